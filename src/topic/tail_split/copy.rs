//! A tail split's copy: the parent's records from the split's offset on,
//! each into the child owning its key hash, in rounds that catch up with
//! the parent's end while appends go on, then the sealed round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::format::batch::RecordIn;
use crate::partition::Partition;
use crate::read::ReadIsolation;
use crate::topic::{key_hash, Topic};

/// Records copied at once into one child (and the most read at once from
/// the parent).
const CHUNK_BYTES: usize = 256 * 1024;
/// Catch-up stops when at most this many records are left for the sealed
/// round, after `MAX_ROUNDS` rounds, or when a round did not shrink what
/// is left (appends outrun the copy).
const CATCH_UP_RECORDS: u64 = 4096;
const MAX_ROUNDS: u32 = 16;

/// Copies records `pos..to` of the parent into the children.
pub(super) struct Copier<'a> {
    pub(super) topic: &'a Topic,
    pub(super) parent: &'a Partition,
    pub(super) kids: &'a [Arc<Partition>],
    pub(super) ranges: &'a [(u64, u64)],
    /// Next parent offset to copy.
    pub(super) pos: u64,
    pub(super) slots: Vec<u8>,
    pub(super) bytes: u64,
    pub(super) started: Instant,
    pub(super) throttle: u64,
}

impl Copier<'_> {
    fn slot(&self, hash: Option<u64>, offset: u64) -> Result<usize> {
        match hash {
            // Keyed: the child owning the hash (ranges tile the parent's).
            // A record `append_to` put here whose hash lies outside the
            // range (below it: the first child; above it: the last) has no
            // routed order to keep. A hot key's lane records, which also
            // lie outside, never get here: `split_tail` refuses partitions
            // holding such lanes.
            Some(h) => Ok(self
                .ranges
                .partition_point(|&(s, _)| s <= h)
                .saturating_sub(1)),
            // Keyless records have no order to keep: spread by offset.
            None => Ok((offset % self.ranges.len() as u64) as usize),
        }
    }

    /// The rounds that copy while appends to the parent go on, until the
    /// gap left is small, stops shrinking (appends outrun the copy) or
    /// `MAX_ROUNDS` ran: the rest goes in the sealed round. Returns the
    /// rounds run.
    pub(super) fn catch_up(&mut self) -> Result<u32> {
        let mut rounds = 0;
        let mut last_gap = u64::MAX;
        loop {
            let target = self.parent.end_offset();
            let gap = target.saturating_sub(self.pos);
            // A round that did not shrink the gap means appends outrun the
            // copy (its budget): the rest goes in the sealed round.
            if gap <= CATCH_UP_RECORDS || rounds >= MAX_ROUNDS || gap >= last_gap {
                break Ok(rounds);
            }
            last_gap = gap;
            rounds += 1;
            if let Err(e) = self.copy_to(target, true) {
                break Err(e);
            }
        }
    }

    /// Copies the parent's records `pos..to` into the children (at the
    /// throttle's pace when `throttled`).
    pub(super) fn copy_to(&mut self, to: u64, throttled: bool) -> Result<()> {
        while self.pos < to {
            let batch = self.read_moved()?;
            let next = self.copy_batch(&batch, to)?;
            self.bytes += batch.len_bytes();
            self.pos = next;
            if throttled {
                self.throttle();
            }
        }
        Ok(())
    }

    /// The parent's batches from `pos` on, at most about a chunk. A hole
    /// salvage left in the moved range is refused.
    fn read_moved(&self) -> Result<crate::read::ReadBatch> {
        match self
            .parent
            .read_with(self.pos, CHUNK_BYTES, ReadIsolation::Written)
        {
            Err(Error::Hole { start, end, .. }) => Err(Error::Refused(format!(
                "offsets {start}..{end} of the moved range are a salvage hole: \
                 a tail split moves only contiguous records"
            ))),
            other => other,
        }
    }

    /// Appends the records of `batch` from `pos` up to `to` to the children
    /// owning them, in chunks, and notes each one's child in `slots`.
    /// Returns the parent offset after the last record copied.
    fn copy_batch(&mut self, batch: &crate::read::ReadBatch, to: u64) -> Result<u64> {
        let mut per: Vec<(Vec<RecordIn<'_>>, Vec<Option<u64>>, usize)> = (0..self.kids.len())
            .map(|_| (Vec::new(), Vec::new(), 0))
            .collect();
        let mut next = self.pos;
        for r in batch.try_iter() {
            let r = r?;
            if r.offset < self.pos {
                continue;
            }
            if r.offset >= to {
                break;
            }
            if r.offset != next {
                return Err(Error::Refused(format!(
                    "offset {next} of the moved range is missing"
                )));
            }
            let hash = r.key.map(|k| key_hash(self.topic.inner.hash_key, k));
            let s = self.slot(hash, r.offset)?;
            self.slots.push(s as u8);
            let rec = RecordIn {
                key: r.key,
                value: r.value,
                timestamp: r.timestamp,
            };
            let size = rec.encoded_len();
            let (recs, hashes, bytes) = &mut per[s];
            if *bytes + size > CHUNK_BYTES && !recs.is_empty() {
                self.kids[s].append(recs, hashes)?;
                recs.clear();
                hashes.clear();
                *bytes = 0;
            }
            recs.push(rec);
            hashes.push(hash);
            *bytes += size;
            next = r.offset + 1;
        }
        if next == self.pos {
            return Err(Error::Refused(format!(
                "no record at offset {} of the moved range",
                self.pos
            )));
        }
        for (s, (recs, hashes, _)) in per.iter().enumerate() {
            if !recs.is_empty() {
                self.kids[s].append(recs, hashes)?;
            }
        }
        Ok(next)
    }

    /// Sleeps while the copy runs ahead of its byte budget.
    fn throttle(&self) {
        if self.throttle > 0 {
            let due = Duration::from_secs_f64(self.bytes as f64 / self.throttle as f64);
            let spent = self.started.elapsed();
            if due > spent {
                std::thread::sleep(due - spent);
            }
        }
    }
}

/// The first offset of the batch holding `offset` in `part` (`offset`
/// itself at the end).
pub(super) fn batch_start(part: &Partition, offset: u64) -> Result<u64> {
    if offset >= part.end_offset() {
        return Ok(offset);
    }
    let b = part.read_with(offset, 1, ReadIsolation::Written)?;
    Ok(b.first_batch_base())
}
