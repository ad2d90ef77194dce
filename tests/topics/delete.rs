//! `Log::delete_topic` holds the topic's change lock, refuses changes
//! through a deleted handle, and leaves partitions that take no appends or
//! rolls and whose failures do not fail log-wide syncs: changes parked in I/O
//! while the delete waits, sync rounds failing on the deleted topic's
//! files, a topic of the same name created while the delete is parked,
//! the balancer thread, retention removal, and a lock-order stress run
//! under a watchdog.

use crate::common;

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::futures::poll_once;
use common::lifecycle::{cfg, delete_in_thread, opts, partition_values, topic_dirs, tree, Gate};
use common::log::rec;
use fissionlog::{
    BalancePolicy, Error, GroupOptions, HotKeyMode, IoOp, Log, LogOptions, NewRecord, SplitPlan,
    SyncPolicy, TailSplitOptions, TopicConfig, TopologyEvent,
};

/// Every value of the topic, over every partition held.
fn all_values(t: &fissionlog::Topic) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = t
        .partitions()
        .iter()
        .flat_map(|p| partition_values(t, p.id))
        .collect();
    v.sort();
    v
}

/// A thread's result, or `None` if it is still running after `limit`.
fn join_within<T: Send + 'static>(
    h: std::thread::JoinHandle<T>,
    limit: Duration,
) -> Option<std::thread::Result<T>> {
    let t = Instant::now();
    while !h.is_finished() {
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Some(h.join())
}

/// Closes `log` (sole owner), reopens it in the default Strict mode and
/// checks the close was clean and only `expect` topics' directories remain.
fn close_reopen_strict(dir: &Path, log: Arc<Log>, ctx: &str) -> Log {
    let Ok(log) = Arc::try_unwrap(log) else {
        panic!("{ctx}: a log handle is still held")
    };
    log.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
    let log = Log::open(dir, opts()).unwrap_or_else(|e| panic!("{ctx}: Strict reopen: {e}"));
    assert!(log.recovery_report().clean_shutdown, "{ctx}: not clean");
    log
}

/// A tail split parked in I/O (its first child's segment fsync) holds the
/// change lock: `delete_topic` waits for it, then removes everything,
/// children and tail index included. The split's children, installed,
/// refuse appends and rolls through kept handles; later syncs, close and a
/// Strict reopen are clean.
#[test]
fn delete_waits_for_a_parked_tail_split_and_removes_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let log = Arc::new(Log::open_with_hook(dir.path(), opts(), gate.clone()).unwrap());
    let live = log.create_topic("live", cfg(1, SyncPolicy::Never)).unwrap();
    let t = log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
    for i in 0..200u32 {
        t.append(Some(&i.to_le_bytes()), &[7u8; 60]).unwrap();
    }
    log.sync().unwrap();
    let tdir = dir.path().join(format!("topics/t{}", t.id()));
    gate.arm(
        IoOp::SyncNewSegment,
        &format!("topics/t{}/p1", t.id()),
        false,
    );
    let split = {
        let t = t.clone();
        std::thread::spawn(move || {
            t.split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(50))
        })
    };
    assert!(gate.wait_reached(), "the tail split never created a child");
    let (del, done) = delete_in_thread(&log, "t");
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !done.load(Ordering::Acquire),
        "delete_topic did not wait for the tail split holding the change lock"
    );
    gate.open();
    let s = split.join().unwrap();
    let d = del.join().unwrap();
    assert!(s.is_ok(), "tail split started before the delete: {s:?}");
    assert!(d.is_ok(), "delete_topic: {d:?}");
    assert!(!tdir.exists(), "left behind: {:?}", tree(&tdir));
    let kids = s.unwrap().children;
    for k in &kids {
        let p = t.partition(*k).unwrap();
        assert!(
            matches!(p.roll_now(), Err(Error::UnknownTopic(_))),
            "roll of child {k}"
        );
        assert!(t.append_to(*k, &rec(b"x")).is_err(), "append_to child {k}");
    }
    assert!(t.append(Some(b"k"), b"x").is_err());
    assert!(!tdir.exists(), "came back: {:?}", tree(&tdir));
    live.append(None, b"l").unwrap();
    log.sync().unwrap();
    drop((t, live));
    let log = close_reopen_strict(dir.path(), log, "tail split");
    assert_eq!(log.topics(), vec!["live".to_string()]);
    assert_eq!(topic_dirs(dir.path()), vec!["t0".to_string()]);
}

/// Behaviour of live topics kept: a tail split whose children roll many
/// times while they are marked removed (sync rounds run meanwhile and skip
/// them) still moves every record, `Log::sync` and close succeed, and a
/// killed process's directory reopens Strict with every record exactly
/// once.
#[test]
fn tail_split_with_rolling_children_still_works_for_a_live_topic() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(dir.path(), opts()).unwrap());
    let t = log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
    let mut expect = Vec::new();
    for i in 0..600u32 {
        let v = format!("v{i:05}-{}", "x".repeat(40));
        t.append(Some(&i.to_le_bytes()), v.as_bytes()).unwrap();
        expect.push(v.into_bytes());
    }
    expect.sort();
    log.sync().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (log, stop) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut errs = Vec::new();
            while !stop.load(Ordering::Acquire) {
                if let Err(e) = log.sync() {
                    errs.push(e.to_string());
                }
            }
            errs
        })
    };
    let out = t
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(10))
        .unwrap();
    stop.store(true, Ordering::Release);
    let errs = syncer.join().unwrap();
    assert!(errs.is_empty(), "syncs during the split: {errs:?}");
    for k in &out.children {
        assert!(
            t.partition(*k).unwrap().segment_count() > 1,
            "child {k} did not roll: the probe does not test rolls"
        );
    }
    assert_eq!(all_values(&t), expect);
    log.sync().unwrap();
    drop(t);
    let Ok(log) = Arc::try_unwrap(log) else {
        panic!("held")
    };
    log.abandon();
    let log = Log::open(dir.path(), opts()).unwrap();
    assert_eq!(all_values(&log.topic("t").unwrap()), expect);
}

/// A merge parked at its manifest commit holds the change lock (and the
/// topology lock): the delete waits and then removes the merge child too.
/// A hot-key change parked at its commit likewise.
#[test]
fn delete_waits_for_a_parked_merge_and_hot_key_change() {
    for which in ["merge", "hot-key"] {
        let dir = tempfile::tempdir().unwrap();
        let gate = Arc::new(Gate::default());
        let log = Arc::new(Log::open_with_hook(dir.path(), opts(), gate.clone()).unwrap());
        let t = log.create_topic("t", cfg(2, SyncPolicy::Never)).unwrap();
        for i in 0..50u32 {
            t.append(Some(&i.to_le_bytes()), b"v").unwrap();
        }
        let tdir = dir.path().join(format!("topics/t{}", t.id()));
        gate.arm(IoOp::SyncManifest, "", false);
        let change = {
            let t = t.clone();
            std::thread::spawn(move || {
                if which == "merge" {
                    t.merge(0, 1).map(drop)
                } else {
                    t.set_hot_key_mode(b"hot", HotKeyMode::Spread)
                }
            })
        };
        assert!(gate.wait_reached(), "{which}: never committed");
        let (del, done) = delete_in_thread(&log, "t");
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !done.load(Ordering::Acquire),
            "{which}: delete did not wait"
        );
        gate.open();
        let c = change.join().unwrap();
        let d = del.join().unwrap();
        assert!(
            c.is_ok() && d.is_ok(),
            "{which}: change {c:?}, delete {d:?}"
        );
        assert!(!tdir.exists(), "{which}: {:?}", tree(&tdir));
        assert!(t.append(Some(b"hot"), b"x").is_err(), "{which}: hot append");
        assert!(
            t.append_batch(&[
                NewRecord {
                    key: Some(b"hot"),
                    value: b"x",
                    timestamp: None
                },
                NewRecord {
                    key: Some(b"cold"),
                    value: b"y",
                    timestamp: None
                }
            ])
            .is_err(),
            "{which}: batch"
        );
        assert!(!tdir.exists(), "{which}: came back {:?}", tree(&tdir));
        log.sync().unwrap();
        drop(t);
        let log = close_reopen_strict(dir.path(), log, which);
        assert!(log.topics().is_empty());
        assert!(topic_dirs(dir.path()).is_empty(), "{which}");
    }
}

/// A hot-key append parked in the directory fsync of a roll (holding the
/// key's run lock and the partition's writer lock): the delete's
/// `mark_deleted` waits for it, then removes the segment the roll created.
#[test]
fn delete_waits_for_a_hot_key_append_parked_in_a_roll() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let log = Arc::new(Log::open_with_hook(dir.path(), opts(), gate.clone()).unwrap());
    let t = log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
    t.set_hot_key_mode(b"hot", HotKeyMode::Spread).unwrap();
    t.append(Some(b"hot"), b"first").unwrap();
    log.sync().unwrap();
    let p = t.partition(0).unwrap();
    // A roll no sync round fsynced the directory for: the next one does.
    p.roll_now().unwrap();
    let tdir = dir.path().join(format!("topics/t{}", t.id()));
    gate.arm(IoOp::SyncRollDir, "", false);
    let app = {
        let t = t.clone();
        std::thread::spawn(move || {
            // Appends go on until the delete ends them: on a loaded machine
            // the delete may reach the topic only after the gate opened,
            // and a fixed count of appends could all land before it.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                let last = t.append(Some(b"hot"), &[1u8; 100]).map(drop);
                if last.is_err() || std::time::Instant::now() > deadline {
                    break last;
                }
            }
        })
    };
    assert!(gate.wait_reached(), "no roll");
    let (del, _) = delete_in_thread(&log, "t");
    std::thread::sleep(Duration::from_millis(30));
    gate.open();
    let d = del.join().unwrap();
    let a = app.join().unwrap();
    assert!(d.is_ok(), "delete: {d:?}");
    assert!(
        matches!(a, Err(Error::UnknownTopic(_))),
        "appends stop with UnknownTopic: {a:?}"
    );
    assert!(!tdir.exists(), "{:?}", tree(&tdir));
    log.sync().unwrap();
    drop((t, p));
    let log = close_reopen_strict(dir.path(), log, "hot roll");
    assert!(topic_dirs(dir.path()).is_empty(), "{:?}", log.topics());
}

/// C6/C1: a sync round that captured the doomed topic's partition, parked
/// in that partition's segment fdatasync (or directory fsync) while the
/// topic is deleted, then gets EIO for it: the failure poisons nothing the
/// log reports. The round's own caller (an `Always` append of a live
/// topic) succeeds; later `Log::sync`, the live topic's `Always` appends
/// and retention pass, and close all succeed; a Strict reopen is clean.
#[test]
fn eio_on_a_deleted_topics_file_in_a_parked_round_fails_nothing_live() {
    for op in [IoOp::SyncSegment, IoOp::SyncDir] {
        let ctx = format!("{op:?}");
        let dir = tempfile::tempdir().unwrap();
        let gate = Arc::new(Gate::default());
        let log = Arc::new(Log::open_with_hook(dir.path(), opts(), gate.clone()).unwrap());
        let live = log
            .create_topic(
                "live",
                TopicConfig {
                    retention_bytes: Some(8192),
                    ..cfg(1, SyncPolicy::Always)
                },
            )
            .unwrap();
        let t = log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
        log.sync().unwrap();
        t.append(None, b"doomed").unwrap();
        if op == IoOp::SyncDir {
            // A roll since the last round: the round fsyncs the directory.
            t.partition(0).unwrap().roll_now().unwrap();
            t.append(None, b"doomed2").unwrap();
        }
        let needle = format!("topics/t{}/", t.id());
        let needle = if op == IoOp::SyncDir {
            needle.trim_end_matches('/').to_string() + "/p0"
        } else {
            needle
        };
        gate.arm(op, &needle, true);
        let app = {
            let live = live.clone();
            std::thread::spawn(move || live.append(None, b"live-1"))
        };
        assert!(gate.wait_reached(), "{ctx}: round never reached the file");
        log.delete_topic("t").unwrap();
        gate.open();
        let a = app.join().unwrap();
        assert!(a.is_ok(), "{ctx}: live Always append in that round: {a:?}");
        log.sync()
            .unwrap_or_else(|e| panic!("{ctx}: Log::sync after: {e}"));
        for i in 0..100u32 {
            live.append(None, &[i as u8; 200])
                .unwrap_or_else(|e| panic!("{ctx}: live append {i}: {e}"));
        }
        log.enforce_retention()
            .unwrap_or_else(|e| panic!("{ctx}: retention: {e}"));
        drop((t, live));
        let _ = close_reopen_strict(dir.path(), log, &ctx);
        assert_eq!(topic_dirs(dir.path()), vec!["t0".to_string()], "{ctx}");
    }
}

/// A partition of the doomed topic poisoned by a failed round before the
/// delete: `Log::sync` fails until the delete, and succeeds after it.
#[test]
fn failure_recorded_before_the_delete_is_forgotten_by_it() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let log = Arc::new(Log::open_with_hook(dir.path(), opts(), gate.clone()).unwrap());
    let live = log.create_topic("live", cfg(1, SyncPolicy::Never)).unwrap();
    let t = log.create_topic("t", cfg(2, SyncPolicy::Never)).unwrap();
    log.sync().unwrap();
    t.append_to(1, &rec(b"doomed")).unwrap();
    gate.arm(IoOp::SyncSegment, &format!("topics/t{}/p1", t.id()), true);
    gate.open();
    assert!(log.sync().is_err(), "the failed fsync is reported");
    assert!(log.sync().is_err(), "and stays reported");
    log.delete_topic("t").unwrap();
    live.append(None, b"l").unwrap();
    log.sync().unwrap();
    drop((t, live));
    let _ = close_reopen_strict(dir.path(), log, "forgotten");
}

/// A topic of the same name created while the delete is parked in its
/// final directory fsync: the new topic stays in the name map (removed by
/// identity), takes appends, and is the one a reopen finds.
#[test]
fn create_same_name_while_delete_is_parked_keeps_the_new_topic() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let log = Arc::new(Log::open_with_hook(dir.path(), opts(), gate.clone()).unwrap());
    let old = log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
    old.append(None, b"old").unwrap();
    gate.arm(IoOp::SyncNewDir, "topics", false);
    let del = {
        let log = log.clone();
        std::thread::spawn(move || log.delete_topic("t"))
    };
    assert!(gate.wait_reached(), "delete never synced topics/");
    let new = log.create_topic("t", cfg(1, SyncPolicy::Always));
    gate.open();
    let d = del.join().unwrap();
    let new = new.unwrap_or_else(|e| panic!("create while the delete is parked: {e}"));
    assert!(d.is_ok(), "{d:?}");
    let found = log.topic("t").unwrap();
    assert_eq!(found.id(), new.id(), "the name map lost the new topic");
    new.append(None, b"new").unwrap();
    assert!(old.append(None, b"x").is_err());
    assert_eq!(partition_values(&found, 0), vec![b"new".to_vec()]);
    drop((old, new, found));
    let log = close_reopen_strict(dir.path(), log, "recreate");
    let t = log.topic("t").unwrap();
    assert_eq!(partition_values(&t, 0), vec![b"new".to_vec()]);
    assert_eq!(topic_dirs(dir.path()), vec![format!("t{}", t.id())]);
}

/// Concurrent `delete_topic("t")` and `create_topic("t")` (with appends
/// through every handle, syncs and a second deleter), many rounds: a
/// create that succeeds leaves its topic in the name map; the in-memory
/// answer, the manifest after a Strict reopen and the directories agree.
#[test]
fn create_and_delete_of_one_name_race_consistently() {
    let dir = common::log::fast_tempdir();
    let log = Arc::new(Log::open(dir.path(), opts()).unwrap());
    log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
    let t0 = Instant::now();
    for round in 0..60u32 {
        let old = log.topic("t").ok();
        let barrier = Arc::new(std::sync::Barrier::new(3));
        let deleter = {
            let (log, b) = (log.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                log.delete_topic("t")
            })
        };
        let creator = {
            let (log, b) = (log.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                for _ in 0..50 {
                    match log.create_topic("t", cfg(1, SyncPolicy::Never)) {
                        Err(Error::TopicExists(_)) => std::thread::yield_now(),
                        other => return other.map(|t| t.id()),
                    }
                }
                Err(Error::TopicExists("t".into()))
            })
        };
        let appender = {
            let (old, b) = (old.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                if let Some(t) = old {
                    for _ in 0..50 {
                        if t.append(None, b"o").is_err() {
                            break;
                        }
                    }
                }
            })
        };
        let d = deleter.join().unwrap();
        let c = creator.join().unwrap();
        appender.join().unwrap();
        let ctx = format!("round {round}: delete {d:?}, create {c:?}");
        match (&d, &c) {
            (Ok(()), Ok(id)) => {
                let now = log.topic("t").unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(now.id(), *id, "{ctx}");
                now.append(None, b"n").unwrap();
            }
            (Ok(()), Err(_)) => assert!(log.topic("t").is_err(), "{ctx}"),
            _ => panic!("{ctx}"),
        }
        if old
            .as_ref()
            .is_some_and(|o| o.append(None, b"late").is_ok())
        {
            panic!("{ctx}: append through the deleted handle acknowledged");
        }
        if log.topic("t").is_err() {
            log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
        }
        if t0.elapsed() > Duration::from_secs(6) {
            break;
        }
    }
    log.sync().unwrap();
    let id = log.topic("t").unwrap().id();
    let log = close_reopen_strict(dir.path(), log, "race");
    assert_eq!(log.topic("t").unwrap().id(), id);
    assert_eq!(topic_dirs(dir.path()), vec![format!("t{id}")]);
}

/// The balancer thread (`LogOptions { balancer: true }`) splitting a hot
/// topic over and over while the topic is deleted: the delete succeeds,
/// the thread brings no directory back, a live topic the balancer also
/// splits keeps working, syncs succeed, and close and a Strict reopen are
/// clean.
#[test]
fn balancer_thread_splitting_while_the_topic_is_deleted() {
    let dir = common::log::fast_tempdir();
    let o = LogOptions {
        balancer: true,
        ..opts()
    };
    let log = Arc::new(Log::open(dir.path(), o).unwrap());
    let hot = TopicConfig {
        balance: BalancePolicy {
            enabled: true,
            target_records_per_sec: Some(20.0),
            min_age: Duration::ZERO,
            check_interval: Duration::from_millis(1),
            max_partitions: 24,
            ..BalancePolicy::default()
        },
        ..cfg(1, SyncPolicy::Never)
    };
    let live = log.create_topic("live", hot.clone()).unwrap();
    let t = log.create_topic("t", hot).unwrap();
    let events = log.subscribe();
    let stop = Arc::new(AtomicBool::new(false));
    let mut hs = Vec::new();
    for topic in [t.clone(), live.clone()] {
        let stop = stop.clone();
        hs.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Acquire) {
                let _ = topic.append(Some(&(i % 997).to_le_bytes()), b"value");
                i += 1;
            }
        }));
    }
    // Wait for the balancer to split "t" a few times.
    let mut splits = 0;
    let t0 = Instant::now();
    while splits < 3 && t0.elapsed() < Duration::from_secs(5) {
        if let Ok(TopologyEvent::Split { topic, .. }) =
            events.recv_timeout(Duration::from_millis(50))
        {
            if topic == "t" {
                splits += 1;
            }
        }
    }
    assert!(splits >= 3, "the balancer split t {splits} times");
    let tdir = dir.path().join(format!("topics/t{}", t.id()));
    log.delete_topic("t").unwrap();
    assert!(!tdir.exists(), "{:?}", tree(&tdir));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!tdir.exists(), "balancer brought back: {:?}", tree(&tdir));
    log.sync().unwrap();
    stop.store(true, Ordering::Release);
    for h in hs {
        h.join().unwrap();
    }
    let n = all_values(&live).len();
    log.sync().unwrap();
    drop((t, live, events));
    let log = close_reopen_strict(dir.path(), log, "balancer");
    assert_eq!(log.topics(), vec!["live".to_string()]);
    assert_eq!(all_values(&log.topic("live").unwrap()).len(), n);
    assert_eq!(topic_dirs(dir.path()), vec!["t0".to_string()]);
}

/// A retention pass parked at the manifest commit of a `RemovePartition`
/// (holding the change lock): the delete waits, then removes the rest. A
/// partition handle kept from the removed partition refuses rolls; syncs,
/// close and a Strict reopen are clean.
#[test]
fn retention_removal_parked_while_the_topic_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let o = LogOptions {
        checkpoint_interval: Duration::ZERO,
        ..opts()
    };
    let log = Arc::new(Log::open_with_hook(dir.path(), o, gate.clone()).unwrap());
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                retention_age: Some(Duration::from_secs(60)),
                ..cfg(1, SyncPolicy::Never)
            },
        )
        .unwrap();
    let old_ts = fissionlog_now_ms() - 3_600_000;
    for _ in 0..40 {
        t.append_to(
            0,
            &[NewRecord {
                key: None,
                value: &[3u8; 100],
                timestamp: Some(old_ts),
            }],
        )
        .unwrap();
    }
    t.split(0, SplitPlan::Even).unwrap();
    let p0 = t.partition(0).unwrap();
    log.sync().unwrap();
    log.sync().unwrap();
    // Passes until one commits a manifest record (the removal of
    // partition 0), parked there while the topic is deleted.
    let tdir = dir.path().join(format!("topics/t{}", t.id()));
    let mut parked = false;
    for _ in 0..6 {
        gate.arm(IoOp::SyncManifest, "", false);
        let pass = {
            let log = log.clone();
            std::thread::spawn(move || log.enforce_retention())
        };
        let t0 = Instant::now();
        while !gate.reached.load(Ordering::Acquire)
            && !pass.is_finished()
            && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        if gate.reached.load(Ordering::Acquire) {
            parked = true;
            let (del, done) = delete_in_thread(&log, "t");
            std::thread::sleep(Duration::from_millis(30));
            let waited = !done.load(Ordering::Acquire);
            gate.open();
            let r = pass.join().unwrap();
            let d = del.join().unwrap();
            assert!(waited, "delete did not wait for the removal");
            assert!(r.is_ok() && d.is_ok(), "pass {r:?}, delete {d:?}");
            break;
        }
        *gate.armed.lock().unwrap() = None;
        pass.join().unwrap().unwrap();
        log.sync().unwrap();
    }
    assert!(parked, "no pass removed partition 0");
    assert!(t.partition(0).is_err(), "partition 0 was removed");
    assert!(!tdir.exists(), "{:?}", tree(&tdir));
    assert!(p0.roll_now().is_err());
    log.sync().unwrap();
    log.enforce_retention().unwrap();
    drop((t, p0));
    let log = close_reopen_strict(dir.path(), log, "retention");
    assert!(log.topics().is_empty());
    assert!(topic_dirs(dir.path()).is_empty());
}

fn fissionlog_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// C6: `delete_topic` whose final fsync of `topics/` fails: the delete is
/// committed (the name is free, a second delete says `UnknownTopic`), the
/// log stays usable (sync, a new topic of the name), and a Strict reopen
/// after a clean close finds nothing of the old topic.
#[test]
fn delete_whose_topics_dir_fsync_fails_leaves_the_log_usable() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let log = Arc::new(Log::open_with_hook(dir.path(), opts(), gate.clone()).unwrap());
    let t = log.create_topic("t", cfg(2, SyncPolicy::Never)).unwrap();
    t.append(None, b"x").unwrap();
    gate.arm(IoOp::SyncNewDir, "topics", true);
    gate.open();
    let d = log.delete_topic("t");
    assert!(d.is_err(), "the injected fsync failure is reported");
    assert!(matches!(log.delete_topic("t"), Err(Error::UnknownTopic(_))));
    assert!(t.append(None, b"y").is_err());
    log.sync().unwrap();
    let n = log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
    n.append(None, b"new").unwrap();
    drop((t, n));
    let log = close_reopen_strict(dir.path(), log, "failed fsync");
    let n = log.topic("t").unwrap();
    assert_eq!(partition_values(&n, 0), vec![b"new".to_vec()]);
    assert_eq!(topic_dirs(dir.path()), vec![format!("t{}", n.id())]);
}

/// C7: a delete made when both checkpoint files already held the current
/// entries, then a kill: the reopen (Strict) succeeds, reports no file
/// action for the deleted topic, and a second open changes nothing.
#[test]
fn kill_after_delete_with_an_unchanged_checkpoint_reopens_strict() {
    let dir = tempfile::tempdir().unwrap();
    let o = LogOptions {
        checkpoint_interval: Duration::ZERO,
        ..opts()
    };
    let log = Log::open(dir.path(), o.clone()).unwrap();
    let live = log.create_topic("live", cfg(1, SyncPolicy::Never)).unwrap();
    let t = log.create_topic("t", cfg(2, SyncPolicy::Never)).unwrap();
    for i in 0..20u32 {
        t.append(Some(&i.to_le_bytes()), b"v").unwrap();
    }
    live.append(None, b"l").unwrap();
    for _ in 0..4 {
        log.sync().unwrap();
    }
    log.delete_topic("t").unwrap();
    log.sync().unwrap();
    log.sync().unwrap();
    drop((t, live));
    log.abandon();
    let log = Log::open(dir.path(), o.clone()).unwrap();
    let files: Vec<_> = log
        .recovery_report()
        .files
        .iter()
        .map(|f| format!("{f:?}"))
        .collect();
    assert!(
        files.iter().all(|f| !f.contains("topics/t1")),
        "reopen acted on the deleted topic's files: {files:?}"
    );
    assert_eq!(
        partition_values(&log.topic("live").unwrap(), 0),
        vec![b"l".to_vec()]
    );
    log.close().unwrap();
    let log = Log::open(dir.path(), o).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    assert_eq!(topic_dirs(dir.path()), vec!["t0".to_string()]);
}

/// Lock order under load: deletes and creates of one name, appends through
/// fresh and stale handles (hot and cold keys, batches), splits, merges,
/// tail splits, hot-key changes, groups (with lag splits), syncs,
/// retention and balancer passes, all at once. A watchdog fails the probe
/// if the run does not finish (a deadlock); afterwards no directory of a
/// deleted topic remains and a Strict reopen is clean.
#[test]
fn everything_at_once_with_deletes_does_not_deadlock() {
    let dir = common::log::fast_tempdir();
    let log = Arc::new(Log::open(dir.path(), opts()).unwrap());
    let base = TopicConfig {
        retention_bytes: Some(1 << 16),
        ..cfg(2, SyncPolicy::Never)
    };
    log.create_topic("keep", base.clone()).unwrap();
    log.create_topic("t", base.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let current: Arc<Mutex<Option<fissionlog::Topic>>> = Arc::new(Mutex::new(log.topic("t").ok()));
    let mut hs: Vec<std::thread::JoinHandle<Vec<String>>> = Vec::new();
    // Deleter/creator.
    {
        let (log, stop, current, base) = (log.clone(), stop.clone(), current.clone(), base.clone());
        hs.push(std::thread::spawn(move || {
            let mut bad = Vec::new();
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(15));
                if let Err(e) = log.delete_topic("t") {
                    bad.push(format!("delete: {e}"));
                }
                match log.create_topic("t", base.clone()) {
                    Ok(t) => *current.lock().unwrap() = Some(t),
                    Err(e) => bad.push(format!("create: {e}")),
                }
            }
            bad
        }));
    }
    // Appenders and changers over the current (possibly stale) handle.
    for w in 0..3u32 {
        let (log, stop, current, ops) = (log.clone(), stop.clone(), current.clone(), ops.clone());
        hs.push(std::thread::spawn(move || {
            let mut i = 0u32;
            let keep = log.topic("keep").unwrap();
            while !stop.load(Ordering::Acquire) {
                let Some(t) = current.lock().unwrap().clone() else {
                    continue;
                };
                for topic in [&t, &keep] {
                    let key = (i % 11).to_le_bytes();
                    match (w, i % 8) {
                        (0, _) => {
                            let _ = topic.append(Some(&key), &[1u8; 64]);
                            let _ = topic.append_batch(&[
                                NewRecord {
                                    key: Some(b"hot"),
                                    value: b"h",
                                    timestamp: None,
                                },
                                NewRecord {
                                    key: Some(&key),
                                    value: b"c",
                                    timestamp: None,
                                },
                            ]);
                        }
                        (1, 0) => {
                            let ids = topic.active_partitions();
                            if ids.len() > 4 {
                                let _ = topic.merge(ids[0], ids[1]);
                            } else {
                                let _ = topic.split(ids[0], SplitPlan::Even);
                            }
                        }
                        (1, 1) => {
                            let ids = topic.active_partitions();
                            let _ = topic.split_tail(
                                ids[ids.len() - 1],
                                SplitPlan::Even,
                                TailSplitOptions::from_offset(0),
                            );
                        }
                        (1, 2) => {
                            let mode = if i % 16 == 2 {
                                HotKeyMode::Spread
                            } else {
                                HotKeyMode::Strict
                            };
                            let _ = topic.set_hot_key_mode(b"hot", mode);
                        }
                        (1, _) => {
                            let _ = topic.append(Some(b"hot"), b"h");
                        }
                        (2, _) => {
                            if let Ok(g) = topic.group("g", GroupOptions::default()) {
                                if let Ok(mut m) = g.join(common::groups::member_opts()) {
                                    let _ = m.poll(20);
                                    let _ = m.commit();
                                }
                            }
                            let _ = poll_once(topic.durable(0, 0));
                        }
                        _ => {}
                    }
                }
                ops.fetch_add(1, Ordering::AcqRel);
                i += 1;
            }
            Vec::new()
        }));
    }
    // Log-wide work.
    {
        let (log, stop) = (log.clone(), stop.clone());
        hs.push(std::thread::spawn(move || {
            let mut bad = Vec::new();
            while !stop.load(Ordering::Acquire) {
                if let Err(e) = log.sync() {
                    bad.push(format!("sync: {e}"));
                }
                if let Err(e) = log.enforce_retention() {
                    bad.push(format!("retention: {e}"));
                }
                if let Err(e) = log.balance_now() {
                    bad.push(format!("balance: {e}"));
                }
            }
            bad
        }));
    }
    let runner = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(2500));
        stop.store(true, Ordering::Release);
        hs.into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect::<Vec<String>>()
    });
    let bad = match join_within(runner, Duration::from_secs(8)) {
        Some(r) => r.unwrap(),
        None => panic!(
            "deadlock or hang: threads still running 5.5 s after stop ({} ops)",
            ops.load(Ordering::Acquire)
        ),
    };
    assert!(bad.is_empty(), "{bad:?}");
    let live_id = log.topic("t").map(|t| t.id()).ok();
    *current.lock().unwrap() = None;
    log.sync().unwrap();
    let log = close_reopen_strict(dir.path(), log, "everything");
    let mut want = vec!["t0".to_string()];
    if let Some(id) = live_id {
        want.push(format!("t{id}"));
    }
    want.sort();
    assert_eq!(topic_dirs(dir.path()), want, "{:?}", log.topics());
}

/// A waker that, the first time it is woken, reports it and blocks until
/// released: woken inline by a sync round (`Partition::poison` notifies the
/// partition's `Durable` futures), it holds the round at that point.
#[derive(Debug, Default)]
struct BlockingWaker {
    woken: AtomicBool,
    release: AtomicBool,
}

impl std::task::Wake for BlockingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.woken.swap(true, Ordering::AcqRel) {
            let t = Instant::now();
            while !self.release.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// C6 (a live log's syncs failing because of a deleted topic): a sync round
/// whose fdatasync of the doomed topic's segment fails checks
/// `is_removed()` (false), then poisons the partition; `Partition::poison`
/// wakes the partition's `Durable` futures inline, and only then does
/// `poison_partition` insert the failure into `failed_partitions`. A delete
/// that runs in between (here while a future's waker runs; in production a
/// preemption) marks the partition deleted and forgets the topic's
/// failures before the insert. Expected: once the delete returned, the
/// log's `Log::sync` and close succeed. Found: every later `Log::sync`
/// fails with `Poisoned` naming the deleted topic until reopen, and close
/// fails (not clean).
#[test]
fn failure_inserted_after_the_delete_forgot_fails_later_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let log = Arc::new(Log::open_with_hook(dir.path(), opts(), gate.clone()).unwrap());
    let live = log.create_topic("live", cfg(1, SyncPolicy::Never)).unwrap();
    let t = log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
    log.sync().unwrap();
    t.append(None, b"doomed").unwrap();
    // A future waiting on the doomed partition: its waker runs in the round.
    let waker = Arc::new(BlockingWaker::default());
    let w = std::task::Waker::from(waker.clone());
    let mut fut = Box::pin(t.durable(0, 1_000));
    let mut cx = std::task::Context::from_waker(&w);
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    gate.arm(IoOp::SyncSegment, &format!("topics/t{}/p0", t.id()), true);
    gate.open();
    let round = {
        let log = log.clone();
        std::thread::spawn(move || log.sync())
    };
    assert!(
        common::faults::wait_flag(&waker.woken, Duration::from_secs(5)),
        "the failed round never poisoned the partition"
    );
    // The round is inside `poison_partition`: past its `is_removed` check,
    // before its insert.
    log.delete_topic("t").unwrap();
    waker.release.store(true, Ordering::Release);
    let _ = round.join().unwrap();
    live.append(None, b"l").unwrap();
    let s = log.sync();
    drop((t, live, fut));
    let Ok(log) = Arc::try_unwrap(log) else {
        panic!("held")
    };
    let c = log.close();
    let log = Log::open(dir.path(), opts()).unwrap();
    let clean = log.recovery_report().clean_shutdown;
    assert!(
        s.is_ok() && c.is_ok() && clean,
        "Log::sync after the delete returned: {s:?}; close: {c:?}; clean: {clean}"
    );
}
