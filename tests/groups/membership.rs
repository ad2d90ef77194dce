//! Consumer groups in simulated time: a `ManualClock` is injected, members
//! heartbeat by hand (no background thread), and every timeout is crossed
//! by advancing the clock.

use crate::common;

use common::groups::*;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fissionlog::{
    Error, GroupOptions, GroupStart, Log, LogOptions, ManualClock, Member, MemberOptions,
    MemberState, NewRecord, OwnedRecord, SplitPlan, SyncPolicy, TopicConfig,
};

#[test]
fn one_member_reads_everything_and_resumes_exactly_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(4)).unwrap();
    append(&topic, 64, 0, 1000);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert_eq!(m.assignment().partitions.len(), 4);
    let first = m.poll(300).unwrap();
    assert_eq!(first.len(), 300);
    m.commit().unwrap();
    // Handed out after the commit: not committed, delivered again.
    let uncommitted = m.poll(50).unwrap();
    assert_eq!(uncommitted.len(), 50);
    drop(m);
    log.close().unwrap();

    let log = open(dir.path(), &clock);
    let topic = log.topic("t").unwrap();
    assert_eq!(topic.groups(), ["g"]);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    let rest = drain(&mut m);
    assert_eq!(rest.len(), 700, "resumed exactly at the commit");
    let mut all = seqs(&first);
    assert!(seqs(&uncommitted).is_subset(&seqs(&rest)));
    all.extend(seqs(&rest));
    assert_eq!(all, (0..1000).collect());
    let mut in_order = first.clone();
    in_order.extend(rest);
    assert_key_order(&in_order);
    log.close().unwrap();
}

#[test]
fn two_members_share_the_partitions_without_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(4)).unwrap();
    append(&topic, 64, 0, 2000);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    // The newcomer's share is revoked from `a` and moves once `a` commits.
    a.poll(0).unwrap();
    a.commit().unwrap();
    let mut got_a = Vec::new();
    let mut got_b = Vec::new();
    for _ in 0..50 {
        got_a.extend(a.poll(100).unwrap());
        a.commit().unwrap();
        got_b.extend(b.poll(100).unwrap());
        b.commit().unwrap();
    }
    let pa: BTreeSet<u32> = a.assignment().partitions.into_iter().collect();
    let pb: BTreeSet<u32> = b.assignment().partitions.into_iter().collect();
    assert!(pa.is_disjoint(&pb), "{pa:?} and {pb:?}");
    assert_eq!(pa.len() + pb.len(), 4);
    assert_eq!(pa.len(), 2, "balanced by load, idle partitions by count");
    let sa = seqs(&got_a);
    let sb = seqs(&got_b);
    assert!(sa.is_disjoint(&sb), "no record went to both");
    assert_eq!(sa.len() + sb.len(), 2000);
    assert_key_order(&got_a);
    assert_key_order(&got_b);
    let d = group.describe();
    assert_eq!(d.lag_records, 0);
    assert_eq!(d.stats.redelivered, 0);
    log.close().unwrap();
}

#[test]
fn a_dead_member_is_fenced_and_its_partitions_resume_from_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    // 200 records per partition whatever the topic's hash key.
    append_rr(&topic, 0, 400);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    a.commit().unwrap();
    b.poll(0).unwrap();
    assert_eq!(a.assignment().partitions.len(), 1);
    assert_eq!(b.assignment().partitions.len(), 1);
    let a_committed = a.poll(60).unwrap();
    a.commit().unwrap();
    let a_uncommitted = a.poll(40).unwrap();
    assert_eq!(a_uncommitted.len(), 40);
    // `a` stops heartbeating; `b` keeps going.
    for _ in 0..11 {
        clock.advance(Duration::from_secs(1));
        b.heartbeat().unwrap();
    }
    let got_b = drain(&mut b);
    assert_eq!(b.assignment().partitions.len(), 2);
    let d = group.describe();
    assert_eq!(d.stats.dead_detected, 1);
    assert_eq!(d.stats.redelivered, 40);
    assert_eq!(d.members.len(), 1);
    // Everything `a` did not commit came to `b`, nothing it committed.
    let sb = seqs(&got_b);
    assert!(seqs(&a_uncommitted).is_subset(&sb));
    assert!(seqs(&a_committed).is_disjoint(&sb));
    assert_eq!(sb.len() + a_committed.len(), 400);
    // The zombie is refused.
    assert!(matches!(a.poll(10), Err(Error::Fenced { .. })));
    assert!(matches!(a.commit(), Err(Error::Fenced { .. })));
    assert!(matches!(a.heartbeat(), Err(Error::Fenced { .. })));
    log.close().unwrap();
}

#[test]
fn a_stall_shorter_than_the_session_timeout_is_not_death() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let b = group.join(member_opts()).unwrap();
    a.poll(0).unwrap();
    let before = a.assignment().partitions;
    // A GC-like pause of 9.9 s: no heartbeat, while `b` ticks the group.
    for _ in 0..99 {
        clock.advance(Duration::from_millis(100));
        b.heartbeat().unwrap();
    }
    a.heartbeat().unwrap();
    a.poll(0).unwrap();
    assert_eq!(a.assignment().partitions, before);
    assert_eq!(group.describe().stats.dead_detected, 0);
    log.close().unwrap();
}

#[test]
fn a_slow_member_is_relieved_then_revoked_but_never_declared_dead() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(4)).unwrap();
    // Every partition holds 100 records, so which partition relief picks
    // does not depend on the topic's hash key: the most behind, the one
    // `slow` holds records of.
    append_rr(&topic, 0, 400);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut slow = group.join(member_opts()).unwrap();
    let mut fast = group.join(member_opts()).unwrap();
    slow.commit().unwrap();
    fast.poll(0).unwrap();
    assert_eq!(slow.assignment().partitions.len(), 2);
    // `slow` takes records and then only heartbeats.
    let held = slow.poll(20).unwrap();
    assert_eq!(held.len(), 20);
    let mut fast_got = Vec::new();
    for _ in 0..31 {
        clock.advance(Duration::from_secs(1));
        slow.heartbeat().unwrap();
        fast_got.extend(fast.poll(1000).unwrap());
        fast.commit().unwrap();
    }
    let d = group.describe();
    assert_eq!(d.stats.slow_detected, 1);
    assert_eq!(d.stats.dead_detected, 0);
    let slow_desc = d.members.iter().find(|m| m.id == slow.id()).unwrap();
    assert_eq!(slow_desc.state, MemberState::Slow);
    // The relieved partition is still listed while it waits for the
    // records `slow` holds there (if any) to be committed or to time out.
    assert!(!slow_desc.partitions.is_empty());
    let reading = d
        .assignments
        .iter()
        .filter(|a| a.member == Some(slow.id()) && !a.revoking)
        .count();
    assert_eq!(reading, 1, "relieved of half first");
    // Still stuck after another processing timeout: everything moves.
    for _ in 0..31 {
        clock.advance(Duration::from_secs(1));
        slow.heartbeat().unwrap();
        fast_got.extend(fast.poll(1000).unwrap());
        fast.commit().unwrap();
    }
    let d = group.describe();
    assert_eq!(d.stats.dead_detected, 0);
    assert!(
        d.members.iter().any(|m| m.id == slow.id()),
        "still a member"
    );
    assert_eq!(fast.assignment().partitions.len(), 4);
    // The records it held and never committed were delivered again.
    assert!(seqs(&held).is_subset(&seqs(&fast_got)));
    assert_eq!(seqs(&fast_got).len(), 400);
    // Its late commit names partitions it no longer owns, which the group
    // has committed past: nothing to refuse, and nothing moves back.
    let committed = group.committed();
    slow.commit().unwrap();
    assert_eq!(group.committed(), committed);
    // Once it moves again it is active and takes a share again.
    slow.poll(0).unwrap();
    let d = group.describe();
    let slow_desc = d.members.iter().find(|m| m.id == slow.id()).unwrap();
    assert_eq!(slow_desc.state, MemberState::Active);
    log.close().unwrap();
}

#[test]
fn a_static_member_rejoining_within_its_session_gets_its_partitions_back_alone() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(4)).unwrap();
    append(&topic, 64, 0, 200);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(static_opts("a")).unwrap();
    let mut b = group.join(static_opts("b")).unwrap();
    a.commit().unwrap();
    b.poll(0).unwrap();
    let a_parts = a.assignment().partitions;
    let b_parts = b.assignment().partitions;
    let got = a.poll(30).unwrap();
    a.commit().unwrap();
    let rebalances = group.describe().stats.rebalances;
    let old_id = a.id();
    drop(a); // a restart: no leave
    clock.advance(Duration::from_secs(5));
    b.heartbeat().unwrap();
    let mut a2 = group.join(static_opts("a")).unwrap();
    assert_ne!(a2.id(), old_id);
    assert_eq!(a2.assignment().partitions, a_parts);
    b.poll(0).unwrap();
    assert_eq!(b.assignment().partitions, b_parts, "nobody else moved");
    let d = group.describe();
    assert_eq!(d.stats.rebalances, rebalances);
    assert_eq!(d.members.len(), 2);
    let rest = drain(&mut a2);
    assert!(
        seqs(&got).is_disjoint(&seqs(&rest)),
        "resumed at the commit"
    );
    // The old incarnation is fenced.
    log.close().unwrap();
}

#[test]
fn split_children_stay_with_the_parents_owner_until_the_parent_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 64, 0, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    b.poll(0).unwrap();
    a.poll(0).unwrap();
    assert_eq!(a.assignment().partitions, [0]);
    let mut got = a.poll(50).unwrap();
    let children = topic.split(0, SplitPlan::Even).unwrap();
    append(&topic, 64, 100, 100);
    // `a` reads the parent to its seal, then the children, in key order.
    got.extend(drain(&mut a));
    assert_eq!(seqs(&got), (0..200).collect());
    assert_key_order(&got);
    assert!(
        b.poll(100).unwrap().is_empty(),
        "children are pinned to the parent's owner"
    );
    a.commit().unwrap();
    // The parent is committed as read: the children are ready partitions of
    // their own, with `a`, and the balancer may now move one to `b`.
    let a_parts: BTreeSet<u32> = a.assignment().partitions.into_iter().collect();
    a.poll(0).unwrap();
    let now: BTreeSet<u32> = a.assignment().partitions.into_iter().collect();
    assert!(a_parts.contains(&0) || now.is_subset(&children.iter().copied().collect()));
    clock.advance(Duration::from_secs(2));
    group.tick();
    a.commit().unwrap();
    b.poll(0).unwrap();
    a.poll(0).unwrap();
    let pa: BTreeSet<u32> = a.assignment().partitions.into_iter().collect();
    let pb: BTreeSet<u32> = b.assignment().partitions.into_iter().collect();
    assert_eq!(
        pa.union(&pb).copied().collect::<BTreeSet<u32>>(),
        children.iter().copied().collect::<BTreeSet<u32>>()
    );
    assert_eq!(
        pb.len(),
        1,
        "one child moved to the idle member: {pa:?} {pb:?}"
    );
    append(&topic, 64, 200, 100);
    let more_a = drain(&mut a);
    let more_b = drain(&mut b);
    assert!(seqs(&more_a).is_disjoint(&seqs(&more_b)));
    assert_eq!(seqs(&more_a).len() + seqs(&more_b).len(), 100);
    log.close().unwrap();
}

#[test]
fn a_merge_child_goes_to_the_member_that_drains_the_last_parent() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append(&topic, 64, 0, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    a.commit().unwrap();
    b.poll(0).unwrap();
    let pa = a.assignment().partitions;
    let pb = b.assignment().partitions;
    assert_eq!((pa.len(), pb.len()), (1, 1));
    let child = topic.merge(0, 1).unwrap();
    append(&topic, 64, 100, 100);
    let mut got_a = drain(&mut a);
    a.commit().unwrap();
    // `a`'s parent is read, `b`'s not yet: nobody reads the child.
    assert!(drain(&mut a).is_empty());
    let mut got_b = drain(&mut b);
    b.commit().unwrap();
    assert_eq!(b.assignment().partitions, [child]);
    got_b.extend(drain(&mut b));
    got_a.extend(drain(&mut a));
    let sa = seqs(&got_a);
    let sb = seqs(&got_b);
    assert!(sa.is_disjoint(&sb));
    assert_eq!(sa.len() + sb.len(), 200);
    assert_key_order(&got_b);
    // Per key across both: every key's parent records precede its child ones.
    let child_min: BTreeMap<Vec<u8>, u64> =
        got_b
            .iter()
            .filter(|r| r.partition == child)
            .fold(BTreeMap::new(), |mut m, r| {
                m.entry(r.key.clone().unwrap()).or_insert(seq(r));
                m
            });
    for r in got_a.iter().chain(&got_b).filter(|r| r.partition != child) {
        if let Some(&c) = child_min.get(r.key.as_ref().unwrap()) {
            assert!(seq(r) < c);
        }
    }
    log.close().unwrap();
}

#[test]
fn a_joining_member_pauses_only_what_moves() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(6)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    a.commit().unwrap();
    b.poll(0).unwrap();
    a.poll(0).unwrap();
    let (pa, pb) = (a.assignment().partitions, b.assignment().partitions);
    assert_eq!((pa.len(), pb.len()), (3, 3));
    let moves = group.describe().stats.moves;
    let pauses = group.describe().stats.pauses_ms.len();
    let mut c = group.join(member_opts()).unwrap();
    a.commit().unwrap();
    b.commit().unwrap();
    c.poll(0).unwrap();
    a.poll(0).unwrap();
    b.poll(0).unwrap();
    let (na, nb, nc) = (
        a.assignment().partitions,
        b.assignment().partitions,
        c.assignment().partitions,
    );
    assert_eq!(na.len() + nb.len() + nc.len(), 6);
    assert_eq!(nc.len(), 2, "{na:?} {nb:?} {nc:?}");
    // Only moved partitions changed hands; nobody gained one from another
    // survivor.
    assert!(na.iter().all(|p| pa.contains(p)));
    assert!(nb.iter().all(|p| pb.contains(p)));
    let d = group.describe();
    assert_eq!(d.stats.moves - moves, 2);
    // Each moved partition was released at its owner's next commit: no
    // simulated time passed.
    assert_eq!(d.stats.pauses_ms.len() - pauses, 2);
    assert!(
        d.stats.pauses_ms.iter().all(|&p| p == 0.0),
        "{:?}",
        d.stats.pauses_ms
    );
    log.close().unwrap();
}

#[test]
fn commits_are_atomic_and_durable_through_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log
        .topic_or_create(
            "t",
            TopicConfig {
                sync: SyncPolicy::Always,
                ..config(3)
            },
        )
        .unwrap();
    append(&topic, 64, 0, 300);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    let got = m.poll(250).unwrap();
    m.commit().unwrap();
    let committed = group.committed();
    log.abandon();
    let log = open(dir.path(), &clock);
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    assert_eq!(group.committed().positions, committed.positions);
    let mut m = group.join(member_opts()).unwrap();
    let rest = drain(&mut m);
    assert!(seqs(&got).is_disjoint(&seqs(&rest)));
    assert_eq!(got.len() + rest.len(), 300);
    log.close().unwrap();
}

#[test]
fn a_group_created_latest_reads_only_new_records() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append(&topic, 64, 0, 50);
    let group = topic
        .group(
            "g",
            GroupOptions {
                start: GroupStart::Latest,
                ..GroupOptions::default()
            },
        )
        .unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert!(m.poll(100).unwrap().is_empty());
    append(&topic, 64, 50, 10);
    assert_eq!(seqs(&drain(&mut m)), (50..60).collect());
    log.close().unwrap();
}

#[test]
fn bad_group_input_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    assert!(matches!(
        topic.group("bad/name", GroupOptions::default()),
        Err(Error::InvalidConfig(_))
    ));
    assert!(topic.groups().is_empty());
    // A group that may move nothing by load would never balance.
    assert!(matches!(
        topic.group(
            "g",
            GroupOptions {
                max_moves_per_balancing: 0,
                ..GroupOptions::default()
            }
        ),
        Err(Error::InvalidConfig(_))
    ));
    assert!(topic.groups().is_empty());
    let group = topic.group("g", GroupOptions::default()).unwrap();
    assert!(matches!(
        group.join(MemberOptions {
            session_timeout: Duration::ZERO,
            ..member_opts()
        }),
        Err(Error::InvalidDuration {
            option: "session_timeout",
            ..
        })
    ));
    let mut m = group.join(member_opts()).unwrap();
    assert!(matches!(
        m.commit_positions(&[(7, 0)]),
        Err(Error::NotAssigned { partition: 7, .. })
    ));
    assert!(matches!(
        m.commit_positions(&[(0, 5)]),
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        topic.delete_group("nope"),
        Err(Error::UnknownGroup(_))
    ));
    topic.delete_group("g").unwrap();
    assert!(topic.groups().is_empty());
    assert!(matches!(m.poll(1), Err(Error::Fenced { .. })));
    log.close().unwrap();
}

#[test]
fn a_committed_position_past_what_a_power_loss_kept_is_reported_and_rewound() {
    use common::crash::DirImage;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 64, 0, 100);
    log.sync().unwrap();
    let durable = DirImage::capture(dir.path()).unwrap();
    // Appended, read and committed by the group, never synced.
    append(&topic, 64, 100, 50);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut m).len(), 150);
    m.commit().unwrap();
    let current = DirImage::capture(dir.path()).unwrap();
    drop(m);
    log.abandon();
    // The power loss keeps the synced data and the (fsynced) manifest.
    let mut image = durable.clone();
    for (path, bytes) in &current.files {
        if path.to_string_lossy().starts_with("manifest") {
            image.insert_file(path.clone(), bytes.clone());
        }
    }
    let lost_dir = tempfile::tempdir().unwrap();
    image.write_to(lost_dir.path()).unwrap();

    let log = open(lost_dir.path(), &clock);
    let lost = &log.recovery_report().group_positions_lost;
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!((lost[0].committed, lost[0].end), (150, 100));
    assert_eq!(lost[0].group, "g");
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    assert_eq!(group.committed().positions[&0], 100);
    // New appends reuse offsets 100..; the group reads them all.
    append(&topic, 64, 1000, 10);
    let mut m = group.join(member_opts()).unwrap();
    let got = drain(&mut m);
    assert_eq!(seqs(&got), (1000..1010).collect());
    drop(m);
    log.close().unwrap();
    // Reported once: the rewind is durable.
    let log = open(lost_dir.path(), &clock);
    assert!(log.recovery_report().group_positions_lost.is_empty());
    log.close().unwrap();
}

#[test]
fn groups_survive_manifest_compaction_and_a_deleted_topic_takes_them() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let opts = LogOptions {
        manifest_compact_records: 3,
        ..options(&clock)
    };
    let log = Log::open(dir.path(), opts.clone()).unwrap();
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append(&topic, 64, 0, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    let mut got = Vec::new();
    for _ in 0..10 {
        got.extend(m.poll(7).unwrap());
        m.commit().unwrap();
    }
    let committed = group.committed();
    drop(m);
    log.close().unwrap();
    let log = Log::open(dir.path(), opts.clone()).unwrap();
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    assert_eq!(group.committed(), committed);
    let mut m = group.join(member_opts()).unwrap();
    let rest = drain(&mut m);
    assert_eq!(got.len() + rest.len(), 100);
    drop(m);
    log.delete_topic("t").unwrap();
    let topic = log.topic_or_create("t", config(2)).unwrap();
    assert!(topic.groups().is_empty());
    log.close().unwrap();
}

#[test]
fn empty_sealed_parents_do_not_hold_back_a_merge_child() {
    // A consumer that commits only after records: the parents of a merge
    // are read to their (empty) seals, which the member commits by itself.
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert!(m.poll(10).unwrap().is_empty());
    let child = topic.merge(0, 1).unwrap();
    append(&topic, 64, 0, 20);
    let got = drain(&mut m);
    assert_eq!(seqs(&got), (0..20).collect());
    assert_eq!(m.assignment().partitions, [child]);
    log.close().unwrap();
}

#[test]
fn members_racing_rebalances_never_get_a_record_twice_outside_a_counted_window() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    // Real threads and the system clock: four members poll and commit
    // while a fifth joins and leaves over and over, so partitions keep
    // moving between members in the middle of their polls.
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(
        dir.path(),
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )
    .unwrap();
    let topic = log.topic_or_create("t", config(8)).unwrap();
    let total = 12_000u64;
    append(&topic, 64, 0, total);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let seen: Mutex<BTreeMap<u64, u32>> = Mutex::new(BTreeMap::new());
    let record = |got: &[OwnedRecord]| {
        let mut seen = seen.lock().unwrap();
        for r in got {
            *seen.entry(seq(r)).or_default() += 1;
        }
    };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let mut m = group.join(member_opts()).unwrap();
                while !stop.load(Ordering::Acquire) {
                    record(&m.poll(97).unwrap());
                    match m.commit() {
                        Ok(()) | Err(Error::NotAssigned { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                m.leave().unwrap();
            });
        }
        s.spawn(|| {
            // Bounded: a record never delivered fails the test below
            // instead of hanging it.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while seen.lock().unwrap().len() < total as usize
                && std::time::Instant::now() < deadline
            {
                let mut m = group.join(member_opts()).unwrap();
                record(&m.poll(13).unwrap());
                let _ = m.commit();
                m.leave().unwrap();
            }
            stop.store(true, Ordering::Release);
        });
    });
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len() as u64, total);
    let again: u64 = seen.values().map(|&n| u64::from(n - 1)).sum();
    let d = group.describe();
    assert!(
        d.stats.moves > 10,
        "partitions moved {} times",
        d.stats.moves
    );
    assert!(
        again <= d.stats.redelivered,
        "{again} records delivered again, {} counted as an uncommitted window",
        d.stats.redelivered
    );
    log.close().unwrap();
}

#[test]
fn a_partition_given_back_is_read_from_the_committed_position_not_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append(&topic, 64, 0, 400);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut got_a = a.poll(10_000).unwrap();
    a.commit().unwrap();
    assert_eq!(got_a.len(), 400);
    append(&topic, 64, 400, 400);
    // `b` joins: one partition moves to it at once (`a` has nothing
    // uncommitted). `b` reads it, commits, and leaves before `a` polls
    // again: the partition goes back to `a`.
    let mut b = group.join(member_opts()).unwrap();
    let got_b = drain(&mut b);
    b.commit().unwrap();
    assert!(!got_b.is_empty());
    b.leave().unwrap();
    got_a.extend(drain(&mut a));
    let sa = seqs(&got_a);
    let sb = seqs(&got_b);
    assert!(sa.is_disjoint(&sb), "a read again what b had committed");
    assert_eq!(sa.len() + sb.len(), 800);
    log.close().unwrap();
}

#[test]
fn a_member_past_its_session_timeout_cannot_commit_even_if_nothing_else_ran() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 64, 0, 10);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(a.poll(5).unwrap().len(), 5);
    // Nobody calls the group for longer than the session timeout.
    clock.advance(SESSION + Duration::from_secs(1));
    assert!(matches!(a.commit(), Err(Error::Fenced { .. })));
    assert!(group.committed().positions.is_empty());
    log.close().unwrap();
}

#[test]
fn a_partition_that_alone_outruns_its_member_is_split_and_shared() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    a.poll(0).unwrap();
    b.poll(0).unwrap();
    let (owner, idle) = if a.assignment().partitions.is_empty() {
        (&mut b, &mut a)
    } else {
        (&mut a, &mut b)
    };
    // 2,000 records/s arrive; the owner handles 200 per second.
    let mut next = 0;
    let mut got = Vec::new();
    for _ in 0..6 {
        append(&topic, 64, next, 2000);
        next += 2000;
        clock.advance(Duration::from_secs(1));
        got.extend(owner.poll(200).unwrap());
        owner.commit().unwrap();
        assert!(idle.poll(100).unwrap().is_empty());
    }
    let d = group.describe();
    assert_eq!(d.stats.lag_splits, 1, "{:?}", d.stats);
    assert_eq!(topic.active_partitions().len(), 2);
    // The owner reads the parent to its seal, then the children; once the
    // parent is committed, one child moves to the idle member.
    loop {
        let more = owner.poll(5000).unwrap();
        if more.is_empty() {
            break;
        }
        got.extend(more);
        owner.commit().unwrap();
    }
    clock.advance(Duration::from_secs(2));
    group.tick();
    owner.commit().unwrap();
    got.extend(idle.poll(5000).unwrap());
    assert_eq!(idle.assignment().partitions.len(), 1);
    assert_eq!(owner.assignment().partitions.len(), 1);
    append(&topic, 64, next, 1000);
    got.extend(drain(owner));
    got.extend(drain(idle));
    assert_eq!(seqs(&got), (0..next + 1000).collect());
    assert_eq!(got.len() as u64, next + 1000, "no record twice");
    // Within the cooldown nothing else is split.
    assert_eq!(group.describe().stats.lag_splits, 1);
    log.close().unwrap();
}

#[test]
fn a_lagging_partition_under_the_merge_floor_is_not_split() {
    // With a target, a partition appending under merge_fraction × target
    // would be merged back by the write-side balancer: the group relieves
    // the member instead of splitting.
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let mut cfg = config(1);
    cfg.balance.target_records_per_sec = Some(1_000_000.0);
    let topic = log.topic_or_create("t", cfg).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    a.poll(0).unwrap();
    b.poll(0).unwrap();
    let owner = if a.assignment().partitions.is_empty() {
        &mut b
    } else {
        &mut a
    };
    let mut next = 0;
    for _ in 0..6 {
        append(&topic, 64, next, 2000);
        next += 2000;
        clock.advance(Duration::from_secs(1));
        owner.poll(200).unwrap();
        owner.commit().unwrap();
    }
    assert_eq!(group.describe().stats.lag_splits, 0);
    assert_eq!(topic.active_partitions().len(), 1);
    log.close().unwrap();
}

/// 2^64 ns plus 0.29 s: a timeout that a cast to `u64` nanoseconds keeps
/// only the 0.29 s of.
const PAST_U64_NANOS: Duration = Duration::from_secs(18_446_744_074);

/// Advances the clock in 100 ms steps for `secs` seconds, ticking the
/// group after each step (past the 1 s rebalance interval, the 0.29 s a
/// truncated timeout would leave, and every default check).
fn tick_for(clock: &ManualClock, group: &fissionlog::Group, secs: u64) {
    for _ in 0..secs * 10 {
        clock.advance(Duration::from_millis(100));
        group.tick();
    }
}

#[test]
fn a_session_timeout_past_u64_nanoseconds_never_declares_the_member_dead() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    for session_timeout in [PAST_U64_NANOS, Duration::MAX] {
        let mut m = group
            .join(MemberOptions {
                session_timeout,
                ..member_opts()
            })
            .unwrap();
        m.poll(0).unwrap();
        // No heartbeat for 3 s, progress within its processing timeout.
        tick_for(&clock, &group, 3);
        let d = group.describe();
        assert_eq!(d.stats.dead_detected, 0, "{session_timeout:?}: {d:?}");
        assert!(d.members.iter().any(|x| x.id == m.id()));
        m.poll(0).unwrap();
        m.heartbeat().unwrap();
        m.leave().unwrap();
    }
    log.close().unwrap();
}

#[test]
fn a_processing_timeout_past_u64_nanoseconds_never_makes_the_member_slow() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append_rr(&topic, 0, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    for processing_timeout in [PAST_U64_NANOS, Duration::MAX] {
        let m = group
            .join(MemberOptions {
                processing_timeout,
                ..member_opts()
            })
            .unwrap();
        // Heartbeats for 3 s and never polls.
        for _ in 0..30 {
            clock.advance(Duration::from_millis(100));
            m.heartbeat().unwrap();
        }
        let d = group.describe();
        assert_eq!(d.stats.slow_detected, 0, "{processing_timeout:?}: {d:?}");
        let me = d.members.iter().find(|x| x.id == m.id()).unwrap();
        assert_eq!(me.state, MemberState::Active);
        assert_eq!(me.partitions.len(), 2);
        m.leave().unwrap();
    }
    log.close().unwrap();
}

#[test]
fn a_revocation_waits_for_an_owner_whose_processing_timeout_is_past_u64_nanoseconds() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append_rr(&topic, 0, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group
        .join(MemberOptions {
            processing_timeout: PAST_U64_NANOS,
            ..member_opts()
        })
        .unwrap();
    let held = a.poll(100).unwrap();
    assert!(!held.is_empty());
    // `b`'s share is revoked from `a`, which holds records there and
    // heartbeats without committing: what is revoked waits for it.
    let b = group.join(member_opts()).unwrap();
    for _ in 0..30 {
        clock.advance(Duration::from_millis(100));
        a.heartbeat().unwrap();
        b.heartbeat().unwrap();
    }
    let d = group.describe();
    let revoking: Vec<_> = d.assignments.iter().filter(|x| x.revoking).collect();
    assert!(!revoking.is_empty(), "{d:?}");
    assert!(revoking.iter().all(|x| x.member == Some(a.id())), "{d:?}");
    assert_eq!(d.stats.redelivered, 0);
    log.close().unwrap();
}

#[test]
fn a_move_cooldown_of_duration_max_relieves_a_lagging_member_without_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(4)).unwrap();
    let options = GroupOptions {
        move_cooldown: Duration::MAX,
        split_lagging: false,
        ..GroupOptions::default()
    };
    let group = topic.group("g", options).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    a.poll(0).unwrap();
    a.commit().unwrap();
    b.poll(0).unwrap();
    let lagging = a.assignment().partitions;
    assert_eq!(lagging.len(), 2);
    // `a`'s partitions fill faster than it reads (it only heartbeats); `b`
    // keeps up.
    let value = [0u8; 16];
    let batch: Vec<fissionlog::NewRecord<'_>> = (0..500)
        .map(|_| fissionlog::NewRecord {
            key: None,
            value: &value,
            timestamp: None,
        })
        .collect();
    for _ in 0..4 {
        for &p in &lagging {
            topic.append_to(p, &batch).unwrap();
        }
        clock.advance(Duration::from_millis(1100));
        a.heartbeat().unwrap();
        drain(&mut b);
        b.commit().unwrap();
    }
    let d = group.describe();
    assert!(d.stats.lag_relieved >= 1, "{d:?}");
    log.close().unwrap();
}

#[test]
fn a_zero_background_heartbeat_interval_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let refused = group.join(MemberOptions {
        background_heartbeat: Some(Duration::ZERO),
        ..member_opts()
    });
    assert!(
        matches!(
            refused,
            Err(Error::InvalidDuration {
                option: "background_heartbeat",
                ..
            })
        ),
        "{:?}",
        refused.map(|m| m.id())
    );
    assert!(group.describe().members.is_empty());
    let m = group
        .join(MemberOptions {
            background_heartbeat: Some(Duration::from_nanos(1_000_000)),
            ..member_opts()
        })
        .unwrap();
    m.leave().unwrap();
    log.close().unwrap();
}

/// What one join cost: balancings until the counts were within one,
/// partitions moved, and the pauses (most partitions one member had
/// revoked and not yet handed over after a balancing; balancings after
/// which any was still revoked once every member had its turn).
#[derive(Debug)]
struct JoinCost {
    members: usize,
    balancings: usize,
    moved: u64,
    most_paused: usize,
    paused_past_a_round: usize,
}

/// `joins` members join one after another a group of `partitions`
/// partitions of equal load (four records each, appended before the group
/// exists, so every append rate is zero). After each join the counts must
/// be within one after at most ceil(ceil(partitions / members) /
/// MOVES_PER_BALANCING) balancings, the join's own included: a join of the
/// n-th member to a group within one needs at most ceil(partitions / n)
/// moves (what the newcomer ends with), and every balancing revokes up to
/// MOVES_PER_BALANCING of them. Then a further round moves nothing (no
/// churn), and the join moved at most the newcomer's fair share.
fn spread_as_members_join(partitions: u32, joins: usize) -> Vec<JoinCost> {
    #[allow(non_snake_case)]
    let MOVES_PER_BALANCING = GroupOptions::default().max_moves_per_balancing;
    // Thousands of commits, each a manifest fsync: cheap on a RAM disk.
    let dir = common::log::fast_tempdir();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(partitions)).unwrap();
    append_rr(&topic, 0, 4 * u64::from(partitions));
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut rounds = Rounds::new(&clock, &group);
    // Members hold records of most of their partitions uncommitted at
    // every balancing: a revoked partition waits for its owner's commit.
    rounds.poll_per_turn = partitions as usize;
    let mut costs = Vec::new();
    for n in 1..=joins {
        let share = (partitions as usize).div_ceil(n);
        let bound = share.div_ceil(MOVES_PER_BALANCING);
        let mut reports = vec![rounds.join()];
        while !within_one(&rounds.counts()) {
            assert!(
                reports.len() < bound,
                "{partitions} partitions, {n} members: not within one after {} balancings: {:?}",
                reports.len(),
                rounds.counts()
            );
            reports.push(rounds.round());
        }
        let cost = JoinCost {
            members: n,
            balancings: reports.len(),
            moved: reports.iter().map(|r| r.moved).sum(),
            most_paused: reports
                .iter()
                .flat_map(|r| r.paused.iter().copied())
                .max()
                .unwrap_or(0),
            paused_past_a_round: reports.iter().filter(|r| r.paused_after_turns > 0).count(),
        };
        if n > 1 {
            assert!(
                cost.moved as usize <= share,
                "{partitions} partitions, {n} members: moved {} for a share of {share}",
                cost.moved
            );
        }
        assert!(cost.balancings <= bound.max(1), "{cost:?}");
        assert!(cost.most_paused <= MOVES_PER_BALANCING, "{cost:?}");
        assert_eq!(cost.paused_past_a_round, 0, "{cost:?}");
        // One more record in every partition, polled in this round and
        // held uncommitted at the next join's balancing.
        append_rr(&topic, 0, u64::from(partitions));
        let again = rounds.round();
        assert_eq!(
            (again.moved, again.paused.iter().sum::<usize>()),
            (0, 0),
            "{partitions} partitions, {n} members: a balanced group moved partitions: {:?}",
            rounds.counts()
        );
        costs.push(cost);
    }
    drop(rounds);
    log.close().unwrap();
    costs
}

#[test]
fn a_thousand_partitions_spread_to_within_one_as_a_hundred_members_join_one_by_one() {
    let costs = spread_as_members_join(1000, 100);
    for c in costs
        .iter()
        .filter(|c| [1, 2, 10, 100].contains(&c.members))
    {
        eprintln!("{c:?}");
    }
    // The first member takes everything without a move.
    assert_eq!(costs[0].moved, 0);
    assert_eq!(costs[1].moved, 500);
    assert_eq!(costs[9].moved, 100);
    assert_eq!(costs[99].moved, 10);
}

#[test]
fn forty_and_a_hundred_partitions_spread_to_within_one_over_two_and_four_members() {
    for partitions in [40, 100] {
        let costs = spread_as_members_join(partitions, 4);
        let share = |n: u32| u64::from(partitions / n);
        assert_eq!(costs[1].moved, share(2));
        assert_eq!(costs[3].moved, share(4), "{costs:?}");
    }
}

/// Records appended to each hot partition per simulated second.
const HOT_RATE: u64 = 20;

#[test]
fn unequal_loads_balance_to_within_one_partition_and_the_stated_tolerance() {
    // 40 partitions, 4 of them taking HOT_RATE records a second, 4 members.
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(40)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut rounds = Rounds::new(&clock, &group);
    rounds.poll_per_turn = 10_000;
    let mut seq = 0u64;
    rounds.before_balancing = Box::new(|| {
        for p in [3, 11, 22, 37] {
            let values: Vec<String> = (seq..seq + HOT_RATE).map(|i| format!("h:{i}")).collect();
            seq += HOT_RATE;
            let records: Vec<NewRecord<'_>> = values
                .iter()
                .map(|v| NewRecord {
                    key: None,
                    value: v.as_bytes(),
                    timestamp: None,
                })
                .collect();
            topic.append_to(p, &records).unwrap();
        }
    });
    for _ in 0..4 {
        rounds.join();
        rounds.round();
    }
    // The rates settle (time constant 2 s) and moves by load wait out
    // their cooldown (10 s) before a partition moves again.
    for _ in 0..40 {
        rounds.round();
    }
    let quiet: Vec<RoundReport> = (0..10).map(|_| rounds.round()).collect();
    let loads = rounds.loads();
    let (busiest, lightest_there) = loads
        .iter()
        .copied()
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap();
    let least = loads.iter().map(|l| l.0).fold(f64::INFINITY, f64::min);
    let total: f64 = loads.iter().map(|l| l.0).sum();
    // The stated tolerance: the busiest member is over the least loaded
    // by at most one of its partitions plus half a mean partition.
    let slack = 0.5 * total / 40.0;
    assert!(
        busiest - least <= lightest_there + slack,
        "loads {loads:?}: {busiest} against {least}, tolerance {lightest_there} + {slack}"
    );
    // Each member has one hot partition: the best split.
    assert!(
        busiest - least < 2.0,
        "loads {loads:?}, counts {:?}",
        rounds.counts()
    );
    assert!(
        quiet.iter().all(|r| r.moved == 0),
        "a balanced group moved partitions: {quiet:?}"
    );
    drop(rounds);
    log.close().unwrap();
}

/// Members polling and committing in their own threads, leaving and
/// joining again in bursts, while the main thread appends, splits, tail
/// splits and merges under them and ticks the coordinator: every record
/// is delivered, one more time only when the group counts it as
/// redelivered, and per key in order to each member.
#[test]
fn members_in_threads_beside_splits_tail_splits_and_merges_get_every_record_once() {
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    let seed: u64 = std::env::var("FISSIONLOG_GROUP_THREAD_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    eprintln!("seed {seed}");
    let dir = common::log::fast_tempdir();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // (member, seq, key) per delivery.
    let seen = Arc::new(Mutex::new(Vec::<(u64, u64, u64)>::new()));
    // Polls made: the main thread's operations wait for the members'.
    let polls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let (group, stop, seen) = (group.clone(), stop.clone(), seen.clone());
            let polls = polls.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (t + 1));
                while !stop.load(Ordering::SeqCst) {
                    // Fenced: joined, then the main thread's clock passed
                    // the session timeout before the join's first sync.
                    let mut m = match group.join(member_opts()) {
                        Ok(m) => m,
                        Err(Error::Fenced { .. }) => continue,
                        Err(e) => panic!("join: {e}"),
                    };
                    for _ in 0..rng.random_range(1..40) {
                        // Fenced: the main thread's clock passed this
                        // member's session timeout before it ran.
                        let Ok(got) = m.poll(rng.random_range(1..30)) else {
                            break;
                        };
                        polls.fetch_add(1, Ordering::SeqCst);
                        {
                            let mut s = seen.lock().unwrap();
                            for r in &got {
                                let v = std::str::from_utf8(&r.value).unwrap();
                                let (k, q) = v.split_once(':').unwrap();
                                s.push((m.id(), q.parse().unwrap(), k[1..].parse().unwrap()));
                            }
                        }
                        match m.commit() {
                            Ok(()) | Err(Error::Fenced { .. }) => {}
                            Err(e) => panic!("commit: {e}"),
                        }
                        std::thread::yield_now();
                    }
                    let _ = m.leave();
                }
            })
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut appended = 0u64;
    for step in 0..600u64 {
        let waited = std::time::Instant::now();
        while polls.load(Ordering::SeqCst) < step * 2 && waited.elapsed() < Duration::from_secs(2) {
            std::thread::yield_now();
        }
        let n = rng.random_range(1..40);
        append(&topic, 8, appended, n);
        appended += n;
        let active = topic.active_partitions();
        let p = active[rng.random_range(0..active.len())];
        match rng.random_range(0..6) {
            0 if active.len() < 8 => {
                let _ = topic.split(p, SplitPlan::Even);
            }
            1 | 2 if active.len() < 8 => {
                let end = topic.partition(p).unwrap().end_offset();
                let back = rng.random_range(0..30);
                let _ = topic.split_tail(
                    p,
                    SplitPlan::Even,
                    fissionlog::TailSplitOptions::from_offset(end.saturating_sub(back)),
                );
            }
            3 => {
                let mut parts = topic.partitions();
                parts.retain(|p| p.sealed_at.is_none());
                parts.sort_by_key(|p| p.start);
                if parts.len() >= 2 {
                    let j = rng.random_range(0..parts.len() - 1);
                    let _ = topic.merge(parts[j].id, parts[j + 1].id);
                }
            }
            _ => {
                clock.advance(Duration::from_millis(200));
                group.tick();
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let mut last = group.join(member_opts()).unwrap();
    for r in drain_committing(&mut last) {
        let v = std::str::from_utf8(&r.value).unwrap();
        let (k, q) = v.split_once(':').unwrap();
        seen.lock()
            .unwrap()
            .push((last.id(), q.parse().unwrap(), k[1..].parse().unwrap()));
    }
    let seen = seen.lock().unwrap();
    let mut count: BTreeMap<u64, u32> = BTreeMap::new();
    let mut order: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for &(m, q, k) in seen.iter() {
        let n = count.entry(q).or_default();
        *n += 1;
        if *n == 1 {
            if let Some(prev) = order.insert((m, k), q) {
                assert!(
                    q > prev,
                    "seed {seed}: member {m} key {k}: {q} after {prev}"
                );
            }
        }
    }
    let missing: Vec<u64> = (0..appended).filter(|q| !count.contains_key(q)).collect();
    assert!(
        missing.is_empty(),
        "seed {seed}: {} records never delivered, from {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let again: u64 = count.values().map(|&n| u64::from(n - 1)).sum();
    let twice: Vec<_> = count.iter().filter(|(_, &n)| n > 1).take(10).collect();
    assert!(
        again <= group.describe().stats.redelivered,
        "seed {seed}: {again} deliveries again, {} counted: {twice:?}",
        group.describe().stats.redelivered
    );
}

/// Polls and commits until a poll returns nothing (a merge child is read
/// once both parents are committed as read).
fn drain_committing(m: &mut Member) -> Vec<OwnedRecord> {
    let mut out = Vec::new();
    loop {
        let got = m.poll(1000).unwrap();
        m.commit().unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend(got);
    }
}

/// Balancing rounds by load while the topology changes under the group
/// (hot partitions split forward, tail-split, merged) and members join and
/// leave: after every round no partition is read by two members, each
/// reads only what the coordinator gives it, and the group ends with no
/// lag and nothing delivered again.
#[test]
fn balancing_rounds_beside_splits_tail_splits_merges_and_member_churn_keep_c9() {
    use rand::{Rng, SeedableRng};
    use std::cell::RefCell;
    let seed: u64 = std::env::var("FISSIONLOG_GROUP_ROUNDS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(11);
    eprintln!("seed {seed}");
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(6)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let rng = RefCell::new(rand::rngs::StdRng::seed_from_u64(seed));
    let mut rounds = Rounds::new(&clock, &group);
    rounds.poll_per_turn = 40;
    rounds.topic = Some(&topic);
    let seq = std::cell::Cell::new(0u64);
    rounds.before_balancing = Box::new(|| {
        let mut rng = rng.borrow_mut();
        let active = topic.active_partitions();
        // A few hot partitions, the rest idle.
        for &p in active.iter().take(3) {
            let from = seq.get();
            let values: Vec<String> = (from..from + 15).map(|i| format!("h:{i}")).collect();
            seq.set(from + 15);
            let records: Vec<NewRecord<'_>> = values
                .iter()
                .map(|v| NewRecord {
                    key: None,
                    value: v.as_bytes(),
                    timestamp: None,
                })
                .collect();
            topic.append_to(p, &records).unwrap();
        }
        let p = active[rng.random_range(0..active.len())];
        match rng.random_range(0..8) {
            0 if active.len() < 12 => {
                let _ = topic.split(p, SplitPlan::Even);
            }
            1 if active.len() < 12 => {
                let end = topic.partition(p).unwrap().end_offset();
                let back = rng.random_range(0..60);
                let _ = topic.split_tail(
                    p,
                    SplitPlan::Even,
                    fissionlog::TailSplitOptions::from_offset(end.saturating_sub(back)),
                );
            }
            2 => {
                let mut parts = topic.partitions();
                parts.retain(|p| p.sealed_at.is_none());
                parts.sort_by_key(|p| p.start);
                if parts.len() >= 2 {
                    let j = rng.random_range(0..parts.len() - 1);
                    let _ = topic.merge(parts[j].id, parts[j + 1].id);
                }
            }
            _ => {}
        }
    });
    for _ in 0..3 {
        rounds.join();
    }
    let mut churn = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    for _ in 0..80 {
        rounds.round();
        match churn.random_range(0..10) {
            0 if rounds.members.len() < 5 => {
                rounds.join();
            }
            1 if rounds.members.len() > 1 => {
                let i = churn.random_range(0..rounds.members.len());
                let mut m = rounds.members.remove(i);
                m.commit().unwrap();
                m.leave().unwrap();
            }
            _ => {}
        }
    }
    rounds.before_balancing = Box::new(|| {});
    for _ in 0..60 {
        rounds.round();
    }
    let d = group.describe();
    assert_eq!(d.lag_records, 0, "seed {seed}: {d:?}");
    assert_eq!(d.stats.redelivered, 0, "seed {seed}");
    let twice: Vec<_> = rounds
        .polled_values
        .iter()
        .filter(|(_, &n)| n > 1)
        .take(5)
        .collect();
    assert!(twice.is_empty(), "seed {seed}: polled twice: {twice:?}");
    assert_eq!(
        rounds.polled_values.len() as u64,
        seq.get(),
        "seed {seed}: every record polled"
    );
    assert!(d.stats.moves > 0, "seed {seed}: nothing moved");
    drop(rounds);
    log.close().unwrap();
}

/// A partition revoked from a member that has handed out records there and
/// not committed them waits for its commit, also when tail splits move
/// those records into children meanwhile: the new owner does not get them
/// while the old owner lives.
#[test]
fn a_revocation_waits_for_the_owners_commit_across_tail_splits() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let options = LogOptions {
        topic_hash_seed: Some(1),
        ..common::groups::options(&clock)
    };
    let log = Log::open(dir.path(), options).unwrap();
    let topic = log.topic_or_create("t", config(2)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    append(&topic, 12, 0, 13);
    assert_eq!(a.poll(23).unwrap().len(), 13);
    a.commit().unwrap();
    append(&topic, 12, 13, 9);
    let held = seqs(&a.poll(9).unwrap());
    assert_eq!(held.len(), 9);
    let mut b = group.join(member_opts()).unwrap();
    // One of A's two partitions is revoked toward B: it waits for A's
    // commit of what A handed out there.
    assert_eq!(
        group
            .describe()
            .assignments
            .iter()
            .filter(|x| x.revoking)
            .count(),
        1
    );
    let first = topic.active_partitions()[0];
    let end = topic.partition(first).unwrap().end_offset();
    // The uncommitted records move into the children, then one child is
    // moved whole into grandchildren.
    topic
        .split_tail(
            first,
            SplitPlan::Even,
            fissionlog::TailSplitOptions::from_offset(end.saturating_sub(11)),
        )
        .unwrap();
    let second = topic.active_partitions()[0];
    topic
        .split_tail(
            second,
            SplitPlan::Even,
            fissionlog::TailSplitOptions {
                from: fissionlog::TailFrom::SlowestGroup,
                throttle_bytes_per_sec: 0,
            },
        )
        .unwrap();
    clock.advance(Duration::from_secs(3));
    group.tick();
    let got = seqs(&b.poll(39).unwrap());
    let twice: Vec<&u64> = got.intersection(&held).collect();
    assert!(
        twice.is_empty(),
        "records {twice:?} went to a second live member before the first committed them"
    );
    // Once A commits, B gets the rest, and nothing went to both.
    a.commit().unwrap();
    let mut all = got;
    for _ in 0..3 {
        clock.advance(Duration::from_secs(1));
        group.tick();
        all.extend(seqs(&drain_committing(&mut b)));
        all.extend(seqs(&drain_committing(&mut a)));
    }
    assert_eq!(group.describe().lag_records, 0);
    assert_eq!(group.describe().stats.redelivered, 0);
}
