//! The controller's last snapshot on disk: `DIR/snapshot`, written as
//! `snapshot.tmp`, fsynced, renamed over `snapshot`, and the directory
//! fsynced, so a crash leaves the old or the new snapshot.
//!
//! Layout: a version byte, the postcard encoding of `(meta, data)`, and a
//! CRC-32 (little-endian) of everything before it.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use openraft::{BasicNode, SnapshotMeta};

use crate::error::{Error, Result};
use crate::types::NodeId;

/// The file version this build writes and reads.
pub const SNAPSHOT_FILE_VERSION: u8 = 1;

/// The snapshot file of one controller replica.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    dir: PathBuf,
    path: PathBuf,
}

type Saved = (SnapshotMeta<NodeId, BasicNode>, Vec<u8>);

impl SnapshotFile {
    /// The file `dir/snapshot` (the directory is created on the first
    /// save).
    pub fn new(dir: &Path) -> SnapshotFile {
        SnapshotFile {
            dir: dir.to_path_buf(),
            path: dir.join("snapshot"),
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, op: &'static str, path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// Saves `meta` and `data`, durably, before returning.
    pub fn save(&self, meta: &SnapshotMeta<NodeId, BasicNode>, data: &[u8]) -> Result<()> {
        let mut bytes = vec![SNAPSHOT_FILE_VERSION];
        postcard::to_io(&(meta, data), &mut bytes)
            .map_err(|e| self.io("encode", &self.path, std::io::Error::other(e.to_string())))?;
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        fs::create_dir_all(&self.dir).map_err(|e| self.io("mkdir", &self.dir, e))?;
        let tmp = self.dir.join("snapshot.tmp");
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| self.io("open", &tmp, e))?;
        f.write_all(&bytes).map_err(|e| self.io("write", &tmp, e))?;
        f.sync_all().map_err(|e| self.io("fsync", &tmp, e))?;
        drop(f);
        fs::rename(&tmp, &self.path).map_err(|e| self.io("rename", &self.path, e))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| self.io("fsync-dir", &self.dir, e))
    }

    /// The saved snapshot, or `None` when there is no file.
    pub fn read(&self) -> Result<Option<Saved>> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io("read", &self.path, e)),
        };
        let corrupt = |reason: String| Error::CorruptSnapshot {
            path: self.path.clone(),
            reason,
        };
        let Some(body_len) = bytes.len().checked_sub(4).filter(|&n| n >= 1) else {
            return Err(corrupt(format!("{} bytes", bytes.len())));
        };
        let (body, crc) = bytes.split_at(body_len);
        let mut stored = [0u8; 4];
        stored.copy_from_slice(crc);
        let (stored, actual) = (u32::from_le_bytes(stored), crc32fast::hash(body));
        if stored != actual {
            return Err(corrupt(format!(
                "checksum {stored:#010x}, computed {actual:#010x}"
            )));
        }
        if body[0] != SNAPSHOT_FILE_VERSION {
            return Err(corrupt(format!(
                "version {}; this build reads {SNAPSHOT_FILE_VERSION}",
                body[0]
            )));
        }
        let (saved, rest) =
            postcard::take_from_bytes::<Saved>(&body[1..]).map_err(|e| corrupt(e.to_string()))?;
        if !rest.is_empty() {
            return Err(corrupt(format!("{} bytes after the snapshot", rest.len())));
        }
        Ok(Some(saved))
    }
}
