//! State a log shares with its topics and partitions: directory,
//! manifest, options, the clock, sync rounds and checkpoints.
//!
//! It sits below `topic`: it names no topic, and the topic map lives in
//! `log/`. What a sync round needs from the topics above comes in as
//! plain values: the partitions a clean round checkpoints (from the
//! caller), and the wake-ups a failed round fires (each topic registers
//! its own, [`Core::watch_sync_failures`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::balance::Clock;
use crate::error::{Error, Result};
use crate::events::EventHub;
use crate::format::checkpoint::PartitionCheckpoint;
use crate::format::manifest::{ManifestRecord, ManifestState};
use crate::partition::{DirtyList, Partition, SyncCapture};
use crate::storage::durability::{
    CheckpointFiles, GroupCommit, SyncTarget, Syncer, BATCH_OPEN_MAX,
};
use crate::storage::fault::IoHook;
use crate::topology::manifest::Manifest;
use crate::topology::model;
use crate::wake::TailWake;

/// The manifest and the state it describes, changed together.
#[derive(Debug)]
pub(crate) struct Topology {
    pub(crate) manifest: Manifest,
    pub(crate) state: ManifestState,
}

/// Shared core.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) dir: PathBuf,
    pub(crate) hook: Arc<dyn IoHook>,
    pub(crate) clock: Arc<dyn Clock>,
    /// `LogOptions::topic_hash_seed`.
    pub(crate) topic_hash_seed: Option<u64>,
    pub(crate) syncer: Syncer,
    pub(crate) group: GroupCommit,
    pub(crate) checkpoint: Mutex<CheckpointFiles>,
    /// A sync round writes the checkpoint when this much time has passed
    /// since the last one (`LogOptions::checkpoint_interval`)...
    pub(crate) checkpoint_interval: Duration,
    /// ... or when this is set (open, retention): see [`Core::request_checkpoint`].
    pub(crate) checkpoint_wanted: AtomicBool,
    /// ... or while retention waits for the checkpoints to move past
    /// segments it would retire (every round writes one meanwhile).
    pub(crate) checkpoint_for_retention: AtomicBool,
    /// When the last checkpoint was written (none yet: the next round writes one).
    pub(crate) checkpoint_written: Mutex<Option<Instant>>,
    pub(crate) topology: Mutex<Topology>,
    /// The wake-ups of every topic's waiters, registered by each topic
    /// made ([`Core::watch_sync_failures`]): a sync round that fails for
    /// good wakes them all, so a `Durable` future waiting on any partition
    /// fails now, not never.
    pub(crate) sync_failure_wakes: Mutex<Vec<Weak<TailWake>>>,
    pub(crate) closed: AtomicBool,
    pub(crate) sync_failure: Mutex<Option<String>>,
    /// Partitions whose fsync failed, by (topic id, partition id): topic
    /// name and reason. They stay out of sync rounds until reopen (after
    /// EIO the kernel may have dropped their dirty pages, and a retried
    /// fdatasync would return 0 without writing them), and every log-wide
    /// sync reports them.
    pub(crate) failed_partitions: Mutex<BTreeMap<(u32, u32), (String, String)>>,
    /// Set by the first manifest I/O failure: the log no longer knows
    /// whether its last topology change is on disk, or whether its journal
    /// handle is the file a replay reads. Every later topology change,
    /// append and sync is refused until reopen.
    pub(crate) manifest_failure: Mutex<Option<String>>,
    /// Whether `manifest_failure` is set: `check_open` runs on every
    /// append, and loads this instead of taking the lock.
    pub(crate) manifest_failed: AtomicBool,
    /// Partitions with something for the next sync round to do.
    pub(crate) dirty: Arc<DirtyList>,
    /// The bounded budget of mappings and descriptors of segments that
    /// take no more appends (`LogOptions::max_mapped_segments`,
    /// `max_open_files`).
    pub(crate) budget: Arc<crate::storage::budget::Budget>,
    /// The checkpoint's entries between rounds.
    pub(crate) ck_cache: Mutex<CheckpointCache>,
    pub(crate) compact_every: u32,
    pub(crate) events: EventHub,
}

impl Core {
    /// Refuses reads on a closed log. A log poisoned by a manifest failure
    /// still serves what it holds.
    pub(crate) fn check_not_closed(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Refuses writes and topology changes on a closed log, or one poisoned
    /// by a manifest failure.
    pub(crate) fn check_open(&self) -> Result<()> {
        self.check_not_closed()?;
        // Acquire, paired with `poison_manifest`'s Release store made after
        // the reason: a set flag finds the reason under the lock.
        if self.manifest_failed.load(Ordering::Acquire) {
            if let Some(reason) = &*self.manifest_failure.lock() {
                return Err(Error::LogPoisoned {
                    reason: reason.clone(),
                });
            }
        }
        Ok(())
    }

    /// Poisons the log after a manifest I/O failure (the first reason stays).
    pub(crate) fn poison_manifest(&self, e: &Error) {
        self.manifest_failure
            .lock()
            .get_or_insert_with(|| e.to_string());
        self.manifest_failed.store(true, Ordering::Release);
    }

    /// Poisons a partition whose fsync failed and keeps it out of every
    /// later sync round; log-wide syncs report it until reopen.
    pub(crate) fn poison_partition(&self, p: &Partition, reason: String) {
        p.poison(reason.clone());
        let mut failed = self.failed_partitions.lock();
        // Checked under the lock `forget_failed_topic` takes, after
        // `Partition::mark_deleted` set the flag: a delete that ran since
        // the caller's own check either sees this entry and forgets it, or
        // its flag is seen here.
        if p.is_removed() {
            return;
        }
        failed
            .entry((p.p.topic_id, p.p.id))
            .or_insert_with(|| (p.p.topic.to_string(), reason));
    }

    /// Registers a partition that poisoned itself (its fsync failed while
    /// a split or merge sealed it), so log-wide syncs report it.
    pub(crate) fn note_poisoned(&self, p: &Partition) {
        if p.is_removed() {
            // Out of the topology (its topic deleted, or emptied and
            // removed): what it held is gone by intent, and a failure on
            // its removed directory says nothing about live data.
            return;
        }
        if let Err(Error::Poisoned { reason, .. }) = p.check_not_poisoned() {
            self.poison_partition(p, reason);
        }
    }

    /// Forgets the failures of a deleted topic's partitions: what they
    /// held is gone by intent, so log-wide syncs stop reporting them.
    pub(crate) fn forget_failed_topic(&self, topic_id: u32) {
        self.failed_partitions
            .lock()
            .retain(|&(t, _), _| t != topic_id);
    }

    /// The error a log-wide sync reports while a partition is poisoned.
    pub(crate) fn partition_failure(&self) -> Result<()> {
        match self.failed_partitions.lock().iter().next() {
            Some((&(_, partition), (topic, reason))) => Err(Error::Poisoned {
                topic: topic.clone(),
                partition,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Registers a topic's wake-up, to be fired when a sync round fails
    /// for good (see `sync_failure_wakes`). Wake-ups of dropped topics are
    /// pruned here.
    pub(crate) fn watch_sync_failures(&self, wake: &Arc<TailWake>) {
        let mut wakes = self.sync_failure_wakes.lock();
        wakes.retain(|w| w.strong_count() > 0);
        wakes.push(Arc::downgrade(wake));
    }

    /// Commits a topology change: durable journal record, then the state.
    ///
    /// Any manifest I/O error poisons the log. A failed commit returns
    /// `Err` with an unknown outcome: the record may be on disk (a failed
    /// fdatasync may still have written it), so the caller must not delete
    /// anything a replay of it could reference; reopening decides. A
    /// compaction failure after a durable commit returns `Ok` (the change
    /// is committed: the journal holds it) but poisons the log, since the
    /// journal handle may no longer be the file a replay reads.
    pub(crate) fn commit(&self, topo: &mut Topology, rec: ManifestRecord) -> Result<()> {
        self.check_open()?;
        if rec.min_version() > topo.manifest.version() {
            // A journal of an older format gets records of the newer one
            // only once a compaction rewrote it (and the snapshot) with
            // the newer header: a build reading only the older format then
            // refuses the files instead of taking the new records for
            // damage. It snapshots the state before this change (the
            // snapshot's sequence number is the last committed record's),
            // so it runs before the change is applied; a compaction for a
            // record then refused changes nothing a replay sees.
            if let Err(e) = topo.manifest.compact(&topo.state) {
                self.poison_manifest(&e);
                return Err(Error::LogPoisoned {
                    reason: e.to_string(),
                });
            }
        }
        // Checked in full before it changes anything (`model::apply`): a
        // refused record leaves the state as it was, and no copy of a
        // topology that grows with every change is made per commit.
        model::apply(&mut topo.state, &rec).map_err(Error::Refused)?;
        if let Err(e) = topo.manifest.commit(&rec) {
            // The state holds the change, whose record may or may not be
            // on disk: the poisoned log commits and compacts nothing more,
            // so nothing writes that state; the reopen decides.
            self.poison_manifest(&e);
            return Err(Error::LogPoisoned {
                reason: e.to_string(),
            });
        }
        // A large state is compacted by the background thread
        // (`Manifest::begin_compaction`): no change waits for it.
        if topo.manifest.wants_compaction(self.compact_every)
            && topo
                .manifest
                .compacts_inline(self.compact_every, &topo.state)
        {
            if let Err(e) = topo.manifest.compact(&topo.state) {
                self.poison_manifest(&e);
            }
        }
        Ok(())
    }

    /// Group-committed sync of everything appended so far, in every topic.
    /// Fails while any partition is poisoned by a failed fsync: what it
    /// held above its durable position may be lost.
    pub(crate) fn sync(&self) -> Result<()> {
        self.group.sync(|| self.sync_round())?;
        self.partition_failure()
    }

    /// Group-committed sync covering `parts` (what an `Always` append
    /// waits for): fails only if one of them is poisoned.
    pub(crate) fn sync_covering(&self, parts: &[&Partition]) -> Result<()> {
        self.group.sync(|| self.sync_round())?;
        parts.iter().try_for_each(|p| p.check_not_poisoned())
    }

    /// Makes the next sync round write the checkpoint whether or not it is
    /// due. A [`Core::sync`] called after this returns only once a
    /// checkpoint holding every change the caller made before this call
    /// (partitions it marked dirty) is durable: the round that takes the
    /// request takes it before its dirty list, so it captures them. That
    /// is the round the caller waits for, or one that started after this
    /// call and ended before it (a round that fails puts the request back,
    /// and a failed checkpoint sync fails every later round).
    pub(crate) fn request_checkpoint(&self) {
        self.checkpoint_wanted.store(true, Ordering::Release);
    }

    /// Takes a pending [`Core::request_checkpoint`]. A round does this
    /// before it takes the dirty list: whoever requested marked its
    /// partitions dirty first (retention raising a floor), so the round
    /// that takes the request also captures them and writes their new
    /// entries. Taken later, a round already past its dirty list could
    /// serve the request with entries cached before the change, and the
    /// round the requester waits for would find no request left.
    fn take_checkpoint_request(&self) -> bool {
        self.checkpoint_wanted.swap(false, Ordering::AcqRel)
    }

    /// Whether this round writes the checkpoint (`requested`: it took a
    /// pending request).
    fn checkpoint_due(&self, requested: bool) -> bool {
        if requested || self.checkpoint_for_retention.load(Ordering::Acquire) {
            return true;
        }
        self.checkpoint_written
            .lock()
            .is_none_or(|at| at.elapsed() >= self.checkpoint_interval)
    }

    /// One sync round (see `storage::durability`). It writes the checkpoint
    /// only when due (interval or request) and changed; other rounds sync
    /// data files and directories only.
    ///
    /// A round costs O(dirty partitions): it captures only the partitions
    /// that registered themselves dirty (an append, roll, seal or
    /// retention change since their last capture, or a durable position
    /// that moved in the previous round and must reach the checkpoint).
    /// The checkpoint is built from cached entries, refreshed for those
    /// partitions (plus a few others' rates, round-robin), and is not
    /// written at all once both checkpoint files hold the current entries.
    pub(crate) fn sync_round(&self) -> Result<()> {
        self.round(None)
    }

    /// The last sync round of a clean close: after syncing what is dirty
    /// it writes a checkpoint of `every` partition of the log (the caller
    /// holds the topic map) with the positions just synced and, unless a
    /// partition is poisoned, the clean flag.
    pub(crate) fn clean_sync_round(&self, every: &[Arc<Partition>]) -> Result<()> {
        self.round(Some(every))
    }

    /// [`Core::sync_round`], or with `every` [`Core::clean_sync_round`].
    ///
    /// The round syncs its partitions in chunks of about
    /// [`BATCH_OPEN_MAX`] files and directories, each chunk's descriptors
    /// open only while it syncs (one submission each), the checkpoint in
    /// the first: a round over 10,000 dirty partitions whose segments'
    /// descriptors the budget closed opens them again 256 at a time, not
    /// all at once. A partition's outcome is recorded once its chunk
    /// synced. When a later chunk cannot open its files (a shortage), the
    /// chunks before it stand, the rest stay dirty for the next round, and
    /// the round fails with the typed error, nothing poisoned.
    fn round(&self, every: Option<&[Arc<Partition>]>) -> Result<()> {
        self.check_no_sync_failure()?;
        // Before the dirty list: see `take_checkpoint_request`.
        let requested = every.is_none() && self.take_checkpoint_request();
        let parts = self.take_dirty();
        let caps: Vec<SyncCapture> = parts.iter().map(|p| p.capture_unsynced()).collect();
        // Nothing of `parts[from..]` was synced: those captures stay
        // unsynced (and dirty), and a request this round took and did not
        // serve goes to the next one.
        let undo = |from: usize, unserved: bool| {
            for (p, c) in parts.iter().zip(&caps).skip(from) {
                p.sync_done(c, false);
            }
            if requested && unserved {
                self.request_checkpoint();
            }
        };
        let mut chunk = match chunk_targets(&parts, &caps, 0) {
            Ok(t) => t,
            Err(e) => {
                undo(0, true);
                return Err(e);
            }
        };
        let mut ck = self.checkpoint.lock();
        if every.is_none() {
            // On failure `undo` puts a taken request back; an interval
            // checkpoint is due again anyway.
            match self.due_checkpoint(&mut ck, &parts, requested) {
                Ok(Some(t)) => {
                    chunk.0.push(t);
                    chunk.1.push(None);
                }
                Ok(None) => {}
                Err(e) => {
                    undo(0, true);
                    return Err(e);
                }
            }
        }
        let round = std::time::Instant::now();
        let mut synced = 0;
        let mut done = 0;
        loop {
            let (targets, owner, upto) = chunk;
            let results = self.syncer.sync_all(&targets);
            synced += targets.len();
            let (failed, first_err) = self.note_sync_results(&targets, &owner, results, &parts);
            // The chunk's descriptors close here (the budget keeps those
            // it has room for).
            drop(targets);
            for i in done..upto {
                if parts[i].sync_done(&caps[i], !failed[i]) {
                    // The checkpoint lags one round: the next round writes
                    // the position this one made durable.
                    parts[i].mark_dirty();
                }
            }
            done = upto;
            if let Some(e) = first_err {
                drop(ck);
                undo(done, false);
                crate::metrics::sync_round(round.elapsed(), synced);
                // Every later round fails at once: a `Durable` future
                // waiting for one fails now, not never.
                self.wake_sync_failures();
                return Err(e);
            }
            if done == parts.len() {
                break;
            }
            chunk = match chunk_targets(&parts, &caps, done) {
                Ok(t) => t,
                Err(e) => {
                    crate::metrics::sync_round(round.elapsed(), synced);
                    undo(done, false);
                    return Err(e);
                }
            };
        }
        crate::metrics::sync_round(round.elapsed(), synced);
        if let Some(every) = every {
            self.write_clean_checkpoint(&mut ck, every)?;
        }
        Ok(())
    }

    /// Refuses a round once a checkpoint fsync failed: every later round
    /// fails.
    fn check_no_sync_failure(&self) -> Result<()> {
        match &*self.sync_failure.lock() {
            Some(f) => Err(Error::Io {
                path: self.dir.clone(),
                source: std::io::Error::other(format!("an earlier sync failed: {f}")),
            }),
            None => Ok(()),
        }
    }

    /// The partitions a round syncs: the dirty list, without the removed
    /// and the poisoned ones. A poisoned partition is never synced again:
    /// after a failed fsync a retry can succeed without writing what the
    /// failure dropped, and its durable position (in the checkpoint) must
    /// stay below that. A partition that poisoned itself outside a round
    /// (a failed directory fsync at a roll) is registered here.
    fn take_dirty(&self) -> Vec<Arc<Partition>> {
        self.dirty
            .take()
            .into_iter()
            .filter(|p| {
                let poisoned = p.is_poisoned();
                if poisoned && p.take_unreported_poison() {
                    self.note_poisoned(p);
                }
                !poisoned && !p.is_removed()
            })
            .collect()
    }

    /// The checkpoint file a (not clean) round writes and syncs with the
    /// data, if one is due and its entries changed: the round's partitions'
    /// entries are marked for recomputing first.
    fn due_checkpoint(
        &self,
        ck: &mut CheckpointFiles,
        parts: &[Arc<Partition>],
        requested: bool,
    ) -> Result<Option<SyncTarget>> {
        let mut cache = self.ck_cache.lock();
        for p in parts {
            cache.update(p);
        }
        if !self.checkpoint_due(requested) {
            return Ok(None);
        }
        let Some(entries) = cache.entries_to_write() else {
            return Ok(None);
        };
        match ck.write((false, self.clock.wall_millis()), entries, &*self.hook) {
            Ok(t) => {
                *self.checkpoint_written.lock() = Some(Instant::now());
                Ok(Some(t))
            }
            Err(e) => {
                cache.written_failed();
                Err(e)
            }
        }
    }

    /// Takes a round's sync results: a failed partition target poisons its
    /// partition (reported by `sync` / `sync_covering` through the poison,
    /// not as the round's error: the round synced every other partition),
    /// a failed checkpoint fails this round and every later one. Returns
    /// which partitions failed, and the round's error.
    fn note_sync_results(
        &self,
        targets: &[SyncTarget],
        owner: &[Option<usize>],
        results: Vec<std::io::Result<()>>,
        parts: &[Arc<Partition>],
    ) -> (Vec<bool>, Option<Error>) {
        let mut failed = vec![false; parts.len()];
        let mut first_err: Option<Error> = None;
        for ((t, r), o) in targets.iter().zip(results).zip(owner) {
            let Err(e) = r else { continue };
            let msg = format!("sync of {} failed: {e}", t.path.display());
            match o {
                Some(i) if parts[*i].is_removed() => failed[*i] = true,
                Some(i) => {
                    failed[*i] = true;
                    self.poison_partition(&parts[*i], msg);
                }
                None => {
                    *self.sync_failure.lock() = Some(msg);
                    first_err.get_or_insert(Error::io(&t.path, e));
                }
            }
        }
        (failed, first_err)
    }

    /// Wakes every topic's waiters (see `sync_failure_wakes`).
    fn wake_sync_failures(&self) {
        let wakes: Vec<Arc<TailWake>> = self
            .sync_failure_wakes
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for w in wakes {
            w.notify_all();
        }
    }

    /// The checkpoint of a clean close, naming `every` partition, written
    /// and synced. A poisoned partition keeps its old durable position, and
    /// the checkpoint is not marked clean: its file may hold bytes past
    /// that position that recovery must scan, not trust. Every other
    /// partition's durable position is its end now. Once per close:
    /// O(every partition) is fine here.
    fn write_clean_checkpoint(
        &self,
        ck: &mut CheckpointFiles,
        every: &[Arc<Partition>],
    ) -> Result<()> {
        let clean = self.failed_partitions.lock().is_empty();
        let entries = every
            .iter()
            .map(|p| {
                let e = p.checkpoint_entry(None);
                p.note_checkpointed(e.segment_base);
                e
            })
            .collect();
        let t = ck.write((clean, self.clock.wall_millis()), entries, &*self.hook)?;
        if let Some(Err(e)) = self.syncer.sync_all(std::slice::from_ref(&t)).pop() {
            return Err(Error::io(&t.path, e));
        }
        Ok(())
    }
}

/// The files and directories one chunk of a round syncs: those of the
/// partitions from `from` on, at least one, until about
/// [`BATCH_OPEN_MAX`] targets are open; each with the index of the
/// partition it belongs to (`owner`, `None` for the checkpoint the round
/// may add), and the index after the chunk's last partition.
fn chunk_targets(
    parts: &[Arc<Partition>],
    caps: &[SyncCapture],
    from: usize,
) -> Result<(Vec<SyncTarget>, Vec<Option<usize>>, usize)> {
    let mut targets = Vec::new();
    let mut owner = Vec::new();
    let mut i = from;
    while i < caps.len() && (i == from || targets.len() < BATCH_OPEN_MAX) {
        match caps[i].targets(parts[i].dir()) {
            Ok(t) => {
                owner.extend(std::iter::repeat_n(Some(i), t.len()));
                targets.extend(t);
            }
            // Removed since it was taken: its directory may be gone, and
            // nothing in it is needed any more.
            Err(_) if parts[i].is_removed() => {}
            Err(e) => return Err(e),
        }
        i += 1;
    }
    Ok((targets, owner, i))
}

/// How many partitions outside the dirty set get their entry (write rates)
/// refreshed per checkpoint written, round-robin: the rates of idle
/// partitions still decay in the checkpoint, at a bounded cost per round.
const RATE_REFRESH_PER_ROUND: usize = 64;

/// The checkpoint's entries, kept between rounds so that a round only
/// recomputes the dirty partitions' entries.
#[derive(Debug, Default)]
pub(crate) struct CheckpointCache {
    entries: BTreeMap<(u32, u32), (Weak<Partition>, PartitionCheckpoint)>,
    /// Partitions captured since the last checkpoint written: their
    /// entries are recomputed when the next one is written, not in every
    /// round (an entry's rates take the partition's writer lock, which
    /// would make a round wait behind the appends in flight).
    stale: BTreeMap<(u32, u32), Weak<Partition>>,
    /// Where the next round-robin rate refresh starts.
    cursor: (u32, u32),
    /// Checkpoints written (both files alternate) since an entry last
    /// changed; at 2 both files hold the current entries.
    current_writes: u8,
}

impl CheckpointCache {
    /// Marks a partition's entry (its durable position, retention floor
    /// and rates) for recomputing before the next checkpoint is written.
    fn update(&mut self, p: &Arc<Partition>) {
        // Checked under the cache lock, which `remove_partition` takes
        // after the flag is set: a removed partition's entry never comes back.
        if p.is_removed() {
            return;
        }
        self.stale.insert((p.p.topic_id, p.id()), Arc::downgrade(p));
        self.current_writes = 0;
    }

    /// The entries of the next checkpoint, or `None` when both files
    /// already hold them. Recomputes the entries marked by `update`, and
    /// refreshes a few other partitions' rates, first.
    fn entries_to_write(&mut self) -> Option<Vec<PartitionCheckpoint>> {
        if self.current_writes >= 2 {
            return None;
        }
        for (k, w) in std::mem::take(&mut self.stale) {
            match w.upgrade() {
                Some(p) if !p.is_removed() => {
                    let e = p.checkpoint_entry(None);
                    self.entries.insert(k, (w, e));
                }
                // Removed (its entry went with it) or dropped with its topic.
                _ => {}
            }
        }
        let keys: Vec<(u32, u32)> = self
            .entries
            .range(self.cursor..)
            .chain(self.entries.range(..self.cursor))
            .take(RATE_REFRESH_PER_ROUND)
            .map(|(k, _)| *k)
            .collect();
        for k in &keys {
            match self.entries.get(k).and_then(|(w, _)| w.upgrade()) {
                Some(p) if !p.is_removed() => {
                    let e = p.checkpoint_entry(None);
                    self.entries.insert(*k, (Arc::downgrade(&p), e));
                }
                // Its topic was deleted, or it was removed.
                _ => {
                    self.entries.remove(k);
                }
            }
        }
        if let Some(last) = keys.last() {
            self.cursor = (last.0, last.1.saturating_add(1));
        }
        self.current_writes += 1;
        let mut out = Vec::with_capacity(self.entries.len());
        for (w, e) in self.entries.values() {
            // Retention keeps what the two newest checkpoints name.
            if let Some(p) = w.upgrade() {
                p.note_checkpointed(e.segment_base);
            }
            out.push(e.clone());
        }
        Some(out)
    }

    /// A checkpoint write failed: the next round writes again.
    fn written_failed(&mut self) {
        self.current_writes = 0;
    }

    /// Drops the entries of a deleted topic.
    pub(crate) fn remove_topic(&mut self, topic_id: u32) {
        self.entries.retain(|k, _| k.0 != topic_id);
        self.stale.retain(|k, _| k.0 != topic_id);
    }

    /// Drops the entry of a removed partition (marked removed before:
    /// see `update`). The next checkpoint no longer names it.
    pub(crate) fn remove_partition(&mut self, topic_id: u32, partition: u32) {
        self.stale.remove(&(topic_id, partition));
        if self.entries.remove(&(topic_id, partition)).is_some() {
            self.current_writes = 0;
        }
    }
}
