//! Key-range arithmetic of splits: the ranges of a new topic's
//! partitions, of a split's children and the children's records. Pure:
//! what a split plan needs from the partition's recent load is read before
//! (see [`LoadCuts`]), so the same inputs always give the same ranges.

use crate::error::{Error, Result};
use crate::format::manifest::{PartitionRecord, PartitionState};

/// How to split a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitPlan {
    /// Children `[start, at]` and `[at + 1, end]`.
    At(u64),
    /// At the middle of the range.
    Even,
    /// At the load-weighted median of recent appends (falls back to Even).
    LoadMedian,
    /// Into this many children (2–16) of about equal recent load (falls
    /// back to LoadMedian when the load is too concentrated).
    LoadQuantiles(u8),
    /// Isolate the hash value of a key into `[h, h]`, remainder on each side.
    IsolateHash(u64),
    /// At these points, each the last hash of a child (1 to 7 points,
    /// strictly increasing, each inside `[start, end)`).
    Cuts(crate::balance::CutPoints),
}

/// What a split plan needs from the partition's recent load, read by the
/// caller from the partition's load map before the pure step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LoadCuts {
    /// The load-weighted median (for `LoadMedian`, and for
    /// `LoadQuantiles` when the load is too concentrated).
    pub median: Option<u64>,
    /// The quantile points for `LoadQuantiles(k)` (empty for other plans).
    pub quantiles: Vec<u64>,
}

/// Splits `[0, u64::MAX]` into `n` near-equal ranges.
pub(crate) fn even_ranges(n: u32) -> Vec<(u64, u64)> {
    let total = 1u128 << 64;
    (0..n)
        .map(|i| {
            let s = total * i as u128 / n as u128;
            let e = total * (i as u128 + 1) / n as u128 - 1;
            (s as u64, e as u64)
        })
        .collect()
}

/// The records of the children of a split of `partition`: ids and hash
/// ranges pairwise, active, created at `created` (ms since the epoch).
pub(crate) fn child_records(
    partition: u32,
    ids: &[u32],
    ranges: &[(u64, u64)],
    created: i64,
) -> Vec<PartitionRecord> {
    ids.iter()
        .zip(ranges)
        .map(|(&id, &(start, end))| PartitionRecord {
            id,
            start,
            end,
            parents: vec![partition],
            state: PartitionState::Active,
            created_ms: created,
            removed_parents: Vec::new(),
        })
        .collect()
}

/// Children ranges for a split plan of `[start, end]`, given what the
/// partition's recent load says ([`LoadCuts`]).
pub(crate) fn split_ranges(
    start: u64,
    end: u64,
    plan: SplitPlan,
    load: &LoadCuts,
) -> Result<Vec<(u64, u64)>> {
    if start == end {
        return Err(Error::Refused(
            "a partition of a single hash value cannot be split (it carries one hot key)".into(),
        ));
    }
    let mid = start + (end - start) / 2;
    let at = match plan {
        SplitPlan::At(at) => at,
        SplitPlan::Even => mid,
        SplitPlan::LoadMedian => load.median.unwrap_or(mid),
        SplitPlan::LoadQuantiles(k) => {
            if !(2..=16).contains(&k) {
                return Err(Error::Refused(format!(
                    "a split makes 2 to 16 children, not {k}"
                )));
            }
            if load.quantiles.len() < 2 {
                load.median.unwrap_or(mid)
            } else {
                return Ok(cut_at(start, end, &load.quantiles));
            }
        }
        SplitPlan::Cuts(points) => {
            let points = points.points();
            if points.is_empty() || points.iter().any(|&c| c < start || c >= end) {
                return Err(Error::Refused(format!(
                    "split points {points:x?} are not all inside [{start:#x}, {end:#x})"
                )));
            }
            return Ok(cut_at(start, end, points));
        }
        SplitPlan::IsolateHash(h) => return isolate_hash(start, end, h),
    };
    if at < start || at >= end {
        return Err(Error::Refused(format!(
            "split point {at:#x} is not inside [{start:#x}, {end:#x})"
        )));
    }
    Ok(vec![(start, at), (at + 1, end)])
}

/// `[start, end]` cut after each of the ascending `points` (each inside
/// `[start, end)`).
fn cut_at(start: u64, end: u64, points: &[u64]) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(points.len() + 1);
    let mut lo = start;
    for &c in points {
        out.push((lo, c));
        lo = c + 1;
    }
    out.push((lo, end));
    out
}

/// `[start, end]` split so that hash `h` is a range of its own.
fn isolate_hash(start: u64, end: u64, h: u64) -> Result<Vec<(u64, u64)>> {
    if h < start || h > end {
        return Err(Error::Refused(format!(
            "hash {h:#x} is outside the partition's range"
        )));
    }
    let mut v = Vec::new();
    if h > start {
        v.push((start, h - 1));
    }
    v.push((h, h));
    if h < end {
        v.push((h + 1, end));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::CutPoints;

    /// The ranges are contiguous, in order, and cover exactly `[start, end]`.
    fn assert_tiles(ranges: &[(u64, u64)], start: u64, end: u64) {
        assert_eq!(ranges.first().map(|r| r.0), Some(start), "{ranges:x?}");
        assert_eq!(ranges.last().map(|r| r.1), Some(end), "{ranges:x?}");
        for w in ranges.windows(2) {
            assert!(w[0].0 <= w[0].1, "{ranges:x?}");
            assert_eq!(w[0].1.checked_add(1), Some(w[1].0), "{ranges:x?}");
        }
    }

    #[test]
    fn even_ranges_tile_the_whole_hash_space_for_any_count() {
        for n in [1, 2, 3, 7, 16, 1000] {
            let r = even_ranges(n);
            assert_eq!(r.len(), n as usize);
            assert_tiles(&r, 0, u64::MAX);
        }
    }

    #[test]
    fn child_records_pair_ids_with_ranges_as_active_children_of_the_parent() {
        let recs = child_records(4, &[9, 10], &[(0, 5), (6, 9)], 1234);
        assert_eq!(recs.len(), 2);
        assert_eq!((recs[0].id, recs[0].start, recs[0].end), (9, 0, 5));
        assert_eq!((recs[1].id, recs[1].start, recs[1].end), (10, 6, 9));
        for r in &recs {
            assert_eq!(r.parents, vec![4]);
            assert_eq!(r.state, PartitionState::Active);
            assert_eq!(r.created_ms, 1234);
            assert!(r.removed_parents.is_empty());
        }
    }

    #[test]
    fn every_plan_that_succeeds_tiles_the_parent_range() {
        let (s, e) = (100u64, 1_000u64);
        let load = LoadCuts {
            median: Some(300),
            quantiles: vec![200, 400, 800],
        };
        let plans = [
            SplitPlan::At(500),
            SplitPlan::Even,
            SplitPlan::LoadMedian,
            SplitPlan::LoadQuantiles(4),
            SplitPlan::IsolateHash(100),
            SplitPlan::IsolateHash(555),
            SplitPlan::IsolateHash(1_000),
            SplitPlan::Cuts(CutPoints::new(&[150, 600]).unwrap()),
        ];
        for plan in plans {
            let r = split_ranges(s, e, plan, &load).unwrap();
            assert!(r.len() >= 2, "{plan:?}: {r:?}");
            assert_tiles(&r, s, e);
        }
    }

    #[test]
    fn load_plans_cut_where_the_load_says_and_fall_back_to_the_middle() {
        let load = LoadCuts {
            median: Some(300),
            quantiles: Vec::new(),
        };
        assert_eq!(
            split_ranges(0, 999, SplitPlan::LoadMedian, &load).unwrap(),
            vec![(0, 300), (301, 999)]
        );
        // Too few quantile points: the median.
        assert_eq!(
            split_ranges(0, 999, SplitPlan::LoadQuantiles(3), &load).unwrap(),
            vec![(0, 300), (301, 999)]
        );
        // No load at all: the middle.
        assert_eq!(
            split_ranges(0, 999, SplitPlan::LoadMedian, &LoadCuts::default()).unwrap(),
            vec![(0, 499), (500, 999)]
        );
    }

    #[test]
    fn isolating_a_hash_gives_it_a_one_value_range() {
        let r = split_ranges(0, 10, SplitPlan::IsolateHash(4), &LoadCuts::default()).unwrap();
        assert_eq!(r, vec![(0, 3), (4, 4), (5, 10)]);
        let r = split_ranges(0, 10, SplitPlan::IsolateHash(0), &LoadCuts::default()).unwrap();
        assert_eq!(r, vec![(0, 0), (1, 10)]);
    }

    #[test]
    fn plans_outside_the_range_or_of_a_one_value_range_are_refused() {
        let none = LoadCuts::default();
        let refused =
            |s, e, plan| matches!(split_ranges(s, e, plan, &none), Err(Error::Refused(_)));
        assert!(refused(5, 5, SplitPlan::Even));
        assert!(refused(0, 10, SplitPlan::At(10)));
        assert!(refused(0, 10, SplitPlan::At(11)));
        assert!(refused(5, 10, SplitPlan::At(4)));
        assert!(refused(0, 10, SplitPlan::IsolateHash(11)));
        assert!(refused(0, 10, SplitPlan::LoadQuantiles(1)));
        assert!(refused(0, 10, SplitPlan::LoadQuantiles(17)));
        let cuts = CutPoints::new(&[20]).unwrap();
        assert!(refused(0, 10, SplitPlan::Cuts(cuts)));
    }
}
