//! Descriptors of a log of many partitions under a low `RLIMIT_NOFILE`:
//! creating the topic, closing it, opening it clean, and opening it after
//! a crash in which every fourth partition rolled past the segment its
//! checkpoint entry names (the open then fsyncs those partitions'
//! directories, and keeps a descriptor for each segment rolled since the
//! checkpoint until it is repaired and synced) all fit in one descriptor
//! per active partition, one per segment rolled since the checkpoint, and
//! one fsync batch of at most 256 directories. The limit is set in a child
//! process (the test runs itself again), so the rest of the binary keeps
//! its own.
//!
//! 1,000 partitions in the normal run; `FISSIONLOG_FD_SCALE_PARTITIONS=N`
//! runs N (10,000 takes a minute in a debug build).

use std::path::Path;
use std::time::Duration;

use crate::common;
use common::log::{serial, sized_value};

use fissionlog::{Log, LogOptions, NewRecord, TopicConfig};

const CHILD_ENV: &str = "FISSIONLOG_FD_SCALE_CHILD";
/// Descriptors the log needs besides one per active partition and one per
/// segment rolled since the checkpoint: one fsync batch (`BATCH_OPEN_MAX`
/// = 256 directories or files), the lock, the manifest, the checkpoint
/// files, the io_uring and the test harness's own.
const SLACK: u64 = 256 + 64;

/// Every `ROLLED`-th partition rolls between the reopen and the crash.
const ROLLED: u32 = 4;

fn partitions() -> u32 {
    std::env::var("FISSIONLOG_FD_SCALE_PARTITIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000)
}

fn opts() -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        // No checkpoint between the reopen and the crash: every partition's
        // entry keeps naming its first segment.
        checkpoint_interval: Duration::from_secs(3600),
        ..LogOptions::default()
    }
}

fn append(log: &Log, p: u32, i: u64) {
    let v = sized_value(i, 3000);
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

/// Runs in the child, under the limit.
fn scenario(dir: &Path, n: u32) {
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
    for p in 0..n {
        append(&log, p, 0);
    }
    log.close().unwrap();

    let log = Log::open(dir, opts()).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    let clean_fds = open_fds();
    // A second record of 3000 bytes rolls a partition to a segment the
    // checkpoint does not name; syncing now and then keeps the rolled
    // segments settled (a settled segment holds no descriptor).
    for p in (0..n).step_by(ROLLED as usize) {
        append(&log, p, 1);
        if p % 64 == 60 {
            log.sync().unwrap();
        }
    }
    log.sync().unwrap();
    let t = log.topic("t").unwrap();
    for p in 0..n {
        let want = if p % ROLLED == 0 { 2 } else { 1 };
        assert_eq!(t.partition(p).unwrap().segment_count(), want);
    }
    drop(t);
    log.abandon();

    let log = Log::open(dir, opts()).unwrap();
    assert!(!log.recovery_report().clean_shutdown);
    let after_crash = open_fds();
    assert!(
        after_crash <= clean_fds + 8 + u64::from(n / ROLLED),
        "{after_crash} descriptors after the open that followed a crash, {clean_fds} after a clean one"
    );
    let t = log.topic("t").unwrap();
    for p in 0..n {
        let part = t.partition(p).unwrap();
        let rolled = p % ROLLED == 0;
        assert_eq!(
            part.end_offset(),
            if rolled { 2 } else { 1 },
            "partition {p}"
        );
        let b = part.read(u64::from(rolled), 1).unwrap();
        let want = sized_value(u64::from(rolled), 3000);
        assert_eq!(b.iter().next().unwrap().value, &want[..]);
    }
    drop(t);
    log.close().unwrap();
    let log = Log::open(dir, opts()).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    log.close().unwrap();
}

#[test]
fn many_partitions_create_close_open_and_reopen_after_a_crash_under_a_low_descriptor_limit() {
    const NAME: &str =
        "many_partitions_create_close_open_and_reopen_after_a_crash_under_a_low_descriptor_limit";
    let n = partitions();
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        scenario(Path::new(&dir), n);
        return;
    }
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let limit = u64::from(n) + u64::from(n / ROLLED) + SLACK;
    let mut cmd = common::log::rerun_command(module_path!(), NAME);
    cmd.env(CHILD_ENV, &dir);
    common::log::assert_rerun_passes_under_nofile(
        cmd,
        limit,
        &format!("{n} partitions under RLIMIT_NOFILE={limit}"),
    );
}
