//! State shared by a `Log` and its topics: directory, manifest, syncing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::balance::Clock;
use crate::error::{Error, Result};
use crate::events::EventHub;
use crate::format::manifest::{ManifestRecord, ManifestState};
use crate::partition::{Partition, SyncCapture};
use crate::storage::durability::{CheckpointFiles, GroupCommit, SyncTarget, Syncer};
use crate::storage::fault::{IoHook, IoOp};
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
    /// A sync round writes the checkpoint when this much time has passed
    /// since the last one (`LogOptions::checkpoint_interval`)...
    pub checkpoint_interval: Duration,
    /// ... or when this is set (open, retention): see [`Core::request_checkpoint`].
    pub checkpoint_wanted: AtomicBool,
    /// ... or while retention waits for the checkpoints to move past
    /// segments it would retire (every round writes one meanwhile).
    pub checkpoint_for_retention: AtomicBool,
    /// When the last checkpoint was written (none yet: the next round writes one).
    pub checkpoint_written: Mutex<Option<Instant>>,
    pub topology: Mutex<Topology>,
    pub topics: RwLock<BTreeMap<String, Topic>>,
    pub closed: AtomicBool,
    pub sync_failure: Mutex<Option<String>>,
    pub compact_every: u32,
    pub events: EventHub,
}

impl Core {
    pub fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
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
    pub fn commit(&self, topo: &mut Topology, rec: ManifestRecord) -> Result<()> {
        let mut next = topo.state.clone();
        model::apply(&mut next, &rec).map_err(Error::Refused)?;
        topo.manifest.commit(&rec)?;
        topo.state = next;
        if topo.manifest.wants_compaction(self.compact_every) {
            // Compaction failing leaves the (durable) journal in charge.
            let _ = topo.manifest.compact(&topo.state);
        }
        Ok(())
    }

    /// Group-committed sync of everything appended so far.
    pub fn sync(&self) -> Result<()> {
        self.group.sync(|| self.sync_round(false))
    }

    /// Makes the next sync round write the checkpoint whether or not it is
    /// due. A [`Core::sync`] called after this returns only once a
    /// checkpoint written after this call is durable: the round it waits
    /// for, or an earlier one that took the request, wrote it (a round that
    /// fails to write it puts the request back, and a failed checkpoint
    /// sync fails every later round).
    pub fn request_checkpoint(&self) {
        self.checkpoint_wanted.store(true, Ordering::Release);
    }

    /// Whether this round writes the checkpoint (takes a pending request).
    fn checkpoint_due(&self) -> bool {
        if self.checkpoint_wanted.swap(false, Ordering::AcqRel)
            || self.checkpoint_for_retention.load(Ordering::Acquire)
        {
            return true;
        }
        self.checkpoint_written
            .lock()
            .is_none_or(|at| at.elapsed() >= self.checkpoint_interval)
    }

    /// One sync round (see `storage::durability`). It writes the checkpoint
    /// only when due (interval or request); other rounds sync data files
    /// and directories only. With `clean`, the checkpoint records the
    /// positions just synced and the clean flag.
    pub fn sync_round(&self, clean: bool) -> Result<()> {
        if let Some(f) = &*self.sync_failure.lock() {
            return Err(Error::Io {
                path: self.dir.clone(),
                source: std::io::Error::other(format!("an earlier sync failed: {f}")),
            });
        }
        let parts = self.all_partitions();
        let caps: Vec<SyncCapture> = parts.iter().map(|p| p.capture_unsynced()).collect();
        let mut targets = Vec::new();
        let mut owner = Vec::new();
        for (i, cap) in caps.iter().enumerate() {
            for (seg, ..) in &cap.segments {
                // No descriptor: a round that ended meanwhile synced it all.
                let Some(file) = seg.sync_handle() else {
                    continue;
                };
                targets.push(SyncTarget {
                    fd: std::os::unix::io::AsRawFd::as_raw_fd(&*file),
                    path: seg.path().to_path_buf(),
                    datasync: true,
                    op: IoOp::SyncSegment,
                    _keep: Some(file),
                });
                owner.push(Some(i));
            }
            if cap.sync_dir {
                let dir = parts[i].dir();
                let f = std::fs::File::open(dir).map_err(|e| Error::io(dir, e))?;
                let fd = std::os::unix::io::AsRawFd::as_raw_fd(&f);
                targets.push(SyncTarget {
                    fd,
                    path: dir.to_path_buf(),
                    datasync: false,
                    op: IoOp::SyncDir,
                    _keep: Some(Arc::new(f)),
                });
                owner.push(Some(i));
            }
        }
        let mut ck = self.checkpoint.lock();
        if !clean && self.checkpoint_due() {
            let entries = parts.iter().map(|p| p.checkpoint_entry(None)).collect();
            match ck.write(false, entries, &*self.hook) {
                Ok(t) => targets.push(t),
                Err(e) => {
                    self.request_checkpoint();
                    return Err(e);
                }
            }
            owner.push(None);
            *self.checkpoint_written.lock() = Some(Instant::now());
        }
        let results = self.syncer.sync_all(&targets);
        let mut failed = vec![false; parts.len()];
        let mut first_err: Option<Error> = None;
        for ((t, r), o) in targets.iter().zip(results).zip(&owner) {
            if let Err(e) = r {
                let msg = format!("sync of {} failed: {e}", t.path.display());
                match o {
                    Some(i) => {
                        failed[*i] = true;
                        parts[*i].poison(msg.clone());
                    }
                    None => *self.sync_failure.lock() = Some(msg.clone()),
                }
                first_err.get_or_insert(Error::io(&t.path, e));
            }
        }
        for (i, cap) in caps.iter().enumerate() {
            parts[i].sync_done(cap, !failed[i]);
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if clean {
            let entries = parts
                .iter()
                .zip(&caps)
                .map(|(p, c)| p.checkpoint_entry(Some(c.pos)))
                .collect();
            let t = ck.write(true, entries, &*self.hook)?;
            if let Some(Err(e)) = self.syncer.sync_all(std::slice::from_ref(&t)).pop() {
                return Err(Error::io(&t.path, e));
            }
        }
        Ok(())
    }
}
