//! The bounded budget of mappings and descriptors: sealed partitions
//! hold no descriptor.

use crate::common;
use common::log::{quiet, serial, sized_value};
use common::tmpfs::{assert_child_ok, child_dir, run_child, Tmpfs};

use std::path::Path;

use fissionlog::{Log, LogOptions, NewRecord, TopicConfig};

/// One record of 3000 bytes fills a 4 KiB segment: every append rolls.
const LEN: usize = 3000;

fn budget(maps: usize, files: usize) -> LogOptions {
    LogOptions {
        max_mapped_segments: maps,
        max_open_files: files,
        ..quiet()
    }
}

/// Mappings of files under `dir` in this process.
fn mappings_under(dir: &Path) -> usize {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains(dir.as_str()))
        .count()
}

/// Descriptors of this process open on files under `dir`.
fn descriptors_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

/// Runs a scenario in a child process on a tmpfs where this process may
/// mount one (fsync costs nothing there), else in a temporary directory.
fn run_on_tmpfs(name: &str) {
    let root = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(1 << 30);
    let base = fs.as_ref().map_or(root.path(), |f| f.path.as_path());
    let out = run_child(module_path!(), name, &base.join("log"));
    assert_child_ok(name, &out);
}

/// Splits partition 0's lineage `changes` times (alternating a split of
/// the newest partition and a merge of the two children back): one active
/// partition at the end, `changes` sealed ones, each holding a record.
fn split_and_merge(log: &Log, changes: u32) -> Vec<u32> {
    let t = log.topic("t").unwrap();
    let mut active = 0u32;
    let mut written = vec![0u32];
    for _ in 0..changes.div_ceil(2) {
        t.append_to(
            active,
            &[NewRecord {
                key: None,
                value: &sized_value(0, LEN),
                timestamp: Some(0),
            }],
        )
        .unwrap();
        let children = t.split(active, fissionlog::SplitPlan::Even).unwrap();
        for &c in &children {
            t.append_to(
                c,
                &[NewRecord {
                    key: None,
                    value: &sized_value(0, LEN),
                    timestamp: Some(0),
                }],
            )
            .unwrap();
        }
        written.extend(&children);
        active = t.merge(children[0], children[1]).unwrap();
        written.push(active);
    }
    t.append_to(
        active,
        &[NewRecord {
            key: None,
            value: &sized_value(0, LEN),
            timestamp: Some(0),
        }],
    )
    .unwrap();
    written
}

/// A log with 1,000 splits and merges (1,500 sealed partitions, one
/// active) under `RLIMIT_NOFILE` 1,024, the default `ulimit -n`: the
/// changes, a clean close and open and a read of every partition stay
/// under the limit, and the sealed partitions hold no descriptor (nor,
/// beyond the budget, a mapping).
fn splits_and_merges_scenario(dir: &Path) {
    limit_open_files(1024);
    let log = Log::open(dir, budget(64, 16)).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    let partitions = split_and_merge(&log, 1000);
    log.sync().unwrap();
    assert!(
        descriptors_under(dir) <= 16 + 1 + 4,
        "{} descriptors after the changes",
        descriptors_under(dir)
    );
    log.close().unwrap();
    let log = Log::open(dir, budget(64, 16)).unwrap();
    for &p in &partitions {
        let part = log.topic("t").unwrap().partition(p).unwrap();
        let b = part.read(0, 1 << 20).unwrap();
        assert_eq!(b.iter().count(), 1, "partition {p}");
    }
    let held = descriptors_under(dir);
    assert!(
        held <= 16 + 1 + 4,
        "{held} descriptors after reading every partition"
    );
    assert!(mappings_under(dir) <= 64 + 1);
    log.close().unwrap();
}

/// Lowers this process's limit on open descriptors.
fn limit_open_files(n: u64) {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn a_thousand_splits_and_merges_open_and_read_under_a_low_descriptor_limit() {
    let _serial = serial();
    const NAME: &str = "a_thousand_splits_and_merges_open_and_read_under_a_low_descriptor_limit";
    if let Some(dir) = child_dir(NAME) {
        splits_and_merges_scenario(&dir);
        return;
    }
    run_on_tmpfs(NAME);
}
