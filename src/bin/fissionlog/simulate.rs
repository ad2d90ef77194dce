//! `fissionlog simulate`: the demo of the main job. Producer threads write a
//! skewed keyed workload (Zipf over many keys, optionally one hot key) into a
//! topic whose balancer splits hot partitions while a consumer reads the
//! topic back with the order-keeping reader and checks per-key order,
//! duplicates and missing records exactly.
//!
//! Targets: unless `--target-*` is given, a one-second calibration run in a
//! throwaway topic measures what the producers reach on this machine, and
//! the balancer's per-partition target is set to
//! `measured records/s / (2 × initial partitions)`: the initial partitions
//! then run at twice the target on average, so the hottest ones split (a
//! topic config is fixed at creation, so calibrating inside the real topic
//! is not possible). The target is raised, if needed, so that the hottest
//! key (the Zipf head, or `--hot-key-share`) fits under it: a key is never
//! spread over partitions (per-key order), so a target below one key's rate
//! leaves that key's partition above target whatever the balancer does.
//! The Log's background thread runs the balancer every `check_interval`.
//!
//! Imbalance is max/mean records/s of the active partitions over the last
//! (up to) 3 seconds of producing, from partition end-offset deltas;
//! `imbalance_static` is the same ratio for the same records counted per
//! initial even hash range (the range each key's hash falls in), i.e. what
//! static partitioning into the initial partitions would have given.

mod check;
mod group;
mod live;
mod monitor;
mod plan;
mod report;
mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use fissionlog::{BalancePolicy, HotKeyMode};
use fissionlog::{Log, LogOptions, PartitionInfo, Topic, TopologyEvent};

use check::{consume, ConsumerShared};
use monitor::{Monitor, Tally};
use plan::{Plan, Stop};
use report::{window_load, PartitionRow, PhasesReport, Report, Sample};
use workload::{produce, write_key, Shared};

/// The topic the simulation writes.
const TOPIC: &str = "simulate";
/// The throwaway topic of the calibration run.
const CALIBRATION_TOPIC: &str = "simulate-calibration";
/// Length of the calibration run.
const CALIBRATION: Duration = Duration::from_secs(1);
/// Segment size of the simulated topic.
const SEGMENT_BYTES: u64 = 64 << 20;
/// How often the monitor samples partition offsets.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Window of the final imbalance figures, seconds.
const IMBALANCE_WINDOW_SECS: f64 = 3.0;

/// Share of the surge rate the producers keep in the calm phase.
const CALM_SHARE: f64 = 0.05;
/// Share of the run spent in the surge with `--phases`.
const SURGE_SHARE: f64 = 1.0 / 3.0;
/// The calibrated target is at least the hottest key's rate over this: the
/// key's partition then runs under the target, with room for the
/// balancer's split fill (0.9 x target) and a little company.
const HEAD_KEY_FILL: f64 = 0.85;

/// Arguments of `fissionlog simulate`.
#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// Log directory (default: a fresh temporary directory, removed at the
    /// end unless --keep; a given directory is always kept).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the temporary directory.
    #[arg(long)]
    pub keep: bool,
    /// Seconds to produce (default 10, or 30 with --phases: the 10 s and 60 s
    /// rate windows need a long calm before partitions count as cold);
    /// ignored with --records.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Produce exactly this many records instead of running for a time.
    #[arg(long)]
    pub records: Option<u64>,
    /// Number of Zipf-distributed keys.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u32,
    /// Zipf exponent.
    #[arg(long, default_value_t = 1.1)]
    pub zipf: f64,
    /// Share of all records carried by one extra hot key (0..1).
    #[arg(long)]
    pub hot_key_share: Option<f64>,
    /// Partitions the topic is created with.
    #[arg(long, default_value_t = 4)]
    pub partitions: u32,
    /// Producer threads.
    #[arg(long, default_value_t = 2)]
    pub producers: u32,
    /// Bytes per value (at least 16: producer, key and sequence number).
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Balancer target per partition, bytes/s (skips calibration).
    #[arg(long)]
    pub target_bytes_per_sec: Option<f64>,
    /// Balancer target per partition, records/s (skips calibration).
    #[arg(long)]
    pub target_records_per_sec: Option<f64>,
    /// Most active partitions the balancer may create.
    #[arg(long, default_value_t = 32)]
    pub max_partitions: u32,
    /// A partition splits when its 1 s rate exceeds this many times the
    /// target (the balancer's `hot_factor`; the library default is 2.0, the
    /// demo reacts sooner).
    #[arg(long, default_value_t = 1.3)]
    pub hot_factor: f64,
    /// A surge, then a calm phase at 5% of the surge rate (shows merges).
    #[arg(long)]
    pub phases: bool,
    /// Turn the automatic balancer off (static partitioning).
    #[arg(long)]
    pub no_balance: bool,
    /// Seed of the key choice (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one JSON document instead of the live view and table.
    #[arg(long)]
    pub json: bool,
    /// Read the topic with a consumer group of N members (threads) instead
    /// of one reader; the summary adds rebalances, pauses, end-to-end
    /// latency and failure detection.
    #[arg(long, value_name = "N")]
    pub consumers: Option<u32>,
    /// Member 0 of the group processes this many times slower than the
    /// others (with --processing-us).
    #[arg(long, value_name = "FACTOR", requires = "consumers")]
    pub slow_consumer: Option<f64>,
    /// The last member of the group stops without leaving this many
    /// seconds into the run (needs at least 2 consumers).
    #[arg(long, value_name = "SECONDS", requires = "consumers")]
    pub kill_consumer_at: Option<f64>,
    /// Simulated processing time per record of each member, microseconds.
    #[arg(long, value_name = "US", requires = "consumers")]
    pub processing_us: Option<f64>,
    /// Limit the producers to this many records/s in total (default: as
    /// fast as they go). Without a --target-*, the balancer's target is
    /// then this rate over twice the initial partitions (no calibration).
    #[arg(long, value_name = "RECORDS_PER_SEC")]
    pub rate: Option<f64>,
    /// How much order the hot key of --hot-key-share keeps: strict (one
    /// lane), windowed (time windows rotating over one lane per initial
    /// partition, in order within each window) or spread (round-robin, no
    /// order).
    #[arg(long, value_enum, default_value_t = HotKeyModeArg::Strict, requires = "hot_key_share")]
    pub hot_key_mode: HotKeyModeArg,
    /// Window length of --hot-key-mode windowed, in ms.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    pub hot_key_window_ms: u64,
}

/// `--hot-key-mode`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HotKeyModeArg {
    /// One lane, per-key order.
    Strict,
    /// Time windows over lanes, order within each window.
    Windowed,
    /// Round-robin over lanes, no order.
    Spread,
}

/// Runs the simulation; exit 0 when no order violation, missing or
/// duplicate record was found, 1 otherwise, 2 on a usage error or an
/// unusable directory.
pub fn run(args: &SimulateArgs) -> ExitCode {
    let plan = match Plan::from_args(args) {
        Ok(p) => p,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::from(2);
        }
    };
    let (dir, temporary) = match prepare_dir(args.dir.as_deref()) {
        Ok(d) => d,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::from(2);
        }
    };
    let keep = !temporary || args.keep;
    let result = simulate(&plan, &dir, keep);
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    match result {
        Ok(report) => {
            if plan.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("error: cannot encode the report: {e}");
                        return ExitCode::from(1);
                    }
                }
            } else {
                report.print_text();
            }
            if report.clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(Failure::Setup(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Run(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
    }
}

/// Why a simulation could not produce a report.
enum Failure {
    /// The directory or log is unusable (exit 2).
    Setup(String),
    /// Something failed while running (exit 1).
    Run(String),
}

/// The directory to use and whether it is a temporary one.
fn prepare_dir(dir: Option<&Path>) -> Result<(PathBuf, bool), String> {
    if let Some(d) = dir {
        return Ok((d.to_path_buf(), false));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let d = std::env::temp_dir().join(format!(
        "fissionlog-simulate-{}-{nanos:09}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d)
        .map_err(|e| format!("cannot create the temporary directory {}: {e}", d.display()))?;
    Ok((d, true))
}

/// Opens the log, calibrates, runs, checks, closes.
fn simulate(plan: &Plan, dir: &Path, keep: bool) -> Result<Report, Failure> {
    let log = open_empty_log(dir)?;
    let events = log.subscribe();
    let targets = Targets::of(&log, plan)?;
    let topic = log
        .create_topic(TOPIC, plan.topic_config(targets.policy(plan)))
        .map_err(|e| Failure::Setup(format!("cannot create topic {TOPIC}: {e}")))?;
    if !plan.json {
        println!("simulating into {} ...", dir.display());
    }
    let hashes = key_hashes(&topic, plan.workload.keys);
    let hot_key = hot_key_bytes();
    if plan.workload.hot_key_share.is_some() && plan.hot_key_mode != HotKeyMode::Strict {
        topic
            .set_hot_key_mode(&hot_key, plan.hot_key_mode)
            .map_err(|e| Failure::Setup(format!("cannot set the hot key's mode: {e}")))?;
    }
    let mut outcome = drive(plan, &topic, &events)?;
    let hot = match plan.workload.hot_key_share {
        Some(_) => match hot_key_summary(&topic, &hot_key, plan.hot_key_mode) {
            Ok(h) => Some(h),
            Err(e) => {
                outcome
                    .errors
                    .push(format!("reading the hot key back failed: {e}"));
                None
            }
        },
        None => None,
    };
    if let Err(e) = log.close() {
        outcome.errors.push(format!("closing the log failed: {e}"));
    }
    let run = RunSummary {
        dir,
        keep,
        targets: &targets,
        hashes: &hashes,
        hot: hot.as_ref(),
    };
    Ok(report_of(plan, &run, outcome))
}

/// The log in `dir`, refused if it already holds one of the simulation's
/// topics.
fn open_empty_log(dir: &Path) -> Result<Log, Failure> {
    let log = Log::open(dir, LogOptions::default())
        .map_err(|e| Failure::Setup(format!("cannot open a log in {}: {e}", dir.display())))?;
    for name in [TOPIC, CALIBRATION_TOPIC] {
        if log.topics().iter().any(|t| t == name) {
            return Err(Failure::Setup(format!(
                "{} already holds a topic named {name}; use an empty directory",
                dir.display()
            )));
        }
    }
    Ok(log)
}

/// The balancer's per-partition targets of a run, and the calibrated rate
/// they came from, if any.
struct Targets {
    records_per_sec: Option<f64>,
    bytes_per_sec: Option<f64>,
    calibrated: Option<f64>,
}

impl Targets {
    /// The targets given, else derived from `--rate`, else calibrated (see
    /// the module comment). No targets without a balancer.
    fn of(log: &Log, plan: &Plan) -> Result<Targets, Failure> {
        let mut calibrated = None;
        let (mut target_records, target_bytes) =
            (plan.target_records_per_sec, plan.target_bytes_per_sec);
        if let (Some(rate), true, None, None) =
            (plan.rate, plan.balance, target_records, target_bytes)
        {
            target_records = Some((rate / (2.0 * f64::from(plan.partitions))).max(1.0));
        }
        if plan.balance && target_records.is_none() && target_bytes.is_none() {
            if !plan.json {
                println!("calibrating for {} s ...", CALIBRATION.as_secs_f64());
            }
            let measured = calibrate(log, plan)?;
            calibrated = Some(measured);
            let spread = measured / (2.0 * f64::from(plan.partitions));
            let head = measured * plan.workload.head_share() / HEAD_KEY_FILL;
            target_records = Some(spread.max(head).max(1.0));
        }
        Ok(Targets {
            records_per_sec: target_records,
            bytes_per_sec: target_bytes,
            calibrated,
        })
    }

    /// The balance policy of the simulated topic.
    fn policy(&self, plan: &Plan) -> BalancePolicy {
        BalancePolicy {
            enabled: plan.balance,
            target_bytes_per_sec: self.bytes_per_sec,
            target_records_per_sec: self.records_per_sec,
            min_age: Duration::from_secs(1),
            check_interval: Duration::from_millis(250),
            max_partitions: plan.max_partitions,
            hot_factor: plan.hot_factor,
            ..BalancePolicy::default()
        }
    }
}

/// What the report needs of a run besides its [`Outcome`].
struct RunSummary<'a> {
    dir: &'a Path,
    keep: bool,
    targets: &'a Targets,
    hashes: &'a [u64],
    hot: Option<&'a HotKeySummary>,
}

/// The active partitions at the end of a run and their load over the
/// imbalance window.
struct ActiveView {
    partitions: Vec<PartitionRow>,
    load: report::WindowLoad,
    imbalance_without_hot_keys: Option<f64>,
    single_key_partitions: usize,
}

impl ActiveView {
    fn of(outcome: &Outcome) -> ActiveView {
        let mut active: Vec<&PartitionInfo> = outcome
            .final_infos
            .iter()
            .filter(|p| p.sealed_at.is_none())
            .collect();
        active.sort_by_key(|p| p.start);
        let ids: Vec<u32> = active.iter().map(|p| p.id).collect();
        let window = IMBALANCE_WINDOW_SECS.min(outcome.seconds);
        let load = window_load(&outcome.samples, &ids, window);
        let total_rate: f64 = load.rates.values().sum();
        let multi_key: Vec<u32> = active
            .iter()
            .filter(|p| p.start < p.end)
            .map(|p| p.id)
            .collect();
        let imbalance_without_hot_keys = if multi_key.len() == ids.len() {
            load.imbalance
        } else {
            window_load(&outcome.samples, &multi_key, window).imbalance
        };
        let partitions: Vec<PartitionRow> = active
            .iter()
            .map(|p| {
                let rate = load.rates.get(&p.id).copied();
                PartitionRow {
                    id: p.id,
                    start: format!("{:016x}", p.start),
                    end: format!("{:016x}", p.end),
                    parents: p.parents.clone(),
                    records: p.end_offset - p.start_offset,
                    bytes: p.bytes,
                    records_per_sec: rate,
                    share: rate.filter(|_| total_rate > 0.0).map(|r| r / total_rate),
                    // Isolated by the balancer, whether or not still reported hot.
                    hot_key: p.hot_key || p.start == p.end,
                }
            })
            .collect();
        let single_key_partitions = active.iter().filter(|p| p.start == p.end).count();
        ActiveView {
            partitions,
            load,
            imbalance_without_hot_keys,
            single_key_partitions,
        }
    }
}

/// The report of a finished run: one field per figure, so this stays one
/// struct literal (the figures themselves are computed in [`ActiveView`]).
fn report_of(plan: &Plan, run: &RunSummary, outcome: Outcome) -> Report {
    let view = ActiveView::of(&outcome);
    let bytes: u64 = outcome.final_infos.iter().map(|p| p.bytes).sum();
    let seconds = outcome.seconds.max(1e-9);
    let mut per_key = vec![0u64; run.hashes.len()];
    for producer in &outcome.acked {
        for (total, n) in per_key.iter_mut().zip(producer) {
            *total += n;
        }
    }
    let load = &view.load;
    let max_partition_records_per_sec = load.rates.values().copied().reduce(f64::max);
    let cmp = outcome.checker.compare(&outcome.acked);
    let tally = outcome.tally;
    let target_records = run.targets.records_per_sec;
    let hot = run.hot;
    let partitions_active = view.partitions.len();
    Report {
        dir: run.dir.display().to_string(),
        kept: run.keep,
        seed: plan.workload.seed,
        records: outcome.records,
        bytes,
        payload_bytes: outcome.payload_bytes,
        seconds: outcome.seconds,
        records_per_sec: outcome.records as f64 / seconds,
        mb_per_sec: bytes as f64 / seconds / 1e6,
        producers: plan.workload.producers,
        keys: plan.workload.keys,
        zipf: plan.workload.zipf_exponent,
        hot_key_share: plan.workload.hot_key_share,
        balance: plan.balance,
        calibrated_records_per_sec: run.targets.calibrated,
        target_records_per_sec: target_records,
        target_bytes_per_sec: run.targets.bytes_per_sec,
        partitions_initial: plan.partitions,
        partitions_active,
        splits: tally.splits,
        merges: tally.merges,
        hot_keys: view.single_key_partitions,
        hot_key_reports: tally.hot_keys,
        single_key_partitions: view.single_key_partitions,
        imbalance: load.imbalance,
        imbalance_static: load.imbalance_static,
        imbalance_static_same_count: report::static_imbalance(
            run.hashes,
            &per_key,
            partitions_active,
        ),
        busiest_over_target: max_partition_records_per_sec
            .zip(target_records)
            .map(|(r, t)| r / t),
        converged_after_s: plan.balance.then(|| tally.last_change.unwrap_or(0.0)),
        imbalance_without_hot_keys: view.imbalance_without_hot_keys,
        max_partition_records_per_sec,
        max_partition_records_per_sec_static: load.static_max_records_per_sec,
        imbalance_window_secs: load.window_secs,
        first_split_after_secs: tally.first_split,
        hot_key_mode: hot.map(|h| h.mode.clone()),
        hot_key_lanes: hot.map(|h| h.lane_loads.len()),
        hot_key_lane_loads: hot.map(|h| h.lane_loads.clone()),
        hot_key_lane_imbalance: hot.and_then(|h| h.lane_imbalance),
        hot_key_read_order_violations: hot.and_then(|h| h.read_order_violations),
        order_violations: outcome.checker.order_violations,
        missing_records: cmp.missing,
        duplicate_records: outcome.checker.duplicates,
        unacknowledged_records: cmp.unacknowledged,
        malformed_records: outcome.checker.malformed,
        records_read: outcome.checker.received,
        errors: outcome.errors,
        phases: outcome.phases,
        events: tally.notes,
        partitions: view.partitions,
        group: outcome.group,
    }
}

/// The key bytes of the `--hot-key-share` key.
fn hot_key_bytes() -> Vec<u8> {
    let mut buf = [0u8; 24];
    let n = write_key(&mut buf, workload::HOT_KEY_ID);
    buf[..n].to_vec()
}

/// What reading the hot key back in per-key order found.
struct HotKeySummary {
    mode: String,
    lane_loads: Vec<u64>,
    lane_imbalance: Option<f64>,
    read_order_violations: Option<u64>,
}

/// Reads the hot key back with the strict key reader: its records per lane
/// of the mode's era, and (strict and windowed) how many came after a later
/// record of their producer, which per-key order forbids.
fn hot_key_summary(
    topic: &Topic,
    key: &[u8],
    mode: HotKeyMode,
) -> fissionlog::Result<HotKeySummary> {
    let last_era = topic.key_lanes(key).eras.len() - 1;
    let lanes = topic.key_lanes(key).eras[last_era].lanes.len();
    let mut lane_loads = vec![0u64; lanes];
    let mut next: BTreeMap<u32, u64> = BTreeMap::new();
    let mut violations = 0u64;
    // Streamed: the key's whole history never sits in memory at once.
    for r in topic.key_reader(key) {
        let r = r?;
        if r.era == last_era {
            lane_loads[r.lane] += 1;
        }
        if let Some((p, _, seq)) = workload::decode_value(&r.value) {
            let n = next.entry(p).or_default();
            if seq < *n {
                violations += 1;
            }
            *n = (*n).max(seq + 1);
        }
    }
    let mean = lane_loads.iter().sum::<u64>() as f64 / lanes as f64;
    let max = lane_loads.iter().copied().max().unwrap_or(0) as f64;
    Ok(HotKeySummary {
        mode: match mode {
            HotKeyMode::Strict => "strict".into(),
            HotKeyMode::Windowed(d) => format!("windowed({} ms)", d.as_millis()),
            HotKeyMode::Spread => "spread".into(),
        },
        lane_loads,
        lane_imbalance: (mean > 0.0).then(|| max / mean),
        read_order_violations: (mode != HotKeyMode::Spread).then_some(violations),
    })
}

/// Runs the producers (and a consumer, so the machine is as busy as in the
/// real run) against a throwaway topic without balancing; returns the
/// records/s they reached.
fn calibrate(log: &Log, plan: &Plan) -> Result<f64, Failure> {
    let policy = BalancePolicy {
        enabled: false,
        ..BalancePolicy::default()
    };
    let topic = log
        .create_topic(CALIBRATION_TOPIC, plan.topic_config(policy))
        .map_err(|e| Failure::Setup(format!("cannot create topic {CALIBRATION_TOPIC}: {e}")))?;
    let shared = Shared::new(None, 1);
    let consumer_shared = ConsumerShared::default();
    let range_of_key = vec![0u32; plan.workload.keys as usize + 1];
    let started = Instant::now();
    let elapsed = std::thread::scope(|s| {
        let consumer = s.spawn(|| {
            consume(
                &topic,
                plan.workload.producers as usize,
                plan.workload.keys as usize + 1,
                &consumer_shared,
            )
        });
        let producers: Vec<_> = (0..plan.workload.producers)
            .map(|p| {
                let (topic, shared, range_of_key) = (&topic, &shared, &range_of_key);
                s.spawn(move || produce(topic, &plan.workload, p, shared, range_of_key))
            })
            .collect();
        std::thread::sleep(CALIBRATION);
        shared.stop.store(true, Ordering::Release);
        for p in producers {
            let _ = p.join();
        }
        let elapsed = started.elapsed();
        consumer_shared.stop_now.store(true, Ordering::Release);
        let _ = consumer.join();
        elapsed
    });
    let acked = shared.acked.load(Ordering::Acquire);
    if let Some(e) = shared.errors.lock().first() {
        return Err(Failure::Run(format!("calibration failed: {e}")));
    }
    drop(topic);
    log.delete_topic(CALIBRATION_TOPIC)
        .map_err(|e| Failure::Run(format!("cannot delete topic {CALIBRATION_TOPIC}: {e}")))?;
    Ok(acked as f64 / elapsed.as_secs_f64().max(1e-3))
}

/// What [`drive`] measured.
struct Outcome {
    seconds: f64,
    records: u64,
    payload_bytes: u64,
    samples: Vec<Sample>,
    final_infos: Vec<PartitionInfo>,
    acked: Vec<Vec<u64>>,
    checker: check::Checker,
    tally: Tally,
    phases: Option<PhasesReport>,
    errors: Vec<String>,
    group: Option<group::GroupReport>,
}

/// The routing hash of every key id `0..=keys`.
fn key_hashes(topic: &Topic, keys: u32) -> Vec<u64> {
    let mut key = [0u8; 24];
    (0..=keys)
        .map(|k| {
            let len = write_key(&mut key, k);
            topic.hash(&key[..len])
        })
        .collect()
}

/// The index of the initial range holding each key's hash.
fn initial_range_of_keys(topic: &Topic, keys: u32) -> (Vec<u32>, usize) {
    let mut starts: Vec<u64> = topic.partitions().iter().map(|p| p.start).collect();
    starts.sort_unstable();
    let table = key_hashes(topic, keys)
        .into_iter()
        .map(|h| (starts.partition_point(|&s| s <= h).max(1) - 1) as u32)
        .collect();
    (table, starts.len())
}

/// What the producers share: the `--records` budget, the `--rate` limit
/// and the per-range counters of `ranges` initial ranges.
fn producer_shared(plan: &Plan, ranges: usize) -> Shared {
    let budget = match plan.stop {
        Stop::Records(n) => Some(n),
        Stop::After(_) => None,
    };
    let shared = Shared::new(budget, ranges);
    if let Some(rate) = plan.rate {
        shared.set_limit_per_producer(rate / f64::from(plan.workload.producers.max(1)));
    }
    shared
}

/// The acknowledged counts of each producer, and an error per producer
/// thread that panicked.
fn join_producers<T>(
    producers: Vec<std::thread::ScopedJoinHandle<'_, T>>,
) -> (Vec<T>, Vec<String>) {
    let mut acked = Vec::new();
    let mut errors = Vec::new();
    for p in producers {
        match p.join() {
            Ok(a) => acked.push(a),
            Err(_) => errors.push("a producer thread panicked".to_string()),
        }
    }
    (acked, errors)
}

/// Runs producers, consumer and monitor on the simulated topic.
fn drive(plan: &Plan, topic: &Topic, events: &Receiver<TopologyEvent>) -> Result<Outcome, Failure> {
    let (range_of_key, ranges) = initial_range_of_keys(topic, plan.workload.keys);
    let shared = producer_shared(plan, ranges);
    let consumer_shared = ConsumerShared {
        hot_order: plan.hot_order(),
        ..ConsumerShared::default()
    };
    let mut monitor = Monitor::new(plan);
    monitor.sample(topic, &shared);
    std::thread::scope(|s| {
        let consumer = s.spawn(|| {
            let (producers, keys) = (
                plan.workload.producers as usize,
                plan.workload.keys as usize + 1,
            );
            match plan.group {
                Some(g) => group::consume_group(topic, g, producers, keys, &consumer_shared)
                    .map(|(c, r)| (c, Some(r))),
                None => consume(topic, producers, keys, &consumer_shared).map(|c| (c, None)),
            }
        });
        let producers: Vec<_> = (0..plan.workload.producers)
            .map(|p| {
                let (shared, range_of_key) = (&shared, &range_of_key);
                s.spawn(move || produce(topic, &plan.workload, p, shared, range_of_key))
            })
            .collect();
        while !producers.iter().all(|p| p.is_finished()) {
            std::thread::sleep(SAMPLE_EVERY);
            monitor.sample(topic, &shared);
            monitor.events(events);
            if monitor.steer(&shared) {
                shared.stop.store(true, Ordering::Release);
            }
            monitor.draw(&consumer_shared, &shared);
        }
        shared.stop.store(true, Ordering::Release);
        let (acked, mut errors) = join_producers(producers);
        let final_infos = monitor.sample(topic, &shared);
        monitor.events(events);
        let records = shared.acked.load(Ordering::Acquire);
        consumer_shared
            .final_acked
            .store(records, Ordering::Release);
        consumer_shared
            .producers_done
            .store(true, Ordering::Release);
        if let Some(live) = &monitor.live {
            live.event(&format!(
                "producers stopped after {records} records; draining the consumer ..."
            ));
        }
        let (checker, group) = match consumer.join() {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(Failure::Run(e)),
            Err(_) => return Err(Failure::Run("the consumer thread panicked".into())),
        };
        let t = monitor.samples.last().map_or(0.0, |s| s.t);
        monitor.tally.drain(events, t);
        if let Some(live) = &monitor.live {
            live.finish();
        }
        errors.extend(shared.errors.lock().iter().cloned());
        let phases = monitor.phases_report(&shared);
        Ok(Outcome {
            seconds: t,
            records,
            payload_bytes: shared.payload_bytes.load(Ordering::Acquire),
            samples: monitor.samples,
            final_infos,
            acked,
            checker,
            tally: monitor.tally,
            phases,
            errors,
            group,
        })
    })
}
