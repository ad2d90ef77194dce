//! The descendant index of a tail split: for every moved record of the
//! parent (offsets `from..seal`), the child it was copied into.
//!
//! ```text
//! magic b"FSNLTIX\0" (8) | version u16 = 1 | children u16 | parent u32
//! from u64 | seal u64 | slot u8 per moved record (index into the
//! record's children, in range order) | crc u32 (CRC-32 IEEE of all
//! bytes before it)
//! ```
//!
//! A record's child offset is the number of earlier moved records with the
//! same slot: each child holds its moved records at `0..count`, in parent
//! order. The file is written once, fdatasynced (with its directory)
//! before the `TailSplit` record that names its CRC, and never changed.

/// File magic.
pub const MAGIC: [u8; 8] = *b"FSNLTIX\0";
const HEADER_LEN: usize = 8 + 2 + 2 + 4 + 8 + 8;
/// Prefix counts every this many records (translation scans at most one block).
const BLOCK: usize = 4096;

/// The file name of a parent's descendant index (in the topic's directory;
/// in the first child's for splits written before that).
pub fn file_name(parent: u32) -> String {
    format!("tail-p{parent}.tix")
}

/// Whether `name` is a descendant index file name.
pub fn is_file_name(name: &str) -> bool {
    name.starts_with("tail-p") && name.ends_with(".tix")
}

/// A decoded descendant index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailIndex {
    /// Parent partition.
    pub parent: u32,
    /// First moved offset.
    pub from: u64,
    /// End of the moved range (the parent's seal).
    pub seal: u64,
    /// Number of children.
    pub children: usize,
    /// Child slot per moved record.
    pub slots: Vec<u8>,
    /// Per block of [`BLOCK`] records, the counts per child before it.
    prefix: Vec<Vec<u64>>,
    /// The per-record slots are lost (see [`TailIndex::without_slots`]).
    lost: bool,
}

impl TailIndex {
    /// An index over `slots` (one per record of `from..from + slots.len()`).
    pub fn new(parent: u32, from: u64, children: usize, slots: Vec<u8>) -> TailIndex {
        let mut prefix = Vec::with_capacity(slots.len() / BLOCK + 1);
        let mut counts = vec![0u64; children];
        for (i, &s) in slots.iter().enumerate() {
            if i % BLOCK == 0 {
                prefix.push(counts.clone());
            }
            counts[usize::from(s)] += 1;
        }
        prefix.push(counts);
        TailIndex {
            parent,
            from,
            seal: from + slots.len() as u64,
            children,
            slots,
            prefix,
            lost: false,
        }
    }

    /// The index of a split whose file is damaged or missing, from what
    /// its manifest record keeps: the range and the records per child.
    /// Which moved record went to which child is lost, so translation is
    /// conservative: a position inside the range resumes every child at
    /// its first moved record (records may be read again, none is
    /// skipped).
    pub fn without_slots(parent: u32, from: u64, seal: u64, counts: Vec<u64>) -> TailIndex {
        TailIndex {
            parent,
            from,
            seal,
            children: counts.len(),
            slots: Vec::new(),
            prefix: vec![counts],
            lost: true,
        }
    }

    /// Built by [`TailIndex::without_slots`]: translation inside the range
    /// is conservative, and there is nothing to encode.
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// Moved records per child.
    pub fn counts(&self) -> Vec<u64> {
        self.prefix.last().cloned().unwrap_or_default()
    }

    /// For a position `pos` in the parent (the next offset to read), the
    /// position in each child (by slot): the first moved record at or
    /// after `pos`. Below `from` every child is at 0; at or past the seal,
    /// at its count.
    pub fn translate(&self, pos: u64) -> Vec<u64> {
        if self.lost {
            return if pos >= self.seal {
                self.counts()
            } else {
                vec![0; self.children]
            };
        }
        let n = (pos.clamp(self.from, self.seal) - self.from) as usize;
        let block = n / BLOCK;
        let mut counts = self.prefix[block.min(self.prefix.len() - 1)].clone();
        for &s in &self.slots[(block * BLOCK).min(n)..n] {
            counts[usize::from(s)] += 1;
        }
        counts
    }

    /// Encodes the file.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.slots.len() + 4);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&(self.children as u16).to_le_bytes());
        out.extend_from_slice(&self.parent.to_le_bytes());
        out.extend_from_slice(&self.from.to_le_bytes());
        out.extend_from_slice(&self.seal.to_le_bytes());
        out.extend_from_slice(&self.slots);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// CRC of the encoded file (what the manifest record names).
    pub fn crc(bytes: &[u8]) -> u32 {
        let n = bytes.len().saturating_sub(4);
        crc32fast::hash(&bytes[..n])
    }

    /// Length of the encoded file of a split that moved `from..seal`:
    /// the header, a slot per moved record and the CRC.
    pub fn file_len(from: u64, seal: u64) -> u64 {
        HEADER_LEN as u64 + seal.saturating_sub(from) + 4
    }

    /// Decodes a file; an error names what is wrong.
    pub fn decode(b: &[u8]) -> Result<TailIndex, String> {
        if b.len() < HEADER_LEN + 4 || b[..8] != MAGIC {
            return Err("not a descendant index (bad magic or too short)".into());
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32fast::hash(body).to_le_bytes() != crc {
            return Err("descendant index CRC mismatch".into());
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u16_at(8) != 1 {
            return Err(format!("descendant index version {}", u16_at(8)));
        }
        let children = usize::from(u16_at(10));
        let parent = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
        let (from, seal) = (u64_at(16), u64_at(24));
        let slots = body[HEADER_LEN..].to_vec();
        if seal.checked_sub(from) != Some(slots.len() as u64)
            || slots.iter().any(|&s| usize::from(s) >= children)
        {
            return Err("descendant index does not match its header".into());
        }
        Ok(TailIndex::new(parent, from, children, slots))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translate_and_round_trip() {
        let slots: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 3) as u8).collect();
        let idx = TailIndex::new(4, 100, 3, slots.clone());
        assert_eq!(idx.translate(0), vec![0, 0, 0]);
        assert_eq!(idx.translate(100), vec![0, 0, 0]);
        assert_eq!(idx.counts().iter().sum::<u64>(), 10_000);
        assert_eq!(idx.translate(10_100), idx.counts());
        for p in [101u64, 4195, 4196, 4197, 8292, 9999] {
            let mut want = vec![0u64; 3];
            for &s in &slots[..(p - 100) as usize] {
                want[usize::from(s)] += 1;
            }
            assert_eq!(idx.translate(p), want, "at {p}");
        }
        let bytes = idx.encode();
        assert_eq!(TailIndex::decode(&bytes).unwrap(), idx);
        let mut bad = bytes.clone();
        bad[40] ^= 1;
        assert!(TailIndex::decode(&bad).is_err());
        assert_eq!(
            TailIndex::crc(&bytes),
            crc32fast::hash(&bytes[..bytes.len() - 4])
        );
    }
}
