//! `Log`: a directory of topics. Opening it is recovery.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::config::{LogOptions, SyncPolicy, TopicConfig};
use crate::core::{Core, Topology};
use crate::error::{Error, IoContext, Result};
use crate::events::{EventHub, TopologyEvent};
use crate::format::checkpoint::{Checkpoint, PartitionCheckpoint};
use crate::format::manifest::{ManifestRecord, PartitionRecord, PartitionState, TopicRecord};
use crate::recovery::partition::{
    open_chain, recover_chain, repair_chain, ChainParams, OpenedChain, Problem, RecoverMode,
};
use crate::recovery::{FileAction, RecoveryReport};
use crate::storage::durability::{
    dir_target, CheckpointFiles, GroupCommit, SyncBackend, Syncer, BATCH_OPEN_MAX,
};
use crate::storage::fault::{IoHook, IoOp, NoFaults};
use crate::storage::file::{open_optional, Access};
use crate::storage::lock::DirLock;
use crate::storage::sync_dir;
use crate::topic::{even_ranges, partition_dir, Node, Topic, TopicInner, TopicState};
use crate::topology::manifest::Manifest;

/// Name of the lock file.
pub const LOCK_FILE: &str = "fissionlog.lock";
/// Folder holding one folder per topic.
pub const TOPICS_DIR: &str = "topics";

/// An open log directory. Dropping it closes it cleanly.
#[derive(Debug)]
pub struct Log {
    core: Arc<Core>,
    report: RecoveryReport,
    /// Shared with every topic, partition and read batch handed out: the
    /// directory stays locked while any of them lives.
    _lock: Arc<DirLock>,
    background: Option<std::thread::JoinHandle<()>>,
    abandoned: bool,
}

pub(crate) fn topic_dir(dir: &Path, id: u32) -> PathBuf {
    dir.join(TOPICS_DIR).join(format!("t{id}"))
}

/// Checks that `dir` is usable: creates it (when allowed) or recognises a log.
/// Returns whether a manifest exists.
fn prepare_dir(dir: &Path, create: bool, hook: &dyn IoHook) -> Result<bool> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(Error::NotALog {
                path: dir.to_path_buf(),
            })
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !create {
                return Err(Error::NotFound {
                    path: dir.to_path_buf(),
                });
            }
            std::fs::create_dir_all(dir).at(dir)?;
            // A relative name's parent is "" (the working directory): its
            // entry for the new directory is made durable as well.
            if let Some(parent) = dir.parent() {
                let parent = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
                sync_dir(hook, IoOp::SyncNewDir, parent)?;
            }
        }
        Err(e) => return Err(Error::io(dir, e)),
    }
    if Manifest::exists(dir) {
        return Ok(true);
    }
    let foreign = std::fs::read_dir(dir)
        .at(dir)?
        .filter_map(|e| e.ok())
        .any(|e| e.file_name() != LOCK_FILE);
    if foreign || !create {
        return Err(Error::NotALog {
            path: dir.to_path_buf(),
        });
    }
    Ok(false)
}

/// Creates a new topic's directory, its partitions' directories and their
/// first segments, and makes them durable, before the manifest record that
/// commits the topic names them (C5: a crash before the commit leaves files
/// no record names, which the next open removes as orphans; after it, every
/// file the record names is there).
///
/// The fsyncs are batched rather than two per partition one after another:
/// every segment's data and every partition directory (naming its segment)
/// in rounds of [`BATCH_OPEN_MAX`] partitions (the directories' descriptors
/// are open only for their round), then the topic directory (naming the
/// partition directories), then `topics/` (naming the topic directory).
fn create_topic_files(
    core: &Core,
    tdir: &Path,
    rec: &TopicRecord,
    now: i64,
) -> Result<Vec<Arc<crate::storage::segment::Segment>>> {
    std::fs::create_dir_all(tdir).at(tdir)?;
    let mut segments = Vec::with_capacity(rec.partitions.len());
    for batch in rec.partitions.chunks(BATCH_OPEN_MAX) {
        let mut targets = Vec::with_capacity(2 * batch.len());
        let mut synced = Vec::with_capacity(batch.len());
        for p in batch {
            let pdir = partition_dir(tdir, p.id);
            std::fs::create_dir_all(&pdir).at(&pdir)?;
            let seg = Arc::new(crate::storage::segment::Segment::create(
                &pdir,
                (rec.id, p.id),
                0,
                rec.config.segment_bytes,
                now,
                &*core.hook,
            )?);
            let (target, pos) = seg.new_data_target()?;
            targets.push(target);
            targets.push(dir_target(&pdir, IoOp::SyncNewDir)?);
            synced.push((seg, pos));
        }
        core.syncer.sync_batch(&targets)?;
        for (seg, pos) in synced {
            seg.set_synced_pos(pos);
            segments.push(seg);
        }
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
fn flush_indexes(core: &Core, parts: &[Arc<crate::partition::Partition>]) -> Result<()> {
    let changed: Vec<_> = parts.iter().filter_map(|p| p.index_to_flush()).collect();
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

impl Log {
    /// Opens (or creates) the log in `dir`, recovering from any crash.
    pub fn open(dir: impl AsRef<Path>, options: LogOptions) -> Result<Log> {
        Log::open_with_hook(dir, options, Arc::new(NoFaults))
    }

    /// [`Log::open`] with a fault-injection hook on the rare I/O paths.
    pub fn open_with_hook(
        dir: impl AsRef<Path>,
        options: LogOptions,
        hook: Arc<dyn IoHook>,
    ) -> Result<Log> {
        let started = Instant::now();
        let dir = dir.as_ref().to_path_buf();
        let exists = prepare_dir(&dir, options.create, &*hook)?;
        let lock = DirLock::acquire(&dir, LOCK_FILE)?;
        let mut report = RecoveryReport::default();
        let (manifest, state) = if exists {
            let (m, s, r) = Manifest::open(&dir, options.recovery, false, hook.clone())?;
            report.manifest = r;
            (m, s)
        } else {
            std::fs::create_dir_all(dir.join(TOPICS_DIR)).at(&dir)?;
            sync_dir(&*hook, IoOp::SyncNewDir, &dir)?;
            (Manifest::create(&dir, hook.clone())?, Default::default())
        };
        let (ck_files, checkpoint, bad) = CheckpointFiles::open(&dir)?;
        if !exists {
            sync_dir(&*hook, IoOp::SyncNewDir, &dir)?;
        }
        for (file, reason) in bad {
            report.add(file, FileAction::InvalidCheckpoint { reason });
        }
        report.checkpoint_found = checkpoint.is_some();
        // Every log writes a checkpoint at its first open, before any topic
        // exists: none while the manifest knows partitions means both files
        // were damaged or removed.
        let checkpoint_lost =
            checkpoint.is_none() && state.topics.iter().any(|t| !t.partitions.is_empty());
        let checkpoint = checkpoint.unwrap_or_default();
        report.clean_shutdown = checkpoint.clean;
        let syncer = Syncer::new(options.use_io_uring, hook.clone());
        let core = Arc::new(Core {
            dir: dir.clone(),
            hook,
            clock: options.clock.clone(),
            topic_hash_seed: options.topic_hash_seed,
            syncer,
            group: GroupCommit::default(),
            checkpoint: Mutex::new(ck_files),
            checkpoint_interval: options.checkpoint_interval,
            checkpoint_wanted: AtomicBool::new(false),
            checkpoint_for_retention: AtomicBool::new(false),
            checkpoint_written: Mutex::new(None),
            topology: Mutex::new(Topology {
                manifest,
                state: state.clone(),
            }),
            topics: RwLock::new(BTreeMap::new()),
            deleted_topics: Mutex::default(),
            closed: AtomicBool::new(false),
            sync_failure: Mutex::new(None),
            failed_partitions: Mutex::new(BTreeMap::new()),
            manifest_failure: Mutex::new(None),
            manifest_failed: AtomicBool::new(false),
            dirty: Arc::default(),
            ck_cache: Mutex::default(),
            compact_every: options.manifest_compact_records.max(1),
            events: EventHub::default(),
        });
        let mode = RecoverMode {
            write: true,
            full_scan: options.full_scan,
            recovery: options.recovery,
        };
        let reclaim_cps = crate::tail::reclaimed_checkpoints(&dir, &state.topics, &checkpoint);
        let cps: HashMap<(u32, u32), &PartitionCheckpoint> = checkpoint
            .partitions
            .iter()
            .map(|p| {
                let key = (p.topic_id, p.partition_id);
                (key, reclaim_cps.get(&key).unwrap_or(p))
            })
            .collect();
        let recovered = (|| -> Result<()> {
            // Phase one opens and maps every segment of every partition and
            // changes nothing: a failing OS call (too many open files, no
            // memory for a mapping, permissions) fails the open here, before
            // any file is repaired.
            let mut opened = HashMap::new();
            for rec in &state.topics {
                for p in &rec.partitions {
                    let pdir = partition_dir(&topic_dir(&dir, rec.id), p.id);
                    let params = chain_params(
                        &pdir,
                        rec,
                        p.id,
                        &cps,
                        &checkpoint,
                        checkpoint_lost,
                        mode,
                        &*core.hook,
                    );
                    opened.insert((rec.id, p.id), open_chain(&params)?);
                }
            }
            // Phase two repairs what the mode allows.
            for rec in &state.topics {
                let topic = load_topic(
                    &core,
                    &lock,
                    rec,
                    &cps,
                    (&checkpoint, checkpoint_lost),
                    mode,
                    &mut opened,
                    &mut report,
                )?;
                core.topics.write().insert(rec.name.clone(), topic);
            }
            let manifest_cut = report.manifest.corruption_truncated.is_some();
            remove_orphans(&dir, &state.topics, manifest_cut, &*core.hook, &mut report)?;
            // Make what recovery kept durable and clear the clean-shutdown
            // mark before anything new is appended: both checkpoint files
            // then describe the recovered state.
            if !checkpoint.clean {
                // A process killed after a roll leaves the new segment's
                // name in the page cache but not known durable: recovery
                // fsyncs a directory only where it removed or created
                // files, so the open's rounds fsync every partition's, before
                // a checkpoint or a durable end names a segment in it.
                for p in core.all_partitions() {
                    p.mark_names_recovered();
                }
            }
            core.request_checkpoint();
            core.sync_round(false)?;
            core.request_checkpoint();
            core.sync_round(false)?;
            let topics: Vec<Topic> = core.topics.read().values().cloned().collect();
            report.group_positions_lost = crate::group::check_group_positions(&topics)?;
            Ok(())
        })();
        if let Err(e) = recovered {
            // Topics hold the core: break the cycle, or a refused open
            // leaks every mapping and file it opened.
            core.topics.write().clear();
            return Err(e);
        }
        report.duration = started.elapsed();
        let background = spawn_background(
            Arc::downgrade(&core),
            options.balancer,
            options.background_retention,
        );
        Ok(Log {
            core,
            report,
            _lock: lock,
            background: Some(background),
            abandoned: false,
        })
    }

    /// What recovery found and did.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Which mechanism syncs files (chosen at open).
    pub fn sync_backend(&self) -> SyncBackend {
        self.core.syncer.backend()
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
        let hash_key = match self.core.topic_hash_seed {
            Some(seed) => [
                crate::topic::key_hash([seed, 0], name.as_bytes()),
                crate::topic::key_hash([seed, 1], name.as_bytes()),
            ],
            None => {
                let mut key = [0u8; 16];
                getrandom::fill(&mut key)
                    .map_err(|e| Error::io(&tdir, std::io::Error::other(e.to_string())))?;
                [
                    u64::from_le_bytes(key[..8].try_into().expect("8 bytes")),
                    u64::from_le_bytes(key[8..].try_into().expect("8 bytes")),
                ]
            }
        };
        let now = crate::partition::now_ms();
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
        let rec = TopicRecord {
            id,
            name: name.to_string(),
            config,
            hash_key,
            next_partition_id: partitions.len() as u32,
            partitions,
            groups: Vec::new(),
            removed: Vec::new(),
            tail_moves: Vec::new(),
            hot_keys: Vec::new(),
        };
        // Files first; the manifest record commits the topic.
        let build = || -> Result<Topic> {
            let segments = create_topic_files(&self.core, &tdir, &rec, now)?;
            let topic = new_topic(&self.core, &self._lock, &rec);
            let mut st = TopicState::default();
            for (p, seg) in rec.partitions.iter().zip(segments) {
                let part =
                    topic.make_partition(p.id, vec![seg], (p.start, p.end), false, (0, 64, 0));
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
        };
        let topic = match build().and_then(|t| {
            self.core
                .commit(&mut topo, ManifestRecord::CreateTopic(rec.clone()))
                .map(|()| t)
        }) {
            Ok(t) => t,
            Err(e) => {
                // A failed commit may be on disk: keep what it references.
                if !matches!(e, Error::LogPoisoned { .. }) {
                    let _ = std::fs::remove_dir_all(&tdir);
                }
                return Err(e);
            }
        };
        drop(topo);
        self.core
            .topics
            .write()
            .insert(name.to_string(), topic.clone());
        self.core.events.emit(TopologyEvent::TopicCreated {
            topic: name.to_string(),
        });
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
        self.core
            .topics
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownTopic(name.to_string()))
    }

    /// Names of all topics.
    pub fn topics(&self) -> Vec<String> {
        self.core.topics.read().keys().cloned().collect()
    }

    /// Deletes a topic and its files. Readers holding its data keep reading
    /// it safely (the mappings stay valid until dropped).
    pub fn delete_topic(&self, name: &str) -> Result<()> {
        self.core.check_open()?;
        let topic = self.topic(name)?;
        // No split, merge, tail split, hot-key change or removal of the
        // topic's partitions runs meanwhile, and none starts afterwards
        // (`deleted`): each writes files into the directory removed below.
        let _change = topic.inner.change.lock();
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
        topic.inner.deleted.store(true, Ordering::Release);
        {
            // By identity: a topic of the same name created since the
            // commit (the name was free from then on) stays.
            let mut topics = self.core.topics.write();
            if topics
                .get(name)
                .is_some_and(|t| Arc::ptr_eq(&t.inner, &topic.inner))
            {
                topics.remove(name);
            }
        }
        {
            let mut deleted = self.core.deleted_topics.lock();
            deleted.retain(|w| w.strong_count() > 0);
            deleted.push(Arc::downgrade(&topic.inner));
        }
        // A `Durable` future waiting on the topic fails now, not never.
        topic.inner.wake.notify_all();
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
        enforce_retention(&self.core)
    }

    /// Runs one balancer pass over every topic now (the background thread
    /// does this at each topic's `check_interval`).
    pub fn balance_now(&self) -> Result<Vec<crate::balance::Decision>> {
        let topics: Vec<Topic> = self.core.topics.read().values().cloned().collect();
        let mut out = Vec::new();
        for t in topics {
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
    /// (the page cache keeps what was written). For crash tests.
    #[doc(hidden)]
    pub fn abandon(mut self) {
        self.abandoned = true;
        let _ = self.shutdown(false);
    }

    fn shutdown(&mut self, clean: bool) -> Result<()> {
        if self.core.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Some(h) = self.background.take() {
            // Wake it from its nap so closing does not wait for it.
            h.thread().unpark();
            let _ = h.join();
        }
        let result = if clean {
            let parts = self.core.all_partitions();
            flush_indexes(&self.core, &parts)
                .and_then(|()| self.core.group.sync(|| self.core.sync_round(true)))
                .and_then(|()| self.core.partition_failure())
        } else {
            Ok(())
        };
        let topics = std::mem::take(&mut *self.core.topics.write());
        for t in topics.values() {
            t.release_partitions();
        }
        // Handles of topics deleted meanwhile hold the directory lock too.
        let deleted = std::mem::take(&mut *self.core.deleted_topics.lock());
        for inner in deleted.iter().filter_map(std::sync::Weak::upgrade) {
            Topic { inner }.release_partitions();
        }
        result
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        if !self.abandoned {
            let _ = self.shutdown(true);
        }
    }
}

fn new_topic(core: &Arc<Core>, lock: &Arc<DirLock>, rec: &TopicRecord) -> Topic {
    Topic {
        inner: Arc::new(TopicInner {
            core: core.clone(),
            lock: Mutex::new(Some(lock.clone())),
            id: rec.id,
            name: Arc::from(rec.name.as_str()),
            config: RwLock::new(rec.config.clone()),
            hash_key: rec.hash_key,
            state: RwLock::new(TopicState::default()),
            generation: AtomicU64::new(0),
            lineage: Mutex::new(None),
            wake: Arc::default(),
            change: Mutex::new(()),
            deleted: std::sync::atomic::AtomicBool::new(false),
            round_robin: AtomicU64::new(0),
            sync_always: rec.config.sync == SyncPolicy::Always,
            dir: topic_dir(&core.dir, rec.id),
            groups: Default::default(),
            hot: crate::hot_keys::HotKeys::from_records(&rec.hot_keys),
        }),
    }
}

/// Creates a partition directory recovery needs (its files were all
/// lost with it), making its name durable.
fn create_partition_dir(pdir: &Path, tdir: &Path, hook: &dyn IoHook) -> Result<()> {
    if pdir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(pdir).at(pdir)?;
    sync_dir(hook, IoOp::SyncRecoveryDir, tdir)
}

#[allow(clippy::too_many_arguments)]
fn chain_params<'a>(
    pdir: &'a Path,
    rec: &TopicRecord,
    partition: u32,
    cps: &HashMap<(u32, u32), &'a PartitionCheckpoint>,
    checkpoint: &Checkpoint,
    checkpoint_lost: bool,
    mode: RecoverMode,
    hook: &'a dyn IoHook,
) -> ChainParams<'a> {
    let sealed = rec
        .partitions
        .iter()
        .find(|p| p.id == partition)
        .and_then(|p| match p.state {
            PartitionState::Sealed { end_offset } => {
                Some(crate::tail::recovery_seal(rec, partition, end_offset))
            }
            PartitionState::Active => None,
        });
    ChainParams {
        dir: pdir,
        ids: (rec.id, partition),
        index_interval: u64::from(rec.config.index_interval_bytes),
        segment_bytes: rec.config.segment_bytes,
        checkpoint: cps.get(&(rec.id, partition)).copied(),
        clean: checkpoint.clean,
        sealed,
        checkpoint_lost,
        mode,
        hook,
    }
}

#[allow(
    clippy::too_many_arguments,
    reason = "one call site, recovery's inputs"
)]
fn load_topic(
    core: &Arc<Core>,
    lock: &Arc<DirLock>,
    rec: &TopicRecord,
    cps: &HashMap<(u32, u32), &PartitionCheckpoint>,
    (checkpoint, checkpoint_lost): (&Checkpoint, bool),
    mode: RecoverMode,
    opened: &mut HashMap<(u32, u32), OpenedChain>,
    report: &mut RecoveryReport,
) -> Result<Topic> {
    let topic = new_topic(core, lock, rec);
    let tdir = topic_dir(&core.dir, rec.id);
    let mut st = TopicState::default();
    let now = core.clock.now_nanos();
    // Saved rates decay by the time since they were saved (nothing was
    // appended meanwhile). A version 1 checkpoint has no save time: its
    // rates come back as saved, and the balancer still never splits on
    // them alone (an empty load map is no reason to cut anywhere).
    let downtime = match checkpoint.saved_at_ms {
        0 => std::time::Duration::ZERO,
        saved => std::time::Duration::from_millis(core.clock.wall_millis().saturating_sub(saved)),
    };
    for p in &rec.partitions {
        let pdir = partition_dir(&tdir, p.id);
        let params = chain_params(
            &pdir,
            rec,
            p.id,
            cps,
            checkpoint,
            checkpoint_lost,
            mode,
            &*core.hook,
        );
        let files = match opened.remove(&(rec.id, p.id)) {
            Some(files) => files,
            None => open_chain(&params)?,
        };
        let mut chain = repair_chain(&params, files, report)?;
        if rec
            .tail_moves
            .iter()
            .any(|m| m.parent == p.id && m.reclaimed)
        {
            forget_reclaim_cuts(report, &pdir);
        }
        for &(s, e) in &chain.holes {
            report.holes.push((rec.name.clone(), p.id, s, e));
        }
        let sealed = matches!(p.state, PartitionState::Sealed { .. });
        crate::storage::segment::prepare_recovered_chain(
            &mut chain.segments,
            sealed,
            rec.config.segment_bytes,
            &core.hook,
        )?;
        let mut segs = crate::recovery::partition::into_arcs(chain.segments);
        let needs_segment = segs.last().is_none_or(|s| s.is_sealed()) && !sealed;
        if needs_segment {
            // Never below an offset already handed out (a lost range reads
            // as a hole, or out of range below the retention floor).
            let base = segs.last().map_or(chain.next_offset, |s| s.end_offset());
            create_partition_dir(&pdir, &tdir, &*core.hook)?;
            let path = pdir.join(crate::storage::segment::segment_file_name(base));
            if path.exists() {
                std::fs::remove_file(&path).at(&path)?;
            }
            let seg = crate::storage::segment::Segment::create(
                &pdir,
                (rec.id, p.id),
                base,
                rec.config.segment_bytes,
                crate::partition::now_ms(),
                &*core.hook,
            )?;
            sync_dir(&*core.hook, IoOp::SyncRecoveryDir, &pdir)?;
            report.add(&path, FileAction::CreatedSegment);
            segs.push(Arc::new(seg));
        }
        if segs.is_empty() {
            // A sealed partition whose files are all gone keeps an empty
            // placeholder so its lineage stays readable. It starts where
            // the recovered chain ends (the retention floor when retention
            // emptied it), never at a seal above that: a segment above the
            // floor with nothing durable below it is what the next open
            // takes for a missing first segment (C7).
            create_partition_dir(&pdir, &tdir, &*core.hook)?;
            let base = chain.next_offset;
            let seg = crate::storage::segment::Segment::create(
                &pdir,
                (rec.id, p.id),
                base,
                4096,
                crate::partition::now_ms(),
                &*core.hook,
            )?;
            // The open's sync rounds sync its bytes (it is new) and then
            // name it in the checkpoint: its name must be durable first,
            // or a power loss reads as a missing segment.
            sync_dir(&*core.hook, IoOp::SyncRecoveryDir, &pdir)?;
            segs.push(Arc::new(seg));
        }
        let retired_below = cps.get(&(rec.id, p.id)).map_or(0, |c| c.start_offset);
        let part = topic.make_partition(p.id, segs, (p.start, p.end), sealed, chain.durable);
        part.set_retired_below(retired_below);
        if let Some(c) = cps.get(&(rec.id, p.id)) {
            let snap = crate::balance::RateSnapshot {
                windows: c
                    .rates
                    .iter()
                    .map(|w| crate::balance::WindowRateSnapshot {
                        window_millis: u64::from(w.window_ms),
                        bytes_per_sec: w.bytes_per_sec,
                        records_per_sec: w.records_per_sec,
                    })
                    .collect(),
            };
            if !snap.windows.is_empty() {
                let snap = snap.decayed(downtime);
                part.with_writer(|w| w.rates = crate::balance::RateTracker::restore(&snap, now));
            }
        }
        // A split or merge syncs the parent up to its seal before the
        // record that commits it, so the recovered end reaches the seal.
        // Logs written before that rule may end below it (a power loss cut
        // the parent's unsynced tail): readers and key chains use the
        // recovered end.
        let mut rec_now = p.clone();
        if let PartitionState::Sealed { end_offset } = p.state {
            rec_now.state = PartitionState::Sealed {
                end_offset: end_offset.min(part.end_offset()),
            };
        }
        st.routes.extend((!sealed).then_some((p.start, p.id)));
        st.nodes.insert(
            p.id,
            Node {
                rec: rec_now,
                children: vec![],
                part,
                last_change_nanos: now,
                hot_key_reported: false,
            },
        );
    }
    let links: Vec<(u32, u32)> = rec
        .partitions
        .iter()
        .flat_map(|c| c.parents.iter().map(move |&par| (par, c.id)))
        .collect();
    for (par, child) in links {
        if let Some(n) = st.nodes.get_mut(&par) {
            n.children.push(child);
        }
    }
    st.removed = rec.removed.clone();
    // Tail-split parents end, for readers, where their moved range starts.
    st.tails = crate::tail::load_tails(&tdir, &rec.tail_moves, Some((mode.recovery, report)))?;
    for (id, t) in &st.tails {
        if let Some(n) = st.nodes.get_mut(id) {
            n.part.set_logical_end(t.index.from);
            if let PartitionState::Sealed { end_offset } = n.rec.state {
                n.rec.state = PartitionState::Sealed {
                    end_offset: end_offset.min(t.index.from),
                };
            }
        }
    }
    // A reclaim a crash interrupted is finished before any reader exists.
    let unfinished: Vec<(Arc<crate::partition::Partition>, u64)> = st
        .tails
        .iter()
        .filter(|(_, t)| t.reclaimed.load(Ordering::Acquire))
        .filter_map(|(id, t)| Some((st.nodes.get(id)?.part.clone(), t.index.from)))
        .collect();
    *topic.inner.write_state() = st;
    if mode.write {
        for (part, from) in unfinished {
            part.reclaim_past(from)?;
        }
    }
    Ok(topic)
}

/// A reclaimed tail-split parent whose reclaim a power loss interrupted
/// can hold part of its released range: zeros past some batch of the
/// moved range, intact bytes elsewhere. Recovery cuts it there as a torn
/// tail, which for this partition is the reclaim's own cut (all of its
/// data was synced before the split), not a loss of unsynced writes: not
/// reported. A cut below the logical end is still reported, as missing
/// data.
fn forget_reclaim_cuts(report: &mut RecoveryReport, pdir: &Path) {
    report.files.retain(|f| {
        !(f.file.starts_with(pdir) && matches!(f.action, FileAction::TruncatedTornTail { .. }))
    });
}

/// Removes directories of topics and partitions the manifest does not know
/// (uncommitted creations, splits and merges; deleted topics). When damaged
/// manifest records were cut (`keep`), a directory may belong to a change
/// that did commit and hold synced data: it is renamed, not deleted.
fn remove_orphans(
    dir: &Path,
    topics: &[TopicRecord],
    keep: bool,
    hook: &dyn IoHook,
    report: &mut RecoveryReport,
) -> Result<()> {
    let tdir = dir.join(TOPICS_DIR);
    let Ok(rd) = std::fs::read_dir(&tdir) else {
        return Ok(());
    };
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let id = name.strip_prefix('t').and_then(|s| s.parse::<u32>().ok());
        match id.and_then(|id| topics.iter().find(|t| t.id == id)) {
            Some(t) => {
                let Ok(prd) = std::fs::read_dir(e.path()) else {
                    continue;
                };
                for pe in prd.filter_map(|e| e.ok()) {
                    let pname = pe.file_name().to_string_lossy().into_owned();
                    let pid = pname.strip_prefix('p').and_then(|s| s.parse::<u32>().ok());
                    match pid {
                        Some(pid) if t.partitions.iter().any(|p| p.id == pid) => {}
                        Some(_) if pe.path().is_dir() => {
                            discard_orphan(&pe.path(), keep, hook, report)?;
                        }
                        None if crate::format::tail_index::is_file_name(&pname) => {
                            // A descendant index no tail entry names: of a
                            // tail split that did not commit, or whose
                            // parent left the removed list.
                            let named = t.tail_moves.iter().any(|m| {
                                m.index_in_topic_dir
                                    && crate::format::tail_index::file_name(m.parent) == pname
                            });
                            if !named && !keep {
                                std::fs::remove_file(pe.path()).at(&pe.path())?;
                                report.add(pe.path(), FileAction::RemovedOrphan);
                            }
                        }
                        _ => report.add(pe.path(), FileAction::ForeignFile),
                    }
                }
            }
            None if id.is_some() && e.path().is_dir() => {
                discard_orphan(&e.path(), keep, hook, report)?;
            }
            None => report.add(e.path(), FileAction::ForeignFile),
        }
    }
    Ok(())
}

/// Deletes an orphan directory, or with `keep` renames it to
/// `<name>.orphaned[.N]` (which no later open takes for a topic or
/// partition) and syncs its parent.
fn discard_orphan(
    path: &Path,
    keep: bool,
    hook: &dyn IoHook,
    report: &mut RecoveryReport,
) -> Result<()> {
    if !keep {
        std::fs::remove_dir_all(path).at(path)?;
        report.add(path, FileAction::RemovedOrphan);
        return Ok(());
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut to = path.with_file_name(format!("{name}.orphaned"));
    let mut n = 1;
    while to.exists() {
        to = path.with_file_name(format!("{name}.orphaned.{n}"));
        n += 1;
    }
    std::fs::rename(path, &to).at(path)?;
    if let Some(parent) = path.parent() {
        sync_dir(hook, IoOp::SyncRecoveryDir, parent)?;
    }
    report.add(path, FileAction::SetAsideOrphan { moved_to: to });
    Ok(())
}

/// Retires expired segments, then removes the sealed partitions that
/// hold nothing any more (`Topic::remove_emptied`). Returns the number of
/// segments deleted.
fn enforce_retention(core: &Core) -> Result<usize> {
    let topics: Vec<Topic> = core.topics.read().values().cloned().collect();
    // Tail-split parents give back their moved ranges (every topic: this
    // is not retention's policy, nothing readable goes). A failure is
    // returned after retention ran, which does not depend on it.
    let reclaimed = topics.iter().try_for_each(|t| t.reclaim_tails().map(drop));
    let deleted = retire_segments(core)?;
    for t in topics {
        let cfg = t.config();
        if cfg.retention_age.is_some() || cfg.retention_bytes.is_some() {
            t.remove_emptied()?;
        }
    }
    reclaimed?;
    Ok(deleted)
}

fn retire_segments(core: &Core) -> Result<usize> {
    let topics: Vec<Topic> = core.topics.read().values().cloned().collect();
    let now = crate::partition::now_ms();
    let mut parts = Vec::new();
    let mut waits = false;
    for t in topics {
        let cfg = t.config();
        if cfg.retention_age.is_none() && cfg.retention_bytes.is_none() {
            continue;
        }
        for p in t.all_partition_handles() {
            let plan = p.plan_retention(cfg.retention_age, cfg.retention_bytes, now);
            waits |= plan.waits_for_checkpoint;
            if plan.floor_moved {
                parts.push(p);
            }
        }
    }
    // Segments held only because a recent checkpoint names them: have
    // every round write the checkpoint until they are released, rather
    // than wait for the checkpoint interval.
    core.checkpoint_for_retention
        .store(waits, Ordering::Release);
    if parts.is_empty() {
        return Ok(0);
    }
    // The new floors reach the checkpoint (durably) before any file goes.
    core.request_checkpoint();
    core.sync()?;
    let mut n = 0;
    for p in parts {
        n += p.delete_retired()?.len();
    }
    Ok(n)
}

fn spawn_background(
    core: Weak<Core>,
    balancer: bool,
    retention: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("fissionlog-bg".into())
        .spawn(move || {
            let mut last_sync = Instant::now();
            let mut last_retention = Instant::now();
            let mut last_balance: HashMap<u32, Instant> = HashMap::new();
            loop {
                // Parked rather than asleep: shutdown unparks it at once.
                std::thread::park_timeout(Duration::from_millis(20));
                let Some(core) = core.upgrade() else { return };
                if core.closed.load(Ordering::Acquire) {
                    return;
                }
                let topics: Vec<Topic> = core.topics.read().values().cloned().collect();
                let interval = topics
                    .iter()
                    .filter_map(|t| match t.config().sync {
                        SyncPolicy::Interval(d) => Some(d),
                        _ => None,
                    })
                    .min();
                if interval.is_some_and(|d| last_sync.elapsed() >= d) {
                    let _ = core.sync();
                    last_sync = Instant::now();
                }
                if retention && last_retention.elapsed() >= Duration::from_secs(1) {
                    let _ = enforce_retention(&core);
                    last_retention = Instant::now();
                }
                if balancer {
                    for t in &topics {
                        let cfg = t.config().balance;
                        let due = last_balance
                            .get(&t.id())
                            .is_none_or(|l| l.elapsed() >= cfg.check_interval);
                        if cfg.enabled && due {
                            let _ = t.balance_step();
                            last_balance.insert(t.id(), Instant::now());
                        }
                    }
                }
            }
        })
        .expect("spawning the background thread")
}

/// Checks a log directory without changing a byte: every header, batch CRC,
/// offset continuity, index and manifest record. Takes a shared lock on the
/// existing lock file and refuses while a writer holds it.
pub fn verify(dir: impl AsRef<Path>) -> Result<(RecoveryReport, Vec<Problem>)> {
    let dir = dir.as_ref();
    if !dir.is_dir() {
        return Err(Error::NotFound {
            path: dir.to_path_buf(),
        });
    }
    if !Manifest::exists(dir) {
        return Err(Error::NotALog {
            path: dir.to_path_buf(),
        });
    }
    let lock_path = dir.join(LOCK_FILE);
    let mut report = RecoveryReport::default();
    let mut problems = Vec::new();
    let _lock = match open_optional(&lock_path, Access::Read) {
        Ok(Some(f)) => match f.try_lock_shared() {
            Ok(()) => Some(f),
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Locked {
                    path: dir.to_path_buf(),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&lock_path, e)),
        },
        // No writer can hold the log either: `Log::open` refuses the lock
        // file too. The check goes on without the lock.
        Err(e @ Error::NotARegularFile { .. }) => {
            problems.extend(odd_file_problem(e));
            None
        }
        Ok(None) | Err(_) => None,
    };
    let (_, state, mreport) = match Manifest::open(
        dir,
        crate::config::RecoveryMode::Strict,
        true,
        Arc::new(NoFaults),
    ) {
        Ok(x) => x,
        Err(Error::Corruption {
            file,
            position,
            reason,
        }) => {
            problems.push(Problem {
                file,
                position,
                what: reason,
                repair: "recover --mode truncate drops the damaged manifest records".into(),
            });
            return Ok((report, problems));
        }
        Err(e @ Error::NotARegularFile { .. }) => {
            problems.extend(odd_file_problem(e));
            return Ok((report, problems));
        }
        Err(e) => return Err(e),
    };
    if let Some((pos, reason)) = &mreport.torn_tail {
        problems.push(Problem {
            file: dir.join(crate::topology::manifest::JOURNAL_FILE),
            position: *pos,
            what: format!("torn journal tail: {reason}"),
            repair: "open cuts the torn tail".into(),
        });
    }
    report.manifest = mreport;
    let (ck, bad) = read_checkpoint(dir, &mut problems)?;
    let checkpoint_lost = ck.seq == 0 && state.topics.iter().any(|t| !t.partitions.is_empty());
    for (file, reason) in bad {
        problems.push(Problem {
            file,
            position: 0,
            what: reason,
            repair: "the other checkpoint file is used; the next sync rewrites it".into(),
        });
    }
    let reclaim_cps = crate::tail::reclaimed_checkpoints(dir, &state.topics, &ck);
    let cps: HashMap<(u32, u32), &PartitionCheckpoint> = ck
        .partitions
        .iter()
        .map(|p| {
            let key = (p.topic_id, p.partition_id);
            (key, reclaim_cps.get(&key).unwrap_or(p))
        })
        .collect();
    let mode = RecoverMode {
        write: false,
        full_scan: true,
        recovery: crate::config::RecoveryMode::Strict,
    };
    for t in &state.topics {
        // Every committed tail split's descendant index: the open refuses
        // the log without it, and once the parent's moved range is
        // reclaimed nothing else says which child holds which offset.
        for m in &t.tail_moves {
            if let Err(e) =
                crate::tail::load_tails(&topic_dir(dir, t.id), std::slice::from_ref(m), None)
            {
                let file = match &e {
                    Error::Corruption { file, .. } => file.clone(),
                    Error::Io { path, .. } | Error::NotARegularFile { path, .. } => path.clone(),
                    _ => topic_dir(dir, t.id),
                };
                problems.push(Problem {
                    file,
                    position: 0,
                    what: format!(
                        "descendant index of tail-split partition {} is unusable: {e}",
                        m.parent
                    ),
                    repair: "restore the file; recover --mode truncate|salvage opens the log without it: positions inside the moved range then resume at the children's first moved records (records may be delivered again)".into(),
                });
            }
        }
        for p in &t.partitions {
            let pdir = partition_dir(&topic_dir(dir, t.id), p.id);
            let params = ChainParams {
                dir: &pdir,
                ids: (t.id, p.id),
                index_interval: u64::from(t.config.index_interval_bytes),
                segment_bytes: t.config.segment_bytes,
                checkpoint: cps.get(&(t.id, p.id)).copied(),
                clean: ck.clean,
                sealed: match p.state {
                    PartitionState::Sealed { end_offset } => {
                        Some(crate::tail::recovery_seal(t, p.id, end_offset))
                    }
                    PartitionState::Active => None,
                },
                checkpoint_lost,
                mode,
                hook: &NoFaults,
            };
            let reclaimed = t.tail_moves.iter().any(|m| m.parent == p.id && m.reclaimed);
            let chain = match recover_chain(&params, &mut report) {
                Ok(chain) => chain,
                Err(e @ Error::NotARegularFile { .. }) => {
                    problems.extend(odd_file_problem(e));
                    continue;
                }
                Err(e) => return Err(e),
            };
            if reclaimed {
                forget_reclaim_cuts(&mut report, &pdir);
            }
            problems.extend(chain.problems);
            if let Some(last) = chain.segments.last() {
                if let PartitionState::Sealed { end_offset } = p.state {
                    // Ending below the seal is a cut unsynced tail (allowed);
                    // data past the seal would break per-key order.
                    if last.end_offset() > end_offset && !reclaimed {
                        problems.push(Problem {
                            file: pdir.clone(),
                            position: 0,
                            what: format!("partition {} was sealed at offset {end_offset} but holds data up to {}", p.id, last.end_offset()),
                            repair: "recover truncates or salvages per mode".into(),
                        });
                    }
                }
            }
            for seg in &chain.segments {
                check_index(seg, &mut problems);
            }
        }
    }
    for f in &report.files {
        if let FileAction::TruncatedTornTail {
            position, reason, ..
        } = &f.action
        {
            problems.push(Problem {
                file: f.file.clone(),
                position: *position,
                what: format!("torn tail (unsynced writes): {reason}"),
                repair: "open cuts the torn tail".into(),
            });
        }
    }
    Ok((report, problems))
}

/// A name that does not hold a regular file, as a problem `verify` lists
/// (`None` for any other error).
fn odd_file_problem(e: Error) -> Option<Problem> {
    let Error::NotARegularFile { path, found } = e else {
        return None;
    };
    Some(Problem {
        what: format!("{} is a {found}, not a regular file", path.display()),
        file: path,
        position: 0,
        repair: "none: every open refuses the log until the file is put back (or what stands in its place is removed, if the file is lost)".into(),
    })
}

fn check_index(seg: &crate::storage::segment::Segment, problems: &mut Vec<Problem>) {
    let buf = match seg.read_index_file() {
        Ok(Some(buf)) => buf,
        Err(e @ Error::NotARegularFile { .. }) => {
            problems.extend(odd_file_problem(e));
            return;
        }
        // Longer than any index of the segment.
        Err(Error::Corruption { .. }) => Vec::new(),
        Ok(None) | Err(_) => return,
    };
    let (_, whole) = crate::format::index::decode_index(
        &buf,
        seg.base_offset,
        seg.committed_pos(),
        seg.end_offset(),
    );
    if !whole {
        problems.push(Problem {
            file: seg.index_path().to_path_buf(),
            position: 0,
            what: "index does not match its segment".into(),
            repair: "the index is rebuilt from the segment on first use".into(),
        });
    }
}

/// The newest valid checkpoint and the invalid files; a checkpoint name
/// that is not a regular file is a problem, and the other file is used.
fn read_checkpoint(
    dir: &Path,
    problems: &mut Vec<Problem>,
) -> Result<(Checkpoint, Vec<(PathBuf, String)>)> {
    let mut best: Option<Checkpoint> = None;
    let mut bad = Vec::new();
    for name in crate::storage::durability::CHECKPOINT_FILES {
        let path = dir.join(name);
        let read = crate::storage::file::read_optional(
            &path,
            crate::storage::durability::CHECKPOINT_FILE_MAX_BYTES,
        );
        let read = match read {
            Err(e @ Error::NotARegularFile { .. }) => {
                problems.extend(odd_file_problem(e));
                continue;
            }
            read => read?,
        };
        if let Some(buf) = read {
            if buf.is_empty() {
                continue;
            }
            if let Some(found) = crate::format::checkpoint::newer_version(&buf) {
                return Err(Error::UnsupportedVersion {
                    file: path,
                    found,
                    supported: crate::format::checkpoint::CHECKPOINT_VERSION,
                });
            }
            match crate::format::checkpoint::decode_checkpoint(&buf) {
                Ok(c) if best.as_ref().is_none_or(|b| c.seq > b.seq) => best = Some(c),
                Ok(_) => {}
                Err(e) => bad.push((path, e)),
            }
        }
    }
    Ok((best.unwrap_or_default(), bad))
}
