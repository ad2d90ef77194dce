//! Retention and reclaim: retiring whole segments below a floor, cutting
//! a tail split's moved records, and marking a partition removed.

use super::*;

/// What [`Partition::plan_retention`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetentionPlan {
    /// The retention floor moved: make it durable, then delete.
    pub floor_moved: bool,
    /// A segment retention would retire is still named by one of the last
    /// two checkpoints: it goes once newer checkpoints are written.
    pub waits_for_checkpoint: bool,
}

impl Partition {
    /// Sets the retention floor found by recovery.
    pub(crate) fn set_retired_below(&self, offset: u64) {
        self.retired_below.fetch_max(offset, Ordering::AcqRel);
    }

    /// Decides which sealed segments retention retires and raises the floor
    /// to the first segment kept. Deletes nothing: the caller makes the new
    /// floor durable (a sync round writes it into the checkpoint) and then
    /// calls [`Partition::delete_retired`], so a crash can never bring back
    /// a retired file that recovery would mistake for live data.
    pub(crate) fn plan_retention(
        &self,
        age: Option<Duration>,
        bytes: Option<u64>,
        now_ms: i64,
    ) -> RetentionPlan {
        let v = self.segments();
        let mut total: u64 = v.iter().map(|s| s.committed_pos()).sum();
        // The segment being written never goes (an empty sealed partition does).
        let keep_last = !self.is_sealed();
        // Nor do the segments the last two checkpoints name (recovery
        // starts from them).
        let floor = {
            let bases = self.checkpointed_bases.lock();
            bases.0.min(bases.1)
        };
        let mut i = 0;
        let mut waits_for_checkpoint = false;
        while v.len() - i > usize::from(keep_last) {
            let s = &v[i];
            // Timestamps are the caller's (any i64) and so is the age: the
            // difference saturates, and an age past i64 milliseconds
            // saturates too (a cast would keep its low bits, negative for
            // `Duration::MAX`, and expire everything).
            let expired = age.is_some_and(|a| {
                let age_ms = i64::try_from(crate::duration::duration_millis(a)).unwrap_or(i64::MAX);
                s.max_timestamp() != i64::MIN && now_ms.saturating_sub(s.max_timestamp()) > age_ms
            });
            let too_big = bytes.is_some_and(|b| total > b);
            if !(expired || too_big) || keep_last && !s.is_sealed() {
                break;
            }
            if keep_last && s.base_offset >= floor {
                waits_for_checkpoint = true;
                break;
            }
            total -= s.committed_pos();
            i += 1;
        }
        let new_floor = match v.get(i) {
            Some(s) if i > 0 => s.base_offset,
            None if i > 0 => v[i - 1].end_offset(),
            _ => 0,
        };
        let floor_moved =
            new_floor > 0 && self.retired_below.fetch_max(new_floor, Ordering::AcqRel) < new_floor;
        if floor_moved {
            // The next checkpoint must carry the new floor.
            self.mark_dirty();
        }
        RetentionPlan {
            floor_moved,
            waits_for_checkpoint,
        }
    }

    /// Unlinks the segments below the retention floor. Readers holding
    /// them keep reading (the mappings stay valid until dropped).
    pub(crate) fn delete_retired(&self) -> Result<Vec<PathBuf>> {
        let floor = self.retired_below.load(Ordering::Acquire);
        let mut removed = Vec::new();
        let mut list = self.segments.write();
        let v = list.clone();
        let mut outcome = Ok(());
        while v.get(removed.len()).is_some_and(|s| {
            s.base_offset < floor && (v.len() - removed.len() > 1 || self.is_sealed())
        }) {
            if self.is_removed() {
                // Its topic was deleted after the pass planned: the files
                // are gone with the directory, and nothing is left to do.
                return Ok(removed);
            }
            let s = &v[removed.len()];
            let _ = std::fs::remove_file(s.index_path());
            if let Err(e) = std::fs::remove_file(s.path()) {
                if e.kind() == std::io::ErrorKind::NotFound && self.is_removed() {
                    return Ok(removed);
                }
                outcome = Err(Error::io(s.path(), e));
                break;
            }
            // The file is unlinked: its space comes back once no reader
            // holds its mapping either, so the cache lets go now.
            s.drop_mapping();
            removed.push(s.path().to_path_buf());
        }
        if !removed.is_empty() {
            *list = v.without_front(removed.len());
            self.dir_dirty.store(true, Ordering::Release);
            self.mark_dirty();
        }
        outcome.map(|()| removed)
    }

    /// Releases the bytes of a sealed tail-split parent past its logical
    /// end `from` (its `TailReclaimed` record is durable). Segments wholly
    /// past `from` are unlinked, newest first, each name removal synced
    /// before the next (the files left are always a prefix of the chain);
    /// a reader still holding one keeps its mapping. The segment holding
    /// `from` is cut there ([`Segment::release_past`]) only when nothing
    /// but the partition holds it: a read batch taken before the split may
    /// still cover bytes past `from`, and the cut waits for the next call.
    /// Returns whether the partition now ends at `from` on disk.
    pub(crate) fn reclaim_past(&self, from: u64) -> Result<bool> {
        let mut w = self.writer.lock();
        let mut list = self.segments.write();
        let v = list.clone();
        let k = v.partition_point(|s| s.base_offset <= from);
        let Some(k) = k.checked_sub(1) else {
            return Ok(true);
        };
        let keep = v[k].clone();
        let later: Vec<Arc<Segment>> = v.iter().skip(k + 1).cloned().collect();
        *list = v.truncated(k + 1);
        drop(v);
        if !later.is_empty() {
            // The writer of a sealed partition writes nothing, but a clean
            // close writes its segment's index file: it must not name a
            // removed segment.
            w.writer = SegmentWriter::new(keep.clone(), self.p.index_interval);
            w.segment_roll = 0;
            self.publish_written(&w);
        }
        let moved_end = |seg: &Arc<Segment>| (seg.committed_pos(), seg.end_offset());
        self.unlink_newest_first(&later)?;
        drop(later);
        let (pos, end) = moved_end(&keep);
        self.set_reclaimed_end(keep.base_offset, pos, end);
        if end <= from {
            return Ok(true);
        }
        // Held by the list, the writer and `keep` only: no read batch
        // (nor a clone of one) covers its bytes. A read started from here
        // on stops at `from` (the logical end) and reads no byte past it.
        if Arc::strong_count(&keep) > 3 {
            drop(list);
            return Ok(false);
        }
        let pos = keep.locate(from)?;
        keep.release_past(pos, from)?;
        // The writer's position is the segment's old end: a sync round
        // would capture it as the durable end, and the checkpoint name
        // offsets past `from` at the cut's position.
        w.writer = SegmentWriter::new(keep.clone(), self.p.index_interval);
        w.segment_roll = 0;
        self.publish_written(&w);
        self.set_reclaimed_end(keep.base_offset, pos, from);
        drop(list);
        Ok(true)
    }

    /// Unlinks `later` (segments wholly past a cut), newest first, the
    /// directory synced after each name goes, so the files left are
    /// always a prefix of the chain; each mapping the budget caches is
    /// given back at once (a reader holding one keeps its own).
    pub(super) fn unlink_newest_first(&self, later: &[Arc<Segment>]) -> Result<()> {
        for seg in later.iter().rev() {
            seg.drop_mapping();
            // The index is a cache: one left behind is rebuilt or ignored.
            let _ = std::fs::remove_file(seg.index_path());
            match std::fs::remove_file(seg.path()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(seg.path(), e)),
            }
            crate::storage::sync_dir(&*self.hook, IoOp::SyncDir, &self.p.dir)?;
        }
        Ok(())
    }

    /// The partition's physical end after a reclaim: what the next
    /// checkpoint names.
    pub(super) fn set_reclaimed_end(&self, segment_base: u64, position: u64, end_offset: u64) {
        // Under the `durable` lock: see `sync_done`.
        let mut d = self.durable.lock();
        self.end_offset.store(end_offset, Ordering::SeqCst);
        self.durable_end.fetch_min(end_offset, Ordering::AcqRel);
        *d = DurablePoint {
            segment_base,
            position,
            end_offset,
        };
        drop(d);
        self.mark_dirty();
    }

    /// The active segment and its index file's new bytes when they differ
    /// from what is durably on disk: a clean close writes those (batched
    /// over every partition, `log.rs`), so a power loss after it never
    /// leaves an index stale, and writes nothing for a partition whose
    /// index did not change.
    pub(crate) fn index_to_flush(&self) -> Option<(Arc<Segment>, Vec<u8>)> {
        let w = self.writer.lock();
        let seg = w.writer.segment();
        seg.index_file_if_changed().map(|buf| (seg.clone(), buf))
    }

    /// Whether every segment was removed by retention (sealed partitions only).
    pub fn is_empty_sealed(&self) -> bool {
        self.is_sealed() && self.segments.read().is_empty()
    }

    /// Sealed, with every offset it ever held below the retention floor:
    /// nothing in it can be read again (a placeholder segment recovery
    /// made for it holds no record).
    pub(crate) fn fully_retired(&self) -> bool {
        self.is_sealed() && self.retired_below.load(Ordering::Acquire) >= self.end_offset()
    }

    /// Marks the partition as removed from the topology (its
    /// `RemovePartition` record is durable). Set before its directory is
    /// deleted: a sync round or checkpoint that meets it afterwards skips
    /// it, and a failure caused by the missing directory is not a failed
    /// fsync of live data.
    pub(crate) fn mark_removed(&self) {
        self.removed.store(true, Ordering::Release);
    }

    /// Undoes [`Partition::mark_removed`] for a partition built before it
    /// entered the topology (a tail split's child, once its record commits).
    pub(crate) fn unmark_removed(&self) {
        self.removed.store(false, Ordering::Release);
        // A sync round may have dropped it from the dirty list meanwhile
        // (as removed) with its dirty flag still set: list it again.
        self.dirty.store(true, Ordering::Release);
        let mut list = self.dirty_list.0.lock();
        if !list.iter().any(|w| w.ptr_eq(&self.me)) {
            list.push(self.me.clone());
        }
    }

    /// Marks the partition removed because its topic is being deleted,
    /// under the writer lock: an append or roll in progress (which may
    /// create a segment file) finishes first, and every later one is
    /// refused (`check_writable`), so nothing writes into the directory
    /// `Log::delete_topic` removes next.
    pub(crate) fn mark_deleted(&self) {
        let _w = self.writer.lock();
        self.deleted.store(true, Ordering::Release);
        self.removed.store(true, Ordering::Release);
    }

    /// See [`Partition::mark_removed`].
    pub(crate) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }
}
