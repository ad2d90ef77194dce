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
//!
//! Every notification also names its partition to the topic's
//! subscribed [`ReadySet`]s: a consumer (a reader, a group member) looks
//! only at the partitions signalled since it last looked, so an idle poll
//! costs O(1) and a poll after one partition got data costs O(that
//! partition), whatever the number of partitions it has open. The price is
//! paid by the notifier: one lock and one set insertion per subscribed
//! consumer, and one load while nobody is subscribed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, RwLock};

/// The partitions signalled to one consumer since it last took them.
#[derive(Debug, Default)]
pub(crate) struct ReadySet {
    /// Whether `marks` may hold something. Set with `SeqCst` after an
    /// insertion (the readiness check of a wait loads it, see
    /// [`TailWake::wait_until`]); cleared under the lock by `take`.
    signalled: AtomicBool,
    marks: Mutex<Marks>,
}

#[derive(Debug, Default)]
struct Marks {
    ids: HashSet<u32>,
    /// Every partition may have moved (the log closed, the topic was
    /// deleted, sync rounds fail for good).
    all: bool,
}

/// What a consumer takes from its [`ReadySet`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Signals {
    /// Nothing signalled since the last take.
    None,
    /// These partitions were signalled.
    Some(Vec<u32>),
    /// Every partition may have moved: look at all of them.
    All,
}

impl ReadySet {
    /// Whether something was signalled since the last take (a `SeqCst`
    /// load: usable in a wait's readiness check).
    pub(crate) fn is_signalled(&self) -> bool {
        self.signalled.load(Ordering::SeqCst)
    }

    /// Takes what was signalled since the last take. A notifier publishes
    /// its partition's state before it marks the set (under the set's
    /// lock), so whatever this returns is visible to reads made after it;
    /// a notification that comes later is in the next take.
    pub(crate) fn take(&self) -> Signals {
        if !self.is_signalled() {
            return Signals::None;
        }
        let mut m = self.marks.lock();
        self.signalled.store(false, Ordering::SeqCst);
        if std::mem::take(&mut m.all) {
            m.ids.clear();
            return Signals::All;
        }
        if m.ids.is_empty() {
            return Signals::None;
        }
        Signals::Some(m.ids.drain().collect())
    }

    fn mark(&self, partition: u32) {
        let mut m = self.marks.lock();
        if !m.all {
            m.ids.insert(partition);
        }
        // Under the lock: a take that clears the flag holds the lock, so
        // the flag is never left clear over a mark.
        self.signalled.store(true, Ordering::SeqCst);
    }

    fn mark_all(&self) {
        let mut m = self.marks.lock();
        m.all = true;
        m.ids.clear();
        self.signalled.store(true, Ordering::SeqCst);
    }
}

/// A consumer's subscription to its topic's notifications: its
/// [`ReadySet`], unsubscribed on drop.
#[derive(Debug)]
pub(crate) struct Subscription {
    wake: Arc<TailWake>,
    ready: Arc<ReadySet>,
}

impl Subscription {
    /// The set the topic's notifications mark.
    pub(crate) fn ready(&self) -> &ReadySet {
        &self.ready
    }

    /// The wake-up this subscription belongs to.
    pub(crate) fn wake(&self) -> &Arc<TailWake> {
        &self.wake
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut subs = self.wake.subscribers.write();
        if let Some(i) = subs.iter().position(|s| Arc::ptr_eq(s, &self.ready)) {
            subs.swap_remove(i);
            self.wake.subscribed.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

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
    /// The ready sets of subscribed consumers.
    subscribers: RwLock<Vec<Arc<ReadySet>>>,
    /// `subscribers.len()`, stored under its write lock; notifiers touch
    /// the lock only while it is non-zero.
    subscribed: AtomicUsize,
}

impl TailWake {
    /// Subscribes a consumer: every notification from now on marks the
    /// returned subscription's [`ReadySet`]. Subscribe before looking at
    /// the partitions, so that nothing published after the look goes
    /// unsignalled.
    pub(crate) fn subscribe(self: &Arc<Self>) -> Subscription {
        let ready = Arc::new(ReadySet::default());
        let mut subs = self.subscribers.write();
        subs.push(ready.clone());
        self.subscribed.fetch_add(1, Ordering::SeqCst);
        drop(subs);
        Subscription {
            wake: self.clone(),
            ready,
        }
    }

    /// Partition `partition` may have moved (an append, for written
    /// reads): marks it in every subscribed [`ReadySet`] and wakes every
    /// waiting reader (not the futures: nothing a [`crate::Durable`]
    /// future checks moves without [`TailWake::notify_partition`] or
    /// [`TailWake::notify_all`]). The caller must have published what
    /// waiters check with a `SeqCst` store or read-modify-write before
    /// this call (see [`TailWake::wait_until`]).
    pub(crate) fn notify(&self, partition: u32) {
        if self.subscribed.load(Ordering::SeqCst) > 0 {
            for s in self.subscribers.read().iter() {
                s.mark(partition);
            }
        }
        self.wake_waiters();
    }

    /// Wakes the threads in [`TailWake::wait_until`].
    fn wake_waiters(&self) {
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
        self.notify(partition);
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
        if self.subscribed.load(Ordering::SeqCst) > 0 {
            for s in self.subscribers.read().iter() {
                s.mark_all();
            }
        }
        self.wake_waiters();
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
            w2.notify(0);
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

    #[test]
    fn a_notification_marks_its_partition_in_every_subscribed_set_once() {
        let w = Arc::new(TailWake::default());
        let a = w.subscribe();
        let b = w.subscribe();
        assert_eq!(a.ready().take(), Signals::None);
        w.notify(3);
        w.notify(5);
        w.notify(3);
        w.notify_partition(7);
        for s in [&a, &b] {
            assert!(s.ready().is_signalled());
            let Signals::Some(mut ids) = s.ready().take() else {
                panic!("partitions were signalled");
            };
            ids.sort_unstable();
            assert_eq!(ids, [3, 5, 7]);
            assert!(!s.ready().is_signalled());
            assert_eq!(s.ready().take(), Signals::None);
        }
    }

    #[test]
    fn notify_all_asks_every_subscriber_to_look_at_everything() {
        let w = Arc::new(TailWake::default());
        let a = w.subscribe();
        w.notify(1);
        w.notify_all();
        w.notify(2);
        assert_eq!(a.ready().take(), Signals::All);
        assert_eq!(a.ready().take(), Signals::None);
    }

    #[test]
    fn a_dropped_subscription_is_no_longer_marked() {
        let w = Arc::new(TailWake::default());
        let a = w.subscribe();
        let b = w.subscribe();
        drop(a);
        assert_eq!(w.subscribed.load(Ordering::SeqCst), 1);
        assert_eq!(w.subscribers.read().len(), 1);
        w.notify(4);
        assert_eq!(b.ready().take(), Signals::Some(vec![4]));
        drop(b);
        assert_eq!(w.subscribed.load(Ordering::SeqCst), 0);
        // Nobody subscribed: a notification touches no set.
        w.notify(4);
        assert!(w.subscribers.read().is_empty());
    }

    /// A notifier publishes a counter per partition, then notifies; the
    /// consumer takes signals and reads the counters of the partitions
    /// signalled only. After each take it must see every value published
    /// before the notification it took, and at the end every last value:
    /// a signal lost between a take and a mark would leave one behind.
    #[test]
    fn signals_taken_concurrently_with_notifications_lose_none() {
        const PARTS: usize = 16;
        const ROUNDS: u64 = 20_000;
        let w = Arc::new(TailWake::default());
        let published: Arc<Vec<AtomicU64>> =
            Arc::new((0..PARTS).map(|_| AtomicU64::new(0)).collect());
        let sub = w.subscribe();
        let (w2, p2) = (w.clone(), published.clone());
        let notifier = std::thread::spawn(move || {
            for i in 1..=ROUNDS {
                let p = (i as usize * 7) % PARTS;
                p2[p].store(i, Ordering::SeqCst);
                w2.notify(p as u32);
            }
        });
        let mut seen = vec![0u64; PARTS];
        let read = |seen: &mut Vec<u64>| match sub.ready().take() {
            Signals::None => {}
            Signals::Some(ids) => {
                for id in ids {
                    seen[id as usize] = published[id as usize].load(Ordering::SeqCst);
                }
            }
            Signals::All => panic!("nobody notified all"),
        };
        while !notifier.is_finished() {
            read(&mut seen);
        }
        notifier.join().unwrap();
        read(&mut seen);
        let want: Vec<u64> = published.iter().map(|p| p.load(Ordering::SeqCst)).collect();
        assert_eq!(seen, want, "a partition's last notification was lost");
    }
}
