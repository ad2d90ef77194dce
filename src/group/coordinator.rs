//! The consumer-group coordinator as a pure state machine: who owns which
//! ready partition, the two liveness clocks, revocations and their
//! release, commits applied to the committed positions. Time and the
//! partitions' ends come in as values, so it runs the same in simulated
//! time (the tests below) as under the log's clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::balance::BalancePolicy;
use crate::duration::duration_nanos;
use crate::error::Error;
use crate::reader::translate_tails;
use crate::topology::lineage::Lineage;

use super::committed::{lists_descendant, Committed, Loss};
use super::rates::{Moved, PartitionRate};
use super::timeouts::deadline_after;
use super::{GroupOptions, GroupStats, MemberOptions, MemberState};

/// What the coordinator reads of its topic, through the shell: the lineage
/// (when the topology generation moved), the end of a partition and the
/// write-side balance policy (for splits for lag). Reads only: what the
/// coordinator wants done to the topic is an output.
pub(crate) trait TopicView {
    /// The topology generation now.
    fn topology_generation(&self) -> u64;
    /// The lineage at the current topology generation.
    fn lineage(&self) -> Arc<Lineage>;
    /// End offset of partition `id`; 0 when it is gone.
    fn end_offset(&self, id: u32) -> u64;
    /// The topic's balance policy (split targets, most partitions).
    fn balance_policy(&self) -> BalancePolicy;
}

/// Partitions read by the owner of ready `p`: `p` and its split
/// descendants (pinned to it until the group commits `p` as read).
pub(super) fn closure(lineage: &Lineage, p: u32) -> Vec<u32> {
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

#[derive(Debug, Clone)]
pub(super) struct Revoke {
    pub(super) since_nanos: u64,
    /// Where it goes once released (None: whoever the balancer picks).
    pub(super) to: Option<u64>,
}

#[derive(Debug, Clone)]
pub(super) struct Owner {
    pub(super) member: Option<u64>,
    pub(super) generation: u64,
    /// Tenure: a new value every time the partition is given to a member,
    /// kept when a split child becomes ready with its parent's owner. A
    /// member's reading state for it is valid only within one tenure.
    pub(super) epoch: u64,
    pub(super) revoking: Option<Revoke>,
    /// When it last lost an owner, for the pause of its next owner.
    pub(super) unowned_since: Option<u64>,
    /// When it was last moved by load (cooldown).
    pub(super) moved_nanos: Option<u64>,
    /// Moved and not taken by its new owner yet: since when nobody reads it.
    pub(super) pause_from: Option<u64>,
}

#[derive(Debug)]
pub(super) struct MemberEntry {
    pub(super) instance_id: Option<String>,
    pub(super) opts: MemberOptions,
    pub(super) last_heartbeat: u64,
    pub(super) last_progress: u64,
    pub(super) state: MemberState,
    pub(super) slow_since: u64,
    /// Handed out: per partition it reads, the next offset and the
    /// fingerprint of the last record handed out there.
    pub(super) delivered: BTreeMap<u32, (u64, Option<u64>)>,
    /// Partitions it handed out up to their seal (not committed yet).
    pub(super) delivered_drained: BTreeSet<u32>,
    /// Records handed out, and the decayed rate of that.
    pub(super) handed_out: u64,
    pub(super) rate: f64,
    pub(super) rate_at: u64,
    /// Not given more partitions by load before this time.
    pub(super) relieved_until: u64,
    /// Its lag at the last balancing.
    pub(super) last_lag: u64,
}

/// The coordinator of one group: a state machine over plain values. Its
/// inputs are the time (`now`, nanoseconds of the group clock), the
/// members' events (join, heartbeat, poll, commit, leave), the partition
/// ends ([`TopicView`]) and the lineage; its outputs are the ownership it
/// keeps (`owners`, read by the members), the records a commit makes
/// durable ([`super::commit::CommitPlan`]) and the lag splits it asks for.
/// It never reads a topic or a clock: the runtime shell
/// ([`super::Runtime`]) does, and feeds it.
#[derive(Debug)]
pub(crate) struct Coordinator {
    /// Group name (for the errors it returns).
    pub(super) name: String,
    pub(super) options: GroupOptions,
    pub(super) generation: u64,
    pub(super) next_member: u64,
    pub(super) members: BTreeMap<u64, MemberEntry>,
    pub(super) committed: Committed,
    pub(super) owners: BTreeMap<u32, Owner>,
    pub(super) lineage: Arc<Lineage>,
    pub(super) rates: HashMap<u32, PartitionRate>,
    pub(super) last_balance: u64,
    /// Next [`Owner::epoch`].
    pub(super) next_epoch: u64,
    /// When the append rates were last folded.
    pub(super) last_rates: u64,
    /// What the topic signalled, and the ready partitions to fold (see
    /// [`super::rates`]).
    pub(super) moved: Moved,
    /// The ready set changed since the rates last had an entry per ready
    /// partition.
    pub(super) ready_changed: bool,
    /// When the group last split a partition for lag.
    pub(super) last_lag_split: Option<u64>,
    /// An output: the partition to split for lag, asked by a tick and not
    /// taken by the shell yet (see [`Coordinator::lag_split_done`]).
    pub(super) lag_split: Option<u32>,
    /// Per committed position in a removed partition, what it leaves
    /// unread and who was told.
    pub(super) losses: BTreeMap<u32, Loss>,
    pub(super) stats: GroupStats,
    /// Deleted: no member joins or commits through this coordinator again.
    pub(super) deleted: bool,
    /// No member's session or processing timeout and no revocation can
    /// pass before this instant: a tick runs the timeout scan only from
    /// then on (see [`super::timeouts`]).
    pub(super) next_timeout: u64,
    /// Some ready partition may have no owner: the unowned ones are looked
    /// for only then (set by whatever can leave one unowned).
    pub(super) maybe_unowned: bool,
    /// The ready partitions that may be being revoked (a superset of those
    /// whose [`Owner::revoking`] is set): what settling and the overdue
    /// check look at instead of every owner.
    pub(super) revoking_hint: BTreeSet<u32>,
    /// The ready partitions that may have a move's pause to end (a
    /// superset of those whose [`Owner::pause_from`] is set).
    pub(super) pausing_hint: BTreeSet<u32>,
    /// Moves with every change of what a member reads of `owners` (an
    /// owner, a tenure, a revocation) and with every change of
    /// `generation`: a member takes its assignment again only when it
    /// moved, and reports only what changed while it stays.
    pub(super) ownership: u64,
    /// Walks over every ready partition or every member made so far (the
    /// timeout scan, the unowned check, a balancing, a ready set rebuild
    /// and the rates' entries after it, a new lineage's closure ends, a
    /// full ownership read; a rate fold is not one, see [`super::rates`]):
    /// what proves, without a clock, that an idle member's poll makes none.
    pub(super) full_walks: u64,
    /// Timeout scans run so far (each also counted in `full_walks`).
    pub(super) timeout_scans: u64,
    /// Scan at every tick whatever the deadline: the rule before deadlines,
    /// which the tests hold the deadline-driven scan to.
    #[cfg(test)]
    pub(super) scan_every_tick: bool,
    /// Fold every ready partition's rate at every fold and look every lag
    /// up: the rule before incremental folds, which the tests hold them
    /// to.
    #[cfg(test)]
    pub(super) fold_every_partition: bool,
}

impl Coordinator {
    pub(super) fn fenced(&self, member: u64, reason: &str) -> Error {
        Error::Fenced {
            group: self.name.clone(),
            member,
            reason: reason.to_string(),
        }
    }

    /// A new coordinator for a group whose committed positions are
    /// `committed` (under `lineage`), last written at `generation`; member
    /// ids start at `first_member`.
    pub(super) fn new(
        name: String,
        options: GroupOptions,
        lineage: Arc<Lineage>,
        mut committed: Committed,
        generation: u64,
        first_member: u64,
    ) -> Coordinator {
        committed.forget_removed(&lineage);
        Coordinator {
            name,
            options,
            generation: generation + 1,
            next_member: first_member,
            members: BTreeMap::new(),
            committed,
            owners: BTreeMap::new(),
            lineage,
            rates: HashMap::new(),
            last_balance: 0,
            next_epoch: 1,
            last_rates: 0,
            moved: Moved::default(),
            ready_changed: true,
            last_lag_split: None,
            lag_split: None,
            losses: BTreeMap::new(),
            stats: GroupStats::default(),
            deleted: false,
            next_timeout: 0,
            maybe_unowned: true,
            revoking_hint: BTreeSet::new(),
            pausing_hint: BTreeSet::new(),
            ownership: 0,
            full_walks: 0,
            timeout_scans: 0,
            #[cfg(test)]
            scan_every_tick: false,
            #[cfg(test)]
            fold_every_partition: false,
        }
    }

    /// Takes the topic's lineage if the topology moved, or if nothing is
    /// ready yet (a new group, or every partition read).
    pub(super) fn refresh(&mut self, view: &dyn TopicView) {
        if view.topology_generation() != self.lineage.generation || self.owners.is_empty() {
            self.take_lineage(view.lineage());
        }
    }

    /// Takes a new lineage: translates positions through tail splits,
    /// forgets removed partitions and recomputes the ready set, keeping
    /// owners.
    pub(super) fn take_lineage(&mut self, lineage: Arc<Lineage>) {
        let before = std::mem::replace(&mut self.lineage, lineage);
        let lineage = self.lineage.clone();
        // Committed positions past a tail-split parent's logical end
        // continue in its children (as its record did in the manifest).
        let c = &mut self.committed;
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
        self.committed.forget_removed(&lineage);
        self.closures_changed();
        self.recompute_ready(None);
        self.refresh_losses();
    }

    /// Recomputes [`GroupState::losses`] from the committed positions,
    /// keeping who was told of each (a member is not told twice).
    pub(super) fn refresh_losses(&mut self) {
        let mut losses = self.committed.losses(&self.lineage);
        for (p, l) in &mut losses {
            if let Some(old) = self.losses.remove(p) {
                l.handed = old.handed;
                l.handed_ranges = old.handed_ranges;
            }
        }
        self.losses = losses;
    }

    /// Who is to be told of `loss`: the owner of its first ready heir that
    /// is not being moved, with that heir's tenure; without heirs, the
    /// member told already if it is still one, else the first member.
    pub(super) fn loss_holder(&self, loss: &Loss) -> Option<(u64, u64)> {
        if loss.heirs.is_empty() {
            return match loss.handed {
                Some((m, e)) if self.members.contains_key(&m) => Some((m, e)),
                _ => self.members.keys().next().map(|&m| (m, 0)),
            };
        }
        loss.heirs.iter().find_map(|h| {
            let o = self.owners.get(h)?;
            o.revoking.is_none().then_some(())?;
            Some((o.member?, o.epoch))
        })
    }

    /// Brings `owners` to the ready set. A partition that became ready goes
    /// to `heir` (the member whose commit made it ready), else to the owner
    /// of a parent, else stays unowned for the balancer.
    pub(super) fn recompute_ready(&mut self, heir: Option<u64>) {
        self.full_walks += 1;
        let ready = self.committed.ready(&self.lineage);
        let old = std::mem::take(&mut self.owners);
        let generation = self.generation;
        let mut kept = 0;
        for p in ready {
            if let Some(o) = old.get(&p) {
                self.owners.insert(p, o.clone());
                kept += 1;
                continue;
            }
            let parent_owners: Vec<(u64, u64)> = self
                .lineage
                .parents(p)
                .iter()
                .filter_map(|q| old.get(q).and_then(|o| Some((o.member?, o.epoch))))
                .collect();
            let member = heir
                .filter(|m| self.members.contains_key(m))
                .or(parent_owners.first().map(|x| x.0))
                .filter(|m| self.members.contains_key(m));
            // A split descendant that stays with the owner of its nearest
            // ready ancestor continues that tenure: the owner has been
            // reading it already (pinned), through any number of splits.
            // Through split parents retention removed too: their owner
            // was reading this one as well.
            let mut up = p;
            let pinned_to = loop {
                let parents = match self.lineage.removed.get(&up) {
                    Some(removed) if !self.lineage.contains(up) => removed.as_slice(),
                    _ => self.lineage.parents(up),
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
                .filter(|m| self.members.contains_key(m));
            let epoch = match pinned_to {
                Some((m, e)) if Some(m) == member => e,
                _ => {
                    self.next_epoch += 1;
                    self.next_epoch
                }
            };
            self.owners.insert(
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
            self.maybe_unowned |= member.is_none();
        }
        if kept != old.len() || kept != self.owners.len() {
            self.ownership += 1;
            self.ready_changed = true;
        }
    }

    /// Runs the timeouts and the balancer: dead members, slow members,
    /// overdue revocations, unowned partitions, load. A partition to split
    /// for lag is left in [`Coordinator::lag_split`] for the shell.
    pub(super) fn tick(&mut self, view: &dyn TopicView, now: u64) {
        self.tick_with(view, now, false);
    }

    /// [`Coordinator::tick`], balancing at once (ignoring the interval and
    /// the move cooldown) when the membership just changed.
    pub(super) fn tick_with(&mut self, view: &dyn TopicView, now: u64, membership_changed: bool) {
        if self.deleted {
            return;
        }
        self.refresh(view);
        self.update_rates(view, now);
        let (dead, mut changed) = self.run_timeouts(view, now);
        let membership_changed = membership_changed || dead;
        changed |= self.assign_unowned(now);
        if membership_changed
            || now.saturating_sub(self.last_balance)
                >= duration_nanos(self.options.rebalance_interval)
        {
            self.last_balance = now;
            self.full_walks += 1;
            changed |= self.balance_load(view, now, membership_changed);
            if self.options.split_lagging {
                let asked = self.split_for_lag(view, now);
                self.lag_split = self.lag_split.or(asked);
            }
        }
        if changed {
            self.generation += 1;
        }
    }

    pub(super) fn owned_by(&self, id: u64) -> Vec<u32> {
        self.owners
            .iter()
            .filter(|(_, o)| o.member == Some(id) && o.revoking.is_none())
            .map(|(&p, _)| p)
            .collect()
    }

    pub(super) fn committed_position(&self, p: u32) -> u64 {
        self.committed.positions.get(&p).copied().unwrap_or(0)
    }

    /// Marks ready `p` as moving away from its owner (to `to`, or to the
    /// balancer's pick). Released at once when its owner has nothing
    /// uncommitted in it. Returns whether anything changed.
    pub(super) fn revoke(&mut self, p: u32, to: Option<u64>, now: u64) -> bool {
        let Some(o) = self.owners.get_mut(&p) else {
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
        let owner = o.member;
        self.revoking_hint.insert(p);
        self.ownership += 1;
        // Overdue after its owner's processing timeout.
        if let Some(m) = owner.and_then(|id| self.members.get(&id)) {
            let limit = duration_nanos(m.opts.processing_timeout);
            self.timeout_at(deadline_after(now, limit));
        }
        self.try_release(p, now);
        true
    }

    /// Releases revoking `p` if its owner's commits cover what it handed
    /// out there.
    pub(super) fn try_release(&mut self, p: u32, now: u64) {
        let Some(o) = self.owners.get(&p) else { return };
        if o.revoking.is_none() {
            return;
        }
        let Some(m) = o.member.and_then(|id| self.members.get(&id)) else {
            self.release(p, now);
            return;
        };
        if self.uncommitted(m, p) == 0 {
            self.release(p, now);
        }
    }

    /// Records `m` handed out in ready `p` (with its pinned children) that
    /// the group has not committed.
    pub(super) fn uncommitted(&self, m: &MemberEntry, p: u32) -> u64 {
        closure(&self.lineage, p)
            .into_iter()
            .map(|x| {
                let committed = if x == p {
                    self.committed_position(p)
                } else {
                    self.committed.positions.get(&x).copied().unwrap_or(0)
                };
                let own = match m.delivered.get(&x) {
                    Some(&(pos, _)) => pos.saturating_sub(committed),
                    None if m.delivered_drained.contains(&x) => self
                        .lineage
                        .sealed_at(x)
                        .unwrap_or(0)
                        .saturating_sub(committed),
                    None => 0,
                };
                own.max(self.handed_through_tails(m, x).saturating_sub(committed))
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
    pub(super) fn handed_through_tails(&self, m: &MemberEntry, x: u32) -> u64 {
        if self.lineage.tails.is_empty() {
            return 0;
        }
        m.delivered
            .iter()
            .filter(|(&q, _)| q != x)
            .filter_map(|(&q, &(pos, _))| {
                let mut at = BTreeMap::from([(q, pos)]);
                translate_tails(&self.lineage, &mut at, &mut BTreeMap::new());
                at.get(&x).copied()
            })
            .max()
            .unwrap_or(0)
    }

    /// Takes ready `p` from its owner (whatever it handed out and did not
    /// commit is delivered again) and gives it to the revocation's target
    /// or leaves it for the balancer.
    pub(super) fn release(&mut self, p: u32, now: u64) {
        let Some(o) = self.owners.get(&p).cloned() else {
            return;
        };
        if let Some(m) = o.member.and_then(|id| self.members.get(&id)) {
            self.stats.redelivered += self.uncommitted(m, p);
        }
        if let Some(id) = o.member {
            if let Some(m) = self.members.get_mut(&id) {
                for x in closure(&self.lineage, p) {
                    m.delivered.remove(&x);
                    m.delivered_drained.remove(&x);
                }
            }
        }
        let to = o
            .revoking
            .as_ref()
            .and_then(|r| r.to)
            .filter(|t| self.members.contains_key(t));
        let since = o.revoking.as_ref().map_or(now, |r| r.since_nanos);
        let entry = self
            .owners
            .get_mut(&p)
            .expect("`p` was found in `owners` above and releasing removes no owner");
        entry.revoking = None;
        entry.member = None;
        self.ownership += 1;
        self.maybe_unowned = true;
        // An owner that never took it did not end the pause that began
        // before it was given the partition.
        entry.unowned_since = Some(entry.pause_from.take().map_or(since, |f| f.min(since)));
        if let Some(t) = to {
            self.give(p, t);
        }
    }

    /// Gives unowned ready `p` to member `to`.
    pub(super) fn give(&mut self, p: u32, to: u64) {
        let generation = self.generation + 1;
        self.next_epoch += 1;
        let epoch = self.next_epoch;
        let entry = self
            .owners
            .get_mut(&p)
            .expect("partitions are given only from `owners`");
        entry.member = Some(to);
        entry.generation = generation;
        entry.epoch = epoch;
        // A move: its pause lasts until the new owner takes it (see
        // `Member::sync`).
        if let Some(since) = entry.unowned_since.take() {
            entry.pause_from = Some(since);
            self.pausing_hint.insert(p);
            self.stats.moves += 1;
        }
        self.ownership += 1;
    }

    pub(super) fn remove_member(&mut self, id: u64, now: u64) {
        let owned: Vec<u32> = self
            .owners
            .iter()
            .filter(|(_, o)| o.member == Some(id))
            .map(|(&p, _)| p)
            .collect();
        for p in owned {
            if let Some(o) = self.owners.get_mut(&p) {
                if o.revoking.is_none() {
                    o.revoking = Some(Revoke {
                        since_nanos: now,
                        to: None,
                    });
                }
            }
            self.release(p, now);
        }
        self.members.remove(&id);
        crate::metrics::group_members(&self.name, self.members.len());
        // Revocations aimed at it go to the balancer.
        for o in self.owners.values_mut() {
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
    pub(super) fn member_loads(&self) -> BTreeMap<u64, f64> {
        let mut loads: BTreeMap<u64, f64> = self.members.keys().map(|&id| (id, 0.0)).collect();
        for (&p, o) in &self.owners {
            if let Some(m) = self.holder(o) {
                *loads.entry(m).or_default() += self.weight(p);
            }
        }
        loads
    }

    /// The member a partition counts with for balancing: the target of its
    /// revocation if it has one, else its owner.
    pub(super) fn holder(&self, o: &Owner) -> Option<u64> {
        let target = o.revoking.as_ref().and_then(|r| r.to);
        target.filter(|t| self.members.contains_key(t)).or(o.member)
    }

    /// Members that may receive partitions: active, not recently relieved.
    pub(super) fn receivers(&self, now: u64) -> Vec<u64> {
        self.members
            .iter()
            .filter(|(_, m)| m.state == MemberState::Active && m.relieved_until <= now)
            .map(|(&id, _)| id)
            .collect()
    }
}

#[cfg(test)]
pub(super) mod tests;
