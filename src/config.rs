//! Configuration of a log and of its topics.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::balance::BalancePolicy;
use crate::error::{Error, Result};
use crate::format::batch::BATCH_HEADER_LEN;
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
            index_interval_bytes: 4096,
            max_record_bytes: 1 << 20,
            sync: SyncPolicy::Never,
            retention_age: None,
            retention_bytes: None,
            balance: BalancePolicy::default(),
            hot_keys: HotKeyPolicy::default(),
        }
    }
}

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
}

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
        }
    }
}
