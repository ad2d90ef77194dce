//! `simulate --consumers N`: the topic is read by one consumer group of N
//! members (threads) while partitions split and merge. Each member polls,
//! "processes" (sleeps `--processing-us` per record, times the slow factor
//! for member 0), feeds the shared checker and commits. One member can be
//! killed (it stops without leaving) to show failure detection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use fissionlog::{Error, Group, GroupOptions, MemberOptions, Topic};
use serde::Serialize;

use super::check::{Checker, ConsumerShared};

/// After the producers stop, the members give up waiting for missing
/// records once nothing arrived for this long.
const DRAIN_IDLE: Duration = Duration::from_secs(3);
/// Session and processing timeouts of the simulated members: short, so
/// a run of seconds shows failure detection.
const SESSION: Duration = Duration::from_secs(3);
const PROCESSING: Duration = Duration::from_secs(5);
const HEARTBEAT: Duration = Duration::from_millis(500);
/// A record delivered within this long after a rebalance counts as
/// delivered during it.
const REBALANCE_WINDOW: Duration = Duration::from_secs(1);

/// Microseconds since the process's first call: the producers stamp each
/// value with it (bytes 16..24) so the consumers can measure append to
/// delivery.
pub fn stamp_micros() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// How the group is run.
#[derive(Debug, Clone, Copy)]
pub struct GroupPlan {
    /// Members.
    pub consumers: u32,
    /// Member 0 processes this many times slower.
    pub slow_factor: f64,
    /// Member `consumers - 1` stops (without leaving) this long after start.
    pub kill_at: Option<Duration>,
    /// Processing time per record, microseconds.
    pub processing_us: f64,
}

/// A log-bucketed histogram of microseconds (8 buckets per octave, about
/// 9 % resolution).
#[derive(Debug, Clone, Default)]
struct Histogram {
    counts: Vec<u64>,
    n: u64,
    max: u64,
}

impl Histogram {
    fn bucket(us: u64) -> usize {
        if us < 8 {
            return us as usize;
        }
        let log = 63 - us.leading_zeros() as usize;
        let frac = ((us >> (log - 3)) & 7) as usize;
        8 + (log - 3) * 8 + frac
    }

    fn low(b: usize) -> u64 {
        if b < 8 {
            return b as u64;
        }
        let log = (b - 8) / 8 + 3;
        let frac = ((b - 8) % 8) as u64;
        (1u64 << log) | (frac << (log - 3))
    }

    fn add(&mut self, us: u64) {
        let b = Self::bucket(us);
        if self.counts.len() <= b {
            self.counts.resize(b + 1, 0);
        }
        self.counts[b] += 1;
        self.n += 1;
        self.max = self.max.max(us);
    }

    fn merge(&mut self, o: &Histogram) {
        if self.counts.len() < o.counts.len() {
            self.counts.resize(o.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.n += o.n;
        self.max = self.max.max(o.max);
    }

    /// The `q` quantile in milliseconds (bucket lower bound).
    fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let want = ((self.n as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(Self::low(b) as f64 / 1000.0);
            }
        }
        Some(self.max as f64 / 1000.0)
    }
}

/// Latency figures in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest.
    pub max: Option<f64>,
}

impl Latency {
    fn of(h: &Histogram) -> Latency {
        Latency {
            p50: h.quantile_ms(0.5),
            p99: h.quantile_ms(0.99),
            max: (h.n > 0).then_some(h.max as f64 / 1000.0),
        }
    }
}

/// Pauses of partitions moved by rebalances, milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Pauses {
    /// Median.
    pub p50: Option<f64>,
    /// Largest.
    pub max: Option<f64>,
}

/// What the consumer group saw; flattened into the JSON summary.
#[derive(Debug, Clone, Serialize)]
pub struct GroupReport {
    /// Members at the start.
    pub consumers: u32,
    /// Ownership changes that moved partitions between members.
    pub rebalances: u64,
    /// Partitions moved.
    pub partitions_moved: u64,
    /// Per moved partition, how long nobody could read it.
    pub rebalance_pause_ms: Pauses,
    /// Append to delivery, over the whole run.
    pub e2e_latency_ms: Latency,
    /// Append to delivery, for records delivered within 1 s of a rebalance.
    pub e2e_latency_during_rebalance_ms: Latency,
    /// Members declared dead.
    pub dead_consumers_detected: u64,
    /// Members declared slow.
    pub slow_consumers_detected: u64,
    /// Members relieved of partitions because they fell behind.
    pub lagging_consumers_relieved: u64,
    /// Partitions split because one member alone fell behind them.
    pub lag_splits: u64,
    /// Seconds from the kill of a member to its partitions being read
    /// again by the others.
    pub failover_secs: Option<f64>,
    /// Seconds from the start to the first relief of a lagging member.
    pub first_relief_secs: Option<f64>,
    /// Largest group lag sampled, records.
    pub lag_max_records: u64,
    /// Records delivered again (the uncommitted window of a member that
    /// died or was relieved while stuck), as the group counted them.
    pub redelivered_records: u64,
    /// Commits.
    pub commits: u64,
    /// Records each member received.
    pub records_per_member: Vec<u64>,
}

/// Reads `topic` with a group until the producers are done and everything
/// they acknowledged was read (or the topic stayed quiet for
/// [`DRAIN_IDLE`]). Returns the checker and the group's figures.
pub fn consume_group(
    topic: &Topic,
    plan: GroupPlan,
    producers: usize,
    keys_per_producer: usize,
    shared: &ConsumerShared,
) -> Result<(Checker, GroupReport), String> {
    let group = topic
        .group("simulate", GroupOptions::default())
        .map_err(|e| format!("cannot create the consumer group: {e}"))?;
    let checker = Mutex::new(Checker::new(producers, keys_per_producer));
    checker.lock().expect("not poisoned").hot_order = shared.hot_order;
    let run = GroupRun {
        group: &group,
        plan,
        shared,
        checker: &checker,
        started: Instant::now(),
        rebalance_until: AtomicU64::new(0),
        done: AtomicBool::new(false),
        progress: AtomicU64::new(stamp_micros()),
        killed_at: Mutex::new(None),
        n: plan.consumers.max(1),
    };
    let (all, during, per_member, watched) = std::thread::scope(|s| {
        let members: Vec<_> = (0..run.n)
            .map(|i| {
                let run = &run;
                s.spawn(move || member(run, i))
            })
            .collect();
        let watched = watch(&run, &members);
        let mut all = Histogram::default();
        let mut during = Histogram::default();
        let mut per_member = Vec::new();
        for m in members {
            let (a, d, r) = m
                .join()
                .map_err(|_| "a consumer thread panicked".to_string())??;
            all.merge(&a);
            during.merge(&d);
            per_member.push(r);
        }
        Ok::<_, String>((all, during, per_member, watched))
    })?;
    let d = group.describe();
    let mut pauses = d.stats.pauses_ms.clone();
    pauses.sort_by(f64::total_cmp);
    let report = GroupReport {
        consumers: run.n,
        rebalances: d.stats.rebalances,
        partitions_moved: d.stats.moves,
        rebalance_pause_ms: Pauses {
            p50: pauses.get(pauses.len() / 2).copied(),
            max: pauses.last().copied(),
        },
        e2e_latency_ms: Latency::of(&all),
        e2e_latency_during_rebalance_ms: Latency::of(&during),
        dead_consumers_detected: d.stats.dead_detected,
        slow_consumers_detected: d.stats.slow_detected,
        lagging_consumers_relieved: d.stats.lag_relieved,
        lag_splits: d.stats.lag_splits,
        failover_secs: watched.failover,
        first_relief_secs: watched.first_relief,
        lag_max_records: watched.lag_max,
        redelivered_records: d.stats.redelivered,
        commits: d.stats.commits,
        records_per_member: per_member,
    };
    let checker = checker.into_inner().expect("not poisoned");
    Ok((checker, report))
}

/// What the member threads and the watcher of one group run share.
struct GroupRun<'a> {
    group: &'a Group,
    plan: GroupPlan,
    shared: &'a ConsumerShared,
    checker: &'a Mutex<Checker>,
    started: Instant,
    /// Until when (stamp_micros) a delivery counts as during a rebalance.
    rebalance_until: AtomicU64,
    done: AtomicBool,
    /// When any member last received records (stamp_micros).
    progress: AtomicU64,
    killed_at: Mutex<Option<Instant>>,
    /// Members.
    n: u32,
}

/// What one member measured: latencies over the run and during
/// rebalances, and how many records it received.
type MemberFigures = (Histogram, Histogram, u64);

/// One member: joins, then polls, processes, checks and commits until the
/// run is done (or it is the member killed at `--kill-consumer-at`).
fn member(run: &GroupRun, i: u32) -> Result<MemberFigures, String> {
    let (plan, shared, n) = (run.plan, run.shared, run.n);
    let opts = MemberOptions {
        session_timeout: SESSION,
        processing_timeout: PROCESSING,
        instance_id: None,
        background_heartbeat: Some(HEARTBEAT),
    };
    let mut m = run
        .group
        .join(opts.clone())
        .map_err(|e| format!("member {i} cannot join: {e}"))?;
    let slow = if i == 0 { plan.slow_factor } else { 1.0 };
    let kill = plan.kill_at.filter(|_| n > 1 && i == n - 1);
    let mut all = Histogram::default();
    let mut during = Histogram::default();
    let mut received = 0u64;
    let mut debt_us = 0.0f64;
    while !run.done.load(Ordering::Acquire) && !shared.stop_now.load(Ordering::Acquire) {
        if kill.is_some_and(|k| run.started.elapsed() >= k) {
            // Stops without leaving: the group finds out
            // when its heartbeats stop.
            *run.killed_at.lock().expect("not poisoned") = Some(Instant::now());
            drop(m);
            return Ok((all, during, received));
        }
        let records = match m.poll_wait(1024, Duration::from_millis(50)) {
            Ok(r) => r,
            Err(Error::Fenced { .. }) => {
                m = run
                    .group
                    .join(opts.clone())
                    .map_err(|e| format!("member {i} cannot rejoin: {e}"))?;
                continue;
            }
            Err(e) => return Err(format!("member {i}: poll failed: {e}")),
        };
        if records.is_empty() {
            if drained(run) {
                run.done.store(true, Ordering::Release);
                break;
            }
            continue;
        }
        run.progress.store(stamp_micros(), Ordering::Relaxed);
        debt_us += plan.processing_us * slow * records.len() as f64;
        if debt_us >= 1000.0 {
            std::thread::sleep(Duration::from_micros(debt_us as u64));
            debt_us = 0.0;
        }
        check_batch(run, &records, &mut all, &mut during);
        received += records.len() as u64;
        shared
            .read
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        match m.commit() {
            Ok(()) | Err(Error::NotAssigned { .. }) => {}
            Err(Error::Fenced { .. }) => {
                m = run
                    .group
                    .join(opts.clone())
                    .map_err(|e| format!("member {i} cannot rejoin: {e}"))?;
            }
            Err(e) => return Err(format!("member {i}: commit failed: {e}")),
        }
    }
    let _ = m.leave();
    Ok((all, during, received))
}

/// After an empty poll: whether the run is over (the producers are done and
/// everything they acknowledged was read, or nothing arrived for
/// [`DRAIN_IDLE`]).
fn drained(run: &GroupRun) -> bool {
    let shared = run.shared;
    if !shared.producers_done.load(Ordering::Acquire) {
        return false;
    }
    let c = run.checker.lock().expect("not poisoned");
    let unique = c.received - c.duplicates;
    if unique >= shared.final_acked.load(Ordering::Acquire) {
        return true;
    }
    drop(c);
    let quiet = stamp_micros().saturating_sub(run.progress.load(Ordering::Relaxed));
    quiet >= DRAIN_IDLE.as_micros() as u64
}

/// Feeds a polled batch to the checker and its append-to-delivery
/// latencies to the histograms.
fn check_batch(
    run: &GroupRun,
    records: &[fissionlog::OwnedRecord],
    all: &mut Histogram,
    during: &mut Histogram,
) {
    let now = stamp_micros();
    let in_rebalance = now < run.rebalance_until.load(Ordering::Relaxed);
    let mut c = run.checker.lock().expect("not poisoned");
    for r in records {
        c.receive_at(&r.value, r.timestamp);
        if let Some(b) = r.value.get(16..24) {
            let at = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            let us = now.saturating_sub(at);
            all.add(us);
            if in_rebalance {
                during.add(us);
            }
        }
    }
}

/// What the watcher saw of the group while the members ran.
struct Watched {
    lag_max: u64,
    failover: Option<f64>,
    first_relief: Option<f64>,
}

/// The watcher: marks rebalance windows, samples the lag, times the
/// failover and writes a status line until every member has finished.
fn watch(
    run: &GroupRun,
    members: &[std::thread::ScopedJoinHandle<'_, Result<MemberFigures, String>>],
) -> Watched {
    let mut last_rebalances = 0;
    let mut w = Watched {
        lag_max: 0,
        failover: None,
        first_relief: None,
    };
    while members.iter().any(|m| !m.is_finished()) {
        std::thread::sleep(Duration::from_millis(100));
        let d = run.group.describe();
        if d.stats.rebalances != last_rebalances {
            last_rebalances = d.stats.rebalances;
            run.rebalance_until.store(
                stamp_micros() + REBALANCE_WINDOW.as_micros() as u64,
                Ordering::Relaxed,
            );
        }
        w.lag_max = w.lag_max.max(d.lag_records);
        if d.stats.lag_relieved + d.stats.slow_detected > 0 && w.first_relief.is_none() {
            w.first_relief = Some(run.started.elapsed().as_secs_f64());
        }
        let killed = *run.killed_at.lock().expect("not poisoned");
        if let (Some(k), None) = (killed, w.failover) {
            if d.stats.dead_detected > 0 && d.assignments.iter().all(|a| a.member.is_some()) {
                w.failover = Some(k.elapsed().as_secs_f64());
            }
        }
        *run.shared.status.lock().expect("not poisoned") = format!(
            "  group: {} members, {} rebalances, lag {}",
            d.members.len(),
            d.stats.rebalances,
            d.lag_records
        );
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_within_a_bucket() {
        let mut h = Histogram::default();
        for us in 1..=10_000u64 {
            h.add(us);
        }
        let p50 = h.quantile_ms(0.5).unwrap();
        assert!((4.5..=5.0).contains(&p50), "{p50}");
        let p99 = h.quantile_ms(0.99).unwrap();
        assert!((9.0..=9.9).contains(&p99), "{p99}");
        assert_eq!(h.max, 10_000);
        for b in 0..100 {
            assert_eq!(Histogram::bucket(Histogram::low(b)), b);
        }
    }
}
