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

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::storage::file::{open_file, Access};

/// How long an open waits for a held lock before it reports
/// `Error::Locked` (see [`DirLock::acquire`]).
pub(crate) const LOCK_PATIENCE: Duration = Duration::from_millis(100);

/// How long an open waits for a lock this process released within the
/// last [`RELEASE_MEMORY`] and does not hold: then the holder is most
/// likely a child of this process between its `fork` and its `exec`,
/// which a loaded machine can leave unscheduled for much longer than
/// [`LOCK_PATIENCE`].
pub(crate) const CHILD_PATIENCE: Duration = Duration::from_secs(5);

/// How long a release is remembered for [`CHILD_PATIENCE`].
const RELEASE_MEMORY: Duration = Duration::from_secs(30);

/// A lock file, by device and inode (one file under any path).
type FileId = (u64, u64);

/// The lock files this process holds, and when it last released each
/// one it no longer holds.
#[derive(Default)]
struct Held {
    now: HashSet<FileId>,
    released: HashMap<FileId, Instant>,
}

/// When an acquire of `id` begun at `start` gives up: [`LOCK_PATIENCE`]
/// after it began, or, once this process holds the lock no more but let
/// go of it lately, [`CHILD_PATIENCE`] after that release.
fn deadline(id: FileId, start: Instant) -> Instant {
    let h = held();
    let mut end = start + LOCK_PATIENCE;
    if !h.now.contains(&id) {
        if let Some(&at) = h.released.get(&id) {
            if at.elapsed() < RELEASE_MEMORY {
                end = end.max(at + CHILD_PATIENCE);
            }
        }
    }
    end
}

fn held() -> std::sync::MutexGuard<'static, Held> {
    static HELD: std::sync::OnceLock<Mutex<Held>> = std::sync::OnceLock::new();
    HELD.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A held `flock` on a log directory's lock file (released on drop, when
/// the file is closed).
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
    dir: PathBuf,
    id: FileId,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let mut h = held();
        h.now.remove(&self.id);
        let now = Instant::now();
        h.released
            .retain(|_, at| now.duration_since(*at) < RELEASE_MEMORY);
        h.released.insert(self.id, now);
        // The flock goes when `_file` closes, right after this.
    }
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
    /// not reached `exec` yet, and a child forked while another `Log` of
    /// this process held its own lock shares that one too. So once this
    /// process has let go of the lock, the wait lasts until
    /// [`CHILD_PATIENCE`] after that release. A lock another `Log` holds
    /// stays refused.
    pub(crate) fn acquire(dir: &Path, lock_file: &str) -> Result<Arc<DirLock>> {
        let path = dir.join(lock_file);
        let f = open_file(&path, Access::OpenOrCreate)?;
        let meta = f.metadata().map_err(|e| Error::io(&path, e))?;
        let id = (meta.dev(), meta.ino());
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match f.try_lock() {
                Ok(()) => {
                    held().now.insert(id);
                    return Ok(Arc::new(DirLock {
                        _file: f,
                        dir: dir.to_path_buf(),
                        id,
                    }));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    let now = Instant::now();
                    let end = deadline(id, start);
                    if now >= end {
                        return Err(Error::Locked {
                            path: dir.to_path_buf(),
                        });
                    }
                    std::thread::sleep(pause.min(end - now));
                    pause = (pause * 2).min(Duration::from_millis(20));
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

/// A shared `flock` on a log directory's lock file (what `verify` takes:
/// it reads, so it only has to keep writers out), released on drop.
pub(crate) struct SharedLock {
    _file: File,
    id: FileId,
}

impl Drop for SharedLock {
    fn drop(&mut self) {
        // A child forked while this was held shares it until its `exec`,
        // as it would an exclusive lock: an open right after waits for it.
        let mut h = held();
        let now = Instant::now();
        h.released
            .retain(|_, at| now.duration_since(*at) < RELEASE_MEMORY);
        h.released.insert(self.id, now);
    }
}

impl SharedLock {
    /// Takes a shared lock on `f`, the lock file at `path` of `dir`. A
    /// writer's lock is refused with `Error::Locked` after the patience of
    /// [`DirLock::acquire`]: a lock this process let go of lately is most
    /// likely still shared by a child between its `fork` and its `exec`,
    /// so `verify` right after a close waits for it as a reopen does.
    pub(crate) fn acquire(f: File, path: &Path, dir: &Path) -> Result<SharedLock> {
        let meta = f.metadata().map_err(|e| Error::io(path, e))?;
        let id = (meta.dev(), meta.ino());
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match f.try_lock_shared() {
                Ok(()) => return Ok(SharedLock { _file: f, id }),
                Err(std::fs::TryLockError::WouldBlock) => {
                    let now = Instant::now();
                    let end = deadline(id, start);
                    if now >= end {
                        return Err(Error::Locked {
                            path: dir.to_path_buf(),
                        });
                    }
                    std::thread::sleep(pause.min(end - now));
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(path, e)),
            }
        }
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

    /// A child forked while the lock was held keeps the `flock` until its
    /// `exec`: a close and reopen in the parent meanwhile must wait for
    /// it, not report the log locked.
    #[test]
    fn a_lock_a_forked_child_still_shares_is_taken_once_the_child_execs() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path(), "lock").unwrap();
        let child = slow_child();
        drop(first);
        let second = DirLock::acquire(dir.path(), "lock");
        assert!(child.join().unwrap().success());
        assert!(second.is_ok(), "{second:?}");
    }

    /// A child forked (and not yet exec'd) while `dir`'s log was open: it
    /// shares the log's lock until its `exec`, 600 ms after the fork.
    fn slow_child() -> std::thread::JoinHandle<std::process::ExitStatus> {
        use std::os::unix::process::CommandExt;
        let child = std::thread::spawn(|| {
            let mut cmd = std::process::Command::new("true");
            // SAFETY: the closure runs in the forked child before `exec`
            // and only calls nanosleep, which is async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    let pause = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 600_000_000,
                    };
                    libc::nanosleep(&pause, std::ptr::null_mut());
                    Ok(())
                });
            }
            cmd.status().unwrap()
        });
        // Let the fork happen while the lock is held.
        std::thread::sleep(Duration::from_millis(150));
        child
    }

    fn quiet() -> crate::LogOptions {
        crate::LogOptions {
            balancer: false,
            background_retention: false,
            ..crate::LogOptions::default()
        }
    }

    /// A `verify` right after a close, while a child forked during the
    /// open still shares the released lock, waits for the child as a
    /// reopen does rather than report the log held by a writer.
    #[test]
    fn a_verify_right_after_a_close_waits_for_a_forked_child() {
        let dir = tempfile::tempdir().unwrap();
        let log = crate::Log::open(dir.path(), quiet()).unwrap();
        let child = slow_child();
        log.close().unwrap();
        let verified = crate::verify(dir.path());
        assert!(child.join().unwrap().success());
        let (_, problems) = verified.unwrap();
        assert!(problems.is_empty(), "{problems:#?}");
    }

    /// A reopen that waits out a child holding the lock it released is
    /// still the only holder: a third open while the reopened log lives
    /// is refused, and one after its close succeeds.
    #[test]
    fn a_reopen_that_waited_for_a_child_still_refuses_a_second_open() {
        let dir = tempfile::tempdir().unwrap();
        let log = crate::Log::open(dir.path(), quiet()).unwrap();
        let child = slow_child();
        log.close().unwrap();
        let reopened = crate::Log::open(dir.path(), quiet()).unwrap();
        assert!(child.join().unwrap().success());
        let third = crate::Log::open(dir.path(), quiet());
        assert!(
            matches!(third, Err(Error::Locked { .. })),
            "{:?}",
            third.err()
        );
        reopened.close().unwrap();
        crate::Log::open(dir.path(), quiet())
            .unwrap()
            .close()
            .unwrap();
    }

    /// A child forked while two logs were open shares both locks: both
    /// reopen after their close, and each refuses a second open.
    #[test]
    fn a_child_forked_under_two_logs_delays_neither_reopen_into_locked() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let la = crate::Log::open(a.path(), quiet()).unwrap();
        let lb = crate::Log::open(b.path(), quiet()).unwrap();
        let child = slow_child();
        la.close().unwrap();
        lb.close().unwrap();
        let ra = crate::Log::open(a.path(), quiet());
        let rb = crate::Log::open(b.path(), quiet());
        assert!(child.join().unwrap().success());
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        for d in [a.path(), b.path()] {
            let again = crate::Log::open(d, quiet());
            assert!(
                matches!(again, Err(Error::Locked { .. })),
                "{:?}",
                again.err()
            );
        }
        ra.close().unwrap();
        rb.close().unwrap();
    }

    #[test]
    fn a_lock_that_stays_held_is_refused_as_locked() {
        let dir = tempfile::tempdir().unwrap();
        let _first = DirLock::acquire(dir.path(), "lock").unwrap();
        let second = DirLock::acquire(dir.path(), "lock");
        assert!(matches!(second, Err(Error::Locked { .. })), "{second:?}");
    }
}
