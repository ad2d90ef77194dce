//! Sparse offset/time index entries.
//!
//! The index is a cache of its segment, never the other way round: every
//! entry is validated against the segment before use, and an invalid index
//! is rebuilt from the segment.
//!
//! ```text
//! file header (16 bytes): magic b"FSNLIDX\0", base_offset u64
//! entries (16 bytes each):
//!   0  rel_offset   u32   offset - base_offset of the batch at `position`
//!   4  position     u32   byte position of that batch in the segment
//!   8  max_ts_before i64  largest timestamp of all records before `position`
//!                         (i64::MIN for the first entry)
//! ```
//!
//! Entries must be strictly increasing in `rel_offset` and `position`;
//! zeroed entries fail that test (position 0 is inside the segment header).

use zerocopy::little_endian::{I64, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::segment::SEGMENT_HEADER_LEN;

/// Index magic.
pub const INDEX_MAGIC: [u8; 8] = *b"FSNLIDX\0";
/// Header length.
pub const INDEX_HEADER_LEN: usize = 16;
/// Entry length.
pub const INDEX_ENTRY_LEN: usize = 16;

/// One decoded index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset of the batch, relative to the segment base.
    pub rel_offset: u32,
    /// Byte position of the batch in the segment.
    pub position: u32,
    /// Largest record timestamp before this batch.
    pub max_ts_before: i64,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawEntry {
    rel_offset: U32,
    position: U32,
    max_ts_before: I64,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawHeader {
    magic: [u8; 8],
    base_offset: U64,
}

/// Encodes the index file header.
pub fn encode_index_header(base_offset: u64) -> [u8; INDEX_HEADER_LEN] {
    let mut out = [0u8; INDEX_HEADER_LEN];
    out.copy_from_slice(
        RawHeader {
            magic: INDEX_MAGIC,
            base_offset: U64::new(base_offset),
        }
        .as_bytes(),
    );
    out
}

/// Encodes one entry.
pub fn encode_entry(e: &IndexEntry) -> [u8; INDEX_ENTRY_LEN] {
    let raw = RawEntry {
        rel_offset: U32::new(e.rel_offset),
        position: U32::new(e.position),
        max_ts_before: I64::new(e.max_ts_before),
    };
    let mut out = [0u8; INDEX_ENTRY_LEN];
    out.copy_from_slice(raw.as_bytes());
    out
}

/// Decodes an index file for the segment at `base_offset` whose data ends at
/// `data_end` (bytes) and `end_offset`. Returns the longest valid prefix of
/// entries and whether the whole file was valid.
pub fn decode_index(
    buf: &[u8],
    base_offset: u64,
    data_end: u64,
    end_offset: u64,
) -> (Vec<IndexEntry>, bool) {
    let Ok((h, rest)) = RawHeader::read_from_prefix(buf) else {
        return (Vec::new(), false);
    };
    if h.magic != INDEX_MAGIC || h.base_offset.get() != base_offset {
        return (Vec::new(), false);
    }
    let mut out = Vec::with_capacity(rest.len() / INDEX_ENTRY_LEN);
    let mut prev: Option<IndexEntry> = None;
    let chunks = rest.chunks_exact(INDEX_ENTRY_LEN);
    let whole = chunks.remainder().is_empty();
    for chunk in chunks {
        let Ok(raw) = RawEntry::read_from_bytes(chunk) else {
            return (out, false);
        };
        let e = IndexEntry {
            rel_offset: raw.rel_offset.get(),
            position: raw.position.get(),
            max_ts_before: raw.max_ts_before.get(),
        };
        let in_bounds = (e.position as usize) >= SEGMENT_HEADER_LEN
            && (e.position as u64) < data_end
            && base_offset + (e.rel_offset as u64) < end_offset;
        let increasing = prev.is_none_or(|p| {
            e.rel_offset > p.rel_offset
                && e.position > p.position
                && e.max_ts_before >= p.max_ts_before
        });
        if !in_bounds || !increasing {
            return (out, false);
        }
        prev = Some(e);
        out.push(e);
    }
    (out, whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(entries: &[IndexEntry]) -> Vec<u8> {
        let mut v = encode_index_header(100).to_vec();
        for e in entries {
            v.extend_from_slice(&encode_entry(e));
        }
        v
    }

    #[test]
    fn round_trip() {
        let es = [
            IndexEntry {
                rel_offset: 0,
                position: 64,
                max_ts_before: i64::MIN,
            },
            IndexEntry {
                rel_offset: 40,
                position: 4200,
                max_ts_before: 5,
            },
        ];
        assert_eq!(
            decode_index(&file(&es), 100, 5000, 200),
            (es.to_vec(), true)
        );
    }

    #[test]
    fn zeroed_and_out_of_bounds_entries_are_rejected() {
        let es = [IndexEntry {
            rel_offset: 0,
            position: 64,
            max_ts_before: 0,
        }];
        let mut f = file(&es);
        f.extend_from_slice(&[0u8; INDEX_ENTRY_LEN]);
        assert_eq!(decode_index(&f, 100, 5000, 200), (es.to_vec(), false));
        // Position past the data end.
        let bad = [IndexEntry {
            rel_offset: 0,
            position: 6000,
            max_ts_before: 0,
        }];
        assert_eq!(decode_index(&file(&bad), 100, 5000, 200), (vec![], false));
        // Offset past the end offset.
        let bad = [IndexEntry {
            rel_offset: 150,
            position: 64,
            max_ts_before: 0,
        }];
        assert_eq!(decode_index(&file(&bad), 100, 5000, 200), (vec![], false));
        // Wrong base.
        assert_eq!(decode_index(&file(&es), 101, 5000, 200), (vec![], false));
        // Partial trailing entry.
        let mut f = file(&es);
        f.push(1);
        assert_eq!(decode_index(&f, 100, 5000, 200), (es.to_vec(), false));
    }
}
