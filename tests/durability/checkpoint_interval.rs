//! The recovery checkpoint is written when due (`LogOptions::checkpoint_interval`)
//! or when something needs it (open, retention, clean close), not in every
//! sync round; a power loss after rounds that synced data but no checkpoint
//! keeps every synced record (C1), and recovery scans only what follows the
//! last checkpoint (C7).

use crate::common;
use common::faults::{Both, Record};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::crash::{power_loss_image_traced, CrashOptions, DirImage};
use fissionlog::{IoHook, IoOp};
use fissionlog::{Log, LogOptions, NewRecord, RecoveryMode, TopicConfig};

/// Records each file's content when its own fsync returns (a copy of the
/// file at a call, which the kit's hooks do not take): what a power
/// loss keeps of it (a checkpoint file left unsynced keeps its older bytes,
/// whatever the directory looks like when `sync()` returns).
#[derive(Debug)]
struct FsyncImage {
    root: PathBuf,
    files: Mutex<BTreeMap<PathBuf, Vec<u8>>>,
}

impl IoHook for FsyncImage {
    fn before(&self, _op: IoOp, _path: &Path) -> std::io::Result<()> {
        Ok(())
    }

    fn after(&self, _op: IoOp, path: &Path, result: std::io::Result<()>) -> std::io::Result<()> {
        if result.is_ok() && path.is_file() {
            let rel = path.strip_prefix(&self.root).unwrap().to_path_buf();
            let bytes = std::fs::read(path).unwrap();
            self.files.lock().unwrap().insert(rel, bytes);
        }
        result
    }
}

impl FsyncImage {
    /// The directory as captured now, each file holding what it held at
    /// its last fsync (files never synced are left out: a crash may lose
    /// them).
    fn durable(&self) -> DirImage {
        let mut img = DirImage::capture(&self.root).unwrap();
        let synced = self.files.lock().unwrap();
        img.files.retain(|p, _| synced.contains_key(p));
        for (p, b) in img.files.iter_mut() {
            *b = synced[p].clone();
        }
        img
    }
}

fn opts(interval: Duration) -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        recovery: RecoveryMode::Strict,
        checkpoint_interval: interval,
        ..LogOptions::default()
    }
}

fn config(segment_bytes: u64) -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes,
        ..TopicConfig::default()
    }
}

fn value(i: u64) -> Vec<u8> {
    (0..40 + i % 90).map(|j| (i * 31 + j) as u8).collect()
}

fn put(log: &Log, from: u64, n: u64) {
    let t = log.topic("t").unwrap();
    for i in from..from + n {
        let at = t
            .append_to(
                0,
                &[NewRecord {
                    key: Some(b"k"),
                    value: &value(i),
                    timestamp: Some(i as i64),
                }],
            )
            .unwrap();
        assert_eq!(at, i);
    }
}

/// Checks partition 0 holds exactly `0..end` with the values `put` wrote.
fn check_prefix(log: &Log, at_least: u64, at_most: u64, ctx: &str) -> u64 {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let end = p.end_offset();
    assert!(
        end >= at_least,
        "{ctx}: synced records lost: end {end} < {at_least}"
    );
    assert!(
        end <= at_most,
        "{ctx}: phantom records: end {end} > {at_most}"
    );
    let mut next = p.start_offset();
    assert_eq!(next, 0, "{ctx}");
    while next < end {
        let b = p.read(next, 1 << 20).unwrap();
        for r in b.iter() {
            assert_eq!(r.offset, next, "{ctx}");
            assert_eq!(r.value, value(next).as_slice(), "{ctx}: record {next}");
            next += 1;
        }
    }
    end
}

#[test]
fn checkpoint_is_written_only_when_due_or_needed() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let hook = Arc::new(Record::default());
    let log = Log::open_with_hook(&dir, opts(Duration::from_secs(3600)), hook.clone()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            retention_bytes: Some(1),
            ..config(4096)
        },
    )
    .unwrap();
    let after_open = hook.count(IoOp::WriteCheckpoint);
    assert!(after_open >= 2, "open writes both checkpoint files");
    let syncs_before = hook.count(IoOp::SyncSegment);
    for round in 0..40 {
        put(&log, round * 3, 3);
        log.sync().unwrap();
    }
    assert!(hook.count(IoOp::SyncSegment) >= syncs_before + 40);
    assert_eq!(
        hook.count(IoOp::WriteCheckpoint),
        after_open,
        "rounds inside the interval sync data only"
    );
    // Retention may not retire the segments the last two checkpoints name;
    // held back by them, it has the following rounds write checkpoints
    // rather than wait for the interval.
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert!(p.segment_count() > 3, "the rounds rolled segments");
    assert_eq!(
        log.enforce_retention().unwrap(),
        0,
        "held by the checkpoints"
    );
    for _ in 0..3 {
        log.sync().unwrap();
    }
    // Two writes put the current entries in both checkpoint files; a third
    // would write the same bytes again, so it is skipped.
    assert_eq!(
        hook.count(IoOp::WriteCheckpoint),
        after_open + 2,
        "rounds write the checkpoint while retention waits for it, until both files are current"
    );
    // Raising the floor writes (and syncs) a checkpoint before unlinking.
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(p.start_offset() > 0);
    let after_retention = hook.count(IoOp::WriteCheckpoint);
    assert!(
        after_retention > after_open + 2,
        "the new floor was not checkpointed"
    );
    // A clean close writes the clean checkpoint. (The partition handle
    // holds the directory lock: let it go first.)
    drop(p);
    log.close().unwrap();
    assert!(hook.count(IoOp::WriteCheckpoint) > after_retention);

    // With a zero interval every round writes one (the protocol before the
    // interval existed).
    let hook = Arc::new(Record::default());
    let log = Log::open_with_hook(&dir, opts(Duration::ZERO), hook.clone()).unwrap();
    let after_open = hook.count(IoOp::WriteCheckpoint);
    for round in 0..5 {
        put(&log, 120 + round, 1);
        log.sync().unwrap();
    }
    assert_eq!(hook.count(IoOp::WriteCheckpoint), after_open + 5);
    log.close().unwrap();
}

/// A power loss after many rounds that synced data (and rolled segments)
/// but wrote no checkpoint keeps every synced record; recovery scans from
/// the last checkpoint, so it reads what those rounds wrote and no more.
#[test]
fn crash_after_rounds_without_checkpoint_keeps_every_synced_record() {
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("base");
    let hook = Arc::new(Record::default());
    let image = Arc::new(FsyncImage {
        root: base.clone(),
        files: Mutex::new(BTreeMap::new()),
    });
    let seg = 4096;
    let log = Log::open_with_hook(&base, opts(Duration::from_secs(3600)), image.clone()).unwrap();
    log.create_topic("t", config(seg)).unwrap();
    put(&log, 0, 30);
    log.sync().unwrap();
    log.abandon();
    // Reopening writes checkpoints naming the end of those 30 records.
    // Counts and records.
    let both = Arc::new(Both(hook.clone(), image.clone()));
    let log = Log::open_with_hook(&base, opts(Duration::from_secs(3600)), both).unwrap();
    let checkpoints = hook.count(IoOp::WriteCheckpoint);
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let checkpointed_bytes = p.size_bytes();
    let mut synced = 30;
    for round in 0..12 {
        put(&log, synced, 4 + round % 5);
        synced += 4 + round % 5;
        log.sync().unwrap();
    }
    assert_eq!(
        hook.count(IoOp::WriteCheckpoint),
        checkpoints,
        "no checkpoint inside the interval"
    );
    assert!(p.segment_count() > 3, "the rounds rolled segments");
    let synced_bytes = p.size_bytes() - checkpointed_bytes;
    let durable = image.durable();
    assert!(
        durable.files.keys().any(|f| f.ends_with("checkpoint.0")),
        "the checkpoint files were synced at open"
    );
    put(&log, synced, 9); // never synced
    let appended = synced + 9;
    let total_bytes = p.size_bytes() - checkpointed_bytes;
    drop(p);
    log.abandon();
    let current = DirImage::capture(&base).unwrap();
    for seed in 0..24u64 {
        let opts_crash = CrashOptions {
            torn_any_byte: seed % 2 == 1,
            keep_all_new_probability: 0.0,
        };
        let (image, trace) = power_loss_image_traced(&durable, &current, seed, &opts_crash);
        let dir = root.path().join(format!("crash-{seed}"));
        image.write_to(&dir).unwrap();
        let log = Log::open(&dir, opts(Duration::from_secs(3600)))
            .unwrap_or_else(|e| panic!("seed {seed}: open failed: {e}; {}", trace.join("; ")));
        let rep = log.recovery_report().clone();
        let ctx = format!("seed {seed}: {}; {rep:#?}", trace.join("; "));
        check_prefix(&log, synced, appended, &ctx);
        // The scan starts at the checkpoint: it covers the rounds after it
        // (each record it keeps) and never the 30 records below it.
        assert!(
            rep.bytes_scanned >= synced_bytes && rep.bytes_scanned <= total_bytes,
            "scanned {} bytes, synced since the checkpoint {synced_bytes}, written {total_bytes}. {ctx}",
            rep.bytes_scanned
        );
        // C7: a second open changes nothing.
        log.abandon();
        let log = Log::open(&dir, opts(Duration::from_secs(3600))).unwrap();
        assert!(!log.recovery_report().changed_anything(), "{ctx}");
        check_prefix(&log, synced, appended, &ctx);
        log.close().unwrap();
    }
}
