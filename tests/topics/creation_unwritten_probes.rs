//! A new topic's partition that nothing was appended to is skipped by
//! every sync round, and an open that finds it still empty keeps it so.
//! Power loss around what may end that state: appends racing explicit
//! and background sync rounds, splits, merges and tail splits of a
//! still-empty partition after a clean reopen, durable appends after an
//! unclean reopen, retention, deletion and a creation under the same
//! name. Every image opens Strict and keeps every acknowledged record.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::common;

use super::creation_probes::{big, check_report, start};
use common::crash::{CrashOptions, DirImage};
use common::lifecycle::{cfg, opts, partition_values};
use common::model_hook::ModelHook;
use fissionlog::{Log, SplitPlan, SyncPolicy, TailSplitOptions, TopicConfig};

/// One acknowledged append seen by a racing thread: the power-loss image
/// taken right after it returned, and how many values of the partition
/// were acknowledged then.
struct AckImage {
    p: u32,
    acked: usize,
    image: DirImage,
    ctx: String,
}

impl AckImage {
    /// A power-loss image taken right after ack `i` (counted from 0) of
    /// partition `p` in `round`, tearing pages at any byte every other
    /// seed.
    fn now(model: &ModelHook, round: u64, p: u32, i: u8) -> AckImage {
        let seed = round * 100 + u64::from(p) * 10 + u64::from(i);
        let options = CrashOptions {
            torn_any_byte: seed % 2 == 1,
            keep_all_new_probability: 0.0,
        };
        let (image, _) = model.crash_image(seed, &options);
        AckImage {
            p,
            acked: usize::from(i) + 1,
            image,
            ctx: format!("round {round}, partition {p}, ack {i}, seed {seed}"),
        }
    }
}

/// C1 under races: four threads make the first durable appends to their
/// own partitions of a fresh `SyncPolicy::Always` topic while another
/// thread runs explicit sync rounds and a second topic's background
/// rounds run, so rounds that skip the still-empty partitions overlap the
/// appends that end it. A power-loss image taken right after each
/// acknowledgement keeps every record acknowledged so far.
#[test]
fn durable_appends_racing_sync_rounds_on_a_new_topic_survive_power_loss() {
    for round in 0..4u64 {
        let dir = tempfile::tempdir().unwrap();
        let model = ModelHook::new(dir.path(), None);
        let log = Arc::new(Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap());
        let t = log.create_topic("t", cfg(6, SyncPolicy::Always)).unwrap();
        // Background rounds of a second topic, never written to either.
        let bg = log
            .create_topic("bg", cfg(4, SyncPolicy::Interval(Duration::from_millis(1))))
            .unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let go = Arc::new(Barrier::new(5));
        let syncer = {
            let (log, done, go) = (log.clone(), done.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                let mut n = 0u64;
                while !done.load(Ordering::Acquire) {
                    log.sync().unwrap();
                    n += 1;
                }
                n
            })
        };
        let writers: Vec<_> = (0..4u32)
            .map(|p| {
                let (t, model, go) = (t.clone(), model.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    let mut out = Vec::new();
                    for i in 0..3u8 {
                        let v = [b'a' + p as u8, i];
                        t.append_to(p, &common::log::rec(&v)).unwrap();
                        out.push(AckImage::now(&model, round, p, i));
                    }
                    out
                })
            })
            .collect();
        let acks: Vec<AckImage> = writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        done.store(true, Ordering::Release);
        assert!(syncer.join().unwrap() > 0, "no explicit sync round ran");
        drop((t, bg));
        Arc::into_inner(log).unwrap().abandon();
        for a in &acks {
            let out = tempfile::tempdir().unwrap();
            a.image.write_to(out.path()).unwrap();
            let log = Log::open(out.path(), opts())
                .unwrap_or_else(|e| panic!("{}: Strict open fails: {e}", a.ctx));
            check_report(&log, &a.ctx);
            let t = log
                .topic("t")
                .unwrap_or_else(|e| panic!("{}: the topic is gone: {e}", a.ctx));
            let want: Vec<Vec<u8>> = (0..a.acked as u8)
                .map(|i| vec![b'a' + a.p as u8, i])
                .collect();
            let vals = partition_values(&t, a.p);
            assert!(
                vals.starts_with(&want) && vals.len() <= 3,
                "{}: partition {} holds {vals:?}, {} acked",
                a.ctx,
                a.p,
                a.acked
            );
            for p in 4..6 {
                assert!(
                    partition_values(&t, p).is_empty(),
                    "{}: partition {p}",
                    a.ctx
                );
            }
            t.append_to(5, &common::log::rec(b"z")).unwrap();
            drop(t);
            log.close().unwrap();
        }
    }
}

/// A topic created and closed clean without a write, reopened (its
/// partitions still count as a new topic's), then a split, a merge and a
/// tail split of still-empty partitions and durable appends to their
/// children: power loss at every step from the reopen on.
#[test]
fn power_loss_around_topology_changes_of_still_empty_partitions_after_a_clean_reopen() {
    for sync in [SyncPolicy::Never, SyncPolicy::Always] {
        let dir = tempfile::tempdir().unwrap();
        let (log, mut s) = start(dir.path());
        let t = s.create(&log, cfg(4, sync));
        drop(t);
        log.close().unwrap();
        s.mark();
        let log = Log::open_with_hook(dir.path(), opts(), s.model.clone()).unwrap();
        s.mark();
        let t = log.topic("t").unwrap();
        let durable = sync == SyncPolicy::Always;
        let children = t.split(0, SplitPlan::Even).unwrap();
        s.mark();
        let merged = t.merge(1, 2).unwrap();
        s.mark();
        t.split_tail(3, SplitPlan::Even, TailSplitOptions::from_offset(0))
            .unwrap();
        s.mark();
        for &c in &children {
            s.append(&t, c, b"c", durable);
        }
        s.append(&t, merged, b"m", durable);
        for c in t.active_partitions() {
            if !s.written.contains_key(&c) {
                s.append(&t, c, b"x", durable);
            }
        }
        s.synced(&log);
        drop(t);
        log.abandon();
        s.check_all();
    }
}

/// A topic created, then a process kill before any write (the page cache
/// survives) and an unclean reopen that finds its partitions empty with
/// nothing durable: the durable appends after it, and the split of a
/// still-empty partition, are kept by a power loss at every step.
#[test]
fn power_loss_after_durable_appends_that_follow_an_unclean_reopen_of_a_new_topic() {
    for split_first in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (log, mut s) = start(dir.path());
        let t = s.create(&log, cfg(3, SyncPolicy::Always));
        drop(t);
        log.abandon();
        s.mark();
        let log = Log::open_with_hook(dir.path(), opts(), s.model.clone()).unwrap();
        s.mark();
        let t = log.topic("t").unwrap();
        if split_first {
            for c in t.split(2, SplitPlan::Even).unwrap() {
                s.mark();
                s.append(&t, c, b"c", true);
            }
        }
        s.append(&t, 0, b"a", true);
        s.append(&t, 1, &big(1), true);
        s.append(&t, 0, b"b", true);
        drop(t);
        // A second kill and reopen: the partition never written stays new.
        log.abandon();
        s.mark();
        let log = Log::open_with_hook(dir.path(), opts(), s.model.clone()).unwrap();
        s.mark();
        let t = log.topic("t").unwrap();
        s.append(&t, 1, b"d", true);
        drop(t);
        log.abandon();
        s.check_all();
    }
}

/// Retention over never-written partitions, the deletion of a topic
/// whose partitions were never written (or were emptied by a power loss
/// of nothing durable), and a creation under the same name with durable
/// appends: power loss at every step. Only the new topic's partitions 0
/// and 1 are written; the old one wrote partition 2 only, so an image of
/// the old topic holds nothing the script checks.
#[test]
fn power_loss_around_retention_and_a_recreation_of_never_written_partitions() {
    for reopen in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (log, mut s) = start(dir.path());
        let config = TopicConfig {
            retention_bytes: Some(4096),
            ..cfg(3, SyncPolicy::Never)
        };
        let t = log.create_topic("t", config.clone()).unwrap();
        t.append_to(2, &common::log::rec(b"old")).unwrap();
        log.enforce_retention().unwrap();
        log.sync().unwrap();
        log.enforce_retention().unwrap();
        drop(t);
        let log = if reopen {
            log.close().unwrap();
            Log::open_with_hook(dir.path(), opts(), s.model.clone()).unwrap()
        } else {
            log
        };
        log.delete_topic("t").unwrap();
        let t = s.create(
            &log,
            TopicConfig {
                sync: SyncPolicy::Always,
                ..config
            },
        );
        log.enforce_retention().unwrap();
        s.mark();
        s.append(&t, 0, b"a", true);
        log.enforce_retention().unwrap();
        s.mark();
        // Small records: retention has no sealed segment of the new
        // topic to retire, only never-written partitions to pass over.
        for i in 0..4u8 {
            s.append(&t, 1, &[b'b', i], true);
        }
        log.enforce_retention().unwrap();
        s.mark();
        s.append(&t, 1, b"e", true);
        drop(t);
        log.abandon();
        s.check_all();
    }
}

/// A power loss that leaves only torn bytes of a new partition's
/// unsynced records (the open cuts them and finds it empty with nothing
/// durable, so it stays a new topic's partition), then a clean close, or
/// durable appends to another partition and a kill: a power-loss image of
/// that opens Strict, reports no loss, takes records and verifies healthy.
#[test]
fn a_partition_emptied_by_a_power_loss_stays_openable_after_later_power_losses() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    let t = log.create_topic("t", cfg(2, SyncPolicy::Never)).unwrap();
    for i in 0..2u8 {
        t.append_to(0, &common::log::rec(&big(i))).unwrap();
    }
    drop(t);
    log.abandon();
    for seed in 0..super::creation_probes::seeds() * 4 {
        for clean in [true, false] {
            let ctx = format!("seed {seed}, clean {clean}");
            let options = CrashOptions {
                torn_any_byte: seed % 2 == 1,
                keep_all_new_probability: 0.0,
            };
            let (image, _) = model.crash_image(seed, &options);
            let first = tempfile::tempdir().unwrap();
            image.write_to(first.path()).unwrap();
            // Whatever the image holds is durable now.
            let again = ModelHook::new(first.path(), None);
            let log = Log::open_with_hook(first.path(), opts(), again.clone())
                .unwrap_or_else(|e| panic!("{ctx}: first Strict open fails: {e}"));
            let t = log.topic("t").unwrap();
            let kept = partition_values(&t, 0);
            if clean {
                drop(t);
                log.close().unwrap();
            } else {
                t.append_to(1, &common::log::rec(b"p1"))
                    .and_then(|_| log.sync())
                    .unwrap();
                drop(t);
                log.abandon();
            }
            for seed2 in 0..4u64 {
                let ctx = format!("{ctx}, second image {seed2}");
                let options = CrashOptions {
                    torn_any_byte: seed2 % 2 == 1,
                    keep_all_new_probability: 0.0,
                };
                let (image, _) = again.crash_image(seed2, &options);
                let out = tempfile::tempdir().unwrap();
                image.write_to(out.path()).unwrap();
                let log = Log::open(out.path(), opts())
                    .unwrap_or_else(|e| panic!("{ctx}: Strict open fails: {e}"));
                check_report(&log, &ctx);
                let t = log.topic("t").unwrap();
                let vals = partition_values(&t, 0);
                assert!(
                    kept.starts_with(&vals),
                    "{ctx}: partition 0 holds {} values, the first open kept {}",
                    vals.len(),
                    kept.len()
                );
                if !clean {
                    assert_eq!(partition_values(&t, 1), vec![b"p1".to_vec()], "{ctx}");
                }
                for p in 0..2 {
                    t.append_to(p, &common::log::rec(b"z")).unwrap();
                }
                log.sync().unwrap();
                drop(t);
                log.close().unwrap();
                super::creation_probes::assert_healthy(out.path(), &ctx);
            }
        }
    }
}

/// C1 and C5 under races: the first durable appends to two fresh
/// partitions race a split of one and a merge of the other two-thread
/// pair, and an explicit sync round, so a topology change's own sync of a
/// never-written partition overlaps the append that ends that state. A
/// power-loss image taken right after each acknowledgement keeps every
/// record acknowledged to that partition, parent or child.
#[test]
fn durable_appends_racing_a_split_and_a_merge_of_fresh_partitions_survive_power_loss() {
    for round in 0..6u64 {
        let dir = tempfile::tempdir().unwrap();
        let model = ModelHook::new(dir.path(), None);
        let log = Arc::new(Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap());
        let t = log.create_topic("t", cfg(3, SyncPolicy::Always)).unwrap();
        let go = Arc::new(Barrier::new(4));
        let changer = {
            let (t, go) = (t.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                if round % 2 == 0 {
                    t.split(0, SplitPlan::Even).unwrap();
                    t.merge(1, 2).unwrap();
                } else {
                    t.merge(1, 2).unwrap();
                    t.split(0, SplitPlan::Even).unwrap();
                }
            })
        };
        let syncer = {
            let (log, go) = (log.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                for _ in 0..20 {
                    log.sync().unwrap();
                }
            })
        };
        let writers: Vec<_> = [0u32, 1]
            .into_iter()
            .map(|p| {
                let (t, model, go) = (t.clone(), model.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    let mut out = Vec::new();
                    for i in 0..4u8 {
                        let v = [b'a' + p as u8, i];
                        // Refused once the partition is sealed.
                        if t.append_to(p, &common::log::rec(&v)).is_err() {
                            break;
                        }
                        out.push(AckImage::now(&model, round, p, i));
                    }
                    out
                })
            })
            .collect();
        let acks: Vec<AckImage> = writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        changer.join().unwrap();
        syncer.join().unwrap();
        drop(t);
        Arc::into_inner(log).unwrap().abandon();
        for a in &acks {
            let out = tempfile::tempdir().unwrap();
            a.image.write_to(out.path()).unwrap();
            let log = Log::open(out.path(), opts())
                .unwrap_or_else(|e| panic!("{}: Strict open fails: {e}", a.ctx));
            check_report(&log, &a.ctx);
            let t = log.topic("t").unwrap();
            let want: Vec<Vec<u8>> = (0..a.acked as u8)
                .map(|i| vec![b'a' + a.p as u8, i])
                .collect();
            let vals = partition_values(&t, a.p);
            assert!(
                vals.starts_with(&want),
                "{}: partition {} holds {vals:?}, {} acked",
                a.ctx,
                a.p,
                a.acked
            );
            for c in t.active_partitions() {
                t.append_to(c, &common::log::rec(b"z")).unwrap();
            }
            drop(t);
            log.close().unwrap();
            super::creation_probes::assert_healthy(out.path(), &a.ctx);
        }
    }
}

/// A topic never written, closed clean and reopened (still a new
/// topic's partitions), deleted and created again under its name, then
/// durable appends: power loss at every step from the reopen on.
#[test]
fn power_loss_around_a_recreation_of_a_never_written_topic_after_a_clean_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    drop(log.create_topic("t", cfg(3, SyncPolicy::Never)).unwrap());
    log.close().unwrap();
    s.mark();
    let log = Log::open_with_hook(dir.path(), opts(), s.model.clone()).unwrap();
    log.delete_topic("t").unwrap();
    let t = s.create(&log, cfg(3, SyncPolicy::Always));
    s.append(&t, 0, b"a", true);
    s.append(&t, 2, &big(1), true);
    s.append(&t, 0, b"b", true);
    drop(t);
    log.abandon();
    s.check_all();
}
