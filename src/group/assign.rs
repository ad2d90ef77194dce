//! Who gets which ready partition: unowned ones to the least loaded
//! receiver, relief of members falling behind, load balancing, and splits
//! for lag. Rules of the [`Coordinator`], over its state.

use std::collections::{BTreeMap, BTreeSet};

use crate::balance::{best_single_move, plan_counts, plan_moves, BalancePolicy};
use crate::duration::duration_nanos;

use super::coordinator::{Coordinator, TopicView};

/// Least lag (records) for which a member falling behind is relieved.
pub(super) const RELIEF_LAG: u64 = 1000;
/// Balancings in a row a partition's lag must grow before the group splits
/// it for lag.
const LAG_SPLIT_ROUNDS: u32 = 3;
/// A move by load must lower the larger of the two members' loads by more
/// than this many mean partition weights. An absolute amount, the same
/// whatever the member's load (a share of the busiest member's load is one
/// that a single partition out of many never reaches), and under one
/// partition so equal partitions balance to within one.
const MOVE_GAIN: f64 = 0.25;

impl Coordinator {
    /// Gives every unowned ready partition to the least loaded receiver.
    /// Walks the owners only while one may be unowned
    /// ([`Coordinator::maybe_unowned`]), and clears that once all have one.
    pub(super) fn assign_unowned(&mut self, now: u64) -> bool {
        if !self.maybe_unowned {
            return false;
        }
        self.full_walks += 1;
        let unowned: Vec<u32> = self
            .owners
            .iter()
            .filter(|(_, o)| o.member.is_none())
            .map(|(&p, _)| p)
            .collect();
        if unowned.is_empty() {
            self.maybe_unowned = false;
            return false;
        }
        let mut receivers = self.receivers(now);
        if receivers.is_empty() {
            // Everyone is slow or relieved: better a slow reader than none.
            receivers = self.members.keys().copied().collect();
        }
        if receivers.is_empty() {
            // Nobody to give them to: looked for again at the next tick.
            return false;
        }
        let mut loads = self.member_loads();
        let mut weights: Vec<(u32, f64)> = unowned.iter().map(|&p| (p, self.weight(p))).collect();
        weights.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for (p, w) in weights {
            let to = *receivers
                .iter()
                .min_by(|a, b| loads[a].total_cmp(&loads[b]).then(a.cmp(b)))
                .expect("`receivers` was checked non-empty above");
            *loads
                .get_mut(&to)
                .expect("`member_loads` has every member, receivers are members") += w;
            self.give(p, to);
        }
        self.maybe_unowned = false;
        self.stats.rebalances += 1;
        true
    }

    /// See [`super::GroupOptions::split_lagging`]: the partition to split
    /// for lag, if one qualifies. The shell splits it; the split changes
    /// the topology, and the next lineage the coordinator takes has the
    /// children (pinned to the owner). The walk over every ready
    /// partition's lag is made only when it can change something
    /// ([`Coordinator::lag_walk_due`]).
    pub(super) fn split_for_lag(&mut self, view: &dyn TopicView, now: u64) -> Option<u32> {
        if !self.lag_walk_due() {
            return None;
        }
        // Lag trend per ready partition, and per member the lag and the
        // count of what it owns and is not being moved away from: one
        // pass, so the candidates below cost a lookup each.
        let mut held: BTreeMap<u64, (usize, u64)> = BTreeMap::new();
        let ready: Vec<(u32, Option<u64>)> = self
            .owners
            .iter()
            .map(|(&p, o)| (p, o.member.filter(|_| o.revoking.is_none())))
            .collect();
        let mut growing = false;
        for (p, holder) in ready {
            let lag = self.lag(view, p);
            if let Some(r) = self.rates.get_mut(&p) {
                r.lag_rounds = if lag > r.lag { r.lag_rounds + 1 } else { 0 };
                r.lag = lag;
                growing |= r.lag_rounds > 0;
            }
            if let Some(m) = holder {
                let h = held.entry(m).or_default();
                h.0 += 1;
                h.1 += lag;
            }
        }
        self.moved.lag_rounds_left = growing;
        let cooldown = duration_nanos(self.options.move_cooldown);
        if self
            .last_lag_split
            .is_some_and(|t| now.saturating_sub(t) < cooldown)
        {
            return None;
        }
        let config: BalancePolicy = view.balance_policy();
        let active = self.lineage.active().count() as u32;
        if active >= config.max_partitions {
            return None;
        }
        let receivers = self.receivers(now);
        let idle = |id: u64| held.get(&id).is_none_or(|h| h.1 == 0);
        let candidate = self.owners.iter().find_map(|(&p, o)| {
            let owner = o.member?;
            let r = self.rates.get(&p)?;
            let rate = self.rate(p);
            // The owner's only partition it keeps.
            let only = o.revoking.is_none() && held.get(&owner).is_some_and(|h| h.0 == 1);
            let sealed = self.lineage.sealed_at(p).is_some();
            let in_band = match (config.target_records_per_sec, config.target_bytes_per_sec) {
                (Some(t), _) => rate < t && rate >= config.merge_fraction * t,
                // Only a bytes target: the group sees records, not bytes.
                (None, Some(_)) => false,
                (None, None) => true,
            };
            let spare = receivers.iter().any(|&m| m != owner && idle(m));
            (only
                && !sealed
                && in_band
                && spare
                && r.lag_rounds >= LAG_SPLIT_ROUNDS
                && r.lag >= RELIEF_LAG)
                .then_some(p)
        });
        candidate
    }

    /// The split for lag of `p` asked by [`Coordinator::tick`] committed.
    pub(super) fn lag_split_done(&mut self, p: u32, now: u64) {
        self.stats.lag_splits += 1;
        self.last_lag_split = Some(now);
        if let Some(r) = self.rates.get_mut(&p) {
            r.lag_rounds = 0;
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
    pub(super) fn balance_load(
        &mut self,
        view: &dyn TopicView,
        now: u64,
        membership_changed: bool,
    ) -> bool {
        if self.members.len() < 2 {
            return false;
        }
        let (relieved, gave) = self.relieve_lagging(view, now);
        let moved = self.balance_by_load(now, membership_changed, &gave) || relieved;
        if moved {
            self.stats.rebalances += 1;
        }
        moved
    }

    /// The relief rule of [`Coordinator::balance_load`]. Returns whether
    /// anything moved, and the members that gave or received a partition
    /// (they take no part in the load moves of this balancing).
    fn relieve_lagging(&mut self, view: &dyn TopicView, now: u64) -> (bool, BTreeSet<u64>) {
        let cooldown = duration_nanos(self.options.move_cooldown);
        let mut moved = false;
        // Per member, the lag of what it owns and is not being moved away
        // from: one pass over the owners, not one per member.
        let mut lags: BTreeMap<u64, u64> = self.members.keys().map(|&id| (id, 0)).collect();
        for (&p, o) in &self.owners {
            if let Some(lag) = o
                .member
                .filter(|_| o.revoking.is_none())
                .and_then(|m| lags.get_mut(&m))
            {
                *lag += self.lag(view, p);
            }
        }
        let receivers = self.receivers(now);
        let mut gave: BTreeSet<u64> = BTreeSet::new();
        for (&id, &lag) in &lags {
            let grew = lag > self.members[&id].last_lag;
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
            let single = self.owned_by(id).len() == 1;
            if single && self.members[&id].rate >= 0.5 * self.members[&to].rate {
                continue;
            }
            let Some(p) = self
                .owned_by(id)
                .into_iter()
                .max_by_key(|&p| (self.lag(view, p), std::cmp::Reverse(p)))
            else {
                continue;
            };
            if self.revoke(p, Some(to), now) {
                self.stats.lag_relieved += 1;
                if let Some(m) = self.members.get_mut(&id) {
                    m.relieved_until = now.saturating_add(cooldown);
                }
                gave.insert(to);
                gave.insert(id);
                moved = true;
            }
        }
        for (&id, &lag) in &lags {
            if let Some(m) = self.members.get_mut(&id) {
                m.last_lag = lag;
            }
        }
        (moved, gave)
    }

    /// The load rule of [`Coordinator::balance_load`], among members not
    /// in `gave`. Returns whether anything moved. The planned moves and the
    /// single moves after them share one budget and one bookkeeping of who
    /// holds what (`owned`, `loads`), so both stay here.
    fn balance_by_load(
        &mut self,
        now: u64,
        membership_changed: bool,
        gave: &BTreeSet<u64>,
    ) -> bool {
        let cooldown = duration_nanos(self.options.move_cooldown);
        let load_cooldown = if membership_changed { 0 } else { cooldown };
        let mut moved = false;
        // Load: moves toward a sticky plan, then single moves while one
        // lowers the larger of two loads by more than the gain threshold;
        // at most `max_moves_per_balancing` revocations in all.
        if membership_changed {
            // The cooldown is against load noise; a join or leave is not
            // noise, so what moved before it may move again.
            for o in self.owners.values_mut() {
                o.moved_nanos = None;
            }
        }
        let receivers = self.receivers(now);
        let mut loads = self.member_loads();
        let weights = self.owned_weights();
        let mean_weight = weights.values().sum::<f64>() / weights.len().max(1) as f64;
        let gain = MOVE_GAIN * mean_weight;
        let mut owned = self.movable_by_member(now, load_cooldown);
        let plan = self.load_plan(&owned, &weights, &loads, &receivers, gave, mean_weight);
        let mut budget = self.options.max_moves_per_balancing;
        type Owned = BTreeMap<u64, Vec<u32>>;
        // The planners move partitions between members of `owned` and
        // `loads`, which hold every member: the lookups below find them.
        let mut apply = |this: &mut Coordinator,
                         owned: &mut Owned,
                         loads: &mut BTreeMap<u64, f64>,
                         (p, from, to): (u32, u64, u64)| {
            if budget == 0 || !this.revoke(p, Some(to), now) {
                return false;
            }
            budget -= 1;
            let w = weights[&p];
            owned
                .get_mut(&from)
                .expect("a planned move is from a member")
                .retain(|&q| q != p);
            *loads
                .get_mut(&from)
                .expect("a planned move is from a member") -= w;
            *loads.get_mut(&to).expect("a planned move is to a member") += w;
            true
        };
        for m in plan {
            moved |= apply(self, &mut owned, &mut loads, m);
        }
        while let Some(m) = best_single_move(&owned, &weights, &loads, &receivers, gave, gain) {
            if !apply(self, &mut owned, &mut loads, m) {
                break;
            }
            moved = true;
        }
        moved
    }

    /// The weight of each owned partition.
    fn owned_weights(&self) -> BTreeMap<u32, f64> {
        self.owners
            .iter()
            .filter(|(_, o)| o.member.is_some())
            .map(|(&p, _)| (p, self.weight(p)))
            .collect()
    }

    /// Each member's partitions that a load move may take: owned, not
    /// being revoked, and not moved within `load_cooldown` of `now`.
    fn movable_by_member(&self, now: u64, load_cooldown: u64) -> BTreeMap<u64, Vec<u32>> {
        let mut owned: BTreeMap<u64, Vec<u32>> =
            self.members.keys().map(|&m| (m, vec![])).collect();
        for (&p, o) in &self.owners {
            let movable = o
                .moved_nanos
                .is_none_or(|t| now.saturating_sub(t) >= load_cooldown);
            if let Some(m) = o.member.filter(|_| o.revoking.is_none()) {
                if movable {
                    owned.entry(m).or_default().push(p);
                }
            }
        }
        owned
    }

    /// The planned moves of a load balancing: by count when the weights
    /// are within one gain of each other, else by weight if the plan is
    /// worth its pauses.
    fn load_plan(
        &self,
        owned: &BTreeMap<u64, Vec<u32>>,
        weights: &BTreeMap<u32, f64>,
        loads: &BTreeMap<u64, f64>,
        receivers: &[u64],
        gave: &BTreeSet<u64>,
        mean_weight: f64,
    ) -> Vec<(u32, u64, u64)> {
        let gain = MOVE_GAIN * mean_weight;
        // Equal weights (idle partitions all weigh one) balance by count,
        // exactly: the fewest moves that bring counts within one.
        let (lightest, heaviest) = weights
            .values()
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), &w| {
                (lo.min(w), hi.max(w))
            });
        if heaviest - lightest <= gain {
            let mut held: BTreeMap<u64, usize> = self.members.keys().map(|&m| (m, 0)).collect();
            for o in self.owners.values() {
                if let Some(m) = self.holder(o) {
                    *held.entry(m).or_default() += 1;
                }
            }
            return plan_counts(owned, &held, receivers, gave);
        }
        let (plan, planned) = plan_moves(owned, weights, loads, receivers, gave);
        let squares = |l: &BTreeMap<u64, f64>| l.values().map(|x| x * x).sum::<f64>();
        // Worth its pauses only if it beats what one good move gives.
        if squares(&planned) < squares(loads) - 2.0 * gain * mean_weight {
            plan
        } else {
            Vec::new()
        }
    }
}
