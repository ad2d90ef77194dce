//! A full disk at every write path:
//! segment growth on append, the roll's new segment, the roll's index file,
//! the checkpoint, the manifest record of a split and a split's child
//! segments. Each gets a typed error, nothing acknowledged is lost, and the
//! log reopens with every synced record byte for byte.

use std::sync::Arc;
use std::time::Duration;

use fissionlog::IoOp;
use fissionlog::{Error, Log, LogOptions, NewRecord, SplitPlan, TopicConfig};

use crate::common::faults::Fail;

fn opts() -> LogOptions {
    LogOptions {
        balancer: false,
        // Every round writes the checkpoint, so a full disk there shows.
        checkpoint_interval: Duration::ZERO,
        ..LogOptions::default()
    }
}

fn config() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 64 << 10,
        ..TopicConfig::default()
    }
}

fn value(i: u64) -> Vec<u8> {
    let mut v = i.to_le_bytes().to_vec();
    v.resize(200, (i % 251) as u8);
    v
}

fn key(i: u64) -> Vec<u8> {
    format!("k{}", i % 7).into_bytes()
}

/// Appends record `i` to partition `p`.
fn put(t: &fissionlog::Topic, p: u32, i: u64) -> fissionlog::Result<u64> {
    let k = key(i);
    t.append_to(
        p,
        &[NewRecord {
            key: Some(&k),
            value: &value(i),
            timestamp: Some(i as i64),
        }],
    )
}

/// Every record of partition 0 from offset 0: (offset, value).
fn partition0(log: &Log) -> Vec<(u64, Vec<u8>)> {
    let t = log.topic("t").unwrap();
    let end = t.partition(0).unwrap().end_offset();
    let mut out = Vec::new();
    let mut next = 0;
    while next < end {
        let b = t.read(0, next, 1 << 20).unwrap();
        for r in b.iter() {
            out.push((r.offset, r.value.to_vec()));
            next = r.offset + 1;
        }
    }
    out
}

/// Runs `provoke` with `op` failing with ENOSPC, after `synced` records
/// were appended to partition 0 and synced. `provoke` returns the error it
/// got (it must get one, unless `may_succeed`). Then checks that the
/// synced records survive a reopen, byte for byte, at their offsets.
fn full_disk_at(
    op: IoOp,
    may_succeed: bool,
    provoke: impl FnOnce(&Log, &fissionlog::Topic) -> fissionlog::Result<()>,
) {
    let dir = tempfile::tempdir().unwrap();
    // Every `op` fails with ENOSPC while armed.
    let hook = Arc::new(Fail::new(op, libc::ENOSPC).disarmed());
    let log = Log::open_with_hook(dir.path(), opts(), hook.clone()).unwrap();
    let t = log.create_topic("t", config()).unwrap();
    let synced = 150u64;
    for i in 0..synced {
        assert_eq!(put(&t, 0, i).unwrap(), i);
    }
    log.sync().unwrap();
    let want: Vec<(u64, Vec<u8>)> = (0..synced).map(|i| (i, value(i))).collect();
    hook.arm();
    match provoke(&log, &t) {
        Ok(()) => assert!(may_succeed, "{op:?}: a full disk went unnoticed"),
        Err(e) => assert!(
            matches!(e, Error::NoSpace { .. })
                || matches!(&e, Error::LogPoisoned { reason } if reason.contains("no space")),
            "{op:?}: expected a no-space error, got {e}"
        ),
    }
    // What was synced is still readable in this process.
    let now = partition0(&log);
    assert!(now.len() >= want.len(), "{op:?}: records vanished");
    assert_eq!(
        now[..want.len()],
        want[..],
        "{op:?}: synced records changed"
    );
    hook.disarm();
    drop(t);
    log.abandon();
    // A power loss is not needed to show loss here: the reopen must find
    // every synced record (and may find more that reached the page cache).
    let log = Log::open(dir.path(), opts()).unwrap_or_else(|e| panic!("{op:?}: reopen: {e}"));
    let after = partition0(&log);
    assert!(after.len() >= want.len(), "{op:?}: lost synced records");
    assert_eq!(
        after[..want.len()],
        want[..],
        "{op:?}: synced records changed"
    );
    // The log takes appends again.
    let t = log.topic("t").unwrap();
    let next = t.partition(0).unwrap().end_offset();
    if t.partition(0).unwrap().is_sealed() {
        return;
    }
    assert_eq!(
        put(&t, 0, next).unwrap(),
        next,
        "{op:?}: no appends after reopen"
    );
    log.close().unwrap();
}

#[test]
fn full_disk_growing_a_segment_on_append() {
    full_disk_at(IoOp::AllocateSegment, false, |_, t| {
        for i in 150..10_000 {
            put(t, 0, i)?;
        }
        Ok(())
    });
}

#[test]
fn full_disk_creating_the_next_segment_at_a_roll() {
    full_disk_at(IoOp::CreateSegment, false, |_, t| {
        for i in 150..10_000 {
            put(t, 0, i)?;
        }
        Ok(())
    });
}

#[test]
fn full_disk_writing_the_index_at_a_roll_does_not_stop_appends() {
    // The index is a cache: a roll whose index write fails still rolls.
    full_disk_at(IoOp::WriteIndex, true, |_, t| {
        for i in 150..1_000 {
            put(t, 0, i)?;
        }
        Ok(())
    });
}

#[test]
fn full_disk_writing_the_checkpoint() {
    full_disk_at(IoOp::WriteCheckpoint, false, |log, t| {
        put(t, 0, 150)?;
        log.sync()
    });
}

#[test]
fn full_disk_committing_a_split() {
    full_disk_at(IoOp::WriteManifest, false, |_, t| {
        t.split(0, SplitPlan::Even).map(|_| ())
    });
}

#[test]
fn full_disk_creating_a_splits_children() {
    full_disk_at(IoOp::CreateSegment, false, |_, t| {
        t.split(0, SplitPlan::Even).map(|_| ())
    });
}
