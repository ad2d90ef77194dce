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

mod assign;
mod commit;
mod committed;
mod coordinator;
mod heartbeat;
mod member;
mod membership;
mod rates;
mod recovery;
mod registry;
mod report;
mod timeouts;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use serde::Serialize;

use crate::balance::BalancePolicy;
use crate::error::{Error, Result};
use crate::topic::{SplitPlan, Topic};
use crate::topology::lineage::Lineage;
use crate::wake::Subscription;

use coordinator::{Coordinator, TopicView};

pub use member::Member;
pub(crate) use recovery::check_group_positions;

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
    pub(super) fn validate(&self) -> Result<()> {
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

/// The runtime shell of one group's [`Coordinator`]: reads the clock and
/// the topic, feeds the coordinator, and carries out its outputs (a split
/// for lag; commits are persisted by [`Member`]). One per group and log,
/// shared by every handle (`registry::Registry`).
#[derive(Debug)]
pub(crate) struct Runtime {
    topic: Topic,
    name: String,
    coordinator: Mutex<Coordinator>,
    /// The partitions the topic signalled, handed to the coordinator on
    /// every lock: its rates and lags follow what moved without walking
    /// every ready partition (see `rates.rs`).
    signals: Subscription,
}

/// A consumer group of one topic (cheap to clone). Take one with
/// [`Topic::group`]; members join through it.
#[derive(Debug, Clone)]
pub struct Group {
    runtime: Arc<Runtime>,
}

impl TopicView for Topic {
    fn topology_generation(&self) -> u64 {
        Topic::topology_generation(self)
    }

    fn lineage(&self) -> Arc<Lineage> {
        Topic::lineage(self)
    }

    fn end_offset(&self, id: u32) -> u64 {
        self.partition(id).map_or(0, |x| x.end_offset())
    }

    fn balance_policy(&self) -> BalancePolicy {
        self.config().balance
    }
}

impl Runtime {
    /// The group clock, in nanoseconds.
    fn now(&self) -> u64 {
        self.topic.inner.core().clock.now_nanos()
    }

    fn lock(&self) -> MutexGuard<'_, Coordinator> {
        let mut co = self.coordinator.lock();
        // Under the lock: the ends the coordinator looks up after this are
        // at least those the signals taken here were published with.
        co.note_moved(self.signals.ready().take());
        co
    }

    /// Carries out what the coordinator asked for while `co` was held: a
    /// split for lag (counted once it commits; a refused one is asked for
    /// again at a later balancing).
    fn carry_out(&self, co: &mut Coordinator, now: u64) {
        if let Some(p) = co.lag_split.take() {
            if self.topic.split(p, SplitPlan::LoadMedian).is_ok() {
                co.lag_split_done(p, now);
            }
        }
    }

    /// Runs the coordinator's timeouts and balancer now.
    fn tick(&self, co: &mut Coordinator, now: u64) {
        co.tick(&self.topic, now);
        self.carry_out(co, now);
    }

    fn heartbeat(&self, id: u64) -> Result<()> {
        let now = self.now();
        let mut co = self.lock();
        let beat = co.heartbeat(&self.topic, now, id);
        self.carry_out(&mut co, now);
        beat
    }
}

impl Group {
    /// Group name.
    pub fn name(&self) -> &str {
        &self.runtime.name
    }

    /// Joins the group. With an `instance_id` naming a member still within
    /// its session timeout, the new member takes over that member's
    /// partitions (the old one is fenced) and nobody else's assignment
    /// changes; it resumes from the committed positions.
    pub fn join(&self, options: MemberOptions) -> Result<Member> {
        let runtime = &self.runtime;
        runtime.topic.inner.core().check_not_closed()?;
        options.validate()?;
        let now = runtime.now();
        let id = {
            let mut co = runtime.lock();
            let joined = co.join(&runtime.topic, now, &options);
            runtime.carry_out(&mut co, now);
            joined?
        };
        Member::start(self.runtime.clone(), id, options.background_heartbeat)
    }

    /// Runs the coordinator now: timeouts (dead and slow members, overdue
    /// revocations), unowned partitions, load balancing. Members' calls
    /// run it too; a broker may call it from a timer.
    pub fn tick(&self) {
        let now = self.runtime.now();
        let mut co = self.runtime.lock();
        self.runtime.tick(&mut co, now);
    }

    /// Members, assignments, committed positions, lag and counters.
    pub fn describe(&self) -> GroupDescription {
        let runtime = &self.runtime;
        let now = runtime.now();
        let mut co = runtime.lock();
        runtime.tick(&mut co, now);
        co.describe(&runtime.topic, now)
    }

    /// The committed positions as a reader's cut: a plain [`crate::Reader`]
    /// started from it reads what the group has not committed, and
    /// reports what retention removed under a committed position that no
    /// member told of it has committed past yet.
    pub fn committed(&self) -> crate::Cut {
        let mut co = self.runtime.lock();
        // A tail split since the last look translates positions.
        co.refresh(&self.runtime.topic);
        crate::Cut {
            topic_id: self.runtime.topic.id(),
            positions: co.committed.positions.clone(),
            drained: co.committed.drained.clone(),
            last_records: co.committed.last_records.clone(),
            removed_before: BTreeSet::new(),
        }
    }
}

fn millis(nanos: u64) -> u64 {
    nanos / 1_000_000
}
