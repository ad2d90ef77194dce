//! The lane arithmetic of hot-key modes (docs/HOT_KEYS.md): a key's lane
//! points on the hash ring, the window of a timestamp and the lane of a
//! window. Pure: the append path and the key reader compute lanes with the
//! same functions, so a record is read from the lane it was written to.

use crate::config::HotKeyMode;
use crate::format::manifest::HotKeyEra;

/// The lane points of a key over `k` lanes: its hash, then `k - 1` points
/// spaced evenly around the hash ring, so the lanes fall into as many
/// different partitions as the topology allows.
pub(crate) fn lane_points(hash: u64, k: u32) -> Vec<u64> {
    (0..u128::from(k))
        .map(|j| (u128::from(hash) + j * (1u128 << 64) / u128::from(k)) as u64)
        .collect()
}

/// The window of a timestamp, for a window length in ms.
pub(crate) fn window_of(ts: i64, window_ms: i64) -> i64 {
    ts.div_euclid(window_ms)
}

pub(crate) fn window_ms(era: &HotKeyEra) -> Option<i64> {
    match era.mode {
        HotKeyMode::Windowed(d) => Some(duration_ms(d)),
        _ => None,
    }
}

/// The lane of window `w` in a windowed era.
pub(crate) fn lane_of_window(era: &HotKeyEra, w: i64) -> usize {
    let wm = window_ms(era).expect("a windowed era");
    lane_after(w, window_of(era.from_ms, wm), era.lanes.len())
}

/// `(w - first) mod lanes`. Record timestamps may be anywhere in `i64`
/// (the caller's), so the difference wraps: the lane written and the lane
/// read are computed by this one function, and builds with and without
/// overflow checks agree.
pub(crate) fn lane_after(w: i64, first: i64, lanes: usize) -> usize {
    w.wrapping_sub(first).rem_euclid(lanes as i64) as usize
}

/// A window length in ms as routing uses it: saturated to `i64::MAX`, at
/// least 1.
pub(crate) fn duration_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn windowed(window: Duration, lanes: usize, from_ms: i64) -> HotKeyEra {
        HotKeyEra {
            mode: HotKeyMode::Windowed(window),
            lanes: (0..lanes as u64).collect(),
            from_ms,
            starts: Vec::new(),
        }
    }

    #[test]
    fn lane_points_start_at_the_key_hash_and_spread_evenly_around_the_ring() {
        assert_eq!(lane_points(5, 1), vec![5]);
        assert_eq!(lane_points(0, 4), vec![0, 1 << 62, 1 << 63, 3 << 62]);
        // Wrapping past u64::MAX.
        assert_eq!(lane_points(u64::MAX, 2), vec![u64::MAX, (1 << 63) - 1]);
    }

    #[test]
    fn window_of_rounds_towards_minus_infinity() {
        assert_eq!(window_of(0, 100), 0);
        assert_eq!(window_of(99, 100), 0);
        assert_eq!(window_of(100, 100), 1);
        assert_eq!(window_of(-1, 100), -1);
    }

    #[test]
    fn windows_rotate_over_the_lanes_from_the_era_s_first_window() {
        let era = windowed(Duration::from_millis(100), 3, 1_050);
        assert_eq!(window_ms(&era), Some(100));
        // The era's first window (10) is lane 0, then 1, 2, 0, ...
        assert_eq!(lane_of_window(&era, 10), 0);
        assert_eq!(lane_of_window(&era, 11), 1);
        assert_eq!(lane_of_window(&era, 13), 0);
        // Earlier windows rotate backwards.
        assert_eq!(lane_of_window(&era, 9), 2);
        // Far-apart windows wrap instead of overflowing.
        assert!(lane_of_window(&era, i64::MIN) < 3);
        assert!(lane_of_window(&era, i64::MAX) < 3);
    }

    #[test]
    fn only_a_windowed_era_has_a_window_length() {
        let mut era = windowed(Duration::from_millis(100), 1, 0);
        era.mode = HotKeyMode::Strict;
        assert_eq!(window_ms(&era), None);
        assert_eq!(duration_ms(Duration::ZERO), 1);
        assert_eq!(duration_ms(Duration::MAX), i64::MAX);
    }
}
