//! Reading a partition: batches from an offset, waiting for new data, and
//! the offset of a timestamp.

use super::*;

impl Partition {
    /// Reads from `offset`: at least one batch, then more while under
    /// `max_bytes`, up to what the partition's default isolation shows.
    pub fn read(&self, offset: u64, max_bytes: usize) -> Result<ReadBatch> {
        self.read_with(offset, max_bytes, self.p.isolation)
    }

    /// [`Partition::read`] with an explicit read isolation.
    pub fn read_with(
        &self,
        offset: u64,
        max_bytes: usize,
        isolation: ReadIsolation,
    ) -> Result<ReadBatch> {
        // The end first, then the list. A roll pushes the new segment into
        // the list before the writer appends to it and publishes the new end
        // (Release); loading the end (Acquire) first makes every offset
        // below it lie in a segment of the list read after it. Loaded the
        // other way round, a roll in between pairs an old list with a new
        // end, and a just-appended offset past the old last segment reads
        // as a hole.
        let end = self.visible_end(isolation);
        // The segment read is taken under the list lock: a Raft
        // truncation holds it from its count of a segment's holders until
        // the segment ends at the cut (see `cut_files`).
        let list = self.segments.read();
        let segments = list.clone();
        let start = segments.first().map_or(end, |s| s.base_offset);
        if offset < start && offset < self.retired_below.load(Ordering::Acquire) {
            return Err(Error::Retained {
                partition: self.p.id,
                start: offset,
                end: start,
            });
        }
        if offset < start || offset >= end {
            return Err(Error::OffsetOutOfRange {
                partition: self.p.id,
                offset,
                start,
                end,
            });
        }
        // `start <= offset` with a non-empty list (an empty one has
        // `start == end` and returned above): some segment starts at or
        // below `offset`.
        let i = segments.partition_point(|s| s.base_offset <= offset);
        let Some(i) = i.checked_sub(1) else {
            return Err(Error::OffsetOutOfRange {
                partition: self.p.id,
                offset,
                start,
                end,
            });
        };
        let seg = segments[i].clone();
        drop(list);
        if offset >= seg.end_offset() {
            let next = segments.get(i + 1).map_or(end, |s| s.base_offset);
            return Err(Error::Hole {
                partition: self.p.id,
                start: seg.end_offset(),
                end: next,
            });
        }
        ReadBatch::new(self.p.id, seg, self.p.lock.clone(), offset, max_bytes, end)
            .map_err(|e| self.retired_while_read(e, offset))
    }

    /// A read that had to map a segment again and found its file gone:
    /// retention unlinked it after the read took the segment list (and
    /// dropped its mapping). The offset is retained, not an I/O failure.
    fn retired_while_read(&self, e: Error, offset: u64) -> Error {
        let gone =
            matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
        if gone && offset < self.retired_below.load(Ordering::Acquire) {
            return Error::Retained {
                partition: self.p.id,
                start: offset,
                end: self.start_offset(),
            };
        }
        e
    }

    /// Blocks until `offset` is readable (under the default isolation),
    /// the partition is sealed below it, or `timeout` passes. Returns
    /// whether data is there.
    pub fn wait_for(&self, offset: u64, timeout: Duration) -> bool {
        self.wait_for_with(offset, timeout, self.p.isolation)
    }

    /// [`Partition::wait_for`] with an explicit read isolation: a durable
    /// wait wakes when a sync round moves the durable end.
    pub fn wait_for_with(&self, offset: u64, timeout: Duration, isolation: ReadIsolation) -> bool {
        let deadline = crate::duration::deadline_after(timeout);
        // The appender stores `end_offset` then loads `waiters`; the waiter
        // increments `waiters` then loads `end_offset` (a store followed by
        // a load of another location on each side, as in Dekker's
        // algorithm). With Release/Acquire only, each load may be ordered
        // before the other side's store (x86 store buffers do exactly
        // that): the appender sees no waiter and skips the notify while
        // the waiter sees the old end and sleeps until its timeout. SeqCst
        // on all four accesses puts them in one total order, so at least
        // one side sees the other: the waiter sees the new end, or the
        // appender sees the waiter and notifies under `tail_lock`, which
        // the waiter holds from its check until it sleeps.
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = self.tail_lock.lock();
        let ready = loop {
            if self.visible_end(isolation) > offset {
                break true;
            }
            // A sealed partition still gets its tail synced: only a
            // written-isolation wait can stop at the seal.
            let final_end = self.is_sealed()
                && (isolation == ReadIsolation::Written
                    || self.durable_end_offset() >= self.end_offset())
                && (isolation != ReadIsolation::Committed
                    || self.committed_end() >= self.end_offset());
            if final_end {
                break self.visible_end(isolation) > offset;
            }
            match deadline {
                Some(d) => {
                    if self.tail_cv.wait_until(&mut g, d).timed_out() {
                        break self.visible_end(isolation) > offset;
                    }
                }
                None => self.tail_cv.wait(&mut g),
            }
        };
        drop(g);
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        ready
    }

    /// First offset whose record timestamp is >= `ts` (None: none yet).
    /// A tail-split parent answers below its logical end only: its records
    /// past it were moved to the children.
    pub fn offset_for_time(&self, ts: i64) -> Result<Option<u64>> {
        let found = self.physical_offset_for_time(ts)?;
        Ok(found.filter(|&o| o < self.logical_end.load(Ordering::Acquire)))
    }

    pub(super) fn physical_offset_for_time(&self, ts: i64) -> Result<Option<u64>> {
        let segments = self.segments();
        // A segment whose newest timestamp cannot be known (it cannot be
        // mapped) fails the lookup: passed over, its records would be
        // answered as missing or as the next segment's.
        let mut found = None;
        for s in segments.iter() {
            if s.newest_timestamp()? >= ts {
                found = Some(s);
                break;
            }
        }
        let Some(seg) = found else {
            return Ok(None);
        };
        let (pos, off) = seg.time_hint(ts);
        let data = seg.committed()?;
        let end = seg.committed_pos();
        let (mut pos, mut next) = (pos, off);
        while pos < end {
            let h = batch::validate(data.from(pos), Some(next))
                .map_err(|e| Error::corruption(seg.path(), pos, e.to_string()))?;
            if !batch::is_hole(&h) && h.max_ts.get() >= ts {
                let b = &data.from(pos)[..h.batch_len.get() as usize];
                for r in batch::RecordIter::new(b, &h) {
                    let r = r.map_err(|e| Error::corruption(seg.path(), pos, e.to_string()))?;
                    if r.timestamp >= ts {
                        return Ok(Some(r.offset));
                    }
                }
            }
            next += u64::from(h.record_count.get());
            pos += u64::from(h.batch_len.get());
        }
        Ok(None)
    }
}
