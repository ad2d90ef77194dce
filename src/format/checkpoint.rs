//! Recovery checkpoint: how far each partition is known to be durable.
//!
//! Two files, `checkpoint.0` and `checkpoint.1`, are written alternately, so
//! a torn checkpoint write always leaves the other intact; the valid one with
//! the higher sequence number wins.
//!
//! ```text
//!  0  magic        b"FSNLCKP\0"
//!  8  version      u16
//! 10  flags        u16   bit 0: written by a clean shutdown
//! 12  payload_len  u32
//! 16  crc          u32   CRC of bytes 8..16 and 20..32+payload_len
//! 20  reserved     u32
//! 24  seq          u64
//! 32  payload: (version 2) saved_at_ms u64, then
//!       entry count u32, then per partition:
//!       topic_id u32, partition_id u32, segment_base u64, position u64,
//!       end_offset u64, start_offset u64 (retention floor),
//!       window count u32, per window:
//!       window_ms u32, bytes_per_sec f64, records_per_sec f64
//! ```
//!
//! Version 2 added `saved_at_ms`, the wall-clock time the rates were taken
//! at (Unix epoch milliseconds, 0 if unknown), so a reopen decays them by
//! the downtime instead of taking minutes-old rates as current. Version 1
//! files (no such field) still decode, with `saved_at_ms` 0.
//!
//! A position in a checkpoint was durable when the checkpoint was written:
//! the engine writes the positions of the previous completed sync, so data
//! below them is known synced (invalid bytes there are corruption) and data
//! above them may be a torn tail.

/// Checkpoint magic.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"FSNLCKP\0";
/// Checkpoint format version written (and the newest read).
pub const CHECKPOINT_VERSION: u16 = 2;
/// The oldest checkpoint version still read.
const CHECKPOINT_VERSION_MIN: u16 = 1;
/// Header length.
pub const CHECKPOINT_HEADER_LEN: usize = 32;
const MAX_WINDOWS: u32 = 64;

/// Persisted EWMA of one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowState {
    /// Window length in ms.
    pub window_ms: u32,
    /// Rate in bytes per second.
    pub bytes_per_sec: f64,
    /// Rate in records per second.
    pub records_per_sec: f64,
}

/// Durable position of one partition.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionCheckpoint {
    /// Topic id.
    pub topic_id: u32,
    /// Partition id.
    pub partition_id: u32,
    /// Base offset of the segment `position` refers to.
    pub segment_base: u64,
    /// Byte position in that segment up to which data is durable.
    pub position: u64,
    /// Offset matching `position` (exclusive end).
    pub end_offset: u64,
    /// Retention floor: segments starting below it were retired (a crash
    /// may bring their files back; recovery deletes them again).
    pub start_offset: u64,
    /// Write rates, so a restart resumes with what it knew.
    pub rates: Vec<WindowState>,
}

/// A whole checkpoint.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Checkpoint {
    /// Increases with every write.
    pub seq: u64,
    /// Written by a clean shutdown: positions are exact ends.
    pub clean: bool,
    /// Wall-clock time the rates were taken at, Unix epoch milliseconds;
    /// 0 if unknown (a version 1 file).
    pub saved_at_ms: u64,
    /// One entry per partition with data.
    pub partitions: Vec<PartitionCheckpoint>,
}

/// Encodes a checkpoint.
pub fn encode_checkpoint(c: &Checkpoint) -> Vec<u8> {
    let mut payload = Vec::with_capacity(12 + c.partitions.len() * 64);
    payload.extend_from_slice(&c.saved_at_ms.to_le_bytes());
    payload.extend_from_slice(&(c.partitions.len() as u32).to_le_bytes());
    for p in &c.partitions {
        payload.extend_from_slice(&p.topic_id.to_le_bytes());
        payload.extend_from_slice(&p.partition_id.to_le_bytes());
        payload.extend_from_slice(&p.segment_base.to_le_bytes());
        payload.extend_from_slice(&p.position.to_le_bytes());
        payload.extend_from_slice(&p.end_offset.to_le_bytes());
        payload.extend_from_slice(&p.start_offset.to_le_bytes());
        payload.extend_from_slice(&(p.rates.len() as u32).to_le_bytes());
        for w in &p.rates {
            payload.extend_from_slice(&w.window_ms.to_le_bytes());
            payload.extend_from_slice(&w.bytes_per_sec.to_le_bytes());
            payload.extend_from_slice(&w.records_per_sec.to_le_bytes());
        }
    }
    let mut out = Vec::with_capacity(CHECKPOINT_HEADER_LEN + payload.len());
    out.extend_from_slice(&CHECKPOINT_MAGIC);
    out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
    out.extend_from_slice(&u16::from(c.clean).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&c.seq.to_le_bytes());
    out.extend_from_slice(&payload);
    let crc = crc_of(&out);
    out[16..20].copy_from_slice(&crc.to_le_bytes());
    out
}

fn crc_of(buf: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[8..16]);
    h.update(&buf[20..]);
    h.finalize()
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        if self.0.len() < N {
            return Err("checkpoint payload truncated".into());
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.0[..N]);
        self.0 = &self.0[N..];
        Ok(out)
    }
    fn u32(&mut self) -> Result<u32, String> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, String> {
        self.take().map(u64::from_le_bytes)
    }
    fn f64(&mut self) -> Result<f64, String> {
        self.take().map(f64::from_le_bytes)
    }
}

/// The version of a checkpoint file written by a newer format than this
/// build reads; such a file is refused, never skipped as invalid (the next
/// sync would overwrite it, and recovery without it would trust too little).
pub fn newer_version(buf: &[u8]) -> Option<u16> {
    let version = u16::from_le_bytes([*buf.get(8)?, *buf.get(9)?]);
    (buf[..8] == CHECKPOINT_MAGIC && version > CHECKPOINT_VERSION).then_some(version)
}

/// Decodes a checkpoint file, or says why it is invalid.
pub fn decode_checkpoint(buf: &[u8]) -> Result<Checkpoint, String> {
    if buf.len() < CHECKPOINT_HEADER_LEN {
        return Err("file shorter than a checkpoint header".into());
    }
    if buf[..8] != CHECKPOINT_MAGIC {
        return Err("bad checkpoint magic".into());
    }
    let version = u16::from_le_bytes([buf[8], buf[9]]);
    if !(CHECKPOINT_VERSION_MIN..=CHECKPOINT_VERSION).contains(&version) {
        return Err(format!("unsupported checkpoint version {version}"));
    }
    let flags = u16::from_le_bytes([buf[10], buf[11]]);
    let len = u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]) as usize;
    if buf.len() - CHECKPOINT_HEADER_LEN < len {
        return Err("checkpoint payload truncated".into());
    }
    let stored = u32::from_le_bytes([buf[16], buf[17], buf[18], buf[19]]);
    let whole = &buf[..CHECKPOINT_HEADER_LEN + len];
    if crc_of(whole) != stored {
        return Err("checkpoint CRC mismatch".into());
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&buf[24..32]);
    let mut cur = Cursor(&whole[CHECKPOINT_HEADER_LEN..]);
    let saved_at_ms = if version >= 2 { cur.u64()? } else { 0 };
    let count = cur.u32()?;
    let mut partitions = Vec::new();
    for _ in 0..count {
        let mut p = PartitionCheckpoint {
            topic_id: cur.u32()?,
            partition_id: cur.u32()?,
            segment_base: cur.u64()?,
            position: cur.u64()?,
            end_offset: cur.u64()?,
            start_offset: cur.u64()?,
            rates: Vec::new(),
        };
        let windows = cur.u32()?;
        if windows > MAX_WINDOWS {
            return Err(format!("checkpoint lists {windows} rate windows"));
        }
        for _ in 0..windows {
            p.rates.push(WindowState {
                window_ms: cur.u32()?,
                bytes_per_sec: cur.f64()?,
                records_per_sec: cur.f64()?,
            });
        }
        partitions.push(p);
    }
    if !cur.0.is_empty() {
        return Err("bytes after the last checkpoint entry".into());
    }
    Ok(Checkpoint {
        seq: u64::from_le_bytes(seq),
        clean: flags & 1 == 1,
        saved_at_ms,
        partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            seq: 42,
            clean: true,
            saved_at_ms: 1_764_547_200_000,
            partitions: vec![PartitionCheckpoint {
                topic_id: 1,
                partition_id: 2,
                segment_base: 300,
                position: 4096,
                end_offset: 350,
                start_offset: 100,
                rates: vec![WindowState {
                    window_ms: 1000,
                    bytes_per_sec: 1.5,
                    records_per_sec: 0.25,
                }],
            }],
        }
    }

    #[test]
    fn round_trip() {
        let c = sample();
        assert_eq!(decode_checkpoint(&encode_checkpoint(&c)).unwrap(), c);
        // Trailing garbage after the payload is ignored (files are rewritten in place).
        let mut b = encode_checkpoint(&c);
        b.extend_from_slice(&[7; 30]);
        assert_eq!(decode_checkpoint(&b).unwrap(), c);
    }

    /// A version 1 file as the previous format wrote it: no save time.
    fn encode_v1(c: &Checkpoint) -> Vec<u8> {
        let mut b = encode_checkpoint(c);
        b.drain(CHECKPOINT_HEADER_LEN..CHECKPOINT_HEADER_LEN + 8);
        b[8..10].copy_from_slice(&1u16.to_le_bytes());
        let len = (b.len() - CHECKPOINT_HEADER_LEN) as u32;
        b[12..16].copy_from_slice(&len.to_le_bytes());
        let crc = crc_of(&b);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        b
    }

    #[test]
    fn version_1_files_still_decode_without_a_save_time() {
        let c = sample();
        let old = decode_checkpoint(&encode_v1(&c)).unwrap();
        assert_eq!(
            old,
            Checkpoint {
                saved_at_ms: 0,
                ..c.clone()
            }
        );
        assert_eq!(newer_version(&encode_v1(&c)), None);
        let mut newer = encode_checkpoint(&c);
        newer[8..10].copy_from_slice(&3u16.to_le_bytes());
        assert_eq!(newer_version(&newer), Some(3));
        assert!(decode_checkpoint(&newer).is_err());
    }

    #[test]
    fn every_byte_is_covered() {
        let b = encode_checkpoint(&sample());
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 0x10;
            assert!(decode_checkpoint(&x).is_err(), "byte {i}");
        }
        for n in 0..b.len() {
            assert!(decode_checkpoint(&b[..n]).is_err(), "prefix {n}");
        }
    }
}
