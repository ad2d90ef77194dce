//! A sync round costs O(dirty partitions), not
//! O(every partition ever created).
//!
//! `sync_round_cost_with_many_partitions` creates `FISSIONLOG_SCALE_PARTITIONS`
//! partitions (default 2,000; 10,000 for the figures in
//! docs/ARCHITECTURE.md) on tmpfs when there is one, and prints the time
//! of a round with one dirty partition, with every partition dirty, and
//! with none. The assertions are structural (which files a round fsyncs),
//! not timings: a round with one dirty partition syncs that partition's
//! segment (and the checkpoint), and once both checkpoint files are
//! current an idle round syncs nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::faults::Record;
use fissionlog::IoOp;
use fissionlog::{Log, LogOptions, NewRecord, SyncPolicy, TopicConfig};

/// The fsyncs a round issues.
const FSYNCS: [IoOp; 3] = [IoOp::SyncSegment, IoOp::SyncDir, IoOp::SyncCheckpoint];

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
fn sync_round_cost_with_many_partitions() {
    let n: u32 = std::env::var("FISSIONLOG_SCALE_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let shm = Path::new("/dev/shm");
    let root = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let hook = Arc::new(Record::default());
    let options = LogOptions {
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    };
    let log = Log::open_with_hook(root.path().join("log"), options, hook.clone()).unwrap();
    let mut cfg = TopicConfig {
        partitions: n,
        segment_bytes: 4096,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    };
    cfg.balance.max_partitions = n;
    let t0 = Instant::now();
    let t = log.create_topic("t", cfg).unwrap();
    let created = t0.elapsed();
    log.sync().unwrap();
    log.sync().unwrap();
    log.sync().unwrap();
    let rec = |i: u64| NewRecord {
        key: None,
        value: &[7u8; 32],
        timestamp: Some(i as i64),
    };
    let mut one = Vec::new();
    let mut none = Vec::new();
    let mut fsyncs_one = Vec::new();
    for i in 0..20u64 {
        t.append_to((i % u64::from(n)) as u32, &[rec(i)]).unwrap();
        hook.clear();
        let s = Instant::now();
        log.sync().unwrap();
        one.push(s.elapsed());
        fsyncs_one = hook.only(&FSYNCS);
        let s = Instant::now();
        log.sync().unwrap();
        none.push(s.elapsed());
    }
    let mut all = Vec::new();
    for i in 0..3u64 {
        for p in 0..n {
            t.append_to(p, &[rec(i)]).unwrap();
        }
        let s = Instant::now();
        log.sync().unwrap();
        all.push(s.elapsed());
    }
    eprintln!(
        "{n} partitions (created in {created:?}): sync round with 1 dirty {:?}, 0 dirty {:?}, all dirty {:?} (medians)",
        median(one),
        median(none),
        median(all)
    );
    let segs = fsyncs_one
        .iter()
        .filter(|(op, _)| *op == IoOp::SyncSegment)
        .count();
    assert_eq!(segs, 1, "a round with one dirty partition: {fsyncs_one:?}");
    // Once both checkpoint files hold the current positions, a round with
    // nothing dirty writes and syncs nothing.
    for _ in 0..3 {
        log.sync().unwrap();
    }
    hook.clear();
    let s = Instant::now();
    log.sync().unwrap();
    let idle_time = s.elapsed();
    let idle = hook.only(&FSYNCS);
    assert!(idle.is_empty(), "an idle round synced {idle:?}");
    let ck_bytes = std::fs::metadata(root.path().join("log/checkpoint.0"))
        .unwrap()
        .len();
    eprintln!("idle round (checkpoint files current) {idle_time:?}; checkpoint {ck_bytes} bytes");
    log.close().unwrap();
}

/// The index files it saw written, sorted.
fn index_writes(hook: &Record) -> Vec<PathBuf> {
    let mut v = hook.paths(IoOp::WriteIndex);
    v.sort();
    v
}

/// A clean close costs what changed: it rewrites (durably) the index file
/// of each partition whose index changed since it was last durable, and
/// no other. Of 200 partitions, one that took a new index entry since the
/// reopen gets its index written; a close after a reopen with nothing
/// appended writes none. The records and their index stay readable.
#[test]
fn a_clean_close_writes_only_the_indexes_that_changed() {
    const PARTITIONS: u32 = 200;
    let dir = tempfile::tempdir().unwrap();
    let config = TopicConfig {
        partitions: PARTITIONS,
        segment_bytes: 1 << 20,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    };
    let opts = || LogOptions {
        balancer: false,
        ..LogOptions::default()
    };
    let big = vec![7u8; 5000];
    fn rec(value: &[u8]) -> [NewRecord<'_>; 1] {
        [NewRecord {
            key: None,
            value,
            timestamp: None,
        }]
    }
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.create_topic("t", config).unwrap();
    for p in 0..PARTITIONS {
        topic.append_to(p, &rec(b"first")).unwrap();
    }
    drop(topic);
    log.close().unwrap();

    // Two large batches to partition 7: the second starts past the index
    // interval and takes an index entry; partition 8's small append does
    // not change its index.
    let hook = Arc::new(Record::default());
    let log = Log::open_with_hook(dir.path(), opts(), hook.clone()).unwrap();
    let topic = log.topic("t").unwrap();
    topic.append_to(7, &rec(&big)).unwrap();
    topic.append_to(7, &rec(&big)).unwrap();
    topic.append_to(8, &rec(b"small")).unwrap();
    drop(topic);
    hook.clear();
    log.close().unwrap();
    let written = index_writes(&hook);
    assert_eq!(written.len(), 1, "index files written: {written:?}");
    assert!(
        written[0].starts_with(dir.path().join("topics/t0/p7")),
        "{written:?}"
    );

    let hook = Arc::new(Record::default());
    let log = Log::open_with_hook(dir.path(), opts(), hook.clone()).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    hook.clear();
    log.close().unwrap();
    assert_eq!(
        index_writes(&hook),
        Vec::<PathBuf>::new(),
        "nothing changed"
    );

    let log = Log::open(dir.path(), opts()).unwrap();
    let p7 = log.topic("t").unwrap().partition(7).unwrap();
    for (offset, len) in [(0u64, 5usize), (1, 5000), (2, 5000)] {
        let b = p7.read(offset, 1).unwrap();
        let r = b.iter().next().unwrap();
        assert_eq!((r.offset, r.value.len()), (offset, len));
    }
    let p8 = log.topic("t").unwrap().partition(8).unwrap();
    assert_eq!(
        p8.read(1, 1).unwrap().iter().next().unwrap().value,
        b"small"
    );
    drop((p7, p8));
    log.close().unwrap();
}

/// Topic creation and a clean close batch their fsyncs in rounds of 256
/// files; with io_uring off (the plain-syscall fallback) a topic of more
/// partitions than one round is created, takes a record in every
/// partition, closes cleanly, and reopens clean with every record there,
/// and verify finds nothing.
#[test]
fn a_topic_larger_than_one_fsync_round_survives_a_clean_close_without_io_uring() {
    const PARTITIONS: u32 = 260;
    let dir = tempfile::tempdir().unwrap();
    let opts = || LogOptions {
        balancer: false,
        use_io_uring: false,
        ..LogOptions::default()
    };
    let config = TopicConfig {
        partitions: PARTITIONS,
        segment_bytes: 64 << 10,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    };
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.create_topic("t", config).unwrap();
    for p in 0..PARTITIONS {
        let value = p.to_le_bytes();
        let rec = [NewRecord {
            key: None,
            value: &value,
            timestamp: Some(i64::from(p)),
        }];
        topic.append_to(p, &rec).unwrap();
    }
    drop(topic);
    log.close().unwrap();

    let log = Log::open(dir.path(), opts()).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    let topic = log.topic("t").unwrap();
    for p in 0..PARTITIONS {
        let part = topic.partition(p).unwrap();
        assert_eq!(part.end_offset(), 1, "partition {p}");
        let b = part.read(0, 1 << 10).unwrap();
        let r = b.iter().next().expect("the partition's record");
        assert_eq!(r.value, p.to_le_bytes().as_slice(), "partition {p}");
        assert_eq!(part.offset_for_time(i64::from(p)).unwrap(), Some(0));
    }
    drop(topic);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}
