//! C5: splits and merges are atomic across failures and crashes. A failed
//! commit leaves the old topology and no orphan files; a kill at any I/O
//! point of a split or merge reopens as either the old or the new topology;
//! a power loss around a split keeps every synced record; and a process
//! killed (SIGKILL) while it splits and merges loses no acknowledged record
//! and keeps per-key order.

use crate::common;
use common::log::no_balancer;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::crash::{CrashOptions, DirImage};
use common::model_hook::{CrashPoint, ModelHook};
use fissionlog::FileAction;
use fissionlog::IoOp;
use fissionlog::{
    Error, Log, NewRecord, OwnedRecord, SplitPlan, StartAt, SyncPolicy, Topic, TopicConfig,
};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TOPIC: &str = "crash";

fn config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: 64 * 1024,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    }
}

/// The per-file crash model's hook (tests/common/model_hook.rs) with the
/// faults these tests inject: manifest writes fail while `fail_manifest`
/// is set, and the segment creation after `fail_create_segment_after` more
/// gets ENOSPC.
fn model_hook(dir: &Path) -> Arc<ModelHook> {
    let hook = ModelHook::new(dir, None);
    // The engine gap the model tests grant (tests/crash_model/harness.rs).
    hook.grant_segment_headers(true);
    hook
}

#[derive(Debug, Default)]
struct Faults {
    fail_manifest: bool,
    fail_create_segment_after: Option<u32>,
}

fn install_faults(hook: &ModelHook, faults: Arc<Mutex<Faults>>) {
    hook.set_fault(Some(Box::new(move |op, _path| {
        let mut s = faults.lock();
        if s.fail_manifest && op == IoOp::WriteManifest {
            return Err(std::io::Error::other("injected manifest write failure"));
        }
        if op == IoOp::CreateSegment {
            match s.fail_create_segment_after {
                Some(0) => return Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
                Some(n) => s.fail_create_segment_after = Some(n - 1),
                None => {}
            }
        }
        Ok(())
    })));
}

/// Per-key sequence numbers appended so far.
type Model = BTreeMap<u32, u64>;

fn key_name(k: u32) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

fn append_keyed(topic: &Topic, model: &mut Model, rng: &mut StdRng, n: usize) {
    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
        .map(|_| {
            let k = rng.random_range(0..16u32);
            let seq = model.entry(k).or_insert(0);
            let v = format!("{k}:{seq}").into_bytes();
            *seq += 1;
            (key_name(k), v)
        })
        .collect();
    let recs: Vec<NewRecord<'_>> = items
        .iter()
        .map(|(k, v)| NewRecord {
            key: Some(k),
            value: v,
            timestamp: None,
        })
        .collect();
    topic.append_batch(&recs).unwrap();
}

fn parse(r: &OwnedRecord) -> (u32, u64) {
    let s = std::str::from_utf8(&r.value).unwrap();
    let (k, seq) = s.split_once(':').unwrap();
    let k: u32 = k.parse().unwrap();
    assert_eq!(r.key.as_deref(), Some(key_name(k).as_slice()));
    (k, seq.parse().unwrap())
}

/// Reads the whole topic through the order-keeping reader. Checks per-key
/// strictly increasing sequences (so no duplicates) and returns, per key,
/// the sequences seen.
fn read_all(topic: &Topic, ctx: &str) -> BTreeMap<u32, Vec<u64>> {
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    let mut seen: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    loop {
        let got = r.poll(4096).unwrap();
        if got.is_empty() {
            break;
        }
        for rec in &got {
            let (k, seq) = parse(rec);
            let v = seen.entry(k).or_default();
            assert!(
                v.last().is_none_or(|&last| seq > last),
                "{ctx}: key {k}: {seq} after {:?} at {}@{}",
                v.last(),
                rec.partition,
                rec.offset
            );
            v.push(seq);
        }
    }
    // The reader must have reached the active partitions: nothing stalls
    // behind a sealed parent.
    let mut open = r.open_partitions();
    open.sort();
    let mut active = topic.active_partitions();
    active.sort();
    assert_eq!(
        open, active,
        "{ctx}: reader stalled before the active partitions"
    );
    seen
}

/// Every record of `model` is present, exactly once, in order.
fn assert_exactly(seen: &BTreeMap<u32, Vec<u64>>, model: &Model, ctx: &str) {
    for (k, &n) in model {
        let want: Vec<u64> = (0..n).collect();
        assert_eq!(
            seen.get(k).cloned().unwrap_or_default(),
            want,
            "{ctx}: key {k}"
        );
    }
    assert_eq!(seen.len(), model.len(), "{ctx}: unknown keys");
}

/// Every record of `synced` is present (more may be, in order, no gaps in
/// the synced prefix).
fn assert_contains_prefix(seen: &BTreeMap<u32, Vec<u64>>, synced: &Model, ctx: &str) {
    for (k, &n) in synced {
        let got = seen.get(k).cloned().unwrap_or_default();
        let want: Vec<u64> = (0..n).collect();
        assert!(
            got.len() >= want.len() && got[..want.len()] == want[..],
            "{ctx}: key {k}: synced 0..{n}, got {got:?}"
        );
    }
}

fn partition_dirs(log_dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(log_dir.join("topics").join("t0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn removed_orphans(log: &Log) -> usize {
    log.recovery_report()
        .files
        .iter()
        .filter(|f| f.action == FileAction::RemovedOrphan)
        .count()
}

/// A failed manifest commit has an unknown outcome (the record may be on
/// disk), so it poisons the log and deletes nothing; the next open replays
/// what reached the disk and removes the orphans of a commit that did not.
/// A failure before the commit (creating a child's files) changes nothing.
#[test]
fn failed_commit_poisons_then_reopen_keeps_the_old_topology() {
    let mut rng = StdRng::seed_from_u64(5);
    let dir = tempfile::tempdir().unwrap();
    let hook = model_hook(dir.path());
    let faults = Arc::new(Mutex::new(Faults::default()));
    install_faults(&hook, faults.clone());
    let log = Log::open_with_hook(dir.path(), no_balancer(), hook.clone()).unwrap();
    let topic = log.create_topic(TOPIC, config(2)).unwrap();
    let mut model = Model::new();
    append_keyed(&topic, &mut model, &mut rng, 500);
    let before = topic.partitions();

    faults.lock().fail_manifest = true;
    assert!(matches!(
        topic.split(0, SplitPlan::Even),
        Err(Error::LogPoisoned { .. })
    ));
    faults.lock().fail_manifest = false;
    assert!(matches!(topic.merge(0, 1), Err(Error::LogPoisoned { .. })));
    assert_eq!(topic.active_partitions(), vec![0, 1]);
    let after = topic.partitions();
    assert_eq!(after.len(), before.len());
    for (a, b) in before.iter().zip(&after) {
        assert_eq!(
            (a.id, a.start, a.end, a.sealed_at),
            (b.id, b.start, b.end, b.sealed_at)
        );
        assert!(b.children.is_empty());
    }
    assert_eq!(
        partition_dirs(dir.path()),
        ["p0", "p1", "p2", "p3"].map(String::from).into(),
        "the children a replay could reference are kept"
    );
    log.close().unwrap();

    let log = Log::open_with_hook(dir.path(), no_balancer(), hook.clone()).unwrap();
    assert_eq!(removed_orphans(&log), 2);
    let topic = log.topic(TOPIC).unwrap();
    assert_eq!(topic.active_partitions(), vec![0, 1]);
    assert_eq!(
        partition_dirs(dir.path()),
        ["p0", "p1"].map(String::from).into(),
        "orphans removed"
    );
    // ENOSPC while creating the second child of a split.
    faults.lock().fail_create_segment_after = Some(1);
    assert!(matches!(
        topic.split(1, SplitPlan::Even),
        Err(Error::NoSpace { .. })
    ));
    faults.lock().fail_create_segment_after = None;
    assert_eq!(
        partition_dirs(dir.path()),
        ["p0", "p1"].map(String::from).into(),
        "a split that failed before its commit leaves no files"
    );
    // The parents still take appends, and a retried split works.
    append_keyed(&topic, &mut model, &mut rng, 300);
    let children = topic.split(0, SplitPlan::Even).unwrap();
    append_keyed(&topic, &mut model, &mut rng, 300);
    assert_exactly(&read_all(&topic, "live"), &model, "live");
    log.close().unwrap();

    let log = Log::open(dir.path(), no_balancer()).unwrap();
    assert_eq!(removed_orphans(&log), 0);
    let topic = log.topic(TOPIC).unwrap();
    let mut active = topic.active_partitions();
    active.sort();
    let mut want = children.clone();
    want.push(1);
    want.sort();
    assert_eq!(active, want);
    assert_exactly(&read_all(&topic, "reopened"), &model, "reopened");
}

/// Opens a crash image in a fresh directory and returns the log.
fn open_image(image: &DirImage) -> (tempfile::TempDir, Log) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("log");
    image.write_to(&root).unwrap();
    let log = Log::open(&root, no_balancer()).unwrap();
    (dir, log)
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort();
    v
}

/// A kill (the page cache survives) keeps the tree as it is: the live
/// files of a crash point.
fn kill_image(point: &CrashPoint) -> DirImage {
    let kill = CrashOptions {
        keep_all_new_probability: 1.0,
        ..CrashOptions::default()
    };
    point.image(0, &kill).0
}

/// The crash points of every I/O step of a split and of a merge, plus the
/// point after each returned, with the topology before and after and the
/// records appended before each.
struct TopologyChanges {
    split: (Vec<CrashPoint>, Vec<u32>, Vec<u32>, Model),
    merge: (Vec<CrashPoint>, Vec<u32>, Vec<u32>, Model),
    /// Records covered by a completed sync before each change.
    synced: Model,
}

fn record_split_and_merge(seed: u64) -> TopologyChanges {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let hook = model_hook(dir.path());
    let log = Log::open_with_hook(dir.path(), no_balancer(), hook.clone()).unwrap();
    let topic = log.create_topic(TOPIC, config(2)).unwrap();
    let mut model = Model::new();
    append_keyed(&topic, &mut model, &mut rng, 300);
    log.sync().unwrap();
    let synced = model.clone();
    // Unsynced appends to the parents, then the split commits.
    append_keyed(&topic, &mut model, &mut rng, 100);

    let model_at_split = model.clone();
    let old = sorted(topic.active_partitions());
    hook.record_steps(true);
    let children = topic.split(0, SplitPlan::LoadMedian).unwrap();
    hook.record_steps(false);
    let new = sorted(topic.active_partitions());
    let mut split_points = hook.take_steps();
    split_points.push(hook.now(IoOp::SyncDir));

    append_keyed(&topic, &mut model, &mut rng, 400);
    let model_at_merge = model.clone();
    hook.record_steps(true);
    topic.merge(children[1], 1).unwrap();
    hook.record_steps(false);
    let merged = sorted(topic.active_partitions());
    let mut merge_points = hook.take_steps();
    merge_points.push(hook.now(IoOp::SyncDir));
    assert!(split_points.len() >= 4 && merge_points.len() >= 3);
    log.abandon();
    TopologyChanges {
        split: (split_points, old, new.clone(), model_at_split),
        merge: (merge_points, new, merged, model_at_merge),
        synced,
    }
}

/// Kill-crash images taken before every I/O operation of a split and of a
/// merge (the page cache survives a kill): each reopens as the old or the
/// new topology with every record; uncommitted child directories are
/// removed and reported.
#[test]
fn kill_at_every_io_point_of_split_and_merge() {
    let changes = record_split_and_merge(6);
    for (name, (points, old, new, at)) in [("split", &changes.split), ("merge", &changes.merge)] {
        let mut saw = (false, false, 0usize);
        let n = points.len();
        for (i, point) in points.iter().enumerate() {
            let ctx = format!("{name} image {i} (before {:?})", point.op);
            let (_d, log) = open_image(&kill_image(point));
            let topic = log.topic(TOPIC).unwrap();
            let active = sorted(topic.active_partitions());
            if active == *old {
                saw.0 = true;
            } else if active == *new {
                saw.1 = true;
            } else {
                panic!("{ctx}: mixed topology {active:?} (old {old:?}, new {new:?})");
            }
            saw.2 += removed_orphans(&log);
            assert_exactly(&read_all(&topic, &ctx), at, &ctx);
            if i + 1 == n {
                assert_eq!(active, *new, "{ctx}: after the call returned");
            }
        }
        assert!(saw.0 && saw.1, "{name}: both outcomes covered");
        assert!(
            saw.2 > 0,
            "{name}: an orphan child was removed and reported"
        );
    }
}

/// A power loss before every I/O step of a split and of a merge, under the
/// per-file crash model (each file and directory durable as of its own
/// last fsync): the topology is the old or the new one, never a mix (C5),
/// the new one once the call returned, and every synced record is there,
/// in order, with no duplicate.
#[test]
fn power_loss_at_every_io_point_of_split_and_merge() {
    let opts = CrashOptions::default();
    for seed in 0..3u64 {
        let changes = record_split_and_merge(seed);
        for (name, (points, old, new, _)) in [("split", &changes.split), ("merge", &changes.merge)]
        {
            let n = points.len();
            for (i, point) in points.iter().enumerate() {
                for s in 0..4u64 {
                    let image_seed = seed * 1000 + i as u64 * 10 + s;
                    let (image, trace) = point.image(image_seed, &opts);
                    let ctx = format!(
                        "seed {seed}, {name} step {i} (before {:?}), image seed {image_seed}: {}",
                        point.op,
                        trace.join("; ")
                    );
                    let (_d, log) = open_image(&image);
                    let topic = log.topic(TOPIC).unwrap();
                    let active = sorted(topic.active_partitions());
                    if i + 1 == n {
                        assert_eq!(active, *new, "C5: {ctx}: after the call returned");
                    } else {
                        assert!(
                            active == *old || active == *new,
                            "C5: {ctx}: mixed topology {active:?}"
                        );
                    }
                    assert_contains_prefix(&read_all(&topic, &ctx), &changes.synced, &ctx);
                }
            }
        }
    }
}

#[test]
fn abandon_after_split_and_merge_keeps_new_topology() {
    let mut rng = StdRng::seed_from_u64(7);
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic(TOPIC, config(1)).unwrap();
    append_keyed(&topic, &mut model, &mut rng, 700);
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    append_keyed(&topic, &mut model, &mut rng, 700);
    let want = sorted(topic.active_partitions());
    log.abandon();

    let log = Log::open(dir.path(), no_balancer()).unwrap();
    assert!(!log.recovery_report().clean_shutdown);
    let topic = log.topic(TOPIC).unwrap();
    assert_eq!(sorted(topic.active_partitions()), want);
    assert_exactly(&read_all(&topic, "after split"), &model, "after split");
    let child = topic.merge(kids[0], kids[1]).unwrap();
    append_keyed(&topic, &mut model, &mut rng, 700);
    log.abandon();

    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.topic(TOPIC).unwrap();
    assert_eq!(topic.active_partitions(), vec![child]);
    assert_exactly(&read_all(&topic, "after merge"), &model, "after merge");
}

const CHILD_ENV: &str = "FISSIONLOG_SPLIT_CRASH_CHILD_DIR";

/// Child mode of [`sigkill_during_splits_and_merges`]: appends, syncs and
/// acknowledges (prints `ACK key seq` once synced), splitting and merging
/// at random, until killed. Continues the sequences found in the log.
#[test]
fn split_crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let seed: u64 = std::env::var("FISSIONLOG_SPLIT_CRASH_SEED")
        .unwrap()
        .parse()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let log = Log::open(&dir, no_balancer()).unwrap();
    let topic = log.topic_or_create(TOPIC, config(2)).unwrap();
    let mut model: Model = read_all(&topic, "child start")
        .into_iter()
        .map(|(k, v)| (k, v.last().map_or(0, |s| s + 1)))
        .collect();
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    loop {
        let before = model.clone();
        let n = rng.random_range(1..40);
        append_keyed(&topic, &mut model, &mut rng, n);
        log.sync().unwrap();
        for (k, &end) in &model {
            for seq in before.get(k).copied().unwrap_or(0)..end {
                writeln!(out, "ACK {k} {seq}").unwrap();
            }
        }
        out.flush().unwrap();
        match rng.random_range(0..10) {
            0 | 1 => {
                let active = topic.active_partitions();
                let p = active[rng.random_range(0..active.len())];
                match topic.split(p, SplitPlan::LoadMedian) {
                    Ok(_) | Err(Error::Refused(_)) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            2 | 3 => {
                let active = topic.active_partitions();
                if active.len() > 1 {
                    let i = rng.random_range(0..active.len() - 1);
                    match topic.merge(active[i], active[i + 1]) {
                        Ok(_) | Err(Error::Refused(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            _ => {}
        }
    }
}

#[test]
fn sigkill_during_splits_and_merges() {
    let seed = std::env::var("FISSIONLOG_SIGKILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5161_u64);
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    let mut acked: Model = Model::new();
    for round in 0..4u64 {
        let mut child = crate::common::log::rerun_command(module_path!(), "split_crash_child")
            .env(CHILD_ENV, &log_dir)
            .env("FISSIONLOG_SPLIT_CRASH_SEED", (seed + round).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (first_ack, acking) = std::sync::mpsc::channel();
        let lines = std::thread::spawn(move || {
            let mut got: Vec<String> = Vec::new();
            let mut acked = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !acked && line.starts_with("ACK ") {
                    acked = true;
                    let _ = first_ack.send(());
                }
                got.push(line);
            }
            got
        });
        // The kill lands while the child works, counted from its first
        // acknowledgement: a child slow to start (a loaded machine) is not
        // killed before it did anything.
        let kill_after = Duration::from_millis(rng.random_range(150..600));
        assert!(
            acking.recv_timeout(Duration::from_secs(60)).is_ok(),
            "seed {seed} round {round}: the child acknowledged nothing in 60 s"
        );
        let started = Instant::now();
        std::thread::sleep(kill_after);
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(
            !status.success(),
            "seed {seed} round {round}: child ended by itself"
        );
        let lines = lines.join().unwrap();
        let mut n = 0;
        for line in &lines {
            let Some(rest) = line.strip_prefix("ACK ") else {
                continue;
            };
            let mut it = rest.split(' ');
            let (Some(k), Some(s), None) = (it.next(), it.next(), it.next()) else {
                continue; // a line cut by the kill
            };
            let (k, s): (u32, u64) = (k.parse().unwrap(), s.parse().unwrap());
            let e = acked.entry(k).or_insert(0);
            *e = (*e).max(s + 1);
            n += 1;
        }
        let ctx = format!(
            "seed {seed} round {round} (killed after {:?}, {n} acks)",
            started.elapsed()
        );
        let log = Log::open(&log_dir, no_balancer()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let topic = log.topic(TOPIC).unwrap();
        let seen = read_all(&topic, &ctx);
        // A kill keeps the page cache: every acknowledged record, in order,
        // no gaps or duplicates (read_all checks order).
        for (k, v) in &seen {
            let want: Vec<u64> = (0..v.len() as u64).collect();
            assert_eq!(v, &want, "{ctx}: key {k}");
        }
        assert_contains_prefix(&seen, &acked, &ctx);
        log.close().unwrap();
    }
    assert!(acked.values().sum::<u64>() > 100, "seed {seed}: {acked:?}");
}

/// A power loss before every I/O step of a topic creation, under the
/// per-file crash model: the topic is either absent or there with every
/// partition, each taking appends, and it is there once the call returned
/// (C5). The creation's fsyncs run in batches (every new segment and
/// partition directory, then the topic directory, then `topics/`), so this
/// is what proves each is made durable before the manifest commits.
#[test]
fn power_loss_at_every_io_point_of_a_topic_creation_leaves_it_whole_or_absent() {
    const PARTITIONS: u32 = 3;
    let opts = CrashOptions::default();
    let dir = tempfile::tempdir().unwrap();
    let hook = model_hook(dir.path());
    let log = Log::open_with_hook(dir.path(), no_balancer(), hook.clone()).unwrap();
    hook.record_steps(true);
    log.create_topic(TOPIC, config(PARTITIONS)).unwrap();
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    assert!(
        points.len() > 2 * PARTITIONS as usize,
        "{} steps",
        points.len()
    );
    log.abandon();
    let n = points.len();
    let mut saw = (false, false);
    for (i, point) in points.iter().enumerate() {
        for s in 0..4u64 {
            let image_seed = i as u64 * 10 + s;
            let (image, trace) = point.image(image_seed, &opts);
            let ctx = format!(
                "step {i} (before {:?} of {}), image seed {image_seed}: {}",
                point.op,
                point.path.display(),
                trace.join("; ")
            );
            let (_d, log) = open_image(&image);
            match log.topic(TOPIC) {
                Ok(topic) => {
                    saw.1 = true;
                    assert_eq!(
                        sorted(topic.active_partitions()),
                        (0..PARTITIONS).collect::<Vec<_>>(),
                        "C5: {ctx}"
                    );
                    for p in 0..PARTITIONS {
                        let rec = NewRecord {
                            key: None,
                            value: b"after",
                            timestamp: None,
                        };
                        assert_eq!(topic.append_to(p, &[rec]).unwrap(), 0, "{ctx}: p{p}");
                    }
                    log.sync().unwrap();
                }
                Err(Error::UnknownTopic(_)) => {
                    saw.0 = true;
                    assert!(
                        i + 1 < n,
                        "C5: {ctx}: the topic is gone after the call returned"
                    );
                }
                Err(e) => panic!("{ctx}: {e}"),
            }
            log.close().unwrap();
        }
    }
    assert!(saw.0 && saw.1, "both outcomes covered");
}
