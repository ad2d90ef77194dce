//! The model of a consumer group, in simulated time, that both group
//! property tests drive: joins (static or not), leaves, crashes (a member
//! stops), stalls, polls, commits, splits, tail splits, merges, retention
//! passes and log reopens, applied to a real log while the model keeps
//! what each member holds uncommitted, what the group committed and what
//! may come again.
//!
//! One switch chooses the setting: [`Model::new`] routes keys by the
//! topic's hash seed on 1 MiB segments without retention, and checks that
//! every record a poll returns belongs to a partition the coordinator
//! assigns to that member; [`Model::with_retention`] puts key `k` in the
//! `k`-th slice of the hash space on 4 KiB segments with a one-hour
//! retention age, tracks where each record is (tail splits move them),
//! and accounts for every range a member was told retention removed.
//!
//! In both, [`Model::finish`] drains the rest with one fresh member and
//! checks that every record appended was delivered (or, with retention,
//! reported removed); each delivery checks that a record the group
//! committed is never delivered again, that every other duplicate was held
//! uncommitted by a member that lost its partitions, and that per key one
//! member receives records in append order.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fissionlog::{
    Group, GroupOptions, Log, LogOptions, ManualClock, Member, MemberOptions, NewRecord,
    OwnedRecord, SplitPlan, SyncPolicy, Topic, TopicConfig,
};

use super::retention::OLD_TS;

/// Keys the records spread over.
pub const KEYS: u64 = 12;

/// Where a tail split starts.
#[derive(Debug, Clone, Copy)]
pub enum Tail {
    /// This many records before the partition's end.
    Back(u8),
    /// The group's slowest position.
    SlowestGroup,
    /// At `n/4` of the partition's end.
    Quarters(u8),
}

/// One step of a case.
#[derive(Debug, Clone)]
pub enum Op {
    /// Appends this many records (old ones, which retention removes, when
    /// set).
    Append(u8, bool),
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
    /// Tail split of an active partition.
    TailSplit(u8, Tail),
    /// Syncs and runs a retention pass.
    Retention,
    /// Close (or abandon, as a crash that keeps the page cache) and open.
    Reopen(bool),
}

struct Live {
    member: Member,
    /// Records delivered and not committed by this member.
    uncommitted: BTreeSet<u64>,
    /// Per key, the last sequence number it received.
    last_seq: BTreeMap<u64, u64>,
    /// How many of its `retained()` ranges were taken already.
    seen_retained: usize,
}

impl Live {
    fn new(member: Member) -> Live {
        Live {
            member,
            uncommitted: BTreeSet::new(),
            last_seq: BTreeMap::new(),
            seen_retained: 0,
        }
    }
}

/// A log, its topic `t` and group `g`, and what the model expects of them.
pub struct Model {
    /// The retention setting (see the module comment).
    retention: bool,
    dir: tempfile::TempDir,
    /// The topic's routing hash key (without retention).
    hash_seed: u64,
    clock: Arc<ManualClock>,
    log: Option<Log>,
    topic: Topic,
    group: Group,
    members: Vec<Live>,
    appended: u64,
    /// Where each record is (appended, or moved by a tail split); kept
    /// with retention only.
    at: Vec<(u32, u64)>,
    /// Every delivery count per record.
    delivered: HashMap<u64, u32>,
    /// Records some member committed.
    committed: BTreeSet<u64>,
    /// Records a member held uncommitted when it lost its partitions (or
    /// may have): the only ones allowed to come again.
    may_repeat: BTreeSet<u64>,
    /// Every range any member reported.
    reported: Vec<(u32, u64, u64)>,
    /// The key of each of the `KEYS` keys.
    keys: Vec<String>,
}

fn opts(retention: bool, clock: &Arc<ManualClock>, hash_seed: u64) -> LogOptions {
    let base = LogOptions {
        clock: clock.clone(),
        balancer: false,
        manifest_compact_records: 16,
        ..LogOptions::default()
    };
    if retention {
        LogOptions {
            background_retention: false,
            ..base
        }
    } else {
        LogOptions {
            topic_hash_seed: Some(hash_seed),
            ..base
        }
    }
}

fn topic_config(retention: bool) -> TopicConfig {
    if retention {
        TopicConfig {
            partitions: 2,
            segment_bytes: 4096,
            retention_age: Some(Duration::from_secs(3600)),
            ..TopicConfig::default()
        }
    } else {
        TopicConfig {
            partitions: 2,
            segment_bytes: 1 << 20,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        }
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

/// A record's key and sequence number (its value is `key:seq`).
fn parse(r: &OwnedRecord) -> (u64, u64) {
    let v = std::str::from_utf8(&r.value).unwrap();
    let (k, s) = v.split_once(':').unwrap();
    (k.parse().unwrap(), s.parse().unwrap())
}

impl Model {
    /// Without retention; `hash_seed`: the topic's routing hash key, so a
    /// case routes the same way on every run.
    pub fn new(hash_seed: u64) -> Model {
        Model::open(false, hash_seed)
    }

    /// With retention: keys routed by slices of the hash space, so routing
    /// does not depend on the topic's random hash key.
    pub fn with_retention() -> Model {
        Model::open(true, 0)
    }

    fn open(retention: bool, hash_seed: u64) -> Model {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let log = Log::open(dir.path(), opts(retention, &clock, hash_seed)).unwrap();
        let topic = log.topic_or_create("t", topic_config(retention)).unwrap();
        let group = topic.group("g", GroupOptions::default()).unwrap();
        let keys = if retention {
            // Key `k` hashes into the `k`-th of `KEYS` equal slices.
            let slice = u64::MAX / KEYS + 1;
            (0..KEYS)
                .map(|k| {
                    (0..)
                        .map(|j| format!("k{k}-{j}"))
                        .find(|name| topic.hash(name.as_bytes()) / slice == k)
                        .unwrap()
                })
                .collect()
        } else {
            (0..KEYS).map(|k| format!("k{k}")).collect()
        };
        Model {
            retention,
            dir,
            hash_seed,
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

    /// Applies every op, then [`Model::finish`].
    pub fn run(mut self, ops: &[Op]) {
        for op in ops {
            self.apply(op);
        }
        self.finish();
    }

    fn pick(&self, i: u8) -> Option<usize> {
        (!self.members.is_empty()).then(|| usize::from(i) % self.members.len())
    }

    /// Takes the ranges member `i` was told of since the last call (with
    /// retention); none is told twice to one member.
    fn collect_retained(&mut self, i: usize) {
        if !self.retention {
            return;
        }
        let live = &mut self.members[i];
        let r = live.member.retained();
        for g in &r[live.seen_retained..] {
            let range = (g.partition, g.start, g.end);
            let told_before = r[..live.seen_retained]
                .iter()
                .any(|x| (x.partition, x.start, x.end) == range);
            assert!(!told_before, "{range:?} reported twice to one member");
            self.reported.push(range);
        }
        live.seen_retained = r.len();
    }

    fn collect_all_retained(&mut self) {
        for i in 0..self.members.len() {
            self.collect_retained(i);
        }
    }

    /// A member that lost (or may have lost) its partitions: what it held
    /// uncommitted may come again.
    fn lose(&mut self, i: usize) {
        self.collect_retained(i);
        let m = self.members.remove(i);
        self.may_repeat.extend(m.uncommitted);
    }

    /// Every member is gone (a reopen, the finish): what they held may
    /// come again; they leave when `leave`.
    fn drop_members(&mut self, leave: bool) {
        self.collect_all_retained();
        for m in std::mem::take(&mut self.members) {
            self.may_repeat.extend(m.uncommitted);
            if leave {
                let _ = m.member.leave();
            }
        }
    }

    /// Without retention: every record's partition is one the coordinator
    /// assigns to member `i`.
    fn check_owner(&self, i: usize, got: &[OwnedRecord]) {
        let d = self.group.describe();
        let id = self.members[i].member.id();
        for r in got {
            if let Some(a) = d.assignments.iter().find(|a| a.partition == r.partition) {
                assert_eq!(
                    a.member,
                    Some(id),
                    "partition {} read by a non-owner",
                    r.partition
                );
            }
        }
    }

    fn receive(&mut self, i: usize, got: Vec<OwnedRecord>) {
        if self.retention {
            self.collect_retained(i);
        } else {
            self.check_owner(i, &got);
        }
        for r in &got {
            let (key, seq) = parse(r);
            if self.retention {
                assert_eq!(
                    self.at[seq as usize],
                    (r.partition, r.offset),
                    "record {seq} where it was appended"
                );
            }
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
                // Handed-out records of a partition taken away: they may
                // come again to the new owner.
                let held = std::mem::take(&mut self.members[i].uncommitted);
                self.may_repeat.extend(held);
            }
            Err(e) => panic!("commit: {e}"),
        }
    }

    fn append(&mut self, n: u8, old: bool) {
        for _ in 0..n {
            let s = self.appended;
            let k = s % KEYS;
            let key = self.keys[k as usize].as_bytes();
            let value = format!("{k}:{s}");
            if self.retention {
                let a = self
                    .topic
                    .append_batch(&[NewRecord {
                        key: Some(key),
                        value: value.as_bytes(),
                        timestamp: old.then_some(OLD_TS),
                    }])
                    .unwrap();
                self.at.push((a[0].partition, a[0].offset));
            } else {
                self.topic.append(Some(key), value.as_bytes()).unwrap();
            }
            self.appended += 1;
        }
    }

    fn join(&mut self, instance: Option<u8>) {
        if self.members.len() >= 4 {
            return;
        }
        // A static rejoin replaces the live member with that id.
        if let Some(iid) = instance {
            let name = format!("static-{iid}");
            let d = self.group.describe();
            let old = self.members.iter().position(|m| {
                d.members
                    .iter()
                    .any(|x| x.id == m.member.id() && x.instance_id.as_ref() == Some(&name))
            });
            if let Some(i) = old {
                self.lose(i);
            }
        }
        let member = self.group.join(member_opts(instance)).unwrap();
        self.members.push(Live::new(member));
    }

    fn poll(&mut self, i: u8, n: u8, then_commit: bool) {
        let Some(i) = self.pick(i) else { return };
        match self.members[i].member.poll(usize::from(n)) {
            Ok(got) => self.receive(i, got),
            Err(fissionlog::Error::Fenced { .. }) => {
                self.lose(i);
                return;
            }
            Err(e) => panic!("poll: {e}"),
        }
        if then_commit {
            self.commit(i);
        }
    }

    fn advance(&mut self, mask: u8, secs: u8) {
        for _ in 0..secs {
            self.clock.advance(Duration::from_secs(1));
            for (j, m) in self.members.iter().enumerate() {
                if mask & (1 << (j % 8)) != 0 {
                    let _ = m.member.heartbeat();
                }
            }
        }
        // Members past their session or processing timeout may have lost
        // partitions: their uncommitted records may come again (fencing is
        // found at their next call).
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

    fn leave(&mut self, i: u8) {
        if let Some(i) = self.pick(i) {
            self.collect_retained(i);
            let m = self.members.remove(i);
            self.may_repeat.extend(m.uncommitted);
            let _ = m.member.leave();
        }
    }

    fn split(&mut self, i: u8) {
        let active = self.topic.active_partitions();
        if active.len() >= 8 {
            return;
        }
        let p = active[usize::from(i) % active.len()];
        let _ = self.topic.split(p, SplitPlan::Even);
    }

    fn merge(&mut self, i: u8) {
        let mut parts = self.topic.partitions();
        parts.retain(|p| p.sealed_at.is_none());
        parts.sort_by_key(|p| p.start);
        if parts.len() < 2 {
            return;
        }
        let j = usize::from(i) % (parts.len() - 1);
        let _ = self.topic.merge(parts[j].id, parts[j + 1].id);
    }

    fn tail_split(&mut self, i: u8, tail: Tail) {
        let active = self.topic.active_partitions();
        if active.len() >= 8 {
            return;
        }
        let p = active[usize::from(i) % active.len()];
        let end = self.topic.partition(p).unwrap().end_offset();
        let from = match tail {
            Tail::Back(back) => fissionlog::TailFrom::Offset(end.saturating_sub(u64::from(back))),
            Tail::SlowestGroup => fissionlog::TailFrom::SlowestGroup,
            Tail::Quarters(n) => fissionlog::TailFrom::Offset(end * u64::from(n) / 4),
        };
        let Ok(out) = self.topic.split_tail(
            p,
            SplitPlan::Even,
            fissionlog::TailSplitOptions {
                from,
                throttle_bytes_per_sec: 0,
            },
        ) else {
            return;
        };
        if self.retention {
            self.track_moved(&out.children, &out.moved);
        }
    }

    /// The moved records lead the children: where they are now.
    fn track_moved(&mut self, children: &[u32], moved: &[u64]) {
        for (&c, &moved) in children.iter().zip(moved) {
            let mut next = 0;
            while next < moved {
                let b = self.topic.read(c, next, 1 << 16).unwrap();
                let got = b.to_owned_records().unwrap();
                assert!(!got.is_empty(), "child {c} at {next}");
                for r in got.iter().take((moved - next) as usize) {
                    let (_, seq) = parse(r);
                    self.at[seq as usize] = (c, r.offset);
                }
                next += got.len() as u64;
            }
        }
    }

    fn reopen(&mut self, abandon: bool) {
        self.drop_members(false);
        let log = self.log.take().unwrap();
        if abandon {
            log.abandon();
        } else {
            log.close().unwrap();
        }
        let log = Log::open(
            self.dir.path(),
            opts(self.retention, &self.clock, self.hash_seed),
        )
        .unwrap();
        self.topic = log.topic("t").unwrap();
        self.group = self.topic.group("g", GroupOptions::default()).unwrap();
        self.log = Some(log);
    }

    /// Applies one step.
    pub fn apply(&mut self, op: &Op) {
        match *op {
            Op::Append(n, old) => self.append(n, old),
            Op::Join(instance) => self.join(instance),
            Op::Poll(i, n) => self.poll(i, n, false),
            Op::PollCommit(i, n) => self.poll(i, n, true),
            Op::Commit(i) => {
                if let Some(i) = self.pick(i) {
                    self.commit(i);
                }
            }
            Op::Advance(mask, secs) => self.advance(mask, secs),
            Op::Crash(i) => {
                if let Some(i) = self.pick(i) {
                    self.lose(i);
                }
            }
            Op::Leave(i) => self.leave(i),
            Op::Split(i) => self.split(i),
            Op::Merge(i) => self.merge(i),
            Op::TailSplit(i, tail) => self.tail_split(i, tail),
            Op::Retention => {
                let log = self.log.as_ref().unwrap();
                log.sync().unwrap();
                log.enforce_retention().unwrap();
            }
            Op::Reopen(abandon) => self.reopen(abandon),
        }
    }

    /// One fresh member drains what is left, after everyone else is gone,
    /// and every record appended was delivered (or reported removed).
    pub fn finish(mut self) {
        self.drop_members(true);
        let member = self.group.join(member_opts(None)).unwrap();
        // Crashed members expire.
        for _ in 0..11 {
            self.clock.advance(Duration::from_secs(1));
            member.heartbeat().unwrap();
        }
        self.members.push(Live::new(member));
        if self.retention {
            self.drain_reporting();
        } else {
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
        }
        self.log.take().unwrap().close().unwrap();
    }

    /// The finish with retention: drained, every record delivered or
    /// reported, and the committed cut reports nothing.
    fn drain_reporting(&mut self) {
        // Committing after empty polls too: a partition retention emptied
        // under the reader is drained without a record, and a merge child
        // behind it waits for that commit (see
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
    }
}

/// The same cases in every run (`FISSIONLOG_GROUP_MODEL_SEED=N` picks
/// other ones, `random` a new seed per run).
pub fn rng_seed() -> proptest::test_runner::RngSeed {
    match std::env::var("FISSIONLOG_GROUP_MODEL_SEED").ok().as_deref() {
        Some("random") => proptest::test_runner::RngSeed::Random,
        Some(v) => proptest::test_runner::RngSeed::Fixed(v.parse().unwrap_or(1)),
        None => proptest::test_runner::RngSeed::Fixed(1),
    }
}

/// `FISSIONLOG_GROUP_MODEL_CASES`, else 32.
pub fn cases() -> u32 {
    std::env::var("FISSIONLOG_GROUP_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}
