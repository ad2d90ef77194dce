//! A partition: a chain of segments with one writer and lock-free readers.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::balance::{LoadMap, RateTracker};
use crate::error::{Error, Result};
use crate::format::batch::{self, RecordIn};
use crate::format::checkpoint::PartitionCheckpoint;
use crate::read::ReadBatch;
use crate::storage::fault::IoHook;
use crate::storage::segment::{Segment, SegmentWriter};

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
}

/// Write-side state, guarded by the writer lock.
#[derive(Debug)]
pub(crate) struct WriterState {
    pub writer: SegmentWriter,
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

/// One partition.
#[derive(Debug)]
pub struct Partition {
    pub(crate) p: PartitionParams,
    segments: RwLock<Arc<Vec<Arc<Segment>>>>,
    writer: Mutex<WriterState>,
    end_offset: AtomicU64,
    sealed: AtomicBool,
    poisoned: Mutex<Option<String>>,
    /// Set once `poisoned` holds a reason (checked on every append without the mutex).
    is_poisoned: AtomicBool,
    dir_dirty: AtomicBool,
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
    tail_lock: Mutex<()>,
    tail_cv: Condvar,
    waiters: AtomicUsize,
    hook: Arc<dyn IoHook>,
    clock: Arc<dyn crate::balance::Clock>,
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
    pub pos: DurablePos,
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
    ) -> Partition {
        let last = segments
            .last()
            .expect("a partition has at least one segment")
            .clone();
        let end = last.end_offset();
        for s in &segments {
            s.attach_hook(&hook);
        }
        Partition {
            writer: Mutex::new(WriterState {
                writer: SegmentWriter::new(last, p.index_interval),
                rates,
                load,
            }),
            p,
            segments: RwLock::new(Arc::new(segments)),
            end_offset: AtomicU64::new(end),
            sealed: AtomicBool::new(sealed),
            poisoned: Mutex::new(None),
            is_poisoned: AtomicBool::new(false),
            dir_dirty: AtomicBool::new(false),
            checkpointed_bases: Mutex::new((durable.0, durable.0)),
            retired_below: AtomicU64::new(0),
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

    /// Offset the next appended record gets (exclusive end).
    pub fn end_offset(&self) -> u64 {
        self.end_offset.load(Ordering::Acquire)
    }

    /// First offset still held (older segments may have been deleted).
    pub fn start_offset(&self) -> u64 {
        self.segments.read().first().map_or(0, |s| s.base_offset)
    }

    /// Whether the partition is sealed.
    pub fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }

    /// Snapshot of the segment list.
    pub fn segments(&self) -> Arc<Vec<Arc<Segment>>> {
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

    /// Marks the partition unusable for writes after a failed sync.
    pub(crate) fn poison(&self, reason: String) {
        let mut g = self.poisoned.lock();
        if g.is_none() {
            *g = Some(reason);
        }
        self.is_poisoned.store(true, Ordering::Release);
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
        let len = self.check_batch(records)?;
        let base = {
            let mut w = self.writer.lock();
            self.check_writable()?;
            if (len as u64) > w.writer.remaining() {
                self.roll(&mut w)?;
            }
            w.writer.reserve(len as u64)?;
            let header = w.writer.append(records, len);
            let now = self.clock.now_nanos();
            w.rates.record(now, records.len() as u64, len as u64);
            for (r, h) in records.iter().zip(hashes) {
                if let Some(h) = h {
                    w.load.observe(now, *h, r.encoded_len() as u64);
                }
            }
            let end = w.writer.next_offset();
            self.end_offset.store(end, Ordering::Release);
            header.base_offset.get()
        };
        if self.waiters.load(Ordering::Acquire) > 0 {
            let _g = self.tail_lock.lock();
            self.tail_cv.notify_all();
        }
        Ok(base)
    }

    /// Seals the active segment and starts a new one. Creating the new
    /// file is the only step that can fail, and it comes first: on failure
    /// it is removed again and the old segment, still unsealed, keeps
    /// taking appends, so a later roll starts from the same state. Sealing
    /// cannot fail (its index write is a cache).
    fn roll(&self, w: &mut WriterState) -> Result<()> {
        let next = w.writer.next_offset();
        let seg = Segment::create(
            &self.p.dir,
            (self.p.topic_id, self.p.id),
            next,
            self.p.segment_bytes,
            now_ms(),
            &*self.hook,
        )?;
        seg.attach_hook(&self.hook);
        w.writer.seal();
        let seg = Arc::new(seg);
        {
            let mut list = self.segments.write();
            let mut v = (**list).clone();
            v.push(seg.clone());
            *list = Arc::new(v);
        }
        self.dir_dirty.store(true, Ordering::Release);
        w.writer = SegmentWriter::new(seg, self.p.index_interval);
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
    pub(crate) fn seal_with<T>(&self, commit: impl FnOnce(u64) -> Result<T>) -> Result<T> {
        let w = self.writer.lock();
        self.check_writable()?;
        let end = w.writer.next_offset();
        let out = commit(end)?;
        self.sealed.store(true, Ordering::Release);
        // The partition takes no more appends: give back the preallocated
        // space of its last segment (a failure only keeps that space).
        let _ = w.writer.segment().trim();
        drop(w);
        let _g = self.tail_lock.lock();
        self.tail_cv.notify_all();
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

    /// Reads from `offset`: at least one batch, then more while under `max_bytes`.
    pub fn read(&self, offset: u64, max_bytes: usize) -> Result<ReadBatch> {
        let segments = self.segments();
        let end = self.end_offset();
        let start = segments.first().map_or(0, |s| s.base_offset);
        if offset < start || offset >= end {
            return Err(Error::OffsetOutOfRange {
                partition: self.p.id,
                offset,
                start,
                end,
            });
        }
        let i = segments.partition_point(|s| s.base_offset <= offset) - 1;
        let seg = &segments[i];
        if offset >= seg.end_offset() {
            let next = segments.get(i + 1).map_or(end, |s| s.base_offset);
            return Err(Error::Hole {
                partition: self.p.id,
                start: seg.end_offset(),
                end: next,
            });
        }
        ReadBatch::new(self.p.id, seg.clone(), offset, max_bytes)
    }

    /// Blocks until `offset` is readable, the partition is sealed below it,
    /// or `timeout` passes. Returns whether data is there.
    pub fn wait_for(&self, offset: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.waiters.fetch_add(1, Ordering::AcqRel);
        let mut g = self.tail_lock.lock();
        let ready = loop {
            if self.end_offset() > offset {
                break true;
            }
            if self.is_sealed() || self.tail_cv.wait_until(&mut g, deadline).timed_out() {
                break self.end_offset() > offset;
            }
        };
        drop(g);
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        ready
    }

    /// First offset whose record timestamp is >= `ts` (None: none yet).
    pub fn offset_for_time(&self, ts: i64) -> Result<Option<u64>> {
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

    /// Captures what a sync round must make durable.
    pub(crate) fn capture_unsynced(&self) -> SyncCapture {
        let w = self.writer.lock();
        let active = w.writer.segment().clone();
        let pos = DurablePos {
            segment_base: active.base_offset,
            position: active.committed_pos(),
            end_offset: w.writer.next_offset(),
        };
        drop(w);
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
            sync_dir: self.dir_dirty.swap(false, Ordering::AcqRel),
            pos,
        }
    }

    /// Records the outcome of a sync round.
    pub(crate) fn sync_done(&self, cap: &SyncCapture, ok: bool) {
        if ok {
            for (s, pos, seal) in &cap.segments {
                s.set_synced_pos(*pos);
                if *seal {
                    s.set_seal_synced();
                }
            }
            *self.durable.lock() = cap.pos;
        } else if cap.sync_dir {
            self.dir_dirty.store(true, Ordering::Release);
        }
    }

    /// Checkpoint entry: the durable position and the write rates.
    pub(crate) fn checkpoint_entry(&self, durable: Option<DurablePos>) -> PartitionCheckpoint {
        let d = durable.unwrap_or_else(|| *self.durable.lock());
        {
            let mut bases = self.checkpointed_bases.lock();
            *bases = (bases.1, d.segment_base);
        }
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
            let expired = age.is_some_and(|a| {
                s.max_timestamp() != i64::MIN && now_ms - s.max_timestamp() > a.as_millis() as i64
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
        RetentionPlan {
            floor_moved: new_floor > 0
                && self.retired_below.fetch_max(new_floor, Ordering::AcqRel) < new_floor,
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
            let s = v.remove(0);
            let _ = std::fs::remove_file(s.index_path());
            std::fs::remove_file(s.path()).map_err(|e| Error::io(s.path(), e))?;
            removed.push(s.path().to_path_buf());
        }
        if !removed.is_empty() {
            *list = Arc::new(v);
            self.dir_dirty.store(true, Ordering::Release);
        }
        Ok(removed)
    }

    /// Writes the active segment's index file durably (clean close), so a
    /// power loss after a clean close never leaves it stale.
    pub(crate) fn flush_index(&self) -> Result<()> {
        let w = self.writer.lock();
        w.writer.segment().write_index_file(true)
    }

    /// Whether every segment was removed by retention (sealed partitions only).
    pub fn is_empty_sealed(&self) -> bool {
        self.is_sealed() && self.segments.read().is_empty()
    }
}
