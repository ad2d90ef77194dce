//! One kit of I/O hooks for fault injection through `Log::open_with_hook`,
//! the path production I/O takes: fail an operation (from its n-th call,
//! once, or while armed, optionally only on some paths; before the OS call
//! or after it returned), hold one at a gate until the test releases it,
//! record the operations seen, run a test action at a partition's next
//! roll, and run two hooks as one; and outside the I/O path, seeded pauses
//! of a thread (a preemption at whatever instruction it is running) to
//! widen races. A test writes its own hook only for what these cannot do
//! (copy files or write part of one inside a call, order calls on one
//! sequence, chain gates), and says so above it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fissionlog::{IoHook, IoOp};

/// Fails calls of one [`IoOp`] with an errno: by default every call from
/// the first on, before the OS runs it. The builder methods choose the
/// call it starts at, one failure only, the stage (after the OS call: the
/// call took effect but the engine sees it fail, as a lost fsync), and
/// whether it starts armed.
#[derive(Debug)]
pub struct Fail {
    op: Mutex<IoOp>,
    /// Only calls on a path containing this (any path when `None`).
    path_part: Option<String>,
    errno: i32,
    nth: usize,
    once: bool,
    after: bool,
    armed: AtomicBool,
    seen: AtomicUsize,
    failed: AtomicUsize,
}

impl Fail {
    /// Fails every call of `op` with `errno`, armed.
    pub fn new(op: IoOp, errno: i32) -> Self {
        Fail {
            op: Mutex::new(op),
            path_part: None,
            errno,
            nth: 0,
            once: false,
            after: false,
            armed: AtomicBool::new(true),
            seen: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
        }
    }

    /// Lets the first `nth` calls (0-based: the `nth` call is the first to
    /// fail) through.
    pub fn failing_from(mut self, nth: usize) -> Self {
        self.nth = nth;
        self
    }

    /// Only calls on a path containing `part` (`"t0/p0"`, `"/p1/"`)
    /// fail or count toward `nth`.
    pub fn in_path(mut self, part: &str) -> Self {
        self.path_part = Some(part.to_string());
        self
    }

    /// Fails one call, then disarms itself.
    pub fn once(mut self) -> Self {
        self.once = true;
        self
    }

    /// Fails the call after the OS ran it (it took effect).
    pub fn after_the_call(mut self) -> Self {
        self.after = true;
        self
    }

    /// Starts disarmed: nothing fails (nor counts toward `nth`) until
    /// [`Fail::arm`].
    pub fn disarmed(self) -> Self {
        self.armed.store(false, Ordering::SeqCst);
        self
    }

    /// Makes the next calls fail.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Fails `op` from now on (in place of the operation it failed).
    pub fn arm_for(&self, op: IoOp) {
        *self.op.lock().unwrap_or_else(|e| e.into_inner()) = op;
        self.arm();
    }

    /// Lets every call through from now on.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    /// Whether the next matching call fails (unless `nth` is not reached).
    pub fn is_armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }

    /// How many calls it failed.
    pub fn failures(&self) -> usize {
        self.failed.load(Ordering::SeqCst)
    }

    /// Whether it failed a call (since it was made).
    pub fn fired(&self) -> bool {
        self.failures() > 0
    }

    fn fails(&self, op: IoOp, path: &Path) -> bool {
        if op != *self.op.lock().unwrap_or_else(|e| e.into_inner()) || !self.is_armed() {
            return false;
        }
        if let Some(part) = &self.path_part {
            if !path.to_string_lossy().contains(part.as_str()) {
                return false;
            }
        }
        if self.seen.fetch_add(1, Ordering::SeqCst) < self.nth {
            return false;
        }
        if self.once && !self.armed.swap(false, Ordering::SeqCst) {
            return false;
        }
        self.failed.fetch_add(1, Ordering::SeqCst);
        true
    }
}

impl IoHook for Fail {
    fn before(&self, op: IoOp, path: &Path) -> io::Result<()> {
        if !self.after && self.fails(op, path) {
            return Err(io::Error::from_raw_os_error(self.errno));
        }
        Ok(())
    }

    fn after(&self, op: IoOp, path: &Path, result: io::Result<()>) -> io::Result<()> {
        if self.after && self.fails(op, path) {
            return Err(io::Error::from_raw_os_error(self.errno));
        }
        result
    }
}

/// Holds the first call of an [`IoOp`] (on a path ending in `suffix`, or
/// containing `part`, when given; once armed) until [`Gate::release`]:
/// before the OS runs it, or after it returned. Later calls pass. Waits
/// at most `limit` (10 s unless set), so a test that fails before
/// releasing it does not hang.
#[derive(Debug)]
pub struct Gate {
    op: IoOp,
    suffix: Option<PathBuf>,
    part: Option<String>,
    after: bool,
    limit: Duration,
    armed: AtomicBool,
    reached: AtomicBool,
    release: AtomicBool,
}

impl Gate {
    /// Holds the first call of `op` before it runs.
    pub fn new(op: IoOp) -> Self {
        Gate {
            op,
            suffix: None,
            part: None,
            after: false,
            limit: Duration::from_secs(10),
            armed: AtomicBool::new(true),
            reached: AtomicBool::new(false),
            release: AtomicBool::new(false),
        }
    }

    /// Only a call on a path ending in `suffix` (whole components).
    pub fn on_path(mut self, suffix: impl Into<PathBuf>) -> Self {
        self.suffix = Some(suffix.into());
        self
    }

    /// Only a call on a path containing `part` (`"/t1/p5"`).
    pub fn in_path(mut self, part: &str) -> Self {
        self.part = Some(part.to_string());
        self
    }

    /// Starts disarmed: every call passes until [`Gate::arm`].
    pub fn disarmed(self) -> Self {
        self.armed.store(false, Ordering::SeqCst);
        self
    }

    /// Holds the next matching call.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Holds the call after it returned.
    pub fn after_the_call(mut self) -> Self {
        self.after = true;
        self
    }

    /// Waits at most `limit` for the release.
    pub fn at_most(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// Whether a call reached the gate.
    pub fn reached(&self) -> bool {
        self.reached.load(Ordering::Acquire)
    }

    /// Waits until a call reached the gate; false after `limit`.
    pub fn wait_reached(&self, limit: Duration) -> bool {
        wait_flag(&self.reached, limit)
    }

    /// Lets the held call go on.
    pub fn release(&self) {
        self.release.store(true, Ordering::Release);
    }

    fn hold(&self, op: IoOp, path: &Path) {
        if op == self.op
            && self.armed.load(Ordering::SeqCst)
            && self.suffix.as_ref().is_none_or(|s| path.ends_with(s))
            && self
                .part
                .as_ref()
                .is_none_or(|p| path.to_string_lossy().contains(p.as_str()))
            && !self.reached.swap(true, Ordering::AcqRel)
        {
            wait_flag(&self.release, self.limit);
        }
    }
}

impl IoHook for Gate {
    fn before(&self, op: IoOp, path: &Path) -> io::Result<()> {
        if !self.after {
            self.hold(op, path);
        }
        Ok(())
    }

    fn after(&self, op: IoOp, path: &Path, result: io::Result<()>) -> io::Result<()> {
        if self.after {
            self.hold(op, path);
        }
        result
    }
}

/// Records every operation it sees (before the OS runs it), with its path.
#[derive(Debug, Default)]
pub struct Record(Mutex<Vec<(IoOp, PathBuf)>>);

impl Record {
    /// The operations seen so far, in order.
    pub fn ops(&self) -> Vec<(IoOp, PathBuf)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many calls of `op` it saw.
    pub fn count(&self, op: IoOp) -> usize {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(o, _)| *o == op)
            .count()
    }

    /// The paths of the calls of `op` it saw, in order.
    pub fn paths(&self, op: IoOp) -> Vec<PathBuf> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(o, _)| *o == op)
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// The calls of any of `ops` it saw, in order.
    pub fn only(&self, ops: &[IoOp]) -> Vec<(IoOp, PathBuf)> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(o, _)| ops.contains(o))
            .cloned()
            .collect()
    }

    /// Forgets what it saw.
    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

impl IoHook for Record {
    fn before(&self, op: IoOp, path: &Path) -> io::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((op, path.to_path_buf()));
        Ok(())
    }
}

/// Two hooks as one: `before` asks the first, then (if it let the call
/// through) the second; `after` passes the result through the first, then
/// the second.
#[derive(Debug)]
pub struct Both(pub Arc<dyn IoHook>, pub Arc<dyn IoHook>);

impl Both {
    /// Runs `a` and `b` on every call.
    pub fn new(a: Arc<dyn IoHook>, b: Arc<dyn IoHook>) -> Self {
        Both(a, b)
    }
}

impl IoHook for Both {
    fn before(&self, op: IoOp, path: &Path) -> io::Result<()> {
        self.0.before(op, path)?;
        self.1.before(op, path)
    }

    fn after(&self, op: IoOp, path: &Path, result: io::Result<()>) -> io::Result<()> {
        let result = self.0.after(op, path, result);
        self.1.after(op, path, result)
    }
}

/// Fails every manifest write (EIO) once armed: a topology record that
/// cannot be written, which poisons the log.
pub fn failing_manifest_writes() -> Fail {
    Fail::new(IoOp::WriteManifest, libc::EIO).disarmed()
}

/// Waits until `f` is set; false after `limit`.
pub fn wait_flag(f: &AtomicBool, limit: Duration) -> bool {
    let start = Instant::now();
    while !f.load(Ordering::Acquire) {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    true
}

/// How long a signalled thread stops, in microseconds (see
/// [`install_pause_handler`]).
pub static PAUSE_US: AtomicU64 = AtomicU64::new(300);

/// Stops the signalled thread for `PAUSE_US` wherever it is, as a
/// preemption would. `nanosleep` is async-signal-safe.
extern "C" fn pause_handler(_: libc::c_int) {
    let us = PAUSE_US.load(Ordering::Relaxed);
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: (us * 1000) as libc::c_long,
    };
    // SAFETY: nanosleep reads the valid `ts`; the remainder may be null.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// Installs the pause handler for `signal` (SA_RESTART: the syscalls it
/// interrupts restart).
pub fn install_pause_handler(signal: libc::c_int) {
    // SAFETY: installs a handler that only calls nanosleep (async-signal-
    // safe).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = pause_handler as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(signal, &sa, std::ptr::null_mut()), 0);
    }
}

/// The calling thread, for [`pause_thread`].
pub fn self_thread() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

/// Sends `signal` to `target` (a thread that runs until `stop` is set, and
/// is joined after this one) every `gap.0 + [0, gap.1)` microseconds,
/// seeded. `PROBE_NO_PAUSES` turns the signals off (to compare). Returns
/// the number sent.
pub fn pause_thread(
    target: u64,
    signal: libc::c_int,
    stop: &AtomicBool,
    seed: u64,
    gap: (u64, u64),
) -> u64 {
    let mut rng = super::crash::SplitMix64::new(seed);
    let mut sent = 0;
    let off = std::env::var_os("PROBE_NO_PAUSES").is_some();
    while !stop.load(Ordering::Acquire) {
        if off {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        std::thread::sleep(Duration::from_micros(gap.0 + rng.below(gap.1)));
        // SAFETY: `target` runs until `stop` is set, and is joined after
        // this thread.
        unsafe { libc::pthread_kill(target as libc::pthread_t, signal) };
        sent += 1;
    }
    sent
}

/// A test action, run inside a call.
pub type Action = Box<dyn FnOnce() -> io::Result<()> + Send>;

/// Runs one action per partition at the next creation of a segment in its
/// directory (`/p{id}/`, a roll), before the OS call, once: the action is
/// taken out before it runs, so the I/O it causes passes through, and an
/// error it returns fails the creation.
#[derive(Default)]
pub struct OnRoll {
    actions: Mutex<Vec<(u32, Action)>>,
}

impl std::fmt::Debug for OnRoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnRoll")
    }
}

impl OnRoll {
    /// Runs `action` at the next roll of `partition`.
    pub fn at(&self, partition: u32, action: impl FnOnce() -> io::Result<()> + Send + 'static) {
        self.actions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((partition, Box::new(action)));
    }

    /// How many actions have not run yet.
    pub fn pending(&self) -> usize {
        self.actions.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Drops the actions that have not run; returns how many.
    pub fn clear(&self) -> usize {
        let mut a = self.actions.lock().unwrap_or_else(|e| e.into_inner());
        let n = a.len();
        a.clear();
        n
    }
}

impl IoHook for OnRoll {
    fn before(&self, op: IoOp, path: &Path) -> io::Result<()> {
        if op != IoOp::CreateSegment {
            return Ok(());
        }
        let path = path.to_string_lossy();
        let action = {
            let mut a = self.actions.lock().unwrap_or_else(|e| e.into_inner());
            a.iter()
                .position(|(p, _)| path.contains(&format!("/p{p}/")))
                .map(|i| a.remove(i).1)
        };
        action.map_or(Ok(()), |f| f())
    }
}
