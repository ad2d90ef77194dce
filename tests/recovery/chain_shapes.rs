//! Segment chains of the wrong shape below the checkpoint: a zero-length
//! segment in the middle, a missing middle segment, a segment whose name
//! overlaps the one before it, a missing last segment the checkpoint
//! names. Strict refuses and changes no file; Truncate keeps the prefix
//! before the damage, Salvage every intact segment, and both keep every
//! offset handed out (the rest reads as holes, C8). Every record read is
//! the one appended at its offset (C2). A repair that an I/O error stops
//! part way, opened again, ends exactly where one uninterrupted repair
//! does (an append after it reads back), and a further open changes
//! nothing (C7).

use crate::common;
use common::crash::DirImage;
use common::faults::Fail;
use common::log::fast_tempdir;
use common::log::{quiet_in, value};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fissionlog::{Error, FileAction, IoOp, Log, LogOptions, NewRecord, RecoveryMode, TopicConfig};

/// Records per 4 KiB segment (157-byte batches after a 64-byte header).
const PER_SEG: u64 = 25;
const N: u64 = 4 * PER_SEG - 20;

fn opts(mode: RecoveryMode) -> LogOptions {
    LogOptions {
        checkpoint_interval: std::time::Duration::ZERO,
        ..quiet_in(mode)
    }
}

fn seg(base: u64) -> PathBuf {
    PathBuf::from(format!("topics/t0/p0/{base:020}.seg"))
}

/// A crashed log of `N` synced and checkpointed records in segments
/// based at 0, 25, 50 and 75.
fn image() -> DirImage {
    let root = fast_tempdir();
    let log = Log::open(root.path(), opts(RecoveryMode::Strict)).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: 4096,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    let t = log.topic("t").unwrap();
    for i in 0..N {
        let at = t
            .append_batch(&[NewRecord {
                key: Some(b"k"),
                value: &value(i),
                timestamp: Some(i as i64),
            }])
            .unwrap();
        assert_eq!(at[0].offset, i);
    }
    let bases: Vec<u64> = t
        .partition(0)
        .unwrap()
        .segment_infos()
        .iter()
        .map(|s| s.base_offset)
        .collect();
    assert_eq!(bases, [0, PER_SEG, 2 * PER_SEG, 3 * PER_SEG]);
    log.sync().unwrap();
    log.sync().unwrap();
    drop(t);
    log.abandon();
    DirImage::capture(root.path()).unwrap()
}

/// A damaged chain, and the offsets Truncate and Salvage keep of it.
struct Shape {
    name: &'static str,
    damage: fn(&mut DirImage),
    /// Kept offset ranges, `[start, end)`.
    truncate_keeps: (u64, u64),
    salvage_keeps: Vec<(u64, u64)>,
}

fn shapes() -> Vec<Shape> {
    let p = PER_SEG;
    vec![
        Shape {
            name: "a zero-length segment in the middle",
            damage: |img| {
                img.files.insert(seg(PER_SEG), Vec::new());
            },
            truncate_keeps: (0, p),
            salvage_keeps: vec![(0, p), (2 * p, N)],
        },
        Shape {
            name: "a missing middle segment",
            damage: |img| {
                img.files.remove(&seg(PER_SEG));
            },
            truncate_keeps: (0, p),
            salvage_keeps: vec![(0, p), (2 * p, N)],
        },
        Shape {
            name: "a segment named below the end of the one before it",
            damage: |img| {
                let bytes = img.files.remove(&seg(2 * PER_SEG)).unwrap();
                img.files.insert(seg(2 * PER_SEG - 5), bytes);
            },
            truncate_keeps: (0, 2 * p),
            salvage_keeps: vec![(0, 2 * p), (3 * p, N)],
        },
        Shape {
            name: "a missing last segment the checkpoint names",
            damage: |img| {
                img.files.remove(&seg(3 * PER_SEG));
            },
            truncate_keeps: (0, 3 * p),
            salvage_keeps: vec![(0, 3 * p)],
        },
    ]
}

/// The offsets of partition 0 that read as records (each checked against
/// what was appended there), its end, and the holes met.
fn read_all(log: &Log) -> (Vec<u64>, u64, Vec<(u64, u64)>) {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let end = p.end_offset();
    let (mut seen, mut holes) = (Vec::new(), Vec::new());
    let mut next = p.start_offset();
    while next < end {
        match p.read(next, 1 << 20) {
            Ok(b) => {
                for r in b.iter() {
                    assert_eq!(r.offset, next);
                    assert_eq!(r.value, value(next).as_slice(), "record {next}");
                    seen.push(next);
                    next += 1;
                }
            }
            Err(Error::Hole { start, end, .. }) => {
                assert_eq!(start, next, "a hole starting elsewhere");
                holes.push((start, end));
                next = end;
            }
            Err(e) => panic!("read {next}: {e}"),
        }
    }
    (seen, end, holes)
}

/// Appends the record of the partition's end offset and checks it takes
/// that offset.
fn append_next(log: &Log, what: &str) {
    let t = log.topic("t").unwrap();
    let end = t.partition(0).unwrap().end_offset();
    let at = t
        .append_batch(&[NewRecord {
            key: Some(b"k"),
            value: &value(end),
            timestamp: None,
        }])
        .unwrap_or_else(|e| panic!("{what}: append: {e}"));
    assert_eq!(at[0].offset, end, "{what}");
}

fn flat(r: &[(u64, u64)]) -> Vec<u64> {
    r.iter().flat_map(|&(a, b)| a..b).collect()
}

fn files(dir: &Path) -> DirImage {
    let mut img = DirImage::capture(dir).unwrap();
    img.files.retain(|k, _| k.starts_with("topics"));
    img
}

fn damaged(img: &DirImage, shape: &Shape) -> tempfile::TempDir {
    let mut img = img.clone();
    (shape.damage)(&mut img);
    let dir = fast_tempdir();
    img.write_to(dir.path()).unwrap();
    dir
}

/// Opens again in Strict: nothing is repaired, the same records read, and
/// `verify` is clean.
fn settled(dir: &Path, want: &(Vec<u64>, u64, Vec<(u64, u64)>), what: &str) {
    let log = Log::open(dir, opts(RecoveryMode::Strict))
        .unwrap_or_else(|e| panic!("{what}: open after the repair: {e}"));
    let rep = log.recovery_report().clone();
    assert!(
        rep.files
            .iter()
            .all(|f| matches!(f.action, FileAction::ForeignFile)),
        "{what}: an open after the repair repaired again: {rep:#?}"
    );
    assert_eq!(&read_all(&log), want, "{what}: after the repair");
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir).unwrap();
    assert!(problems.is_empty(), "{what}: verify: {problems:#?}");
}

#[test]
fn damaged_chain_shapes_are_refused_untouched_then_repaired_keeping_every_handed_out_offset() {
    let img = image();
    for shape in shapes() {
        let dir = damaged(&img, &shape);
        let before = files(dir.path());
        match Log::open(dir.path(), opts(RecoveryMode::Strict)) {
            Err(Error::Corruption { .. }) => {}
            Err(e) => panic!("{}: Strict failed with {e}", shape.name),
            Ok(_) => panic!("{}: Strict opened the damaged chain", shape.name),
        }
        let after = files(dir.path());
        assert!(
            after == before,
            "{}: Strict changed files: {}",
            shape.name,
            after.diff_summary(&before)
        );
        let (_, problems) = fissionlog::verify(dir.path()).unwrap();
        assert!(!problems.is_empty(), "{}: verify is clean", shape.name);
        for (mode, keeps) in [
            (RecoveryMode::Truncate, vec![shape.truncate_keeps]),
            (RecoveryMode::Salvage, shape.salvage_keeps.clone()),
        ] {
            let what = format!("{} in {mode:?}", shape.name);
            let dir = damaged(&img, &shape);
            let log = Log::open(dir.path(), opts(mode)).unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = read_all(&log);
            assert_eq!(got.0, flat(&keeps), "{what}: records kept");
            assert!(
                got.1 >= N,
                "{what}: ends at {} below {N}, handed out",
                got.1
            );
            // The next append takes a fresh offset and reads back.
            append_next(&log, &what);
            let got = read_all(&log);
            log.close().unwrap();
            settled(dir.path(), &got, &what);
        }
    }
}

#[test]
fn a_salvage_an_io_error_stops_part_way_ends_where_one_uninterrupted_salvage_does() {
    let img = image();
    let ops = [
        IoOp::SyncRecoveryDir,
        IoOp::CreateSegment,
        IoOp::SyncNewSegment,
        IoOp::SyncNewDir,
        IoOp::SyncSegment,
        IoOp::SyncDir,
        IoOp::WriteCheckpoint,
        IoOp::SyncCheckpoint,
    ];
    for shape in shapes() {
        let reference = {
            let dir = damaged(&img, &shape);
            let log = Log::open(dir.path(), opts(RecoveryMode::Salvage)).unwrap();
            append_next(&log, shape.name);
            let got = read_all(&log);
            log.close().unwrap();
            got
        };
        for op in ops {
            for nth in 0..3 {
                let what = format!("{}: {op:?} call {nth} fails", shape.name);
                let dir = damaged(&img, &shape);
                let fail = Arc::new(Fail::new(op, libc::EIO).failing_from(nth).once());
                // The process stops here, as after a crash.
                if let Ok(log) = Log::open_with_hook(dir.path(), opts(RecoveryMode::Salvage), fail)
                {
                    log.abandon();
                }
                let log = Log::open(dir.path(), opts(RecoveryMode::Salvage))
                    .unwrap_or_else(|e| panic!("{what}: open after: {e}"));
                append_next(&log, &what);
                assert_eq!(read_all(&log), reference, "{what}");
                log.close().unwrap();
                settled(dir.path(), &reference, &what);
            }
        }
    }
}

#[test]
fn a_full_truncate_of_a_rolled_segment_an_io_error_stops_part_way_ends_where_an_uninterrupted_one_does(
) {
    let img = image();
    // A flipped byte inside record 30, in the rolled segment based at 25.
    let damage = |img: &mut DirImage| {
        let s = img.files.get_mut(&seg(PER_SEG)).unwrap();
        s[(64 + 5 * 157 + 60) as usize] ^= 0xFF;
    };
    let fresh = || {
        let mut img = img.clone();
        damage(&mut img);
        let dir = fast_tempdir();
        img.write_to(dir.path()).unwrap();
        dir
    };
    let full_truncate = LogOptions {
        full_scan: true,
        ..opts(RecoveryMode::Truncate)
    };
    let reference = {
        let dir = fresh();
        let log = Log::open(dir.path(), full_truncate.clone()).unwrap();
        append_next(&log, "uninterrupted");
        let got = read_all(&log);
        log.close().unwrap();
        got
    };
    assert_eq!(reference.0[..30], (0..30).collect::<Vec<u64>>()[..]);
    let ops = [
        IoOp::SyncRecoveryDir,
        IoOp::CreateSegment,
        IoOp::SyncNewSegment,
        IoOp::SyncNewDir,
        IoOp::SyncSegment,
        IoOp::SyncDir,
        IoOp::WriteIndex,
        IoOp::WriteCheckpoint,
        IoOp::SyncCheckpoint,
    ];
    for op in ops {
        for nth in 0..4 {
            let what = format!("{op:?} call {nth} fails");
            let dir = fresh();
            let fail = Arc::new(Fail::new(op, libc::EIO).failing_from(nth).once());
            // The process stops here, as after a crash.
            if let Ok(log) = Log::open_with_hook(dir.path(), full_truncate.clone(), fail) {
                log.abandon();
            }
            let log = Log::open(dir.path(), opts(RecoveryMode::Truncate))
                .unwrap_or_else(|e| panic!("{what}: open after: {e}"));
            append_next(&log, &what);
            assert_eq!(read_all(&log), reference, "{what}");
            log.close().unwrap();
            settled(dir.path(), &reference, &what);
        }
    }
}
