//! Damage at every byte of a partition's last batch. Past the checkpoint,
//! a tear after any byte of it (zeros or garbage after the tear) is a torn
//! tail: cut, reported, and the synced records before it all survive (C1,
//! C3). Below the checkpoint, a flipped byte anywhere in it (header, key,
//! value, CRC) is a typed error when read, `verify` names its position,
//! and a full Truncate scan cuts there and never hands its offset out
//! again (C8). A second open changes nothing (C7) and `verify` is clean
//! after the repair.

use crate::common;
use common::crash::DirImage;
use common::faults::Fail;
use common::log::fast_tempdir;
use common::log::{quiet_in, value};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fissionlog::{Error, FileAction, IoOp, Log, LogOptions, NewRecord, RecoveryMode, TopicConfig};

/// One record with key "k" and a 100-byte value.
const BATCH: u64 = 157;
const HEADER: u64 = 64;
/// Records before the last batch.
const SYNCED: u64 = 5;

fn opts(mode: RecoveryMode) -> LogOptions {
    LogOptions {
        checkpoint_interval: std::time::Duration::ZERO,
        ..quiet_in(mode)
    }
}

fn seg0() -> PathBuf {
    PathBuf::from(format!("topics/t0/p0/{:020}.seg", 0))
}

fn put(log: &Log, i: u64) {
    let at = log
        .topic("t")
        .unwrap()
        .append_batch(&[NewRecord {
            key: Some(b"k"),
            value: &value(i),
            timestamp: Some(i as i64),
        }])
        .unwrap();
    assert_eq!(at[0].offset, i);
}

/// The image of a log holding `SYNCED` synced records and one more, synced
/// and checkpointed when `last_synced`, left by a crash.
fn image(last_synced: bool) -> DirImage {
    image_left(last_synced, false)
}

/// [`image`], left by a clean close when `clean` (the checkpoint then
/// names every partition's end and says the shutdown was clean).
fn image_left(last_synced: bool, clean: bool) -> DirImage {
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
    for i in 0..SYNCED {
        put(&log, i);
    }
    log.sync().unwrap();
    put(&log, SYNCED);
    if last_synced {
        // The checkpoint lags one sync round: the second round writes the
        // position the first made durable.
        log.sync().unwrap();
        log.sync().unwrap();
    }
    if clean {
        log.close().unwrap();
    } else {
        log.abandon();
    }
    DirImage::capture(root.path()).unwrap()
}

/// Every record of partition 0 from 0 up to its end, checked against
/// `value`, with holes skipped; returns (end, offsets read).
fn read_all(log: &Log) -> (u64, Vec<u64>) {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let end = p.end_offset();
    let mut seen = Vec::new();
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
            Err(Error::Hole { end, .. }) => next = end,
            Err(e) => panic!("read {next}: {e}"),
        }
    }
    (end, seen)
}

/// `img` with the segment's bytes changed by `f`, written to a new dir.
fn damaged(img: &DirImage, f: impl FnOnce(&mut Vec<u8>)) -> tempfile::TempDir {
    let mut img = img.clone();
    let seg = img.files.get_mut(&seg0()).expect("segment 0 in the image");
    f(seg);
    let dir = fast_tempdir();
    img.write_to(dir.path()).unwrap();
    dir
}

/// Opens twice and checks the second open repairs nothing and reads the
/// same records; then `verify` finds no problem.
fn settled(dir: &Path, mode: RecoveryMode, want: &[u64], what: &str) {
    let log = Log::open(dir, opts(mode)).unwrap();
    let (_, seen) = read_all(&log);
    assert_eq!(seen, want, "{what}: records after the first open");
    log.close().unwrap();
    let log = Log::open(dir, opts(mode)).unwrap();
    let rep = log.recovery_report().clone();
    assert!(
        rep.files
            .iter()
            .all(|f| matches!(f.action, FileAction::ForeignFile)),
        "{what}: the second open repaired again: {rep:#?}"
    );
    let (_, seen) = read_all(&log);
    assert_eq!(seen, want, "{what}: records after the second open");
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir).unwrap();
    assert!(
        problems.is_empty(),
        "{what}: verify after repair: {problems:#?}"
    );
}

#[test]
fn a_tear_at_every_byte_of_an_unsynced_last_batch_keeps_exactly_the_synced_records() {
    let img = image(false);
    let start = HEADER + SYNCED * BATCH;
    let synced: Vec<u64> = (0..SYNCED).collect();
    let all: Vec<u64> = (0..=SYNCED).collect();
    for kept in 0..=BATCH {
        for fill in [0u8, 0xAA] {
            let dir = damaged(&img, |s| {
                let from = (start + kept) as usize;
                let to = ((start + BATCH) as usize).min(s.len());
                for b in &mut s[from..to] {
                    *b = fill;
                }
            });
            let what = format!("tear after {kept} bytes, filled with {fill:#x}");
            let log = Log::open(dir.path(), opts(RecoveryMode::Strict))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let rep = log.recovery_report().clone();
            let (end, seen) = read_all(&log);
            let whole = kept == BATCH;
            assert_eq!(&seen, if whole { &all } else { &synced }, "{what}");
            assert_eq!(end, if whole { SYNCED + 1 } else { SYNCED }, "{what}");
            let torn = rep
                .files
                .iter()
                .any(|f| matches!(f.action, FileAction::TruncatedTornTail { .. }));
            let garbage = !whole && (fill != 0 || kept > 0);
            assert_eq!(torn, garbage, "{what}: torn tail reported: {rep:#?}");
            // The next append takes the cut offset: it was never synced.
            put(&log, end);
            log.close().unwrap();
            let mut want = seen.clone();
            want.push(end);
            settled(dir.path(), RecoveryMode::Strict, &want, &what);
        }
    }
}

#[test]
fn a_flipped_byte_anywhere_in_a_checkpointed_last_batch_is_an_error_then_truncated_for_good() {
    let img = image(true);
    let start = HEADER + SYNCED * BATCH;
    let synced: Vec<u64> = (0..SYNCED).collect();
    for at in 0..BATCH {
        let what = format!("byte {at} of the checkpointed last batch flipped");
        let dir = damaged(&img, |s| s[(start + at) as usize] ^= 0xFF);
        // Below the checkpoint the data is trusted at open (C7): the
        // damage shows when the batch is read, as a typed error, or, when
        // it breaks the chain of batch headers the open walks after a
        // crash, as the open's error naming it.
        match Log::open(dir.path(), opts(RecoveryMode::Strict)) {
            Ok(log) => {
                let p = log.topic("t").unwrap().partition(0).unwrap();
                for o in 0..SYNCED {
                    let b = p
                        .read(o, 1)
                        .unwrap_or_else(|e| panic!("{what}: read {o}: {e}"));
                    assert_eq!(b.iter().next().map(|r| r.offset), Some(o), "{what}");
                }
                match p.read(SYNCED, 1 << 20) {
                    Err(Error::Corruption { .. } | Error::ChecksumMismatch { .. }) => {}
                    Err(e) => panic!("{what}: read of the damaged batch failed with {e}"),
                    Ok(b) => panic!(
                        "{what}: read of the damaged batch returned {:?}",
                        b.iter().map(|r| r.offset).collect::<Vec<_>>()
                    ),
                }
                drop(p);
                log.close().unwrap();
            }
            Err(Error::Corruption { file, position, .. }) => {
                assert_eq!(position, start, "{what}: position named");
                assert!(file.ends_with(seg0()), "{what}: {}", file.display());
            }
            Err(e) => panic!("{what}: Strict: {e}"),
        }
        let (_, problems) = fissionlog::verify(dir.path()).unwrap();
        assert!(
            problems.iter().any(|p| p.position == start),
            "{what}: verify does not name the damage at {start}: {problems:#?}"
        );
        let log = Log::open(
            dir.path(),
            LogOptions {
                full_scan: true,
                ..opts(RecoveryMode::Truncate)
            },
        )
        .unwrap_or_else(|e| panic!("{what}: Truncate: {e}"));
        let (end, seen) = read_all(&log);
        assert_eq!(seen, synced, "{what}");
        // The lost offset was handed out and synced: it reads as a hole
        // and is never handed out again.
        assert_eq!(
            end,
            SYNCED + 1,
            "{what}: offsets continue after the lost one"
        );
        put(&log, SYNCED + 1);
        log.close().unwrap();
        let mut want = synced.clone();
        want.push(SYNCED + 1);
        settled(dir.path(), RecoveryMode::Strict, &want, &what);
    }
}

/// Appends the record of the partition's end offset.
fn append_next(log: &Log, what: &str) {
    let end = log.topic("t").unwrap().partition(0).unwrap().end_offset();
    let at = log
        .topic("t")
        .unwrap()
        .append_batch(&[NewRecord {
            key: Some(b"k"),
            value: &value(end),
            timestamp: Some(end as i64),
        }])
        .unwrap_or_else(|e| panic!("{what}: append: {e}"));
    assert_eq!(at[0].offset, end, "{what}");
}

#[test]
fn a_truncate_an_io_error_stops_after_its_cut_ends_where_an_uninterrupted_one_does() {
    interrupted_truncate(&image(true), "after a crash");
}

#[test]
fn a_truncate_of_a_cleanly_closed_log_an_io_error_stops_after_its_cut_ends_where_an_uninterrupted_one_does(
) {
    interrupted_truncate(&image_left(true, true), "after a clean close");
}

/// A full-scan Truncate of `img` with its last batch damaged, stopped by
/// an I/O error at each step, then opened again without a full scan:
/// the records and an append after it are those of one uninterrupted
/// repair.
fn interrupted_truncate(img: &DirImage, left: &str) {
    let start = HEADER + SYNCED * BATCH;
    let full_truncate = LogOptions {
        full_scan: true,
        ..opts(RecoveryMode::Truncate)
    };
    let reference = {
        let dir = damaged(img, |s| s[(start + 20) as usize] ^= 0xFF);
        let log = Log::open(dir.path(), full_truncate.clone()).unwrap();
        append_next(&log, "uninterrupted");
        let got = read_all(&log);
        log.close().unwrap();
        got
    };
    let ops = [
        IoOp::SyncRecoveryDir,
        IoOp::CreateSegment,
        IoOp::SyncNewSegment,
        IoOp::SyncSegment,
        IoOp::SyncDir,
        IoOp::WriteCheckpoint,
        IoOp::SyncCheckpoint,
    ];
    for op in ops {
        for nth in 0..3 {
            let what = format!("{left}: {op:?} call {nth} fails");
            let dir = damaged(img, |s| s[(start + 20) as usize] ^= 0xFF);
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
            settled(dir.path(), RecoveryMode::Strict, &reference.1, &what);
        }
    }
}
