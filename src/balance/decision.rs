//! When to split, merge, or report a hot key: a pure decision function.
//!
//! [`decide`] looks at the active partitions of one topic and proposes
//! topology changes. It is deliberately stateless: everything it needs
//! (rates, ages, split points, hot keys, whether a hot key was already
//! reported) comes in through [`PartitionLoad`], so the same inputs always
//! give the same decisions and the function can be driven in simulated
//! time. The caller must re-check each decision when it commits (the
//! topology may have changed in between; Pravega #4445). Why the loop is
//! stable (hysteresis, cooldown, no splitting of `[h, h]`) is explained on
//! [`BalancePolicy`].

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::cuts::{load_up_to, HashSpan};
use super::policy::RateOf;
use super::{duration_nanos, BalancePolicy, HotKey, WindowRate};

mod grid;

use grid::{layout, pieces_for, Grid, EDGE_TOLERANCE, FRAGMENT, GRID_FILL, SIBLING_FILL};

/// What [`decide`] knows about one active partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionLoad {
    /// Partition id.
    pub id: u32,
    /// First hash of its inclusive range.
    pub start: u64,
    /// Last hash of its inclusive range.
    pub end: u64,
    /// Its rates (any order; shortest and longest windows are looked up).
    pub rates: Vec<WindowRate>,
    /// Creation or last topology change, on the same clock as `now_nanos`.
    /// After a restart, use the reopen time: a value in the future counts
    /// as age zero.
    pub last_change_nanos: u64,
    /// [`super::LoadMap::split_point`] of the partition. `None` for a
    /// multi-value range means an empty load map: [`decide`] does not
    /// split such a partition (it would cut blind).
    pub split_point: Option<u64>,
    /// The partition's top key, [`super::LoadMap::hot_key`] with a low
    /// `min_share` (0 is fine): [`decide`] isolates it when it carries more
    /// than `hot_key_share` of the partition's load, or on its own at least
    /// [`KEY_FILL`] of a target.
    pub hot_key: Option<HotKey>,
    /// Whether this single-value partition was already reported hot.
    pub hot_key_reported: bool,
    /// [`super::LoadMap::profile`] of the partition: where its load lands,
    /// in hash order. [`decide`] lays the profiles of all partitions side
    /// by side to cut the topic as a whole (see [`CutPoints`]); empty means
    /// unknown, and a topic with a loaded partition of unknown profile is
    /// only split partition by partition.
    #[serde(skip)]
    pub profile: Vec<HashSpan>,
    /// The partitions it was made from: none for an initial partition, one
    /// after a split, two after a merge. Children of one split are never
    /// merged back by the grid's fit rule (only the cold rule may): a
    /// split followed by a merge of its own children is thrash.
    #[serde(default)]
    pub parents: Vec<u32>,
}

/// The cut points of one split into up to eight children, each point the
/// last hash of a child: children `[start, c1]`, `[c1 + 1, c2]`, ...,
/// `[ck + 1, end]`. A fixed-size list so that [`Decision`] stays `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CutPoints {
    points: [u64; CutPoints::MAX],
    len: u8,
}

impl CutPoints {
    /// Most cut points of one split (eight children).
    pub const MAX: usize = 7;

    /// `None` unless `points` holds 1 to [`CutPoints::MAX`] strictly
    /// increasing hashes.
    pub fn new(points: &[u64]) -> Option<CutPoints> {
        if points.is_empty() || points.len() > Self::MAX || points.windows(2).any(|w| w[0] >= w[1])
        {
            return None;
        }
        let mut out = CutPoints {
            points: [0; Self::MAX],
            len: points.len() as u8,
        };
        out.points[..points.len()].copy_from_slice(points);
        Some(out)
    }

    /// The points, strictly increasing.
    pub fn points(&self) -> &[u64] {
        &self.points[..usize::from(self.len).min(Self::MAX)]
    }
}

/// Where to split a partition `[start, end]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SplitAt {
    /// Children `[start, p]` and `[p + 1, end]`; `start <= p < end`.
    Point(u64),
    /// Into this many children at the load quantiles of the partition's
    /// load map: a partition carrying several targets' worth of load is cut
    /// once into as many pieces as it needs, not halved repeatedly.
    Quantiles(u8),
    /// Children `[start, h - 1]` (if `h > start`), `[h, h]` and
    /// `[h + 1, end]` (if `h < end`).
    IsolateKey(u64),
    /// At these points, chosen for the topic as a whole: the children line
    /// up with pieces of about equal load across partition boundaries (a
    /// child at the edge of the range may be a fragment of such a piece,
    /// which merges with the fragment next to it on the other side).
    Cuts(CutPoints),
}

/// A proposed topology change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Split `partition`.
    Split {
        /// The partition to split.
        partition: u32,
        /// Where.
        at: SplitAt,
    },
    /// Merge two adjacent partitions: `right.start == left.end + 1`.
    Merge {
        /// The partition with the lower range.
        left: u32,
        /// The partition with the higher range.
        right: u32,
    },
    /// A single-value partition is hot and cannot split: tell the operator
    /// (once; the caller records it and sets `hot_key_reported`).
    HotKey {
        /// The partition `[hash, hash]`.
        partition: u32,
        /// Its only key hash.
        hash: u64,
    },
}

/// The topology changes to make now for one topic whose active partitions
/// are `partitions` (any order). At most one decision per partition; none
/// if the policy is disabled, invalid, or has no target.
pub fn decide(
    policy: &BalancePolicy,
    now_nanos: u64,
    partitions: &[PartitionLoad],
) -> Vec<Decision> {
    if !policy.enabled || policy.validate().is_err() || policy.targets().is_empty() {
        return Vec::new();
    }
    let mut sorted: Vec<&PartitionLoad> = partitions.iter().collect();
    sorted.sort_by_key(|p| (p.start, p.id));
    let mut plan = Plan {
        policy,
        now_nanos,
        count: sorted.len() as u64,
        added: 0,
        decided: HashSet::new(),
        out: Vec::new(),
    };
    let grid = plan.grid(&sorted);
    if let Some(g) = &grid {
        plan.grid_splits(&sorted, g);
    }
    plan.splits(&sorted);
    plan.merges(&sorted, grid.as_ref());
    plan.out
}

/// The decisions of one [`decide`] call under construction.
struct Plan<'a> {
    policy: &'a BalancePolicy,
    now_nanos: u64,
    /// Active partitions before any decision.
    count: u64,
    /// Partitions the splits decided so far add.
    added: u64,
    decided: HashSet<u32>,
    out: Vec<Decision>,
}

impl Plan<'_> {
    fn old_enough(&self, p: &PartitionLoad) -> bool {
        self.now_nanos.saturating_sub(p.last_change_nanos) >= duration_nanos(self.policy.min_age)
    }

    /// Hot partitions, hottest first, each split as the budget allows.
    /// The budget ignores merges made in the same call (conservative).
    fn splits(&mut self, sorted: &[&PartitionLoad]) {
        let mut hot: Vec<(f64, &PartitionLoad)> = sorted
            .iter()
            .filter(|p| p.start <= p.end && self.old_enough(p))
            .filter_map(|p| heat(self.policy, p).map(|h| (h, *p)))
            .collect();
        hot.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
        for (_, p) in hot {
            if self.decided.contains(&p.id) {
                continue;
            }
            if let Some((decision, added)) = split_for(self.policy, p, self.budget()) {
                self.added += added;
                self.decided.insert(p.id);
                self.out.push(decision);
            }
        }
    }

    /// Room for this many more partitions.
    fn budget(&self) -> u64 {
        u64::from(self.policy.max_partitions)
            .saturating_sub(self.count)
            .saturating_sub(self.added)
    }

    /// The topic cut as a whole (see [`Grid`]); `None` when a partition's
    /// load is unknown, a loaded partition has no profile, the ranges
    /// overlap, or there is no load at all.
    fn grid(&self, sorted: &[&PartitionLoad]) -> Option<Grid> {
        let mut loads = Vec::with_capacity(sorted.len());
        let mut prev_end: Option<u64> = None;
        for p in sorted {
            if p.start > p.end || prev_end.is_some_and(|e| p.start <= e) {
                return None;
            }
            prev_end = Some(p.end);
            let load = in_targets(self.policy, p)?;
            let mass: f64 = p.profile.iter().map(|s| s.mass).sum();
            if load > 0.0 && !(mass.is_finite() && mass > 0.0) {
                return None;
            }
            loads.push(load);
        }
        let all = vec![true; sorted.len()];
        let segments = layout(sorted, &loads, &all);
        let total = segments.last().map_or(0.0, |s| s.cum_after);
        if !(total.is_finite() && total > 0.0) {
            return None;
        }
        let max = usize::try_from(self.policy.max_partitions).unwrap_or(usize::MAX);
        let (n, _) = pieces_for(&segments, max);
        let piece = total / n as f64;
        let cuttable: Vec<bool> = sorted
            .iter()
            .zip(&loads)
            .map(|(p, &load)| {
                p.start < p.end
                    && !p.profile.is_empty()
                    && self.old_enough(p)
                    && settled(p)
                    && load >= self.policy.cold_fraction
                    && (heat(self.policy, p).is_some()
                        || p.parents.len() != 2
                            && long_units(self.policy, p, as_is).is_some_and(|u| u > 1.0)
                            && long_units(self.policy, p, at_least).is_some_and(|u| u > GRID_FILL))
            })
            .collect();
        let (segments, cuts) = if cuttable.iter().any(|&c| c) {
            let segments = layout(sorted, &loads, &cuttable);
            let (_, cuts) = pieces_for(&segments, max);
            (segments, cuts)
        } else {
            (segments, Vec::new())
        };
        Some(Grid {
            segments,
            cuts,
            piece,
            loads,
            cuttable,
        })
    }

    /// Splits the partitions the grid may cut at the grid's cuts inside
    /// them, largest first, as the budget allows. A cut closer than
    /// [`EDGE_TOLERANCE`] pieces to a partition's edge is left out (the
    /// sliver stays with its neighbour piece).
    fn grid_splits(&mut self, sorted: &[&PartitionLoad], g: &Grid) {
        let mut order: Vec<usize> = (0..sorted.len()).filter(|&i| g.cuttable[i]).collect();
        order.sort_by(|&a, &b| {
            g.loads[b]
                .total_cmp(&g.loads[a])
                .then(sorted[a].id.cmp(&sorted[b].id))
        });
        let min_piece = EDGE_TOLERANCE * g.piece;
        let upto = |h: u64| load_up_to(&g.segments, h);
        for i in order {
            let p = sorted[i];
            if self.decided.contains(&p.id) {
                continue;
            }
            let before = p.start.checked_sub(1).map_or(0.0, upto);
            let through = upto(p.end);
            let cuts: Vec<u64> = g
                .cuts
                .iter()
                .copied()
                .filter(|&c| p.start <= c && c < p.end)
                .filter(|&c| upto(c) - before >= min_piece && through - upto(c) >= min_piece)
                .collect();
            let Some(points) = CutPoints::new(&cuts) else {
                continue;
            };
            let added = cuts.len() as u64;
            if added > self.budget() {
                continue;
            }
            self.added += added;
            self.decided.insert(p.id);
            self.out.push(Decision::Split {
                partition: p.id,
                at: split_at(p, points),
            });
        }
    }

    /// Adjacent cold pairs, and adjacent pairs that fit one piece of the
    /// grid, left to right, down to `min_partitions`.
    fn merges(&mut self, sorted: &[&PartitionLoad], grid: Option<&Grid>) {
        let mut remaining = self.count;
        let floor = u64::from(self.policy.min_partitions.max(1));
        let mut i = 0;
        while i + 1 < sorted.len() && remaining > floor {
            let (left, right) = (sorted[i], sorted[i + 1]);
            let fits = grid.is_some_and(|g| self.fit_together(left, right, g));
            if self.mergeable(left, right) || fits {
                self.decided.insert(left.id);
                self.decided.insert(right.id);
                self.out.push(Decision::Merge {
                    left: left.id,
                    right: right.id,
                });
                remaining -= 1;
                i += 2;
            } else {
                i += 1;
            }
        }
    }

    /// Whether `left` and `right`, adjacent, make one piece of the grid
    /// together: not children of one split, one of them a fragment (below
    /// [`FRAGMENT`] pieces),
    /// both loads are settled (see [`SETTLED_UNCERTAINTY`]), and together
    /// they carry at most [`GRID_FILL`] of the target. The merged partition
    /// is then neither hot (the long window must clear [`LONG_HOT_MARGIN`]
    /// targets by its noise) nor above [`GRID_FILL`] by more than its
    /// noise, so it is not cut again unless its load grows.
    fn fit_together(&self, left: &PartitionLoad, right: &PartitionLoad, g: &Grid) -> bool {
        let adjacent = left.start <= left.end
            && right.start <= right.end
            && left.end.checked_add(1) == Some(right.start);
        let siblings = left.parents.len() == 1 && left.parents == right.parents;
        if !adjacent
            || left.id == right.id
            || self.decided.contains(&left.id)
            || self.decided.contains(&right.id)
            || !self.old_enough(left)
            || !self.old_enough(right)
            || !settled(left)
            || !settled(right)
        {
            return false;
        }
        let (Some(l), Some(r)) = (
            in_targets(self.policy, left),
            in_targets(self.policy, right),
        ) else {
            return false;
        };
        let fill = if siblings { SIBLING_FILL } else { GRID_FILL };
        l.min(r) < FRAGMENT * g.piece && windows_fit(self.policy, left, right, fill)
    }

    fn mergeable(&self, left: &PartitionLoad, right: &PartitionLoad) -> bool {
        let adjacent = left.start <= left.end
            && right.start <= right.end
            && left.end.checked_add(1) == Some(right.start);
        adjacent
            && left.id != right.id
            && !self.decided.contains(&left.id)
            && !self.decided.contains(&right.id)
            && self.old_enough(left)
            && self.old_enough(right)
            && is_cold(self.policy, left)
            && is_cold(self.policy, right)
            && combined_below(self.policy, left, right)
    }
}

/// A rate usable in a comparison: finite and non-negative.
fn known(rate: f64) -> Option<f64> {
    (rate.is_finite() && rate >= 0.0).then_some(rate)
}

/// How many standard deviations of sampling noise a rate must clear before
/// it counts as hot or cold (see [`uncertainty`]).
const NOISE_SIGMAS: f64 = 3.0;

/// The relative standard deviation of a window's rate, times
/// [`NOISE_SIGMAS`]. Records arrive at random: an EWMA with time constant
/// `w` over `n` records/s behaves like a count of about `2 n w` records,
/// whose relative deviation is `1 / sqrt(2 n w)`. At a few records per
/// second one record lifts the 1 s EWMA far above any target for a moment;
/// that is noise, not load, and splitting on it (then merging the cold
/// children back) is churn. At thousands of records per second the margin
/// is a few percent. Unknown counts are as uncertain as one record.
fn uncertainty(r: &WindowRate) -> f64 {
    // A window of a tracker only `h` old has seen `h` of history, not the
    // `2 w` of a settled EWMA; this blends the two smoothly.
    let span = 2.0 * r.window.as_secs_f64();
    let seen = span * -(-r.history.as_secs_f64() / span).exp_m1();
    let records = known(r.records_per_sec).unwrap_or(0.0) * seen;
    NOISE_SIGMAS / records.max(1.0).sqrt()
}

/// `rate_of(r)` lowered by its noise: what the rate is at least.
fn at_least(rate_of: RateOf, r: &WindowRate) -> Option<f64> {
    known(rate_of(r)).map(|v| v * (1.0 - uncertainty(r)).max(0.0))
}

/// `rate_of(r)` raised by its noise: what the rate is at most.
fn at_most(rate_of: RateOf, r: &WindowRate) -> Option<f64> {
    known(rate_of(r)).map(|v| v * (1.0 + uncertainty(r)))
}

/// The rates of the shortest and longest windows.
fn short_and_long(rates: &[WindowRate]) -> Option<(&WindowRate, &WindowRate)> {
    let short = rates.iter().min_by_key(|r| r.window)?;
    let long = rates.iter().max_by_key(|r| r.window)?;
    Some((short, long))
}

/// How far over its hot thresholds a partition is (`> 1` for either set
/// target), or `None` if it is not hot. Unknown rates are never hot.
fn heat(policy: &BalancePolicy, p: &PartitionLoad) -> Option<f64> {
    let (short, long) = short_and_long(&p.rates)?;
    let mut hottest: Option<f64> = None;
    let mut consider = |score: f64| hottest = Some(hottest.map_or(score, |h| h.max(score)));
    for (rate_of, target) in policy.targets() {
        let short_limit = policy.hot_factor * target;
        if let Some(r) = at_least(rate_of, short).filter(|&r| r > short_limit) {
            consider(r / short_limit);
        }
        let long_limit = LONG_HOT_MARGIN * target;
        if let Some(r) = at_least(rate_of, long).filter(|&r| r > long_limit) {
            consider(r / long_limit);
        }
    }
    hottest
}

/// Most children one split creates.
const MAX_PIECES: u64 = 8;

/// The load a split aims to leave on each child at most, as a fraction of
/// the target. Children cut to exactly the target (1.0) sit on the hot
/// threshold: a cut a few percent off plus noise split them again minutes
/// later. Much lower is not better either: every extra partition lowers
/// the mean load, and a partition that cannot be split (one hot key) then
/// stands out further above it.
const FILL: f64 = 0.9;

/// A window whose noise ([`uncertainty`]) is at most this says what the
/// load is now.
const SETTLED_UNCERTAINTY: f64 = 0.25;

/// The longest window makes a partition hot above this many targets, not
/// at the target itself: load quantiles cut from a 64-bucket histogram
/// miss by a few percent, so a child aimed at [`FILL`] of the target can
/// land just above it, and its noise would split it minutes later.
const LONG_HOT_MARGIN: f64 = 1.05;

/// A key carrying at least this fraction of a target on its own is
/// isolated into `[h, h]` whatever its share of its partition: no cut of
/// its partition into pieces of at most [`FILL`] × the target can leave it
/// with company, and isolating it first lets the next split cut the rest
/// evenly (a key of 13 % of the load in a partition of 30 % is below half
/// of it, but a median split would leave it in a child as loaded as the
/// parent was).
pub(crate) const KEY_FILL: f64 = FILL;

/// The window that says what the load is now: the shortest one that holds
/// enough records to be trusted (the longest one if none does).
fn current(p: &PartitionLoad) -> Option<&WindowRate> {
    let mut windows: Vec<&WindowRate> = p.rates.iter().collect();
    windows.sort_by_key(|r| r.window);
    windows
        .iter()
        .find(|r| uncertainty(r) <= SETTLED_UNCERTAINTY)
        .or(windows.last())
        .copied()
}

/// Whether a key with `share` of `p`'s current load carries at least
/// [`KEY_FILL`] of a set target.
fn fills_a_partition(policy: &BalancePolicy, p: &PartitionLoad, share: f64) -> bool {
    let Some(now) = current(p) else {
        return false;
    };
    policy.targets().into_iter().any(|(rate_of, target)| {
        known(rate_of(now)).is_some_and(|r| r * share >= KEY_FILL * target)
    })
}

/// How many partitions of at most `FILL` × the target the current load
/// needs (see [`current`]).
fn pieces_needed(policy: &BalancePolicy, p: &PartitionLoad) -> u64 {
    let Some(now) = current(p) else {
        return 2;
    };
    policy
        .targets()
        .into_iter()
        .filter_map(|(rate_of, target)| known(rate_of(now)).map(|r| (r / (FILL * target)).ceil()))
        .fold(2.0_f64, f64::max)
        .min(MAX_PIECES as f64) as u64
}

/// Every window of every set target known and below `cold_fraction`, by
/// more than its noise.
fn is_cold(policy: &BalancePolicy, p: &PartitionLoad) -> bool {
    !p.rates.is_empty()
        && policy.targets().into_iter().all(|(rate_of, target)| {
            p.rates
                .iter()
                .all(|r| at_most(rate_of, r).is_some_and(|v| v < policy.cold_fraction * target))
        })
}

/// Every window of `left`, summed with the same window of `right`, stays
/// below `merge_fraction` of every set target. A window `right` lacks makes
/// the pair unmergeable (the combined rate would be unknown).
fn combined_below(policy: &BalancePolicy, left: &PartitionLoad, right: &PartitionLoad) -> bool {
    policy.targets().into_iter().all(|(rate_of, target)| {
        left.rates.iter().all(|l| {
            right
                .rates
                .iter()
                .find(|r| r.window == l.window)
                .is_some_and(|r| {
                    let sum = rate_of(l) + rate_of(r);
                    known(sum).is_some_and(|s| s < policy.merge_fraction * target)
                })
        })
    })
}

/// The split of hot partition `p` given room for `budget` more partitions,
/// with how many partitions it adds.
fn split_for(policy: &BalancePolicy, p: &PartitionLoad, budget: u64) -> Option<(Decision, u64)> {
    let (start, end) = (p.start, p.end);
    if start == end {
        // Cannot split; report once, never again (no scale storm).
        let report = Decision::HotKey {
            partition: p.id,
            hash: start,
        };
        return (!p.hot_key_reported).then_some((report, 0));
    }
    let split = |at| Decision::Split {
        partition: p.id,
        at,
    };
    let hot_key = p.hot_key.filter(|k| {
        k.share.is_finite()
            && (k.share > policy.hot_key_share || fills_a_partition(policy, p, k.share))
            && (start..=end).contains(&k.hash)
    });
    if let Some(HotKey { hash, .. }) = hot_key {
        let needed = u64::from(hash > start) + u64::from(hash < end);
        if needed <= budget {
            return Some((split(SplitAt::IsolateKey(hash)), needed));
        }
        if budget == 0 {
            return None;
        }
        // Room for one more only, and the key is strictly inside (needed is
        // 2, so hash > start): cut just before it, so the next round
        // isolates it with one more partition.
        return Some((split(SplitAt::Point(hash - 1)), 1));
    }
    if budget == 0 {
        return None;
    }
    // An empty load map (nothing appended since the partition was created
    // or the log reopened) knows nothing about where the load lands: the
    // heat can only come from rates restored from before the reopen, and a
    // split now would cut blind at the middle of the range. Wait for
    // appends; a partition that is really hot gets them at once.
    p.split_point?;
    let pieces = pieces_needed(policy, p)
        .min(budget.saturating_add(1))
        .min(MAX_PIECES);
    if pieces > 2 && end - start >= pieces {
        return Some((split(SplitAt::Quantiles(pieces as u8)), pieces - 1));
    }
    let middle = start + (end - start) / 2;
    let point = p
        .split_point
        .filter(|&m| start <= m && m < end)
        .unwrap_or(middle);
    Some((split(SplitAt::Point(point)), 1))
}

/// The split of `p` at `points`, as the plainest [`SplitAt`].
fn split_at(p: &PartitionLoad, points: CutPoints) -> SplitAt {
    match *points.points() {
        [c] => SplitAt::Point(c),
        [a, h] if a.checked_add(1) == Some(h) && h > p.start => SplitAt::IsolateKey(h),
        _ => SplitAt::Cuts(points),
    }
}

/// Whether the window that says what `p`'s load is now holds enough
/// records to be trusted (see [`current`]).
fn settled(p: &PartitionLoad) -> bool {
    current(p).is_some_and(|r| uncertainty(r) <= SETTLED_UNCERTAINTY)
}

/// `p`'s current load in targets: the largest ratio over the set targets.
fn in_targets(policy: &BalancePolicy, p: &PartitionLoad) -> Option<f64> {
    let now = current(p)?;
    policy
        .targets()
        .into_iter()
        .filter_map(|(rate_of, target)| known(rate_of(now)).map(|r| r / target))
        .reduce(f64::max)
}

/// The load of `p`'s longest window in targets, as `bound` reads it (as
/// is: `known`, or lowered by its noise: `at_least`).
fn long_units(
    policy: &BalancePolicy,
    p: &PartitionLoad,
    bound: fn(RateOf, &WindowRate) -> Option<f64>,
) -> Option<f64> {
    let (_, long) = short_and_long(&p.rates)?;
    policy
        .targets()
        .into_iter()
        .filter_map(|(rate_of, target)| bound(rate_of, long).map(|r| r / target))
        .reduce(f64::max)
}

/// `rate_of(r)` as is, if known.
fn as_is(rate_of: RateOf, r: &WindowRate) -> Option<f64> {
    known(rate_of(r))
}

/// Every window of `left` plus the same window of `right` carries at most
/// `fill` of every set target.
fn windows_fit(
    policy: &BalancePolicy,
    left: &PartitionLoad,
    right: &PartitionLoad,
    fill: f64,
) -> bool {
    !left.rates.is_empty()
        && policy.targets().into_iter().all(|(rate_of, target)| {
            left.rates.iter().all(|l| {
                right
                    .rates
                    .iter()
                    .find(|r| r.window == l.window)
                    .is_some_and(|r| {
                        known(rate_of(l) + rate_of(r)).is_some_and(|s| s <= fill * target)
                    })
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SEC: u64 = 1_000_000_000;
    const NOW: u64 = 3_600 * SEC;
    const TARGET: f64 = 1_000_000.0;

    fn policy() -> BalancePolicy {
        BalancePolicy {
            target_bytes_per_sec: Some(TARGET),
            ..BalancePolicy::default()
        }
    }

    /// Rates for the default windows: `short` in 1 s, `long` in 10 s and 60 s.
    fn rates(short: f64, long: f64) -> Vec<WindowRate> {
        [(1, short), (10, long), (60, long)]
            .into_iter()
            .map(|(secs, bytes_per_sec)| WindowRate {
                window: Duration::from_secs(secs),
                bytes_per_sec,
                // 100-byte records.
                records_per_sec: bytes_per_sec / 100.0,
                history: Duration::MAX,
            })
            .collect()
    }

    fn part(id: u32, start: u64, end: u64, short: f64, long: f64) -> PartitionLoad {
        PartitionLoad {
            id,
            start,
            end,
            rates: rates(short, long),
            last_change_nanos: 0,
            split_point: (start < end).then(|| start + (end - start) / 2),
            hot_key: None,
            hot_key_reported: false,
            profile: Vec::new(),
            parents: Vec::new(),
        }
    }

    fn split(partition: u32, at: SplitAt) -> Decision {
        Decision::Split { partition, at }
    }

    #[test]
    fn hot_by_short_or_long_window_splits_at_the_split_point() {
        // 2.2 targets of load: cut once into the 3 pieces of at most 0.8
        // targets it needs.
        let mut by_short = part(1, 0, 999, 2.2 * TARGET, 0.0);
        by_short.split_point = Some(300);
        assert_eq!(
            decide(&policy(), NOW, &[by_short.clone()]),
            vec![split(1, SplitAt::Quantiles(3))]
        );
        // Never more than 8 children at once, and never past max_partitions.
        by_short.rates = rates(10.0 * TARGET, 0.0);
        assert_eq!(
            decide(&policy(), NOW, &[by_short.clone()]),
            vec![split(1, SplitAt::Quantiles(8))]
        );
        let capped = BalancePolicy {
            max_partitions: 2,
            ..policy()
        };
        assert_eq!(
            decide(&capped, NOW, &[by_short]),
            vec![split(1, SplitAt::Point(300))]
        );
        let by_long = part(2, 0, 999, 0.0, 1.1 * TARGET);
        assert_eq!(
            decide(&policy(), NOW, &[by_long]),
            vec![split(2, SplitAt::Point(499))]
        );
        // Not hot: short under hot_factor x target, long under target.
        assert!(decide(
            &policy(),
            NOW,
            &[part(3, 0, 999, 1.9 * TARGET, 0.9 * TARGET)]
        )
        .is_empty());
    }

    #[test]
    fn a_window_holding_a_few_records_is_not_evidence_of_heat() {
        // One 4 KB record lifts the 1 s EWMA to ~4 KB/s against a 1 KB/s
        // target: 4 x the target, but less than one record in the window.
        let policy = BalancePolicy {
            target_bytes_per_sec: Some(1_000.0),
            ..BalancePolicy::default()
        };
        let mut p = part(1, 0, 999, 0.0, 0.0);
        p.rates[0].bytes_per_sec = 3_800.0;
        p.rates[0].records_per_sec = 0.95;
        assert!(decide(&policy, NOW, &[p.clone()]).is_empty());
        // The 60 s window with 60 records of the same load is evidence.
        p.rates[2].bytes_per_sec = 4_000.0;
        p.rates[2].records_per_sec = 1.0;
        assert_eq!(decide(&policy, NOW, &[p]).len(), 1);
    }

    #[test]
    fn invalid_split_point_falls_back_to_the_middle() {
        for bad in [Some(999), Some(5_000)] {
            let mut p = part(1, 0, 999, 0.0, 1.5 * TARGET);
            p.split_point = bad;
            assert_eq!(
                decide(&policy(), NOW, &[p]),
                vec![split(1, SplitAt::Point(499))]
            );
        }
    }

    #[test]
    fn an_empty_load_map_is_never_split_blind() {
        // Hot by rates restored at a reopen, nothing appended since.
        let mut p = part(1, 0, 999, 0.0, 4.0 * TARGET);
        p.split_point = None;
        assert!(decide(&policy(), NOW, &[p.clone()]).is_empty());
        p.split_point = Some(300);
        assert_eq!(
            decide(&policy(), NOW, &[p]),
            vec![split(1, SplitAt::Quantiles(5))]
        );
    }

    #[test]
    fn records_target_alone_can_make_hot() {
        let policy = BalancePolicy {
            target_records_per_sec: Some(100.0),
            ..BalancePolicy::default()
        };
        let mut p = part(1, 0, 9, 0.0, 0.0);
        p.rates[2].records_per_sec = 150.0;
        assert_eq!(decide(&policy, NOW, &[p]).len(), 1);
        assert!(decide(&BalancePolicy::default(), NOW, &[part(1, 0, 9, 9e9, 9e9)]).is_empty());
    }

    #[test]
    fn dominant_key_is_isolated_and_single_value_is_reported_once() {
        let mut p = part(1, 0, 999, 0.0, 3.0 * TARGET);
        p.hot_key = Some(HotKey {
            hash: 400,
            share: 0.7,
        });
        assert_eq!(
            decide(&policy(), NOW, &[p.clone()]),
            vec![split(1, SplitAt::IsolateKey(400))]
        );
        p.hot_key = Some(HotKey {
            hash: 400,
            share: 0.4,
        });
        p.split_point = Some(400);
        // The 1 s window (one target) says two pieces are enough now.
        p.rates = rates(TARGET, 3.0 * TARGET);
        assert_eq!(
            decide(&policy(), NOW, &[p]),
            vec![split(1, SplitAt::Point(400))]
        );

        let mut single = part(2, 400, 400, 9e9, 9e9);
        single.hot_key = Some(HotKey {
            hash: 400,
            share: 1.0,
        });
        single.split_point = Some(400);
        let report = Decision::HotKey {
            partition: 2,
            hash: 400,
        };
        assert_eq!(decide(&policy(), NOW, &[single.clone()]), vec![report]);
        single.hot_key_reported = true;
        assert!(
            decide(&policy(), NOW, &[single]).is_empty(),
            "never split [h, h]"
        );
    }

    #[test]
    fn a_key_filling_a_partition_is_isolated_below_the_share_rule() {
        // 2.5 targets of load, its top key 40 % of it: one target alone.
        let mut p = part(1, 0, 999, 2.5 * TARGET, 2.5 * TARGET);
        p.hot_key = Some(HotKey {
            hash: 600,
            share: 0.4,
        });
        assert_eq!(
            decide(&policy(), NOW, &[p.clone()]),
            vec![split(1, SplitAt::IsolateKey(600))]
        );
        // 20 % of it (half a target) fits in a piece: load quantiles.
        p.hot_key = Some(HotKey {
            hash: 600,
            share: 0.2,
        });
        assert_eq!(
            decide(&policy(), NOW, &[p]),
            vec![split(1, SplitAt::Quantiles(3))]
        );
    }

    #[test]
    fn min_age_and_clock_going_backwards_block_decisions() {
        let mut young = part(1, 0, 999, 9e9, 9e9);
        young.last_change_nanos = NOW - 9 * SEC;
        assert!(decide(&policy(), NOW, &[young.clone()]).is_empty());
        young.last_change_nanos = NOW + SEC; // from the future: age 0
        assert!(decide(&policy(), NOW, &[young.clone()]).is_empty());
        young.last_change_nanos = NOW - 10 * SEC;
        assert_eq!(decide(&policy(), NOW, &[young]).len(), 1);
    }

    #[test]
    fn max_partitions_budget_counts_isolation_children() {
        let policy = BalancePolicy {
            max_partitions: 4,
            ..policy()
        };
        let mut a = part(1, 0, 999, 0.0, 5.0 * TARGET);
        a.hot_key = Some(HotKey {
            hash: 500,
            share: 0.9,
        });
        let b = part(2, 1_000, 1_999, 0.0, 4.0 * TARGET);
        let c = part(3, 2_000, u64::MAX, 0.0, 3.0 * TARGET);
        // 3 active, room for 1: the hottest (a) gets a cut before its key.
        let out = decide(&policy, NOW, &[c.clone(), b.clone(), a.clone()]);
        assert_eq!(out, vec![split(1, SplitAt::Point(499))]);
        // 2 active, room for 2: a isolates (+2), nothing left for b.
        let out = decide(&policy, NOW, &[b.clone(), a.clone()]);
        assert_eq!(out, vec![split(1, SplitAt::IsolateKey(500))]);
        // At the cap: nothing, but a single-value report needs no room.
        let single = part(4, 2_000, 2_000, 9e9, 9e9);
        let out = decide(&policy, NOW, &[a, b, c, single]);
        assert_eq!(
            out,
            vec![Decision::HotKey {
                partition: 4,
                hash: 2_000
            }]
        );
    }

    #[test]
    fn merges_only_adjacent_cold_pairs_and_stops_at_min_partitions() {
        let cold = 0.1 * TARGET;
        let parts = [
            part(1, 0, 99, cold, cold),
            part(2, 100, 199, cold, cold),
            part(3, 200, 299, cold, cold),
            part(4, 300, u64::MAX, cold, cold),
        ];
        let all = decide(&policy(), NOW, &parts);
        let merges = vec![
            Decision::Merge { left: 1, right: 2 },
            Decision::Merge { left: 3, right: 4 },
        ];
        assert_eq!(all, merges);
        let three = BalancePolicy {
            min_partitions: 3,
            ..policy()
        };
        assert_eq!(decide(&three, NOW, &parts), merges[..1].to_vec());
        // A gap, a warm neighbour, or a combined rate too high: no merge.
        let gap = [part(1, 0, 99, cold, cold), part(2, 101, 199, cold, cold)];
        assert!(decide(&policy(), NOW, &gap).is_empty());
        let warm = [
            part(1, 0, 99, cold, cold),
            part(2, 100, 199, 0.4 * TARGET, cold),
        ];
        assert!(decide(&policy(), NOW, &warm).is_empty());
        let sum = 0.29 * TARGET;
        let heavy = [part(1, 0, 99, sum, sum), part(2, 100, 199, sum, sum)];
        assert!(decide(&policy(), NOW, &heavy).is_empty());
    }

    #[test]
    fn split_and_merge_never_touch_the_same_partition() {
        let cold = 0.1 * TARGET;
        let parts = [
            part(1, 0, 99, 0.0, 1.5 * TARGET),
            part(2, 100, 199, cold, cold),
            part(3, 200, 299, cold, cold),
            part(4, 300, 399, cold, cold),
        ];
        let out = decide(&policy(), NOW, &parts);
        assert_eq!(
            out,
            vec![
                split(1, SplitAt::Point(49)),
                Decision::Merge { left: 2, right: 3 }
            ]
        );
        // Duplicate ids get one decision at most.
        let dup = [
            part(5, 0, 99, 0.0, 2.0 * TARGET),
            part(5, 100, 199, 0.0, 2.0 * TARGET),
        ];
        assert_eq!(decide(&policy(), NOW, &dup).len(), 1);
    }

    #[test]
    fn invalid_or_disabled_policy_decides_nothing() {
        let hot = [part(0, 0, u64::MAX, 9e9, 9e9)];
        let invalid = BalancePolicy {
            cold_fraction: 0.9,
            ..policy()
        };
        assert!(decide(&invalid, NOW, &hot).is_empty());
        let disabled = BalancePolicy {
            enabled: false,
            ..policy()
        };
        assert!(decide(&disabled, NOW, &hot).is_empty());
        assert_eq!(decide(&policy(), NOW, &hot).len(), 1);
    }

    #[test]
    fn cut_points_hold_one_to_seven_increasing_hashes() {
        assert_eq!(
            CutPoints::new(&[3, 9]).map(|c| c.points().to_vec()),
            Some(vec![3, 9])
        );
        assert!(CutPoints::new(&[]).is_none());
        assert!(CutPoints::new(&[9, 3]).is_none());
        assert!(CutPoints::new(&[3, 3]).is_none());
        assert!(CutPoints::new(&[1, 2, 3, 4, 5, 6, 7, 8]).is_none());
        assert_eq!(
            CutPoints::new(&[1, 2, 3, 4, 5, 6, 7]).map(|c| c.points().len()),
            Some(7)
        );
    }

    #[test]
    fn garbage_rates_are_neither_hot_nor_cold() {
        let weird = [
            part(1, 0, 99, f64::NAN, f64::NAN),
            part(2, 100, 199, -1.0, -1.0),
            part(3, 200, 299, f64::INFINITY, f64::NAN),
            PartitionLoad {
                rates: Vec::new(),
                ..part(4, 300, 399, 0.0, 0.0)
            },
            part(5, 400, 300, 9e9, 9e9), // reversed range
        ];
        assert!(decide(&policy(), NOW, &weird).is_empty());
        assert!(decide(&policy(), 0, &[]).is_empty());
    }
}
