//! Zero-copy reads: records borrow from the segment mapping, which an `Arc`
//! keeps alive (also after retention unlinked the file).

use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::format::batch::{self, BatchHeader, RecordIter};
use crate::storage::segment::Segment;

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
        offset: u64,
        max_bytes: usize,
    ) -> Result<ReadBatch> {
        let start = segment.locate(offset)?;
        let end_pos = segment.committed_pos();
        let mut pos = start;
        let mut next: Option<u64> = None;
        while pos < end_pos {
            let header = verify(&segment, pos, next)?;
            if batch::is_hole(&header) {
                let hole_start = header.base_offset.get();
                let hole_end = hole_start + u64::from(header.record_count.get());
                if next.is_none() {
                    return Err(Error::Hole {
                        partition,
                        start: hole_start.max(offset),
                        end: hole_end,
                    });
                }
                break;
            }
            next = Some(header.base_offset.get() + u64::from(header.record_count.get()));
            pos += u64::from(header.batch_len.get());
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
        self.segment.committed().range(self.start, self.end)
    }

    /// The raw batch bytes as `Bytes`, sharing the mapping.
    pub fn to_bytes(&self) -> Bytes {
        Bytes::from_owner(SegmentSlice {
            segment: self.segment.clone(),
            start: self.start,
            end: self.end,
        })
    }

    /// Iterates the records from the requested offset on.
    pub fn iter(&self) -> impl Iterator<Item = Record<'_>> + '_ {
        let data = self.segment.committed();
        let from = self.from_offset;
        let mut pos = self.start;
        let end = self.end;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let bytes = data.from(pos);
            // Validated in `new`; parse again only for lengths.
            let h = batch::parse_header(bytes).expect("batch validated when the read was built");
            let len = h.batch_len.get() as usize;
            pos += len as u64;
            Some(
                RecordIter::new(&bytes[..len], &h)
                    .map(|r| r.expect("records validated when the read was built")),
            )
        })
        .flatten()
        .filter(move |r| r.offset >= from)
        .map(|r| Record {
            offset: r.offset,
            timestamp: r.timestamp,
            key: r.key,
            value: r.value,
        })
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
        let off = part.as_ptr() as usize - all.as_ptr() as usize;
        assert!(off + part.len() <= all.len(), "slice comes from this batch");
        let start = self.start + off as u64;
        Bytes::from_owner(SegmentSlice {
            segment: self.segment.clone(),
            start,
            end: start + part.len() as u64,
        })
    }

    /// Copies the records out.
    pub fn to_owned_records(&self) -> Vec<OwnedRecord> {
        self.iter()
            .map(|r| OwnedRecord {
                partition: self.partition,
                offset: r.offset,
                timestamp: r.timestamp,
                key: r.key.map(<[u8]>::to_vec),
                value: r.value.to_vec(),
            })
            .collect()
    }
}

/// Validates the batch at `pos`: a checksum failure after open is a typed
/// error, never wrong bytes.
fn verify(segment: &Segment, pos: u64, expected: Option<u64>) -> Result<BatchHeader> {
    let bytes = segment.committed().from(pos);
    batch::validate(bytes, expected).map_err(|e| match e {
        batch::BatchError::BadCrc { expected, actual } => Error::ChecksumMismatch {
            file: segment.path().to_path_buf(),
            position: pos,
            expected,
            actual,
        },
        other => Error::corruption(segment.path(), pos, other.to_string()),
    })
}

/// Owner handed to `Bytes::from_owner`: keeps the segment mapped.
struct SegmentSlice {
    segment: Arc<Segment>,
    start: u64,
    end: u64,
}

impl AsRef<[u8]> for SegmentSlice {
    fn as_ref(&self) -> &[u8] {
        self.segment.committed().range(self.start, self.end)
    }
}
