//! A group's committed position in a partition retention removes: the
//! records the group had not read there are reported through
//! `Member::retained()` to the member that takes over (C8), again after a
//! reopen or a member's death until a member told of them commits, and
//! never after that commit.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::groups::{drain, member_opts, open};
use common::retention::{config, fill, lost};
use fissionlog::{Group, GroupOptions, Log, ManualClock, SplitPlan, StartAt, Topic};

/// 40 old records in partition 0; a member reads and commits 10 and
/// leaves; 0 is split into children with 5 fresh records each, and
/// retention removes 0. Returns the log, topic and group.
fn committed_then_removed(dir: &std::path::Path, clock: &Arc<ManualClock>) -> (Log, Topic, Group) {
    let log = open(dir, clock);
    let topic = log.create_topic("t", config()).unwrap();
    fill(&topic, 0, 40, true);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(a.poll(10).unwrap().len(), 10);
    a.commit().unwrap();
    a.leave().unwrap();
    for c in topic.split(0, SplitPlan::Even).unwrap() {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err(), "partition 0 was removed");
    (log, topic, group)
}

fn reopen(dir: &std::path::Path, clock: &Arc<ManualClock>) -> (Log, Topic, Group) {
    let log = open(dir, clock);
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    (log, topic, group)
}

/// The loss is handed to a member that does not commit; after a reopen
/// the group still holds the position in the removed partition and the
/// next member is told again. Once a member commits, a reopen tells
/// nobody, and the group's positions no longer name the partition.
#[test]
fn a_loss_is_reported_again_after_a_reopen_until_a_member_commits() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let (log, topic, group) = committed_then_removed(root.path(), &clock);
    let mut b = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut b).len(), 10, "the children");
    assert_eq!(lost(&b), vec![(0, 10, 40)]);
    // Polled again: told once.
    assert!(drain(&mut b).is_empty());
    assert_eq!(lost(&b), vec![(0, 10, 40)], "reported once");
    assert_eq!(group.committed().positions.get(&0), Some(&10));
    // No commit: a crash or a clean close alike keeps the position.
    drop((b, group, topic));
    log.close().unwrap();

    let (log, topic, group) = reopen(root.path(), &clock);
    assert_eq!(group.committed().positions.get(&0), Some(&10));
    let mut c = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut c).len(), 10, "uncommitted: delivered again");
    assert_eq!(lost(&c), vec![(0, 10, 40)], "told again after the reopen");
    c.commit().unwrap();
    assert_eq!(group.committed().positions.get(&0), None);
    let mut r = topic.reader(StartAt::Cut(group.committed())).unwrap();
    assert!(r.poll(1000).unwrap().is_empty());
    assert!(r.retained().is_empty(), "{:?}", r.retained());
    // A member joining now is told nothing.
    c.leave().unwrap();
    let mut d = group.join(member_opts()).unwrap();
    assert!(drain(&mut d).is_empty());
    assert!(lost(&d).is_empty(), "{:?}", lost(&d));
    drop((d, group, topic));
    log.close().unwrap();

    let (log, topic, group) = reopen(root.path(), &clock);
    assert_eq!(group.committed().positions.get(&0), None);
    let mut e = group.join(member_opts()).unwrap();
    assert!(drain(&mut e).is_empty(), "all committed");
    assert!(lost(&e).is_empty(), "committed past: {:?}", lost(&e));
    drop((e, group, topic));
    log.close().unwrap();
}

/// A member that was told of the loss and died without committing leaves
/// it to the next owner, who is told; after its commit, a later member is
/// not.
#[test]
fn a_member_that_dies_before_committing_leaves_the_loss_to_the_next_owner() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let (log, topic, group) = committed_then_removed(root.path(), &clock);
    let mut b = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut b).len(), 10);
    assert_eq!(lost(&b), vec![(0, 10, 40)]);
    // b stops heartbeating and is declared dead.
    clock.advance(common::groups::SESSION + Duration::from_secs(1));
    group.tick();
    assert_eq!(group.describe().stats.dead_detected, 1);
    assert_eq!(group.committed().positions.get(&0), Some(&10));
    let mut c = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut c).len(), 10);
    assert_eq!(lost(&c), vec![(0, 10, 40)], "the next owner is told");
    c.commit().unwrap();
    c.leave().unwrap();
    let mut d = group.join(member_opts()).unwrap();
    assert!(drain(&mut d).is_empty());
    assert!(lost(&d).is_empty(), "{:?}", lost(&d));
    drop((b, d, group, topic));
    log.close().unwrap();
}

/// A member reading partition 0 past the committed position when
/// retention removes it reports the rest from its own position, once: the
/// group's loss (from the committed position) is not reported to it on
/// top, and its commit settles the group's.
#[test]
fn a_member_reading_the_removed_partition_reports_it_once_from_its_own_position() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let topic = log.create_topic("t", config()).unwrap();
    fill(&topic, 0, 40, true);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(a.poll(10).unwrap().len(), 10);
    a.commit().unwrap();
    assert_eq!(a.poll(5).unwrap().len(), 5);
    for c in topic.split(0, SplitPlan::Even).unwrap() {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err());
    assert_eq!(drain(&mut a).len(), 10, "the children");
    assert_eq!(lost(&a), vec![(0, 15, 40)]);
    a.commit().unwrap();
    assert_eq!(group.committed().positions.get(&0), None);
    assert!(drain(&mut a).is_empty());
    assert_eq!(lost(&a), vec![(0, 15, 40)], "reported once");
    drop((a, group, topic));
    log.close().unwrap();
    let (log, topic, group) = reopen(root.path(), &clock);
    let mut b = group.join(member_opts()).unwrap();
    assert!(drain(&mut b).is_empty());
    assert!(lost(&b).is_empty(), "{:?}", lost(&b));
    drop((b, group, topic));
    log.close().unwrap();
}

/// A power loss before every I/O step of the commit that settles the
/// loss: after the reopen the group either still holds the position in
/// the removed partition and the next member is told of it (and reads the
/// uncommitted children again), or the commit is durable and nobody is
/// told or reads anything again. The commit is durable once it returned.
#[test]
fn a_power_loss_during_the_settling_commit_reports_the_loss_or_settles_it() {
    use common::crash::CrashOptions;
    use common::model_hook::ModelHook;
    use fissionlog::IoOp;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir_all(&dir).unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let hook = ModelHook::new(&dir, None);
    hook.grant_segment_headers(true);
    let log = Log::open_with_hook(&dir, common::groups::options(&clock), hook.clone()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    fill(&topic, 0, 40, true);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(a.poll(10).unwrap().len(), 10);
    a.commit().unwrap();
    a.leave().unwrap();
    for c in topic.split(0, SplitPlan::Even).unwrap() {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    log.sync().unwrap();
    let mut b = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut b).len(), 10);
    assert_eq!(lost(&b), vec![(0, 10, 40)]);
    hook.record_steps(true);
    b.commit().unwrap();
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    assert!(points.len() >= 2, "steps: {}", points.len());
    drop((b, group, topic));
    log.abandon();
    let mut told = 0;
    for (i, point) in points.iter().enumerate() {
        let (image, trace) = point.image(i as u64 * 7 + 1, &CrashOptions::default());
        let ctx = format!("step {i} (before {:?}): {}", point.op, trace.join("; "));
        let d = tempfile::tempdir().unwrap();
        let at = d.path().join("log");
        image.write_to(&at).unwrap();
        let (log, topic, group) = reopen(&at, &clock);
        let held = group.committed().positions.contains_key(&0);
        let mut m = group.join(member_opts()).unwrap();
        let got = drain(&mut m);
        if held {
            told += 1;
            assert_eq!(lost(&m), vec![(0, 10, 40)], "{ctx}");
            assert_eq!(got.len(), 10, "{ctx}");
        } else {
            assert!(lost(&m).is_empty(), "{ctx}: {:?}", lost(&m));
            assert!(got.is_empty(), "{ctx}: {} records again", got.len());
        }
        if i == points.len() - 1 {
            assert!(!held, "{ctx}: the returned commit is durable");
        }
        drop((m, group, topic));
        log.close().unwrap();
    }
    assert!(told > 0, "no step before the commit's record was durable");
}

/// A member reads partition 0, its split child 1 and 1's children 3 and 4
/// (pinned to it: nothing committed). Retention removes 0 and 1; the
/// member keeps 3 and 4 in the same tenure, so it does not read their
/// records again (none counted as redelivered), and nothing it read is
/// reported lost.
#[test]
fn a_member_keeps_pinned_grandchildren_when_retention_removes_the_parents_between() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let topic = log.create_topic("t", config()).unwrap();
    fill(&topic, 0, 40, true);
    let g1 = topic.split(0, SplitPlan::Even).unwrap();
    fill(&topic, g1[0], 40, true);
    let g2 = topic.split(g1[0], SplitPlan::Even).unwrap();
    for &c in &g2 {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut m).len(), 90);
    assert!(log.enforce_retention().unwrap() > 0);
    for p in [0, g1[0]] {
        assert!(topic.partition(p).is_err(), "partition {p} was removed");
    }
    let again: Vec<(u32, u64)> = drain(&mut m)
        .iter()
        .map(|r| (r.partition, r.offset))
        .collect();
    assert!(again.is_empty(), "delivered again: {again:?}");
    assert_eq!(group.describe().stats.redelivered, 0);
    assert!(lost(&m).is_empty(), "{:?}", lost(&m));
    let mut owned = m.assignment().partitions;
    owned.sort_unstable();
    let mut want = vec![g1[1], g2[0], g2[1]];
    want.sort_unstable();
    assert_eq!(owned, want);
    drop((m, group, topic));
    log.close().unwrap();
}

/// The group committed inside partition 0; retention removes 0 and a whole
/// generation below it (1 and both its children) while no member runs.
/// After a reopen the next member is told of every removed partition,
/// each once, as a reader from the committed cut reports them; after its
/// commit and another reopen, nobody is. The manifest is compacted all
/// along.
#[test]
fn a_removed_generation_below_a_committed_position_is_reported_after_a_reopen() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    // The manifest is compacted into a snapshot after every record: the
    // position in the removed partition lives in snapshots too.
    let o = fissionlog::LogOptions {
        manifest_compact_records: 1,
        ..common::groups::options(&clock)
    };
    let reopen = |dir: &std::path::Path| {
        let log = Log::open(dir, o.clone()).unwrap();
        let topic = log.topic("t").unwrap();
        let group = topic.group("g", GroupOptions::default()).unwrap();
        (log, topic, group)
    };
    let log = Log::open(root.path(), o.clone()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    fill(&topic, 0, 40, true);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(a.poll(10).unwrap().len(), 10);
    a.commit().unwrap();
    a.leave().unwrap();
    let split_fill = |p: u32, n: u32, old: bool| {
        let kids = topic.split(p, SplitPlan::Even).unwrap();
        for &c in &kids {
            fill(&topic, c, n, old);
        }
        kids
    };
    let g1 = split_fill(0, 10, true);
    let g2 = split_fill(g1[0], 10, true);
    split_fill(g2[0], 5, false);
    split_fill(g2[1], 5, false);
    log.sync().unwrap();
    drop((group, topic));
    log.close().unwrap();
    let (log, topic, group) = reopen(root.path());
    assert!(log.enforce_retention().unwrap() > 0);
    let mut want = vec![(0, 10, 40), (g1[0], 0, 10), (g2[0], 0, 10), (g2[1], 0, 10)];
    want.sort_unstable();
    drop((group, topic));
    log.close().unwrap();

    let (log, topic, group) = reopen(root.path());
    let mut r = topic.reader(StartAt::Cut(group.committed())).unwrap();
    let mut read = 0;
    loop {
        let got = r.poll(1000).unwrap();
        if got.is_empty() {
            break;
        }
        read += got.len();
    }
    let mut from_cut: Vec<_> = r
        .retained()
        .iter()
        .map(|g| (g.partition, g.start, g.end))
        .collect();
    from_cut.sort_unstable();
    assert_eq!(from_cut, want, "a reader from the committed cut");
    assert_eq!(read, 30, "the live partitions: 10 in g1[1], 5 in each of 4");
    let mut b = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut b).len(), read, "what the reader read");
    assert_eq!(lost(&b), want, "the member");
    b.commit().unwrap();
    drop((b, group, topic));
    log.close().unwrap();

    let (log, topic, group) = reopen(root.path());
    let mut c = group.join(member_opts()).unwrap();
    assert!(drain(&mut c).is_empty());
    assert!(lost(&c).is_empty(), "{:?}", lost(&c));
    drop((c, group, topic));
    log.close().unwrap();
}

/// The group exists but never read partition 0 (it would start there at
/// offset 0); retention removes 0 before any member runs. The first member
/// is told of all of 0, as a reader from the oldest data started before
/// the removal reports it; again after a reopen until it commits.
#[test]
fn a_partition_the_group_never_read_is_reported_whole_when_removed() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let topic = log.create_topic("t", config()).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    fill(&topic, 0, 40, true);
    for c in topic.split(0, SplitPlan::Even).unwrap() {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err());
    while !r.poll(1000).unwrap().is_empty() {}
    let from_reader: Vec<_> = r
        .retained()
        .iter()
        .map(|g| (g.partition, g.start, g.end))
        .collect();
    assert_eq!(from_reader, vec![(0, 0, 40)]);
    let mut b = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut b).len(), 10);
    assert_eq!(lost(&b), from_reader, "the member");
    drop((b, r, group, topic));
    log.close().unwrap();

    let (log, topic, group) = reopen(root.path(), &clock);
    let mut c = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut c).len(), 10);
    assert_eq!(lost(&c), from_reader, "told again after the reopen");
    c.commit().unwrap();
    drop((c, group, topic));
    log.close().unwrap();

    let (log, topic, group) = reopen(root.path(), &clock);
    let mut d = group.join(member_opts()).unwrap();
    assert!(drain(&mut d).is_empty());
    assert!(lost(&d).is_empty(), "{:?}", lost(&d));
    drop((d, group, topic));
    log.close().unwrap();
}
