//! Segment file header.
//!
//! ```text
//!  0  magic            [u8; 8]  b"FSNLSEG\0"
//!  8  version          u16      1: format-1 batches; 2: format-2 batches
//!                                 (a replicated partition, Raft log ids)
//! 10  reserved         u16
//! 12  topic_id         u32
//! 16  partition_id     u32
//! 20  reserved         u32
//! 24  base_offset      u64      offset of the first record in this file
//! 32  created_ms       i64
//! 40  header_crc       u32      CRC of bytes 0..40
//! 44  seal_crc         u32      CRC of bytes 48..64; 0 while not sealed
//! 48  seal_end_offset  u64      end offset (exclusive) once sealed
//! 56  seal_end_pos     u64      end of data in bytes once sealed
//! 64  batches...
//! ```
//!
//! The seal fields are written when the writer rolls to a new segment. They
//! are trusted only for segments below the recovery checkpoint (which proves
//! they were synced); newer segments are scanned.

use zerocopy::little_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Length of the segment header; batches start here.
pub const SEGMENT_HEADER_LEN: usize = 64;
/// Segment magic.
pub const SEGMENT_MAGIC: [u8; 8] = *b"FSNLSEG\0";
/// Newest segment format version this build reads.
pub const SEGMENT_VERSION: u16 = 2;
/// Version of a segment holding batch format 1 (an unreplicated partition).
pub const SEGMENT_VERSION_V1: u16 = 1;
/// Version of a segment holding batch format 2 (a replicated partition).
pub const SEGMENT_VERSION_V2: u16 = 2;

/// The on-disk segment header.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SegmentHeader {
    magic: [u8; 8],
    version: U16,
    reserved0: U16,
    topic_id: U32,
    partition_id: U32,
    reserved1: U32,
    base_offset: U64,
    created_ms: I64,
    header_crc: U32,
    seal_crc: U32,
    seal_end_offset: U64,
    seal_end_pos: U64,
}

const _: () = assert!(std::mem::size_of::<SegmentHeader>() == SEGMENT_HEADER_LEN);

/// Decoded segment identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderInfo {
    /// Topic id.
    pub topic_id: u32,
    /// Partition id.
    pub partition_id: u32,
    /// First offset stored in the segment.
    pub base_offset: u64,
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
    /// `(end_offset, end_position)` when the header carries a valid seal.
    pub seal: Option<(u64, u64)>,
    /// [`SEGMENT_VERSION_V1`] or [`SEGMENT_VERSION_V2`]: the batch format
    /// of every batch in the segment.
    pub version: u16,
}

/// Why a segment header was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// Shorter than a header.
    Short,
    /// Wrong magic.
    BadMagic,
    /// Version this build does not read.
    Version(u16),
    /// CRC mismatch.
    BadCrc,
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Short => write!(f, "file shorter than a segment header"),
            HeaderError::BadMagic => write!(f, "not a fissionlog segment (bad magic)"),
            HeaderError::Version(v) => write!(f, "unsupported segment version {v}"),
            HeaderError::BadCrc => write!(f, "segment header CRC mismatch"),
        }
    }
}

/// Encodes a fresh (unsealed) version-1 header.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn encode_header(
    topic_id: u32,
    partition_id: u32,
    base_offset: u64,
    created_ms: i64,
) -> [u8; SEGMENT_HEADER_LEN] {
    encode_header_version(
        SEGMENT_VERSION_V1,
        topic_id,
        partition_id,
        base_offset,
        created_ms,
    )
}

/// Encodes a fresh (unsealed) header of `version` (1 or 2).
pub fn encode_header_version(
    version: u16,
    topic_id: u32,
    partition_id: u32,
    base_offset: u64,
    created_ms: i64,
) -> [u8; SEGMENT_HEADER_LEN] {
    assert!(
        (SEGMENT_VERSION_V1..=SEGMENT_VERSION).contains(&version),
        "a segment version this build writes"
    );
    let mut h = SegmentHeader {
        magic: SEGMENT_MAGIC,
        version: U16::new(version),
        reserved0: U16::new(0),
        topic_id: U32::new(topic_id),
        partition_id: U32::new(partition_id),
        reserved1: U32::new(0),
        base_offset: U64::new(base_offset),
        created_ms: I64::new(created_ms),
        header_crc: U32::new(0),
        seal_crc: U32::new(0),
        seal_end_offset: U64::new(0),
        seal_end_pos: U64::new(0),
    };
    h.header_crc = U32::new(crc32fast::hash(&h.as_bytes()[..40]));
    let mut out = [0u8; SEGMENT_HEADER_LEN];
    out.copy_from_slice(h.as_bytes());
    out
}

/// Encodes the 20 seal bytes that go at byte 44 of the header.
pub fn encode_seal(end_offset: u64, end_pos: u64) -> [u8; 20] {
    let mut tail = [0u8; 16];
    tail[..8].copy_from_slice(&end_offset.to_le_bytes());
    tail[8..].copy_from_slice(&end_pos.to_le_bytes());
    let mut out = [0u8; 20];
    out[..4].copy_from_slice(&crc32fast::hash(&tail).to_le_bytes());
    out[4..].copy_from_slice(&tail);
    out
}

/// Byte position of the seal fields inside the header.
pub const SEAL_POS: usize = 44;

/// Decodes and validates a header.
pub fn decode_header(buf: &[u8]) -> Result<HeaderInfo, HeaderError> {
    let Ok((h, _)) = SegmentHeader::read_from_prefix(buf) else {
        return Err(HeaderError::Short);
    };
    if h.magic != SEGMENT_MAGIC {
        return Err(HeaderError::BadMagic);
    }
    // A newer version is checked before the CRC: a later format may lay the
    // header out differently, and its file must be refused, never taken for
    // damage and cut. (A torn header write keeps a prefix of the new bytes
    // and zeros, so it never shows a version above ours.)
    if h.version.get() > SEGMENT_VERSION {
        return Err(HeaderError::Version(h.version.get()));
    }
    if crc32fast::hash(&buf[..40]) != h.header_crc.get() {
        return Err(HeaderError::BadCrc);
    }
    if h.version.get() < SEGMENT_VERSION_V1 {
        return Err(HeaderError::Version(h.version.get()));
    }
    let seal_ok = h.seal_crc.get() != 0 && crc32fast::hash(&buf[48..64]) == h.seal_crc.get();
    let seal = (seal_ok
        && h.seal_end_pos.get() >= SEGMENT_HEADER_LEN as u64
        && h.seal_end_offset.get() >= h.base_offset.get())
    .then(|| (h.seal_end_offset.get(), h.seal_end_pos.get()));
    Ok(HeaderInfo {
        topic_id: h.topic_id.get(),
        partition_id: h.partition_id.get(),
        base_offset: h.base_offset.get(),
        created_ms: h.created_ms.get(),
        seal,
        version: h.version.get(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_seal() {
        let mut h = encode_header(3, 9, 1000, 55);
        let info = decode_header(&h).unwrap();
        assert_eq!(
            info,
            HeaderInfo {
                topic_id: 3,
                partition_id: 9,
                base_offset: 1000,
                created_ms: 55,
                seal: None,
                version: SEGMENT_VERSION_V1,
            }
        );
        h[SEAL_POS..SEAL_POS + 20].copy_from_slice(&encode_seal(1500, 9000));
        assert_eq!(decode_header(&h).unwrap().seal, Some((1500, 9000)));
    }

    #[test]
    fn every_header_byte_is_checked() {
        let h = encode_header(3, 9, 1000, 55);
        for i in 0..40 {
            let mut b = h;
            b[i] ^= 0x40;
            assert!(decode_header(&b).is_err(), "byte {i}");
        }
        // A damaged seal is ignored, never trusted.
        let mut b = h;
        b[SEAL_POS..SEAL_POS + 20].copy_from_slice(&encode_seal(1500, 9000));
        b[50] ^= 1;
        assert_eq!(decode_header(&b).unwrap().seal, None);
        assert_eq!(decode_header(&h[..63]), Err(HeaderError::Short));
    }

    #[test]
    fn a_version_2_header_names_its_version_and_is_checked_like_version_1() {
        let h = encode_header_version(SEGMENT_VERSION_V2, 3, 9, 1000, 55);
        let info = decode_header(&h).unwrap();
        assert_eq!((info.version, info.base_offset), (SEGMENT_VERSION_V2, 1000));
        for i in 0..40 {
            let mut b = h;
            b[i] ^= 0x40;
            assert!(decode_header(&b).is_err(), "byte {i}");
        }
        // Version 0 is no version.
        let mut b = h;
        b[8..10].copy_from_slice(&0u16.to_le_bytes());
        let crc = crc32fast::hash(&b[..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_header(&b), Err(HeaderError::Version(0)));
    }

    #[test]
    fn newer_version_is_unsupported_not_damage() {
        let mut h = encode_header(3, 9, 1000, 55);
        h[8..10].copy_from_slice(&(SEGMENT_VERSION + 1).to_le_bytes());
        // The CRC no longer matches, and the version still wins.
        assert_eq!(
            decode_header(&h),
            Err(HeaderError::Version(SEGMENT_VERSION + 1))
        );
    }
}
