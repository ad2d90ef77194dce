//! Full-length sparse segment files, the `pwrite`
//! path for large batches, single-target syncs and the lineage reader
//! (contracts C1-C8). Scenarios that can kill the process (SIGBUS) run in
//! a child process on a size-limited tmpfs, as in `allocation`.

use crate::common;
use common::log::quiet;
use common::log::serial;
use common::log::sized_value;
use common::retention::OLD_TS;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::tmpfs::{
    assert_child_ok, child_dir, fill_disk, run_child, Tmpfs, CHILD_DIR_ENV, CHILD_ENV,
};
use fissionlog::{Error, Log, LogOptions, NewRecord, SyncPolicy, TopicConfig};

/// Appends one record with value `sized_value(i, len)` to partition 0 of "t".
fn append(log: &Log, i: u64, len: usize) -> fissionlog::Result<u64> {
    let t = log.topic("t")?;
    let key = format!("k{i}");
    let at = t.append_to(
        0,
        &[NewRecord {
            key: Some(key.as_bytes()),
            value: &sized_value(i, len),
            timestamp: Some(i as i64),
        }],
    )?;
    Ok(at)
}

/// Reads partition 0 of "t" and checks record `i` holds `sized_value(i, len)`;
/// returns the end offset.
fn read_all(log: &Log, len_of: impl Fn(u64) -> usize) -> u64 {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let mut next = p.start_offset();
    while next < p.end_offset() {
        let b = p.read(next, 1 << 20).unwrap();
        for r in b.iter() {
            assert_eq!(r.offset, next);
            assert_eq!(
                r.value,
                sized_value(next, len_of(next)).as_slice(),
                "record {next}"
            );
            next += 1;
        }
    }
    next
}

/// Runs `scenario` in a child process on a tmpfs of `bytes` bytes.
fn in_child_on_tmpfs(name: &str, bytes: u64, scenario: fn(&Path)) {
    if let Some(dir) = child_dir(name) {
        scenario(&dir);
        return;
    }
    let _serial = serial();
    let Some(fs) = Tmpfs::mount(bytes) else {
        return;
    };
    let out = run_child(module_path!(), name, &fs.path);
    assert_child_ok(name, &out);
}

/// Bytes the files of a directory tree occupy on disk (st_blocks).
fn disk_usage(dir: &Path) -> u64 {
    let mut used = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        used += if m.is_dir() {
            disk_usage(&e.path())
        } else {
            m.blocks() * 512
        };
    }
    used
}

const SEG_4M: u64 = 4 << 20;
/// A value this long makes a batch of more than 16 KiB: written with
/// `pwrite`, and it leaves no allocated space past its end.
const BIG: usize = 40 << 10;

fn create(dir: &Path) -> Log {
    let log = Log::open(dir, quiet()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: SEG_4M,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    log
}

/// An unclean open on a full disk after a large batch was the last write:
/// the batch was written with `pwrite`, so nothing past it is allocated,
/// and the recovery scan looks past the end of the data for a torn write.
/// Reading that sparse range through a shared mapping allocates on tmpfs,
/// and on a full one kills the process with SIGBUS (C6). The open must
/// succeed, or fail with a typed error, and keep every synced record.
fn unclean_open_full_disk_after_big_batch(mnt: &Path) {
    let dir = mnt.join("log");
    let log = create(&dir);
    for i in 0..3 {
        assert_eq!(append(&log, i, 100).unwrap(), i);
    }
    assert_eq!(append(&log, 3, BIG).unwrap(), 3);
    log.sync().unwrap();
    log.abandon();
    let filler = mnt.join("filler");
    fill_disk(&filler);
    let len_of = |i: u64| if i == 3 { BIG } else { 100 };
    match Log::open(&dir, quiet()) {
        Ok(log) => {
            assert!(!log.recovery_report().clean_shutdown);
            assert_eq!(read_all(&log, len_of), 4);
            let err = append(&log, 4, 100).err();
            assert!(
                err.is_none() || matches!(err, Some(Error::NoSpace { .. })),
                "{err:?}"
            );
            log.abandon();
        }
        Err(e) => assert!(matches!(e, Error::NoSpace { .. }), "{e}"),
    }
    std::fs::remove_file(&filler).unwrap();
    let log = Log::open(&dir, quiet()).unwrap();
    assert!(read_all(&log, len_of) >= 4);
    log.close().unwrap();
}

#[test]
fn unclean_open_on_full_disk_after_pwrite_batch_is_no_sigbus() {
    in_child_on_tmpfs(
        "unclean_open_on_full_disk_after_pwrite_batch_is_no_sigbus",
        16 << 20,
        unclean_open_full_disk_after_big_batch,
    );
}

/// Damage inside the synced part of an active segment, on a tmpfs smaller
/// than one segment: a strict full-scan open looks for valid batches after the
/// damage across the whole file, and the file is as long as the segment,
/// sparse past its data. Reading that sparse range through the mapping
/// allocates it on tmpfs (disk usage grows by the segment size) and, as it
/// does not fit, kills the process with SIGBUS (C6). The open must refuse
/// the log with `Error::Corruption` and leave the disk usage as it was.
fn strict_open_of_damaged_segment_on_small_tmpfs(mnt: &Path) {
    let dir = mnt.join("log");
    // Every sync writes the checkpoint, and the open scans the whole data
    // (as `fissionlog verify` and `recover` do).
    let opts = || LogOptions {
        checkpoint_interval: std::time::Duration::ZERO,
        full_scan: true,
        ..quiet()
    };
    let log = Log::open(&dir, opts()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: 64 << 20,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    for i in 0..10 {
        assert_eq!(append(&log, i, 1000).unwrap(), i);
    }
    log.sync().unwrap();
    log.sync().unwrap();
    let seg = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .dir()
        .join(format!("{:020}.seg", 0));
    log.abandon();
    // Flip one byte of the last record's value: no valid batch follows,
    // so the search for one runs to the end of the file.
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[64 + 9 * 1058 + 500] ^= 0xff;
    std::fs::write(&seg, &bytes[..8192]).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    let before = disk_usage(&dir);
    let opened = Log::open(&dir, opts());
    let after = disk_usage(&dir);
    match opened {
        Err(Error::Corruption { .. }) => {}
        Err(e) => panic!("expected Error::Corruption, got {e}"),
        Ok(_) => panic!("a strict open accepted a segment damaged in its synced part"),
    }
    assert!(
        after <= before + (1 << 20),
        "the open grew disk usage from {before} to {after} bytes"
    );
}

#[test]
fn strict_open_of_damaged_sparse_segment_is_an_error_not_sigbus() {
    in_child_on_tmpfs(
        "strict_open_of_damaged_sparse_segment_is_an_error_not_sigbus",
        16 << 20,
        strict_open_of_damaged_segment_on_small_tmpfs,
    );
}

// ---- Readers and retention removal (C4, C8) ----

/// Appends `n` records keyed `key-0..8` round-robin, valued `tag:i`;
/// `old` ones carry an ancient timestamp (retention expires them).
fn put_keyed(topic: &fissionlog::Topic, tag: &str, n: u32, old: bool) -> Vec<String> {
    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
        .map(|i| {
            (
                format!("key-{}", i % 8).into_bytes(),
                format!("{tag}:{i}:{}", "x".repeat(60)).into_bytes(),
            )
        })
        .collect();
    let recs: Vec<NewRecord<'_>> = items
        .iter()
        .map(|(k, v)| NewRecord {
            key: Some(k),
            value: v,
            timestamp: old.then_some(OLD_TS),
        })
        .collect();
    for chunk in recs.chunks(20) {
        topic.append_batch(chunk).unwrap();
    }
    items
        .into_iter()
        .map(|(_, v)| String::from_utf8(v).unwrap())
        .collect()
}

/// Polls until the reader is idle; returns the values handed out.
fn drain_values(r: &mut fissionlog::Reader) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let got = r.poll(1000).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend(
            got.iter()
                .map(|r| String::from_utf8(r.value.clone()).unwrap()),
        );
    }
}

/// A reader inside partition 0 (its position saved in a cut, and a live
/// reader too); partition 0 is split into 1 and 2, partition 1 into 3 and
/// 4. Partitions 0 and 1 hold only expired records, so retention removes
/// both. Partition 1's records were never read by either reader, and they
/// are gone: each reader must report a retained range of partition 1, not
/// skip its records silently into partitions 3 and 4 (C8).
#[test]
fn removal_of_a_parent_and_its_child_reports_both_losses() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path(), quiet()).unwrap();
    let topic = log.create_topic("t", common::retention::config()).unwrap();
    put_keyed(&topic, "p0", 100, true);
    let mut live = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    assert_eq!(live.poll(10).unwrap().len(), 10);
    let cut = live.cut();
    assert_eq!(
        topic.split(0, fissionlog::SplitPlan::Even).unwrap(),
        vec![1, 2]
    );
    // Partition 1 gets old records, partition 2 live ones.
    let to_1: Vec<u32> = (0..8)
        .filter(|k| topic.route(format!("key-{k}").as_bytes()) == 1)
        .collect();
    assert!(!to_1.is_empty() && to_1.len() < 8);
    for i in 0..60u32 {
        let k = to_1[i as usize % to_1.len()];
        topic
            .append_batch(&[NewRecord {
                key: Some(format!("key-{k}").as_bytes()),
                value: format!("p1:{i}").as_bytes(),
                timestamp: Some(OLD_TS),
            }])
            .unwrap();
    }
    assert_eq!(
        topic.split(1, fissionlog::SplitPlan::Even).unwrap(),
        vec![3, 4]
    );
    let fresh = put_keyed(&topic, "new", 80, false);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    let held: Vec<u32> = topic.partitions().iter().map(|p| p.id).collect();
    assert_eq!(
        held,
        vec![2, 3, 4],
        "partitions 0 and 1 were emptied and removed"
    );
    let mut from_cut = topic.reader(fissionlog::StartAt::Cut(cut)).unwrap();
    for (name, r) in [
        ("live reader", &mut live),
        ("reader from the cut", &mut from_cut),
    ] {
        // Records of partition 0 the reader had read before the removal
        // may still come out (they were appended once, in order).
        let mut got: Vec<String> = drain_values(r)
            .into_iter()
            .filter(|v| !v.starts_with("p0:"))
            .collect();
        got.sort();
        let mut want = fresh.clone();
        want.sort();
        assert_eq!(got, want, "{name}: every live record once");
        let lost: Vec<u32> = r.retained().iter().map(|g| g.partition).collect();
        assert!(lost.contains(&0), "{name}: {:?}", r.retained());
        assert!(
            lost.contains(&1),
            "{name}: partition 1's 60 records were skipped without a report: {:?}",
            r.retained()
        );
    }
}

/// Milliseconds since the epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Partitions 0 and 1 are merged into 2. A reader drained 0 (it waits in
/// the cut for 1) and read 5 records of 1. Retention removes 0, later 1.
/// Only the 5.. range of 1 is lost to the reader: partition 0, which it
/// read to its seal, must not be reported lost, neither by the live
/// reader nor by readers resumed from cuts taken between the removals.
#[test]
fn removal_of_a_drained_merge_parent_is_not_reported_lost() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path(), quiet()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                ..common::retention::config()
            },
        )
        .unwrap();
    let key_of = |p: u32| {
        (0..)
            .map(|k| format!("key-{k}"))
            .find(|k| topic.route(k.as_bytes()) == p)
            .unwrap()
    };
    let (k0, k1) = (key_of(0), key_of(1));
    // Partition 1's records expire a moment after partition 0's.
    let soon = now_ms() - 3_600_000 + 1_000;
    for i in 0..20 {
        for (k, ts) in [(&k0, OLD_TS), (&k1, soon)] {
            topic
                .append_batch(&[NewRecord {
                    key: Some(k.as_bytes()),
                    value: format!("{k}:{i}").as_bytes(),
                    timestamp: Some(ts),
                }])
                .unwrap();
        }
    }
    assert_eq!(topic.merge(0, 1).unwrap(), 2);
    put_keyed(&topic, "new", 10, false);
    log.sync().unwrap();
    let mut r = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    let first = r.poll(20).unwrap();
    assert!(first.iter().all(|x| x.partition == 0), "partition 0 first");
    assert_eq!(r.poll(5).unwrap().len(), 5);
    let cut = r.cut();
    assert_eq!(cut.positions.get(&1), Some(&5), "{cut:?}");
    assert!(cut.drained.contains(&0), "{cut:?}");
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err(), "partition 0 was removed");
    assert!(topic.partition(1).is_ok(), "partition 1 not yet");
    let mut resumed = topic.reader(fissionlog::StartAt::Cut(cut)).unwrap();
    assert!(resumed.poll(0).unwrap().is_empty());
    let between = resumed.cut();
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(1).is_err(), "partition 1 was removed");
    let mut from_between = topic.reader(fissionlog::StartAt::Cut(between)).unwrap();
    for (name, r) in [
        ("resumed reader", &mut resumed),
        ("reader from a cut between the removals", &mut from_between),
    ] {
        let got = drain_values(r);
        assert_eq!(got.len(), 10, "{name}: the merge child's records");
        assert_eq!(
            r.retained(),
            &[fissionlog::RetainedRange {
                partition: 1,
                start: 5,
                end: 20,
            }],
            "{name}"
        );
    }
}

/// Splits partition `p` evenly and appends `n` records to each child
/// (old or live); returns the children.
fn split_and_fill(topic: &fissionlog::Topic, p: u32, n: u32, old: bool) -> Vec<u32> {
    let kids = topic.split(p, fissionlog::SplitPlan::Even).unwrap();
    for &c in &kids {
        common::retention::fill(topic, c, n, old);
    }
    kids
}

/// A reader inside partition 0; below it a whole generation (partition 1
/// and both its children) is emptied and removed along with 0. Nothing
/// left in the topology names partition 1 (its children are gone too), yet
/// its records are reported (C8): the manifest keeps every removed
/// partition with its parents and seal. Each loss is reported once, the
/// same after a reopen, and a reader starting after the removals reports
/// none.
#[test]
fn removal_of_a_whole_generation_reports_every_lost_partition() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path(), quiet()).unwrap();
    let topic = log.create_topic("t", common::retention::config()).unwrap();
    put_keyed(&topic, "p0", 40, true);
    let mut r = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    assert_eq!(r.poll(10).unwrap().len(), 10);
    let cut = r.cut();
    let g1 = split_and_fill(&topic, 0, 10, true);
    // The left child holds old records and is split again, twice over;
    // the right one holds live records.
    let g2 = split_and_fill(&topic, g1[0], 10, true);
    split_and_fill(&topic, g2[0], 5, false);
    split_and_fill(&topic, g2[1], 5, false);
    put_keyed(&topic, "new", 8, false);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    for p in [0, g1[0], g2[0], g2[1]] {
        assert!(topic.partition(p).is_err(), "partition {p} was removed");
    }
    let report = |topic: &fissionlog::Topic| {
        let mut r = topic.reader(fissionlog::StartAt::Cut(cut.clone())).unwrap();
        drain_values(&mut r);
        let mut lost: Vec<(u32, u64, u64)> = r
            .retained()
            .iter()
            .map(|g| (g.partition, g.start, g.end))
            .collect();
        lost.sort_unstable();
        lost
    };
    let lost = report(&topic);
    let ids: Vec<u32> = lost.iter().map(|l| l.0).collect();
    let mut want = vec![0, g1[0], g2[0], g2[1]];
    want.sort_unstable();
    assert_eq!(ids, want, "every removed partition once: {lost:?}");
    assert_eq!(
        lost[0],
        (0, 10, 40),
        "partition 0 from the reader's position"
    );
    for l in &lost[1..] {
        assert_eq!((l.1, l.2), (0, 10), "partition {} whole: {lost:?}", l.0);
    }
    let mut fresh = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    drain_values(&mut fresh);
    assert!(fresh.retained().is_empty(), "{:?}", fresh.retained());
    drop(topic);
    log.close().unwrap();
    let log = Log::open(root.path(), quiet()).unwrap();
    assert_eq!(report(&log.topic("t").unwrap()), lost, "after a reopen");
}

// ---- Single-target sync rounds (C1) ----

/// One partition of a `SyncPolicy::Always` topic: each append's sync round
/// has one target, synced with a direct fdatasync. When that fdatasync
/// fails, the append (small or a large `pwrite` batch) is not
/// acknowledged, the record never becomes visible to durable reads, later
/// appends and syncs report the failure, and no later round claims it.
#[test]
fn failed_single_target_fdatasync_is_never_reported_durable() {
    let _serial = serial();
    for len in [100, BIG] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        // Fails, after it ran, the first fsync of a segment of `t0/p0` once
        // armed (EIO: the kernel may have dropped the pages).
        let hook = std::sync::Arc::new(
            common::faults::Fail::new(fissionlog::IoOp::SyncSegment, libc::EIO)
                .in_path("t0/p0")
                .after_the_call()
                .once()
                .disarmed(),
        );
        let log = Log::open_with_hook(&dir, quiet(), hook.clone()).unwrap();
        let t = log
            .create_topic(
                "t",
                TopicConfig {
                    partitions: 1,
                    segment_bytes: SEG_4M,
                    sync: SyncPolicy::Always,
                    ..TopicConfig::default()
                },
            )
            .unwrap();
        for i in 0..3 {
            assert_eq!(append(&log, i, len).unwrap(), i);
        }
        let p = t.partition(0).unwrap();
        assert_eq!(p.durable_end_offset(), 3);
        hook.arm();
        let err = append(&log, 3, len);
        assert!(hook.fired(), "the segment fsync ran");
        assert!(
            err.is_err(),
            "len {len}: an append whose sync failed was acknowledged"
        );
        assert_eq!(p.durable_end_offset(), 3, "len {len}");
        assert!(append(&log, 4, len).is_err(), "len {len}: appends go on");
        assert!(
            log.sync().is_err(),
            "len {len}: a later sync claims the record"
        );
        assert_eq!(p.durable_end_offset(), 3, "len {len}");
        let mut r = t.reader(fissionlog::StartAt::Earliest).unwrap();
        let mut seen = 0;
        loop {
            let got = r.poll(100).unwrap();
            if got.is_empty() {
                break;
            }
            seen += got.len();
        }
        assert_eq!(seen, 3, "len {len}: durable reads see only synced records");
        log.abandon();
    }
}

// ---- Full disk with mixed batch sizes, rolls and unclean opens (C1, C6) ----

/// Value length of record `i` in the mixed scenario: small stores into the
/// mapping, and batches past 16 KiB written with `pwrite`.
fn mixed_len(i: u64) -> usize {
    match i % 7 {
        0 => 40 << 10,
        3 => 17 << 10,
        5 => 200 << 10,
        _ => 100 + (i as usize % 5) * 300,
    }
}

/// Appends mixed records from `from` until the disk is full; returns the
/// next offset (every record below it acknowledged). The error must be
/// `Error::NoSpace`.
fn append_until_full(log: &Log, from: u64) -> u64 {
    let mut next = from;
    loop {
        match append(log, next, mixed_len(next)) {
            Ok(off) => {
                assert_eq!(off, next, "offsets are dense and never reused");
                next += 1;
            }
            Err(Error::NoSpace { .. }) => return next,
            Err(e) => panic!("record {next}: {e}"),
        }
        assert!(next < 100_000, "the disk never filled up");
    }
}

/// Segments of 1 MiB (rolls every few records), mixed small and large
/// batches, filled to ENOSPC (a large batch fails inside its `pwrite`
/// or its allocation), then: reads, an unclean open on the full disk,
/// appends refused there, space freed, appends again, a clean reopen.
/// Never a SIGBUS; every acknowledged record is there, once, in order.
fn mixed_full_disk(mnt: &Path) {
    let dir = mnt.join("log");
    let reserve = mnt.join("reserve");
    std::fs::write(&reserve, vec![1u8; 3 << 20]).unwrap();
    let log = Log::open(&dir, quiet()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: 1 << 20,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    let acked = append_until_full(&log, 0);
    assert!(acked > 20, "{acked} records");
    assert_eq!(read_all(&log, mixed_len), acked);
    log.sync().unwrap();
    log.abandon();
    // Unclean open on the full disk.
    let log = Log::open(&dir, quiet()).unwrap();
    assert_eq!(read_all(&log, mixed_len), acked);
    let acked = append_until_full(&log, acked);
    assert_eq!(read_all(&log, mixed_len), acked);
    log.sync().unwrap();
    log.abandon();
    std::fs::remove_file(&reserve).unwrap();
    let log = Log::open(&dir, quiet()).unwrap();
    assert_eq!(read_all(&log, mixed_len), acked);
    let mut next = acked;
    for _ in 0..10 {
        assert_eq!(append(&log, next, mixed_len(next)).unwrap(), next);
        next += 1;
    }
    log.close().unwrap();
    let log = Log::open(&dir, quiet()).unwrap();
    assert!(log.recovery_report().clean_shutdown);
    assert_eq!(read_all(&log, mixed_len), next);
    let used = disk_usage(&dir);
    let data: u64 = (0..next).map(|i| mixed_len(i) as u64 + 100).sum();
    assert!(
        used <= data + data / 50 + (5 << 20),
        "{used} bytes on disk for about {data} bytes of data"
    );
    log.close().unwrap();
}

#[test]
fn mixed_batches_to_a_full_disk_and_back() {
    in_child_on_tmpfs(
        "mixed_batches_to_a_full_disk_and_back",
        24 << 20,
        mixed_full_disk,
    );
}

// ---- Tail-following readers and large batches (C2, C4) ----

/// A reader follows the tail while a writer appends small records and
/// large `pwrite` batches into 1 MiB segments (rolls, trims), and splits
/// the partition halfway: every record comes out once, byte for byte, in
/// per-key order, and the reader ends on the active partitions.
#[test]
fn tail_reader_follows_mixed_batches_across_rolls_and_a_split() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path(), quiet()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 1 << 20,
                sync: SyncPolicy::Never,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    const N: u64 = 300;
    let mut reader = topic.reader(fissionlog::StartAt::Latest).unwrap();
    let writer = {
        let topic = topic.clone();
        std::thread::spawn(move || {
            for i in 0..N {
                let key = format!("k{}", i % 4);
                let recs: Vec<Vec<u8>> = (0..1 + i % 3)
                    .map(|j| sized_value(i * 10 + j, mixed_len(i) / 2))
                    .collect();
                let batch: Vec<NewRecord<'_>> = recs
                    .iter()
                    .map(|v| NewRecord {
                        key: Some(key.as_bytes()),
                        value: v,
                        timestamp: Some(i as i64),
                    })
                    .collect();
                topic.append_batch(&batch).unwrap();
                if i == N / 2 {
                    topic.split(0, fissionlog::SplitPlan::Even).unwrap();
                }
            }
        })
    };
    let want: u64 = (0..N).map(|i| 1 + i % 3).sum();
    let mut got = 0u64;
    let mut last: std::collections::BTreeMap<String, (i64, u64)> = Default::default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while got < want {
        assert!(
            std::time::Instant::now() < deadline,
            "stalled at {got}/{want}"
        );
        for r in reader
            .poll_wait(64, std::time::Duration::from_millis(200))
            .unwrap()
        {
            let key = String::from_utf8(r.key.clone().unwrap()).unwrap();
            let i = r.timestamp as u64;
            let j = (0..3)
                .find(|&j| r.value == sized_value(i * 10 + j, mixed_len(i) / 2))
                .unwrap_or_else(|| panic!("record {i} of {key}: bytes differ"));
            let at = (r.timestamp, j);
            if let Some(prev) = last.get(&key) {
                assert!(*prev < at, "{key}: {at:?} after {prev:?}");
            }
            last.insert(key, at);
            got += 1;
        }
    }
    writer.join().unwrap();
    assert_eq!(got, want);
    assert!(reader.poll(10).unwrap().is_empty(), "no duplicates");
    let mut open = reader.open_partitions();
    open.sort();
    let mut active = topic.active_partitions();
    active.sort();
    assert_eq!(open, active);
}

/// Cuts taken at every poll of a reader that hands out records a few at a
/// time (the rest waiting in its buffer), across a split and a merge of a
/// `SyncPolicy::Always` topic, then a kill and a reopen: a reader resumed
/// from each cut gets exactly the records after it, once each, in per-key
/// order, and ends on the active partitions.
#[test]
fn cuts_taken_mid_buffer_resume_exactly_once_after_a_kill() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = Log::open(&dir, quiet()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                segment_bytes: 64 << 10,
                sync: SyncPolicy::Always,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let put = |n: u32, tag: &str| {
        let recs: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
            .map(|i| {
                let len = if i % 9 == 0 { 20 << 10 } else { 50 };
                let mut v = format!("{tag}:{i}:").into_bytes();
                v.resize(len, b'.');
                (format!("key-{}", i % 6).into_bytes(), v)
            })
            .collect();
        let batch: Vec<NewRecord<'_>> = recs
            .iter()
            .map(|(k, v)| NewRecord {
                key: Some(k),
                value: v,
                timestamp: None,
            })
            .collect();
        for c in batch.chunks(7) {
            topic.append_batch(c).unwrap();
        }
    };
    let mut all: Vec<(String, String)> = Vec::new();
    let mut cuts = Vec::new();
    let mut r = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    let mut take = |r: &mut fissionlog::Reader, all: &mut Vec<(String, String)>| loop {
        cuts.push((r.cut(), all.len()));
        let got = r.poll(3).unwrap();
        if got.is_empty() {
            return;
        }
        for x in got {
            let v = String::from_utf8_lossy(&x.value)
                .trim_end_matches('.')
                .to_string();
            all.push((String::from_utf8(x.key.unwrap()).unwrap(), v));
        }
    };
    put(60, "a");
    take(&mut r, &mut all);
    put(30, "b");
    topic.split(0, fissionlog::SplitPlan::Even).unwrap();
    put(60, "c");
    take(&mut r, &mut all);
    // Merge two active partitions with adjacent ranges.
    let mut parts: Vec<_> = topic
        .partitions()
        .into_iter()
        .filter(|p| p.sealed_at.is_none())
        .collect();
    parts.sort_by_key(|p| p.start);
    topic.merge(parts[0].id, parts[1].id).unwrap();
    put(60, "d");
    take(&mut r, &mut all);
    assert_eq!(all.len(), 210, "the live reader got every record");
    log.abandon();
    let log = Log::open(&dir, quiet()).unwrap();
    let topic = log.topic("t").unwrap();
    for (i, (cut, at)) in cuts.iter().enumerate() {
        let mut r = topic.reader(fissionlog::StartAt::Cut(cut.clone())).unwrap();
        let mut rest = Vec::new();
        loop {
            let got = r.poll(1000).unwrap();
            if got.is_empty() {
                break;
            }
            for x in got {
                let v = String::from_utf8_lossy(&x.value)
                    .trim_end_matches('.')
                    .to_string();
                rest.push((String::from_utf8(x.key.unwrap()).unwrap(), v));
            }
        }
        // Per key, the records after the cut are exactly what the live
        // reader handed out after it.
        let per_key = |v: &[(String, String)]| {
            let mut m: std::collections::BTreeMap<String, Vec<String>> = Default::default();
            for (k, x) in v {
                m.entry(k.clone()).or_default().push(x.clone());
            }
            m
        };
        assert_eq!(per_key(&rest), per_key(&all[*at..]), "cut {i}: {cut:?}");
        assert_eq!(r.retained(), &[], "cut {i}");
        let mut open = r.open_partitions();
        open.sort();
        let mut active = topic.active_partitions();
        active.sort();
        assert_eq!(open, active, "cut {i}");
    }
    log.close().unwrap();
}

/// Partitions 0 and 1 are merged into 2; retention removes 0 first. A
/// reader from Earliest created then starts at 1 (what is held), and a
/// cut it takes names only 1. When 1 is removed too, the reader (and one
/// resumed from its cut) reports 1 from its position, but not 0: 0 was
/// gone before the reader started, not lost to it.
#[test]
fn partition_removed_before_an_earliest_reader_started_is_not_reported() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path(), quiet()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                ..common::retention::config()
            },
        )
        .unwrap();
    let key_of = |p: u32| {
        (0..)
            .map(|k| format!("key-{k}"))
            .find(|k| topic.route(k.as_bytes()) == p)
            .unwrap()
    };
    let (k0, k1) = (key_of(0), key_of(1));
    let soon = now_ms() - 3_600_000 + 1_000;
    for i in 0..20 {
        for (k, ts) in [(&k0, OLD_TS), (&k1, soon)] {
            topic
                .append_batch(&[NewRecord {
                    key: Some(k.as_bytes()),
                    value: format!("{k}:{i}").as_bytes(),
                    timestamp: Some(ts),
                }])
                .unwrap();
        }
    }
    assert_eq!(topic.merge(0, 1).unwrap(), 2);
    put_keyed(&topic, "new", 10, false);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err(), "partition 0 was removed");
    let mut r = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    assert_eq!(r.open_partitions(), vec![1]);
    assert_eq!(r.poll(5).unwrap().len(), 5);
    let cut = r.cut();
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(1).is_err(), "partition 1 was removed");
    let mut resumed = topic.reader(fissionlog::StartAt::Cut(cut)).unwrap();
    // The live reader had read all of partition 1 (what it had not handed
    // out yet comes out now): no loss at all.
    let got = drain_values(&mut r);
    assert_eq!(got.iter().filter(|v| v.starts_with("new:")).count(), 10);
    assert_eq!(r.retained(), &[], "reader");
    let got = drain_values(&mut resumed);
    assert_eq!(got.len(), 10, "the merge child's records");
    assert_eq!(
        resumed.retained(),
        &[fissionlog::RetainedRange {
            partition: 1,
            start: 5,
            end: 20,
        }],
        "reader from the cut"
    );
}

// ---- Segment files of older layouts (C6, C7) ----

/// Allocates `[from, from + len)` of the file at `path` (extending it).
fn fallocate(path: &Path, from: u64, len: u64) {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    // SAFETY: plain syscall on an fd we own; no memory is passed.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, from as libc::off_t, len as libc::off_t) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

/// The active segment of a closed log rewritten as older versions left it:
/// a file exactly as long as what was allocated (data plus a chunk), or a
/// whole segment preallocated. Each opens (cleanly and after a kill),
/// takes small and large appends up to a full disk with `Error::NoSpace`,
/// keeps every acknowledged record, and a second open changes nothing.
fn older_layouts(mnt: &Path) {
    for (n, layout) in ["chunked", "preallocated"].into_iter().enumerate() {
        let dir = mnt.join(format!("log{n}"));
        let log = create(&dir);
        let mut next = 0;
        while next < 30 {
            assert_eq!(append(&log, next, mixed_len(next)).unwrap(), next);
            next += 1;
        }
        let seg = {
            let p = log.topic("t").unwrap().partition(0).unwrap();
            let info = p.segment_infos();
            let last = info.last().unwrap();
            (last.path.clone(), 64 + last.data_bytes)
        };
        log.close().unwrap();
        let (path, data_end) = seg;
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        match layout {
            "chunked" => {
                let len = data_end.div_ceil(4096) * 4096 + (64 << 10);
                f.set_len(len).unwrap();
                fallocate(&path, 0, len);
            }
            _ => fallocate(&path, 0, SEG_4M),
        }
        drop(f);
        let log = Log::open(&dir, quiet()).unwrap();
        assert_eq!(read_all(&log, mixed_len), next, "{layout}");
        for _ in 0..5 {
            assert_eq!(append(&log, next, mixed_len(next)).unwrap(), next);
            next += 1;
        }
        log.abandon();
        let log = Log::open(&dir, quiet()).unwrap();
        assert_eq!(read_all(&log, mixed_len), next, "{layout}");
        log.close().unwrap();
    }
    // Both logs to a full disk. A close there may fail (with
    // `Error::NoSpace`: it writes index files); the next open recovers.
    let reserve = mnt.join("reserve");
    std::fs::write(&reserve, vec![1u8; 2 << 20]).unwrap();
    let mut ends = Vec::new();
    for n in 0..2 {
        let dir = mnt.join(format!("log{n}"));
        let log = Log::open(&dir, quiet()).unwrap();
        let end = read_all(&log, mixed_len);
        let end = append_until_full(&log, end);
        assert_eq!(read_all(&log, mixed_len), end);
        match log.close() {
            Ok(()) | Err(Error::NoSpace { .. }) => {}
            Err(e) => panic!("close on a full disk: {e}"),
        }
        ends.push(end);
    }
    std::fs::remove_file(&reserve).unwrap();
    for (n, end) in ends.into_iter().enumerate() {
        let dir = mnt.join(format!("log{n}"));
        let log = Log::open(&dir, quiet()).unwrap();
        assert_eq!(read_all(&log, mixed_len), end);
        log.close().unwrap();
        let before = std::fs::read_dir(dir.join("topics/t0/p0"))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), std::fs::read(e.path()).unwrap())
            })
            .collect::<std::collections::BTreeMap<_, _>>();
        let log = Log::open(&dir, quiet()).unwrap();
        assert_eq!(read_all(&log, mixed_len), end);
        log.close().unwrap();
        let after = std::fs::read_dir(dir.join("topics/t0/p0"))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), std::fs::read(e.path()).unwrap())
            })
            .collect::<std::collections::BTreeMap<_, _>>();
        let names = |m: &std::collections::BTreeMap<std::ffi::OsString, Vec<u8>>| {
            m.keys().cloned().collect::<Vec<_>>()
        };
        assert_eq!(
            names(&before),
            names(&after),
            "log{n}: a second open changed the files"
        );
        for (k, v) in &before {
            let w = &after[k];
            let common = v.len().min(w.len());
            assert!(
                v[..common] == w[..common]
                    && v[common..].iter().chain(&w[common..]).all(|&b| b == 0),
                "log{n}: a second open changed {k:?}"
            );
        }
    }
}

#[test]
fn segment_files_of_older_layouts_open_and_fill_the_disk() {
    in_child_on_tmpfs(
        "segment_files_of_older_layouts_open_and_fill_the_disk",
        32 << 20,
        older_layouts,
    );
}

// ---- SIGKILL around large batches (C1, C2, C3) ----

/// Value of the record at offset `i` in the kill scenario: every third
/// one a batch past 16 KiB (written with `pwrite`), the rest small.
fn kill_value(i: u64) -> Vec<u8> {
    let len = if i.is_multiple_of(3) {
        (16 << 10) + (i as usize * 977) % (48 << 10)
    } else {
        20 + (i as usize * 31) % 300
    };
    sized_value(i, len)
}

fn kill_config() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 256 << 10,
        sync: SyncPolicy::Always,
        ..TopicConfig::default()
    }
}

/// Child: appends `kill_value(offset)` records forever and prints each
/// acknowledged offset.
fn kill_child_scenario(dir: &Path) {
    use std::io::Write;
    let log = Log::open(dir, quiet()).unwrap();
    let t = log.topic_or_create("t", kill_config()).unwrap();
    let mut next = t.partition(0).unwrap().end_offset();
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY").unwrap();
    loop {
        let key = format!("k{}", next % 4);
        let at = t
            .append_to(
                0,
                &[NewRecord {
                    key: Some(key.as_bytes()),
                    value: &kill_value(next),
                    timestamp: Some(next as i64),
                }],
            )
            .unwrap();
        assert_eq!(at, next);
        writeln!(out, "ACK {at}").unwrap();
        out.flush().unwrap();
        next += 1;
    }
}

/// A child process appending small and large batches is SIGKILLed at
/// seeded moments (several rounds on one log): after each, every
/// acknowledged record is there byte for byte, every record present is
/// one that was appended at its offset (no phantom), and offsets go on
/// from the end (no reuse).
#[test]
fn sigkill_around_large_batches_keeps_every_acknowledged_record() {
    const NAME: &str = "sigkill_around_large_batches_keeps_every_acknowledged_record";
    if let Some(dir) = child_dir(NAME) {
        kill_child_scenario(&dir);
        return;
    }
    use std::io::{BufRead, BufReader};
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let mut acked_end = 0u64;
    for round in 0..4u64 {
        let mut child = crate::common::log::rerun_command(module_path!(), NAME)
            .env(CHILD_ENV, NAME)
            .env(CHILD_DIR_ENV, &dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let kill_after = 5 + (round * 37 + 11) % 40;
        let mut acks = 0;
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(off) = line.strip_prefix("ACK ") {
                let off: u64 = off.parse().unwrap();
                assert!(off >= acked_end, "round {round}: offset {off} reused");
                acked_end = off + 1;
                acks += 1;
                if acks >= kill_after {
                    break;
                }
            }
        }
        assert_eq!(acks, kill_after, "round {round}: the child stopped early");
        child.kill().unwrap();
        child.wait().unwrap();
        let log = Log::open(&dir, quiet()).unwrap();
        let p = log.topic("t").unwrap().partition(0).unwrap();
        let end = p.end_offset();
        assert!(
            end >= acked_end,
            "round {round}: end {end} < acknowledged {acked_end}"
        );
        let mut next = p.start_offset();
        while next < end {
            let b = p.read(next, 1 << 20).unwrap();
            for r in b.iter() {
                assert_eq!(r.offset, next, "round {round}");
                assert_eq!(
                    r.value,
                    kill_value(next).as_slice(),
                    "round {round}: record {next}"
                );
                next += 1;
            }
        }
        acked_end = end;
        log.close().unwrap();
    }
}

// ---- Idempotent unclean opens (C7) ----

/// Every file under `dir` with its bytes (trailing zeros dropped: a
/// sparse length is not a change of content).
fn contents(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n != "LOCK" && n != "lock") {
                let mut b = std::fs::read(&p).unwrap();
                while b.last() == Some(&0) {
                    b.pop();
                }
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), b);
            }
        }
    }
    out
}

/// Mixed small and large batches, some synced, then a kill; the next open
/// repairs what it must. Killing that log without a write and opening
/// again changes no byte of the segments and reports no repair.
#[test]
fn second_unclean_open_after_large_batches_changes_nothing() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = create(&dir);
    for i in 0..40 {
        assert_eq!(append(&log, i, mixed_len(i)).unwrap(), i);
        if i == 25 {
            log.sync().unwrap();
        }
    }
    log.abandon();
    let log = Log::open(&dir, quiet()).unwrap();
    assert_eq!(read_all(&log, mixed_len), 40);
    log.abandon();
    let segs = |m: std::collections::BTreeMap<PathBuf, Vec<u8>>| {
        m.into_iter()
            .filter(|(p, _)| p.extension().is_some_and(|e| e == "seg"))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let before = segs(contents(&dir));
    let log = Log::open(&dir, quiet()).unwrap();
    let report = log.recovery_report().clone();
    assert_eq!(read_all(&log, mixed_len), 40);
    log.abandon();
    let after = segs(contents(&dir));
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    for (p, b) in &before {
        assert!(
            b == &after[p],
            "the second unclean open changed {}",
            p.display()
        );
    }
    assert!(!report.changed_anything(), "{report:?}");
}

// ---- Power loss around large batches (C1, C2, C3, C7) ----

/// Small and large batches with syncs between, then power-loss images
/// (seeded, from the per-file model): every record synced is there byte
/// for byte, every record present is the one appended at its offset, and
/// a second open of the recovered image changes no segment byte.
#[test]
fn power_loss_around_large_batches() {
    let _serial = serial();
    use common::crash::CrashOptions;
    use common::model_hook::ModelHook;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir(&dir).unwrap();
    let hook = ModelHook::new(&dir, None);
    let opts = || LogOptions {
        checkpoint_interval: std::time::Duration::ZERO,
        ..quiet()
    };
    let log = Log::open_with_hook(&dir, opts(), hook.clone()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: 256 << 10,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    let mut synced = 0;
    for i in 0..60 {
        assert_eq!(append(&log, i, mixed_len(i)).unwrap(), i);
        if i == 20 || i == 45 {
            log.sync().unwrap();
            synced = i + 1;
        }
    }
    for seed in 0..32u64 {
        let crash = CrashOptions {
            torn_any_byte: seed % 2 == 1,
            ..CrashOptions::default()
        };
        let (img, trace) = hook.crash_image(seed, &crash);
        let at = root.path().join(format!("img{seed}"));
        img.write_to(&at).unwrap();
        let ctx = || format!("seed {seed}:\n{}", trace.join("\n"));
        let log = Log::open(&at, opts()).unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
        let end = read_all(&log, mixed_len);
        assert!(
            end >= synced,
            "synced records lost: end {end} < {synced}\n{}",
            ctx()
        );
        log.abandon();
        let segs = |m: std::collections::BTreeMap<PathBuf, Vec<u8>>| {
            m.into_iter()
                .filter(|(p, _)| p.extension().is_some_and(|e| e == "seg"))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let before = segs(contents(&at));
        let log = Log::open(&at, opts()).unwrap();
        let report = log.recovery_report().clone();
        assert_eq!(read_all(&log, mixed_len), end, "{}", ctx());
        log.abandon();
        let after = segs(contents(&at));
        assert!(before == after, "a second open changed segments\n{}", ctx());
        assert!(!report.changed_anything(), "{report:?}\n{}", ctx());
    }
    log.close().unwrap();
}

// ---- Random topology changes, retention removal and reopens under readers (C4, C8) ----

/// One random run: appends (records that retention will expire, and live
/// ones), splits, merges, retention (which removes emptied sealed
/// partitions), reopens, a live reader polling random amounts and cuts
/// taken at random moments. At the end, the live reader and a reader
/// resumed from every cut: no record twice, per-key order, ends on the
/// active partitions; a cut reader gets every live record the live reader
/// had not handed out when the cut was taken, and none it had.
fn random_reader_run(seed: u64) {
    use common::crash::SplitMix64;
    use std::collections::{BTreeMap, HashSet};
    let mut rng = SplitMix64::new(seed);
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let ropts = || LogOptions {
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    };
    let mut log = Log::open(&dir, ropts()).unwrap();
    let mut topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                segment_bytes: 4096,
                retention_age: Some(std::time::Duration::from_secs(3600)),
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let mut seq: BTreeMap<u32, u64> = BTreeMap::new();
    let mut live_records: HashSet<(u32, u64)> = HashSet::new();
    // Where each record went: (partition, offset).
    let mut placed: BTreeMap<(u32, u64), (u32, u64)> = BTreeMap::new();
    let mut reader = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    let mut handed: Vec<(u32, u64)> = Vec::new();
    // With each cut, what the live reader had handed out and what it had
    // reported lost (across reopens) when the cut was taken.
    let mut cuts: Vec<(fissionlog::Cut, usize, Vec<fissionlog::RetainedRange>)> = Vec::new();
    let mut lost_live: Vec<fissionlog::RetainedRange> = Vec::new();
    let parse = |r: &fissionlog::OwnedRecord| -> (u32, u64) {
        let s = std::str::from_utf8(&r.value).unwrap();
        let mut it = s.split(':');
        (
            it.next().unwrap().parse().unwrap(),
            it.next().unwrap().parse().unwrap(),
        )
    };
    for step in 0..60 {
        match rng.below(10) {
            0..=3 => {
                let old = rng.coin();
                let n = 1 + rng.below(30) as u32;
                let mut ks = Vec::new();
                let items: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
                    .map(|_| {
                        let k = rng.below(6) as u32;
                        let s = seq.entry(k).or_insert(0);
                        *s += 1;
                        if !old {
                            live_records.insert((k, *s));
                        }
                        ks.push((k, *s));
                        (
                            format!("key-{k}").into_bytes(),
                            format!("{k}:{s}:{}", "x".repeat(40)).into_bytes(),
                        )
                    })
                    .collect();
                let recs: Vec<NewRecord<'_>> = items
                    .iter()
                    .map(|(k, v)| NewRecord {
                        key: Some(k),
                        value: v,
                        timestamp: old.then_some(OLD_TS),
                    })
                    .collect();
                let mut at = Vec::new();
                for c in recs.chunks(10) {
                    at.extend(topic.append_batch(c).unwrap());
                }
                for (rec, a) in ks.into_iter().zip(at) {
                    placed.insert(rec, (a.partition, a.offset));
                }
            }
            4 => {
                let active = topic.active_partitions();
                let p = active[rng.below(active.len() as u64) as usize];
                let _ = topic.split(p, fissionlog::SplitPlan::Even);
            }
            5 => {
                let mut parts: Vec<_> = topic
                    .partitions()
                    .into_iter()
                    .filter(|p| p.sealed_at.is_none())
                    .collect();
                parts.sort_by_key(|p| p.start);
                if parts.len() >= 2 {
                    let i = rng.below(parts.len() as u64 - 1) as usize;
                    let _ = topic.merge(parts[i].id, parts[i + 1].id);
                }
            }
            6 => {
                log.sync().unwrap();
                log.enforce_retention().unwrap();
            }
            7 => {
                let mut lost = lost_live.clone();
                lost.extend_from_slice(reader.retained());
                cuts.push((reader.cut(), handed.len(), lost));
            }
            8 if step % 3 == 0 => {
                let cut = reader.cut();
                lost_live.extend_from_slice(reader.retained());
                log.close().unwrap();
                log = Log::open(&dir, ropts()).unwrap();
                topic = log.topic("t").unwrap();
                reader = topic.reader(fissionlog::StartAt::Cut(cut)).unwrap();
            }
            _ => {
                let n = 1 + rng.below(40) as usize;
                for r in reader.poll(n).unwrap() {
                    handed.push(parse(&r));
                }
            }
        }
    }
    log.sync().unwrap();
    let check = |name: &str, got: &[(u32, u64)], r: &fissionlog::Reader| {
        let mut last: BTreeMap<u32, u64> = BTreeMap::new();
        for &(k, s) in got {
            if let Some(&l) = last.get(&k) {
                assert!(s > l, "seed {seed}, {name}: key {k}: {s} after {l}");
            }
            last.insert(k, s);
        }
        let mut open = r.open_partitions();
        open.sort();
        let mut active = topic.active_partitions();
        active.sort();
        assert_eq!(open, active, "seed {seed}, {name}: stalled");
    };
    loop {
        let got = reader.poll(1000).unwrap();
        if got.is_empty() {
            break;
        }
        handed.extend(got.iter().map(parse));
    }
    check("live reader", &handed, &reader);
    for (i, (cut, at, lost)) in cuts.iter().enumerate() {
        let name = format!("cut {i}");
        let mut r = topic.reader(fissionlog::StartAt::Cut(cut.clone())).unwrap();
        let mut got = Vec::new();
        loop {
            let g = r.poll(1000).unwrap();
            if g.is_empty() {
                break;
            }
            got.extend(g.iter().map(parse));
        }
        check(&name, &got, &r);
        let before: HashSet<(u32, u64)> = handed[..*at].iter().copied().collect();
        let after: HashSet<(u32, u64)> = got.iter().copied().collect();
        assert!(
            before.is_disjoint(&after),
            "seed {seed}, {name}: re-delivered {:?}",
            before.intersection(&after).take(5).collect::<Vec<_>>()
        );
        for rec in &live_records {
            assert!(
                before.contains(rec) || after.contains(rec),
                "seed {seed}, {name}: live record {rec:?} skipped; retained {:?}",
                r.retained()
            );
        }
        // An expired record the cut reader did not get is reported lost,
        // unless nothing names its partition any more (the open gap of
        // `removal_of_a_whole_generation_reports_every_lost_partition`).
        let infos = topic.partitions();
        let named: HashSet<u32> = infos
            .iter()
            .flat_map(|p| {
                std::iter::once(p.id).chain(p.removed_parents.iter().map(|q| q.partition))
            })
            .chain(cut.positions.keys().copied())
            .chain(cut.drained.iter().copied())
            .collect();
        let covered = |g: &fissionlog::RetainedRange, p: u32, off: u64| {
            g.partition == p && g.start <= off && off < g.end
        };
        for (rec, &(p, off)) in &placed {
            if before.contains(rec)
                || after.contains(rec)
                || !named.contains(&p)
                || lost.iter().any(|g| covered(g, p, off))
            {
                continue;
            }
            assert!(
                r.retained().iter().any(|g| covered(g, p, off)),
                "seed {seed}, {name}: record {rec:?} at {p}/{off} skipped without a report; retained {:?}\ncut {cut:?}\npartitions {:?}",
                r.retained(),
                infos.iter().map(|p| (p.id, p.parents.clone(), p.removed_parents.clone(), p.sealed_at, p.start_offset, p.end_offset)).collect::<Vec<_>>()
            );
        }
    }
    log.close().unwrap();
}

#[test]
fn random_topology_changes_and_removals_under_readers() {
    let _serial = serial();
    // Keys route by a random per-topic hash key: every run differs.
    for seed in 0..30 {
        random_reader_run(seed);
    }
}

/// Appends `n` records to partition `p` (a key routed there), old or live.
fn put_to(topic: &fissionlog::Topic, p: u32, n: u32, old: bool) {
    let k = (0..)
        .map(|k| format!("key-{k}"))
        .find(|k| topic.route(k.as_bytes()) == p)
        .unwrap();
    for i in 0..n {
        topic
            .append_batch(&[NewRecord {
                key: Some(k.as_bytes()),
                value: format!("{p}:{i}").as_bytes(),
                timestamp: old.then_some(OLD_TS),
            }])
            .unwrap();
    }
}

/// Partition 0 splits into 1 and 2, 2 into 3 and 4, and 1 merges with 3
/// into 5. Retention removes 0 and 1 (old records). A reader resumed from
/// a cut taken at the start goes 0 → 2 → 3, 4 → 5; partition 1 is a
/// parent of 5 it never read, and its records are gone: the reader must
/// report them when it opens 5 (C8), not count 1 as drained.
#[test]
fn removed_merge_parent_never_read_is_reported_when_the_child_opens() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path(), quiet()).unwrap();
    let topic = log.create_topic("t", common::retention::config()).unwrap();
    let cut = topic.reader(fissionlog::StartAt::Earliest).unwrap().cut();
    assert_eq!(
        topic.split(0, fissionlog::SplitPlan::Even).unwrap(),
        vec![1, 2]
    );
    put_to(&topic, 1, 12, true);
    put_to(&topic, 2, 5, false);
    assert_eq!(
        topic.split(2, fissionlog::SplitPlan::Even).unwrap(),
        vec![3, 4]
    );
    assert_eq!(topic.merge(1, 3).unwrap(), 5);
    put_to(&topic, 5, 4, false);
    put_to(&topic, 4, 4, false);
    log.sync().unwrap();
    log.enforce_retention().unwrap();
    let ids: Vec<u32> = topic.partitions().iter().map(|p| p.id).collect();
    assert!(!ids.contains(&0) && !ids.contains(&1), "{ids:?}");
    let mut r = topic.reader(fissionlog::StartAt::Cut(cut)).unwrap();
    let got = drain_values(&mut r);
    assert_eq!(got.len(), 13, "{got:?}");
    assert_eq!(
        r.retained(),
        &[fissionlog::RetainedRange {
            partition: 1,
            start: 0,
            end: 12,
        }]
    );
}
