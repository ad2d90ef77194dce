//! A topic: routing keys to partitions, appends, reads, splits and merges.
//!
//! Every `impl Topic` of the engine's topic side lives in this folder, one
//! job per file; the fields of [`TopicInner`] are private to it, and the
//! rest of the crate reaches them through the accessors below.

mod append;
mod balance;
pub(crate) mod change;
mod describe;
pub(crate) mod durable;
pub(crate) mod hot_keys;
mod raft;

mod route;
pub(crate) mod tail_split;

pub(crate) use crate::topology::ranges::even_ranges;
pub use crate::topology::ranges::SplitPlan;

use std::any::Any;
use std::collections::BTreeMap;
use std::hash::Hasher;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock, RwLockWriteGuard};
use serde::Serialize;

use crate::balance::WindowRate;
use crate::config::TopicConfig;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::events::TopologyEvent;
use crate::format::manifest::PartitionRecord;
use crate::partition::Partition;
use crate::read::{ReadBatch, ReadIsolation};
use crate::storage::lock::DirLock;
use crate::topology::lineage::Lineage;
use crate::wake::TailWake;

/// A record to append.
#[derive(Debug, Clone, Copy, Default)]
pub struct NewRecord<'a> {
    /// Routing key; records without one are spread round-robin.
    pub key: Option<&'a [u8]>,
    /// Payload.
    pub value: &'a [u8],
    /// Milliseconds since the epoch; now when `None`.
    pub timestamp: Option<i64>,
}

pub(crate) use crate::types::Appended;

/// A partition as seen from outside: range, lineage, state, offsets, rates.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionInfo {
    /// Id.
    pub id: u32,
    /// First hash value owned.
    pub start: u64,
    /// Last hash value owned.
    pub end: u64,
    /// Parents (ids of removed ones included).
    pub parents: Vec<u32>,
    /// The parents removed from the topology after retention emptied them,
    /// each with the end offset it was sealed at.
    pub removed_parents: Vec<RemovedParent>,
    /// Children.
    pub children: Vec<u32>,
    /// Sealed at this end offset, or active (None).
    pub sealed_at: Option<u64>,
    /// First offset held.
    pub start_offset: u64,
    /// End offset (exclusive).
    pub end_offset: u64,
    /// Bytes of data.
    pub bytes: u64,
    /// Segment files.
    pub segments: usize,
    /// Write rates per window.
    pub rates: Vec<WindowRate>,
    /// Reported as carrying one hot key.
    pub hot_key: bool,
    /// For the parent of a tail split: the range moved to its children
    /// (`sealed_at` and `end_offset` are then its logical end, the range's
    /// start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved: Option<crate::topic::tail_split::MovedRange>,
}

/// A parent retention emptied and removed from the topology, with the end
/// offset it was sealed at (see [`PartitionInfo::removed_parents`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RemovedParent {
    /// The removed parent's id.
    pub partition: u32,
    /// The end offset it was sealed at.
    pub end_offset: u64,
}

/// One step of a key's lineage: the partition and the offsets where the key
/// may have records, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ChainLink {
    /// Partition id.
    pub partition: u32,
    /// End offset when sealed; None for the active partition at the end.
    pub sealed_at: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) rec: PartitionRecord,
    pub(crate) children: Vec<u32>,
    pub(crate) part: Arc<Partition>,
    pub(crate) last_change_nanos: u64,
    pub(crate) hot_key_reported: bool,
}

impl TopicState {
    /// The active partition owning hash `h`.
    pub(crate) fn owner_of(&self, h: u64) -> u32 {
        self.owner(h)
    }

    /// The active partition owning hash `h`.
    fn owner(&self, h: u64) -> u32 {
        *self
            .routes
            .range(..=h)
            .next_back()
            .expect("active ranges tile the hash space")
            .1
    }
}

#[derive(Debug, Default)]
pub(crate) struct TopicState {
    pub(crate) nodes: BTreeMap<u32, Node>,
    /// Active partitions by range start.
    pub(crate) routes: BTreeMap<u64, u32>,
    /// Partitions retention removed, earliest first, as the manifest's
    /// `TopicRecord::removed` records them.
    pub(crate) removed: Vec<crate::format::manifest::RemovedPartition>,
    /// Committed tail splits by parent (while the parent is in the topology).
    pub(crate) tails: BTreeMap<u32, Arc<tail_split::TailInfo>>,
}

#[derive(Debug)]
pub(crate) struct TopicInner {
    core: Arc<Core>,
    /// The directory lock, handed to every partition made; dropped when
    /// the log closes (see [`Topic::release_partitions`]).
    lock: Mutex<Option<Arc<DirLock>>>,
    id: u32,
    name: Arc<str>,
    config: RwLock<TopicConfig>,
    hash_key: [u64; 2],
    /// Written only through [`TopicInner::write_state`], which moves
    /// `generation`.
    state: RwLock<TopicState>,
    /// Topology generation: moves with every write of `state` (split,
    /// merge, partition removal, open, close). Read without a lock by
    /// readers deciding whether their lineage snapshot is current.
    generation: AtomicU64,
    /// The last lineage snapshot built, shared by the topic's readers.
    lineage: Mutex<Option<Arc<Lineage>>>,
    /// Wakes readers blocked in `poll_wait` when any partition can move.
    wake: Arc<TailWake>,
    /// Serialises topology changes of the topic (split, merge, tail split,
    /// hot-key modes, removal of emptied partitions) and its deletion.
    change: Mutex<()>,
    /// Set by `Log::delete_topic` under `change` once the deletion is
    /// committed: a change that takes `change` afterwards refuses to run
    /// (it would write files into the removed directory).
    deleted: std::sync::atomic::AtomicBool,
    round_robin: AtomicU64,
    /// `config.sync == SyncPolicy::Always`, read without a lock on every append.
    sync_always: bool,
    dir: PathBuf,
    /// Coordinators of the topic's consumer groups taken so far.
    groups: GroupSlot,
    /// Keys with a hot-key mode (docs/HOT_KEYS.md).
    hot: hot_keys::HotKeys,
}

/// The consumer groups of a topic, held here for the `group` layer above,
/// which alone knows their type (its registry of coordinators): every
/// handle of one topic then reaches the same groups, and they end with the
/// topic. The topic holds them opaque, so `topic` never imports `group`;
/// all it does with them is let go when the log closes
/// ([`Topic::release_partitions`]), since each coordinator holds its topic.
#[derive(Default)]
pub(crate) struct GroupSlot(Mutex<Option<Arc<dyn Any + Send + Sync>>>);

impl GroupSlot {
    /// The value held, made with `T::default()` by the first call.
    pub(crate) fn get_or_default<T: Any + Send + Sync + Default>(&self) -> Arc<T> {
        let mut slot = self.0.lock();
        if let Some(held) = slot.as_ref() {
            return held
                .clone()
                .downcast::<T>()
                .unwrap_or_else(|_| unreachable!("a topic's group slot holds one type"));
        }
        let made = Arc::new(T::default());
        *slot = Some(made.clone());
        made
    }

    /// Lets go of the value held.
    fn clear(&self) {
        let held = self.0.lock().take();
        // Dropped outside the lock: it may hold the last handle of things
        // that take other locks as they go.
        drop(held);
    }
}

impl std::fmt::Debug for GroupSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.0.lock().is_some();
        f.debug_struct("GroupSlot").field("held", &held).finish()
    }
}

impl TopicInner {
    /// The topic's consumer groups, as the group layer keeps them.
    pub(crate) fn groups(&self) -> &GroupSlot {
        &self.groups
    }

    /// The log's shared state.
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The wake-up of the topic's waiting readers.
    pub(crate) fn wake(&self) -> &Arc<TailWake> {
        &self.wake
    }

    /// Takes the lock that serialises the topic's topology changes and
    /// its deletion.
    pub(crate) fn lock_changes(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.change.lock()
    }

    /// Marks the topic deleted; called under [`TopicInner::lock_changes`]
    /// once the deletion is committed, so no later change runs.
    pub(crate) fn mark_deleted(&self) {
        self.deleted
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The state for writing. Every change to partitions (their set, their
    /// states, their lineage) goes through here, so it moves the topology
    /// generation. The bump happens under the write lock: a reader that
    /// sees the new generation and then takes the read lock sees the
    /// state it names, and one that saw the old generation uses a snapshot
    /// that was current before this change.
    pub(crate) fn write_state(&self) -> RwLockWriteGuard<'_, TopicState> {
        let st = self.state.write();
        // SeqCst: a waiter's readiness check loads it (see `TailWake`).
        self.generation.fetch_add(1, Ordering::SeqCst);
        st
    }

    /// Each partition's visible end, with the topology generation, under
    /// one read of the state: a change committed meanwhile is either in
    /// both or in neither.
    pub(crate) fn visible_ends(&self) -> (u64, std::collections::BTreeMap<u32, u64>) {
        let st = self.state.read();
        let ends = st
            .nodes
            .iter()
            .map(|(&id, n)| (id, n.part.visible_end(n.part.default_isolation())))
            .collect();
        (self.generation.load(Ordering::SeqCst), ends)
    }
}

/// Handle to a topic (cheap to clone).
#[derive(Debug, Clone)]
pub struct Topic {
    pub(crate) inner: Arc<TopicInner>,
}

/// Keyed SipHash-1-3 of a key: the routing hash (stable across versions).
pub fn key_hash(hash_key: [u64; 2], key: &[u8]) -> u64 {
    let mut h = siphasher::sip::SipHasher13::new_with_keys(hash_key[0], hash_key[1]);
    h.write(key);
    h.finish()
}

pub(crate) fn partition_dir(topic_dir: &std::path::Path, id: u32) -> PathBuf {
    topic_dir.join(format!("p{id}"))
}

impl Topic {
    /// The handle of a topic the manifest names, with no partitions yet
    /// (the log's open installs them through [`TopicInner::write_state`]).
    pub(crate) fn new(
        core: &Arc<Core>,
        lock: &Arc<DirLock>,
        rec: &crate::format::manifest::TopicRecord,
        dir: PathBuf,
    ) -> Topic {
        let config = crate::config::TopicConfig::from_record(&rec.config);
        let sync_always = config.sync == crate::config::SyncPolicy::Always;
        let wake = Arc::default();
        core.watch_sync_failures(&wake);
        Topic {
            inner: Arc::new(TopicInner {
                core: core.clone(),
                lock: Mutex::new(Some(lock.clone())),
                id: rec.id,
                name: Arc::from(rec.name.as_str()),
                config: RwLock::new(config),
                hash_key: rec.hash_key,
                state: RwLock::new(TopicState::default()),
                generation: AtomicU64::new(0),
                lineage: Mutex::new(None),
                wake,
                change: Mutex::new(()),
                deleted: std::sync::atomic::AtomicBool::new(false),
                round_robin: AtomicU64::new(0),
                sync_always,
                dir,
                groups: Default::default(),
                hot: hot_keys::HotKeys::from_records(&rec.hot_keys),
            }),
        }
    }

    /// Topic name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Topic id.
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// Current configuration.
    pub fn config(&self) -> TopicConfig {
        self.inner.config.read().clone()
    }

    /// A partition handle. The handle keeps the log directory locked while
    /// it lives (it maps the partition's files), also after `Log::close`.
    pub fn partition(&self, id: u32) -> Result<Arc<Partition>> {
        self.inner.core.check_not_closed()?;
        self.inner
            .state
            .read()
            .nodes
            .get(&id)
            .map(|n| n.part.clone())
            .ok_or_else(|| Error::UnknownPartition {
                topic: self.name().to_string(),
                partition: id,
            })
    }

    /// Whether the log still has this topic (its deletion not committed).
    pub(crate) fn is_live(&self) -> bool {
        !self.is_deleted()
    }

    /// Lets go of every partition (and so of the mappings and the directory
    /// lock they hold) when the log closes: a topic handle that outlives its
    /// `Log` then answers `Error::Closed` and does not keep the directory
    /// locked. Routes stay (plain ids), so routing never panics.
    pub(crate) fn release_partitions(&self) {
        let mut st = self.inner.write_state();
        st.nodes.clear();
        drop(st);
        *self.inner.lineage.lock() = None;
        *self.inner.lock.lock() = None;
        // A group's coordinator holds its topic: kept here, the two would
        // keep each other (and the log's manifest and checkpoint files)
        // alive after the log closed. Group handles still held go on
        // answering `Error::Closed`.
        self.inner.groups.clear();
        // Readers blocked in `poll_wait` return `Error::Closed` now.
        self.inner.wake.notify_all();
    }

    /// For a topology change, under the change lock: the log is open and
    /// the topic was not deleted.
    pub(crate) fn check_live(&self) -> Result<()> {
        self.inner.core.check_open()?;
        if self.is_deleted() {
            return Err(Error::UnknownTopic(self.inner.name.to_string()));
        }
        Ok(())
    }

    /// `Log::delete_topic` committed the topic's deletion.
    pub(crate) fn is_deleted(&self) -> bool {
        self.inner.deleted.load(Ordering::Acquire)
    }

    pub(crate) fn all_partition_handles(&self) -> Vec<Arc<Partition>> {
        self.inner
            .state
            .read()
            .nodes
            .values()
            .map(|n| n.part.clone())
            .collect()
    }

    /// Reads from a partition: whole verified batches from `offset`, at
    /// least one, more while under `max_bytes`.
    /// Sees what the topic's default [`ReadIsolation`] shows (durable
    /// records for `SyncPolicy::Always`, every written one otherwise).
    pub fn read(&self, partition: u32, offset: u64, max_bytes: usize) -> Result<ReadBatch> {
        self.partition(partition)?.read(offset, max_bytes)
    }

    /// [`Topic::read`] with an explicit read isolation.
    pub fn read_with(
        &self,
        partition: u32,
        offset: u64,
        max_bytes: usize,
        isolation: ReadIsolation,
    ) -> Result<ReadBatch> {
        self.partition(partition)?
            .read_with(offset, max_bytes, isolation)
    }

    /// Makes everything appended so far durable (group-committed with
    /// concurrent callers; covers every topic of the log).
    pub fn sync(&self) -> Result<()> {
        self.inner.core.sync()
    }

    /// First offset at or after timestamp `ts` in a partition.
    pub fn offset_for_time(&self, partition: u32, ts: i64) -> Result<Option<u64>> {
        self.partition(partition)?.offset_for_time(ts)
    }

    /// Waits up to `timeout` for `offset` to become readable.
    pub fn wait_for(&self, partition: u32, offset: u64, timeout: Duration) -> Result<bool> {
        Ok(self.partition(partition)?.wait_for(offset, timeout))
    }

    /// Subscribes to topology events of the whole log.
    pub fn subscribe(&self) -> std::sync::mpsc::Receiver<TopologyEvent> {
        self.inner.core.events.subscribe()
    }
}
