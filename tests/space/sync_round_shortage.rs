//! A sync round that runs out of descriptors in a later chunk: the
//! budget closed the descriptors of the active segments, so the round
//! opens every dirty file again, about 256 at a time. When one chunk's
//! opens fail (EMFILE under a lowered `RLIMIT_NOFILE`), the chunks before
//! it are durable, the partitions of the failed chunk report nothing
//! durable past what was durable before, the round fails with a typed
//! `ResourceExhausted`, nothing is poisoned, and the next round (with
//! descriptors to spare) syncs what was left. The limit is lowered in a
//! child process (the test runs itself again).

use crate::common;
use common::log::{quiet, serial, sized_value};
use common::tmpfs::{assert_child_ok, child_dir, run_child};

use std::path::Path;

use fissionlog::{Error, Log, LogOptions, NewRecord, Resource, TopicConfig};

/// Partitions with one unsynced segment each: the first chunk.
const SMALL: u32 = 256;
/// Segments of partition 0, each rolled and unsynced: the second chunk
/// alone, larger than the first.
const ROLLS: u64 = 420;
/// One record of 3000 bytes fills a 4 KiB segment: every append rolls.
const LEN: usize = 3000;

fn opts() -> LogOptions {
    LogOptions {
        max_open_files: 8,
        ..quiet()
    }
}

fn append(log: &Log, p: u32, i: u64) {
    let v = sized_value(i, LEN);
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

/// Sets the soft limit on open descriptors (the hard one stays, so the
/// limit can be raised again).
fn soft_limit_open_files(n: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass and nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(rc, 0, "getrlimit: {}", std::io::Error::last_os_error());
    let old = lim.rlim_cur;
    lim.rlim_cur = n.min(lim.rlim_max);
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
    old
}

fn check_records(log: &Log, p: u32, n: u64) {
    let part = log.topic("t").unwrap().partition(p).unwrap();
    assert_eq!(part.end_offset(), n, "partition {p}");
    let mut next = 0;
    while next < n {
        let b = part.read(next, 1 << 20).unwrap();
        for r in b.iter() {
            assert_eq!(r.offset, next);
            assert_eq!(
                r.value,
                sized_value(next, LEN).as_slice(),
                "partition {p} record {next}"
            );
            next += 1;
        }
    }
}

fn scenario(dir: &Path) {
    let log = Log::open(dir, opts()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: SMALL + 1,
            segment_bytes: 4096,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    log.sync().unwrap();
    // Dirty in this order: partitions 1.. first (the first chunk), then
    // partition 0 with one unsynced segment per record (the second).
    for p in 1..=SMALL {
        append(&log, p, 0);
    }
    for i in 0..ROLLS {
        append(&log, 0, i);
    }
    let t = log.topic("t").unwrap();
    let p0 = t.partition(0).unwrap();
    assert!(p0.segment_count() as u64 >= ROLLS);
    let durable_before = p0.durable_end_offset();
    assert!(durable_before < ROLLS);
    assert!(log.resource_stats().open_segment_files <= 8);

    // Room for the first chunk's files, not for the second's.
    let base = open_fds();
    let old = soft_limit_open_files(base + 330);
    let err = log.sync().unwrap_err();
    assert!(
        matches!(
            err,
            Error::ResourceExhausted {
                resource: Resource::Descriptors,
                ..
            }
        ),
        "{err:?}"
    );
    for p in 1..=SMALL {
        assert_eq!(
            t.partition(p).unwrap().durable_end_offset(),
            1,
            "partition {p} was synced in the first chunk"
        );
    }
    assert_eq!(
        p0.durable_end_offset(),
        durable_before,
        "nothing of the partition whose chunk could not open is reported durable"
    );
    soft_limit_open_files(old);

    log.sync().unwrap();
    assert_eq!(
        p0.durable_end_offset(),
        ROLLS,
        "the next round syncs what was left"
    );
    drop((p0, t));
    log.abandon();

    let log = Log::open(dir, opts()).unwrap();
    check_records(&log, 0, ROLLS);
    for p in 1..=SMALL {
        check_records(&log, p, 1);
    }
    log.close().unwrap();
}

#[test]
fn a_sync_round_that_runs_out_of_descriptors_in_a_later_chunk_keeps_the_earlier_chunks_and_syncs_the_rest_next_round(
) {
    let _serial = serial();
    const NAME: &str = "a_sync_round_that_runs_out_of_descriptors_in_a_later_chunk_keeps_the_earlier_chunks_and_syncs_the_rest_next_round";
    if let Some(dir) = child_dir(NAME) {
        scenario(&dir);
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let out = run_child(module_path!(), NAME, &root.path().join("log"));
    assert_child_ok(NAME, &out);
}
