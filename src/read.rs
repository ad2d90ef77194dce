//! Zero-copy reads: records borrow from the segment mapping, which an `Arc`
//! keeps alive (also after retention unlinked the file), together with the
//! directory lock (no other fissionlog handle may repair the file under it).
//!
//! Batches are CRC-checked when a [`ReadBatch`] is built. Iteration parses
//! them again without trusting that check: only something outside
//! fissionlog writing the file could change the bytes, and that must be an
//! error (or an early end), never a panic.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::batch::{self, RecordIter};
use crate::storage::lock::DirLock;
use crate::storage::segment::{CommittedBytes, Segment};

/// How far a read may see into a partition.
///
/// A record past the durable end can still be lost by a power failure;
/// recovery then cuts it and hands its offsets to new records. A consumer
/// that read it would hold a position past the cut (see
/// [`Error::PositionLost`]). `Durable` never shows such records.
///
/// Default per topic: `Durable` for `SyncPolicy::Always` (an append there
/// returns only once durable, so readers lose no latency), `Written` for
/// `Never` and `Interval` (readers would otherwise wait for the next
/// `sync()` or interval).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadIsolation {
    /// Only records a completed sync covered.
    Durable,
    /// Every record appended so far, durable or not.
    Written,
    /// Only records below the partition's committed end (the high
    /// watermark a replicated partition's state machine publishes with
    /// `Partition::set_committed_end`, for entries Raft committed), and
    /// never past the durable end: no consumer sees a record that a later
    /// truncation removes.
    Committed,
}

/// One record, borrowed from a [`ReadBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Offset in its partition.
    pub offset: u64,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// Routing key, if any.
    pub key: Option<&'a [u8]>,
    /// Payload.
    pub value: &'a [u8],
}

/// An owned record (copied out of the mapping).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRecord {
    /// Partition id.
    pub partition: u32,
    /// Offset in its partition.
    pub offset: u64,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// Routing key, if any.
    pub key: Option<Vec<u8>>,
    /// Payload.
    pub value: Vec<u8>,
}

/// Verified batches read from one segment, starting at a requested offset.
#[derive(Debug, Clone)]
pub struct ReadBatch {
    partition: u32,
    segment: Arc<Segment>,
    /// The committed bytes with their mapping: holding them keeps the
    /// segment mapped whatever the log's budget evicts meanwhile.
    data: CommittedBytes,
    /// Keeps the directory locked while the mapping is reachable.
    lock: Option<Arc<DirLock>>,
    /// File positions `[start, end)` of whole, CRC-checked batches.
    start: u64,
    end: u64,
    /// First offset to yield (records before it in the first batch are skipped).
    from_offset: u64,
    /// Offset after the last record covered.
    next_offset: u64,
}

impl ReadBatch {
    pub(crate) fn new(
        partition: u32,
        segment: Arc<Segment>,
        lock: Option<Arc<DirLock>>,
        offset: u64,
        max_bytes: usize,
        limit: u64,
    ) -> Result<ReadBatch> {
        let data = segment.committed()?;
        let start = segment.locate_in(&data, offset)?;
        let end_pos = data.end_pos();
        let mut pos = start;
        let mut next: Option<u64> = None;
        // Batches whose records lie past `limit` (the visible end, a batch
        // boundary) are not included.
        while pos < end_pos && next.is_none_or(|n| n < limit) {
            let header = match batch::validate_fields(data.from(pos), next) {
                Ok(h) => h,
                Err(e) => return Err(batch_error(&segment, pos, e)),
            };
            if header.is_hole() {
                let hole_start = header.base_offset;
                let hole_end = hole_start + u64::from(header.record_count);
                if next.is_none() {
                    return Err(Error::Hole {
                        partition,
                        start: hole_start.max(offset),
                        end: hole_end,
                    });
                }
                break;
            }
            next = Some(header.base_offset + u64::from(header.record_count));
            pos += u64::from(header.batch_len);
            if (pos - start) as usize >= max_bytes {
                break;
            }
        }
        Ok(ReadBatch {
            partition,
            start,
            end: pos,
            from_offset: offset,
            next_offset: next.unwrap_or(offset),
            segment,
            data,
            lock,
        })
    }

    /// Partition the records come from.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// Offset to read next after this batch.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Bytes of batch data covered (headers included).
    pub fn len_bytes(&self) -> u64 {
        self.end - self.start
    }

    /// The raw batch bytes (for zero-copy hand-off to network code).
    pub fn as_bytes(&self) -> &[u8] {
        self.data.range(self.start, self.end)
    }

    /// The raw batch bytes as `Bytes`, sharing the mapping.
    pub fn to_bytes(&self) -> Bytes {
        Bytes::from_owner(SegmentSlice {
            data: self.data.clone(),
            _segment: self.segment.clone(),
            _lock: self.lock.clone(),
            start: self.start,
            end: self.end,
        })
    }

    /// The first offset of the first batch read (at or below the requested
    /// offset; the requested offset if the batch no longer parses).
    pub(crate) fn first_batch_base(&self) -> u64 {
        batch::header_fields(self.data.range(self.start, self.end))
            .map_or(self.from_offset, |h| h.base_offset.min(self.from_offset))
    }

    /// Iterates the records from the requested offset on. Stops early if
    /// the bytes no longer parse (something outside fissionlog changed the
    /// file); [`ReadBatch::try_iter`] reports that as an error.
    pub fn iter(&self) -> impl Iterator<Item = Record<'_>> + '_ {
        Iter(self.records(false))
    }

    /// Iterates the records from the requested offset on, checking every
    /// batch again (CRC included). Bytes changed since the batch was read
    /// give one `Err` item ([`Error::ChecksumMismatch`] or
    /// [`Error::Corruption`]), then the iteration ends.
    pub fn try_iter(&self) -> impl Iterator<Item = Result<Record<'_>>> + '_ {
        TryIter(self.records(true))
    }

    fn records(&self, check_crc: bool) -> Records<'_> {
        Records {
            segment: &self.segment,
            data: &self.data,
            pos: self.start,
            end: self.end,
            from: self.from_offset,
            expected: None,
            check_crc,
            current: None,
            failed: None,
        }
    }

    /// A record's value as `Bytes` sharing the mapping (no copy).
    pub fn value_bytes(&self, record: &Record<'_>) -> Bytes {
        self.slice_bytes(record.value)
    }

    /// A record's key as `Bytes` sharing the mapping (no copy).
    pub fn key_bytes(&self, record: &Record<'_>) -> Option<Bytes> {
        record.key.map(|k| self.slice_bytes(k))
    }

    fn slice_bytes(&self, part: &[u8]) -> Bytes {
        let all = self.as_bytes();
        let off = (part.as_ptr() as usize).wrapping_sub(all.as_ptr() as usize);
        if off > all.len() || part.len() > all.len() - off {
            // Not a slice of this batch (a record of another one): a copy.
            return Bytes::copy_from_slice(part);
        }
        let start = self.start + off as u64;
        Bytes::from_owner(SegmentSlice {
            data: self.data.clone(),
            _segment: self.segment.clone(),
            _lock: self.lock.clone(),
            start,
            end: start + part.len() as u64,
        })
    }

    /// Copies the records out (checked as by [`ReadBatch::try_iter`]).
    pub fn to_owned_records(&self) -> Result<Vec<OwnedRecord>> {
        self.try_iter()
            .map(|r| {
                r.map(|r| OwnedRecord {
                    partition: self.partition,
                    offset: r.offset,
                    timestamp: r.timestamp,
                    key: r.key.map(<[u8]>::to_vec),
                    value: r.value.to_vec(),
                })
            })
            .collect()
    }
}

/// The typed error for a batch at `pos` that did not validate: a checksum
/// failure after open is [`Error::ChecksumMismatch`], never wrong bytes.
#[cold]
fn batch_error(segment: &Segment, pos: u64, e: batch::BatchError) -> Error {
    match e {
        batch::BatchError::BadCrc { expected, actual } => Error::ChecksumMismatch {
            file: segment.path().to_path_buf(),
            position: pos,
            expected,
            actual,
        },
        other => Error::corruption(segment.path(), pos, other.to_string()),
    }
}

/// Why an iteration ended early, kept small so that the per-record path
/// moves only records; turned into an [`Error`] by [`TryIter`].
#[derive(Debug)]
enum Failure {
    /// The batch at the position no longer validates or parses.
    Batch(batch::BatchError),
    /// It parses, but is not the batch that was read there.
    Changed,
}

/// The records of a batch range, parsed again as they are iterated.
struct Records<'a> {
    segment: &'a Segment,
    data: &'a CommittedBytes,
    /// File position of the next batch.
    pos: u64,
    end: u64,
    from: u64,
    /// Base offset the next batch must have (after the first).
    expected: Option<u64>,
    check_crc: bool,
    /// The batch being iterated and its file position.
    current: Option<(u64, RecordIter<'a>)>,
    /// Set when the iteration ended early (it then yields nothing more).
    failed: Option<(u64, Failure)>,
}

impl<'a> Records<'a> {
    /// Opens the next batch of the range; on failure records why. Inlined:
    /// returned through memory, the iterator cost a store-forwarding stall
    /// per batch.
    #[inline(always)]
    fn next_batch(&mut self) -> Option<RecordIter<'a>> {
        let pos = self.pos;
        // Only bytes of this read's range: a batch must not run past it.
        let bytes = self.data.range(pos, self.end);
        let parsed = if self.check_crc {
            batch::validate_fields(bytes, self.expected)
        } else {
            batch::header_fields(bytes)
        };
        let header = match parsed {
            Ok(h) => h,
            Err(e) => {
                self.failed = Some((pos, Failure::Batch(e)));
                return None;
            }
        };
        if self.expected.is_some_and(|x| x != header.base_offset) || header.is_hole() {
            self.failed = Some((pos, Failure::Changed));
            return None;
        }
        let len = header.batch_len as usize;
        self.expected = Some(header.base_offset + u64::from(header.record_count));
        self.pos += len as u64;
        Some(RecordIter::from_fields(&bytes[..len], &header))
    }

    /// The next record; `None` at the end of the range or once the
    /// iteration failed (see `failed`).
    #[inline]
    fn next_record(&mut self) -> Option<Record<'a>> {
        loop {
            if let Some((pos, it)) = &mut self.current {
                match it.next() {
                    Some(Ok(r)) if r.offset < self.from => continue,
                    Some(Ok(r)) => {
                        return Some(Record {
                            offset: r.offset,
                            timestamp: r.timestamp,
                            key: r.key,
                            value: r.value,
                        })
                    }
                    Some(Err(e)) => {
                        self.failed = Some((*pos, Failure::Batch(e)));
                        self.current = None;
                        self.pos = self.end;
                        return None;
                    }
                    None => self.current = None,
                }
            }
            if self.pos >= self.end || self.failed.is_some() {
                return None;
            }
            let pos = self.pos;
            match self.next_batch() {
                Some(it) => self.current = Some((pos, it)),
                None => {
                    self.pos = self.end;
                    return None;
                }
            }
        }
    }

    /// The error that ended the iteration, once.
    #[cold]
    fn take_error(&mut self) -> Option<Error> {
        let (pos, f) = self.failed.take()?;
        Some(match f {
            Failure::Batch(e) => batch_error(self.segment, pos, e),
            Failure::Changed => {
                Error::corruption(self.segment.path(), pos, "batch changed since it was read")
            }
        })
    }
}

/// [`ReadBatch::iter`]: records until the end or bytes that no longer
/// parse.
struct Iter<'a>(Records<'a>);

impl<'a> Iterator for Iter<'a> {
    type Item = Record<'a>;

    #[inline]
    fn next(&mut self) -> Option<Record<'a>> {
        self.0.next_record()
    }
}

/// [`ReadBatch::try_iter`]: records, then one `Err` item if the bytes no
/// longer check.
struct TryIter<'a>(Records<'a>);

impl<'a> Iterator for TryIter<'a> {
    type Item = Result<Record<'a>>;

    #[inline]
    fn next(&mut self) -> Option<Result<Record<'a>>> {
        match self.0.next_record() {
            Some(r) => Some(Ok(r)),
            None => self.0.take_error().map(Err),
        }
    }
}

/// Owner handed to `Bytes::from_owner`: keeps the segment mapped and the
/// directory locked.
struct SegmentSlice {
    data: CommittedBytes,
    /// Counted by a tail split's reclaim, which cuts a segment's bytes
    /// only once nothing but the partition holds it.
    _segment: Arc<Segment>,
    _lock: Option<Arc<DirLock>>,
    start: u64,
    end: u64,
}

impl AsRef<[u8]> for SegmentSlice {
    fn as_ref(&self) -> &[u8] {
        self.data.range(self.start, self.end)
    }
}
