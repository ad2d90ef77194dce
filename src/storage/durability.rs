//! Making data durable: batched fsyncs (io_uring or plain syscalls), group
//! commit, and the recovery checkpoint written with the rounds it is due in.
//!
//! A sync round captures every partition's unsynced segments and positions,
//! writes the checkpoint of the *previous* round's positions (which are
//! known durable) when one is due (`LogOptions::checkpoint_interval`, or a
//! request from open or retention), and syncs all captured files, dirty
//! directories and that checkpoint in one batch. Positions in a checkpoint therefore never claim
//! more than what was synced, so recovery may treat damage below them as
//! corruption and damage above them as a torn tail.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, IoContext, Result};
use crate::format::checkpoint::{self, Checkpoint, PartitionCheckpoint};
use crate::storage::fault::{IoHook, IoOp};

/// Which mechanism syncs files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum SyncBackend {
    /// One io_uring submission per round.
    IoUring,
    /// One fdatasync/fsync syscall per file.
    Syscalls,
}

impl std::fmt::Display for SyncBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SyncBackend::IoUring => "io_uring",
            SyncBackend::Syscalls => "syscalls",
        })
    }
}

/// One file to sync in a round.
#[derive(Debug)]
pub struct SyncTarget {
    /// Raw fd (kept open by `_keep`).
    pub fd: i32,
    /// For error messages and hooks.
    pub path: PathBuf,
    /// fdatasync (files) or fsync (directories).
    pub datasync: bool,
    /// Which op the fault hook sees.
    pub op: IoOp,
    /// Keeps the fd valid while the round runs.
    pub _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

/// Syncs many files in one go.
pub struct Syncer {
    ring: Option<Mutex<io_uring::IoUring>>,
    hook: Arc<dyn IoHook>,
}

impl std::fmt::Debug for Syncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Syncer({})", self.backend())
    }
}

impl Syncer {
    /// Sets up io_uring when asked and available, else plain syscalls.
    pub fn new(use_io_uring: bool, hook: Arc<dyn IoHook>) -> Syncer {
        let ring = use_io_uring
            .then(|| io_uring::IoUring::new(256).ok())
            .flatten()
            .map(Mutex::new);
        Syncer { ring, hook }
    }

    /// The backend chosen at open.
    pub fn backend(&self) -> SyncBackend {
        if self.ring.is_some() {
            SyncBackend::IoUring
        } else {
            SyncBackend::Syscalls
        }
    }

    /// Syncs every target; returns the per-target results.
    pub fn sync_all(&self, targets: &[SyncTarget]) -> Vec<std::io::Result<()>> {
        let mut results: Vec<std::io::Result<()>> = targets
            .iter()
            .map(|t| self.hook.before(t.op, &t.path))
            .collect();
        let todo: Vec<usize> = (0..targets.len()).filter(|&i| results[i].is_ok()).collect();
        match &self.ring {
            Some(ring) if !todo.is_empty() => {
                let mut ring = ring.lock();
                for chunk in todo.chunks(128) {
                    if let Err(e) = submit_chunk(&mut ring, targets, chunk, &mut results) {
                        for &i in chunk {
                            results[i] = Err(std::io::Error::new(e.kind(), e.to_string()));
                        }
                    }
                }
            }
            _ => {
                for &i in &todo {
                    results[i] = fsync_fd(targets[i].fd, targets[i].datasync);
                }
            }
        }
        for &i in &todo {
            let r = std::mem::replace(&mut results[i], Ok(()));
            results[i] = self.hook.after(targets[i].op, &targets[i].path, r);
        }
        results
    }
}

fn fsync_fd(fd: i32, datasync: bool) -> std::io::Result<()> {
    // SAFETY: plain syscalls on an fd kept open by the caller; no memory passed.
    let rc = unsafe {
        if datasync {
            libc::fdatasync(fd)
        } else {
            libc::fsync(fd)
        }
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn submit_chunk(
    ring: &mut io_uring::IoUring,
    targets: &[SyncTarget],
    chunk: &[usize],
    results: &mut [std::io::Result<()>],
) -> std::io::Result<()> {
    use io_uring::{opcode, types};
    for &i in chunk {
        let t = &targets[i];
        let flags = if t.datasync {
            types::FsyncFlags::DATASYNC
        } else {
            types::FsyncFlags::empty()
        };
        let sqe = opcode::Fsync::new(types::Fd(t.fd))
            .flags(flags)
            .build()
            .user_data(i as u64);
        // SAFETY: the fd stays open (held by the caller's `_keep`) until the
        // completion is reaped below; the entry references no other memory.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| std::io::Error::other("io_uring submission queue full"))?;
    }
    let mut pending = chunk.len();
    ring.submit_and_wait(pending)?;
    while pending > 0 {
        let mut got = 0;
        for cqe in ring.completion() {
            let i = cqe.user_data() as usize;
            results[i] = if cqe.result() < 0 {
                Err(std::io::Error::from_raw_os_error(-cqe.result()))
            } else {
                Ok(())
            };
            got += 1;
        }
        pending -= got;
        if pending > 0 {
            ring.submit_and_wait(pending)?;
        }
    }
    Ok(())
}

/// Both checkpoint files, the newest valid checkpoint, and the invalid files.
pub type OpenedCheckpoints = (CheckpointFiles, Option<Checkpoint>, Vec<(PathBuf, String)>);

/// The two alternating checkpoint files.
#[derive(Debug)]
pub struct CheckpointFiles {
    files: [File; 2],
    paths: [PathBuf; 2],
    seq: u64,
}

/// Names of the two checkpoint files.
pub const CHECKPOINT_FILES: [&str; 2] = ["checkpoint.0", "checkpoint.1"];

impl CheckpointFiles {
    /// Opens (creating when missing) both files. Returns the newest valid
    /// checkpoint and a description of each invalid file.
    pub fn open(dir: &Path) -> Result<OpenedCheckpoints> {
        let mut best: Option<Checkpoint> = None;
        let mut problems = Vec::new();
        let mut files = Vec::new();
        let mut paths = Vec::new();
        for name in CHECKPOINT_FILES {
            let path = dir.join(name);
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .at(&path)?;
            let buf = std::fs::read(&path).at(&path)?;
            if !buf.is_empty() {
                match checkpoint::decode_checkpoint(&buf) {
                    Ok(c) => {
                        if best.as_ref().is_none_or(|b| c.seq > b.seq) {
                            best = Some(c);
                        }
                    }
                    Err(e) => problems.push((path.clone(), e)),
                }
            }
            files.push(f);
            paths.push(path);
        }
        let seq = best.as_ref().map_or(0, |c| c.seq);
        let files: [File; 2] = files.try_into().expect("two files");
        let paths: [PathBuf; 2] = paths.try_into().expect("two paths");
        Ok((CheckpointFiles { files, paths, seq }, best, problems))
    }

    /// Writes the next checkpoint into the older file (not synced). Returns
    /// the sync target for it.
    pub fn write(
        &mut self,
        clean: bool,
        partitions: Vec<PartitionCheckpoint>,
        hook: &dyn IoHook,
    ) -> Result<SyncTarget> {
        self.seq += 1;
        let slot = (self.seq % 2) as usize;
        let bytes = checkpoint::encode_checkpoint(&Checkpoint {
            seq: self.seq,
            clean,
            partitions,
        });
        let path = &self.paths[slot];
        hook.before(IoOp::WriteCheckpoint, path).at(path)?;
        self.files[slot].write_all_at(&bytes, 0).at(path)?;
        Ok(SyncTarget {
            fd: self.files[slot].as_raw_fd(),
            path: path.clone(),
            datasync: true,
            op: IoOp::SyncCheckpoint,
            _keep: None,
        })
    }
}

/// Group-commit coordination: concurrent appenders share one round.
#[derive(Debug, Default)]
pub struct GroupCommit {
    state: Mutex<GroupState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct GroupState {
    started: u64,
    completed: u64,
    running: bool,
    last_error: Option<(u64, String)>,
}

impl GroupCommit {
    /// Waits until a round that started after this call has completed,
    /// running it here when no other thread is. `round` does the work.
    pub fn sync(&self, round: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut g = self.state.lock();
        let target = g.started + 1;
        let mut round = Some(round);
        loop {
            if g.completed >= target {
                return match &g.last_error {
                    Some((gen, msg)) if *gen >= target => Err(Error::Io {
                        path: PathBuf::new(),
                        source: std::io::Error::other(msg.clone()),
                    }),
                    _ => Ok(()),
                };
            }
            if !g.running {
                g.running = true;
                g.started += 1;
                let gen = g.started;
                drop(g);
                let result = (round.take().expect("a thread leads at most one round"))();
                g = self.state.lock();
                g.running = false;
                g.completed = gen;
                if let Err(e) = &result {
                    g.last_error = Some((gen, e.to_string()));
                }
                self.cv.notify_all();
                return result;
            }
            self.cv.wait(&mut g);
        }
    }
}
