//! Sealed partitions that retention emptied leave the topology: one durable `RemovePartition` manifest record, then the
//! in-memory topology, then the directory. Readers go on through the
//! lineage (a removed parent counts as drained, a cut naming it reports the
//! loss), every reopen and every crash between the steps opens in Strict
//! mode with every live record, and the topology stays bounded however
//! many splits retention has emptied.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::crash::{CrashOptions, DirImage};
use common::model_hook::{CrashPoint, ModelHook};
use fissionlog::internals::format::decode_checkpoint;
use fissionlog::{
    Cut, Error, FileAction, IoOp, Log, LogOptions, NewRecord, OwnedRecord, RecoveryMode,
    RetainedRange, SplitPlan, StartAt, Topic, TopicConfig, TopologyEvent,
};

const TOPIC: &str = "t";
const KEYS: u32 = 8;
/// Timestamp of the records retention expires (ms since the epoch).
const OLD_TS: i64 = 1_000;

fn options() -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        recovery: RecoveryMode::Strict,
        // Where keys land is the same in every run: the tests need keys on
        // both sides of a split, which a random hash key misses once in
        // 2^(KEYS-1) runs.
        topic_hash_seed: Some(1),
        ..LogOptions::default()
    }
}

fn config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: 4096,
        retention_age: Some(Duration::from_secs(3600)),
        ..TopicConfig::default()
    }
}

/// Per key, the sequence numbers appended so far (`total`) and the first
/// one appended with a current timestamp (`live_from`): the records below
/// it are old enough for retention.
#[derive(Debug, Default, Clone)]
struct Model {
    total: BTreeMap<u32, u64>,
    live_from: BTreeMap<u32, u64>,
}

impl Model {
    fn live(&self) -> BTreeMap<u32, Vec<u64>> {
        self.total
            .iter()
            .map(|(&k, &n)| {
                (
                    k,
                    (self.live_from.get(&k).copied().unwrap_or(n)..n).collect(),
                )
            })
            .collect()
    }
}

fn key(k: u32) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

/// Appends `n` records round-robin over the keys; `old` ones carry an
/// ancient timestamp (expired), the others the current time.
fn append(topic: &Topic, model: &mut Model, n: u32, old: bool) {
    let all: Vec<u32> = (0..KEYS).collect();
    append_keys(topic, model, &all, n, old);
}

/// [`append`] round-robin over `keys`.
fn append_keys(topic: &Topic, model: &mut Model, keys: &[u32], n: u32, old: bool) {
    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
        .map(|i| {
            let k = keys[i as usize % keys.len()];
            let seq = model.total.entry(k).or_insert(0);
            if !old {
                model.live_from.entry(k).or_insert(*seq);
            }
            let v = format!("{k}:{seq}:{}", "x".repeat(60)).into_bytes();
            *seq += 1;
            (key(k), v)
        })
        .collect();
    let recs: Vec<NewRecord<'_>> = items
        .iter()
        .map(|(k, v)| NewRecord {
            key: Some(k),
            value: v,
            timestamp: old.then_some(OLD_TS),
        })
        .collect();
    // Batches that fit a 4 KiB segment.
    for chunk in recs.chunks(20) {
        topic.append_batch(chunk).unwrap();
    }
}

fn parse(r: &OwnedRecord) -> (u32, u64) {
    let s = std::str::from_utf8(&r.value).unwrap();
    let mut it = s.split(':');
    let k: u32 = it.next().unwrap().parse().unwrap();
    let seq = it.next().unwrap().parse().unwrap();
    assert_eq!(r.key.as_deref(), Some(key(k).as_slice()));
    (k, seq)
}

/// Reads everything the reader gives (until it is idle), checking per-key
/// order (strictly increasing: no duplicate) and that it reached the
/// active partitions.
fn drain(topic: &Topic, r: &mut fissionlog::Reader, ctx: &str) -> BTreeMap<u32, Vec<u64>> {
    let mut seen: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    loop {
        let got = r.poll(1000).unwrap();
        if got.is_empty() {
            break;
        }
        for rec in &got {
            let (k, seq) = parse(rec);
            let v = seen.entry(k).or_default();
            assert!(
                v.last().is_none_or(|&l| seq > l),
                "{ctx}: key {k}: {seq} after {:?}",
                v.last()
            );
            v.push(seq);
        }
    }
    let mut open = r.open_partitions();
    open.sort();
    let mut active = topic.active_partitions();
    active.sort();
    assert_eq!(
        open, active,
        "{ctx}: the reader stalled before the active partitions"
    );
    seen
}

fn ids(topic: &Topic) -> BTreeSet<u32> {
    topic.partitions().iter().map(|p| p.id).collect()
}

fn pdir(dir: &Path, id: u32) -> std::path::PathBuf {
    dir.join("topics").join("t0").join(format!("p{id}"))
}

/// The partition ids each checkpoint file names, newest first.
fn checkpoint_ids(dir: &Path) -> Vec<BTreeSet<u32>> {
    let mut found: Vec<(u64, BTreeSet<u32>)> = ["checkpoint.0", "checkpoint.1"]
        .iter()
        .filter_map(|f| std::fs::read(dir.join(f)).ok().filter(|b| !b.is_empty()))
        .map(|buf| {
            let c = decode_checkpoint(&buf).unwrap();
            (c.seq, c.partitions.iter().map(|p| p.partition_id).collect())
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.into_iter().map(|(_, ids)| ids).collect()
}

/// Partition ids removed by `RemovePartition` records in the journal, and
/// the ids of the snapshot's topic (empty without a snapshot). Payloads
/// are JSON (docs/FORMAT.md).
fn manifest_view(dir: &Path) -> (Vec<u64>, Vec<u64>) {
    let frames = |buf: &[u8]| -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        let mut pos = 16;
        while pos + 16 <= buf.len() {
            let len = u32::from_le_bytes(buf[pos..pos + 4].try_into().unwrap()) as usize;
            if len == 0 {
                break;
            }
            out.push(serde_json::from_slice(&buf[pos + 16..pos + 16 + len]).unwrap());
            pos += 16 + len;
        }
        out
    };
    let journal = std::fs::read(dir.join(fissionlog::layout::JOURNAL_FILE)).unwrap();
    let removed = frames(&journal)
        .iter()
        .filter_map(|v| v.get("RemovePartition")?.get("partition")?.as_u64())
        .collect();
    let snapshot = std::fs::read(dir.join(fissionlog::layout::SNAPSHOT_FILE))
        .map(|b| frames(&b))
        .unwrap_or_default();
    let in_snapshot = snapshot
        .first()
        .and_then(|s| s["topics"][0]["partitions"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p["id"].as_u64())
        .collect();
    (removed, in_snapshot)
}

/// A topic whose one partition holds old (expired) records and was split;
/// the children hold live records, all synced. Returns the model and a cut
/// taken in the parent, after reading some of it.
fn build(log: &Log) -> (Topic, Model, Cut) {
    let topic = log.create_topic(TOPIC, config(1)).unwrap();
    let mut model = Model::default();
    append(&topic, &mut model, 300, true);
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    assert_eq!(r.poll(40).unwrap().len(), 40);
    let cut = r.cut();
    assert_eq!(cut.positions.keys().copied().collect::<Vec<_>>(), vec![0]);
    let children = topic.split(0, SplitPlan::Even).unwrap();
    assert_eq!(children, vec![1, 2]);
    append(&topic, &mut model, 300, false);
    log.sync().unwrap();
    (topic, model, cut)
}

/// Every live record, exactly once, in per-key order, from Earliest and
/// from `cut` (which reports the removed parent as retained from its
/// position on).
fn check_readers(topic: &Topic, model: &Model, cut: &Cut, ctx: &str) {
    let live = model.live();
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    assert_eq!(drain(topic, &mut r, ctx), live, "{ctx}: Earliest");
    assert_eq!(r.retained(), &[], "{ctx}: Earliest starts at what is held");
    let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
    assert_eq!(drain(topic, &mut r, ctx), live, "{ctx}: from the cut");
    assert_eq!(
        r.retained(),
        &[RetainedRange {
            partition: 0,
            start: cut.positions[&0],
            end: 300,
        }],
        "{ctx}: the cut's partition was lost to retention up to its seal"
    );
}

#[test]
fn emptied_parent_is_removed_and_readers_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let events = log.subscribe();
    let (topic, model, cut) = build(&log);
    assert_eq!(ids(&topic), [0, 1, 2].into());
    // A reader that drained the parent before the removal goes on in the
    // children without reporting anything.
    let mut early = topic.reader(StartAt::Earliest).unwrap();
    assert_eq!(early.poll(300).unwrap().len(), 300);
    let drained_cut = early.cut();
    assert!(!drained_cut.positions.contains_key(&0), "{drained_cut:?}");

    assert!(log.enforce_retention().unwrap() > 0);
    assert_eq!(ids(&topic), [1, 2].into(), "the emptied parent left");
    assert!(!pdir(dir.path(), 0).exists(), "its directory is deleted");
    assert!(matches!(
        topic.partition(0),
        Err(Error::UnknownPartition { partition: 0, .. })
    ));
    let (removed, _) = manifest_view(dir.path());
    assert_eq!(removed, vec![0], "one RemovePartition record");
    let got: Vec<TopologyEvent> = events.try_iter().collect();
    assert!(
        got.contains(&TopologyEvent::PartitionRemoved {
            topic: TOPIC.into(),
            partition: 0,
        }),
        "{got:?}"
    );
    // The children keep their lineage: parents name the removed id (and
    // where it was sealed), and each key's chain starts at the child now.
    for p in topic.partitions() {
        assert_eq!(p.parents, vec![0]);
        assert_eq!(
            p.removed_parents,
            vec![fissionlog::RemovedParent {
                partition: 0,
                end_offset: 300
            }]
        );
    }
    for k in 0..KEYS {
        let chain = topic.key_chain(&key(k));
        assert_eq!(chain.len(), 1, "key {k}: {chain:?}");
        assert_eq!(chain[0].partition, topic.route(&key(k)));
    }
    check_readers(&topic, &model, &cut, "live");
    let mut r = topic.reader(StartAt::Cut(drained_cut)).unwrap();
    assert_eq!(
        drain(&topic, &mut r, "drained cut"),
        model.live(),
        "a cut past the parent resumes in the children"
    );
    assert_eq!(r.retained(), &[]);
    // The next checkpoint (here the clean one of close) no longer names it.
    log.close().unwrap();
    let newest = checkpoint_ids(dir.path())[0].clone();
    assert_eq!(newest, [1, 2].into());

    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic(TOPIC).unwrap();
    assert_eq!(ids(&topic), [1, 2].into());
    check_readers(&topic, &model, &cut, "reopened");
    log.abandon();
    let log = Log::open(dir.path(), options()).unwrap();
    assert!(!log.recovery_report().clean_shutdown);
    let topic = log.topic(TOPIC).unwrap();
    assert_eq!(ids(&topic), [1, 2].into());
    check_readers(&topic, &model, &cut, "after abandon");
}

/// The removed partitions were on one side of a merge: the merge child
/// keeps one parent that still holds live data. Key chains start at the
/// oldest partition still there on each side, a reader from Earliest
/// drains the surviving parent before the child, and a cut taken in the
/// removed parent reports it and still gets every live record.
#[test]
fn merge_child_with_one_removed_parent() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic(TOPIC, config(1)).unwrap();
    let mut model = Model::default();
    append(&topic, &mut model, 100, true);
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    let (left, right): (Vec<u32>, Vec<u32>) =
        (0..KEYS).partition(|&k| topic.route(&key(k)) == kids[0]);
    assert!(!left.is_empty() && !right.is_empty(), "keys on both sides");
    // The left child holds only expired records, the right one live ones.
    append_keys(&topic, &mut model, &left, 100, true);
    append_keys(&topic, &mut model, &right, 100, false);
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    let read = r.poll(120).unwrap();
    assert_eq!(read.len(), 120);
    let cut = r.cut();
    assert!(cut.positions.contains_key(&kids[0]), "{cut:?}");
    // What the reader had read before its cut is not read again.
    let mut read_up_to: BTreeMap<u32, u64> = BTreeMap::new();
    for rec in &read {
        let (k, seq) = parse(rec);
        read_up_to.insert(k, seq);
    }
    let child = topic.merge(kids[0], kids[1]).unwrap();
    let left_seal = topic
        .partitions()
        .iter()
        .find(|p| p.id == kids[0])
        .and_then(|p| p.sealed_at)
        .unwrap();
    append(&topic, &mut model, 100, false);
    log.sync().unwrap();
    log.enforce_retention().unwrap();
    assert_eq!(ids(&topic), [kids[1], child].into());
    for k in &left {
        let chain: Vec<u32> = topic
            .key_chain(&key(*k))
            .iter()
            .map(|l| l.partition)
            .collect();
        assert_eq!(chain, vec![child], "key {k}");
    }
    for k in &right {
        let chain: Vec<u32> = topic
            .key_chain(&key(*k))
            .iter()
            .map(|l| l.partition)
            .collect();
        assert_eq!(chain, vec![kids[1], child], "key {k}");
    }
    let check = |topic: &Topic, ctx: &str| {
        let mut r = topic.reader(StartAt::Earliest).unwrap();
        assert_eq!(drain(topic, &mut r, ctx), model.live(), "{ctx}: Earliest");
        let after_cut: BTreeMap<u32, Vec<u64>> = model
            .live()
            .into_iter()
            .map(|(k, v)| {
                let from = read_up_to.get(&k).map_or(0, |&s| s + 1);
                (k, v.into_iter().filter(|&s| s >= from).collect())
            })
            .collect();
        let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
        assert_eq!(drain(topic, &mut r, ctx), after_cut, "{ctx}: cut");
        assert_eq!(
            r.retained(),
            &[RetainedRange {
                partition: kids[0],
                start: cut.positions[&kids[0]],
                end: left_seal,
            }],
            "{ctx}"
        );
    };
    check(&topic, "live");
    drop(topic);
    log.close().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic(TOPIC).unwrap();
    assert_eq!(ids(&topic), [kids[1], child].into());
    check(&topic, "reopened");
}

/// A reader that had read a partition to its end while it was still
/// active, then saw it split and removed before its next poll, lost
/// nothing and reports nothing; nor does a cut taken at that point.
#[test]
fn caught_up_reader_reports_no_loss_when_its_partition_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic(TOPIC, config(1)).unwrap();
    let mut model = Model::default();
    append(&topic, &mut model, 200, true);
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    assert_eq!(r.poll(1000).unwrap().len(), 200);
    let cut = r.cut();
    assert_eq!(cut.positions.get(&0), Some(&200), "caught up, still active");
    topic.split(0, SplitPlan::Even).unwrap();
    append(&topic, &mut model, 100, false);
    log.sync().unwrap();
    log.enforce_retention().unwrap();
    assert!(!ids(&topic).contains(&0));
    assert_eq!(drain(&topic, &mut r, "live reader"), model.live());
    assert_eq!(r.retained(), &[]);
    let mut r = topic.reader(StartAt::Cut(cut)).unwrap();
    assert_eq!(drain(&topic, &mut r, "from the cut"), model.live());
    assert_eq!(r.retained(), &[]);
}

/// A cut naming an id that never existed is still refused.
#[test]
fn cut_naming_an_unknown_partition_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let (topic, _, mut cut) = build(&log);
    log.enforce_retention().unwrap();
    cut.positions.insert(7, 0);
    assert!(matches!(
        topic.reader(StartAt::Cut(cut)),
        Err(Error::InvalidCut(_))
    ));
}

/// A process killed right after the removal: the checkpoint on disk was
/// written before it and still names the removed partition. Recovery
/// takes the manifest's word (the checkpoint is older).
#[test]
fn checkpoint_older_than_the_removal_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let (_, model, cut) = build(&log);
    log.enforce_retention().unwrap();
    log.abandon();
    let newest = checkpoint_ids(dir.path())[0].clone();
    assert!(
        newest.contains(&0),
        "the newest checkpoint predates the removal: {newest:?}"
    );
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic(TOPIC).unwrap();
    assert_eq!(ids(&topic), [1, 2].into());
    check_readers(&topic, &model, &cut, "old checkpoint");
}

fn model_hook(dir: &Path) -> Arc<ModelHook> {
    let hook = ModelHook::new(dir, None);
    hook.grant_segment_headers(true);
    hook
}

/// Fails every `op` from now on (until the fault is removed).
fn fail(hook: &ModelHook, op: IoOp) {
    hook.set_fault(Some(Box::new(move |o, _| {
        if o == op {
            return Err(std::io::Error::other("injected failure"));
        }
        Ok(())
    })));
}

/// The record's fdatasync fails: the outcome is unknown, the log is
/// poisoned and nothing is deleted. Reopening replays what reached the
/// disk (here the record, still in the page cache) and removes the
/// leftover directory as an orphan, reported.
#[test]
fn failed_record_sync_poisons_and_reopen_finishes_the_removal() {
    let dir = tempfile::tempdir().unwrap();
    let hook = model_hook(dir.path());
    let log = Log::open_with_hook(dir.path(), options(), hook.clone()).unwrap();
    let (topic, model, cut) = build(&log);
    fail(&hook, IoOp::SyncManifest);
    assert!(matches!(
        log.enforce_retention(),
        Err(Error::LogPoisoned { .. })
    ));
    hook.set_fault(None);
    assert_eq!(ids(&topic), [0, 1, 2].into(), "not removed in memory");
    assert!(pdir(dir.path(), 0).exists(), "nothing deleted");
    drop(topic);
    log.abandon();

    let log = Log::open(dir.path(), options()).unwrap();
    let orphans: Vec<_> = log
        .recovery_report()
        .files
        .iter()
        .filter(|f| f.action == FileAction::RemovedOrphan)
        .map(|f| f.file.clone())
        .collect();
    assert_eq!(orphans, vec![pdir(dir.path(), 0)]);
    let topic = log.topic(TOPIC).unwrap();
    assert_eq!(ids(&topic), [1, 2].into());
    check_readers(&topic, &model, &cut, "after the failed sync");
}

/// Deleting the directory fails after the record is durable: the removal
/// stands, the log keeps working (not poisoned), and the next open
/// removes the directory as an orphan and reports it.
#[test]
fn failed_directory_removal_leaves_an_orphan_recovery_removes() {
    let dir = tempfile::tempdir().unwrap();
    let hook = model_hook(dir.path());
    let log = Log::open_with_hook(dir.path(), options(), hook.clone()).unwrap();
    let (topic, mut model, cut) = build(&log);
    fail(&hook, IoOp::RemovePartitionDir);
    assert!(matches!(log.enforce_retention(), Err(Error::Io { .. })));
    hook.set_fault(None);
    assert_eq!(ids(&topic), [1, 2].into());
    assert!(pdir(dir.path(), 0).exists());
    append(&topic, &mut model, 50, false);
    log.sync().unwrap();
    check_readers(&topic, &model, &cut, "after the failed removal");
    drop(topic);
    log.close().unwrap();

    let log = Log::open(dir.path(), options()).unwrap();
    assert!(log
        .recovery_report()
        .files
        .iter()
        .any(|f| f.action == FileAction::RemovedOrphan && f.file == pdir(dir.path(), 0)));
    assert!(!pdir(dir.path(), 0).exists());
    let topic = log.topic(TOPIC).unwrap();
    check_readers(&topic, &model, &cut, "reopened");
}

/// The crash points of every I/O step of a retention pass that removes
/// the emptied parent, and the point after it returned.
fn record_removal() -> (Vec<CrashPoint>, Model, Cut) {
    let dir = tempfile::tempdir().unwrap();
    let hook = model_hook(dir.path());
    let log = Log::open_with_hook(dir.path(), options(), hook.clone()).unwrap();
    let (_topic, model, cut) = build(&log);
    hook.record_steps(true);
    log.enforce_retention().unwrap();
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    let ops: Vec<IoOp> = points.iter().map(|p| p.op).collect();
    for op in [
        IoOp::SyncCheckpoint,
        IoOp::SyncManifest,
        IoOp::RemovePartitionDir,
        IoOp::SyncNewDir,
    ] {
        assert!(ops.contains(&op), "no {op:?} step in {ops:?}");
    }
    log.abandon();
    (points, model, cut)
}

/// Opens a crash image in Strict mode; returns the log and whether
/// partition 0 is still in its topology.
fn open_image(image: &DirImage, ctx: &str) -> (tempfile::TempDir, Log, bool) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("log");
    image.write_to(&root).unwrap();
    let log = Log::open(&root, options()).unwrap_or_else(|e| panic!("{ctx}: Strict open: {e}"));
    let ids = ids(&log.topic(TOPIC).unwrap());
    assert!(
        ids == [0, 1, 2].into() || ids == [1, 2].into(),
        "{ctx}: {ids:?}"
    );
    if !ids.contains(&0) {
        assert!(
            !root.join("topics/t0/p0").exists(),
            "{ctx}: leftover directory"
        );
    }
    (dir, log, ids.contains(&0))
}

/// Every live record exactly once, in order; expired ones only where the
/// parent is still there (a crash before retention's files went).
fn check_image(log: &Log, model: &Model, cut: &Cut, ctx: &str) {
    let topic = log.topic(TOPIC).unwrap();
    let live = model.live();
    for start in [StartAt::Earliest, StartAt::Cut(cut.clone())] {
        let mut r = topic.reader(start).unwrap();
        let seen = drain(&topic, &mut r, ctx);
        for (k, want) in &live {
            let got = seen.get(k).cloned().unwrap_or_default();
            assert!(
                got.ends_with(want) && got.len() <= model.total[k] as usize,
                "{ctx}: key {k}: {got:?}"
            );
        }
    }
}

/// A kill (page cache kept) and a power loss (each file and directory as
/// of its last fsync) before every I/O step of the removal: each image
/// opens in Strict mode with every live record, the parent either still
/// there or gone with its directory; both outcomes happen, and a leftover
/// directory is removed and reported.
#[test]
fn crash_at_every_step_of_the_removal() {
    let (points, model, cut) = record_removal();
    let kill = CrashOptions {
        keep_all_new_probability: 1.0,
        ..CrashOptions::default()
    };
    let mut outcomes = (false, false, false);
    let n = points.len();
    for (i, point) in points.iter().enumerate() {
        let mut images = vec![("kill".to_string(), point.image(0, &kill))];
        for s in 0..3u64 {
            let seed = i as u64 * 10 + s;
            images.push((
                format!("power loss seed {seed}"),
                point.image(seed, &CrashOptions::default()),
            ));
        }
        for (what, (image, trace)) in images {
            let ctx = format!(
                "step {i} (before {:?}), {what}: {}",
                point.op,
                trace.join("; ")
            );
            let (_d, log, kept) = open_image(&image, &ctx);
            if kept {
                outcomes.0 = true;
            } else {
                outcomes.1 = true;
            }
            outcomes.2 |= log
                .recovery_report()
                .files
                .iter()
                .any(|f| f.action == FileAction::RemovedOrphan);
            if i + 1 == n {
                assert!(!kept, "{ctx}: removed once the call returned");
            }
            check_image(&log, &model, &cut, &ctx);
        }
    }
    assert!(
        outcomes.0 && outcomes.1 && outcomes.2,
        "kept, removed and orphan cleanup all covered: {outcomes:?}"
    );
}

/// 1,000 split + merge + retention cycles: every sealed generation is
/// emptied and removed, so the topology, the manifest snapshot and the
/// checkpoint stay a handful of partitions, not thousands.
#[test]
fn topology_stays_bounded_over_many_cycles() {
    // Some 20 fsyncs a cycle: on tmpfs where there is one, so that the
    // test measures the topology, not the disk.
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let opts = LogOptions {
        manifest_compact_records: 64,
        ..options()
    };
    let log = Log::open(dir.path(), opts.clone()).unwrap();
    let topic = log.create_topic(TOPIC, config(1)).unwrap();
    let mut model = Model::default();
    // A cut in the first partition: by the end, it and its children are
    // long gone, and nothing records where it was sealed any more.
    append(&topic, &mut model, 2, true);
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    assert_eq!(r.poll(1).unwrap().len(), 1);
    let old_cut = r.cut();
    for cycle in 0..1000 {
        append(&topic, &mut model, 2, true);
        let active = topic.active_partitions()[0];
        let kids = topic.split(active, SplitPlan::Even).unwrap();
        append(&topic, &mut model, 2, true);
        topic.merge(kids[0], kids[1]).unwrap();
        log.enforce_retention().unwrap();
        assert!(
            topic.partitions().len() <= 2,
            "cycle {cycle}: {:?}",
            ids(&topic)
        );
    }
    append(&topic, &mut model, 16, false);
    log.sync().unwrap();
    assert_eq!(topic.partitions().len(), 1, "{:?}", ids(&topic));
    let (_, in_snapshot) = manifest_view(dir.path());
    assert!(
        !in_snapshot.is_empty() && in_snapshot.len() <= 4,
        "snapshot partitions: {in_snapshot:?}"
    );
    log.close().unwrap();
    for ids in checkpoint_ids(dir.path()) {
        assert!(ids.len() <= 4, "checkpoint: {ids:?}");
    }
    let topics_dir = dir.path().join("topics").join("t0");
    assert_eq!(std::fs::read_dir(&topics_dir).unwrap().count(), 1);

    let log = Log::open(dir.path(), opts).unwrap();
    let topic = log.topic(TOPIC).unwrap();
    assert_eq!(topic.partitions().len(), 1);
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    assert_eq!(drain(&topic, &mut r, "reopened"), model.live());
    let mut r = topic.reader(StartAt::Cut(old_cut)).unwrap();
    assert_eq!(drain(&topic, &mut r, "old cut"), model.live());
    // Partition 0 from the cut's position on, then every removed
    // partition the reader never read, whole, once each: together exactly
    // the records retention removed after the cut.
    let got = r.retained();
    assert_eq!((got[0].partition, got[0].start), (0, 1), "{:?}", &got[..2]);
    assert!(got[1..].iter().all(|g| g.start == 0 && g.end > 0));
    let mut seen: Vec<u32> = got.iter().map(|g| g.partition).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), got.len(), "each partition once");
    let total: u64 = model.total.values().sum();
    let live: u64 = model.live().values().map(|v| v.len() as u64).sum();
    let reported: u64 = got.iter().map(|g| g.end - g.start).sum();
    assert_eq!(reported, total - live - 1);
}
