//! Tunables of the balancer and their validation.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::WindowRate;

/// Reads one rate (bytes/s or records/s) out of a [`WindowRate`].
pub(crate) type RateOf = fn(&WindowRate) -> f64;

/// Tunables of the balancer.
///
/// Stability comes from three mechanisms, enforced by [`BalancePolicy::validate`]
/// and applied by the balancer (`balance::decide`, behind
/// [`crate::Log::balance_now`] and the background thread):
///
/// - hysteresis: hot means above the target, cold means every window below
///   `cold_fraction` (< 0.5) of it, and a merge must stay below
///   `merge_fraction` (<= 0.8) of the target, so the halves of a split are
///   not cold and the result of a merge is not hot;
/// - a minimum age since a partition's last topology change;
/// - a single-value partition `[h, h]` is never split (it cannot be): it is
///   reported once as a hot key, which stops a scale storm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BalancePolicy {
    /// Master switch (default true; with no target set nothing happens).
    pub enabled: bool,
    /// Target bytes/s per partition (default none).
    pub target_bytes_per_sec: Option<f64>,
    /// Target records/s per partition (default none).
    pub target_records_per_sec: Option<f64>,
    /// Hot when the shortest window exceeds `hot_factor × target`
    /// (default 2.0), or the longest window exceeds the target.
    pub hot_factor: f64,
    /// Cold when every window is below `cold_fraction × target`
    /// (default 0.3).
    pub cold_fraction: f64,
    /// Two adjacent cold partitions merge only if their combined rate stays
    /// below `merge_fraction × target` in every window (default 0.5).
    pub merge_fraction: f64,
    /// Cooldown: no decision on a partition younger than this since its
    /// creation or last topology change (default 10 s).
    pub min_age: Duration,
    /// Merges stop at this many active partitions (default 1).
    pub min_partitions: u32,
    /// Splits stop at this many active partitions (default 64).
    pub max_partitions: u32,
    /// A hot partition whose top key carries more than this share of its
    /// load isolates that key instead of splitting at the median
    /// (default 0.5).
    pub hot_key_share: f64,
    /// How often the background balancer runs its decision (default 250 ms).
    pub check_interval: Duration,
}

impl Default for BalancePolicy {
    fn default() -> Self {
        BalancePolicy {
            enabled: true,
            target_bytes_per_sec: None,
            target_records_per_sec: None,
            hot_factor: 2.0,
            cold_fraction: 0.3,
            merge_fraction: 0.5,
            min_age: Duration::from_secs(10),
            min_partitions: 1,
            max_partitions: 64,
            hot_key_share: 0.5,
            check_interval: Duration::from_millis(250),
        }
    }
}

impl BalancePolicy {
    /// Checks that the tunables make a stable policy; the message is one
    /// sentence naming the offending field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, target) in [
            ("target_bytes_per_sec", self.target_bytes_per_sec),
            ("target_records_per_sec", self.target_records_per_sec),
        ] {
            if let Some(t) = target {
                if !(t.is_finite() && t > 0.0) {
                    return Err(format!("{name} must be a positive number, not {t}"));
                }
            }
        }
        if !(self.hot_factor.is_finite() && self.hot_factor >= 1.0) {
            return Err(format!(
                "hot_factor must be at least 1, not {}",
                self.hot_factor
            ));
        }
        // The halves of a partition just above target carry about half the
        // target each: a cold threshold at or above that would merge them
        // right back.
        if !(self.cold_fraction >= 0.0 && self.cold_fraction < 0.5) {
            return Err(format!(
                "cold_fraction must be in [0, 0.5) for hysteresis, not {}",
                self.cold_fraction
            ));
        }
        if !(self.merge_fraction > 0.0 && self.merge_fraction <= 0.8) {
            return Err(format!(
                "merge_fraction must be in (0, 0.8] so a merge is not hot at once, not {}",
                self.merge_fraction
            ));
        }
        if !(self.hot_key_share > 0.0 && self.hot_key_share <= 1.0) {
            return Err(format!(
                "hot_key_share must be in (0, 1], not {}",
                self.hot_key_share
            ));
        }
        if self.min_partitions == 0 || self.max_partitions < self.min_partitions {
            return Err(format!(
                "partition limits must satisfy 1 <= min_partitions <= max_partitions, not {} and {}",
                self.min_partitions, self.max_partitions
            ));
        }
        if self.check_interval.is_zero() {
            return Err("check_interval must be positive".to_string());
        }
        Ok(())
    }

    /// The targets that are set, as (selector, target) pairs.
    pub(crate) fn targets(&self) -> Vec<(RateOf, f64)> {
        let mut out: Vec<(RateOf, f64)> = Vec::with_capacity(2);
        if let Some(t) = self.target_bytes_per_sec {
            out.push((|r| r.bytes_per_sec, t));
        }
        if let Some(t) = self.target_records_per_sec {
            out.push((|r| r.records_per_sec, t));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BalancePolicy {
        BalancePolicy {
            target_bytes_per_sec: Some(1e6),
            ..BalancePolicy::default()
        }
    }

    #[test]
    fn defaults_are_valid_and_bad_values_are_rejected() {
        assert_eq!(BalancePolicy::default().validate(), Ok(()));
        let bad = [
            BalancePolicy {
                cold_fraction: 0.9,
                ..policy()
            },
            BalancePolicy {
                cold_fraction: f64::NAN,
                ..policy()
            },
            BalancePolicy {
                hot_factor: 0.5,
                ..policy()
            },
            BalancePolicy {
                merge_fraction: 1.0,
                ..policy()
            },
            BalancePolicy {
                hot_key_share: 0.0,
                ..policy()
            },
            BalancePolicy {
                target_bytes_per_sec: Some(-1.0),
                ..policy()
            },
            BalancePolicy {
                target_records_per_sec: Some(f64::INFINITY),
                ..policy()
            },
            BalancePolicy {
                min_partitions: 0,
                ..policy()
            },
            BalancePolicy {
                min_partitions: 8,
                max_partitions: 4,
                ..policy()
            },
            BalancePolicy {
                check_interval: Duration::ZERO,
                ..policy()
            },
        ];
        for p in bad {
            let err = p.validate().expect_err("invalid policy accepted");
            assert!(!err.is_empty());
        }
    }

    #[test]
    fn serde_fills_missing_fields_with_defaults() {
        // No JSON crate is allowed here, so check the pieces serde uses:
        // `#[serde(default)]` relies on `Default`, which must be valid.
        let p = BalancePolicy::default();
        assert!(p.enabled && p.target_bytes_per_sec.is_none());
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(p.targets().len(), 0);
        assert_eq!(policy().targets().len(), 1);
    }
}
