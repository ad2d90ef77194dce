//! Consumer-group edge cases in simulated time: ownership handed back to a
//! member that never saw it leave, stale group handles after a delete,
//! retention and recovery under committed positions, odd commit inputs,
//! manifest compaction and format upgrade with group records.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use fissionlog::{
    Error, GroupOptions, GroupStart, Log, LogOptions, ManualClock, Member, MemberOptions,
    NewRecord, OwnedRecord, SplitPlan, SyncPolicy, Topic, TopicConfig,
};

const SESSION: Duration = Duration::from_secs(10);
const PROCESSING: Duration = Duration::from_secs(30);

fn options(clock: &Arc<ManualClock>) -> LogOptions {
    LogOptions {
        clock: clock.clone(),
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    }
}

fn config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: 1 << 20,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    }
}

fn member_opts() -> MemberOptions {
    MemberOptions {
        session_timeout: SESSION,
        processing_timeout: PROCESSING,
        instance_id: None,
        background_heartbeat: None,
    }
}

/// Appends `n` records with keys `k0..k{keys}` and values `key:seq`.
fn append(topic: &Topic, keys: u32, from: u64, n: u64) {
    for i in from..from + n {
        let key = format!("k{}", i % u64::from(keys));
        topic
            .append(Some(key.as_bytes()), format!("{key}:{i}").as_bytes())
            .unwrap();
    }
}

fn seq(r: &OwnedRecord) -> u64 {
    let v = std::str::from_utf8(&r.value).unwrap();
    v.split(':').nth(1).unwrap().parse().unwrap()
}

fn seqs(records: &[OwnedRecord]) -> BTreeSet<u64> {
    records.iter().map(seq).collect()
}

/// Polls until a poll returns nothing.
fn drain(m: &mut Member) -> Vec<OwnedRecord> {
    let mut out = Vec::new();
    loop {
        let got = m.poll(1000).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend(got);
    }
}

fn open(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Log {
    Log::open(dir, options(clock)).unwrap()
}

/// Advances the clock in steps of a second, heartbeating `beat` and
/// polling (zero records) `progress` at every step.
fn pass(clock: &ManualClock, total: Duration, beat: &[&Member], progress: &mut [&mut Member]) {
    let mut left = total;
    while !left.is_zero() {
        let step = left.min(Duration::from_secs(1));
        clock.advance(step);
        left -= step;
        for m in beat {
            m.heartbeat().unwrap();
        }
        for m in progress.iter_mut() {
            m.poll(0).unwrap();
        }
    }
}

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
    let c0 = children[0];
    let in_c0 = got.iter().filter(|r| r.partition == c0).count() as u64;
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

/// Keeps the imports of the probes below in use.
#[allow(dead_code)]
fn _unused(_: Error, _: GroupStart) {}
