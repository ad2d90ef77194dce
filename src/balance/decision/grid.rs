//! The grid: the topic cut as a whole into pieces of about equal load,
//! which [`decide`](super::decide) lines its splits and merges up with.

use super::super::cuts::{cut_points, load_up_to, HashSpan};
use super::PartitionLoad;

/// Two children of one split merge by the fit rule only if together they
/// carry at most this fraction of the target in every window: the load has
/// fallen well below what the split was cut for (a topic cut from a busy
/// first second that then runs at half the rate), far enough below the
/// target that the merged partition is not cut again when the load rises
/// by a third.
pub(super) const SIBLING_FILL: f64 = 0.75;

/// A partition below this many pieces of the grid is a fragment: the part
/// of a piece that a partition boundary cut off.
pub(super) const FRAGMENT: f64 = 0.6;

/// The load the pieces of the grid carry at most, as a fraction of the
/// target: a little above [`FILL`], because the grid cuts the whole topic at
/// once from settled loads (a local split cuts one partition from its first
/// second), and every piece more lowers the mean load against the piece
/// that holds the heaviest key. Still far enough below the long window's
/// hot threshold ([`LONG_HOT_MARGIN`]) that noise does not split it again.
pub(super) const GRID_FILL: f64 = 0.95;

/// A cut of the grid closer than this many pieces to a partition's edge is
/// not made: the sliver would only have to merge back.
pub(super) const EDGE_TOLERANCE: f64 = 0.1;

/// The topic cut as a whole into pieces of about equal load, each at most
/// [`GRID_FILL`] of the target unless it is a single key (or a partition that is
/// not cut now): where the partitions would be if they had been cut
/// together. Splitting partitions one by one into even pieces of their own
/// load leaves the partition count rounded up once per partition and the
/// pieces next to a heavy key at whatever is left; cutting at the grid
/// lines up the children across partition boundaries, and the two
/// fragments of a piece that straddles a boundary merge afterwards.
pub(super) struct Grid {
    /// The topic's load in hash order, in targets: the partitions that may
    /// be cut by their profiles, every other one as one indivisible block.
    pub(super) segments: Vec<HashSpan>,
    /// Cut points of `segments` into the fewest pieces that fit.
    pub(super) cuts: Vec<u64>,
    /// Mean load of a piece when every partition may be cut, in targets.
    pub(super) piece: f64,
    /// Each partition's load in targets, in hash order.
    pub(super) loads: Vec<f64>,
    /// Whether each partition (in hash order) is cut now: hot, or its
    /// longest window above the target and above [`GRID_FILL`] by more than
    /// its noise (a margin over [`GRID_FILL`], the most a merge or a cut of
    /// the grid makes; and the longest window: a load that swings for a few
    /// seconds must not cut what a merge made; the child of a merge is cut
    /// only when hot), with a settled load, old enough.
    pub(super) cuttable: Vec<bool>,
}

/// The topic's load in hash order, in targets: each partition's profile
/// scaled to its load if `cuttable`, otherwise one indivisible block.
pub(super) fn layout(sorted: &[&PartitionLoad], loads: &[f64], cuttable: &[bool]) -> Vec<HashSpan> {
    let mut out: Vec<HashSpan> = Vec::new();
    let mut cum = 0.0;
    let mut push = |lo: u64, hi: u64, mass: f64, point: bool| {
        cum += mass;
        out.push(HashSpan {
            lo,
            hi,
            mass,
            point,
            cum_after: cum,
        });
    };
    for ((p, &load), &cut) in sorted.iter().zip(loads).zip(cuttable) {
        let mass: f64 = p.profile.iter().map(|s| s.mass).sum();
        if !(cut && mass.is_finite() && mass > 0.0) {
            push(p.start, p.end, load, !cut);
            continue;
        }
        let scale = load / mass;
        for s in &p.profile {
            let (lo, hi) = (s.lo.max(p.start), s.hi.min(p.end));
            if lo <= hi && s.mass.is_finite() && s.mass >= 0.0 {
                push(lo, hi, s.mass * scale, s.point);
            }
        }
    }
    out
}

/// The fewest pieces (at most `max`) that cut `segments` into pieces of at
/// most [`GRID_FILL`] each, except a piece that is a single indivisible segment,
/// with their cut points.
pub(super) fn pieces_for(segments: &[HashSpan], max: usize) -> (usize, Vec<u64>) {
    let total = segments.last().map_or(0.0, |s| s.cum_after);
    let heavy: Vec<f64> = segments
        .iter()
        .filter(|s| s.point && s.mass > GRID_FILL)
        .map(|s| s.mass)
        .collect();
    let rest = (total - heavy.iter().sum::<f64>()).max(0.0);
    let mut n = (heavy.len() + (rest / GRID_FILL).ceil() as usize).clamp(1, max.max(1));
    loop {
        let cuts = cut_points(segments, n);
        if n >= max || fits(segments, &cuts) {
            let cuts = without_slivers(segments, cuts);
            return (cuts.len() + 1, cuts);
        }
        n += 1;
    }
}

/// `cuts` without the cuts that leave a sliver: a piece below half the
/// mean piece that fits into a neighbour piece within [`GRID_FILL`] joins
/// the smaller such neighbour. Cutting into a fixed number of pieces around
/// heavy keys can leave one (the pieces on either side of a key are
/// whatever the key leaves), and a sliver is a partition more for the same
/// load: it lowers the mean against the busiest piece.
pub(super) fn without_slivers(segments: &[HashSpan], mut cuts: Vec<u64>) -> Vec<u64> {
    let total = segments.last().map_or(0.0, |s| s.cum_after);
    let Some(last) = segments.last().map(|s| s.hi) else {
        return cuts;
    };
    while !cuts.is_empty() {
        let ends: Vec<u64> = cuts.iter().copied().chain([last]).collect();
        let mut before = 0.0;
        let loads: Vec<f64> = ends
            .iter()
            .map(|&e| {
                let through = load_up_to(segments, e);
                let load = through - before;
                before = through;
                load
            })
            .collect();
        let mean = total / loads.len() as f64;
        let mut best: Option<(f64, usize)> = None; // (joined load, cut index)
        for (i, &l) in loads.iter().enumerate() {
            if l >= 0.5 * mean {
                continue;
            }
            // Joining piece i with piece i - 1 removes cut i - 1; with
            // piece i + 1, cut i.
            let left = (i > 0).then(|| (l + loads[i - 1], i - 1));
            let right = (i + 1 < loads.len()).then(|| (l + loads[i + 1], i));
            for (joined, cut) in left.into_iter().chain(right) {
                if joined <= GRID_FILL && best.is_none_or(|b| joined < b.0) {
                    best = Some((joined, cut));
                }
            }
        }
        let Some((_, cut)) = best else {
            break;
        };
        cuts.remove(cut);
    }
    cuts
}

/// Whether every piece `cuts` makes carries at most [`GRID_FILL`], or is one
/// indivisible segment and nothing else.
pub(super) fn fits(segments: &[HashSpan], cuts: &[u64]) -> bool {
    let total = segments.last().map_or(0.0, |s| s.cum_after);
    let slack = 1e-9 * total.max(1.0);
    let mut lo = segments.first().map_or(0, |s| s.lo);
    let mut before = 0.0;
    let ends = cuts.iter().copied().chain(segments.last().map(|s| s.hi));
    for hi in ends {
        let through = load_up_to(segments, hi);
        let load = through - before;
        if load > GRID_FILL + slack {
            let block = segments
                .iter()
                .filter(|s| s.point && s.lo >= lo && s.hi <= hi)
                .map(|s| s.mass)
                .fold(0.0, f64::max);
            if load - block > slack.max(1e-6 * load) {
                return false;
            }
        }
        before = through;
        lo = hi.wrapping_add(1);
    }
    true
}
