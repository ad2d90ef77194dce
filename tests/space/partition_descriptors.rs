//! Descriptors of a log of many partitions under a low `RLIMIT_NOFILE`:
//! creating the topic, closing it, opening it clean, and opening it after
//! a crash in which every partition rolled past the segment its checkpoint
//! entry names (the open then fsyncs every partition's directory) all fit
//! in one descriptor per active partition plus one fsync batch of at most
//! 256 directories. The limit is set in a child process (the test runs
//! itself again), so the rest of the binary keeps its own.
//!
//! 1,000 partitions in the normal run; `FISSIONLOG_FD_SCALE_PARTITIONS=N`
//! runs N (10,000 takes a minute in a debug build).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common;
use common::log::{serial, sized_value};

use fissionlog::{Log, LogOptions, NewRecord, TopicConfig};

const CHILD_ENV: &str = "FISSIONLOG_FD_SCALE_CHILD";
/// Descriptors the log needs besides one per active partition: one fsync
/// batch (`BATCH_OPEN_MAX` = 256 directories or files), the lock, the
/// manifest, the checkpoint files, the io_uring and the test harness's own.
const SLACK: u64 = 256 + 64;

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
    // A second record of 3000 bytes rolls every partition to a segment the
    // checkpoint does not name; syncing now and then keeps the rolled
    // segments settled (a settled segment holds no descriptor).
    for p in 0..n {
        append(&log, p, 1);
        if p % 64 == 63 {
            log.sync().unwrap();
        }
    }
    log.sync().unwrap();
    let t = log.topic("t").unwrap();
    assert!((0..n).all(|p| t.partition(p).unwrap().segment_count() == 2));
    drop(t);
    log.abandon();

    let log = Log::open(dir, opts()).unwrap();
    assert!(!log.recovery_report().clean_shutdown);
    let after_crash = open_fds();
    assert!(
        after_crash <= clean_fds + 8,
        "{after_crash} descriptors after the open that followed a crash, {clean_fds} after a clean one"
    );
    let t = log.topic("t").unwrap();
    for p in 0..n {
        let part = t.partition(p).unwrap();
        assert_eq!(part.end_offset(), 2, "partition {p}");
        let b = part.read(1, 1).unwrap();
        assert_eq!(b.iter().next().unwrap().value, &sized_value(1, 3000)[..]);
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
    let limit = u64::from(n) + SLACK;
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        &common::log::test_name(module_path!(), NAME),
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, &dir);
    let rlimit = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setrlimit, which is async-signal-safe; `rlimit` is a plain
    // value copied into the closure.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{n} partitions under RLIMIT_NOFILE={limit}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "the child ran the scenario: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}
