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
use crate::storage::budget::Budget;
use crate::storage::durability::{SyncTarget, Syncer};
use crate::storage::fault::{IoHook, IoOp};
use crate::storage::lock::DirLock;
use crate::storage::position::{DurablePoint, PositionCell};
use crate::storage::segment::{Segment, SegmentWriter, Segments};
use crate::wake::TailWake;

mod append;
mod raft;
mod read;
mod retention;
mod sync_capture;

pub use raft::{EntryBatch, EntryPos, RaftEntry, RaftEntryBody};

pub(crate) use sync_capture::SyncCapture;

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
    /// The log's budget of mappings and descriptors: every segment of
    /// the partition is under it.
    pub budget: Arc<Budget>,
    /// A Raft log (`TopicConfig::replicated`): format-2 segments, appends
    /// only through [`Partition::append_entry`].
    pub replicated: bool,
}

impl PartitionParams {
    /// Header version of the segments this partition creates.
    pub(crate) fn segment_version(&self) -> u16 {
        segment_version(self.replicated)
    }
}

/// Header version of a partition's segments: 2 for a replicated one.
pub(crate) fn segment_version(replicated: bool) -> u16 {
    if replicated {
        crate::format::segment::SEGMENT_VERSION_V2
    } else {
        crate::format::segment::SEGMENT_VERSION_V1
    }
}

/// Where a new partition's writer stands before its first append: the
/// first segment's header, offset 0.
pub(crate) const UNWRITTEN: DurablePoint = DurablePoint {
    segment_base: 0,
    position: crate::format::segment::SEGMENT_HEADER_LEN as u64,
    end_offset: 0,
};

/// Write-side state, guarded by the writer lock.
#[derive(Debug)]
pub(crate) struct WriterState {
    pub writer: SegmentWriter,
    /// The value of `Partition::rolls` after the roll that created the
    /// writer's segment; 0 for a segment this process did not roll to,
    /// whose name is made durable elsewhere: a new partition's first by its
    /// creation, an older one a reclaim went back to by the roll after it,
    /// a recovered one by the open (which, after an unclean shutdown,
    /// fsyncs the directory of every partition whose chain ends past the
    /// segment its checkpoint entry names).
    pub segment_roll: u64,
    pub rates: RateTracker,
    pub load: LoadMap,
    /// The Raft log's last id and next index (replicated partitions).
    pub raft: raft::RaftTail,
}

/// How a partition's writer and sync rounds use a durable point.
impl DurablePoint {
    /// Where `w`'s data ends: its segment, the byte position after its
    /// last batch, and the offset the next record gets.
    fn of_writer(w: &SegmentWriter) -> DurablePoint {
        DurablePoint {
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
    ) -> (DurablePoint, u64) {
        let pos = DurablePoint {
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
    metrics: crate::metrics::PartitionMetrics,
    segments: RwLock<Segments>,
    writer: Mutex<WriterState>,
    /// Where the writer's data ends ([`DurablePoint::of_writer`]) and
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
    /// A new topic's partition nothing was appended to yet, whose first
    /// segment is neither synced nor named durably: a sync round has
    /// nothing of it to make durable (see [`Partition::capture_unsynced`]).
    /// Cleared by the first position published past the header.
    unwritten_start: AtomicBool,
    /// Rolls so far, counted from 1 at open (the names recovery found are
    /// not known to be durable). Changed under the writer lock.
    rolls: AtomicU64,
    /// The largest value of `rolls` read before a directory fsync that then
    /// completed: every segment created before that read has a durable
    /// name. A roll that finds it behind `rolls` fsyncs the directory
    /// before it creates the new segment (see [`Partition::roll`]).
    dir_synced_rolls: AtomicU64,
    durable: Mutex<DurablePoint>,
    /// Segment bases named by the last two checkpoints written (the newest
    /// valid checkpoint on disk is one of them). Retention keeps these
    /// segments and everything after them: deleting a segment a checkpoint
    /// calls durable would let a crash lose synced offsets that no remaining
    /// file can account for.
    checkpointed_bases: Mutex<(u64, u64)>,
    /// Retention floor: segments starting below it are retired. Recorded
    /// in the checkpoint before their files are unlinked.
    retired_below: AtomicU64,
    /// High watermark of a replicated partition: reads under
    /// [`ReadIsolation::Committed`] stop here ([`Partition::set_committed_end`]).
    committed_end: AtomicU64,
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
            s.set_index_interval(p.index_interval);
            s.attach_budget(&p.budget);
        }
        if sealed {
            last.freeze();
        }
        let writer = SegmentWriter::new(last, p.index_interval);
        Partition {
            metrics: crate::metrics::PartitionMetrics::new(&p.topic, p.id),
            written: PositionCell::new(DurablePoint::of_writer(&writer).to_cell(0)),
            writer: Mutex::new(WriterState {
                writer,
                segment_roll: 0,
                rates,
                load,
                raft: raft::RaftTail::default(),
            }),
            p,
            segments: RwLock::new(Segments::from_vec(segments)),
            end_offset: AtomicU64::new(end),
            durable_end: AtomicU64::new(durable.2.min(end)),
            sealed: AtomicBool::new(sealed),
            poisoned: Mutex::new(None),
            is_poisoned: AtomicBool::new(false),
            poison_unreported: AtomicBool::new(false),
            dir_dirty: AtomicBool::new(false),
            unwritten_start: AtomicBool::new(false),
            rolls: AtomicU64::new(1),
            dir_synced_rolls: AtomicU64::new(0),
            checkpointed_bases: Mutex::new((durable.0, durable.0)),
            retired_below: AtomicU64::new(0),
            logical_end: AtomicU64::new(u64::MAX),
            committed_end: AtomicU64::new(0),
            removed: AtomicBool::new(false),
            deleted: AtomicBool::new(false),
            durable: Mutex::new(DurablePoint {
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

    /// Marks the first segment of a new topic's partition as not yet
    /// named durably: its directory entry, like a rolled segment's, becomes
    /// durable by the directory fsync of the first sync round that captures
    /// a position in it. `rolls` starts at 1 and `dir_synced_rolls` at 0,
    /// so a segment counted as created by roll 1 is fsynced into its
    /// directory by that round (or by the roll that follows it, before the
    /// next segment is created).
    ///
    /// While nothing is appended, a sync round skips the partition: a
    /// never-written partition costs no fsync, at its first round, at a
    /// clean close or after a reopen that finds it still empty (recovery
    /// marks such a partition again).
    pub(crate) fn first_segment_unnamed(&self) {
        let mut w = self.writer.lock();
        w.segment_roll = 1;
        self.unwritten_start.store(
            DurablePoint::of_writer(&w.writer) == UNWRITTEN,
            Ordering::Release,
        );
        self.publish_written(&w);
    }

    /// Whether nothing was appended to this new partition yet (see
    /// [`Partition::first_segment_unnamed`]).
    pub(crate) fn is_unwritten_start(&self) -> bool {
        self.unwritten_start.load(Ordering::Acquire)
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
            ReadIsolation::Committed => self
                .committed_end
                .load(Ordering::SeqCst)
                .min(self.durable_end_offset()),
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
    pub(crate) fn segments(&self) -> Segments {
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
