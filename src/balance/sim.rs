//! Test-only: a tiny simulated topic that feeds [`decide`]'s decisions back
//! into its topology, in simulated time, to check that the whole loop
//! (rates, load maps, policy) converges instead of oscillating.
//!
//! Each partition has a real [`RateTracker`] and [`LoadMap`]; the load is a
//! stationary function over hash space (uniform pieces and single keys).
//! New partitions start with empty trackers, the harder case for stability
//! (a fresh child looks cold in its long windows).

use std::time::Duration;

use super::{
    decide, duration_nanos, BalancePolicy, Decision, LoadMap, LoadMapConfig, PartitionLoad,
    RateTracker, SplitAt, DEFAULT_WINDOWS,
};

const STEP: Duration = Duration::from_millis(250);
const RECORD_BYTES: f64 = 1_000.0;
/// Load-map samples per uniform piece, per partition, per step.
const SAMPLES: u64 = 8;
const MB: f64 = 1_000_000.0;

/// `bytes_per_sec` spread uniformly over the hashes `[lo, hi]`.
#[derive(Debug, Clone, Copy)]
struct Load {
    lo: u64,
    hi: u64,
    bytes_per_sec: f64,
}

/// The part of `l` on `[start, end]`: its hashes and bytes/s.
fn overlap(l: &Load, start: u64, end: u64) -> Option<(u64, u64, f64)> {
    let (lo, hi) = (l.lo.max(start), l.hi.min(end));
    if lo > hi {
        return None;
    }
    let share = (u128::from(hi - lo) + 1) as f64 / (u128::from(l.hi - l.lo) + 1) as f64;
    Some((lo, hi, l.bytes_per_sec * share))
}

fn uniform(lo: u64, hi: u64, bytes_per_sec: f64) -> Load {
    Load {
        lo,
        hi,
        bytes_per_sec,
    }
}

struct Part {
    id: u32,
    start: u64,
    end: u64,
    rates: RateTracker,
    map: LoadMap,
    last_change_nanos: u64,
    hot_key_reported: bool,
    parents: Vec<u32>,
}

struct Sim {
    seed: u64,
    now: u64,
    parts: Vec<Part>,
    next_id: u32,
    policy: BalancePolicy,
    load: Vec<Load>,
    rng: u64,
    /// Every decision applied, with its time.
    log: Vec<(u64, Decision)>,
    max_active: usize,
    /// Load-map samples per uniform piece, per partition, per step.
    samples: u64,
    /// Bytes per record: fewer, larger records make noisier rates.
    record_bytes: f64,
}

impl Sim {
    /// `initial` partitions tiling the hash space evenly.
    fn new(seed: u64, policy: BalancePolicy, load: Vec<Load>, initial: u32) -> Sim {
        let mut sim = Sim {
            seed,
            now: 0,
            parts: Vec::new(),
            next_id: 0,
            policy,
            load,
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            log: Vec::new(),
            max_active: 0,
            samples: SAMPLES,
            record_bytes: RECORD_BYTES,
        };
        let n = u128::from(initial);
        for i in 0..n {
            let start = (i << 64) / n;
            let end = ((i + 1) << 64) / n - 1;
            sim.add(start as u64, end as u64);
        }
        sim.max_active = sim.parts.len();
        sim
    }

    fn add(&mut self, start: u64, end: u64) {
        self.add_from(start, end, Vec::new());
    }

    fn add_from(&mut self, start: u64, end: u64, parents: Vec<u32>) {
        let config = LoadMapConfig {
            sample_every: 1,
            ..LoadMapConfig::default()
        };
        self.parts.push(Part {
            id: self.next_id,
            start,
            end,
            rates: RateTracker::new(&DEFAULT_WINDOWS, self.now),
            map: LoadMap::with_config(start, end, &config, self.now),
            last_change_nanos: self.now,
            hot_key_reported: false,
            parents,
        });
        self.next_id += 1;
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// The exact bytes/s landing on `[start, end]`.
    fn true_load(&self, start: u64, end: u64) -> f64 {
        self.load
            .iter()
            .filter_map(|l| overlap(l, start, end))
            .map(|o| o.2)
            .sum()
    }

    /// One step of appends into partition `i`.
    fn feed(&mut self, i: usize) {
        let secs = STEP.as_secs_f64();
        let (start, end) = (self.parts[i].start, self.parts[i].end);
        let mut samples = Vec::new();
        for l in self.load.clone() {
            let Some((lo, hi, bytes_per_sec)) = overlap(&l, start, end) else {
                continue;
            };
            let n = if lo == hi { 1 } else { self.samples };
            for _ in 0..n {
                let width = u128::from(hi - lo) + 1;
                let hash = lo + ((u128::from(self.next_random()) * width) >> 64) as u64;
                samples.push((hash, bytes_per_sec * secs / n as f64));
            }
        }
        let now = self.now;
        let part = &mut self.parts[i];
        let bytes: f64 = samples.iter().map(|s| s.1).sum();
        for (hash, weight) in samples {
            part.map.record(now, hash, weight as u64);
        }
        part.rates
            .record(now, (bytes / self.record_bytes) as u64, bytes as u64);
    }

    fn step(&mut self) {
        self.now += duration_nanos(STEP);
        for i in 0..self.parts.len() {
            self.feed(i);
        }
        let loads: Vec<PartitionLoad> = self
            .parts
            .iter()
            .map(|p| PartitionLoad {
                id: p.id,
                start: p.start,
                end: p.end,
                rates: p.rates.rates(self.now),
                last_change_nanos: p.last_change_nanos,
                split_point: p.map.split_point(),
                hot_key: p.map.hot_key(0.0),
                hot_key_reported: p.hot_key_reported,
                profile: p.map.profile(),
                parents: p.parents.clone(),
            })
            .collect();
        for decision in decide(&self.policy, self.now, &loads) {
            self.apply(decision);
            self.log.push((self.now, decision));
        }
        self.check_tiling();
        self.max_active = self.max_active.max(self.parts.len());
    }

    fn take(&mut self, id: u32) -> Part {
        let seed = self.seed;
        let i = self.parts.iter().position(|p| p.id == id);
        let i = i.unwrap_or_else(|| panic!("seed {seed}: decision on unknown partition {id}"));
        self.parts.remove(i)
    }

    fn apply(&mut self, decision: Decision) {
        let seed = self.seed;
        match decision {
            Decision::Split { partition, at } => {
                let p = self.take(partition);
                match at {
                    SplitAt::Point(m) => {
                        assert!(p.start <= m && m < p.end, "seed {seed}: bad point {m}");
                        self.add_from(p.start, m, vec![p.id]);
                        self.add_from(m + 1, p.end, vec![p.id]);
                    }
                    SplitAt::Quantiles(k) => {
                        let mut lo = p.start;
                        for m in p.map.quantile_points(usize::from(k)) {
                            assert!(lo <= m && m < p.end, "seed {seed}: bad quantile {m}");
                            self.add_from(lo, m, vec![p.id]);
                            lo = m + 1;
                        }
                        self.add_from(lo, p.end, vec![p.id]);
                    }
                    SplitAt::Cuts(points) => {
                        let mut lo = p.start;
                        for &m in points.points() {
                            assert!(lo <= m && m < p.end, "seed {seed}: bad cut {m}");
                            self.add_from(lo, m, vec![p.id]);
                            lo = m + 1;
                        }
                        self.add_from(lo, p.end, vec![p.id]);
                    }
                    SplitAt::IsolateKey(h) => {
                        assert!(p.start <= h && h <= p.end && p.start < p.end, "seed {seed}");
                        if h > p.start {
                            self.add_from(p.start, h - 1, vec![p.id]);
                        }
                        self.add_from(h, h, vec![p.id]);
                        if h < p.end {
                            self.add_from(h + 1, p.end, vec![p.id]);
                        }
                    }
                }
            }
            Decision::Merge { left, right } => {
                let (l, r) = (self.take(left), self.take(right));
                assert_eq!(
                    l.end.checked_add(1),
                    Some(r.start),
                    "seed {seed}: not adjacent"
                );
                self.add_from(l.start, r.end, vec![l.id, r.id]);
            }
            Decision::HotKey { partition, hash } => {
                let seed = self.seed;
                let p = self.parts.iter_mut().find(|p| p.id == partition);
                let p = p.unwrap_or_else(|| panic!("seed {seed}: unknown {partition}"));
                assert!(p.start == hash && p.end == hash, "seed {seed}: not [h, h]");
                assert!(!p.hot_key_reported, "seed {seed}: reported twice");
                p.hot_key_reported = true;
            }
        }
    }

    /// The active partitions tile `[0, u64::MAX]` exactly.
    fn check_tiling(&mut self) {
        self.parts.sort_by_key(|p| p.start);
        let mut next = Some(0u64);
        for p in &self.parts {
            assert_eq!(Some(p.start), next, "seed {}: gap or overlap", self.seed);
            next = p.end.checked_add(1);
        }
        assert_eq!(next, None, "seed {}: hash space not covered", self.seed);
    }

    /// Runs for `duration` and returns the decisions made meanwhile.
    fn run(&mut self, duration: Duration) -> Vec<(u64, Decision)> {
        let from = self.log.len();
        for _ in 0..duration_nanos(duration) / duration_nanos(STEP) {
            self.step();
        }
        self.log[from..].to_vec()
    }

    fn loads(&self) -> Vec<f64> {
        self.parts
            .iter()
            .map(|p| self.true_load(p.start, p.end))
            .collect()
    }
}

fn policy() -> BalancePolicy {
    BalancePolicy {
        target_bytes_per_sec: Some(MB),
        ..BalancePolicy::default()
    }
}

const MINUTE: Duration = Duration::from_secs(60);

#[test]
fn skewed_load_converges_then_stays_quiet() {
    for seed in [1, 2, 3] {
        // 5 MB/s: 3.75 on the first quarter of hash space, 1.25 on the rest.
        let quarter = (1u64 << 62) - 1;
        let load = vec![
            uniform(0, quarter, 3.75 * MB),
            uniform(quarter + 1, u64::MAX, 1.25 * MB),
        ];
        let mut sim = Sim::new(seed, policy(), load, 1);
        let converging = sim.run(20 * MINUTE);
        assert!(!converging.is_empty(), "seed {seed}: never split");
        let quiet = sim.run(10 * MINUTE);
        assert!(quiet.is_empty(), "seed {seed}: still deciding {quiet:?}");
        let loads = sim.loads();
        assert!((6..=12).contains(&loads.len()), "seed {seed}: {loads:?}");
        for l in &loads {
            assert!(
                (0.3 * MB..=MB).contains(l),
                "seed {seed}: unbalanced {loads:?}"
            );
        }
        // The hot quarter holds most partitions: splits followed the load.
        let in_hot_quarter = sim.parts.iter().filter(|p| p.end <= quarter).count();
        assert!(in_hot_quarter * 2 >= loads.len(), "seed {seed}: {loads:?}");
    }
}

#[test]
fn hot_key_is_isolated_once_then_only_reported() {
    for seed in [4, 5] {
        let h = 0x9E37_79B9_7F4A_7C15_u64;
        let load = vec![uniform(h, h, 3.0 * MB), uniform(0, u64::MAX, 0.4 * MB)];
        let mut sim = Sim::new(seed, policy(), load, 1);
        let log = sim.run(10 * MINUTE);
        let decisions: Vec<Decision> = log.iter().map(|d| d.1).collect();
        let isolate = Decision::Split {
            partition: 0,
            at: SplitAt::IsolateKey(h),
        };
        assert_eq!(decisions.len(), 2, "seed {seed}: {decisions:?}");
        assert_eq!(decisions[0], isolate, "seed {seed}");
        assert!(
            matches!(decisions[1], Decision::HotKey { hash, .. } if hash == h),
            "seed {seed}: {decisions:?}"
        );
        // The cold neighbours of [h, h] are not adjacent: no merge either.
        assert_eq!(sim.parts.len(), 3, "seed {seed}");
        assert!(sim.run(10 * MINUTE).is_empty(), "seed {seed}: scale storm");
    }
}

#[test]
fn load_drop_merges_down_to_min_partitions() {
    for (seed, min_partitions) in [(6, 2), (7, 1)] {
        let policy = BalancePolicy {
            min_partitions,
            ..policy()
        };
        let busy = vec![uniform(0, u64::MAX, 6.0 * MB)];
        let mut sim = Sim::new(seed, policy, busy, 8);
        assert!(
            sim.run(2 * MINUTE).is_empty(),
            "seed {seed}: 0.75 MB/s each is stable"
        );
        sim.load = vec![uniform(0, u64::MAX, 0.4 * MB)];
        let log = sim.run(10 * MINUTE);
        assert!(
            log.iter().all(|d| matches!(d.1, Decision::Merge { .. })),
            "seed {seed}"
        );
        assert_eq!(
            sim.parts.len(),
            min_partitions as usize,
            "seed {seed}: {log:?}"
        );
        assert!(sim.run(10 * MINUTE).is_empty(), "seed {seed}");
    }
}

#[test]
fn max_partitions_is_respected() {
    for (seed, max_partitions) in [(8, 5), (9, 2)] {
        let policy = BalancePolicy {
            max_partitions,
            ..policy()
        };
        let load = vec![uniform(0, u64::MAX, 100.0 * MB)];
        let mut sim = Sim::new(seed, policy, load, 1);
        sim.run(10 * MINUTE);
        assert_eq!(sim.max_active, max_partitions as usize, "seed {seed}");
        assert_eq!(sim.parts.len(), max_partitions as usize, "seed {seed}");
        assert!(sim.run(MINUTE).is_empty(), "seed {seed}: at the cap");
    }
}

#[test]
fn hot_key_below_isolation_share_is_isolated_by_the_first_split() {
    // A key with 40 % of the load, 1.6 targets: no piece of at most 0.95 x
    // target can hold it with company, so the topic is cut around it once.
    let h = 3u64 << 62;
    let load = vec![uniform(h, h, 1.6 * MB), uniform(0, u64::MAX, 2.4 * MB)];
    let mut sim = Sim::new(10, policy(), load, 1);
    let log = sim.run(20 * MINUTE);
    let splits = log
        .iter()
        .filter(|d| matches!(d.1, Decision::Split { .. }))
        .count();
    assert_eq!(splits, 1, "{log:?}");
    assert!(sim.parts.iter().any(|p| p.start == h && p.end == h));
    for p in sim.parts.iter().filter(|p| p.start < p.end) {
        let l = sim.true_load(p.start, p.end);
        assert!(l <= 0.95 * MB, "{l}: {log:?}");
    }
    assert!(sim.run(10 * MINUTE).is_empty());
}

/// A Zipf-like load as `simulate` writes it: the head key carries 13.5 %
/// of the records, the next keys 6.3, 4.1, 3.0 and 2.4 %, the rest is
/// spread evenly. The target is sized so the head key fits under it
/// (0.85 x target), as `simulate` calibrates it.
fn zipf_like(seed: u64, total: f64) -> Vec<Load> {
    let mut rng = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let heads = [0.135, 0.063, 0.041, 0.030, 0.024];
    let mut load: Vec<Load> = heads
        .iter()
        .map(|share| {
            let h = next();
            uniform(h, h, share * total)
        })
        .collect();
    let rest = 1.0 - heads.iter().sum::<f64>();
    load.push(uniform(0, u64::MAX, rest * total));
    load
}

/// Converged within 5 s, then ten minutes without a change, every partition
/// at most 1.1 x target, and more even than static hashing into as many
/// partitions (max/mean 1.08-1.25 for these seeds, 7-8 partitions).
#[test]
fn zipf_head_converges_in_seconds_to_balanced_partitions_under_target() {
    for seed in [11, 12, 13, 14] {
        let total = 10.0 * MB;
        let target = 0.135 * total / 0.85;
        let policy = BalancePolicy {
            target_bytes_per_sec: Some(target),
            min_age: Duration::from_secs(1),
            hot_factor: 1.3,
            ..BalancePolicy::default()
        };
        let mut sim = Sim::new(seed, policy, zipf_like(seed, total), 4);
        sim.samples = 64;
        let converging = sim.run(Duration::from_secs(5));
        assert!(!converging.is_empty(), "seed {seed}: never split");
        let settled: Vec<(u64, u64)> = sim.parts.iter().map(|p| (p.start, p.end)).collect();
        let quiet = sim.run(10 * MINUTE);
        assert!(
            quiet.is_empty(),
            "seed {seed}: still deciding after 5 s: {quiet:?}"
        );
        let now: Vec<(u64, u64)> = sim.parts.iter().map(|p| (p.start, p.end)).collect();
        assert_eq!(now, settled, "seed {seed}");
        let loads = sim.loads();
        for l in &loads {
            assert!(
                *l <= 1.1 * target,
                "seed {seed}: {l} over 1.1 x target: {loads:?}"
            );
        }
        let mean = loads.iter().sum::<f64>() / loads.len() as f64;
        let max = loads.iter().copied().fold(0.0, f64::max);
        let n = u128::from(loads.len() as u32);
        let even: Vec<f64> = (0..n)
            .map(|i| sim.true_load(((i << 64) / n) as u64, (((i + 1) << 64) / n - 1) as u64))
            .collect();
        let static_max = even.iter().copied().fold(0.0, f64::max);
        assert!(
            max / mean < static_max / mean,
            "seed {seed}: imbalance {} over {} partitions, static {}: {loads:?}",
            max / mean,
            loads.len(),
            static_max / mean
        );
    }
}

/// `simulate`'s default load: Zipf with `exponent` over `keys` keys at
/// random hashes; the `points` heaviest keys as single hashes (the head key
/// of Zipf 1.1 over 100,000 keys carries 13.5 % of the records), the rest
/// spread evenly.
fn zipf_keys(seed: u64, total: f64, keys: u32, exponent: f64, points: u32) -> Vec<Load> {
    let mut rng = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let weight = |k: u32| f64::from(k).powf(-exponent);
    let sum: f64 = (1..=keys).map(weight).sum();
    let mut load: Vec<Load> = (1..=points)
        .map(|k| {
            let h = next();
            uniform(h, h, weight(k) / sum * total)
        })
        .collect();
    let rest: f64 = (points + 1..=keys).map(weight).sum::<f64>() / sum;
    load.push(uniform(0, u64::MAX, rest * total));
    load
}

/// The target `simulate` calibrates: half the mean of the initial
/// partitions, raised so that the head key runs at 0.85 x target.
fn simulate_policy(total: f64, head: f64, initial: u32) -> BalancePolicy {
    BalancePolicy {
        target_bytes_per_sec: Some((total / (2.0 * f64::from(initial))).max(head / 0.85)),
        min_age: Duration::from_secs(1),
        hot_factor: 1.3,
        max_partitions: 32,
        ..BalancePolicy::default()
    }
}

/// max/mean of `loads`.
fn imbalance(loads: &[f64]) -> f64 {
    let mean = loads.iter().sum::<f64>() / loads.len() as f64;
    loads.iter().copied().fold(0.0, f64::max) / mean
}

/// The defaults of `simulate` (Zipf 1.1 over 100,000 keys, 4 initial
/// partitions, target as calibrated): settled within 5 s of the load
/// starting, then ten minutes without a change; every partition at most
/// 1.1 x target, max/mean at most 1.2, and better than static hashing at
/// the initial count and at the same final count.
#[test]
fn zipf_defaults_converge_within_5_s_to_max_over_mean_under_1_2() {
    let mut results = Vec::new();
    for seed in [21, 22, 23, 24, 25] {
        let total = 10.0 * MB;
        let load = zipf_keys(seed, total, 100_000, 1.1, 300);
        let head = load
            .iter()
            .filter(|l| l.lo == l.hi)
            .map(|l| l.bytes_per_sec)
            .fold(0.0, f64::max);
        let policy = simulate_policy(total, head, 4);
        let target = policy.target_bytes_per_sec.unwrap_or(MB);
        let mut sim = Sim::new(seed, policy, load, 4);
        sim.samples = 64;
        // 100-byte records, as `simulate` writes them by default.
        sim.record_bytes = 100.0;
        let converging = sim.run(Duration::from_secs(5));
        assert!(!converging.is_empty(), "seed {seed}: never split");
        let settled: Vec<(u64, u64)> = sim.parts.iter().map(|p| (p.start, p.end)).collect();
        let quiet = sim.run(10 * MINUTE);
        assert!(
            quiet.is_empty(),
            "seed {seed}: still deciding after 5 s: {quiet:?}"
        );
        let now: Vec<(u64, u64)> = sim.parts.iter().map(|p| (p.start, p.end)).collect();
        assert_eq!(now, settled, "seed {seed}");
        let loads = sim.loads();
        for l in &loads {
            assert!(
                *l <= 1.1 * target,
                "seed {seed}: {l} over 1.1 x target: {loads:?}"
            );
        }
        let even = |n: u32| -> Vec<f64> {
            let n = u128::from(n);
            (0..n)
                .map(|i| sim.true_load(((i << 64) / n) as u64, (((i + 1) << 64) / n - 1) as u64))
                .collect()
        };
        let (ours, initial, same) = (
            imbalance(&loads),
            imbalance(&even(4)),
            imbalance(&even(loads.len() as u32)),
        );
        results.push((seed, loads.len(), ours, initial, same));
        assert!(
            ours <= 1.3 && ours < initial && ours < same,
            "seed {seed}: max/mean {ours} over {} partitions, static {initial} (4), {same} (same count): {loads:?}",
            loads.len()
        );
    }
    eprintln!("(seed, partitions, max/mean, static 4, static same count): {results:?}");
    let mut ours: Vec<f64> = results.iter().map(|r| r.2).collect();
    ours.sort_by(f64::total_cmp);
    assert!(
        ours[ours.len() / 2] <= 1.2,
        "median max/mean over 1.2: (seed, partitions, max/mean, static 4, static same count): {results:?}"
    );
}

/// The load of a real `simulate` run on a busy machine: the first second
/// runs at twice the rate the producers keep up afterwards. The first cut
/// is made for the double rate; once the rate halves, partitions merge
/// (fit rule) as their windows fall, never split again, and after two
/// minutes nothing changes for ten. (Not max/mean <= 1.2: the children of
/// one split merge back only below 0.75 x target, so half-filled pieces
/// remain; 1.35-1.50 for these seeds, as in the real runs.)
#[test]
fn zipf_load_halving_after_the_first_cut_consolidates_without_thrash() {
    for seed in [31, 32, 33] {
        let total = 10.0 * MB;
        let load = zipf_keys(seed, total, 100_000, 1.1, 300);
        let head = load
            .iter()
            .filter(|l| l.lo == l.hi)
            .map(|l| l.bytes_per_sec)
            .fold(0.0, f64::max);
        // Calibrated on the steady rate: the first second runs at 2 x.
        let policy = simulate_policy(total, head, 4);
        let target = policy.target_bytes_per_sec.unwrap_or(MB);
        let doubled: Vec<Load> = load
            .iter()
            .map(|l| uniform(l.lo, l.hi, 2.0 * l.bytes_per_sec))
            .collect();
        let mut sim = Sim::new(seed, policy, doubled, 4);
        sim.samples = 64;
        sim.record_bytes = 100.0;
        let first = sim.run(Duration::from_millis(1_500));
        assert!(
            first.iter().any(|d| matches!(d.1, Decision::Split { .. })),
            "seed {seed}: {first:?}"
        );
        let after_cut = sim.parts.len();
        sim.load = load;
        let settling = sim.run(2 * MINUTE);
        let quiet = sim.run(10 * MINUTE);
        assert!(quiet.is_empty(), "seed {seed}: still deciding: {quiet:?}");
        let merged: Vec<u32> = settling
            .iter()
            .filter_map(|d| match d.1 {
                Decision::Merge { .. } => Some(d.0 as u32),
                _ => None,
            })
            .collect();
        assert!(!merged.is_empty(), "seed {seed}: never consolidated");
        // Once merging started, nothing was split again.
        let first_merge = settling
            .iter()
            .position(|d| matches!(d.1, Decision::Merge { .. }));
        assert!(
            settling[first_merge.unwrap_or(0)..]
                .iter()
                .all(|d| matches!(d.1, Decision::Merge { .. })),
            "seed {seed}: thrash {settling:?}"
        );
        let loads = sim.loads();
        assert!(loads.len() < after_cut, "seed {seed}");
        for l in &loads {
            assert!(*l <= 1.1 * target, "seed {seed}: {l} over 1.1 x target");
        }
        eprintln!(
            "seed {seed}: {after_cut} partitions after the first cut, {} after the rate halved, max/mean {}",
            loads.len(),
            imbalance(&loads)
        );
    }
}
