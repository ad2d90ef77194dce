//! One kit of I/O hooks for fault injection through `Log::open_with_hook`,
//! the path production I/O takes: fail an operation (from its n-th call,
//! once, or while armed; before the OS call or after it returned), hold
//! one at a gate until the test releases it, record the operations seen,
//! and run two hooks as one.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fissionlog::{IoHook, IoOp};

/// Fails calls of one [`IoOp`] with an errno: by default every call from
/// the first on, before the OS runs it. The builder methods choose the
/// call it starts at, one failure only, the stage (after the OS call: the
/// call took effect but the engine sees it fail, as a lost fsync), and
/// whether it starts armed.
#[derive(Debug)]
pub struct Fail {
    op: Mutex<IoOp>,
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

    fn fails(&self, op: IoOp) -> bool {
        if op != *self.op.lock().unwrap_or_else(|e| e.into_inner()) || !self.is_armed() {
            return false;
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
    fn before(&self, op: IoOp, _path: &Path) -> io::Result<()> {
        if !self.after && self.fails(op) {
            return Err(io::Error::from_raw_os_error(self.errno));
        }
        Ok(())
    }

    fn after(&self, op: IoOp, _path: &Path, result: io::Result<()>) -> io::Result<()> {
        if self.after && self.fails(op) {
            return Err(io::Error::from_raw_os_error(self.errno));
        }
        result
    }
}

/// Holds the first call of an [`IoOp`] (on a path ending in `suffix`,
/// when given) until [`Gate::release`]: before the OS runs it, or after
/// it returned. Later calls pass. Waits at most `limit` (10 s unless
/// set), so a test that fails before releasing it does not hang.
#[derive(Debug)]
pub struct Gate {
    op: IoOp,
    suffix: Option<PathBuf>,
    after: bool,
    limit: Duration,
    reached: AtomicBool,
    release: AtomicBool,
}

impl Gate {
    /// Holds the first call of `op` before it runs.
    pub fn new(op: IoOp) -> Self {
        Gate {
            op,
            suffix: None,
            after: false,
            limit: Duration::from_secs(10),
            reached: AtomicBool::new(false),
            release: AtomicBool::new(false),
        }
    }

    /// Only a call on a path ending in `suffix` (whole components).
    pub fn on_path(mut self, suffix: impl Into<PathBuf>) -> Self {
        self.suffix = Some(suffix.into());
        self
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
        super::probe::wait_flag(&self.reached, limit)
    }

    /// Lets the held call go on.
    pub fn release(&self) {
        self.release.store(true, Ordering::Release);
    }

    fn hold(&self, op: IoOp, path: &Path) {
        if op == self.op
            && self.suffix.as_ref().is_none_or(|s| path.ends_with(s))
            && !self.reached.swap(true, Ordering::AcqRel)
        {
            super::probe::wait_flag(&self.release, self.limit);
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
