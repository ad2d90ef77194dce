//! Consumer-group edge cases in simulated time: ownership handed back to a
//! member that never saw it leave, stale group handles after a delete,
//! retention and recovery under committed positions, odd commit inputs,
//! manifest compaction and format upgrade with group records.

use crate::common;

use common::crash::SplitMix64;
use common::groups::*;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fissionlog::{
    Error, GroupOptions, GroupStart, Log, LogOptions, ManualClock, Member, MemberOptions,
    NewRecord, OwnedRecord, SplitPlan, TopicConfig,
};

/// A member stuck long enough to lose its partition, which then comes back
/// to it after another member read and committed further, resumes at the
/// group's committed position: not at the position it had reached in its
/// earlier ownership (that would deliver again records the group
/// committed, outside any uncommitted window).
#[test]
fn a_partition_handed_back_to_a_stuck_member_resumes_at_the_committed_position() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 4, 0, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let first_a = a.poll(60).unwrap();
    assert_eq!(seqs(&first_a), (0..60).collect());
    let mut b = group.join(member_opts()).unwrap();
    b.poll(0).unwrap();
    assert_eq!(a.assignment().partitions, [0]);
    // `a` heartbeats but makes no progress: slow, then stuck; its
    // partition moves to `b`.
    pass(
        &clock,
        PROCESSING * 2 + Duration::from_secs(4),
        &[&a],
        &mut [&mut b],
    );
    assert_eq!(b.assignment().partitions, [0], "moved to the live reader");
    let got_b = b.poll(90).unwrap();
    assert_eq!(seqs(&got_b), (0..90).collect(), "from the committed 0");
    b.commit().unwrap();
    assert_eq!(group.committed().positions.get(&0), Some(&90));
    // `b` leaves: the partition goes back to `a`, the only member.
    b.leave().unwrap();
    let again = drain(&mut a);
    assert_eq!(a.assignment().partitions, [0]);
    let s = seqs(&again);
    assert!(
        s.iter().all(|&x| x >= 90),
        "records 60..90 were committed by the group; redelivered: {:?}",
        s.iter().filter(|&&x| x < 90).collect::<Vec<_>>()
    );
    assert_eq!(s, (90..100).collect());
    log.close().unwrap();
}

/// A `Group` handle taken before `delete_group` must not bring the group
/// back: a member joining through it reads every partition beside the
/// members of the group created again under the same name (two live owners
/// of partition 0), and its commit writes the deleted group back into the
/// manifest.
#[test]
fn a_stale_group_handle_after_delete_does_not_double_own() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 4, 0, 10);
    let stale = topic.group("g", GroupOptions::default()).unwrap();
    topic.delete_group("g").unwrap();
    assert!(topic.groups().is_empty());
    let fresh = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = fresh.join(member_opts()).unwrap();
    assert_eq!(seqs(&m.poll(100).unwrap()), (0..10).collect());
    let zombie = stale.join(member_opts()).and_then(|mut z| {
        let got = z.poll(100)?;
        Ok((z, got))
    });
    if let Ok((mut z, got)) = zombie {
        assert!(
            got.is_empty(),
            "a member joined through the deleted group's handle reads partition 0 \
             beside the new group's member: {} records",
            got.len()
        );
        let _ = z.commit();
    }
    m.commit().unwrap();
    topic.delete_group("g").unwrap();
    assert!(
        topic.groups().is_empty(),
        "the deleted group came back: {:?}",
        topic.groups()
    );
    log.close().unwrap();
}

/// Retention removes a sealed parent a member is reading and has not
/// committed: the member's next commit (of the parent's children it read
/// past) is not refused, and the group goes on from the children.
#[test]
fn retention_removing_a_parent_under_a_member_keeps_its_commits_working() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log
        .topic_or_create(
            "t",
            TopicConfig {
                segment_bytes: 4096,
                retention_age: Some(Duration::from_secs(3600)),
                ..config(1)
            },
        )
        .unwrap();
    // Old records (expired by age) in the parent.
    for i in 0..40u64 {
        let key = format!("k{}", i % 4);
        let value = format!("{key}:{i}");
        topic
            .append_batch(&[NewRecord {
                key: Some(key.as_bytes()),
                value: value.as_bytes(),
                timestamp: Some(1_000),
            }])
            .unwrap();
    }
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let got = a.poll(10).unwrap();
    assert_eq!(got.len(), 10);
    let children = topic.split(0, SplitPlan::Even).unwrap();
    append(&topic, 4, 40, 20);
    let removed = log.enforce_retention().unwrap();
    assert!(removed > 0, "retention removed nothing");
    assert!(topic.partition(0).is_err(), "the parent is gone");
    let rest = drain(&mut a);
    assert!(
        seqs(&rest).is_superset(&(40..60).collect()),
        "the children's records: {:?}",
        seqs(&rest)
    );
    a.commit().unwrap();
    let c = group.committed();
    for ch in &children {
        assert!(c.positions.contains_key(ch), "{c:?}");
    }
    assert_eq!(
        c.positions.values().sum::<u64>(),
        children
            .iter()
            .map(|&p| topic.partition(p).unwrap().end_offset())
            .sum::<u64>()
    );
    log.close().unwrap();
}

/// Retention removes a sealed parent after a member read part of it (no
/// poll since): the commit of what it handed out is not refused.
#[test]
fn a_commit_naming_a_partition_retention_removed_is_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log
        .topic_or_create(
            "t",
            TopicConfig {
                segment_bytes: 4096,
                retention_age: Some(Duration::from_secs(3600)),
                ..config(1)
            },
        )
        .unwrap();
    for i in 0..40u64 {
        let key = format!("k{}", i % 4);
        let value = format!("{key}:{i}");
        topic
            .append_batch(&[NewRecord {
                key: Some(key.as_bytes()),
                value: value.as_bytes(),
                timestamp: Some(1_000),
            }])
            .unwrap();
    }
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(a.poll(10).unwrap().len(), 10);
    topic.split(0, SplitPlan::Even).unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err(), "the parent is gone");
    let r = a.commit();
    assert!(
        r.is_ok(),
        "commit after retention removed the partition it read: {r:?}"
    );
    log.close().unwrap();
}

/// `commit_positions` naming a split child before its parent is read to
/// its seal must not report success for a position it did not commit.
#[test]
fn commit_positions_of_a_child_before_its_parent_is_not_a_silent_no_op() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 16, 0, 20);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let children = topic.split(0, SplitPlan::Even).unwrap();
    append(&topic, 16, 20, 40);
    let got = drain(&mut a);
    assert_eq!(got.len(), 60);
    // The child with more records (the topic's hash key is random).
    let count = |c: u32| got.iter().filter(|r| r.partition == c).count() as u64;
    let c0 = *children.iter().max_by_key(|&&c| count(c)).unwrap();
    let in_c0 = count(c0);
    assert!(in_c0 > 0);
    let r = a.commit_positions(&[(c0, in_c0)]);
    let committed = group.committed().positions.get(&c0).copied();
    assert!(
        r.is_err() || committed == Some(in_c0),
        "commit_positions returned {r:?} but the group has {committed:?} for child {c0}"
    );
    log.close().unwrap();
}

/// Duplicate partitions in one `commit_positions`: refused, or the
/// highest wins; never a position below one committed in the same call.
#[test]
fn commit_positions_with_duplicates_never_moves_back() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 4, 0, 20);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(a.poll(20).unwrap().len(), 20);
    let r = a.commit_positions(&[(0, 15), (0, 5)]);
    let c = group.committed().positions.get(&0).copied();
    assert!(
        r.is_err() && c.unwrap_or(0) == 0 || c == Some(15),
        "{r:?}: committed {c:?}"
    );
    log.close().unwrap();
}

fn header_version(path: &std::path::Path) -> u16 {
    let b = std::fs::read(path).unwrap();
    u16::from_le_bytes([b[8], b[9]])
}

fn set_header_version(path: &std::path::Path, v: u16) {
    let mut b = std::fs::read(path).unwrap();
    b[8..10].copy_from_slice(&v.to_le_bytes());
    std::fs::write(path, b).unwrap();
}

/// A log whose manifest is of format version 1 (no group records) takes a
/// group: the files are rewritten at the current version (2 or later)
/// before the first group record, and the group's positions survive a reopen and an abandon.
#[test]
fn a_version_1_manifest_takes_groups_after_an_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append(&topic, 8, 0, 50);
    topic.split(0, SplitPlan::Even).unwrap();
    log.close().unwrap();
    let journal = dir.path().join("manifest.log");
    let snap = dir.path().join("manifest.snap");
    set_header_version(&journal, 1);
    if snap.exists() {
        set_header_version(&snap, 1);
    }
    let log = open(dir.path(), &clock);
    let topic = log.topic("t").unwrap();
    append(&topic, 8, 50, 10);
    assert_eq!(header_version(&journal), 1, "no upgrade without a group");
    let group = topic.group("g", GroupOptions::default()).unwrap();
    // The current version: 2 brought groups (3, tail splits, keeps them).
    assert!(header_version(&journal) >= 2);
    assert_eq!(header_version(&snap), header_version(&journal));
    let mut m = group.join(member_opts()).unwrap();
    let got = m.poll(30).unwrap();
    m.commit().unwrap();
    let committed = group.committed();
    log.abandon();
    let log = open(dir.path(), &clock);
    let topic = log.topic("t").unwrap();
    assert_eq!(topic.groups(), ["g"]);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    assert_eq!(group.committed().positions, committed.positions);
    let mut m = group.join(member_opts()).unwrap();
    let rest = drain(&mut m);
    assert!(seqs(&got).is_disjoint(&seqs(&rest)));
    assert_eq!(got.len() + rest.len(), 60);
    log.close().unwrap();
}

/// Manifest compaction every record or two, with groups committing,
/// splitting, deleting and reopening in between: the positions read back
/// are the last committed, the deleted group stays deleted.
#[test]
fn group_positions_survive_frequent_manifest_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let opts = || LogOptions {
        manifest_compact_records: 2,
        ..options(&clock)
    };
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append(&topic, 8, 0, 100);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let h = topic.group("h", GroupOptions::default()).unwrap();
    let mut a = g.join(member_opts()).unwrap();
    let mut b = h.join(member_opts()).unwrap();
    let mut got = Vec::new();
    for i in 0..5 {
        got.extend(a.poll(7).unwrap());
        a.commit().unwrap();
        b.poll(3).unwrap();
        b.commit().unwrap();
        if i == 2 {
            topic.split(1, SplitPlan::Even).unwrap();
            append(&topic, 8, 100, 20);
        }
    }
    let committed = g.committed();
    topic.delete_group("h").unwrap();
    drop((a, b));
    log.close().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.topic("t").unwrap();
    assert_eq!(topic.groups(), ["g"]);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    assert_eq!(g.committed().positions, committed.positions);
    assert_eq!(g.committed().drained, committed.drained);
    let mut a = g.join(member_opts()).unwrap();
    let rest = drain(&mut a);
    assert!(seqs(&got).is_disjoint(&seqs(&rest)));
    assert_eq!(got.len() + rest.len(), 120);
    log.close().unwrap();
}

/// Zeroes partition 0's segment (topic 0, base 0) from a little before the
/// record whose value is `needle` to its end: a power loss that kept only
/// the pages before it.
fn cut_before(dir: &std::path::Path, needle: &[u8]) {
    let rel = std::path::PathBuf::from(format!("topics/t0/p0/{:020}.seg", 0));
    let bytes = std::fs::read(dir.join(&rel)).unwrap();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("record in the segment");
    let from = (at as u64).saturating_sub(24);
    common::crash::zero_range(dir, &rel, from, bytes.len() as u64 - from);
}

/// `SyncPolicy::Never`: a group commit (durable in the manifest) of records
/// a power loss then cut is reported, and the group resumes at the
/// recovered end: records appended after the reopen reuse the lost offsets
/// and must all be delivered.
#[test]
fn a_committed_position_past_the_recovered_end_is_reported_and_new_records_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 4, 0, 100);
    log.sync().unwrap();
    append(&topic, 4, 100, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut m).len(), 200);
    m.commit().unwrap();
    assert_eq!(group.committed().positions.get(&0), Some(&200));
    drop(m);
    log.abandon();
    cut_before(dir.path(), b"k2:150");
    let log = open(dir.path(), &clock);
    let lost = log.recovery_report().group_positions_lost.clone();
    let topic = log.topic("t").unwrap();
    let end = topic.partition(0).unwrap().end_offset();
    assert!((100..200).contains(&end), "recovered end {end}");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!((lost[0].committed, lost[0].end), (200, end));
    append(&topic, 4, 1000, 30);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    assert_eq!(group.committed().positions.get(&0), Some(&end));
    let mut m = group.join(member_opts()).unwrap();
    let got = drain(&mut m);
    assert_eq!(seqs(&got), (1000..1030).collect(), "the new records");
    m.commit().unwrap();
    drop(m);
    // A second crash after the rewind: nothing more is reported.
    log.abandon();
    let log = open(dir.path(), &clock);
    assert!(log.recovery_report().group_positions_lost.is_empty());
    log.close().unwrap();
}

/// Same power loss under a group created `Latest` (positioned at the end
/// it saw, without reading): reported, and the group reads the records
/// appended after the reopen.
#[test]
fn a_lost_position_in_a_group_created_latest_resumes_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 4, 0, 100);
    log.sync().unwrap();
    append(&topic, 4, 100, 100);
    // Latest: positioned at 200 without reading anything.
    let group = topic
        .group(
            "g",
            GroupOptions {
                start: GroupStart::Latest,
                ..GroupOptions::default()
            },
        )
        .unwrap();
    assert_eq!(group.committed().positions.get(&0), Some(&200));
    log.abandon();
    cut_before(dir.path(), b"k2:150");
    let log = open(dir.path(), &clock);
    let lost = log.recovery_report().group_positions_lost.clone();
    assert_eq!(lost.len(), 1, "{lost:?}");
    let topic = log.topic("t").unwrap();
    append(&topic, 4, 1000, 10);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert_eq!(seqs(&drain(&mut m)), (1000..1010).collect());
    log.close().unwrap();
}

fn by_partition(records: &[OwnedRecord]) -> BTreeMap<u32, Vec<u64>> {
    let mut out: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for r in records {
        out.entry(r.partition).or_default().push(r.offset);
    }
    out
}

/// A partition being revoked (its owner has uncommitted records in it) is
/// split: the owner reads neither it nor its children any more; once the
/// owner commits, the new owner reads the rest of the parent and the
/// children, every record exactly once between the two.
#[test]
fn a_split_of_a_partition_being_revoked_moves_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append_rr(&topic, 0, 200);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut got_a = Vec::new();
    for _ in 0..4 {
        got_a.extend(a.poll(20).unwrap());
    }
    let mut b = group.join(member_opts()).unwrap();
    let d = group.describe();
    let revoking: Vec<u32> = d
        .assignments
        .iter()
        .filter(|x| x.revoking)
        .map(|x| x.partition)
        .collect();
    assert_eq!(revoking.len(), 1, "{d:#?}");
    let p = revoking[0];
    let handed_in_p = got_a.iter().filter(|r| r.partition == p).count() as u64;
    assert!(
        handed_in_p > 0 && handed_in_p < 100,
        "uncommitted records in the revoked partition, not all: {handed_in_p}"
    );
    let children = topic.split(p, SplitPlan::Even).unwrap();
    append_rr(&topic, 200, 100);
    // `a` keeps reading only its other partition.
    let more_a = drain(&mut a);
    assert!(
        more_a
            .iter()
            .all(|r| r.partition != p && !children.contains(&r.partition)),
        "the owner read a revoked partition or its children: {:?}",
        by_partition(&more_a).keys().collect::<Vec<_>>()
    );
    got_a.extend(more_a);
    assert!(b.poll(10).unwrap().is_empty(), "not released yet");
    a.commit().unwrap();
    let got_b = drain(&mut b);
    assert_eq!(b.assignment().partitions, [p], "moved whole to `b`");
    assert!(a.poll(10).unwrap().is_empty());
    let sa = seqs(&got_a);
    let sb = seqs(&got_b);
    assert!(
        sa.is_disjoint(&sb),
        "{:?}",
        sa.intersection(&sb).collect::<Vec<_>>()
    );
    assert_eq!(sa.len() + sb.len(), 300);
    assert_eq!(got_a.len() + got_b.len(), 300);
    assert_partition_order(&got_a);
    assert_partition_order(&got_b);
    log.close().unwrap();
}

/// A merge where one parent's owner dies before committing: the survivor
/// reads the dead owner's parent from its commit, then the merge child;
/// nothing lost, duplicates only inside the dead member's window.
#[test]
fn a_merge_whose_parent_owner_dies_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append_rr(&topic, 0, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    a.commit().unwrap();
    b.poll(0).unwrap();
    assert_eq!(a.assignment().partitions.len(), 1);
    let child = topic.merge(0, 1).unwrap();
    append_rr(&topic, 100, 50);
    let mut got_a = drain(&mut a);
    a.commit().unwrap();
    let got_b = b.poll(20).unwrap();
    b.commit().unwrap();
    let window = b.poll(10).unwrap();
    assert_eq!(window.len(), 10);
    drop(b);
    // `b` stops heartbeating; `a` goes on.
    pass(&clock, SESSION + Duration::from_secs(2), &[], &mut [&mut a]);
    got_a.extend(drain(&mut a));
    a.commit().unwrap();
    assert_eq!(a.assignment().partitions, [child]);
    got_a.extend(drain(&mut a));
    let d = group.describe();
    assert_eq!(d.stats.dead_detected, 1);
    let sa = seqs(&got_a);
    let sb = seqs(&got_b);
    assert!(sa.is_disjoint(&sb));
    let dup: BTreeSet<u64> = sa.intersection(&seqs(&window)).copied().collect();
    assert_eq!(dup, seqs(&window), "the dead member's window came again");
    assert_eq!(sa.union(&sb).count(), 150);
    assert_eq!(d.stats.redelivered, 10);
    assert_partition_order(&got_a);
    log.close().unwrap();
}

/// A split child split again while it is pinned to the parent's owner:
/// the owner reads the whole tree in key order, a commit lists the leaves,
/// and a reopen resumes exactly.
#[test]
fn a_pinned_child_split_again_is_read_in_order_and_resumed_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 16, 0, 50);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    b.poll(0).unwrap();
    let mut got = a.poll(20).unwrap();
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    append(&topic, 16, 50, 50);
    got.extend(a.poll(40).unwrap());
    let grandkids = topic.split(kids[0], SplitPlan::Even).unwrap();
    append(&topic, 16, 100, 50);
    got.extend(a.poll(50).unwrap());
    a.commit().unwrap();
    assert!(b.poll(100).unwrap().is_empty(), "pinned to the owner");
    got.extend(drain(&mut a));
    assert_eq!(seqs(&got), (0..150).collect());
    assert_key_order(&got);
    let before = seqs(&got);
    let window = a.poll(1).unwrap();
    assert!(window.is_empty());
    a.commit().unwrap();
    let c = group.committed();
    assert!(c.positions.contains_key(&kids[1]), "{c:?}");
    for g in &grandkids {
        assert!(c.positions.contains_key(g), "{c:?}");
    }
    assert!(!c.positions.contains_key(&0) && !c.positions.contains_key(&kids[0]));
    drop((a, b));
    log.close().unwrap();
    let log = open(dir.path(), &clock);
    let topic = log.topic("t").unwrap();
    append(&topic, 16, 150, 30);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let rest = drain(&mut a);
    assert_eq!(seqs(&rest), (150..180).collect());
    assert!(before.is_disjoint(&seqs(&rest)));
    log.close().unwrap();
}

/// `delete_topic` under a live group: its members may read on what they
/// hold (as readers do), but their commits fail with an error (no panic,
/// no manifest record), and the topic created again under the name has no
/// groups.
#[test]
fn delete_topic_under_a_live_group_fails_its_members_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append(&topic, 4, 0, 20);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert_eq!(m.poll(5).unwrap().len(), 5);
    log.delete_topic("t").unwrap();
    let _ = m.poll(100);
    assert!(m.commit().is_err(), "commit into a deleted topic");
    assert!(group.join(member_opts()).is_err() || m.commit().is_err());
    let topic = log.topic_or_create("t", config(2)).unwrap();
    assert!(topic.groups().is_empty());
    assert!(matches!(
        topic.delete_group("g"),
        Err(Error::UnknownGroup(_))
    ));
    drop(m);
    log.close().unwrap();
    let log = open(dir.path(), &clock);
    assert!(log.topic("t").unwrap().groups().is_empty());
    log.close().unwrap();
}

/// A static member replaced by a rejoin with its instance id: the old
/// incarnation is fenced on commit and poll; the new one starts at the
/// committed position and the old one's uncommitted window is counted.
#[test]
fn a_replaced_static_incarnation_cannot_commit_after_the_rejoin() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append(&topic, 4, 0, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let sopts = MemberOptions {
        instance_id: Some("x".into()),
        ..member_opts()
    };
    let mut old = group.join(sopts.clone()).unwrap();
    let first = old.poll(30).unwrap();
    old.commit().unwrap();
    let window = old.poll(20).unwrap();
    assert_eq!(window.len(), 20);
    let mut new = group.join(sopts).unwrap();
    assert!(matches!(old.commit(), Err(Error::Fenced { .. })));
    assert!(matches!(old.poll(10), Err(Error::Fenced { .. })));
    let rest = drain(&mut new);
    assert!(seqs(&first).is_disjoint(&seqs(&rest)));
    assert!(seqs(&window).is_subset(&seqs(&rest)));
    assert_eq!(first.len() + rest.len(), 100);
    assert_eq!(group.describe().stats.redelivered, 20);
    log.close().unwrap();
}

/// A group created `Latest` on a topology with sealed parents holding
/// unread records and a merge child: only records appended afterwards are
/// read, each once.
#[test]
fn a_latest_group_on_a_split_and_merged_topology_reads_only_new_records() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append(&topic, 16, 0, 100);
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    append(&topic, 16, 100, 50);
    topic.merge(kids[1], 1).unwrap();
    append(&topic, 16, 150, 50);
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
    assert!(drain(&mut m).is_empty());
    append(&topic, 16, 200, 40);
    let got = drain(&mut m);
    assert_eq!(seqs(&got), (200..240).collect());
    assert_eq!(got.len(), 40);
    log.close().unwrap();
}

/// A handle of a deleted topic (a `Topic`, or a `Group` holding one) kept
/// past `Log::close` must not keep the directory locked: the log reopens.
#[test]
fn a_deleted_topic_handle_kept_past_close_does_not_lock_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 4, 0, 5);
    log.delete_topic("t").unwrap();
    log.close().unwrap();
    let reopened = Log::open(dir.path(), options(&clock));
    assert!(reopened.is_ok(), "{:?}", reopened.err());
    drop(topic);
    reopened.unwrap().close().unwrap();
}

/// A member whose revoked partition was released after its processing
/// timeout commits late: refused while that would move the group's
/// position past what the new owner committed, ignored once the new owner
/// committed further; the committed position never moves back.
#[test]
fn a_late_commit_after_an_overdue_revocation_never_moves_the_position() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append_rr(&topic, 0, 200);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let got = a.poll(50).unwrap();
    let p = got[0].partition;
    assert!(got.iter().all(|r| r.partition == p));
    a.commit_positions(&[(p, got[29].offset + 1)]).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    let d = group.describe();
    assert!(
        d.assignments.iter().any(|x| x.partition == p && x.revoking),
        "{d:#?}"
    );
    // `a` keeps heartbeating but does not commit the revoked partition:
    // released after the processing timeout.
    pass(
        &clock,
        PROCESSING + Duration::from_secs(1),
        &[&a],
        &mut [&mut b],
    );
    assert!(b.assignment().partitions.contains(&p), "released to `b`");
    let got_b = b.poll(10).unwrap();
    assert!(got_b.iter().all(|r| r.partition == p));
    assert_eq!(got_b[0].offset, 30, "from `a`'s commit");
    b.commit().unwrap();
    let at = group.committed().positions[&p];
    assert_eq!(at, 40);
    // `a` commits what it handed out there (50): `b` committed 40 only.
    assert!(matches!(a.commit(), Err(Error::NotAssigned { .. })));
    assert_eq!(group.committed().positions[&p], 40);
    drain(&mut b);
    b.commit().unwrap();
    let end = group.committed().positions[&p];
    assert!(end > 50);
    a.commit().unwrap();
    assert_eq!(group.committed().positions[&p], end, "never backwards");
    log.close().unwrap();
}

/// The owner of a split parent dies after reading into the pinned
/// children: the next owner reads the parent from the committed position
/// and the children from their start; what comes again is exactly the
/// dead member's uncommitted window, and the stats count it.
#[test]
fn a_dead_owner_of_pinned_children_is_redelivered_exactly_its_window() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append(&topic, 16, 0, 60);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    b.poll(0).unwrap();
    let committed = a.poll(25).unwrap();
    a.commit().unwrap();
    topic.split(0, SplitPlan::Even).unwrap();
    append(&topic, 16, 60, 60);
    let window = drain(&mut a);
    assert_eq!(window.len(), 95);
    drop(a);
    pass(&clock, SESSION + Duration::from_secs(2), &[], &mut [&mut b]);
    let got_b = drain(&mut b);
    assert_eq!(seqs(&got_b), seqs(&window), "exactly the window, again");
    assert_eq!(got_b.len(), window.len());
    assert!(seqs(&committed).is_disjoint(&seqs(&got_b)));
    assert_key_order(&got_b);
    assert_eq!(group.describe().stats.redelivered, 95);
    log.close().unwrap();
}

/// The group's committed positions as a cut: a plain reader started from
/// it reads exactly what the group has not committed, across a split.
#[test]
fn a_reader_from_the_committed_cut_reads_exactly_the_uncommitted_records() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append(&topic, 16, 0, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut got = a.poll(70).unwrap();
    topic.split(0, SplitPlan::Even).unwrap();
    append(&topic, 16, 100, 60);
    got.extend(a.poll(60).unwrap());
    a.commit().unwrap();
    let mut r = topic
        .reader(fissionlog::StartAt::Cut(group.committed()))
        .unwrap();
    let mut rest = Vec::new();
    loop {
        let x = r.poll(1000).unwrap();
        if x.is_empty() {
            break;
        }
        rest.extend(x);
    }
    assert!(seqs(&got).is_disjoint(&seqs(&rest)));
    assert_eq!(got.len() + rest.len(), 160);
    log.close().unwrap();
}

/// Retention removes a split parent the group holds a position in while
/// no member is alive; after a reopen the group reads the children from
/// their start instead of stalling on the removed parent.
#[test]
fn a_group_positioned_in_a_parent_retention_removed_goes_on_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log
        .topic_or_create(
            "t",
            TopicConfig {
                segment_bytes: 4096,
                retention_age: Some(Duration::from_secs(3600)),
                ..config(1)
            },
        )
        .unwrap();
    for i in 0..40u64 {
        let value = format!("r:{i}");
        topic
            .append_batch(&[NewRecord {
                key: None,
                value: value.as_bytes(),
                timestamp: Some(1_000),
            }])
            .unwrap();
    }
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(a.poll(10).unwrap().len(), 10);
    a.commit().unwrap();
    a.leave().unwrap();
    topic.split(0, SplitPlan::Even).unwrap();
    append_rr(&topic, 40, 20);
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err());
    drop(group);
    log.close().unwrap();
    let log = open(dir.path(), &clock);
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(seqs(&drain(&mut a)), (40..60).collect());
    a.commit().unwrap();
    log.close().unwrap();
}

struct Sim {
    member: Member,
    /// Heartbeats but makes no progress (slow, then stuck).
    frozen: bool,
}

/// Seeded random joins, leaves, crashes, stalls, splits, merges, polls,
/// commits and clock steps (keyless records, so the run does not depend on
/// the topic's hash key). Oracle: every record is delivered at least once;
/// extra deliveries never exceed what the group counts as redelivered
/// (uncommitted windows of members that died, left, were stuck or were
/// replaced); nothing is left to read; positions read back after a reopen
/// are the committed ones. `GROUP_SIM_SEEDS=N` runs more seeds.
#[test]
fn seeded_group_simulation_loses_nothing_and_duplicates_only_windows() {
    let seeds = std::env::var("GROUP_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5u64);
    for seed in 0..seeds {
        simulate(seed);
    }
}

fn simulate(seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut members: Vec<Sim> = Vec::new();
    let mut appended = 0u64;
    let mut deliveries: Vec<u64> = Vec::new();
    for _step in 0..300 {
        match rng.below(100) {
            0..=19 => {
                let n = 1 + rng.below(20);
                append_rr(&topic, appended, n);
                appended += n;
            }
            20..=44 if !members.is_empty() => {
                let i = rng.below(members.len() as u64) as usize;
                if !members[i].frozen {
                    let got = members[i].member.poll(1 + rng.below(40) as usize);
                    deliveries.extend(got.unwrap().iter().map(seq));
                }
            }
            45..=59 if !members.is_empty() => {
                let i = rng.below(members.len() as u64) as usize;
                if !members[i].frozen {
                    match members[i].member.commit() {
                        Ok(()) | Err(Error::NotAssigned { .. }) => {}
                        Err(e) => panic!("seed {seed}: commit: {e}"),
                    }
                }
            }
            60..=74 => {
                clock.advance(Duration::from_secs(1 + rng.below(3)));
                for m in &members {
                    m.member.heartbeat().unwrap();
                }
                group.tick();
            }
            75..=79 if members.len() < 3 => {
                let member = group.join(member_opts()).unwrap();
                members.push(Sim {
                    member,
                    frozen: false,
                });
            }
            80..=84 if !members.is_empty() => {
                let i = rng.below(members.len() as u64) as usize;
                let m = members.remove(i);
                if rng.below(2) == 0 && !m.frozen {
                    let _ = m.member.leave();
                } else {
                    // Crashed: no heartbeat any more, dead after the
                    // session timeout.
                    drop(m);
                }
            }
            85..=88 if !members.is_empty() => {
                let i = rng.below(members.len() as u64) as usize;
                members[i].frozen = !members[i].frozen;
            }
            89..=92 => {
                let active: Vec<u32> = topic
                    .partitions()
                    .into_iter()
                    .filter(|p| p.sealed_at.is_none())
                    .map(|p| p.id)
                    .collect();
                if active.len() < 6 {
                    let p = active[rng.below(active.len() as u64) as usize];
                    topic.split(p, SplitPlan::Even).unwrap();
                }
            }
            93..=96 => {
                let mut active: Vec<(u64, u32)> = topic
                    .partitions()
                    .into_iter()
                    .filter(|p| p.sealed_at.is_none())
                    .map(|p| (p.start, p.id))
                    .collect();
                active.sort_unstable();
                if active.len() > 1 {
                    let i = rng.below(active.len() as u64 - 1) as usize;
                    topic.merge(active[i].1, active[i + 1].1).unwrap();
                }
            }
            _ => {}
        }
    }
    // Everyone wakes up; the crashed ones are declared dead; the rest
    // read and commit everything.
    for m in &mut members {
        m.frozen = false;
    }
    if members.is_empty() {
        members.push(Sim {
            member: group.join(member_opts()).unwrap(),
            frozen: false,
        });
    }
    for _ in 0..40 {
        clock.advance(Duration::from_secs(1));
        for m in &mut members {
            m.member.heartbeat().unwrap();
            let got = drain(&mut m.member);
            deliveries.extend(got.iter().map(seq));
            match m.member.commit() {
                Ok(()) | Err(Error::NotAssigned { .. }) => {}
                Err(e) => panic!("seed {seed}: final commit: {e}"),
            }
        }
    }
    let unique: BTreeSet<u64> = deliveries.iter().copied().collect();
    let missing: Vec<u64> = (0..appended).filter(|s| !unique.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "seed {seed}: {} records never delivered: {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    let extra = deliveries.len() as u64 - unique.len() as u64;
    let d = group.describe();
    assert!(
        extra <= d.stats.redelivered,
        "seed {seed}: {extra} extra deliveries, {} counted as redelivered",
        d.stats.redelivered
    );
    assert_eq!(d.lag_records, 0, "seed {seed}: {d:#?}");
    let committed = group.committed();
    drop(members);
    drop(group);
    log.close().unwrap();
    let log = open(dir.path(), &clock);
    let group = log
        .topic("t")
        .unwrap()
        .group("g", GroupOptions::default())
        .unwrap();
    assert_eq!(
        group.committed().positions,
        committed.positions,
        "seed {seed}"
    );
    log.close().unwrap();
}
