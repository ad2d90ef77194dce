//! C1, C3, C7, C8 for the repair of synced segments that came back with
//! only their header (their records lost): Truncate and Salvage fill the
//! lost offsets with a hole, the hole segment taking the place (and the
//! name) of a header-only segment at the end of the chain. Each shape is
//! repaired once without interruption, then again from a power-loss image
//! taken before every I/O step of that repair (the per-file crash model of
//! `common::model_hook`): every image must repair to the same reads, never
//! hand a lost offset out again, and leave a log a second open does not
//! change.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::crash::{CrashOptions, DirImage};
use common::model_hook::ModelHook;
use fissionlog::{Log, LogOptions, NewRecord, RecoveryMode, SplitPlan, SyncPolicy, TopicConfig};

use super::power_loss_repairs::live_image;

/// Length of a segment header.
const SEGMENT_HEADER: u64 = 64;

fn opts(recovery: RecoveryMode) -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        recovery,
        // Every sync round writes the checkpoint of the previous round's
        // durable positions: two syncs put it at the synced end.
        checkpoint_interval: Duration::ZERO,
        ..LogOptions::default()
    }
}

fn topic() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 4096,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    }
}

/// Appends `n` records of 200 bytes filled with `tag` to `partition` of "t".
fn put(log: &Log, partition: u32, tag: u8, n: u64) -> u64 {
    let value = vec![tag; 200];
    let mut last = 0;
    for _ in 0..n {
        last = log
            .topic("t")
            .unwrap()
            .append_to(
                partition,
                &[NewRecord {
                    key: Some(b"k"),
                    value: &value,
                    timestamp: Some(i64::from(tag)),
                }],
            )
            .unwrap();
    }
    last
}

/// What `partition` of "t" reads as, offset by offset: the tag of the
/// record there, `H` for a reported hole, or what went wrong.
fn reads(log: &Log, partition: u32) -> Vec<String> {
    let p = log.topic("t").unwrap().partition(partition).unwrap();
    (p.start_offset()..p.end_offset())
        .map(|i| match p.read(i, 1) {
            Ok(b) => match b.iter().next() {
                Some(r) if r.offset == i => format!("{}", r.value[0]),
                Some(r) => format!("offset {} at {i}", r.offset),
                None => "nothing".into(),
            },
            Err(fissionlog::Error::Hole { .. }) => "H".into(),
            Err(e) => format!("{e}"),
        })
        .collect()
}

/// Cuts a segment file to its header: its records are lost.
fn keep_only_header(path: &Path) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(SEGMENT_HEADER).unwrap();
}

/// Where the header-only segments are.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// The only segment of an initial partition.
    OnlySegment,
    /// The last (writer) segment of a partition with rolled ones before it.
    WriterSegment,
    /// A rolled segment in the middle of the chain.
    MiddleSegment,
    /// A rolled segment in the middle of the chain whose seal was lost
    /// with its records.
    UnsealedMiddleSegment,
    /// The last two segments.
    TwoLastSegments,
    /// The only segment of a split's child.
    ChildSegment,
}

/// A damaged log of `shape` in `dir`, every file of it durable: the
/// partition that holds the header-only segments, and the offsets known
/// to have been handed out (appends after a repair never go below).
fn build(dir: &Path, shape: Shape) -> (u32, u64) {
    let log = Log::open(dir, opts(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", topic()).unwrap();
    let (partition, records) = match shape {
        Shape::OnlySegment => (0, 5),
        Shape::WriterSegment
        | Shape::MiddleSegment
        | Shape::UnsealedMiddleSegment
        | Shape::TwoLastSegments => (0, 60),
        Shape::ChildSegment => {
            put(&log, 0, 1, 5);
            let children = log.topic("t").unwrap().split(0, SplitPlan::Even).unwrap();
            (children[0], 5)
        }
    };
    put(&log, partition, 2, records);
    log.sync().unwrap();
    log.sync().unwrap();
    let segs = log
        .topic("t")
        .unwrap()
        .partition(partition)
        .unwrap()
        .segment_infos();
    let end = log
        .topic("t")
        .unwrap()
        .partition(partition)
        .unwrap()
        .end_offset();
    log.close().unwrap();
    let damaged: Vec<&PathBuf> = match shape {
        Shape::OnlySegment | Shape::ChildSegment => {
            assert_eq!(segs.len(), 1, "{shape:?}");
            vec![&segs[0].path]
        }
        Shape::WriterSegment => vec![&segs.last().unwrap().path],
        Shape::MiddleSegment | Shape::UnsealedMiddleSegment => {
            assert!(segs.len() >= 3, "{shape:?}: {} segments", segs.len());
            vec![&segs[segs.len() / 2].path]
        }
        Shape::TwoLastSegments => {
            assert!(segs.len() >= 3, "{shape:?}: {} segments", segs.len());
            segs[segs.len() - 2..].iter().map(|s| &s.path).collect()
        }
    };
    for p in damaged {
        keep_only_header(p);
        if matches!(shape, Shape::UnsealedMiddleSegment) {
            // The seal's 20 bytes at byte 44 of the header (docs/FORMAT.md).
            let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 20], 44).unwrap();
        }
    }
    (partition, end)
}

/// One shape, repaired in `mode` without interruption and from a power
/// loss before each I/O step of that repair; returns what went wrong.
fn power_loss_at_every_step(root: &Path, shape: Shape, mode: RecoveryMode) -> Vec<String> {
    let name = format!("{shape:?}-{mode:?}");
    let pristine = root.join(format!("{name}-pristine"));
    let (partition, handed_out) = build(&pristine, shape);
    let repair = root.join(format!("{name}-repair"));
    DirImage::capture(&pristine)
        .unwrap()
        .write_to(&repair)
        .unwrap();
    let hook = ModelHook::new(&repair, None);
    hook.record_steps(true);
    let log = Log::open_with_hook(&repair, opts(mode), hook.clone())
        .unwrap_or_else(|e| panic!("{name}: the repair failed: {e}"));
    let repaired = reads(&log, partition);
    log.abandon();
    let steps = hook.take_steps();
    let mut failures = Vec::new();
    if !repaired.iter().any(|r| r == "H") {
        failures.push(format!("{name}: no hole after the repair: {repaired:?}"));
    }
    if (repaired.len() as u64) < handed_out {
        failures.push(format!(
            "{name}: the repaired partition ends at {} below {handed_out}",
            repaired.len()
        ));
    }
    for (i, step) in steps.iter().enumerate() {
        let mut images = vec![("live".to_string(), live_image(step))];
        for seed in 0..3 {
            images.push((
                format!("seed {seed}"),
                step.image(seed, &CrashOptions::default()).0,
            ));
        }
        for (what, img) in images {
            let dir = root.join(format!("{name}-s{i}-{}", what.replace(' ', "")));
            img.write_to(&dir).unwrap();
            let ctx = format!(
                "{name}: power loss before step {i} ({:?} {}), {what}",
                step.op,
                step.path.display()
            );
            failures.extend(check_image(&dir, partition, mode, &repaired, &ctx));
        }
    }
    // The repair run again on its own result (a crash right after it).
    let ctx = format!("{name}: a second repair");
    failures.extend(check_image(&repair, partition, mode, &repaired, &ctx));
    failures
}

/// Opens a power-loss image of a repair in `mode` and checks it repairs
/// to `repaired`, appends after every offset handed out, and that a second
/// open changes nothing.
fn check_image(
    dir: &Path,
    partition: u32,
    mode: RecoveryMode,
    repaired: &[String],
    ctx: &str,
) -> Option<String> {
    let log = match Log::open(dir, opts(mode)) {
        Ok(log) => log,
        Err(e) => return Some(format!("{ctx}: open failed: {e}")),
    };
    let got = reads(&log, partition);
    if got != repaired {
        return Some(format!(
            "{ctx}: reads {got:?}, the uninterrupted repair {repaired:?}; report {:?}",
            log.recovery_report().files
        ));
    }
    let next = put(&log, partition, 9, 1);
    if next != repaired.len() as u64 {
        return Some(format!(
            "{ctx}: the next append got offset {next}, expected {}",
            repaired.len()
        ));
    }
    log.sync().unwrap();
    log.close().unwrap();
    let log = match Log::open(dir, opts(RecoveryMode::Strict)) {
        Ok(log) => log,
        Err(e) => return Some(format!("{ctx}: Strict reopen failed: {e}")),
    };
    if log.recovery_report().changed_anything() {
        return Some(format!(
            "{ctx}: a second open changed {:?}",
            log.recovery_report().files
        ));
    }
    let mut want = repaired.to_vec();
    want.push("9".into());
    let got = reads(&log, partition);
    (got != want).then(|| format!("{ctx}: after reopen reads {got:?}, expected {want:?}"))
}

fn run(shape: Shape) {
    let root = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for mode in [RecoveryMode::Truncate, RecoveryMode::Salvage] {
        failures.extend(power_loss_at_every_step(root.path(), shape, mode));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn power_loss_during_the_hole_repair_of_a_header_only_only_segment() {
    run(Shape::OnlySegment);
}

#[test]
fn power_loss_during_the_hole_repair_of_a_header_only_writer_segment() {
    run(Shape::WriterSegment);
}

#[test]
fn power_loss_during_the_repair_of_a_header_only_middle_segment() {
    run(Shape::MiddleSegment);
}

#[test]
fn power_loss_during_the_hole_repair_of_a_header_only_middle_segment_without_its_seal() {
    run(Shape::UnsealedMiddleSegment);
}

#[test]
fn power_loss_during_the_hole_repair_of_two_header_only_last_segments() {
    run(Shape::TwoLastSegments);
}

#[test]
fn power_loss_during_the_hole_repair_of_a_header_only_child_segment() {
    run(Shape::ChildSegment);
}
