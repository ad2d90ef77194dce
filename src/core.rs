//! State shared by a `Log` and its topics: directory, manifest, syncing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::balance::Clock;
use crate::error::{Error, Result};
use crate::events::EventHub;
use crate::format::manifest::{ManifestRecord, ManifestState};
use crate::partition::{Partition, SyncCapture};
use crate::storage::durability::{CheckpointFiles, GroupCommit, Syncer};
use crate::storage::fault::IoHook;
use crate::topic::Topic;
use crate::topology::manifest::Manifest;
use crate::topology::model;

/// The manifest and the state it describes, changed together.
#[derive(Debug)]
pub(crate) struct Topology {
    pub manifest: Manifest,
    pub state: ManifestState,
}

/// Shared core.
#[derive(Debug)]
pub(crate) struct Core {
    pub dir: PathBuf,
    pub hook: Arc<dyn IoHook>,
    pub clock: Arc<dyn Clock>,
    pub syncer: Syncer,
    pub group: GroupCommit,
    pub checkpoint: Mutex<CheckpointFiles>,
    pub topology: Mutex<Topology>,
    pub topics: RwLock<BTreeMap<String, Topic>>,
    pub closed: AtomicBool,
    pub sync_failure: Mutex<Option<String>>,
    /// Partitions whose fsync failed, by (topic id, partition id): topic
    /// name and reason. They stay out of sync rounds until reopen (after
    /// EIO the kernel may have dropped their dirty pages, and a retried
    /// fdatasync would return 0 without writing them), and every log-wide
    /// sync reports them.
    pub failed_partitions: Mutex<BTreeMap<(u32, u32), (String, String)>>,
    /// Set by the first manifest I/O failure: the log no longer knows
    /// whether its last topology change is on disk, or whether its journal
    /// handle is the file a replay reads. Every later topology change,
    /// append and sync is refused until reopen.
    pub manifest_failure: Mutex<Option<String>>,
    pub compact_every: u32,
    pub events: EventHub,
}

impl Core {
    /// Refuses calls on a closed log, or one poisoned by a manifest failure.
    pub fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(reason) = &*self.manifest_failure.lock() {
            return Err(Error::LogPoisoned {
                reason: reason.clone(),
            });
        }
        Ok(())
    }

    /// Poisons the log after a manifest I/O failure (the first reason stays).
    pub fn poison_manifest(&self, e: &Error) {
        self.manifest_failure
            .lock()
            .get_or_insert_with(|| e.to_string());
    }

    /// Poisons a partition whose fsync failed and keeps it out of every
    /// later sync round; log-wide syncs report it until reopen.
    pub fn poison_partition(&self, p: &Partition, reason: String) {
        p.poison(reason.clone());
        self.failed_partitions
            .lock()
            .entry((p.p.topic_id, p.p.id))
            .or_insert_with(|| (p.p.topic.to_string(), reason));
    }

    /// Registers a partition that poisoned itself (its fsync failed while
    /// a split or merge sealed it), so log-wide syncs report it.
    pub fn note_poisoned(&self, p: &Partition) {
        if let Err(Error::Poisoned { reason, .. }) = p.check_not_poisoned() {
            self.poison_partition(p, reason);
        }
    }

    /// The error a log-wide sync reports while a partition is poisoned.
    pub fn partition_failure(&self) -> Result<()> {
        match self.failed_partitions.lock().iter().next() {
            Some((&(_, partition), (topic, reason))) => Err(Error::Poisoned {
                topic: topic.clone(),
                partition,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Every partition of every topic.
    pub fn all_partitions(&self) -> Vec<Arc<Partition>> {
        self.topics
            .read()
            .values()
            .flat_map(|t| t.all_partition_handles())
            .collect()
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
    pub fn commit(&self, topo: &mut Topology, rec: ManifestRecord) -> Result<()> {
        self.check_open()?;
        let mut next = topo.state.clone();
        model::apply(&mut next, &rec).map_err(Error::Refused)?;
        if let Err(e) = topo.manifest.commit(&rec) {
            self.poison_manifest(&e);
            return Err(Error::LogPoisoned {
                reason: e.to_string(),
            });
        }
        topo.state = next;
        if topo.manifest.wants_compaction(self.compact_every) {
            if let Err(e) = topo.manifest.compact(&topo.state) {
                self.poison_manifest(&e);
            }
        }
        Ok(())
    }

    /// Group-committed sync of everything appended so far, in every topic.
    /// Fails while any partition is poisoned by a failed fsync: what it
    /// held above its durable position may be lost.
    pub fn sync(&self) -> Result<()> {
        self.group.sync(|| self.sync_round(false))?;
        self.partition_failure()
    }

    /// Group-committed sync covering `parts` (what an `Always` append
    /// waits for): fails only if one of them is poisoned.
    pub fn sync_covering(&self, parts: &[&Partition]) -> Result<()> {
        self.group.sync(|| self.sync_round(false))?;
        parts.iter().try_for_each(|p| p.check_not_poisoned())
    }

    /// One sync round (see `storage::durability`). With `clean`, the
    /// checkpoint records the positions just synced and the clean flag.
    pub fn sync_round(&self, clean: bool) -> Result<()> {
        if let Some(f) = &*self.sync_failure.lock() {
            return Err(Error::Io {
                path: self.dir.clone(),
                source: std::io::Error::other(format!("an earlier sync failed: {f}")),
            });
        }
        let all = self.all_partitions();
        // A poisoned partition is never synced again: after a failed fsync
        // a retry can succeed without writing what the failure dropped, and
        // its durable position (in the checkpoint) must stay below that.
        let parts: Vec<Arc<Partition>> = all.iter().filter(|p| !p.is_poisoned()).cloned().collect();
        let caps: Vec<SyncCapture> = parts.iter().map(|p| p.capture_unsynced()).collect();
        let mut targets = Vec::new();
        let mut owner = Vec::new();
        for (i, cap) in caps.iter().enumerate() {
            match cap.targets(parts[i].dir()) {
                Ok(t) => {
                    owner.extend(std::iter::repeat_n(Some(i), t.len()));
                    targets.extend(t);
                }
                Err(e) => {
                    // Nothing was synced: every capture stays unsynced.
                    for (p, c) in parts.iter().zip(&caps) {
                        p.sync_done(c, false);
                    }
                    return Err(e);
                }
            }
        }
        let mut ck = self.checkpoint.lock();
        if !clean {
            let entries = all.iter().map(|p| p.checkpoint_entry(None)).collect();
            targets.push(ck.write(false, entries, &*self.hook)?);
            owner.push(None);
        }
        let results = self.syncer.sync_all(&targets);
        let mut failed = vec![false; parts.len()];
        let mut first_err: Option<Error> = None;
        for ((t, r), o) in targets.iter().zip(results).zip(&owner) {
            if let Err(e) = r {
                let msg = format!("sync of {} failed: {e}", t.path.display());
                match o {
                    // Reported by `sync` / `sync_covering` through the
                    // partition's poison, not as the round's error: the
                    // round synced every other partition.
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
        }
        for (i, cap) in caps.iter().enumerate() {
            parts[i].sync_done(cap, !failed[i]);
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if clean {
            // A poisoned partition keeps its old durable position, and the
            // checkpoint is not marked clean: its file may hold bytes past
            // that position that recovery must scan, not trust.
            let clean = self.failed_partitions.lock().is_empty();
            // `parts` is `all` without the poisoned ones, in the same order.
            let mut next = 0;
            let entries = all
                .iter()
                .map(|p| {
                    let captured = parts.get(next).is_some_and(|q| Arc::ptr_eq(p, q));
                    let pos = captured.then_some(next).filter(|&i| !failed[i]);
                    next += usize::from(captured);
                    p.checkpoint_entry(pos.map(|i| caps[i].pos))
                })
                .collect();
            let t = ck.write(clean, entries, &*self.hook)?;
            if let Some(Err(e)) = self.syncer.sync_all(std::slice::from_ref(&t)).pop() {
                return Err(Error::io(&t.path, e));
            }
        }
        Ok(())
    }
}
