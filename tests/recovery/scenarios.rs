//! Focused recovery scenarios (C1, C3, C7) and regression tests for
//! recovery and durability fixes.

use crate::common;
use common::log::no_balancer_in;
use common::log::value;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::crash::{flip_byte, zero_range, DirImage};
use fissionlog::FileAction;
use fissionlog::IoOp;
use fissionlog::{Error, Log, LogOptions, NewRecord, RecoveryMode, TopicConfig};

const SEG: u64 = 4096;
/// One record with key "k" and a 100-byte value: 40 + 16 + 1 + 100 bytes.
const BATCH: u64 = 157;
const HEADER: u64 = 64;

/// A checkpoint in every sync round (`checkpoint_interval` zero), for the
/// scenarios that put synced data *below* the checkpoint (or move the
/// checkpointed segments) by syncing; with the default interval a sync
/// writes no checkpoint until one is due (tests/durability/checkpoint_interval.rs).
fn opts_every_round(mode: RecoveryMode) -> LogOptions {
    LogOptions {
        checkpoint_interval: std::time::Duration::ZERO,
        ..no_balancer_in(mode)
    }
}

fn config() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: SEG,
        ..TopicConfig::default()
    }
}

fn put(log: &Log, from: u64, n: u64) {
    let t = log.topic("t").unwrap();
    for i in from..from + n {
        let at = t
            .append_batch(&[NewRecord {
                key: Some(b"k"),
                value: &value(i),
                timestamp: Some(i as i64),
            }])
            .unwrap();
        assert_eq!(at[0].offset, i);
    }
}

/// Reads every record of partition 0 and checks it against `value`.
fn all(log: &Log) -> (u64, u64) {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let (start, end) = (p.start_offset(), p.end_offset());
    let mut next = start;
    while next < end {
        let b = p.read(next, 1 << 20).unwrap();
        for r in b.iter() {
            assert_eq!(r.offset, next);
            assert_eq!(r.value, value(next).as_slice(), "record {next}");
            next += 1;
        }
    }
    (start, end)
}

fn rel_seg(base: u64) -> PathBuf {
    PathBuf::from(format!("topics/t0/p0/{base:020}.seg"))
}

#[test]
fn torn_tail_is_cut_reported_and_never_resurrected() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", config()).unwrap();
    put(&log, 0, 5);
    log.sync().unwrap();
    put(&log, 5, 20); // unsynced
    log.abandon();
    // Only a prefix of the unsynced writes reached the disk: a torn tail.
    let tear = HEADER + 12 * BATCH + 10;
    zero_range(&dir, &rel_seg(0), tear, SEG - tear);
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    let rep = log.recovery_report().clone();
    let (_, end) = all(&log);
    assert_eq!(end, 12);
    assert!(
        rep.files
            .iter()
            .any(|f| matches!(f.action, FileAction::TruncatedTornTail { .. })),
        "{rep:#?}"
    );
    // Append different data over the cut region, crash again: the stale
    // unsynced batches that followed the tear must not come back.
    let t = log.topic("t").unwrap();
    for i in end..end + 2 {
        t.append_batch(&[NewRecord {
            key: Some(b"k"),
            value: &value(i),
            timestamp: Some(i as i64),
        }])
        .unwrap();
    }
    log.abandon();
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    let (_, end2) = all(&log);
    assert!(
        end2 <= end + 2,
        "stale records resurrected: {end2} > {}",
        end + 2
    );
    log.close().unwrap();
}

/// A log with 10 records in one segment, all below the checkpoint.
fn synced_log(dir: &Path) {
    let log = Log::open(dir, opts_every_round(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", config()).unwrap();
    put(&log, 0, 10);
    log.sync().unwrap();
    log.sync().unwrap();
    log.abandon();
}

#[test]
fn mid_segment_corruption_per_mode() {
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("base");
    synced_log(&base);
    let image = DirImage::capture(&base).unwrap();
    let bad_pos = HEADER + 3 * BATCH + 60; // inside record 3
    for mode in [
        RecoveryMode::Strict,
        RecoveryMode::Truncate,
        RecoveryMode::Salvage,
    ] {
        let dir = root.path().join(format!("{mode:?}"));
        image.write_to(&dir).unwrap();
        flip_byte(&dir, &rel_seg(0), bad_pos);
        // Data below the checkpoint is trusted at open: a plain open finds
        // the damage only when reading, as a typed error.
        if mode == RecoveryMode::Strict {
            let log = Log::open(&dir, no_balancer_in(mode)).unwrap();
            let p = log.topic("t").unwrap().partition(0).unwrap();
            assert!(matches!(
                p.read(3, 1),
                Err(Error::ChecksumMismatch { position, .. }) if position == HEADER + 3 * BATCH
            ));
            assert_eq!(p.read(2, 1).unwrap().iter().next().unwrap().offset, 2);
            log.abandon();
        }
        let full = LogOptions {
            full_scan: true,
            ..no_balancer_in(mode)
        };
        match (mode, Log::open(&dir, full)) {
            (RecoveryMode::Strict, Err(Error::Corruption { file, position, .. })) => {
                assert!(file.ends_with(rel_seg(0)), "{file:?}");
                assert_eq!(position, HEADER + 3 * BATCH);
            }
            (RecoveryMode::Truncate, Ok(log)) => {
                // Cut at the damage; the synced offsets after it read as a
                // hole and are never handed out again.
                let p = log.topic("t").unwrap().partition(0).unwrap();
                assert_eq!((p.start_offset(), p.end_offset()), (0, 10));
                for i in 0..3 {
                    let b = p.read(i, 1).unwrap();
                    let r = b.iter().next().unwrap();
                    assert_eq!((r.offset, r.value), (i, value(i).as_slice()));
                }
                assert!(matches!(
                    p.read(3, 1),
                    Err(Error::Hole {
                        start: 3,
                        end: 10,
                        ..
                    })
                ));
                put(&log, 10, 1);
                log.close().unwrap();
            }
            (RecoveryMode::Salvage, Ok(log)) => {
                let p = log.topic("t").unwrap().partition(0).unwrap();
                assert_eq!(p.end_offset(), 10);
                for i in (0..3).chain(4..10) {
                    let b = p.read(i, 1).unwrap();
                    let r = b.iter().next().unwrap();
                    assert_eq!((r.offset, r.value), (i, value(i).as_slice()));
                }
                assert!(matches!(
                    p.read(3, 1),
                    Err(Error::Hole {
                        start: 3,
                        end: 4,
                        ..
                    })
                ));
                let holes = &log.recovery_report().holes;
                assert_eq!(holes.len(), 1, "{holes:?}");
                assert_eq!((holes[0].topic.as_str(), holes[0].partition), ("t", 0));
                assert_eq!(holes[0].offsets.as_range(), 3..4);
                drop(p);
                log.close().unwrap();
                // The hole is permanent and reopening is idempotent.
                let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
                assert!(!log.recovery_report().changed_anything());
                let p = log.topic("t").unwrap().partition(0).unwrap();
                assert!(matches!(p.read(3, 1), Err(Error::Hole { .. })));
                assert_eq!(p.read(4, 1).unwrap().iter().next().unwrap().offset, 4);
            }
            (m, r) => panic!("{m:?}: unexpected {:?}", r.map(|_| ())),
        }
    }
}

#[test]
fn clean_reopen_of_many_segments_scans_nothing_and_is_idempotent() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", config()).unwrap();
    put(&log, 0, 400);
    assert!(
        log.topic("t")
            .unwrap()
            .partition(0)
            .unwrap()
            .segment_count()
            > 10
    );
    log.close().unwrap();
    for _ in 0..2 {
        let before = DirImage::capture(&dir).unwrap();
        let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
        let rep = log.recovery_report().clone();
        assert!(rep.clean_shutdown);
        assert_eq!(rep.bytes_scanned, 0, "{rep:#?}");
        assert!(!rep.changed_anything(), "{rep:#?}");
        assert_eq!(all(&log), (0, 400));
        log.close().unwrap();
        let after = DirImage::capture(&dir).unwrap();
        let segs = |i: &DirImage| {
            i.files
                .iter()
                .filter(|(p, _)| p.extension().is_some_and(|e| e == "seg"))
                .map(|(p, b)| (p.clone(), b.clone()))
                .collect::<Vec<_>>()
        };
        assert!(segs(&before) == segs(&after), "segments changed");
    }
    // After a crash, a second open changes nothing more.
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    put(&log, 400, 7);
    log.abandon();
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(all(&log), (0, 407));
    log.abandon();
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    assert!(!log.recovery_report().changed_anything());
    assert_eq!(log.recovery_report().bytes_scanned, 0);
    assert_eq!(all(&log), (0, 407));
}

/// Regression: rolling writes the seal into the old segment's header; the
/// next sync round must flush it even when the old segment's data was
/// already synced (else a power loss keeps a synced segment without its
/// seal, and a later checkpoint makes its trailing zeros "corruption").
#[test]
fn sync_after_roll_flushes_the_seal() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let hook = Arc::new(common::faults::Record::default());
    let log =
        Log::open_with_hook(&dir, no_balancer_in(RecoveryMode::Strict), hook.clone()).unwrap();
    log.create_topic("t", config()).unwrap();
    put(&log, 0, 3);
    log.sync().unwrap();
    log.topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .roll_now()
        .unwrap();
    hook.clear();
    log.sync().unwrap();
    let synced = hook.paths(IoOp::SyncSegment);
    assert!(
        synced.iter().any(|p| p.ends_with(rel_seg(0))),
        "sealed segment not synced: {synced:?}"
    );
    hook.clear();
    log.sync().unwrap();
    assert!(
        !hook
            .paths(IoOp::SyncSegment)
            .iter()
            .any(|p| p.ends_with(rel_seg(0))),
        "the seal is synced once"
    );
}

/// Regression: a crash kept the next segment but lost the header page
/// holding the seal of the previous one. Recovery must seal it, or the
/// second open (checkpoint now naming the next segment) fails.
#[test]
fn recovery_seals_a_segment_that_lost_its_seal() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", config()).unwrap();
    put(&log, 0, 5);
    log.sync().unwrap();
    log.sync().unwrap();
    log.topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .roll_now()
        .unwrap();
    put(&log, 5, 3);
    log.abandon();
    zero_range(&dir, &rel_seg(0), 44, 20); // the seal
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(all(&log), (0, 8));
    log.abandon();
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(all(&log), (0, 8));
    assert!(!log.recovery_report().changed_anything());
}

/// Regression: retention must not delete the segment the on-disk
/// checkpoint calls durable (nor later ones): a crash could then lose
/// synced offsets with no file left to say where the partition ended.
#[test]
fn retention_keeps_the_checkpointed_segment() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            retention_bytes: Some(1),
            ..config()
        },
    )
    .unwrap();
    put(&log, 0, 3);
    log.sync().unwrap();
    log.sync().unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    for i in 0..3 {
        p.roll_now().unwrap();
        put(&log, 3 + i, 1);
    }
    log.enforce_retention().unwrap();
    assert_eq!(p.start_offset(), 0, "checkpointed segment deleted");
    // The two newest checkpoints must both name a later segment.
    for _ in 0..3 {
        log.sync().unwrap();
    }
    log.enforce_retention().unwrap();
    assert_eq!(p.start_offset(), 5, "retention resumes once synced");
    drop(p);
    log.abandon();
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(all(&log), (5, 6));
}

/// Regression: retention unlinks the oldest segments first, but a crash
/// may bring back an older one while a newer deleted one stays gone. The
/// resurrected prefix before the gap is dropped, not called corruption.
#[test]
fn resurrected_retention_leftovers_are_dropped() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let log = Log::open(&dir, opts_every_round(RecoveryMode::Strict)).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            retention_bytes: Some(1),
            ..config()
        },
    )
    .unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    for i in 0..4 {
        put(&log, i, 1);
        p.roll_now().unwrap();
    }
    put(&log, 4, 1);
    for _ in 0..3 {
        log.sync().unwrap();
    }
    let old = std::fs::read(dir.join(rel_seg(0))).unwrap();
    log.enforce_retention().unwrap();
    assert_eq!(p.start_offset(), 4);
    log.sync().unwrap();
    drop(p);
    log.abandon();
    std::fs::write(dir.join(rel_seg(0)), old).unwrap();
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(all(&log), (4, 5));
    assert!(log
        .recovery_report()
        .files
        .iter()
        .any(|f| f.file.ends_with(rel_seg(0))
            && matches!(f.action, FileAction::DeletedSegment { .. })));
}

/// A power loss at a roll kept the old segment's header page (with the
/// seal) but neither the new segment nor the old one's last records.
/// Recovery keeps the old segment as the active one; the stale seal leaves
/// its header, so appends never land in a segment marked sealed and a
/// later open changes nothing (C7). Earlier, once appends brought the
/// segment back to the seal's position, the next open took the stale seal
/// for a roll and started a new segment.
#[test]
fn torn_roll_below_the_seal_leaves_an_unsealed_active_segment() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", config()).unwrap();
    put(&log, 0, 10);
    log.topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .roll_now()
        .unwrap();
    log.abandon();
    // What the disk kept: the seal (header page), records 0..6, no new segment.
    std::fs::remove_file(dir.join(rel_seg(10))).unwrap();
    zero_range(&dir, &rel_seg(0), HEADER + 6 * BATCH, 4 * BATCH);
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(all(&log), (0, 6));
    // Records of the same size: the segment ends where the stale seal says.
    put(&log, 6, 4);
    log.abandon();
    let header = std::fs::read(dir.join(rel_seg(0))).unwrap();
    assert!(
        header[44..64].iter().all(|&b| b == 0),
        "the active segment's header still carries a seal"
    );
    for _ in 0..2 {
        let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
        assert_eq!(all(&log), (0, 10));
        assert!(
            !log.recovery_report().changed_anything(),
            "{:?}",
            log.recovery_report().files
        );
        log.abandon();
    }
}

/// Appends `n` records of `len`-byte values to partition 0 of `topic`, the
/// record at offset `i` timestamped `i`.
fn put_sized(log: &Log, topic: &str, n: u64, len: usize) {
    let t = log.topic(topic).unwrap();
    for i in 0..n {
        let v = vec![i as u8; len];
        let at = t
            .append_batch(&[NewRecord {
                key: Some(b"k"),
                value: &v,
                timestamp: Some(i as i64),
            }])
            .unwrap();
        assert_eq!(at[0].offset, i);
    }
}

/// The active segment's index file, read at an open after a clean
/// shutdown, is a cache: one that decodes whole but names positions that
/// are not where its offsets' batches start (here another partition's
/// index, same base offset, in bounds) must not make a lookup by offset or
/// by timestamp answer differently from a walk of the data.
#[test]
fn a_wrong_index_file_after_a_clean_close_never_changes_what_reads_answer() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let big = TopicConfig {
        partitions: 1,
        segment_bytes: 1 << 20,
        ..TopicConfig::default()
    };
    let n = 600;
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", big.clone()).unwrap();
    log.create_topic("u", big).unwrap();
    put_sized(&log, "t", n, 100);
    // Fewer bytes and fewer offsets than "t": every entry is in bounds there.
    put_sized(&log, "u", 60, 500);
    log.close().unwrap();
    let idx = |topic: u32| dir.join(format!("topics/t{topic}/p0/{:020}.idx", 0));
    let theirs = std::fs::read(idx(1)).unwrap();
    assert!(theirs.len() > 40, "the donor index holds entries");
    std::fs::write(idx(0), &theirs).unwrap();

    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(p.end_offset(), n);
    for i in (0..n).step_by(7) {
        let b = p.read(i, 1).unwrap();
        let first = b
            .iter()
            .next()
            .expect("a record at every offset below the end");
        assert_eq!(first.offset, i);
        assert_eq!(first.value, vec![i as u8; 100].as_slice(), "record {i}");
        assert_eq!(first.timestamp, i as i64);
    }
    for ts in (0..n).step_by(13) {
        let found = p.offset_for_time(ts as i64);
        assert!(
            matches!(found, Ok(Some(o)) if o == ts),
            "offset_for_time({ts}) = {found:?}, a walk finds {ts}"
        );
    }
    log.close().unwrap();
}

/// The entries before the last of an index file read at a clean open are
/// hints: one that names a position inside a batch (here entry 3 moved by
/// a byte, the file otherwise the one the close wrote) must not turn a
/// lookup by timestamp into an error or a wrong answer.
#[test]
fn a_wrong_middle_index_entry_after_a_clean_close_never_fails_a_time_lookup() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let big = TopicConfig {
        partitions: 1,
        segment_bytes: 1 << 20,
        ..TopicConfig::default()
    };
    let n = 600;
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", big).unwrap();
    put_sized(&log, "t", n, 100);
    log.close().unwrap();
    let idx = dir.join(format!("topics/t0/p0/{:020}.idx", 0));
    let mut buf = std::fs::read(&idx).unwrap();
    // 16-byte header, then 16-byte entries: rel_offset u32, position u32,
    // max_ts_before i64, little-endian.
    let (entry, header, entry_len) = (3, 16, 16);
    assert!(
        buf.len() >= header + (entry + 2) * entry_len,
        "{}",
        buf.len()
    );
    let at = header + entry * entry_len + 4;
    let pos = u32::from_le_bytes(buf[at..at + 4].try_into().unwrap());
    buf[at..at + 4].copy_from_slice(&(pos + 1).to_le_bytes());
    std::fs::write(&idx, &buf).unwrap();

    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(p.end_offset(), n);
    for ts in 0..n {
        let found = p.offset_for_time(ts as i64);
        assert!(
            matches!(found, Ok(Some(o)) if o == ts),
            "offset_for_time({ts}) = {found:?}, a walk finds {ts}"
        );
    }
    for i in 0..n {
        let b = p.read(i, 1).unwrap();
        assert_eq!(b.iter().next().map(|r| r.offset), Some(i));
    }
    log.close().unwrap();
}

/// Every record of partition 0 of "t" (`len`-byte values, offset `i`
/// timestamped `i`) read by offset and found by its timestamp.
fn check_sized(log: &Log, n: u64, len: usize) {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(p.end_offset(), n);
    for i in 0..n {
        let b = p.read(i, 1).unwrap();
        let r = b
            .iter()
            .next()
            .expect("a record at every offset below the end");
        assert_eq!((r.offset, r.timestamp), (i, i as i64));
        assert_eq!(r.value, vec![i as u8; len].as_slice(), "record {i}");
        let found = p.offset_for_time(i as i64);
        assert!(
            matches!(found, Ok(Some(o)) if o == i),
            "time {i}: {found:?}"
        );
    }
}

/// The index a clean close wrote and the next open read goes stale as
/// soon as records follow: a crash after them is recovered by a walk (the
/// clean mark was cleared at the open), and a second clean close writes
/// the longer index, which the open after it reads; every step answers as
/// a walk of the data does, and verify finds nothing.
#[test]
fn appends_after_a_clean_reopen_are_indexed_through_a_crash_and_a_second_clean_close() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let big = TopicConfig {
        partitions: 1,
        segment_bytes: 1 << 20,
        ..TopicConfig::default()
    };
    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", big).unwrap();
    put_sized(&log, "t", 300, 100);
    log.close().unwrap();
    let idx = dir.join(format!("topics/t0/p0/{:020}.idx", 0));
    let first = std::fs::read(&idx).unwrap();

    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    let t = log.topic("t").unwrap();
    for i in 300..600u64 {
        t.append_batch(&[NewRecord {
            key: Some(b"k"),
            value: &[i as u8; 100],
            timestamp: Some(i as i64),
        }])
        .unwrap();
    }
    log.sync().unwrap();
    log.abandon();
    assert_eq!(
        std::fs::read(&idx).unwrap(),
        first,
        "no close, no new index"
    );

    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    assert!(!log.recovery_report().clean_shutdown);
    check_sized(&log, 600, 100);
    log.close().unwrap();
    let second = std::fs::read(&idx).unwrap();
    assert!(
        second.len() > first.len(),
        "the close indexed the new records"
    );

    let log = Log::open(&dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    check_sized(&log, 600, 100);
    log.close().unwrap();
    assert_eq!(std::fs::read(&idx).unwrap(), second);
    let (_, problems) = fissionlog::verify(&dir).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}
