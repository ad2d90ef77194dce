//! What an open and a close cost in I/O (C7): an open after an unclean
//! stop syncs and clears only what was written since the last checkpoint,
//! and a clean close and open of a log nothing was appended to since its
//! last open write nothing into any partition's directory.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common;
use common::faults::Record;
use common::log::{quiet, value};

use fissionlog::{IoOp, Log, NewRecord, TopicConfig};

const PARTITIONS: u32 = 8;

fn append_one(log: &Log, partition: u32, i: u64) {
    let t = log.topic("t").unwrap();
    let v = value(i);
    t.append_to(
        partition,
        &[NewRecord {
            key: None,
            value: &v,
            timestamp: None,
        }],
    )
    .unwrap();
}

/// A topic of [`PARTITIONS`] partitions, one record in each, closed cleanly.
fn closed_log(dir: &Path) {
    let log = Log::open(dir, quiet()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: PARTITIONS,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    for p in 0..PARTITIONS {
        append_one(&log, p, u64::from(p));
    }
    log.close().unwrap();
}

/// The partition directories the recorded operations wrote into or synced
/// (opening and mapping a segment only reads it).
fn partitions_touched(rec: &Record, dir: &Path) -> BTreeSet<PathBuf> {
    let topics = dir.join("topics");
    rec.ops()
        .into_iter()
        .filter(|(op, _)| {
            !matches!(
                op,
                IoOp::OpenSegment | IoOp::MapSegment | IoOp::WriteCheckpoint | IoOp::SyncCheckpoint
            )
        })
        .filter_map(|(_, path)| {
            let rel = path.strip_prefix(&topics).ok()?;
            let mut parts = rel.components();
            let (t, p) = (parts.next()?, parts.next()?);
            Some(topics.join(t).join(p))
        })
        .collect()
}

fn partition_dir(log: &Log, p: u32) -> PathBuf {
    log.topic("t")
        .unwrap()
        .partition(p)
        .unwrap()
        .dir()
        .to_path_buf()
}

#[test]
fn an_open_after_an_unclean_stop_touches_only_the_partitions_written_since_the_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    closed_log(&dir);
    // The open writes a checkpoint of every partition's end (without the
    // clean mark); one partition is written after it, then the process
    // stops without syncing.
    let log = Log::open(&dir, quiet()).unwrap();
    append_one(&log, 3, 100);
    let written = partition_dir(&log, 3);
    log.abandon();

    let rec = Arc::new(Record::default());
    let log = Log::open_with_hook(&dir, quiet(), rec.clone()).unwrap();
    assert!(!log.recovery_report().clean_shutdown);
    let touched = partitions_touched(&rec, &dir);
    assert_eq!(
        touched,
        BTreeSet::from([written.clone()]),
        "recovery synced, cleared or rewrote files of partitions nothing was written to: {:?}",
        rec.ops()
    );
    assert!(
        rec.ops()
            .iter()
            .any(|(op, p)| *op == IoOp::SyncSegment && p.starts_with(&written)),
        "the records written after the checkpoint were not made durable: {:?}",
        rec.ops()
    );
    let t = log.topic("t").unwrap();
    for p in 0..PARTITIONS {
        let want = if p == 3 { 2 } else { 1 };
        assert_eq!(t.partition(p).unwrap().end_offset(), want, "partition {p}");
    }
    let b = t.partition(3).unwrap().read(1, 1 << 20).unwrap();
    assert_eq!(b.iter().next().unwrap().value, &value(100)[..]);
    log.close().unwrap();
}

#[test]
fn a_clean_close_and_open_of_an_unchanged_log_write_nothing_into_its_partitions() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    closed_log(&dir);
    let rec = Arc::new(Record::default());
    let log = Log::open_with_hook(&dir, quiet(), rec.clone()).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    log.close().unwrap();
    let log = Log::open_with_hook(&dir, quiet(), rec.clone()).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    assert_eq!(log.recovery_report().bytes_scanned, 0);
    log.close().unwrap();
    let touched = partitions_touched(&rec, &dir);
    assert!(
        touched.is_empty(),
        "a clean close or open wrote into {touched:?}: {:?}",
        rec.ops()
    );
}

/// An index of one entry (a segment whose records fit in one index
/// interval) is what a clean open derives from at most one interval of
/// batch headers, the walk that checks an index file anyway: a clean close
/// writes no file for it. A longer index is written, and both open clean.
#[test]
fn a_clean_close_writes_no_index_for_a_partition_whose_records_fit_in_one_index_interval() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let rec = Arc::new(Record::default());
    let log = Log::open_with_hook(&dir, quiet(), rec.clone()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: PARTITIONS,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    for p in 0..PARTITIONS {
        append_one(&log, p, u64::from(p));
    }
    // Two more records past the 4 KiB index interval: a second entry.
    let big = vec![5u8; 5000];
    let t = log.topic("t").unwrap();
    for _ in 0..2 {
        let r = NewRecord {
            key: None,
            value: &big,
            timestamp: None,
        };
        t.append_to(0, &[r]).unwrap();
    }
    let long = partition_dir(&log, 0);
    drop(t);
    log.close().unwrap();
    let written: BTreeSet<PathBuf> = rec
        .ops()
        .into_iter()
        .filter(|(op, _)| *op == IoOp::WriteIndex)
        .filter_map(|(_, p)| Some(p.parent()?.to_path_buf()))
        .collect();
    assert_eq!(written, BTreeSet::from([long]), "index files written");

    let rec = Arc::new(Record::default());
    let log = Log::open_with_hook(&dir, quiet(), rec.clone()).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    assert_eq!(log.recovery_report().bytes_scanned, 0);
    let t = log.topic("t").unwrap();
    for p in 0..PARTITIONS {
        let b = t.partition(p).unwrap().read(0, 1 << 20).unwrap();
        assert_eq!(b.iter().next().unwrap().value, &value(u64::from(p))[..]);
    }
    let p0 = t.partition(0).unwrap();
    for offset in 1..3 {
        let b = p0.read(offset, 1).unwrap();
        let r = b.iter().next().unwrap();
        assert_eq!((r.offset, r.value), (offset, &big[..]));
    }
    drop((p0, t));
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(&dir).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(partitions_touched(&rec, &dir).is_empty(), "{:?}", rec.ops());
}

/// Each partition's values, in order.
pub(super) type Written = Vec<(u32, Vec<Vec<u8>>)>;

/// A topic split and merged back `changes` times, a record in every
/// partition before each change, closed cleanly. Returns the directories
/// of its sealed partitions and what each partition holds.
pub(super) fn closed_history(dir: &Path, changes: u32) -> (Vec<PathBuf>, Written) {
    let log = Log::open(dir, quiet()).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: fissionlog::MIN_SEGMENT_BYTES,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let mut active = vec![0u32];
    let mut written: std::collections::BTreeMap<u32, Vec<Vec<u8>>> = Default::default();
    for i in 0..changes {
        for &p in &active {
            let v = value(u64::from(i) * 10 + u64::from(p));
            t.append_to(
                p,
                &[NewRecord {
                    key: None,
                    value: &v,
                    timestamp: None,
                }],
            )
            .unwrap();
            written.entry(p).or_default().push(v);
        }
        active = if active.len() == 1 {
            t.split(active[0], fissionlog::SplitPlan::Even).unwrap()
        } else {
            vec![t.merge(active[0], active[1]).unwrap()]
        };
    }
    let sealed = t
        .partitions()
        .iter()
        .filter(|p| p.sealed_at.is_some())
        .map(|p| t.partition(p.id).unwrap().dir().to_path_buf())
        .collect();
    drop(t);
    log.close().unwrap();
    (sealed, written.into_iter().collect())
}

/// A clean open of a topic with a long split and merge history costs
/// nothing per sealed partition beyond listing it and reading its last
/// segment's header: no mapping, no index file read, no data scanned, and
/// the budget holds nothing for them (C7 at scale). Every record still
/// reads back, each sealed partition's segment mapped on demand.
#[test]
fn a_clean_open_maps_no_segment_of_a_sealed_partition_until_it_is_read() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let (sealed, written) = closed_history(&dir, 40);
    assert!(sealed.len() >= 50, "{} sealed partitions", sealed.len());

    let rec = Arc::new(Record::default());
    let log = Log::open_with_hook(&dir, quiet(), rec.clone()).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    assert_eq!(log.recovery_report().bytes_scanned, 0);
    let mapped: Vec<PathBuf> = rec
        .ops()
        .into_iter()
        .filter(|(op, p)| *op == IoOp::MapSegment && sealed.iter().any(|d| p.starts_with(d)))
        .map(|(_, p)| p)
        .collect();
    assert!(
        mapped.is_empty(),
        "a clean open mapped {} segments of sealed partitions: {:?}",
        mapped.len(),
        &mapped[..mapped.len().min(4)]
    );
    let stats = log.resource_stats();
    assert_eq!(
        (stats.mapped_segments, stats.mappings_evicted),
        (0, 0),
        "the budget after a clean open: {stats:?}"
    );

    let t = log.topic("t").unwrap();
    for (p, values) in &written {
        let part = t.partition(*p).unwrap();
        let b = part.read(0, 1 << 20).unwrap();
        let got: Vec<Vec<u8>> = b.iter().map(|r| r.value.to_vec()).collect();
        assert_eq!(&got, values, "partition {p}");
    }
    // Each read loaded its segment's index from the data: one interval
    // of it, which a clean close does not write, so neither does a read.
    let written: Vec<PathBuf> = rec
        .ops()
        .into_iter()
        .filter(|(op, p)| *op == IoOp::WriteIndex && sealed.iter().any(|d| p.starts_with(d)))
        .map(|(_, p)| p)
        .collect();
    assert!(written.is_empty(), "reads wrote index files: {written:?}");
    drop(t);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(&dir).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}
