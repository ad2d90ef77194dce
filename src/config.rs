//! Configuration of a log and of its topics.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::balance::BalancePolicy;
use crate::error::{Error, Result};
use crate::format::batch::BATCH_HEADER_LEN;
use crate::format::config_record::{
    BalancePolicyRecord, HotKeyPolicyRecord, SyncPolicyRecord, TopicConfigRecord,
};
use crate::format::segment::SEGMENT_HEADER_LEN;
pub use crate::types::HotKeyMode;

/// When appended data is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum SyncPolicy {
    /// Only on `sync()` and on clean close.
    #[default]
    Never,
    /// A background thread syncs at this interval.
    Interval(Duration),
    /// Every append returns only once durable (group commit).
    Always,
}

/// What `open` does with corruption inside data that was known durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum RecoveryMode {
    /// Refuse to open, naming file and byte position.
    #[default]
    Strict,
    /// Cut the partition at the first damaged batch.
    Truncate,
    /// Keep the valid batches after the damage; the lost offsets become a hole.
    Salvage,
}

/// Per-topic configuration, stored in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicConfig {
    /// Partitions created with the topic.
    pub partitions: u32,
    /// Size of each segment file (preallocated and mapped at this size).
    pub segment_bytes: u64,
    /// One sparse index entry per this many bytes of data.
    pub index_interval_bytes: u32,
    /// Largest encoded record (key + value + 16 bytes of framing); records
    /// are also bounded by what fits one segment.
    pub max_record_bytes: u32,
    /// Durability policy.
    pub sync: SyncPolicy,
    /// Delete sealed segments whose newest record is older than this.
    pub retention_age: Option<Duration>,
    /// Delete the oldest sealed segments while a partition holds more than this.
    pub retention_bytes: Option<u64>,
    /// Automatic splitting and merging.
    #[serde(default)]
    pub balance: BalancePolicy,
    /// Which hot-key modes the topic allows, and over how many lanes
    /// (see [`HotKeyMode`] and docs/HOT_KEYS.md). Absent in manifests
    /// written before hot-key modes existed: strict only.
    #[serde(default)]
    pub hot_keys: HotKeyPolicy,
    /// The topic's partitions are Raft logs (docs/REPLICATION.md): their
    /// segments hold batch format 2, each batch stamped with its Raft log
    /// id, and they take appends only through
    /// [`crate::Partition::append_entry`]. Chosen at creation, never
    /// switched for existing data; absent in older manifests (false).
    /// Splits of a replicated topic are the controller's, so the balancer
    /// must be off (`balance.enabled = false`).
    #[serde(default)]
    pub replicated: bool,
}

/// A topic's rules for hot-key modes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HotKeyPolicy {
    /// `Windowed` may be set on a key (default false).
    pub allow_windowed: bool,
    /// `Spread` may be set on a key (default false).
    pub allow_spread: bool,
    /// Most lanes one key spreads over, 1..=64 (default 4).
    pub max_lanes: u32,
    /// When set (and `allow_windowed`), the balancer puts a key whose
    /// single-value partition is still above target into `Windowed` with
    /// this window and `max_lanes` lanes, once (default none).
    pub auto_window: Option<Duration>,
}

impl Default for HotKeyPolicy {
    fn default() -> Self {
        HotKeyPolicy {
            allow_windowed: false,
            allow_spread: false,
            max_lanes: 4,
            auto_window: None,
        }
    }
}

/// Most lanes a hot key may spread over.
pub const MAX_HOT_KEY_LANES: u32 = 64;

impl HotKeyPolicy {
    /// Checks the fields; the message names the offending one.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if !(1..=MAX_HOT_KEY_LANES).contains(&self.max_lanes) {
            return Err(format!(
                "hot_keys.max_lanes must be 1..={MAX_HOT_KEY_LANES}, not {}",
                self.max_lanes
            ));
        }
        if let Some(w) = self.auto_window {
            if w.as_millis() == 0 {
                return Err("hot_keys.auto_window must be at least 1 ms".into());
            }
            if !self.allow_windowed {
                return Err("hot_keys.auto_window needs allow_windowed".into());
            }
        }
        Ok(())
    }
}

impl Default for TopicConfig {
    fn default() -> Self {
        TopicConfig {
            partitions: 1,
            segment_bytes: 128 << 20,
            index_interval_bytes: DEFAULT_INDEX_INTERVAL_BYTES,
            max_record_bytes: 1 << 20,
            sync: SyncPolicy::Never,
            retention_age: None,
            retention_bytes: None,
            balance: BalancePolicy::default(),
            hot_keys: HotKeyPolicy::default(),
            replicated: false,
        }
    }
}

/// The default `index_interval_bytes`.
pub const DEFAULT_INDEX_INTERVAL_BYTES: u32 = 4096;

/// Smallest segment accepted (room for a header and a few batches).
pub const MIN_SEGMENT_BYTES: u64 = 4096;
/// Largest segment accepted: index entries store 32-bit positions.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 32;

/// Smallest step by which an active segment's file grows: a new segment
/// holds its header and this much allocated space.
pub const ALLOC_CHUNK_MIN_BYTES: u64 = 64 << 10;
/// Largest step by which an active segment's file grows. The step doubles
/// with the data in the segment, from [`ALLOC_CHUNK_MIN_BYTES`] up to this.
pub const ALLOC_CHUNK_MAX_BYTES: u64 = 2 << 20;
/// Most allocated but unwritten bytes an active segment holds ahead of its
/// writer (two steps plus page rounding). Sealed segments hold none.
pub const ACTIVE_HEADROOM_MAX_BYTES: u64 = 2 * ALLOC_CHUNK_MAX_BYTES + 4096;

impl TopicConfig {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if self.partitions == 0 || self.partitions > 65_536 {
            return bad(format!(
                "partitions must be 1..=65536, got {}",
                self.partitions
            ));
        }
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&self.segment_bytes) {
            return bad(format!(
                "segment_bytes must be {MIN_SEGMENT_BYTES}..={MAX_SEGMENT_BYTES}, got {}",
                self.segment_bytes
            ));
        }
        if self.index_interval_bytes == 0 {
            return bad("index_interval_bytes must be > 0".into());
        }
        if self.max_record_bytes < 16 {
            return bad(format!(
                "max_record_bytes must be at least 16, got {}",
                self.max_record_bytes
            ));
        }
        if let SyncPolicy::Interval(d) = self.sync {
            if d.is_zero() {
                return bad("sync interval must be > 0".into());
            }
        }
        self.balance.validate().map_err(Error::InvalidConfig)?;
        if self.replicated && self.balance.enabled {
            return Err(Error::InvalidConfig(
                "a replicated topic is split by its controller: balance.enabled must be false"
                    .into(),
            ));
        }
        self.hot_keys.validate().map_err(Error::InvalidConfig)
    }
}

impl TopicConfig {
    /// The record limit in force: the configured one, or what fits a segment.
    pub fn effective_max_record_bytes(&self) -> u64 {
        let room = self
            .segment_bytes
            .saturating_sub((SEGMENT_HEADER_LEN + BATCH_HEADER_LEN) as u64);
        u64::from(self.max_record_bytes).min(room)
    }
}

// The manifest keeps a topic's configuration in its own records
// (`format::config_record`): these conversions are the one place where the
// public field names meet the file format's. Every field is named on both
// sides (no `..`), so a field added to either fails to compile here until
// it is mapped.

// Crate-private functions rather than `From` impls: a public impl on the
// public `TopicConfig` would make the record types reachable from outside.
impl TopicConfig {
    /// The manifest's record of this configuration.
    pub(crate) fn to_record(&self) -> TopicConfigRecord {
        let TopicConfig {
            partitions,
            segment_bytes,
            index_interval_bytes,
            max_record_bytes,
            sync,
            retention_age,
            retention_bytes,
            balance,
            hot_keys,
            replicated,
        } = self;
        TopicConfigRecord {
            partitions: *partitions,
            segment_bytes: *segment_bytes,
            index_interval_bytes: *index_interval_bytes,
            max_record_bytes: *max_record_bytes,
            sync: sync_record(*sync),
            retention_age: *retention_age,
            retention_bytes: *retention_bytes,
            balance: balance_record(balance),
            hot_keys: hot_keys_record(hot_keys),
            replicated: *replicated,
        }
    }

    /// The configuration a manifest record holds.
    pub(crate) fn from_record(r: &TopicConfigRecord) -> TopicConfig {
        let TopicConfigRecord {
            partitions,
            segment_bytes,
            index_interval_bytes,
            max_record_bytes,
            sync,
            retention_age,
            retention_bytes,
            balance,
            hot_keys,
            replicated,
        } = r;
        TopicConfig {
            partitions: *partitions,
            segment_bytes: *segment_bytes,
            index_interval_bytes: *index_interval_bytes,
            max_record_bytes: *max_record_bytes,
            sync: match *sync {
                SyncPolicyRecord::Never => SyncPolicy::Never,
                SyncPolicyRecord::Interval(d) => SyncPolicy::Interval(d),
                SyncPolicyRecord::Always => SyncPolicy::Always,
            },
            retention_age: *retention_age,
            retention_bytes: *retention_bytes,
            balance: balance_policy(balance),
            hot_keys: hot_key_policy(hot_keys),
            replicated: *replicated,
        }
    }
}

fn sync_record(sync: SyncPolicy) -> SyncPolicyRecord {
    match sync {
        SyncPolicy::Never => SyncPolicyRecord::Never,
        SyncPolicy::Interval(d) => SyncPolicyRecord::Interval(d),
        SyncPolicy::Always => SyncPolicyRecord::Always,
    }
}

fn balance_record(b: &BalancePolicy) -> BalancePolicyRecord {
    let BalancePolicy {
        enabled,
        target_bytes_per_sec,
        target_records_per_sec,
        hot_factor,
        cold_fraction,
        merge_fraction,
        min_age,
        min_partitions,
        max_partitions,
        hot_key_share,
        check_interval,
    } = b;
    BalancePolicyRecord {
        enabled: *enabled,
        target_bytes_per_sec: *target_bytes_per_sec,
        target_records_per_sec: *target_records_per_sec,
        hot_factor: *hot_factor,
        cold_fraction: *cold_fraction,
        merge_fraction: *merge_fraction,
        min_age: *min_age,
        min_partitions: *min_partitions,
        max_partitions: *max_partitions,
        hot_key_share: *hot_key_share,
        check_interval: *check_interval,
    }
}

fn balance_policy(r: &BalancePolicyRecord) -> BalancePolicy {
    let BalancePolicyRecord {
        enabled,
        target_bytes_per_sec,
        target_records_per_sec,
        hot_factor,
        cold_fraction,
        merge_fraction,
        min_age,
        min_partitions,
        max_partitions,
        hot_key_share,
        check_interval,
    } = r;
    BalancePolicy {
        enabled: *enabled,
        target_bytes_per_sec: *target_bytes_per_sec,
        target_records_per_sec: *target_records_per_sec,
        hot_factor: *hot_factor,
        cold_fraction: *cold_fraction,
        merge_fraction: *merge_fraction,
        min_age: *min_age,
        min_partitions: *min_partitions,
        max_partitions: *max_partitions,
        hot_key_share: *hot_key_share,
        check_interval: *check_interval,
    }
}

fn hot_keys_record(h: &HotKeyPolicy) -> HotKeyPolicyRecord {
    let HotKeyPolicy {
        allow_windowed,
        allow_spread,
        max_lanes,
        auto_window,
    } = h;
    HotKeyPolicyRecord {
        allow_windowed: *allow_windowed,
        allow_spread: *allow_spread,
        max_lanes: *max_lanes,
        auto_window: *auto_window,
    }
}

fn hot_key_policy(r: &HotKeyPolicyRecord) -> HotKeyPolicy {
    let HotKeyPolicyRecord {
        allow_windowed,
        allow_spread,
        max_lanes,
        auto_window,
    } = r;
    HotKeyPolicy {
        allow_windowed: *allow_windowed,
        allow_spread: *allow_spread,
        max_lanes: *max_lanes,
        auto_window: *auto_window,
    }
}

/// Options for [`crate::Log::open`].
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// Create the directory (and an empty log) when missing or empty.
    pub create: bool,
    /// How to treat corruption in durable data.
    pub recovery: RecoveryMode,
    /// Scan all data, not only what follows the checkpoint (like `verify`).
    pub full_scan: bool,
    /// Try io_uring for group commit (falls back to syscalls when unavailable).
    pub use_io_uring: bool,
    /// Compact the manifest journal into a snapshot after this many records.
    pub manifest_compact_records: u32,
    /// Run the background balancer for topics whose policy enables it.
    pub balancer: bool,
    /// Apply retention from the background thread every second (off: only
    /// [`crate::Log::enforce_retention`] applies it).
    pub background_retention: bool,
    /// How often a sync round also writes and syncs the recovery
    /// checkpoint (default 1 s). Rounds in between sync only data files and
    /// directories: on ext4 a second file's fdatasync in a round roughly
    /// doubles its latency. Open, retention and a clean close write the
    /// checkpoint whenever they need it, whatever the interval. After a
    /// crash, recovery scans what was written since the last checkpoint
    /// (about `checkpoint_interval` times the write rate), and damage in
    /// that window is treated as a torn tail, not as corruption: see
    /// "Durability protocol" in docs/ARCHITECTURE.md. Zero writes it in
    /// every round.
    pub checkpoint_interval: Duration,
    /// Clock for rates and policies (injectable for deterministic tests).
    pub clock: std::sync::Arc<dyn crate::balance::Clock>,
    /// Derive each new topic's routing hash key from this seed and the
    /// topic's name instead of drawing it at random: where keys land is
    /// then the same in every run (for tests and simulations). `None` (the
    /// default) keeps keys unpredictable, so no client can aim its keys at
    /// one partition. Existing topics keep the key they were created with.
    pub topic_hash_seed: Option<u64>,
    /// The most segments that take no more appends (rolled, or of sealed
    /// partitions) the log keeps mapped; the least recently read ones
    /// beyond it are unmapped and mapped again by the next read of them.
    /// Active segments are mapped besides (one per active partition), and
    /// so is any evicted segment a `ReadBatch` (or `Bytes` from one) still
    /// holds. Default [`DEFAULT_MAX_MAPPED_SEGMENTS`], far below the
    /// kernel's default `vm.max_map_count` of 65,530 per process.
    pub max_mapped_segments: usize,
    /// The most descriptors of segments the log keeps open, active ones
    /// included (a sealed segment keeps one only until a sync round has
    /// made it durable; past this many the oldest are closed, and opened
    /// again by the writer or the round that syncs them when needed). The
    /// log itself holds a few besides (lock, journal, checkpoints), and a
    /// sync round one chunk of about 256 while it runs.
    /// Default [`DEFAULT_MAX_OPEN_FILES`], well within the default
    /// `ulimit -n` of 1,024.
    pub max_open_files: usize,
}

/// Default of [`LogOptions::max_mapped_segments`].
pub const DEFAULT_MAX_MAPPED_SEGMENTS: usize = 4096;

/// Default of [`LogOptions::max_open_files`].
pub const DEFAULT_MAX_OPEN_FILES: usize = 128;

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            create: true,
            recovery: RecoveryMode::Strict,
            full_scan: false,
            use_io_uring: true,
            manifest_compact_records: 1000,
            balancer: true,
            background_retention: true,
            checkpoint_interval: Duration::from_secs(1),
            clock: std::sync::Arc::new(crate::balance::SystemClock),
            topic_hash_seed: None,
            max_mapped_segments: DEFAULT_MAX_MAPPED_SEGMENTS,
            max_open_files: DEFAULT_MAX_OPEN_FILES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::config_record::tests::{CUSTOM_JSON, DEFAULT_JSON, OLDEST_JSON};

    fn decode(json: &str) -> TopicConfig {
        let rec: TopicConfigRecord = serde_json::from_str(json).expect("decodes");
        TopicConfig::from_record(&rec)
    }

    fn encode(config: &TopicConfig) -> String {
        serde_json::to_string(&config.to_record()).expect("encodes")
    }

    #[test]
    fn a_manifest_config_in_todays_format_decodes_to_the_config_that_wrote_it() {
        let mut want = TopicConfig {
            partitions: 3,
            segment_bytes: 1 << 20,
            index_interval_bytes: 1024,
            max_record_bytes: 4096,
            sync: SyncPolicy::Interval(Duration::from_millis(1500)),
            retention_age: Some(Duration::from_secs(3600)),
            retention_bytes: Some(1 << 30),
            ..TopicConfig::default()
        };
        want.balance = BalancePolicy {
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
        };
        want.hot_keys = HotKeyPolicy {
            allow_windowed: true,
            allow_spread: true,
            max_lanes: 8,
            auto_window: Some(Duration::from_millis(200)),
        };
        assert_eq!(decode(CUSTOM_JSON), want);
        assert_eq!(encode(&want), CUSTOM_JSON);
    }

    #[test]
    fn the_default_config_round_trips_through_the_manifest_record_byte_for_byte() {
        let config = TopicConfig::default();
        assert_eq!(encode(&config), DEFAULT_JSON);
        assert_eq!(decode(DEFAULT_JSON), config);
        for sync in [SyncPolicy::Never, SyncPolicy::Always] {
            let config = TopicConfig {
                sync,
                ..TopicConfig::default()
            };
            assert_eq!(decode(&encode(&config)), config);
        }
    }

    #[test]
    fn the_record_defaults_for_fields_old_manifests_lack_are_the_api_defaults() {
        let config = decode(OLDEST_JSON);
        assert_eq!(config.balance, BalancePolicy::default());
        assert_eq!(config.hot_keys, HotKeyPolicy::default());
        assert_eq!(config.sync, SyncPolicy::Always);
    }
}
