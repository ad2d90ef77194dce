//! Shared pieces of the consumer-group tests: a log on a `ManualClock`,
//! members that heartbeat by hand, records whose values carry their
//! sequence number.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fissionlog::{
    Group, GroupOptions, Log, LogOptions, ManualClock, Member, MemberOptions, OwnedRecord,
    SyncPolicy, Topic, TopicConfig,
};

/// Session timeout of the members.
pub const SESSION: Duration = Duration::from_secs(10);
/// Processing timeout of the members.
pub const PROCESSING: Duration = Duration::from_secs(30);

/// The simulated clock, no background balancer or retention.
pub fn options(clock: &Arc<ManualClock>) -> LogOptions {
    LogOptions {
        topic_hash_seed: Some(super::log::HASH_SEED),
        clock: clock.clone(),
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    }
}

pub fn config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: 1 << 20,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    }
}

pub fn member_opts() -> MemberOptions {
    MemberOptions {
        session_timeout: SESSION,
        processing_timeout: PROCESSING,
        instance_id: None,
        background_heartbeat: None,
    }
}

pub fn static_opts(id: &str) -> MemberOptions {
    MemberOptions {
        instance_id: Some(id.to_string()),
        ..member_opts()
    }
}

/// Appends `n` records with keys `k0..k{keys}` and values `key:seq`.
pub fn append(topic: &Topic, keys: u32, from: u64, n: u64) {
    for i in from..from + n {
        let key = format!("k{}", i % u64::from(keys));
        topic
            .append(Some(key.as_bytes()), format!("{key}:{i}").as_bytes())
            .unwrap();
    }
}

/// Appends `n` records without keys, spread round-robin (every partition
/// gets its share whatever the topic's random hash key), values `r:seq`.
pub fn append_rr(topic: &Topic, from: u64, n: u64) {
    for i in from..from + n {
        topic.append(None, format!("r:{i}").as_bytes()).unwrap();
    }
}

pub fn seq(r: &OwnedRecord) -> u64 {
    let v = std::str::from_utf8(&r.value).unwrap();
    v.split(':').nth(1).unwrap().parse().unwrap()
}

pub fn seqs(records: &[OwnedRecord]) -> BTreeSet<u64> {
    records.iter().map(seq).collect()
}

/// Polls until a poll returns nothing.
pub fn drain(m: &mut Member) -> Vec<OwnedRecord> {
    let mut out = Vec::new();
    loop {
        let got = m.poll(1000).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend(got);
    }
}

/// Per key, the sequence numbers must rise.
pub fn assert_key_order(records: &[OwnedRecord]) {
    let mut last: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for r in records {
        let s = seq(r);
        let k = r.key.clone().unwrap();
        if let Some(&prev) = last.get(&k) {
            assert!(
                s > prev,
                "key {:?}: {s} after {prev}",
                String::from_utf8_lossy(&k)
            );
        }
        last.insert(k, s);
    }
}

pub fn open(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Log {
    Log::open(dir, options(clock)).unwrap()
}

/// Per partition, offsets handed out rise.
pub fn assert_partition_order(records: &[OwnedRecord]) {
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for r in records {
        if let Some(&prev) = last.get(&r.partition) {
            assert!(
                r.offset > prev,
                "partition {}: {} after {prev}",
                r.partition,
                r.offset
            );
        }
        last.insert(r.partition, r.offset);
    }
}

/// Advances the clock in steps of a second, heartbeating `beat` and
/// polling (zero records) `progress` at every step.
pub fn pass(clock: &ManualClock, total: Duration, beat: &[&Member], progress: &mut [&mut Member]) {
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

/// A group driven in balancing rounds of simulated time. A round advances
/// the clock by the rebalance interval and ticks the coordinator (one
/// balancing), then every member takes its turn: it commits what it polled
/// in its last turn and polls again (held uncommitted until its next turn,
/// so a partition revoked at the balancing waits for its owner's commit,
/// as it would in a running consumer). After the turns, C9 is checked: the
/// members' assignments are disjoint, each is what the coordinator gives
/// that member and does not revoke, and every record a member polled is
/// from its own assignment.
pub struct Rounds<'a> {
    clock: &'a ManualClock,
    group: &'a Group,
    /// The members, in the order they joined.
    pub members: Vec<Member>,
    /// Records a member polls in its turn.
    pub poll_per_turn: usize,
    /// Run before each balancing (e.g. appends that set the loads).
    pub before_balancing: Box<dyn FnMut() + 'a>,
    /// The group's topic, when splits happen: a member also reads the
    /// split descendants of the partitions it owns (pinned to it until the
    /// group commits the parent as read).
    pub topic: Option<&'a Topic>,
    /// Every value polled so far, with how many times.
    pub polled_values: BTreeMap<Vec<u8>, u32>,
}

/// What one balancing round (or one join) did.
#[derive(Debug, Clone, Default)]
pub struct RoundReport {
    /// Partitions that changed hands ([`fissionlog::GroupStats::moves`]).
    pub moved: u64,
    /// Per member, partitions revoked from it and not yet handed over
    /// right after the balancing (paused: nobody reads them).
    pub paused: Vec<usize>,
    /// Partitions still revoked once every member had its turn.
    pub paused_after_turns: usize,
}

impl<'a> Rounds<'a> {
    pub fn new(clock: &'a ManualClock, group: &'a Group) -> Rounds<'a> {
        Rounds {
            clock,
            group,
            members: Vec::new(),
            poll_per_turn: 50,
            before_balancing: Box::new(|| {}),
            topic: None,
            polled_values: BTreeMap::new(),
        }
    }

    /// A new member joins: the join balances at once (a round of its own,
    /// without time passing).
    pub fn join(&mut self) -> RoundReport {
        let moves = self.group.describe().stats.moves;
        self.members.push(self.group.join(member_opts()).unwrap());
        self.finish(moves)
    }

    /// One balancing round.
    pub fn round(&mut self) -> RoundReport {
        let moves = self.group.describe().stats.moves;
        self.clock
            .advance(GroupOptions::default().rebalance_interval);
        (self.before_balancing)();
        self.group.tick();
        self.finish(moves)
    }

    fn finish(&mut self, moves_before: u64) -> RoundReport {
        let d = self.group.describe();
        let paused = self
            .members
            .iter()
            .map(|m| {
                d.assignments
                    .iter()
                    .filter(|a| a.member == Some(m.id()) && a.revoking)
                    .count()
            })
            .collect();
        let mut polled = Vec::new();
        for m in &mut self.members {
            m.commit().unwrap();
            let got = m.poll(self.poll_per_turn).unwrap();
            polled.push(got);
        }
        let d = self.group.describe();
        let owner: BTreeMap<u32, (Option<u64>, bool)> = d
            .assignments
            .iter()
            .map(|a| (a.partition, (a.member, a.revoking)))
            .collect();
        // Each partition's single parent (a split child's), to find the
        // owned partition a pinned descendant belongs to.
        let split_parent: BTreeMap<u32, u32> = self
            .topic
            .map(|t| {
                t.partitions()
                    .iter()
                    .filter(|p| p.parents.len() == 1)
                    .map(|p| (p.id, p.parents[0]))
                    .collect()
            })
            .unwrap_or_default();
        let mut seen: BTreeSet<u32> = BTreeSet::new();
        for (m, got) in self.members.iter().zip(&polled) {
            let view = m.assignment().partitions;
            let reads = |mut p: u32| loop {
                if view.contains(&p) {
                    return true;
                }
                match split_parent.get(&p) {
                    Some(&q) => p = q,
                    None => return false,
                }
            };
            for &p in &view {
                assert!(seen.insert(p), "partition {p} assigned to two members");
                assert_eq!(
                    owner.get(&p),
                    Some(&(Some(m.id()), false)),
                    "member {} reads partition {p} the coordinator does not give it",
                    m.id()
                );
            }
            for r in got {
                *self.polled_values.entry(r.value.to_vec()).or_default() += 1;
                assert!(
                    reads(r.partition),
                    "member {} polled partition {} outside its assignment",
                    m.id(),
                    r.partition
                );
            }
        }
        RoundReport {
            moved: d.stats.moves - moves_before,
            paused,
            paused_after_turns: d.assignments.iter().filter(|a| a.revoking).count(),
        }
    }

    /// Partitions per member, as the coordinator assigns them (revoked
    /// ones with their owner).
    pub fn counts(&self) -> Vec<usize> {
        let d = self.group.describe();
        self.members
            .iter()
            .map(|m| {
                d.assignments
                    .iter()
                    .filter(|a| a.member == Some(m.id()))
                    .count()
            })
            .collect()
    }

    /// Per member, its load as the coordinator weighs it (append rate plus
    /// one per partition), and the lightest of its partitions.
    pub fn loads(&self) -> Vec<(f64, f64)> {
        let d = self.group.describe();
        self.members
            .iter()
            .map(|m| {
                let mine = d.assignments.iter().filter(|a| a.member == Some(m.id()));
                let weights: Vec<f64> = mine.map(|a| a.append_rate + 1.0).collect();
                let lightest = weights.iter().copied().fold(f64::INFINITY, f64::min);
                (weights.iter().sum(), lightest)
            })
            .collect()
    }
}

/// Whether partition counts are within one of each other.
pub fn within_one(counts: &[usize]) -> bool {
    let max = counts.iter().max().copied().unwrap_or(0);
    let min = counts.iter().min().copied().unwrap_or(0);
    max - min <= 1
}
