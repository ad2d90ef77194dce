//! The exclusive lock of a log directory, shared by everything that maps
//! its files.
//!
//! The soundness argument of the mappings (`storage::segment`) rests on no
//! other fissionlog handle writing, repairing or truncating the files while
//! they are mapped. So the lock is not owned by the `Log` alone: every
//! topic and partition handle and every [`crate::ReadBatch`] (and `Bytes`
//! made from one) holds an `Arc` of it, and the `flock` is released only
//! when the last of them is dropped. A second `Log::open` of the directory,
//! in this process or another, gets `Error::Locked` until then.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::storage::file::{open_file, Access};

/// How long an open waits for a held lock before it reports
/// `Error::Locked` (see [`DirLock::acquire`]).
pub(crate) const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(100);

/// A held `flock` on a log directory's lock file (released on drop, when
/// the file is closed).
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
    dir: PathBuf,
}

impl DirLock {
    /// Takes the exclusive lock of `dir` (its file named `lock_file`).
    ///
    /// A lock found held is asked for again a few times over about
    /// [`LOCK_PATIENCE`] before the answer is `Error::Locked`. An `flock`
    /// belongs to the open file description, which a child process shares
    /// from `fork` until its `exec` closes the descriptor: a process that
    /// spawns children (a broker running tools, a test harness) can see
    /// its own lock, released a moment ago, still held by a child that has
    /// not reached `exec` yet. A lock another `Log` holds stays refused.
    pub(crate) fn acquire(dir: &Path, lock_file: &str) -> Result<Arc<DirLock>> {
        let path = dir.join(lock_file);
        let f = open_file(&path, Access::OpenOrCreate)?;
        let deadline = std::time::Instant::now() + LOCK_PATIENCE;
        let mut pause = std::time::Duration::from_millis(1);
        loop {
            match f.try_lock() {
                Ok(()) => {
                    return Ok(Arc::new(DirLock {
                        _file: f,
                        dir: dir.to_path_buf(),
                    }))
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    let now = std::time::Instant::now();
                    if now >= deadline {
                        return Err(Error::Locked {
                            path: dir.to_path_buf(),
                        });
                    }
                    std::thread::sleep(pause.min(deadline - now));
                    pause = (pause * 2).min(std::time::Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
            }
        }
    }

    /// The locked directory.
    #[allow(dead_code, reason = "for debugging output and future callers")]
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_lock_released_a_moment_after_a_second_open_asks_is_taken_by_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path(), "lock").unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            drop(first);
        });
        let second = DirLock::acquire(dir.path(), "lock");
        release.join().unwrap();
        assert!(second.is_ok(), "{second:?}");
    }

    #[test]
    fn a_lock_that_stays_held_is_refused_as_locked() {
        let dir = tempfile::tempdir().unwrap();
        let _first = DirLock::acquire(dir.path(), "lock").unwrap();
        let second = DirLock::acquire(dir.path(), "lock");
        assert!(matches!(second, Err(Error::Locked { .. })), "{second:?}");
    }
}
