//! Disk space, allocation and descriptors: a full disk is an error and never a SIGBUS, files hold their
//! data plus a bounded headroom, a failed roll never wedges a partition, a
//! stale index is rebuilt durably, and descriptors do not grow with the
//! number of segments.

use crate::common;
use common::faults::Fail;
use common::log::quiet;
use common::log::serial;
use common::log::sized_value;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::tmpfs::{assert_child_ok, child_dir, fill_disk, run_child, Tmpfs};
use fissionlog::IoOp;
use fissionlog::{Error, Log, NewRecord, SyncPolicy, TopicConfig};

fn append(log: &Log, topic: &str, i: u64, len: usize) -> fissionlog::Result<u64> {
    let t = log.topic(topic)?;
    let key = format!("k{i}");
    let at = t.append_batch(&[NewRecord {
        key: Some(key.as_bytes()),
        value: &sized_value(i, len),
        timestamp: Some(i as i64),
    }])?;
    Ok(at[0].offset)
}

fn read_all(log: &Log, topic: &str, partition: u32, len: usize) -> u64 {
    let p = log.topic(topic).unwrap().partition(partition).unwrap();
    let mut next = p.start_offset();
    while next < p.end_offset() {
        let b = p.read(next, 1 << 20).unwrap();
        for r in b.iter() {
            assert_eq!(r.offset, next);
            assert_eq!(r.value, sized_value(next, len).as_slice(), "record {next}");
            next += 1;
        }
    }
    next
}

const SEG_4M: u64 = 4 << 20;

/// The scenario of `full_disk_after_unclean_open_is_no_space_not_sigbus`,
/// run in a child process on a 24 MiB tmpfs.
fn full_disk_scenario(mnt: &Path) {
    const LEN: usize = 1000;
    let dir = mnt.join("log");
    let config = TopicConfig {
        partitions: 1,
        segment_bytes: SEG_4M,
        ..TopicConfig::default()
    };
    let log = Log::open(&dir, quiet()).unwrap();
    log.create_topic("t", config).unwrap();
    for i in 0..100 {
        assert_eq!(append(&log, "t", i, LEN).unwrap(), i);
    }
    log.sync().unwrap();
    // A crash: the next open is unclean and clears the active segment's tail.
    log.abandon();
    let log = Log::open(&dir, quiet()).unwrap();
    assert!(!log.recovery_report().clean_shutdown);
    let filler = mnt.join("filler");
    fill_disk(&filler);
    // Append until the disk is full: an error, not a SIGBUS.
    let mut acked = 100u64;
    let err = loop {
        match append(&log, "t", acked, LEN) {
            Ok(off) => {
                assert_eq!(off, acked);
                acked += 1;
            }
            Err(e) => break e,
        }
        assert!(acked < 100_000, "the disk never filled up");
    };
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert_eq!(read_all(&log, "t", 0, LEN), acked);
    // Once space frees, the same partition takes appends again.
    std::fs::remove_file(&filler).unwrap();
    for i in acked..acked + 50 {
        assert_eq!(append(&log, "t", i, LEN).unwrap(), i);
    }
    acked += 50;
    log.close().unwrap();
    let log = Log::open(&dir, quiet()).unwrap();
    assert_eq!(read_all(&log, "t", 0, LEN), acked);
    // And the same again, starting from a full disk after an unclean open.
    log.abandon();
    let log = Log::open(&dir, quiet()).unwrap();
    fill_disk(&filler);
    let err = loop {
        match append(&log, "t", acked, LEN) {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    log.abandon();
    std::fs::remove_file(&filler).unwrap();
    let log = Log::open(&dir, quiet()).unwrap();
    assert_eq!(read_all(&log, "t", 0, LEN), acked);
    log.close().unwrap();
}

/// Recovery cleared the active segment's free tail by
/// punching holes, so later stores into the mapping allocated inside a page
/// fault and a full disk killed the process with SIGBUS. Every byte the
/// writer stores into must be allocated first; a full disk is
/// `Error::NoSpace`, loses nothing acknowledged and the log reopens.
#[test]
fn full_disk_after_unclean_open_is_no_space_not_sigbus() {
    let _serial = serial();
    const NAME: &str = "full_disk_after_unclean_open_is_no_space_not_sigbus";
    if let Some(dir) = child_dir(NAME) {
        full_disk_scenario(&dir);
        return;
    }
    let Some(fs) = Tmpfs::mount(24 << 20) else {
        return;
    };
    let out = run_child(module_path!(), NAME, &fs.path);
    assert_child_ok(NAME, &out);
}

/// Bytes a directory tree occupies on disk (st_blocks), and the total
/// length of the files in it.
fn disk_usage(dir: &Path) -> (u64, u64) {
    let mut used = 0;
    let mut len = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        if m.is_dir() {
            let (u, l) = disk_usage(&e.path());
            used += u;
            len += l;
        } else {
            used += m.blocks() * 512;
            len += m.len();
        }
    }
    (used, len)
}

/// 3 records in 4 partitions took 513 MB, because
/// every partition preallocated a whole 128 MiB segment. Preallocation
/// runs in bounded chunks ahead of the writer.
#[test]
fn small_log_occupies_its_data_plus_bounded_headroom() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = Log::open(&dir, quiet()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 4,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    for i in 0..3 {
        append(&log, "t", i, 100).unwrap();
    }
    log.sync().unwrap();
    let (used, _) = disk_usage(&dir);
    eprintln!("3 records in 4 partitions: {used} bytes on disk");
    let bound = 4 * fissionlog::ACTIVE_HEADROOM_MAX_BYTES + (1 << 20);
    assert!(used <= bound, "{used} bytes on disk, bound {bound}");
    log.close().unwrap();
    let (used, _) = disk_usage(&dir);
    assert!(used <= bound, "{used} bytes on disk after close");
}

/// Bytes of data (segment headers and batches) held by a partition.
fn data_bytes(log: &Log, topic: &str, partition: u32) -> u64 {
    let p = log.topic(topic).unwrap().partition(partition).unwrap();
    p.size_bytes() + 64 * p.segment_count() as u64
}

/// A rolled segment and the last segment of a sealed
/// (split) partition keep only their data: bytes on disk per byte of data
/// stay within 1.01 for sealed data (index files included), plus a bounded
/// headroom for each active partition.
#[test]
fn sealed_segments_are_trimmed_to_their_data() {
    let _serial = serial();
    const LEN: usize = 1000;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = Log::open(&dir, quiet()).unwrap();
    let config = TopicConfig {
        partitions: 1,
        segment_bytes: SEG_4M,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    };
    log.create_topic("t", config).unwrap();
    for i in 0..20_000 {
        append(&log, "t", i, LEN).unwrap();
    }
    log.sync().unwrap();
    let t = log.topic("t").unwrap();
    assert!(t.partition(0).unwrap().segment_count() >= 4);
    let pdir = t.partition(0).unwrap().dir().to_path_buf();
    let data = data_bytes(&log, "t", 0);
    let (used, _) = disk_usage(&pdir);
    let headroom = fissionlog::ACTIVE_HEADROOM_MAX_BYTES;
    assert!(
        used as f64 <= 1.01 * data as f64 + headroom as f64,
        "{used} bytes on disk for {data} bytes of data"
    );
    // Split: the parent is sealed and must give back its headroom.
    let children = t.split(0, fissionlog::SplitPlan::Even).unwrap();
    let (used, _) = disk_usage(&pdir);
    eprintln!(
        "sealed partition: {used} bytes on disk for {data} bytes of data ({:.4})",
        used as f64 / data as f64
    );
    assert!(
        used as f64 <= 1.01 * data as f64,
        "sealed partition: {used} bytes on disk for {data} bytes of data"
    );
    log.close().unwrap();
    let log = Log::open(&dir, quiet()).unwrap();
    assert_eq!(read_all(&log, "t", 0, LEN), 20_000);
    let (used, _) = disk_usage(&pdir);
    assert!(used as f64 <= 1.01 * data as f64, "after reopen: {used}");
    assert!(!children.is_empty());
}

/// Segments of 8 KiB hold 7 records of 1000 bytes (1057 bytes each with
/// framing, after a 64-byte header).
const SMALL_SEG: u64 = 8192;
const PER_SMALL_SEG: u64 = 7;

fn small_segments() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: SMALL_SEG,
        ..TopicConfig::default()
    }
}

/// Asserts the log in `dir` holds exactly records `0..n` of topic "t" and
/// that `verify` finds nothing wrong.
fn assert_log_holds(dir: &Path, n: u64) {
    let log = Log::open(dir, quiet()).unwrap();
    assert_eq!(read_all(&log, "t", 0, 1000), n);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A failure at any step of a roll leaves the partition
/// writable. Steps that make the new segment (create, allocate, map) fail
/// the append that needed the roll and change nothing; the index write (a
/// cache) and the trim (space only) do not fail it. Later appends roll
/// normally and nothing lands in a sealed segment.
#[test]
fn a_failure_at_any_roll_step_leaves_the_partition_writable() {
    let _serial = serial();
    let steps = [
        (IoOp::CreateSegment, true),
        (IoOp::AllocateSegment, true),
        (IoOp::MapSegment, true),
        (IoOp::WriteIndex, false),
        (IoOp::TrimSegment, false),
    ];
    for (op, fails_append) in steps {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        // The next call of `op` fails with ENOSPC, once.
        let hook = std::sync::Arc::new(
            Fail::new(IoOp::CreateSegment, libc::ENOSPC)
                .once()
                .disarmed(),
        );
        let log = Log::open_with_hook(&dir, quiet(), hook.clone()).unwrap();
        log.create_topic("t", small_segments()).unwrap();
        let mut next = 0;
        while next < PER_SMALL_SEG {
            append(&log, "t", next, 1000).unwrap();
            next += 1;
        }
        hook.arm_for(op);
        match append(&log, "t", next, 1000) {
            Ok(off) => {
                assert!(!fails_append, "{op:?}: the roll should have failed");
                assert_eq!(off, next);
                next += 1;
            }
            Err(e) => {
                assert!(fails_append, "{op:?}: {e}");
                assert!(matches!(e, Error::NoSpace { .. }), "{op:?}: {e}");
            }
        }
        assert_eq!(hook.failures(), 1, "{op:?}");
        // The partition keeps working: small and large records, several rolls.
        for _ in 0..3 * PER_SMALL_SEG {
            assert_eq!(append(&log, "t", next, 1000).unwrap(), next, "{op:?}");
            next += 1;
        }
        assert_eq!(read_all(&log, "t", 0, 1000), next, "{op:?}");
        log.close().unwrap();
        assert_log_holds(&dir, next);
    }
}

/// As first reproduced: the seal's index write fails
/// after the new segment file was created (here: a directory sits where
/// the index's temporary file goes). Before the fix every later roll failed
/// with "File exists" until restart, and records went on landing in the
/// segment whose header already carried the seal.
#[test]
fn a_failed_index_write_at_a_roll_does_not_wedge_the_partition() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = Log::open(&dir, quiet()).unwrap();
    log.create_topic("t", small_segments()).unwrap();
    let pdir = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .dir()
        .to_path_buf();
    std::fs::create_dir(pdir.join(format!("{:020}.idx.tmp", 0))).unwrap();
    let mut next = 0;
    for _ in 0..4 * PER_SMALL_SEG {
        assert_eq!(append(&log, "t", next, 1000).unwrap(), next);
        next += 1;
    }
    assert!(
        log.topic("t")
            .unwrap()
            .partition(0)
            .unwrap()
            .segment_count()
            >= 4
    );
    assert_eq!(read_all(&log, "t", 0, 1000), next);
    log.close().unwrap();
    std::fs::remove_dir(pdir.join(format!("{:020}.idx.tmp", 0))).unwrap();
    assert_log_holds(&dir, next);
}

fn cli(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fissionlog"))
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("run fissionlog")
}

/// A log whose partition rolled three times; returns the first segment's
/// index path and its bytes.
fn rolled_log(dir: &Path) -> (PathBuf, Vec<u8>, u64) {
    let log = Log::open(dir, quiet()).unwrap();
    log.create_topic("t", small_segments()).unwrap();
    let n = 3 * PER_SMALL_SEG + 2;
    for i in 0..n {
        append(&log, "t", i, 1000).unwrap();
    }
    let pdir = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .dir()
        .to_path_buf();
    log.close().unwrap();
    let idx = pdir.join(format!("{:020}.idx", 0));
    let bytes = std::fs::read(&idx).unwrap();
    assert!(bytes.len() > 16, "the rolled segment has an index");
    (idx, bytes, n)
}

/// Index files that do not match their segment: empty (what a power loss
/// after an unsynced roll left), garbage, and well-formed entries pointing
/// at the wrong positions.
fn stale_indexes(good: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let mut shifted = good.to_vec();
    // Second entry's position (bytes 16 + 16 + 4 ..): off by 8 bytes.
    let at = 16 + 16 + 4;
    let pos = u32::from_le_bytes(shifted[at..at + 4].try_into().unwrap()) + 8;
    shifted[at..at + 4].copy_from_slice(&pos.to_le_bytes());
    vec![
        ("empty", Vec::new()),
        ("garbage", b"this is not an index file".to_vec()),
        ("wrong positions", shifted),
    ]
}

/// After a power loss at a roll the rolled segment's
/// index was empty on disk, never rewritten, and `verify` failed forever.
/// The read that notices a stale index rebuilds it and writes it durably
/// (tmp + fsync + rename + directory fsync, through the hook).
#[test]
fn a_stale_index_is_rebuilt_durably_by_the_read_that_notices_it() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    for (what, stale) in stale_indexes(&rolled_log(&root.path().join("probe")).1) {
        let dir = root.path().join(what.replace(' ', "_"));
        let (idx, good, n) = rolled_log(&dir);
        std::fs::write(&idx, &stale).unwrap();
        let hook = std::sync::Arc::new(common::faults::Record::default());
        let log = Log::open_with_hook(&dir, quiet(), hook.clone()).unwrap();
        assert_eq!(read_all(&log, "t", 0, 1000), n, "{what}");
        // Reads that start at each offset (they use the index's hints).
        let p = log.topic("t").unwrap().partition(0).unwrap();
        for i in 0..n {
            let b = p.read(i, 1).unwrap();
            let r = b.iter().next().unwrap();
            assert_eq!(
                (r.offset, r.value),
                (i, sized_value(i, 1000).as_slice()),
                "{what}"
            );
        }
        // A partition handle keeps the directory locked: drop it first.
        drop(p);
        log.close().unwrap();
        assert_eq!(std::fs::read(&idx).unwrap(), good, "{what}: index rebuilt");
        let ops = hook.ops();
        let tmp = idx.with_extension("idx.tmp");
        assert!(
            ops.iter()
                .any(|(op, p)| *op == IoOp::SyncIndex && *p == tmp),
            "{what}: the rebuilt index is fsynced: {ops:?}"
        );
        assert!(
            ops.iter()
                .any(|(op, p)| *op == IoOp::SyncIndexDir && Some(p.as_path()) == idx.parent()),
            "{what}: its rename is made durable: {ops:?}"
        );
        let out = cli(&["verify"], &dir);
        assert!(out.status.success(), "{what}: {out:?}");
    }
}

/// `recover` must not call the log consistent and leave a stale index in
/// place: it rewrites the index, so `verify` is clean again.
#[test]
fn recover_rebuilds_a_stale_index() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    for (what, stale) in stale_indexes(&rolled_log(&root.path().join("probe")).1) {
        let dir = root.path().join(what.replace(' ', "_"));
        let (idx, good, n) = rolled_log(&dir);
        std::fs::write(&idx, &stale).unwrap();
        let out = cli(&["recover"], &dir);
        assert!(out.status.success(), "{what}: {out:?}");
        assert_eq!(std::fs::read(&idx).unwrap(), good, "{what}: index rebuilt");
        let out = cli(&["verify"], &dir);
        assert!(out.status.success(), "{what}: {out:?}");
        assert_log_holds(&dir, n);
    }
}

/// Files written by versions that preallocated
/// whole segments (and punched holes into the free tail on an unclean
/// open) still open; nothing past the data counts as allocated (the writer
/// allocates before it stores there), and the data stays readable.
#[test]
fn segments_preallocated_or_punched_by_older_versions_still_open() {
    let _serial = serial();
    for (what, sparse) in [("preallocated", false), ("punched", true)] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        let log = Log::open(&dir, quiet()).unwrap();
        let config = TopicConfig {
            partitions: 1,
            segment_bytes: SEG_4M,
            ..TopicConfig::default()
        };
        log.create_topic("t", config).unwrap();
        for i in 0..100 {
            append(&log, "t", i, 1000).unwrap();
        }
        let pdir = log
            .topic("t")
            .unwrap()
            .partition(0)
            .unwrap()
            .dir()
            .to_path_buf();
        log.close().unwrap();
        let seg = pdir.join(format!("{:020}.seg", 0));
        let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
        if sparse {
            f.set_len(SEG_4M).unwrap();
        } else {
            // SAFETY: plain syscall on an fd this test owns.
            let rc = unsafe {
                libc::fallocate(
                    std::os::unix::io::AsRawFd::as_raw_fd(&f),
                    0,
                    0,
                    SEG_4M as libc::off_t,
                )
            };
            assert_eq!(rc, 0, "{what}");
        }
        drop(f);
        let log = Log::open(&dir, quiet()).unwrap();
        // The file's length says nothing about its allocation: the log
        // counts as allocated only its data (to a page), so the writer
        // allocates before it stores into the punched tail.
        let info = log
            .topic("t")
            .unwrap()
            .partition(0)
            .unwrap()
            .segment_infos();
        assert_eq!(info.len(), 1, "{what}");
        assert!(
            info[0].file_bytes < info[0].data_bytes + 64 + 4096,
            "{what}: the tail past the data counts as allocated: {info:?}"
        );
        for i in 100..5000 {
            append(&log, "t", i, 1000).unwrap();
        }
        log.abandon();
        let log = Log::open(&dir, quiet()).unwrap();
        assert_eq!(read_all(&log, "t", 0, 1000), 5000, "{what}");
        log.close().unwrap();
        assert_log_holds(&dir, 5000);
        // The old full-size file was rolled and trimmed to its data.
        assert!(std::fs::metadata(&seg).unwrap().len() < SEG_4M, "{what}");
    }
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

/// Descriptors this process holds open.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// One record of 3000 bytes fills a 4 KiB segment: every append rolls.
fn many_segments_scenario(dir: &Path, segments: u64, fd_limit: u64) {
    limit_open_files(fd_limit);
    let log = Log::open(dir, quiet()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: 4096,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    for i in 0..segments {
        assert_eq!(append(&log, "t", i, 3000).unwrap(), i);
        if i % 32 == 31 {
            log.sync().unwrap();
        }
    }
    log.sync().unwrap();
    let held = open_fds();
    assert!(held < 48, "{held} descriptors open for {segments} segments");
    assert_eq!(
        log.topic("t")
            .unwrap()
            .partition(0)
            .unwrap()
            .segment_count() as u64,
        segments
    );
    log.close().unwrap();
    // Opening (recovery), reading and verifying stay under the limit too.
    let log = Log::open(dir, quiet()).unwrap();
    assert!(
        open_fds() < 64,
        "{} descriptors open after open",
        open_fds()
    );
    assert_eq!(read_all(&log, "t", 0, 3000), segments);
    assert!(
        open_fds() < 64,
        "{} descriptors open after reads",
        open_fds()
    );
    log.abandon();
    let log = Log::open(dir, quiet()).unwrap();
    assert_eq!(read_all(&log, "t", 0, 3000), segments);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Runs the many-segments scenario in a child process, on a tmpfs where
/// this process may mount one (fsync costs nothing there, and descriptors
/// do not depend on the filesystem), else in a temporary directory.
fn run_many_segments(name: &str) {
    let root = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(1 << 30);
    let base = fs.as_ref().map_or(root.path(), |f| f.path.as_path());
    let out = run_child(module_path!(), name, &base.join("log"));
    assert_child_ok(name, &out);
}

/// Every segment held a descriptor for the life of
/// the log, so about 20k segments hit "too many open files". A sealed
/// segment closes its descriptor once its seal is synced (the mapping
/// stays valid), so 2,000 segments run under a limit of 64 descriptors.
#[test]
fn sealed_segments_hold_no_descriptor() {
    let _serial = serial();
    const NAME: &str = "sealed_segments_hold_no_descriptor";
    if let Some(dir) = child_dir(NAME) {
        many_segments_scenario(&dir, 2_000, 64);
        return;
    }
    run_many_segments(NAME);
}

/// [`sealed_segments_hold_no_descriptor`] at 50,000 segments (opt-in:
/// `cargo test --test space -- --ignored`).
#[test]
#[ignore]
fn fifty_thousand_segments_under_a_low_descriptor_limit() {
    let _serial = serial();
    const NAME: &str = "fifty_thousand_segments_under_a_low_descriptor_limit";
    if let Some(dir) = child_dir(NAME) {
        many_segments_scenario(&dir, 50_000, 64);
        return;
    }
    run_many_segments(NAME);
}

/// Appends records `first..first + n` of `len` bytes to partition 0 as one
/// batch (`append_to`): at 20 × 1000 B it is past the 16 KiB from which a
/// batch is written with `pwrite` instead of stores into the mapping.
fn append_batch_of(
    log: &Log,
    topic: &str,
    first: u64,
    n: u64,
    len: usize,
) -> fissionlog::Result<u64> {
    let values: Vec<Vec<u8>> = (first..first + n).map(|i| sized_value(i, len)).collect();
    let keys: Vec<String> = (first..first + n).map(|i| format!("k{i}")).collect();
    let records: Vec<NewRecord<'_>> = (0..n as usize)
        .map(|j| NewRecord {
            key: Some(keys[j].as_bytes()),
            value: &values[j],
            timestamp: Some((first + j as u64) as i64),
        })
        .collect();
    log.topic(topic)?.append_to(0, &records)
}

/// Appends single records and `pwrite` batches in turn until the disk is
/// full; checks the error and that every acknowledged record reads back,
/// then frees the space and appends one more batch. Returns the new count.
fn fill_with_large_batches(log: &Log, filler: &Path, mut acked: u64) -> u64 {
    const LEN: usize = 1000;
    const BATCH: u64 = 20;
    fill_disk(filler);
    let err = loop {
        let r = if acked.is_multiple_of(3) {
            append(log, "t", acked, LEN).map(|_| 1)
        } else {
            append_batch_of(log, "t", acked, BATCH, LEN).map(|first| {
                assert_eq!(first, acked);
                BATCH
            })
        };
        match r {
            Ok(n) => acked += n,
            Err(e) => break e,
        }
        assert!(acked < 1_000_000, "the disk never filled up");
    };
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert_eq!(read_all(log, "t", 0, LEN), acked);
    // Space frees: the partition takes batches again where it stopped.
    std::fs::remove_file(filler).unwrap();
    assert_eq!(append_batch_of(log, "t", acked, BATCH, LEN).unwrap(), acked);
    log.sync().unwrap();
    acked + BATCH
}

/// The scenario of `full_disk_under_large_batches_is_no_space`, run in a
/// child process on a 24 MiB tmpfs: batches written with `pwrite`,
/// interleaved with single records stored through the mapping.
fn full_disk_large_batches_scenario(mnt: &Path) {
    let dir = mnt.join("log");
    let filler = mnt.join("filler");
    let config = TopicConfig {
        partitions: 1,
        segment_bytes: SEG_4M,
        ..TopicConfig::default()
    };
    let log = Log::open(&dir, quiet()).unwrap();
    log.create_topic("t", config).unwrap();
    let acked = fill_with_large_batches(&log, &filler, 0);
    // Again from an unclean open.
    log.abandon();
    let log = Log::open(&dir, quiet()).unwrap();
    assert!(!log.recovery_report().clean_shutdown);
    let acked = fill_with_large_batches(&log, &filler, acked);
    log.close().unwrap();
    let log = Log::open(&dir, quiet()).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    assert_eq!(read_all(&log, "t", 0, 1000), acked);
    log.close().unwrap();
}

/// A full disk while batches go through `pwrite` (which grows the file
/// itself) is `Error::NoSpace` from the append, publishes nothing of the
/// batch, and the partition takes appends again once space frees, also
/// after an unclean open.
#[test]
fn full_disk_under_large_batches_is_no_space() {
    let _serial = serial();
    const NAME: &str = "full_disk_under_large_batches_is_no_space";
    if let Some(dir) = child_dir(NAME) {
        full_disk_large_batches_scenario(&dir);
        return;
    }
    let Some(fs) = Tmpfs::mount(24 << 20) else {
        return;
    };
    let out = run_child(module_path!(), NAME, &fs.path);
    assert_child_ok(NAME, &out);
}

/// Opens descriptors until the process has none left; dropping the result
/// gives them back.
fn hoard_descriptors() -> Vec<std::fs::File> {
    let mut held = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                return held;
            }
        }
        assert!(held.len() < 100_000, "no descriptor limit");
    }
}

/// Every append rolls (3000 B records in 4 KiB segments). After a sync
/// and with no descriptor left, the rolls still go through: the only
/// descriptor the log holds for segments, the active one's, is under the
/// budget, which gives it back (the writer opens the new segment with
/// it). Then, with rolled segments left unsynced (they keep their
/// descriptors until a round) and again no descriptor left, every roll
/// goes through too: the budget closes the unsynced segments'
/// descriptors (the next round opens them again) and the roll uses them.
/// Sync and close succeed, and every acknowledged record is there after
/// reopen. (A shortage the budget cannot relieve is
/// `Error::ResourceExhausted`, injected in `tests/space/budget.rs`.)
fn descriptor_shortage_at_a_roll_scenario(dir: &Path) {
    limit_open_files(64);
    let log = Log::open(dir, quiet()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: 4096,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    for i in 0..10 {
        assert_eq!(append(&log, "t", i, 3000).unwrap(), i);
    }
    log.sync().unwrap();
    let held = hoard_descriptors();
    for i in 10..20 {
        assert_eq!(append(&log, "t", i, 3000).unwrap(), i);
    }
    assert!(
        log.resource_stats().files_evicted > 0,
        "the budget gave descriptors back"
    );
    drop(held);
    log.sync().unwrap();
    let held = hoard_descriptors();
    for i in 20..40 {
        assert_eq!(append(&log, "t", i, 3000).unwrap(), i);
    }
    drop(held);
    log.sync().unwrap();
    log.close().unwrap();
    let log = Log::open(dir, quiet()).unwrap();
    assert_eq!(read_all(&log, "t", 0, 3000), 40);
    log.close().unwrap();
}

/// A descriptor shortage is the environment, not a failed fsync: a roll
/// that cannot open the partition directory or the new segment (EMFILE)
/// has the budget give back the segments' descriptors and tries again,
/// and poisons nothing. Run in a child process under a limit of 64
/// descriptors.
#[test]
fn a_descriptor_shortage_at_a_roll_is_relieved_by_the_budget_and_poisons_nothing() {
    let _serial = serial();
    const NAME: &str =
        "a_descriptor_shortage_at_a_roll_is_relieved_by_the_budget_and_poisons_nothing";
    if let Some(dir) = child_dir(NAME) {
        descriptor_shortage_at_a_roll_scenario(&dir);
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let out = run_child(module_path!(), NAME, &root.path().join("log"));
    assert_child_ok(NAME, &out);
}
