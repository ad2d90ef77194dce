//! What a sync round makes durable: capturing a partition's unsynced
//! state without its writer lock, recording the round's outcome, and the
//! checkpoint entry that names the durable position.

use super::*;

/// Capture of a partition's unsynced state for one sync round.
#[derive(Debug)]
pub(crate) struct SyncCapture {
    /// Segments to sync: (segment, committed position, sealed at capture).
    pub segments: Vec<(Arc<Segment>, u64, bool)>,
    pub sync_dir: bool,
    /// The op the directory fsync goes through (the open makes the names
    /// recovery found durable itself, as `SyncRecoveryDir`).
    pub dir_op: IoOp,
    /// The partition's roll count at the capture: what a successful
    /// directory fsync of this capture covers.
    pub rolls: u64,
    pub pos: DurablePoint,
}

impl SyncCapture {
    /// The fsyncs that make this capture durable: each segment's data,
    /// then the partition directory `dir` when a file was added or removed.
    pub(crate) fn targets(&self, dir: &Path) -> Result<Vec<SyncTarget>> {
        let mut targets = Vec::with_capacity(self.segments.len() + 1);
        for (seg, ..) in &self.segments {
            // No descriptor: a round that ended meanwhile synced it all. A
            // segment that must be synced but can't be opened again (EMFILE)
            // fails the round: nothing is reported durable, nothing poisoned.
            let Some(file) = seg.sync_handle()? else {
                continue;
            };
            targets.push(SyncTarget {
                fd: std::os::unix::io::AsRawFd::as_raw_fd(&*file),
                path: seg.path().to_path_buf(),
                datasync: true,
                op: IoOp::SyncSegment,
                _keep: Some(file),
            });
        }
        if self.sync_dir {
            let f = crate::storage::file::open_dir(dir)
                .map_err(|e| Error::io(dir, e).resource_typed())?;
            targets.push(SyncTarget {
                fd: std::os::unix::io::AsRawFd::as_raw_fd(&f),
                path: dir.to_path_buf(),
                datasync: false,
                op: self.dir_op,
                _keep: Some(Arc::new(f)),
            });
        }
        Ok(targets)
    }
}

impl Partition {
    /// Syncs everything written so far while the caller holds the writer
    /// lock (nothing can be appended meanwhile). A failed fsync poisons
    /// the partition, as in a sync round.
    pub(super) fn sync_locked(&self, w: &WriterState, syncer: &Syncer) -> Result<()> {
        let mut cap = self.capture_with(w);
        // Always the directory too: a sync round in flight may have taken
        // the "directory changed" flag and not yet fsynced it, and a split
        // or merge must not commit while the name of a segment the parent
        // rolled to is not durable.
        cap.sync_dir = true;
        let targets = match cap.targets(self.dir()) {
            Ok(t) => t,
            Err(e) => {
                self.sync_done(&cap, false);
                return Err(e);
            }
        };
        let results = syncer.sync_all(&targets);
        if let Some((t, Err(e))) = targets.iter().zip(results).find(|(_, r)| r.is_err()) {
            self.poison(format!("sync of {} failed: {e}", t.path.display()));
            self.sync_done(&cap, false);
            return Err(Error::io(&t.path, e));
        }
        self.sync_done(&cap, true);
        Ok(())
    }

    /// Publishes where the writer's data ends, for [`Partition::capture_unsynced`].
    /// Called under the writer lock after every append and every change of
    /// the writer, before the partition is marked dirty.
    ///
    /// The `end_offset` store is SeqCst for two readers: `wait_for` (see
    /// the comment there), and a capture, whose SeqCst clear of `dirty`
    /// and SeqCst load of `end_offset` pair with it and with the SeqCst
    /// load in `mark_dirty`: either the capture sees this position, or
    /// the `mark_dirty` that follows sees the cleared flag and puts the
    /// partition on the list for the next round. (A lost race both ways
    /// would let a round started after an append miss it.)
    pub(super) fn publish_written(&self, w: &WriterState) {
        let pos = DurablePoint::of_writer(&w.writer);
        if pos != UNWRITTEN && self.unwritten_start.load(Ordering::Relaxed) {
            // Before the position: a capture that reads the new position
            // never skips it (see `capture_unsynced`), one that reads the
            // old one skips what was then nothing to sync.
            self.unwritten_start.store(false, Ordering::Release);
        }
        self.written.store(pos.to_cell(w.segment_roll));
        self.end_offset
            .store(w.writer.next_offset(), Ordering::SeqCst);
    }

    /// Captures what a sync round must make durable, without the writer
    /// lock: appends go on while a round captures and syncs.
    ///
    /// Why this is as good as a capture under the lock:
    /// - The position is one published triple (segment, byte position,
    ///   offset) of a moment between two appends, published after that
    ///   append's bytes were in place (stores or `pwrite`), so the fsyncs
    ///   that follow cover it.
    /// - It is read before the segment list and each segment's committed
    ///   position, which only grow after it: every segment the position
    ///   names is in the list, synced up to at least the position. A roll
    ///   pushes the new segment and publishes the sealed flag of the old
    ///   one before it publishes a position in the new one.
    /// - The segment the position names has a durable name once this round
    ///   completes: the position comes with the count of the roll that
    ///   created its segment, and unless a completed directory fsync
    ///   already covers that count, this round fsyncs the directory. The
    ///   "directory changed" flag alone is not enough: a roll may set it
    ///   after this capture took it, and a seal's `sync_locked` may hold it
    ///   with its fsync still in flight. The roll count this capture
    ///   reports (what its directory fsync covers) is read after the
    ///   position, so it counts that roll too.
    /// - `dirty` is cleared first: an append published after the load
    ///   marks the partition dirty again, for the next round.
    /// - SeqCst with `publish_written` and `mark_dirty`: see there.
    pub(crate) fn capture_unsynced(&self) -> SyncCapture {
        self.dirty.store(false, Ordering::SeqCst);
        let _ = self.end_offset.load(Ordering::SeqCst);
        let (pos, created_roll) = DurablePoint::from_cell(self.written.load());
        let rolls = self.rolls.load(Ordering::Acquire);
        // Taken whenever set: retention's deletions set it too.
        let flagged = self.dir_dirty.swap(false, Ordering::AcqRel);
        if !flagged && pos == UNWRITTEN && self.unwritten_start.load(Ordering::Acquire) {
            // A new topic's partition with nothing appended: its first
            // segment and its name need not be durable yet (recovery makes
            // them again if a power loss takes them), unless a split or
            // merge sealed it, whose seal must be synced.
            let sealed = self.sealed.load(Ordering::Acquire)
                || self.segments().last().is_some_and(|s| s.is_sealed());
            if !sealed {
                return SyncCapture {
                    segments: Vec::new(),
                    sync_dir: false,
                    dir_op: IoOp::SyncDir,
                    rolls,
                    pos: DurablePoint::NOTHING,
                };
            }
        }
        let sync_dir = flagged || self.dir_synced_rolls.load(Ordering::Acquire) < created_roll;
        self.capture_segments(pos, sync_dir, rolls)
    }

    /// [`Partition::capture_unsynced`] by a caller holding the writer lock.
    ///
    /// Never skips a never-written partition: the callers (a split, merge
    /// or tail split syncing its parent or children before its record
    /// commits) need its first segment durable, even empty, so the
    /// partition stops counting as unwritten here.
    pub(super) fn capture_with(&self, w: &WriterState) -> SyncCapture {
        debug_assert_eq!(
            DurablePoint::of_writer(&w.writer),
            DurablePoint::from_cell(self.written.load()).0,
            "the published position follows the writer"
        );
        self.unwritten_start.store(false, Ordering::Release);
        self.capture_unsynced()
    }

    pub(super) fn capture_segments(
        &self,
        pos: DurablePoint,
        sync_dir: bool,
        rolls: u64,
    ) -> SyncCapture {
        let segments = self.segments();
        let mut out = Vec::new();
        for s in segments.iter().rev() {
            // Sealed is read first: the seal bytes are in the mapping before
            // the flag is published, so the sync below covers them.
            let seal = s.needs_seal_sync();
            let committed = s.committed_pos();
            if committed > s.synced_pos() || seal {
                out.push((s.clone(), committed, seal));
            } else if s.is_sealed() {
                break;
            }
        }
        SyncCapture {
            segments: out,
            sync_dir,
            dir_op: IoOp::SyncDir,
            rolls,
            pos,
        }
    }

    /// Records the outcome of a sync round. Returns whether the durable
    /// position moved (the checkpoint has to catch up).
    pub(crate) fn sync_done(&self, cap: &SyncCapture, ok: bool) -> bool {
        let mut moved = false;
        if ok {
            for (s, pos, seal) in &cap.segments {
                s.set_synced_pos(*pos);
                if *seal {
                    s.set_seal_synced();
                }
            }
            // Monotonic: a round that captured before a seal's own sync
            // may finish after it. A capture past the partition's end is
            // either from before a reclaim cut the partition there (it names
            // bytes the reclaim punched out) or of an append whose writer
            // has published its position but not yet its end: the durable
            // position stays (the writer marks the partition dirty again
            // right after, for the next round), and the durable end rises
            // only to the partition's end, which this round's fsyncs
            // covered. Checked under the `durable` lock, which the reclaim
            // holds while it lowers the end.
            let mut d = self.durable.lock();
            let physical_end = self.end_offset.load(Ordering::Acquire);
            let current = cap.pos.end_offset <= physical_end;
            let end = cap.pos.end_offset.min(physical_end);
            if current && (cap.pos.segment_base, cap.pos.position) >= (d.segment_base, d.position) {
                moved = *d != cap.pos;
                *d = cap.pos;
            }
            // Under the same lock, for the same reason.
            let raised = self.durable_end.fetch_max(end, Ordering::SeqCst) < end;
            drop(d);
            if cap.sync_dir {
                // The directory fsync started after the capture: the names
                // of the segments created by then are durable.
                self.dir_synced_rolls.fetch_max(cap.rolls, Ordering::AcqRel);
            }
            // `durable_end` (raised above) is published only once the
            // fsyncs returned: durable reads never show what a power loss
            // could still take back. SeqCst pairs with the waiter's
            // increment of `waiters` (see `wait_for_with`).
            if raised {
                if self.waiters.load(Ordering::SeqCst) > 0 {
                    let _g = self.tail_lock.lock();
                    self.tail_cv.notify_all();
                }
                self.p.wake.notify_partition(self.p.id);
            }
        } else {
            if cap.sync_dir {
                self.dir_dirty.store(true, Ordering::Release);
            }
            self.mark_dirty();
        }
        moved
    }

    /// Records that a checkpoint naming `segment_base` was written (once
    /// per checkpoint file written: the two files alternate).
    pub(crate) fn note_checkpointed(&self, segment_base: u64) {
        let mut bases = self.checkpointed_bases.lock();
        *bases = (bases.1, segment_base);
    }

    /// Checkpoint entry: the durable position and the write rates. The
    /// caller reports it with [`Partition::note_checkpointed`] if written.
    pub(crate) fn checkpoint_entry(&self, durable: Option<DurablePoint>) -> PartitionCheckpoint {
        let d = durable.unwrap_or_else(|| *self.durable.lock());
        let now = self.clock.now_nanos();
        let rates = self.writer.lock().rates.snapshot(now);
        PartitionCheckpoint {
            topic_id: self.p.topic_id,
            partition_id: self.p.id,
            segment_base: d.segment_base,
            position: d.position,
            end_offset: d.end_offset,
            start_offset: self.retired_below.load(Ordering::Acquire),
            rates: rates
                .windows
                .iter()
                .map(|w| crate::format::checkpoint::WindowState {
                    window_ms: w.window_millis.min(u64::from(u32::MAX)) as u32,
                    bytes_per_sec: w.bytes_per_sec,
                    records_per_sec: w.records_per_sec,
                })
                .collect(),
        }
    }
}
