//! A minimal executor for the futures of the log (`Topic::durable`), so
//! the tests need no runtime: a waker that counts its wakes and unparks
//! the thread that made it, one poll with it or with no waker at all, and
//! a `block_on` that polls only after a wake.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// Counts its wakes and unparks the thread that made it.
pub struct Wakes {
    wakes: AtomicUsize,
    thread: std::thread::Thread,
}

impl Wakes {
    /// How many times it was woken.
    pub fn count(&self) -> usize {
        self.wakes.load(Ordering::SeqCst)
    }
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// A counting waker of this thread.
pub fn counter() -> (Arc<Wakes>, Waker) {
    let c = Arc::new(Wakes {
        wakes: AtomicUsize::new(0),
        thread: std::thread::current(),
    });
    (c.clone(), Waker::from(c))
}

/// Polls `f` once with `waker`.
pub fn poll_with<F: Future + Unpin>(f: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(waker))
}

/// Polls `f` to completion on this thread, parking between polls (only a
/// wake unparks it; the 10 s bound turns a lost wake-up into a failure).
pub fn block_on<F: Future + Unpin>(mut f: F) -> F::Output {
    let (c, waker) = counter();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = c.count();
        if let Poll::Ready(v) = poll_with(&mut f, &waker) {
            return v;
        }
        while c.count() == seen {
            assert!(
                std::time::Instant::now() < deadline,
                "a pending durability future was never woken"
            );
            std::thread::park_timeout(Duration::from_millis(100));
        }
    }
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
