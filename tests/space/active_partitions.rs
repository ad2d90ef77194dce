//! Descriptors of a log whose partitions are all active and all written:
//! the active segments' descriptors are under the log's budget
//! (`LogOptions::max_open_files`), so writing every partition, crashing
//! (`Log::abandon`, which keeps the page cache as a killed process would)
//! and reopening fit in a descriptor limit far below the partition count,
//! with every record back. The limit is set in a child process (the test
//! runs itself again), so the rest of the binary keeps its own.
//!
//! 2,000 partitions under `RLIMIT_NOFILE` 512 in the normal run;
//! `FISSIONLOG_ACTIVE_FD_PARTITIONS=10000` runs 10,000 under 1,024 (about
//! a minute in a debug build).

use std::path::Path;
use std::time::Duration;

use crate::common;
use common::log::{serial, sized_value};

use fissionlog::{Log, LogOptions, NewRecord, TopicConfig};

const CHILD_ENV: &str = "FISSIONLOG_ACTIVE_FD_CHILD";
const RECORD_BYTES: usize = 1000;
/// Every `ROLLED`-th partition gets records enough to roll after the sync.
const ROLLED: u32 = 3;
/// Records a rolled partition gets after the sync (a 4 KiB segment holds
/// three).
const MORE: u64 = 4;

fn partitions() -> (u32, u64) {
    match std::env::var("FISSIONLOG_ACTIVE_FD_PARTITIONS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(n) => (n, 1024),
        None => (2_000, 512),
    }
}

fn opts() -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        checkpoint_interval: Duration::from_secs(3600),
        ..LogOptions::default()
    }
}

/// The descriptors the process may hold outside a sync round and a topic
/// creation whatever the partition count: the budget's segments, the
/// log's own files, the test harness's.
fn ceiling() -> u64 {
    opts().max_open_files as u64 + 64
}

fn value(p: u32, i: u64) -> Vec<u8> {
    sized_value((u64::from(p) << 32) | i, RECORD_BYTES)
}

fn append(log: &Log, p: u32, i: u64) {
    let v = value(p, i);
    let r = NewRecord {
        key: None,
        value: &v,
        timestamp: None,
    };
    let at = log.topic("t").unwrap().append_to(p, &[r]).unwrap();
    assert_eq!(at, i, "partition {p}");
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

/// Every partition holds exactly `records(p)` records, each its own value.
fn check_all(log: &Log, n: u32, records: impl Fn(u32) -> u64) {
    let t = log.topic("t").unwrap();
    for p in 0..n {
        let part = t.partition(p).unwrap();
        let want = records(p);
        assert_eq!(part.end_offset(), want, "partition {p}");
        let mut next = 0;
        while next < want {
            let b = part.read(next, 1 << 20).unwrap();
            for r in b.iter() {
                assert_eq!(r.offset, next, "partition {p}");
                assert_eq!(r.value, &value(p, next)[..], "partition {p} offset {next}");
                next += 1;
            }
        }
    }
}

/// Runs in the child, under the limit.
fn scenario(dir: &Path, n: u32) {
    let before_crash = |p: u32| {
        if p.is_multiple_of(ROLLED) {
            1 + MORE
        } else {
            1
        }
    };
    let log = Log::open(dir, opts()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: n,
            segment_bytes: 4096,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    assert!(open_fds() <= ceiling(), "{} after the create", open_fds());
    for p in 0..n {
        append(&log, p, 0);
    }
    log.sync().unwrap();
    assert!(open_fds() <= ceiling(), "{} after the sync", open_fds());
    // Unsynced from here on: rolls and appends the crash keeps in the
    // page cache only.
    for p in (0..n).step_by(ROLLED as usize) {
        for i in 1..=MORE {
            append(&log, p, i);
        }
    }
    assert!(open_fds() <= ceiling(), "{} before the crash", open_fds());
    log.abandon();

    let log = Log::open(dir, opts()).unwrap();
    assert!(!log.recovery_report().clean_shutdown);
    assert!(open_fds() <= ceiling(), "{} after the reopen", open_fds());
    check_all(&log, n, before_crash);
    for p in 0..n {
        append(&log, p, before_crash(p));
    }
    log.close().unwrap();

    let log = Log::open(dir, opts()).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    assert!(
        open_fds() <= ceiling(),
        "{} after the clean open",
        open_fds()
    );
    check_all(&log, n, |p| before_crash(p) + 1);
    log.close().unwrap();
}

#[test]
fn every_partition_written_crashed_and_reopened_fits_a_descriptor_limit_below_the_partition_count()
{
    const NAME: &str =
        "every_partition_written_crashed_and_reopened_fits_a_descriptor_limit_below_the_partition_count";
    let (n, limit) = partitions();
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        scenario(Path::new(&dir), n);
        return;
    }
    assert!(
        u64::from(n) > limit,
        "the limit is below the partition count"
    );
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let mut cmd = common::log::rerun_command(module_path!(), NAME);
    cmd.env(CHILD_ENV, &dir);
    common::log::assert_rerun_passes_under_nofile(
        cmd,
        limit,
        &format!("{n} partitions under RLIMIT_NOFILE={limit}"),
    );
}
