//! # fissionlog
//!
//! A persistent, append-only, segmented log on memory-mapped files for
//! people who build message brokers. It tracks every partition's write rate
//! and, when one runs hot, splits it into children where the load is,
//! keeping per-key order through splits, merges and crashes.
//!
//! ```no_run
//! use fissionlog::{Log, LogOptions, TopicConfig, SyncPolicy};
//! let log = Log::open("/tmp/example-log", LogOptions::default())?;
//! let topic = log.topic_or_create("orders", TopicConfig { partitions: 4, sync: SyncPolicy::Always, ..Default::default() })?;
//! let at = topic.append(Some(b"customer-42"), b"order placed")?;
//! let batch = topic.read(at.partition, at.offset, 64 * 1024)?;
//! for r in batch.iter() {
//!     println!("{} {:?}", r.offset, r.value);
//! }
//! log.close()?;
//! # Ok::<(), fissionlog::Error>(())
//! ```
//!
//! Durability, recovery and the soundness argument for the memory maps are
//! described in `docs/` (ARCHITECTURE.md, FORMAT.md) and next to the code
//! that relies on them.
//!
//! ## The public surface
//!
//! Everything public is re-exported here, at the crate root (plus the file
//! names in [`layout`]). The segment files, their memory maps and writers,
//! recovery, the manifest and the sync machinery are crate-private: a
//! reader's [`ReadBatch`] borrows the mapped bytes directly, and that is
//! sound only while nothing but the partition's one writer can store into
//! the mapping, so no safe API hands out a segment or a writer. A
//! [`Partition`] handle reads, waits and describes its segments as plain
//! data ([`SegmentInfo`]):
//!
//! ```
//! # fn f(topic: &fissionlog::Topic) -> fissionlog::Result<()> {
//! let partition = topic.partition(0)?;
//! for s in partition.segment_infos() {
//!     println!("{:?}: offsets {}..{}", s.path, s.base_offset, s.end_offset);
//! }
//! # Ok(()) }
//! ```
//!
//! The segments themselves are out of reach, by module:
//!
//! ```compile_fail,E0603
//! use fissionlog::storage::segment::{Segment, SegmentWriter};
//! ```
//!
//! and through a partition handle:
//!
//! ```compile_fail,E0624
//! # fn f(topic: &fissionlog::Topic) -> fissionlog::Result<()> {
//! let segments = topic.partition(0)?.segments();
//! # Ok(()) }
//! ```

#![warn(missing_docs)]
// A type that a public signature exposes must be nameable by users: every
// such type is re-exported here.
#![warn(unnameable_types)]

// The engine relies on Linux: fallocate and hole punching, sparse files,
// io_uring (with a syscall fallback), flock semantics and the page-cache
// coherence of MAP_SHARED mappings with write(2). Other systems are refused at
// build time rather than left to fail at run time.
#[cfg(not(target_os = "linux"))]
compile_error!("fissionlog supports Linux only (see docs/ARCHITECTURE.md, \"Platform\")");

mod balance;
mod config;
mod core;
mod duration;
mod error;
mod events;
mod format;
#[cfg(feature = "internals")]
mod fuzz_checks;
mod group;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals;
pub mod layout;
mod log;
pub mod metrics;
mod partition;
mod read;
mod reader;
mod recovery;
mod storage;
mod topic;
mod topic_name;
mod topology;
mod types;
mod wake;

#[cfg(feature = "testing")]
pub use balance::ManualClock;
pub use balance::{BalancePolicy, Clock, CutPoints, Decision, SplitAt, SystemClock, WindowRate};
pub use config::{
    HotKeyPolicy, LogOptions, RecoveryMode, SyncPolicy, TopicConfig, ACTIVE_HEADROOM_MAX_BYTES,
    DEFAULT_MAX_MAPPED_SEGMENTS, DEFAULT_MAX_OPEN_FILES, MAX_HOT_KEY_LANES, MAX_SEGMENT_BYTES,
    MIN_SEGMENT_BYTES,
};
pub use error::{Error, Resource, Result};
pub use events::TopologyEvent;
pub use format::batch::{ControlKind, EntryBody, RaftLogId, RecordIn};
pub use group::{
    Assignment, AssignmentDescription, Group, GroupDescription, GroupOptions, GroupStart,
    GroupStats, Member, MemberDescription, MemberOptions, MemberState,
};
pub use log::{verify, Log};
pub use partition::{EntryBatch, EntryPos, Partition, RaftEntry, RaftEntryBody, SegmentInfo};
pub use read::{OwnedRecord, ReadBatch, ReadIsolation, Record};
pub use reader::key_reader::KeyReader;
pub use reader::{Cut, Reader, RetainedRange, StartAt};
pub use recovery::partition::Problem;
pub use recovery::{FileAction, FileReport, Hole, LostGroupPosition, OffsetRange, RecoveryReport};
pub use storage::budget::ResourceStats;
pub use storage::durability::SyncBackend;
#[cfg(feature = "testing")]
pub use storage::fault::{IoHook, IoOp, NoFaults};
pub use topic::durable::Durable;
pub use topic::hot_keys::{HotKey, KeyEra, KeyLane, KeyLanes, KeyLink, KeyRecord};
pub use topic::tail_split::{
    MovedChild, MovedRange, TailFrom, TailReclaimOutcome, TailSplitOptions, TailSplitOutcome,
};
pub use topic::{key_hash, ChainLink, NewRecord, PartitionInfo, RemovedParent, SplitPlan, Topic};
pub use topic_name::{validate as validate_topic_name, MAX_TOPIC_NAME};
pub use topology::command::{Applied, HashRange, TopologyCommand};
pub use topology::manifest::ManifestReport;
pub use types::{Appended, HotKeyMode};
