//! A group's `raft-meta` file: the last purged log id and the committed
//! log id, written like the vote file (tmp + fsync + rename + fsync of the
//! directory, a version byte and a CRC), through the same [`VoteIo`].
//!
//! ```text
//!  0  magic      [u8; 8]  b"FSNLMETA"
//!  8  version    u8       1
//!  9  flags      u8       bit 0: purged present; bit 1: committed present
//! 10  purged     3 × u64  term, node id, index
//! 34  committed  3 × u64  term, node id, index
//! 58  crc        u32      CRC-32 of bytes 0..58
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::{CommittedLeaderId, LogId};

use crate::error::{Error, Result};
use crate::types::NodeId;
use crate::vote::{StdVoteIo, VoteIo};

/// File name of the meta file in a group's directory.
pub const META_FILE: &str = "raft-meta";
/// Name of the meta file while it is written.
pub const META_TMP_FILE: &str = "raft-meta.tmp";
/// Length of the meta file.
pub const META_FILE_LEN: usize = 62;
const MAGIC: &[u8; 8] = b"FSNLMETA";
const VERSION: u8 = 1;

/// What the meta file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Meta {
    /// The last log id purged from the log.
    pub purged: Option<LogId<NodeId>>,
    /// The last committed log id openraft saved.
    pub committed: Option<LogId<NodeId>>,
}

fn put(out: &mut Vec<u8>, id: Option<LogId<NodeId>>) {
    let (t, n, i) = id.map_or((0, 0, 0), |id| {
        (id.leader_id.term, id.leader_id.node_id, id.index)
    });
    for v in [t, n, i] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn get(b: &[u8], at: usize, present: bool) -> Option<LogId<NodeId>> {
    let u = |k: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[at + 8 * k..at + 8 * k + 8]);
        u64::from_le_bytes(a)
    };
    present.then(|| LogId::new(CommittedLeaderId::new(u(0), u(1)), u(2)))
}

/// Encodes `meta`.
pub fn encode_meta(meta: &Meta) -> Vec<u8> {
    let mut out = Vec::with_capacity(META_FILE_LEN);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(u8::from(meta.purged.is_some()) | (u8::from(meta.committed.is_some()) << 1));
    put(&mut out, meta.purged);
    put(&mut out, meta.committed);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a meta file's bytes; damage is [`Error::CorruptVote`] naming
/// the file (a group whose meta is unreadable does not start).
pub fn decode_meta(path: &Path, b: &[u8]) -> Result<Meta> {
    let corrupt = |reason: &str| Error::CorruptVote {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    if b.len() != META_FILE_LEN {
        return Err(corrupt("wrong length"));
    }
    if &b[..8] != MAGIC {
        return Err(corrupt("bad magic"));
    }
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&b[58..62]);
    if crc32fast::hash(&b[..58]) != u32::from_le_bytes(crc) {
        return Err(corrupt("checksum mismatch"));
    }
    if b[8] != VERSION {
        return Err(Error::UnsupportedVoteVersion {
            path: path.to_path_buf(),
            version: b[8],
            supported: VERSION,
        });
    }
    if b[9] & !3 != 0 {
        return Err(corrupt("unknown flags"));
    }
    Ok(Meta {
        purged: get(b, 10, b[9] & 1 != 0),
        committed: get(b, 34, b[9] & 2 != 0),
    })
}

/// A group's meta file.
#[derive(Debug)]
pub struct MetaFile {
    dir: PathBuf,
    path: PathBuf,
    tmp_path: PathBuf,
    io: Arc<dyn VoteIo>,
}

impl MetaFile {
    /// The meta file of the group whose directory is `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> MetaFile {
        MetaFile::with_io(dir, Arc::new(StdVoteIo))
    }

    /// The same, with all I/O through `io`.
    pub fn with_io(dir: impl Into<PathBuf>, io: Arc<dyn VoteIo>) -> MetaFile {
        let dir = dir.into();
        MetaFile {
            path: dir.join(META_FILE),
            tmp_path: dir.join(META_TMP_FILE),
            dir,
            io,
        }
    }

    /// Reads the file; all absent when it does not exist.
    pub fn read(&self) -> Result<Meta> {
        let bytes = self.io.read_file(&self.path).map_err(|source| Error::Io {
            op: "read",
            path: self.path.clone(),
            source,
        })?;
        bytes.map_or(Ok(Meta::default()), |b| decode_meta(&self.path, &b))
    }

    /// Saves `meta` durably (returns once a power loss keeps it).
    pub fn save(&self, meta: &Meta) -> Result<()> {
        let bytes = encode_meta(meta);
        let err = |op: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { op, path, source }
        };
        self.io
            .write_file(&self.tmp_path, &bytes)
            .map_err(err("write", &self.tmp_path))?;
        self.io
            .sync_file(&self.tmp_path)
            .map_err(err("fsync", &self.tmp_path))?;
        self.io
            .rename(&self.tmp_path, &self.path)
            .map_err(err("rename", &self.tmp_path))?;
        self.io
            .sync_dir(&self.dir)
            .map_err(err("fsync-dir", &self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(t: u64, n: u64, i: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(t, n), i)
    }

    #[test]
    fn a_meta_file_round_trips_and_every_bit_flip_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = MetaFile::new(dir.path());
        assert_eq!(f.read().unwrap(), Meta::default());
        let m = Meta {
            purged: Some(id(3, 1, 40)),
            committed: Some(id(4, 2, 77)),
        };
        f.save(&m).unwrap();
        assert_eq!(f.read().unwrap(), m);
        let only = Meta {
            purged: None,
            committed: Some(id(1, 1, 1)),
        };
        f.save(&only).unwrap();
        assert_eq!(f.read().unwrap(), only);
        let bytes = encode_meta(&m);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(
                    decode_meta(Path::new("m"), &b).is_err(),
                    "byte {i} bit {bit}"
                );
            }
        }
        assert!(decode_meta(Path::new("m"), &bytes[..61]).is_err());
    }
}
