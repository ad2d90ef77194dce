//! One wake-up shared by every partition of a topic, so that a reader of
//! many partitions sleeps once and wakes when any of them can move: an
//! append (written reads), a sync round raising a durable end (durable
//! reads), a seal (the reader drains the parent and opens its children),
//! or the log closing.
//!
//! Each partition still has its own condition variable for
//! [`crate::Partition::wait_for`]; this one is for [`crate::Reader::poll_wait`]
//! and for the wakers of [`crate::Durable`] futures.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Waker;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

#[derive(Debug, Default)]
pub(crate) struct TailWake {
    /// Threads between their registration and their return in
    /// [`TailWake::wait_until`]. Notifiers touch the lock only while it is
    /// non-zero: an append with nobody waiting pays one load.
    waiters: AtomicUsize,
    /// Notifications made while someone waited; guarded by `lock` for
    /// writes, so a waiter can tell under the lock whether one came after
    /// its check.
    epoch: AtomicU64,
    lock: Mutex<()>,
    cv: Condvar,
    /// Wakers of pending futures, woken and dropped by the next
    /// notification (a future polled again registers again).
    wakers: Mutex<Vec<Waker>>,
    /// `wakers.len()`, stored under its lock; notifiers touch the lock
    /// only while it is non-zero.
    registered: AtomicUsize,
}

impl TailWake {
    /// Wakes every waiter. The caller must have published what waiters
    /// check with a `SeqCst` store or read-modify-write before this call
    /// (see [`TailWake::wait_until`]).
    pub(crate) fn notify(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock();
            // SeqCst: a waiter whose `seen` load reads this bump also sees
            // what the caller published before it.
            self.epoch.fetch_add(1, Ordering::SeqCst);
            self.cv.notify_all();
        }
        if self.registered.load(Ordering::SeqCst) > 0 {
            let wakers = {
                let mut w = self.wakers.lock();
                self.registered.store(0, Ordering::SeqCst);
                std::mem::take(&mut *w)
            };
            for w in wakers {
                w.wake();
            }
        }
    }

    /// Has the next notification wake `waker`. The caller checks its
    /// condition again afterwards, with `SeqCst` loads of what notifiers
    /// publish: the registration is a `SeqCst` store followed by those
    /// loads, the notifier's publication a `SeqCst` store followed by its
    /// load of `registered` (Dekker, as in [`TailWake::wait_until`]), so
    /// either the check sees the new state or the notifier sees the waker.
    pub(crate) fn register(&self, waker: &Waker) {
        let mut w = self.wakers.lock();
        if !w.iter().any(|x| x.will_wake(waker)) {
            w.push(waker.clone());
        }
        self.registered.store(w.len(), Ordering::SeqCst);
    }

    /// Returns at once when `ready()` holds; otherwise sleeps until a
    /// notification or `deadline`. Returns what `ready()` said.
    ///
    /// `ready` must read what notifiers publish with `SeqCst` loads. The
    /// waiter increments `waiters` and then loads the published state; a
    /// notifier stores the state and then loads `waiters` (each a store
    /// followed by a load of another location, as in Dekker's algorithm,
    /// and all `SeqCst`, so one total order holds them). Either the waiter
    /// sees the new state, or the notifier sees the waiter and bumps
    /// `epoch` under the lock; the waiter compares `epoch` with the value
    /// it read before its check, under the same lock, and does not sleep
    /// through a notification it has not seen. `ready` runs without the
    /// lock held, so it may take any other lock.
    pub(crate) fn wait_until(&self, deadline: Instant, ready: impl FnOnce() -> bool) -> bool {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let seen = self.epoch.load(Ordering::SeqCst);
        let is_ready = ready();
        if !is_ready {
            let mut g = self.lock.lock();
            if self.epoch.load(Ordering::SeqCst) == seen {
                let _ = self.cv.wait_until(&mut g, deadline);
            }
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        is_ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_notification_after_the_check_wakes_the_waiter() {
        let w = Arc::new(TailWake::default());
        let flag = Arc::new(AtomicBool::new(false));
        let (w2, f2) = (w.clone(), flag.clone());
        let t0 = Instant::now();
        let notifier = std::thread::spawn(move || {
            // Until the waiter registered.
            while w2.waiters.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(20));
            f2.store(true, Ordering::SeqCst);
            w2.notify();
        });
        let deadline = t0 + Duration::from_secs(10);
        while !flag.load(Ordering::SeqCst) && Instant::now() < deadline {
            w.wait_until(deadline, || flag.load(Ordering::SeqCst));
        }
        notifier.join().unwrap();
        assert!(flag.load(Ordering::SeqCst));
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_ready_check_returns_without_sleeping() {
        let w = TailWake::default();
        let t0 = Instant::now();
        assert!(w.wait_until(t0 + Duration::from_secs(10), || true));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(w.waiters.load(Ordering::SeqCst), 0);
    }
}
