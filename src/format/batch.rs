//! Batch framing: the unit in which records reach a segment.
//!
//! ```text
//! batch header (40 bytes, little-endian)
//!   0  batch_len      u32   whole batch, header included
//!   4  crc            u32   CRC-32 (crc32fast, IEEE) of bytes 8..batch_len
//!   8  magic          u16   0xF1B1: batch format 1
//!  10  flags          u16   bit 0: hole (written by salvage recovery over
//!                             damaged bytes; `record_count` offsets were lost
//!                             and the payload is zero padding)
//!  12  record_count   u32   >= 1
//!  16  base_offset    u64   offset of the first record
//!  24  first_ts       i64   timestamp of the first record (ms since epoch)
//!  32  max_ts         i64   largest record timestamp in the batch
//! records, back to back:
//!   0  record_len     u32   bytes after this field
//!   4  key_len        u32   u32::MAX = no key
//!   8  timestamp      i64
//!  16  key bytes, value bytes
//! ```
//!
//! The CRC covers the base offset, so a stale or misplaced batch does not
//! validate at the wrong position: recovery compares `base_offset` with the
//! offset it expects next.
//!
//! # Batch format 2 (replicated partitions)
//!
//! ```text
//! batch header (64 bytes): the 40 bytes above with magic 0xF1B2, then
//!  40  raft_term      u64   openraft LogId.leader_id.term
//!  48  raft_leader    u64   openraft LogId.leader_id.node_id
//!  56  raft_index     u64   openraft LogId.index
//! flags bit 1: control (a Raft entry of its own: blank, membership, seal):
//!   record_count 0, base_offset = the partition's end (it takes no offset),
//!   payload = kind byte (ControlKind) + the entry's encoded body.
//! ```
//!
//! The first 40 bytes keep format 1's layout, so every reader parses both
//! with one function and only the start of the records moves. A control
//! batch has no records: a reader iterating records sees none, and
//! offsets stay dense without a translator. The CRC covers the log id, as
//! it covers the base offset: a batch of another term or index does not
//! validate where this one is expected. Holes (salvage) stay format 1.

use zerocopy::little_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// CRC-32 (IEEE) of `bytes`, the same value as `crc32fast::hash`.
/// `crc32fast::hash` builds a `Hasher`, which detects CPU features on every
/// call: about 37 of the ~840 instructions of a 100-byte single-record
/// append (callgrind). Cloning a hasher built once skips the detection.
#[inline]
pub fn crc32(bytes: &[u8]) -> u32 {
    static FRESH: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
    let mut h = FRESH.get_or_init(crc32fast::Hasher::new).clone();
    h.update(bytes);
    h.finalize()
}

/// Size of the batch header.
pub const BATCH_HEADER_LEN: usize = 40;
/// Size of the per-record header.
pub const RECORD_HEADER_LEN: usize = 16;
/// Magic (and format version) of a batch.
pub const BATCH_MAGIC: u16 = 0xF1B1;
/// Flag bit of a hole batch.
pub const FLAG_HOLE: u16 = 1;
/// `key_len` value meaning "no key".
pub const NO_KEY: u32 = u32::MAX;
/// Magic of batch format 2 (with the Raft log id).
pub const BATCH_MAGIC_V2: u16 = 0xF1B2;
/// Size of a format-2 batch header.
pub const BATCH_HEADER_V2_LEN: usize = 64;
/// Flag bit of a control batch (format 2 only).
pub const FLAG_CONTROL: u16 = 2;

/// A Raft log id as a format-2 batch stores it: openraft's
/// `LogId { leader_id: { term, node_id }, index }`. The whole id is kept,
/// not only the term: a committed leader id is (term, node id) and
/// openraft compares both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RaftLogId {
    /// The leader's term.
    pub term: u64,
    /// The leader's node id.
    pub leader: u64,
    /// The entry's index in the Raft log.
    pub index: u64,
}

/// What a control batch holds (its first payload byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum ControlKind {
    /// openraft's blank entry (every new leader commits one).
    Blank = 0,
    /// A membership entry (the payload is the encoded membership).
    Membership = 1,
    /// The partition's seal at a split (the payload names the topology epoch).
    Seal = 2,
}

impl ControlKind {
    /// The kind a payload byte names, if any.
    pub fn from_byte(b: u8) -> Option<ControlKind> {
        match b {
            0 => Some(ControlKind::Blank),
            1 => Some(ControlKind::Membership),
            2 => Some(ControlKind::Seal),
            _ => None,
        }
    }
}

/// What one Raft entry puts into the log: a data batch or a control batch.
#[derive(Debug, Clone, Copy)]
pub enum EntryBody<'a> {
    /// Records (at least one), which take offsets.
    Records(&'a [RecordIn<'a>]),
    /// A Raft entry of its own kind and encoded body; takes no offset.
    Control(ControlKind, &'a [u8]),
}

impl EntryBody<'_> {
    /// Encoded size of the format-2 batch holding this entry.
    pub fn batch_len(&self) -> usize {
        match self {
            EntryBody::Records(r) => {
                BATCH_HEADER_V2_LEN + r.iter().map(RecordIn::encoded_len).sum::<usize>()
            }
            EntryBody::Control(_, body) => BATCH_HEADER_V2_LEN + 1 + body.len(),
        }
    }

    /// Offsets the entry takes.
    pub fn record_count(&self) -> usize {
        match self {
            EntryBody::Records(r) => r.len(),
            EntryBody::Control(..) => 0,
        }
    }
}

/// The on-disk format-2 batch header: format 1's fields, then the log id.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BatchHeaderV2 {
    /// The fields shared with format 1 (magic [`BATCH_MAGIC_V2`]).
    pub base: BatchHeader,
    /// The leader's term.
    pub raft_term: U64,
    /// The leader's node id.
    pub raft_leader: U64,
    /// The entry's Raft index.
    pub raft_index: U64,
}

const _: () = assert!(std::mem::size_of::<BatchHeaderV2>() == BATCH_HEADER_V2_LEN);

impl BatchHeaderV2 {
    /// The Raft log id the header carries.
    pub fn log_id(&self) -> RaftLogId {
        RaftLogId {
            term: self.raft_term.get(),
            leader: self.raft_leader.get(),
            index: self.raft_index.get(),
        }
    }

    /// Whether the batch is a control batch.
    pub fn is_control(&self) -> bool {
        self.base.flags.get() & FLAG_CONTROL != 0
    }
}

/// The on-disk batch header.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BatchHeader {
    /// Whole batch length in bytes.
    pub batch_len: U32,
    /// CRC of bytes `8..batch_len`.
    pub crc: U32,
    /// [`BATCH_MAGIC`].
    pub magic: U16,
    /// Reserved.
    pub flags: U16,
    /// Number of records.
    pub record_count: U32,
    /// Offset of the first record.
    pub base_offset: U64,
    /// First record's timestamp.
    pub first_ts: I64,
    /// Largest timestamp in the batch.
    pub max_ts: I64,
}

/// The on-disk record header.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RecordHeader {
    record_len: U32,
    key_len: U32,
    timestamp: I64,
}

const _: () = assert!(std::mem::size_of::<BatchHeader>() == BATCH_HEADER_LEN);
const _: () = assert!(std::mem::size_of::<RecordHeader>() == RECORD_HEADER_LEN);

/// A record to append.
#[derive(Debug, Clone, Copy)]
pub struct RecordIn<'a> {
    /// Routing key, if any.
    pub key: Option<&'a [u8]>,
    /// Payload.
    pub value: &'a [u8],
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
}

impl RecordIn<'_> {
    /// Encoded size of this record inside a batch.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER_LEN + self.key.map_or(0, <[u8]>::len) + self.value.len()
    }
}

/// Encoded size of a batch holding `records`.
pub fn batch_len(records: &[RecordIn<'_>]) -> usize {
    BATCH_HEADER_LEN + records.iter().map(RecordIn::encoded_len).sum::<usize>()
}

/// Writes a batch into `dst`, which must be exactly [`batch_len`] bytes.
/// Returns the header as written. Panics if `dst` has the wrong size or
/// `records` is empty (callers size it; both are invariants).
pub fn encode_batch(dst: &mut [u8], base_offset: u64, records: &[RecordIn<'_>]) -> BatchHeader {
    assert!(!records.is_empty(), "a batch holds at least one record");
    assert_eq!(
        dst.len(),
        batch_len(records),
        "destination sized for the batch"
    );
    let max_ts = encode_records(&mut dst[BATCH_HEADER_LEN..], records);
    let mut header = BatchHeader {
        batch_len: U32::new(dst.len() as u32),
        crc: U32::new(0),
        magic: U16::new(BATCH_MAGIC),
        flags: U16::new(0),
        record_count: U32::new(records.len() as u32),
        base_offset: U64::new(base_offset),
        first_ts: I64::new(records[0].timestamp),
        max_ts: I64::new(max_ts),
    };
    dst[..BATCH_HEADER_LEN].copy_from_slice(header.as_bytes());
    let crc = crc32(&dst[8..]);
    header.crc = U32::new(crc);
    dst[4..8].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Writes a format-2 batch holding `body` with Raft log id `id` into `dst`,
/// which must be exactly [`EntryBody::batch_len`] bytes. A control batch
/// takes no offset (`base_offset` is the partition's end) and carries
/// `control_ts` (the leader's clock) as both timestamps. Panics if `dst`
/// has the wrong size or a records body is empty (callers size and check
/// it; both are invariants).
pub fn encode_batch_v2(
    dst: &mut [u8],
    base_offset: u64,
    id: RaftLogId,
    body: EntryBody<'_>,
    control_ts: i64,
) -> BatchHeaderV2 {
    assert_eq!(
        dst.len(),
        body.batch_len(),
        "destination sized for the batch"
    );
    let payload = &mut dst[BATCH_HEADER_V2_LEN..];
    let (flags, count, first_ts, max_ts) = match body {
        EntryBody::Records(records) => {
            assert!(
                !records.is_empty(),
                "a data batch holds at least one record"
            );
            let max_ts = encode_records(payload, records);
            (0, records.len() as u32, records[0].timestamp, max_ts)
        }
        EntryBody::Control(kind, bytes) => {
            payload[0] = kind as u8;
            payload[1..].copy_from_slice(bytes);
            (FLAG_CONTROL, 0, control_ts, control_ts)
        }
    };
    let mut header = BatchHeaderV2 {
        base: BatchHeader {
            batch_len: U32::new(dst.len() as u32),
            crc: U32::new(0),
            magic: U16::new(BATCH_MAGIC_V2),
            flags: U16::new(flags),
            record_count: U32::new(count),
            base_offset: U64::new(base_offset),
            first_ts: I64::new(first_ts),
            max_ts: I64::new(max_ts),
        },
        raft_term: U64::new(id.term),
        raft_leader: U64::new(id.leader),
        raft_index: U64::new(id.index),
    };
    dst[..BATCH_HEADER_V2_LEN].copy_from_slice(header.as_bytes());
    let crc = crc32(&dst[8..]);
    header.base.crc = U32::new(crc);
    dst[4..8].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Writes `records` back to back into `dst` (exactly their encoded
/// length). Returns their largest timestamp.
fn encode_records(dst: &mut [u8], records: &[RecordIn<'_>]) -> i64 {
    let mut pos = 0;
    let mut max_ts = i64::MIN;
    for r in records {
        let key_len = r.key.map_or(0, <[u8]>::len);
        let hdr = RecordHeader {
            record_len: U32::new((r.encoded_len() - 4) as u32),
            key_len: U32::new(r.key.map_or(NO_KEY, |k| k.len() as u32)),
            timestamp: I64::new(r.timestamp),
        };
        dst[pos..pos + RECORD_HEADER_LEN].copy_from_slice(hdr.as_bytes());
        pos += RECORD_HEADER_LEN;
        if let Some(k) = r.key {
            dst[pos..pos + key_len].copy_from_slice(k);
            pos += key_len;
        }
        dst[pos..pos + r.value.len()].copy_from_slice(r.value);
        pos += r.value.len();
        max_ts = max_ts.max(r.timestamp);
    }
    debug_assert_eq!(pos, dst.len(), "records fill their space");
    max_ts
}

/// Whether a (validated) batch is a hole left by salvage recovery.
pub fn is_hole(h: &BatchHeader) -> bool {
    h.flags.get() & FLAG_HOLE != 0
}

/// Writes a hole batch over `dst` (at least [`BATCH_HEADER_LEN`] bytes):
/// `lost` offsets starting at `base_offset` are gone; the payload is zeroed.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn encode_hole(dst: &mut [u8], base_offset: u64, lost: u32) {
    let len = u32::try_from(dst.len()).expect("a batch is shorter than 4 GiB");
    let header = hole_header(len, base_offset, lost);
    dst.fill(0);
    dst[..BATCH_HEADER_LEN].copy_from_slice(&header);
}

/// The header of a hole batch of `len` bytes whose payload is all zeros
/// (see [`encode_hole`]), computed without the payload in memory, so a
/// large hole can be written in bounded pieces.
pub fn hole_header(len: u32, base_offset: u64, lost: u32) -> [u8; BATCH_HEADER_LEN] {
    assert!(
        len as usize >= BATCH_HEADER_LEN && lost > 0,
        "a hole covers a header and at least one offset"
    );
    let header = BatchHeader {
        batch_len: U32::new(len),
        crc: U32::new(0),
        magic: U16::new(BATCH_MAGIC),
        flags: U16::new(FLAG_HOLE),
        record_count: U32::new(lost),
        base_offset: U64::new(base_offset),
        first_ts: I64::new(0),
        max_ts: I64::new(i64::MIN),
    };
    let mut out = [0u8; BATCH_HEADER_LEN];
    out.copy_from_slice(header.as_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[8..]);
    let zeros = [0u8; 4096];
    let mut rest = len as usize - BATCH_HEADER_LEN;
    while rest > 0 {
        let n = rest.min(zeros.len());
        crc.update(&zeros[..n]);
        rest -= n;
    }
    out[4..8].copy_from_slice(&crc.finalize().to_le_bytes());
    out
}

/// Why bytes at a position are not a valid batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// Fewer bytes than a header remain.
    ShortHeader,
    /// The header is all zeros: never-written space.
    Zeroed,
    /// Magic is not [`BATCH_MAGIC`].
    BadMagic(u16),
    /// `batch_len` is impossible or runs past the available bytes.
    BadLength(u32),
    /// Zero records, or records that do not exactly fill the batch.
    BadRecords(&'static str),
    /// CRC mismatch.
    BadCrc {
        /// Stored CRC.
        expected: u32,
        /// Computed CRC.
        actual: u32,
    },
    /// A batch of the other format than its segment's version names.
    WrongFormat {
        /// The segment header's version.
        segment_version: u16,
        /// The batch's magic.
        magic: u16,
    },
    /// A format-2 batch out of Raft order: its index is not the previous
    /// batch's + 1, or its term is below the previous batch's.
    RaftOrder {
        /// The previous batch's Raft index.
        prev_index: u64,
        /// The previous batch's term.
        prev_term: u64,
        /// This batch's Raft index.
        index: u64,
        /// This batch's term.
        term: u64,
    },
    /// The batch is valid but not at the offset expected here.
    OffsetMismatch {
        /// Offset expected at this position.
        expected: u64,
        /// Offset the batch claims.
        found: u64,
    },
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchError::ShortHeader => write!(f, "truncated batch header"),
            BatchError::Zeroed => write!(f, "zeroed bytes where a batch was expected"),
            BatchError::BadMagic(m) => write!(f, "bad batch magic {m:#06x}"),
            BatchError::BadLength(l) => write!(f, "impossible batch length {l}"),
            BatchError::BadRecords(why) => write!(f, "bad record framing: {why}"),
            BatchError::BadCrc { expected, actual } => {
                write!(
                    f,
                    "batch CRC mismatch (stored {expected:#010x}, computed {actual:#010x})"
                )
            }
            BatchError::WrongFormat {
                segment_version,
                magic,
            } => write!(
                f,
                "batch magic {magic:#06x} in a segment of version {segment_version}"
            ),
            BatchError::RaftOrder {
                prev_index,
                prev_term,
                index,
                term,
            } => write!(
                f,
                "Raft entry {index} (term {term}) follows entry {prev_index} (term {prev_term})"
            ),
            BatchError::OffsetMismatch { expected, found } => {
                write!(f, "batch has base offset {found}, expected {expected}")
            }
        }
    }
}

/// A batch header's fields, read once from the bytes into native integers.
///
/// The read path works on these rather than on a [`BatchHeader`]: that
/// type has alignment 1, and returned inside a `Result` its fields sit at
/// odd offsets, so reading them back right after the callee stored them
/// missed store-to-load forwarding (a stall per batch, a third of the
/// iteration's time in a profile of 1 KiB single-record batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderFields {
    /// [`BATCH_MAGIC`] or [`BATCH_MAGIC_V2`]: the batch format.
    pub magic: u16,
    /// Whole batch length in bytes.
    pub batch_len: u32,
    /// Stored CRC of bytes `8..batch_len`.
    pub crc: u32,
    /// Flag bits ([`FLAG_HOLE`]).
    pub flags: u16,
    /// Number of records (or lost offsets, for a hole).
    pub record_count: u32,
    /// Offset of the first record.
    pub base_offset: u64,
    /// First record's timestamp.
    pub first_ts: i64,
    /// Largest timestamp in the batch.
    pub max_ts: i64,
}

impl HeaderFields {
    /// Whether the batch is a hole left by salvage recovery.
    #[inline]
    pub fn is_hole(&self) -> bool {
        self.flags & FLAG_HOLE != 0
    }

    /// Whether the batch is a control batch (format 2): no records.
    #[inline]
    pub fn is_control(&self) -> bool {
        self.flags & FLAG_CONTROL != 0
    }

    /// Length of the header: where the records (or control payload) start.
    #[inline]
    pub fn header_len(&self) -> usize {
        header_len_of(self.magic)
    }

    /// The on-disk header these fields came from (its first 40 bytes).
    #[inline]
    pub fn header(&self) -> BatchHeader {
        BatchHeader {
            batch_len: U32::new(self.batch_len),
            crc: U32::new(self.crc),
            magic: U16::new(self.magic),
            flags: U16::new(self.flags),
            record_count: U32::new(self.record_count),
            base_offset: U64::new(self.base_offset),
            first_ts: I64::new(self.first_ts),
            max_ts: I64::new(self.max_ts),
        }
    }
}

/// Header length of the batch format `magic` names (format 1 otherwise).
#[inline]
fn header_len_of(magic: u16) -> usize {
    if magic == BATCH_MAGIC_V2 {
        BATCH_HEADER_V2_LEN
    } else {
        BATCH_HEADER_LEN
    }
}

/// The format-2 header at the start of the (parsed) batch `buf`; `None`
/// for a format-1 batch or fewer than 64 bytes.
pub fn header_v2(buf: &[u8]) -> Option<BatchHeaderV2> {
    let (h, _) = BatchHeaderV2::read_from_prefix(buf).ok()?;
    (h.base.magic.get() == BATCH_MAGIC_V2).then_some(h)
}

/// The kind and body of the validated control batch `buf` (header
/// included); `None` for any other batch.
pub fn control_body(buf: &[u8]) -> Option<(ControlKind, &[u8])> {
    let h = header_v2(buf)?;
    if !h.is_control() {
        return None;
    }
    let payload = buf.get(BATCH_HEADER_V2_LEN..h.base.batch_len.get() as usize)?;
    let (&kind, body) = payload.split_first()?;
    Some((ControlKind::from_byte(kind)?, body))
}

/// Parses and bounds-checks a header at the start of `buf` (no CRC check).
/// `buf` is everything that may belong to the batch (to the end of data).
#[inline]
pub fn parse_header(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    header_fields(buf).map(|f| f.header())
}

/// [`parse_header`], returning the fields. Always inlined: returned
/// through memory, its result costs a store-forwarding stall per batch.
#[inline(always)]
pub fn header_fields(buf: &[u8]) -> Result<HeaderFields, BatchError> {
    let Some(h) = buf.first_chunk::<BATCH_HEADER_LEN>() else {
        return Err(BatchError::ShortHeader);
    };
    let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
    let magic = u16_at(8);
    // A header with the magic is not all zeros: the zero scan only runs on
    // the failure path.
    if magic != BATCH_MAGIC && magic != BATCH_MAGIC_V2 {
        if h.iter().all(|&b| b == 0) {
            return Err(BatchError::Zeroed);
        }
        return Err(BatchError::BadMagic(magic));
    }
    let f = HeaderFields {
        magic,
        batch_len: u32_at(0),
        crc: u32_at(4),
        flags: u16_at(10),
        record_count: u32_at(12),
        base_offset: u64_at(16),
        first_ts: u64_at(24) as i64,
        max_ts: u64_at(32) as i64,
    };
    let len = f.batch_len;
    let count = u64::from(f.record_count);
    let v2 = magic == BATCH_MAGIC_V2;
    if v2 {
        return v2_bounds(f, buf);
    }
    if count == 0 {
        return Err(BatchError::BadRecords("zero records"));
    }
    // Offsets are u64: a batch whose offsets would run past u64::MAX cannot
    // have been written, and accepting it would overflow every end offset
    // computed from it.
    if f.base_offset.checked_add(count).is_none() {
        return Err(BatchError::BadRecords("offsets run past u64::MAX"));
    }
    if f.flags & !FLAG_HOLE != 0 {
        return Err(BatchError::BadRecords("unknown flags"));
    }
    let per_record = if f.is_hole() {
        0
    } else {
        RECORD_HEADER_LEN as u64
    };
    let min = BATCH_HEADER_LEN as u64 + count * per_record;
    if (len as u64) < min || len as usize > buf.len() {
        return Err(BatchError::BadLength(len));
    }
    Ok(f)
}

/// The bounds of a format-2 header: flags (control only, never a hole),
/// the record count (zero exactly for control), one timestamp for a
/// control batch, the length.
#[cold]
fn v2_bounds(f: HeaderFields, buf: &[u8]) -> Result<HeaderFields, BatchError> {
    let count = u64::from(f.record_count);
    if f.flags & !FLAG_CONTROL != 0 {
        return Err(BatchError::BadRecords("unknown flags"));
    }
    let min = if f.is_control() {
        if count != 0 {
            return Err(BatchError::BadRecords("a control batch with records"));
        }
        // Written with one timestamp (the leader's clock) in both fields.
        if f.first_ts != f.max_ts {
            return Err(BatchError::BadRecords(
                "a control batch whose timestamps differ",
            ));
        }
        BATCH_HEADER_V2_LEN as u64 + 1
    } else {
        if count == 0 {
            return Err(BatchError::BadRecords("zero records"));
        }
        if f.base_offset.checked_add(count).is_none() {
            return Err(BatchError::BadRecords("offsets run past u64::MAX"));
        }
        BATCH_HEADER_V2_LEN as u64 + count * RECORD_HEADER_LEN as u64
    };
    if (f.batch_len as u64) < min || f.batch_len as usize > buf.len() {
        return Err(BatchError::BadLength(f.batch_len));
    }
    Ok(f)
}

/// Validates the batch at the start of `buf`: header bounds, CRC, record
/// framing and (when given) the expected base offset. Returns the header.
#[inline]
pub fn validate(buf: &[u8], expected_offset: Option<u64>) -> Result<BatchHeader, BatchError> {
    validate_fields(buf, expected_offset).map(|f| f.header())
}

/// [`validate`], returning the fields. Always inlined, as
/// [`header_fields`].
#[inline(always)]
pub fn validate_fields(
    buf: &[u8],
    expected_offset: Option<u64>,
) -> Result<HeaderFields, BatchError> {
    let f = header_fields(buf)?;
    let len = f.batch_len as usize;
    let actual = crc32(&buf[8..len]);
    if f.crc != actual {
        return Err(BatchError::BadCrc {
            expected: f.crc,
            actual,
        });
    }
    if f.is_control() {
        if ControlKind::from_byte(buf[BATCH_HEADER_V2_LEN]).is_none() {
            return Err(BatchError::BadRecords("unknown control kind"));
        }
    } else if !f.is_hole() {
        check_records(&buf[f.header_len()..len], f.record_count)?;
    }
    if let Some(expected) = expected_offset {
        if f.base_offset != expected {
            return Err(BatchError::OffsetMismatch {
                expected,
                found: f.base_offset,
            });
        }
    }
    Ok(f)
}

/// Checks that `count` records exactly fill `payload`.
#[inline]
fn check_records(payload: &[u8], count: u32) -> Result<(), BatchError> {
    let mut it = RecordIter {
        payload,
        remaining: count,
        next_offset: 0,
    };
    for r in &mut it {
        r?;
    }
    if !it.payload.is_empty() {
        return Err(BatchError::BadRecords("bytes left after the last record"));
    }
    Ok(())
}

/// A record read back from a batch, borrowing its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// Offset in its partition.
    pub offset: u64,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// Routing key, if the record had one.
    pub key: Option<&'a [u8]>,
    /// Payload.
    pub value: &'a [u8],
}

/// Iterates the records of a batch payload (the bytes after the header).
#[derive(Debug, Clone)]
pub struct RecordIter<'a> {
    payload: &'a [u8],
    remaining: u32,
    next_offset: u64,
}

impl<'a> RecordIter<'a> {
    /// Iterates the records of the validated batch `batch` (header included).
    #[inline]
    pub fn new(batch: &'a [u8], header: &BatchHeader) -> RecordIter<'a> {
        RecordIter {
            payload: &batch[header_len_of(header.magic.get())..header.batch_len.get() as usize],
            remaining: header.record_count.get(),
            next_offset: header.base_offset.get(),
        }
    }

    /// [`RecordIter::new`] from the header's fields.
    #[inline]
    pub fn from_fields(batch: &'a [u8], f: &HeaderFields) -> RecordIter<'a> {
        RecordIter {
            payload: &batch[f.header_len()..f.batch_len as usize],
            remaining: f.record_count,
            next_offset: f.base_offset,
        }
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<RecordView<'a>, BatchError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let Ok((hdr, _)) = RecordHeader::read_from_prefix(self.payload) else {
            self.remaining = 0;
            return Some(Err(BatchError::BadRecords("truncated record header")));
        };
        let body_len = hdr.record_len.get() as usize;
        let total = 4 + body_len;
        let key_len = hdr.key_len.get();
        let key_bytes = if key_len == NO_KEY {
            0
        } else {
            key_len as usize
        };
        if body_len < RECORD_HEADER_LEN - 4
            || total > self.payload.len()
            || RECORD_HEADER_LEN + key_bytes > total
        {
            self.remaining = 0;
            return Some(Err(BatchError::BadRecords("record length out of bounds")));
        }
        let body = &self.payload[RECORD_HEADER_LEN..total];
        let (key, value) = body.split_at(key_bytes);
        let view = RecordView {
            offset: self.next_offset,
            timestamp: hdr.timestamp.get(),
            key: (key_len != NO_KEY).then_some(key),
            value,
        };
        self.payload = &self.payload[total..];
        self.next_offset += 1;
        Some(Ok(view))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let recs = [
            RecordIn {
                key: Some(b"k1"),
                value: b"hello",
                timestamp: 10,
            },
            RecordIn {
                key: None,
                value: b"",
                timestamp: 30,
            },
            RecordIn {
                key: Some(b""),
                value: b"x",
                timestamp: 20,
            },
        ];
        let mut buf = vec![0; batch_len(&recs)];
        encode_batch(&mut buf, 7, &recs);
        buf
    }

    #[test]
    fn header_fields_read_every_field_of_the_on_disk_header() {
        let mut buf = sample();
        let f = validate_fields(&buf, Some(7)).unwrap();
        assert_eq!(f.header().as_bytes(), &buf[..BATCH_HEADER_LEN]);
        assert_eq!((f.base_offset, f.record_count), (7, 3));
        assert_eq!((f.first_ts, f.max_ts, f.flags), (10, 30, 0));
        assert_eq!(f.batch_len as usize, buf.len());
        // Every byte of the header moves some field (or fails the parse).
        for i in 0..BATCH_HEADER_LEN {
            buf[i] ^= 0x01;
            if let Ok(g) = header_fields(&buf) {
                assert_ne!(f, g, "byte {i} read by no field");
                assert_eq!(g.header().as_bytes(), &buf[..BATCH_HEADER_LEN]);
            }
            buf[i] ^= 0x01;
        }
    }

    #[test]
    fn round_trip() {
        let buf = sample();
        let h = validate(&buf, Some(7)).unwrap();
        assert_eq!(h.record_count.get(), 3);
        assert_eq!(h.first_ts.get(), 10);
        assert_eq!(h.max_ts.get(), 30);
        let recs: Vec<_> = RecordIter::new(&buf, &h).map(Result::unwrap).collect();
        assert_eq!(
            recs[0],
            RecordView {
                offset: 7,
                timestamp: 10,
                key: Some(b"k1"),
                value: b"hello"
            }
        );
        assert_eq!(
            recs[1],
            RecordView {
                offset: 8,
                timestamp: 30,
                key: None,
                value: b""
            }
        );
        assert_eq!(
            recs[2],
            RecordView {
                offset: 9,
                timestamp: 20,
                key: Some(b""),
                value: b"x"
            }
        );
    }

    #[test]
    fn every_byte_flip_is_detected() {
        let buf = sample();
        for i in 0..buf.len() {
            for bit in 0..8 {
                let mut b = buf.clone();
                b[i] ^= 1 << bit;
                assert!(
                    validate(&b, Some(7)).is_err(),
                    "flip of byte {i} bit {bit} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn hole_round_trip() {
        let mut buf = vec![0xAA; 100];
        encode_hole(&mut buf, 50, 1000);
        let h = validate(&buf, Some(50)).unwrap();
        assert!(is_hole(&h));
        assert_eq!(h.record_count.get(), 1000);
        let mut b = buf.clone();
        b[99] = 1;
        assert!(validate(&b, Some(50)).is_err());
    }

    #[test]
    fn a_hole_header_written_over_zeros_is_the_hole_batch() {
        for len in [BATCH_HEADER_LEN, 100, 4096, 4097, 3 * 4096 + 17] {
            let mut whole = vec![0x55; len];
            encode_hole(&mut whole, 7, 3);
            let mut pieces = vec![0u8; len];
            pieces[..BATCH_HEADER_LEN].copy_from_slice(&hole_header(len as u32, 7, 3));
            assert_eq!(pieces, whole, "{len} bytes");
            assert!(validate(&pieces, Some(7)).is_ok());
        }
    }

    #[test]
    fn offset_mismatch_is_reported() {
        let buf = sample();
        assert_eq!(
            validate(&buf, Some(8)).unwrap_err(),
            BatchError::OffsetMismatch {
                expected: 8,
                found: 7
            }
        );
    }

    #[test]
    fn bounds() {
        assert_eq!(
            parse_header(&[0u8; 10]).unwrap_err(),
            BatchError::ShortHeader
        );
        assert_eq!(parse_header(&[0u8; 64]).unwrap_err(), BatchError::Zeroed);
        let buf = sample();
        // Batch runs past the available bytes.
        assert!(matches!(
            parse_header(&buf[..buf.len() - 1]),
            Err(BatchError::BadLength(_))
        ));
        // Zero records.
        let mut b = buf.clone();
        b[12..16].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            parse_header(&b).unwrap_err(),
            BatchError::BadRecords("zero records")
        );
        // Length smaller than the header of its records.
        let mut b = buf.clone();
        b[0..4].copy_from_slice(&41u32.to_le_bytes());
        assert!(matches!(parse_header(&b), Err(BatchError::BadLength(41))));
        // Bad magic.
        let mut b = buf;
        b[8] ^= 0xff;
        assert!(matches!(parse_header(&b), Err(BatchError::BadMagic(_))));
    }

    #[test]
    fn crc32_matches_crc32fast() {
        let buf = sample();
        for end in [0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, buf.len()] {
            let b = &buf[..end.min(buf.len())];
            assert_eq!(crc32(b), crc32fast::hash(b), "{end} bytes");
        }
        let long: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        assert_eq!(crc32(&long), crc32fast::hash(&long));
    }

    #[test]
    fn record_framing_is_checked_even_with_valid_crc() {
        let mut buf = sample();
        // Make the first record claim more bytes than the batch has, fix the CRC.
        buf[40..44].copy_from_slice(&1000u32.to_le_bytes());
        let crc = crc32fast::hash(&buf[8..]);
        buf[4..8].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            validate(&buf, None),
            Err(BatchError::BadRecords(_))
        ));
    }

    fn id(term: u64, index: u64) -> RaftLogId {
        RaftLogId {
            term,
            leader: 3,
            index,
        }
    }

    fn v2(base: u64, id: RaftLogId, body: EntryBody<'_>) -> Vec<u8> {
        let mut buf = vec![0; body.batch_len()];
        encode_batch_v2(&mut buf, base, id, body, 77);
        buf
    }

    const RECS: [RecordIn<'static>; 2] = [
        RecordIn {
            key: Some(b"k"),
            value: b"v1",
            timestamp: 5,
        },
        RecordIn {
            key: None,
            value: b"v2",
            timestamp: 9,
        },
    ];

    #[test]
    fn a_format_2_data_batch_round_trips_its_records_and_log_id() {
        let buf = v2(40, id(7, 12), EntryBody::Records(&RECS));
        let f = validate_fields(&buf, Some(40)).unwrap();
        assert_eq!(
            (f.magic, f.record_count, f.header_len()),
            (BATCH_MAGIC_V2, 2, 64)
        );
        assert!(!f.is_control());
        let h = header_v2(&buf).unwrap();
        assert_eq!(h.log_id(), id(7, 12));
        let recs: Vec<_> = RecordIter::from_fields(&buf, &f)
            .map(Result::unwrap)
            .collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(
            (recs[0].offset, recs[0].key, recs[0].value),
            (40, Some(&b"k"[..]), &b"v1"[..])
        );
        assert_eq!(
            (recs[1].offset, recs[1].value, recs[1].timestamp),
            (41, &b"v2"[..], 9)
        );
        let via_header: Vec<_> = RecordIter::new(&buf, &f.header())
            .map(Result::unwrap)
            .collect();
        assert_eq!(via_header, recs);
        assert_eq!(control_body(&buf), None);
    }

    #[test]
    fn a_control_batch_takes_no_offset_and_yields_no_record() {
        let buf = v2(
            40,
            id(7, 13),
            EntryBody::Control(ControlKind::Membership, b"m"),
        );
        let f = validate_fields(&buf, Some(40)).unwrap();
        assert!(f.is_control());
        assert_eq!(
            (f.record_count, f.base_offset, f.first_ts, f.max_ts),
            (0, 40, 77, 77)
        );
        assert_eq!(RecordIter::from_fields(&buf, &f).count(), 0);
        assert_eq!(
            control_body(&buf),
            Some((ControlKind::Membership, &b"m"[..]))
        );
        let blank = v2(40, id(7, 14), EntryBody::Control(ControlKind::Blank, b""));
        assert_eq!(control_body(&blank), Some((ControlKind::Blank, &b""[..])));
    }

    #[test]
    fn the_crc_of_a_format_2_batch_covers_every_byte_of_the_log_id() {
        for body in [
            EntryBody::Records(&RECS),
            EntryBody::Control(ControlKind::Seal, b"e"),
        ] {
            let buf = v2(40, id(7, 12), body);
            for i in 0..buf.len() {
                for bit in 0..8 {
                    let mut b = buf.clone();
                    b[i] ^= 1 << bit;
                    assert!(
                        validate(&b, Some(40)).is_err(),
                        "flip of byte {i} bit {bit} went unnoticed"
                    );
                }
            }
        }
    }

    #[test]
    fn format_1_bytes_are_unchanged_by_format_2() {
        let mut buf = vec![0; batch_len(&RECS)];
        encode_batch(&mut buf, 40, &RECS);
        let mut expected = Vec::new();
        expected.extend_from_slice(&(buf.len() as u32).to_le_bytes());
        expected.extend_from_slice(&crc32(&buf[8..]).to_le_bytes());
        expected.extend_from_slice(&BATCH_MAGIC.to_le_bytes());
        expected.extend_from_slice(&0u16.to_le_bytes());
        expected.extend_from_slice(&2u32.to_le_bytes());
        expected.extend_from_slice(&40u64.to_le_bytes());
        expected.extend_from_slice(&5i64.to_le_bytes());
        expected.extend_from_slice(&9i64.to_le_bytes());
        assert_eq!(&buf[..BATCH_HEADER_LEN], &expected[..]);
        assert_eq!(validate_fields(&buf, Some(40)).unwrap().header_len(), 40);
        assert!(header_v2(&buf).is_none());
        // The same records in format 2 differ only by the header.
        let v = v2(40, id(1, 1), EntryBody::Records(&RECS));
        assert_eq!(&v[BATCH_HEADER_V2_LEN..], &buf[BATCH_HEADER_LEN..]);
    }

    #[test]
    fn malformed_format_2_headers_are_refused() {
        let resealed = |mut b: Vec<u8>| {
            let crc = crc32(&b[8..]);
            b[4..8].copy_from_slice(&crc.to_le_bytes());
            b
        };
        // A data batch claiming zero records.
        let mut b = v2(0, id(1, 1), EntryBody::Records(&RECS));
        b[12..16].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            validate(&resealed(b), None).unwrap_err(),
            BatchError::BadRecords("zero records")
        );
        // A control batch claiming records.
        let mut b = v2(0, id(1, 1), EntryBody::Control(ControlKind::Blank, b""));
        b[12..16].copy_from_slice(&1u32.to_le_bytes());
        assert!(validate(&resealed(b), None).is_err());
        // A control batch of an unknown kind.
        let mut b = v2(0, id(1, 1), EntryBody::Control(ControlKind::Blank, b""));
        b[64] = 9;
        assert_eq!(
            validate(&resealed(b), None).unwrap_err(),
            BatchError::BadRecords("unknown control kind")
        );
        // A hole flag on a format-2 batch, and an unknown flag.
        for flag in [FLAG_HOLE, 4] {
            let mut b = v2(0, id(1, 1), EntryBody::Records(&RECS));
            b[10..12].copy_from_slice(&flag.to_le_bytes());
            assert_eq!(
                validate(&resealed(b), None).unwrap_err(),
                BatchError::BadRecords("unknown flags")
            );
        }
        // Cut anywhere inside the header or payload.
        let b = v2(0, id(1, 1), EntryBody::Records(&RECS));
        for cut in 0..b.len() {
            assert!(validate(&b[..cut], None).is_err(), "cut at {cut}");
        }
    }
}
