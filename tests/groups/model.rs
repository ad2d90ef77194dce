//! Model-based property test of consumer groups, in simulated time: random
//! joins (static or not), leaves, crashes (a member stops), stalls (time
//! passes while some members neither heartbeat nor poll), polls, commits,
//! splits, tail splits, merges and log reopens. The oracle checks:
//!
//! - a record the group committed is never delivered again;
//! - every other duplicate comes from a member that lost its partition
//!   (died, left, was replaced, was stuck) before committing it;
//! - per key, what one member receives is in append order (apart from
//!   those duplicates);
//! - at the end every appended record was delivered at least once;
//! - no partition is readable by two live members at once: every record a
//!   poll returns belongs to a partition the coordinator assigns to that
//!   member (or pins to one it owns).
//!
//! `FISSIONLOG_GROUP_MODEL_CASES` raises the number of cases (default 32).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fissionlog::{
    Group, GroupOptions, Log, LogOptions, ManualClock, Member, MemberOptions, OwnedRecord,
    SplitPlan, SyncPolicy, Topic, TopicConfig,
};
use proptest::prelude::*;

const KEYS: u64 = 12;

#[derive(Debug, Clone)]
enum Op {
    Append(u8),
    Join(Option<u8>),
    Poll(u8, u8),
    Commit(u8),
    PollCommit(u8, u8),
    /// Time passes; members whose bit is set in the mask heartbeat.
    Advance(u8, u8),
    Crash(u8),
    Leave(u8),
    Split(u8),
    Merge(u8),
    /// Tail split of an active partition: from this many records before
    /// its end, or (255) from the group's slowest position.
    TailSplit(u8, u8),
    /// Close (or abandon, as a crash that keeps the page cache) and open.
    Reopen(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u8..30).prop_map(Op::Append),
        2 => proptest::option::of(0u8..3).prop_map(Op::Join),
        4 => (any::<u8>(), 1u8..40).prop_map(|(m, n)| Op::Poll(m, n)),
        3 => any::<u8>().prop_map(Op::Commit),
        5 => (any::<u8>(), 1u8..40).prop_map(|(m, n)| Op::PollCommit(m, n)),
        2 => (any::<u8>(), 1u8..20).prop_map(|(mask, s)| Op::Advance(mask, s)),
        1 => any::<u8>().prop_map(Op::Crash),
        1 => any::<u8>().prop_map(Op::Leave),
        1 => any::<u8>().prop_map(Op::Split),
        1 => any::<u8>().prop_map(Op::Merge),
        2 => (any::<u8>(), prop_oneof![0u8..40, Just(255u8)]).prop_map(|(p, b)| Op::TailSplit(p, b)),
        1 => any::<bool>().prop_map(Op::Reopen),
    ]
}

struct Live {
    member: Member,
    /// Records delivered and not committed by this member.
    uncommitted: BTreeSet<u64>,
    /// Per key, the last sequence number it received.
    last_seq: BTreeMap<u64, u64>,
}

struct Model {
    dir: tempfile::TempDir,
    hash_seed: u64,
    clock: Arc<ManualClock>,
    log: Option<Log>,
    topic: Topic,
    group: Group,
    members: Vec<Live>,
    appended: u64,
    /// Every delivery count per record.
    delivered: HashMap<u64, u32>,
    /// Records some member committed.
    committed: BTreeSet<u64>,
    /// Records a member held uncommitted when it lost its partitions (or
    /// may have): the only ones allowed to come again.
    may_repeat: BTreeSet<u64>,
}

fn opts(clock: &Arc<ManualClock>, hash_seed: u64) -> LogOptions {
    LogOptions {
        clock: clock.clone(),
        topic_hash_seed: Some(hash_seed),
        balancer: false,
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
    /// `hash_seed`: the topic's routing hash key, so a case routes the
    /// same way on every run.
    fn new(hash_seed: u64) -> Model {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let log = Log::open(dir.path(), opts(&clock, hash_seed)).unwrap();
        let topic = log
            .topic_or_create(
                "t",
                TopicConfig {
                    partitions: 2,
                    segment_bytes: 1 << 20,
                    sync: SyncPolicy::Never,
                    ..TopicConfig::default()
                },
            )
            .unwrap();
        let group = topic.group("g", GroupOptions::default()).unwrap();
        Model {
            dir,
            hash_seed,
            clock,
            log: Some(log),
            topic,
            group,
            members: Vec::new(),
            appended: 0,
            delivered: HashMap::new(),
            committed: BTreeSet::new(),
            may_repeat: BTreeSet::new(),
        }
    }

    fn pick(&self, i: u8) -> Option<usize> {
        (!self.members.is_empty()).then(|| usize::from(i) % self.members.len())
    }

    /// A member that lost (or may have lost) its partitions: what it held
    /// uncommitted may come again.
    fn lose(&mut self, i: usize) {
        let m = self.members.remove(i);
        self.may_repeat.extend(m.uncommitted);
    }

    fn receive(&mut self, i: usize, got: Vec<OwnedRecord>) {
        // Ownership: every record's partition is one this member reads.
        let d = self.group.describe();
        let id = self.members[i].member.id();
        for r in &got {
            let (key, seq) = parse(r);
            if let Some(a) = d.assignments.iter().find(|a| a.partition == r.partition) {
                assert_eq!(
                    a.member,
                    Some(id),
                    "partition {} read by a non-owner",
                    r.partition
                );
            }
            let n = self.delivered.entry(seq).or_default();
            *n += 1;
            if *n > 1 {
                assert!(
                    !self.committed.contains(&seq),
                    "record {seq} delivered again after the group committed it"
                );
                assert!(
                    self.may_repeat.contains(&seq),
                    "record {seq} delivered again outside a lost uncommitted window"
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
                // Handed-out records of a partition taken away: they may
                // come again to the new owner.
                let held = std::mem::take(&mut self.members[i].uncommitted);
                self.may_repeat.extend(held);
            }
            Err(e) => panic!("commit: {e}"),
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Append(n) => {
                for _ in 0..n {
                    let s = self.appended;
                    let k = s % KEYS;
                    self.topic
                        .append(
                            Some(format!("k{k}").as_bytes()),
                            format!("{k}:{s}").as_bytes(),
                        )
                        .unwrap();
                    self.appended += 1;
                }
            }
            Op::Join(instance) => {
                if self.members.len() >= 4 {
                    return;
                }
                // A static rejoin replaces the live member with that id.
                if let Some(iid) = instance {
                    let name = format!("static-{iid}");
                    let old =
                        self.members.iter().position(|m| {
                            self.group.describe().members.iter().any(|d| {
                                d.id == m.member.id() && d.instance_id.as_ref() == Some(&name)
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
                // Members past their session or processing timeout may
                // have lost partitions: their uncommitted records may come
                // again (fencing is found at their next call).
                self.group.tick();
                let d = self.group.describe();
                let mut stale = Vec::new();
                for (j, m) in self.members.iter().enumerate() {
                    let desc = d.members.iter().find(|x| x.id == m.member.id());
                    let stuck = desc.is_none_or(|x| x.state == fissionlog::MemberState::Slow);
                    if stuck {
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
            Op::TailSplit(i, back) => {
                let active = self.topic.active_partitions();
                if active.len() >= 8 {
                    return;
                }
                let p = active[usize::from(i) % active.len()];
                let end = self.topic.partition(p).unwrap().end_offset();
                let from = if back == 255 {
                    fissionlog::TailFrom::SlowestGroup
                } else {
                    fissionlog::TailFrom::Offset(end.saturating_sub(u64::from(back)))
                };
                let _ = self.topic.split_tail(
                    p,
                    SplitPlan::Even,
                    fissionlog::TailSplitOptions {
                        from,
                        throttle_bytes_per_sec: 0,
                    },
                );
            }
            Op::Reopen(abandon) => {
                let members = std::mem::take(&mut self.members);
                for m in members {
                    self.may_repeat.extend(m.uncommitted);
                }
                let log = self.log.take().unwrap();
                if abandon {
                    log.abandon();
                } else {
                    log.close().unwrap();
                }
                let log = Log::open(self.dir.path(), opts(&self.clock, self.hash_seed)).unwrap();
                self.topic = log.topic("t").unwrap();
                self.group = self.topic.group("g", GroupOptions::default()).unwrap();
                self.log = Some(log);
            }
        }
    }

    /// One fresh member drains what is left, after everyone else is gone.
    fn finish(&mut self) {
        let members = std::mem::take(&mut self.members);
        for m in members {
            self.may_repeat.extend(m.uncommitted);
            let _ = m.member.leave();
        }
        let member = self.group.join(member_opts(None)).unwrap();
        // Crashed members expire.
        for _ in 0..11 {
            self.clock.advance(Duration::from_secs(1));
            member.heartbeat().unwrap();
        }
        self.members.push(Live {
            member,
            uncommitted: BTreeSet::new(),
            last_seq: BTreeMap::new(),
        });
        loop {
            let got = self.members[0].member.poll(500).unwrap();
            if got.is_empty() {
                break;
            }
            self.receive(0, got);
            self.commit(0);
        }
        let missing: Vec<u64> = (0..self.appended)
            .filter(|s| !self.delivered.contains_key(s))
            .collect();
        assert!(missing.is_empty(), "never delivered: {missing:?}");
        assert_eq!(self.group.describe().lag_records, 0);
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
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn groups_keep_their_promises(
        hash_seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let mut m = Model::new(hash_seed);
        for op in &ops {
            m.apply(op);
        }
        m.finish();
    }
}
