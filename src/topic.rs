//! A topic: routing keys to partitions, appends, reads, splits and merges.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock, RwLockWriteGuard};
use serde::Serialize;

use crate::balance::{LoadMap, RateTracker, WindowRate};
use crate::config::TopicConfig;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::events::TopologyEvent;
use crate::format::batch::RecordIn;
use crate::format::manifest::{ManifestRecord, PartitionRecord, PartitionState};
use crate::partition::{now_ms, Partition, PartitionParams};
use crate::read::{ReadBatch, ReadIsolation};
use crate::storage::fault::IoOp;
use crate::storage::lock::DirLock;
use crate::storage::segment::Segment;
use crate::storage::sync_dir;
use crate::topology::lineage::{Lineage, LineageNode};
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

/// Where an appended record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Appended {
    /// Partition id.
    pub partition: u32,
    /// Offset in it.
    pub offset: u64,
}

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
    pub removed_parents: Vec<(u32, u64)>,
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
    pub moved: Option<crate::tail::MovedRange>,
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

/// How to split a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitPlan {
    /// Children `[start, at]` and `[at + 1, end]`.
    At(u64),
    /// At the middle of the range.
    Even,
    /// At the load-weighted median of recent appends (falls back to Even).
    LoadMedian,
    /// Into this many children (2–16) of about equal recent load (falls
    /// back to LoadMedian when the load is too concentrated).
    LoadQuantiles(u8),
    /// Isolate the hash value of a key into `[h, h]`, remainder on each side.
    IsolateHash(u64),
    /// At these points, each the last hash of a child (1 to 7 points,
    /// strictly increasing, each inside `[start, end)`).
    Cuts(crate::balance::CutPoints),
}

#[derive(Debug)]
pub(crate) struct Node {
    pub rec: PartitionRecord,
    pub children: Vec<u32>,
    pub part: Arc<Partition>,
    pub last_change_nanos: u64,
    pub hot_key_reported: bool,
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
    pub nodes: BTreeMap<u32, Node>,
    /// Active partitions by range start.
    pub routes: BTreeMap<u64, u32>,
    /// Partitions retention removed, earliest first, as the manifest's
    /// `TopicRecord::removed` records them.
    pub removed: Vec<crate::format::manifest::RemovedPartition>,
    /// Committed tail splits by parent (while the parent is in the topology).
    pub tails: BTreeMap<u32, Arc<crate::tail::TailInfo>>,
}

#[derive(Debug)]
pub(crate) struct TopicInner {
    pub core: Arc<Core>,
    /// The directory lock, handed to every partition made; dropped when
    /// the log closes (see [`Topic::release_partitions`]).
    pub lock: Mutex<Option<Arc<DirLock>>>,
    pub id: u32,
    pub name: Arc<str>,
    pub config: RwLock<TopicConfig>,
    pub hash_key: [u64; 2],
    /// Written only through [`TopicInner::write_state`], which moves
    /// `generation`.
    pub state: RwLock<TopicState>,
    /// Topology generation: moves with every write of `state` (split,
    /// merge, partition removal, open, close). Read without a lock by
    /// readers deciding whether their lineage snapshot is current.
    pub generation: AtomicU64,
    /// The last lineage snapshot built, shared by the topic's readers.
    pub lineage: Mutex<Option<Arc<Lineage>>>,
    /// Wakes readers blocked in `poll_wait` when any partition can move.
    pub wake: Arc<TailWake>,
    /// Serialises topology changes of the topic (split, merge, tail split,
    /// hot-key modes, removal of emptied partitions) and its deletion.
    pub change: Mutex<()>,
    /// Set by `Log::delete_topic` under `change` once the deletion is
    /// committed: a change that takes `change` afterwards refuses to run
    /// (it would write files into the removed directory).
    pub deleted: std::sync::atomic::AtomicBool,
    pub round_robin: AtomicU64,
    /// `config.sync == SyncPolicy::Always`, read without a lock on every append.
    pub sync_always: bool,
    pub dir: PathBuf,
    /// Coordinators of the topic's consumer groups taken so far.
    pub groups: crate::group::Registry,
    /// Keys with a hot-key mode (docs/HOT_KEYS.md).
    pub hot: crate::hot_keys::HotKeys,
}

impl TopicInner {
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

/// Splits `[0, u64::MAX]` into `n` near-equal ranges.
pub(crate) fn even_ranges(n: u32) -> Vec<(u64, u64)> {
    let total = 1u128 << 64;
    (0..n)
        .map(|i| {
            let s = total * i as u128 / n as u128;
            let e = total * (i as u128 + 1) / n as u128 - 1;
            (s as u64, e as u64)
        })
        .collect()
}

pub(crate) fn partition_dir(topic_dir: &std::path::Path, id: u32) -> PathBuf {
    topic_dir.join(format!("p{id}"))
}

impl Topic {
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

    /// The routing hash of `key` in this topic.
    pub fn hash(&self, key: &[u8]) -> u64 {
        key_hash(self.inner.hash_key, key)
    }

    /// The active partition that owns `key` now.
    pub fn route(&self, key: &[u8]) -> u32 {
        self.route_hash(self.hash(key))
    }

    fn route_hash(&self, h: u64) -> u32 {
        self.inner.state.read().owner(h)
    }

    /// The next partition for keyless records (round-robin over the active ones).
    fn next_keyless(&self, st: &TopicState) -> u32 {
        if st.routes.len() == 1 {
            // One active partition: no shared counter to bump (an atomic
            // read-modify-write per append, contended between appenders).
            return *st
                .routes
                .values()
                .next()
                .expect("active ranges tile the hash space");
        }
        let i = self.inner.round_robin.fetch_add(1, Ordering::Relaxed) % st.routes.len() as u64;
        *st.routes
            .values()
            .nth(i as usize)
            .expect("index below the count")
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

    /// Whether the log still has this topic (not deleted).
    pub(crate) fn is_live(&self) -> bool {
        self.inner
            .core
            .topics
            .read()
            .get(self.name())
            .is_some_and(|t| t.id() == self.id())
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

    /// Appends one record; returns where it landed.
    pub fn append(&self, key: Option<&[u8]>, value: &[u8]) -> Result<Appended> {
        // A closed or poisoned log is refused below, after the hot-key
        // lookup (and in `append_hot` under the key's lock), before any write.
        let hash = key.map(|k| self.hash(k));
        let record = [RecordIn {
            key,
            value,
            timestamp: now_ms(),
        }];
        let hashes = [hash];
        // Route and take the partition under one read of the state; an
        // append that raced a split's seal (or a hot-key mode change) is
        // routed again (to the child, or by the key's new mode).
        for _ in 0..1000 {
            let fence = self.inner.hot.fence.load(Ordering::SeqCst);
            if let Some(st) = hash.and_then(|h| self.inner.hot.get(h)) {
                return self.append_hot(&st, record[0]);
            }
            // Again after the lookup: a mode change whose commit failed
            // poisons the log before it takes a new key back out of the
            // map, and its record may still be on disk (the next open then
            // finds the era). An append routed by the old mode after that
            // would land above the era's start and be read as the new
            // era's.
            self.inner.core.check_open()?;
            let (partition, part) = {
                let st = self.inner.state.read();
                let pid = hash.map_or_else(|| self.next_keyless(&st), |h| st.owner(h));
                (pid, st.nodes[&pid].part.clone())
            };
            match part.append_fenced(&record, &hashes, Some((&self.inner.hot.fence, fence))) {
                Ok(offset) => {
                    self.after_append(&[&part])?;
                    return Ok(Appended { partition, offset });
                }
                Err(Error::Sealed { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Refused(
            "the partition kept being sealed under this append".into(),
        ))
    }

    /// Appends one record of a key with a hot-key mode, holding the key's
    /// lock from routing to the write.
    fn append_hot(&self, st: &crate::hot_keys::HotKeyState, rec: RecordIn<'_>) -> Result<Appended> {
        let mut run = st.run.lock();
        // A mode change that failed under this lock poisoned the log
        // first; its era may be on disk even so (see `append`).
        self.inner.core.check_open()?;
        let (point, ts) = self.hot_route(&mut run, rec.key.unwrap_or_default(), rec.timestamp);
        let record = [RecordIn {
            timestamp: ts,
            ..rec
        }];
        let hashes = [Some(point)];
        for _ in 0..1000 {
            let (partition, part) = {
                let st = self.inner.state.read();
                let pid = st.owner(point);
                (pid, st.nodes[&pid].part.clone())
            };
            match part.append(&record, &hashes) {
                Ok(offset) => {
                    drop(run);
                    self.after_append(&[&part])?;
                    return Ok(Appended { partition, offset });
                }
                Err(Error::Sealed { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Refused(
            "the partition kept being sealed under this append".into(),
        ))
    }

    /// Appends records, routed by key (keyless ones round-robin), one batch
    /// per partition; returns each record's position in input order.
    ///
    /// Atomic per partition, not across partitions. Every record and every
    /// partition's batch is checked (sizes, limits) before anything is
    /// written, so a refused batch writes nothing. Each partition's records
    /// are then written as one batch, whole or not at all. An I/O error (or
    /// a closed or poisoned partition) met after some partitions' batches
    /// were written returns [`Error::PartialBatch`], which names exactly the
    /// records that landed: retry only the others. Under
    /// `SyncPolicy::Always` they are synced before the error returns, as a
    /// successful batch's records are. A batch whose every record was
    /// written but whose sync failed in some of its partitions (poisoned)
    /// and not in others returns `PartialBatch` too, naming every record
    /// (its source, [`Error::Poisoned`], names the partition whose records
    /// may not be durable): appended again, the records of the partitions
    /// that did sync would be there twice.
    ///
    /// A key in `Windowed` mode whose records of the batch go to several
    /// lanes' partitions has them written lane after lane in input order
    /// (a partition's records then take several batches when the key comes
    /// back to it), and the writes stop at the first error: the key's
    /// records that landed are always its first ones in the batch, so
    /// appending the others again keeps the key's order
    /// (docs/HOT_KEYS.md, "Batches of a windowed key").
    pub fn append_batch(&self, records: &[NewRecord<'_>]) -> Result<Vec<Appended>> {
        // A closed or poisoned log is refused below, after the hot-key
        // lookup and under the keys' locks, before any write.
        let now = now_ms();
        let mut hashes: Vec<Option<u64>> = records
            .iter()
            .map(|r| r.key.map(|k| self.hash(k)))
            .collect();
        let mut ins: Vec<RecordIn<'_>> = records
            .iter()
            .map(|r| RecordIn {
                key: r.key,
                value: r.value,
                timestamp: r.timestamp.unwrap_or(now),
            })
            .collect();
        // Keys with a hot-key mode: locked (in hash order) for the whole
        // batch, routed to their lane points in input order. The fence is
        // read first: a key that gets a mode after it is refused below.
        let mut fence = self.inner.hot.fence.load(Ordering::SeqCst);
        let hot_states: Vec<Arc<crate::hot_keys::HotKeyState>> = if self.inner.hot.any() {
            let mut hs: Vec<u64> = hashes.iter().flatten().copied().collect();
            hs.sort_unstable();
            hs.dedup();
            hs.into_iter()
                .filter_map(|h| self.inner.hot.get(h))
                .collect()
        } else {
            Vec::new()
        };
        let mut hot_guards: BTreeMap<u64, parking_lot::MutexGuard<'_, crate::hot_keys::KeyRun>> =
            hot_states
                .iter()
                .map(|s| {
                    let g = s.run.lock();
                    (g.hash, g)
                })
                .collect();
        // After the lookup and under the keys' locks: a mode change that
        // failed under one of these locks, or took a new key back out of
        // the map, poisoned the log first (see `append`).
        self.inner.core.check_open()?;
        // Empty (no allocation) when no key of the batch has a mode.
        let mut hot_routed: Vec<bool> = Vec::new();
        // The key of each record of a windowed key (its records are
        // written round by round, see `batch_round`); empty (no
        // allocation) when the batch has none.
        let mut windowed: Vec<Option<u64>> = Vec::new();
        let n_hot_scan = if hot_guards.is_empty() {
            0
        } else {
            records.len()
        };
        // What routing changes in the keys' runs, put back if the batch is
        // refused before anything is written (bad input changes nothing).
        // Empty (no allocation) when no key of the batch has a mode.
        let routed_from: Vec<(Option<i64>, u64)> = hot_guards
            .values()
            .map(|r| (r.high_ms, r.next_lane))
            .collect();
        for i in 0..n_hot_scan {
            if let Some(run) = hashes[i].and_then(|h| hot_guards.get_mut(&h)) {
                if run.windowed() {
                    windowed.resize(records.len(), None);
                    windowed[i] = Some(run.hash);
                }
                let (point, ts) =
                    self.hot_route(run, ins[i].key.unwrap_or_default(), ins[i].timestamp);
                hashes[i] = Some(point);
                ins[i].timestamp = ts;
                hot_routed.resize(records.len(), false);
                hot_routed[i] = true;
            }
        }
        let mut landed: Vec<Option<Appended>> = vec![None; records.len()];
        // Which first-round group each record belongs to. A record re-routed
        // after a seal only joins records of its own first-round group, so
        // every batch written is a part of one that was checked up front.
        let mut origin: Vec<usize> = vec![0; records.len()];
        let mut pending: Vec<usize> = (0..records.len()).collect();
        let mut attempts = 0;
        let mut touched: Vec<Arc<Partition>> = Vec::new();
        let mut wrote_any = false;
        let partial = |landed: Vec<Option<Appended>>, wrote_any: bool, e: Error| {
            if wrote_any {
                self.partial_batch(landed, e, true)
            } else {
                e
            }
        };
        while !pending.is_empty() {
            // Route every pending record against one snapshot of the routing
            // table: routed one by one, a split landing mid-batch could send
            // a key's first record to the parent and its second to a child,
            // and the parent's group (refused as sealed, then retried) would
            // land after the child's: per-key order broken.
            // Groups are keyed (round, partition, origin): round 0 but for a
            // windowed key's records that went elsewhere than its previous
            // one (`batch_round`).
            type Group = (Arc<Partition>, Vec<usize>);
            type GroupKey = (u32, u32, usize);
            let mut groups: BTreeMap<GroupKey, Group> = BTreeMap::new();
            {
                let st = self.inner.state.read();
                let keyless = self.next_keyless(&st);
                let mut runs = Vec::new();
                for &i in &pending {
                    let pid = hashes[i].map_or(keyless, |h| st.owner(h));
                    let round = match windowed.get(i).copied().flatten() {
                        Some(k) => crate::hot_keys::batch_round(&mut runs, k, (pid, origin[i])),
                        None => 0,
                    };
                    groups
                        .entry((round, pid, origin[i]))
                        .or_insert_with(|| (st.nodes[&pid].part.clone(), Vec::new()))
                        .1
                        .push(i);
                }
            }
            let batches: Vec<(GroupKey, Group, Vec<RecordIn<'_>>)> = groups
                .into_iter()
                .map(|(k, g)| {
                    let recs = g.1.iter().map(|&i| ins[i]).collect();
                    (k, g, recs)
                })
                .collect();
            if attempts == 0 {
                // Nothing is written until every group passed its checks.
                for (_, (part, _), recs) in &batches {
                    if let Err(e) = part.check_batch(recs) {
                        for (run, &(high, next)) in hot_guards.values_mut().zip(&routed_from) {
                            run.high_ms = high;
                            run.next_lane = next;
                        }
                        return Err(e);
                    }
                }
                for (n, (_, (_, idxs), _)) in batches.iter().enumerate() {
                    for &i in idxs {
                        origin[i] = n;
                    }
                }
            }
            let mut retry = Vec::new();
            // The first round with a group refused as sealed: later rounds
            // wait for the next pass, so a windowed key's later records
            // never land before its earlier ones (nor do they after an
            // error: the loop stops at the first).
            let mut sealed_round: Option<u32> = None;
            for ((round, pid, _), (part, idxs), recs) in batches {
                if sealed_round.is_some_and(|r| round > r) {
                    retry.extend(idxs);
                    continue;
                }
                touched.push(part.clone());
                let hs: Vec<Option<u64>> = idxs.iter().map(|&i| hashes[i]).collect();
                // Groups of keys routed by mode are under their keys' locks;
                // the others are fenced against a mode change.
                let is_hot = |i: usize| hot_routed.get(i).copied().unwrap_or(false);
                let fenced =
                    (!idxs.iter().all(|&i| is_hot(i))).then_some((&self.inner.hot.fence, fence));
                match part.append_fenced(&recs, &hs, fenced) {
                    Ok(base) => {
                        wrote_any = true;
                        for (k, &i) in idxs.iter().enumerate() {
                            landed[i] = Some(Appended {
                                partition: pid,
                                offset: base + k as u64,
                            });
                        }
                    }
                    // Sealed between routing and appending: route again.
                    Err(Error::Sealed { .. }) if attempts < 1000 => {
                        retry.extend(idxs);
                        sealed_round.get_or_insert(round);
                    }
                    Err(e) => return Err(partial(landed, wrote_any, e)),
                }
            }
            retry.sort_unstable();
            fence = self.inner.hot.fence.load(Ordering::SeqCst);
            // A key given a mode since the batch began cannot be routed by
            // it now (its lock is taken in hash order, at the start): the
            // caller appends it again.
            if retry.iter().any(|&i| {
                !hot_routed.get(i).copied().unwrap_or(false)
                    && hashes[i].is_some_and(|h| self.inner.hot.get(h).is_some())
            }) {
                let e = Error::Refused(
                    "a key of the batch changed hot-key mode during the append; append the records not landed again".into(),
                );
                return Err(partial(landed, wrote_any, e));
            }
            // After that lookup (see `append`): a failed mode change took
            // its key back out of the map only after poisoning the log.
            if !retry.is_empty() {
                if let Err(e) = self.inner.core.check_open() {
                    return Err(partial(landed, wrote_any, e));
                }
            }
            pending = retry;
            attempts += 1;
        }
        drop(hot_guards);
        let out: Vec<Appended> = landed
            .iter()
            .map(|l| l.expect("every record landed when nothing is pending"))
            .collect();
        let touched: Vec<&Partition> = touched.iter().map(|p| &**p).collect();
        if let Err(e) = self.after_append(&touched) {
            // Every record was written. When the failed sync poisoned only
            // some of the partitions, the others' records are durable:
            // appended again, they would be there twice. Otherwise the
            // error alone, as for a single append.
            let durable_somewhere = out.iter().any(|a| {
                self.partition(a.partition)
                    .is_ok_and(|p| p.check_not_poisoned().is_ok())
            });
            if !durable_somewhere || !matches!(e, Error::Poisoned { .. }) {
                return Err(e);
            }
            return Err(self.partial_batch(landed, e, false));
        }
        Ok(out)
    }

    /// The error of a batch that wrote the records `landed` names (some)
    /// and then met `e`: [`Error::PartialBatch`], whose landed records the
    /// caller does not append again. Under `SyncPolicy::Always` they are
    /// synced first (unless `sync` is false: the batch's own sync round
    /// failed), as a successful batch's are; a sync that fails poisons its
    /// partition (every later sync reports it), whose records stay named:
    /// they were written, and the partition refuses appends until the log
    /// is reopened.
    fn partial_batch(&self, landed: Vec<Option<Appended>>, e: Error, sync: bool) -> Error {
        if sync && self.inner.sync_always {
            let _ = self.inner.core.sync_covering(&[]);
        }
        Error::PartialBatch {
            landed,
            source: Box::new(e),
        }
    }

    /// Appends records to one partition, bypassing routing.
    pub fn append_to(&self, partition: u32, records: &[NewRecord<'_>]) -> Result<u64> {
        self.inner.core.check_open()?;
        let now = now_ms();
        let recs: Vec<RecordIn<'_>> = records
            .iter()
            .map(|r| RecordIn {
                key: r.key,
                value: r.value,
                timestamp: r.timestamp.unwrap_or(now),
            })
            .collect();
        let hs: Vec<Option<u64>> = records
            .iter()
            .map(|r| r.key.map(|k| self.hash(k)))
            .collect();
        let part = self.partition(partition)?;
        let base = part.append(&recs, &hs)?;
        self.after_append(&[&part])?;
        Ok(base)
    }

    /// Under `SyncPolicy::Always`, waits for a sync round covering the
    /// partitions just appended to (a poisoned partition elsewhere does not
    /// fail this append).
    fn after_append(&self, parts: &[&Partition]) -> Result<()> {
        if self.inner.sync_always {
            self.inner.core.sync_covering(parts)?;
        }
        // The topic was deleted under a handle that lived on: the record
        // went into a removed file, and no round syncs it.
        if parts.iter().any(|p| p.is_removed()) {
            return Err(Error::UnknownTopic(self.inner.name.to_string()));
        }
        Ok(())
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

    /// Every partition in the topology: the active ones and the sealed
    /// ones not yet removed (a sealed partition leaves once retention has
    /// emptied it and its parents are gone, see [`crate::Log::enforce_retention`]).
    /// A `parents` entry may name a partition that was removed.
    pub fn partitions(&self) -> Vec<PartitionInfo> {
        let now = self.inner.core.clock.now_nanos();
        // Rates need each partition's writer lock, which a split or merge
        // holds while it waits for the state lock to install its children:
        // take them only after the state lock is released (lock order:
        // writer, then state; never the other way round).
        let snapshot: Vec<(PartitionInfo, Arc<Partition>)> = {
            let st = self.inner.state.read();
            st.nodes
                .values()
                .map(|n| {
                    let mut info = self.info_of(n);
                    info.moved = st.tails.get(&n.rec.id).map(|t| t.moved_range());
                    (info, n.part.clone())
                })
                .collect()
        };
        snapshot
            .into_iter()
            .map(|(mut info, part)| {
                info.rates = part.with_writer(|w| w.rates.rates(now));
                info
            })
            .collect()
    }

    /// A node's description, without rates.
    fn info_of(&self, n: &Node) -> PartitionInfo {
        PartitionInfo {
            id: n.rec.id,
            start: n.rec.start,
            end: n.rec.end,
            parents: n.rec.parents.clone(),
            removed_parents: n.rec.removed_parents.clone(),
            children: n.children.clone(),
            sealed_at: match n.rec.state {
                PartitionState::Active => None,
                PartitionState::Sealed { end_offset } => Some(end_offset),
            },
            start_offset: n.part.start_offset(),
            end_offset: n.part.end_offset(),
            bytes: n.part.size_bytes(),
            segments: n.part.segments().len(),
            rates: Vec::new(),
            hot_key: n.hot_key_reported,
            moved: None,
        }
    }

    /// The topology generation: a counter that moves with every change of
    /// the topic's partitions (split, merge, removal of an emptied
    /// partition, close). Two equal readings mean the same partitions with
    /// the same parents, children and seal offsets; it may also move for a
    /// change that leaves those alone (a hot key reported). Counted per
    /// open log, from zero: not kept across a reopen. One atomic load.
    pub fn topology_generation(&self) -> u64 {
        self.inner.generation.load(Ordering::SeqCst)
    }

    /// The lineage at the current generation: the cached snapshot if it is
    /// current, else a new one built under the state's read lock (no
    /// partition's lock, no offsets or rates).
    pub(crate) fn lineage(&self) -> Arc<Lineage> {
        let want = self.topology_generation();
        if let Some(l) = &*self.inner.lineage.lock() {
            if l.generation == want {
                return l.clone();
            }
        }
        let built = {
            let st = self.inner.state.read();
            Arc::new(Lineage {
                // Stable while the read lock is held.
                generation: self.topology_generation(),
                nodes: st
                    .nodes
                    .values()
                    .map(|n| {
                        let sealed_at = match n.rec.state {
                            PartitionState::Active => None,
                            PartitionState::Sealed { end_offset } => Some(end_offset),
                        };
                        let node = LineageNode {
                            parents: n.rec.parents.clone(),
                            children: n.children.clone(),
                            sealed_at,
                        };
                        (n.rec.id, node)
                    })
                    .collect(),
                removed_seals: st
                    .removed
                    .iter()
                    .map(|r| (r.id, r.end_offset))
                    .chain(
                        st.nodes
                            .values()
                            .flat_map(|n| n.rec.removed_parents.iter().copied()),
                    )
                    .collect(),
                removed: st
                    .removed
                    .iter()
                    .map(|r| (r.id, r.parents.clone()))
                    .collect(),
                removed_named: st
                    .nodes
                    .values()
                    .flat_map(|n| n.rec.removed_parents.iter().map(|r| r.0))
                    .collect(),
                removed_children: st.removed.iter().fold(
                    HashMap::new(),
                    |mut m: HashMap<u32, Vec<u32>>, r| {
                        for &q in &r.parents {
                            m.entry(q).or_default().push(r.id);
                        }
                        m
                    },
                ),
                tails: st.tails.iter().map(|(&k, v)| (k, v.clone())).collect(),
            })
        };
        let mut cache = self.inner.lineage.lock();
        if cache
            .as_ref()
            .is_none_or(|c| c.generation < built.generation)
        {
            *cache = Some(built.clone());
        }
        built
    }

    /// Ids of the active partitions, in hash-range order.
    pub fn active_partitions(&self) -> Vec<u32> {
        self.inner.state.read().routes.values().copied().collect()
    }

    /// The partitions that have held `key`, oldest first, each with its seal
    /// offset: reading them in this order returns the key's records in order.
    ///
    /// For a key given a hot-key mode (docs/HOT_KEYS.md), the links come
    /// era by era and, inside an era, lane by lane, each with its mode,
    /// lane, first window and the offsets bounding the era in it: reading
    /// each era's lanes and taking windows in sequence (as
    /// [`Topic::read_key`] does) returns the key's records in order.
    pub fn key_chain(&self, key: &[u8]) -> Vec<crate::hot_keys::KeyLink> {
        self.key_links(key)
    }

    /// [`Topic::key_chain`] for a hash value.
    pub fn hash_chain(&self, h: u64) -> Vec<ChainLink> {
        let st = self.inner.state.read();
        let covers = |id: &u32| {
            st.nodes
                .get(id)
                .is_some_and(|n| n.rec.start <= h && h <= n.rec.end)
        };
        // From the active partition that owns `h` (an O(log n) lookup) up
        // through the parent covering `h` (one of at most two), to the
        // oldest one still in the topology: an ancestor retention emptied
        // and removed ends the walk, whichever side of a merge it was on.
        let owner = st
            .routes
            .range(..=h)
            .next_back()
            .map(|(_, &id)| id)
            .filter(covers);
        let mut out = Vec::new();
        let mut cur = owner;
        while let Some(id) = cur {
            let n = &st.nodes[&id];
            let sealed_at = match n.rec.state {
                PartitionState::Sealed { end_offset } => Some(end_offset),
                PartitionState::Active => None,
            };
            out.push(ChainLink {
                partition: id,
                sealed_at,
            });
            cur = n.rec.parents.iter().copied().find(|p| covers(p));
        }
        out.reverse();
        out
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

    /// Creates the directories and empty first segments of new partitions.
    /// On failure, removes whatever it created (ids are reused by the next
    /// attempt, so no half-built directory may stay behind).
    pub(crate) fn create_partition_files(&self, ids: &[u32]) -> Result<Vec<Arc<Segment>>> {
        let result = self.try_create_partition_files(ids);
        if result.is_err() {
            self.remove_partition_files(ids);
        }
        result
    }

    fn try_create_partition_files(&self, ids: &[u32]) -> Result<Vec<Arc<Segment>>> {
        let cfg = self.config();
        let mut out = Vec::new();
        for &id in ids {
            let dir = partition_dir(&self.inner.dir, id);
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            let seg = Segment::create(
                &dir,
                (self.inner.id, id),
                0,
                cfg.segment_bytes,
                now_ms(),
                &*self.inner.core.hook,
            )?;
            seg.sync_data(&*self.inner.core.hook)?;
            sync_dir(&*self.inner.core.hook, IoOp::SyncNewDir, &dir)?;
            out.push(Arc::new(seg));
        }
        sync_dir(&*self.inner.core.hook, IoOp::SyncNewDir, &self.inner.dir)?;
        Ok(out)
    }

    pub(crate) fn remove_partition_files(&self, ids: &[u32]) {
        for &id in ids {
            let _ = std::fs::remove_dir_all(partition_dir(&self.inner.dir, id));
        }
    }

    /// Builds a partition over `seg`; `durable` is (segment base, byte
    /// position, end offset) known to be on disk.
    pub(crate) fn make_partition(
        &self,
        id: u32,
        seg: Vec<Arc<Segment>>,
        (start, end): (u64, u64),
        sealed: bool,
        durable: (u64, u64, u64),
    ) -> Arc<Partition> {
        let cfg = self.config();
        let now = self.inner.core.clock.now_nanos();
        Arc::new_cyclic(|me| {
            Partition::new(
                PartitionParams {
                    topic: self.inner.name.clone(),
                    topic_id: self.inner.id,
                    id,
                    dir: partition_dir(&self.inner.dir, id),
                    segment_bytes: cfg.segment_bytes,
                    index_interval: u64::from(cfg.index_interval_bytes),
                    max_record_bytes: cfg.effective_max_record_bytes(),
                    lock: self.inner.lock.lock().clone(),
                    isolation: if cfg.sync == crate::config::SyncPolicy::Always {
                        ReadIsolation::Durable
                    } else {
                        ReadIsolation::Written
                    },
                    wake: self.inner.wake.clone(),
                },
                seg,
                sealed,
                durable,
                RateTracker::new(&crate::balance::DEFAULT_WINDOWS, now),
                LoadMap::new(start, end, now),
                self.inner.core.hook.clone(),
                self.inner.core.clock.clone(),
                (self.inner.core.dirty.clone(), me.clone()),
            )
        })
    }

    /// Splits an active partition: children are created first, then one
    /// durable manifest record commits the split while appends to the
    /// parent wait (only for that commit). Returns the children, in range order.
    pub fn split(&self, partition: u32, plan: SplitPlan) -> Result<Vec<u32>> {
        let _change = self.inner.change.lock();
        // Checked under the change lock: a split that failed to commit
        // poisons the log and keeps its children's files (its record may be
        // on disk); no later change may reuse their ids. A deleted topic
        // takes no children into its removed directory.
        self.check_live()?;
        let (start, end, parent) = {
            let st = self.inner.state.read();
            let n = st
                .nodes
                .get(&partition)
                .ok_or_else(|| Error::UnknownPartition {
                    topic: self.name().into(),
                    partition,
                })?;
            if n.rec.state != PartitionState::Active {
                return Err(Error::Refused(format!("partition {partition} is sealed")));
            }
            (n.rec.start, n.rec.end, n.part.clone())
        };
        let ranges = split_ranges(start, end, plan, &parent)?;
        let max = self.config().balance.max_partitions as usize;
        let active = self.inner.state.read().routes.len();
        if active - 1 + ranges.len() > max {
            return Err(Error::Refused(format!(
                "split would exceed max_partitions ({max})"
            )));
        }
        let first_id = self.next_partition_id();
        let ids: Vec<u32> = (0..ranges.len() as u32).map(|i| first_id + i).collect();
        let segs = self.create_partition_files(&ids)?;
        let children = child_records(partition, &ids, &ranges);
        let core = self.inner.core.clone();
        let result = parent.seal_with(&core.syncer, |seal_offset| {
            let mut topo = core.topology.lock();
            let rec = ManifestRecord::Split {
                topic_id: self.inner.id,
                parent: partition,
                seal_offset,
                children: children.clone(),
            };
            core.commit(&mut topo, rec)?;
            drop(topo);
            self.install_children(&[(partition, seal_offset)], &children, segs.clone());
            Ok(seal_offset)
        });
        match result {
            Ok(seal_offset) => {
                self.seed_children(&[&parent], &ids);
                core.events.emit(TopologyEvent::Split {
                    topic: self.name().into(),
                    parent: partition,
                    seal_offset,
                    children: ids.clone(),
                });
                Ok(ids)
            }
            Err(e) => {
                drop(segs);
                // After a failed commit the record may be on disk: keep the
                // children for the replay (an open that does not find the
                // record removes them as orphans). Otherwise the parent's
                // sync may have failed: log-wide syncs report it.
                if !matches!(e, Error::LogPoisoned { .. }) {
                    core.note_poisoned(&parent);
                    self.remove_partition_files(&ids);
                }
                Err(e)
            }
        }
    }

    /// Merges two active partitions with adjacent ranges into one child.
    pub fn merge(&self, a: u32, b: u32) -> Result<u32> {
        let _change = self.inner.change.lock();
        self.check_live()?;
        let (left, right) = {
            let st = self.inner.state.read();
            let get = |id: u32| -> Result<&Node> {
                let n = st.nodes.get(&id).ok_or_else(|| Error::UnknownPartition {
                    topic: self.name().into(),
                    partition: id,
                })?;
                if n.rec.state != PartitionState::Active {
                    return Err(Error::Refused(format!("partition {id} is sealed")));
                }
                Ok(n)
            };
            let (na, nb) = (get(a)?, get(b)?);
            let (l, r) = if na.rec.start < nb.rec.start {
                (na, nb)
            } else {
                (nb, na)
            };
            if l.rec.end.checked_add(1) != Some(r.rec.start) {
                return Err(Error::Refused(format!(
                    "partitions {a} and {b} do not have adjacent ranges"
                )));
            }
            let min = self.config().balance.min_partitions as usize;
            if st.routes.len() - 1 < min {
                return Err(Error::Refused(format!(
                    "merge would go below min_partitions ({min})"
                )));
            }
            (
                (l.rec.id, l.rec.start, l.part.clone()),
                (r.rec.id, r.rec.end, r.part.clone()),
            )
        };
        let id = self.next_partition_id();
        let segs = self.create_partition_files(&[id])?;
        let child = PartitionRecord {
            id,
            start: left.1,
            end: right.1,
            parents: vec![left.0, right.0],
            state: PartitionState::Active,
            created_ms: now_ms(),
            removed_parents: Vec::new(),
        };
        let core = self.inner.core.clone();
        let result = left.2.seal_with(&core.syncer, |lend| {
            right.2.seal_with(&core.syncer, |rend| {
                let mut topo = core.topology.lock();
                let parents = vec![(left.0, lend), (right.0, rend)];
                core.commit(
                    &mut topo,
                    ManifestRecord::Merge {
                        topic_id: self.inner.id,
                        parents: parents.clone(),
                        child: child.clone(),
                    },
                )?;
                drop(topo);
                self.install_children(&parents, std::slice::from_ref(&child), segs.clone());
                Ok(parents)
            })
        });
        match result {
            Ok(parents) => {
                self.seed_children(&[&left.2, &right.2], &[id]);
                core.events.emit(TopologyEvent::Merge {
                    topic: self.name().into(),
                    parents,
                    child: id,
                });
                Ok(id)
            }
            Err(e) => {
                drop(segs);
                if !matches!(e, Error::LogPoisoned { .. }) {
                    core.note_poisoned(&left.2);
                    core.note_poisoned(&right.2);
                    self.remove_partition_files(&[id]);
                }
                Err(e)
            }
        }
    }

    /// Removes the sealed partitions that retention emptied, oldest first
    /// (one whose parent is still there waits for it: until then a reader
    /// may still be draining the parent, and must find this partition to
    /// continue the lineage in order). Returns how many were removed.
    pub(crate) fn remove_emptied(&self) -> Result<usize> {
        let _change = self.inner.change.lock();
        if self.is_deleted() {
            // Its partitions went with it.
            return Ok(0);
        }
        let mut removed = 0;
        loop {
            let next = {
                let st = self.inner.state.read();
                st.nodes
                    .values()
                    .find(|n| {
                        n.rec.state != PartitionState::Active
                            && n.rec.parents.iter().all(|p| !st.nodes.contains_key(p))
                            && n.part.fully_retired()
                    })
                    .map(|n| (n.rec.id, n.part.clone()))
            };
            let Some((id, part)) = next else {
                return Ok(removed);
            };
            self.remove_partition(id, &part)?;
            removed += 1;
        }
    }

    /// Removes one emptied sealed partition, in the order that keeps every
    /// crash recoverable in Strict mode: (1) a durable `RemovePartition`
    /// record (a crash before it finds the partition with its retention
    /// floor at its end: empty, not damaged), (2) out of the in-memory
    /// topology and the checkpoint, (3) its directory deleted and the
    /// topic directory fsynced (a crash before that leaves a directory no
    /// manifest record names: recovery removes it as an orphan and
    /// reports it). Called under the change lock.
    fn remove_partition(&self, id: u32, part: &Arc<Partition>) -> Result<()> {
        let core = &self.inner.core;
        let dropped_indexes = {
            let mut topo = core.topology.lock();
            let kept = |topo: &crate::core::Topology| -> Vec<u32> {
                topo.state
                    .topics
                    .iter()
                    .find(|t| t.id == self.inner.id)
                    .map(|t| {
                        t.tail_moves
                            .iter()
                            .filter(|m| m.index_in_topic_dir)
                            .map(|m| m.parent)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let before = kept(&topo);
            core.commit(
                &mut topo,
                ManifestRecord::RemovePartition {
                    topic_id: self.inner.id,
                    partition: id,
                },
            )?;
            let after = kept(&topo);
            before
                .into_iter()
                .filter(|p| !after.contains(p))
                .collect::<Vec<u32>>()
        };
        part.mark_removed();
        {
            // Through `write_state`: the topology generation moves, so
            // readers take a lineage without the removed partition.
            // A tail split's index stays for this run: a reader still
            // positioned past the removed parent's logical end is
            // translated at its next look, not sent back to the children's
            // first offsets.
            let mut st = self.inner.write_state();
            if let Some(n) = st.nodes.remove(&id) {
                // As the record did in the manifest (with the seal readers
                // used: the recovered end, where that is lower).
                if let PartitionState::Sealed { end_offset } = n.rec.state {
                    for c in &n.children {
                        if let Some(child) = st.nodes.get_mut(c) {
                            child.rec.removed_parents.push((id, end_offset));
                        }
                    }
                    st.removed.push(crate::format::manifest::RemovedPartition {
                        id,
                        parents: n.rec.parents.clone(),
                        end_offset,
                    });
                    crate::topology::model::bound_removed(&mut st.removed);
                }
            }
        }
        core.ck_cache.lock().remove_partition(self.inner.id, id);
        // A reader waiting on the removed partition moves on.
        self.inner.wake.notify_partition(id);
        core.events.emit(TopologyEvent::PartitionRemoved {
            topic: self.name().into(),
            partition: id,
        });
        // Committed: a failure from here on leaves an orphan directory for
        // the next open to remove, never a partition the manifest misses.
        let dir = partition_dir(&self.inner.dir, id);
        core.hook
            .before(IoOp::RemovePartitionDir, &dir)
            .and_then(|()| std::fs::remove_dir_all(&dir))
            .map_err(|e| Error::io(&dir, e))?;
        // Descendant indexes whose tail entry the record dropped (the
        // parent left the removed list); this run's readers keep theirs in
        // memory. A crash before this leaves them for the next open.
        for parent in dropped_indexes {
            let path = self
                .inner
                .dir
                .join(crate::format::tail_index::file_name(parent));
            let _ = std::fs::remove_file(&path);
        }
        sync_dir(&*core.hook, IoOp::SyncNewDir, &self.inner.dir)
    }

    pub(crate) fn next_partition_id(&self) -> u32 {
        let topo = self.inner.core.topology.lock();
        topo.state
            .topics
            .iter()
            .find(|t| t.id == self.inner.id)
            .map_or(0, |t| t.next_partition_id)
    }

    /// Updates the in-memory topology after a committed split or merge.
    fn install_children(
        &self,
        parents: &[(u32, u64)],
        children: &[PartitionRecord],
        segs: Vec<Arc<Segment>>,
    ) {
        let parts: Vec<Arc<Partition>> = children
            .iter()
            .zip(segs)
            .map(|(c, s)| self.make_partition(c.id, vec![s], (c.start, c.end), false, (0, 64, 0)))
            .collect();
        self.install_children_with(parents, children, parts, None);
    }

    /// [`Topic::install_children`] with the children's partitions built.
    pub(crate) fn install_children_with(
        &self,
        parents: &[(u32, u64)],
        children: &[PartitionRecord],
        parts: Vec<Arc<Partition>>,
        tail: Option<(u32, Arc<crate::tail::TailInfo>)>,
    ) {
        let now = self.inner.core.clock.now_nanos();
        let mut st = self.inner.write_state();
        // A tail split's entry goes in with the seal, under one write: a
        // reader taking the lineage in between would see the parent sealed
        // at its logical end without it, take a position past that end for
        // drained, and read the moved records again from the children.
        if let Some((parent, info)) = tail {
            // The parent's reads stop at `from` from here on: after the
            // generation moved (`write_state`), so whoever sees the parent
            // cut there also sees the new generation and finds the moved
            // records in the children (a key reader takes a read that stops
            // short of its bound for the end of the parent only when the
            // generation did not move); and under the write lock, so a
            // lineage built under the read lock sees the cut with it (a
            // reader seeing the new lineage reads the parent up to `from`
            // only).
            if let Some(n) = st.nodes.get(&parent) {
                n.part.set_logical_end(info.index.from);
            }
            st.tails.insert(parent, info);
        }
        for &(pid, end_offset) in parents {
            if let Some(n) = st.nodes.get_mut(&pid) {
                n.rec.state = PartitionState::Sealed { end_offset };
                n.children.extend(children.iter().map(|c| c.id));
                n.part.mark_sealed();
                let start = n.rec.start;
                st.routes.remove(&start);
            }
        }
        for (c, p) in children.iter().zip(parts) {
            st.routes.insert(c.start, c.id);
            st.nodes.insert(
                c.id,
                Node {
                    rec: c.clone(),
                    children: Vec::new(),
                    part: p,
                    last_change_nanos: now,
                    hot_key_reported: false,
                },
            );
        }
    }
}

/// The records of the children of a split of `partition`: ids and hash
/// ranges pairwise, active, created now.
pub(crate) fn child_records(
    partition: u32,
    ids: &[u32],
    ranges: &[(u64, u64)],
) -> Vec<PartitionRecord> {
    let created = now_ms();
    ids.iter()
        .zip(ranges)
        .map(|(&id, &(start, end))| PartitionRecord {
            id,
            start,
            end,
            parents: vec![partition],
            state: PartitionState::Active,
            created_ms: created,
            removed_parents: Vec::new(),
        })
        .collect()
}

/// Children ranges for a split plan.
pub(crate) fn split_ranges(
    start: u64,
    end: u64,
    plan: SplitPlan,
    parent: &Partition,
) -> Result<Vec<(u64, u64)>> {
    if start == end {
        return Err(Error::Refused(
            "a partition of a single hash value cannot be split (it carries one hot key)".into(),
        ));
    }
    let mid = start + (end - start) / 2;
    let at = match plan {
        SplitPlan::At(at) => at,
        SplitPlan::Even => mid,
        SplitPlan::LoadMedian => parent.with_writer(|w| w.load.split_point()).unwrap_or(mid),
        SplitPlan::LoadQuantiles(k) => {
            if !(2..=16).contains(&k) {
                return Err(Error::Refused(format!(
                    "a split makes 2 to 16 children, not {k}"
                )));
            }
            let points = parent.with_writer(|w| w.load.quantile_points(usize::from(k)));
            if points.len() < 2 {
                parent.with_writer(|w| w.load.split_point()).unwrap_or(mid)
            } else {
                let mut out = Vec::with_capacity(points.len() + 1);
                let mut lo = start;
                for m in points {
                    out.push((lo, m));
                    lo = m + 1;
                }
                out.push((lo, end));
                return Ok(out);
            }
        }
        SplitPlan::Cuts(points) => {
            let points = points.points();
            if points.is_empty() || points.iter().any(|&c| c < start || c >= end) {
                return Err(Error::Refused(format!(
                    "split points {points:x?} are not all inside [{start:#x}, {end:#x})"
                )));
            }
            let mut out = Vec::with_capacity(points.len() + 1);
            let mut lo = start;
            for &c in points {
                out.push((lo, c));
                lo = c + 1;
            }
            out.push((lo, end));
            return Ok(out);
        }
        SplitPlan::IsolateHash(h) => {
            if h < start || h > end {
                return Err(Error::Refused(format!(
                    "hash {h:#x} is outside the partition's range"
                )));
            }
            let mut v = Vec::new();
            if h > start {
                v.push((start, h - 1));
            }
            v.push((h, h));
            if h < end {
                v.push((h + 1, end));
            }
            return Ok(v);
        }
    };
    if at < start || at >= end {
        return Err(Error::Refused(format!(
            "split point {at:#x} is not inside [{start:#x}, {end:#x})"
        )));
    }
    Ok(vec![(start, at), (at + 1, end)])
}
