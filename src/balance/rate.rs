//! Append rates of one partition as EWMAs over several windows.
//!
//! The append path calls [`RateTracker::record`], which only adds to two
//! pending counters and compares one timestamp; at most once per tick
//! (default 100 ms) the pending amounts are folded into every window's
//! continuous-time EWMA:
//!
//! ```text
//! keep = exp(-dt / window)
//! rate = rate * keep + (1 - keep) * (pending / dt)
//! ```
//!
//! Because the update uses the real elapsed `dt`, irregular ticks and idle
//! gaps are handled exactly: a gap of `dt` with nothing pending decays the
//! rate by `exp(-dt / window)`. [`RateTracker::rates`] applies the same
//! formula on the fly up to `now` without mutating, so a reader sees the
//! decay through an idle period even if no append ever folds it.
//!
//! Rates are persisted as a [`RateSnapshot`] so a restart resumes with what
//! it knew (Pravega forgot its rates on restart, issue #2786).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration_nanos;

/// The default EWMA windows: 1 s (reacts to bursts), 10 s, 60 s (sustained).
pub const DEFAULT_WINDOWS: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(10),
    Duration::from_secs(60),
];

/// Default minimum interval between folds of the pending counters.
const DEFAULT_TICK_NANOS: u64 = 100_000_000;

/// Windows shorter than this are clamped to it: a zero window would divide
/// by zero, and anything below a millisecond is noise at our tick rate.
const MIN_WINDOW_NANOS: u64 = 1_000_000;

const NANOS_PER_SEC: f64 = 1e9;

/// The rate over one EWMA window at some moment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WindowRate {
    /// The EWMA window (time constant).
    pub window: Duration,
    /// Smoothed bytes per second.
    pub bytes_per_sec: f64,
    /// Smoothed records per second.
    pub records_per_sec: f64,
    /// How much history the rate is computed from: the tracker's age when
    /// it is younger than the window (the rate is then corrected for the
    /// missing history, see [`RateTracker::rates`]), `Duration::MAX` for a
    /// tracker with full history (restored, or seeded from a parent).
    pub history: Duration,
}

/// One window of a [`RateSnapshot`], in plain serializable fields.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WindowRateSnapshot {
    /// The EWMA window in milliseconds.
    pub window_millis: u64,
    /// Smoothed bytes per second when the snapshot was taken.
    pub bytes_per_sec: f64,
    /// Smoothed records per second when the snapshot was taken.
    pub records_per_sec: f64,
}

/// The persistent form of a [`RateTracker`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RateSnapshot {
    /// One entry per window, shortest first.
    pub windows: Vec<WindowRateSnapshot>,
}

impl RateSnapshot {
    /// The snapshot as it would read after `elapsed` more time without any
    /// appends: for a restore when the downtime is known (e.g. from
    /// wall-clock timestamps in the manifest).
    pub fn decayed(&self, elapsed: Duration) -> RateSnapshot {
        let elapsed_nanos = duration_nanos(elapsed);
        let windows = self
            .windows
            .iter()
            .map(|w| {
                let window_nanos = w.window_millis.saturating_mul(1_000_000);
                let ewma = Ewma::new(window_nanos, w.bytes_per_sec, w.records_per_sec);
                let e = ewma.advanced(elapsed_nanos, 0, 0);
                WindowRateSnapshot {
                    window_millis: w.window_millis,
                    bytes_per_sec: e.bytes_per_sec,
                    records_per_sec: e.records_per_sec,
                }
            })
            .collect();
        RateSnapshot { windows }
    }
}

/// One window's EWMA state, current as of the tracker's last fold.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ewma {
    window_nanos: u64,
    bytes_per_sec: f64,
    records_per_sec: f64,
}

/// A rate read from outside (a snapshot, a scale factor) as a usable
/// value: NaN, infinite and negative rates become 0.
fn sanitize(rate: f64) -> f64 {
    if rate.is_finite() && rate > 0.0 {
        rate
    } else {
        0.0
    }
}

impl Ewma {
    fn new(window_nanos: u64, bytes_per_sec: f64, records_per_sec: f64) -> Ewma {
        Ewma {
            window_nanos: window_nanos.max(MIN_WINDOW_NANOS),
            bytes_per_sec: sanitize(bytes_per_sec),
            records_per_sec: sanitize(records_per_sec),
        }
    }

    /// The state after `elapsed_nanos` more nanoseconds during which
    /// `records` and `bytes` arrived.
    fn advanced(&self, elapsed_nanos: u64, records: u64, bytes: u64) -> Ewma {
        if elapsed_nanos == 0 {
            return *self;
        }
        let x = elapsed_nanos as f64 / self.window_nanos as f64;
        let keep = (-x).exp();
        // 1 - exp(-x), precise when dt is tiny against the window.
        let gain = -(-x).exp_m1();
        let secs = elapsed_nanos as f64 / NANOS_PER_SEC;
        Ewma {
            window_nanos: self.window_nanos,
            bytes_per_sec: self.bytes_per_sec * keep + gain * (bytes as f64 / secs),
            records_per_sec: self.records_per_sec * keep + gain * (records as f64 / secs),
        }
    }

    /// The rate, divided by `1 - exp(-age / window)` when the tracker is
    /// only `age` old (`None`: full history): an EWMA started at zero
    /// reaches `(1 - exp(-age / window))` of a constant rate after `age`,
    /// so the division makes a young tracker's long windows say what the
    /// load is instead of lagging a minute behind it.
    fn window_rate(&self, age_nanos: Option<u64>) -> WindowRate {
        let window = Duration::from_nanos(self.window_nanos);
        let Some(age) = age_nanos else {
            return WindowRate {
                window,
                bytes_per_sec: self.bytes_per_sec,
                records_per_sec: self.records_per_sec,
                history: Duration::MAX,
            };
        };
        let seen = -(-(age as f64) / self.window_nanos as f64).exp_m1();
        let correct = |r: f64| if seen > 0.0 { r / seen } else { 0.0 };
        WindowRate {
            window,
            bytes_per_sec: correct(self.bytes_per_sec),
            records_per_sec: correct(self.records_per_sec),
            history: Duration::from_nanos(age),
        }
    }
}

/// Bytes/s and records/s of one partition over several EWMA windows.
///
/// Not internally synchronized: it lives next to the partition's writer,
/// under the same lock as the append it measures.
#[derive(Debug, Clone, PartialEq)]
pub struct RateTracker {
    /// Shortest window first.
    ewmas: Vec<Ewma>,
    tick_nanos: u64,
    /// The moment the EWMAs are current for; pending amounts arrived after.
    folded_nanos: u64,
    pending_records: u64,
    pending_bytes: u64,
    /// When the tracker started from nothing; `None` when it carries full
    /// history (restored from a snapshot).
    born_nanos: Option<u64>,
}

impl RateTracker {
    /// A tracker with zero rates over `windows` (sorted, duplicates dropped,
    /// each clamped to at least 1 ms; an empty list means
    /// [`DEFAULT_WINDOWS`], since a tracker without windows would silently
    /// measure nothing).
    pub fn new(windows: &[Duration], now_nanos: u64) -> RateTracker {
        Self::with_tick(windows, Duration::from_nanos(DEFAULT_TICK_NANOS), now_nanos)
    }

    /// Like [`RateTracker::new`] with a custom fold interval (`tick`,
    /// clamped to at least 1 ns). A longer tick makes `record` cheaper on
    /// average; rates read by [`RateTracker::rates`] are exact either way.
    pub fn with_tick(windows: &[Duration], tick: Duration, now_nanos: u64) -> RateTracker {
        let windows = if windows.is_empty() {
            &DEFAULT_WINDOWS[..]
        } else {
            windows
        };
        let mut window_nanos: Vec<u64> = windows
            .iter()
            .map(|w| duration_nanos(*w).max(MIN_WINDOW_NANOS))
            .collect();
        window_nanos.sort_unstable();
        window_nanos.dedup();
        RateTracker {
            ewmas: window_nanos
                .into_iter()
                .map(|w| Ewma::new(w, 0.0, 0.0))
                .collect(),
            tick_nanos: duration_nanos(tick).max(1),
            folded_nanos: now_nanos,
            pending_records: 0,
            pending_bytes: 0,
            born_nanos: Some(now_nanos),
        }
    }

    /// Counts `records` records totalling `bytes` bytes appended at
    /// `now_nanos`. Cheap: two saturating adds and one comparison, except
    /// once per tick when the pending amounts are folded into the EWMAs.
    /// A `now_nanos` earlier than the last fold is treated as equal to it.
    #[inline]
    pub fn record(&mut self, now_nanos: u64, records: u64, bytes: u64) {
        self.pending_records = self.pending_records.saturating_add(records);
        self.pending_bytes = self.pending_bytes.saturating_add(bytes);
        if now_nanos.saturating_sub(self.folded_nanos) >= self.tick_nanos {
            self.fold(now_nanos);
        }
    }

    /// Folds the pending amounts into the EWMAs now, regardless of the tick.
    /// Never needed for correctness (see [`RateTracker::rates`]); useful
    /// before a snapshot is compared byte for byte.
    pub fn fold(&mut self, now_nanos: u64) {
        let elapsed = now_nanos.saturating_sub(self.folded_nanos);
        if elapsed == 0 {
            return;
        }
        for ewma in &mut self.ewmas {
            *ewma = ewma.advanced(elapsed, self.pending_records, self.pending_bytes);
        }
        self.pending_records = 0;
        self.pending_bytes = 0;
        self.folded_nanos = now_nanos;
    }

    /// The rates at `now_nanos`, shortest window first, including pending
    /// amounts and the decay through any idle time since the last fold.
    /// Does not mutate: it computes what a fold at `now_nanos` would give.
    /// A tracker younger than a window reports that window's rate corrected
    /// for the history it lacks (see [`WindowRate::history`]).
    pub fn rates(&self, now_nanos: u64) -> Vec<WindowRate> {
        let elapsed = now_nanos.saturating_sub(self.folded_nanos);
        let age = self
            .born_nanos
            .map(|b| now_nanos.max(self.folded_nanos).saturating_sub(b));
        self.ewmas
            .iter()
            .map(|e| {
                e.advanced(elapsed, self.pending_records, self.pending_bytes)
                    .window_rate(age)
            })
            .collect()
    }

    /// The windows tracked, shortest first.
    #[allow(dead_code, reason = "introspection for unit tests and tools")]
    pub fn windows(&self) -> Vec<Duration> {
        self.ewmas
            .iter()
            .map(|e| Duration::from_nanos(e.window_nanos))
            .collect()
    }

    /// The persistent form of the rates at `now_nanos`.
    pub fn snapshot(&self, now_nanos: u64) -> RateSnapshot {
        // The corrected rates: a restored tracker has full history, so it
        // must get what this one believes, not its raw young EWMAs.
        let windows = self
            .rates(now_nanos)
            .into_iter()
            .map(|r| WindowRateSnapshot {
                window_millis: crate::duration::duration_millis(r.window),
                bytes_per_sec: r.bytes_per_sec,
                records_per_sec: r.records_per_sec,
            })
            .collect();
        RateSnapshot { windows }
    }

    /// A tracker resuming from `snapshot` at `now_nanos`. Invalid values are
    /// repaired rather than rejected: NaN, infinite or negative rates become
    /// 0, a zero window becomes 1 ms, duplicate windows keep the first, and
    /// an empty snapshot gives [`DEFAULT_WINDOWS`] with zero rates.
    pub fn restore(snapshot: &RateSnapshot, now_nanos: u64) -> RateTracker {
        let mut tracker = RateTracker::new(&[], now_nanos);
        if snapshot.windows.is_empty() {
            return tracker;
        }
        let mut ewmas: Vec<Ewma> = snapshot
            .windows
            .iter()
            .map(|w| {
                let nanos = w.window_millis.saturating_mul(1_000_000);
                Ewma::new(nanos, w.bytes_per_sec, w.records_per_sec)
            })
            .collect();
        ewmas.sort_by_key(|e| e.window_nanos);
        ewmas.dedup_by_key(|e| e.window_nanos);
        tracker.ewmas = ewmas;
        tracker.born_nanos = None;
        tracker
    }

    /// A new tracker whose rates are this one's times `factor` (NaN or
    /// negative factors count as 0): seeds the children of a split with
    /// their share of the parent's load, so they don't start out "cold".
    pub fn scaled(&self, factor: f64, now_nanos: u64) -> RateTracker {
        let factor = sanitize(factor);
        let mut out = self.clone();
        out.fold(now_nanos);
        for e in &mut out.ewmas {
            e.bytes_per_sec *= factor;
            e.records_per_sec *= factor;
        }
        out
    }

    /// A new tracker with this one's windows whose rates are the sum of both
    /// trackers' rates for the same window (a window `other` lacks adds
    /// nothing): seeds the child of a merge.
    pub fn merged(&self, other: &RateTracker, now_nanos: u64) -> RateTracker {
        let mut out = self.clone();
        out.fold(now_nanos);
        // The older history of the two (full history wins); both trackers'
        // corrected rates are summed and expressed on that history.
        out.born_nanos = match (self.born_nanos, other.born_nanos) {
            (Some(a), Some(b)) => Some(a.min(b)),
            _ => None,
        };
        let age = out.born_nanos.map(|b| now_nanos.saturating_sub(b));
        let theirs = other.rates(now_nanos);
        for (e, mine) in out.ewmas.iter_mut().zip(self.rates(now_nanos)) {
            let seen = age.map_or(1.0, |a| -(-(a as f64) / e.window_nanos as f64).exp_m1());
            let (mut bytes, mut records) = (mine.bytes_per_sec, mine.records_per_sec);
            if let Some(t) = theirs.iter().find(|t| t.window == mine.window) {
                bytes += t.bytes_per_sec;
                records += t.records_per_sec;
            }
            e.bytes_per_sec = bytes * seen;
            e.records_per_sec = records * seen;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::{Clock, ManualClock};

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000_000_000;

    /// Appends `bytes_per_sec` in 10 ms steps for `secs` seconds.
    fn feed(t: &mut RateTracker, clock: &ManualClock, secs: u64, bytes_per_sec: u64) {
        for _ in 0..secs * 100 {
            clock.advance(Duration::from_millis(10));
            // 100-byte records: records/s = bytes/s / 100.
            t.record(
                clock.now_nanos(),
                bytes_per_sec / 10_000,
                bytes_per_sec / 100,
            );
        }
    }

    fn assert_close(actual: f64, expected: f64, rel: f64, what: &str) {
        let err = (actual - expected).abs();
        assert!(
            err <= rel * expected.abs().max(1e-9),
            "{what}: {actual} vs expected {expected}"
        );
    }

    #[test]
    fn constant_rate_converges_in_every_window() {
        let clock = ManualClock::new(1_000 * SEC);
        let mut t = RateTracker::new(&DEFAULT_WINDOWS, clock.now_nanos());
        feed(&mut t, &clock, 600, 1_000_000);
        let rates = t.rates(clock.now_nanos());
        assert_eq!(rates.len(), 3);
        for r in &rates {
            assert_close(r.bytes_per_sec, 1e6, 0.01, "bytes/s");
            assert_close(r.records_per_sec, 1e4, 0.01, "records/s");
        }
    }

    #[test]
    fn short_window_reacts_before_long_window() {
        let clock = ManualClock::new(0);
        let mut t = RateTracker::new(&DEFAULT_WINDOWS, 0);
        feed(&mut t, &clock, 5, 1_000_000);
        let r = t.rates(clock.now_nanos());
        assert!(r[0].bytes_per_sec > 0.98e6, "1 s window: {:?}", r[0]);
        // The raw 60 s EWMA is 1 - exp(-5/60) ~ 0.08 of the way ...
        assert_close(
            t.ewmas[2].bytes_per_sec,
            1e6 * (1.0 - (-5.0f64 / 60.0).exp()),
            0.03,
            "60 s",
        );
        let raw = t.snapshot(clock.now_nanos());
        // ... and the tracker, 5 s old, corrects for the history it lacks.
        assert_close(r[2].bytes_per_sec, 1e6, 0.03, "60 s corrected");
        assert_eq!(r[2].history, Duration::from_secs(5));
        // A restored tracker has full history and resumes with what this
        // one believes.
        let restored = RateTracker::restore(&raw, 0);
        assert_eq!(restored.rates(0)[2].history, Duration::MAX);
        assert_close(restored.rates(0)[2].bytes_per_sec, 1e6, 0.03, "restored");
    }

    #[test]
    fn idle_decays_without_mutation() {
        let clock = ManualClock::new(0);
        let mut t = RateTracker::new(&DEFAULT_WINDOWS, 0);
        feed(&mut t, &clock, 600, 1_000_000);
        let before = t.clone();
        let later = clock.now_nanos() + 10 * SEC;
        let r = t.rates(later);
        assert_eq!(t, before, "rates() must not mutate");
        assert_close(r[0].bytes_per_sec, 1e6 * (-10.0f64).exp(), 0.05, "1 s");
        assert_close(r[1].bytes_per_sec, 1e6 * (-1.0f64).exp(), 0.02, "10 s");
        assert_close(
            r[2].bytes_per_sec,
            1e6 * (-10.0f64 / 60.0).exp(),
            0.02,
            "60 s",
        );
        // Folding at the same instant gives the same answer as the view.
        t.fold(later);
        assert_eq!(t.rates(later), r);
    }

    #[test]
    fn record_folds_at_most_once_per_tick() {
        let mut t = RateTracker::new(&[Duration::from_secs(1)], 0);
        t.record(MS, 1, 100);
        t.record(2 * MS, 1, 100);
        assert_eq!(t.pending_bytes, 200, "no fold before the tick");
        t.record(100 * MS, 1, 100);
        assert_eq!(t.pending_bytes, 0);
        assert_eq!(t.folded_nanos, 100 * MS);
    }

    #[test]
    fn snapshot_restore_round_trips() {
        let clock = ManualClock::new(0);
        let mut t = RateTracker::new(&DEFAULT_WINDOWS, 0);
        feed(&mut t, &clock, 30, 500_000);
        let snap = t.snapshot(clock.now_nanos());
        // A restarted process has a new monotonic origin.
        let restored = RateTracker::restore(&snap, 7);
        assert_eq!(restored.snapshot(7), snap);
        assert_eq!(restored.windows(), DEFAULT_WINDOWS.to_vec());
        let r = restored.rates(7);
        assert_close(r[0].bytes_per_sec, 500_000.0, 0.01, "restored 1 s");
    }

    #[test]
    fn snapshot_decayed_matches_idle_tracker() {
        let clock = ManualClock::new(0);
        let mut t = RateTracker::new(&DEFAULT_WINDOWS, 0);
        feed(&mut t, &clock, 30, 500_000);
        let now = clock.now_nanos();
        // With full history (a young tracker's correction changes as it ages).
        let t = RateTracker::restore(&t.snapshot(now), now);
        let snap = t.snapshot(now).decayed(Duration::from_secs(20));
        let idle = t.snapshot(now + 20 * SEC);
        for (a, b) in snap.windows.iter().zip(&idle.windows) {
            assert_close(a.bytes_per_sec, b.bytes_per_sec, 1e-9, "decayed");
        }
    }

    #[test]
    fn restore_repairs_garbage() {
        let snap = RateSnapshot {
            windows: vec![
                WindowRateSnapshot {
                    window_millis: 0,
                    bytes_per_sec: f64::NAN,
                    records_per_sec: -5.0,
                },
                WindowRateSnapshot {
                    window_millis: 0,
                    bytes_per_sec: f64::INFINITY,
                    records_per_sec: 1.0,
                },
            ],
        };
        let t = RateTracker::restore(&snap, 0);
        let r = t.rates(SEC);
        assert_eq!(r.len(), 1, "duplicate windows collapse");
        assert_eq!(r[0].window, Duration::from_millis(1));
        assert!(r[0].bytes_per_sec == 0.0 && r[0].records_per_sec == 0.0);
        let empty = RateTracker::restore(&RateSnapshot::default(), 0);
        assert_eq!(empty.windows(), DEFAULT_WINDOWS.to_vec());
    }

    #[test]
    fn time_going_backwards_is_clamped() {
        let mut t = RateTracker::new(&[Duration::ZERO, Duration::from_secs(1)], 10 * SEC);
        t.record(SEC, 10, 1_000); // before creation
        t.record(0, u64::MAX, u64::MAX);
        t.record(u64::MAX, 1, 1);
        for r in t.rates(0).into_iter().chain(t.rates(u64::MAX)) {
            assert!(
                r.bytes_per_sec.is_finite() && r.bytes_per_sec >= 0.0,
                "{r:?}"
            );
            assert!(r.records_per_sec.is_finite() && r.records_per_sec >= 0.0);
        }
    }

    #[test]
    fn scaled_and_merged_seed_children() {
        let clock = ManualClock::new(0);
        let mut t = RateTracker::new(&DEFAULT_WINDOWS, 0);
        feed(&mut t, &clock, 600, 1_000_000);
        let now = clock.now_nanos();
        let child = t.scaled(0.25, now);
        assert_close(child.rates(now)[2].bytes_per_sec, 250_000.0, 0.01, "scaled");
        assert_eq!(t.scaled(f64::NAN, now).rates(now)[0].bytes_per_sec, 0.0);
        let both = child.merged(&t.scaled(0.5, now), now);
        assert_close(both.rates(now)[1].bytes_per_sec, 750_000.0, 0.01, "merged");
        let other = RateTracker::new(&[Duration::from_secs(3)], now);
        assert_eq!(child.merged(&other, now).rates(now), child.rates(now));
    }
}
