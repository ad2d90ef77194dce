//! One wake-up shared by every partition of a topic, so that a reader of
//! many partitions sleeps once and wakes when any of them can move: an
//! append (written reads), a sync round raising a durable end (durable
//! reads), a seal (the reader drains the parent and opens its children),
//! or the log closing.
//!
//! Each partition still has its own condition variable for
//! [`crate::Partition::wait_for`]; this one is for [`crate::Reader::poll_wait`]
//! and for the wakers of [`crate::Durable`] futures. Those wakers are kept
//! per partition: a sync round wakes only the futures of partitions whose
//! durable end it moved, and an append wakes none of them (it moves no
//! durable end).

use std::collections::HashMap;
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
    /// Wakers of pending futures by partition, woken and dropped by the
    /// next notification of their partition (or of every partition); a
    /// future polled again registers again.
    wakers: Mutex<HashMap<u32, Vec<Waker>>>,
    /// Wakers held in `wakers`, stored under its lock; notifiers touch the
    /// lock only while it is non-zero.
    registered: AtomicUsize,
}

impl TailWake {
    /// Wakes every waiting reader (not the futures: nothing a
    /// [`crate::Durable`] future checks moves without
    /// [`TailWake::notify_partition`] or [`TailWake::notify_all`]). The
    /// caller must have published what waiters check with a `SeqCst` store
    /// or read-modify-write before this call (see [`TailWake::wait_until`]).
    pub(crate) fn notify(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock();
            // SeqCst: a waiter whose `seen` load reads this bump also sees
            // what the caller published before it.
            self.epoch.fetch_add(1, Ordering::SeqCst);
            self.cv.notify_all();
        }
    }

    /// Wakes every waiting reader and the futures registered for
    /// `partition` (its durable end moved, it was sealed, poisoned or
    /// removed). Published state as for [`TailWake::notify`].
    pub(crate) fn notify_partition(&self, partition: u32) {
        self.notify();
        if self.registered.load(Ordering::SeqCst) > 0 {
            let wakers = {
                let mut w = self.wakers.lock();
                let Some(list) = w.remove(&partition) else {
                    return;
                };
                self.registered.fetch_sub(list.len(), Ordering::SeqCst);
                list
            };
            // Outside the lock: a waker may poll the future again at once,
            // which registers again.
            for w in wakers {
                w.wake();
            }
        }
    }

    /// Wakes every waiting reader and every registered future (the log
    /// closed, the topic was deleted, sync rounds fail for good).
    pub(crate) fn notify_all(&self) {
        self.notify();
        if self.registered.load(Ordering::SeqCst) > 0 {
            let wakers = {
                let mut w = self.wakers.lock();
                self.registered.store(0, Ordering::SeqCst);
                std::mem::take(&mut *w)
            };
            for w in wakers.into_values().flatten() {
                w.wake();
            }
        }
    }

    /// Has the next notification of `partition` (or of every partition)
    /// wake `waker`. The caller checks its condition again afterwards,
    /// with `SeqCst` loads of what notifiers publish: the registration is
    /// a `SeqCst` store of `registered` (under the lock, after the push)
    /// followed by those loads, the notifier's publication a `SeqCst` store
    /// followed by its load of `registered` (Dekker, as in
    /// [`TailWake::wait_until`]). Either the check sees the new state, or
    /// the notifier sees a non-zero count and takes the lock, which it can
    /// only get after the push. (Under the lock the count always equals the
    /// wakers held, so it is non-zero while this one is held.)
    pub(crate) fn register(&self, partition: u32, waker: &Waker) {
        let mut w = self.wakers.lock();
        let list = w.entry(partition).or_default();
        if !list.iter().any(|x| x.will_wake(waker)) {
            list.push(waker.clone());
            self.registered.fetch_add(1, Ordering::SeqCst);
        }
        // Already registered: that registration's count is still in
        // `registered`, so a notifier that publishes after it takes the
        // lock and wakes it.
    }

    /// Returns at once when `ready()` holds; otherwise sleeps until a
    /// notification or `deadline` (`None`: until a notification). Returns
    /// what `ready()` said.
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
    pub(crate) fn wait_until(
        &self,
        deadline: Option<Instant>,
        ready: impl FnOnce() -> bool,
    ) -> bool {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let seen = self.epoch.load(Ordering::SeqCst);
        let is_ready = ready();
        if !is_ready {
            let mut g = self.lock.lock();
            if self.epoch.load(Ordering::SeqCst) == seen {
                match deadline {
                    Some(d) => {
                        let _ = self.cv.wait_until(&mut g, d);
                    }
                    None => self.cv.wait(&mut g),
                }
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
            w.wait_until(Some(deadline), || flag.load(Ordering::SeqCst));
        }
        notifier.join().unwrap();
        assert!(flag.load(Ordering::SeqCst));
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_ready_check_returns_without_sleeping() {
        let w = TailWake::default();
        let t0 = Instant::now();
        assert!(w.wait_until(Some(t0 + Duration::from_secs(10)), || true));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(w.waiters.load(Ordering::SeqCst), 0);
    }
}
