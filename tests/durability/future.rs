//! `Topic::durable`: a future that resolves once an offset is durable,
//! without a thread blocked per request.
//! Driven here by a minimal executor, so the test needs no runtime.

use crate::common::log::quiet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use crate::common::faults::Fail;
use crate::common::futures::{block_on, counter, poll_with};
use fissionlog::{Error, IoOp, Log, NewRecord, SyncPolicy, TopicConfig};

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
    let log = Log::open(root.path().join("log"), quiet()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    let last = (0..10).map(|i| append(&t, 0, i)).next_back().unwrap();
    let (c, waker) = counter();
    let mut covered = t.durable(0, last);
    let mut next = t.durable(0, last + 1);
    assert!(
        poll_with(&mut covered, &waker).is_pending(),
        "nothing synced yet"
    );
    assert!(poll_with(&mut next, &waker).is_pending());
    assert_eq!(c.count(), 0);
    log.sync().unwrap();
    assert!(c.count() > 0, "the sync woke the waiter");
    assert!(matches!(
        poll_with(&mut covered, &waker),
        Poll::Ready(Ok(()))
    ));
    // The next offset is not written yet: still waiting.
    assert!(poll_with(&mut next, &waker).is_pending());
    append(&t, 0, 10);
    log.sync().unwrap();
    assert!(matches!(poll_with(&mut next, &waker), Poll::Ready(Ok(()))));
    assert!(t.partition(0).unwrap().durable_end_offset() > last + 1);
}

/// Eight producers append and await their own offsets while the log syncs
/// on an interval: every future resolves, and only once its record is
/// covered by the durable watermark.
#[test]
fn concurrent_producers_await_their_offsets() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), quiet()).unwrap();
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
    let log = Log::open(root.path().join("log"), quiet()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    let off = append(&t, 1, 0);
    let (c, waker) = counter();
    // Past what will ever be written before the close.
    let mut f = t.durable(1, off + 5);
    assert!(poll_with(&mut f, &waker).is_pending());
    log.close().unwrap();
    assert!(c.count() > 0, "the close woke the waiter");
    assert!(matches!(
        poll_with(&mut f, &waker),
        Poll::Ready(Err(Error::Closed))
    ));
}

#[test]
fn a_failed_fsync_fails_the_future_instead_of_resolving_it() {
    let root = tempfile::tempdir().unwrap();
    // Every segment fdatasync fails once armed (EIO after the call).
    let hook = Arc::new(
        Fail::new(IoOp::SyncSegment, libc::EIO)
            .after_the_call()
            .disarmed(),
    );
    let log = Log::open_with_hook(root.path().join("log"), quiet(), hook.clone()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    let off = append(&t, 0, 0);
    let (c, waker) = counter();
    let mut f = t.durable(0, off);
    assert!(poll_with(&mut f, &waker).is_pending());
    hook.arm();
    assert!(log.sync().is_err());
    assert!(c.count() > 0, "the failure woke the waiter");
    match poll_with(&mut f, &waker) {
        Poll::Ready(Err(Error::Poisoned { partition: 0, .. })) => {}
        other => panic!("expected Poisoned, got {other:?}"),
    }
    assert_eq!(t.partition(0).unwrap().durable_end_offset(), 0);
}

#[test]
fn an_offset_past_a_seal_is_an_error() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), quiet()).unwrap();
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

/// A future waits on its own partition: appends (to any partition) move
/// no durable end and wake nobody, and a sync round wakes only the
/// futures of the partitions whose durable end it moved.
#[test]
fn a_round_moving_another_partition_does_not_wake_the_future() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), quiet()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    let a_end = append(&t, 0, 0) + 1;
    log.sync().unwrap();
    let (ca, wa) = counter();
    let (cb, wb) = counter();
    // Partition 0: the next offset, not written yet. Partition 1: a
    // written record not synced yet.
    let mut fa = t.durable(0, a_end);
    let mut fb = t.durable(1, append(&t, 1, 1));
    assert!(poll_with(&mut fa, &wa).is_pending());
    assert!(poll_with(&mut fb, &wb).is_pending());
    append(&t, 1, 2);
    assert_eq!(cb.count(), 0, "an append woke B");
    log.sync().unwrap();
    assert_eq!(
        ca.count(),
        0,
        "A was woken by appends and a round on partition 1 only"
    );
    assert!(cb.count() > 0, "the round woke B");
    assert!(matches!(poll_with(&mut fb, &wb), Poll::Ready(Ok(()))));
    // Partition 0's own append does not wake A either; its round does.
    assert_eq!(append(&t, 0, 3), a_end);
    assert_eq!(ca.count(), 0, "an append woke A");
    assert!(poll_with(&mut fa, &wa).is_pending(), "not durable yet");
    log.sync().unwrap();
    assert_eq!(ca.count(), 1, "A's round woke it once");
    assert!(matches!(poll_with(&mut fa, &wa), Poll::Ready(Ok(()))));
}

/// Deleting the topic wakes the futures of every partition, not only of
/// one (the wakers are kept per partition).
#[test]
fn deleting_the_topic_wakes_futures_on_every_partition() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), quiet()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    let wakers: Vec<_> = (0..2u32)
        .map(|p| {
            let (c, w) = counter();
            let mut f = t.durable(p, append(&t, p, u64::from(p)) + 1);
            assert!(poll_with(&mut f, &w).is_pending());
            (c, w, f)
        })
        .collect();
    log.delete_topic("t").unwrap();
    for (p, (c, w, mut f)) in wakers.into_iter().enumerate() {
        assert!(c.count() > 0, "partition {p} not woken");
        assert!(
            matches!(
                poll_with(&mut f, &w),
                Poll::Ready(Err(Error::UnknownTopic(_)))
            ),
            "partition {p}"
        );
    }
}

/// xorshift64*: a deterministic sequence per seed.
fn next_rand(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// Futures registered while sync rounds run: each producer (one per
/// partition) appends, then polls its future over and over, each time
/// with a fresh waker (so each poll is a first registration racing the
/// round), until a poll answers `Ready`. Every poll that answered
/// `Pending` registered a waker that must then be woken: only the round
/// of that partition can do it (nobody else moves its durable end), so a
/// registration that missed the round covering the record stays unwoken
/// and the test fails after 2 s. Seeded random pauses vary where the
/// polls fall against the rounds.
#[test]
fn registration_racing_sync_rounds_loses_no_wakeup() {
    const PRODUCERS: u32 = 4;
    const ROUNDS: u64 = 60;
    let root = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(root.path().join("log"), quiet()).unwrap());
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: PRODUCERS,
                sync: SyncPolicy::Never,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (log, t, stop) = (log.clone(), t.clone(), stop.clone());
        std::thread::spawn(move || {
            let parts: Vec<_> = (0..PRODUCERS).map(|p| t.partition(p).unwrap()).collect();
            let mut rounds = 0u64;
            while !stop.load(Ordering::SeqCst) {
                if parts
                    .iter()
                    .any(|p| p.durable_end_offset() < p.end_offset())
                {
                    log.sync().unwrap();
                    rounds += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            rounds
        })
    };
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let t = t.clone();
            std::thread::spawn(move || {
                let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(p + 1);
                let mut pending_polls = 0usize;
                for i in 0..ROUNDS {
                    let off = append(&t, p, i);
                    let mut f = t.durable(p, off);
                    let mut pending = Vec::new();
                    loop {
                        for _ in 0..next_rand(&mut seed) % 256 {
                            std::hint::spin_loop();
                        }
                        let (c, w) = counter();
                        match poll_with(&mut f, &w) {
                            Poll::Ready(r) => {
                                r.unwrap();
                                break;
                            }
                            Poll::Pending => pending.push(c),
                        }
                    }
                    assert!(t.partition(p).unwrap().durable_end_offset() > off);
                    let deadline = std::time::Instant::now() + Duration::from_secs(2);
                    for (k, c) in pending.iter().enumerate() {
                        while c.count() == 0 {
                            assert!(
                                std::time::Instant::now() < deadline,
                                "partition {p}, offset {off}: poll {k} of {} answered \
                                 Pending and was never woken",
                                pending.len()
                            );
                            std::thread::park_timeout(Duration::from_millis(1));
                        }
                    }
                    pending_polls += pending.len();
                }
                pending_polls
            })
        })
        .collect();
    let pending_polls: usize = producers.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, Ordering::SeqCst);
    let rounds = syncer.join().unwrap();
    assert!(rounds > 0);
    // The polls did race the rounds: most records saw several `Pending`.
    assert!(
        pending_polls as u64 > u64::from(PRODUCERS) * ROUNDS,
        "{pending_polls} pending polls"
    );
    for p in 0..PRODUCERS {
        assert_eq!(t.partition(p).unwrap().durable_end_offset(), ROUNDS);
    }
}
