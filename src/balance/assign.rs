//! Which member of a consumer group reads which partition: pure planning
//! over partition weights and member loads, for the group coordinator
//! (`crate::group`), which owns the members, the revocations and the
//! budget of moves per balancing.
//!
//! Members and partitions are plain ids here (`u64`, `u32`); a weight is a
//! partition's append rate plus one, a load the sum of a member's weights.
//! `frozen` members (relieved or relieving by lag in this balancing) neither
//! give nor receive.

use std::collections::{BTreeMap, BTreeSet};

/// One move: `(partition, from member, to member)`.
pub(crate) type Move = (u32, u64, u64);

/// The moves `(partition, from, to)` toward a balanced assignment that
/// keeps as much as it can where it is. Partitions are placed heaviest
/// first: each stays with its owner while the owner's planned load plus
/// half the partition is within the mean (so a member at the mean keeps
/// its last partition rather than handing it over for another member to
/// hand back), else goes to the receiver with the least claim that has
/// room for it (claim plus half the partition within the mean), else stays.
/// A claim is what a member is planned to carry plus its own partitions of
/// comparable weight (at least half) not placed yet, up to the mean: a
/// member is not handed another's partition only to shed its own later,
/// but its light partitions do not keep a heavy one away from it. With
/// equal weights this balances counts to within one, moving only from
/// members over the mean to members under it.
pub(crate) fn plan_moves(
    owned: &BTreeMap<u64, Vec<u32>>,
    weights: &BTreeMap<u32, f64>,
    loads: &BTreeMap<u64, f64>,
    receivers: &[u64],
    frozen: &BTreeSet<u64>,
) -> (Vec<Move>, BTreeMap<u64, f64>) {
    let receivers: Vec<u64> = receivers
        .iter()
        .copied()
        .filter(|r| !frozen.contains(r))
        .collect();
    if receivers.is_empty() || loads.len() < 2 {
        return (Vec::new(), loads.clone());
    }
    let mean = loads.values().sum::<f64>() / loads.len() as f64;
    // What cannot move (revoking, cooling down, frozen givers) is planned
    // where it is.
    let mut planned: BTreeMap<u64, f64> = loads.clone();
    let (order, mut own) = unplace_movable(owned, weights, frozen, &mut planned);
    let mut moves = Vec::new();
    for (p, from, w) in order {
        if let Some((_, _, done)) = own.get_mut(&from) {
            *done += 1;
        }
        if planned[&from] + w / 2.0 <= mean {
            *planned.get_mut(&from).expect("member") += w;
            continue;
        }
        // Only to a member with room for it under the mean: the remainder
        // of an uneven division stays where it is instead of moving
        // between members that are all at the mean.
        let to = receivers
            .iter()
            .copied()
            .map(|m| (m, claim(&planned, &own, mean, m, w)))
            .filter(|&(_, c)| c + w / 2.0 <= mean)
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
            .map_or(from, |(m, _)| m);
        *planned.get_mut(&to).expect("member") += w;
        if to != from {
            moves.push((p, from, to));
        }
    }
    (moves, planned)
}

/// Per member, the weights of its movable partitions, heaviest first, with
/// suffix sums (what it has left to place at any point) and how many it
/// has placed.
type Unplaced = BTreeMap<u64, (Vec<f64>, Vec<f64>, usize)>;

/// Takes the movable partitions of members not `frozen` out of `planned`;
/// returns them in placing order (heaviest first, lower id on a tie) with
/// each member's [`Unplaced`].
fn unplace_movable(
    owned: &BTreeMap<u64, Vec<u32>>,
    weights: &BTreeMap<u32, f64>,
    frozen: &BTreeSet<u64>,
    planned: &mut BTreeMap<u64, f64>,
) -> (Vec<(u32, u64, f64)>, Unplaced) {
    let mut order: Vec<(u32, u64, f64)> = Vec::new();
    let mut own: Unplaced = BTreeMap::new();
    for (&m, ps) in owned {
        if frozen.contains(&m) {
            continue;
        }
        let mut ws: Vec<f64> = ps.iter().map(|p| weights[p]).collect();
        ws.sort_by(|a, b| b.total_cmp(a));
        let mut suffix = vec![0.0; ws.len() + 1];
        for i in (0..ws.len()).rev() {
            suffix[i] = suffix[i + 1] + ws[i];
        }
        *planned.get_mut(&m).expect("member") -= suffix[0];
        order.extend(ps.iter().map(|&p| (p, m, weights[&p])));
        own.insert(m, (ws, suffix, 0));
    }
    order.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
    (order, own)
}

/// Member `m`'s claim against a partition of weight `w`: what it is planned
/// to carry plus its own unplaced partitions of at least `w / 2`, up to the
/// mean.
fn claim(planned: &BTreeMap<u64, f64>, own: &Unplaced, mean: f64, m: u64, w: f64) -> f64 {
    let pl = planned[&m];
    let ahead = own.get(&m).map_or(0.0, |(ws, suffix, done)| {
        let similar = done + ws[*done..].partition_point(|&x| x >= w / 2.0);
        suffix[*done] - suffix[similar]
    });
    pl + ahead.min((mean - pl).max(0.0))
}

/// With equal weights: the fewest moves `(partition, from, to)` that bring
/// partition counts (`held`, revocations counted with their targets) to
/// within one. Of `total = q × members + r` partitions, the `r` members
/// holding most (the lower id on a tie) are to hold `q + 1`, the others
/// `q`; members over that give their excess (lowest ids first) to
/// receivers under it, the neediest first. Counts within one already give
/// no move.
pub(crate) fn plan_counts(
    owned: &BTreeMap<u64, Vec<u32>>,
    held: &BTreeMap<u64, usize>,
    receivers: &[u64],
    frozen: &BTreeSet<u64>,
) -> Vec<Move> {
    let n = held.len().max(1);
    let total: usize = held.values().sum();
    let (q, r) = (total / n, total % n);
    let mut by_count: Vec<(u64, usize)> = held.iter().map(|(&m, &c)| (m, c)).collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let target: BTreeMap<u64, usize> = by_count
        .iter()
        .enumerate()
        .map(|(i, &(m, _))| (m, q + usize::from(i < r)))
        .collect();
    let mut need: Vec<(u64, usize)> = receivers
        .iter()
        .filter(|m| !frozen.contains(m))
        .filter_map(|&m| {
            let short = target.get(&m)?.checked_sub(*held.get(&m)?)?;
            (short > 0).then_some((m, short))
        })
        .collect();
    let mut moves = Vec::new();
    for &(from, count) in &by_count {
        if frozen.contains(&from) {
            continue;
        }
        let excess = count.saturating_sub(target[&from]);
        let movable = owned.get(&from).map_or(&[][..], |v| &v[..]);
        for &p in movable.iter().take(excess) {
            need.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let Some(slot) = need.first_mut().filter(|s| s.1 > 0) else {
                return moves;
            };
            slot.1 -= 1;
            moves.push((p, from, slot.0));
        }
    }
    moves
}

/// The single move that lowers the larger of two members' loads the most,
/// by more than `gain`: from the busiest member that has one to the least
/// loaded receiver, the partition that leaves the two closest.
pub(crate) fn best_single_move(
    owned: &BTreeMap<u64, Vec<u32>>,
    weights: &BTreeMap<u32, f64>,
    loads: &BTreeMap<u64, f64>,
    receivers: &[u64],
    frozen: &BTreeSet<u64>,
    gain: f64,
) -> Option<Move> {
    let mut givers: Vec<(u64, f64)> = loads
        .iter()
        .filter(|(m, _)| !frozen.contains(m))
        .map(|(&m, &l)| (m, l))
        .collect();
    givers.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    for (from, lf) in givers {
        let Some(to) = receivers
            .iter()
            .copied()
            .filter(|&r| r != from && !frozen.contains(&r))
            .min_by(|a, b| loads[a].total_cmp(&loads[b]).then(a.cmp(b)))
        else {
            continue;
        };
        let lt = loads[&to];
        let best = owned
            .get(&from)
            .into_iter()
            .flatten()
            .copied()
            .min_by(|a, b| {
                let ka = (lf - weights[a]).max(lt + weights[a]);
                let kb = (lf - weights[b]).max(lt + weights[b]);
                ka.total_cmp(&kb).then(a.cmp(b))
            });
        if let Some(p) = best {
            if lt + weights[&p] < lf - gain {
                return Some((p, from, to));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Members `0..n` with the given partitions each, weight one.
    fn idle(counts: &[usize]) -> (BTreeMap<u64, Vec<u32>>, BTreeMap<u64, usize>) {
        let mut owned = BTreeMap::new();
        let mut next = 0u32;
        for (m, &c) in counts.iter().enumerate() {
            owned.insert(m as u64, (next..next + c as u32).collect::<Vec<_>>());
            next += c as u32;
        }
        let held = counts
            .iter()
            .enumerate()
            .map(|(m, &c)| (m as u64, c))
            .collect();
        (owned, held)
    }

    fn after(counts: &[usize], moves: &[(u32, u64, u64)]) -> Vec<usize> {
        let mut c = counts.to_vec();
        for &(_, from, to) in moves {
            c[from as usize] -= 1;
            c[to as usize] += 1;
        }
        c
    }

    #[test]
    fn counts_reach_within_one_with_the_fewest_moves() {
        for (counts, moves) in [
            (vec![1000, 0], 500),
            (vec![500, 500, 0], 333),
            (vec![91, 91, 90, 0], 68),
            (vec![40, 0, 0, 0], 30),
            (vec![3, 0, 0, 0, 0], 2),
        ] {
            let (owned, held) = idle(&counts);
            let receivers: Vec<u64> = (0..counts.len() as u64).collect();
            let plan = plan_counts(&owned, &held, &receivers, &BTreeSet::new());
            let end = after(&counts, &plan);
            let (lo, hi) = (end.iter().min().unwrap(), end.iter().max().unwrap());
            assert!(hi - lo <= 1, "{counts:?} -> {end:?}");
            assert_eq!(plan.len(), moves, "{counts:?} -> {end:?}");
            // All to the members that were short: nobody both gives and takes.
            let givers: BTreeSet<u64> = plan.iter().map(|m| m.1).collect();
            assert!(plan.iter().all(|m| !givers.contains(&m.2)), "{plan:?}");
        }
    }

    #[test]
    fn counts_within_one_plan_no_move() {
        for counts in [vec![84, 83, 83], vec![10; 100], vec![1, 0, 0], vec![0, 0]] {
            let (owned, held) = idle(&counts);
            let receivers: Vec<u64> = (0..counts.len() as u64).collect();
            assert!(plan_counts(&owned, &held, &receivers, &BTreeSet::new()).is_empty());
            let loads = held.iter().map(|(&m, &c)| (m, c as f64)).collect();
            let weights = (0..counts.iter().sum::<usize>() as u32)
                .map(|p| (p, 1.0))
                .collect();
            assert!(
                best_single_move(&owned, &weights, &loads, &receivers, &BTreeSet::new(), 0.25)
                    .is_none(),
                "{counts:?}"
            );
        }
    }

    #[test]
    fn a_heavy_partition_moves_to_the_member_whose_light_ones_can_go() {
        // Member 0: 26 light partitions; 1 and 3: one heavy and 5 light
        // each; 2: two heavy. Loads 26, 26, 42, 26: single moves are stuck
        // (member 2's heavy partitions would overload anyone), the plan
        // gives one to member 0 and spreads member 0's light ones.
        let mut owned: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        owned.insert(0, (0..26).collect());
        owned.insert(1, [36].into_iter().chain(26..31).collect());
        owned.insert(2, vec![37, 38]);
        owned.insert(3, [39].into_iter().chain(31..36).collect());
        let weights: BTreeMap<u32, f64> = (0..40)
            .map(|p| (p, if p >= 36 { 21.0 } else { 1.0 }))
            .collect();
        let load = |m: u64| owned[&m].iter().map(|p| weights[p]).sum::<f64>();
        let loads: BTreeMap<u64, f64> = (0..4).map(|m| (m, load(m))).collect();
        let receivers = [0, 1, 2, 3];
        let none = BTreeSet::new();
        assert_eq!(
            best_single_move(&owned, &weights, &loads, &receivers, &none, 0.75),
            None
        );
        let (plan, planned) = plan_moves(&owned, &weights, &loads, &receivers, &none);
        assert!(plan.contains(&(38, 2, 0)), "{plan:?}");
        assert!(
            planned.values().all(|&l| (29.0..=31.0).contains(&l)),
            "{planned:?}"
        );
        let mut end = loads.clone();
        for &(p, from, to) in &plan {
            *end.get_mut(&from).unwrap() -= weights[&p];
            *end.get_mut(&to).unwrap() += weights[&p];
        }
        assert_eq!(end, planned);
    }

    #[test]
    fn frozen_members_neither_give_nor_take() {
        let (owned, held) = idle(&[10, 0, 0]);
        let frozen: BTreeSet<u64> = [1].into();
        let plan = plan_counts(&owned, &held, &[0, 1, 2], &frozen);
        assert!(plan.iter().all(|m| m.2 == 2), "{plan:?}");
        let frozen: BTreeSet<u64> = [0].into();
        assert!(plan_counts(&owned, &held, &[0, 1, 2], &frozen).is_empty());
    }
}

#[cfg(test)]
mod random {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Random counts, weights and frozen members: the count plan reaches
    /// within one with the fewest moves, the load plan's moves add up to
    /// its planned loads and leave frozen members alone, and a single move
    /// is one that lowers the larger load by more than the gain.
    #[test]
    fn random_plans_keep_their_stated_properties() {
        for seed in 0..2000u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let n = rng.random_range(1..7u64);
            let mut owned: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
            let mut held: BTreeMap<u64, usize> = BTreeMap::new();
            let mut next = 0u32;
            for m in 0..n {
                let c = rng.random_range(0..12u32);
                owned.insert(m, (next..next + c).collect());
                held.insert(m, c as usize);
                next += c;
            }
            let receivers: Vec<u64> = (0..n).collect();
            let plan = plan_counts(&owned, &held, &receivers, &BTreeSet::new());
            let mut end = held.clone();
            for &(p, from, to) in &plan {
                assert!(owned[&from].contains(&p));
                *end.get_mut(&from).unwrap() -= 1;
                *end.get_mut(&to).unwrap() += 1;
            }
            let lo = end.values().min().unwrap();
            let hi = end.values().max().unwrap();
            assert!(hi - lo <= 1, "seed {seed}: {held:?} -> {end:?}");
            let total: usize = held.values().sum();
            let (q, r) = (total / n as usize, total % n as usize);
            let mut sorted: Vec<usize> = held.values().copied().collect();
            sorted.sort_by(|a, b| b.cmp(a));
            let min_moves: usize = sorted
                .iter()
                .enumerate()
                .map(|(i, &c)| c.saturating_sub(q + usize::from(i < r)))
                .sum();
            assert_eq!(plan.len(), min_moves, "seed {seed}: {held:?}");
            // Weighted.
            let weights: BTreeMap<u32, f64> = (0..next)
                .map(|p| {
                    (
                        p,
                        if rng.random_bool(0.3) {
                            rng.random_range(1.0..50.0)
                        } else {
                            1.0
                        },
                    )
                })
                .collect();
            let loads: BTreeMap<u64, f64> = owned
                .iter()
                .map(|(&m, ps)| (m, ps.iter().map(|p| weights[p]).sum()))
                .collect();
            let frozen: BTreeSet<u64> = (0..n).filter(|_| rng.random_bool(0.2)).collect();
            let (plan, planned) = plan_moves(&owned, &weights, &loads, &receivers, &frozen);
            let mut end = loads.clone();
            let mut moved = BTreeSet::new();
            for &(p, from, to) in &plan {
                assert!(moved.insert(p), "seed {seed}: {p} twice");
                assert!(
                    !frozen.contains(&from) && !frozen.contains(&to),
                    "seed {seed}"
                );
                assert!(owned[&from].contains(&p));
                *end.get_mut(&from).unwrap() -= weights[&p];
                *end.get_mut(&to).unwrap() += weights[&p];
            }
            for (m, l) in &end {
                assert!(
                    (l - planned[m]).abs() < 1e-6,
                    "seed {seed}: {end:?} vs {planned:?}"
                );
            }
            if let Some((p, from, to)) =
                best_single_move(&owned, &weights, &loads, &receivers, &frozen, 0.5)
            {
                assert!(owned[&from].contains(&p) && from != to);
                assert!(!frozen.contains(&from) && !frozen.contains(&to));
                assert!(loads[&to] + weights[&p] < loads[&from] - 0.5);
            }
        }
    }
}
