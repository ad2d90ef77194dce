//! Record timestamps after a reopen: a segment's newest timestamp, which
//! retention by age and the time lookup rely on, counts every record of
//! the segment, also those before its last sparse index entry, whatever
//! the order of the timestamps the producers gave.

use crate::common;
use common::log::{quiet, value};

use std::time::Duration;

use fissionlog::{Log, NewRecord, TopicConfig};

/// Far newer than every other record of these tests.
const NEW_TS: i64 = 1_000_000;

fn config(retention_age: Option<Duration>) -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 64 * 1024,
        index_interval_bytes: 1024,
        retention_age,
        ..TopicConfig::default()
    }
}

/// Appends record `i` with timestamp `ts` (`None`: now).
fn put(log: &Log, i: u64, ts: Option<i64>) {
    let t = log.topic("t").unwrap();
    let at = t
        .append_batch(&[NewRecord {
            key: Some(b"k"),
            value: &value(i),
            timestamp: ts,
        }])
        .unwrap();
    assert_eq!(at[0].offset, i);
}

/// Record 0 carries the newest timestamp; the 100 after it (many index
/// intervals of data) older ones.
fn newest_first(log: &Log) {
    put(log, 0, Some(NEW_TS));
    for i in 1..=100 {
        put(log, i, Some(i as i64));
    }
}

#[test]
fn the_time_lookup_finds_a_record_before_the_last_index_entry_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    log.create_topic("t", config(None)).unwrap();
    newest_first(&log);
    let t = log.topic("t").unwrap();
    assert_eq!(t.offset_for_time(0, NEW_TS).unwrap(), Some(0));
    drop(t);
    log.close().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log.topic("t").unwrap();
    assert_eq!(t.offset_for_time(0, NEW_TS).unwrap(), Some(0));
    assert_eq!(t.offset_for_time(0, 500).unwrap(), Some(0));
    assert_eq!(t.offset_for_time(0, 50).unwrap(), Some(0));
    // Appends after the reopen index their data with the true newest
    // timestamp before it: the lookup still finds record 0 after the
    // next reopen, when the index file the close wrote is read.
    for i in 101..=200 {
        put(&log, i, Some(i as i64 - 100));
    }
    drop(t);
    log.close().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log.topic("t").unwrap();
    assert_eq!(t.offset_for_time(0, NEW_TS).unwrap(), Some(0));
    assert_eq!(t.offset_for_time(0, 150).unwrap(), Some(0));
    drop(t);
    log.close().unwrap();
}

#[test]
fn the_time_lookup_finds_a_record_in_a_rolled_segment_before_its_last_index_entry() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    log.create_topic("t", config(None)).unwrap();
    newest_first(&log);
    log.topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .roll_now()
        .unwrap();
    put(&log, 101, Some(7));
    log.close().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log.topic("t").unwrap();
    assert_eq!(t.offset_for_time(0, NEW_TS).unwrap(), Some(0));
    assert_eq!(t.offset_for_time(0, 101).unwrap(), Some(0));
    drop(t);
    log.close().unwrap();
}

#[test]
fn retention_by_age_keeps_a_reopened_segment_whose_new_record_precedes_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    log.create_topic("t", config(Some(Duration::from_secs(3600))))
        .unwrap();
    // Record 0 is new (timestamped now); the 100 after it are from 1970.
    put(&log, 0, None);
    for i in 1..=100 {
        put(&log, i, Some(1_000));
    }
    log.topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .roll_now()
        .unwrap();
    put(&log, 101, None);
    log.enforce_retention().unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(
        p.start_offset(),
        0,
        "retention removed a segment holding a new record"
    );
    drop(p);
    log.close().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    log.enforce_retention().unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(
        p.start_offset(),
        0,
        "after a reopen, retention removed a segment holding a new record"
    );
    let b = p.read(0, 1 << 20).unwrap();
    let first = b.iter().next().unwrap();
    assert_eq!(first.value, value(0).as_slice());
    drop(p);
    log.close().unwrap();
}
