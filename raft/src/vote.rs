//! The vote of one Raft group, kept in a small file of its own.
//!
//! Raft's safety rests on a node never voting twice in one term: the vote
//! must be on disk before `save_vote` returns, and a vote that cannot be
//! read back must stop the group rather than reset it to "no vote". So:
//!
//! - the first save takes an exclusive `flock` on the directory, held until
//!   the file is dropped, so no second writer interleaves its saves;
//! - a save writes `vote.tmp`, fsyncs it, renames it over `vote` and
//!   fsyncs the directory, in that order, and returns only after all four;
//! - a crash between any two steps leaves either the old `vote` (the
//!   rename had not reached the disk) or the new one (it had); `vote.tmp`
//!   is never read, and the next save overwrites it;
//! - the file carries a magic, a version byte and a CRC, so a torn or
//!   damaged file is [`Error::CorruptVote`], never a silently lost vote;
//! - after any failed step the file refuses further saves
//!   ([`Error::VoteFilePoisoned`]): a failed fsync may have dropped the
//!   dirty pages, and retrying as if nothing happened would report a vote
//!   durable that is not.
//!
//! All I/O goes through [`VoteIo`], so tests can record the order of the
//! calls and model what a power loss keeps.
//!
//! ## File layout (version 1, 36 bytes, little-endian)
//!
//! ```text
//!  0  magic      b"FSNLVOTE"
//!  8  version    u8 = 1
//!  9  committed  u8   0 or 1 (openraft's `Vote::committed`)
//! 10  reserved   [u8; 6] = 0
//! 16  term       u64
//! 24  node_id    u64  the candidate or leader voted for
//! 32  crc        u32  CRC-32 of bytes 0..32
//! ```

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::Vote;

use crate::error::{Error, Result};
use crate::types::NodeId;

/// Name of the vote file in a group's directory.
pub const VOTE_FILE: &str = "vote";
/// Name of the scratch file a save writes before renaming it into place.
pub const VOTE_TMP_FILE: &str = "vote.tmp";

const MAGIC: &[u8; 8] = b"FSNLVOTE";
const VERSION: u8 = 1;
/// Length of a version-1 vote file.
pub const VOTE_FILE_LEN: usize = 36;

/// Encodes a vote as the bytes of a version-1 vote file.
pub fn encode_vote(vote: &Vote<NodeId>) -> [u8; VOTE_FILE_LEN] {
    let mut b = [0u8; VOTE_FILE_LEN];
    b[0..8].copy_from_slice(MAGIC);
    b[8] = VERSION;
    b[9] = u8::from(vote.committed);
    b[16..24].copy_from_slice(&vote.leader_id.term.to_le_bytes());
    b[24..32].copy_from_slice(&vote.leader_id.node_id.to_le_bytes());
    let crc = crc32fast::hash(&b[0..32]);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes the bytes of a vote file; `path` only names the file in errors.
pub fn decode_vote(path: &Path, bytes: &[u8]) -> Result<Vote<NodeId>> {
    let corrupt = |reason: String| Error::CorruptVote {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < 9 || &bytes[0..8] != MAGIC {
        return Err(corrupt(format!(
            "no vote file magic in its {} bytes",
            bytes.len()
        )));
    }
    if bytes[8] > VERSION {
        return Err(Error::UnsupportedVoteVersion {
            path: path.to_path_buf(),
            version: bytes[8],
            supported: VERSION,
        });
    }
    if bytes[8] != VERSION {
        return Err(corrupt(format!(
            "version byte {} was never written",
            bytes[8]
        )));
    }
    if bytes.len() != VOTE_FILE_LEN {
        return Err(corrupt(format!(
            "{} bytes, a version-1 vote file has {VOTE_FILE_LEN}",
            bytes.len()
        )));
    }
    let stored = u32::from_le_bytes([bytes[32], bytes[33], bytes[34], bytes[35]]);
    let actual = crc32fast::hash(&bytes[0..32]);
    if stored != actual {
        return Err(corrupt(format!(
            "checksum mismatch: stored {stored:#010x}, computed {actual:#010x}"
        )));
    }
    let committed = match bytes[9] {
        0 => false,
        1 => true,
        other => return Err(corrupt(format!("committed byte is {other}, not 0 or 1"))),
    };
    if bytes[10..16].iter().any(|&b| b != 0) {
        return Err(corrupt("reserved bytes are not zero".to_string()));
    }
    let mut term = [0u8; 8];
    term.copy_from_slice(&bytes[16..24]);
    let mut node = [0u8; 8];
    node.copy_from_slice(&bytes[24..32]);
    let (term, node) = (u64::from_le_bytes(term), u64::from_le_bytes(node));
    Ok(if committed {
        Vote::new_committed(term, node)
    } else {
        Vote::new(term, node)
    })
}

/// The file operations a group's own files consist of (the vote, the
/// `raft-meta` file and the `raft-stamps` side file), one call per step,
/// so a test can record their order, fail one, or model what survives a
/// power loss. [`StdVoteIo`] is the real one.
pub trait VoteIo: Send + Sync + fmt::Debug {
    /// Creates or truncates `path` and writes `bytes` to it (not synced).
    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Makes the content of `path` durable (fsync).
    fn sync_file(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` over `to` (atomic replacement in one directory).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the entries of directory `dir` durable (fsync of the directory).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Reads the whole of `path`; `Ok(None)` when it does not exist.
    fn read_file(&self, path: &Path) -> io::Result<Option<Vec<u8>>>;
    /// Makes the content of `file`, open at `path`, durable (fdatasync):
    /// for a file its owner keeps open and appends to.
    fn sync_held(&self, file: &fs::File, path: &Path) -> io::Result<()> {
        let _ = path;
        file.sync_data()
    }
    /// Takes the exclusive hold on directory `dir` that a vote file keeps
    /// from its first save until it is dropped, so a second writer (another
    /// handle, another process) cannot interleave its saves with ours; a
    /// directory already held is [`io::ErrorKind::WouldBlock`]. The default
    /// holds nothing: for a [`VoteIo`] whose files only one handle sees.
    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        let _ = dir;
        Ok(DirLock { _held: None })
    }
}

/// The hold [`VoteIo::lock_dir`] took, released when dropped.
#[derive(Debug)]
pub struct DirLock {
    _held: Option<fs::File>,
}

/// [`VoteIo`] on the real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdVoteIo;

impl VoteIo for StdVoteIo {
    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        // A leftover `vote.tmp` is removed, not opened: were it a symbolic
        // link, opening it would write the vote into whatever it points at
        // and rename the link itself into place. `create_new` (O_EXCL)
        // never follows one.
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)?;
        f.write_all(bytes)
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        // fsync through a second descriptor flushes the file's dirty pages
        // all the same: durability belongs to the inode, not the descriptor.
        fs::OpenOptions::new().write(true).open(path)?.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        fs::File::open(dir)?.sync_all()
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        use std::os::fd::AsRawFd;
        // An exclusive `flock` on the directory itself: no lock file to
        // leave behind, and the kernel releases it when the process dies.
        let f = fs::File::open(dir)?;
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(DirLock { _held: Some(f) })
    }

    fn read_file(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        // Like every file of a log directory, the vote is a regular file:
        // nothing is read through a symbolic link, a FIFO or a device.
        match fs::symlink_metadata(path) {
            Ok(m) if !m.file_type().is_file() => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "not a regular file",
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
        let file = match fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // One byte more than a vote (or `raft-meta`) file holds is enough
        // to tell a file of the wrong length: a huge (or sparse) file is
        // never read whole.
        let max = VOTE_FILE_LEN.max(crate::meta::META_FILE_LEN);
        let mut bytes = Vec::with_capacity(max + 1);
        io::Read::read_to_end(&mut io::Read::take(file, max as u64 + 1), &mut bytes)?;
        Ok(Some(bytes))
    }
}

/// The durable vote of one Raft group: `DIR/vote`.
///
/// Blocking I/O: the log storage calls it from its own I/O task (a save is
/// two fsyncs, far below an election timeout).
#[derive(Debug)]
pub struct VoteFile {
    dir: PathBuf,
    path: PathBuf,
    tmp_path: PathBuf,
    io: Arc<dyn VoteIo>,
    poisoned: Option<String>,
    /// Taken by the first save, held until the file is dropped.
    lock: Option<DirLock>,
}

impl VoteFile {
    /// The vote file of the group whose directory is `dir` (which must
    /// exist), on the real file system.
    pub fn new(dir: impl Into<PathBuf>) -> VoteFile {
        VoteFile::with_io(dir, Arc::new(StdVoteIo))
    }

    /// The same, with all I/O through `io`.
    pub fn with_io(dir: impl Into<PathBuf>, io: Arc<dyn VoteIo>) -> VoteFile {
        let dir = dir.into();
        VoteFile {
            path: dir.join(VOTE_FILE),
            tmp_path: dir.join(VOTE_TMP_FILE),
            dir,
            io,
            poisoned: None,
            lock: None,
        }
    }

    /// Path of the vote file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the saved vote: `Ok(None)` when no vote was ever saved here,
    /// a typed error when the file is there but not a valid vote.
    pub fn read(&self) -> Result<Option<Vote<NodeId>>> {
        let bytes = self.io.read_file(&self.path).map_err(|source| Error::Io {
            op: "read",
            path: self.path.clone(),
            source,
        })?;
        bytes.map(|b| decode_vote(&self.path, &b)).transpose()
    }

    /// Saves `vote` durably: returns only once a power loss can no longer
    /// take it back. On any failure the file refuses later saves. The
    /// first save takes the directory (see [`VoteIo::lock_dir`]): while
    /// this file holds it, a save through another is
    /// [`Error::VoteFileLocked`].
    pub fn save(&mut self, vote: &Vote<NodeId>) -> Result<()> {
        if let Some(reason) = &self.poisoned {
            return Err(Error::VoteFilePoisoned {
                path: self.path.clone(),
                reason: reason.clone(),
            });
        }
        if self.lock.is_none() {
            match self.io.lock_dir(&self.dir) {
                Ok(l) => self.lock = Some(l),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(Error::VoteFileLocked {
                        dir: self.dir.clone(),
                    })
                }
                Err(source) => {
                    return Err(Error::Io {
                        op: "lock",
                        path: self.dir.clone(),
                        source,
                    })
                }
            }
        }
        let result = self.save_steps(vote);
        if let Err(e) = &result {
            self.poisoned = Some(e.to_string());
        }
        result
    }

    fn save_steps(&self, vote: &Vote<NodeId>) -> Result<()> {
        let bytes = encode_vote(vote);
        let io_err = |op: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { op, path, source }
        };
        self.io
            .write_file(&self.tmp_path, &bytes)
            .map_err(io_err("write", &self.tmp_path))?;
        self.io
            .sync_file(&self.tmp_path)
            .map_err(io_err("fsync", &self.tmp_path))?;
        self.io
            .rename(&self.tmp_path, &self.path)
            .map_err(io_err("rename", &self.tmp_path))?;
        self.io
            .sync_dir(&self.dir)
            .map_err(io_err("fsync-dir", &self.dir))
    }
}

#[cfg(test)]
mod tests;
