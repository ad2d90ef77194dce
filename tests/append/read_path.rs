//! The read path under rolls, retention, recovery and a closed `Log`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::common;
use common::log::quiet;

use fissionlog::{Error, Log, NewRecord, TopicConfig};

/// A reader following the tail while the writer rolls
/// segments never gets `Error::Hole` for live data. The partition's segment
/// list used to be snapshotted before its end offset was loaded, so a roll
/// in between made a just-appended offset look like a gap after the old
/// active segment.
#[test]
fn tail_reader_during_rolls_never_sees_a_hole() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 4096,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let p = t.partition(0).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let appends: u64 = std::env::var("FISSIONLOG_TAIL_APPENDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6_000);
    // More readers than cores: a reader preempted between its two loads
    // lets the writer roll in between, which is the window this test hunts.
    // They are reading before the first append, and appends go on past
    // `appends` until each reader has caught up with the writer
    // `TAIL_HITS` times, so every reader follows a moving tail however
    // late it was scheduled.
    const READERS: usize = 4;
    const TAIL_HITS: u64 = 100;
    let start = Arc::new(std::sync::Barrier::new(READERS + 1));
    let hits: Arc<[AtomicU64; READERS]> = Arc::default();
    let readers: Vec<_> = (0..READERS)
        .map(|me| {
            let (p, done, start, hits) = (p.clone(), done.clone(), start.clone(), hits.clone());
            std::thread::spawn(move || -> Result<u64, String> {
                start.wait();
                let mut next = 0u64;
                loop {
                    let finished = done.load(Ordering::Acquire);
                    match p.read(next, 64 * 1024) {
                        Ok(b) => {
                            for r in b.iter() {
                                if r.offset != next {
                                    return Err(format!("expected {next}, got {}", r.offset));
                                }
                                next += 1;
                            }
                        }
                        Err(Error::OffsetOutOfRange { .. }) if finished => return Ok(next),
                        Err(Error::OffsetOutOfRange { .. }) => {
                            hits[me].fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => return Err(format!("read at {next}: {e}")),
                    }
                }
            })
        })
        .collect();
    start.wait();
    let v = [7u8; 40];
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let caught_up = |r: usize| hits[r].load(Ordering::Relaxed) >= TAIL_HITS;
    let mut appended = 0u64;
    while appended < appends || !(0..READERS).all(caught_up) {
        assert!(
            !appended.is_multiple_of(1000) || std::time::Instant::now() < limit,
            "after {appended} appends the readers caught up {:?} times",
            hits.iter()
                .map(|h| h.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        );
        t.append_to(
            0,
            &[NewRecord {
                key: None,
                value: &v,
                timestamp: None,
            }],
        )
        .unwrap();
        appended += 1;
    }
    done.store(true, Ordering::Release);
    for r in readers {
        assert_eq!(r.join().unwrap().unwrap(), appended);
    }
    assert!(p.segment_count() > 100, "the test rolled segments");
}

/// A one-partition topic whose partition 0 holds `n` records with old
/// timestamps, then is split (sealed at `n`) and emptied by retention.
/// Returns the log, the topic and a cut taken after `read_before` records.
///
/// Retention removes an emptied partition from the topology right after
/// emptying it (tests/topology/retention_removal.rs); this one keeps it: the
/// process dies before its `RemovePartition` record is written, and the
/// reopened log (background retention off) holds it, empty.
fn emptied_sealed_partition(
    dir: &std::path::Path,
    n: u64,
    read_before: usize,
) -> (Log, fissionlog::Topic, fissionlog::Cut) {
    let hook = Arc::new(common::faults::failing_manifest_writes());
    let log = Log::open_with_hook(dir, quiet(), hook.clone()).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                retention_age: Some(std::time::Duration::from_secs(3600)),
                ..TopicConfig::default()
            },
        )
        .unwrap();
    for i in 0..n {
        t.append_to(
            0,
            &[NewRecord {
                key: Some(format!("k{i}").as_bytes()),
                value: b"old",
                timestamp: Some(1),
            }],
        )
        .unwrap();
    }
    let mut r = t.reader(fissionlog::StartAt::Earliest).unwrap();
    assert_eq!(r.poll(read_before).unwrap().len(), read_before);
    let cut = r.cut();
    t.split(0, fissionlog::SplitPlan::Even).unwrap();
    log.sync().unwrap();
    // Two sync rounds move the checkpointed segment bases off partition 0.
    log.sync().unwrap();
    hook.arm();
    assert!(matches!(
        log.enforce_retention(),
        Err(Error::LogPoisoned { .. })
    ));
    let p = t.partition(0).unwrap();
    assert!(p.is_empty_sealed(), "retention removed every segment");
    drop((p, t));
    log.abandon();
    let log = Log::open(dir, quiet()).unwrap();
    let t = log.topic("t").unwrap();
    (log, t, cut)
}

/// A sealed partition that retention emptied reads as
/// removed by retention (a typed error), never a panic, and its start
/// offset is its end (it holds nothing).
#[test]
fn read_of_a_partition_emptied_by_retention_is_a_retention_error() {
    let dir = tempfile::tempdir().unwrap();
    let (log, t, _) = emptied_sealed_partition(dir.path(), 50, 10);
    let p = t.partition(0).unwrap();
    assert_eq!(p.end_offset(), 50);
    assert_eq!(p.start_offset(), 50, "nothing is held");
    for offset in [0, 10, 49] {
        match t.read(0, offset, 1024) {
            Err(Error::Retained {
                partition: 0,
                start,
                end: 50,
            }) => assert_eq!(start, offset),
            other => panic!("read at {offset}: {other:?}"),
        }
    }
    assert!(matches!(
        t.read(0, 50, 1024),
        Err(Error::OffsetOutOfRange { .. })
    ));
    let info = t.partitions().into_iter().find(|i| i.id == 0).unwrap();
    assert_eq!((info.start_offset, info.end_offset), (50, 50));
    drop(p);
    log.close().unwrap();
    // The floor survives a reopen.
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log.topic("t").unwrap();
    assert!(matches!(
        t.read(0, 0, 1024),
        Err(Error::Retained {
            start: 0,
            end: 50,
            ..
        })
    ));
}

/// Readers over a partition that retention emptied
/// (from Earliest, and from a cut taken before the split) treat it as
/// drained, go on to its children, and report what retention removed
/// under them.
#[test]
fn reader_passes_a_partition_emptied_by_retention_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, t, cut) = emptied_sealed_partition(dir.path(), 50, 10);
    let children = t.active_partitions();
    assert_eq!(children.len(), 2);
    for (i, c) in children.iter().enumerate() {
        t.append_to(
            *c,
            &[NewRecord {
                key: None,
                value: format!("new{i}").as_bytes(),
                timestamp: None,
            }],
        )
        .unwrap();
    }
    let mut from_cut = t.reader(fissionlog::StartAt::Cut(cut)).unwrap();
    let got = from_cut.poll(100).unwrap();
    assert_eq!(got.len(), 2, "both children's records: {got:?}");
    assert!(got.iter().all(|r| r.partition != 0));
    assert_eq!(
        from_cut.retained(),
        &[fissionlog::RetainedRange {
            partition: 0,
            start: 10,
            end: 50
        }]
    );
    // Drained: its children are open, so the cut leaves it out (an
    // ancestor of an open partition counts as drained).
    let open_children = |cut: fissionlog::Cut| {
        assert!(cut.drained.is_empty(), "{:?}", cut.drained);
        cut.positions.keys().copied().collect::<Vec<u32>>()
    };
    assert_eq!(open_children(from_cut.cut()), children);

    let mut earliest = t.reader(fissionlog::StartAt::Earliest).unwrap();
    let got = earliest.poll(100).unwrap();
    assert_eq!(got.len(), 2, "both children's records: {got:?}");
    assert_eq!(open_children(earliest.cut()), children);
}

/// The directory lock lives as long as any mapping a
/// caller holds. A batch read before `Log::close` keeps the directory
/// locked, so no second open can repair files under it; once it is
/// dropped the directory opens again.
#[test]
fn read_batch_outliving_the_log_keeps_the_directory_locked() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log.create_topic("t", TopicConfig::default()).unwrap();
    t.append_to(
        0,
        &[NewRecord {
            key: None,
            value: b"held",
            timestamp: None,
        }],
    )
    .unwrap();
    let batch = t.read(0, 0, 1024).unwrap();
    drop(t);
    log.close().unwrap();
    assert!(matches!(
        Log::open(dir.path(), quiet()),
        Err(Error::Locked { .. })
    ));
    assert_eq!(batch.iter().next().unwrap().value, b"held");
    // A partition handle outliving the log holds it too.
    drop(batch);
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log.topic("t").unwrap();
    let p = t.partition(0).unwrap();
    log.close().unwrap();
    assert!(matches!(
        Log::open(dir.path(), quiet()),
        Err(Error::Locked { .. })
    ));
    assert_eq!(p.read(0, 1024).unwrap().iter().count(), 1);
    drop(p);
    // A topic handle alone does not: it let go of its partitions at close
    // and answers Closed.
    let log = Log::open(dir.path(), quiet()).unwrap();
    assert!(matches!(t.read(0, 0, 1024), Err(Error::Closed)));
    drop(t);
    log.close().unwrap();
}

/// Bytes changed under a live batch (by something
/// outside fissionlog writing the file) make iteration stop, and
/// `try_iter` report a typed error; nothing panics.
#[test]
fn bytes_changed_under_a_read_batch_are_an_error_not_a_panic() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log.create_topic("t", TopicConfig::default()).unwrap();
    for i in 0..3u8 {
        t.append_to(
            0,
            &[NewRecord {
                key: None,
                value: &[i; 100],
                timestamp: None,
            }],
        )
        .unwrap();
    }
    let batch = t.read(0, 0, 1 << 20).unwrap();
    assert_eq!(batch.iter().count(), 3);
    let seg = &t.partition(0).unwrap().segment_infos()[0];
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&seg.path)
        .unwrap();
    // Overwrite the second batch (header and records) with garbage.
    let second = 64 + batch.len_bytes() / 3;
    file.write_all_at(&[0xA5; 64], second).unwrap();
    let seen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| batch.iter().count()));
    assert!(seen.is_ok(), "iteration panicked on changed bytes");
    assert!(seen.unwrap() < 3, "iteration stops at the changed batch");
    let items: Vec<_> = batch.try_iter().collect();
    assert!(items[0].is_ok());
    assert!(
        matches!(
            items.last(),
            Some(Err(
                Error::ChecksumMismatch { .. } | Error::Corruption { .. }
            ))
        ),
        "{items:?}"
    );
    assert!(batch.to_owned_records().is_err());
}

/// A record's bytes changed under a live batch (its batch header intact):
/// `try_iter` yields the records before it, then exactly one
/// `ChecksumMismatch` naming the changed batch, then nothing; `iter`
/// stops before the changed batch.
#[test]
fn a_changed_record_ends_try_iter_with_one_checksum_error() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log.create_topic("t", TopicConfig::default()).unwrap();
    for i in 0..3u8 {
        put(&t, &[i; 100]);
    }
    let batch = t.read(0, 0, 1 << 20).unwrap();
    let seg = &t.partition(0).unwrap().segment_infos()[0];
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&seg.path)
        .unwrap();
    // One value byte of the second batch (past its 40-byte header and the
    // record's 16-byte header).
    let second = 64 + batch.len_bytes() / 3;
    file.write_all_at(&[0xA5], second + 40 + 16 + 10).unwrap();
    let offsets: Vec<u64> = batch.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, vec![0, 1, 2], "iter does not check the CRC");
    let mut items = batch.try_iter();
    assert_eq!(items.next().unwrap().unwrap().offset, 0);
    match items.next() {
        Some(Err(Error::ChecksumMismatch { position, .. })) => assert_eq!(position, second),
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
    assert!(items.next().is_none(), "one error, then the end");
    assert!(items.next().is_none());
}

fn put(t: &fissionlog::Topic, value: &[u8]) -> u64 {
    t.append_to(
        0,
        &[NewRecord {
            key: None,
            value,
            timestamp: None,
        }],
    )
    .unwrap()
}

/// A durable read shows only what a completed sync
/// covered, a durable wait wakes when a sync moves the durable end, and
/// the default follows the sync policy (durable for `Always`).
#[test]
fn durable_reads_show_only_synced_records_and_wake_on_sync() {
    use fissionlog::ReadIsolation::{Durable, Written};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log
        .create_topic(
            "never",
            TopicConfig {
                partitions: 1,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let p = t.partition(0).unwrap();
    assert_eq!(p.default_isolation(), Written);
    for i in 0..3u8 {
        put(&t, &[i]);
    }
    assert_eq!(p.durable_end_offset(), 0);
    assert!(matches!(
        t.read_with(0, 0, 1 << 20, Durable),
        Err(Error::OffsetOutOfRange { end: 0, .. })
    ));
    assert_eq!(t.read(0, 0, 1 << 20).unwrap().iter().count(), 3);
    let waiter = {
        let p = p.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let ready = p.wait_for_with(0, Duration::from_secs(20), Durable);
            (ready, started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    log.sync().unwrap();
    let (ready, waited) = waiter.join().unwrap();
    assert!(ready && waited < Duration::from_secs(10), "{waited:?}");
    assert_eq!(p.durable_end_offset(), 3);
    // Unsynced records past the durable end stay hidden from durable reads.
    put(&t, b"late");
    let b = t.read_with(0, 0, 1 << 20, Durable).unwrap();
    assert_eq!((b.iter().count(), b.next_offset()), (3, 3));
    let mut r = t.reader(fissionlog::StartAt::Earliest).unwrap();
    r.set_isolation(Durable);
    assert_eq!(r.poll(100).unwrap().len(), 3);
    assert!(r.poll(100).unwrap().is_empty());
    log.sync().unwrap();
    assert_eq!(r.poll(100).unwrap().len(), 1);

    let always = log
        .create_topic(
            "always",
            TopicConfig {
                partitions: 1,
                sync: fissionlog::SyncPolicy::Always,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    assert_eq!(always.partition(0).unwrap().default_isolation(), Durable);
    let at = put(&always, b"acked");
    assert_eq!(always.read(0, at, 1024).unwrap().iter().count(), 1);
}

/// A cut whose position lies past records that a
/// power loss took (recovery cut the unsynced tail) is reported when the
/// reader resumes, both before and after new appends reuse the offsets,
/// instead of silently skipping the new records.
#[test]
fn cut_past_a_tail_recovery_cut_is_reported_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    for i in 0..10u8 {
        put(&t, &[i]);
    }
    log.sync().unwrap();
    log.sync().unwrap();
    // What the disk holds: the synced ten records.
    let durable = common::crash::DirImage::capture(dir.path()).unwrap();
    for i in 10..20u8 {
        put(&t, &[i]);
    }
    let mut r = t.reader(fissionlog::StartAt::Earliest).unwrap();
    assert_eq!(r.poll(100).unwrap().len(), 20);
    let cut = r.cut();
    let early = {
        let mut r = t.reader(fissionlog::StartAt::Earliest).unwrap();
        assert_eq!(r.poll(4).unwrap().len(), 4);
        r.cut()
    };
    drop((r, t));
    log.abandon();
    // Power loss: the unsynced ten are gone.
    std::fs::remove_dir_all(dir.path()).unwrap();
    durable.write_to(dir.path()).unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log.topic("t").unwrap();
    assert_eq!(t.partition(0).unwrap().end_offset(), 10);
    let resume = |cut: &fissionlog::Cut| t.reader(fissionlog::StartAt::Cut(cut.clone()));
    assert!(matches!(
        resume(&cut),
        Err(Error::PositionLost {
            partition: 0,
            position: 20,
            end: 10
        })
    ));
    // New records take offsets 10..25: the cut's position 20 now lies
    // inside them, and the record before it is not the one read there.
    for i in 0..15u8 {
        put(&t, &[100 + i]);
    }
    assert!(matches!(
        resume(&cut),
        Err(Error::PositionLost { position: 20, .. })
    ));
    // A cut below the loss still resumes, through the new records.
    let mut r = resume(&early).unwrap();
    let got = r.poll(100).unwrap();
    assert_eq!(got.len(), 21);
    assert_eq!(got.last().unwrap().value, vec![114]);
    // And a cut survives serialization with its check.
    let bytes = cut.to_bytes();
    assert!(matches!(
        resume(&fissionlog::Cut::from_bytes(&bytes).unwrap()),
        Err(Error::PositionLost { .. })
    ));
}
