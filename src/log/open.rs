//! Opening a log is recovery: the manifest, the checkpoint, every
//! partition's chain of segments (opened and mapped first, repaired only
//! once all opened), orphans left by uncommitted changes, then two sync
//! rounds that make what recovery kept durable.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::{new_topic, Log, TopicMap};
use crate::config::LogOptions;
use crate::core::{Core, Topology};
use crate::error::{Error, IoContext, Result};
use crate::events::EventHub;
use crate::format::checkpoint::{Checkpoint, PartitionCheckpoint};
use crate::format::manifest::{ManifestState, PartitionRecord, PartitionState, TopicRecord};
use crate::format::segment::SEGMENT_HEADER_LEN;
use crate::layout::{topic_dir, LOCK_FILE, TOPICS_DIR};
use crate::partition::Partition;
use crate::recovery::partition::{
    open_chain, repair_chain, ChainParams, OpenedChain, PartitionIds, RecoverMode, RecoveredChain,
};
use crate::recovery::{FileAction, RecoveryReport};
use crate::storage::durability::{
    dir_target, CheckpointFiles, GroupCommit, Syncer, BATCH_OPEN_MAX,
};
use crate::storage::fault::{IoHook, IoOp};
use crate::storage::lock::DirLock;
use crate::storage::position::DurablePoint;
use crate::storage::segment::Segment;
use crate::storage::sync_dir;
use crate::topic::{partition_dir, Node, Topic, TopicState};
use crate::topology::manifest::Manifest;

/// Opens (or creates) the log in `dir`: [`Log::open`] and
/// [`Log::open_with_hook`].
pub(super) fn open(dir: &Path, options: LogOptions, hook: Arc<dyn IoHook>) -> Result<Log> {
    let started = Instant::now();
    let dir = dir.to_path_buf();
    let exists = prepare_dir(&dir, options.create, &*hook)?;
    let lock = DirLock::acquire(&dir, LOCK_FILE)?;
    let mut report = RecoveryReport::default();
    let meta = read_metadata(&dir, exists, &options, &hook, &mut report)?;
    let core = new_core(
        &dir,
        &options,
        hook,
        meta.manifest,
        meta.state.clone(),
        meta.ck_files,
    );
    let mode = RecoverMode {
        write: true,
        full_scan: options.full_scan,
        recovery: options.recovery,
    };
    let topics = Arc::new(TopicMap::default());
    let recovered = recover(
        &core,
        &topics,
        &lock,
        &meta.state,
        (&meta.checkpoint, meta.checkpoint_lost),
        mode,
        &mut report,
    );
    report.duration = started.elapsed();
    let background = recovered.and_then(|()| {
        super::background::spawn(
            Arc::downgrade(&core),
            Arc::downgrade(&topics),
            options.balancer,
            options.background_retention,
        )
    });
    // A refused open drops the topics it recovered, with every mapping
    // and file they opened.
    Ok(Log {
        core,
        topics,
        report,
        _lock: lock,
        background: Some(background?),
        abandoned: false,
    })
}

/// What the log directory holds besides the partitions' files.
struct Metadata {
    manifest: Manifest,
    state: ManifestState,
    ck_files: CheckpointFiles,
    /// The newest valid checkpoint (an empty one when none is).
    checkpoint: Checkpoint,
    /// No checkpoint, while the manifest knows partitions.
    checkpoint_lost: bool,
}

/// Opens (or creates) the manifest and the checkpoint files.
fn read_metadata(
    dir: &Path,
    exists: bool,
    options: &LogOptions,
    hook: &Arc<dyn IoHook>,
    report: &mut RecoveryReport,
) -> Result<Metadata> {
    let (manifest, state) = if exists {
        let (m, s, r) = Manifest::open(dir, options.recovery, false, hook.clone())?;
        report.manifest = r;
        (m, s)
    } else {
        std::fs::create_dir_all(dir.join(TOPICS_DIR)).at(dir)?;
        sync_dir(&**hook, IoOp::SyncNewDir, dir)?;
        (Manifest::create(dir, hook.clone())?, Default::default())
    };
    let (ck_files, checkpoint, bad) = CheckpointFiles::open(dir)?;
    if !exists {
        sync_dir(&**hook, IoOp::SyncNewDir, dir)?;
    }
    for (file, reason) in bad {
        report.add(file, FileAction::InvalidCheckpoint { reason });
    }
    report.checkpoint_found = checkpoint.is_some();
    // Every log writes a checkpoint at its first open, before any topic
    // exists: none while the manifest knows partitions means both files
    // were damaged or removed.
    let checkpoint_lost = checkpoint.is_none()
        && state
            .topics
            .iter()
            .any(|t: &TopicRecord| !t.partitions.is_empty());
    let checkpoint = checkpoint.unwrap_or_default();
    report.clean_shutdown = checkpoint.clean;
    Ok(Metadata {
        manifest,
        state,
        ck_files,
        checkpoint,
        checkpoint_lost,
    })
}

fn new_core(
    dir: &Path,
    options: &LogOptions,
    hook: Arc<dyn IoHook>,
    manifest: Manifest,
    state: ManifestState,
    ck_files: CheckpointFiles,
) -> Arc<Core> {
    let syncer = Syncer::new(options.use_io_uring, hook.clone());
    Arc::new(Core {
        dir: dir.to_path_buf(),
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
        topology: Mutex::new(Topology { manifest, state }),
        sync_failure_wakes: Mutex::default(),
        closed: AtomicBool::new(false),
        sync_failure: Mutex::new(None),
        failed_partitions: Mutex::new(std::collections::BTreeMap::new()),
        manifest_failure: Mutex::new(None),
        manifest_failed: AtomicBool::new(false),
        dirty: Arc::default(),
        budget: Arc::new(crate::storage::budget::Budget::new(
            crate::storage::budget::BudgetLimits {
                max_mapped_segments: options.max_mapped_segments,
                max_open_files: options.max_open_files,
            },
        )),
        ck_cache: Mutex::default(),
        compact_every: options.manifest_compact_records.max(1),
        events: EventHub::default(),
    })
}

/// Each partition's checkpoint entry, by (topic id, partition id): the
/// checkpoint's own, or for a reclaimed tail-split parent the entry its
/// reclaim left (`reclaimed`, from `tail::reclaimed_checkpoints`).
pub(super) fn checkpoint_entries<'a>(
    checkpoint: &'a Checkpoint,
    reclaimed: &'a HashMap<(u32, u32), PartitionCheckpoint>,
) -> HashMap<(u32, u32), &'a PartitionCheckpoint> {
    checkpoint
        .partitions
        .iter()
        .map(|p| {
            let key = (p.topic_id, p.partition_id);
            (key, reclaimed.get(&key).unwrap_or(p))
        })
        .collect()
}

/// Recovers every topic into `topics`, removes orphans and makes the
/// result durable with two sync rounds.
fn recover(
    core: &Arc<Core>,
    topics: &TopicMap,
    lock: &Arc<DirLock>,
    state: &ManifestState,
    (checkpoint, checkpoint_lost): (&Checkpoint, bool),
    mode: RecoverMode,
    report: &mut RecoveryReport,
) -> Result<()> {
    let dir = &core.dir;
    let reclaimed = crate::topic::tail_split::reclaimed_checkpoints(dir, &state.topics, checkpoint);
    let cps = checkpoint_entries(checkpoint, &reclaimed);
    // Phase one opens and maps every segment of every partition and
    // changes nothing: a failing OS call (too many open files, no memory
    // for a mapping, permissions) fails the open here, before any file is
    // repaired.
    let mut opened = HashMap::new();
    // `topics` and each topic's directory may not be symlinks (see
    // `storage::file::refuse_symlinked_dir`): checked once here, not
    // once per partition.
    // `topics` is checked even without a topic: the next topic created
    // would otherwise go through the link, outside this log's lock.
    crate::storage::file::refuse_symlinked_dir(&dir.join(crate::layout::TOPICS_DIR))
        .map_err(crate::recovery::partition::open_failed)?;
    for rec in &state.topics {
        crate::storage::file::refuse_symlinked_dir(&topic_dir(dir, rec.id))
            .map_err(crate::recovery::partition::open_failed)?;
        for p in &rec.partitions {
            let pdir = partition_dir(&topic_dir(dir, rec.id), p.id);
            let params = chain_params(
                &pdir,
                rec,
                p,
                &cps,
                checkpoint,
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
            core,
            lock,
            rec,
            &cps,
            (checkpoint, checkpoint_lost),
            mode,
            &mut opened,
            report,
        )?;
        topics.insert(topic);
    }
    let manifest_cut = report.manifest.corruption_truncated.is_some();
    remove_orphans(dir, &state.topics, manifest_cut, &*core.hook, report)?;
    // Make what recovery kept durable and clear the clean-shutdown mark
    // before anything new is appended: both checkpoint files then describe
    // the recovered state.
    // A process killed after a roll leaves the new segment's name in the
    // page cache but not known durable: recovery fsyncs a directory only
    // where it removed or created files, so after an unclean shutdown the
    // open fsyncs the directory of every partition whose names may not be
    // durable, before a checkpoint or a durable end names a segment in it.
    // A checkpoint names a segment only once its name is durable (and with
    // it every older one): a partition whose chain ends at or below the
    // segment its entry names has nothing to make durable, and costs no
    // fsync. An entry that calls nothing durable (a new topic's partition
    // no sync round had reached) says no name is, even after a clean close.
    let dirs: Vec<std::path::PathBuf> = topics
        .partitions()
        .iter()
        .filter(|p| {
            !p.is_unwritten_start()
                && names_may_not_be_durable(p, &cps, checkpoint_lost)
                && (!checkpoint.clean || nothing_durable(p, &cps))
        })
        .map(|p| p.dir().to_path_buf())
        .collect();
    sync_recovered_dirs(core, &dirs)?;
    core.request_checkpoint();
    core.sync_round()?;
    core.request_checkpoint();
    core.sync_round()?;
    report.group_positions_lost = crate::group::check_group_positions(&topics.all())?;
    Ok(())
}

/// Fsyncs `dirs` in batches of [`BATCH_OPEN_MAX`], each directory's
/// descriptor open only for its batch: an open after a crash of N
/// partitions that all rolled needs no more descriptors than a clean one
/// (one per active segment), where fsyncing them in the open's sync rounds
/// held one more per partition at once.
fn sync_recovered_dirs(core: &Core, dirs: &[std::path::PathBuf]) -> Result<()> {
    for batch in dirs.chunks(BATCH_OPEN_MAX) {
        let targets = batch
            .iter()
            .map(|d| dir_target(d, IoOp::SyncRecoveryDir))
            .collect::<Result<Vec<_>>>()?;
        core.syncer.sync_batch(&targets)?;
    }
    Ok(())
}

/// Whether the names of `p`'s segments may not all be durable after an
/// unclean shutdown: its chain ends in a segment newer than the one its
/// checkpoint entry names (rolled to after that checkpoint), its entry
/// calls nothing durable (see [`nothing_durable`]), or no entry names it.
fn names_may_not_be_durable(
    p: &Partition,
    cps: &HashMap<(u32, u32), &PartitionCheckpoint>,
    checkpoint_lost: bool,
) -> bool {
    let last = p.segments().last().map(|s| s.base_offset);
    match cps.get(&(p.p.topic_id, p.id())) {
        Some(c) if !checkpoint_lost => {
            calls_nothing_durable(c) || last.is_some_and(|base| base > c.segment_base)
        }
        _ => true,
    }
}

/// Whether `p`'s checkpoint entry calls nothing of it durable, not even
/// its first segment's header: a new topic's partition that no sync round
/// had reached when the checkpoint was written.
fn nothing_durable(p: &Partition, cps: &HashMap<(u32, u32), &PartitionCheckpoint>) -> bool {
    cps.get(&(p.p.topic_id, p.id()))
        .is_some_and(|c| calls_nothing_durable(c))
}

/// A position below the header says nothing of a segment's bytes (see
/// `ChainParams::checkpoint_in_data`).
fn calls_nothing_durable(c: &PartitionCheckpoint) -> bool {
    c.position < SEGMENT_HEADER_LEN as u64
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
    p: &PartitionRecord,
    cps: &HashMap<(u32, u32), &'a PartitionCheckpoint>,
    checkpoint: &Checkpoint,
    checkpoint_lost: bool,
    mode: RecoverMode,
    hook: &'a dyn IoHook,
) -> ChainParams<'a> {
    let partition = p.id;
    // The record is passed in, not looked up by id: a lookup per partition
    // made an open of N partitions O(N²).
    let sealed = match p.state {
        PartitionState::Sealed { end_offset } => Some(crate::topic::tail_split::recovery_seal(
            rec, partition, end_offset,
        )),
        PartitionState::Active => None,
    };
    ChainParams {
        dir: pdir,
        ids: PartitionIds {
            topic: rec.id,
            partition,
        },
        index_interval: u64::from(rec.config.index_interval_bytes),
        segment_bytes: rec.config.segment_bytes,
        checkpoint: cps.get(&(rec.id, partition)).copied(),
        clean: checkpoint.clean,
        sealed,
        checkpoint_lost,
        initial: p.parents.is_empty(),
        mode,
        // `recover` checks them once per topic before any chain opens.
        parents_checked: true,
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
    let downtime = downtime(core, checkpoint);
    for p in &rec.partitions {
        let pdir = partition_dir(&tdir, p.id);
        let params = chain_params(
            &pdir,
            rec,
            p,
            cps,
            checkpoint,
            checkpoint_lost,
            mode,
            &*core.hook,
        );
        let (segs, chain) = recover_segments(core, rec, p, &params, opened, report)?;
        let sealed = matches!(p.state, PartitionState::Sealed { .. });
        let retired_below = cps.get(&(rec.id, p.id)).map_or(0, |c| c.start_offset);
        let unwritten = params.first_segment_may_be_unsynced()
            && retired_below == 0
            && segs.len() == 1
            && segs[0].base_offset == 0
            && segs[0].end_offset() == 0
            && chain.durable == DurablePoint::NOTHING;
        let part = topic.make_partition(p.id, segs, (p.start, p.end), sealed, chain.durable.into());
        if unwritten {
            // Still nothing appended and nothing durable: the partition
            // stays as a new topic's, costing no fsync until its first
            // records (the open does not fsync its directory either).
            part.first_segment_unnamed();
        }
        part.set_retired_below(retired_below);
        if let Some(c) = cps.get(&(rec.id, p.id)) {
            restore_rates(&part, c, downtime, now);
        }
        st.routes.extend((!sealed).then_some((p.start, p.id)));
        st.nodes.insert(p.id, recovered_node(p, part, now));
    }
    let unfinished = link_topic_state(&mut st, rec, &tdir, mode, report)?;
    *topic.inner.write_state() = st;
    if mode.write {
        for (part, from) in unfinished {
            part.reclaim_past(from)?;
        }
    }
    Ok(topic)
}

/// How long the log was closed, by the checkpoint's save time: saved rates
/// decay by it (nothing was appended meanwhile). A version 1 checkpoint has
/// no save time: its rates come back as saved, and the balancer still never
/// splits on them alone (an empty load map is no reason to cut anywhere).
fn downtime(core: &Core, checkpoint: &Checkpoint) -> std::time::Duration {
    match checkpoint.saved_at_ms {
        0 => std::time::Duration::ZERO,
        saved => std::time::Duration::from_millis(core.clock.wall_millis().saturating_sub(saved)),
    }
}

/// The topology node of recovered partition `p`.
fn recovered_node(p: &PartitionRecord, part: Arc<Partition>, now: u64) -> Node {
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
    Node {
        rec: rec_now,
        children: vec![],
        part,
        last_change_nanos: now,
        hot_key_reported: false,
    }
}

/// One partition's segments after repair, with the segment that takes its
/// next appends (or a placeholder for a sealed partition left with none),
/// and what else recovery learnt of its chain.
fn recover_segments(
    core: &Arc<Core>,
    rec: &TopicRecord,
    p: &PartitionRecord,
    params: &ChainParams<'_>,
    opened: &mut HashMap<(u32, u32), OpenedChain>,
    report: &mut RecoveryReport,
) -> Result<(Vec<Arc<Segment>>, RecoveredChain)> {
    let pdir = params.dir;
    let files = match opened.remove(&(rec.id, p.id)) {
        Some(files) => files,
        None => open_chain(params)?,
    };
    let mut chain = repair_chain(params, files, report)?;
    if rec
        .tail_moves
        .iter()
        .any(|m| m.parent == p.id && m.reclaimed)
    {
        forget_reclaim_cuts(report, pdir);
    }
    for h in &chain.holes {
        report.holes.push(crate::recovery::Hole {
            topic: rec.name.clone(),
            partition: p.id,
            offsets: h.clone().into(),
        });
    }
    let sealed = matches!(p.state, PartitionState::Sealed { .. });
    crate::storage::segment::prepare_recovered_chain(
        &mut chain.segments,
        sealed,
        rec.config.segment_bytes,
        &core.hook,
    )?;
    let mut segs = crate::recovery::partition::into_arcs(std::mem::take(&mut chain.segments));
    add_missing_segment(core, rec, p, pdir, &mut segs, chain.next_offset, report)?;
    Ok((segs, chain))
}

/// Creates the segment a recovered chain lacks: the one that takes the
/// next appends of an active partition whose last segment is sealed (or
/// that has none), or an empty placeholder for a sealed partition left
/// with no segment. `next_offset` is where the recovered chain ends.
fn add_missing_segment(
    core: &Core,
    rec: &TopicRecord,
    p: &PartitionRecord,
    pdir: &Path,
    segs: &mut Vec<Arc<Segment>>,
    next_offset: u64,
    report: &mut RecoveryReport,
) -> Result<()> {
    let sealed = matches!(p.state, PartitionState::Sealed { .. });
    let tdir = topic_dir(&core.dir, rec.id);
    let needs_segment = segs.last().is_none_or(|s| s.is_sealed()) && !sealed;
    if needs_segment {
        // Never below an offset already handed out (a lost range reads
        // as a hole, or out of range below the retention floor).
        let base = segs.last().map_or(next_offset, |s| s.end_offset());
        create_partition_dir(pdir, &tdir, &*core.hook)?;
        let path = pdir.join(crate::storage::segment::segment_file_name(base));
        if path.exists() {
            std::fs::remove_file(&path).at(&path)?;
        }
        let seg = Segment::create_version(
            pdir,
            (rec.id, p.id),
            base,
            rec.config.segment_bytes,
            (
                crate::partition::now_ms(),
                crate::partition::segment_version(rec.config.replicated),
            ),
            &*core.hook,
        )?;
        sync_dir(&*core.hook, IoOp::SyncRecoveryDir, pdir)?;
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
        create_partition_dir(pdir, &tdir, &*core.hook)?;
        let base = next_offset;
        let seg = Segment::create_version(
            pdir,
            (rec.id, p.id),
            base,
            4096,
            (
                crate::partition::now_ms(),
                crate::partition::segment_version(rec.config.replicated),
            ),
            &*core.hook,
        )?;
        // The open's sync rounds sync its bytes (it is new) and then
        // name it in the checkpoint: its name must be durable first,
        // or a power loss reads as a missing segment.
        sync_dir(&*core.hook, IoOp::SyncRecoveryDir, pdir)?;
        segs.push(Arc::new(seg));
    }
    Ok(())
}

/// Gives a recovered partition the rates its checkpoint entry saved,
/// decayed over the time the log was closed.
fn restore_rates(
    part: &Partition,
    c: &PartitionCheckpoint,
    downtime: std::time::Duration,
    now_nanos: u64,
) {
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
        part.with_writer(|w| w.rates = crate::balance::RateTracker::restore(&snap, now_nanos));
    }
}

/// Links the recovered partitions to their children, restores the removed
/// list and the tail splits. Returns the reclaims a crash interrupted,
/// which the open finishes before any reader exists.
fn link_topic_state(
    st: &mut TopicState,
    rec: &TopicRecord,
    tdir: &Path,
    mode: RecoverMode,
    report: &mut RecoveryReport,
) -> Result<Vec<(Arc<Partition>, u64)>> {
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
    st.tails =
        crate::topic::tail_split::load_tails(tdir, &rec.tail_moves, Some((mode.recovery, report)))?;
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
    Ok(st
        .tails
        .iter()
        .filter(|(_, t)| t.reclaimed.load(Ordering::Acquire))
        .filter_map(|(id, t)| Some((st.nodes.get(id)?.part.clone(), t.index.from)))
        .collect())
}

/// A reclaimed tail-split parent whose reclaim a power loss interrupted
/// can hold part of its released range: zeros past some batch of the
/// moved range, intact bytes elsewhere. Recovery cuts it there as a torn
/// tail, which for this partition is the reclaim's own cut (all of its
/// data was synced before the split), not a loss of unsynced writes: not
/// reported. A cut below the logical end is still reported, as missing
/// data.
pub(super) fn forget_reclaim_cuts(report: &mut RecoveryReport, pdir: &Path) {
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
                let known: std::collections::HashSet<u32> =
                    t.partitions.iter().map(|p| p.id).collect();
                for pe in prd.filter_map(|e| e.ok()) {
                    let pname = pe.file_name().to_string_lossy().into_owned();
                    let pid = pname.strip_prefix('p').and_then(|s| s.parse::<u32>().ok());
                    match pid {
                        Some(pid) if known.contains(&pid) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(topic_id: u32, partition_id: u32, end_offset: u64) -> PartitionCheckpoint {
        PartitionCheckpoint {
            topic_id,
            partition_id,
            segment_base: 0,
            position: 0,
            end_offset,
            start_offset: 0,
            rates: Vec::new(),
        }
    }

    #[test]
    fn a_reclaimed_parents_entry_replaces_the_checkpoints_own_and_the_others_stay() {
        let checkpoint = Checkpoint {
            partitions: vec![entry(1, 0, 10), entry(1, 1, 20)],
            ..Checkpoint::default()
        };
        let reclaimed = HashMap::from([((1, 1), entry(1, 1, 5))]);
        let cps = checkpoint_entries(&checkpoint, &reclaimed);
        assert_eq!(cps.len(), 2);
        assert_eq!(cps[&(1, 0)].end_offset, 10);
        assert_eq!(cps[&(1, 1)].end_offset, 5);
    }
}
