//! Appending to a partition: batch checks, the fenced append, rolling to
//! a new segment and sealing.

use super::*;

impl Partition {
    /// Checks sizes before taking the lock. Returns the batch length.
    pub(crate) fn check_batch(&self, records: &[RecordIn<'_>]) -> Result<usize> {
        if records.is_empty() {
            return Err(Error::InvalidConfig(
                "a batch needs at least one record".into(),
            ));
        }
        for r in records {
            let size = r.encoded_len() as u64;
            if size > self.p.max_record_bytes || r.key.is_some_and(|k| k.len() >= u32::MAX as usize)
            {
                return Err(Error::RecordTooLarge {
                    size,
                    max: self.p.max_record_bytes,
                });
            }
        }
        let len = batch::batch_len(records);
        let room = self.p.segment_bytes - crate::format::segment::SEGMENT_HEADER_LEN as u64;
        if len as u64 > room || records.len() > u32::MAX as usize {
            return Err(Error::RecordTooLarge {
                size: len as u64,
                max: room,
            });
        }
        Ok(len)
    }

    /// Appends a batch; returns the offset of its first record.
    /// `hashes` (one per record, keyed records only) feed the load map.
    pub(crate) fn append(&self, records: &[RecordIn<'_>], hashes: &[Option<u64>]) -> Result<u64> {
        self.append_fenced(records, hashes, None)
    }

    /// [`Partition::append`] that refuses, as if sealed (so the caller
    /// routes again), when `fence` no longer holds the value the caller
    /// routed under. Checked under the writer lock: a hot-key mode change
    /// moves the fence and then takes this lock to read the partition's
    /// end, so every append routed before the change is either below that
    /// end or routed again under the new mode.
    pub(crate) fn append_fenced(
        &self,
        records: &[RecordIn<'_>],
        hashes: &[Option<u64>],
        fence: Option<(&AtomicU64, u64)>,
    ) -> Result<u64> {
        if self.p.replicated {
            // A Raft log takes entries only (`append_entry`).
            return Err(Error::ReplicationMismatch {
                topic: self.p.topic.to_string(),
                partition: self.p.id,
                replicated: true,
            });
        }
        let len = self.check_batch(records)?;
        let base = {
            let mut w = self.writer.lock();
            self.check_writable()?;
            if let Some((f, seen)) = fence {
                if f.load(Ordering::SeqCst) != seen {
                    return Err(Error::Sealed {
                        topic: self.p.topic.to_string(),
                        partition: self.p.id,
                    });
                }
            }
            if (len as u64) > w.writer.remaining() {
                self.roll(&mut w)?;
            }
            let header = w.writer.append(records, len)?;
            let now = self.clock.now_nanos();
            w.rates.record(now, records.len() as u64, len as u64);
            self.metrics.appended(records.len(), len);
            for (r, h) in records.iter().zip(hashes) {
                if let Some(h) = h {
                    w.load.observe(now, *h, r.encoded_len() as u64);
                }
            }
            self.publish_written(&w);
            self.mark_dirty();
            header.base_offset.get()
        };
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.tail_lock.lock();
            self.tail_cv.notify_all();
        }
        // After the SeqCst store of `end_offset`: one load while no reader
        // of the topic waits.
        self.p.wake.notify(self.p.id);
        Ok(base)
    }

    /// Seals the active segment and starts a new one. Creating the new
    /// file is the only step that can fail, and it comes first: on failure
    /// it is removed again and the old segment, still unsealed, keeps
    /// taking appends, so a later roll starts from the same state. Sealing
    /// cannot fail (its index write is a cache).
    ///
    /// Before the new file is created, the name of every segment created
    /// before it is made durable: unless a directory fsync (of a sync
    /// round, or of an earlier roll) completed since the last roll, the
    /// partition directory is fsynced here. So a segment's name never
    /// survives a power loss that loses an earlier segment's name, and
    /// recovery can take a segment missing before one that is there for
    /// lost data, not for a crash artifact (docs/ARCHITECTURE.md). At most
    /// one directory fsync per roll, and none when sync rounds run more
    /// often than rolls. A failed fsync poisons the partition, as in a
    /// sync round.
    pub(super) fn roll(&self, w: &mut WriterState) -> Result<()> {
        let next = w.writer.next_offset();
        let rolls = self.rolls.load(Ordering::Acquire);
        if self.dir_synced_rolls.load(Ordering::Acquire) < rolls {
            // Opening the directory is not its fsync: failing to (too many
            // open files) loses nothing, so it poisons nothing and the
            // roll can be retried.
            let dir = self.with_budget_retry(|| {
                crate::storage::file::open_dir(&self.p.dir)
                    .map_err(|e| Error::io(&self.p.dir, e).resource_typed())
            })?;
            let synced =
                crate::storage::sync_file(&*self.hook, IoOp::SyncRollDir, &dir, &self.p.dir, false);
            drop(dir);
            if let Err(e) = synced {
                // Registered as failed by the next sync round (log-wide
                // syncs report it from then on): flagged before the poison
                // is published, so a round that sees the poison sees the
                // flag; a round that does not captures the partition, and
                // `mark_dirty` puts it back in the list for the next one.
                self.poison_unreported.store(true, Ordering::Release);
                self.poison(format!("directory sync before a roll failed: {e}"));
                self.mark_dirty();
                return Err(e);
            }
            self.dir_synced_rolls.fetch_max(rolls, Ordering::AcqRel);
        }
        let seg = self.with_budget_retry(|| {
            Segment::create_version(
                &self.p.dir,
                (self.p.topic_id, self.p.id),
                next,
                self.p.segment_bytes,
                (now_ms(), self.p.segment_version()),
                &*self.hook,
            )
            .map_err(Error::resource_typed)
        })?;
        seg.attach_hook(&self.hook);
        seg.set_index_interval(self.p.index_interval);
        seg.attach_budget(&self.p.budget);
        // Sealing puts the old segment's mapping and descriptor under the
        // budget (it takes no more appends).
        w.writer.seal();
        let seg = Arc::new(seg);
        {
            // O(1) amortised: the list is append-only (see
            // `storage/segment/list.rs`).
            let mut list = self.segments.write();
            *list = list.pushed(seg.clone());
        }
        w.segment_roll = self.rolls.fetch_add(1, Ordering::AcqRel) + 1;
        self.dir_dirty.store(true, Ordering::Release);
        w.writer = SegmentWriter::new(seg, self.p.index_interval);
        self.publish_written(w);
        self.mark_dirty();
        Ok(())
    }

    /// Runs `op`; when it fails for want of descriptors or mappings
    /// ([`Error::ResourceExhausted`]), the log's budget gives back what it
    /// caches for reads and `op` runs once more. A shortage changes
    /// nothing and poisons nothing: the caller gets the typed error and
    /// may retry.
    fn with_budget_retry<T>(&self, op: impl Fn() -> Result<T>) -> Result<T> {
        match op() {
            Err(e) if e.is_resource_shortage() && self.p.budget.shed() => op(),
            r => r,
        }
    }

    /// Forces a roll (tests and tools).
    pub fn roll_now(&self) -> Result<()> {
        let mut w = self.writer.lock();
        self.check_writable()?;
        if w.writer.segment().end_offset() == w.writer.segment().base_offset {
            return Ok(());
        }
        self.roll(&mut w)
    }

    /// Seals the partition at its current end (split/merge commit point).
    /// Returns the seal offset. Appenders block on the writer lock meanwhile.
    ///
    /// Before `commit` runs, everything up to the seal is made durable
    /// (through `syncer`): a split or merge record must never be durable
    /// while the parent's records below the seal are not, or a power loss
    /// could keep a key's later records (in a child) and lose its earlier
    /// ones (in the parent). A failed sync poisons the partition.
    pub(crate) fn seal_with<T>(
        &self,
        syncer: &Syncer,
        commit: impl FnOnce(u64) -> Result<T>,
    ) -> Result<T> {
        let mut w = self.writer.lock();
        self.check_writable()?;
        let end = w.writer.next_offset();
        self.sync_locked(&w, syncer)?;
        let out = match commit(end) {
            Ok(out) => out,
            Err(e) => {
                if let Error::LogPoisoned { reason } = &e {
                    // The seal may be committed on disk: no append may land
                    // past it (released only when the lock drops).
                    self.poison(format!("a topology change sealing it failed: {reason}"));
                }
                return Err(e);
            }
        };
        // SeqCst: published before the notifications below (the commit
        // also moved the topology generation, which readers check).
        self.sealed.store(true, Ordering::SeqCst);
        // The partition takes no more appends: give back the preallocated
        // space of its last segment (a failure only keeps that space).
        let _ = w.writer.segment().trim();
        // Its mapping and descriptor go under the budget: no descriptor is
        // held for a sealed partition nobody reads once it is synced.
        w.writer.freeze();
        self.mark_dirty();
        drop(w);
        {
            let _g = self.tail_lock.lock();
            self.tail_cv.notify_all();
        }
        self.p.wake.notify_partition(self.p.id);
        Ok(out)
    }

    /// Marks sealed without a commit (recovery of a sealed partition).
    pub(crate) fn mark_sealed(&self) {
        self.sealed.store(true, Ordering::Release);
    }

    /// Current write rates and load map, for the balancer.
    pub(crate) fn with_writer<T>(&self, f: impl FnOnce(&mut WriterState) -> T) -> T {
        f(&mut self.writer.lock())
    }
}
