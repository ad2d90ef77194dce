//! The topic lifecycle: `Log::create_topic`,
//! `Log::delete_topic`, a topic created again under a deleted one's name,
//! handles of a deleted topic, crashes and power losses in between, many
//! create/delete cycles, and bad configurations.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::crash::CrashOptions;
use common::futures::poll_once;
use common::lifecycle::{cfg, opts, partition_values, topic_dirs, tree, Gate};
use common::log::rec;
use common::model_hook::ModelHook;
use fissionlog::{
    Error, GroupOptions, HotKeyMode, HotKeyPolicy, IoHook, IoOp, Log, LogOptions, NewRecord,
    SplitPlan, StartAt, SyncPolicy, TailSplitOptions, TopicConfig,
};

/// Copies a directory tree (what a killed process leaves: the page cache).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        let q = to.join(e.file_name());
        if p.is_dir() {
            copy_tree(&p, &q);
        } else if e.file_name() != "fissionlog.lock" {
            // A file removed while we copy is simply not in the copy.
            if let Ok(bytes) = std::fs::read(&p) {
                std::fs::write(&q, bytes).unwrap();
            }
        }
    }
}

/// Builds an old topic `t` with history: records in two partitions, a
/// forward split, a committed group position, a hot-key mode.
fn old_topic_with_history(log: &Log) -> fissionlog::Topic {
    let t = log.create_topic("t", cfg(2, SyncPolicy::Never)).unwrap();
    for i in 0..40u32 {
        t.append(Some(format!("k{}", i % 5).as_bytes()), b"old-record")
            .unwrap();
    }
    t.split(0, SplitPlan::Even).unwrap();
    for i in 0..10u32 {
        t.append(Some(format!("k{}", i % 5).as_bytes()), b"old-after-split")
            .unwrap();
    }
    t.set_hot_key_mode(b"k1", HotKeyMode::Spread).unwrap();
    let g = t.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(common::groups::member_opts()).unwrap();
    let _ = m.poll(1000).unwrap();
    m.commit().unwrap();
    drop(m);
    log.sync().unwrap();
    t
}

/// Checks that `t` (named "t") is a fresh one-partition topic.
fn assert_fresh(t: &fissionlog::Topic, ctx: &str) {
    let ids: Vec<u32> = t.partitions().iter().map(|p| p.id).collect();
    assert_eq!(ids, vec![0], "{ctx}: partitions of the new topic");
    let p = t.partition(0).unwrap();
    assert_eq!((p.start_offset(), p.end_offset()), (0, 0), "{ctx}: offsets");
    assert!(t.groups().is_empty(), "{ctx}: groups {:?}", t.groups());
    assert_eq!(
        t.hot_key_mode(b"k1"),
        HotKeyMode::Strict,
        "{ctx}: hot-key mode of the old topic"
    );
    assert!(
        t.hot_keys().is_empty(),
        "{ctx}: hot keys {:?}",
        t.hot_keys()
    );
    let chain = t.key_chain(b"k1");
    assert_eq!(chain.len(), 1, "{ctx}: key chain {chain:?}");
    assert!(t.read_key(b"k1").unwrap().is_empty(), "{ctx}: read_key");
    let mut r = t.reader(StartAt::Earliest).unwrap();
    assert!(r.poll(100).unwrap().is_empty(), "{ctx}: reader");
    assert!(t.partition(1).is_err(), "{ctx}: old partition 1 visible");
}

/// C2/C8: a topic deleted and created again under the same name (no
/// reopen, then after a clean reopen, then after a crash image) shows
/// nothing of the old one: no records, offsets, partitions, group
/// positions, hot-key modes or key chain.
#[test]
fn recreated_topic_shows_nothing_of_the_deleted_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let old = old_topic_with_history(&log);
    log.delete_topic("t").unwrap();
    let t = log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
    assert_fresh(&t, "same run");
    // A group of the same name starts from scratch.
    let g = t.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(common::groups::member_opts()).unwrap();
    assert!(m.poll(100).unwrap().is_empty());
    drop(m);
    drop(g);
    t.append(None, b"new").unwrap();
    drop(old);
    drop(t);
    log.close().unwrap();

    let log = Log::open(dir.path(), opts()).unwrap();
    let t = log.topic("t").unwrap();
    assert_eq!(partition_values(&t, 0), vec![b"new".to_vec()]);
    assert!(t.partition(1).is_err());
    assert_eq!(t.hot_key_mode(b"k1"), HotKeyMode::Strict);
    assert_eq!(topic_dirs(dir.path()), vec!["t1".to_string()]);
    drop(t);
    log.abandon();

    // Killed: page cache as is.
    let log = Log::open(dir.path(), opts()).unwrap();
    let t = log.topic("t").unwrap();
    assert_eq!(partition_values(&t, 0), vec![b"new".to_vec()]);
    assert_eq!(t.groups(), vec!["g".to_string()]);
    let ids: Vec<u32> = t.partitions().iter().map(|p| p.id).collect();
    assert_eq!(ids, vec![0]);
}

/// Copies the log directory at chosen points of the engine's I/O: after
/// the manifest fsync of the n-th (armed) commit, and before the directory
/// fsync of `topics/` that follows a delete.
/// (Its own hook: it copies the directory at a call, which the kit cannot.)
#[derive(Default)]
struct Snapshotter {
    root: PathBuf,
    armed: AtomicBool,
    shots: Mutex<Vec<(String, tempfile::TempDir)>>,
}

impl std::fmt::Debug for Snapshotter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Snapshotter")
    }
}

impl Snapshotter {
    fn shoot(&self, what: &str) {
        let to = tempfile::tempdir().unwrap();
        copy_tree(&self.root, to.path());
        self.shots.lock().unwrap().push((what.to_string(), to));
    }
}

impl IoHook for Snapshotter {
    fn before(&self, op: IoOp, path: &Path) -> std::io::Result<()> {
        if self.armed.load(Ordering::Acquire) && op == IoOp::SyncNewDir && path.ends_with("topics")
        {
            self.shoot("before the topics/ fsync");
        }
        Ok(())
    }

    fn after(&self, op: IoOp, _: &Path, result: std::io::Result<()>) -> std::io::Result<()> {
        if self.armed.load(Ordering::Acquire) && op == IoOp::SyncManifest && result.is_ok() {
            self.shoot("after the manifest fsync");
        }
        result
    }
}

/// C6/C7: a process killed after `delete_topic`'s manifest record is
/// durable but before (or while) its directory is removed leaves a log a
/// Strict open accepts: the topic is gone, its files are removed as
/// orphans, the other topic keeps every record, and a second open changes
/// nothing. Also with only some of the deleted topic's files left (a
/// removal cut short) and with the delete's record followed by a create
/// of the same name.
#[test]
fn kill_between_delete_record_and_directory_removal_opens_strict() {
    let dir = tempfile::tempdir().unwrap();
    let snap = Arc::new(Snapshotter {
        root: dir.path().to_path_buf(),
        ..Default::default()
    });
    let log = Log::open_with_hook(dir.path(), opts(), snap.clone()).unwrap();
    let a = log.create_topic("a", cfg(2, SyncPolicy::Never)).unwrap();
    let b = log.create_topic("b", cfg(1, SyncPolicy::Never)).unwrap();
    for i in 0..100u32 {
        a.append(Some(&i.to_le_bytes()), &[b'a'; 200]).unwrap();
        b.append(None, format!("b{i}").as_bytes()).unwrap();
    }
    log.sync().unwrap();
    snap.armed.store(true, Ordering::Release);
    log.delete_topic("a").unwrap();
    // The create of the same name: its commit is snapshotted too.
    let a2 = log.create_topic("a", cfg(1, SyncPolicy::Never)).unwrap();
    snap.armed.store(false, Ordering::Release);
    drop((a, a2, b));
    log.close().unwrap();
    let shots = std::mem::take(&mut *snap.shots.lock().unwrap());
    assert!(shots.len() >= 3, "shots: {}", shots.len());
    let want_b: Vec<Vec<u8>> = (0..100u32).map(|i| format!("b{i}").into_bytes()).collect();
    let mut variants = Vec::new();
    for (what, d) in &shots {
        variants.push((what.clone(), d.path().to_path_buf(), false));
        variants.push((what.clone(), d.path().to_path_buf(), true));
    }
    for (what, d, cut_short) in variants {
        let work = tempfile::tempdir().unwrap();
        copy_tree(&d, work.path());
        if cut_short {
            // Half of the deleted topic's files already gone.
            let t0 = work.path().join("topics/t0");
            for (i, f) in tree(&t0).into_iter().rev().enumerate() {
                let p = t0.join(&f);
                if i.is_multiple_of(2) && p.is_file() {
                    std::fs::remove_file(&p).unwrap();
                }
            }
        }
        let ctx = format!("{what}, cut short {cut_short}");
        let log = Log::open(work.path(), opts())
            .unwrap_or_else(|e| panic!("{ctx}: Strict open fails: {e}"));
        let b = log.topic("b").unwrap();
        assert_eq!(partition_values(&b, 0), want_b, "{ctx}: topic b");
        if let Ok(a) = log.topic("a") {
            assert_eq!(a.id(), 2, "{ctx}: old topic a is back");
            assert_eq!(a.partition(0).unwrap().end_offset(), 0, "{ctx}");
        }
        assert!(
            !work.path().join("topics/t0").exists(),
            "{ctx}: the deleted topic's directory stays"
        );
        drop(b);
        log.close().unwrap();
        let before = tree(work.path());
        let log = Log::open(work.path(), opts()).unwrap();
        assert!(
            log.recovery_report().files.is_empty(),
            "{ctx}: second open changed {:?}",
            log.recovery_report().files
        );
        log.close().unwrap();
        assert_eq!(before, tree(work.path()), "{ctx}: second open");
    }
}

/// C1/C6: power-loss images at every I/O step of `delete_topic` and of a
/// following `create_topic` of the same name (per-file crash model) open
/// Strict; the other topic keeps every synced record; topic `t` is either
/// the old one with all its synced records, or a fresh one, or absent;
/// no directory of an unknown topic stays after the open.
#[test]
fn power_loss_during_delete_and_recreate_opens_strict() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    model.grant_segment_headers(true);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    let t = log.create_topic("t", cfg(2, SyncPolicy::Never)).unwrap();
    let o = log.create_topic("o", cfg(1, SyncPolicy::Never)).unwrap();
    for i in 0..60u32 {
        t.append(Some(&i.to_le_bytes()), &[b't'; 100]).unwrap();
        o.append(None, format!("o{i}").as_bytes()).unwrap();
    }
    log.sync().unwrap();
    let t_ends: Vec<u64> = (0..2)
        .map(|p| t.partition(p).unwrap().end_offset())
        .collect();
    model.record_steps(true);
    log.delete_topic("t").unwrap();
    let t2 = log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
    t2.append(None, b"new").unwrap();
    log.sync().unwrap();
    model.record_steps(false);
    let mut points = model.take_steps();
    points.push(model.now(IoOp::SyncSegment));
    drop((t, t2, o));
    log.abandon();
    let want_o: Vec<Vec<u8>> = (0..60u32).map(|i| format!("o{i}").into_bytes()).collect();
    let mut opened = 0;
    for (k, point) in points.iter().enumerate() {
        for seed in 0..3u64 {
            let (image, _) = point.image(seed, &CrashOptions::default());
            let out = tempfile::tempdir().unwrap();
            image.write_to(out.path()).unwrap();
            let ctx = format!(
                "step {k} ({:?} {}), seed {seed}",
                point.op,
                point.path.display()
            );
            let l = Log::open(out.path(), opts())
                .unwrap_or_else(|e| panic!("{ctx}: Strict open fails: {e}"));
            opened += 1;
            assert_eq!(partition_values(&l.topic("o").unwrap(), 0), want_o, "{ctx}");
            let live: Vec<String> = l
                .topics()
                .iter()
                .map(|n| format!("t{}", l.topic(n).unwrap().id()))
                .collect();
            let mut live_sorted = live.clone();
            live_sorted.sort();
            assert_eq!(topic_dirs(out.path()), live_sorted, "{ctx}: topic dirs");
            if let Ok(t) = l.topic("t") {
                if t.id() == 0 {
                    for (p, &end) in t_ends.iter().enumerate() {
                        let got = t.partition(p as u32).unwrap().end_offset();
                        assert_eq!(got, end, "{ctx}: old topic partition {p}");
                    }
                } else {
                    let vals = partition_values(&t, 0);
                    assert!(
                        vals.is_empty() || vals == vec![b"new".to_vec()],
                        "{ctx}: new topic holds {vals:?}"
                    );
                    assert!(t.partition(1).is_err(), "{ctx}");
                }
            }
        }
    }
    assert!(opened > 10, "only {opened} images");
}

/// C6: every call through the handles of a deleted topic (topic, partition,
/// reader, key reader, group, member, `Durable`) returns (no panic, no
/// hang); every write, topology change and group change is an `Err`, never
/// an acknowledgement; nothing of it reaches the disk; the log's own syncs
/// and its clean close still succeed and a reopen finds nothing of it.
#[test]
fn deleted_topic_handles_answer_with_errors_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    for sync in [SyncPolicy::Never, SyncPolicy::Always] {
        let name = format!("t-{sync:?}");
        let t = log.create_topic(&name, cfg(2, sync)).unwrap();
        for i in 0..30u32 {
            t.append(Some(&i.to_le_bytes()), b"v").unwrap();
        }
        log.sync().unwrap();
        let part = t.partition(0).unwrap();
        let mut reader = t.reader(StartAt::Earliest).unwrap();
        let mut key_reader = t.key_reader(&0u32.to_le_bytes());
        let g = t.group("g", GroupOptions::default()).unwrap();
        let mut m = g.join(common::groups::member_opts()).unwrap();
        let fut_old = t.durable(0, 0);
        let fut_new = t.durable(0, 1_000);
        log.delete_topic(&name).unwrap();

        let ctx = format!("{sync:?}");
        assert!(
            t.append(Some(b"k"), b"x").is_err(),
            "{ctx}: append acknowledged"
        );
        assert!(t.append(None, b"x").is_err(), "{ctx}: keyless append");
        assert!(
            t.append_batch(&[NewRecord {
                key: Some(b"k"),
                value: b"x",
                timestamp: None
            }])
            .is_err(),
            "{ctx}: append_batch acknowledged"
        );
        assert!(t.append_to(1, &rec(b"x")).is_err(), "{ctx}: append_to");
        assert!(t.split(0, SplitPlan::Even).is_err(), "{ctx}: split");
        assert!(t.merge(0, 1).is_err(), "{ctx}: merge");
        assert!(
            t.split_tail(1, SplitPlan::Even, TailSplitOptions::from_offset(0))
                .is_err(),
            "{ctx}: split_tail"
        );
        assert!(
            t.set_hot_key_mode(b"k", HotKeyMode::Spread).is_err(),
            "{ctx}: set_hot_key_mode"
        );
        assert!(
            t.group("g2", GroupOptions::default()).is_err(),
            "{ctx}: group"
        );
        assert!(t.delete_group("g").is_err(), "{ctx}: delete_group");
        let _ = m.heartbeat();
        let _ = m.poll(10);
        assert!(m.commit().is_err(), "{ctx}: member commit acknowledged");
        assert!(
            m.commit_positions(&[(0, 1)]).is_err(),
            "{ctx}: commit_positions acknowledged"
        );
        let _ = g.join(common::groups::member_opts());
        // Reads: whatever they say, they return.
        let _ = reader.poll(10);
        let _ = key_reader.next();
        let _ = part.read(0, 1 << 10);
        let _ = part.wait_for(1_000, Duration::from_millis(1));
        let _ = t.partitions();
        let _ = t.key_chain(b"k");
        let _ = t.reader(StartAt::Earliest);
        assert!(
            matches!(poll_once(fut_old), Some(Err(_))),
            "{ctx}: durable() of an old offset"
        );
        assert!(
            matches!(poll_once(fut_new), Some(Err(_))),
            "{ctx}: durable() of a future offset"
        );
        assert!(
            !dir.path().join(format!("topics/t{}", t.id())).exists(),
            "{ctx}: deleted topic directory came back: {:?}",
            tree(&dir.path().join(format!("topics/t{}", t.id())))
        );
        log.sync()
            .unwrap_or_else(|e| panic!("{ctx}: Log::sync after the calls: {e}"));
    }
    log.close().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    assert!(log.topics().is_empty(), "{:?}", log.topics());
    assert!(log.recovery_report().clean_shutdown);
    assert!(
        topic_dirs(dir.path()).is_empty(),
        "{:?}",
        topic_dirs(dir.path())
    );
}

/// C6/C1: a partition handle of a deleted topic whose writer still had a
/// roll pending a directory fsync (one roll since the last sync round)
/// rolls again (`Partition::roll_now`, or an append through the handle
/// that fills the segment): the roll's directory fsync fails on the
/// removed directory. Expected: that call fails, and nothing else: the
/// log's later `Log::sync` calls succeed and its close is clean (the
/// partition is no part of the log any more).
#[test]
fn roll_through_a_deleted_topic_handle_does_not_fail_later_log_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let live = log.create_topic("live", cfg(1, SyncPolicy::Never)).unwrap();
    let t = log.create_topic("t", cfg(1, SyncPolicy::Never)).unwrap();
    t.append(None, b"one").unwrap();
    log.sync().unwrap();
    let p = t.partition(0).unwrap();
    // A roll nobody synced the directory for.
    p.roll_now().unwrap();
    t.append(None, b"two").unwrap();
    log.delete_topic("t").unwrap();
    let r = p.roll_now();
    assert!(
        matches!(r, Err(Error::UnknownTopic(_))),
        "a roll through the deleted topic's partition is refused before it writes: {r:?}"
    );
    live.append(None, b"live").unwrap();
    let s = log.sync();
    drop((t, p, live));
    let c = log.close();
    let log = Log::open(dir.path(), opts()).unwrap();
    let clean = log.recovery_report().clean_shutdown;
    assert!(
        s.is_ok() && c.is_ok() && clean,
        "Log::sync after the roll: {s:?}; close: {c:?}; next open sees a clean close: {clean}"
    );
}

/// C6 (misreport): a retention pass that planned its cuts before a topic
/// was deleted, and deletes the segments after (`retire_segments` syncs in
/// between, gated here at its checkpoint fsync). Expected: the pass
/// succeeds and still deletes the live topic's retired segments; the
/// deleted topic's files (gone with its directory) are not an error.
#[test]
fn retention_pass_racing_delete_topic_still_retires_the_live_topic() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let o = LogOptions {
        checkpoint_interval: Duration::ZERO,
        ..opts()
    };
    let log = Arc::new(Log::open_with_hook(dir.path(), o, gate.clone()).unwrap());
    let c = TopicConfig {
        retention_bytes: Some(8192),
        ..cfg(1, SyncPolicy::Never)
    };
    // "a" sorts before "b": its partitions come first in the pass.
    let a = log.create_topic("a", c.clone()).unwrap();
    let b = log.create_topic("b", c).unwrap();
    for _ in 0..200u32 {
        a.append(None, &[b'a'; 200]).unwrap();
        b.append(None, &[b'b'; 200]).unwrap();
    }
    log.sync().unwrap();
    log.sync().unwrap();
    let b_segs = b.partition(0).unwrap().segment_count();
    assert!(b_segs > 5, "{b_segs} segments");
    // A first pass only moves the checkpointed floors (it deletes nothing).
    assert_eq!(log.enforce_retention().unwrap(), 0);
    log.sync().unwrap();
    gate.arm(IoOp::SyncCheckpoint, "", false);
    let pass = {
        let log = log.clone();
        std::thread::spawn(move || log.enforce_retention())
    };
    assert!(gate.wait_reached(), "the pass never synced");
    log.delete_topic("a").unwrap();
    gate.open();
    let r = pass.join().unwrap();
    let after = b.partition(0).unwrap().segment_count();
    assert!(
        r.is_ok() && after < b_segs,
        "retention pass: {r:?}; topic b segments {b_segs} -> {after}"
    );
}

/// C7: 150 create/append/group/delete cycles of one name, then a reopen:
/// the directory holds no file of any deleted topic (it does not grow
/// with the cycles), the open is fast and reports nothing to repair,
/// `fissionlog verify --json` (the binary) and `verify()` find no problem,
/// and a topic of the same name created afterwards is empty.
#[test]
fn many_create_delete_cycles_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let keep = log.create_topic("keep", cfg(1, SyncPolicy::Never)).unwrap();
    let mut after_first = None;
    for i in 0..150u32 {
        let sync = if i.is_multiple_of(3) {
            SyncPolicy::Always
        } else {
            SyncPolicy::Never
        };
        let t = log.create_topic("c", cfg(2, sync)).unwrap();
        for j in 0..10u32 {
            t.append(Some(&j.to_le_bytes()), b"cycle").unwrap();
        }
        if i.is_multiple_of(10) {
            let g = t.group("g", GroupOptions::default()).unwrap();
            let mut m = g.join(common::groups::member_opts()).unwrap();
            let _ = m.poll(100).unwrap();
            m.commit().unwrap();
        }
        keep.append(None, format!("keep{i}").as_bytes()).unwrap();
        log.delete_topic("c").unwrap();
        if i == 0 {
            let n = tree(dir.path())
                .iter()
                .filter(|f| !f.starts_with("topics/t0") && !f.starts_with("manifest.snap"))
                .count();
            after_first = Some(n);
        }
    }
    let files = tree(dir.path());
    let others: Vec<&PathBuf> = files
        .iter()
        .filter(|f| !f.starts_with("topics/t0") && !f.starts_with("manifest.snap"))
        .collect();
    assert!(
        others.len() <= after_first.unwrap(),
        "the directory grew with the cycles: {} entries after one, now {others:?}",
        after_first.unwrap(),
    );
    drop(keep);
    log.close().unwrap();
    let t = Instant::now();
    let log = Log::open(dir.path(), opts()).unwrap();
    let took = t.elapsed();
    assert!(took < Duration::from_secs(2), "open took {took:?}");
    assert!(
        log.recovery_report().files.is_empty(),
        "{:?}",
        log.recovery_report().files
    );
    assert_eq!(log.topics(), vec!["keep".to_string()]);
    let c = log.create_topic("c", cfg(1, SyncPolicy::Never)).unwrap();
    assert_eq!(c.partition(0).unwrap().end_offset(), 0);
    assert!(c.groups().is_empty());
    drop(c);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fissionlog"))
        .args(["verify", "--dir"])
        .arg(dir.path())
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "verify: {:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// C6: `create_topic` with a bad name or configuration returns a typed
/// error (`InvalidTopicName` / `InvalidConfig`) and writes nothing: the
/// directory tree and the manifest bytes are unchanged, and the next
/// valid topic still gets the next id (no id was taken).
#[test]
fn bad_create_topic_is_a_typed_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let base = cfg(1, SyncPolicy::Never);
    let before = tree(dir.path());
    let manifest_before = std::fs::read(dir.path().join("manifest.log")).ok();
    let long = "x".repeat(250);
    for name in [
        "",
        ".",
        "..",
        "a/b",
        "../x",
        "a b",
        long.as_str(),
        "é",
        "a\0b",
    ] {
        let r = log.create_topic(name, base.clone());
        assert!(
            matches!(r, Err(Error::InvalidTopicName { .. })),
            "{name:?}: {r:?}"
        );
    }
    let bad_configs: Vec<(&str, TopicConfig)> = vec![
        (
            "0 partitions",
            TopicConfig {
                partitions: 0,
                ..base.clone()
            },
        ),
        (
            "65537 partitions",
            TopicConfig {
                partitions: 65_537,
                ..base.clone()
            },
        ),
        (
            "u32::MAX partitions",
            TopicConfig {
                partitions: u32::MAX,
                ..base.clone()
            },
        ),
        (
            "segment_bytes 0",
            TopicConfig {
                segment_bytes: 0,
                ..base.clone()
            },
        ),
        (
            "segment_bytes 4095",
            TopicConfig {
                segment_bytes: 4095,
                ..base.clone()
            },
        ),
        (
            "segment_bytes 2^32 + 1",
            TopicConfig {
                segment_bytes: (1 << 32) + 1,
                ..base.clone()
            },
        ),
        (
            "segment_bytes u64::MAX",
            TopicConfig {
                segment_bytes: u64::MAX,
                ..base.clone()
            },
        ),
        (
            "index_interval_bytes 0",
            TopicConfig {
                index_interval_bytes: 0,
                ..base.clone()
            },
        ),
        (
            "max_record_bytes 0",
            TopicConfig {
                max_record_bytes: 0,
                ..base.clone()
            },
        ),
        (
            "sync interval 0",
            TopicConfig {
                sync: SyncPolicy::Interval(Duration::ZERO),
                ..base.clone()
            },
        ),
        (
            "max_partitions below min_partitions",
            TopicConfig {
                balance: fissionlog::BalancePolicy {
                    min_partitions: 4,
                    max_partitions: 3,
                    ..Default::default()
                },
                ..base.clone()
            },
        ),
        (
            "min_partitions 0",
            TopicConfig {
                balance: fissionlog::BalancePolicy {
                    min_partitions: 0,
                    ..Default::default()
                },
                ..base.clone()
            },
        ),
        (
            "max_lanes 0",
            TopicConfig {
                hot_keys: HotKeyPolicy {
                    max_lanes: 0,
                    ..base.hot_keys.clone()
                },
                ..base.clone()
            },
        ),
    ];
    for (what, c) in bad_configs {
        let r = log.create_topic("t", c);
        assert!(matches!(r, Err(Error::InvalidConfig(_))), "{what}: {r:?}");
    }
    assert!(log.topics().is_empty());
    assert_eq!(tree(dir.path()), before, "files changed");
    assert_eq!(
        std::fs::read(dir.path().join("manifest.log")).ok(),
        manifest_before,
        "the manifest changed"
    );
    // Edges that are valid: a 1-byte-above-minimum segment, the largest one.
    for (n, segment_bytes) in [(0u32, 4096u64), (1, 1 << 32)] {
        let t = log
            .create_topic(
                &format!("ok{n}"),
                TopicConfig {
                    segment_bytes,
                    ..base.clone()
                },
            )
            .unwrap_or_else(|e| panic!("segment_bytes {segment_bytes}: {e}"));
        assert_eq!(t.id(), n, "a refused create took a topic id");
        t.append(None, b"x").unwrap();
    }
    // An existing name: TopicExists, nothing written.
    let before = tree(dir.path());
    assert!(matches!(
        log.create_topic("ok0", base.clone()),
        Err(Error::TopicExists(_))
    ));
    assert_eq!(tree(dir.path()), before);
    log.close().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    assert_eq!(log.topics().len(), 2);
}

/// C1/C6 (race, bounded luck: 6 rounds per policy): `delete_topic` while
/// appenders (single and batch), `Log::sync`, group commits, hot-key mode
/// changes, merges and tail splits run on the topic. Expected: no panic or
/// hang; no append *started* after `delete_topic` returned is
/// acknowledged; every `Log::sync` succeeds (the other topic is healthy);
/// after the threads stop no file of the deleted topic exists; the close
/// is clean and a Strict reopen has the other topic's records only.
#[test]
fn delete_topic_racing_appends_syncs_and_changes() {
    race_delete(4096);
}

/// [`delete_topic_racing_appends_syncs_and_changes`] with 1 MiB segments:
/// no append rolls during the run, so no file is created while the
/// directory is removed. Same expectations (bounded luck: 6 rounds per
/// policy).
#[test]
fn delete_topic_racing_appends_syncs_and_changes_without_rolls() {
    race_delete(1 << 20);
}

fn race_delete(segment_bytes: u64) {
    for sync in [SyncPolicy::Always, SyncPolicy::Never] {
        for round in 0..6u32 {
            let ctx = format!("{sync:?} round {round}");
            let dir = tempfile::tempdir().unwrap();
            let log = Arc::new(Log::open(dir.path(), opts()).unwrap());
            let other = log.create_topic("o", cfg(1, SyncPolicy::Never)).unwrap();
            let t = log
                .create_topic(
                    "t",
                    TopicConfig {
                        segment_bytes,
                        ..cfg(2, sync)
                    },
                )
                .unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let progress = Arc::new(AtomicU64::new(0));
            let deleted_at: Arc<Mutex<Option<Instant>>> = Arc::default();
            let mut hs: Vec<std::thread::JoinHandle<Vec<String>>> = Vec::new();
            for w in 0..2u32 {
                let (t, stop, progress, deleted_at) = (
                    t.clone(),
                    stop.clone(),
                    progress.clone(),
                    deleted_at.clone(),
                );
                hs.push(std::thread::spawn(move || {
                    let mut bad = Vec::new();
                    let mut i = 0u32;
                    while !stop.load(Ordering::Acquire) {
                        let started = Instant::now();
                        let key = (i % 7).to_le_bytes();
                        let r = if w == 0 {
                            t.append(Some(&key), b"v").map(|_| ())
                        } else {
                            t.append_batch(&[
                                NewRecord {
                                    key: Some(&key),
                                    value: b"v",
                                    timestamp: None,
                                },
                                NewRecord {
                                    key: None,
                                    value: b"w",
                                    timestamp: None,
                                },
                            ])
                            .map(|_| ())
                        };
                        progress.fetch_add(1, Ordering::AcqRel);
                        let del = *deleted_at.lock().unwrap();
                        if r.is_ok() && del.is_some_and(|d| started > d) {
                            bad.push(format!("writer {w}: append {i} acknowledged after delete"));
                        }
                        if r.is_err() && del.is_some() {
                            // The topic is gone: stop soon.
                            if bad.len() > 100 {
                                break;
                            }
                        }
                        i += 1;
                    }
                    bad
                }));
            }
            {
                let (log, stop) = (log.clone(), stop.clone());
                hs.push(std::thread::spawn(move || {
                    let mut bad = Vec::new();
                    while !stop.load(Ordering::Acquire) {
                        if let Err(e) = log.sync() {
                            bad.push(format!("Log::sync: {e}"));
                            break;
                        }
                    }
                    bad
                }));
            }
            {
                let (t, stop) = (t.clone(), stop.clone());
                hs.push(std::thread::spawn(move || {
                    let mut n = 0u32;
                    while !stop.load(Ordering::Acquire) {
                        let mode = if n.is_multiple_of(2) {
                            HotKeyMode::Spread
                        } else {
                            HotKeyMode::Strict
                        };
                        let _ = t.set_hot_key_mode(&3u32.to_le_bytes(), mode);
                        if n.is_multiple_of(5) {
                            let ids = t.active_partitions();
                            if ids.len() >= 2 {
                                let _ = t.merge(ids[0], ids[1]);
                            } else if let Some(&p) = ids.first() {
                                let _ = t.split_tail(
                                    p,
                                    SplitPlan::Even,
                                    TailSplitOptions::from_offset(0),
                                );
                            }
                        }
                        if let Ok(g) = t.group("g", GroupOptions::default()) {
                            if let Ok(mut m) = g.join(common::groups::member_opts()) {
                                let _ = m.poll(50);
                                let _ = m.commit();
                            }
                        }
                        n += 1;
                    }
                    Vec::new()
                }));
            }
            let t0 = Instant::now();
            while progress.load(Ordering::Acquire) < 200 + u64::from(round) * 150
                && t0.elapsed() < Duration::from_secs(3)
            {
                std::thread::yield_now();
            }
            other.append(None, b"o1").unwrap();
            let tdir = dir.path().join(format!("topics/t{}", t.id()));
            let d = log.delete_topic("t");
            *deleted_at.lock().unwrap() = Some(Instant::now());
            if let Err(e) = &d {
                let left = tree(&tdir);
                stop.store(true, Ordering::Release);
                panic!("{ctx}: delete_topic: {e}; left in its directory: {left:?}");
            }
            other.append(None, b"o2").unwrap();
            let at = progress.load(Ordering::Acquire);
            while progress.load(Ordering::Acquire) < at + 50
                && t0.elapsed() < Duration::from_secs(4)
            {
                std::thread::yield_now();
            }
            stop.store(true, Ordering::Release);
            let bad: Vec<String> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
            assert!(bad.is_empty(), "{ctx}: {bad:?}");
            assert!(!tdir.exists(), "{ctx}: {:?}", tree(&tdir));
            log.sync()
                .unwrap_or_else(|e| panic!("{ctx}: final Log::sync: {e}"));
            drop((t, other));
            let Ok(log) = Arc::try_unwrap(log) else {
                panic!("{ctx}: a log handle is still held")
            };
            log.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
            let log = Log::open(dir.path(), opts()).unwrap();
            assert!(log.recovery_report().clean_shutdown, "{ctx}");
            assert_eq!(log.topics(), vec!["o".to_string()], "{ctx}");
            assert_eq!(
                partition_values(&log.topic("o").unwrap(), 0),
                vec![b"o1".to_vec(), b"o2".to_vec()],
                "{ctx}"
            );
            assert_eq!(topic_dirs(dir.path()), vec!["t0".to_string()], "{ctx}");
        }
    }
}
