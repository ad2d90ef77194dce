//! Scaffolding for race tests: one-record batches, a single
//! poll of a future, waiting on a flag set by a hook, a fast temporary
//! directory, and seeded pauses of a thread (a preemption at whatever
//! instruction it is running) to widen races.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fissionlog::NewRecord;

/// One keyless record, timestamped at append.
pub fn rec(v: &[u8]) -> [NewRecord<'_>; 1] {
    [NewRecord {
        key: None,
        value: v,
        timestamp: None,
    }]
}

/// Polls a future once with a no-op waker.
pub fn poll_once<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
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

/// A fast filesystem when there is one (fsyncs are cheap there, so rounds
/// and rolls come often), the default temporary directory otherwise.
pub fn fast_tempdir() -> tempfile::TempDir {
    if Path::new("/dev/shm").is_dir() {
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
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
