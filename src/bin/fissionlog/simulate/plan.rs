//! The validated parameters of a `fissionlog simulate` run, checked from
//! its arguments one group of flags at a time.

use std::io::IsTerminal as _;
use std::time::Duration;

use fissionlog::{BalancePolicy, HotKeyMode, HotKeyPolicy};
use fissionlog::{SyncPolicy, TopicConfig, MAX_HOT_KEY_LANES};

use super::workload::{Workload, VALUE_HEADER_BYTES};
use super::{check, group, HotKeyModeArg, SimulateArgs, SEGMENT_BYTES};

/// Most `--keys`: per key the run keeps a hash and counters.
const KEYS_MAX: u32 = 10_000_000;
/// Most `(--keys + 1) x --producers`: each producer keeps a sequence
/// number per key and the checker two counters (24 bytes per stream).
const KEY_STREAMS_MAX: u64 = 20_000_000;
/// Most `--max-partitions` (and so `--partitions`): a topic's limit.
const PARTITIONS_MAX: u32 = 65_536;
/// Most `--records`.
const RECORDS_MAX: u64 = 1_000_000_000_000;
/// Most records/s or bytes/s any rate argument takes.
const RATE_MAX: f64 = 1e12;
/// Most `--slow-consumer` factor.
const SLOW_FACTOR_MAX: f64 = 1e6;

/// When the producers stop.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stop {
    After(Duration),
    Records(u64),
}

/// Validated parameters of a run.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) workload: Workload,
    pub(super) stop: Stop,
    pub(super) partitions: u32,
    pub(super) max_partitions: u32,
    pub(super) hot_factor: f64,
    pub(super) target_bytes_per_sec: Option<f64>,
    pub(super) target_records_per_sec: Option<f64>,
    pub(super) balance: bool,
    pub(super) phases: bool,
    pub(super) json: bool,
    pub(super) group: Option<group::GroupPlan>,
    pub(super) rate: Option<f64>,
    /// The hot key's mode (strict without a hot key).
    pub(super) hot_key_mode: HotKeyMode,
}

impl Plan {
    /// Checks the arguments in a fixed order (the first bad flag is the one
    /// reported) and builds the plan.
    pub(super) fn from_args(a: &SimulateArgs) -> Result<Plan, String> {
        check_workload(a)?;
        check_partitions(a)?;
        check_targets(a)?;
        let stop = stop_of(a)?;
        check_rate(a)?;
        let group = group_of(a)?;
        let hot_key_mode = hot_key_mode_of(a)?;
        let seed = a.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Ok(Plan {
            workload: Workload {
                keys: a.keys,
                zipf_exponent: a.zipf,
                hot_key_share: a.hot_key_share.filter(|&s| s > 0.0),
                value_bytes: a.value_bytes,
                producers: a.producers,
                seed,
            },
            stop,
            partitions: a.partitions,
            max_partitions: a.max_partitions,
            hot_factor: a.hot_factor,
            target_bytes_per_sec: a.target_bytes_per_sec,
            target_records_per_sec: a.target_records_per_sec,
            balance: !a.no_balance,
            phases: a.phases,
            json: a.json,
            group,
            rate: a.rate,
            hot_key_mode,
        })
    }

    pub(super) fn topic_config(&self, balance: BalancePolicy) -> TopicConfig {
        TopicConfig {
            partitions: self.partitions,
            segment_bytes: SEGMENT_BYTES,
            sync: SyncPolicy::Never,
            balance,
            hot_keys: HotKeyPolicy {
                allow_windowed: matches!(self.hot_key_mode, HotKeyMode::Windowed(_)),
                allow_spread: self.hot_key_mode == HotKeyMode::Spread,
                max_lanes: self.partitions.clamp(1, MAX_HOT_KEY_LANES),
                auto_window: None,
            },
            ..TopicConfig::default()
        }
    }

    /// The order the checker holds the hot key to.
    pub(super) fn hot_order(&self) -> check::HotOrder {
        match self.hot_key_mode {
            HotKeyMode::Strict => check::HotOrder::Strict,
            HotKeyMode::Windowed(d) => check::HotOrder::Windowed(d.as_millis() as i64),
            HotKeyMode::Spread => check::HotOrder::Spread,
        }
    }

    /// Whether to draw the live view.
    pub(super) fn live(&self) -> bool {
        !self.json && std::io::stdout().is_terminal()
    }
}

/// `--value-bytes`, `--keys` (alone and times `--producers`), `--zipf` and
/// `--hot-key-share`.
fn check_workload(a: &SimulateArgs) -> Result<(), String> {
    if a.value_bytes < VALUE_HEADER_BYTES {
        return Err(format!(
            "--value-bytes must be at least {VALUE_HEADER_BYTES}, not {}",
            a.value_bytes
        ));
    }
    if a.value_bytes > 1 << 20 {
        return Err(format!(
            "--value-bytes must be at most 1 MiB, not {}",
            a.value_bytes
        ));
    }
    // Every key costs memory: its hash, its load and range counters,
    // and per producer a sequence number and the checker's two
    // counters, so both the key count and keys x producers are bounded.
    if a.keys == 0 || a.keys > KEYS_MAX {
        return Err(format!(
            "--keys must be between 1 and {KEYS_MAX}, not {}",
            a.keys
        ));
    }
    if (u64::from(a.keys) + 1) * u64::from(a.producers) > KEY_STREAMS_MAX {
        return Err(format!(
            "--keys x --producers must be at most {KEY_STREAMS_MAX} (each producer keeps counters per key), not {} x {}",
            a.keys, a.producers
        ));
    }
    if !(a.zipf.is_finite() && a.zipf >= 0.0) {
        return Err(format!("--zipf must be a number >= 0, not {}", a.zipf));
    }
    if let Some(s) = a.hot_key_share {
        if !(s.is_finite() && (0.0..1.0).contains(&s)) {
            return Err(format!("--hot-key-share must be in [0, 1), not {s}"));
        }
    }
    Ok(())
}

/// `--max-partitions`, `--partitions` and `--producers`.
fn check_partitions(a: &SimulateArgs) -> Result<(), String> {
    if a.max_partitions == 0 || a.max_partitions > PARTITIONS_MAX {
        return Err(format!(
            "--max-partitions must be between 1 and {PARTITIONS_MAX}, not {}",
            a.max_partitions
        ));
    }
    if a.partitions == 0 || a.partitions > a.max_partitions {
        return Err(format!(
            "--partitions must be between 1 and --max-partitions ({}), not {}",
            a.max_partitions, a.partitions
        ));
    }
    if a.producers == 0 || a.producers > 256 {
        return Err(format!(
            "--producers must be between 1 and 256, not {}",
            a.producers
        ));
    }
    Ok(())
}

/// `--target-bytes-per-sec` and `--target-records-per-sec`.
fn check_targets(a: &SimulateArgs) -> Result<(), String> {
    for (name, t) in [
        ("--target-bytes-per-sec", a.target_bytes_per_sec),
        ("--target-records-per-sec", a.target_records_per_sec),
    ] {
        if let Some(t) = t {
            if !(t.is_finite() && t > 0.0 && t <= RATE_MAX) {
                return Err(format!("{name} must be in (0, {RATE_MAX:e}], not {t}"));
            }
        }
    }
    Ok(())
}

/// When the producers stop: `--records`, `--seconds`, or the default run
/// length (longer with `--phases`).
fn stop_of(a: &SimulateArgs) -> Result<Stop, String> {
    if a.phases && a.records.is_some() {
        return Err("--phases runs for a time; it cannot be combined with --records".into());
    }
    Ok(match (a.records, a.seconds) {
        (Some(n), _) if n == 0 || n > RECORDS_MAX => {
            return Err(format!(
                "--records must be between 1 and {RECORDS_MAX}, not {n}"
            ))
        }
        (Some(n), _) => Stop::Records(n),
        (None, Some(s)) if !(s.is_finite() && s > 0.0 && s <= 86_400.0) => {
            return Err(format!("--seconds must be in (0, 86400], not {s}"));
        }
        (None, Some(s)) => Stop::After(Duration::from_secs_f64(s)),
        (None, None) => Stop::After(Duration::from_secs(if a.phases { 30 } else { 10 })),
    })
}

/// `--rate`.
fn check_rate(a: &SimulateArgs) -> Result<(), String> {
    if let Some(r) = a.rate {
        if !(r.is_finite() && (1.0..=RATE_MAX).contains(&r)) {
            return Err(format!(
                "--rate must be between 1 and {RATE_MAX:e} records/s, not {r}"
            ));
        }
    }
    Ok(())
}

/// The consumer group of `--consumers`, with `--slow-consumer`,
/// `--processing-us` and `--kill-consumer-at`.
fn group_of(a: &SimulateArgs) -> Result<Option<group::GroupPlan>, String> {
    Ok(match a.consumers {
        None => None,
        Some(n) if n == 0 || n > 64 => {
            return Err(format!("--consumers must be between 1 and 64, not {n}"));
        }
        Some(n) => {
            let slow_factor = a.slow_consumer.unwrap_or(1.0);
            if !(slow_factor.is_finite() && (1.0..=SLOW_FACTOR_MAX).contains(&slow_factor)) {
                return Err(format!(
                    "--slow-consumer must be a factor between 1 and {SLOW_FACTOR_MAX}, not {slow_factor}"
                ));
            }
            let processing_us = a.processing_us.unwrap_or(0.0);
            if !(processing_us.is_finite() && (0.0..=1e6).contains(&processing_us)) {
                return Err(format!(
                    "--processing-us must be between 0 and 1000000, not {processing_us}"
                ));
            }
            let kill_at = match a.kill_consumer_at {
                None => None,
                Some(_) if n < 2 => {
                    return Err("--kill-consumer-at needs at least 2 consumers".into())
                }
                Some(s) if !(s.is_finite() && s > 0.0 && s <= 86_400.0) => {
                    return Err(format!("--kill-consumer-at must be in (0, 86400], not {s}"));
                }
                Some(s) => Some(Duration::from_secs_f64(s)),
            };
            Some(group::GroupPlan {
                consumers: n,
                slow_factor,
                kill_at,
                processing_us,
            })
        }
    })
}

/// `--hot-key-mode`, with `--hot-key-window-ms`.
fn hot_key_mode_of(a: &SimulateArgs) -> Result<HotKeyMode, String> {
    if a.hot_key_window_ms == 0 || a.hot_key_window_ms > 86_400_000 {
        return Err(format!(
            "--hot-key-window-ms must be between 1 and 86400000, not {}",
            a.hot_key_window_ms
        ));
    }
    Ok(match a.hot_key_mode {
        HotKeyModeArg::Strict => HotKeyMode::Strict,
        HotKeyModeArg::Windowed => HotKeyMode::Windowed(Duration::from_millis(a.hot_key_window_ms)),
        HotKeyModeArg::Spread => HotKeyMode::Spread,
    })
}
