//! Sparse offset/time index entries.
//!
//! The index is a cache of its segment, never the other way round: a file
//! whose checksum fails is not read at all, every entry's position is
//! validated against the segment before use, and an invalid index is
//! rebuilt from the segment.
//!
//! ```text
//! file header (16 bytes): magic b"FSNLIDX\x02" (the last byte is the
//!                         format version), base_offset u64
//! entries (16 bytes each):
//!   0  rel_offset   u32   offset - base_offset of the batch at `position`
//!   4  position     u32   byte position of that batch in the segment
//!   8  max_ts_before i64  largest timestamp of all records before `position`
//!                         (i64::MIN for the first entry)
//! trailer (4 bytes): crc u32, CRC-32 of every byte before it
//! ```
//!
//! Entries must be strictly increasing in `rel_offset` and `position`;
//! zeroed entries fail that test (position 0 is inside the segment header).
//! The checksum is what guards `max_ts_before`: a position can be checked
//! against the batch it names when it is used, but a timestamp bound
//! covers every record before it, which only a walk of them could check.
//! A damaged bound would make the time lookup skip records and time
//! retention think a segment older than it is. A version-1 file (magic
//! b"FSNLIDX\0", no trailer) is not trusted either: it is rebuilt.

use zerocopy::little_endian::{I64, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::segment::SEGMENT_HEADER_LEN;

/// Index magic.
pub const INDEX_MAGIC: [u8; 8] = *b"FSNLIDX\x02";
/// The magic of the first version of the format, which had no trailer.
pub const INDEX_MAGIC_V1: [u8; 8] = *b"FSNLIDX\0";
/// Header length.
pub const INDEX_HEADER_LEN: usize = 16;
/// Trailer length: the CRC-32 of the header and the entries.
pub const INDEX_TRAILER_LEN: usize = 4;
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

/// The bytes of an index file for the segment at `base_offset` holding
/// `entries`: header, entries, checksum.
pub fn encode_index_file(base_offset: u64, entries: &[IndexEntry]) -> Vec<u8> {
    let mut buf =
        Vec::with_capacity(INDEX_HEADER_LEN + entries.len() * INDEX_ENTRY_LEN + INDEX_TRAILER_LEN);
    buf.extend_from_slice(&encode_index_header(base_offset));
    for e in entries {
        buf.extend_from_slice(&encode_entry(e));
    }
    let crc = crc32fast::hash(&buf);
    buf.extend_from_slice(&crc.to_le_bytes());
    buf
}

/// Whether `buf` is a whole first-version index file of the segment at
/// `base_offset` whose data ends at `data_end` (bytes) and `end_offset`: a
/// file of the earlier format, which an open rebuilds, not a damaged one.
/// The first version had no checksum, so its shape is all that tells it
/// from damage: header and whole entries with no trailer (a current file
/// whose magic lost its version byte keeps its trailer), entries in bounds
/// and increasing.
pub fn is_first_version(buf: &[u8], base_offset: u64, data_end: u64, end_offset: u64) -> bool {
    let Ok((h, rest)) = RawHeader::read_from_prefix(buf) else {
        return false;
    };
    if h.magic != INDEX_MAGIC_V1
        || h.base_offset.get() != base_offset
        || rest.len() % INDEX_ENTRY_LEN != 0
    {
        return false;
    }
    let mut current = buf.to_vec();
    current[..INDEX_MAGIC.len()].copy_from_slice(&INDEX_MAGIC);
    let crc = crc32fast::hash(&current);
    current.extend_from_slice(&crc.to_le_bytes());
    decode_index(&current, base_offset, data_end, end_offset).1
}

/// Decodes an index file for the segment at `base_offset` whose data ends at
/// `data_end` (bytes) and `end_offset`. Returns the longest valid prefix of
/// entries and whether the whole file was valid. A file whose checksum
/// fails (damaged, cut short, or of another version) gives no entries.
pub fn decode_index(
    buf: &[u8],
    base_offset: u64,
    data_end: u64,
    end_offset: u64,
) -> (Vec<IndexEntry>, bool) {
    let Some(body_len) = buf.len().checked_sub(INDEX_TRAILER_LEN) else {
        return (Vec::new(), false);
    };
    let (body, trailer) = buf.split_at(body_len);
    if crc32fast::hash(body).to_le_bytes() != trailer {
        return (Vec::new(), false);
    }
    let Ok((h, rest)) = RawHeader::read_from_prefix(body) else {
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
        encode_index_file(100, entries)
    }

    /// Entries at positions 64 and 4200 (offsets 0 and 40 past the base),
    /// the second with the bound `ts`.
    fn two_entries(ts: i64) -> [IndexEntry; 2] {
        [
            IndexEntry {
                rel_offset: 0,
                position: 64,
                max_ts_before: i64::MIN,
            },
            IndexEntry {
                rel_offset: 40,
                position: 4200,
                max_ts_before: ts,
            },
        ]
    }

    /// `bytes` with a checksum trailer that matches them.
    fn sealed(mut bytes: Vec<u8>) -> Vec<u8> {
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Any change of a byte fails the checksum, a lowered timestamp bound
    /// included (which no check against the segment's batches could see),
    /// and so does a file of the first version, without a trailer.
    #[test]
    fn a_damaged_or_first_version_file_gives_no_entries() {
        let es = two_entries(5_000);
        let good = file(&es);
        assert_eq!(decode_index(&good, 100, 5000, 200), (es.to_vec(), true));
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            assert_eq!(decode_index(&bad, 100, 5000, 200), (vec![], false), "{at}");
        }
        let mut lowered = es;
        lowered[1].max_ts_before = 4_000;
        let mut forged = file(&lowered);
        let n = forged.len();
        forged[n - 4..].copy_from_slice(&good[n - 4..]);
        assert_eq!(decode_index(&forged, 100, 5000, 200), (vec![], false));
        let mut v1 = b"FSNLIDX\0".to_vec();
        v1.extend_from_slice(&100u64.to_le_bytes());
        for e in &es {
            v1.extend_from_slice(&encode_entry(e));
        }
        assert_eq!(decode_index(&v1, 100, 5000, 200), (vec![], false));
        assert_eq!(decode_index(&[], 100, 5000, 200), (vec![], false));
    }

    #[test]
    fn round_trip() {
        let es = two_entries(5);
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
        let mut f = encode_index_header(100).to_vec();
        f.extend_from_slice(&encode_entry(&es[0]));
        f.extend_from_slice(&[0u8; INDEX_ENTRY_LEN]);
        assert_eq!(
            decode_index(&sealed(f), 100, 5000, 200),
            (es.to_vec(), false)
        );
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
        let mut f = encode_index_header(100).to_vec();
        f.extend_from_slice(&encode_entry(&es[0]));
        f.push(1);
        assert_eq!(
            decode_index(&sealed(f), 100, 5000, 200),
            (es.to_vec(), false)
        );
    }
}
