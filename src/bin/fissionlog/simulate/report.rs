//! Measurements of a run: periodic samples of partition end offsets, the
//! load and imbalance over the last seconds, and the final report (text
//! table or one JSON document).

use std::collections::BTreeMap;

use serde::Serialize;

/// One periodic sample taken while the producers run.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since the run started.
    pub t: f64,
    /// End offset of every partition (active and sealed) at that moment.
    pub end_offsets: BTreeMap<u32, u64>,
    /// Acknowledged records per initial hash range (static partitioning).
    pub initial_ranges: Vec<u64>,
    /// Acknowledged records in total.
    pub acked: u64,
}

/// Load of the active partitions over a window ending at the last sample.
#[derive(Debug, Clone, Default)]
pub struct WindowLoad {
    /// Length of the window actually measured, in seconds.
    pub window_secs: f64,
    /// Records/s of each active partition over the part of the window it
    /// existed in; partitions younger than a quarter of the window are left
    /// out (their rate is not yet comparable).
    pub rates: BTreeMap<u32, f64>,
    /// max / mean of `rates`.
    pub imbalance: Option<f64>,
    /// max / mean of the records per initial hash range in the window: what
    /// static `hash(key) % initial_partitions`-style partitioning would have
    /// given for the same records.
    pub imbalance_static: Option<f64>,
    /// Records/s over the window, all partitions.
    pub records_per_sec: f64,
    /// Records/s of the busiest initial hash range over the window.
    pub static_max_records_per_sec: Option<f64>,
}

fn max_over_mean(values: impl Iterator<Item = f64> + Clone) -> Option<f64> {
    let n = values.clone().count();
    let sum: f64 = values.clone().sum();
    if n == 0 || sum <= 0.0 {
        return None;
    }
    let max = values.fold(0.0f64, f64::max);
    Some(max / (sum / n as f64))
}

/// The load of `active` partitions over the last `window` seconds of `samples`.
pub fn window_load(samples: &[Sample], active: &[u32], window: f64) -> WindowLoad {
    let Some(last) = samples.last() else {
        return WindowLoad::default();
    };
    let from = last.t - window;
    let i0 = samples
        .iter()
        .position(|s| s.t >= from - 1e-9)
        .unwrap_or(samples.len() - 1);
    let first = &samples[i0];
    let window_secs = last.t - first.t;
    let mut rates = BTreeMap::new();
    for &id in active {
        let Some(&end) = last.end_offsets.get(&id) else {
            continue;
        };
        let Some(s) = samples[i0..]
            .iter()
            .find(|s| s.end_offsets.contains_key(&id))
        else {
            continue;
        };
        let dt = last.t - s.t;
        if dt > 0.0 && dt >= 0.25 * window_secs {
            rates.insert(id, end.saturating_sub(s.end_offsets[&id]) as f64 / dt);
        }
    }
    let imbalance = max_over_mean(rates.values().copied());
    let static_deltas: Vec<f64> = last
        .initial_ranges
        .iter()
        .zip(&first.initial_ranges)
        .map(|(a, b)| a.saturating_sub(*b) as f64)
        .collect();
    let imbalance_static = max_over_mean(static_deltas.iter().copied());
    let static_max_records_per_sec = (window_secs > 0.0)
        .then(|| static_deltas.iter().copied().fold(0.0f64, f64::max) / window_secs);
    let records_per_sec = if window_secs > 0.0 {
        last.acked.saturating_sub(first.acked) as f64 / window_secs
    } else {
        0.0
    };
    WindowLoad {
        window_secs,
        rates,
        imbalance,
        imbalance_static,
        records_per_sec,
        static_max_records_per_sec,
    }
}

/// One active partition in the final report.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionRow {
    /// Partition id.
    pub id: u32,
    /// First hash of its range, hex.
    pub start: String,
    /// Last hash of its range, hex.
    pub end: String,
    /// Its parents.
    pub parents: Vec<u32>,
    /// Records it holds.
    pub records: u64,
    /// Bytes of data it holds.
    pub bytes: u64,
    /// Records/s over the imbalance window (None when too young to tell).
    pub records_per_sec: Option<f64>,
    /// Its share of the load over the imbalance window.
    pub share: Option<f64>,
    /// Reported as carrying one hot key.
    pub hot_key: bool,
}

/// A topology event as it happened during the run.
#[derive(Debug, Clone, Serialize)]
pub struct EventNote {
    /// Seconds since the run started.
    pub t: f64,
    /// `split`, `merge`, `hot_key` or `phase`.
    pub kind: &'static str,
    /// Human-readable description.
    pub what: String,
}

/// The two phases of `--phases`.
#[derive(Debug, Clone, Serialize)]
pub struct PhasesReport {
    /// Length of the surge, seconds.
    pub surge_secs: f64,
    /// Length of the calm phase, seconds.
    pub calm_secs: f64,
    /// Records/s reached during the surge.
    pub surge_records_per_sec: f64,
    /// Records/s during the calm phase.
    pub calm_records_per_sec: f64,
    /// Active partitions at the end of the surge.
    pub partitions_after_surge: usize,
    /// Merges during the calm phase.
    pub merges_in_calm: u64,
}

/// The whole result of a run; `--json` prints it as one document.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Log directory used.
    pub dir: String,
    /// Whether the directory was kept.
    pub kept: bool,
    /// Seed of the key choice.
    pub seed: u64,
    /// Records acknowledged by the producers.
    pub records: u64,
    /// Bytes of data in the topic's partitions (records with framing).
    pub bytes: u64,
    /// Key + value bytes acknowledged.
    pub payload_bytes: u64,
    /// Seconds the producers ran.
    pub seconds: f64,
    /// `records / seconds`.
    pub records_per_sec: f64,
    /// `bytes / seconds` in MB (10^6 bytes) per second.
    pub mb_per_sec: f64,
    /// Producer threads.
    pub producers: u32,
    /// Keys of the Zipf distribution.
    pub keys: u32,
    /// Zipf exponent.
    pub zipf: f64,
    /// Share of records on the single hot key, if any.
    pub hot_key_share: Option<f64>,
    /// Whether the automatic balancer was on.
    pub balance: bool,
    /// Records/s measured by the calibration run, if one ran.
    pub calibrated_records_per_sec: Option<f64>,
    /// Balancer target per partition, records/s.
    pub target_records_per_sec: Option<f64>,
    /// Balancer target per partition, bytes/s.
    pub target_bytes_per_sec: Option<f64>,
    /// Partitions the topic was created with.
    pub partitions_initial: u32,
    /// Active partitions at the end.
    pub partitions_active: usize,
    /// Splits during the run.
    pub splits: u64,
    /// Merges during the run.
    pub merges: u64,
    /// Hot keys: keys the balancer isolated into a partition of their own
    /// (`[h, h]`), active at the end. Agrees with `single_key_partitions`
    /// and with the `hot_key` flags of `partitions`.
    pub hot_keys: usize,
    /// `HotKey` events: single-key partitions still hot after isolation
    /// (the balancer cannot help those further).
    pub hot_key_reports: u64,
    /// Partitions of a single hash value `[h, h]` at the end.
    pub single_key_partitions: usize,
    /// max / mean load of the active partitions over the last seconds.
    pub imbalance: Option<f64>,
    /// The same for static partitioning into the initial even ranges.
    pub imbalance_static: Option<f64>,
    /// Static partitioning into as many even ranges as there are active
    /// partitions at the end, for the records of the whole run (per-key
    /// counts: the key distribution does not change during a run).
    pub imbalance_static_same_count: Option<f64>,
    /// Records/s of the busiest active partition over the window, divided
    /// by the records/s target.
    pub busiest_over_target: Option<f64>,
    /// Seconds from the start of the load to the last split or merge: the
    /// topology did not change after it (0 when it never changed).
    pub converged_after_s: Option<f64>,
    /// `imbalance` leaving out single-key partitions `[h, h]` (a key's load
    /// cannot be divided without breaking its order).
    pub imbalance_without_hot_keys: Option<f64>,
    /// Records/s of the busiest active partition over the window.
    pub max_partition_records_per_sec: Option<f64>,
    /// Records/s the busiest initial range would have taken under static
    /// partitioning over the same window.
    pub max_partition_records_per_sec_static: Option<f64>,
    /// Length of the window both imbalances were measured over, seconds.
    pub imbalance_window_secs: f64,
    /// Seconds from the start of the run to the first split.
    pub first_split_after_secs: Option<f64>,
    /// `--hot-key-mode` of the hot key, when there is one.
    pub hot_key_mode: Option<String>,
    /// Lanes the hot key's mode spreads it over (1 for strict).
    pub hot_key_lanes: Option<usize>,
    /// The hot key's records per lane (of its mode, as the strict key
    /// reader found them).
    pub hot_key_lane_loads: Option<Vec<u64>>,
    /// max / mean of `hot_key_lane_loads`.
    pub hot_key_lane_imbalance: Option<f64>,
    /// Records of the hot key that the strict key reader (`read_key`)
    /// returned after a later record of their producer: per-key order
    /// holds when 0 (none for spread, which keeps no order).
    pub hot_key_read_order_violations: Option<u64>,
    /// Records read after a later record of the same (producer, key); for
    /// a windowed hot key, of the same window; never for a spread one.
    pub order_violations: u64,
    /// Acknowledged records never read back.
    pub missing_records: u64,
    /// Records read more than once.
    pub duplicate_records: u64,
    /// Records read that were not acknowledged.
    pub unacknowledged_records: u64,
    /// Records whose value could not be decoded.
    pub malformed_records: u64,
    /// Records the consumer read.
    pub records_read: u64,
    /// Errors of producers or consumer, one sentence each.
    pub errors: Vec<String>,
    /// `--phases` figures.
    pub phases: Option<PhasesReport>,
    /// Topology events in order.
    pub events: Vec<EventNote>,
    /// The active partitions at the end, in hash-range order.
    pub partitions: Vec<PartitionRow>,
    /// With `--consumers`: what the consumer group saw.
    #[serde(flatten)]
    pub group: Option<super::group::GroupReport>,
}

impl Report {
    /// Whether the run found no order violation, missing or duplicate record.
    pub fn clean(&self) -> bool {
        // A consumer group delivers again what a member handed out and
        // did not commit before it died or was relieved while stuck: that
        // many duplicates are the documented at-least-once, no more.
        let allowed = self.group.as_ref().map_or(0, |g| g.redelivered_records);
        self.order_violations == 0
            && self.hot_key_read_order_violations.unwrap_or(0) == 0
            && self.missing_records == 0
            && self.duplicate_records <= allowed
            && self.malformed_records == 0
            && self.errors.is_empty()
    }

    /// The human-readable report.
    pub fn print_text(&self) {
        self.print_run();
        self.print_partitions();
        self.print_balance_and_checks();
        self.print_group();
        for e in &self.errors {
            println!("error: {e}");
        }
        if self.kept {
            println!("log kept in {}", self.dir);
        }
    }

    /// What ran: the workload, the balancer and the topology changes.
    fn print_run(&self) {
        println!(
            "{} records in {:.1} s: {} records/s, {:.1} MB/s ({} producers, {} keys, zipf {}{})",
            self.records,
            self.seconds,
            si(self.records_per_sec),
            self.mb_per_sec,
            self.producers,
            self.keys,
            self.zipf,
            self.hot_key_share
                .map(|s| format!(", hot key {:.0}%", s * 100.0))
                .unwrap_or_default()
        );
        match (
            self.balance,
            self.target_records_per_sec,
            self.target_bytes_per_sec,
        ) {
            (false, _, _) => println!("balancer: off"),
            (true, r, b) => println!(
                "balancer: on, target per partition {}{}{}",
                r.map(|r| format!("{} records/s", si(r)))
                    .unwrap_or_default(),
                if r.is_some() && b.is_some() { ", " } else { "" },
                b.map(|b| format!("{:.1} MB/s", b / 1e6))
                    .unwrap_or_default()
            ),
        }
        println!(
            "partitions: {} initial, {} active; {} splits, {} merges, {} hot keys isolated; first split after {}, last change after {}",
            self.partitions_initial,
            self.partitions_active,
            self.splits,
            self.merges,
            self.hot_keys,
            self.first_split_after_secs
                .map(|t| format!("{t:.2} s"))
                .unwrap_or_else(|| "-".into()),
            self.converged_after_s
                .map(|t| format!("{t:.2} s"))
                .unwrap_or_else(|| "-".into())
        );
        if let Some(p) = &self.phases {
            println!(
                "phases: surge {:.1} s at {} records/s -> {} partitions; calm {:.1} s at {} records/s, {} merges",
                p.surge_secs,
                si(p.surge_records_per_sec),
                p.partitions_after_surge,
                p.calm_secs,
                si(p.calm_records_per_sec),
                p.merges_in_calm
            );
        }
    }

    /// One row per active partition.
    fn print_partitions(&self) {
        println!();
        println!(
            "{:>5}  {:<35} {:>12} {:>12} {:>12} {:>7}",
            "id", "key range", "records", "bytes", "records/s", "share"
        );
        for p in &self.partitions {
            println!(
                "{:>5}  {:<35} {:>12} {:>12} {:>12} {:>7}{}",
                p.id,
                format!("{}..{}", p.start, p.end),
                p.records,
                p.bytes,
                p.records_per_sec.map(si).unwrap_or_else(|| "-".into()),
                p.share
                    .map(|s| format!("{:.1}%", s * 100.0))
                    .unwrap_or_else(|| "-".into()),
                if p.hot_key { "  hot key" } else { "" }
            );
        }
    }

    /// How even the load ended up, and what the order checker found.
    fn print_balance_and_checks(&self) {
        println!();
        println!(
            "imbalance (max/mean load, last {:.1} s): {} with splitting, {} static ({} even ranges), {} static ({} even ranges)",
            self.imbalance_window_secs,
            opt2(self.imbalance),
            opt2(self.imbalance_static),
            self.partitions_initial,
            opt2(self.imbalance_static_same_count),
            self.partitions_active
        );
        if self.single_key_partitions > 0 {
            println!(
                "imbalance without single-key partitions: {}",
                opt2(self.imbalance_without_hot_keys)
            );
        }
        println!(
            "busiest partition: {} records/s with splitting ({} x target), {} records/s static",
            self.max_partition_records_per_sec
                .map(si)
                .unwrap_or_else(|| "-".into()),
            opt2(self.busiest_over_target),
            self.max_partition_records_per_sec_static
                .map(si)
                .unwrap_or_else(|| "-".into())
        );
        println!(
            "check: {} records read, {} order violations, {} missing, {} duplicates{}",
            self.records_read,
            self.order_violations,
            self.missing_records,
            self.duplicate_records,
            if self.unacknowledged_records > 0 {
                format!(", {} unacknowledged", self.unacknowledged_records)
            } else {
                String::new()
            }
        );
        if let (Some(mode), Some(loads)) = (&self.hot_key_mode, &self.hot_key_lane_loads) {
            println!(
                "hot key: {mode} over {} lanes, records per lane {loads:?} (max/mean {}), strict key reader: {} order violations",
                loads.len(),
                opt2(self.hot_key_lane_imbalance),
                self.hot_key_read_order_violations
                    .map_or_else(|| "-".to_string(), |v| v.to_string())
            );
        }
    }

    /// The consumer group's figures, with `--consumers`.
    fn print_group(&self) {
        if let Some(g) = &self.group {
            let ms = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
            println!(
                "group: {} consumers, {} rebalances moved {} partitions (pause p50 {} ms, max {} ms), records per member {:?}",
                g.consumers,
                g.rebalances,
                g.partitions_moved,
                ms(g.rebalance_pause_ms.p50),
                ms(g.rebalance_pause_ms.max),
                g.records_per_member
            );
            println!(
                "group: end-to-end latency p50 {} ms, p99 {} ms, max {} ms; during rebalances p99 {} ms, max {} ms",
                ms(g.e2e_latency_ms.p50),
                ms(g.e2e_latency_ms.p99),
                ms(g.e2e_latency_ms.max),
                ms(g.e2e_latency_during_rebalance_ms.p99),
                ms(g.e2e_latency_during_rebalance_ms.max)
            );
            println!(
                "group: {} dead and {} slow consumers detected, {} relieved for lag, failover {} s, lag max {} records, {} records delivered again by design",
                g.dead_consumers_detected,
                g.slow_consumers_detected,
                g.lagging_consumers_relieved,
                ms(g.failover_secs),
                g.lag_max_records,
                g.redelivered_records
            );
        }
    }
}

fn opt2(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

/// max / mean of the records per range when `hashes[k]` (the routing hash
/// of key `k`, which has `counts[k]` records) is placed by static
/// partitioning into `ranges` even ranges of the hash space.
pub fn static_imbalance(hashes: &[u64], counts: &[u64], ranges: usize) -> Option<f64> {
    if ranges == 0 {
        return None;
    }
    let mut per_range = vec![0.0f64; ranges];
    for (&h, &c) in hashes.iter().zip(counts) {
        let i = ((u128::from(h) * ranges as u128) >> 64) as usize;
        per_range[i.min(ranges - 1)] += c as f64;
    }
    max_over_mean(per_range.into_iter())
}

/// A rate with an SI suffix: `1.23M`.
pub fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, offsets: &[(u32, u64)], ranges: &[u64]) -> Sample {
        Sample {
            t,
            end_offsets: offsets.iter().copied().collect(),
            initial_ranges: ranges.to_vec(),
            acked: ranges.iter().sum(),
        }
    }

    #[test]
    fn static_imbalance_places_keys_in_even_ranges() {
        let hashes = [0, 1 << 62, u64::MAX / 2 + 1, u64::MAX];
        let counts = [30, 10, 20, 20];
        // 2 ranges: 40 and 40.
        assert_eq!(static_imbalance(&hashes, &counts, 2), Some(1.0));
        // 4 ranges: 30, 10, 20, 20 -> max 30 over mean 20.
        assert_eq!(static_imbalance(&hashes, &counts, 4), Some(1.5));
        assert_eq!(static_imbalance(&hashes, &counts, 0), None);
    }

    #[test]
    fn window_load_uses_deltas_and_skips_young_partitions() {
        let samples = vec![
            sample(0.0, &[(0, 0), (1, 0)], &[0, 0]),
            sample(1.0, &[(0, 100), (1, 300)], &[100, 300]),
            sample(2.0, &[(0, 200), (1, 300), (2, 0), (3, 0)], &[200, 600]),
            sample(3.0, &[(0, 300), (1, 300), (2, 100), (3, 200)], &[300, 900]),
            sample(
                3.9,
                &[(0, 390), (1, 300), (2, 190), (3, 380), (4, 0)],
                &[390, 1170],
            ),
        ];
        let w = window_load(&samples, &[0, 2, 3, 4], 2.0);
        assert!((w.window_secs - 1.9).abs() < 1e-9);
        assert!((w.rates[&0] - 100.0).abs() < 1e-9);
        assert!((w.rates[&3] - 200.0).abs() < 1e-9);
        assert!(!w.rates.contains_key(&4), "created at the last sample");
        let imb = w.imbalance.unwrap();
        assert!((imb - 200.0 / (400.0 / 3.0)).abs() < 1e-9, "{imb}");
        let st = w.imbalance_static.unwrap();
        assert!((st - 1.5).abs() < 1e-9, "{st}");
    }
}
