//! Consumer groups: members share the reading of one topic, each partition
//! owned by one live member at a time (C9), with committed positions stored
//! in the manifest under the same power-loss rules as the topology.
//!
//! # The model
//!
//! The group's committed positions have the form of a reader's cut
//! ([`crate::Cut`]): the next offset per partition of the group's
//! *frontier*, and the partitions read to their seal whose children are not
//! all listed yet. A partition is *ready* when it is not committed as read
//! and all its parents are (or were removed). Ready partitions are what the
//! coordinator assigns, each to one member.
//!
//! - **Split-aware.** The owner of a ready partition also reads its split
//!   children (one parent) as soon as it has handed out the parent up to its
//!   seal: the children are *pinned* to the parent's owner until the group
//!   commits the parent as read. So the records of one key never cross
//!   members while their order matters, and children are readable at once.
//!   Once the parent is committed, the children are ready partitions of
//!   their own and may move.
//! - **Merges.** A merge child becomes ready only when both parents are
//!   committed as read, and goes to the member whose commit completed the
//!   last parent.
//! - **Cooperative.** A move revokes one partition from its owner: the owner
//!   stops receiving it at once and the partition moves when the owner's
//!   commits cover what it handed out (at once if they do already), or when
//!   the processing timeout passes (the owner is stuck; what it handed out
//!   and did not commit is delivered again). Members that neither gain nor
//!   lose a partition are never paused.
//! - **Two clocks.** No heartbeat for `session_timeout`: dead, fenced, its
//!   partitions go to the others from the committed positions. Heartbeats
//!   but no poll or commit for `processing_timeout`: slow, first relieved
//!   of half its partitions, then of all of them if it stays stuck; it stays
//!   a member and gets partitions again once it moves.
//! - **Load.** A partition weighs its append rate plus one. Equal weights
//!   (idle partitions, equal rates) balance by count to within one, with the
//!   fewest moves; unequal ones by load, each move lowering the larger of
//!   two loads by more than an absolute gain (see
//!   [`crate::balance`]'s `assign`). A member falling behind sheds
//!   partitions to the others (relief by lag). A balancing revokes at most
//!   [`GroupOptions::max_moves_per_balancing`] partitions.
//!
//! Delivery is at least once. Records are delivered again only from an
//! uncommitted window: what a member handed out and did not commit before
//! it died, left, was relieved while stuck, or was replaced by a static
//! rejoin. [`GroupStats::redelivered`] counts them.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::Serialize;

use crate::balance::{best_single_move, plan_counts, plan_moves};
use crate::duration::duration_nanos;
use crate::error::{Error, Result};
use crate::format::manifest::{GroupPosition, GroupRecord, ManifestRecord};
use crate::read::OwnedRecord;
use crate::reader::{
    drained_at, fingerprint, read_step, take_batch, translate_tails, ReadStep, RetainedRange,
    REMOVED_END,
};
use crate::topic::Topic;
use crate::topology::lineage::Lineage;

/// Least lag (records) for which a member falling behind is relieved.
const RELIEF_LAG: u64 = 1000;
/// Balancings in a row a partition's lag must grow before the group splits
/// it for lag.
const LAG_SPLIT_ROUNDS: u32 = 3;
/// A move by load must lower the larger of the two members' loads by more
/// than this many mean partition weights. An absolute amount, the same
/// whatever the member's load (a share of the busiest member's load is one
/// that a single partition out of many never reaches), and under one
/// partition so equal partitions balance to within one.
const MOVE_GAIN: f64 = 0.25;
/// Pauses kept in [`GroupStats::pauses_ms`] (the latest).
const MAX_PAUSES: usize = 4096;
/// Rate estimates decay with this time constant.
const RATE_TAU_S: f64 = 2.0;

/// Where a new group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupStart {
    /// From the oldest data.
    #[default]
    Earliest,
    /// Only records appended after the group was created.
    Latest,
}

/// Options of a group, given when a handle is taken.
#[derive(Debug, Clone)]
pub struct GroupOptions {
    /// Where a group that has no committed positions yet starts.
    pub start: GroupStart,
    /// Least time between two load-driven moves of partitions (dead or slow
    /// members and unowned partitions are handled at once).
    pub rebalance_interval: Duration,
    /// A partition moved by load is not moved by load again for this long
    /// (against rate noise), unless a member joins or leaves since.
    pub move_cooldown: Duration,
    /// Split a partition that alone outruns its member: its lag grew at
    /// each of the last three balancings, it is its owner's only partition
    /// (moving it would move the problem), another member has no lag, and
    /// its append rate is under the topic's split target but not under its
    /// merge floor (so the write-side balancer neither splits it anyway nor
    /// merges the children back). The children stay with the owner until
    /// it has read the parent, then one can move to the idle member. At
    /// most one such split per move cooldown.
    pub split_lagging: bool,
    /// Most partitions one balancing revokes by load: a join to a group
    /// whose partitions all sit with one member moves its share over a few
    /// balancings (one per `rebalance_interval`), so the owners pause only
    /// this many at a time.
    pub max_moves_per_balancing: usize,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            start: GroupStart::Earliest,
            rebalance_interval: Duration::from_secs(1),
            move_cooldown: Duration::from_secs(10),
            split_lagging: true,
            max_moves_per_balancing: 64,
        }
    }
}

/// Options of one member.
#[derive(Debug, Clone)]
pub struct MemberOptions {
    /// No heartbeat for this long: the member is dead and fenced. Must be
    /// positive; one past the group clock's 584 years (`Duration::MAX`)
    /// means never.
    pub session_timeout: Duration,
    /// Heartbeats but no poll or commit for this long: the member is slow.
    /// Must be positive; one past 584 years means never.
    pub processing_timeout: Duration,
    /// A stable identity across restarts (static membership): a member that
    /// joins with the instance id of a member still within its session
    /// timeout takes over its assignment, and nobody else's changes.
    pub instance_id: Option<String>,
    /// Heartbeat from a background thread at this interval while the
    /// [`Member`] handle lives, independently of processing. `None`: the
    /// caller heartbeats (a broker relaying its clients' heartbeats).
    /// `Some(Duration::ZERO)` is refused: the thread would spin.
    pub background_heartbeat: Option<Duration>,
}

impl MemberOptions {
    /// Refuses zero durations: a zero session or processing timeout
    /// declares the member dead or slow at once, and a zero heartbeat
    /// interval makes its background thread spin. A duration too long for
    /// the group's nanosecond clock (`Duration::MAX` included) is accepted
    /// and means never.
    fn validate(&self) -> Result<()> {
        let zero = |option, value: Duration| {
            if value.is_zero() {
                return Err(Error::InvalidDuration {
                    option,
                    value,
                    reason: "it must be positive",
                });
            }
            Ok(())
        };
        zero("session_timeout", self.session_timeout)?;
        zero("processing_timeout", self.processing_timeout)?;
        if let Some(every) = self.background_heartbeat {
            zero("background_heartbeat", every)?;
        }
        Ok(())
    }
}

impl Default for MemberOptions {
    fn default() -> Self {
        MemberOptions {
            session_timeout: Duration::from_secs(10),
            processing_timeout: Duration::from_secs(30),
            instance_id: None,
            background_heartbeat: Some(Duration::from_secs(1)),
        }
    }
}

/// A member's liveness as the coordinator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Heartbeating and making progress.
    Active,
    /// Heartbeating, no poll or commit for its processing timeout.
    Slow,
}

/// One member in a [`GroupDescription`].
#[derive(Debug, Clone, Serialize)]
pub struct MemberDescription {
    /// Member id.
    pub id: u64,
    /// Static instance id, if any.
    pub instance_id: Option<String>,
    /// Liveness.
    pub state: MemberState,
    /// Ready partitions it owns (revoking ones included).
    pub partitions: Vec<u32>,
    /// Records of its partitions past the committed positions.
    pub lag_records: u64,
    /// Records it handed out per second (decayed).
    pub processing_rate: f64,
    /// Milliseconds since its last heartbeat.
    pub since_heartbeat_ms: u64,
    /// Milliseconds since its last poll or commit.
    pub since_progress_ms: u64,
}

/// One ready partition in a [`GroupDescription`].
#[derive(Debug, Clone, Serialize)]
pub struct AssignmentDescription {
    /// Partition id.
    pub partition: u32,
    /// Owner (none: waiting for a member).
    pub member: Option<u64>,
    /// Generation in which it was assigned to its owner.
    pub generation: u64,
    /// Being moved away from its owner.
    pub revoking: bool,
    /// Committed position (next offset).
    pub committed: u64,
    /// Records past the committed position.
    pub lag_records: u64,
    /// Appends per second (decayed).
    pub append_rate: f64,
}

/// Counters of a group since the handle's coordinator started.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GroupStats {
    /// Ownership changes that moved at least one partition between members.
    pub rebalances: u64,
    /// Partitions moved between members.
    pub moves: u64,
    /// Per moved partition, how long nobody read it: from its revocation
    /// until its new owner's next poll took it (milliseconds; the latest
    /// 4,096).
    pub pauses_ms: Vec<f64>,
    /// Members declared dead (no heartbeat for the session timeout).
    pub dead_detected: u64,
    /// Members declared slow (no progress for the processing timeout).
    pub slow_detected: u64,
    /// Members relieved of partitions because they fell behind.
    pub lag_relieved: u64,
    /// Partitions the group split because one member alone fell behind
    /// them (see [`GroupOptions::split_lagging`]).
    pub lag_splits: u64,
    /// Records handed out and not committed by a member that lost them
    /// (dead, left, stuck, replaced): they are delivered again.
    pub redelivered: u64,
    /// Commits applied.
    pub commits: u64,
}

/// A snapshot of a group: members, assignments, positions and lag.
#[derive(Debug, Clone, Serialize)]
pub struct GroupDescription {
    /// Group name.
    pub name: String,
    /// Current generation (moves with every ownership change).
    pub generation: u64,
    /// Live members.
    pub members: Vec<MemberDescription>,
    /// Ready partitions.
    pub assignments: Vec<AssignmentDescription>,
    /// Total lag in records.
    pub lag_records: u64,
    /// Counters.
    pub stats: GroupStats,
}

/// What a member owns, as of a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// Generation the assignment was read at.
    pub generation: u64,
    /// Ready partitions the member reads (with their split children).
    pub partitions: Vec<u32>,
}

/// The committed positions, as in the manifest.
#[derive(Debug, Clone, Default)]
struct Committed {
    positions: BTreeMap<u32, u64>,
    last_records: BTreeMap<u32, u64>,
    drained: BTreeSet<u32>,
}

impl Committed {
    fn from_record(g: &GroupRecord) -> Committed {
        Committed {
            positions: g.positions.clone(),
            last_records: g.last_records.clone(),
            drained: g.drained.clone(),
        }
    }

    /// Every partition the group has read to its seal: those listed as
    /// drained and every ancestor of a listed one.
    fn all_drained(&self, lineage: &Lineage) -> BTreeSet<u32> {
        let mut out: BTreeSet<u32> = self.drained.clone();
        out.extend(lineage.ancestors(self.positions.keys().chain(&self.drained).copied()));
        out
    }

    /// Ready partitions: listed with a position, or not drained with every
    /// parent drained (or removed).
    fn ready(&self, lineage: &Lineage) -> BTreeSet<u32> {
        let drained = self.all_drained(lineage);
        let mut out: BTreeSet<u32> = self
            .positions
            .keys()
            .copied()
            .filter(|&p| lineage.contains(p) && !drained.contains(&p))
            .collect();
        let mut candidates: Vec<u32> = lineage.roots().collect();
        for &d in &drained {
            candidates.extend_from_slice(lineage.children(d));
        }
        for c in candidates {
            if drained.contains(&c) || out.contains(&c) {
                continue;
            }
            if lineage
                .parents(c)
                .iter()
                .all(|q| drained.contains(q) || !lineage.contains(*q))
            {
                out.insert(c);
            }
        }
        out
    }

    /// Drops what the topology no longer has (retention removed it), as the
    /// manifest's `RemovePartition` does, except the position in a removed
    /// partition the topic still remembers: what the group had not read
    /// there is a loss to report ([`Loss`]), and the position stays until
    /// a member that was handed the report commits.
    fn forget_removed(&mut self, lineage: &Lineage) {
        self.positions
            .retain(|p, _| lineage.contains(*p) || lineage.removed.contains_key(p));
        self.last_records.retain(|p, _| lineage.contains(*p));
        self.drained.retain(|p| lineage.contains(*p));
    }

    /// What the group's positions in removed partitions leave unread, per
    /// removed partition, as a [`crate::Reader`] from the same cut reports
    /// it: the rest of the partition from the position to its seal, and
    /// every removed partition below it that nothing the group holds is
    /// below (a whole removed generation), each once.
    fn losses(&self, lineage: &Lineage) -> BTreeMap<u32, Loss> {
        let gone: BTreeSet<u32> = self
            .positions
            .keys()
            .filter(|p| !lineage.contains(**p))
            .copied()
            .collect();
        let mut out = BTreeMap::new();
        if gone.is_empty() {
            return out;
        }
        let behind = lineage.removed_ancestors(
            self.positions
                .keys()
                .chain(&self.drained)
                .filter(|p| !gone.contains(p))
                .copied(),
        );
        let passed = self.all_drained(lineage);
        let seal = |q: u32| {
            lineage
                .removed_seals
                .get(&q)
                .copied()
                .unwrap_or(REMOVED_END)
        };
        let mut reported: BTreeSet<u32> = BTreeSet::new();
        for &p in &gone {
            let mut ranges = Vec::new();
            let start = self.positions[&p];
            if start < seal(p) {
                ranges.push(RetainedRange {
                    partition: p,
                    start,
                    end: seal(p),
                });
            }
            let below = lineage.removed_descendants(p);
            for &q in &below {
                if gone.contains(&q) || behind.contains(&q) || !reported.insert(q) {
                    continue;
                }
                if seal(q) > 0 {
                    ranges.push(RetainedRange {
                        partition: q,
                        start: 0,
                        end: seal(q),
                    });
                }
            }
            // The partitions in the topology that continue it and the
            // group has not read: children of it or of a removed partition
            // below it, or descendants of those the group has read.
            let mut through: BTreeSet<u32> = below.iter().copied().chain([p]).collect();
            let mut heirs: BTreeSet<u32> = BTreeSet::new();
            loop {
                let mut grew = false;
                for (&id, n) in &lineage.nodes {
                    if through.contains(&id)
                        || heirs.contains(&id)
                        || !n.parents.iter().any(|q| through.contains(q))
                    {
                        continue;
                    }
                    if passed.contains(&id) || self.drained.contains(&id) {
                        through.insert(id);
                        grew = true;
                    } else {
                        heirs.insert(id);
                    }
                }
                if !grew {
                    break;
                }
            }
            out.insert(
                p,
                Loss {
                    ranges,
                    heirs: heirs.into_iter().collect(),
                    handed: None,
                    handed_ranges: Vec::new(),
                },
            );
        }
        out
    }
}

/// Whether `listed` holds a descendant of `id` (through partitions in the
/// topology and removed ones alike): the group has passed `id`.
fn lists_descendant(lineage: &Lineage, listed: &BTreeSet<u32>, id: u32) -> bool {
    let mut seen = BTreeSet::from([id]);
    let mut stack = vec![id];
    while let Some(x) = stack.pop() {
        let live = lineage.children_naming(x);
        let removed = lineage
            .removed_children
            .get(&x)
            .map_or(&[][..], Vec::as_slice);
        for &c in live.iter().chain(removed) {
            if listed.contains(&c) {
                return true;
            }
            if seen.insert(c) {
                stack.push(c);
            }
        }
    }
    false
}

/// The unread rest of a partition retention removed under a committed
/// position of the group (with the removed partitions below it). Reported
/// through [`Member::retained`] to the owner of the first ready partition
/// that continues it (any member when none does), again to each later
/// owner until one of them commits: that commit drops the position from
/// the manifest (at least once, as records are delivered).
#[derive(Debug, Clone)]
struct Loss {
    ranges: Vec<RetainedRange>,
    /// Partitions in the topology that continue the removed one.
    heirs: Vec<u32>,
    /// The member it was handed to, with the tenure of the heir it came
    /// with (0: no heir).
    handed: Option<(u64, u64)>,
    /// The ranges handed to it so far.
    handed_ranges: Vec<RetainedRange>,
}

#[derive(Debug, Clone)]
struct Revoke {
    since_nanos: u64,
    /// Where it goes once released (None: whoever the balancer picks).
    to: Option<u64>,
}

#[derive(Debug, Clone)]
struct Owner {
    member: Option<u64>,
    generation: u64,
    /// Tenure: a new value every time the partition is given to a member,
    /// kept when a split child becomes ready with its parent's owner. A
    /// member's reading state for it is valid only within one tenure.
    epoch: u64,
    revoking: Option<Revoke>,
    /// When it last lost an owner, for the pause of its next owner.
    unowned_since: Option<u64>,
    /// When it was last moved by load (cooldown).
    moved_nanos: Option<u64>,
    /// Moved and not taken by its new owner yet: since when nobody reads it.
    pause_from: Option<u64>,
}

#[derive(Debug)]
struct MemberEntry {
    instance_id: Option<String>,
    opts: MemberOptions,
    last_heartbeat: u64,
    last_progress: u64,
    state: MemberState,
    slow_since: u64,
    /// Handed out: per partition it reads, the next offset and the
    /// fingerprint of the last record handed out there.
    delivered: BTreeMap<u32, (u64, Option<u64>)>,
    /// Partitions it handed out up to their seal (not committed yet).
    delivered_drained: BTreeSet<u32>,
    /// Records handed out, and the decayed rate of that.
    handed_out: u64,
    rate: f64,
    rate_at: u64,
    /// Not given more partitions by load before this time.
    relieved_until: u64,
    /// Its lag at the last balancing.
    last_lag: u64,
}

#[derive(Debug, Default)]
struct PartitionRate {
    end: u64,
    at: u64,
    rate: f64,
    /// Its lag at the last balancing, and for how many balancings in a
    /// row it grew.
    lag: u64,
    lag_rounds: u32,
}

#[derive(Debug)]
struct GroupState {
    generation: u64,
    next_member: u64,
    members: BTreeMap<u64, MemberEntry>,
    committed: Committed,
    owners: BTreeMap<u32, Owner>,
    lineage: Arc<Lineage>,
    rates: HashMap<u32, PartitionRate>,
    last_balance: u64,
    /// Next [`Owner::epoch`].
    next_epoch: u64,
    /// When the append rates were last folded.
    last_rates: u64,
    /// When the group last split a partition for lag.
    last_lag_split: Option<u64>,
    /// Per committed position in a removed partition, what it leaves
    /// unread and who was told.
    losses: BTreeMap<u32, Loss>,
    stats: GroupStats,
    /// Deleted: no member joins or commits through this coordinator again.
    deleted: bool,
}

/// The coordinator of one group in one topic.
#[derive(Debug)]
pub(crate) struct GroupShared {
    topic: Topic,
    name: String,
    options: GroupOptions,
    st: Mutex<GroupState>,
}

/// A consumer group of one topic (cheap to clone). Take one with
/// [`Topic::group`]; members join through it.
#[derive(Debug, Clone)]
pub struct Group {
    shared: Arc<GroupShared>,
}

/// One member of a group: polls records of the partitions it owns, commits
/// what it processed, heartbeats. Dropping it without [`Member::leave`]
/// stops its heartbeats: it is declared dead after its session timeout
/// (unless a member with its instance id rejoins first).
#[derive(Debug)]
pub struct Member {
    shared: Arc<GroupShared>,
    id: u64,
    generation: u64,
    lineage: Arc<Lineage>,
    /// Ready partitions owned, as of `generation`.
    owned: BTreeSet<u32>,
    /// Next offset to hand out per partition being read (owned ones and
    /// their pinned split children).
    positions: BTreeMap<u32, u64>,
    last_records: BTreeMap<u32, u64>,
    /// Read to their seal, not committed yet.
    drained: BTreeSet<u32>,
    pending: VecDeque<OwnedRecord>,
    next_rr: u32,
    retained: Vec<RetainedRange>,
    /// Partitions being moved away: not read any more, their handed-out
    /// positions kept for the commit that releases them.
    paused: BTreeSet<u32>,
    /// Per ready partition owned, the tenure ([`Owner::epoch`]) its
    /// reading state belongs to.
    tenure: BTreeMap<u32, u64>,
    /// Removed partitions this member was reading (or had read to their
    /// seal) when it saw them go: it reported their rest from its own
    /// position, so the group's [`Loss`] is not reported for them again.
    own_gone: BTreeSet<u32>,
    /// Per partition, the last run of offsets this member skipped because
    /// retention removed them (reported in `retained`): `(from, to, poll)`,
    /// `poll` being the [`Member::polls`] count of the poll that reported it.
    skipped: BTreeMap<u32, (u64, u64, u64)>,
    /// Calls of `poll` and `poll_wait` made so far (each returns to the
    /// application, which can look at `retained` before the next).
    polls: u64,
    heartbeat: Option<HeartbeatThread>,
}

#[derive(Debug)]
struct HeartbeatThread {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for HeartbeatThread {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn millis(nanos: u64) -> u64 {
    nanos / 1_000_000
}

impl Topic {
    /// The consumer group `name` of this topic, created (durably, with its
    /// starting positions) if it does not exist. Every handle of one group
    /// in one log shares one coordinator.
    pub fn group(&self, name: &str, options: GroupOptions) -> Result<Group> {
        self.inner.core().check_not_closed()?;
        crate::topic_name::validate(name).map_err(|e| match e {
            Error::InvalidTopicName { reason, .. } => {
                Error::InvalidConfig(format!("group name {name:?}: {reason}"))
            }
            other => other,
        })?;
        if options.max_moves_per_balancing == 0 {
            return Err(Error::InvalidConfig(
                "max_moves_per_balancing must be at least 1: a group that may move \
                 nothing by load never balances"
                    .into(),
            ));
        }
        let mut groups = self.inner.groups.lock();
        if let Some(g) = groups.get(name) {
            return Ok(Group { shared: g.clone() });
        }
        let record = self.group_record(name);
        let (lineage, committed, generation) = match record {
            Some(g) => (self.lineage(), Committed::from_record(&g), g.generation),
            None => {
                // Taken again while a topology change commits meanwhile: a
                // `Latest` position read under a lineage from before a
                // tail split, at the parent's new end, would hand the
                // moved records out again from the children (as for
                // `Topic::reader`). A split committing after this only
                // translates the positions (`GroupShared::refresh`).
                let (lineage, c) = loop {
                    let lineage = self.lineage();
                    let got = self.initial_positions(&lineage, options.start);
                    if self.topology_generation() == lineage.generation {
                        break (lineage, got?);
                    }
                };
                self.commit_group(name, 0, &c, &[], &[])?;
                (lineage, c, 0)
            }
        };
        let mut committed = committed;
        committed.forget_removed(&lineage);
        let shared = Arc::new(GroupShared {
            topic: self.clone(),
            name: name.to_string(),
            options,
            st: Mutex::new(GroupState {
                generation: generation + 1,
                next_member: member_id_base(),
                members: BTreeMap::new(),
                committed,
                owners: BTreeMap::new(),
                lineage,
                rates: HashMap::new(),
                last_balance: 0,
                next_epoch: 1,
                last_rates: 0,
                last_lag_split: None,
                losses: BTreeMap::new(),
                stats: GroupStats::default(),
                deleted: false,
            }),
        });
        shared.refresh(&mut shared.st.lock());
        groups.insert(name.to_string(), shared.clone());
        Ok(Group { shared })
    }

    /// Names of the topic's consumer groups.
    pub fn groups(&self) -> Vec<String> {
        let topo = self.inner.core().topology.lock();
        topo.state
            .topics
            .iter()
            .find(|t| t.id == self.id())
            .map(|t| t.groups.iter().map(|g| g.name.clone()).collect())
            .unwrap_or_default()
    }

    /// Deletes a group and its committed positions. Members of it that are
    /// still alive are fenced.
    pub fn delete_group(&self, name: &str) -> Result<()> {
        let mut groups = self.inner.groups.lock();
        if self.group_record(name).is_none() {
            return Err(Error::UnknownGroup(name.to_string()));
        }
        // The coordinator's lock is held across the record: a member's
        // commit (which creates the group if it is missing) cannot land
        // after it and bring the group back.
        let shared = groups.get(name).cloned();
        let mut st = shared.as_ref().map(|g| g.st.lock());
        {
            let core = self.inner.core();
            let mut topo = core.topology.lock();
            core.commit(
                &mut topo,
                ManifestRecord::DeleteGroup {
                    topic_id: self.id(),
                    group: name.to_string(),
                },
            )?;
        }
        if let Some(st) = st.as_mut() {
            st.members.clear();
            st.owners.clear();
            st.deleted = true;
        }
        drop(st);
        groups.remove(name);
        Ok(())
    }

    pub(crate) fn group_record(&self, name: &str) -> Option<GroupRecord> {
        let topo = self.inner.core().topology.lock();
        topo.state
            .topics
            .iter()
            .find(|t| t.id == self.id())
            .and_then(|t| t.groups.iter().find(|g| g.name == name).cloned())
    }

    fn initial_positions(&self, lineage: &Lineage, start: GroupStart) -> Result<Committed> {
        let mut c = Committed::default();
        if start == GroupStart::Latest {
            for id in lineage.active() {
                let end = self.partition(id)?.end_offset();
                let (pos, last) = self.latest_position(id, end)?;
                c.positions.insert(id, pos);
                if let Some(f) = last {
                    c.last_records.insert(id, f);
                }
            }
        }
        Ok(c)
    }

    /// Writes a group commit to the manifest: durable when this returns.
    fn commit_group(
        &self,
        group: &str,
        generation: u64,
        c: &Committed,
        drained: &[u32],
        pruned: &[u32],
    ) -> Result<()> {
        let positions = c
            .positions
            .iter()
            .map(|(&partition, &offset)| GroupPosition {
                partition,
                offset,
                last_record: c.last_records.get(&partition).copied(),
            })
            .collect();
        let core = self.inner.core();
        let mut topo = core.topology.lock();
        core.commit(
            &mut topo,
            ManifestRecord::GroupCommit {
                topic_id: self.id(),
                group: group.to_string(),
                generation,
                positions,
                drained: drained.to_vec(),
                pruned: pruned.to_vec(),
            },
        )
    }
}

/// Member ids are unique across runs of a log (the run's start time in the
/// high bits), so a member of an earlier run is never taken for one of
/// this run.
fn member_id_base() -> u64 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    (secs & 0xFFFF_FFFF) << 24
}

impl GroupShared {
    fn now(&self) -> u64 {
        self.topic.inner.core().clock.now_nanos()
    }

    fn fenced(&self, member: u64, reason: &str) -> Error {
        Error::Fenced {
            group: self.name.clone(),
            member,
            reason: reason.to_string(),
        }
    }

    /// Takes a new lineage if the topology moved: forgets removed
    /// partitions and recomputes the ready set, keeping owners.
    fn refresh(&self, st: &mut GroupState) {
        if self.topic.topology_generation() != st.lineage.generation || st.owners.is_empty() {
            let before = std::mem::replace(&mut st.lineage, self.topic.lineage());
            let lineage = st.lineage.clone();
            // Committed positions past a tail-split parent's logical end
            // continue in its children (as its record did in the manifest).
            let c = &mut st.committed;
            translate_tails(&lineage, &mut c.positions, &mut c.last_records);
            // A partition removed since that the group neither listed nor
            // passed (listed a descendant of) is at its first offset, as
            // the manifest's `RemovePartition` records it. Also one this
            // coordinator never saw (created and removed since its last
            // look): the manifest gave it a position all the same.
            let listed: BTreeSet<u32> = c.positions.keys().chain(&c.drained).copied().collect();
            let mut fresh: Vec<u32> = lineage
                .removed
                .keys()
                .filter(|&&id| !lineage.contains(id) && !before.removed.contains_key(&id))
                .copied()
                .collect();
            fresh.sort_unstable();
            for id in fresh {
                if !listed.contains(&id) && !lists_descendant(&lineage, &listed, id) {
                    c.positions.insert(id, 0);
                }
            }
            st.committed.forget_removed(&lineage);
            self.recompute_ready(st, None);
            self.refresh_losses(st);
        }
    }

    /// Recomputes [`GroupState::losses`] from the committed positions,
    /// keeping who was told of each (a member is not told twice).
    fn refresh_losses(&self, st: &mut GroupState) {
        let mut losses = st.committed.losses(&st.lineage);
        for (p, l) in &mut losses {
            if let Some(old) = st.losses.remove(p) {
                l.handed = old.handed;
                l.handed_ranges = old.handed_ranges;
            }
        }
        st.losses = losses;
    }

    /// Who is to be told of `loss`: the owner of its first ready heir that
    /// is not being moved, with that heir's tenure; without heirs, the
    /// member told already if it is still one, else the first member.
    fn loss_holder(st: &GroupState, loss: &Loss) -> Option<(u64, u64)> {
        if loss.heirs.is_empty() {
            return match loss.handed {
                Some((m, e)) if st.members.contains_key(&m) => Some((m, e)),
                _ => st.members.keys().next().map(|&m| (m, 0)),
            };
        }
        loss.heirs.iter().find_map(|h| {
            let o = st.owners.get(h)?;
            o.revoking.is_none().then_some(())?;
            Some((o.member?, o.epoch))
        })
    }

    /// Brings `owners` to the ready set. A partition that became ready goes
    /// to `heir` (the member whose commit made it ready), else to the owner
    /// of a parent, else stays unowned for the balancer.
    fn recompute_ready(&self, st: &mut GroupState, heir: Option<u64>) {
        let ready = st.committed.ready(&st.lineage);
        let old = std::mem::take(&mut st.owners);
        let generation = st.generation;
        for p in ready {
            if let Some(o) = old.get(&p) {
                st.owners.insert(p, o.clone());
                continue;
            }
            let parent_owners: Vec<(u64, u64)> = st
                .lineage
                .parents(p)
                .iter()
                .filter_map(|q| old.get(q).and_then(|o| Some((o.member?, o.epoch))))
                .collect();
            let member = heir
                .filter(|m| st.members.contains_key(m))
                .or(parent_owners.first().map(|x| x.0))
                .filter(|m| st.members.contains_key(m));
            // A split descendant that stays with the owner of its nearest
            // ready ancestor continues that tenure: the owner has been
            // reading it already (pinned), through any number of splits.
            // Through split parents retention removed too: their owner
            // was reading this one as well.
            let mut up = p;
            let pinned_to = loop {
                let parents = match st.lineage.removed.get(&up) {
                    Some(removed) if !st.lineage.contains(up) => removed.as_slice(),
                    _ => st.lineage.parents(up),
                };
                if parents.len() != 1 {
                    break None;
                }
                up = parents[0];
                if let Some(o) = old.get(&up) {
                    break o.member.map(|m| (m, o.epoch));
                }
            };
            // Nobody else has a claim: the pinned owner keeps it.
            let member = member
                .or(pinned_to.map(|x| x.0))
                .filter(|m| st.members.contains_key(m));
            let epoch = match pinned_to {
                Some((m, e)) if Some(m) == member => e,
                _ => {
                    st.next_epoch += 1;
                    st.next_epoch
                }
            };
            st.owners.insert(
                p,
                Owner {
                    member,
                    generation,
                    epoch,
                    revoking: None,
                    unowned_since: None,
                    moved_nanos: None,
                    pause_from: None,
                },
            );
        }
    }

    /// Runs the timeouts and the balancer: dead members, slow members,
    /// overdue revocations, unowned partitions, load.
    fn tick(&self, st: &mut GroupState, now: u64) {
        self.tick_with(st, now, false);
    }

    /// [`GroupShared::tick`], balancing at once (ignoring the interval and
    /// the move cooldown) when the membership just changed.
    fn tick_with(&self, st: &mut GroupState, now: u64, membership_changed: bool) {
        if st.deleted {
            return;
        }
        self.refresh(st);
        self.update_rates(st, now);
        let mut changed = false;
        let mut membership_changed = membership_changed;
        // Dead: no heartbeat for the session timeout.
        let dead: Vec<u64> = st
            .members
            .iter()
            .filter(|(_, m)| {
                now.saturating_sub(m.last_heartbeat) > duration_nanos(m.opts.session_timeout)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in dead {
            st.stats.dead_detected += 1;
            self.remove_member(st, id, now);
            changed = true;
            membership_changed = true;
        }
        // Slow: heartbeats, no progress.
        let ids: Vec<u64> = st.members.keys().copied().collect();
        for id in ids {
            let m = &st.members[&id];
            let stuck_for = now.saturating_sub(m.last_progress);
            let limit = duration_nanos(m.opts.processing_timeout);
            if stuck_for <= limit {
                continue;
            }
            match m.state {
                MemberState::Active => {
                    st.stats.slow_detected += 1;
                    let m = st.members.get_mut(&id).expect("listed");
                    m.state = MemberState::Slow;
                    m.slow_since = now;
                    // Relief: half of its partitions, the most behind first.
                    let mut owned = self.owned_by(st, id);
                    owned.sort_by_key(|&p| std::cmp::Reverse(self.lag(st, p)));
                    let n = owned.len() / 2;
                    for p in owned.into_iter().take(n) {
                        changed |= self.revoke(st, p, None, now);
                    }
                }
                MemberState::Slow => {
                    // Stuck for another processing timeout: everything it
                    // owns moves now (what it handed out and did not
                    // commit is delivered again).
                    if now.saturating_sub(m.slow_since) > limit {
                        let all: Vec<u32> = st
                            .owners
                            .iter()
                            .filter(|(_, o)| o.member == Some(id))
                            .map(|(&p, _)| p)
                            .collect();
                        for p in all {
                            if let Some(o) = st.owners.get_mut(&p) {
                                o.revoking.get_or_insert(Revoke {
                                    since_nanos: now,
                                    to: None,
                                });
                            }
                            self.release(st, p, now);
                            changed = true;
                        }
                        // What it gets back (nobody else can take it) is
                        // not moved again on the next tick: only after
                        // another processing timeout without progress.
                        if let Some(m) = st.members.get_mut(&id) {
                            m.slow_since = now;
                        }
                    }
                }
            }
        }
        // Revocations the owner did not settle within its processing timeout.
        let overdue: Vec<u32> = st
            .owners
            .iter()
            .filter_map(|(&p, o)| {
                let r = o.revoking.as_ref()?;
                let m = st.members.get(&o.member?)?;
                (now.saturating_sub(r.since_nanos) > duration_nanos(m.opts.processing_timeout))
                    .then_some(p)
            })
            .collect();
        for p in overdue {
            self.release(st, p, now);
            changed = true;
        }
        changed |= self.assign_unowned(st, now);
        if membership_changed
            || now.saturating_sub(st.last_balance)
                >= duration_nanos(self.options.rebalance_interval)
        {
            st.last_balance = now;
            changed |= self.balance_load(st, now, membership_changed);
            if self.options.split_lagging {
                self.split_for_lag(st, now);
            }
        }
        if changed {
            st.generation += 1;
        }
    }

    fn owned_by(&self, st: &GroupState, id: u64) -> Vec<u32> {
        st.owners
            .iter()
            .filter(|(_, o)| o.member == Some(id) && o.revoking.is_none())
            .map(|(&p, _)| p)
            .collect()
    }

    /// Partitions read by the owner of ready `p`: `p` and its split
    /// descendants (pinned to it until the group commits `p` as read).
    fn closure(lineage: &Lineage, p: u32) -> Vec<u32> {
        let mut out = vec![p];
        let mut i = 0;
        while i < out.len() {
            let x = out[i];
            for &c in lineage.children(x) {
                if lineage.parents(c).len() == 1 {
                    out.push(c);
                }
            }
            i += 1;
        }
        out
    }

    fn end_offset(&self, p: u32) -> u64 {
        self.topic.partition(p).map_or(0, |x| x.end_offset())
    }

    fn committed_position(st: &GroupState, p: u32) -> u64 {
        st.committed.positions.get(&p).copied().unwrap_or(0)
    }

    /// Records of ready `p` (with its pinned children) past the committed
    /// positions.
    fn lag(&self, st: &GroupState, p: u32) -> u64 {
        Self::closure(&st.lineage, p)
            .into_iter()
            .map(|x| {
                let end = self.end_offset(x);
                let start = if x == p {
                    Self::committed_position(st, p)
                } else {
                    0
                };
                end.saturating_sub(start)
            })
            .sum()
    }

    fn update_rates(&self, st: &mut GroupState, now: u64) {
        // At most every 100 ms: a tick runs on every member call.
        if now.saturating_sub(st.last_rates) < 100_000_000 && st.rates.len() == st.owners.len() {
            return;
        }
        st.last_rates = now;
        let ready: Vec<u32> = st.owners.keys().copied().collect();
        for p in ready {
            let end: u64 = Self::closure(&st.lineage, p)
                .into_iter()
                .map(|x| self.end_offset(x))
                .sum();
            let r = st.rates.entry(p).or_insert(PartitionRate {
                end,
                at: now,
                rate: 0.0,
                lag: 0,
                lag_rounds: 0,
            });
            let dt = now.saturating_sub(r.at) as f64 / 1e9;
            if dt >= 0.1 {
                let inst = end.saturating_sub(r.end) as f64 / dt;
                let a = 1.0 - (-dt / RATE_TAU_S).exp();
                r.rate += a * (inst - r.rate);
                r.end = end;
                r.at = now;
            }
        }
        st.rates.retain(|p, _| st.owners.contains_key(p));
    }

    /// Load of ready `p` for balancing: appends per second (plus one, so
    /// idle partitions still spread by count).
    fn weight(&self, st: &GroupState, p: u32) -> f64 {
        st.rates.get(&p).map_or(0.0, |r| r.rate) + 1.0
    }

    /// Marks ready `p` as moving away from its owner (to `to`, or to the
    /// balancer's pick). Released at once when its owner has nothing
    /// uncommitted in it. Returns whether anything changed.
    fn revoke(&self, st: &mut GroupState, p: u32, to: Option<u64>, now: u64) -> bool {
        let Some(o) = st.owners.get_mut(&p) else {
            return false;
        };
        if o.revoking.is_some() || o.member.is_none() {
            return false;
        }
        o.revoking = Some(Revoke {
            since_nanos: now,
            to,
        });
        o.moved_nanos = Some(now);
        self.try_release(st, p, now);
        true
    }

    /// Releases revoking `p` if its owner's commits cover what it handed
    /// out there.
    fn try_release(&self, st: &mut GroupState, p: u32, now: u64) {
        let Some(o) = st.owners.get(&p) else { return };
        if o.revoking.is_none() {
            return;
        }
        let Some(m) = o.member.and_then(|id| st.members.get(&id)) else {
            self.release(st, p, now);
            return;
        };
        if self.uncommitted(st, m, p) == 0 {
            self.release(st, p, now);
        }
    }

    /// Records `m` handed out in ready `p` (with its pinned children) that
    /// the group has not committed.
    fn uncommitted(&self, st: &GroupState, m: &MemberEntry, p: u32) -> u64 {
        Self::closure(&st.lineage, p)
            .into_iter()
            .map(|x| {
                let committed = if x == p {
                    Self::committed_position(st, p)
                } else {
                    st.committed.positions.get(&x).copied().unwrap_or(0)
                };
                let own = match m.delivered.get(&x) {
                    Some(&(pos, _)) => pos.saturating_sub(committed),
                    None if m.delivered_drained.contains(&x) => st
                        .lineage
                        .sealed_at(x)
                        .unwrap_or(0)
                        .saturating_sub(committed),
                    None => 0,
                };
                own.max(Self::handed_through_tails(st, m, x).saturating_sub(committed))
            })
            .sum()
    }

    /// How far `m` handed out `x`'s records before tail splits moved them
    /// into `x`: records it read from an ancestor past its split offset,
    /// which the group knows only by the ancestor's position until the
    /// member's next look translates it. Through any chain of tail splits
    /// (a child split in turn past what it was given): one level only
    /// would leave a grandchild with nothing handed out, and a revocation
    /// of it would release it at once while its owner holds its records.
    /// Each position is carried down alone, so a partition the member
    /// also lists itself does not stop another's translation.
    fn handed_through_tails(st: &GroupState, m: &MemberEntry, x: u32) -> u64 {
        if st.lineage.tails.is_empty() {
            return 0;
        }
        m.delivered
            .iter()
            .filter(|(&q, _)| q != x)
            .filter_map(|(&q, &(pos, _))| {
                let mut at = BTreeMap::from([(q, pos)]);
                translate_tails(&st.lineage, &mut at, &mut BTreeMap::new());
                at.get(&x).copied()
            })
            .max()
            .unwrap_or(0)
    }

    /// Takes ready `p` from its owner (whatever it handed out and did not
    /// commit is delivered again) and gives it to the revocation's target
    /// or leaves it for the balancer.
    fn release(&self, st: &mut GroupState, p: u32, now: u64) {
        let Some(o) = st.owners.get(&p).cloned() else {
            return;
        };
        if let Some(m) = o.member.and_then(|id| st.members.get(&id)) {
            st.stats.redelivered += self.uncommitted(st, m, p);
        }
        if let Some(id) = o.member {
            if let Some(m) = st.members.get_mut(&id) {
                for x in Self::closure(&st.lineage, p) {
                    m.delivered.remove(&x);
                    m.delivered_drained.remove(&x);
                }
            }
        }
        let to = o
            .revoking
            .as_ref()
            .and_then(|r| r.to)
            .filter(|t| st.members.contains_key(t));
        let since = o.revoking.as_ref().map_or(now, |r| r.since_nanos);
        let entry = st.owners.get_mut(&p).expect("present");
        entry.revoking = None;
        entry.member = None;
        // An owner that never took it did not end the pause that began
        // before it was given the partition.
        entry.unowned_since = Some(entry.pause_from.take().map_or(since, |f| f.min(since)));
        if let Some(t) = to {
            self.give(st, p, t, now);
        }
    }

    /// Gives unowned ready `p` to member `to`.
    fn give(&self, st: &mut GroupState, p: u32, to: u64, now: u64) {
        let generation = st.generation + 1;
        st.next_epoch += 1;
        let epoch = st.next_epoch;
        let entry = st.owners.get_mut(&p).expect("present");
        entry.member = Some(to);
        entry.generation = generation;
        entry.epoch = epoch;
        // A move: its pause lasts until the new owner takes it (see
        // `Member::sync`).
        if let Some(since) = entry.unowned_since.take() {
            entry.pause_from = Some(since);
            st.stats.moves += 1;
        }
        let _ = now;
    }

    fn remove_member(&self, st: &mut GroupState, id: u64, now: u64) {
        let owned: Vec<u32> = st
            .owners
            .iter()
            .filter(|(_, o)| o.member == Some(id))
            .map(|(&p, _)| p)
            .collect();
        for p in owned {
            if let Some(o) = st.owners.get_mut(&p) {
                if o.revoking.is_none() {
                    o.revoking = Some(Revoke {
                        since_nanos: now,
                        to: None,
                    });
                }
            }
            self.release(st, p, now);
        }
        st.members.remove(&id);
        // Revocations aimed at it go to the balancer.
        for o in st.owners.values_mut() {
            if let Some(r) = &mut o.revoking {
                if r.to == Some(id) {
                    r.to = None;
                }
            }
        }
    }

    /// Load per member. A partition being revoked toward a member counts
    /// with that member: it is on its way there, and counted with its
    /// owner it would make the next balancing move more than the share.
    fn member_loads(&self, st: &GroupState) -> BTreeMap<u64, f64> {
        let mut loads: BTreeMap<u64, f64> = st.members.keys().map(|&id| (id, 0.0)).collect();
        for (&p, o) in &st.owners {
            if let Some(m) = Self::holder(st, o) {
                *loads.entry(m).or_default() += self.weight(st, p);
            }
        }
        loads
    }

    /// The member a partition counts with for balancing: the target of its
    /// revocation if it has one, else its owner.
    fn holder(st: &GroupState, o: &Owner) -> Option<u64> {
        let target = o.revoking.as_ref().and_then(|r| r.to);
        target.filter(|t| st.members.contains_key(t)).or(o.member)
    }

    /// Members that may receive partitions: active, not recently relieved.
    fn receivers(st: &GroupState, now: u64) -> Vec<u64> {
        st.members
            .iter()
            .filter(|(_, m)| m.state == MemberState::Active && m.relieved_until <= now)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Gives every unowned ready partition to the least loaded receiver.
    fn assign_unowned(&self, st: &mut GroupState, now: u64) -> bool {
        let unowned: Vec<u32> = st
            .owners
            .iter()
            .filter(|(_, o)| o.member.is_none())
            .map(|(&p, _)| p)
            .collect();
        if unowned.is_empty() {
            return false;
        }
        let mut receivers = Self::receivers(st, now);
        if receivers.is_empty() {
            // Everyone is slow or relieved: better a slow reader than none.
            receivers = st.members.keys().copied().collect();
        }
        if receivers.is_empty() {
            return false;
        }
        let mut loads = self.member_loads(st);
        let mut weights: Vec<(u32, f64)> =
            unowned.iter().map(|&p| (p, self.weight(st, p))).collect();
        weights.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for (p, w) in weights {
            let to = *receivers
                .iter()
                .min_by(|a, b| loads[a].total_cmp(&loads[b]).then(a.cmp(b)))
                .expect("non-empty");
            *loads.get_mut(&to).expect("member") += w;
            self.give(st, p, to, now);
        }
        st.stats.rebalances += 1;
        true
    }

    /// See [`GroupOptions::split_lagging`]. The split changes the topology;
    /// the next refresh takes the children (pinned to the owner).
    fn split_for_lag(&self, st: &mut GroupState, now: u64) {
        // Lag trend per ready partition.
        let ready: Vec<u32> = st.owners.keys().copied().collect();
        for p in ready {
            let lag = self.lag(st, p);
            if let Some(r) = st.rates.get_mut(&p) {
                r.lag_rounds = if lag > r.lag { r.lag_rounds + 1 } else { 0 };
                r.lag = lag;
            }
        }
        let cooldown = duration_nanos(self.options.move_cooldown);
        if st
            .last_lag_split
            .is_some_and(|t| now.saturating_sub(t) < cooldown)
        {
            return;
        }
        let config = self.topic.config().balance;
        let active = st.lineage.active().count() as u32;
        if active >= config.max_partitions {
            return;
        }
        let receivers = Self::receivers(st, now);
        let idle = |st: &GroupState, id: u64| {
            self.owned_by(st, id)
                .iter()
                .map(|&q| self.lag(st, q))
                .sum::<u64>()
                == 0
        };
        let candidate = st.owners.iter().find_map(|(&p, o)| {
            let owner = o.member?;
            let r = st.rates.get(&p)?;
            let only = self.owned_by(st, owner) == [p] && o.revoking.is_none();
            let sealed = st.lineage.sealed_at(p).is_some();
            let in_band = match (config.target_records_per_sec, config.target_bytes_per_sec) {
                (Some(t), _) => r.rate < t && r.rate >= config.merge_fraction * t,
                // Only a bytes target: the group sees records, not bytes.
                (None, Some(_)) => false,
                (None, None) => true,
            };
            let spare = receivers.iter().any(|&m| m != owner && idle(st, m));
            (only
                && !sealed
                && in_band
                && spare
                && r.lag_rounds >= LAG_SPLIT_ROUNDS
                && r.lag >= RELIEF_LAG)
                .then_some(p)
        });
        let Some(p) = candidate else { return };
        if self
            .topic
            .split(p, crate::topic::SplitPlan::LoadMedian)
            .is_ok()
        {
            st.stats.lag_splits += 1;
            st.last_lag_split = Some(now);
            if let Some(r) = st.rates.get_mut(&p) {
                r.lag_rounds = 0;
            }
        }
    }

    /// Two rules, at most one move per member per balancing:
    ///
    /// - **Relief.** A member whose lag grew since the last balancing and
    ///   is at least [`RELIEF_LAG`] records and twice the lag of the least
    ///   lagging receiver gives its most lagging partition to that receiver
    ///   (its last one only if the receiver hands out records at least
    ///   twice as fast), and gets nothing by load for the move cooldown: it
    ///   processes more slowly than its partitions fill.
    /// - **Load.** With equal weights (all within the gain of each other;
    ///   idle partitions weigh one each), the fewest moves that bring the
    ///   counts within one ([`plan_counts`]). Otherwise the moves of a
    ///   sticky plan ([`plan_moves`]) when, all made, they lower the sum of
    ///   squared loads by more than one good single move would. Then, while
    ///   one exists, the single move to the least loaded receiver that
    ///   lowers the larger of the two loads by more than the gain
    ///   ([`MOVE_GAIN`] mean partition weights): where that ends, the
    ///   busiest member is over the least loaded receiver by at most its
    ///   lightest movable partition plus the gain. At most
    ///   [`GroupOptions::max_moves_per_balancing`] revocations a balancing.
    ///
    /// `membership_changed`: a member joined or left, so partitions moved
    /// recently may move again (the cooldown is against load noise).
    fn balance_load(&self, st: &mut GroupState, now: u64, membership_changed: bool) -> bool {
        if st.members.len() < 2 {
            return false;
        }
        let cooldown = duration_nanos(self.options.move_cooldown);
        let load_cooldown = if membership_changed { 0 } else { cooldown };
        let mut moved = false;
        // Relief by lag.
        let lags: BTreeMap<u64, u64> = st
            .members
            .keys()
            .map(|&id| {
                let lag = self.owned_by(st, id).iter().map(|&p| self.lag(st, p)).sum();
                (id, lag)
            })
            .collect();
        let receivers = Self::receivers(st, now);
        let mut gave: BTreeSet<u64> = BTreeSet::new();
        for (&id, &lag) in &lags {
            let grew = lag > st.members[&id].last_lag;
            let Some(&to) = receivers
                .iter()
                .filter(|&&r| r != id && !gave.contains(&r))
                .min_by_key(|&&r| (lags[&r], r))
            else {
                continue;
            };
            if !grew || lag < RELIEF_LAG || lag < 2 * lags[&to].max(1) {
                continue;
            }
            // Its only partition moves only to a member measurably faster:
            // otherwise the receiver would fall behind it the same way (a
            // partition hotter than one member is split for lag instead).
            let single = self.owned_by(st, id).len() == 1;
            if single && st.members[&id].rate >= 0.5 * st.members[&to].rate {
                continue;
            }
            let Some(p) = self
                .owned_by(st, id)
                .into_iter()
                .max_by_key(|&p| (self.lag(st, p), std::cmp::Reverse(p)))
            else {
                continue;
            };
            if self.revoke(st, p, Some(to), now) {
                st.stats.lag_relieved += 1;
                if let Some(m) = st.members.get_mut(&id) {
                    m.relieved_until = now.saturating_add(cooldown);
                }
                gave.insert(to);
                gave.insert(id);
                moved = true;
            }
        }
        for (&id, &lag) in &lags {
            if let Some(m) = st.members.get_mut(&id) {
                m.last_lag = lag;
            }
        }
        // Load: moves toward a sticky plan, then single moves while one
        // lowers the larger of two loads by more than the gain threshold;
        // at most `max_moves_per_balancing` revocations in all.
        if membership_changed {
            // The cooldown is against load noise; a join or leave is not
            // noise, so what moved before it may move again.
            for o in st.owners.values_mut() {
                o.moved_nanos = None;
            }
        }
        let receivers = Self::receivers(st, now);
        let mut loads = self.member_loads(st);
        let weights: BTreeMap<u32, f64> = st
            .owners
            .iter()
            .filter(|(_, o)| o.member.is_some())
            .map(|(&p, _)| (p, self.weight(st, p)))
            .collect();
        let mean_weight = weights.values().sum::<f64>() / weights.len().max(1) as f64;
        let gain = MOVE_GAIN * mean_weight;
        let movable = |st: &GroupState, p: u32| {
            st.owners[&p]
                .moved_nanos
                .is_none_or(|t| now.saturating_sub(t) >= load_cooldown)
        };
        let mut owned: BTreeMap<u64, Vec<u32>> = st.members.keys().map(|&m| (m, vec![])).collect();
        for (&p, o) in &st.owners {
            if let Some(m) = o.member.filter(|_| o.revoking.is_none()) {
                if movable(st, p) {
                    owned.entry(m).or_default().push(p);
                }
            }
        }
        // Equal weights (idle partitions all weigh one) balance by count,
        // exactly: the fewest moves that bring counts within one.
        let (lightest, heaviest) = weights
            .values()
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), &w| {
                (lo.min(w), hi.max(w))
            });
        let plan = if heaviest - lightest <= gain {
            let mut held: BTreeMap<u64, usize> = st.members.keys().map(|&m| (m, 0)).collect();
            for o in st.owners.values() {
                if let Some(m) = Self::holder(st, o) {
                    *held.entry(m).or_default() += 1;
                }
            }
            plan_counts(&owned, &held, &receivers, &gave)
        } else {
            let (plan, planned) = plan_moves(&owned, &weights, &loads, &receivers, &gave);
            let squares = |l: &BTreeMap<u64, f64>| l.values().map(|x| x * x).sum::<f64>();
            // Worth its pauses only if it beats what one good move gives.
            if squares(&planned) < squares(&loads) - 2.0 * gain * mean_weight {
                plan
            } else {
                Vec::new()
            }
        };
        let mut budget = self.options.max_moves_per_balancing;
        type Owned = BTreeMap<u64, Vec<u32>>;
        let mut apply = |st: &mut GroupState,
                         owned: &mut Owned,
                         loads: &mut BTreeMap<u64, f64>,
                         (p, from, to): (u32, u64, u64)| {
            if budget == 0 || !self.revoke(st, p, Some(to), now) {
                return false;
            }
            budget -= 1;
            let w = weights[&p];
            owned.get_mut(&from).expect("member").retain(|&q| q != p);
            *loads.get_mut(&from).expect("member") -= w;
            *loads.get_mut(&to).expect("member") += w;
            true
        };
        for m in plan {
            moved |= apply(st, &mut owned, &mut loads, m);
        }
        while let Some(m) = best_single_move(&owned, &weights, &loads, &receivers, &gave, gain) {
            if !apply(st, &mut owned, &mut loads, m) {
                break;
            }
            moved = true;
        }
        if moved {
            st.stats.rebalances += 1;
        }
        moved
    }
}

impl Group {
    /// Group name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Joins the group. With an `instance_id` naming a member still within
    /// its session timeout, the new member takes over that member's
    /// partitions (the old one is fenced) and nobody else's assignment
    /// changes; it resumes from the committed positions.
    pub fn join(&self, options: MemberOptions) -> Result<Member> {
        let s = &self.shared;
        s.topic.inner.core().check_not_closed()?;
        options.validate()?;
        let now = s.now();
        let mut st = s.st.lock();
        if st.deleted {
            return Err(Error::UnknownGroup(s.name.clone()));
        }
        s.tick(&mut st, now);
        let id = st.next_member;
        st.next_member += 1;
        let previous = options.instance_id.as_ref().and_then(|iid| {
            st.members
                .iter()
                .find(|(_, m)| m.instance_id.as_ref() == Some(iid))
                .map(|(&id, _)| id)
        });
        let entry = MemberEntry {
            instance_id: options.instance_id.clone(),
            opts: options.clone(),
            last_heartbeat: now,
            last_progress: now,
            state: MemberState::Active,
            slow_since: 0,
            delivered: BTreeMap::new(),
            delivered_drained: BTreeSet::new(),
            handed_out: 0,
            rate: 0.0,
            rate_at: now,
            relieved_until: 0,
            // No growth is measured before one balancing saw its lag.
            last_lag: u64::MAX,
        };
        st.members.insert(id, entry);
        if let Some(old) = previous {
            // Static rejoin: the partitions change hands directly; what the
            // old incarnation handed out and did not commit comes again.
            let generation = st.generation + 1;
            let ids: Vec<u32> = st
                .owners
                .iter()
                .filter(|(_, o)| o.member == Some(old))
                .map(|(&p, _)| p)
                .collect();
            for p in ids {
                let old_m = &st.members[&old];
                st.stats.redelivered += s.uncommitted(&st, old_m, p);
                st.next_epoch += 1;
                let epoch = st.next_epoch;
                let o = st.owners.get_mut(&p).expect("listed");
                o.member = Some(id);
                o.generation = generation;
                o.epoch = epoch;
                o.revoking = None;
            }
            st.members.remove(&old);
            st.generation = generation;
        } else {
            // Others keep reading; the newcomer gets unowned partitions and
            // its share of the load at once (each moved partition as soon
            // as its owner's commits cover it).
            s.tick_with(&mut st, now, true);
        }
        drop(st);
        let heartbeat = options
            .background_heartbeat
            .map(|every| spawn_heartbeat(Arc::downgrade(&self.shared), id, every));
        let mut m = Member {
            shared: self.shared.clone(),
            id,
            generation: 0,
            lineage: s.topic.lineage(),
            owned: BTreeSet::new(),
            positions: BTreeMap::new(),
            last_records: BTreeMap::new(),
            drained: BTreeSet::new(),
            pending: VecDeque::new(),
            next_rr: 0,
            retained: Vec::new(),
            paused: BTreeSet::new(),
            tenure: BTreeMap::new(),
            own_gone: BTreeSet::new(),
            skipped: BTreeMap::new(),
            polls: 0,
            heartbeat,
        };
        m.sync()?;
        Ok(m)
    }

    /// Runs the coordinator now: timeouts (dead and slow members, overdue
    /// revocations), unowned partitions, load balancing. Members' calls
    /// run it too; a broker may call it from a timer.
    pub fn tick(&self) {
        let now = self.shared.now();
        let mut st = self.shared.st.lock();
        self.shared.tick(&mut st, now);
    }

    /// Members, assignments, committed positions, lag and counters.
    pub fn describe(&self) -> GroupDescription {
        let s = &self.shared;
        let now = s.now();
        let mut st = s.st.lock();
        s.tick(&mut st, now);
        let st = &*st;
        let assignments: Vec<AssignmentDescription> = st
            .owners
            .iter()
            .map(|(&p, o)| AssignmentDescription {
                partition: p,
                member: o.member,
                generation: o.generation,
                revoking: o.revoking.is_some(),
                committed: GroupShared::committed_position(st, p),
                lag_records: s.lag(st, p),
                append_rate: st.rates.get(&p).map_or(0.0, |r| r.rate),
            })
            .collect();
        let members = st
            .members
            .iter()
            .map(|(&id, m)| MemberDescription {
                id,
                instance_id: m.instance_id.clone(),
                state: m.state,
                partitions: assignments
                    .iter()
                    .filter(|a| a.member == Some(id))
                    .map(|a| a.partition)
                    .collect(),
                lag_records: assignments
                    .iter()
                    .filter(|a| a.member == Some(id))
                    .map(|a| a.lag_records)
                    .sum(),
                processing_rate: m.rate,
                since_heartbeat_ms: millis(now.saturating_sub(m.last_heartbeat)),
                since_progress_ms: millis(now.saturating_sub(m.last_progress)),
            })
            .collect();
        GroupDescription {
            name: s.name.clone(),
            generation: st.generation,
            members,
            lag_records: assignments.iter().map(|a| a.lag_records).sum(),
            assignments,
            stats: st.stats.clone(),
        }
    }

    /// The committed positions as a reader's cut: a plain [`crate::Reader`]
    /// started from it reads what the group has not committed, and
    /// reports what retention removed under a committed position that no
    /// member told of it has committed past yet.
    pub fn committed(&self) -> crate::Cut {
        let mut st = self.shared.st.lock();
        // A tail split since the last look translates positions.
        self.shared.refresh(&mut st);
        crate::Cut {
            topic_id: self.shared.topic.id(),
            positions: st.committed.positions.clone(),
            drained: st.committed.drained.clone(),
            last_records: st.committed.last_records.clone(),
            removed_before: BTreeSet::new(),
        }
    }
}

fn spawn_heartbeat(
    shared: std::sync::Weak<GroupShared>,
    id: u64,
    every: Duration,
) -> HeartbeatThread {
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let stop2 = stop.clone();
    let handle = std::thread::Builder::new()
        .name("fissionlog-heartbeat".into())
        .spawn(move || loop {
            {
                let mut stopped = stop2.0.lock();
                if *stopped {
                    return;
                }
                stop2.1.wait_for(&mut stopped, every);
                if *stopped {
                    return;
                }
            }
            let Some(s) = shared.upgrade() else { return };
            if s.heartbeat(id).is_err() {
                return;
            }
        })
        .ok();
    HeartbeatThread { stop, handle }
}

impl GroupShared {
    fn heartbeat(&self, id: u64) -> Result<()> {
        let now = self.now();
        let mut st = self.st.lock();
        self.tick(&mut st, now);
        let m = st
            .members
            .get_mut(&id)
            .ok_or_else(|| self.fenced(id, "not a member (dead, left or replaced)"))?;
        m.last_heartbeat = now;
        Ok(())
    }
}

impl Member {
    /// Member id (unique across runs of the log).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The generation of the assignment this member last saw.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The ready partitions this member reads (with their split children),
    /// as of its last poll.
    pub fn assignment(&self) -> Assignment {
        Assignment {
            generation: self.generation,
            partitions: self.owned.iter().copied().collect(),
        }
    }

    /// Ranges passed over because retention had removed them first,
    /// including the unread rest of a partition this member was reading
    /// when retention emptied it and removed it from the topology (up to
    /// the seal its children record, `u64::MAX` when none does any more).
    /// Also what the group had not read of a partition retention removed
    /// under its committed position (with the removed partitions below
    /// it), when this member takes over what continues it: told again to
    /// the next owner, also after a reopen, until a member told of it
    /// commits.
    pub fn retained(&self) -> &[RetainedRange] {
        &self.retained
    }

    /// Tells the coordinator this member is alive (independently of
    /// processing). [`Error::Fenced`] if it was declared dead.
    pub fn heartbeat(&self) -> Result<()> {
        self.shared.heartbeat(self.id)
    }

    /// Takes the current assignment: drops partitions moved away, starts
    /// new ones at the committed positions. Called under no lock.
    fn sync(&mut self) -> Result<()> {
        let s = self.shared.clone();
        let now = s.now();
        let mut st = s.st.lock();
        s.tick(&mut st, now);
        let Some(m) = st.members.get_mut(&self.id) else {
            return Err(s.fenced(self.id, "not a member (dead, left or replaced)"));
        };
        m.last_heartbeat = now;
        m.last_progress = now;
        if m.state == MemberState::Slow {
            m.state = MemberState::Active;
        }
        // Report what was handed out since the last sync, once the
        // assignment has dropped the state of tenures that ended (else a
        // revocation would wait on records this member no longer holds).
        self.take_assignment(&st);
        self.report(&mut st);
        if self.settle_revoked(&s, &mut st, now) {
            self.take_assignment(&st);
        }
        self.take_losses(&mut st);
        // Partitions moved here end their pause now.
        for p in self.owned.iter() {
            if let Some(o) = st.owners.get_mut(p) {
                if let Some(from) = o.pause_from.take() {
                    let pauses = &mut st.stats.pauses_ms;
                    if pauses.len() >= MAX_PAUSES {
                        pauses.remove(0);
                    }
                    pauses.push(now.saturating_sub(from) as f64 / 1e6);
                }
            }
        }
        Ok(())
    }

    /// Brings the member's reading state to the coordinator's assignment
    /// (under the group lock): drops partitions moved away or read and
    /// committed, pauses those being revoked, starts new ones at their
    /// committed positions.
    fn take_assignment(&mut self, st: &GroupState) {
        self.lineage = st.lineage.clone();
        let lineage = self.lineage.clone();
        // A tail split moved what this member read past its parent's
        // logical end: read it from the children, at translated positions.
        self.pending.retain(|r| {
            lineage
                .tails
                .get(&r.partition)
                .is_none_or(|t| r.offset < t.index.from)
        });
        // The parents it read past their logical ends are read to the end
        // this member needs: drained (else the parent, still this member's
        // until a commit says otherwise, is read again from the committed
        // position, and a commit naming the children is refused).
        let left = translate_tails(&lineage, &mut self.positions, &mut self.last_records);
        self.drained.extend(left);
        // Partitions this member was reading that retention emptied and
        // removed: what it had not handed out is gone with their files, and
        // is reported (up to the seal their children record) as a reader
        // reports it, not dropped silently with the position below.
        let gone: Vec<(u32, u64)> = self
            .positions
            .iter()
            .filter(|(p, _)| !lineage.contains(**p))
            .map(|(&p, &o)| (p, o))
            .collect();
        self.own_gone.extend(
            self.drained
                .iter()
                .filter(|p| !lineage.contains(**p))
                .copied(),
        );
        for (p, pos) in gone {
            self.own_gone.insert(p);
            let start = self
                .pending
                .iter()
                .filter(|r| r.partition == p)
                .map(|r| r.offset)
                .min()
                .unwrap_or(pos);
            let end = lineage
                .removed_seals
                .get(&p)
                .copied()
                .unwrap_or(REMOVED_END);
            if start < end {
                self.tell(RetainedRange {
                    partition: p,
                    start,
                    end,
                });
            }
        }
        // Ours, in a tenure this member's reading state belongs to (the
        // same one, or its parent's for a split child it kept). A
        // partition taken away and given back since is read again from
        // the committed position: someone else may have read and
        // committed past what this member remembers.
        let held: BTreeSet<u64> = self.tenure.values().copied().collect();
        let mut mine: BTreeMap<u32, bool> = BTreeMap::new();
        let mut fresh: Vec<u32> = Vec::new();
        let mut tenure = BTreeMap::new();
        for (&p, o) in &st.owners {
            if o.member != Some(self.id) {
                continue;
            }
            mine.insert(p, o.revoking.is_some());
            tenure.insert(p, o.epoch);
            if !held.contains(&o.epoch) {
                fresh.push(p);
            }
        }
        self.tenure = tenure;
        let keep: BTreeSet<u32> = mine
            .keys()
            .filter(|p| !fresh.contains(p))
            .flat_map(|&p| GroupShared::closure(&lineage, p))
            .collect();
        self.paused = mine
            .iter()
            .filter(|(_, &revoking)| revoking)
            .flat_map(|(&p, _)| GroupShared::closure(&lineage, p))
            .collect();
        self.positions.retain(|p, _| keep.contains(p));
        self.drained.retain(|p| keep.contains(p));
        self.last_records.retain(|p, _| keep.contains(p));
        let paused = &self.paused;
        self.pending
            .retain(|r| keep.contains(&r.partition) && !paused.contains(&r.partition));
        let owned: BTreeSet<u32> = mine
            .iter()
            .filter(|(_, &revoking)| !revoking)
            .map(|(&p, _)| p)
            .collect();
        for &p in &owned {
            if self.positions.contains_key(&p) || self.drained.contains(&p) {
                continue;
            }
            // New to this member: from the committed position.
            let pos = GroupShared::committed_position(st, p);
            self.positions.insert(p, pos);
            if let Some(&f) = st.committed.last_records.get(&p) {
                self.last_records.insert(p, f);
            }
        }
        self.owned = owned;
        self.generation = st.generation;
    }

    /// Releases this member's revoked partitions whose handed-out records
    /// are all committed (what it publishes can shrink without a commit:
    /// a poll drops the state of tenures that ended). Returns whether any
    /// moved.
    fn settle_revoked(&self, s: &GroupShared, st: &mut GroupState, now: u64) -> bool {
        let revoking: Vec<u32> = st
            .owners
            .iter()
            .filter(|(_, o)| o.member == Some(self.id) && o.revoking.is_some())
            .map(|(&p, _)| p)
            .collect();
        let mut moved = false;
        for p in revoking {
            s.try_release(st, p, now);
            moved |= st.owners.get(&p).is_some_and(|o| o.member != Some(self.id));
        }
        if moved {
            st.generation += 1;
        }
        moved
    }

    /// Adds a range to `retained` unless this member was told exactly that
    /// range already (the group's loss and the member's own reading can
    /// both come to the same removed partition).
    fn tell(&mut self, r: RetainedRange) {
        if !self.retained.contains(&r) {
            self.retained.push(r);
        }
    }

    /// Takes the group's losses this member is to be told of into
    /// `retained` (under the group lock): each range once per member
    /// (a later tenure of the heir with the same member tells nothing
    /// new), none this member reported from its own reading state.
    fn take_losses(&mut self, st: &mut GroupState) {
        let held: BTreeSet<u64> = self.tenure.values().copied().collect();
        let mine: Vec<(u32, (u64, u64))> = st
            .losses
            .iter()
            .filter_map(|(&p, l)| Some((p, GroupShared::loss_holder(st, l)?)))
            .filter(|&(_, (m, e))| m == self.id && (e == 0 || held.contains(&e)))
            .collect();
        for (p, holder) in mine {
            let loss = st.losses.get_mut(&p).expect("listed");
            if loss.handed != Some(holder) {
                // A new tenure of this same member (what continues the
                // loss merged or moved back to it): its `retained` holds
                // the ranges already, they are not told again.
                if loss.handed.map(|(m, _)| m) != Some(holder.0) {
                    loss.handed_ranges.clear();
                }
                loss.handed = Some(holder);
            }
            for r in &loss.ranges {
                if loss.handed_ranges.contains(r) {
                    continue;
                }
                loss.handed_ranges.push(*r);
                if !self.own_gone.contains(&r.partition) {
                    self.tell(*r);
                }
            }
        }
        // Only those the group may still report matter.
        let named: BTreeSet<u32> = st
            .losses
            .values()
            .flat_map(|l| l.ranges.iter().map(|r| r.partition))
            .collect();
        self.own_gone.retain(|p| named.contains(p));
    }

    /// The group's losses this member was told of in full, in tenures it
    /// still holds, and those with nothing to tell: a commit of the
    /// member drops their positions. A range of a partition this member
    /// was reading when retention removed it counts as told: the member
    /// handed out what it read there since the committed position and
    /// reported the rest from its own position.
    fn told_losses(&self, st: &GroupState) -> Vec<u32> {
        let held: BTreeSet<u64> = self.tenure.values().copied().collect();
        st.losses
            .iter()
            .filter(|(_, l)| {
                let handed_here = l
                    .handed
                    .is_some_and(|(m, e)| m == self.id && (e == 0 || held.contains(&e)));
                l.ranges.iter().all(|r| {
                    self.own_gone.contains(&r.partition)
                        || (handed_here && l.handed_ranges.contains(r))
                })
            })
            .map(|(&p, _)| p)
            .collect()
    }

    /// Publishes what this member handed out (under the group lock).
    fn report(&self, st: &mut GroupState) {
        let Some(m) = st.members.get_mut(&self.id) else {
            return;
        };
        m.delivered = self
            .positions
            .iter()
            .map(|(&p, &pos)| (p, (pos, self.last_records.get(&p).copied())))
            .collect();
        m.delivered_drained = self.drained.clone();
    }

    /// Up to `max_records` records of this member's partitions that are
    /// available now. Per key, records come in append order, through
    /// splits and merges. [`Error::Fenced`] if the member was declared dead.
    pub fn poll(&mut self, max_records: usize) -> Result<Vec<OwnedRecord>> {
        self.polls += 1;
        self.poll_once(max_records)
    }

    /// One round of [`Member::poll`], counted in [`Member::polls`] by its
    /// caller: the calls the application makes count, not the rounds
    /// [`Member::poll_wait`] makes while it waits (a loss reported by one
    /// of them is not yet seen by the application).
    fn poll_once(&mut self, max_records: usize) -> Result<Vec<OwnedRecord>> {
        let mut out = Vec::new();
        // A few rounds when a round only passed empty sealed partitions:
        // committing those lets merge children become ready.
        for _ in 0..8 {
            self.sync()?;
            self.take(&mut out, max_records)?;
            self.advance();
            if !out.is_empty() || !self.settle_empty_drains()? {
                break;
            }
        }
        self.advance();
        let s = self.shared.clone();
        let mut st = s.st.lock();
        // Records are handed out only from partitions still this member's
        // as the coordinator learns of them: one released meanwhile (its
        // new owner starts at the committed position) gives nothing here,
        // so no record reaches two live members.
        if !st.members.contains_key(&self.id) {
            return Err(s.fenced(self.id, "not a member (dead, left or replaced)"));
        }
        if !out.is_empty() {
            let lineage = st.lineage.clone();
            let held: BTreeSet<u64> = self.tenure.values().copied().collect();
            let mine: BTreeSet<u32> = st
                .owners
                .iter()
                .filter(|(_, o)| o.member == Some(self.id) && held.contains(&o.epoch))
                .flat_map(|(&p, _)| GroupShared::closure(&lineage, p))
                .collect();
            if out.iter().any(|r| !mine.contains(&r.partition)) {
                out.retain(|r| mine.contains(&r.partition));
                self.positions.retain(|p, _| mine.contains(p));
                self.last_records.retain(|p, _| mine.contains(p));
                self.drained.retain(|p| mine.contains(p));
                self.pending.retain(|r| mine.contains(&r.partition));
            }
        }
        if let Some(m) = st.members.get_mut(&self.id) {
            m.handed_out += out.len() as u64;
            let now = s.now();
            let dt = now.saturating_sub(m.rate_at) as f64 / 1e9;
            if dt >= 0.1 {
                let inst = m.handed_out as f64 / dt;
                let a = 1.0 - (-dt / RATE_TAU_S).exp();
                m.rate += a * (inst - m.rate);
                m.handed_out = 0;
                m.rate_at = now;
            }
        }
        self.report(&mut st);
        self.settle_revoked(&s, &mut st, s.now());
        Ok(out)
    }

    /// Hands out pending and newly read records into `out`, up to `max`.
    fn take(&mut self, out: &mut Vec<OwnedRecord>, max: usize) -> Result<()> {
        while out.len() < max {
            if self.pending.is_empty() {
                match self.fill() {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(e) if out.is_empty() => return Err(e),
                    Err(_) => break,
                }
            }
            let n = (max - out.len()).min(self.pending.len());
            out.extend(self.pending.drain(..n));
            if let Some(r) = out.last().filter(|_| n > 0) {
                self.positions.insert(r.partition, r.offset + 1);
                let f = fingerprint(r.offset, r.timestamp, r.key.as_deref(), &r.value);
                self.last_records.insert(r.partition, f);
            }
        }
        Ok(())
    }

    /// Commits as read the partitions this member read to their seal that
    /// hold nothing past the group's committed position (empty sealed
    /// partitions, or all committed already): no record is at stake, and
    /// without it a consumer that commits only after records would never
    /// let a merge child behind them become ready. Returns whether the
    /// group's positions moved.
    fn settle_empty_drains(&mut self) -> Result<bool> {
        let done: Vec<u32> = {
            let st = self.shared.st.lock();
            let candidates: Vec<u32> = self
                .drained
                .iter()
                .copied()
                .filter(|&d| {
                    let seal = self.lineage.sealed_at(d).unwrap_or(u64::MAX);
                    let end = self
                        .shared
                        .topic
                        .partition(d)
                        .map_or(seal, |p| p.end_offset().min(seal));
                    let committed = st.committed.positions.get(&d).copied().unwrap_or(0);
                    // Or nothing is left between the committed position and
                    // the end but what retention removed, and this member
                    // reported that in an earlier poll (its caller has seen
                    // `retained` since): committing it as read hands out
                    // nothing and keeps the loss reported at least once.
                    let skipped = self.skipped.get(&d).is_some_and(|&(from, to, poll)| {
                        from <= committed && to >= end && poll < self.polls
                    });
                    (committed >= end || skipped) && !st.committed.drained.contains(&d)
                })
                .collect();
            // Parents first: a split child only with (or after) its
            // parents committed as read.
            let read = st.committed.all_drained(&self.lineage);
            let mut done: Vec<u32> = Vec::new();
            loop {
                let before = done.len();
                for &d in &candidates {
                    if !done.contains(&d)
                        && self.lineage.parents(d).iter().all(|q| {
                            read.contains(q) || done.contains(q) || !self.lineage.contains(*q)
                        })
                    {
                        done.push(d);
                    }
                }
                if done.len() == before {
                    break done;
                }
            }
        };
        if done.is_empty() {
            return Ok(false);
        }
        let before = self.shared.st.lock().stats.commits;
        self.commit_inner(&[], &done, false)?;
        Ok(self.shared.st.lock().stats.commits > before)
    }

    /// Like [`Member::poll`], but waits up to `timeout` for records.
    pub fn poll_wait(&mut self, max_records: usize, timeout: Duration) -> Result<Vec<OwnedRecord>> {
        let deadline = crate::duration::deadline_after(timeout);
        let wake = self.shared.topic.inner.wake().clone();
        self.polls += 1;
        loop {
            let got = self.poll_once(max_records)?;
            let now = Instant::now();
            if !got.is_empty() || deadline.is_some_and(|d| now >= d) {
                return Ok(got);
            }
            // Wake at least every 50 ms to run the coordinator's timeouts.
            let tick = now + Duration::from_millis(50);
            let until = deadline.map_or(tick, |d| d.min(tick));
            wake.wait_until(Some(until), || self.can_move());
        }
    }

    fn can_move(&self) -> bool {
        if !self.pending.is_empty() {
            return true;
        }
        // Partitions being revoked are not read: records there are no
        // reason to wake (the wait would spin until its timeout).
        self.positions.iter().any(|(&id, &pos)| {
            !self.paused.contains(&id)
                && self.shared.topic.partition(id).map_or(true, |p| {
                    p.visible_end(p.default_isolation()) > pos || self.is_drained_at(id, pos)
                })
        })
    }

    fn is_drained_at(&self, id: u32, pos: u64) -> bool {
        drained_at(&self.shared.topic, &self.lineage, id, pos)
    }

    /// Moves partitions handed out to their seal into `drained` and opens
    /// their split children. Merge children wait for the group's commit.
    fn advance(&mut self) -> bool {
        let mut changed = false;
        loop {
            let done: Vec<u32> = self
                .positions
                .iter()
                .filter(|(&id, &pos)| {
                    self.is_drained_at(id, pos) && !self.pending.iter().any(|r| r.partition == id)
                })
                .map(|(&id, _)| id)
                .collect();
            if done.is_empty() {
                return changed;
            }
            changed = true;
            for id in done {
                self.positions.remove(&id);
                self.last_records.remove(&id);
                self.drained.insert(id);
                for &c in self.lineage.children(id) {
                    if self.lineage.parents(c).len() == 1 && !self.positions.contains_key(&c) {
                        self.positions.insert(c, 0);
                    }
                }
            }
        }
    }

    /// Reads the next partition (in turn) with records into `pending`.
    fn fill(&mut self) -> Result<bool> {
        let mut moved = self.advance();
        let ids: Vec<u32> = self
            .positions
            .range(self.next_rr..)
            .chain(self.positions.range(..self.next_rr))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            if self.paused.contains(&id) {
                continue;
            }
            let pos = self.positions[&id];
            let part = match self.shared.topic.partition(id) {
                Ok(p) => p,
                Err(Error::UnknownPartition { .. }) => continue,
                Err(e) => return Err(e),
            };
            let batch = match read_step(&part, pos, part.default_isolation())? {
                ReadStep::Nothing => continue,
                ReadStep::Skip { to, retained } => {
                    if let Some(r) = retained {
                        self.tell(r);
                    }
                    let from = match self.skipped.get(&id) {
                        Some(&(from, end, _)) if end == pos => from,
                        _ => pos,
                    };
                    self.skipped.insert(id, (from, to, self.polls));
                    self.positions.insert(id, to);
                    self.last_records.remove(&id);
                    moved = true;
                    continue;
                }
                ReadStep::Batch(b) => b,
            };
            self.next_rr = id.wrapping_add(1);
            if let Some(to) = take_batch(&mut self.pending, id, pos, &batch)? {
                self.positions.insert(id, to);
            }
            return Ok(true);
        }
        Ok(moved)
    }

    /// Commits everything this member has handed out, atomically across its
    /// partitions, durably (in the manifest) when this returns. Refused
    /// with [`Error::Fenced`] if the member was declared dead; a partition
    /// revoked in the meantime moves to its new owner once committed.
    pub fn commit(&mut self) -> Result<()> {
        let positions: Vec<(u32, u64)> = self.positions.iter().map(|(&p, &o)| (p, o)).collect();
        let drained: Vec<u32> = self.drained.iter().copied().collect();
        self.commit_inner(&positions, &drained, true)
    }

    /// Commits the given next offsets (each at most what was handed out),
    /// atomically. A partition must be one this member reads (one
    /// retention removed has nothing left to commit and is passed over);
    /// a split child
    /// only together with (or after) its parent read to its seal, else the
    /// commit is refused ([`Error::InvalidConfig`]). A partition named twice
    /// commits the higher offset.
    pub fn commit_positions(&mut self, positions: &[(u32, u64)]) -> Result<()> {
        let mut highest: BTreeMap<u32, u64> = BTreeMap::new();
        for &(p, o) in positions {
            let e = highest.entry(p).or_insert(o);
            *e = (*e).max(o);
        }
        let mut pos = Vec::new();
        let mut drained = Vec::new();
        // Offsets of records handed out from a tail-split parent before the
        // split, past its logical end: the children's translated positions,
        // the parent read (as this member's positions were translated).
        let lineage = self.lineage.clone();
        for p in translate_tails(&lineage, &mut highest, &mut BTreeMap::new()) {
            if self.drained.contains(&p) {
                drained.push(p);
            }
        }
        for (p, o) in highest {
            let handed = match self.positions.get(&p) {
                Some(&h) => h,
                None if self.drained.contains(&p) => self.lineage.sealed_at(p).unwrap_or(0),
                // Removed by retention (this member reported what it had
                // not handed out there): nothing left to commit, as in
                // `commit`.
                None if !self.lineage.contains(p) && self.lineage.removed.contains_key(&p) => {
                    continue
                }
                None => {
                    return Err(Error::NotAssigned {
                        group: self.shared.name.clone(),
                        member: self.id,
                        partition: p,
                    })
                }
            };
            if o > handed {
                return Err(Error::InvalidConfig(format!(
                    "commit of offset {o} in partition {p} past what was handed out ({handed})"
                )));
            }
            if self.drained.contains(&p) && o >= handed {
                drained.push(p);
            } else {
                pos.push((p, o));
            }
        }
        self.commit_inner(&pos, &drained, true)
    }

    /// `tell`: a commit the caller made (not one a poll made by itself),
    /// so it covers the losses the member was told of before it.
    fn commit_inner(
        &mut self,
        positions: &[(u32, u64)],
        drained: &[u32],
        tell: bool,
    ) -> Result<()> {
        let s = self.shared.clone();
        let now = s.now();
        let mut st = s.st.lock();
        // The timeouts first: a member past its session timeout is fenced
        // here, not allowed to commit until something else notices.
        s.tick(&mut st, now);
        if !st.members.contains_key(&self.id) {
            return Err(s.fenced(self.id, "not a member (dead, left or replaced)"));
        }
        self.report(&mut st);
        let lineage = st.lineage.clone();
        // A position past a tail-split parent's logical end (records handed
        // out before the split) is committed as what it means: the parent
        // read, the children at the translated positions. Written as the
        // parent's, it would be lost with the parent's removal.
        let mut moved: BTreeMap<u32, u64> = positions.iter().copied().collect();
        let left = translate_tails(&lineage, &mut moved, &mut BTreeMap::new());
        let (moved_positions, moved_drained): (Vec<(u32, u64)>, Vec<u32>);
        let (positions, drained) = if left.is_empty() {
            (positions, drained)
        } else {
            moved_positions = moved.into_iter().collect();
            moved_drained = drained.iter().copied().chain(left).collect();
            (&moved_positions[..], &moved_drained[..])
        };
        // Which ready partition each named one belongs to.
        // Only partitions held in the tenure this member's state belongs
        // to: one taken away and given back since is not committed from
        // what this member remembers of it.
        let held: BTreeSet<u64> = self.tenure.values().copied().collect();
        let mut root_of: BTreeMap<u32, u32> = BTreeMap::new();
        for (&p, o) in &st.owners {
            if o.member == Some(self.id) && held.contains(&o.epoch) {
                for x in GroupShared::closure(&lineage, p) {
                    root_of.insert(x, p);
                }
            }
        }
        let all_drained = st.committed.all_drained(&lineage);
        let drained_now: BTreeSet<u32> = drained.iter().copied().collect();
        let mut delta = Committed::default();
        let child_before_parent = |p: u32| {
            Error::InvalidConfig(format!(
                "commit of split child {p} before its parents are committed as read"
            ))
        };
        let lost = |p: u32, o: u64| -> Result<()> {
            // Moved away: fine when the group committed this far already
            // (the partition was released with nothing pending), refused
            // when records handed out here would be lost to the commit.
            // A partition retention removed has nothing left to commit.
            let committed = st.committed.positions.get(&p).copied();
            if all_drained.contains(&p)
                || committed.is_some_and(|c| c >= o)
                || o == 0
                || !lineage.contains(p)
            {
                Ok(())
            } else {
                Err(Error::NotAssigned {
                    group: s.name.clone(),
                    member: self.id,
                    partition: p,
                })
            }
        };
        // Every named partition: one not held is fine only if nothing
        // handed out there would be lost; one held is a split child only
        // once its parent is (being) read, refused rather than left out of
        // a commit that reports success.
        let named = positions.iter().copied().chain(
            drained
                .iter()
                .map(|&d| (d, self.lineage.sealed_at(d).unwrap_or(u64::MAX))),
        );
        for (p, o) in named {
            if !root_of.contains_key(&p) {
                lost(p, o)?;
            } else if !lineage.parents(p).iter().all(|q| {
                all_drained.contains(q) || drained_now.contains(q) || !lineage.contains(*q)
            }) {
                return Err(child_before_parent(p));
            }
        }
        for &(p, o) in positions {
            if !root_of.contains_key(&p) {
                continue;
            }
            if st.committed.positions.get(&p).is_some_and(|&c| c >= o) {
                // Never backwards (a commit of older positions after a
                // newer one), and nothing to write for a position the
                // group lists already (an idle consumer loop commits after
                // every empty poll: each would cost a manifest fsync). An
                // unlisted partition is listed once, even at 0.
                continue;
            }
            delta.positions.insert(p, o);
            let f = if self.positions.get(&p) == Some(&o) {
                self.last_records.get(&p).copied()
            } else {
                None
            };
            if let Some(f) = f {
                delta.last_records.insert(p, f);
            }
        }
        for &d in drained {
            if root_of.contains_key(&d) && !all_drained.contains(&d) {
                delta.drained.insert(d);
            }
        }
        // A drained partition's split children are listed (at 0 if unread)
        // so the parent can be pruned and the children become ready.
        for &d in &delta.drained.clone() {
            for &c in lineage.children(d) {
                if lineage.parents(c).len() == 1
                    && !delta.positions.contains_key(&c)
                    && !delta.drained.contains(&c)
                    && !st.committed.positions.contains_key(&c)
                {
                    delta.positions.insert(c, 0);
                }
            }
        }
        // Losses this member was told of leave the committed positions
        // now (drained and pruned at once: a removed partition has no
        // children to list); the partitions that continue them are listed
        // (at 0 if unread), so their own removal is reported in turn.
        let told = if tell {
            self.told_losses(&st)
        } else {
            Vec::new()
        };
        for p in &told {
            delta.drained.insert(*p);
            for &h in &st.losses[p].heirs {
                if st.owners.contains_key(&h)
                    && !st.committed.positions.contains_key(&h)
                    && !delta.positions.contains_key(&h)
                    && !delta.drained.contains(&h)
                {
                    delta.positions.insert(h, 0);
                }
            }
        }
        if delta.positions.is_empty() && delta.drained.is_empty() {
            st.members.get_mut(&self.id).expect("member").last_progress = now;
            self.settle_revoked(&s, &mut st, now);
            self.take_assignment(&st);
            return Ok(());
        }
        // The state after the commit, and which drained ids it can prune.
        let mut next = st.committed.clone();
        for (&p, &o) in &delta.positions {
            next.positions.insert(p, o);
            match delta.last_records.get(&p) {
                Some(&f) => next.last_records.insert(p, f),
                None => next.last_records.remove(&p),
            };
            next.drained.remove(&p);
        }
        for &d in &delta.drained {
            next.positions.remove(&d);
            next.last_records.remove(&d);
            next.drained.insert(d);
        }
        let pruned: Vec<u32> = next
            .drained
            .iter()
            .copied()
            .filter(|&d| {
                let children = lineage.children(d);
                !children.is_empty()
                    && children
                        .iter()
                        .all(|c| next.positions.contains_key(c) || next.drained.contains(c))
            })
            .collect();
        let pruned: Vec<u32> = pruned.into_iter().chain(told.iter().copied()).collect();
        for d in &pruned {
            next.drained.remove(d);
        }
        let drained_list: Vec<u32> = delta.drained.iter().copied().collect();
        let generation = st.generation;
        s.topic
            .commit_group(&s.name, generation, &delta, &drained_list, &pruned)?;
        st.committed = next;
        for p in &told {
            st.losses.remove(p);
        }
        if !st.losses.is_empty() {
            // The commit may have read partitions that continued a loss:
            // it goes on with what continues them.
            s.refresh_losses(&mut st);
        }
        st.stats.commits += 1;
        if let Some(m) = st.members.get_mut(&self.id) {
            m.last_progress = now;
            if m.state == MemberState::Slow {
                m.state = MemberState::Active;
            }
        }
        // Partitions read and committed leave the ready set; their children
        // become ready with this member.
        let before: BTreeSet<u32> = st.owners.keys().copied().collect();
        s.recompute_ready(&mut st, Some(self.id));
        if st.owners.keys().copied().collect::<BTreeSet<u32>>() != before {
            st.generation += 1;
        }
        // Revoked partitions whose handed-out records are now committed move.
        let revoking: Vec<u32> = st
            .owners
            .iter()
            .filter(|(_, o)| o.member == Some(self.id) && o.revoking.is_some())
            .map(|(&p, _)| p)
            .collect();
        for p in revoking {
            s.try_release(&mut st, p, now);
        }
        s.assign_unowned(&mut st, now);
        self.take_assignment(&st);
        Ok(())
    }

    /// Leaves the group: its partitions go to the others at once, from the
    /// committed positions (commit first, or what was handed out since the
    /// last commit is delivered again).
    pub fn leave(mut self) -> Result<()> {
        self.heartbeat.take();
        let s = self.shared.clone();
        let now = s.now();
        let mut st = s.st.lock();
        if !st.members.contains_key(&self.id) {
            return Err(s.fenced(self.id, "not a member (dead, left or replaced)"));
        }
        self.report(&mut st);
        s.remove_member(&mut st, self.id, now);
        s.tick_with(&mut st, now, true);
        st.generation += 1;
        Ok(())
    }
}

/// Stops the heartbeat: without [`Member::leave`], the member is declared
/// dead once its session timeout passes.
impl Drop for Member {
    fn drop(&mut self) {
        self.heartbeat.take();
    }
}

/// What a crash recovery cut under a group's committed position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LostGroupPosition {
    /// Topic name.
    pub topic: String,
    /// Group name.
    pub group: String,
    /// Partition id.
    pub partition: u32,
    /// The committed position.
    pub committed: u64,
    /// Where the partition ends now; the group resumes here.
    pub end: u64,
}

/// After recovery: every group position past its partition's recovered end
/// (records the group consumed that a power loss cut, whose offsets new
/// appends would reuse) is moved back to the end, durably, and reported,
/// before anything can be appended.
pub(crate) fn check_group_positions(topics: &[Topic]) -> Result<Vec<LostGroupPosition>> {
    let mut lost = Vec::new();
    for t in topics {
        for name in t.groups() {
            let Some(g) = t.group_record(&name) else {
                continue;
            };
            let mut rewind = Committed::default();
            let lineage = t.lineage();
            for (&p, &pos) in &g.positions {
                let Ok(part) = t.partition(p) else { continue };
                let end = part.end_offset();
                // Past a tail-split parent's logical end, up to its seal, a
                // position continues in the children (translated at the
                // group's first look): a commit that raced the split wrote
                // it, from records handed out before. Not lost.
                if lineage
                    .tails
                    .get(&p)
                    .is_some_and(|tail| pos <= tail.index.seal)
                {
                    continue;
                }
                if pos > end {
                    let (at, last) = t.latest_position(p, end)?;
                    rewind.positions.insert(p, at);
                    if let Some(f) = last {
                        rewind.last_records.insert(p, f);
                    }
                    lost.push(LostGroupPosition {
                        topic: t.name().to_string(),
                        group: name.clone(),
                        partition: p,
                        committed: pos,
                        end,
                    });
                }
            }
            if !rewind.positions.is_empty() {
                t.commit_group(&name, g.generation, &rewind, &[], &[])?;
            }
        }
    }
    Ok(lost)
}
