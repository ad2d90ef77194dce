//! Tail splits: the parent's records from an offset on move into the
//! children. Every record is read exactly once in per-key order, through
//! readers started before, during and after the split, saved cuts, group
//! positions and a reopen; bad input changes nothing; a kill or power loss
//! at every I/O step leaves the old layout or the new one.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use common::crash::{CrashOptions, DirImage};
use common::model_hook::{CrashPoint, ModelHook};
use fissionlog::{
    Cut, Error, FileAction, GroupOptions, IoOp, Log, MemberOptions, OwnedRecord, SplitPlan,
    StartAt, SyncPolicy, TailFrom, TailSplitOptions, Topic, TopicConfig,
};

const KEYS: u64 = 13;

use common::tail::{
    check_exactly_once, churn_rounds, config, drain, options, read_all, seq, SplitChurn,
};

fn append(topic: &Topic, from: u64, n: u64) {
    common::tail::append(topic, from, n, KEYS);
}

/// Reads `n` records from a fresh reader and returns them with its cut.
fn read_some(topic: &Topic, n: usize) -> (Vec<OwnedRecord>, Cut) {
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    let got = r.poll(n).unwrap();
    assert_eq!(got.len(), n);
    (got, r.cut())
}

#[test]
fn moved_backlog_reads_exactly_once_through_cuts_live_readers_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 1000);
    // A cut inside the range about to move, one below it, and a live
    // reader past the split offset with records read but not handed out.
    let (before_low, cut_low) = read_some(&topic, 300);
    let (before_high, cut_high) = read_some(&topic, 700);
    let mut live = topic.reader(StartAt::Earliest).unwrap();
    let mut live_seen = live.poll(650).unwrap();

    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(400))
        .unwrap();
    assert_eq!(out.from, 400);
    assert_eq!(out.seal_offset, 1000);
    assert_eq!(out.children.len(), 2);
    assert_eq!(out.moved.iter().sum::<u64>(), 600);
    assert!(out.moved.iter().all(|&m| m > 0), "{:?}", out.moved);
    append(&topic, 1000, 300);

    // The parent ends at 400 for every read path.
    let info = topic.partitions();
    let parent = info.iter().find(|p| p.id == 0).unwrap();
    assert_eq!(parent.sealed_at, Some(400));
    assert_eq!(parent.end_offset, 400);
    let moved = parent.moved.as_ref().expect("moved range reported");
    assert_eq!((moved.from, moved.to), (400, 1000));
    assert!(matches!(
        topic.read(0, 400, 1 << 20),
        Err(Error::OffsetOutOfRange { end: 400, .. })
    ));
    let chain = topic.key_chain(b"k3");
    assert_eq!(chain.len(), 2);
    assert_eq!(chain[0].sealed_at, Some(400));
    // The child's first records are the key's moved ones, in order.
    let child = chain[1].partition;
    let b = topic.read(child, 0, 1 << 20).unwrap();
    let first: Vec<u64> = b
        .to_owned_records()
        .unwrap()
        .iter()
        .filter(|r| r.key.as_deref() == Some(b"k3"))
        .map(seq)
        .take(3)
        .collect();
    // (419 is keyless: every fifth record is.)
    assert_eq!(first, [406, 432, 445]);

    check_exactly_once(&read_all(&topic), 0..1300, "earliest");
    for (name, before, cut) in [
        ("low", &before_low, &cut_low),
        ("high", &before_high, &cut_high),
    ] {
        let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
        let mut seen = before.clone();
        drain(&mut r, &mut seen);
        check_exactly_once(&seen, 0..1300, &format!("cut {name}"));
    }
    drain(&mut live, &mut live_seen);
    check_exactly_once(&live_seen, 0..1300, "live reader");

    // After a reopen: the same, from the index file and the record.
    drop((live, b, topic));
    log.close().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic("t").unwrap();
    assert_eq!(
        topic
            .partitions()
            .iter()
            .find(|p| p.id == 0)
            .unwrap()
            .sealed_at,
        Some(400)
    );
    check_exactly_once(&read_all(&topic), 0..1300, "reopened earliest");
    let mut r = topic.reader(StartAt::Cut(cut_high.clone())).unwrap();
    let mut seen = before_high.clone();
    drain(&mut r, &mut seen);
    check_exactly_once(&seen, 0..1300, "reopened cut high");
}

/// A split offset inside a batch moves the whole batch (batches are
/// never cut); a cut inside it is translated exactly.
#[test]
fn an_offset_inside_a_batch_moves_from_the_batch_start() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    let values: Vec<String> = (0..100u64).map(|i| i.to_string()).collect();
    let keys: Vec<String> = (0..100u64).map(|i| format!("k{}", i % KEYS)).collect();
    for chunk in 0..10 {
        let recs: Vec<fissionlog::NewRecord<'_>> = (chunk * 10..chunk * 10 + 10)
            .map(|i| fissionlog::NewRecord {
                key: Some(keys[i].as_bytes()),
                value: values[i].as_bytes(),
                timestamp: None,
            })
            .collect();
        topic.append_batch(&recs).unwrap();
    }
    let (before, cut) = read_some(&topic, 57);
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(55))
        .unwrap();
    assert_eq!(out.from, 50);
    let mut r = topic.reader(StartAt::Cut(cut)).unwrap();
    let mut seen = before;
    drain(&mut r, &mut seen);
    check_exactly_once(&seen, 0..100, "cut inside the first moved batch");
}

fn snapshot(dir: &Path, topic: &Topic) -> (Vec<u32>, BTreeSet<String>, usize) {
    let mut dirs = BTreeSet::new();
    for e in walkdir(dir) {
        dirs.insert(e);
    }
    (topic.active_partitions(), dirs, read_all(topic).len())
}

fn walkdir(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.push(p.display().to_string());
            out.extend(walkdir(&p));
        }
    }
    out
}

#[test]
fn bad_input_is_refused_with_typed_errors_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 100);
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    append(&topic, 100, 50);
    let before = snapshot(dir.path(), &topic);
    let err = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(10))
        .unwrap_err();
    assert!(matches!(err, Error::Sealed { partition: 0, .. }), "{err:?}");
    let end = topic.partition(kids[0]).unwrap().end_offset();
    let err = topic
        .split_tail(
            kids[0],
            SplitPlan::Even,
            TailSplitOptions::from_offset(end + 1),
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::OffsetOutOfRange { offset, .. } if offset == end + 1),
        "{err:?}"
    );
    let err = topic
        .split_tail(99, SplitPlan::Even, TailSplitOptions::from_offset(0))
        .unwrap_err();
    assert!(
        matches!(err, Error::UnknownPartition { partition: 99, .. }),
        "{err:?}"
    );
    // No group: the slowest group position does not exist.
    let err = topic
        .split_tail(
            kids[0],
            SplitPlan::Even,
            TailSplitOptions {
                from: TailFrom::SlowestGroup,
                throttle_bytes_per_sec: 0,
            },
        )
        .unwrap_err();
    assert!(matches!(err, Error::Refused(_)), "{err:?}");
    assert_eq!(snapshot(dir.path(), &topic), before);
    // And a good one still works after the refusals (ids not burnt).
    let out = topic
        .split_tail(kids[0], SplitPlan::Even, TailSplitOptions::from_offset(end))
        .unwrap();
    assert_eq!(out.moved.iter().sum::<u64>(), 0);
    assert_eq!(out.children, vec![kids[1] + 1, kids[1] + 2]);
}

fn member_opts() -> MemberOptions {
    MemberOptions {
        session_timeout: std::time::Duration::from_secs(60),
        processing_timeout: std::time::Duration::from_secs(60),
        instance_id: None,
        background_heartbeat: None,
    }
}

/// A group's committed position inside the moved range is translated in
/// the same record: after the split (and after a reopen) the group goes on
/// with exactly the records it had not consumed. `SlowestGroup` moves
/// from the group's position.
#[test]
fn group_positions_inside_the_moved_range_are_translated() {
    let dir = tempfile::tempdir().unwrap();
    let mut consumed = Vec::new();
    {
        let log = Log::open(dir.path(), options()).unwrap();
        let topic = log.create_topic("t", config()).unwrap();
        append(&topic, 0, 600);
        let slow = topic.group("slow", GroupOptions::default()).unwrap();
        let mut m = slow.join(member_opts()).unwrap();
        let got = m.poll(200).unwrap();
        assert_eq!(got.len(), 200);
        m.commit().unwrap();
        consumed.extend(got);
        let fast = topic.group("fast", GroupOptions::default()).unwrap();
        let mut f = fast.join(member_opts()).unwrap();
        let mut fast_seen = f.poll(450).unwrap();
        f.commit().unwrap();
        let out = topic
            .split_tail(
                0,
                SplitPlan::Even,
                TailSplitOptions {
                    from: TailFrom::SlowestGroup,
                    throttle_bytes_per_sec: 0,
                },
            )
            .unwrap();
        assert_eq!(out.from, 200);
        // The fast group's position (450, past the logical end) now names
        // the children.
        let cut = fast.committed();
        assert!(!cut.positions.contains_key(&0), "{cut:?}");
        assert_eq!(cut.positions.len(), 2, "{cut:?}");
        append(&topic, 600, 100);
        loop {
            let got = f.poll(64).unwrap();
            if got.is_empty() {
                break;
            }
            fast_seen.extend(got);
        }
        check_exactly_once(&fast_seen, 0..700, "fast group, live member");
        drop((m, f, slow, fast, topic));
        log.close().unwrap();
    }
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic("t").unwrap();
    let slow = topic.group("slow", GroupOptions::default()).unwrap();
    let mut m = slow.join(member_opts()).unwrap();
    loop {
        let got = m.poll(64).unwrap();
        if got.is_empty() {
            break;
        }
        consumed.extend(got);
    }
    check_exactly_once(&consumed, 0..700, "slow group after reopen");
}

// ---- crash atomicity -------------------------------------------------

fn model_hook(dir: &Path) -> Arc<ModelHook> {
    let hook = ModelHook::new(dir, None);
    hook.grant_segment_headers(true);
    hook
}

fn kill_image(point: &CrashPoint) -> DirImage {
    let kill = CrashOptions {
        keep_all_new_probability: 1.0,
        ..CrashOptions::default()
    };
    point.image(0, &kill).0
}

fn open_image(image: &DirImage) -> (tempfile::TempDir, Log) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("log");
    image.write_to(&root).unwrap();
    let log = Log::open(&root, options()).unwrap();
    (dir, log)
}

/// Records every I/O step of a tail split: (crash points, records synced
/// before it, records written before it).
fn record_tail_split() -> (Vec<CrashPoint>, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let hook = model_hook(dir.path());
    let log = Log::open_with_hook(dir.path(), options(), hook.clone()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 400);
    log.sync().unwrap();
    // Unsynced appends: the split's seal syncs them before its record.
    append(&topic, 400, 100);
    hook.record_steps(true);
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(150))
        .unwrap();
    hook.record_steps(false);
    assert_eq!(out.from, 150);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    assert!(points.len() >= 6, "{} steps", points.len());
    log.abandon();
    (points, 400, 500)
}

/// Which layout an image reopened as: false old, true new. Panics on a mix.
fn layout(topic: &Topic, ctx: &str) -> bool {
    let active = topic.active_partitions();
    let parent = topic.partitions().into_iter().find(|p| p.id == 0).unwrap();
    match (active.as_slice(), parent.sealed_at) {
        ([0], None) => {
            assert!(parent.moved.is_none(), "{ctx}");
            false
        }
        ([1, 2], Some(150)) => {
            assert!(parent.moved.is_some(), "{ctx}");
            true
        }
        _ => panic!("{ctx}: mixed layout: active {active:?}, parent {parent:?}"),
    }
}

fn orphans_removed(log: &Log) -> usize {
    log.recovery_report()
        .files
        .iter()
        .filter(|f| f.action == FileAction::RemovedOrphan)
        .count()
}

/// A kill before every I/O step of a tail split: the old layout (children
/// removed as orphans and reported) or the new one, every record exactly
/// once either way (the moved range neither lost nor doubled).
#[test]
fn kill_at_every_io_step_of_a_tail_split() {
    let (points, _, written) = record_tail_split();
    let (mut old, mut new, mut orphans) = (0, 0, 0);
    for (i, point) in points.iter().enumerate() {
        let ctx = format!("image {i} (before {:?} {})", point.op, point.path.display());
        let (_d, log) = open_image(&kill_image(point));
        let topic = log.topic("t").unwrap();
        if layout(&topic, &ctx) {
            new += 1;
        } else {
            old += 1;
        }
        orphans += orphans_removed(&log);
        check_exactly_once(&read_all(&topic), 0..written, &ctx);
        if i + 1 == points.len() {
            assert!(layout(&topic, &ctx), "{ctx}: after the call returned");
        }
    }
    assert!(old > 0 && new > 0, "both outcomes: old {old}, new {new}");
    assert!(orphans > 0, "an orphan child was removed and reported");
}

/// A power loss before every I/O step, under the per-file crash model:
/// old or new layout, never a mix; every synced record there exactly once
/// and in per-key order; after the call returned, the new layout with
/// every record.
#[test]
fn power_loss_at_every_io_step_of_a_tail_split() {
    let (points, synced, written) = record_tail_split();
    let opts = CrashOptions::default();
    for (i, point) in points.iter().enumerate() {
        for s in 0..3u64 {
            let (image, trace) = point.image(i as u64 * 10 + s, &opts);
            let ctx = format!(
                "step {i} (before {:?}), image {s}: {}",
                point.op,
                trace.join("; ")
            );
            let (_d, log) = open_image(&image);
            let topic = log.topic("t").unwrap();
            let is_new = layout(&topic, &ctx);
            let seen = read_all(&topic);
            let n = seen.len() as u64;
            assert!(n >= synced && n <= written, "{ctx}: {n} records");
            check_exactly_once(&seen, 0..n, &ctx);
            if is_new {
                // The record commits after the parent was synced to its end.
                assert_eq!(n, written, "{ctx}: new layout lost records");
            }
            if i + 1 == points.len() {
                assert!(is_new, "{ctx}: after the call returned");
            }
        }
    }
}

// ---- randomized: tail splits among appends, forward splits and merges ----

/// One consumer of the random run: what it was handed so far, and how it
/// goes on (a live reader, or a cut it resumes from later).
enum Consumer {
    Live(fissionlog::Reader, Vec<OwnedRecord>),
    Saved(Cut, Vec<OwnedRecord>),
}

fn random_run(seed: u64, steps: u32) {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), options()).unwrap();
    let mut topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                segment_bytes: 16 * 1024,
                ..config()
            },
        )
        .unwrap();
    let mut n = 0u64;
    let mut consumers: Vec<Consumer> = Vec::new();
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        match rng.random_range(0..14) {
            0..=3 => {
                let k = rng.random_range(1..120);
                append(&topic, n, k);
                n += k;
            }
            4 => {
                let mut r = topic.reader(StartAt::Earliest).unwrap();
                let got = r.poll(rng.random_range(0..=n as usize + 1)).unwrap();
                consumers.push(if rng.random_bool(0.5) {
                    Consumer::Live(r, got)
                } else {
                    Consumer::Saved(r.cut(), got)
                });
            }
            5 => {
                for c in &mut consumers {
                    if let Consumer::Live(r, seen) = c {
                        seen.extend(r.poll(rng.random_range(1..200)).unwrap());
                    }
                }
            }
            6..=8 => {
                let active = topic.active_partitions();
                let id = active[rng.random_range(0..active.len())];
                let p = topic.partition(id).unwrap();
                let (lo, hi) = (p.start_offset(), p.end_offset());
                let x = rng.random_range(lo..=hi);
                match topic.split_tail(id, SplitPlan::Even, TailSplitOptions::from_offset(x)) {
                    Ok(out) => {
                        assert!(out.from <= x, "{ctx}");
                        assert_eq!(out.moved.iter().sum::<u64>(), out.seal_offset - out.from);
                    }
                    // A one-value range or the partition limit.
                    Err(Error::Refused(_)) => {}
                    Err(e) => panic!("{ctx}: {e}"),
                }
            }
            9 => {
                let active = topic.active_partitions();
                let id = active[rng.random_range(0..active.len())];
                let _ = topic.split(id, SplitPlan::Even);
            }
            10 => {
                // The moved ranges' bytes go from the parents.
                log.enforce_retention().unwrap();
            }
            11 => {
                // Clean close or abandon (the process goes on, so the page
                // cache keeps every write): live readers become saved cuts,
                // carried as bytes.
                for c in &mut consumers {
                    if let Consumer::Live(r, seen) = c {
                        let cut = Cut::from_bytes(&r.cut().to_bytes()).unwrap();
                        *c = Consumer::Saved(cut, std::mem::take(seen));
                    }
                }
                drop(topic);
                if rng.random_bool(0.5) {
                    log.close().unwrap();
                } else {
                    log.abandon();
                }
                log = Log::open(dir.path(), options()).unwrap();
                topic = log.topic("t").unwrap();
            }
            _ => {
                let active = topic.active_partitions();
                if active.len() >= 2 {
                    let i = rng.random_range(0..active.len() - 1);
                    // Adjacent in range order.
                    let _ = topic.merge(active[i], active[i + 1]);
                }
            }
        }
    }
    check_exactly_once(&read_all(&topic), 0..n, &format!("seed {seed}: earliest"));
    for (i, c) in consumers.into_iter().enumerate() {
        let ctx = format!("seed {seed}: consumer {i}");
        let seen = match c {
            Consumer::Live(mut r, mut seen) => {
                drain(&mut r, &mut seen);
                seen
            }
            Consumer::Saved(cut, mut seen) => {
                let mut r = topic.reader(StartAt::Cut(cut)).unwrap();
                drain(&mut r, &mut seen);
                seen
            }
        };
        check_exactly_once(&seen, 0..n, &ctx);
    }
}

/// Every record exactly once and per-key order, for the oldest-first
/// reader, live readers and saved cuts, through random tail splits (at any
/// offset, of children of earlier ones too), forward splits, merges,
/// reclaims of moved ranges, appends and reopens (clean or abandoned).
/// `FISSIONLOG_TAIL_RANDOM_SEEDS` and `FISSIONLOG_TAIL_RANDOM_STEPS` raise
/// the number of runs (default 3) and their length (default 60).
#[test]
fn random_tail_splits_keep_every_record_exactly_once_and_key_order() {
    let seeds: u64 = std::env::var("FISSIONLOG_TAIL_RANDOM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let steps: u32 = std::env::var("FISSIONLOG_TAIL_RANDOM_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    for seed in 0..seeds {
        random_run(seed, steps);
    }
}

/// Under `SyncPolicy::Always` readers see durable records only: the moved
/// records, synced before the record committed, are visible in the
/// children at once, and the parent up to its logical end.
#[test]
fn durable_readers_see_the_moved_records_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                sync: SyncPolicy::Always,
                ..config()
            },
        )
        .unwrap();
    append(&topic, 0, 300);
    let (before, cut) = read_some(&topic, 250);
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(100))
        .unwrap();
    for (&c, &m) in out.children.iter().zip(&out.moved) {
        assert_eq!(topic.partition(c).unwrap().durable_end_offset(), m);
    }
    check_exactly_once(&read_all(&topic), 0..300, "durable earliest");
    let mut r = topic.reader(StartAt::Cut(cut)).unwrap();
    let mut seen = before;
    drain(&mut r, &mut seen);
    check_exactly_once(&seen, 0..300, "durable cut");
}

// ---- fault injection -------------------------------------------------

fn partition_dirs(log_dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(log_dir.join("topics/t0"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The descendant index files in the topic's directory.
fn index_files(log_dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(log_dir.join("topics/t0"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tix"))
        .collect()
}

/// Faults at each stage of a tail split: ENOSPC creating a child, ENOSPC
/// while the copy rolls a child's segment (both before the commit: an
/// error, no files left, the parent unchanged and still taking appends),
/// and a failed manifest write (unknown outcome: the log is poisoned, the
/// children kept for the replay; the next open finds no record, removes
/// them as orphans and reports them). Every record is read exactly once
/// throughout, and a retried tail split works.
#[test]
fn faults_before_and_at_the_commit_leave_the_old_layout() {
    #[derive(Default)]
    struct Faults {
        fail_manifest: bool,
        fail_create_segment_after: Option<u32>,
    }
    let dir = tempfile::tempdir().unwrap();
    let hook = model_hook(dir.path());
    let faults = Arc::new(parking_lot::Mutex::new(Faults::default()));
    let f = faults.clone();
    hook.set_fault(Some(Box::new(move |op, _path| {
        let mut s = f.lock();
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
    let small = TopicConfig {
        segment_bytes: 8 * 1024,
        ..config()
    };
    let log = Log::open_with_hook(dir.path(), options(), hook.clone()).unwrap();
    let topic = log.create_topic("t", small).unwrap();
    append(&topic, 0, 2000);
    let dirs = partition_dirs(dir.path());
    assert_eq!(dirs, BTreeSet::from(["p0".to_string()]));

    // ENOSPC creating the second child.
    faults.lock().fail_create_segment_after = Some(1);
    let err = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(100))
        .unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err:?}");
    // ENOSPC when the copy rolls a child to its second segment (8 KiB
    // segments: 2,000 moved records need several).
    faults.lock().fail_create_segment_after = Some(2);
    let err = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(0))
        .unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err:?}");
    faults.lock().fail_create_segment_after = None;
    assert_eq!(partition_dirs(dir.path()), dirs, "no files left behind");
    assert_eq!(topic.active_partitions(), vec![0]);
    append(&topic, 2000, 50);
    check_exactly_once(&read_all(&topic), 0..2050, "after refused copies");

    // The manifest write fails: outcome unknown, the log is poisoned.
    faults.lock().fail_manifest = true;
    let err = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(100))
        .unwrap_err();
    assert!(matches!(err, Error::LogPoisoned { .. }), "{err:?}");
    faults.lock().fail_manifest = false;
    assert_eq!(topic.active_partitions(), vec![0]);
    assert_eq!(
        partition_dirs(dir.path()).len(),
        3,
        "the children a replay could reference are kept"
    );
    drop(topic);
    log.close().unwrap();

    let log = Log::open_with_hook(dir.path(), options(), hook.clone()).unwrap();
    assert_eq!(
        orphans_removed(&log),
        3,
        "orphan children and their index removed and reported"
    );
    assert_eq!(partition_dirs(dir.path()), dirs);
    assert!(index_files(dir.path()).is_empty(), "orphan index removed");
    let topic = log.topic("t").unwrap();
    let info = topic.partitions();
    assert_eq!(info.len(), 1);
    assert!(info[0].moved.is_none() && info[0].sealed_at.is_none());
    check_exactly_once(
        &read_all(&topic),
        0..2050,
        "reopened after the failed commit",
    );
    // A retry works.
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(100))
        .unwrap();
    assert_eq!((out.from, out.seal_offset), (100, 2050));
    check_exactly_once(&read_all(&topic), 0..2050, "after the retried split");
}

/// A parent moved whole (from its first offset) holds nothing for readers:
/// retention's pass removes it like any emptied sealed partition, which
/// releases its bytes. A cut saved inside the moved range before the split
/// still resumes exactly once after the removal, also after a reopen (the
/// descendant index stays with the first child).
#[test]
fn a_wholly_moved_parent_is_removed_and_old_cuts_still_resume_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    // Retention's pass removes emptied partitions only on topics with a
    // retention policy (this one never expires a record).
    let cfg = TopicConfig {
        retention_bytes: Some(1 << 30),
        ..config()
    };
    let topic = log.create_topic("t", cfg).unwrap();
    append(&topic, 0, 500);
    let (before, cut) = read_some(&topic, 200);
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(0))
        .unwrap();
    assert_eq!((out.from, out.seal_offset), (0, 500));
    log.enforce_retention().unwrap();
    assert!(
        topic.partitions().iter().all(|p| p.id != 0),
        "parent removed"
    );
    assert!(
        !dir.path().join("topics/t0/p0").exists(),
        "its bytes released"
    );
    append(&topic, 500, 100);
    check_exactly_once(&read_all(&topic), 0..600, "after the removal");
    let resume = |topic: &Topic, ctx: &str| {
        let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
        let mut seen = before.clone();
        drain(&mut r, &mut seen);
        check_exactly_once(&seen, 0..600, ctx);
    };
    resume(&topic, "cut, same run");
    drop(topic);
    log.close().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic("t").unwrap();
    check_exactly_once(&read_all(&topic), 0..600, "reopened");
    resume(&topic, "cut, after a reopen");
}

/// A backlog larger than the sealed round's share is copied in throttled
/// rounds while another thread keeps appending (to the parent, then to the
/// children): every record exactly once, per-key order kept, and the copy
/// rounds took at least the time the byte budget allows.
#[test]
fn copy_rounds_run_beside_appends_and_keep_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 12_000);
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    // The next sequence number the appender will append.
    let next = Arc::new(AtomicU64::new(12_000));
    let appender = {
        let (topic, stop, next) = (topic.clone(), stop.clone(), next.clone());
        std::thread::spawn(move || {
            let mut i = 12_000u64;
            // About 16,000 records/s: slower than the copy's budget.
            while !stop.load(Ordering::Relaxed) {
                append(&topic, i, 1);
                i += 1;
                next.store(i, Ordering::Release);
                if i.is_multiple_of(16) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            i
        })
    };
    // Waits (at most 10 s) until the appender has appended up to `to`:
    // a thread scheduled late makes the test wait, not pass or fail.
    let appended = |to: u64| {
        let limit = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while next.load(Ordering::Acquire) < to {
            assert!(
                std::time::Instant::now() < limit,
                "the appender stopped at {}",
                next.load(Ordering::Acquire)
            );
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    };
    // It appends to the parent before the split starts...
    appended(12_001);
    let budget = 1_000_000u64;
    let started = std::time::Instant::now();
    let out = topic
        .split_tail(
            0,
            SplitPlan::Even,
            TailSplitOptions {
                from: TailFrom::Offset(2_000),
                throttle_bytes_per_sec: budget,
            },
        )
        .unwrap();
    let took = started.elapsed();
    // ...and in the children for a while after it.
    appended(out.seal_offset + 32);
    stop.store(true, Ordering::Relaxed);
    let n = appender.join().unwrap();
    assert!(out.rounds >= 1, "{out:?}");
    assert!(out.seal_offset > 12_000, "appends moved too: {out:?}");
    assert!(n > out.seal_offset, "appends went on after the split");
    // The first, throttled round copied the 10,000 records of 2,000..12,000
    // (one batch of at least 40 bytes each) at the budget.
    assert!(
        took.as_secs_f64() >= 10_000.0 * 40.0 / budget as f64 * 0.9,
        "{took:?} for {out:?}"
    );
    check_exactly_once(&read_all(&topic), 0..n, "concurrent appends");
}

// ---- key readers across a tail split -----------------------------------

/// The numbers of `key`'s records among `0..n` as `common::tail::append`
/// writes them over `keys` keys.
fn key_seqs(key: u64, keys: u64, n: u64) -> Vec<u64> {
    (0..n).filter(|i| i % keys == key && i % 5 != 4).collect()
}

fn key_record_seq(r: &fissionlog::KeyRecord) -> u64 {
    let v = std::str::from_utf8(&r.value).unwrap();
    v.split(':').next().unwrap().parse().unwrap()
}

/// A key reader reads the records visible when it was made. A tail split
/// made after it moves some of them into the children: the reader follows
/// them there and returns each once, in order; what was appended after it
/// was made is not returned.
#[test]
fn a_key_reader_made_before_a_tail_split_returns_every_record_moved() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    common::tail::append(&topic, 0, 200, 5);
    let reader = topic.key_reader(b"k3");
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(50))
        .unwrap();
    common::tail::append(&topic, 200, 100, 5);
    let got: Vec<u64> = reader.map(|r| key_record_seq(&r.unwrap())).collect();
    assert_eq!(got, key_seqs(3, 5, 200), "the records visible at creation");
    let after: Vec<u64> = topic
        .read_key(b"k3")
        .unwrap()
        .iter()
        .map(key_record_seq)
        .collect();
    assert_eq!(after, key_seqs(3, 5, 300), "a reader made after the split");
}

/// A key reader in the middle of its key, with records read ahead past
/// the split offset (small records: one read took the whole partition) or
/// not (1 KiB records: reads of 256 KiB), meets a tail split from below or
/// above its position: the rest of the key comes from the parent and the
/// children, each record once, in order.
#[test]
fn a_key_reader_in_the_middle_of_its_key_follows_a_tail_split() {
    for (big, from) in [(false, 100), (false, 5), (true, 100), (true, 1500)] {
        let ctx = format!("1 KiB records {big}, split from {from}");
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), options()).unwrap();
        let topic = log.create_topic("t", config()).unwrap();
        if big {
            common::tail::append_big(&topic, 0, 2000, 5);
        } else {
            common::tail::append(&topic, 0, 2000, 5);
        }
        let mut reader = topic.key_reader(b"k3");
        let mut got: Vec<u64> = reader
            .by_ref()
            .take(10)
            .map(|r| key_record_seq(&r.unwrap()))
            .collect();
        topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(from))
            .unwrap();
        common::tail::append(&topic, 2000, 100, 5);
        got.extend(reader.map(|r| key_record_seq(&r.unwrap())));
        assert_eq!(got, key_seqs(3, 5, 2000), "{ctx}");
    }
}

/// Chained tail splits made after a key reader (the child holding the key
/// split in turn, from inside its moved records): the reader's bound in
/// the parent is carried through both, the middle partition keeps what it
/// holds below its own new end, and every record of the key comes once.
#[test]
fn a_key_reader_follows_chained_tail_splits_made_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    // 1 KiB records: the moved ones land in the child in batches of up to
    // 256 KiB, so the second split can start inside them.
    common::tail::append_big(&topic, 0, 1000, 5);
    let reader = topic.key_reader(b"k3");
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(50))
        .unwrap();
    let child = topic.route(b"k3");
    let moved = topic.partition(child).unwrap().end_offset();
    let out = topic
        .split_tail(
            child,
            SplitPlan::Even,
            TailSplitOptions::from_offset(moved / 2),
        )
        .unwrap();
    assert!(out.from > 0 && out.from < moved, "{out:?}");
    common::tail::append(&topic, 1000, 50, 5);
    let got: Vec<u64> = reader.map(|r| key_record_seq(&r.unwrap())).collect();
    assert_eq!(got, key_seqs(3, 5, 1000));
}

/// Readers from `Latest` made over and over while tail splits (and merges
/// back) commit beside them: none ever returns a record appended before
/// it was made. (A `Latest` position taken from a lineage from before a
/// split's commit and an end from after it named the parent's new end,
/// and the reader then read the moved records again from the children.)
#[test]
fn latest_readers_made_while_tail_splits_commit_never_return_older_records() {
    let dir = common::log::fast_tempdir();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    let rounds = churn_rounds(1000);
    let churn = SplitChurn::start(&topic, rounds, 5);
    let mut readers: Vec<(u64, fissionlog::Reader)> = Vec::new();
    let mut made = 0u64;
    while churn.running() {
        let floor = churn.appended();
        readers.push((floor, topic.reader(StartAt::Latest).unwrap()));
        made += 1;
        if readers.len() > 8 {
            readers.remove(0);
        }
        for (floor, r) in &mut readers {
            for rec in r.poll(1000).unwrap() {
                assert!(
                    seq(&rec) >= *floor,
                    "a reader made once {floor} records were appended returned record {} \
                     (partition {} offset {})",
                    seq(&rec),
                    rec.partition,
                    rec.offset
                );
            }
        }
    }
    churn.join();
    assert!(made > u64::from(rounds), "readers made: {made}");
}

/// Groups starting at `Latest`, created over and over while tail splits
/// (and merges back) commit beside them: none ever hands out a record
/// appended before the group was created.
#[test]
fn latest_groups_made_while_tail_splits_commit_never_get_older_records() {
    let dir = common::log::fast_tempdir();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    let rounds = churn_rounds(1000);
    let churn = SplitChurn::start(&topic, rounds, 5);
    let latest = GroupOptions {
        start: fissionlog::GroupStart::Latest,
        ..GroupOptions::default()
    };
    let mut groups = Vec::new();
    let mut made = 0u64;
    while churn.running() {
        let floor = churn.appended();
        let name = format!("g{made}");
        let g = topic.group(&name, latest.clone()).unwrap();
        let m = g.join(member_opts()).unwrap();
        groups.push((floor, name, g, m));
        made += 1;
        if groups.len() > 4 {
            let (_, name, g, m) = groups.remove(0);
            drop((m, g));
            topic.delete_group(&name).unwrap();
        }
        for (floor, _, _, m) in &mut groups {
            for rec in m.poll(1000).unwrap() {
                assert!(
                    seq(&rec) >= *floor,
                    "a group made once {floor} records were appended got record {} \
                     (partition {} offset {})",
                    seq(&rec),
                    rec.partition,
                    rec.offset
                );
            }
        }
    }
    churn.join();
    assert!(made > 10, "groups made: {made}");
}

/// Key readers made and read while tail splits (and merges back) commit
/// beside them, with appends going on: each returns every record of the
/// key appended before it was made, once and in order, and none appended
/// after it was made.
#[test]
fn key_readers_read_while_tail_splits_commit_return_each_record_once() {
    let dir = common::log::fast_tempdir();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    let churn = SplitChurn::start(&topic, churn_rounds(300), 15);
    let mut made = 0u64;
    while churn.running() {
        let floor = churn.appended();
        let reader = topic.key_reader(b"k");
        // At least what returned before it was made, at most what began
        // by then.
        let ceiling = churn.started();
        let mut got = Vec::new();
        for r in reader {
            got.push(key_record_seq(&r.unwrap()));
            if got.len() % 7 == 0 {
                std::thread::yield_now();
            }
        }
        made += 1;
        let ctx = format!("a key reader made between {floor} and {ceiling} records");
        assert!(got.len() as u64 >= floor, "{ctx}: {} returned", got.len());
        assert!(got.len() as u64 <= ceiling, "{ctx}: {} returned", got.len());
        assert_eq!(got, (0..got.len() as u64).collect::<Vec<_>>(), "{ctx}");
    }
    churn.join();
    assert!(made > 1, "key readers made: {made}");
}

/// A reader and a group member waiting without a deadline at the end of a
/// partition wake for records appended after a tail split moved that end
/// into the children (the wait follows the topology, not the parent).
#[test]
fn waits_without_a_deadline_follow_a_tail_split_to_the_children() {
    use std::sync::mpsc;
    use std::time::Duration;
    for member in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), options()).unwrap();
        let topic = log.create_topic("t", config()).unwrap();
        append(&topic, 0, 40);
        let (started, started_rx) = mpsc::channel();
        let (tx, rx) = mpsc::channel();
        let waiter = if member {
            let group = topic.group("g", GroupOptions::default()).unwrap();
            let mut m = group.join(member_opts()).unwrap();
            let mut seen = Vec::new();
            while seen.len() < 40 {
                seen.extend(m.poll(100).unwrap());
            }
            m.commit().unwrap();
            std::thread::spawn(move || {
                started.send(()).unwrap();
                let got = m.poll_wait(100, Duration::MAX).unwrap();
                let _ = tx.send(got);
                drop(group);
            })
        } else {
            let mut r = topic.reader(StartAt::Earliest).unwrap();
            let mut seen = Vec::new();
            drain(&mut r, &mut seen);
            assert_eq!(seen.len(), 40);
            std::thread::spawn(move || {
                started.send(()).unwrap();
                let got = r.poll_wait(100, Duration::MAX).unwrap();
                let _ = tx.send(got);
            })
        };
        started_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let out = topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(30))
            .unwrap();
        assert_eq!(out.from, 30);
        std::thread::sleep(Duration::from_millis(50));
        append(&topic, 40, 13);
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("member {member}: no records after the split: {e}"));
        waiter.join().unwrap();
        assert!(!got.is_empty(), "member {member}");
        assert!(got.iter().all(|r| seq(r) >= 40), "member {member}: {got:?}");
        drop(topic);
        log.close().unwrap();
    }
}

/// A key reader made before a tail split that moves its parent whole
/// returns every record of its key once, also when retention removes the
/// emptied parent before the reader reads, and when it removes it midway.
#[test]
fn a_key_reader_made_before_a_whole_parent_moves_and_is_removed_returns_every_record() {
    for read_before in [0usize, 3] {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), options()).unwrap();
        let cfg = TopicConfig {
            retention_bytes: Some(1 << 30),
            ..config()
        };
        let topic = log.create_topic("t", cfg).unwrap();
        append(&topic, 0, 500);
        let mut reader = topic.key_reader(b"k3");
        let mut got: Vec<u64> = Vec::new();
        for _ in 0..read_before {
            got.push(key_record_seq(&reader.next().unwrap().unwrap()));
        }
        let out = topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(0))
            .unwrap();
        assert_eq!(out.from, 0);
        log.enforce_retention().unwrap();
        assert!(
            topic.partitions().iter().all(|p| p.id != 0),
            "the emptied parent is removed"
        );
        append(&topic, 500, 50);
        for r in reader {
            got.push(key_record_seq(&r.unwrap()));
        }
        assert_eq!(got, key_seqs(3, KEYS, 500), "read {read_before} before");
        drop(topic);
        log.close().unwrap();
    }
}

/// A member that handed out records of a partition a tail split then moves
/// whole, and retention removes, before its next poll: it goes on in the
/// children with exactly what it had not handed out, and after a reopen
/// the group resumes exactly at what it committed.
#[test]
fn a_member_goes_on_exactly_after_its_partition_moves_whole_and_is_removed() {
    for commit_first in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let ctx = format!("commit first {commit_first}");
        let mut seen = Vec::new();
        {
            let log = Log::open(dir.path(), options()).unwrap();
            let cfg = TopicConfig {
                retention_bytes: Some(1 << 30),
                ..config()
            };
            let topic = log.create_topic("t", cfg).unwrap();
            append(&topic, 0, 500);
            let group = topic.group("g", GroupOptions::default()).unwrap();
            let mut m = group.join(member_opts()).unwrap();
            seen.extend(m.poll(200).unwrap());
            if commit_first {
                m.commit().unwrap();
            }
            topic
                .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(0))
                .unwrap();
            log.enforce_retention().unwrap();
            assert!(topic.partitions().iter().all(|p| p.id != 0), "{ctx}");
            append(&topic, 500, 50);
            seen.extend(m.poll(120).unwrap());
            m.commit().unwrap();
            let d = group.describe();
            let distinct: BTreeSet<u64> = seen.iter().map(seq).collect();
            assert_eq!(
                distinct.len(),
                seen.len(),
                "{ctx}: a record handed out twice"
            );
            assert_eq!(d.stats.redelivered, 0, "{ctx}");
            drop((m, group, topic));
            log.close().unwrap();
        }
        let log = Log::open(dir.path(), options()).unwrap();
        let topic = log.topic("t").unwrap();
        let group = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = group.join(member_opts()).unwrap();
        loop {
            let got = m.poll(64).unwrap();
            if got.is_empty() {
                break;
            }
            seen.extend(got);
            m.commit().unwrap();
        }
        check_exactly_once(&seen, 0..550, &format!("{ctx}, after reopen"));
    }
}

/// Readers polling in their own threads while appends go on in another and
/// the main thread tail-splits (with copy rounds beside the appends),
/// splits forward and merges: each reader returns every record once, per
/// key in order.
#[test]
fn readers_polling_beside_tail_splits_appends_and_merges_return_each_record_once() {
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let seed: u64 = std::env::var("FISSIONLOG_TAIL_THREAD_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    eprintln!("seed {seed}");
    let dir = common::log::fast_tempdir();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                segment_bytes: 16 * 1024,
                ..config()
            },
        )
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let appended = Arc::new(AtomicU64::new(0));
    let writer = {
        let (topic, stop, appended) = (topic.clone(), stop.clone(), appended.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                append(&topic, n, 7);
                n += 7;
                appended.store(n, Ordering::SeqCst);
            }
            n
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (topic, stop) = (topic.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut r = topic.reader(StartAt::Earliest).unwrap();
                let mut seen = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    seen.extend(
                        r.poll_wait(50, std::time::Duration::from_millis(5))
                            .unwrap(),
                    );
                }
                (r, seen)
            })
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for step in 0..60u64 {
        // Let the writer get ahead of this step.
        let want = (step + 1) * 40;
        let waited = std::time::Instant::now();
        while appended.load(Ordering::SeqCst) < want
            && waited.elapsed() < std::time::Duration::from_secs(5)
        {
            std::thread::yield_now();
        }
        let active = topic.active_partitions();
        let id = active[rng.random_range(0..active.len())];
        match rng.random_range(0..5) {
            0..=2 if active.len() < 10 => {
                let p = topic.partition(id).unwrap();
                let (lo, hi) = (p.start_offset(), p.end_offset());
                let x = rng.random_range(lo..=hi);
                match topic.split_tail(
                    id,
                    SplitPlan::Even,
                    TailSplitOptions {
                        from: TailFrom::Offset(x),
                        throttle_bytes_per_sec: 2_000_000,
                    },
                ) {
                    Ok(_) | Err(Error::Refused(_)) => {}
                    Err(e) => panic!("seed {seed} step {step}: {e}"),
                }
            }
            3 if active.len() < 10 => {
                let _ = topic.split(id, SplitPlan::Even);
            }
            _ if active.len() >= 2 => {
                let i = rng.random_range(0..active.len() - 1);
                let _ = topic.merge(active[i], active[i + 1]);
            }
            _ => {}
        }
    }
    stop.store(true, Ordering::SeqCst);
    let n = writer.join().unwrap();
    for (i, h) in readers.into_iter().enumerate() {
        let (mut r, mut seen) = h.join().unwrap();
        drain(&mut r, &mut seen);
        check_exactly_once(&seen, 0..n, &format!("seed {seed}: reader {i}"));
    }
    check_exactly_once(&read_all(&topic), 0..n, &format!("seed {seed}: earliest"));
}
