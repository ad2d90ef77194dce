//! Where to cut a partition into pieces of about equal load.
//!
//! Pure arithmetic over a [`super::LoadMap`]'s load laid out as segments in
//! hash order: uniform stretches (the untracked rest of a histogram bucket)
//! and points (keys the heavy-hitter sketch tracks, which no cut may
//! divide: a key's records stay in one partition, in order).

/// Up to `pieces - 1` strictly increasing cuts (each the last hash of a
/// piece) over `segments`: as few pieces as `pieces` can make keep the
/// largest piece smallest (at least an equal share, at least the heaviest
/// key), and within that each piece aims at an equal share of what is
/// left. Empty when there is no load.
pub(super) fn cut_points(segments: &[HashSpan], pieces: usize) -> Vec<u64> {
    let sum = segments.last().map_or(0.0, |s| s.cum_after);
    if pieces < 2 || !(sum.is_finite() && sum > 0.0) {
        return Vec::new();
    }
    let heaviest = segments
        .iter()
        .filter(|s| s.point)
        .map(|s| s.mass)
        .fold(0.0, f64::max);
    // Bisection on the largest piece: greedy filling is optimal for "how
    // many pieces of at most L", so the smallest feasible L is found.
    let (mut lo, mut hi) = ((sum / pieces as f64).max(heaviest), sum);
    if greedy_cuts(segments, lo).len() >= pieces {
        for _ in 0..48 {
            let mid = (lo + hi) / 2.0;
            if greedy_cuts(segments, mid).len() < pieces {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        lo = hi;
    }
    let cap = lo * (1.0 + 1e-9);
    let mut out: Vec<u64> = Vec::new();
    for m in balanced_cuts(segments, pieces, cap) {
        if out.last().is_none_or(|&l| m > l) {
            out.push(m);
        }
    }
    out.truncate(pieces - 1);
    // Aiming at equal shares can place early cuts so that a heavy key and
    // what follows it end up together over the cap; the greedy fill never
    // does (its pieces are just less even).
    if largest_piece(segments, &out) > cap * (1.0 + 1e-6) {
        out = greedy_cuts(segments, cap);
        out.truncate(pieces - 1);
    }
    out
}

/// The load of the largest piece that `cuts` make.
pub(super) fn largest_piece(segments: &[HashSpan], cuts: &[u64]) -> f64 {
    let sum = segments.last().map_or(0.0, |s| s.cum_after);
    let mut largest: f64 = 0.0;
    let mut before = 0.0;
    for &m in cuts {
        let upto = load_up_to(segments, m);
        largest = largest.max(upto - before);
        before = upto;
    }
    largest.max(sum - before)
}

/// The load on hashes `<= m`.
pub(super) fn load_up_to(segments: &[HashSpan], m: u64) -> f64 {
    let mut total = 0.0;
    for s in segments {
        if s.hi <= m {
            total += s.mass;
        } else if s.lo <= m {
            let width = (u128::from(s.hi - s.lo) + 1) as f64;
            total += s.mass * (u128::from(m - s.lo) + 1) as f64 / width;
        } else {
            break;
        }
    }
    total
}

/// A stretch of a load map's range with its load, in hash order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HashSpan {
    /// First hash.
    pub lo: u64,
    /// Last hash.
    pub hi: u64,
    /// Decayed load on it.
    pub mass: f64,
    /// One tracked key (`lo == hi`), which a cut cannot divide.
    pub point: bool,
    /// Load of every span up to and including this one.
    pub cum_after: f64,
}

/// Cuts (each the last hash of a piece) that fill pieces from the left up to
/// `limit` each: a tracked key is never divided (a piece ends before it if
/// it would not fit), a uniform stretch is cut where the piece is full.
fn greedy_cuts(segments: &[HashSpan], limit: f64) -> Vec<u64> {
    let mut cuts = Vec::new();
    let mut acc = 0.0;
    for s in segments {
        if s.point {
            if acc > 0.0 && acc + s.mass > limit {
                cuts.push(s.lo.wrapping_sub(1));
                acc = 0.0;
            }
            acc += s.mass;
            continue;
        }
        let width = (u128::from(s.hi - s.lo) + 1) as f64;
        let per_value = s.mass / width;
        let mut from = 0.0; // values of this segment already placed
        let mut left = s.mass;
        while acc + left > limit && per_value > 0.0 {
            // Whole values that still fit the current piece; at least one
            // when the piece is empty (a value heavier than the limit
            // cannot be divided).
            let mut values = ((limit - acc).max(0.0) / per_value).floor();
            if values < 1.0 && acc == 0.0 {
                values = 1.0;
            }
            let at = from + values;
            if at >= width {
                break;
            }
            // The piece ends before value `at`: at the previous segment's
            // end when no value of this one fits.
            if at > 0.0 || s.lo > 0 {
                cuts.push(value_before(s.lo, at));
            }
            from = at;
            left = per_value * (width - from);
            acc = 0.0;
        }
        acc += left;
    }
    cuts
}

/// The hash just before value `at` (counted from 0) of a segment starting
/// at `lo`: the last hash of a piece that ends there.
fn value_before(lo: u64, at: f64) -> u64 {
    let at = at as u128; // f64 -> u128 saturates; `at` is below 2^64 here
    u64::try_from((u128::from(lo) + at).saturating_sub(1)).unwrap_or(u64::MAX)
}

/// `pieces - 1` cuts that make pieces of about equal load, none above
/// `cap`: each piece aims at an equal share of what is left, a tracked key
/// goes to the piece whose end it brings closer to that aim (never past
/// `cap`), a uniform stretch is cut at the aim. The last piece takes the
/// rest.
fn balanced_cuts(segments: &[HashSpan], pieces: usize, cap: f64) -> Vec<u64> {
    let total = segments.last().map_or(0.0, |s| s.cum_after);
    let mut cuts: Vec<u64> = Vec::new();
    let mut done = 0.0;
    let mut acc = 0.0;
    let aim = |done: f64, made: usize| ((total - done) / (pieces - made) as f64).min(cap);
    for s in segments {
        if cuts.len() + 1 >= pieces {
            break;
        }
        if s.point {
            let g = aim(done, cuts.len());
            if acc > 0.0 && (acc + s.mass > cap || acc + s.mass - g > g - acc) {
                cuts.push(s.lo.wrapping_sub(1));
                done += acc;
                acc = 0.0;
            }
            acc += s.mass;
            continue;
        }
        let width = (u128::from(s.hi - s.lo) + 1) as f64;
        let per_value = s.mass / width;
        let mut from = 0.0;
        let mut left = s.mass;
        while cuts.len() + 1 < pieces && per_value > 0.0 {
            let g = aim(done, cuts.len());
            if acc + left <= g {
                break;
            }
            let mut values = ((g - acc).max(0.0) / per_value).round();
            if values < 1.0 && acc == 0.0 {
                values = 1.0;
            }
            let at = from + values;
            if at >= width {
                break;
            }
            if at > 0.0 || s.lo > 0 {
                cuts.push(value_before(s.lo, at));
            }
            done += acc + per_value * (at - from);
            acc = 0.0;
            from = at;
            left = per_value * (width - from);
        }
        acc += left;
    }
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Segments from (lo, hi, mass, point) in order.
    fn segments(parts: &[(u64, u64, f64, bool)]) -> Vec<HashSpan> {
        let mut cum = 0.0;
        parts
            .iter()
            .map(|&(lo, hi, mass, point)| {
                cum += mass;
                HashSpan {
                    lo,
                    hi,
                    mass,
                    point,
                    cum_after: cum,
                }
            })
            .collect()
    }

    #[test]
    fn uniform_load_is_cut_into_equal_pieces() {
        let segs = segments(&[(0, 999, 100.0, false)]);
        assert_eq!(cut_points(&segs, 4), vec![249, 499, 749]);
        assert!(cut_points(&segs, 1).is_empty());
        assert!(cut_points(&[], 4).is_empty());
    }

    #[test]
    fn a_heavy_key_gets_a_piece_and_the_rest_is_shared_evenly() {
        // 40 uniform, a key of 40 at 500, 20 uniform after it.
        let segs = segments(&[
            (0, 499, 40.0, false),
            (500, 500, 40.0, true),
            (501, 999, 20.0, false),
        ]);
        // Three pieces: [0, 499] 40, the key 40, [501, 999] 20.
        assert_eq!(cut_points(&segs, 3), vec![499, 500]);
        // Two pieces: the largest is at least 60 either way; the key goes
        // with the side that keeps the pieces closest to even.
        let two = cut_points(&segs, 2);
        assert_eq!(two.len(), 1);
        assert!(two[0] == 499 || two[0] == 500, "{two:?}");
        // Never a piece above what the best cut into k pieces achieves.
        for k in 2..8 {
            let cuts = cut_points(&segs, k);
            assert!(cuts.windows(2).all(|w| w[0] < w[1]), "{cuts:?}");
            let best = if k == 2 { 60.0 } else { 40.0 };
            let largest = largest_piece(&segs, &cuts);
            assert!(largest <= best + 1e-6, "{k} pieces: {cuts:?} -> {largest}");
        }
    }
}
