//! Probes of how consumer groups report what retention removed under a
//! committed position: the report matches what a reader from the group's
//! committed cut reports, is settled by one commit for good (also across
//! reopens), and every record is either delivered or reported.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::groups::{drain, member_opts, open};
use fissionlog::{
    GroupOptions, ManualClock, Member, NewRecord, SplitPlan, StartAt, Topic, TopicConfig,
};

/// Old enough for a one-hour retention age.
const OLD_TS: i64 = 1_000;

fn config() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 4096,
        retention_age: Some(Duration::from_secs(3600)),
        ..TopicConfig::default()
    }
}

/// Appends `n` records routed to partition `p` (old ones when `old`).
fn fill(topic: &Topic, p: u32, n: u32, old: bool) {
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

fn lost(m: &Member) -> Vec<(u32, u64, u64)> {
    let mut v: Vec<_> = m
        .retained()
        .iter()
        .map(|g| (g.partition, g.start, g.end))
        .collect();
    v.sort_unstable();
    v
}

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
    //! Model-based accounting of consumer groups under retention: random
    //! appends (old records retention removes, fresh ones it keeps),
    //! splits, merges, retention passes, joins, leaves, crashes, stalls,
    //! polls, commits and reopens. Every record appended is delivered to
    //! some member or lies in a range some member reported through
    //! `Member::retained()`; a record is delivered again only after the
    //! member holding it uncommitted lost its partitions, and never after
    //! the group committed it.

    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::sync::Arc;
    use std::time::Duration;

    use fissionlog::{
        Group, GroupOptions, Log, LogOptions, ManualClock, Member, MemberOptions, NewRecord,
        OwnedRecord, SplitPlan, Topic, TopicConfig,
    };
    use proptest::prelude::*;

    use super::OLD_TS;

    const KEYS: u64 = 12;

    #[derive(Debug, Clone)]
    pub enum Op {
        Append(u8, bool),
        Join(Option<u8>),
        Poll(u8, u8),
        Commit(u8),
        PollCommit(u8, u8),
        Advance(u8, u8),
        Crash(u8),
        Leave(u8),
        Split(u8),
        Merge(u8),
        Retention,
        Reopen,
    }

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
            3 => Just(Op::Retention),
            1 => Just(Op::Reopen),
        ]
    }

    struct Live {
        member: Member,
        uncommitted: BTreeSet<u64>,
        last_seq: BTreeMap<u64, u64>,
        /// How many of its `retained()` ranges were taken already.
        seen_retained: usize,
    }

    pub struct Model {
        dir: tempfile::TempDir,
        clock: Arc<ManualClock>,
        log: Option<Log>,
        topic: Topic,
        group: Group,
        members: Vec<Live>,
        appended: u64,
        /// Where each record was appended.
        at: Vec<(u32, u64)>,
        delivered: HashMap<u64, u32>,
        committed: BTreeSet<u64>,
        may_repeat: BTreeSet<u64>,
        /// Every range any member reported.
        reported: Vec<(u32, u64, u64)>,
        /// Key `k` hashes into the `k`-th of `KEYS` equal slices of the
        /// hash space, so routing does not depend on the topic's random
        /// hash key.
        keys: Vec<String>,
    }

    fn opts(clock: &Arc<ManualClock>) -> LogOptions {
        LogOptions {
            clock: clock.clone(),
            balancer: false,
            background_retention: false,
            manifest_compact_records: 16,
            ..LogOptions::default()
        }
    }

    fn member_opts(instance: Option<u8>) -> MemberOptions {
        MemberOptions {
            session_timeout: Duration::from_secs(10),
            processing_timeout: Duration::from_secs(30),
            instance_id: instance.map(|i| format!("static-{i}")),
            background_heartbeat: None,
        }
    }

    fn parse(r: &OwnedRecord) -> (u64, u64) {
        let v = std::str::from_utf8(&r.value).unwrap();
        let (k, s) = v.split_once(':').unwrap();
        (k.parse().unwrap(), s.parse().unwrap())
    }

    impl Model {
        pub fn new() -> Model {
            let dir = tempfile::tempdir().unwrap();
            let clock = Arc::new(ManualClock::new(1_000_000_000));
            let log = Log::open(dir.path(), opts(&clock)).unwrap();
            let topic = log
                .topic_or_create(
                    "t",
                    TopicConfig {
                        partitions: 2,
                        segment_bytes: 4096,
                        retention_age: Some(Duration::from_secs(3600)),
                        ..TopicConfig::default()
                    },
                )
                .unwrap();
            let group = topic.group("g", GroupOptions::default()).unwrap();
            let slice = u64::MAX / KEYS + 1;
            let keys = (0..KEYS)
                .map(|k| {
                    (0..)
                        .map(|j| format!("k{k}-{j}"))
                        .find(|name| topic.hash(name.as_bytes()) / slice == k)
                        .unwrap()
                })
                .collect();
            Model {
                dir,
                clock,
                log: Some(log),
                topic,
                group,
                members: Vec::new(),
                appended: 0,
                at: Vec::new(),
                delivered: HashMap::new(),
                committed: BTreeSet::new(),
                may_repeat: BTreeSet::new(),
                reported: Vec::new(),
                keys,
            }
        }

        fn pick(&self, i: u8) -> Option<usize> {
            (!self.members.is_empty()).then(|| usize::from(i) % self.members.len())
        }

        fn collect_retained(&mut self, i: usize) {
            let live = &mut self.members[i];
            let r = live.member.retained();
            for g in &r[live.seen_retained..] {
                self.reported.push((g.partition, g.start, g.end));
            }
            live.seen_retained = r.len();
        }

        fn lose(&mut self, i: usize) {
            self.collect_retained(i);
            let m = self.members.remove(i);
            self.may_repeat.extend(m.uncommitted);
        }

        fn receive(&mut self, i: usize, got: Vec<OwnedRecord>) {
            self.collect_retained(i);
            for r in &got {
                let (key, seq) = parse(r);
                assert_eq!(
                    self.at[seq as usize],
                    (r.partition, r.offset),
                    "record {seq} where it was appended"
                );
                let n = self.delivered.entry(seq).or_default();
                *n += 1;
                if *n > 1 {
                    assert!(
                        !self.committed.contains(&seq),
                        "record {seq} ({}, {}) delivered again after the group committed it",
                        r.partition,
                        r.offset
                    );
                    assert!(
                        self.may_repeat.contains(&seq),
                        "record {seq} ({}, {}) delivered again outside a lost uncommitted window",
                        r.partition,
                        r.offset
                    );
                } else {
                    let live = &mut self.members[i];
                    if let Some(&prev) = live.last_seq.get(&key) {
                        assert!(seq > prev, "key {key}: {seq} after {prev} to one member");
                    }
                }
                let live = &mut self.members[i];
                live.last_seq.insert(key, seq);
                live.uncommitted.insert(seq);
            }
        }

        fn commit(&mut self, i: usize) {
            match self.members[i].member.commit() {
                Ok(()) => {
                    let done = std::mem::take(&mut self.members[i].uncommitted);
                    self.committed.extend(done);
                }
                Err(fissionlog::Error::Fenced { .. }) => self.lose(i),
                Err(fissionlog::Error::NotAssigned { .. }) => {
                    let held = std::mem::take(&mut self.members[i].uncommitted);
                    self.may_repeat.extend(held);
                }
                Err(e) => panic!("commit: {e}"),
            }
        }

        pub fn apply(&mut self, op: &Op) {
            match *op {
                Op::Append(n, old) => {
                    for _ in 0..n {
                        let s = self.appended;
                        let k = s % KEYS;
                        let key = self.keys[k as usize].clone();
                        let value = format!("{k}:{s}");
                        let a = self
                            .topic
                            .append_batch(&[NewRecord {
                                key: Some(key.as_bytes()),
                                value: value.as_bytes(),
                                timestamp: old.then_some(OLD_TS),
                            }])
                            .unwrap();
                        self.at.push((a[0].partition, a[0].offset));
                        self.appended += 1;
                    }
                }
                Op::Join(instance) => {
                    if self.members.len() >= 4 {
                        return;
                    }
                    if let Some(iid) = instance {
                        let name = format!("static-{iid}");
                        let d = self.group.describe();
                        let old = self.members.iter().position(|m| {
                            d.members.iter().any(|x| {
                                x.id == m.member.id() && x.instance_id.as_ref() == Some(&name)
                            })
                        });
                        if let Some(i) = old {
                            self.lose(i);
                        }
                    }
                    let member = self.group.join(member_opts(instance)).unwrap();
                    self.members.push(Live {
                        member,
                        uncommitted: BTreeSet::new(),
                        last_seq: BTreeMap::new(),
                        seen_retained: 0,
                    });
                }
                Op::Poll(i, n) | Op::PollCommit(i, n) => {
                    let Some(i) = self.pick(i) else { return };
                    match self.members[i].member.poll(usize::from(n)) {
                        Ok(got) => self.receive(i, got),
                        Err(fissionlog::Error::Fenced { .. }) => {
                            self.lose(i);
                            return;
                        }
                        Err(e) => panic!("poll: {e}"),
                    }
                    if matches!(op, Op::PollCommit(..)) {
                        self.commit(i);
                    }
                }
                Op::Commit(i) => {
                    if let Some(i) = self.pick(i) {
                        self.commit(i);
                    }
                }
                Op::Advance(mask, secs) => {
                    for _ in 0..secs {
                        self.clock.advance(Duration::from_secs(1));
                        for (j, m) in self.members.iter().enumerate() {
                            if mask & (1 << (j % 8)) != 0 {
                                let _ = m.member.heartbeat();
                            }
                        }
                    }
                    self.group.tick();
                    let d = self.group.describe();
                    let mut stale = Vec::new();
                    for (j, m) in self.members.iter().enumerate() {
                        let desc = d.members.iter().find(|x| x.id == m.member.id());
                        if desc.is_none_or(|x| x.state == fissionlog::MemberState::Slow) {
                            stale.push(j);
                        }
                    }
                    for j in stale {
                        let held = std::mem::take(&mut self.members[j].uncommitted);
                        self.may_repeat.extend(held);
                    }
                }
                Op::Crash(i) => {
                    if let Some(i) = self.pick(i) {
                        self.lose(i);
                    }
                }
                Op::Leave(i) => {
                    if let Some(i) = self.pick(i) {
                        self.collect_retained(i);
                        let m = self.members.remove(i);
                        self.may_repeat.extend(m.uncommitted);
                        let _ = m.member.leave();
                    }
                }
                Op::Split(i) => {
                    let active = self.topic.active_partitions();
                    if active.len() >= 8 {
                        return;
                    }
                    let p = active[usize::from(i) % active.len()];
                    let _ = self.topic.split(p, SplitPlan::Even);
                }
                Op::Merge(i) => {
                    let mut parts = self.topic.partitions();
                    parts.retain(|p| p.sealed_at.is_none());
                    parts.sort_by_key(|p| p.start);
                    if parts.len() < 2 {
                        return;
                    }
                    let j = usize::from(i) % (parts.len() - 1);
                    let _ = self.topic.merge(parts[j].id, parts[j + 1].id);
                }
                Op::Retention => {
                    let log = self.log.as_ref().unwrap();
                    log.sync().unwrap();
                    log.enforce_retention().unwrap();
                }
                Op::Reopen => {
                    for i in 0..self.members.len() {
                        self.collect_retained(i);
                    }
                    let members = std::mem::take(&mut self.members);
                    for m in members {
                        self.may_repeat.extend(m.uncommitted);
                    }
                    self.log.take().unwrap().close().unwrap();
                    let log = Log::open(self.dir.path(), opts(&self.clock)).unwrap();
                    self.topic = log.topic("t").unwrap();
                    self.group = self.topic.group("g", GroupOptions::default()).unwrap();
                    self.log = Some(log);
                }
            }
        }

        pub fn finish(&mut self) {
            for i in 0..self.members.len() {
                self.collect_retained(i);
            }
            let members = std::mem::take(&mut self.members);
            for m in members {
                self.may_repeat.extend(m.uncommitted);
                let _ = m.member.leave();
            }
            let member = self.group.join(member_opts(None)).unwrap();
            for _ in 0..11 {
                self.clock.advance(Duration::from_secs(1));
                member.heartbeat().unwrap();
            }
            self.members.push(Live {
                member,
                uncommitted: BTreeSet::new(),
                last_seq: BTreeMap::new(),
                seen_retained: 0,
            });
            // Committing after empty polls too: a partition retention
            // emptied under the reader is drained without a record, and a
            // merge child behind it waits for that commit (see
            // `a_parent_emptied_by_retention_does_not_hold_a_merge_child_back`).
            let mut empty = 0;
            while empty < 12 {
                let got = self.members[0].member.poll(500).unwrap();
                empty = if got.is_empty() { empty + 1 } else { 0 };
                self.receive(0, got);
                self.commit(0);
            }
            self.collect_retained(0);
            let missing: Vec<(u64, (u32, u64))> = (0..self.appended)
                .filter(|s| !self.delivered.contains_key(s))
                .map(|s| (s, self.at[s as usize]))
                .filter(|&(_, (p, o))| {
                    !self
                        .reported
                        .iter()
                        .any(|&(q, a, b)| q == p && a <= o && o < b)
                })
                .collect();
            assert!(
                missing.is_empty(),
                "neither delivered nor reported: {missing:?}; reported {:?}",
                self.reported
            );
            assert_eq!(self.group.describe().lag_records, 0);
            // Nothing left to report: the committed cut reports nothing.
            let mut r = self
                .topic
                .reader(fissionlog::StartAt::Cut(self.group.committed()))
                .unwrap();
            assert!(r.poll(1000).unwrap().is_empty());
            assert!(
                r.retained().is_empty(),
                "committed cut still reports {:?}",
                r.retained()
            );
            self.log.take().unwrap().close().unwrap();
        }
    }

    fn cases() -> u32 {
        std::env::var("FISSIONLOG_GROUP_MODEL_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(32)
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: cases(),
            max_shrink_iters: 400,
            ..ProptestConfig::default()
        })]

        #[test]
        fn every_record_is_delivered_or_reported(ops in proptest::collection::vec(op(), 1..60)) {
            let mut m = Model::new();
            for op in &ops {
                m.apply(op);
            }
            m.finish();
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
/// after a poll returned records reads 0, commits, and then every poll is
/// empty: 1 is drained by skipping what retention removed, but nothing
/// commits it, so the merge child 3 never becomes ready and its records
/// are never delivered.
#[test]
#[ignore = "open: a parent emptied by retention holds a merge child back from a consumer committing only after records"]
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
