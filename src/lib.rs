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
//! described in `docs/` and next to the code that relies on them
//! (`storage::segment`, `storage::durability`).

#![warn(missing_docs)]

// The engine relies on Linux: fallocate and hole punching, MADV_POPULATE_READ,
// io_uring (with a syscall fallback), flock semantics and the page-cache
// coherence of MAP_SHARED mappings with write(2). Other systems are refused at
// build time rather than left to fail at run time.
#[cfg(not(target_os = "linux"))]
compile_error!("fissionlog supports Linux only (see docs/ARCHITECTURE.md, \"Platform\")");

pub mod balance;
mod balance_step;
pub mod config;
mod core;
pub mod error;
pub mod events;
pub mod format;
pub mod fuzz_checks;
mod log;
pub mod partition;
pub mod read;
pub mod reader;
pub mod recovery;
pub mod storage;
pub mod topic;
pub mod topic_name;
pub mod topology;

pub use config::{LogOptions, RecoveryMode, SyncPolicy, TopicConfig};
pub use error::{Error, Result};
pub use events::TopologyEvent;
pub use log::{verify, Log, LOCK_FILE, TOPICS_DIR};
pub use read::{OwnedRecord, ReadBatch, ReadIsolation, Record};
pub use reader::{Cut, Reader, RetainedRange, StartAt};
pub use recovery::partition::Problem;
pub use recovery::RecoveryReport;
pub use storage::durability::SyncBackend;
pub use topic::{Appended, ChainLink, NewRecord, PartitionInfo, SplitPlan, Topic};
