//! A lost tail-split descendant index (groups, a reclaim of the
//! degraded parent, read errors that are not damage), of a group's
//! retention loss settled by the member that reported it, and of
//! `LogOptions::topic_hash_seed`.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::groups::member_opts;
use common::retention::{fill, OLD_TS};
use common::tail::{config, seq};
use fissionlog::{
    FileAction, GroupOptions, Log, LogOptions, ManualClock, NewRecord, RecoveryMode, SplitPlan,
    TailSplitOptions, Topic, TopicConfig,
};

/// Records appended; the split moves `FROM..N`.
const N: u64 = 400;
const FROM: u64 = 100;

fn opts(recovery: RecoveryMode, clock: &Arc<ManualClock>) -> LogOptions {
    LogOptions {
        recovery,
        // Where the seven keys land decides which child a tail split fills:
        // with a random hash key, about one run in thirty put every key in
        // one child and left the other empty (a nested split from offset 10
        // of an empty child is out of range).
        topic_hash_seed: Some(1),
        ..common::groups::options(clock)
    }
}

/// Values of about 1 KiB, keys `k{i % 7}`.
fn append_big(topic: &Topic, from: u64, n: u64) {
    let pad = "x".repeat(1000);
    for i in from..from + n {
        let key = format!("k{}", i % 7);
        topic
            .append(Some(key.as_bytes()), format!("{i}:{pad}").as_bytes())
            .unwrap();
    }
}

fn index_file(root: &Path) -> PathBuf {
    root.join("topics/t0/tail-p0.tix")
}

fn index_lost(log: &Log) -> bool {
    log.recovery_report().files.iter().any(|f| {
        matches!(
            f.action,
            FileAction::DescendantIndexLost {
                parent: 0,
                moved_offsets: (FROM, N),
                ..
            }
        )
    })
}

/// A group commits partition 0 at `at`, then 0 is tail-split from `FROM`
/// (reclaimed when `reclaim`), the log closes and the index is removed.
fn group_then_lost_index(dir: &Path, clock: &Arc<ManualClock>, at: usize, reclaim: bool) {
    let log = Log::open(dir, opts(RecoveryMode::Strict, clock)).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append_big(&topic, 0, N);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    let mut n = 0;
    while n < at {
        let got = m.poll(at - n).unwrap();
        assert!(!got.is_empty());
        n += got.len();
    }
    m.commit().unwrap();
    drop((m, group));
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    if reclaim {
        assert!(topic.reclaim_tail(0).unwrap().complete);
    }
    drop(topic);
    log.close().unwrap();
    std::fs::remove_file(index_file(dir)).unwrap();
}

/// Every record the group reads after the reopen.
fn group_reads(log: &Log) -> Vec<u64> {
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    let mut seen = Vec::new();
    for _ in 0..50 {
        let got = m.poll(1000).unwrap();
        if !got.is_empty() {
            seen.extend(got.iter().map(seq));
            m.commit().unwrap();
        }
    }
    seen.sort_unstable();
    seen
}

/// A group committed inside the moved range (and, apart, below it and at
/// its end) before a tail split whose index is then lost: Truncate and
/// Salvage open it, and the group reads every record past its committed
/// position; the only records read again are moved records below it.
#[test]
fn a_group_committed_around_the_moved_range_loses_nothing_when_the_index_is_lost() {
    for (at, reclaim) in [
        (250, true),
        (250, false),
        (50, true),
        (400, true),
        (100, true),
    ] {
        for mode in [RecoveryMode::Truncate, RecoveryMode::Salvage] {
            let dir = tempfile::tempdir().unwrap();
            let clock = Arc::new(ManualClock::new(1_000_000_000));
            group_then_lost_index(dir.path(), &clock, at, reclaim);
            let log = Log::open(dir.path(), opts(mode, &clock)).unwrap();
            let ctx = format!("at {at}, reclaim {reclaim}, {mode:?}");
            assert!(index_lost(&log), "{ctx}");
            let got = group_reads(&log);
            let at = at as u64;
            // Every record past the position; moved records below it at
            // most once more (a group that saw the split pinned the
            // children's positions and reads none again).
            let again = if at > FROM && at < N {
                FROM..at
            } else {
                at..at
            };
            let mut dedup = got.clone();
            dedup.dedup();
            assert_eq!(dedup, got, "{ctx}: nothing twice");
            let past: Vec<u64> = got.iter().copied().filter(|&s| s >= at).collect();
            assert_eq!(past, (at..N).collect::<Vec<_>>(), "{ctx}");
            assert!(
                got.iter().all(|&s| s >= at || again.contains(&s)),
                "{ctx}: {got:?}"
            );
            log.close().unwrap();
        }
    }
}

/// The parent's moved range is reclaimed after the open that lost its
/// index: the reclaim writes no index, the next open still reports the
/// loss (and Strict still refuses), and every record reads once.
#[test]
fn a_reclaim_of_a_parent_whose_index_is_lost_writes_no_index_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    group_then_lost_index(dir.path(), &clock, 10, false);
    {
        let log = Log::open(dir.path(), opts(RecoveryMode::Truncate, &clock)).unwrap();
        assert!(index_lost(&log));
        let topic = log.topic("t").unwrap();
        let out = topic.reclaim_tail(0).unwrap();
        assert!(out.recorded && out.complete, "{out:?}");
        assert!(!index_file(dir.path()).exists(), "no index written");
        drop(topic);
        log.close().unwrap();
    }
    assert!(Log::open(dir.path(), opts(RecoveryMode::Strict, &clock)).is_err());
    for mode in [RecoveryMode::Truncate, RecoveryMode::Salvage] {
        let log = Log::open(dir.path(), opts(mode, &clock)).unwrap();
        assert!(index_lost(&log), "{mode:?}");
        assert!(!index_file(dir.path()).exists(), "{mode:?}");
        let topic = log.topic("t").unwrap();
        let mut seen: Vec<u64> = common::tail::read_all(&topic).iter().map(seq).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..N).collect::<Vec<_>>(), "{mode:?}");
        drop(topic);
        log.close().unwrap();
    }
}

/// An index path that cannot be read for another reason than damage (here
/// a directory in its place) fails the open in every mode and changes
/// nothing: with the file put back, Strict opens the log.
#[test]
fn an_index_that_cannot_be_read_fails_every_open_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let path = index_file(dir.path());
    {
        let log = Log::open(dir.path(), opts(RecoveryMode::Strict, &clock)).unwrap();
        let topic = log.create_topic("t", config()).unwrap();
        append_big(&topic, 0, N);
        log.sync().unwrap();
        topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
            .unwrap();
        drop(topic);
        log.close().unwrap();
    }
    let saved = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    for mode in [
        RecoveryMode::Strict,
        RecoveryMode::Truncate,
        RecoveryMode::Salvage,
    ] {
        assert!(
            Log::open(dir.path(), opts(mode, &clock)).is_err(),
            "{mode:?}"
        );
        assert!(path.is_dir(), "{mode:?}");
    }
    std::fs::remove_dir(&path).unwrap();
    std::fs::write(&path, saved).unwrap();
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict, &clock)).unwrap();
    assert!(!index_lost(&log));
    let topic = log.topic("t").unwrap();
    assert_eq!(common::tail::read_all(&topic).len() as u64, N);
    drop(topic);
    log.close().unwrap();
}

/// Partition 0 splits into 1 (old records only, emptied by retention) and
/// 2 (empty), which merge into 3 (empty). A member commits 0, then calls `poll_wait` once: that call
/// reports 1's removed records. The settling commit of 1 as read must wait
/// for a later call: `poll_wait` polls again while it waits, and a commit
/// made there is durable before the caller has seen `retained()`, so the
/// process gone while the call still waits (here: right as it returns,
/// nothing else having happened) loses the report for good.
#[test]
fn a_loss_reported_inside_poll_wait_is_not_settled_before_the_caller_sees_it() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let kids = {
        let log = common::groups::open(root.path(), &clock);
        let topic = log.create_topic("t", common::retention::config()).unwrap();
        fill(&topic, 0, 5, false);
        let kids = topic.split(0, SplitPlan::Even).unwrap();
        fill(&topic, kids[0], 40, true);
        topic.merge(kids[0], kids[1]).unwrap();
        log.sync().unwrap();
        assert!(log.enforce_retention().unwrap() > 0);
        let group = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = group.join(member_opts()).unwrap();
        assert_eq!(m.poll(5).unwrap().len(), 5);
        m.commit().unwrap();
        assert!(m.retained().is_empty());
        let got = m.poll_wait(1000, Duration::from_millis(300)).unwrap().len();
        assert_eq!(got, 0);
        // The caller has not looked at retained() yet: the process goes.
        drop((m, group, topic));
        log.abandon();
        kids
    };
    let log = common::groups::open(root.path(), &clock);
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    for _ in 0..5 {
        assert!(m.poll(1000).unwrap().is_empty());
    }
    let lost: Vec<_> = m
        .retained()
        .iter()
        .map(|g| (g.partition, g.start, g.end))
        .collect();
    assert_eq!(lost, vec![(kids[0], 0, 40)], "told again after the crash");
    drop((m, group, topic));
    log.close().unwrap();
}

fn seeded(seed: Option<u64>) -> LogOptions {
    LogOptions {
        topic_hash_seed: seed,
        ..common::tail::options()
    }
}

fn routes(topic: &Topic) -> Vec<u32> {
    (0..200)
        .map(|k| topic.route(format!("key-{k}").as_bytes()))
        .collect()
}

/// A seed derives a new topic's key only: a reopen with another seed or
/// none keeps the existing topic's routing; equal names and seeds in two
/// logs route alike; a topic deleted and created again under the same
/// name and seed routes as before and reads none of the old records.
#[test]
fn a_hash_seed_never_changes_an_existing_topics_key() {
    let cfg = TopicConfig {
        partitions: 8,
        ..config()
    };
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let first = {
        let log = Log::open(a.path(), seeded(Some(7))).unwrap();
        let topic = log.create_topic("t", cfg.clone()).unwrap();
        topic.append(Some(b"k"), b"old").unwrap();
        let r = routes(&topic);
        assert!(r.iter().any(|&p| p != r[0]), "keys spread");
        drop(topic);
        log.close().unwrap();
        r
    };
    for seed in [Some(8), None, Some(7)] {
        let log = Log::open(a.path(), seeded(seed)).unwrap();
        assert_eq!(routes(&log.topic("t").unwrap()), first, "{seed:?}");
        log.close().unwrap();
    }
    {
        let log = Log::open(b.path(), seeded(Some(7))).unwrap();
        assert_eq!(routes(&log.create_topic("t", cfg.clone()).unwrap()), first);
        let other = log.create_topic("u", cfg.clone()).unwrap();
        assert_ne!(routes(&other), first, "another name, another key");
        drop(other);
        log.close().unwrap();
    }
    let log = Log::open(a.path(), seeded(Some(7))).unwrap();
    log.delete_topic("t").unwrap();
    let topic = log.create_topic("t", cfg).unwrap();
    assert_eq!(routes(&topic), first);
    assert!(common::tail::read_all(&topic).is_empty());
    drop(topic);
    log.close().unwrap();
    let log = Log::open(a.path(), seeded(None)).unwrap();
    let topic = log.topic("t").unwrap();
    assert_eq!(routes(&topic), first);
    assert!(common::tail::read_all(&topic).is_empty());
    drop(topic);
    log.close().unwrap();
}

fn cut_at(topic: &Topic, at: usize) -> fissionlog::Cut {
    let mut r = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    let mut n = 0;
    while n < at {
        let got = r.poll(at - n).unwrap();
        assert!(!got.is_empty());
        n += got.len();
    }
    r.cut()
}

fn read_sorted(topic: &Topic, start: fissionlog::StartAt) -> Vec<u64> {
    let mut r = topic.reader(start).unwrap();
    let mut out = Vec::new();
    common::tail::drain(&mut r, &mut out);
    let mut s: Vec<u64> = out.iter().map(seq).collect();
    s.sort_unstable();
    s
}

/// Nested tail splits (0 from `FROM`, its first child from 10), both
/// reclaimed, and one of the two indexes lost: verify names it, Strict
/// refuses, and under Truncate and Salvage the log reads every record
/// once from the start, and from cuts saved before the splits every
/// record past the cut once, the only extras being moved records below it.
#[test]
fn nested_tail_splits_with_one_index_lost_read_everything_past_each_cut() {
    for lose_inner in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let (cuts, child) = {
            let log = Log::open(dir.path(), opts(RecoveryMode::Strict, &clock)).unwrap();
            let topic = log.create_topic("t", config()).unwrap();
            append_big(&topic, 0, N);
            log.sync().unwrap();
            let cuts: Vec<(u64, fissionlog::Cut)> = [50u64, 100, 120, 300, 399]
                .iter()
                .map(|&at| (at, cut_at(&topic, at as usize)))
                .collect();
            let out = topic
                .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
                .unwrap();
            let child = out.children[0];
            topic
                .split_tail(child, SplitPlan::Even, TailSplitOptions::from_offset(10))
                .unwrap();
            for p in [0, child] {
                assert!(topic.reclaim_tail(p).unwrap().complete, "{p}");
            }
            drop(topic);
            log.close().unwrap();
            (cuts, child)
        };
        let lost = if lose_inner {
            dir.path().join(format!("topics/t0/tail-p{child}.tix"))
        } else {
            index_file(dir.path())
        };
        std::fs::remove_file(&lost).unwrap();
        let (_, problems) = fissionlog::verify(dir.path()).unwrap();
        assert_eq!(problems.len(), 1, "{lose_inner}: {problems:?}");
        assert!(Log::open(dir.path(), opts(RecoveryMode::Strict, &clock)).is_err());
        for mode in [RecoveryMode::Truncate, RecoveryMode::Salvage] {
            let ctx = format!("inner {lose_inner}, {mode:?}");
            let log = Log::open(dir.path(), opts(mode, &clock)).unwrap();
            assert!(
                log.recovery_report().files.iter().any(|f| f.file == lost
                    && matches!(f.action, FileAction::DescendantIndexLost { .. })),
                "{ctx}: {:?}",
                log.recovery_report().files
            );
            let topic = log.topic("t").unwrap();
            assert_eq!(
                read_sorted(&topic, fissionlog::StartAt::Earliest),
                (0..N).collect::<Vec<_>>(),
                "{ctx}: earliest"
            );
            for (at, cut) in &cuts {
                let got = read_sorted(&topic, fissionlog::StartAt::Cut(cut.clone()));
                let mut dedup = got.clone();
                dedup.dedup();
                assert_eq!(dedup, got, "{ctx}, cut {at}: nothing twice");
                let past: Vec<u64> = got.iter().copied().filter(|s| s >= at).collect();
                assert_eq!(past, (*at..N).collect::<Vec<_>>(), "{ctx}, cut {at}");
                assert!(
                    got.iter().all(|s| s >= at || *s >= FROM),
                    "{ctx}, cut {at}: {got:?}"
                );
            }
            drop(topic);
            log.close().unwrap();
        }
    }
}

/// A group committed inside the moved range before a tail split whose
/// index is then lost, and retention (all records are old) removes what it
/// can after the Truncate open: every record past the committed position
/// is delivered to the group or inside a range it is told was removed.
#[test]
fn retention_after_an_index_lost_open_loses_nothing_unreported() {
    let at = 250usize;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let cfg = TopicConfig {
        retention_age: Some(Duration::from_secs(3600)),
        ..config()
    };
    {
        let log = Log::open(dir.path(), opts(RecoveryMode::Strict, &clock)).unwrap();
        let topic = log.create_topic("t", cfg).unwrap();
        let pad = "x".repeat(1000);
        for i in 0..N {
            let key = format!("k{}", i % 7);
            let value = format!("{i}:{pad}");
            topic
                .append_batch(&[NewRecord {
                    key: Some(key.as_bytes()),
                    value: value.as_bytes(),
                    timestamp: Some(OLD_TS),
                }])
                .unwrap();
        }
        log.sync().unwrap();
        let group = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = group.join(member_opts()).unwrap();
        let mut n = 0;
        while n < at {
            n += m.poll(at - n).unwrap().len();
        }
        m.commit().unwrap();
        drop((m, group));
        topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
            .unwrap();
        drop(topic);
        log.close().unwrap();
        std::fs::remove_file(index_file(dir.path())).unwrap();
    }
    let log = Log::open(dir.path(), opts(RecoveryMode::Truncate, &clock)).unwrap();
    assert!(index_lost(&log));
    let topic = log.topic("t").unwrap();
    // Which record each (partition, offset) holds, before retention.
    let mut r = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    let mut all = Vec::new();
    common::tail::drain(&mut r, &mut all);
    drop(r);
    let at_offset: std::collections::BTreeMap<(u32, u64), u64> = all
        .iter()
        .map(|r| ((r.partition, r.offset), seq(r)))
        .collect();
    assert!(log.enforce_retention().unwrap() > 0);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    let mut covered = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let got = m.poll(1000).unwrap();
        if !got.is_empty() {
            covered.extend(got.iter().map(seq));
            m.commit().unwrap();
        }
    }
    for g in m.retained() {
        for o in g.start..g.end {
            if let Some(&s) = at_offset.get(&(g.partition, o)) {
                covered.insert(s);
            }
        }
    }
    let missing: Vec<u64> = (at as u64..N).filter(|s| !covered.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "neither delivered nor told: {missing:?}"
    );
    drop((m, group, topic));
    log.close().unwrap();
}

/// As above, with two partitions, and a second member joining right after
/// the first was told of 1's removed records: whoever owns what after the
/// rebalance, the group's committed cut never passes a record no member
/// was handed, and in the end the merge child's and partition 1's records
/// are each delivered.
#[test]
fn a_rebalance_after_a_reported_loss_commits_no_record_unread() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = common::groups::open(root.path(), &clock);
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                ..common::retention::config()
            },
        )
        .unwrap();
    fill(&topic, 0, 5, false);
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    fill(&topic, kids[0], 40, true);
    let merged = topic.merge(kids[0], kids[1]).unwrap();
    fill(&topic, merged, 5, false);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    let other = 1;
    assert!(![kids[0], kids[1], merged].contains(&other));
    fill(&topic, other, 5, false);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut delivered: Vec<(u32, u64)> = Vec::new();
    let mut told = false;
    for _ in 0..5 {
        let got = a.poll(5).unwrap();
        delivered.extend(got.iter().map(|r| (r.partition, r.offset)));
        if !got.is_empty() {
            a.commit().unwrap();
        }
        if !a.retained().is_empty() {
            told = true;
            break;
        }
    }
    assert!(told, "{delivered:?}");
    let mut b = group.join(member_opts()).unwrap();
    for step in 0..40 {
        clock.advance(Duration::from_millis(500));
        for m in [&mut a, &mut b] {
            let got = m.poll(1).unwrap();
            delivered.extend(got.iter().map(|r| (r.partition, r.offset)));
            // What is still to be handed out is past the committed cut.
            let mut r = topic
                .reader(fissionlog::StartAt::Cut(group.committed()))
                .unwrap();
            let mut rest = Vec::new();
            common::tail::drain(&mut r, &mut rest);
            for p in [merged, other] {
                let end = topic.partition(p).unwrap().end_offset();
                for o in 0..end {
                    let seen = delivered.contains(&(p, o));
                    let ahead = rest.iter().any(|r| r.partition == p && r.offset == o);
                    assert!(seen || ahead, "step {step}: {p}:{o} committed unread");
                }
            }
            if step % 3 == 0 {
                m.commit().unwrap();
            }
        }
    }
    for p in [merged, other] {
        for o in 0..5 {
            assert!(delivered.contains(&(p, o)), "{p}:{o} never delivered");
        }
    }
    drop((a, b, group, topic));
    log.close().unwrap();
}
