//! `Topic::durable`: a future that resolves once an offset is durable,
//! without a thread blocked per request (issue 8, "await durability").
//! Driven here by a minimal executor, so the test needs no runtime.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use fissionlog::{Error, IoHook, IoOp, Log, LogOptions, NewRecord, SyncPolicy, TopicConfig};

/// Counts its wakes and unparks the thread that made it.
struct Counter {
    wakes: AtomicUsize,
    thread: std::thread::Thread,
}

impl Wake for Counter {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.thread.unpark();
    }
}

fn counter() -> (Arc<Counter>, Waker) {
    let c = Arc::new(Counter {
        wakes: AtomicUsize::new(0),
        thread: std::thread::current(),
    });
    (c.clone(), Waker::from(c))
}

fn poll_once<F: Future + Unpin>(f: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(waker))
}

/// Polls `f` to completion on this thread, parking between polls (only a
/// wake unparks it; the 10 s bound turns a lost wake-up into a failure).
fn block_on<F: Future + Unpin>(mut f: F) -> F::Output {
    let (c, waker) = counter();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = c.wakes.load(Ordering::SeqCst);
        if let Poll::Ready(v) = poll_once(&mut f, &waker) {
            return v;
        }
        while c.wakes.load(Ordering::SeqCst) == seen {
            assert!(
                std::time::Instant::now() < deadline,
                "a pending durability future was never woken"
            );
            std::thread::park_timeout(Duration::from_millis(100));
        }
    }
}

fn opts() -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    }
}

fn config(sync: SyncPolicy) -> TopicConfig {
    TopicConfig {
        partitions: 2,
        sync,
        ..TopicConfig::default()
    }
}

fn append(t: &fissionlog::Topic, p: u32, i: u64) -> u64 {
    let v = i.to_le_bytes();
    t.append_to(
        p,
        &[NewRecord {
            key: None,
            value: &v,
            timestamp: None,
        }],
    )
    .unwrap()
}

#[test]
fn resolves_once_a_sync_covers_the_offset_and_not_before() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), opts()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    let last = (0..10).map(|i| append(&t, 0, i)).next_back().unwrap();
    let (c, waker) = counter();
    let mut covered = t.durable(0, last);
    let mut next = t.durable(0, last + 1);
    assert!(
        poll_once(&mut covered, &waker).is_pending(),
        "nothing synced yet"
    );
    assert!(poll_once(&mut next, &waker).is_pending());
    assert_eq!(c.wakes.load(Ordering::SeqCst), 0);
    log.sync().unwrap();
    assert!(
        c.wakes.load(Ordering::SeqCst) > 0,
        "the sync woke the waiter"
    );
    assert!(matches!(
        poll_once(&mut covered, &waker),
        Poll::Ready(Ok(()))
    ));
    // The next offset is not written yet: still waiting.
    assert!(poll_once(&mut next, &waker).is_pending());
    append(&t, 0, 10);
    log.sync().unwrap();
    assert!(matches!(poll_once(&mut next, &waker), Poll::Ready(Ok(()))));
    assert!(t.partition(0).unwrap().durable_end_offset() > last + 1);
}

/// Eight producers append and await their own offsets while the log syncs
/// on an interval: every future resolves, and only once its record is
/// covered by the durable watermark.
#[test]
fn concurrent_producers_await_their_offsets() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), opts()).unwrap();
    let t = log
        .create_topic("t", config(SyncPolicy::Interval(Duration::from_millis(2))))
        .unwrap();
    let handles: Vec<_> = (0..8u32)
        .map(|w| {
            let t = t.clone();
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    let p = w % 2;
                    let off = append(&t, p, u64::from(w) * 1000 + i);
                    block_on(t.durable(p, off)).unwrap();
                    assert!(t.partition(p).unwrap().durable_end_offset() > off);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let total: u64 = (0..2).map(|p| t.partition(p).unwrap().end_offset()).sum();
    assert_eq!(total, 400);
}

#[test]
fn closing_the_log_fails_a_pending_future() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), opts()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    let off = append(&t, 1, 0);
    let (c, waker) = counter();
    // Past what will ever be written before the close.
    let mut f = t.durable(1, off + 5);
    assert!(poll_once(&mut f, &waker).is_pending());
    log.close().unwrap();
    assert!(
        c.wakes.load(Ordering::SeqCst) > 0,
        "the close woke the waiter"
    );
    assert!(matches!(
        poll_once(&mut f, &waker),
        Poll::Ready(Err(Error::Closed))
    ));
}

/// Fails every segment fdatasync once armed (EIO after the call).
#[derive(Debug, Default)]
struct FailSegmentSync(AtomicBool);

impl IoHook for FailSegmentSync {
    fn before(&self, _op: IoOp, _path: &Path) -> std::io::Result<()> {
        Ok(())
    }

    fn after(&self, op: IoOp, _path: &Path, result: std::io::Result<()>) -> std::io::Result<()> {
        if op == IoOp::SyncSegment && self.0.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        result
    }
}

#[test]
fn a_failed_fsync_fails_the_future_instead_of_resolving_it() {
    let root = tempfile::tempdir().unwrap();
    let hook = Arc::new(FailSegmentSync::default());
    let log = Log::open_with_hook(root.path().join("log"), opts(), hook.clone()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    let off = append(&t, 0, 0);
    let (c, waker) = counter();
    let mut f = t.durable(0, off);
    assert!(poll_once(&mut f, &waker).is_pending());
    hook.0.store(true, Ordering::SeqCst);
    assert!(log.sync().is_err());
    assert!(
        c.wakes.load(Ordering::SeqCst) > 0,
        "the failure woke the waiter"
    );
    match poll_once(&mut f, &waker) {
        Poll::Ready(Err(Error::Poisoned { partition: 0, .. })) => {}
        other => panic!("expected Poisoned, got {other:?}"),
    }
    assert_eq!(t.partition(0).unwrap().durable_end_offset(), 0);
}

#[test]
fn an_offset_past_a_seal_is_an_error() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), opts()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    let off = append(&t, 0, 0);
    t.split(0, fissionlog::SplitPlan::Even).unwrap();
    let err = block_on(t.durable(0, off + 1)).unwrap_err();
    assert!(
        matches!(err, Error::OffsetOutOfRange { partition: 0, .. }),
        "{err}"
    );
    // The record below the seal: the split synced the parent.
    block_on(t.durable(0, off)).unwrap();
}
