//! The partition as a Raft log (docs/REPLICATION.md): one Raft entry is
//! one format-2 batch, appended only at `last + 1`; entries are found by
//! Raft index, and the first and last log ids come from the batch headers.
//!
//! Finding a batch by Raft index: the segments' first indexes are read
//! from their first batch headers (in the mapping, so in memory), a binary
//! search over them picks the segment, and a binary search over the
//! segment's sparse index entries (whose positions are batch starts, each
//! header naming its Raft index) picks where to walk from, so at most
//! `index_interval` bytes of headers are walked. The sparse index file
//! gains no Raft column: the header it points at carries the index.

use super::*;
use crate::format::batch::{ControlKind, EntryBody, RaftLogId, BATCH_HEADER_V2_LEN};
use crate::format::segment::SEGMENT_HEADER_LEN;
use crate::read::Record;
use crate::storage::segment::{CommittedBytes, IndexState, Segments};

/// Where [`Partition::append_entry`] put an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntryPos {
    /// The entry's log id.
    pub id: RaftLogId,
    /// Offset of its first record (a control entry: the partition's end,
    /// which it does not take).
    pub base_offset: u64,
    /// Offset after its records (`base_offset` for a control entry).
    pub end_offset: u64,
    /// Base offset of the segment holding it.
    pub segment_base: u64,
    /// File position just past the batch in that segment: the entry is
    /// durable once a sync round covered it ([`Partition::is_entry_durable`]).
    pub end_position: u64,
}

/// Raft state kept under the writer lock.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RaftTail {
    /// The last entry's log id; `None` when it was not read yet.
    pub last: Option<Option<RaftLogId>>,
    /// The index the next entry must have when the log holds none (after
    /// a truncation or purge emptied it); `None`: any.
    pub next_when_empty: Option<u64>,
    /// A truncation from this index is in progress: appends wait for it
    /// (they are refused).
    pub cutting: Option<u64>,
    /// Entries were purged through this index: a log whose entries all
    /// lie at or below it takes this + 1 next (a snapshot installed past
    /// the log's end). Set by a purge, and again at open by the caller
    /// from its `raft-meta`.
    pub purged: Option<u64>,
}

/// Where a truncation cuts: the segment (its place in the list), the
/// file position of the first batch removed and its offset.
#[derive(Debug, Clone, Copy)]
struct Cut {
    k: usize,
    position: u64,
    offset: u64,
}

/// How long a truncation waits for readers holding the segment it cuts.
const CUT_READER_WAIT: Duration = Duration::from_secs(10);

/// One Raft entry read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftEntry<'a> {
    /// Its log id.
    pub id: RaftLogId,
    /// Offset of its first record (a control entry: the offset it sits at).
    pub base_offset: u64,
    /// The leader's timestamp of a control entry; a data entry's first
    /// record's.
    pub timestamp: i64,
    /// Its body.
    pub body: RaftEntryBody<'a>,
    /// The whole batch as stored (header included), for zero-copy
    /// replication.
    pub bytes: &'a [u8],
}

/// What a Raft entry holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RaftEntryBody<'a> {
    /// Records, with their offsets.
    Records(Vec<Record<'a>>),
    /// A control entry: its kind and encoded body.
    Control(ControlKind, &'a [u8]),
}

/// Whole format-2 batches read by Raft index from one segment (see
/// [`Partition::read_entries`]); keeps the mapping alive as a
/// [`ReadBatch`] does.
#[derive(Debug, Clone)]
pub struct EntryBatch {
    partition: u32,
    segment: Arc<Segment>,
    /// The committed bytes with their mapping, kept mapped while this
    /// lives whatever the log's budget evicts.
    data: CommittedBytes,
    _lock: Option<Arc<DirLock>>,
    start: u64,
    end: u64,
    first_index: u64,
    count: u64,
}

impl EntryBatch {
    /// Raft index of the first entry.
    pub fn first_index(&self) -> u64 {
        self.first_index
    }

    /// Index after the last entry read: where the next read starts.
    pub fn next_index(&self) -> u64 {
        self.first_index + self.count
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether no entry was read (never, for a batch `read_entries` returned).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The raw batches (zero copy).
    pub fn as_bytes(&self) -> &[u8] {
        self.data.range(self.start, self.end)
    }

    /// The entries, parsed again (CRC included) as they are iterated:
    /// bytes changed since they were read are an error item, then the end.
    pub fn entries(&self) -> impl Iterator<Item = Result<RaftEntry<'_>>> + '_ {
        let data = &self.data;
        let mut pos = self.start;
        let mut expected = self.first_index;
        let mut failed = false;
        std::iter::from_fn(move || {
            if failed || pos >= self.end {
                return None;
            }
            let item = entry_at(&self.segment, data.range(pos, self.end), pos, expected);
            match &item {
                Ok(e) => {
                    pos += e.bytes.len() as u64;
                    expected += 1;
                }
                Err(_) => failed = true,
            }
            Some(item)
        })
    }

    /// Partition the entries come from.
    pub fn partition(&self) -> u32 {
        self.partition
    }
}

/// The entry at the start of `bytes` (file position `pos`), which must
/// have Raft index `expected`.
fn entry_at<'a>(seg: &Segment, bytes: &'a [u8], pos: u64, expected: u64) -> Result<RaftEntry<'a>> {
    let f = batch::validate_fields(bytes, None)
        .map_err(|e| Error::corruption(seg.path(), pos, e.to_string()))?;
    let bytes = &bytes[..f.batch_len as usize];
    let Some(h) = batch::header_v2(bytes) else {
        return Err(Error::corruption(
            seg.path(),
            pos,
            "a format-1 batch in a Raft log",
        ));
    };
    if h.log_id().index != expected {
        return Err(Error::corruption(
            seg.path(),
            pos,
            format!(
                "Raft index {} where {expected} was expected",
                h.log_id().index
            ),
        ));
    }
    let body = if let Some((kind, body)) = batch::control_body(bytes) {
        RaftEntryBody::Control(kind, body)
    } else {
        let mut records = Vec::with_capacity(f.record_count as usize);
        for r in batch::RecordIter::from_fields(bytes, &f) {
            let r = r.map_err(|e| Error::corruption(seg.path(), pos, e.to_string()))?;
            records.push(Record {
                offset: r.offset,
                timestamp: r.timestamp,
                key: r.key,
                value: r.value,
            });
        }
        RaftEntryBody::Records(records)
    };
    Ok(RaftEntry {
        id: h.log_id(),
        base_offset: f.base_offset,
        timestamp: f.first_ts,
        body,
        bytes,
    })
}

/// The log id of the format-2 batch at file position `pos` of `seg`.
fn log_id_at(seg: &Segment, pos: u64) -> Option<RaftLogId> {
    if pos < SEGMENT_HEADER_LEN as u64 || pos >= seg.committed_pos() {
        return None;
    }
    let data = seg.committed().ok()?;
    batch::header_v2(data.from(pos)).map(|h| h.log_id())
}

/// The log id of a segment's first batch (`None`: it holds none).
fn first_id(seg: &Segment) -> Option<RaftLogId> {
    log_id_at(seg, SEGMENT_HEADER_LEN as u64)
}

/// Walks a segment's batch headers from `from` (a batch start) to its
/// committed end: `(position, header fields)` of each.
fn walk(seg: &Segment, from: u64) -> impl Iterator<Item = (u64, batch::HeaderFields)> + '_ {
    // Nothing to walk while the segment cannot be mapped (a shortage).
    let data = seg.committed().ok();
    let end = data.as_ref().map_or(0, |d| d.end_pos());
    let mut pos = from;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let f = batch::header_fields(data.as_ref()?.from(pos)).ok()?;
        let at = pos;
        pos += u64::from(f.batch_len);
        Some((at, f))
    })
}

/// The position of the batch with Raft index `index` in `seg` (whose
/// first index is at most `index`), if the segment holds it.
fn position_of(seg: &Segment, index: u64) -> Option<u64> {
    let mut from = SEGMENT_HEADER_LEN as u64;
    if let IndexState::Loaded(entries) = &*seg.index.lock() {
        // The last index entry whose batch's Raft index is at most `index`.
        let k = entries.partition_point(|e| {
            log_id_at(seg, u64::from(e.position)).is_some_and(|id| id.index <= index)
        });
        if let Some(e) = k.checked_sub(1).map(|k| entries[k]) {
            from = u64::from(e.position);
        }
    }
    walk(seg, from)
        .find(|(pos, _)| log_id_at(seg, *pos).is_some_and(|id| id.index >= index))
        .and_then(|(pos, _)| (log_id_at(seg, pos)?.index == index).then_some(pos))
}

/// The last log id in `segments`, newest segment first.
fn scan_last<'a>(segments: impl DoubleEndedIterator<Item = &'a Arc<Segment>>) -> Option<RaftLogId> {
    segments.rev().find_map(|seg| {
        let mut from = SEGMENT_HEADER_LEN as u64;
        if let IndexState::Loaded(entries) = &*seg.index.lock() {
            if let Some(e) = entries.last() {
                from = u64::from(e.position);
            }
        }
        walk(seg, from)
            .last()
            .and_then(|(pos, _)| log_id_at(seg, pos))
    })
}

impl Partition {
    /// Whether the partition is a Raft log (`TopicConfig::replicated`).
    pub fn is_replicated(&self) -> bool {
        self.p.replicated
    }

    fn require_replicated(&self) -> Result<()> {
        if self.p.replicated {
            Ok(())
        } else {
            Err(Error::ReplicationMismatch {
                topic: self.p.topic.to_string(),
                partition: self.p.id,
                replicated: false,
            })
        }
    }

    /// The last entry's log id, read once from the log under the writer
    /// lock and then kept up to date by appends and cuts.
    pub(super) fn raft_last_locked(&self, w: &mut WriterState) -> Option<RaftLogId> {
        if let Some(last) = w.raft.last {
            return last;
        }
        let last = scan_last(self.segments().iter());
        w.raft.last = Some(last);
        last
    }

    /// Appends one Raft entry as one format-2 batch: records take offsets
    /// as any append's do; a control entry takes none, so record offsets
    /// stay dense and no reader sees it. Refuses an index that is not the
    /// last entry's + 1, or a term below the last entry's
    /// ([`Error::RaftIndexMismatch`]); an empty log (new, or emptied by a
    /// cut) takes the index the cut left, any index when it never held one
    /// since open (the caller's `raft-meta` knows the purged id). Readable
    /// on return; durable once a sync round covered
    /// [`EntryPos::end_position`].
    pub fn append_entry(&self, id: RaftLogId, body: EntryBody<'_>) -> Result<EntryPos> {
        self.require_replicated()?;
        let len = match body {
            EntryBody::Records(records) => {
                self.check_batch(records)? + (BATCH_HEADER_V2_LEN - batch::BATCH_HEADER_LEN)
            }
            EntryBody::Control(..) => body.batch_len(),
        };
        let room = self.p.segment_bytes - SEGMENT_HEADER_LEN as u64;
        if len as u64 > room {
            return Err(Error::RecordTooLarge {
                size: len as u64,
                max: room,
            });
        }
        let count = body.record_count() as u64;
        let pos = {
            let mut w = self.writer.lock();
            self.check_writable()?;
            if let Some(cut) = w.raft.cutting {
                return Err(Error::RaftIndexMismatch {
                    topic: self.p.topic.to_string(),
                    partition: self.p.id,
                    expected: cut,
                    min_term: 0,
                    index: id.index,
                    term: id.term,
                });
            }
            let last = self.raft_last_locked(&mut w);
            let past_purge = w.raft.purged.filter(|p| last.is_none_or(|l| l.index <= *p));
            let (expected, min_term) = match (past_purge, last) {
                (Some(p), _) => (Some(p + 1), 0),
                (None, Some(l)) => (Some(l.index + 1), l.term),
                (None, None) => (w.raft.next_when_empty, 0),
            };
            if expected.is_some_and(|x| x != id.index) || id.term < min_term {
                return Err(Error::RaftIndexMismatch {
                    topic: self.p.topic.to_string(),
                    partition: self.p.id,
                    expected: expected.unwrap_or(id.index),
                    min_term,
                    index: id.index,
                    term: id.term,
                });
            }
            if (len as u64) > w.writer.remaining() {
                self.roll(&mut w)?;
            }
            let base = w.writer.next_offset();
            let now = now_ms();
            w.writer.append_encoded(len, count, |dst| {
                batch::encode_batch_v2(dst, base, id, body, now).base
            })?;
            w.rates.record(self.clock.now_nanos(), count, len as u64);
            w.raft.last = Some(Some(id));
            self.publish_written(&w);
            self.mark_dirty();
            EntryPos {
                id,
                base_offset: base,
                end_offset: base + count,
                segment_base: w.writer.segment().base_offset,
                end_position: w.writer.segment().committed_pos(),
            }
        };
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.tail_lock.lock();
            self.tail_cv.notify_all();
        }
        self.p.wake.notify(self.p.id);
        Ok(pos)
    }

    /// Where cutting from Raft index `index` starts, `None` when the log
    /// holds nothing from there on.
    fn locate_cut(&self, segments: &Segments, index: u64) -> Option<Cut> {
        let k = segments.partition_point(|s| first_id(s).is_some_and(|id| id.index < index));
        // The first segment whose first entry is at or past `index`, or
        // the one before it, holding `index` itself.
        let (k, position) = match k.checked_sub(1) {
            Some(j) => match position_of(&segments[j], index) {
                Some(pos) => (j, pos),
                // `index` opens the next segment, a rolled one: the cut is
                // the end of this one, and the next one goes whole (a
                // rolled segment never takes appends again from its base).
                None if segments.get(k).is_some_and(|s| {
                    s.is_sealed() && first_id(s).is_some_and(|id| id.index == index)
                }) =>
                {
                    (j, segments[j].committed_pos())
                }
                None => (k, SEGMENT_HEADER_LEN as u64),
            },
            None => (0, SEGMENT_HEADER_LEN as u64),
        };
        let seg = segments.get(k)?;
        if position >= seg.committed_pos() && k + 1 >= segments.len() {
            return None;
        }
        let offset = if position >= seg.committed_pos() {
            seg.end_offset()
        } else {
            batch::header_fields(seg.committed().ok()?.from(position))
                .ok()?
                .base_offset
        };
        Some(Cut {
            k,
            position,
            offset,
        })
    }

    /// Removes every entry from Raft index `index` on (openraft's
    /// `truncate`), durably before it returns, and refuses a cut that
    /// would remove a record below `committed_end` (or below the committed
    /// end published with [`Partition::set_committed_end`]) with
    /// [`Error::TruncateBelowCommitted`]. `sync` runs a sync round that
    /// writes the recovery checkpoint (`Topic::truncate_from_index` passes
    /// the log's).
    ///
    /// Crash order, each step durable before the next: (1) the durable
    /// position drops to the cut and a checkpoint naming it is written,
    /// so no checkpoint ever names bytes past the cut once they are gone;
    /// (2) segments wholly past the cut are unlinked, newest first, the
    /// directory fsynced after each (the files left are a prefix of the
    /// chain); (3) the segment holding the cut has its bytes past it
    /// zeroed and punched out, and is fdatasynced. A crash before (3)
    /// completes leaves a prefix of the old log longer than the cut, as if
    /// the truncation had not been asked for; openraft issues no append
    /// or vote before this returns. Appends are refused meanwhile. A
    /// reader holding a batch of the segment that is cut keeps its bytes:
    /// the cut waits for it (up to ten seconds, then the truncation fails
    /// and may be asked again), and a reader that comes while the files
    /// are cut reads up to the cut only (its segment is taken under the
    /// list lock, which the cut holds until the segment ends there). A cut from the first entry of a rolled
    /// segment is the end of the segment before it; one that would leave a
    /// rolled segment without a record before the cut is refused
    /// ([`Error::InvalidConfig`]) before anything changes.
    pub(crate) fn truncate_from_index_with(
        &self,
        index: u64,
        committed_end: u64,
        sync: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        self.require_replicated()?;
        let cut = {
            let mut w = self.writer.lock();
            self.check_writable()?;
            let Some(cut) = self.locate_cut(&self.segments(), index) else {
                return Ok(());
            };
            let floor = committed_end.max(self.committed_end());
            if cut.offset < floor {
                return Err(Error::TruncateBelowCommitted {
                    partition: self.p.id,
                    offset: cut.offset,
                    committed_end: floor,
                });
            }
            let seg = &self.segments()[cut.k];
            // Refused before anything changes: the appends after the cut
            // would need a new segment named as this rolled one.
            if cut.offset == seg.base_offset && seg.is_sealed() {
                return Err(Error::InvalidConfig(format!(
                    "partition {}: a Raft truncation inside a rolled segment that holds no record before the cut",
                    self.p.id
                )));
            }
            w.raft.cutting = Some(index);
            self.set_reclaimed_end(seg.base_offset, cut.position, cut.offset);
            cut
        };
        let done = sync().and_then(|()| self.cut_files(cut));
        let mut w = self.writer.lock();
        w.raft.cutting = None;
        if done.is_ok() {
            w.raft.last = None;
            w.raft.next_when_empty = Some(index);
        }
        done
    }

    /// Steps (2) and (3) of [`Partition::truncate_from_index_with`].
    fn cut_files(&self, cut: Cut) -> Result<()> {
        let deadline = std::time::Instant::now() + CUT_READER_WAIT;
        loop {
            let mut w = self.writer.lock();
            let mut list = self.segments.write();
            let v = list.clone();
            let keep = v[cut.k].clone();
            let later: Vec<Arc<Segment>> = v.iter().skip(cut.k + 1).cloned().collect();
            // Held by the list, the writer (when it is the writer's) and
            // `keep` (a clone of the list shares its slots): more means a
            // reader holds it.
            let writer_holds = Arc::ptr_eq(w.writer.segment(), &keep);
            let held = 2 + usize::from(writer_holds);
            if Arc::strong_count(&keep) > held && cut.position < keep.committed_pos() {
                drop((list, w, keep, later, v));
                if std::time::Instant::now() >= deadline {
                    return Err(Error::Io {
                        path: self.p.dir.clone(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::WouldBlock,
                            "a reader holds the segment a Raft truncation cuts",
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            *list = v.truncated(cut.k + 1);
            drop(v);
            // Not published yet: the writer's position is `keep`'s old
            // end, past the cut. Published, it would raise the
            // partition's end back over the truncated entries while they
            // are cut (readers would see them, and a sync round would
            // take them as durable and checkpoint them); the published
            // position stays the one before the truncation, which a sync
            // round finds past the end and ignores.
            w.writer = SegmentWriter::new(keep.clone(), self.p.index_interval);
            w.segment_roll = 0;
            self.unlink_newest_first(&later)
                .map_err(|e| self.poisoned_by_cut(e))?;
            drop(later);
            // The list stays locked until `keep` ends at the cut: a reader
            // takes its segment under the list lock (`read_entries`,
            // `read_with`), so it either took it before the count above
            // (and the cut waited for it) or takes it once its bytes past
            // the cut can no longer be read.
            if cut.position < keep.committed_pos() {
                keep.release_past(cut.position, cut.offset)
                    .map_err(|e| self.poisoned_by_cut(e))?;
            }
            drop(list);
            w.writer = SegmentWriter::new(keep.clone(), self.p.index_interval);
            self.publish_written(&w);
            self.set_reclaimed_end(keep.base_offset, cut.position, cut.offset);
            if keep.is_sealed() && !self.is_sealed() {
                // A rolled segment takes no appends again: the next ones
                // go to a new segment starting at the cut (refused above
                // when that is the rolled segment's own base).
                self.roll(&mut w).map_err(|e| self.poisoned_by_cut(e))?;
            }
            return Ok(());
        }
    }

    /// A truncation that failed once it started cutting files leaves the
    /// chain part cut and the writer on the segment it cuts (possibly a
    /// rolled one): no append may land there. The partition refuses
    /// appends until a reopen recovers what the files hold (a prefix of
    /// the old log, the checkpoint at the cut being durable).
    fn poisoned_by_cut(&self, e: Error) -> Error {
        // Registered by the next sync round, as a roll's failed directory
        // fsync is (see `roll`).
        self.poison_unreported.store(true, Ordering::Release);
        self.poison(format!("a Raft truncation failed part way: {e}"));
        self.mark_dirty();
        e
    }

    /// Deletes the whole segments whose entries all lie at or below Raft
    /// index `index` (openraft's `purge`: retention), never part of one
    /// and never the segment being written; returns the files removed.
    /// As retention does, the new floor is made durable first (`sync`
    /// writes a checkpoint carrying it), then the files go; a crash in
    /// between leaves files below the floor, which the next open deletes.
    /// A segment a recent checkpoint names stays until newer checkpoints
    /// are written (a later purge takes it).
    pub(crate) fn purge_through_index_with(
        &self,
        index: u64,
        sync: &dyn Fn() -> Result<()>,
    ) -> Result<Vec<PathBuf>> {
        self.require_replicated()?;
        self.purge_past_the_end(index, sync)?;
        let (mut i, held) = self.purge_plan(index);
        if held {
            // Segments the last two checkpoints name stay: two checkpoints
            // written now name the newest durable segment instead.
            sync()?;
            sync()?;
            (i, _) = self.purge_plan(index);
        }
        let v = self.segments();
        if i == 0 {
            return Ok(Vec::new());
        }
        let new_floor = v[i].base_offset;
        drop(v);
        if self.retired_below.fetch_max(new_floor, Ordering::AcqRel) < new_floor {
            self.mark_dirty();
        }
        sync()?;
        self.delete_retired()
    }

    /// A purge through `index` at or past the last entry (a snapshot
    /// installed past the log's end): the next entry is `index + 1`, and
    /// it must open a segment, since recovery checks that the indexes of
    /// one segment's batches follow each other. A writer segment holding
    /// records rolls; one holding only control entries cannot (its
    /// successor would have its name), so those entries are cut, durably
    /// (they are purged anyway). Idempotent: the caller repeats it at open
    /// from its `raft-meta`, which covers a crash at any step.
    fn purge_past_the_end(&self, index: u64, sync: &dyn Fn() -> Result<()>) -> Result<()> {
        let cut_from = {
            let mut w = self.writer.lock();
            let last = self.raft_last_locked(&mut w);
            if last.is_some_and(|l| l.index > index) {
                return Ok(());
            }
            let seg = w.writer.segment().clone();
            let cut_from = if seg.committed_pos() <= SEGMENT_HEADER_LEN as u64 {
                None
            } else if w.writer.next_offset() > seg.base_offset {
                self.check_writable()?;
                self.roll(&mut w)?;
                None
            } else {
                first_id(&seg).map(|id| id.index)
            };
            w.raft.purged = w.raft.purged.max(Some(index));
            cut_from
        };
        match cut_from {
            Some(from) => self.truncate_from_index_with(from, 0, sync),
            None => Ok(()),
        }
    }

    /// How many leading segments a purge through `index` removes, and
    /// whether one more would go but for a checkpoint naming it.
    fn purge_plan(&self, index: u64) -> (usize, bool) {
        let v = self.segments();
        let floor = {
            let bases = self.checkpointed_bases.lock();
            bases.0.min(bases.1)
        };
        let mut i = 0;
        while i + 1 < v.len() {
            let last = match first_id(&v[i + 1]) {
                Some(next) => next.index.checked_sub(1),
                None => scan_last(std::iter::once(&v[i])).map(|id| id.index),
            };
            if last.is_none_or(|l| l > index) {
                return (i, false);
            }
            if v[i].base_offset >= floor {
                return (i, true);
            }
            i += 1;
        }
        (i, false)
    }

    /// Whether a completed sync round covered the entry at `pos` (its
    /// segment's bytes up to `pos.end_position` are on disk).
    pub fn is_entry_durable(&self, pos: &EntryPos) -> bool {
        let d = self.durable.lock();
        (d.segment_base, d.position) >= (pos.segment_base, pos.end_position)
    }

    /// Publishes the committed end (high watermark): reads and tail waits
    /// under [`ReadIsolation::Committed`] see records below it. Only
    /// rises; a lower value is ignored (Raft never un-commits, and a
    /// reader must never see the end go back). Wakes tail waiters.
    pub fn set_committed_end(&self, offset: u64) {
        let offset = offset.min(self.end_offset.load(Ordering::SeqCst));
        if self.committed_end.fetch_max(offset, Ordering::SeqCst) >= offset {
            return;
        }
        {
            let _g = self.tail_lock.lock();
            self.tail_cv.notify_all();
        }
        self.p.wake.notify_partition(self.p.id);
    }

    /// The committed end published so far (0 before any).
    pub fn committed_end(&self) -> u64 {
        self.committed_end.load(Ordering::SeqCst)
    }

    /// The last entry's log id (`None`: the log holds no entry).
    pub fn last_log_id(&self) -> Option<RaftLogId> {
        let mut w = self.writer.lock();
        self.raft_last_locked(&mut w)
    }

    /// The first entry's log id (`None`: the log holds no entry).
    pub fn first_log_id(&self) -> Option<RaftLogId> {
        self.segments().iter().find_map(|s| first_id(s))
    }

    /// Reads whole entries from Raft index `from_index` on, from one
    /// segment: at least one, then more while under `max_bytes`. Entries
    /// are read whether committed or not (the Raft log's own reader).
    /// [`Error::RaftIndexOutOfRange`] when the log does not hold the index.
    pub fn read_entries(&self, from_index: u64, max_bytes: usize) -> Result<EntryBatch> {
        self.require_replicated()?;
        // The segment is taken under the list lock, which a Raft
        // truncation holds from its count of a segment's holders until
        // the segment ends at the cut (see `cut_files`).
        let list = self.segments.read();
        let segments = list.clone();
        let out_of_range = || Error::RaftIndexOutOfRange {
            topic: self.p.topic.to_string(),
            partition: self.p.id,
            index: from_index,
            first: segments.iter().find_map(|s| first_id(s)).map(|i| i.index),
            last: scan_last(segments.iter()).map(|i| i.index),
        };
        let k = segments.partition_point(|s| first_id(s).is_some_and(|id| id.index <= from_index));
        let Some(seg) = k.checked_sub(1).map(|k| segments[k].clone()) else {
            return Err(out_of_range());
        };
        drop(list);
        let seg = &seg;
        let Some(start) = position_of(seg, from_index) else {
            return Err(out_of_range());
        };
        let data = seg.committed()?;
        let mut end = start;
        let mut count = 0;
        for (pos, f) in walk(seg, start) {
            if count > 0 && (pos - start) as usize >= max_bytes {
                break;
            }
            let bytes = data.from(pos);
            if let Err(e) = batch::validate_fields(bytes, Some(f.base_offset)) {
                return Err(Error::corruption(seg.path(), pos, e.to_string()));
            }
            end = pos + u64::from(f.batch_len);
            count += 1;
        }
        Ok(EntryBatch {
            partition: self.p.id,
            segment: seg.clone(),
            data,
            _lock: self.p.lock.clone(),
            start,
            end,
            first_index: from_index,
            count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LogOptions, TopicConfig};
    use crate::log::Log;
    use crate::topic::Topic;

    pub(crate) fn replicated_config(segment_bytes: u64) -> TopicConfig {
        let mut cfg = TopicConfig {
            segment_bytes,
            index_interval_bytes: 256,
            replicated: true,
            ..TopicConfig::default()
        };
        cfg.balance.enabled = false;
        cfg
    }

    fn open(dir: &Path) -> (Log, Topic) {
        let log = Log::open(dir, LogOptions::default()).unwrap();
        let t = match log.topic("r") {
            Ok(t) => t,
            Err(_) => log.create_topic("r", replicated_config(8192)).unwrap(),
        };
        (log, t)
    }

    fn id(term: u64, index: u64) -> RaftLogId {
        RaftLogId {
            term,
            leader: 1,
            index,
        }
    }

    fn rec(v: &[u8]) -> RecordIn<'_> {
        RecordIn {
            key: Some(b"k"),
            value: v,
            timestamp: 1,
        }
    }

    /// Appends entries 1..=n of term 1: every third a control entry, the
    /// others one record each whose value names the index.
    fn fill(p: &Partition, from: u64, n: u64) -> Vec<EntryPos> {
        (from..from + n)
            .map(|i| {
                let v = format!("{i:0100}");
                if i % 3 == 0 {
                    p.append_entry(id(1, i), EntryBody::Control(ControlKind::Blank, b""))
                } else {
                    p.append_entry(id(1, i), EntryBody::Records(&[rec(v.as_bytes())]))
                }
                .unwrap()
            })
            .collect()
    }

    #[test]
    fn an_entry_whose_index_is_not_last_plus_one_or_whose_term_falls_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, t) = open(dir.path());
        let p = t.partition(0).unwrap();
        p.append_entry(id(2, 5), EntryBody::Records(&[rec(b"a")]))
            .unwrap();
        for bad in [id(2, 5), id(2, 7), id(1, 6)] {
            let e = p
                .append_entry(bad, EntryBody::Records(&[rec(b"b")]))
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::RaftIndexMismatch {
                        expected: 6,
                        min_term: 2,
                        ..
                    }
                ),
                "{e}"
            );
        }
        assert_eq!(p.end_offset(), 1, "a refused entry took no offset");
        p.append_entry(id(3, 6), EntryBody::Records(&[rec(b"c")]))
            .unwrap();
        assert_eq!(p.last_log_id(), Some(id(3, 6)));
    }

    #[test]
    fn control_entries_take_no_offset_and_no_read_shows_them() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, t) = open(dir.path());
        let p = t.partition(0).unwrap();
        let c = p
            .append_entry(id(1, 1), EntryBody::Control(ControlKind::Blank, b""))
            .unwrap();
        assert_eq!((c.base_offset, c.end_offset), (0, 0));
        p.append_entry(id(1, 2), EntryBody::Records(&[rec(b"a"), rec(b"b")]))
            .unwrap();
        let m = p
            .append_entry(id(1, 3), EntryBody::Control(ControlKind::Membership, b"m"))
            .unwrap();
        assert_eq!((m.base_offset, m.end_offset), (2, 2));
        p.append_entry(id(1, 4), EntryBody::Records(&[rec(b"c")]))
            .unwrap();
        assert_eq!(p.end_offset(), 3, "offsets stay dense");
        let b = p.read_with(0, 1 << 20, ReadIsolation::Written).unwrap();
        let got: Vec<_> = b.iter().map(|r| (r.offset, r.value.to_vec())).collect();
        assert_eq!(
            got,
            vec![(0, b"a".to_vec()), (1, b"b".to_vec()), (2, b"c".to_vec())]
        );
        let b = p.read_with(2, 1 << 20, ReadIsolation::Written).unwrap();
        assert_eq!(b.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![2]);
        let mut reader = t.reader(crate::reader::StartAt::Earliest).unwrap();
        reader.set_isolation(ReadIsolation::Written);
        let all = reader.poll(10).unwrap();
        assert_eq!(
            all.iter().map(|r| r.offset).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn a_replicated_partition_refuses_plain_appends_and_writes_version_2_segments() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, t) = open(dir.path());
        let e = t.append(Some(b"k"), b"v").unwrap_err();
        assert!(
            matches!(
                e,
                Error::ReplicationMismatch {
                    replicated: true,
                    ..
                }
            ),
            "{e}"
        );
        let p = t.partition(0).unwrap();
        assert!(p.is_replicated());
        let head = std::fs::read(&p.segment_infos()[0].path).unwrap();
        let info = crate::format::segment::decode_header(&head).unwrap();
        assert_eq!(info.version, crate::format::segment::SEGMENT_VERSION_V2);
        let plain = tempfile::tempdir().unwrap();
        let log = Log::open(plain.path(), LogOptions::default()).unwrap();
        let t = log.create_topic("u", TopicConfig::default()).unwrap();
        let e = t
            .partition(0)
            .unwrap()
            .append_entry(id(1, 1), EntryBody::Records(&[rec(b"a")]));
        assert!(matches!(
            e,
            Err(Error::ReplicationMismatch {
                replicated: false,
                ..
            })
        ));
    }

    #[test]
    fn entries_are_found_by_raft_index_across_rolls_and_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let check = |p: &Partition| {
            assert!(p.segment_count() > 3, "the entries span several segments");
            assert_eq!(p.first_log_id(), Some(id(1, 1)));
            assert_eq!(p.last_log_id(), Some(id(1, 200)));
            for i in 1..=200 {
                let b = p.read_entries(i, 1).unwrap();
                assert_eq!((b.first_index(), b.len()), (i, 1));
                let e = b.entries().next().unwrap().unwrap();
                assert_eq!(e.id, id(1, i));
                match e.body {
                    RaftEntryBody::Control(kind, body) => {
                        assert_eq!((i % 3, kind, body), (0, ControlKind::Blank, &b""[..]))
                    }
                    RaftEntryBody::Records(r) => {
                        assert_eq!(r[0].value, format!("{i:0100}").as_bytes(), "entry {i}")
                    }
                }
            }
            // A large read runs to the end of the segment holding the first.
            let mut next = 1;
            while next <= 200 {
                let b = p.read_entries(next, 1 << 20).unwrap();
                let ids: Vec<_> = b.entries().map(|e| e.unwrap().id.index).collect();
                assert_eq!(ids, (next..b.next_index()).collect::<Vec<_>>());
                next = b.next_index();
            }
            assert_eq!(next, 201);
            for missing in [0, 201, 500] {
                let e = p.read_entries(missing, 1).unwrap_err();
                assert!(
                    matches!(e, Error::RaftIndexOutOfRange { .. }),
                    "{missing}: {e}"
                );
            }
        };
        {
            let (log, t) = open(dir.path());
            let p = t.partition(0).unwrap();
            assert_eq!((p.first_log_id(), p.last_log_id()), (None, None));
            fill(&p, 1, 200);
            check(&p);
            log.close().unwrap();
        }
        let (_log, t) = open(dir.path());
        let p = t.partition(0).unwrap();
        check(&p);
        // Appends continue at last + 1 after the reopen.
        assert!(p
            .append_entry(id(1, 200), EntryBody::Records(&[rec(b"x")]))
            .is_err());
        p.append_entry(id(1, 201), EntryBody::Records(&[rec(b"x")]))
            .unwrap();
    }

    #[test]
    fn committed_reads_and_waits_stop_at_the_committed_end_which_never_falls() {
        let dir = tempfile::tempdir().unwrap();
        let (log, t) = open(dir.path());
        let p = t.partition(0).unwrap();
        fill(&p, 1, 10);
        log.sync().unwrap();
        let end = p.end_offset();
        assert!(end > 4);
        let committed = ReadIsolation::Committed;
        assert!(
            p.read_with(0, 1 << 20, committed).is_err(),
            "nothing committed yet"
        );
        assert!(!p.wait_for_with(0, Duration::from_millis(1), committed));
        p.set_committed_end(3);
        let b = p.read_with(0, 1 << 20, committed).unwrap();
        assert_eq!(
            b.iter().map(|r| r.offset).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert!(p.read_with(3, 1 << 20, committed).is_err());
        p.set_committed_end(1);
        assert_eq!(p.committed_end(), 3, "the committed end never falls");
        // A waiter past the committed end wakes when it rises.
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || p.wait_for_with(3, Duration::from_secs(30), committed))
        };
        while p.waiters.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        p.set_committed_end(end + 100);
        assert!(waiter.join().unwrap());
        assert_eq!(p.committed_end(), end, "never past the written end");
        assert_eq!(p.visible_end(committed), end);
    }

    fn values(p: &Partition) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut next = p.start_offset();
        while next < p.end_offset() {
            let b = p.read_with(next, 1 << 20, ReadIsolation::Written).unwrap();
            out.extend(b.iter().map(|r| (r.offset, r.value.to_vec())));
            next = b.next_offset();
        }
        out
    }

    #[test]
    fn a_truncation_removes_the_entries_from_its_index_and_appends_go_on_there_in_a_newer_term() {
        for cut in [150, 120, 60, 2] {
            let dir = tempfile::tempdir().unwrap();
            let expect_after;
            {
                let (log, t) = open(dir.path());
                let p = t.partition(0).unwrap();
                fill(&p, 1, 200);
                let before = values(&p);
                t.truncate_from_index(0, cut, 0).unwrap();
                assert_eq!(p.last_log_id(), Some(id(1, cut - 1)), "cut {cut}");
                // Records of entries below the cut stay, at their offsets.
                let kept = (1..cut).filter(|i| i % 3 != 0).count();
                assert_eq!(values(&p), before[..kept].to_vec(), "cut {cut}");
                assert!(p.read_entries(cut, 1).is_err());
                assert!(p
                    .append_entry(id(1, cut + 1), EntryBody::Records(&[rec(b"x")]))
                    .is_err());
                p.append_entry(id(2, cut), EntryBody::Records(&[rec(b"new")]))
                    .unwrap();
                fill_term(&p, 2, cut + 1, 20);
                expect_after = values(&p);
                assert_eq!(expect_after[kept], (kept as u64, b"new".to_vec()));
                log.close().unwrap();
            }
            let (_log, t) = open(dir.path());
            let p = t.partition(0).unwrap();
            assert_eq!(values(&p), expect_after, "cut {cut} after reopen");
            assert_eq!(p.last_log_id(), Some(id(2, cut + 20)));
            let b = p.read_entries(cut, 1).unwrap();
            let e = b.entries().next().unwrap().unwrap();
            assert_eq!(e.id, id(2, cut));
        }
    }

    fn fill_term(p: &Partition, term: u64, from: u64, n: u64) {
        for i in from..from + n {
            let v = format!("{i:0100}");
            p.append_entry(id(term, i), EntryBody::Records(&[rec(v.as_bytes())]))
                .unwrap();
        }
    }

    #[test]
    fn a_truncation_below_the_committed_end_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, t) = open(dir.path());
        let p = t.partition(0).unwrap();
        fill(&p, 1, 30);
        let before = values(&p);
        // Entry 10 holds offset 6 (entries 3, 6 and 9 are control).
        let e = t.truncate_from_index(0, 10, 7).unwrap_err();
        assert!(
            matches!(
                e,
                Error::TruncateBelowCommitted {
                    offset: 6,
                    committed_end: 7,
                    ..
                }
            ),
            "{e}"
        );
        p.set_committed_end(8);
        let e = t.truncate_from_index(0, 10, 0).unwrap_err();
        assert!(
            matches!(
                e,
                Error::TruncateBelowCommitted {
                    committed_end: 8,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(values(&p), before);
        assert_eq!(p.last_log_id(), Some(id(1, 30)));
        // At the committed end exactly is allowed; past the last entry is a no-op.
        t.truncate_from_index(0, 31, 8).unwrap();
        assert_eq!(p.last_log_id(), Some(id(1, 30)));
        t.truncate_from_index(0, 13, 8).unwrap();
        assert_eq!(p.last_log_id(), Some(id(1, 12)));
    }

    #[test]
    fn a_truncation_at_the_first_entry_of_a_rolled_segment_removes_it_and_appends_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let (expect_after, cut);
        {
            let (log, t) = open(dir.path());
            let p = t.partition(0).unwrap();
            // Records only: the segment before the cut holds records.
            fill_term(&p, 1, 1, 200);
            assert!(p.segment_count() > 3, "the entries span several segments");
            cut = first_id(&p.segments()[2]).unwrap().index;
            let before = values(&p);
            t.truncate_from_index(0, cut, 0).unwrap();
            assert_eq!(p.last_log_id(), Some(id(1, cut - 1)));
            let kept = (cut - 1) as usize;
            assert_eq!(values(&p), before[..kept].to_vec());
            p.append_entry(id(2, cut), EntryBody::Records(&[rec(b"new")]))
                .unwrap();
            fill_term(&p, 2, cut + 1, 100);
            expect_after = values(&p);
            assert_eq!(expect_after[kept], (kept as u64, b"new".to_vec()));
            log.close().unwrap();
        }
        let (_log, t) = open(dir.path());
        let p = t.partition(0).unwrap();
        assert_eq!(values(&p), expect_after);
        assert_eq!(p.last_log_id(), Some(id(2, cut + 100)));
        let b = p.read_entries(cut, 1).unwrap();
        let e = b.entries().next().unwrap().unwrap();
        assert_eq!(e.id, id(2, cut));
    }

    /// Fails the directory fsyncs of unlinks while armed.
    #[derive(Debug, Default)]
    struct FailDirSync(std::sync::atomic::AtomicBool);

    impl crate::storage::fault::IoHook for FailDirSync {
        fn before(&self, op: crate::IoOp, _: &Path) -> std::io::Result<()> {
            if op == crate::IoOp::SyncDir && self.0.load(Ordering::SeqCst) {
                return Err(std::io::Error::other("injected directory fsync failure"));
            }
            Ok(())
        }
    }

    #[test]
    fn a_truncation_that_fails_after_it_started_cutting_files_refuses_later_appends_and_a_reopen_keeps_a_prefix(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(FailDirSync::default());
        let before;
        {
            let log = Log::open_with_hook(dir.path(), LogOptions::default(), hook.clone()).unwrap();
            let t = log.create_topic("r", replicated_config(8192)).unwrap();
            let p = t.partition(0).unwrap();
            fill_term(&p, 1, 1, 200);
            log.sync().unwrap();
            before = values(&p);
            assert!(p.segment_count() > 3, "the cut unlinks segments");
            hook.0.store(true, Ordering::SeqCst);
            assert!(t.truncate_from_index(0, 50, 0).is_err());
            // Part of the chain is gone: appending where the writer was
            // left (in a rolled segment, past removed entries) is refused.
            for i in [50, 201] {
                assert!(
                    p.append_entry(id(2, i), EntryBody::Records(&[rec(b"x")]))
                        .is_err(),
                    "an append of index {i} after a failed truncation"
                );
            }
            hook.0.store(false, Ordering::SeqCst);
            log.abandon();
        }
        let (_log, t) = open(dir.path());
        let p = t.partition(0).unwrap();
        let got = values(&p);
        assert!(
            got.len() >= 49 && before.starts_with(&got),
            "a prefix of the old log holding every entry before the cut: {} of {}",
            got.len(),
            before.len()
        );
    }

    #[test]
    fn a_purge_deletes_whole_segments_only_and_a_reopen_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let remaining;
        {
            let (log, t) = open(dir.path());
            let p = t.partition(0).unwrap();
            fill(&p, 1, 200);
            log.sync().unwrap();
            log.sync().unwrap();
            let segs = p.segment_count();
            let second_first = first_id(&p.segments()[1]).unwrap().index;
            // Below the end of the first segment: nothing goes.
            assert!(t
                .purge_through_index(0, second_first - 2)
                .unwrap()
                .is_empty());
            let removed = t.purge_through_index(0, second_first + 1).unwrap();
            assert_eq!(removed.len(), 1, "only the first segment lies wholly below");
            assert_eq!(p.segment_count(), segs - 1);
            assert_eq!(p.first_log_id(), Some(id(1, second_first)));
            assert!(p.read_entries(second_first - 1, 1).is_err());
            assert!(p.read_entries(second_first, 1).is_ok());
            remaining = values(&p);
            log.close().unwrap();
        }
        let (_log, t) = open(dir.path());
        let p = t.partition(0).unwrap();
        assert_eq!(values(&p), remaining);
        assert_eq!(p.last_log_id(), Some(id(1, 200)));
    }
}
