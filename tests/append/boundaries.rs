//! Appends at a segment's exact boundaries: a batch that fills a segment
//! to its last byte stays in it and the next one rolls; a batch one byte
//! too big for any segment is a typed error that changes nothing; every
//! record reads back after a clean reopen and after a crash (C1, C2, C6).
//! A reader holding a batch of a segment retention removes still reads it
//! whole (C6).

use crate::common;
use common::log::quiet;

use std::time::Duration;

use fissionlog::{Error, Log, LogOptions, NewRecord, RecoveryMode, TopicConfig};

const SEG: u64 = 4096;
const HEADER: u64 = 64;
/// A batch of one record with key "k" is this many bytes plus its value.
const OVERHEAD: u64 = 57;
/// The value length whose batch fills a segment's room exactly.
const FILL: usize = (SEG - HEADER - OVERHEAD) as usize;
/// The value length whose batch fills half a segment's room exactly.
const HALF: usize = (SEG - HEADER) as usize / 2 - OVERHEAD as usize;

fn config() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: SEG,
        max_record_bytes: 1 << 16,
        ..TopicConfig::default()
    }
}

/// The `len`-byte value of record `i`.
fn val(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 131 + j * 7) as u8).collect()
}

fn put(log: &Log, i: u64, len: usize) -> fissionlog::Result<u64> {
    let t = log.topic("t")?;
    let at = t.append_batch(&[NewRecord {
        key: Some(b"k"),
        value: &val(i, len),
        timestamp: Some(i as i64),
    }])?;
    Ok(at[0].offset)
}

/// Lengths of the records: whole-segment batches, then smaller ones
/// whose sizes leave a few bytes short of a full segment, then whole
/// ones again.
fn lengths() -> Vec<usize> {
    let mut v = vec![FILL, FILL];
    // Two batches that fill a segment together.
    v.extend([HALF, HALF]);
    // One byte short of filling: the next batch rolls.
    v.extend([HALF, HALF - 1, 1]);
    v.extend([FILL, 0, FILL]);
    v
}

fn check_all(log: &Log, lens: &[usize], what: &str) {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(p.end_offset(), lens.len() as u64, "{what}");
    for (i, &len) in lens.iter().enumerate() {
        let i = i as u64;
        let b = p
            .read(i, 1)
            .unwrap_or_else(|e| panic!("{what}: read {i}: {e}"));
        let r = b.iter().next().unwrap();
        assert_eq!(r.offset, i, "{what}");
        assert_eq!(r.value, val(i, len).as_slice(), "{what}: record {i}");
    }
    for s in p.segment_infos() {
        assert!(
            s.data_bytes <= SEG - HEADER,
            "{what}: segment {} holds {} bytes of data",
            s.base_offset,
            s.data_bytes
        );
    }
}

#[test]
fn batches_that_fill_a_segment_exactly_stay_in_it_and_the_next_one_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    log.create_topic("t", config()).unwrap();
    let lens = lengths();
    for (i, &len) in lens.iter().enumerate() {
        assert_eq!(put(&log, i as u64, len).unwrap(), i as u64);
    }
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let bases: Vec<u64> = p.segment_infos().iter().map(|s| s.base_offset).collect();
    // A full segment each for 0 and 1, one for 2 and 3, one for 4 and 5
    // (one byte short), 6 rolls, 7 fills one, 8 (an empty value) and 9
    // one each.
    assert_eq!(bases, vec![0, 1, 2, 4, 6, 7, 8, 9], "segment bases");
    drop(p);
    check_all(&log, &lens, "before a reopen");
    log.close().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    check_all(&log, &lens, "after a clean reopen");
    log.sync().unwrap();
    log.abandon();
    let log = Log::open(dir.path(), common::log::quiet_in(RecoveryMode::Strict)).unwrap();
    check_all(&log, &lens, "after a crash");
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn a_batch_one_byte_larger_than_a_segment_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    log.create_topic("t", config()).unwrap();
    assert_eq!(put(&log, 0, 10).unwrap(), 0);
    match put(&log, 1, FILL + 1) {
        Err(Error::RecordTooLarge { size, max }) => {
            assert!(size > max, "{size} <= {max}");
            assert!(max < SEG - HEADER, "{max}");
        }
        other => panic!("a batch larger than a segment: {other:?}"),
    }
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(p.end_offset(), 1);
    assert_eq!(p.segment_count(), 1, "the refused batch rolled a segment");
    drop(p);
    // The next batch that fits takes the next offset.
    assert_eq!(put(&log, 1, FILL).unwrap(), 1);
    log.close().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    check_all(&log, &[10, FILL], "after a reopen");
    log.close().unwrap();
}

#[test]
fn a_reader_holding_a_batch_reads_it_whole_after_retention_removed_its_segment() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(
        dir.path(),
        LogOptions {
            checkpoint_interval: Duration::ZERO,
            ..quiet()
        },
    )
    .unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            retention_age: Some(Duration::from_secs(3600)),
            ..config()
        },
    )
    .unwrap();
    // Old records fill three segments, two to a segment; the active one
    // is new.
    let t = log.topic("t").unwrap();
    for i in 0..6u64 {
        t.append_batch(&[NewRecord {
            key: Some(b"k"),
            value: &val(i, HALF),
            timestamp: Some(1_000),
        }])
        .unwrap();
    }
    t.append_batch(&[NewRecord {
        key: Some(b"k"),
        value: &val(6, 10),
        timestamp: None,
    }])
    .unwrap();
    // Retention keeps the segments the last two checkpoints name: sync
    // rounds move them to the active segment.
    log.sync().unwrap();
    log.sync().unwrap();
    let p = t.partition(0).unwrap();
    let held = p.read(0, 1 << 20).unwrap();
    let path = p.segment_infos()[0].path.clone();
    // The first pass finds the segments named by a recent checkpoint and
    // has the next sync round write a new one; the second retires them.
    let mut deleted = log.enforce_retention().unwrap();
    log.sync().unwrap();
    deleted += log.enforce_retention().unwrap();
    assert_eq!(deleted, 3, "segments retention removed");
    assert!(!path.exists(), "segment 0 was not removed");
    assert_eq!(p.start_offset(), 6);
    // The held batch still reads, byte for byte.
    let got: Vec<(u64, Vec<u8>)> = held.iter().map(|r| (r.offset, r.value.to_vec())).collect();
    assert_eq!(
        got,
        vec![(0, val(0, HALF)), (1, val(1, HALF))],
        "the held batch"
    );
    assert!(matches!(p.read(0, 1), Err(Error::Retained { .. })));
    drop(held);
    drop(p);
    drop(t);
    log.close().unwrap();
}
