//! How consumer groups report what retention removed under a
//! committed position: the report matches what a reader from the group's
//! committed cut reports, is settled by one commit for good (also across
//! reopens), and every record is either delivered or reported.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::groups::{drain, member_opts, open};
use common::retention::{config, fill, lost};
use fissionlog::{GroupOptions, ManualClock, NewRecord, SplitPlan, StartAt, Topic, TopicConfig};

/// What a reader from the group's committed cut reports as removed.
fn reader_lost(topic: &Topic, group: &fissionlog::Group) -> (usize, Vec<(u32, u64, u64)>) {
    let mut r = topic.reader(StartAt::Cut(group.committed())).unwrap();
    let mut n = 0;
    loop {
        let got = r.poll(1000).unwrap();
        if got.is_empty() {
            break;
        }
        n += got.len();
    }
    let mut v: Vec<_> = r
        .retained()
        .iter()
        .map(|g| (g.partition, g.start, g.end))
        .collect();
    v.sort_unstable();
    (n, v)
}

/// The group commits inside partition 0 and its coordinator then sees
/// nothing while 0 splits, its child 1 splits again and retention removes
/// 0 and 1 together. The next member is told of both (the rest of 0, all
/// of 1) and commits: that settles both for good, in the manifest too, so
/// a reopen tells nobody again and the committed cut names neither.
#[test]
fn a_settled_loss_spanning_two_removed_generations_stays_settled_after_a_reopen() {
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
    a.leave().unwrap();
    // The coordinator is not asked anything from here until `b` joins.
    let g1 = topic.split(0, SplitPlan::Even).unwrap();
    fill(&topic, g1[0], 40, true);
    fill(&topic, g1[1], 5, false);
    let g2 = topic.split(g1[0], SplitPlan::Even).unwrap();
    for &c in &g2 {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    for p in [0, g1[0]] {
        assert!(topic.partition(p).is_err(), "partition {p} was removed");
    }
    let mut want = vec![(0, 10, 40), (g1[0], 0, 40)];
    want.sort_unstable();
    let mut b = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut b).len(), 15);
    assert_eq!(lost(&b), want);
    b.commit().unwrap();
    let (n, from_cut) = reader_lost(&topic, &group);
    assert_eq!(n, 0);
    assert!(
        from_cut.is_empty(),
        "committed cut still reports {from_cut:?}"
    );
    b.leave().unwrap();
    drop((group, topic));
    log.close().unwrap();

    let log = open(root.path(), &clock);
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let (n, from_cut) = reader_lost(&topic, &group);
    assert_eq!(n, 0);
    assert!(
        from_cut.is_empty(),
        "after a reopen the committed cut reports {from_cut:?}"
    );
    let mut c = group.join(member_opts()).unwrap();
    assert!(drain(&mut c).is_empty());
    assert!(
        lost(&c).is_empty(),
        "told again after the settling commit: {:?}",
        lost(&c)
    );
    drop((c, group, topic));
    log.close().unwrap();
}

mod model {
    //! Model-based accounting of consumer groups under retention, through
    //! the group model of `tests/common/group_model.rs` with retention:
    //! random appends (old records retention removes, fresh ones it
    //! keeps), splits, merges, retention passes, joins, leaves, crashes,
    //! stalls, polls, commits and reopens. Every record appended is
    //! delivered to some member or lies in a range some member reported
    //! through `Member::retained()`; a record is delivered again only after
    //! the member holding it uncommitted lost its partitions, and never
    //! after the group committed it.

    use proptest::prelude::*;

    use crate::common::group_model::{cases, rng_seed, Model, Op, Tail};

    pub fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u8..60, 0u8..3).prop_map(|(n, old)| Op::Append(n, old > 0)),
            2 => proptest::option::of(0u8..3).prop_map(Op::Join),
            4 => (any::<u8>(), 1u8..40).prop_map(|(m, n)| Op::Poll(m, n)),
            3 => any::<u8>().prop_map(Op::Commit),
            5 => (any::<u8>(), 1u8..40).prop_map(|(m, n)| Op::PollCommit(m, n)),
            2 => (any::<u8>(), 1u8..20).prop_map(|(mask, s)| Op::Advance(mask, s)),
            1 => any::<u8>().prop_map(Op::Crash),
            1 => any::<u8>().prop_map(Op::Leave),
            3 => any::<u8>().prop_map(Op::Split),
            2 => any::<u8>().prop_map(Op::Merge),
            // From `n/4` of the partition's end.
            2 => (any::<u8>(), 0u8..4).prop_map(|(p, n)| Op::TailSplit(p, Tail::Quarters(n))),
            3 => Just(Op::Retention),
            1 => Just(Op::Reopen(false)),
        ]
    }

    /// A case the model found: three members, a tail split of the
    /// partition one of them read past its commit, then a join. The child
    /// holding the moved records that member had handed out moved to the
    /// new member at once (the group saw nothing handed out in the child,
    /// only in the parent), which read them again outside any window a
    /// member lost uncommitted. A move now waits for the commit of what the
    /// owner handed out through the parent.
    #[test]
    fn a_tail_split_under_uncommitted_reads_delivers_no_uncounted_duplicate() {
        let ops = [
            Op::Append(1, false),
            Op::Join(None),
            Op::Append(36, false),
            Op::PollCommit(0, 1),
            Op::Poll(0, 1),
            Op::Join(None),
            Op::TailSplit(72, Tail::Quarters(0)),
            Op::Join(None),
            Op::PollCommit(14, 1),
        ];
        Model::with_retention().run(&ops);
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: cases(),
            max_shrink_iters: 400,
            rng_seed: rng_seed(),
            ..ProptestConfig::default()
        })]

        #[test]
        fn every_record_is_delivered_or_reported(ops in proptest::collection::vec(op(), 1..60)) {
            Model::with_retention().run(&ops);
        }
    }
}

/// Open file descriptors of this process that point under `dir`.
fn fds_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

/// A log closed and dropped with every handle leaves no file of it open,
/// also when a consumer group of a topic was used: the group's
/// coordinator must not keep the closed log's topic (and its partitions'
/// files) alive.
#[test]
fn a_closed_log_with_a_group_keeps_no_file_open() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().canonicalize().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    for round in 0..3 {
        let log = open(&dir, &clock);
        let topic = log.topic_or_create("t", config()).unwrap();
        fill(&topic, 0, 10, false);
        let group = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = group.join(member_opts()).unwrap();
        assert!(!drain(&mut m).is_empty() || round > 0);
        m.commit().unwrap();
        m.leave().unwrap();
        drop((group, topic));
        log.close().unwrap();
        assert_eq!(
            fds_under(&dir),
            0,
            "round {round}: files of the closed log still open"
        );
    }
}

/// Partition 0 (fresh records) splits into 1 (old records only) and 2
/// (empty), which merge into 3 (fresh records). Retention empties 1 but
/// cannot remove it (its parent 0 stays). A consumer that commits only
/// after a poll returned records reads 0 and commits; the next poll
/// reports 1's removed records (`retained`) and returns nothing. The poll
/// after it commits 1 as read by itself (nothing was left to hand out and
/// the loss was reported in an earlier poll), so the merge child 3 becomes
/// ready and its records are delivered.
#[test]
fn a_parent_emptied_by_retention_does_not_hold_a_merge_child_back() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let topic = log.create_topic("t", config()).unwrap();
    fill(&topic, 0, 5, false);
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    fill(&topic, kids[0], 40, true);
    let merged = topic.merge(kids[0], kids[1]).unwrap();
    fill(&topic, merged, 5, false);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(
        topic.partition(kids[0]).is_ok(),
        "1 is emptied, not removed"
    );
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    // Exactly 0's records first: the children come in later polls.
    let mut got = m.poll(5).unwrap().len();
    assert_eq!(got, 5);
    m.commit().unwrap();
    for _ in 0..10 {
        let n = m.poll(1000).unwrap().len();
        if n > 0 {
            got += n;
            m.commit().unwrap();
        }
    }
    assert_eq!(lost(&m), vec![(kids[0], 0, 40)]);
    assert_eq!(got, 10, "the merge child's records were never delivered");
    drop((m, group, topic));
    log.close().unwrap();
}

/// As above, with the process gone right after the poll that reported
/// 1's removed records (before any later poll): the commit of 1 as read
/// waits for a later poll, so after the reopen a member is told the loss
/// again, then gets the merge child's records.
#[test]
fn a_loss_reported_by_the_last_poll_before_a_crash_is_reported_again() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let kids = {
        let log = open(root.path(), &clock);
        let topic = log.create_topic("t", config()).unwrap();
        fill(&topic, 0, 5, false);
        let kids = topic.split(0, SplitPlan::Even).unwrap();
        fill(&topic, kids[0], 40, true);
        let merged = topic.merge(kids[0], kids[1]).unwrap();
        fill(&topic, merged, 5, false);
        log.sync().unwrap();
        assert!(log.enforce_retention().unwrap() > 0);
        let group = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = group.join(member_opts()).unwrap();
        assert_eq!(m.poll(5).unwrap().len(), 5);
        m.commit().unwrap();
        let mut polls = 0;
        while lost(&m).is_empty() {
            assert!(m.poll(1000).unwrap().is_empty());
            polls += 1;
            assert!(polls < 5, "the loss is reported");
        }
        assert_eq!(lost(&m), vec![(kids[0], 0, 40)]);
        drop((m, group, topic));
        log.abandon();
        kids
    };
    let log = open(root.path(), &clock);
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    let mut got = 0;
    for _ in 0..10 {
        let n = m.poll(1000).unwrap().len();
        if n > 0 {
            got += n;
            m.commit().unwrap();
        }
    }
    assert_eq!(lost(&m), vec![(kids[0], 0, 40)], "told again");
    assert_eq!(got, 5, "the merge child's records");
    drop((m, group, topic));
    log.close().unwrap();
}

/// The group committed partition 0 exactly to where it is then sealed (a
/// split right after the commit): retention removing 0 loses nothing of
/// the group's. Nobody is told anything, before or after a commit or a
/// reopen, and the settling commit drops the position.
#[test]
fn a_committed_position_at_the_seal_reports_nothing() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let topic = log.create_topic("t", config()).unwrap();
    fill(&topic, 0, 40, true);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut a).len(), 40);
    a.commit().unwrap();
    a.leave().unwrap();
    assert_eq!(group.committed().positions.get(&0), Some(&40));
    for c in topic.split(0, SplitPlan::Even).unwrap() {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err());
    let (n, from_cut) = reader_lost(&topic, &group);
    assert_eq!(n, 10);
    assert!(from_cut.is_empty(), "{from_cut:?}");
    let mut b = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut b).len(), 10);
    assert!(lost(&b).is_empty(), "{:?}", lost(&b));
    b.commit().unwrap();
    assert_eq!(group.committed().positions.get(&0), None);
    drop((b, group, topic));
    log.close().unwrap();
    let log = open(root.path(), &clock);
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    assert_eq!(group.committed().positions.get(&0), None);
    let mut c = group.join(member_opts()).unwrap();
    assert!(drain(&mut c).is_empty());
    assert!(lost(&c).is_empty(), "{:?}", lost(&c));
    drop((c, group, topic));
    log.close().unwrap();
}

/// Records stamped `secs_old` seconds short of the one-hour retention age
/// in the past... plus `margin_ms`: old enough for retention once the
/// margin has passed.
fn nearly_old(margin_ms: i64) -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    now - 3_600_000 + margin_ms
}

/// Appends `n` records to partition `p` stamped `ts`.
fn fill_at(topic: &Topic, p: u32, n: u32, ts: i64) {
    let k = (0..)
        .map(|k| format!("key-{k}"))
        .find(|k| topic.route(k.as_bytes()) == p)
        .unwrap();
    for i in 0..n {
        topic
            .append_batch(&[NewRecord {
                key: Some(k.as_bytes()),
                value: format!("{p}:{i}").as_bytes(),
                timestamp: Some(ts),
            }])
            .unwrap();
    }
}

/// Two root partitions merge into 2. The group committed inside both
/// parents; retention removes one parent, later the other (its records
/// age meanwhile). The merge child waits for both; its owner is told of
/// the rest of both parents, each once, and its commit settles both: a
/// reopen tells nobody and the committed cut names neither.
#[test]
fn merge_parents_removed_at_different_times_are_each_reported_once() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                ..config()
            },
        )
        .unwrap();
    let later = nearly_old(1_500);
    fill(&topic, 0, 40, true);
    fill_at(&topic, 1, 30, later);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let got = drain(&mut a);
    // Commit 10 of each parent.
    let upto = |p: u32| {
        got.iter()
            .filter(|r| r.partition == p)
            .nth(9)
            .map(|r| r.offset + 1)
            .unwrap()
    };
    a.commit_positions(&[(0, upto(0)), (1, upto(1))]).unwrap();
    a.leave().unwrap();
    let merged = topic.merge(0, 1).unwrap();
    fill(&topic, merged, 5, false);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err(), "0 removed first");
    assert!(topic.partition(1).is_ok(), "1 not old yet");
    let mut b = group.join(member_opts()).unwrap();
    let first = drain(&mut b);
    let mut got_b: Vec<(u32, u64)> = first.iter().map(|r| (r.partition, r.offset)).collect();
    assert_eq!(
        got_b.iter().filter(|r| r.0 == 1).count(),
        20,
        "the rest of 1 delivered"
    );
    b.commit().unwrap();
    // 1 committed as read: the merge child is b's, and b is told of 0.
    got_b.extend(drain(&mut b).iter().map(|r| (r.partition, r.offset)));
    assert_eq!(lost(&b), vec![(0, 10, 40)]);
    assert_eq!(got_b.iter().filter(|r| r.0 == merged).count(), 5);
    b.commit().unwrap();
    // Now 1 ages and goes: nothing of it was left unread.
    let wait = later + 3_600_000 + 100
        - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
    if wait > 0 {
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(1).is_err(), "1 removed now");
    assert!(drain(&mut b).is_empty());
    assert_eq!(lost(&b), vec![(0, 10, 40)], "nothing more");
    b.commit().unwrap();
    let (n, from_cut) = reader_lost(&topic, &group);
    assert_eq!(n, 0);
    assert!(from_cut.is_empty(), "{from_cut:?}");
    drop((b, group, topic));
    log.close().unwrap();
    let log = open(root.path(), &clock);
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut c = group.join(member_opts()).unwrap();
    assert!(drain(&mut c).is_empty());
    assert!(lost(&c).is_empty(), "{:?}", lost(&c));
    drop((c, group, topic));
    log.close().unwrap();
}

/// As above, but the member reads part of the second parent without
/// committing when retention removes it: it reports the rest of 1 from
/// its own position, and the rest of 0 from the committed one once the
/// merge child is its, each once; its commit settles both.
#[test]
fn a_merge_parent_removed_under_a_member_reading_it_is_reported_once() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                ..config()
            },
        )
        .unwrap();
    let later = nearly_old(1_500);
    fill(&topic, 0, 40, true);
    fill_at(&topic, 1, 30, later);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let got = drain(&mut a);
    let upto = |p: u32| {
        got.iter()
            .filter(|r| r.partition == p)
            .nth(9)
            .map(|r| r.offset + 1)
            .unwrap()
    };
    a.commit_positions(&[(0, upto(0)), (1, upto(1))]).unwrap();
    a.leave().unwrap();
    let merged = topic.merge(0, 1).unwrap();
    fill(&topic, merged, 5, false);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err(), "0 removed first");
    let mut b = group.join(member_opts()).unwrap();
    let first = b.poll(5).unwrap();
    assert!(first.iter().all(|r| r.partition == 1), "{first:?}");
    assert_eq!(first.len(), 5);
    assert!(
        lost(&b).is_empty(),
        "the merge child is not ready: {:?}",
        lost(&b)
    );
    let redelivered = group.describe().stats.redelivered;
    let wait = later + 3_600_000 + 100
        - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
    if wait > 0 {
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(1).is_err(), "1 removed now");
    let rest = drain(&mut b);
    assert_eq!(rest.len(), 5, "the merge child");
    assert!(rest.iter().all(|r| r.partition == merged));
    assert_eq!(lost(&b), vec![(0, 10, 40), (1, 15, 30)]);
    assert_eq!(group.describe().stats.redelivered, redelivered);
    b.commit().unwrap();
    let (n, from_cut) = reader_lost(&topic, &group);
    assert_eq!(n, 0);
    assert!(from_cut.is_empty(), "{from_cut:?}");
    drop((b, group, topic));
    log.close().unwrap();
    let log = open(root.path(), &clock);
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut c = group.join(member_opts()).unwrap();
    assert!(drain(&mut c).is_empty());
    assert!(lost(&c).is_empty(), "{:?}", lost(&c));
    drop((c, group, topic));
    log.close().unwrap();
}

/// A power loss before every I/O step of the retention pass that removes
/// partition 0 under the group's committed position (the manifest
/// compacted into a snapshot after every record): after the reopen, every
/// record of 0 past the committed position is delivered or reported, the
/// children are delivered, nothing below the committed position comes
/// again; after the next member's commit and another reopen, nothing is
/// delivered or reported again.
#[test]
fn a_power_loss_during_the_removal_under_a_committed_position_loses_nothing() {
    use common::crash::CrashOptions;
    use common::model_hook::ModelHook;
    use fissionlog::IoOp;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir_all(&dir).unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let o = fissionlog::LogOptions {
        manifest_compact_records: 1,
        ..common::groups::options(&clock)
    };
    let hook = ModelHook::new(&dir, None);
    hook.grant_segment_headers(true);
    let log = fissionlog::Log::open_with_hook(&dir, o.clone(), hook.clone()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    fill(&topic, 0, 40, true);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(a.poll(10).unwrap().len(), 10);
    a.commit().unwrap();
    a.leave().unwrap();
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    for &c in &kids {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    hook.record_steps(true);
    assert!(log.enforce_retention().unwrap() > 0);
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    assert!(points.len() >= 2, "steps: {}", points.len());
    drop((group, topic));
    log.abandon();
    let reopen = |at: &std::path::Path| {
        let log = fissionlog::Log::open(at, o.clone()).unwrap();
        let topic = log.topic("t").unwrap();
        let group = topic.group("g", GroupOptions::default()).unwrap();
        (log, topic, group)
    };
    let mut removed = 0;
    for (i, point) in points.iter().enumerate() {
        let (image, trace) = point.image(i as u64 * 13 + 5, &CrashOptions::default());
        let ctx = format!("step {i} (before {:?}): {}", point.op, trace.join("; "));
        let d = tempfile::tempdir().unwrap();
        let at = d.path().join("log");
        image.write_to(&at).unwrap();
        let (log, topic, group) = reopen(&at);
        if topic.partition(0).is_err() {
            removed += 1;
        }
        let mut m = group.join(member_opts()).unwrap();
        let got: Vec<(u32, u64)> = drain(&mut m)
            .iter()
            .map(|r| (r.partition, r.offset))
            .collect();
        let told = lost(&m);
        let mut seen = got.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), got.len(), "{ctx}: delivered twice: {got:?}");
        for o in 0..40u64 {
            let delivered = got.contains(&(0, o));
            let reported = told.iter().any(|&(p, s, e)| p == 0 && s <= o && o < e);
            if o < 10 {
                assert!(!delivered, "{ctx}: committed record 0/{o} again");
            } else {
                assert!(delivered || reported, "{ctx}: 0/{o} lost: {told:?}");
            }
        }
        for &c in &kids {
            assert_eq!(
                got.iter().filter(|r| r.0 == c).count(),
                5,
                "{ctx}: child {c}"
            );
        }
        m.commit().unwrap();
        drop((m, group, topic));
        log.close().unwrap();
        let (log, topic, group) = reopen(&at);
        let mut m = group.join(member_opts()).unwrap();
        let again = drain(&mut m);
        assert!(again.is_empty(), "{ctx}: {} records again", again.len());
        assert!(lost(&m).is_empty(), "{ctx}: told again {:?}", lost(&m));
        drop((m, group, topic));
        log.close().unwrap();
    }
    assert!(removed > 0, "no image with the removal durable");
    assert!(removed < points.len(), "no image without it");
}

/// A group deleted before retention removes the partition it had
/// committed in, then created again under the same name (from the
/// earliest data): the new group reads what is there and is told nothing
/// of the old group's position, before and after a reopen.
#[test]
fn a_group_deleted_before_the_removal_and_created_again_is_told_nothing() {
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
    a.leave().unwrap();
    drop(group);
    topic.delete_group("g").unwrap();
    for c in topic.split(0, SplitPlan::Even).unwrap() {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err());
    let group = topic.group("g", GroupOptions::default()).unwrap();
    assert!(group.committed().positions.is_empty());
    let mut b = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut b).len(), 10);
    assert!(lost(&b).is_empty(), "{:?}", lost(&b));
    drop((b, group, topic));
    log.close().unwrap();
    let log = open(root.path(), &clock);
    let topic = log.topic("t").unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut c = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut c).len(), 10, "nothing committed");
    assert!(lost(&c).is_empty(), "{:?}", lost(&c));
    drop((c, group, topic));
    log.close().unwrap();
}

/// A member told of a loss names the removed partition in
/// `commit_positions`: there is nothing to commit there, the commit is
/// accepted and (the member was told) settles the loss: the next member
/// is told nothing.
#[test]
fn a_told_member_naming_the_removed_partition_in_commit_positions_settles_it() {
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
    a.leave().unwrap();
    for c in topic.split(0, SplitPlan::Even).unwrap() {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    let mut b = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut b).len(), 10);
    assert_eq!(lost(&b), vec![(0, 10, 40)]);
    b.commit_positions(&[(0, 40)]).unwrap();
    assert_eq!(group.committed().positions.get(&0), None);
    drop(b);
    clock.advance(common::groups::SESSION + Duration::from_secs(1));
    group.tick();
    let mut c = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut c).len(), 10, "the children, not committed");
    assert!(lost(&c).is_empty(), "{:?}", lost(&c));
    drop((c, group, topic));
    log.close().unwrap();
}

/// Retention removes partition 0 under the group's committed position
/// while its children 1 and 2 are still empty; a member takes both and is
/// told of the rest of 0. Then 1 and 2 merge into 3: the member's next
/// poll passes the empty parents (committing them by itself) and reads 3.
/// It holds what continues 0 all along and was told already: it must not
/// be told again.
#[test]
fn a_member_is_not_told_twice_when_what_continues_the_loss_merges() {
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
    a.leave().unwrap();
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err());
    let mut b = group.join(member_opts()).unwrap();
    assert!(drain(&mut b).is_empty());
    assert_eq!(lost(&b), vec![(0, 10, 40)]);
    let merged = topic.merge(kids[0], kids[1]).unwrap();
    fill(&topic, merged, 5, false);
    assert_eq!(drain(&mut b).len(), 5);
    assert_eq!(lost(&b), vec![(0, 10, 40)], "told once");
    b.commit().unwrap();
    assert_eq!(group.committed().positions.get(&0), None);
    drop((b, group, topic));
    log.close().unwrap();
}

/// Partition 0 holds 40 old records; the group committed 10. A tail split
/// from offset 20 moves 20..40 into the children (where they are read);
/// retention then removes 0. What the group lost is 0's records 10..20
/// only: the moved ones are delivered from the children, and a report up
/// to 0's physical seal would count them lost too.
#[test]
fn a_tail_split_parent_removed_under_a_committed_position_reports_to_its_logical_end() {
    use fissionlog::TailSplitOptions;
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
    a.leave().unwrap();
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(20))
        .unwrap();
    assert_eq!(out.from, 20);
    assert_eq!(out.moved.iter().sum::<u64>(), 20);
    for &c in &out.children {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err(), "0 removed");
    let (n, from_cut) = reader_lost(&topic, &group);
    let mut b = group.join(member_opts()).unwrap();
    let got = drain(&mut b);
    assert_eq!(got.len(), 30, "moved and fresh records of the children");
    assert_eq!(lost(&b), vec![(0, 10, 20)], "the member");
    assert_eq!(
        (n, from_cut),
        (30, vec![(0, 10, 20)]),
        "a reader from the cut"
    );
    b.commit().unwrap();
    drop((b, group, topic));
    log.close().unwrap();
}

/// As above with the group's position (30) past the tail split's start
/// (20): the position continues in the children, so removing 0 loses
/// nothing of the group's; nothing is reported and only the moved records
/// past 30 (and fresh ones) are delivered.
#[test]
fn a_tail_split_parent_removed_below_a_translated_position_reports_nothing() {
    use fissionlog::TailSplitOptions;
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let topic = log.create_topic("t", config()).unwrap();
    fill(&topic, 0, 40, true);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(a.poll(30).unwrap().len(), 30);
    a.commit().unwrap();
    a.leave().unwrap();
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(20))
        .unwrap();
    assert_eq!(out.from, 20);
    for &c in &out.children {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err(), "0 removed");
    let (n, from_cut) = reader_lost(&topic, &group);
    let mut b = group.join(member_opts()).unwrap();
    let got = drain(&mut b);
    assert_eq!(got.len(), 20, "10 moved past 30 and 10 fresh");
    assert!(lost(&b).is_empty(), "{:?}", lost(&b));
    assert_eq!((n, from_cut), (20, vec![]), "a reader from the cut");
    b.commit().unwrap();
    drop((b, group, topic));
    log.close().unwrap();
}

/// Partitions 0 (old records) and 1 (fresh) merge into 2. Member `a`
/// reads 15 records of 0 with 10 committed when retention removes 0: it
/// reports the rest of 0 from its own position (15..40) and commits. The
/// merge child is not ready yet (1 is not read to its end), so nobody was
/// handed the group's loss. `a` leaves; `b` reads 1 to its end and gets
/// the merge child. Everything of 0 past the committed position was
/// delivered or reported by `a`, whose commit came after: `b` must not
/// be told of 0 again.
#[test]
fn a_loss_reported_and_committed_by_the_reading_member_is_not_told_to_the_next() {
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                ..config()
            },
        )
        .unwrap();
    fill(&topic, 0, 40, true);
    fill(&topic, 1, 100, false);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut from0 = 0;
    while from0 < 15 {
        from0 += a
            .poll(1)
            .unwrap()
            .iter()
            .filter(|r| r.partition == 0)
            .count();
    }
    a.commit_positions(&[(0, 10)]).unwrap();
    let merged = topic.merge(0, 1).unwrap();
    fill(&topic, merged, 5, false);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err(), "0 removed");
    assert!(a.poll(1).unwrap().iter().all(|r| r.partition == 1));
    assert_eq!(lost(&a), vec![(0, 15, 40)], "a reports the rest itself");
    a.commit().unwrap();
    a.leave().unwrap();
    let mut b = group.join(member_opts()).unwrap();
    let mut got = drain(&mut b);
    b.commit().unwrap();
    got.extend(drain(&mut b));
    assert_eq!(got.iter().filter(|r| r.partition == merged).count(), 5);
    assert!(
        lost(&b).is_empty(),
        "a reported 0 and committed after: {:?}",
        lost(&b)
    );
    drop((b, group, topic));
    log.close().unwrap();
}

/// A member handed out records of partition 0 when retention removes it;
/// the application commits what it processed by offset, naming 0 with a
/// child: the commit is accepted (0 has nothing left to commit), the
/// child's position is committed, and the group's loss in 0 (reported by
/// the member itself) is settled.
#[test]
fn commit_positions_naming_a_partition_removed_under_the_member_is_accepted() {
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
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    for &c in &kids {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err());
    let got = drain(&mut a);
    assert_eq!(got.len(), 10);
    assert_eq!(lost(&a), vec![(0, 15, 40)]);
    let c = got[0].partition;
    let upto = got.iter().filter(|r| r.partition == c).count() as u64;
    a.commit_positions(&[(0, 15), (c, upto)]).unwrap();
    assert_eq!(group.committed().positions.get(&c), Some(&upto));
    assert_eq!(group.committed().positions.get(&0), None, "settled");
    drop((a, group, topic));
    log.close().unwrap();
}

/// Partitions 0 (one fresh record) and 1 merge into 2, which gets two old
/// records and is tail-split from offset 1. A retention pass reclaims
/// 2's moved range and deletes its old segment (2 stays: its parent 0
/// does); after a clean close the log opens again (it took the released
/// range for missing data: "the partition ends at offset 1 but the
/// checkpoint says offsets up to 2 are durable").
#[test]
fn a_log_reopens_after_retention_reclaims_a_tail_split_parent() {
    use fissionlog::TailSplitOptions;
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                ..config()
            },
        )
        .unwrap();
    fill(&topic, 0, 1, false);
    let merged = topic.merge(0, 1).unwrap();
    fill(&topic, merged, 2, true);
    let out = topic
        .split_tail(merged, SplitPlan::Even, TailSplitOptions::from_offset(1))
        .unwrap();
    assert_eq!(out.from, 1);
    log.sync().unwrap();
    log.enforce_retention().unwrap();
    drop(topic);
    log.close().unwrap();
    for _ in 0..2 {
        let log = fissionlog::Log::open(root.path(), common::groups::options(&clock))
            .expect("a clean close opens again");
        let topic = log.topic("t").unwrap();
        let mut r = topic.reader(StartAt::Earliest).unwrap();
        let mut n = 0;
        loop {
            let got = r.poll(100).unwrap();
            if got.is_empty() {
                break;
            }
            n += got.len();
        }
        assert!(n >= 1, "the fresh record of 0");
        drop((r, topic));
        log.close().unwrap();
    }
}
