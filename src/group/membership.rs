//! What members tell the coordinator (join, heartbeat, poll, what they
//! handed out, leave) and what it tells them (their partitions, the
//! group's description). Events of the [`Coordinator`] state machine: the
//! time comes in as `now`, the topic through a [`TopicView`].

use std::collections::{BTreeMap, BTreeSet};

use crate::duration::duration_nanos;
use crate::error::{Error, Result};

use super::coordinator::{closure, Coordinator, MemberEntry, TopicView};
use super::timeouts::deadline_after;
use super::{
    millis, AssignmentDescription, GroupDescription, MemberDescription, MemberOptions, MemberState,
    MAX_PAUSES, RATE_TAU_S,
};

impl MemberEntry {
    pub(super) fn new(options: &MemberOptions, now: u64) -> MemberEntry {
        MemberEntry {
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
        }
    }
}

impl Coordinator {
    /// The error for a call of member `id` that is not a member.
    fn not_a_member(&self, id: u64) -> Error {
        self.fenced(id, "not a member (dead, left or replaced)")
    }

    /// Member `id`, or [`Error::Fenced`].
    pub(super) fn member(&self, id: u64) -> Result<&MemberEntry> {
        self.members.get(&id).ok_or_else(|| self.not_a_member(id))
    }

    /// A member joins at `now`. With an instance id naming a live member,
    /// it takes over that member's partitions (a static rejoin: nobody
    /// else's assignment changes); otherwise it gets unowned partitions
    /// and its share of the load at once. Returns its id.
    pub(super) fn join(
        &mut self,
        view: &dyn TopicView,
        now: u64,
        options: &MemberOptions,
    ) -> Result<u64> {
        if self.deleted {
            return Err(Error::UnknownGroup(self.name.clone()));
        }
        self.tick(view, now);
        let id = self.next_member;
        self.next_member += 1;
        let previous = options.instance_id.as_ref().and_then(|iid| {
            self.members
                .iter()
                .find(|(_, m)| m.instance_id.as_ref() == Some(iid))
                .map(|(&id, _)| id)
        });
        self.members.insert(id, MemberEntry::new(options, now));
        // Its session and processing timeouts run from now.
        let session = duration_nanos(options.session_timeout);
        let processing = duration_nanos(options.processing_timeout);
        self.timeout_at(deadline_after(now, session.min(processing)));
        crate::metrics::group_members(&self.name, self.members.len());
        match previous {
            Some(old) => self.take_over(old, id),
            // Others keep reading; the newcomer gets unowned partitions and
            // its share of the load at once (each moved partition as soon
            // as its owner's commits cover it).
            None => self.tick_with(view, now, true),
        }
        Ok(id)
    }

    /// Static rejoin: the partitions of member `old` change hands directly
    /// to `new`; what the old incarnation handed out and did not commit
    /// comes again.
    fn take_over(&mut self, old: u64, new: u64) {
        let generation = self.generation + 1;
        let ids: Vec<u32> = self
            .owners
            .iter()
            .filter(|(_, o)| o.member == Some(old))
            .map(|(&p, _)| p)
            .collect();
        for p in ids {
            let old_member = &self.members[&old];
            self.stats.redelivered += self.uncommitted(old_member, p);
            self.next_epoch += 1;
            let epoch = self.next_epoch;
            let o = self
                .owners
                .get_mut(&p)
                .expect("`p` was taken from `owners` above");
            o.member = Some(new);
            o.generation = generation;
            o.epoch = epoch;
            o.revoking = None;
        }
        self.ownership += 1;
        self.members.remove(&old);
        crate::metrics::group_members(&self.name, self.members.len());
        self.generation = generation;
    }

    /// Member `id` heartbeats at `now`.
    pub(super) fn heartbeat(&mut self, view: &dyn TopicView, now: u64, id: u64) -> Result<()> {
        self.tick(view, now);
        let not_a_member = self.not_a_member(id);
        let m = self.members.get_mut(&id).ok_or(not_a_member)?;
        m.last_heartbeat = now;
        Ok(())
    }

    /// Member `id` polls at `now`: a heartbeat and progress (a slow member
    /// that polls is active again).
    pub(super) fn polled(&mut self, view: &dyn TopicView, now: u64, id: u64) -> Result<()> {
        self.tick(view, now);
        let not_a_member = self.not_a_member(id);
        let m = self.members.get_mut(&id).ok_or(not_a_member)?;
        m.last_heartbeat = now;
        m.last_progress = now;
        if m.state == MemberState::Slow {
            m.state = MemberState::Active;
        }
        Ok(())
    }

    /// Member `id` hands out: per partition it reads, the next offset and
    /// the fingerprint of the last record handed out; the partitions it
    /// handed out to their seal. What a revocation waits for.
    pub(super) fn handed_out(
        &mut self,
        id: u64,
        delivered: BTreeMap<u32, (u64, Option<u64>)>,
        delivered_drained: BTreeSet<u32>,
    ) {
        if let Some(m) = self.members.get_mut(&id) {
            m.delivered = delivered;
            m.delivered_drained = delivered_drained;
        }
    }

    /// What member `id` handed out changed in these partitions only, each
    /// with its next offset and fingerprint (none: it reads it no more, or
    /// read it to its seal) and whether it is read to its seal: the rest
    /// of what it published stands.
    pub(super) fn handed_out_changes(
        &mut self,
        id: u64,
        changes: impl IntoIterator<Item = (u32, Option<(u64, Option<u64>)>, bool)>,
    ) {
        let Some(m) = self.members.get_mut(&id) else {
            return;
        };
        for (p, at, drained) in changes {
            match at {
                Some(at) => m.delivered.insert(p, at),
                None => m.delivered.remove(&p),
            };
            if drained {
                m.delivered_drained.insert(p);
            } else {
                m.delivered_drained.remove(&p);
            }
        }
    }

    /// Member `id` leaves at `now` (after reporting what it handed out):
    /// its partitions go to the others at once.
    pub(super) fn leave(&mut self, view: &dyn TopicView, now: u64, id: u64) -> Result<()> {
        self.member(id)?;
        self.remove_member(id, now);
        self.tick_with(view, now, true);
        self.generation += 1;
        Ok(())
    }

    /// Releases member `id`'s revoked partitions whose handed-out records
    /// are all committed (what it publishes can shrink without a commit:
    /// a poll drops the state of tenures that ended). Returns whether any
    /// moved.
    /// Looks only at the partitions that may be revoking.
    pub(super) fn settle_revoked(&mut self, id: u64, now: u64) -> bool {
        let revoking = self.revoking_of(id);
        let mut moved = false;
        for p in revoking {
            self.try_release(p, now);
            moved |= self.owners.get(&p).is_some_and(|o| o.member != Some(id));
        }
        if moved {
            self.generation += 1;
        }
        moved
    }

    /// The ready partitions of member `id` being revoked, from the
    /// partitions that may be (forgetting those that are not any more).
    pub(super) fn revoking_of(&mut self, id: u64) -> Vec<u32> {
        let owners = &self.owners;
        self.revoking_hint
            .retain(|p| owners.get(p).is_some_and(|o| o.revoking.is_some()));
        self.revoking_hint
            .iter()
            .copied()
            .filter(|p| owners.get(p).is_some_and(|o| o.member == Some(id)))
            .collect()
    }

    /// Whether member `id` reads partition `x` in one of the tenures
    /// `held`: `x` is a ready partition it owns in one of them, or a
    /// pinned split child of one. The split children of a ready partition
    /// are the descendants reached through children of one parent, so the
    /// candidates are `x` and its ancestors up through parents with one
    /// child link each: as many lookups as `x` is deep, whatever the
    /// number of partitions (the same answer as [`Self::readable_by`]).
    pub(super) fn reads(&self, id: u64, held: &BTreeSet<u64>, x: u32) -> bool {
        let mut at = x;
        loop {
            if let Some(o) = self.owners.get(&at) {
                if o.member == Some(id) && held.contains(&o.epoch) {
                    return true;
                }
            }
            match self.lineage.parents(at) {
                [parent] if self.lineage.children(*parent).contains(&at) => at = *parent,
                _ => return false,
            }
        }
    }

    /// The partitions member `id` reads in the tenures `held` (its reading
    /// state belongs to those): each ready partition it owns in one of
    /// them and its pinned split children, mapped to that ready partition.
    pub(super) fn readable_by(&self, id: u64, held: &BTreeSet<u64>) -> BTreeMap<u32, u32> {
        let mut root_of = BTreeMap::new();
        for (&p, o) in &self.owners {
            if o.member == Some(id) && held.contains(&o.epoch) {
                for x in closure(&self.lineage, p) {
                    root_of.insert(x, p);
                }
            }
        }
        root_of
    }

    /// The partitions in `owned` moved to their new owner end their pause
    /// at `now` (it took them). Looks only at the partitions that may be
    /// paused by a move.
    pub(super) fn end_pauses(&mut self, owned: &BTreeSet<u32>, now: u64) {
        if self.pausing_hint.is_empty() {
            return;
        }
        let owners = &self.owners;
        self.pausing_hint
            .retain(|p| owners.get(p).is_some_and(|o| o.pause_from.is_some()));
        let ending: Vec<u32> = self
            .pausing_hint
            .iter()
            .copied()
            .filter(|p| owned.contains(p))
            .collect();
        for p in &ending {
            self.pausing_hint.remove(p);
            if let Some(o) = self.owners.get_mut(p) {
                if let Some(from) = o.pause_from.take() {
                    let pauses = &mut self.stats.pauses_ms;
                    if pauses.len() >= MAX_PAUSES {
                        pauses.remove(0);
                    }
                    pauses.push(now.saturating_sub(from) as f64 / 1e6);
                    crate::metrics::rebalance_pause(
                        &self.name,
                        now.saturating_sub(from) as f64 / 1e9,
                    );
                }
            }
        }
    }

    /// Member `id` handed out `records` more at `now`: folds its processing
    /// rate (at most every 100 ms).
    pub(super) fn count_handed_out(&mut self, id: u64, records: u64, now: u64) {
        let Some(m) = self.members.get_mut(&id) else {
            return;
        };
        m.handed_out += records;
        let dt = now.saturating_sub(m.rate_at) as f64 / 1e9;
        if dt >= 0.1 {
            let inst = m.handed_out as f64 / dt;
            let a = 1.0 - (-dt / RATE_TAU_S).exp();
            m.rate += a * (inst - m.rate);
            m.handed_out = 0;
            m.rate_at = now;
        }
    }

    /// Deletes the group: no member joins or commits through it again.
    pub(super) fn delete(&mut self) {
        self.members.clear();
        self.owners.clear();
        self.revoking_hint.clear();
        self.pausing_hint.clear();
        self.ownership += 1;
        self.deleted = true;
    }

    /// Members, assignments, committed positions, lag and counters.
    pub(super) fn describe(&self, view: &dyn TopicView, now: u64) -> GroupDescription {
        let assignments: Vec<AssignmentDescription> = self
            .owners
            .iter()
            .map(|(&p, o)| AssignmentDescription {
                partition: p,
                member: o.member,
                generation: o.generation,
                revoking: o.revoking.is_some(),
                committed: self.committed_position(p),
                lag_records: self.lag(view, p),
                append_rate: self.rate(p),
            })
            .collect();
        let members = self
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
            name: self.name.clone(),
            generation: self.generation,
            members,
            lag_records: assignments.iter().map(|a| a.lag_records).sum(),
            assignments,
            stats: self.stats.clone(),
        }
    }
}
