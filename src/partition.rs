//! A partition: a chain of segments with one writer and lock-free readers.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::balance::{LoadMap, RateTracker};
use crate::error::{Error, Result};
use crate::format::batch::{self, RecordIn};
use crate::format::checkpoint::PartitionCheckpoint;
use crate::read::{ReadBatch, ReadIsolation};
use crate::storage::durability::{SyncTarget, Syncer};
use crate::storage::fault::{IoHook, IoOp};
use crate::storage::lock::DirLock;
use crate::storage::position::PositionCell;
use crate::storage::segment::{Segment, SegmentWriter};
use crate::wake::TailWake;

/// Static facts a partition needs from its topic.
#[derive(Debug, Clone)]
pub(crate) struct PartitionParams {
    pub topic: Arc<str>,
    pub topic_id: u32,
    pub id: u32,
    pub dir: PathBuf,
    pub segment_bytes: u64,
    pub index_interval: u64,
    pub max_record_bytes: u64,
    /// The directory lock: held while the partition (and any batch read
    /// from it) can touch the mappings. `None` only for a partition made
    /// while its log was closing (never handed out).
    pub lock: Option<Arc<DirLock>>,
    /// What `read` and `wait_for` see unless told otherwise.
    pub isolation: ReadIsolation,
    /// The topic's reader wake-up: signalled on every append, durable end
    /// moved and seal, after the partition's own condition variable (the
    /// `Durable` futures of this partition only on a durable end moved, a
    /// seal or a poisoning).
    pub wake: Arc<TailWake>,
}

/// Write-side state, guarded by the writer lock.
#[derive(Debug)]
pub(crate) struct WriterState {
    pub writer: SegmentWriter,
    /// The value of `Partition::rolls` after the roll that created the
    /// writer's segment; 0 for a segment this process did not roll to,
    /// whose name is made durable elsewhere: a new partition's first by its
    /// creation, an older one a reclaim went back to by the roll after it,
    /// a recovered one by the open (which fsyncs every partition directory
    /// after an unclean shutdown).
    pub segment_roll: u64,
    pub rates: RateTracker,
    pub load: LoadMap,
}

/// Where a partition's data is known durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DurablePos {
    pub segment_base: u64,
    pub position: u64,
    pub end_offset: u64,
}

impl DurablePos {
    /// Where `w`'s data ends: its segment, the byte position after its
    /// last batch, and the offset the next record gets.
    fn of_writer(w: &SegmentWriter) -> DurablePos {
        DurablePos {
            segment_base: w.segment().base_offset,
            position: w.segment().committed_pos(),
            end_offset: w.next_offset(),
        }
    }

    /// With `created_roll`: the cell of `Partition::written`.
    fn to_cell(self, created_roll: u64) -> [u64; 4] {
        [
            self.segment_base,
            self.position,
            self.end_offset,
            created_roll,
        ]
    }

    /// The position and the roll that created its segment.
    fn from_cell(
        [segment_base, position, end_offset, created_roll]: [u64; 4],
    ) -> (DurablePos, u64) {
        let pos = DurablePos {
            segment_base,
            position,
            end_offset,
        };
        (pos, created_roll)
    }
}

/// The partitions with something for the next sync round to do. A
/// partition adds itself when it goes from clean to dirty (one atomic load
/// on the append path while it stays dirty), so a round finds its work in
/// O(dirty partitions) instead of walking every partition of the log.
#[derive(Debug, Default)]
pub(crate) struct DirtyList(Mutex<Vec<Weak<Partition>>>);

impl DirtyList {
    /// Takes the dirty partitions still alive.
    pub(crate) fn take(&self) -> Vec<Arc<Partition>> {
        std::mem::take(&mut *self.0.lock())
            .into_iter()
            .filter_map(|w| w.upgrade())
            .collect()
    }
}

/// One partition: a handle from [`crate::Topic::partition`] for reading,
/// waiting and inspecting. Its public methods cannot reach the segment
/// files, their mappings or the writer; appends go through the topic.
/// Holding it keeps the log directory locked (see [`crate::ReadBatch`]).
#[derive(Debug)]
pub struct Partition {
    pub(crate) p: PartitionParams,
    segments: RwLock<Arc<Vec<Arc<Segment>>>>,
    writer: Mutex<WriterState>,
    /// Where the writer's data ends ([`DurablePos::of_writer`]) and
    /// [`WriterState::segment_roll`], published
    /// under the writer lock after every change of the writer, so that a
    /// sync round captures it without waiting behind appends in flight.
    written: PositionCell,
    end_offset: AtomicU64,
    /// End of what a completed sync round covered: raised (Release) by
    /// `sync_done` after the fsyncs returned, read (Acquire) by durable
    /// reads. Always a batch boundary and never above `end_offset`.
    durable_end: AtomicU64,
    sealed: AtomicBool,
    poisoned: Mutex<Option<String>>,
    /// Set once `poisoned` holds a reason (checked on every append without the mutex).
    is_poisoned: AtomicBool,
    /// Poisoned outside a sync round (a failed directory fsync at a roll):
    /// the next round registers it with the log's failed partitions.
    poison_unreported: AtomicBool,
    dir_dirty: AtomicBool,
    /// The names recovery found are not known durable (an unclean
    /// shutdown): the next round fsyncs the directory, as recovery's own.
    dir_recovered: AtomicBool,
    /// Rolls so far, counted from 1 at open (the names recovery found are
    /// not known to be durable). Changed under the writer lock.
    rolls: AtomicU64,
    /// The largest value of `rolls` read before a directory fsync that then
    /// completed: every segment created before that read has a durable
    /// name. A roll that finds it behind `rolls` fsyncs the directory
    /// before it creates the new segment (see [`Partition::roll`]).
    dir_synced_rolls: AtomicU64,
    durable: Mutex<DurablePos>,
    /// Segment bases named by the last two checkpoints written (the newest
    /// valid checkpoint on disk is one of them). Retention keeps these
    /// segments and everything after them: deleting a segment a checkpoint
    /// calls durable would let a crash lose synced offsets that no remaining
    /// file can account for.
    checkpointed_bases: Mutex<(u64, u64)>,
    /// Retention floor: segments starting below it are retired. Recorded
    /// in the checkpoint before their files are unlinked.
    retired_below: AtomicU64,
    /// Logical end of a tail-split parent (`u64::MAX`: none); see
    /// [`Partition::set_logical_end`].
    logical_end: AtomicU64,
    /// Left the topology ([`Partition::mark_removed`]): its directory is
    /// about to go, so no sync round touches it and no checkpoint names it.
    removed: AtomicBool,
    /// Its topic was deleted (set under the writer lock by
    /// [`Partition::mark_deleted`]): no append or roll writes again.
    deleted: AtomicBool,
    tail_lock: Mutex<()>,
    tail_cv: Condvar,
    waiters: AtomicUsize,
    hook: Arc<dyn IoHook>,
    clock: Arc<dyn crate::balance::Clock>,
    /// In `dirty_list` (or about to be taken from it by a round).
    dirty: AtomicBool,
    dirty_list: Arc<DirtyList>,
    /// This partition, for `dirty_list`.
    me: Weak<Partition>,
}

/// What [`Partition::plan_retention`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetentionPlan {
    /// The retention floor moved: make it durable, then delete.
    pub floor_moved: bool,
    /// A segment retention would retire is still named by one of the last
    /// two checkpoints: it goes once newer checkpoints are written.
    pub waits_for_checkpoint: bool,
}

/// Capture of a partition's unsynced state for one sync round.
#[derive(Debug)]
pub(crate) struct SyncCapture {
    /// Segments to sync: (segment, committed position, sealed at capture).
    pub segments: Vec<(Arc<Segment>, u64, bool)>,
    pub sync_dir: bool,
    /// The op the directory fsync goes through (`SyncRecoveryDir` when it
    /// makes the names recovery found durable).
    pub dir_op: IoOp,
    /// The partition's roll count at the capture: what a successful
    /// directory fsync of this capture covers.
    pub rolls: u64,
    pub pos: DurablePos,
}

impl SyncCapture {
    /// The fsyncs that make this capture durable: each segment's data,
    /// then the partition directory `dir` when a file was added or removed.
    pub(crate) fn targets(&self, dir: &Path) -> Result<Vec<SyncTarget>> {
        let mut targets = Vec::with_capacity(self.segments.len() + 1);
        for (seg, ..) in &self.segments {
            // No descriptor: a round that ended meanwhile synced it all. A
            // segment that must be synced but can't be opened again (EMFILE)
            // fails the round: nothing is reported durable, nothing poisoned.
            let Some(file) = seg.sync_handle()? else {
                continue;
            };
            targets.push(SyncTarget {
                fd: std::os::unix::io::AsRawFd::as_raw_fd(&*file),
                path: seg.path().to_path_buf(),
                datasync: true,
                op: IoOp::SyncSegment,
                _keep: Some(file),
            });
        }
        if self.sync_dir {
            let f = crate::storage::file::open_dir(dir).map_err(|e| Error::io(dir, e))?;
            targets.push(SyncTarget {
                fd: std::os::unix::io::AsRawFd::as_raw_fd(&f),
                path: dir.to_path_buf(),
                datasync: false,
                op: self.dir_op,
                _keep: Some(Arc::new(f)),
            });
        }
        Ok(targets)
    }
}

/// Wall-clock milliseconds since the Unix epoch (0 before it): the default
/// record timestamp. One `clock_gettime(CLOCK_REALTIME)` and integer math;
/// `SystemTime::now().duration_since(UNIX_EPOCH)` cost ~84 instructions per
/// single-record append (callgrind), 10% of it.
#[allow(
    clippy::unnecessary_cast,
    reason = "time_t and c_long are 32 bits on some Linux targets"
)]
pub(crate) fn now_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, owned `ts`.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) } != 0 || ts.tv_sec < 0 {
        return 0;
    }
    ts.tv_sec as i64 * 1000 + ts.tv_nsec as i64 / 1_000_000
}

impl Partition {
    /// Assembles a partition from recovered segments (oldest first, the last
    /// one takes appends unless `sealed`).
    #[allow(
        clippy::too_many_arguments,
        reason = "assembled in one place from recovery's parts"
    )]
    pub(crate) fn new(
        p: PartitionParams,
        segments: Vec<Arc<Segment>>,
        sealed: bool,
        durable: (u64, u64, u64),
        rates: RateTracker,
        load: LoadMap,
        hook: Arc<dyn IoHook>,
        clock: Arc<dyn crate::balance::Clock>,
        (dirty_list, me): (Arc<DirtyList>, Weak<Partition>),
    ) -> Partition {
        // New or recovered: the next round syncs what recovery kept and
        // puts the partition into the checkpoint.
        dirty_list.0.lock().push(me.clone());
        let last = segments
            .last()
            .expect("a partition has at least one segment")
            .clone();
        let end = last.end_offset();
        for s in &segments {
            s.attach_hook(&hook);
        }
        let writer = SegmentWriter::new(last, p.index_interval);
        Partition {
            written: PositionCell::new(DurablePos::of_writer(&writer).to_cell(0)),
            writer: Mutex::new(WriterState {
                writer,
                segment_roll: 0,
                rates,
                load,
            }),
            p,
            segments: RwLock::new(Arc::new(segments)),
            end_offset: AtomicU64::new(end),
            durable_end: AtomicU64::new(durable.2.min(end)),
            sealed: AtomicBool::new(sealed),
            poisoned: Mutex::new(None),
            is_poisoned: AtomicBool::new(false),
            poison_unreported: AtomicBool::new(false),
            dir_dirty: AtomicBool::new(false),
            dir_recovered: AtomicBool::new(false),
            rolls: AtomicU64::new(1),
            dir_synced_rolls: AtomicU64::new(0),
            checkpointed_bases: Mutex::new((durable.0, durable.0)),
            retired_below: AtomicU64::new(0),
            logical_end: AtomicU64::new(u64::MAX),
            removed: AtomicBool::new(false),
            deleted: AtomicBool::new(false),
            durable: Mutex::new(DurablePos {
                segment_base: durable.0,
                position: durable.1,
                end_offset: durable.2,
            }),
            tail_lock: Mutex::new(()),
            tail_cv: Condvar::new(),
            waiters: AtomicUsize::new(0),
            hook,
            clock,
            dirty: AtomicBool::new(true),
            dirty_list,
            me,
        }
    }

    /// Partition id.
    pub fn id(&self) -> u32 {
        self.p.id
    }

    /// Directory holding the segment files.
    pub fn dir(&self) -> &Path {
        &self.p.dir
    }

    /// Offset the next appended record gets (exclusive end). For the
    /// parent of a tail split, its logical end: the records past it were
    /// moved to the children.
    pub fn end_offset(&self) -> u64 {
        self.end_offset
            .load(Ordering::Acquire)
            .min(self.logical_end.load(Ordering::Acquire))
    }

    /// Caps what reads see at `end` (a tail split moved the records from
    /// there on into the children). Set under the topic state's write lock
    /// once the topology generation moved (`Topic::install_children_with`):
    /// a reader that sees the new lineage reads up to `end` only, and one
    /// that sees the cap sees the new generation.
    pub(crate) fn set_logical_end(&self, end: u64) {
        self.logical_end.store(end, Ordering::SeqCst);
    }

    /// Syncs everything written so far (the children of a tail split
    /// before its record commits).
    pub(crate) fn sync_now(&self, syncer: &Syncer) -> Result<()> {
        let w = self.writer.lock();
        self.sync_locked(&w, syncer)
    }

    /// End of the records a completed sync covered (exclusive).
    pub fn durable_end_offset(&self) -> u64 {
        // SeqCst: a tail waiter's check of this end pairs with the sync
        // round's publication (see `wait_for_with`).
        self.durable_end.load(Ordering::SeqCst)
    }

    /// The read isolation this partition's reads use by default (from its
    /// topic's sync policy).
    pub fn default_isolation(&self) -> ReadIsolation {
        self.p.isolation
    }

    /// End (exclusive) of what a read with `isolation` may see.
    pub fn visible_end(&self, isolation: ReadIsolation) -> u64 {
        let end = match isolation {
            ReadIsolation::Durable => self.durable_end_offset(),
            ReadIsolation::Written => self.end_offset.load(Ordering::SeqCst),
        };
        end.min(self.logical_end.load(Ordering::SeqCst))
    }

    /// First offset still held (older segments may have been deleted by
    /// retention). A sealed partition that retention emptied holds nothing:
    /// its start is its end.
    pub fn start_offset(&self) -> u64 {
        let end = self.end_offset();
        self.segments.read().first().map_or(end, |s| s.base_offset)
    }

    /// Whether the partition is sealed.
    pub fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }

    /// Snapshot of the segment list.
    pub(crate) fn segments(&self) -> Arc<Vec<Arc<Segment>>> {
        self.segments.read().clone()
    }

    /// Bytes of record data held.
    pub fn size_bytes(&self) -> u64 {
        self.segments()
            .iter()
            .map(|s| s.committed_pos() - crate::format::segment::SEGMENT_HEADER_LEN as u64)
            .sum()
    }

    fn check_writable(&self) -> Result<()> {
        if self.deleted.load(Ordering::Acquire) {
            return Err(Error::UnknownTopic(self.p.topic.to_string()));
        }
        if !self.is_poisoned.load(Ordering::Acquire) {
            return if self.is_sealed() {
                Err(Error::Sealed {
                    topic: self.p.topic.to_string(),
                    partition: self.p.id,
                })
            } else {
                Ok(())
            };
        }
        if let Some(reason) = &*self.poisoned.lock() {
            return Err(Error::Poisoned {
                topic: self.p.topic.to_string(),
                partition: self.p.id,
                reason: reason.clone(),
            });
        }
        if self.is_sealed() {
            return Err(Error::Sealed {
                topic: self.p.topic.to_string(),
                partition: self.p.id,
            });
        }
        Ok(())
    }

    /// Makes the next sync round fsync the partition's directory, for the
    /// names recovery found (see `Log::open`).
    pub(crate) fn mark_names_recovered(&self) {
        self.dir_recovered.store(true, Ordering::Release);
        self.mark_dirty();
    }

    /// Registers the partition for the next sync round.
    pub(crate) fn mark_dirty(&self) {
        // SeqCst: see `publish_written`.
        if !self.dirty.load(Ordering::SeqCst) && !self.dirty.swap(true, Ordering::AcqRel) {
            self.dirty_list.0.lock().push(self.me.clone());
        }
    }

    /// Whether a failed fsync poisoned the partition.
    pub(crate) fn is_poisoned(&self) -> bool {
        // SeqCst: a `Durable` future's check pairs with `poison`'s notify.
        self.is_poisoned.load(Ordering::SeqCst)
    }

    /// Whether a failed fsync outside a sync round poisoned the partition
    /// since the last call: a round registers it as failed.
    pub(crate) fn take_unreported_poison(&self) -> bool {
        self.poison_unreported.swap(false, Ordering::AcqRel)
    }

    /// `Err(Poisoned)` once a failed fsync poisoned the partition.
    pub(crate) fn check_not_poisoned(&self) -> Result<()> {
        match &*self.poisoned.lock() {
            Some(reason) => Err(Error::Poisoned {
                topic: self.p.topic.to_string(),
                partition: self.p.id,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Marks the partition unusable for writes after a failed sync.
    pub(crate) fn poison(&self, reason: String) {
        let mut g = self.poisoned.lock();
        if g.is_none() {
            *g = Some(reason);
        }
        self.is_poisoned.store(true, Ordering::SeqCst);
        drop(g);
        // A `Durable` future waiting here fails now, not never.
        self.p.wake.notify_partition(self.p.id);
    }

    /// Checks sizes before taking the lock. Returns the batch length.
    pub(crate) fn check_batch(&self, records: &[RecordIn<'_>]) -> Result<usize> {
        if records.is_empty() {
            return Err(Error::InvalidConfig(
                "a batch needs at least one record".into(),
            ));
        }
        for r in records {
            let size = r.encoded_len() as u64;
            if size > self.p.max_record_bytes || r.key.is_some_and(|k| k.len() >= u32::MAX as usize)
            {
                return Err(Error::RecordTooLarge {
                    size,
                    max: self.p.max_record_bytes,
                });
            }
        }
        let len = batch::batch_len(records);
        let room = self.p.segment_bytes - crate::format::segment::SEGMENT_HEADER_LEN as u64;
        if len as u64 > room || records.len() > u32::MAX as usize {
            return Err(Error::RecordTooLarge {
                size: len as u64,
                max: room,
            });
        }
        Ok(len)
    }

    /// Appends a batch; returns the offset of its first record.
    /// `hashes` (one per record, keyed records only) feed the load map.
    pub(crate) fn append(&self, records: &[RecordIn<'_>], hashes: &[Option<u64>]) -> Result<u64> {
        self.append_fenced(records, hashes, None)
    }

    /// [`Partition::append`] that refuses, as if sealed (so the caller
    /// routes again), when `fence` no longer holds the value the caller
    /// routed under. Checked under the writer lock: a hot-key mode change
    /// moves the fence and then takes this lock to read the partition's
    /// end, so every append routed before the change is either below that
    /// end or routed again under the new mode.
    pub(crate) fn append_fenced(
        &self,
        records: &[RecordIn<'_>],
        hashes: &[Option<u64>],
        fence: Option<(&AtomicU64, u64)>,
    ) -> Result<u64> {
        let len = self.check_batch(records)?;
        let base = {
            let mut w = self.writer.lock();
            self.check_writable()?;
            if let Some((f, seen)) = fence {
                if f.load(Ordering::SeqCst) != seen {
                    return Err(Error::Sealed {
                        topic: self.p.topic.to_string(),
                        partition: self.p.id,
                    });
                }
            }
            if (len as u64) > w.writer.remaining() {
                self.roll(&mut w)?;
            }
            let header = w.writer.append(records, len)?;
            let now = self.clock.now_nanos();
            w.rates.record(now, records.len() as u64, len as u64);
            for (r, h) in records.iter().zip(hashes) {
                if let Some(h) = h {
                    w.load.observe(now, *h, r.encoded_len() as u64);
                }
            }
            self.publish_written(&w);
            self.mark_dirty();
            header.base_offset.get()
        };
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.tail_lock.lock();
            self.tail_cv.notify_all();
        }
        // After the SeqCst store of `end_offset`: one load while no reader
        // of the topic waits.
        self.p.wake.notify();
        Ok(base)
    }

    /// Seals the active segment and starts a new one. Creating the new
    /// file is the only step that can fail, and it comes first: on failure
    /// it is removed again and the old segment, still unsealed, keeps
    /// taking appends, so a later roll starts from the same state. Sealing
    /// cannot fail (its index write is a cache).
    ///
    /// Before the new file is created, the name of every segment created
    /// before it is made durable: unless a directory fsync (of a sync
    /// round, or of an earlier roll) completed since the last roll, the
    /// partition directory is fsynced here. So a segment's name never
    /// survives a power loss that loses an earlier segment's name, and
    /// recovery can take a segment missing before one that is there for
    /// lost data, not for a crash artifact (docs/ARCHITECTURE.md). At most
    /// one directory fsync per roll, and none when sync rounds run more
    /// often than rolls. A failed fsync poisons the partition, as in a
    /// sync round.
    fn roll(&self, w: &mut WriterState) -> Result<()> {
        let next = w.writer.next_offset();
        let rolls = self.rolls.load(Ordering::Acquire);
        if self.dir_synced_rolls.load(Ordering::Acquire) < rolls {
            // Opening the directory is not its fsync: failing to (too many
            // open files) loses nothing, so it poisons nothing and the
            // roll can be retried.
            let dir = crate::storage::file::open_dir(&self.p.dir)
                .map_err(|e| Error::io(&self.p.dir, e).descriptor_shortage_typed())?;
            let synced =
                crate::storage::sync_file(&*self.hook, IoOp::SyncRollDir, &dir, &self.p.dir, false);
            drop(dir);
            if let Err(e) = synced {
                // Registered as failed by the next sync round (log-wide
                // syncs report it from then on): flagged before the poison
                // is published, so a round that sees the poison sees the
                // flag; a round that does not captures the partition, and
                // `mark_dirty` puts it back in the list for the next one.
                self.poison_unreported.store(true, Ordering::Release);
                self.poison(format!("directory sync before a roll failed: {e}"));
                self.mark_dirty();
                return Err(e);
            }
            self.dir_synced_rolls.fetch_max(rolls, Ordering::AcqRel);
        }
        let seg = Segment::create(
            &self.p.dir,
            (self.p.topic_id, self.p.id),
            next,
            self.p.segment_bytes,
            now_ms(),
            &*self.hook,
        )
        .map_err(Error::descriptor_shortage_typed)?;
        seg.attach_hook(&self.hook);
        w.writer.seal();
        let seg = Arc::new(seg);
        {
            let mut list = self.segments.write();
            let mut v = (**list).clone();
            v.push(seg.clone());
            *list = Arc::new(v);
        }
        w.segment_roll = self.rolls.fetch_add(1, Ordering::AcqRel) + 1;
        self.dir_dirty.store(true, Ordering::Release);
        w.writer = SegmentWriter::new(seg, self.p.index_interval);
        self.publish_written(w);
        self.mark_dirty();
        Ok(())
    }

    /// Forces a roll (tests and tools).
    pub fn roll_now(&self) -> Result<()> {
        let mut w = self.writer.lock();
        self.check_writable()?;
        if w.writer.segment().end_offset() == w.writer.segment().base_offset {
            return Ok(());
        }
        self.roll(&mut w)
    }

    /// Seals the partition at its current end (split/merge commit point).
    /// Returns the seal offset. Appenders block on the writer lock meanwhile.
    ///
    /// Before `commit` runs, everything up to the seal is made durable
    /// (through `syncer`): a split or merge record must never be durable
    /// while the parent's records below the seal are not, or a power loss
    /// could keep a key's later records (in a child) and lose its earlier
    /// ones (in the parent). A failed sync poisons the partition.
    pub(crate) fn seal_with<T>(
        &self,
        syncer: &Syncer,
        commit: impl FnOnce(u64) -> Result<T>,
    ) -> Result<T> {
        let w = self.writer.lock();
        self.check_writable()?;
        let end = w.writer.next_offset();
        self.sync_locked(&w, syncer)?;
        let out = match commit(end) {
            Ok(out) => out,
            Err(e) => {
                if let Error::LogPoisoned { reason } = &e {
                    // The seal may be committed on disk: no append may land
                    // past it (released only when the lock drops).
                    self.poison(format!("a topology change sealing it failed: {reason}"));
                }
                return Err(e);
            }
        };
        // SeqCst: published before the notifications below (the commit
        // also moved the topology generation, which readers check).
        self.sealed.store(true, Ordering::SeqCst);
        // The partition takes no more appends: give back the preallocated
        // space of its last segment (a failure only keeps that space).
        let _ = w.writer.segment().trim();
        self.mark_dirty();
        drop(w);
        {
            let _g = self.tail_lock.lock();
            self.tail_cv.notify_all();
        }
        self.p.wake.notify_partition(self.p.id);
        Ok(out)
    }

    /// Marks sealed without a commit (recovery of a sealed partition).
    pub(crate) fn mark_sealed(&self) {
        self.sealed.store(true, Ordering::Release);
    }

    /// Current write rates and load map, for the balancer.
    pub(crate) fn with_writer<T>(&self, f: impl FnOnce(&mut WriterState) -> T) -> T {
        f(&mut self.writer.lock())
    }

    /// Reads from `offset`: at least one batch, then more while under
    /// `max_bytes`, up to what the partition's default isolation shows.
    pub fn read(&self, offset: u64, max_bytes: usize) -> Result<ReadBatch> {
        self.read_with(offset, max_bytes, self.p.isolation)
    }

    /// [`Partition::read`] with an explicit read isolation.
    pub fn read_with(
        &self,
        offset: u64,
        max_bytes: usize,
        isolation: ReadIsolation,
    ) -> Result<ReadBatch> {
        // The end first, then the list. A roll pushes the new segment into
        // the list before the writer appends to it and publishes the new end
        // (Release); loading the end (Acquire) first makes every offset
        // below it lie in a segment of the list read after it. Loaded the
        // other way round, a roll in between pairs an old list with a new
        // end, and a just-appended offset past the old last segment reads
        // as a hole.
        let end = self.visible_end(isolation);
        let segments = self.segments();
        let start = segments.first().map_or(end, |s| s.base_offset);
        if offset < start && offset < self.retired_below.load(Ordering::Acquire) {
            return Err(Error::Retained {
                partition: self.p.id,
                start: offset,
                end: start,
            });
        }
        if offset < start || offset >= end {
            return Err(Error::OffsetOutOfRange {
                partition: self.p.id,
                offset,
                start,
                end,
            });
        }
        // `start <= offset` with a non-empty list (an empty one has
        // `start == end` and returned above): some segment starts at or
        // below `offset`.
        let i = segments.partition_point(|s| s.base_offset <= offset);
        let Some(i) = i.checked_sub(1) else {
            return Err(Error::OffsetOutOfRange {
                partition: self.p.id,
                offset,
                start,
                end,
            });
        };
        let seg = &segments[i];
        if offset >= seg.end_offset() {
            let next = segments.get(i + 1).map_or(end, |s| s.base_offset);
            return Err(Error::Hole {
                partition: self.p.id,
                start: seg.end_offset(),
                end: next,
            });
        }
        ReadBatch::new(
            self.p.id,
            seg.clone(),
            self.p.lock.clone(),
            offset,
            max_bytes,
            end,
        )
    }

    /// Blocks until `offset` is readable (under the default isolation),
    /// the partition is sealed below it, or `timeout` passes. Returns
    /// whether data is there.
    pub fn wait_for(&self, offset: u64, timeout: Duration) -> bool {
        self.wait_for_with(offset, timeout, self.p.isolation)
    }

    /// [`Partition::wait_for`] with an explicit read isolation: a durable
    /// wait wakes when a sync round moves the durable end.
    pub fn wait_for_with(&self, offset: u64, timeout: Duration, isolation: ReadIsolation) -> bool {
        let deadline = crate::duration::deadline_after(timeout);
        // The appender stores `end_offset` then loads `waiters`; the waiter
        // increments `waiters` then loads `end_offset` (a store followed by
        // a load of another location on each side, as in Dekker's
        // algorithm). With Release/Acquire only, each load may be ordered
        // before the other side's store (x86 store buffers do exactly
        // that): the appender sees no waiter and skips the notify while
        // the waiter sees the old end and sleeps until its timeout. SeqCst
        // on all four accesses puts them in one total order, so at least
        // one side sees the other: the waiter sees the new end, or the
        // appender sees the waiter and notifies under `tail_lock`, which
        // the waiter holds from its check until it sleeps.
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = self.tail_lock.lock();
        let ready = loop {
            if self.visible_end(isolation) > offset {
                break true;
            }
            // A sealed partition still gets its tail synced: only a
            // written-isolation wait can stop at the seal.
            let final_end = self.is_sealed()
                && (isolation == ReadIsolation::Written
                    || self.durable_end_offset() >= self.end_offset());
            if final_end {
                break self.visible_end(isolation) > offset;
            }
            match deadline {
                Some(d) => {
                    if self.tail_cv.wait_until(&mut g, d).timed_out() {
                        break self.visible_end(isolation) > offset;
                    }
                }
                None => self.tail_cv.wait(&mut g),
            }
        };
        drop(g);
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        ready
    }

    /// First offset whose record timestamp is >= `ts` (None: none yet).
    /// A tail-split parent answers below its logical end only: its records
    /// past it were moved to the children.
    pub fn offset_for_time(&self, ts: i64) -> Result<Option<u64>> {
        let found = self.physical_offset_for_time(ts)?;
        Ok(found.filter(|&o| o < self.logical_end.load(Ordering::Acquire)))
    }

    fn physical_offset_for_time(&self, ts: i64) -> Result<Option<u64>> {
        let segments = self.segments();
        let Some(i) = segments.iter().position(|s| s.max_timestamp() >= ts) else {
            return Ok(None);
        };
        let seg = &segments[i];
        let (pos, off) = seg.time_hint(ts);
        let data = seg.committed();
        let end = seg.committed_pos();
        let (mut pos, mut next) = (pos, off);
        while pos < end {
            let h = batch::validate(data.from(pos), Some(next))
                .map_err(|e| Error::corruption(seg.path(), pos, e.to_string()))?;
            if !batch::is_hole(&h) && h.max_ts.get() >= ts {
                let b = &data.from(pos)[..h.batch_len.get() as usize];
                for r in batch::RecordIter::new(b, &h) {
                    let r = r.map_err(|e| Error::corruption(seg.path(), pos, e.to_string()))?;
                    if r.timestamp >= ts {
                        return Ok(Some(r.offset));
                    }
                }
            }
            next += u64::from(h.record_count.get());
            pos += u64::from(h.batch_len.get());
        }
        Ok(None)
    }

    /// Syncs everything written so far while the caller holds the writer
    /// lock (nothing can be appended meanwhile). A failed fsync poisons
    /// the partition, as in a sync round.
    fn sync_locked(&self, w: &WriterState, syncer: &Syncer) -> Result<()> {
        let mut cap = self.capture_with(w);
        // Always the directory too: a sync round in flight may have taken
        // the "directory changed" flag and not yet fsynced it, and a split
        // or merge must not commit while the name of a segment the parent
        // rolled to is not durable.
        cap.sync_dir = true;
        let targets = match cap.targets(self.dir()) {
            Ok(t) => t,
            Err(e) => {
                self.sync_done(&cap, false);
                return Err(e);
            }
        };
        let results = syncer.sync_all(&targets);
        if let Some((t, Err(e))) = targets.iter().zip(results).find(|(_, r)| r.is_err()) {
            self.poison(format!("sync of {} failed: {e}", t.path.display()));
            self.sync_done(&cap, false);
            return Err(Error::io(&t.path, e));
        }
        self.sync_done(&cap, true);
        Ok(())
    }

    /// Publishes where the writer's data ends, for [`Partition::capture_unsynced`].
    /// Called under the writer lock after every append and every change of
    /// the writer, before the partition is marked dirty.
    ///
    /// The `end_offset` store is SeqCst for two readers: `wait_for` (see
    /// the comment there), and a capture, whose SeqCst clear of `dirty`
    /// and SeqCst load of `end_offset` pair with it and with the SeqCst
    /// load in `mark_dirty`: either the capture sees this position, or
    /// the `mark_dirty` that follows sees the cleared flag and puts the
    /// partition on the list for the next round. (A lost race both ways
    /// would let a round started after an append miss it.)
    fn publish_written(&self, w: &WriterState) {
        self.written
            .store(DurablePos::of_writer(&w.writer).to_cell(w.segment_roll));
        self.end_offset
            .store(w.writer.next_offset(), Ordering::SeqCst);
    }

    /// Captures what a sync round must make durable, without the writer
    /// lock: appends go on while a round captures and syncs.
    ///
    /// Why this is as good as a capture under the lock:
    /// - The position is one published triple (segment, byte position,
    ///   offset) of a moment between two appends, published after that
    ///   append's bytes were in place (stores or `pwrite`), so the fsyncs
    ///   that follow cover it.
    /// - It is read before the segment list and each segment's committed
    ///   position, which only grow after it: every segment the position
    ///   names is in the list, synced up to at least the position. A roll
    ///   pushes the new segment and publishes the sealed flag of the old
    ///   one before it publishes a position in the new one.
    /// - The segment the position names has a durable name once this round
    ///   completes: the position comes with the count of the roll that
    ///   created its segment, and unless a completed directory fsync
    ///   already covers that count, this round fsyncs the directory. The
    ///   "directory changed" flag alone is not enough: a roll may set it
    ///   after this capture took it, and a seal's `sync_locked` may hold it
    ///   with its fsync still in flight. The roll count this capture
    ///   reports (what its directory fsync covers) is read after the
    ///   position, so it counts that roll too.
    /// - `dirty` is cleared first: an append published after the load
    ///   marks the partition dirty again, for the next round.
    /// - SeqCst with `publish_written` and `mark_dirty`: see there.
    pub(crate) fn capture_unsynced(&self) -> SyncCapture {
        self.dirty.store(false, Ordering::SeqCst);
        let _ = self.end_offset.load(Ordering::SeqCst);
        let (pos, created_roll) = DurablePos::from_cell(self.written.load());
        let rolls = self.rolls.load(Ordering::Acquire);
        // Taken whenever set: retention's deletions set it too.
        let flagged = self.dir_dirty.swap(false, Ordering::AcqRel);
        let recovered = self.dir_recovered.swap(false, Ordering::AcqRel);
        let sync_dir =
            flagged || recovered || self.dir_synced_rolls.load(Ordering::Acquire) < created_roll;
        let mut cap = self.capture_segments(pos, sync_dir, rolls);
        if recovered {
            cap.dir_op = IoOp::SyncRecoveryDir;
        }
        cap
    }

    /// [`Partition::capture_unsynced`] by a caller holding the writer lock.
    fn capture_with(&self, w: &WriterState) -> SyncCapture {
        debug_assert_eq!(
            DurablePos::of_writer(&w.writer),
            DurablePos::from_cell(self.written.load()).0,
            "the published position follows the writer"
        );
        self.capture_unsynced()
    }

    fn capture_segments(&self, pos: DurablePos, sync_dir: bool, rolls: u64) -> SyncCapture {
        let segments = self.segments();
        let mut out = Vec::new();
        for s in segments.iter().rev() {
            // Sealed is read first: the seal bytes are in the mapping before
            // the flag is published, so the sync below covers them.
            let seal = s.needs_seal_sync();
            let committed = s.committed_pos();
            if committed > s.synced_pos() || seal {
                out.push((s.clone(), committed, seal));
            } else if s.is_sealed() {
                break;
            }
        }
        SyncCapture {
            segments: out,
            sync_dir,
            dir_op: IoOp::SyncDir,
            rolls,
            pos,
        }
    }

    /// Records the outcome of a sync round. Returns whether the durable
    /// position moved (the checkpoint has to catch up).
    pub(crate) fn sync_done(&self, cap: &SyncCapture, ok: bool) -> bool {
        let mut moved = false;
        if ok {
            for (s, pos, seal) in &cap.segments {
                s.set_synced_pos(*pos);
                if *seal {
                    s.set_seal_synced();
                }
            }
            // Monotonic: a round that captured before a seal's own sync
            // may finish after it. A capture past the partition's end is
            // either from before a reclaim cut the partition there (it names
            // bytes the reclaim punched out) or of an append whose writer
            // has published its position but not yet its end: the durable
            // position stays (the writer marks the partition dirty again
            // right after, for the next round), and the durable end rises
            // only to the partition's end, which this round's fsyncs
            // covered. Checked under the `durable` lock, which the reclaim
            // holds while it lowers the end.
            let mut d = self.durable.lock();
            let physical_end = self.end_offset.load(Ordering::Acquire);
            let current = cap.pos.end_offset <= physical_end;
            let end = cap.pos.end_offset.min(physical_end);
            if current && (cap.pos.segment_base, cap.pos.position) >= (d.segment_base, d.position) {
                moved = *d != cap.pos;
                *d = cap.pos;
            }
            // Under the same lock, for the same reason.
            let raised = self.durable_end.fetch_max(end, Ordering::SeqCst) < end;
            drop(d);
            if cap.sync_dir {
                // The directory fsync started after the capture: the names
                // of the segments created by then are durable.
                self.dir_synced_rolls.fetch_max(cap.rolls, Ordering::AcqRel);
            }
            // `durable_end` (raised above) is published only once the
            // fsyncs returned: durable reads never show what a power loss
            // could still take back. SeqCst pairs with the waiter's
            // increment of `waiters` (see `wait_for_with`).
            if raised {
                if self.waiters.load(Ordering::SeqCst) > 0 {
                    let _g = self.tail_lock.lock();
                    self.tail_cv.notify_all();
                }
                self.p.wake.notify_partition(self.p.id);
            }
        } else {
            if cap.sync_dir {
                self.dir_dirty.store(true, Ordering::Release);
            }
            if cap.dir_op == IoOp::SyncRecoveryDir {
                self.dir_recovered.store(true, Ordering::Release);
            }
            self.mark_dirty();
        }
        moved
    }

    /// Records that a checkpoint naming `segment_base` was written (once
    /// per checkpoint file written: the two files alternate).
    pub(crate) fn note_checkpointed(&self, segment_base: u64) {
        let mut bases = self.checkpointed_bases.lock();
        *bases = (bases.1, segment_base);
    }

    /// Checkpoint entry: the durable position and the write rates. The
    /// caller reports it with [`Partition::note_checkpointed`] if written.
    pub(crate) fn checkpoint_entry(&self, durable: Option<DurablePos>) -> PartitionCheckpoint {
        let d = durable.unwrap_or_else(|| *self.durable.lock());
        let now = self.clock.now_nanos();
        let rates = self.writer.lock().rates.snapshot(now);
        PartitionCheckpoint {
            topic_id: self.p.topic_id,
            partition_id: self.p.id,
            segment_base: d.segment_base,
            position: d.position,
            end_offset: d.end_offset,
            start_offset: self.retired_below.load(Ordering::Acquire),
            rates: rates
                .windows
                .iter()
                .map(|w| crate::format::checkpoint::WindowState {
                    window_ms: w.window_millis.min(u64::from(u32::MAX)) as u32,
                    bytes_per_sec: w.bytes_per_sec,
                    records_per_sec: w.records_per_sec,
                })
                .collect(),
        }
    }

    /// Sets the retention floor found by recovery.
    pub(crate) fn set_retired_below(&self, offset: u64) {
        self.retired_below.fetch_max(offset, Ordering::AcqRel);
    }

    /// Decides which sealed segments retention retires and raises the floor
    /// to the first segment kept. Deletes nothing: the caller makes the new
    /// floor durable (a sync round writes it into the checkpoint) and then
    /// calls [`Partition::delete_retired`], so a crash can never bring back
    /// a retired file that recovery would mistake for live data.
    pub(crate) fn plan_retention(
        &self,
        age: Option<Duration>,
        bytes: Option<u64>,
        now_ms: i64,
    ) -> RetentionPlan {
        let v = self.segments();
        let mut total: u64 = v.iter().map(|s| s.committed_pos()).sum();
        // The segment being written never goes (an empty sealed partition does).
        let keep_last = !self.is_sealed();
        // Nor do the segments the last two checkpoints name (recovery
        // starts from them).
        let floor = {
            let bases = self.checkpointed_bases.lock();
            bases.0.min(bases.1)
        };
        let mut i = 0;
        let mut waits_for_checkpoint = false;
        while v.len() - i > usize::from(keep_last) {
            let s = &v[i];
            // Timestamps are the caller's (any i64) and so is the age: the
            // difference saturates, and an age past i64 milliseconds
            // saturates too (a cast would keep its low bits, negative for
            // `Duration::MAX`, and expire everything).
            let expired = age.is_some_and(|a| {
                let age_ms = i64::try_from(crate::duration::duration_millis(a)).unwrap_or(i64::MAX);
                s.max_timestamp() != i64::MIN && now_ms.saturating_sub(s.max_timestamp()) > age_ms
            });
            let too_big = bytes.is_some_and(|b| total > b);
            if !(expired || too_big) || keep_last && !s.is_sealed() {
                break;
            }
            if keep_last && s.base_offset >= floor {
                waits_for_checkpoint = true;
                break;
            }
            total -= s.committed_pos();
            i += 1;
        }
        let new_floor = match v.get(i) {
            Some(s) if i > 0 => s.base_offset,
            None if i > 0 => v[i - 1].end_offset(),
            _ => 0,
        };
        let floor_moved =
            new_floor > 0 && self.retired_below.fetch_max(new_floor, Ordering::AcqRel) < new_floor;
        if floor_moved {
            // The next checkpoint must carry the new floor.
            self.mark_dirty();
        }
        RetentionPlan {
            floor_moved,
            waits_for_checkpoint,
        }
    }

    /// Unlinks the segments below the retention floor. Readers holding
    /// them keep reading (the mappings stay valid until dropped).
    pub(crate) fn delete_retired(&self) -> Result<Vec<PathBuf>> {
        let floor = self.retired_below.load(Ordering::Acquire);
        let mut removed = Vec::new();
        let mut list = self.segments.write();
        let mut v = (**list).clone();
        while v
            .first()
            .is_some_and(|s| s.base_offset < floor && (v.len() > 1 || self.is_sealed()))
        {
            if self.is_removed() {
                // Its topic was deleted after the pass planned: the files
                // are gone with the directory, and nothing is left to do.
                return Ok(removed);
            }
            let s = v.remove(0);
            let _ = std::fs::remove_file(s.index_path());
            if let Err(e) = std::fs::remove_file(s.path()) {
                if e.kind() == std::io::ErrorKind::NotFound && self.is_removed() {
                    return Ok(removed);
                }
                return Err(Error::io(s.path(), e));
            }
            removed.push(s.path().to_path_buf());
        }
        if !removed.is_empty() {
            *list = Arc::new(v);
            self.dir_dirty.store(true, Ordering::Release);
            self.mark_dirty();
        }
        Ok(removed)
    }

    /// Releases the bytes of a sealed tail-split parent past its logical
    /// end `from` (its `TailReclaimed` record is durable). Segments wholly
    /// past `from` are unlinked, newest first, each name removal synced
    /// before the next (the files left are always a prefix of the chain);
    /// a reader still holding one keeps its mapping. The segment holding
    /// `from` is cut there ([`Segment::release_past`]) only when nothing
    /// but the partition holds it: a read batch taken before the split may
    /// still cover bytes past `from`, and the cut waits for the next call.
    /// Returns whether the partition now ends at `from` on disk.
    pub(crate) fn reclaim_past(&self, from: u64) -> Result<bool> {
        let mut w = self.writer.lock();
        let mut list = self.segments.write();
        let v = (**list).clone();
        let Some(k) = v.iter().rposition(|s| s.base_offset <= from) else {
            return Ok(true);
        };
        let keep = v[k].clone();
        let later: Vec<Arc<Segment>> = v[k + 1..].to_vec();
        *list = Arc::new(v[..=k].to_vec());
        drop(v);
        if !later.is_empty() {
            // The writer of a sealed partition writes nothing, but a clean
            // close writes its segment's index file: it must not name a
            // removed segment.
            w.writer = SegmentWriter::new(keep.clone(), self.p.index_interval);
            w.segment_roll = 0;
            self.publish_written(&w);
        }
        let moved_end = |seg: &Arc<Segment>| (seg.committed_pos(), seg.end_offset());
        for seg in later.iter().rev() {
            let _ = std::fs::remove_file(seg.index_path());
            match std::fs::remove_file(seg.path()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(seg.path(), e)),
            }
            crate::storage::sync_dir(&*self.hook, IoOp::SyncDir, &self.p.dir)?;
        }
        drop(later);
        let (pos, end) = moved_end(&keep);
        self.set_reclaimed_end(keep.base_offset, pos, end);
        if end <= from {
            return Ok(true);
        }
        // Held by the list, the writer and `keep` only: no read batch
        // (nor a clone of one) covers its bytes. A read started from here
        // on stops at `from` (the logical end) and reads no byte past it.
        if Arc::strong_count(&keep) > 3 {
            drop(list);
            return Ok(false);
        }
        let pos = keep.locate(from)?;
        keep.release_past(pos, from)?;
        // The writer's position is the segment's old end: a sync round
        // would capture it as the durable end, and the checkpoint name
        // offsets past `from` at the cut's position.
        w.writer = SegmentWriter::new(keep.clone(), self.p.index_interval);
        w.segment_roll = 0;
        self.publish_written(&w);
        self.set_reclaimed_end(keep.base_offset, pos, from);
        drop(list);
        Ok(true)
    }

    /// The partition's physical end after a reclaim: what the next
    /// checkpoint names.
    fn set_reclaimed_end(&self, segment_base: u64, position: u64, end_offset: u64) {
        // Under the `durable` lock: see `sync_done`.
        let mut d = self.durable.lock();
        self.end_offset.store(end_offset, Ordering::SeqCst);
        self.durable_end.fetch_min(end_offset, Ordering::AcqRel);
        *d = DurablePos {
            segment_base,
            position,
            end_offset,
        };
        drop(d);
        self.mark_dirty();
    }

    /// The active segment and its index file's new bytes when they differ
    /// from what is durably on disk: a clean close writes those (batched
    /// over every partition, `log.rs`), so a power loss after it never
    /// leaves an index stale, and writes nothing for a partition whose
    /// index did not change.
    pub(crate) fn index_to_flush(&self) -> Option<(Arc<Segment>, Vec<u8>)> {
        let w = self.writer.lock();
        let seg = w.writer.segment();
        seg.index_file_if_changed().map(|buf| (seg.clone(), buf))
    }

    /// Whether every segment was removed by retention (sealed partitions only).
    pub fn is_empty_sealed(&self) -> bool {
        self.is_sealed() && self.segments.read().is_empty()
    }

    /// Sealed, with every offset it ever held below the retention floor:
    /// nothing in it can be read again (a placeholder segment recovery
    /// made for it holds no record).
    pub(crate) fn fully_retired(&self) -> bool {
        self.is_sealed() && self.retired_below.load(Ordering::Acquire) >= self.end_offset()
    }

    /// Marks the partition as removed from the topology (its
    /// `RemovePartition` record is durable). Set before its directory is
    /// deleted: a sync round or checkpoint that meets it afterwards skips
    /// it, and a failure caused by the missing directory is not a failed
    /// fsync of live data.
    pub(crate) fn mark_removed(&self) {
        self.removed.store(true, Ordering::Release);
    }

    /// Undoes [`Partition::mark_removed`] for a partition built before it
    /// entered the topology (a tail split's child, once its record commits).
    pub(crate) fn unmark_removed(&self) {
        self.removed.store(false, Ordering::Release);
        // A sync round may have dropped it from the dirty list meanwhile
        // (as removed) with its dirty flag still set: list it again.
        self.dirty.store(true, Ordering::Release);
        let mut list = self.dirty_list.0.lock();
        if !list.iter().any(|w| w.ptr_eq(&self.me)) {
            list.push(self.me.clone());
        }
    }

    /// Marks the partition removed because its topic is being deleted,
    /// under the writer lock: an append or roll in progress (which may
    /// create a segment file) finishes first, and every later one is
    /// refused (`check_writable`), so nothing writes into the directory
    /// `Log::delete_topic` removes next.
    pub(crate) fn mark_deleted(&self) {
        let _w = self.writer.lock();
        self.deleted.store(true, Ordering::Release);
        self.removed.store(true, Ordering::Release);
    }

    /// See [`Partition::mark_removed`].
    pub(crate) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }
}

/// One segment of a partition, as plain data: what
/// [`Partition::segment_infos`] reports. A snapshot; the active segment
/// keeps growing after it was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SegmentInfo {
    /// Offset of its first record.
    pub base_offset: u64,
    /// Offset after its last record (exclusive).
    pub end_offset: u64,
    /// Bytes of record data (batches, without the segment header).
    pub data_bytes: u64,
    /// Bytes allocated to its file as far as the log knows: the data, the
    /// header and, for the active segment, space allocated ahead of the
    /// writer (its file is longer, sparse past that).
    pub file_bytes: u64,
    /// Path of the segment file.
    pub path: PathBuf,
    /// Takes no more appends: rolled, or its partition is sealed.
    pub sealed: bool,
}

impl Partition {
    /// Number of segments the partition holds (retention lowers it).
    pub fn segment_count(&self) -> usize {
        self.segments.read().len()
    }

    /// The partition's segments, oldest first, as plain data.
    pub fn segment_infos(&self) -> Vec<SegmentInfo> {
        let header = crate::format::segment::SEGMENT_HEADER_LEN as u64;
        let partition_sealed = self.is_sealed();
        self.segments()
            .iter()
            .map(|s| SegmentInfo {
                base_offset: s.base_offset,
                end_offset: s.end_offset(),
                data_bytes: s.committed_pos().saturating_sub(header),
                file_bytes: s.allocated(),
                path: s.path().to_path_buf(),
                sealed: partition_sealed || s.is_sealed(),
            })
            .collect()
    }
}
