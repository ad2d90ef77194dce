//! `Log`: a directory of topics, and its API (topic creation, lookup and
//! deletion, sync, close). Opening it is recovery (`open.rs`); retention,
//! the background thread and the offline `verify` have their own files.

mod background;
mod open;
mod retention;
mod verify;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};

use crate::config::{LogOptions, TopicConfig};
use crate::core::Core;
use crate::error::{Error, IoContext, Result};
use crate::events::TopologyEvent;
use crate::format::manifest::{ManifestRecord, PartitionRecord, PartitionState, TopicRecord};
use crate::layout::{topic_dir, TOPICS_DIR};
use crate::partition::Partition;
use crate::recovery::RecoveryReport;
use crate::storage::durability::{SyncBackend, BATCH_OPEN_MAX};
#[cfg(feature = "testing")]
use crate::storage::fault::IoHook;
use crate::storage::fault::{IoOp, NoFaults};
use crate::storage::lock::DirLock;
use crate::storage::position::DurablePoint;
use crate::storage::sync_dir;
use crate::topic::{even_ranges, partition_dir, Node, Topic, TopicInner, TopicState};

pub use verify::verify;

/// An open log directory. Dropping it closes it cleanly.
#[derive(Debug)]
pub struct Log {
    core: Arc<Core>,
    /// The topics by name. Here, above `topic`, and not in the core: the
    /// core is what topics and partitions below need (options, clock,
    /// manifest, sync rounds), so a topic holds the core and nothing holds
    /// a topic but the log, its background thread and the caller.
    topics: Arc<TopicMap>,
    report: RecoveryReport,
    /// Shared with every topic, partition and read batch handed out: the
    /// directory stays locked while any of them lives.
    _lock: Arc<DirLock>,
    background: Option<std::thread::JoinHandle<()>>,
    abandoned: bool,
}

/// Creates a new topic's directory, its partitions' directories and their
/// first segments, and makes the partition directories' names durable,
/// before the manifest record that commits the topic names them (C5: a
/// crash before the commit leaves files no record names, which the next
/// open removes as orphans; after it, every partition directory the record
/// names is there).
///
/// The first segments are not synced here, nor the directories naming
/// them: two fsyncs a partition were most of a creation's time (10,000
/// partitions, 20,000 fsyncs). A new partition's durable point says
/// nothing is durable, not even its first segment's header, and its first
/// segment counts as created by a roll whose directory fsync has not run
/// (see [`Partition::first_segment_unnamed`]): the sync round that first
/// has something of it to make durable fdatasyncs the segment and fsyncs
/// its directory, in the batches it issues anyway. Until then a power loss
/// may take the file or leave its header torn; recovery treats that as the
/// torn creation of a segment no checkpoint calls synced and creates it
/// again, losing nothing, since nothing of it was acknowledged durable.
///
/// Each segment's descriptor is closed once it is created: the topic holds
/// no descriptor per partition (the writer opens the file again when it
/// needs it). Then the topic
/// directory (naming the partition directories) and `topics/` (naming the
/// topic directory) are fsynced.
fn create_topic_files(
    core: &Core,
    tdir: &Path,
    rec: &TopicRecord,
    now: i64,
) -> Result<Vec<Arc<crate::storage::segment::Segment>>> {
    std::fs::create_dir_all(tdir).at(tdir)?;
    let mut segments = Vec::with_capacity(rec.partitions.len());
    for p in &rec.partitions {
        let pdir = partition_dir(tdir, p.id);
        std::fs::create_dir_all(&pdir).at(&pdir)?;
        let seg = Arc::new(crate::storage::segment::Segment::create_version(
            &pdir,
            (rec.id, p.id),
            0,
            rec.config.segment_bytes,
            (
                now,
                crate::partition::segment_version(rec.config.replicated),
            ),
            &*core.hook,
        )?);
        seg.close_file();
        segments.push(seg);
    }
    sync_dir(&*core.hook, IoOp::SyncNewDir, tdir)?;
    sync_dir(&*core.hook, IoOp::SyncNewDir, &core.dir.join(TOPICS_DIR))?;
    Ok(segments)
}

/// Writes durably the index file of every active segment whose index
/// changed since it was last durable (a clean close), in batches of
/// [`BATCH_OPEN_MAX`]: each batch writes its temporary files, fdatasyncs
/// them together, renames them into place and fsyncs their directories
/// together. An index is a cache, validated on load: the order only keeps
/// a power loss from leaving a half-written one in place.
///
/// An index the open derives as cheaply as it reads the file gets no file
/// when it has none ([`Segment::index_file_derivable`](crate::storage::segment::Segment::index_file_derivable)):
/// a topic of many small partitions then closes without creating a file
/// per partition.
fn flush_indexes(core: &Core, parts: &[Arc<Partition>]) -> Result<()> {
    let changed: Vec<_> = parts
        .iter()
        .filter_map(|p| p.index_to_flush())
        .filter(|(seg, buf)| !seg.index_file_derivable(buf))
        .collect();
    for batch in changed.chunks(BATCH_OPEN_MAX) {
        let files = batch
            .iter()
            .map(|(seg, buf)| seg.write_index_tmp(buf))
            .collect::<Result<Vec<_>>>()?;
        core.syncer.sync_batch(&files)?;
        drop(files);
        let dirs = batch
            .iter()
            .map(|(seg, _)| seg.install_index_file())
            .collect::<Result<Vec<_>>>()?;
        core.syncer.sync_batch(&dirs)?;
        for (seg, buf) in batch {
            seg.index_made_durable(buf);
        }
    }
    Ok(())
}

/// The topics of an open log: the live ones by name, and the handles of
/// deleted ones that may still live.
#[derive(Debug, Default)]
pub(crate) struct TopicMap {
    live: RwLock<BTreeMap<String, Topic>>,
    /// Topics deleted while the log is open whose handles may still live:
    /// closing releases their partitions (and the directory lock they
    /// hold) like those of the live topics.
    deleted: Mutex<Vec<Weak<TopicInner>>>,
}

impl TopicMap {
    /// The live topic `name`.
    fn get(&self, name: &str) -> Option<Topic> {
        self.live.read().get(name).cloned()
    }

    /// Names of the live topics.
    fn names(&self) -> Vec<String> {
        self.live.read().keys().cloned().collect()
    }

    /// Every live topic, taken under one read of the map.
    pub(crate) fn all(&self) -> Vec<Topic> {
        self.live.read().values().cloned().collect()
    }

    /// Every partition of every live topic.
    pub(crate) fn partitions(&self) -> Vec<Arc<Partition>> {
        self.live
            .read()
            .values()
            .flat_map(|t| t.all_partition_handles())
            .collect()
    }

    /// Adds a topic (created, or recovered at open).
    pub(crate) fn insert(&self, topic: Topic) {
        self.live.write().insert(topic.name().to_string(), topic);
    }

    /// Moves a topic whose deletion committed from the live map to the
    /// deleted handles. By identity: a topic of the same name created
    /// since the commit (the name was free from then on) stays.
    fn remove_deleted(&self, topic: &Topic) {
        {
            let mut live = self.live.write();
            if live
                .get(topic.name())
                .is_some_and(|t| Arc::ptr_eq(&t.inner, &topic.inner))
            {
                live.remove(topic.name());
            }
        }
        let mut deleted = self.deleted.lock();
        deleted.retain(|w| w.strong_count() > 0);
        deleted.push(Arc::downgrade(&topic.inner));
    }

    /// Empties the map at close, releasing the partitions of every topic,
    /// live or deleted (see [`Topic::release_partitions`]).
    fn release_all(&self) {
        let live = std::mem::take(&mut *self.live.write());
        for t in live.values() {
            t.release_partitions();
        }
        // Handles of topics deleted meanwhile hold the directory lock too.
        let deleted = std::mem::take(&mut *self.deleted.lock());
        for inner in deleted.iter().filter_map(Weak::upgrade) {
            Topic { inner }.release_partitions();
        }
    }
}

impl Log {
    /// Opens (or creates) the log in `dir`, recovering from any crash.
    pub fn open(dir: impl AsRef<Path>, options: LogOptions) -> Result<Log> {
        open::open(dir.as_ref(), options, Arc::new(NoFaults))
    }

    /// [`Log::open`] with a fault-injection hook on the rare I/O paths
    /// (a test seam: `testing` feature).
    #[cfg(feature = "testing")]
    pub fn open_with_hook(
        dir: impl AsRef<Path>,
        options: LogOptions,
        hook: Arc<dyn IoHook>,
    ) -> Result<Log> {
        open::open(dir.as_ref(), options, hook)
    }

    /// What recovery found and did.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Which mechanism syncs files (chosen at open).
    pub fn sync_backend(&self) -> SyncBackend {
        self.core.syncer.backend()
    }

    /// What the log's budget of mappings and descriptors of sealed
    /// segments holds now, and its limits.
    pub fn resource_stats(&self) -> crate::ResourceStats {
        self.core.budget.counts()
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.core.dir
    }

    /// Creates a topic with its initial partitions.
    pub fn create_topic(&self, name: &str, config: TopicConfig) -> Result<Topic> {
        crate::topic_name::validate(name)?;
        config.validate()?;
        self.core.check_open()?;
        let mut topo = self.core.topology.lock();
        // Again under the topology lock: after a failed commit, the next
        // topic id may name a directory a replay could still reference.
        self.core.check_open()?;
        if topo.state.topics.iter().any(|t| t.name == name) {
            return Err(Error::TopicExists(name.to_string()));
        }
        let id = topo.state.next_topic_id;
        let tdir = topic_dir(&self.core.dir, id);
        let hash_key = self.topic_hash_key(name, &tdir)?;
        let now = crate::partition::now_ms();
        let rec = initial_record(id, name, &config, hash_key, now);
        // Files first; the manifest record commits the topic.
        let topic = match self.build_topic(&tdir, &rec, now).and_then(|t| {
            self.core
                .commit(&mut topo, ManifestRecord::CreateTopic(rec.clone()))
                .map(|()| t)
        }) {
            Ok(t) => t,
            Err(e) => {
                // A failed commit may be on disk: keep what it references.
                if !matches!(e, Error::LogPoisoned { .. }) {
                    // Best effort: what stays behind is an orphan no
                    // manifest record names, which the next open removes.
                    let _ = std::fs::remove_dir_all(&tdir);
                }
                return Err(e);
            }
        };
        drop(topo);
        self.topics.insert(topic.clone());
        self.core.events.emit(TopologyEvent::TopicCreated {
            topic: name.to_string(),
        });
        Ok(topic)
    }

    /// The routing hash key of a new topic: derived from the seed in the
    /// options when one is set, random otherwise.
    fn topic_hash_key(&self, name: &str, tdir: &Path) -> Result<[u64; 2]> {
        Ok(match self.core.topic_hash_seed {
            Some(seed) => [
                crate::topic::key_hash([seed, 0], name.as_bytes()),
                crate::topic::key_hash([seed, 1], name.as_bytes()),
            ],
            None => {
                let mut key = [0u8; 16];
                getrandom::fill(&mut key)
                    .map_err(|e| Error::io(tdir, std::io::Error::other(e.to_string())))?;
                [
                    u64::from_le_bytes(key[..8].try_into().expect("8 bytes")),
                    u64::from_le_bytes(key[8..].try_into().expect("8 bytes")),
                ]
            }
        })
    }

    /// A new topic's files and in-memory state, before the manifest record
    /// that commits it.
    fn build_topic(&self, tdir: &Path, rec: &TopicRecord, now: i64) -> Result<Topic> {
        let segments = create_topic_files(&self.core, tdir, rec, now)?;
        let topic = new_topic(&self.core, &self._lock, rec);
        let mut st = TopicState::default();
        for (p, seg) in rec.partitions.iter().zip(segments) {
            // Nothing durable yet, not even the header: see
            // `create_topic_files`.
            let part = topic.make_partition(
                p.id,
                vec![seg],
                (p.start, p.end),
                false,
                DurablePoint::NOTHING.into(),
            );
            part.first_segment_unnamed();
            st.routes.insert(p.start, p.id);
            st.nodes.insert(
                p.id,
                Node {
                    rec: p.clone(),
                    children: vec![],
                    part,
                    last_change_nanos: self.core.clock.now_nanos(),
                    hot_key_reported: false,
                },
            );
        }
        *topic.inner.write_state() = st;
        Ok(topic)
    }

    /// Opens a topic by name, creating it with `config` when missing.
    pub fn topic_or_create(&self, name: &str, config: TopicConfig) -> Result<Topic> {
        match self.topic(name) {
            Err(Error::UnknownTopic(_)) => self.create_topic(name, config),
            other => other,
        }
    }

    /// A topic by name.
    pub fn topic(&self, name: &str) -> Result<Topic> {
        crate::topic_name::validate(name)?;
        self.topics
            .get(name)
            .ok_or_else(|| Error::UnknownTopic(name.to_string()))
    }

    /// Names of all topics.
    pub fn topics(&self) -> Vec<String> {
        self.topics.names()
    }

    /// Deletes a topic and its files. Readers holding its data keep reading
    /// it safely (the mappings stay valid until dropped).
    pub fn delete_topic(&self, name: &str) -> Result<()> {
        self.core.check_open()?;
        let topic = self.topic(name)?;
        // No split, merge, tail split, hot-key change or removal of the
        // topic's partitions runs meanwhile, and none starts afterwards
        // (`deleted`): each writes files into the directory removed below.
        let _change = topic.inner.lock_changes();
        if topic.is_deleted() {
            // A concurrent delete of the same topic went first.
            return Err(Error::UnknownTopic(name.to_string()));
        }
        let mut topo = self.core.topology.lock();
        self.core.commit(
            &mut topo,
            ManifestRecord::DeleteTopic {
                topic_id: topic.id(),
            },
        )?;
        drop(topo);
        topic.inner.mark_deleted();
        self.topics.remove_deleted(&topic);
        // A `Durable` future waiting on the topic fails now, not never.
        topic.inner.wake().notify_all();
        // Before the files go: a sync round that meets one of its
        // partitions afterwards skips it, instead of failing on the missing
        // directory (and every round after it, as the partition stayed
        // dirty), and no checkpoint names it again.
        for p in topic.all_partition_handles() {
            p.mark_deleted();
        }
        self.core.forget_failed_topic(topic.id());
        self.core.ck_cache.lock().remove_topic(topic.id());
        let tdir = topic_dir(&self.core.dir, topic.id());
        std::fs::remove_dir_all(&tdir).at(&tdir)?;
        sync_dir(
            &*self.core.hook,
            IoOp::SyncNewDir,
            &self.core.dir.join(TOPICS_DIR),
        )
    }

    /// Makes everything appended so far durable.
    pub fn sync(&self) -> Result<()> {
        self.core.check_open()?;
        self.core.sync()
    }

    /// Subscribes to topology events (splits, merges, hot keys).
    pub fn subscribe(&self) -> std::sync::mpsc::Receiver<TopologyEvent> {
        self.core.events.subscribe()
    }

    /// Applies retention to every topic now (the background thread also
    /// does this every second). Returns the number of segments deleted.
    ///
    /// A sealed partition left with nothing to read (every offset below
    /// its seal retired) is then removed from the topology once its
    /// parents are gone: a durable `RemovePartition` manifest record, then
    /// its directory (see docs/ARCHITECTURE.md, "Retention").
    ///
    /// It also releases the moved range of every tail-split parent, in
    /// every topic ([`Topic::reclaim_tail`]).
    pub fn enforce_retention(&self) -> Result<usize> {
        retention::enforce_retention(&self.core, &self.topics)
    }

    /// Runs one balancer pass over every topic now (the background thread
    /// does this at each topic's `check_interval`).
    pub fn balance_now(&self) -> Result<Vec<crate::balance::Decision>> {
        let mut out = Vec::new();
        for t in self.topics.all() {
            out.extend(t.balance_step()?);
        }
        Ok(out)
    }

    /// Closes cleanly: syncs everything and writes a clean checkpoint, so the
    /// next open reads metadata only.
    pub fn close(mut self) -> Result<()> {
        self.shutdown(true)
    }

    /// Stops without syncing or checkpointing, as a killed process would
    /// (the page cache keeps what was written). For crash tests (a test
    /// seam: `testing` feature).
    #[cfg(feature = "testing")]
    pub fn abandon(mut self) {
        self.abandoned = true;
        // Without `clean` the shutdown syncs nothing and cannot fail.
        let _ = self.shutdown(false);
    }

    fn shutdown(&mut self, clean: bool) -> Result<()> {
        if self.core.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Some(h) = self.background.take() {
            // Wake it from its nap so closing does not wait for it.
            h.thread().unpark();
            // An error here is the thread's panic, already reported on
            // stderr; every sync it ran left its failure in the core, which
            // the clean round below reports.
            let _ = h.join();
        }
        let result = if clean {
            let parts = self.topics.partitions();
            flush_indexes(&self.core, &parts)
                .and_then(|()| self.core.group.sync(|| self.core.clean_sync_round(&parts)))
                .and_then(|()| self.core.partition_failure())
        } else {
            Ok(())
        };
        self.topics.release_all();
        result
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        if !self.abandoned {
            // A drop cannot report: `close` is the call that returns the
            // final sync's error. A failed round leaves a checkpoint
            // without the clean mark, so the next open recovers as after a
            // crash, and nothing is lost that was known durable.
            let _ = self.shutdown(true);
        }
    }
}

/// A new topic's manifest record: `config.partitions` partitions with
/// even ranges over the whole hash space.
fn initial_record(
    id: u32,
    name: &str,
    config: &TopicConfig,
    hash_key: [u64; 2],
    now: i64,
) -> TopicRecord {
    let partitions: Vec<PartitionRecord> = even_ranges(config.partitions)
        .into_iter()
        .enumerate()
        .map(|(i, (s, e))| PartitionRecord {
            id: i as u32,
            start: s,
            end: e,
            parents: vec![],
            state: PartitionState::Active,
            created_ms: now,
            removed_parents: Vec::new(),
        })
        .collect();
    TopicRecord {
        id,
        name: name.to_string(),
        config: config.to_record(),
        hash_key,
        next_partition_id: partitions.len() as u32,
        partitions,
        groups: Vec::new(),
        removed: Vec::new(),
        tail_moves: Vec::new(),
        hot_keys: Vec::new(),
    }
}

fn new_topic(core: &Arc<Core>, lock: &Arc<DirLock>, rec: &TopicRecord) -> Topic {
    Topic::new(core, lock, rec, topic_dir(&core.dir, rec.id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_topic_record_tiles_the_hash_space_with_active_partitions_numbered_from_zero() {
        let config = TopicConfig {
            partitions: 3,
            ..TopicConfig::default()
        };
        let rec = initial_record(7, "orders", &config, [1, 2], 1_000);
        assert_eq!(
            (rec.id, rec.name.as_str(), rec.hash_key),
            (7, "orders", [1, 2])
        );
        assert_eq!(rec.config, config.to_record());
        assert_eq!(rec.next_partition_id, 3);
        let ids: Vec<u32> = rec.partitions.iter().map(|p| p.id).collect();
        assert_eq!(ids, vec![0, 1, 2]);
        assert_eq!(rec.partitions[0].start, 0);
        assert_eq!(rec.partitions[2].end, u64::MAX);
        for w in rec.partitions.windows(2) {
            assert_eq!(w[0].end + 1, w[1].start, "ranges tile without gaps");
        }
        for p in &rec.partitions {
            assert!(p.parents.is_empty() && p.removed_parents.is_empty());
            assert_eq!((p.state, p.created_ms), (PartitionState::Active, 1_000));
        }
    }
}
