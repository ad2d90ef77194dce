//! Two contracts: a sealed partition holding less
//! than its seal is missing data (C7: a legitimate crash state must still
//! open in Strict; C8: Truncate must not hand offsets out twice), and
//! `Topic::durable` (resolves only once the offset is durable, never hangs
//! while something syncs).

use crate::common;
use common::log::quiet_in;

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use common::crash::CrashOptions;
use common::faults::Fail;
use common::futures::{block_on, counter, poll_with};
use common::model_hook::ModelHook;
use fissionlog::{
    Error, IoOp, Log, LogOptions, NewRecord, RecoveryMode, SplitPlan, SyncPolicy, Topic,
    TopicConfig,
};

fn config(partitions: u32, sync: SyncPolicy) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: 4096,
        sync,
        ..TopicConfig::default()
    }
}

fn append(t: &Topic, p: u32, i: u64) -> u64 {
    let v: Vec<u8> = (0..100).map(|j| (i * 31 + j) as u8).collect();
    t.append_to(
        p,
        &[NewRecord {
            key: None,
            value: &v,
            timestamp: Some(i as i64),
        }],
    )
    .unwrap()
}

/// Segment files of a partition directory, sorted by name.
fn segments(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// A one-partition log of several segments whose last segment file is
/// gone (closed cleanly first, so the checkpoint names it): a Truncate
/// open fills a hole up to the checkpoint's end.
fn damaged_log(dir: &Path) -> u64 {
    let log = Log::open(dir, quiet_in(RecoveryMode::Strict)).unwrap();
    let t = log.create_topic("t", config(1, SyncPolicy::Never)).unwrap();
    let mut end = 0;
    for i in 0..120 {
        end = append(&t, 0, i) + 1;
    }
    log.close().unwrap();
    let segs = segments(&dir.join("topics/t0/p0"));
    assert!(segs.len() >= 3, "{segs:?}");
    let last = segs.last().unwrap();
    std::fs::remove_file(last).unwrap();
    let _ = std::fs::remove_file(last.with_extension("idx"));
    end
}

/// Opens `dir` (damaged as [`damaged_log`] leaves it) with Truncate under
/// the crash model, splits partition 0 right after the open and merges its
/// children; a power loss before every I/O step of the split and of the
/// merge must leave a log Strict opens, with no offset handed out twice.
#[test]
fn split_and_merge_right_after_a_truncate_repair_reopen_in_strict() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir_all(&dir).unwrap();
    let end = damaged_log(&dir);
    let hook = ModelHook::new(&dir, None);
    hook.grant_segment_headers(true);
    let log = Log::open_with_hook(&dir, quiet_in(RecoveryMode::Truncate), hook.clone()).unwrap();
    assert!(log.recovery_report().changed_anything());
    let t = log.topic("t").unwrap();
    assert_eq!(t.partition(0).unwrap().end_offset(), end);
    hook.record_steps(true);
    let kids = t.split(0, SplitPlan::Even).unwrap();
    for (i, &k) in kids.iter().enumerate() {
        append(&t, k, 1000 + i as u64);
    }
    t.merge(kids[0], kids[1]).unwrap();
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    log.abandon();
    let crash = CrashOptions::default();
    let mut refused = Vec::new();
    for (i, point) in points.iter().enumerate() {
        for s in 0..3u64 {
            let (image, trace) = point.image(i as u64 * 10 + s, &crash);
            let d = tempfile::tempdir().unwrap();
            let r = d.path().join("log");
            image.write_to(&r).unwrap();
            match Log::open(&r, quiet_in(RecoveryMode::Strict)) {
                Ok(log) => {
                    let t = log.topic("t").unwrap();
                    let p0 = t.partition(0).unwrap();
                    assert!(
                        p0.end_offset() >= end,
                        "C8: step {i}: parent end moved back"
                    );
                }
                Err(e) => refused.push(format!(
                    "step {i} (before {:?}) seed {s}: {e} [{}]",
                    point.op,
                    trace.join("; ")
                )),
            }
        }
    }
    assert!(
        refused.is_empty(),
        "C7: Strict refused {} of {} images:\n{}",
        refused.len(),
        points.len() * 3,
        refused.join("\n")
    );
}

/// One future cloned and polled from two tasks (two wakers): one sync
/// wakes both, and both resolve.
#[test]
fn a_future_polled_from_two_tasks_wakes_both() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), quiet_in(RecoveryMode::Strict)).unwrap();
    let t = log.create_topic("t", config(1, SyncPolicy::Never)).unwrap();
    let off = append(&t, 0, 0);
    let mut a = t.durable(0, off);
    let mut b = a.clone();
    let (ca, wa) = counter();
    let (cb, wb) = counter();
    assert!(poll_with(&mut a, &wa).is_pending());
    assert!(poll_with(&mut b, &wb).is_pending());
    // Polled again with the same waker: still one registration each.
    assert!(poll_with(&mut a, &wa).is_pending());
    log.sync().unwrap();
    assert!(ca.count() >= 1 && cb.count() >= 1);
    assert!(matches!(poll_with(&mut a, &wa), Poll::Ready(Ok(()))));
    assert!(matches!(poll_with(&mut b, &wb), Poll::Ready(Ok(()))));
}

/// Futures made before their offset is appended, one producer per
/// partition, while another thread syncs in a loop: each resolves, and
/// only once the watermark covers it.
#[test]
fn futures_made_before_the_append_resolve_only_once_durable() {
    let root = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(root.path().join("log"), quiet_in(RecoveryMode::Strict)).unwrap());
    let t = log.create_topic("t", config(4, SyncPolicy::Never)).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (log, done) = (log.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                log.sync().unwrap();
                std::thread::yield_now();
            }
        })
    };
    let producers: Vec<_> = (0..4u32)
        .map(|p| {
            let t = t.clone();
            std::thread::spawn(move || {
                let part = t.partition(p).unwrap();
                for i in 0..200u64 {
                    let next = part.end_offset();
                    let mut f = t.durable(p, next);
                    let (_c, w) = counter();
                    let early = poll_with(&mut f, &w);
                    assert!(early.is_pending(), "offset {next} of {p} not appended yet");
                    let off = append(&t, p, i);
                    assert_eq!(off, next);
                    block_on(f).unwrap();
                    assert!(part.durable_end_offset() > off);
                }
            })
        })
        .collect();
    for h in producers {
        h.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    syncer.join().unwrap();
}

/// A merge seals both parents: an offset below a parent's seal resolves,
/// one at or past it fails instead of waiting forever.
#[test]
fn a_merged_parent_resolves_below_its_seal_and_fails_past_it() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), quiet_in(RecoveryMode::Strict)).unwrap();
    let t = log.create_topic("t", config(2, SyncPolicy::Never)).unwrap();
    let a = append(&t, 0, 0);
    let b = append(&t, 1, 1);
    let mut past = t.durable(1, b + 1);
    let (c, w) = counter();
    assert!(poll_with(&mut past, &w).is_pending());
    t.merge(0, 1).unwrap();
    assert!(c.count() > 0, "the merge woke the waiter");
    assert!(matches!(
        poll_with(&mut past, &w),
        Poll::Ready(Err(Error::OffsetOutOfRange { partition: 1, .. }))
    ));
    block_on(t.durable(0, a)).unwrap();
    block_on(t.durable(1, b)).unwrap();
}

/// After a reopen the watermark is what the checkpoint holds: the last
/// record of a clean close resolves at once, the next offset waits.
#[test]
fn after_a_reopen_only_what_is_on_disk_resolves() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
    let t = log.create_topic("t", config(1, SyncPolicy::Never)).unwrap();
    let last = (0..10).map(|i| append(&t, 0, i)).next_back().unwrap();
    log.close().unwrap();
    let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
    let t = log.topic("t").unwrap();
    let (_c, w) = counter();
    assert!(matches!(
        poll_with(&mut t.durable(0, last), &w),
        Poll::Ready(Ok(()))
    ));
    let mut next = t.durable(0, last + 1);
    assert!(poll_with(&mut next, &w).is_pending());
    append(&t, 0, 10);
    assert!(
        poll_with(&mut next, &w).is_pending(),
        "appended, not synced"
    );
    log.sync().unwrap();
    assert!(matches!(poll_with(&mut next, &w), Poll::Ready(Ok(()))));
}

/// Retention empties a sealed parent (every offset below its seal
/// retired) and then removes it; a power loss before every I/O step of
/// those passes (and of the syncs that let them go on) leaves a log
/// Strict opens: a parent retired below its seal is not missing data.
#[test]
fn retention_emptying_a_sealed_parent_reopens_in_strict() {
    retention_probe(
        TopicConfig {
            retention_age: Some(Duration::from_secs(1)),
            ..config(1, SyncPolicy::Never)
        },
        true,
    );
}

/// As above, with retention by size: the sealed parent loses its first
/// segments (no checkpoint is waited for, the parent takes no appends)
/// and keeps the rest.
#[test]
fn retention_cutting_a_sealed_parent_from_the_front_reopens_in_strict() {
    retention_probe(
        TopicConfig {
            retention_bytes: Some(2048),
            ..config(1, SyncPolicy::Never)
        },
        false,
    );
}

fn retention_probe(cfg: TopicConfig, removed: bool) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir_all(&dir).unwrap();
    let hook = ModelHook::new(&dir, None);
    hook.grant_segment_headers(true);
    let eager = LogOptions {
        checkpoint_interval: Duration::ZERO,
        ..quiet_in(RecoveryMode::Strict)
    };
    let log = Log::open_with_hook(&dir, eager, hook.clone()).unwrap();
    let t = log.create_topic("t", cfg).unwrap();
    for i in 0..60 {
        append(&t, 0, i);
    }
    let kids = t.split(0, SplitPlan::Even).unwrap();
    hook.record_steps(true);
    for round in 0..6u64 {
        for (j, &k) in kids.iter().enumerate() {
            for i in 0..40 {
                append(&t, k, round * 1000 + j as u64 * 100 + i);
            }
        }
        log.sync().unwrap();
        log.enforce_retention().unwrap();
    }
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    match t.partition(0) {
        Err(_) => assert!(removed, "retention removed the parent"),
        Ok(p) => assert!(!removed && p.start_offset() > 0, "retention cut the parent"),
    }
    log.abandon();
    let crash = CrashOptions::default();
    let mut refused = Vec::new();
    for (i, point) in points.iter().enumerate() {
        for s in 0..2u64 {
            let (image, trace) = point.image(i as u64 * 10 + s, &crash);
            let d = tempfile::tempdir().unwrap();
            let r = d.path().join("log");
            image.write_to(&r).unwrap();
            if let Err(e) = Log::open(&r, quiet_in(RecoveryMode::Strict)) {
                refused.push(format!(
                    "step {i} (before {:?}) seed {s}: {e} [{}]",
                    point.op,
                    trace.join("; ")
                ));
            }
        }
    }
    assert!(
        refused.is_empty(),
        "C7: Strict refused {} of {} images:\n{}",
        refused.len(),
        points.len() * 2,
        refused.join("\n")
    );
}

/// Polls `f` once after each of a few syncs: `Some` once it resolved.
fn resolves_with_syncs<F: Future + Unpin>(log: &Log, mut f: F) -> Option<F::Output> {
    let (_c, w) = counter();
    for _ in 0..3 {
        if let Poll::Ready(v) = poll_with(&mut f, &w) {
            return Some(v);
        }
        log.sync().unwrap();
    }
    match poll_with(&mut f, &w) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// A Truncate open fills the lost end of a partition with a hole: a
/// future on an offset below the recovered end resolves (one way or the
/// other) once the log syncs, instead of waiting for a sync round that
/// never covers it.
#[test]
fn an_offset_in_a_recovered_hole_does_not_wait_forever() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir_all(&dir).unwrap();
    let end = damaged_log(&dir);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Truncate)).unwrap();
    let t = log.topic("t").unwrap();
    assert_eq!(t.partition(0).unwrap().end_offset(), end);
    let r = resolves_with_syncs(&log, t.durable(0, end - 1));
    assert!(
        r.is_some(),
        "offset {} below the end {end} still pending",
        end - 1
    );
}

/// A split commits after syncing its parent, and the process dies before
/// the next checkpoint: after the reopen the sealed parent's records are
/// on disk, and a future on one of them resolves once the log syncs (the
/// parent takes no appends, so no later round makes it dirty).
#[test]
fn a_sealed_parent_recovered_past_its_checkpoint_does_not_wait_forever() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let slow = LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..quiet_in(RecoveryMode::Strict)
    };
    let log = Log::open(&dir, slow.clone()).unwrap();
    let t = log.create_topic("t", config(1, SyncPolicy::Never)).unwrap();
    append(&t, 0, 0);
    log.sync().unwrap();
    let last = (1..80).map(|i| append(&t, 0, i)).next_back().unwrap();
    t.split(0, SplitPlan::Even).unwrap();
    log.abandon();
    let log = Log::open(&dir, slow).unwrap();
    let t = log.topic("t").unwrap();
    let p = t.partition(0).unwrap();
    assert!(p.is_sealed() && p.end_offset() == last + 1);
    let r = resolves_with_syncs(&log, t.durable(0, last));
    assert!(
        matches!(r, Some(Ok(()))),
        "offset {last} of the sealed parent: {r:?} (durable end {})",
        p.durable_end_offset()
    );
}

/// A topic deleted while a future waits on one of its unsynced records:
/// the record will never be durable (its files are gone), so a sync after
/// the deletion must not resolve the future `Ok`.
#[test]
fn a_deleted_topic_fails_a_pending_future_instead_of_resolving_it() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), quiet_in(RecoveryMode::Strict)).unwrap();
    let t = log.create_topic("t", config(1, SyncPolicy::Never)).unwrap();
    let off = append(&t, 0, 0);
    let (c, w) = counter();
    let mut f = t.durable(0, off);
    assert!(poll_with(&mut f, &w).is_pending());
    log.delete_topic("t").unwrap();
    assert!(c.count() > 0, "the deletion woke the waiter");
    log.sync().unwrap();
    let r = poll_with(&mut f, &w);
    assert!(
        matches!(r, Poll::Ready(Err(Error::UnknownTopic(_)))),
        "{r:?} for a record of a deleted topic"
    );
}

/// A future on an offset a deleted topic never wrote: the log's close
/// must not leave it pending forever (the close releases only the topics
/// it still has).
#[test]
fn a_deleted_topic_does_not_leave_a_future_pending_past_the_close() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), quiet_in(RecoveryMode::Strict)).unwrap();
    let t = log.create_topic("t", config(1, SyncPolicy::Never)).unwrap();
    let off = append(&t, 0, 0);
    let (_c, w) = counter();
    let mut f = t.durable(0, off + 1);
    assert!(poll_with(&mut f, &w).is_pending());
    log.delete_topic("t").unwrap();
    log.close().unwrap();
    let r = poll_with(&mut f, &w);
    assert!(matches!(r, Poll::Ready(Err(_))), "{r:?} after the close");
}

/// A failed checkpoint fsync fails every later sync round (no partition
/// is poisoned): a record appended after it can never become durable, so
/// a future waiting on it must fail, not wait for a round that never
/// succeeds.
#[test]
fn a_failed_checkpoint_sync_fails_a_pending_future() {
    let root = tempfile::tempdir().unwrap();
    let hook = Arc::new(
        // Every checkpoint fsync fails once armed (EIO after the call).
        Fail::new(IoOp::SyncCheckpoint, libc::EIO)
            .after_the_call()
            .disarmed(),
    );
    let eager = LogOptions {
        checkpoint_interval: Duration::ZERO,
        ..quiet_in(RecoveryMode::Strict)
    };
    let log = Log::open_with_hook(root.path().join("log"), eager, hook.clone()).unwrap();
    let t = log.create_topic("t", config(1, SyncPolicy::Never)).unwrap();
    append(&t, 0, 0);
    log.sync().unwrap();
    let off = append(&t, 0, 1);
    let (_c, w) = counter();
    let mut f = t.durable(0, off);
    assert!(poll_with(&mut f, &w).is_pending());
    // Not appended yet: the failing round cannot cover it.
    let (c2, w2) = counter();
    let mut g = t.durable(0, off + 1);
    assert!(poll_with(&mut g, &w2).is_pending());
    // Covers `off`; the checkpoint lags a round behind it.
    log.sync().unwrap();
    assert!(matches!(poll_with(&mut f, &w), Poll::Ready(Ok(()))));
    assert!(poll_with(&mut g, &w2).is_pending());
    let woken = c2.count();
    hook.arm();
    // The round that writes the lagging checkpoint (interval zero) fails
    // on it and moves no durable end.
    assert!(log.sync().is_err());
    assert!(c2.count() > woken, "the failure woke the waiter");
    let late = append(&t, 0, 2);
    assert_eq!(late, off + 1);
    assert!(log.sync().is_err(), "sync rounds fail from now on");
    let r = poll_with(&mut g, &w2);
    assert!(
        matches!(r, Poll::Ready(Err(_))),
        "{r:?}: offset {late} can no longer become durable"
    );
}

/// A sealed partition the checkpoint does not name (no checkpoint since
/// the split), `records` long, whose segment `torn` (by index) loses its
/// last 60 bytes after the process died. Returns the seal.
fn sealed_with_a_torn_segment(dir: &Path, records: u64, torn: usize) -> u64 {
    let no_checkpoint = LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..quiet_in(RecoveryMode::Strict)
    };
    let log = Log::open(dir, no_checkpoint).unwrap();
    let t = log.create_topic("t", config(1, SyncPolicy::Never)).unwrap();
    for i in 0..records {
        append(&t, 0, i);
    }
    t.split(0, SplitPlan::Even).unwrap();
    drop(t);
    log.abandon();
    let segs = segments(&dir.join("topics/t0/p0"));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&segs[torn])
        .unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - 60).unwrap();
    records
}

/// A Strict open that refuses a sealed partition holding less than its
/// seal changes no file: not the torn tail it would clear, not the
/// segments after it.
fn strict_refusal_changes_nothing(records: u64, torn: usize) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let seal = sealed_with_a_torn_segment(&dir, records, torn);
    let before = common::crash::DirImage::capture(&dir).unwrap();
    let err = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap_err();
    assert!(err.to_string().contains(&format!("{seal}")), "{err}");
    let after = common::crash::DirImage::capture(&dir).unwrap();
    assert!(before == after, "{}", before.diff_summary(&after));
    root
}

#[test]
fn strict_refusing_a_sealed_partition_with_a_torn_tail_changes_nothing() {
    strict_refusal_changes_nothing(10, 0);
}

#[test]
fn strict_refusing_a_sealed_partition_torn_before_its_last_segment_changes_nothing() {
    strict_refusal_changes_nothing(80, 0);
}

/// Salvage of the same state: the records of the segments after the torn
/// one are intact on disk, and Salvage is the mode that keeps valid
/// records after damage: only the torn segment's tail (up to its seal)
/// becomes a hole, and a second open finds the repaired chain as it was.
#[test]
fn salvage_keeps_the_segments_after_a_torn_rolled_segment() {
    let dir = strict_refusal_changes_nothing(80, 0);
    let path = dir.path().join("log");
    let log = Log::open(&path, quiet_in(RecoveryMode::Salvage)).unwrap();
    let holes = log.recovery_report().holes.clone();
    assert_eq!(holes.len(), 1, "{holes:?}");
    let (partition, start, end) = (
        holes[0].partition,
        holes[0].offsets.start,
        holes[0].offsets.end,
    );
    assert_eq!(partition, 0);
    // The tear cost the last batches of the first segment only.
    assert!(start > 0 && end <= 40 && start < end, "{holes:?}");
    let check = |log: &Log| {
        let p = log.topic("t").unwrap().partition(0).unwrap();
        assert_eq!(p.end_offset(), 80);
        let mut offset = 0;
        while offset < 80 {
            match p.read(offset, 1 << 20) {
                Ok(batch) => {
                    for r in batch.iter() {
                        assert_eq!(r.offset, offset);
                        let want: Vec<u8> = (0..100).map(|j| (offset * 31 + j) as u8).collect();
                        assert_eq!(r.value, &want[..], "offset {offset}");
                        offset += 1;
                    }
                }
                Err(fissionlog::Error::Hole {
                    start: s, end: e, ..
                }) => {
                    assert_eq!((s, e), (start, end));
                    offset = e;
                }
                Err(e) => panic!("offset {offset}: {e}"),
            }
        }
    };
    check(&log);
    drop(log);
    // The repair is durable and complete: a Strict open accepts it.
    let log = Log::open(&path, quiet_in(RecoveryMode::Strict)).unwrap();
    check(&log);
}

/// A sealed partition (no checkpoint since the split) whose second
/// segment file is gone: Strict refuses the gap and changes no file (the
/// segments after the gap hold synced records).
#[test]
fn strict_refusing_a_sealed_partition_missing_a_middle_segment_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    sealed_with_a_torn_segment(&dir, 80, 3);
    let segs = segments(&dir.join("topics/t0/p0"));
    assert!(segs.len() >= 4, "{segs:?}");
    std::fs::remove_file(&segs[1]).unwrap();
    let _ = std::fs::remove_file(segs[1].with_extension("idx"));
    let before = common::crash::DirImage::capture(&dir).unwrap();
    assert!(Log::open(&dir, quiet_in(RecoveryMode::Strict)).is_err());
    let after = common::crash::DirImage::capture(&dir).unwrap();
    assert!(before == after, "{}", before.diff_summary(&after));
}

/// One future's clones awaited from three threads at once while the main
/// thread syncs: no wake-up is lost (each thread's waker is registered
/// separately and every sync round takes them all).
#[test]
fn clones_awaited_from_three_threads_all_resolve() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), quiet_in(RecoveryMode::Strict)).unwrap();
    let t = log.create_topic("t", config(1, SyncPolicy::Never)).unwrap();
    for i in 0..100u64 {
        let off = append(&t, 0, i);
        let f = t.durable(0, off);
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let f = f.clone();
                std::thread::spawn(move || block_on(f))
            })
            .collect();
        if i % 2 == 0 {
            std::thread::yield_now();
        }
        log.sync().unwrap();
        for w in waiters {
            w.join().unwrap().unwrap();
        }
        assert!(t.partition(0).unwrap().durable_end_offset() > off);
    }
}
