//! A topic's configuration as the manifest records it.
//!
//! These records are the file format's own: their serde names are the
//! manifest's JSON keys, fixed by the files already written, and they do
//! not follow the public `TopicConfig`. `config.rs` converts between the
//! two, so a public field can be renamed or retyped without changing a
//! byte on disk (the conversion changes instead).
//!
//! The JSON is the one manifests have always held: a `TopicConfig` was
//! serialized directly until these records existed, and the tests below
//! decode that text. Defaults fill fields absent from older manifests
//! (`balance` and `hot_keys` in whole, or any field inside them); they are
//! the values those manifests meant, written here rather than taken from
//! the API, whose defaults may move.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Per-topic configuration (see `TopicConfig` for what each field means).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicConfigRecord {
    /// Partitions created with the topic.
    pub partitions: u32,
    /// Size of each segment file.
    pub segment_bytes: u64,
    /// One sparse index entry per this many bytes of data.
    pub index_interval_bytes: u32,
    /// Largest encoded record.
    pub max_record_bytes: u32,
    /// Durability policy.
    pub sync: SyncPolicyRecord,
    /// Age past which sealed segments are deleted.
    pub retention_age: Option<Duration>,
    /// Bytes past which the oldest sealed segments are deleted.
    pub retention_bytes: Option<u64>,
    /// Balancer tunables (absent in the oldest manifests).
    #[serde(default)]
    pub balance: BalancePolicyRecord,
    /// Hot-key rules (absent in manifests written before hot-key modes).
    #[serde(default)]
    pub hot_keys: HotKeyPolicyRecord,
    /// Partitions are Raft logs with format-2 segments (absent before
    /// replication existed: false, and not written when false, so an
    /// unreplicated topic's record keeps its bytes).
    #[serde(default, skip_serializing_if = "is_false")]
    pub replicated: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// When appended data is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncPolicyRecord {
    /// Only on `sync()` and on clean close.
    Never,
    /// A background thread syncs at this interval.
    Interval(Duration),
    /// Every append returns only once durable.
    Always,
}

/// The balancer's tunables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BalancePolicyRecord {
    /// Master switch.
    pub enabled: bool,
    /// Target bytes/s per partition.
    pub target_bytes_per_sec: Option<f64>,
    /// Target records/s per partition.
    pub target_records_per_sec: Option<f64>,
    /// Hot above this multiple of the target (shortest window).
    pub hot_factor: f64,
    /// Cold below this fraction of the target (every window).
    pub cold_fraction: f64,
    /// A merge stays below this fraction of the target.
    pub merge_fraction: f64,
    /// Cooldown after a partition's last topology change.
    pub min_age: Duration,
    /// Merges stop at this many active partitions.
    pub min_partitions: u32,
    /// Splits stop at this many active partitions.
    pub max_partitions: u32,
    /// Top-key share of a partition's load that isolates the key.
    pub hot_key_share: f64,
    /// How often the background balancer decides.
    pub check_interval: Duration,
}

impl Default for BalancePolicyRecord {
    fn default() -> Self {
        BalancePolicyRecord {
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

/// A topic's rules for hot-key modes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HotKeyPolicyRecord {
    /// `Windowed` may be set on a key.
    pub allow_windowed: bool,
    /// `Spread` may be set on a key.
    pub allow_spread: bool,
    /// Most lanes one key spreads over.
    pub max_lanes: u32,
    /// Window the balancer gives a key still hot alone, once.
    pub auto_window: Option<Duration>,
}

impl Default for HotKeyPolicyRecord {
    fn default() -> Self {
        HotKeyPolicyRecord {
            allow_windowed: false,
            allow_spread: false,
            max_lanes: 4,
            auto_window: None,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A topic's configuration as a manifest written before these records
    /// existed holds it (every field set away from its default).
    pub(crate) const CUSTOM_JSON: &str = r#"{"partitions":3,"segment_bytes":1048576,"index_interval_bytes":1024,"max_record_bytes":4096,"sync":{"Interval":{"secs":1,"nanos":500000000}},"retention_age":{"secs":3600,"nanos":0},"retention_bytes":1073741824,"balance":{"enabled":false,"target_bytes_per_sec":1000000.0,"target_records_per_sec":5000.0,"hot_factor":3.0,"cold_fraction":0.25,"merge_fraction":0.4,"min_age":{"secs":5,"nanos":0},"min_partitions":2,"max_partitions":32,"hot_key_share":0.6,"check_interval":{"secs":0,"nanos":100000000}},"hot_keys":{"allow_windowed":true,"allow_spread":true,"max_lanes":8,"auto_window":{"secs":0,"nanos":200000000}}}"#;

    /// The default configuration, as such a manifest holds it.
    pub(crate) const DEFAULT_JSON: &str = r#"{"partitions":1,"segment_bytes":134217728,"index_interval_bytes":4096,"max_record_bytes":1048576,"sync":"Never","retention_age":null,"retention_bytes":null,"balance":{"enabled":true,"target_bytes_per_sec":null,"target_records_per_sec":null,"hot_factor":2.0,"cold_fraction":0.3,"merge_fraction":0.5,"min_age":{"secs":10,"nanos":0},"min_partitions":1,"max_partitions":64,"hot_key_share":0.5,"check_interval":{"secs":0,"nanos":250000000}},"hot_keys":{"allow_windowed":false,"allow_spread":false,"max_lanes":4,"auto_window":null}}"#;

    /// The oldest shape: no balance or hot-key fields, `Always` sync.
    pub(crate) const OLDEST_JSON: &str = r#"{"partitions":2,"segment_bytes":65536,"index_interval_bytes":4096,"max_record_bytes":1048576,"sync":"Always","retention_age":null,"retention_bytes":null}"#;

    fn custom() -> TopicConfigRecord {
        TopicConfigRecord {
            partitions: 3,
            segment_bytes: 1 << 20,
            index_interval_bytes: 1024,
            max_record_bytes: 4096,
            sync: SyncPolicyRecord::Interval(Duration::from_millis(1500)),
            retention_age: Some(Duration::from_secs(3600)),
            retention_bytes: Some(1 << 30),
            balance: BalancePolicyRecord {
                enabled: false,
                target_bytes_per_sec: Some(1e6),
                target_records_per_sec: Some(5000.0),
                hot_factor: 3.0,
                cold_fraction: 0.25,
                merge_fraction: 0.4,
                min_age: Duration::from_secs(5),
                min_partitions: 2,
                max_partitions: 32,
                hot_key_share: 0.6,
                check_interval: Duration::from_millis(100),
            },
            hot_keys: HotKeyPolicyRecord {
                allow_windowed: true,
                allow_spread: true,
                max_lanes: 8,
                auto_window: Some(Duration::from_millis(200)),
            },
            replicated: false,
        }
    }

    #[test]
    fn a_config_written_before_the_record_existed_decodes_field_for_field() {
        let rec: TopicConfigRecord = serde_json::from_str(CUSTOM_JSON).expect("decodes");
        assert_eq!(rec, custom());
    }

    #[test]
    fn a_config_record_encodes_to_the_same_json_manifests_already_hold() {
        assert_eq!(
            serde_json::to_string(&custom()).expect("encodes"),
            CUSTOM_JSON
        );
        let back: TopicConfigRecord =
            serde_json::from_str(&serde_json::to_string(&custom()).expect("encodes"))
                .expect("decodes");
        assert_eq!(back, custom());
    }

    #[test]
    fn a_config_without_balance_or_hot_key_fields_decodes_to_their_defaults() {
        let rec: TopicConfigRecord = serde_json::from_str(OLDEST_JSON).expect("decodes");
        assert_eq!(rec.sync, SyncPolicyRecord::Always);
        assert_eq!(rec.balance, BalancePolicyRecord::default());
        assert_eq!(rec.hot_keys, HotKeyPolicyRecord::default());
        assert!(!rec.replicated);
        let partial: BalancePolicyRecord =
            serde_json::from_str(r#"{"enabled":false}"#).expect("decodes");
        assert_eq!(
            partial,
            BalancePolicyRecord {
                enabled: false,
                ..BalancePolicyRecord::default()
            }
        );
    }

    #[test]
    fn a_replicated_config_round_trips_and_an_unreplicated_one_keeps_its_bytes() {
        let rec = TopicConfigRecord {
            replicated: true,
            ..custom()
        };
        let json = serde_json::to_string(&rec).expect("encodes");
        assert!(json.ends_with(r#","replicated":true}"#), "{json}");
        let back: TopicConfigRecord = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, rec);
        let old: TopicConfigRecord = serde_json::from_str(CUSTOM_JSON).expect("decodes");
        assert!(!old.replicated);
    }
}
