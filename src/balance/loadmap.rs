//! Where inside a partition's hash range the load lands.
//!
//! Two decayed summaries of the sampled appends of one partition owning the
//! inclusive hash range `[start, end]`:
//!
//! - a histogram of equal-width buckets over the range, from which
//!   [`LoadMap::split_point`] takes the load-weighted median, so a split
//!   cuts where the load is, not in the middle of the range;
//! - a Space-Saving top-k sketch (Metwally et al. 2005) of key hashes
//!   weighted by bytes, from which [`LoadMap::hot_key`] finds a single key
//!   carrying most of the load (such a key can only be helped by isolating
//!   it into a one-value partition `[h, h]`).
//!
//! Decay: every weight is multiplied by `2^(-dt / half_life)` lazily, at
//! most once per tick (100 ms) when a sample arrives. Split point and hot-key
//! share are ratios, so they don't depend on when the last decay happened;
//! only the absolute [`LoadMap::total_load`] does.
//!
//! Sampling: recording every append would cost a u128 division and a scan
//! of k counters. [`LoadMap::observe`] records a pseudo-random 1 in
//! `sample_every` appends (default 16), each weighted by `sample_every`, so
//! totals stay unbiased. Random rather than every N-th call because a
//! producer cycling through keys with a period dividing N would alias: one
//! key would be sampled every time and look like 100 % of the load. The
//! generator is a xorshift seeded from the range, so runs are reproducible.
//!
//! Low rates: while the map holds fewer than [`DENSE_SAMPLES`] decayed
//! samples, every append is recorded (weight 1): at a few records per
//! second, 1 in 16 would leave the map with one or two samples, and the
//! latest would carry most of the decayed weight (a key written once looked
//! like more than half of the load). Mixing the two rates stays unbiased:
//! each sample is weighted by the inverse of the probability it was taken
//! with. A key also needs [`MIN_HOT_KEY_SAMPLES`] decayed samples of its own
//! before [`LoadMap::hot_key`] names it: a share computed from one sample
//! is not evidence.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::cuts::{cut_points, HashSpan};
use super::duration_nanos;

/// Weights below this total are dropped entirely after a decay: the
/// partition has been idle for many half-lives and old samples would only
/// steer a future split with stale information.
const NEGLIGIBLE_TOTAL: f64 = 1e-9;

/// Below this many decayed samples the map records every append (see the
/// module notes): at the default 10 s half-life that is about 70 appends/s,
/// so sampling 1 in `sample_every` only starts above that rate, and load
/// quantiles of a partition at a few dozen records/s come from ~1,000
/// samples (with 256, the stationary-load test of `tests/balance.rs` once
/// left a piece over target that split again minutes after converging).
pub(crate) const DENSE_SAMPLES: f64 = 1024.0;

/// Decayed samples of its own a key needs before it can be a hot key.
pub(crate) const MIN_HOT_KEY_SAMPLES: f64 = 8.0;

/// Tunables of a [`LoadMap`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadMapConfig {
    /// Histogram buckets (default 64; clamped to 1..=4096, and to the width
    /// of the range so each bucket holds at least one hash value).
    pub buckets: usize,
    /// Counters of the Space-Saving sketch (default 16; at least 1).
    pub top_k: usize,
    /// Decay half-life (default 10 s; at least 1 ms).
    pub half_life: Duration,
    /// [`LoadMap::observe`] records one in this many appends (default 16;
    /// at least 1).
    pub sample_every: u32,
    /// Minimum interval between two decays (default 100 ms).
    pub tick: Duration,
}

impl Default for LoadMapConfig {
    fn default() -> Self {
        LoadMapConfig {
            buckets: 64,
            top_k: 16,
            half_life: Duration::from_secs(10),
            sample_every: 16,
            tick: Duration::from_millis(100),
        }
    }
}

/// A key hash carrying a large share of a partition's load.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HotKey {
    /// The key hash.
    pub hash: u64,
    /// A lower bound on its share of the partition's load, in `[0, 1]`.
    pub share: f64,
}

/// One Space-Saving counter: `weight` overestimates the key's true weight
/// by at most `error` (the weight of the counter it evicted); `samples` is
/// the decayed number of samples of this key itself (inherited ones don't
/// count).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counter {
    hash: u64,
    weight: f64,
    error: f64,
    samples: f64,
}

/// Decayed load distribution over one partition's hash range.
#[derive(Debug, Clone)]
pub struct LoadMap {
    start: u64,
    end: u64,
    /// The histogram's bucket count (`buckets` is empty until the first
    /// load arrives, then holds this many).
    n_buckets: usize,
    /// Empty while nothing was recorded or absorbed: a partition that
    /// takes no appends (every sealed one, and an idle active one) holds
    /// no histogram.
    buckets: Vec<f64>,
    /// Grows to `top_k` as keys arrive.
    counters: Vec<Counter>,
    top_k: usize,
    total: f64,
    /// Decayed number of samples recorded (not weighted by bytes).
    samples: f64,
    half_life_nanos: u64,
    tick_nanos: u64,
    /// The moment the stored weights are expressed at.
    decayed_nanos: u64,
    sample_every: u32,
    /// `should_sample` fires when the generator is at most this.
    sample_threshold: u64,
    rng: u64,
}

impl LoadMap {
    /// An empty map for the inclusive range `[start, end]` with the default
    /// [`LoadMapConfig`]. A reversed range is swapped rather than rejected.
    pub fn new(start: u64, end: u64, now_nanos: u64) -> LoadMap {
        Self::with_config(start, end, &LoadMapConfig::default(), now_nanos)
    }

    /// An empty map for `[start, end]` with `config` (clamped as documented
    /// on its fields).
    pub fn with_config(start: u64, end: u64, config: &LoadMapConfig, now_nanos: u64) -> LoadMap {
        let (start, end) = if start <= end {
            (start, end)
        } else {
            (end, start)
        };
        let width = u128::from(end - start) + 1;
        let buckets = (config.buckets.clamp(1, 4096) as u128).min(width) as usize;
        let sample_every = config.sample_every.max(1);
        // splitmix64 of the range: reproducible, different per partition.
        let mut seed = (start ^ end.rotate_left(32)).wrapping_add(0x9E37_79B9_7F4A_7C15);
        seed = (seed ^ (seed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        seed = (seed ^ (seed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        LoadMap {
            start,
            end,
            n_buckets: buckets,
            buckets: Vec::new(),
            counters: Vec::new(),
            top_k: config.top_k.max(1),
            total: 0.0,
            samples: 0.0,
            half_life_nanos: duration_nanos(config.half_life).max(1_000_000),
            tick_nanos: duration_nanos(config.tick).max(1),
            decayed_nanos: now_nanos,
            sample_every,
            sample_threshold: u64::MAX / u64::from(sample_every),
            rng: (seed ^ (seed >> 31)) | 1,
        }
    }

    /// The inclusive hash range this map covers.
    #[allow(dead_code, reason = "introspection for unit tests and tools")]
    pub fn range(&self) -> (u64, u64) {
        (self.start, self.end)
    }

    /// True for a pseudo-random one in `sample_every` calls (always true
    /// when `sample_every` is 1). About a nanosecond: one xorshift step.
    #[inline]
    pub fn should_sample(&mut self) -> bool {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x <= self.sample_threshold
    }

    /// The append-path entry point: samples one in `sample_every` appends
    /// and records the sampled ones with weight `bytes * sample_every`, or
    /// every append with weight `bytes` while the map holds fewer than
    /// [`DENSE_SAMPLES`] decayed samples (low rates).
    #[inline]
    pub fn observe(&mut self, now_nanos: u64, key_hash: u64, bytes: u64) {
        if self.samples < DENSE_SAMPLES {
            self.record(now_nanos, key_hash, bytes);
        } else if self.should_sample() {
            let weight = bytes.saturating_mul(u64::from(self.sample_every));
            self.record(now_nanos, key_hash, weight);
        }
    }

    /// Records `bytes` of load (at least 1: a record always costs its
    /// framing) on `key_hash` at `now_nanos`, unsampled. A hash outside the
    /// range is clamped into it (the caller routed it wrongly; counting it
    /// at the edge is better than a panic).
    pub fn record(&mut self, now_nanos: u64, key_hash: u64, bytes: u64) {
        self.decay_to(now_nanos);
        let hash = key_hash.clamp(self.start, self.end);
        let weight = bytes.max(1) as f64;
        self.allocate();
        let bucket = self.bucket_of(hash);
        self.buckets[bucket] += weight;
        self.total += weight;
        self.samples += 1.0;
        self.count_key(hash, weight);
    }

    /// The decayed total weight as of the last recorded sample.
    #[allow(dead_code, reason = "introspection for unit tests and tools")]
    pub fn total_load(&self) -> f64 {
        self.total
    }

    /// The decayed total weight as of `now_nanos` (no later than the last
    /// sample counts as the last sample's time).
    #[allow(dead_code, reason = "introspection for unit tests and tools")]
    pub fn total_load_at(&self, now_nanos: u64) -> f64 {
        self.total * self.decay_factor(now_nanos.saturating_sub(self.decayed_nanos))
    }

    /// The load-weighted median `m` with `start <= m < end`: children
    /// `[start, m]` and `[m + 1, end]` would each carry about half the load.
    /// Within the median bucket the load is assumed uniform. `None` for a
    /// single-value range or when nothing was recorded.
    pub fn split_point(&self) -> Option<u64> {
        if self.start == self.end {
            return None;
        }
        let sum: f64 = self.buckets.iter().sum();
        if !(sum.is_finite() && sum > 0.0) {
            return None;
        }
        let half = sum / 2.0;
        let mut before = 0.0;
        for (i, &w) in self.buckets.iter().enumerate() {
            if w > 0.0 && before + w >= half {
                let fraction = ((half - before) / w).clamp(0.0, 1.0);
                return Some(self.point_in_bucket(i, fraction));
            }
            before += w;
        }
        // Only reachable through rounding: the last loaded bucket is median.
        let last = self.buckets.iter().rposition(|&w| w > 0.0)?;
        Some(self.point_in_bucket(last, 1.0))
    }

    /// Cut points dividing the load into `pieces` parts of about equal load:
    /// up to `pieces - 1` strictly increasing points `m` with
    /// `start <= m < end`, each the last hash of a part. Fewer (possibly
    /// none) when the load is too concentrated to cut that finely.
    ///
    /// Keys the sketch tracks are point masses at their hash (a cut never
    /// splits a key: it goes just before or just after it, whichever is
    /// closer to the goal); the rest of each bucket is uniform over it.
    /// Under a skewed (Zipf) load a bucket can hold a key carrying more
    /// than a whole piece, and a cut placed as if that load were spread
    /// over the bucket would leave one child with the key and most of the
    /// bucket's remainder.
    pub fn quantile_points(&self, pieces: usize) -> Vec<u64> {
        if self.start == self.end || pieces < 2 || self.is_empty() {
            return Vec::new();
        }
        let segments = self.segments();
        cut_points(&segments, pieces)
            .into_iter()
            .filter(|&m| m >= self.start && m < self.end)
            .collect()
    }

    /// The load as consecutive segments over the range, in hash order:
    /// each tracked key a point segment with its guaranteed weight, each
    /// stretch of a bucket between keys a uniform segment with its share of
    /// the bucket's remaining weight. Empty when nothing was recorded: the
    /// balancer lays the profiles of all partitions side by side to cut
    /// the topic as a whole (see `balance::decide`).
    pub(crate) fn profile(&self) -> Vec<HashSpan> {
        if self.is_empty() {
            return Vec::new();
        }
        self.segments()
    }

    /// See [`LoadMap::profile`].
    fn segments(&self) -> Vec<HashSpan> {
        let mut keys: Vec<(u64, f64)> = self
            .counters
            .iter()
            .map(|c| (c.hash, (c.weight - c.error).max(0.0)))
            .collect();
        keys.sort_by_key(|k| k.0);
        let mut out = Vec::with_capacity(self.n_buckets + 2 * keys.len());
        let mut cum = 0.0;
        let mut push = |lo: u64, hi: u64, mass: f64, point: bool, out: &mut Vec<HashSpan>| {
            cum += mass;
            out.push(HashSpan {
                lo,
                hi,
                mass,
                point,
                cum_after: cum,
            });
        };
        let mut k = 0;
        for (i, &w) in self.buckets.iter().enumerate() {
            let lo = self.start + self.bucket_lo(i) as u64;
            let hi = self.start + (self.bucket_lo(i + 1) - 1) as u64;
            let first = k;
            while k < keys.len() && keys[k].0 <= hi {
                k += 1;
            }
            let inside = &keys[first..k];
            let width = (u128::from(hi - lo) + 1) as f64;
            let spread = (w - inside.iter().map(|k| k.1).sum::<f64>()).max(0.0);
            let mut from = lo;
            for &(h, mass) in inside {
                if h > from {
                    let part = (u128::from(h - from)) as f64 / width;
                    push(from, h - 1, spread * part, false, &mut out);
                }
                push(h, h, mass, true, &mut out);
                from = h.saturating_add(1);
                if h == u64::MAX {
                    break;
                }
            }
            if inside.last().is_some_and(|l| l.0 == u64::MAX) {
                continue; // the key ends the range
            }
            if from <= hi {
                let part = (u128::from(hi - from) + 1) as f64 / width;
                push(from, hi, spread * part, false, &mut out);
            }
        }
        out
    }

    /// Whether nothing was recorded (or it all decayed away): the map
    /// knows nothing about where the load lands.
    pub fn is_empty(&self) -> bool {
        !(self.total.is_finite() && self.total > 0.0)
    }

    /// The key with the largest guaranteed share of the load, if that share
    /// exceeds `min_share`. The guaranteed weight of a Space-Saving counter
    /// is `weight - error`: a key that merely inherited an evicted
    /// counter's weight is not reported. Only keys with at least
    /// [`MIN_HOT_KEY_SAMPLES`] decayed samples of their own count: under
    /// decay, the latest sample of a key written once can carry most of
    /// the weight of a map fed at a few records per second.
    pub fn hot_key(&self, min_share: f64) -> Option<HotKey> {
        if self.is_empty() {
            return None;
        }
        let best = self
            .counters
            .iter()
            .filter(|c| c.samples >= MIN_HOT_KEY_SAMPLES)
            .max_by(|a, b| (a.weight - a.error).total_cmp(&(b.weight - b.error)))?;
        let share = ((best.weight - best.error) / self.total).clamp(0.0, 1.0);
        (share > min_share).then_some(HotKey {
            hash: best.hash,
            share,
        })
    }

    /// The estimated share of the load on hashes in `[lo, hi]` (clipped to
    /// the range), assuming uniform load within each bucket: seeds the rates
    /// of split children. 0 when nothing was recorded.
    #[allow(dead_code, reason = "for seeding split children; not wired in yet")]
    pub fn load_share(&self, lo: u64, hi: u64) -> f64 {
        let sum: f64 = self.buckets.iter().sum();
        if !(sum.is_finite() && sum > 0.0) || lo > hi || hi < self.start || lo > self.end {
            return 0.0;
        }
        let lo_off = u128::from(lo.max(self.start) - self.start);
        let hi_off = u128::from(hi.min(self.end) - self.start) + 1; // exclusive
        let mut inside = 0.0;
        for (i, &w) in self.buckets.iter().enumerate() {
            let (b_lo, b_hi) = (self.bucket_lo(i), self.bucket_lo(i + 1));
            let overlap = b_hi.min(hi_off).saturating_sub(b_lo.max(lo_off));
            if overlap > 0 {
                inside += w * (overlap as f64 / (b_hi - b_lo) as f64);
            }
        }
        (inside / sum).clamp(0.0, 1.0)
    }

    /// The decayed weight (as of the last decay) on hashes in `[lo, hi]`.
    /// Keys the sketch tracks count as points at their hash with their
    /// guaranteed weight; the rest of each bucket is taken as uniform over
    /// it. A one-value range `[h, h]` of a hot key therefore gets the key's
    /// weight, not a bucket's sliver.
    fn load_in(&self, lo: u64, hi: u64) -> f64 {
        if self.is_empty() || lo > hi || hi < self.start || lo > self.end {
            return 0.0;
        }
        let (lo, hi) = (lo.max(self.start), hi.min(self.end));
        let mut points = vec![0.0; self.n_buckets];
        let mut inside = 0.0;
        for c in &self.counters {
            let guaranteed = (c.weight - c.error).max(0.0);
            points[self.bucket_of(c.hash)] += guaranteed;
            if (lo..=hi).contains(&c.hash) {
                inside += guaranteed;
            }
        }
        let lo_off = u128::from(lo - self.start);
        let hi_off = u128::from(hi - self.start) + 1; // exclusive
        for (i, (&w, &p)) in self.buckets.iter().zip(&points).enumerate() {
            let (b_lo, b_hi) = (self.bucket_lo(i), self.bucket_lo(i + 1));
            let overlap = b_hi.min(hi_off).saturating_sub(b_lo.max(lo_off));
            if overlap > 0 {
                inside += (w - p).max(0.0) * (overlap as f64 / (b_hi - b_lo) as f64);
            }
        }
        inside
    }

    /// The share of the load on `[lo, hi]` by [`LoadMap::load_in`]: what a
    /// child of a split over that range inherits. `None` for an empty map.
    pub fn child_share(&self, lo: u64, hi: u64) -> Option<f64> {
        (!self.is_empty()).then(|| (self.load_in(lo, hi) / self.total).clamp(0.0, 1.0))
    }

    /// Adds what `other` knows about the hashes this map covers, decayed to
    /// this map's time: seeds the child of a split (from its parent) or a
    /// merge (from both parents), so the child neither starts blind nor
    /// looks cold. Bucket loads are re-binned (uniform within a bucket),
    /// tracked keys are carried over with their weights and samples.
    pub fn absorb(&mut self, other: &LoadMap) {
        if other.is_empty() || other.end < self.start || other.start > self.end {
            return;
        }
        // Both maps expressed at the later of their two times.
        let now = self.decayed_nanos.max(other.decayed_nanos);
        let mine = self.decay_factor(now - self.decayed_nanos);
        self.scale(mine);
        self.decayed_nanos = now;
        let factor = other.decay_factor(now - other.decayed_nanos);
        let before = self.total;
        self.allocate();
        for i in 0..self.n_buckets {
            let lo = self.start + (self.bucket_lo(i) as u64);
            let hi = self.start + (self.bucket_lo(i + 1) - 1) as u64;
            let w = other.load_in(lo, hi) * factor;
            self.buckets[i] += w;
            self.total += w;
        }
        let covered = other.child_share(self.start, self.end).unwrap_or(0.0);
        self.samples += other.samples * covered * factor;
        for c in &other.counters {
            if !(self.start..=self.end).contains(&c.hash) {
                continue;
            }
            let moved = Counter {
                hash: c.hash,
                weight: c.weight * factor,
                error: c.error * factor,
                samples: c.samples * factor,
            };
            if let Some(mine) = self.counters.iter_mut().find(|m| m.hash == c.hash) {
                mine.weight += moved.weight;
                mine.error += moved.error;
                mine.samples += moved.samples;
            } else if self.counters.len() < self.top_k {
                self.counters.push(moved);
            } else if let Some(min) = self
                .counters
                .iter_mut()
                .min_by(|a, b| a.weight.total_cmp(&b.weight))
                .filter(|m| m.weight < moved.weight)
            {
                let floor = min.weight;
                *min = Counter {
                    weight: moved.weight + floor,
                    error: moved.error + floor,
                    ..moved
                };
            }
        }
        if !(self.total.is_finite() && self.total >= before) {
            // Only reachable with absurd weights; start over rather than
            // carry a NaN into every later decision.
            self.scale(0.0);
        }
    }

    /// Multiplies every weight and count by `factor` (0 empties the map).
    fn scale(&mut self, factor: f64) {
        self.total *= factor;
        self.samples *= factor;
        if self.total.is_nan() || self.total <= NEGLIGIBLE_TOTAL {
            self.total = 0.0;
            self.samples = 0.0;
            self.buckets.iter_mut().for_each(|w| *w = 0.0);
            self.counters.clear();
            return;
        }
        self.buckets.iter_mut().for_each(|w| *w *= factor);
        for c in &mut self.counters {
            c.weight *= factor;
            c.error *= factor;
            c.samples *= factor;
        }
    }

    /// `2^(-elapsed / half_life)`.
    fn decay_factor(&self, elapsed_nanos: u64) -> f64 {
        (-(elapsed_nanos as f64) / self.half_life_nanos as f64).exp2()
    }

    /// Applies the decay up to `now_nanos` if a tick has passed.
    fn decay_to(&mut self, now_nanos: u64) {
        let elapsed = now_nanos.saturating_sub(self.decayed_nanos);
        if elapsed < self.tick_nanos {
            return;
        }
        self.decayed_nanos = now_nanos;
        self.scale(self.decay_factor(elapsed));
    }

    /// Space-Saving update: bump the key's counter, else take a free one,
    /// else evict the smallest and inherit its weight as error.
    fn count_key(&mut self, hash: u64, weight: f64) {
        if let Some(c) = self.counters.iter_mut().find(|c| c.hash == hash) {
            c.weight += weight;
            c.samples += 1.0;
            return;
        }
        if self.counters.len() < self.top_k {
            self.counters.push(Counter {
                hash,
                weight,
                error: 0.0,
                samples: 1.0,
            });
            return;
        }
        if let Some(min) = self
            .counters
            .iter_mut()
            .min_by(|a, b| a.weight.total_cmp(&b.weight))
        {
            let floor = min.weight;
            *min = Counter {
                hash,
                weight: floor + weight,
                error: floor,
                samples: 1.0,
            };
        }
    }

    /// Makes room for load: the histogram's buckets, allocated at the first
    /// load that arrives.
    fn allocate(&mut self) {
        if self.buckets.is_empty() {
            self.buckets = vec![0.0; self.n_buckets];
        }
    }

    /// Width of the range as a count of hash values (up to 2^64).
    fn width(&self) -> u128 {
        u128::from(self.end - self.start) + 1
    }

    /// The bucket of `hash`, which must lie in the range: bucket
    /// `floor(offset * n / width)`. Integer arithmetic on u128, so the full
    /// range `[0, u64::MAX]` (width 2^64) needs no special case.
    fn bucket_of(&self, hash: u64) -> usize {
        let n = self.n_buckets as u128;
        let offset = u128::from(hash - self.start);
        let bucket = offset * n / self.width();
        (bucket as usize).min(self.n_buckets - 1)
    }

    /// The first offset of bucket `i` (`i == n` gives the width): the
    /// smallest offset `o` with `o * n >= i * width`.
    fn bucket_lo(&self, i: usize) -> u128 {
        let n = self.n_buckets as u128;
        (i as u128 * self.width()).div_ceil(n)
    }

    /// The hash `m` such that `[start, m]` takes all buckets before `i` and
    /// `fraction` of bucket `i`, clamped to `start <= m < end`.
    fn point_in_bucket(&self, i: usize, fraction: f64) -> u64 {
        let (lo, hi) = (self.bucket_lo(i), self.bucket_lo(i + 1));
        let size = hi - lo;
        // f64 -> u128 saturates and maps NaN to 0; the clamp bounds the rest.
        let take = ((fraction * size as f64).round() as u128).min(size);
        // The left child's last offset is lo + take - 1.
        let last_offset = (lo + take).saturating_sub(1);
        let m = u128::from(self.start) + last_offset;
        let m = u64::try_from(m).unwrap_or(self.end);
        m.min(self.end.saturating_sub(1)).max(self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::{Clock, ManualClock};

    const SEC: u64 = 1_000_000_000;

    /// splitmix64: deterministic pseudo-random hashes for the tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn in_range(&mut self, lo: u64, hi: u64) -> u64 {
            let width = u128::from(hi - lo) + 1;
            lo + ((u128::from(self.next()) * width) >> 64) as u64
        }
    }

    fn unsampled() -> LoadMapConfig {
        LoadMapConfig {
            sample_every: 1,
            ..LoadMapConfig::default()
        }
    }

    /// A map that never saw load (a sealed partition's, an idle one's)
    /// holds no histogram or counters; the first load allocates them and
    /// the map then answers as one allocated up front would.
    #[test]
    fn a_map_allocates_its_histogram_at_the_first_load_and_answers_the_same() {
        let mut lazy = LoadMap::with_config(0, u64::MAX, &unsampled(), 0);
        assert_eq!((lazy.buckets.capacity(), lazy.counters.capacity()), (0, 0));
        assert_eq!(lazy.split_point(), None);
        assert_eq!(lazy.child_share(0, u64::MAX / 2), None);
        assert!(lazy.profile().is_empty());
        let mut seeded = LoadMap::with_config(0, u64::MAX, &unsampled(), 0);
        seeded.absorb(&lazy);
        assert_eq!(seeded.buckets.capacity(), 0, "an empty map seeds nothing");
        let mut rng = Rng(7);
        for i in 0..1_000 {
            lazy.record(i, rng.next() / 4, 100);
        }
        assert_eq!(lazy.buckets.len(), 64);
        let m = lazy.split_point().expect("a median of recorded load");
        assert!(m < u64::MAX / 4 + u64::MAX / 64, "{m}");
        seeded.absorb(&lazy);
        assert_eq!(seeded.buckets.len(), 64);
        let share = seeded.child_share(0, u64::MAX / 4).unwrap();
        assert!(share > 0.95, "{share}");
    }

    /// Every question to a map that never saw load, over ranges of one
    /// value, a few and the whole space, answers "nothing known" without
    /// a panic; absorbing a map with nothing on this range allocates
    /// nothing; load that decays away leaves a map answering the same.
    #[test]
    fn a_map_that_never_saw_load_answers_nothing_known_everywhere() {
        for (start, end) in [(5, 5), (10, 12), (0, u64::MAX), (u64::MAX - 3, u64::MAX)] {
            let what = format!("[{start}, {end}]");
            let mut m = LoadMap::with_config(start, end, &unsampled(), 0);
            let ask = |m: &LoadMap, what: &str| {
                assert_eq!(m.split_point(), None, "{what}");
                assert!(m.quantile_points(4).is_empty(), "{what}");
                assert!(m.profile().is_empty(), "{what}");
                assert!(m.hot_key(0.0).is_none(), "{what}");
                assert_eq!(m.load_share(start, end), 0.0, "{what}");
                assert_eq!(m.child_share(start, end), None, "{what}");
                assert_eq!(m.load_in(start, end), 0.0, "{what}");
                assert!(m.is_empty(), "{what}");
            };
            ask(&m, &what);
            let mut elsewhere = LoadMap::with_config(0, 4, &unsampled(), 0);
            elsewhere.record(0, 2, 100);
            m.absorb(&elsewhere);
            if start > 4 {
                assert_eq!(m.buckets.capacity(), 0, "{what}");
                ask(&m, &format!("{what}, after absorbing another range"));
            }
            m.record(0, start, 100);
            assert!(!m.is_empty(), "{what}");
            assert!(
                m.child_share(start, end).is_some_and(|s| s > 0.99),
                "{what}"
            );
            // Long past every half-life: all of it decays away.
            m.decay_to(u64::MAX / 2);
            ask(&m, &format!("{what}, decayed"));
        }
    }

    fn rel_err(actual: u64, expected: u64) -> f64 {
        (actual as f64 - expected as f64).abs() / expected as f64
    }

    #[test]
    fn uniform_load_splits_near_the_middle() {
        let mut map = LoadMap::with_config(0, u64::MAX, &unsampled(), 0);
        let mut rng = Rng(1);
        for _ in 0..20_000 {
            map.record(0, rng.next(), 100);
        }
        let m = map.split_point().expect("loaded");
        assert!(rel_err(m, 1 << 63) < 0.03, "split at {m:#x}");
        assert!((map.load_share(0, m) - 0.5).abs() < 0.01);
    }

    #[test]
    fn quantile_points_cut_equal_loads() {
        let mut map = LoadMap::with_config(0, u64::MAX, &unsampled(), 0);
        let mut rng = Rng(3);
        for _ in 0..40_000 {
            // Three quarters of the load on the lowest eighth of the space.
            let hash = if rng.next().is_multiple_of(4) {
                rng.next()
            } else {
                rng.in_range(0, (1 << 61) - 1)
            };
            map.record(0, hash, 100);
        }
        let points = map.quantile_points(4);
        assert_eq!(points.len(), 3, "{points:?}");
        let mut lo = 0;
        for &m in points.iter().chain(std::iter::once(&u64::MAX)) {
            let share = map.load_share(lo, m);
            assert!(
                (share - 0.25).abs() < 0.03,
                "piece [{lo:#x}, {m:#x}] carries {share}"
            );
            lo = m.saturating_add(1);
        }
        assert!(points.windows(2).all(|w| w[0] < w[1]));
        // Load inside one bucket is taken as uniform over it (a single hot
        // key is the heavy-hitter sketch's job): points stay in range.
        let mut one = LoadMap::with_config(10, 20, &unsampled(), 0);
        one.record(0, 12, 100);
        let p = one.quantile_points(8);
        assert!(
            p.iter().all(|&m| (10..20).contains(&m)) && p.windows(2).all(|w| w[0] < w[1]),
            "{p:?}"
        );
        assert!(LoadMap::with_config(7, 7, &unsampled(), 0)
            .quantile_points(4)
            .is_empty());
    }

    #[test]
    fn quantile_cuts_go_around_heavy_keys() {
        // Zipf-like: a key with 30 % of the load and one with 15 %, both
        // in the same bucket as a slice of the uniform rest.
        let mut map = LoadMap::with_config(0, u64::MAX, &unsampled(), 0);
        let mut rng = Rng(9);
        let (big, second) = (1u64 << 58, (1u64 << 58) + 1_000);
        for i in 0..20_000 {
            let hash = match i % 20 {
                0..=5 => big,
                6..=8 => second,
                _ => rng.next(),
            };
            map.record(0, hash, 100);
        }
        let points = map.quantile_points(4);
        let mut lo = 0u64;
        let mut shares = Vec::new();
        for &m in points.iter().chain(std::iter::once(&u64::MAX)) {
            shares.push(map.child_share(lo, m).unwrap());
            lo = m.saturating_add(1);
        }
        // No piece far above a quarter: only the 30 % key forces one above.
        for (i, s) in shares.iter().enumerate() {
            assert!(
                *s <= 0.36,
                "piece {i} carries {s}: {shares:?} at {points:x?}"
            );
        }
        assert!(shares.iter().sum::<f64>() > 0.99, "{shares:?}");
    }

    #[test]
    fn skewed_load_splits_where_the_load_is() {
        // 90 % of the load on [0, 2^60), 10 % spread over the rest.
        let mut map = LoadMap::with_config(0, u64::MAX, &unsampled(), 0);
        let mut rng = Rng(2);
        for i in 0..50_000 {
            let hash = if i % 10 == 0 {
                rng.in_range(1 << 60, u64::MAX)
            } else {
                rng.in_range(0, (1 << 60) - 1)
            };
            map.record(0, hash, 100);
        }
        let m = map.split_point().expect("loaded");
        // Half the load: 0.5 / 0.9 of the hot region.
        let ideal = ((1u64 << 60) as f64 * 0.5 / 0.9) as u64;
        assert!(
            rel_err(m, ideal) < 0.05,
            "split at {m:#x}, ideal {ideal:#x}"
        );
    }

    #[test]
    fn split_point_respects_bounds_on_tiny_and_edge_ranges() {
        let mut single = LoadMap::new(7, 7, 0);
        single.record(0, 7, 10);
        assert_eq!(single.split_point(), None, "single value");
        assert_eq!(LoadMap::new(0, u64::MAX, 0).split_point(), None, "no load");
        let cases = [
            (10, 12, 12),
            (10, 12, 10),
            (u64::MAX - 1, u64::MAX, u64::MAX),
            (0, 1, 0),
            (0, u64::MAX, u64::MAX),
            (0, u64::MAX, 0),
            (5, 200, 100),
        ];
        for (start, end, hot) in cases {
            let mut map = LoadMap::with_config(start, end, &unsampled(), 0);
            map.record(0, hot, 1_000);
            map.record(0, start, 1);
            let m = map.split_point().expect("loaded");
            assert!(start <= m && m < end, "[{start}, {end}] hot {hot}: {m}");
        }
        // Two values with equal load: the only possible cut.
        let mut two = LoadMap::with_config(40, 41, &unsampled(), 0);
        two.record(0, 40, 10);
        two.record(0, 41, 10);
        assert_eq!(two.split_point(), Some(40));
    }

    #[test]
    fn dominant_key_is_detected() {
        let mut map = LoadMap::with_config(0, u64::MAX, &unsampled(), 0);
        let mut rng = Rng(3);
        let hot = 0xDEAD_BEEF_u64;
        for i in 0..10_000 {
            let hash = if i % 5 < 3 { hot } else { rng.next() };
            map.record(0, hash, 100);
        }
        let key = map.hot_key(0.5).expect("60 % key");
        assert_eq!(key.hash, hot);
        assert!((key.share - 0.6).abs() < 0.02, "share {}", key.share);
    }

    #[test]
    fn five_percent_key_is_not_hot() {
        let mut map = LoadMap::with_config(0, u64::MAX, &unsampled(), 0);
        let mut rng = Rng(4);
        for i in 0..10_000 {
            let hash = if i % 20 == 0 { 42 } else { rng.next() };
            map.record(0, hash, 100);
        }
        assert_eq!(map.hot_key(0.5), None);
        assert_eq!(map.hot_key(0.1), None);
    }

    #[test]
    fn evicted_weight_is_not_mistaken_for_heat() {
        // All keys distinct: each counter's weight is mostly inherited error;
        // without the `weight - error` guard one would look like 1/k = 6 %.
        let mut map = LoadMap::with_config(0, u64::MAX, &unsampled(), 0);
        let mut rng = Rng(5);
        for _ in 0..10_000 {
            map.record(0, rng.next(), 100);
        }
        assert_eq!(map.hot_key(0.01), None);
    }

    #[test]
    fn decay_follows_the_load() {
        let clock = ManualClock::new(0);
        let mut map = LoadMap::with_config(0, u64::MAX, &unsampled(), 0);
        let mut rng = Rng(6);
        let half = 1u64 << 63;
        for _ in 0..600 {
            clock.advance(Duration::from_millis(100));
            for _ in 0..10 {
                map.record(clock.now_nanos(), rng.in_range(0, half - 1), 100);
            }
        }
        assert!(map.split_point().expect("loaded") < half);
        for _ in 0..600 {
            clock.advance(Duration::from_millis(100));
            for _ in 0..10 {
                map.record(clock.now_nanos(), rng.in_range(half, u64::MAX), 100);
            }
        }
        assert!(
            map.split_point().expect("loaded") >= half,
            "old load decayed"
        );
        let now = clock.now_nanos();
        let ratio = map.total_load_at(now + 10 * SEC) / map.total_load_at(now);
        assert!((ratio - 0.5).abs() < 1e-9, "one half-life halves the load");
        // Long idle: everything decays away on the next sample, and one
        // sample is no evidence of a hot key; a few more are.
        map.record(now + 10_000 * SEC, 3, 1);
        assert_eq!(map.total_load(), 1.0);
        assert_eq!(map.hot_key(0.5), None);
        for _ in 0..MIN_HOT_KEY_SAMPLES as usize {
            map.record(now + 10_000 * SEC, 3, 1);
        }
        assert_eq!(map.hot_key(0.5).map(|k| k.hash), Some(3));
    }

    #[test]
    fn sampling_is_unbiased_and_does_not_alias() {
        let mut map = LoadMap::new(0, u64::MAX, 0);
        let n = 160_000u64;
        for i in 0..n {
            // 16 keys in a round robin: every 16th call is the same key.
            map.observe(0, (i % 16) << 58, 100);
        }
        let expected = (n * 100) as f64;
        let total = map.total_load();
        assert!((total - expected).abs() / expected < 0.05, "total {total}");
        assert_eq!(map.hot_key(0.2), None, "a period-16 key must not alias");
        let samples = (0..1_600).filter(|_| map.should_sample()).count();
        assert!((50..=150).contains(&samples), "{samples} of 1600 sampled");
    }

    #[test]
    fn keys_written_once_at_low_rates_are_not_hot() {
        // One record per second, every key new: with 1-in-16 sampling and a
        // 10 s half-life the latest sample used to carry over half of the
        // decayed weight.
        let clock = ManualClock::new(0);
        let mut map = LoadMap::new(0, u64::MAX, 0);
        let mut rng = Rng(7);
        for _ in 0..600 {
            clock.advance(Duration::from_secs(1));
            map.observe(clock.now_nanos(), rng.next(), 4_096);
            assert_eq!(map.hot_key(0.5), None);
            assert_eq!(map.hot_key(0.05), None);
        }
        // Dense at this rate: about 14 decayed samples, each weighted 1.
        assert!(
            (10.0..20.0).contains(&map.samples),
            "{} samples",
            map.samples
        );
        // The same rate on one key is a hot key once it has the samples.
        let hot = 99u64;
        for _ in 0..30 {
            clock.advance(Duration::from_secs(1));
            map.observe(clock.now_nanos(), hot, 4_096);
        }
        assert_eq!(map.hot_key(0.3).map(|k| k.hash), Some(hot));
    }

    #[test]
    fn odd_inputs_are_clamped_not_panicking() {
        let zero = LoadMapConfig {
            buckets: 0,
            top_k: 0,
            half_life: Duration::ZERO,
            sample_every: 0,
            tick: Duration::ZERO,
        };
        let mut map = LoadMap::with_config(100, 50, &zero, 10);
        assert_eq!(map.range(), (50, 100));
        map.record(5, 0, 0); // before creation, below the range, no bytes
        map.record(u64::MAX, u64::MAX, u64::MAX);
        map.observe(0, 75, 10);
        let m = map.split_point().expect("loaded");
        assert!((50..100).contains(&m));
        assert_eq!(map.hot_key(f64::NAN), None);
        assert!(map.load_share(200, 300) == 0.0 && map.load_share(9, 3) == 0.0);
        assert!(map.total_load_at(0).is_finite());
    }
}
