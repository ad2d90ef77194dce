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

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, IoContext, Result};
use crate::format::checkpoint::{self, Checkpoint, PartitionCheckpoint};
use crate::storage::fault::{IoHook, IoOp};
use crate::storage::file::{open_file, read_to_end, Access};

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
    ring: Option<Mutex<Ring>>,
    /// Cleared when the ring failed in a way that may leave operations in
    /// flight; later rounds use plain syscalls.
    ring_usable: AtomicBool,
    hook: Arc<dyn IoHook>,
}

/// The io_uring and the tag of the last chunk submitted on it.
struct Ring {
    ring: io_uring::IoUring,
    /// Incremented per chunk and carried in the upper 32 bits of every
    /// entry's `user_data`, so a completion can never be taken for a
    /// target of another chunk.
    chunk_tag: u32,
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
            .map(|ring| Mutex::new(Ring { ring, chunk_tag: 0 }));
        Syncer {
            ring_usable: AtomicBool::new(ring.is_some()),
            ring,
            hook,
        }
    }

    /// The backend in use (chosen at open; syscalls after the ring failed).
    pub fn backend(&self) -> SyncBackend {
        if self.ring_usable.load(Ordering::Acquire) {
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
        let mut done_by_ring = 0;
        // One target (a durable batch to one partition, say) gains nothing
        // from the ring: the fdatasync would run in an io_uring worker
        // thread anyway, and the handoff to it and back cost ~10 µs of CPU
        // and ~4 context switches per round (W3, docs/PERFORMANCE.md).
        if let Some(ring) = self.ring.as_ref().filter(|_| todo.len() > 1) {
            let mut ring = ring.lock();
            for chunk in todo.chunks(CHUNK) {
                if !self.ring_usable.load(Ordering::Acquire) {
                    break;
                }
                if let Err(e) = submit_chunk(&mut ring, targets, chunk, &mut results) {
                    // Entries of this chunk may still be in flight: the ring
                    // is never used again, so no later round can reap them.
                    // Their targets report the error (nothing is claimed
                    // durable); later chunks and rounds use syscalls.
                    self.ring_usable.store(false, Ordering::Release);
                    for &i in chunk {
                        if results[i].is_ok() {
                            results[i] = Err(std::io::Error::new(e.kind(), e.to_string()));
                        }
                    }
                }
                done_by_ring += chunk.len();
            }
        }
        for &i in &todo[done_by_ring..] {
            results[i] = fsync_fd(targets[i].fd, targets[i].datasync);
        }
        for &i in &todo {
            let r = std::mem::replace(&mut results[i], Ok(()));
            results[i] = self.hook.after(targets[i].op, &targets[i].path, r);
        }
        results
    }
}

/// Entries per io_uring submission (the ring has 256).
const CHUNK: usize = 128;

/// Directories or files a batch outside a sync round opens at once (one
/// descriptor each while the batch runs): a topic of 10,000 partitions
/// syncs its new directories this many at a time, not all with one
/// descriptor each.
pub(crate) const BATCH_OPEN_MAX: usize = 2 * CHUNK;

impl Syncer {
    /// [`Syncer::sync_all`] for a batch that succeeds or fails as a whole
    /// (files made durable before a manifest record names them): the first
    /// failure, with its path.
    pub(crate) fn sync_batch(&self, targets: &[SyncTarget]) -> Result<()> {
        let results = self.sync_all(targets);
        for (t, r) in targets.iter().zip(results) {
            r.at(&t.path)?;
        }
        Ok(())
    }
}

/// An fsync target for the directory `dir`, as the hook's `op`.
pub(crate) fn dir_target(dir: &Path, op: IoOp) -> Result<SyncTarget> {
    let f = crate::storage::file::open_dir(dir).at(dir)?;
    Ok(SyncTarget {
        fd: f.as_raw_fd(),
        path: dir.to_path_buf(),
        datasync: false,
        op,
        _keep: Some(Arc::new(f)),
    })
}

fn fsync_fd(fd: i32, datasync: bool) -> std::io::Result<()> {
    loop {
        // SAFETY: plain syscalls on an fd kept open by the caller; no memory passed.
        let rc = unsafe {
            if datasync {
                libc::fdatasync(fd)
            } else {
                libc::fsync(fd)
            }
        };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether an io_uring_enter error only means "try again": a signal
/// interrupted the wait (EINTR), or the kernel is short of resources for
/// the moment (EAGAIN, EBUSY: completions must be reaped first, which the
/// loop does).
fn retry_enter(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Interrupted
        || matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY))
}

/// Submits one fsync per target of `chunk` and waits for every one of them.
///
/// Returns only when every entry of the chunk has completed (`Ok`), or on
/// an error that may leave entries in flight (the caller then retires the
/// ring). An interrupted wait (EINTR) is retried, never returned: returning
/// early used to leave completions in flight that the next round took for
/// its own targets (they were tagged by index only), and made its pending
/// count underflow. Each entry's `user_data` carries the chunk's tag and
/// the target's position in the chunk; a completion with another tag, an
/// unknown position or a position already completed is ignored.
fn submit_chunk(
    r: &mut Ring,
    targets: &[SyncTarget],
    chunk: &[usize],
    results: &mut [std::io::Result<()>],
) -> std::io::Result<()> {
    use io_uring::{opcode, types};
    r.chunk_tag = r.chunk_tag.wrapping_add(1);
    let tag = u64::from(r.chunk_tag) << 32;
    for (pos, &i) in chunk.iter().enumerate() {
        let t = &targets[i];
        let flags = if t.datasync {
            types::FsyncFlags::DATASYNC
        } else {
            types::FsyncFlags::empty()
        };
        let sqe = opcode::Fsync::new(types::Fd(t.fd))
            .flags(flags)
            .build()
            .user_data(tag | pos as u64);
        // SAFETY: the fd stays open (held by the caller's `_keep`) until the
        // completion is reaped below (or, if the ring fails, for as long as
        // the kernel holds its own reference to the file); the entry
        // references no other memory.
        while unsafe { r.ring.submission().push(&sqe) }.is_err() {
            // Full: hand what is queued to the kernel to make room.
            match r.ring.submit() {
                Ok(_) => {}
                Err(e) if retry_enter(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }
    let mut done = vec![false; chunk.len()];
    let mut pending = chunk.len();
    loop {
        for cqe in r.ring.completion() {
            let ud = cqe.user_data();
            let pos = (ud & u64::from(u32::MAX)) as usize;
            if ud & !u64::from(u32::MAX) != tag || pos >= chunk.len() || done[pos] {
                continue;
            }
            done[pos] = true;
            pending -= 1;
            results[chunk[pos]] = if cqe.result() < 0 {
                Err(std::io::Error::from_raw_os_error(-cqe.result()))
            } else {
                Ok(())
            };
        }
        if pending == 0 {
            return Ok(());
        }
        // Submits whatever is still queued and waits for the rest (one
        // wakeup per chunk, not per completion: fsyncs run on io-wq workers
        // and complete one by one). Only this chunk's entries are in
        // flight, so `pending` completions will come.
        match r.ring.submit_and_wait(pending) {
            Ok(_) => {}
            Err(e) if retry_enter(&e) => {}
            Err(e) => return Err(e),
        }
    }
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

/// The longest checkpoint file read: a few hundred bytes per partition.
/// A longer file is not one fissionlog wrote, and reading it whole could
/// exhaust memory.
pub(crate) const CHECKPOINT_FILE_MAX_BYTES: u64 = 1 << 30;

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
            let f = open_file(&path, Access::OpenOrCreate)?;
            let buf = read_to_end(&f, &path, CHECKPOINT_FILE_MAX_BYTES)?;
            if let Some(found) = checkpoint::newer_version(&buf) {
                return Err(Error::UnsupportedVersion {
                    file: path,
                    found,
                    supported: checkpoint::CHECKPOINT_VERSION,
                });
            }
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
    ///
    /// The sequence number (and so the slot) advances only once a write
    /// succeeded: a write that failed part way (ENOSPC while the file
    /// grows, EIO) may have damaged its file, and the retry must go to that
    /// same file. Advanced anyway, the retry would overwrite the other
    /// file, the only valid checkpoint left, and a power loss during it
    /// would leave none.
    pub fn write(
        &mut self,
        (clean, saved_at_ms): (bool, u64),
        partitions: Vec<PartitionCheckpoint>,
        hook: &dyn IoHook,
    ) -> Result<SyncTarget> {
        let seq = self.seq + 1;
        let slot = (seq % 2) as usize;
        let bytes = checkpoint::encode_checkpoint(&Checkpoint {
            seq,
            clean,
            saved_at_ms,
            partitions,
        });
        let path = &self.paths[slot];
        hook.before(IoOp::WriteCheckpoint, path).at(path)?;
        self.files[slot].write_all_at(&bytes, 0).at(path)?;
        self.seq = seq;
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
///
/// A caller waits for round `started + 1` (the first to start after its
/// call), on the condition variable of that round's parity: while round
/// `n` runs, the threads still waiting are those of round `n` (they came
/// while `n - 1` ran, and one of them leads `n`) and those of round
/// `n + 1`. A finished round wakes its own waiters, which are done, and
/// one waiter of the next round, which leads it; the others of the next
/// round sleep on until it completes. Waking every waiter at the end of
/// each round (as this did) woke the next round's waiters only for all
/// but one to contend for the mutex and go back to sleep
/// (docs/PERFORMANCE.md, Run 7).
#[derive(Debug, Default)]
pub struct GroupCommit {
    state: Mutex<CommitRounds>,
    /// Waiters for round `n` wait on `rounds[n % 2]`.
    rounds: [Condvar; 2],
}

/// Where group commit's rounds stand: how many started and completed,
/// whether one runs now, and the last one that failed.
#[derive(Debug, Default)]
struct CommitRounds {
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
                // This round's waiters are done; one of the next round's
                // leads it (or a caller arriving first does, and the woken
                // one waits for that round to complete).
                self.rounds[(gen % 2) as usize].notify_all();
                self.rounds[((gen + 1) % 2) as usize].notify_one();
                return result;
            }
            // Rounds `target - 1` and `target` are the only ones running or
            // pending here; every waiter of `target - 2` (the same
            // condition variable) was woken when it completed.
            self.rounds[(target % 2) as usize].wait(&mut g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fault::NoFaults;
    use std::sync::atomic::AtomicU64;
    use std::time::{Duration, Instant};

    extern "C" fn ignore_signal(_: libc::c_int) {}

    /// Every `GroupCommit::sync` returns only after a round that began
    /// after its call completed, and every caller gets through: 8 threads
    /// × 300 calls, rounds that sleep a little so callers pile up behind
    /// them and the lead passes between threads.
    #[test]
    fn group_commit_waits_for_a_round_begun_after_the_call() {
        let gc = GroupCommit::default();
        let begun = AtomicU64::new(0);
        let done = AtomicU64::new(0);
        let rounds_led = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (gc, begun, done, rounds_led) = (&gc, &begun, &done, &rounds_led);
                s.spawn(move || {
                    for i in 0..300u64 {
                        let before = begun.load(Ordering::SeqCst);
                        gc.sync(|| {
                            begun.fetch_add(1, Ordering::SeqCst);
                            rounds_led.fetch_add(1, Ordering::Relaxed);
                            if (i + t) % 3 == 0 {
                                std::thread::sleep(Duration::from_micros(50));
                            }
                            done.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        })
                        .unwrap();
                        let after = done.load(Ordering::SeqCst);
                        assert!(
                            after > before,
                            "thread {t} call {i} returned with {after} rounds done, {before} begun before it"
                        );
                    }
                });
            }
        });
        let led = rounds_led.load(Ordering::Relaxed);
        assert_eq!(led, done.load(Ordering::SeqCst));
        assert!((1..=2400).contains(&led), "{led} rounds");
    }

    /// Whether target `i` of round `round` gets a bad fd (EBADF expected).
    /// The pattern changes every round, so a completion from one round
    /// taken for another round's target shows as a wrong result.
    fn bad(round: usize, i: usize) -> bool {
        (i * 7 + round).is_multiple_of(5)
    }

    /// Signals interrupting io_uring waits. A no-op
    /// SIGUSR1 handler without SA_RESTART makes a blocking io_uring_enter
    /// return EINTR; another thread sends SIGUSR1 to the syncing thread
    /// over and over while rounds of 1 to 300 targets (crossing the
    /// 128-entry chunks) run. Every round must report exactly its own
    /// per-target results, and nothing may panic or underflow.
    #[test]
    fn sync_rounds_interrupted_by_signals_report_each_target() {
        let syncer = Syncer::new(true, Arc::new(NoFaults));
        let backend = syncer.backend();
        if backend != SyncBackend::IoUring {
            eprintln!("io_uring unavailable here: only the syscall path is checked");
        }
        // SAFETY: installs a handler that does nothing (async-signal-safe)
        // for SIGUSR1; the struct is zeroed then filled as sigaction(2) wants.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ignore_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = 0; // no SA_RESTART: waits return EINTR
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<(File, PathBuf)> = (0..32)
            .map(|i| {
                let path = dir.path().join(format!("f{i}"));
                (File::create(&path).unwrap(), path)
            })
            .collect();
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() };
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let signaller = {
            let (stop, sent) = (stop.clone(), sent.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    // SAFETY: `me` is the test thread, which joins this
                    // thread before it returns, so it is alive here.
                    unsafe { libc::pthread_kill(me, libc::SIGUSR1) };
                    sent.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(30));
                }
            })
        };
        let budget = Duration::from_millis(
            std::env::var("FISSIONLOG_EINTR_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1500),
        );
        // The rounds start once signals arrive, and go on past the budget
        // until 200 signals were sent while they ran (at most a minute):
        // a signaller scheduled late must not leave them uninterrupted.
        let limit = Instant::now() + Duration::from_secs(60);
        while sent.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < limit, "the signaller never ran");
            std::thread::yield_now();
        }
        let sent_before = sent.load(Ordering::Relaxed);
        let signalled = || sent.load(Ordering::Relaxed) - sent_before;
        let started = Instant::now();
        let mut round = 0usize;
        let mut failure = None;
        while (started.elapsed() < budget || signalled() < 200)
            && Instant::now() < limit
            && failure.is_none()
        {
            let n = 1 + (round * 37) % 300;
            let targets: Vec<SyncTarget> = (0..n)
                .map(|i| {
                    let (f, path) = &files[i % files.len()];
                    if !bad(round, i) {
                        // Dirty data, so the fsync has work to do.
                        f.write_all_at(&[round as u8; 512], (i as u64 % 8) * 4096)
                            .unwrap();
                    }
                    SyncTarget {
                        fd: if bad(round, i) { -1 } else { f.as_raw_fd() },
                        path: path.clone(),
                        datasync: true,
                        op: IoOp::SyncSegment,
                        _keep: None,
                    }
                })
                .collect();
            let results = syncer.sync_all(&targets);
            if results.len() != n {
                failure = Some(format!("round {round}: {} results for {n}", results.len()));
            }
            for (i, r) in results.iter().enumerate() {
                let got = r.as_ref().err().and_then(|e| e.raw_os_error());
                let want = bad(round, i).then_some(libc::EBADF);
                if got != want {
                    failure = Some(format!(
                        "round {round}, target {i} of {n}: got {r:?}, want {want:?}"
                    ));
                    break;
                }
            }
            round += 1;
        }
        let during = signalled();
        stop.store(true, Ordering::Release);
        signaller.join().unwrap();
        eprintln!(
            "{round} rounds, {during} signals, backend {}",
            syncer.backend()
        );
        if let Some(f) = failure {
            panic!("{f}");
        }
        assert!(during >= 200, "only {during} signals during {round} rounds");
        assert_eq!(
            syncer.backend(),
            backend,
            "an interrupted wait retired the ring"
        );
    }
}
