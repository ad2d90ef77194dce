//! A segment's sparse index: the index file (a cache, validated against
//! the segment and rebuilt when it does not match), and offset and time
//! lookups through it. The walkers over batch headers at the end are pure.

use super::*;

impl Segment {
    /// Writes the in-memory index to the index file (tmp + rename). With
    /// `durable`, the tmp file is fsynced before the rename and the
    /// directory after it, so a power loss leaves the old or the new index,
    /// never an empty one. A roll writes it without syncing (it is a cache
    /// on the append path, and a stale one is noticed and rebuilt); a
    /// rebuild after a mismatch writes it durably.
    pub(crate) fn write_index_file(&self, durable: bool) -> Result<()> {
        let guard = self.index.lock();
        let IndexState::Loaded(entries) = &*guard else {
            return Ok(());
        };
        let buf = encode_index_file(self.base_offset, entries);
        drop(guard);
        self.write_index_bytes(&buf, durable, self.hook())
    }

    pub(super) fn write_index_bytes(
        &self,
        buf: &[u8],
        durable: bool,
        hook: &dyn IoHook,
    ) -> Result<()> {
        let tmp = self.index_path.with_extension("idx.tmp");
        hook.before(IoOp::WriteIndex, &self.index_path)
            .at(&self.index_path)?;
        self.index_durable.store(INDEX_UNKNOWN, Ordering::Release);
        let file = create_scratch(&tmp)?;
        file.write_all_at(buf, 0).at(&tmp)?;
        if durable {
            crate::storage::sync_file(hook, IoOp::SyncIndex, &file, &tmp, true)?;
        }
        drop(file);
        std::fs::rename(&tmp, &self.index_path).at(&self.index_path)?;
        if durable {
            if let Some(dir) = self.index_path.parent() {
                crate::storage::sync_dir(hook, IoOp::SyncIndexDir, dir)?;
            }
            self.index_durable
                .store(index_fingerprint(buf), Ordering::Release);
        }
        Ok(())
    }

    /// The index file's new bytes when the in-memory index differs from
    /// what is durably on disk (a clean close writes only those).
    pub(crate) fn index_file_if_changed(&self) -> Option<Vec<u8>> {
        let guard = self.index.lock();
        let IndexState::Loaded(entries) = &*guard else {
            return None;
        };
        let buf = encode_index_file(self.base_offset, entries);
        drop(guard);
        (self.index_durable.load(Ordering::Acquire) != index_fingerprint(&buf)).then_some(buf)
    }

    /// First step of a batched durable index write (a clean close of many
    /// partitions): writes `buf` into the temporary file and returns its
    /// fdatasync. Then [`Segment::install_index_file`] once every target of
    /// the batch synced.
    pub(crate) fn write_index_tmp(&self, buf: &[u8]) -> Result<SyncTarget> {
        let tmp = self.index_path.with_extension("idx.tmp");
        self.hook()
            .before(IoOp::WriteIndex, &self.index_path)
            .at(&self.index_path)?;
        self.index_durable.store(INDEX_UNKNOWN, Ordering::Release);
        let file = create_scratch(&tmp)?;
        file.write_all_at(buf, 0).at(&tmp)?;
        Ok(SyncTarget {
            fd: file.as_raw_fd(),
            path: tmp,
            datasync: true,
            op: IoOp::SyncIndex,
            _keep: Some(Arc::new(file)),
        })
    }

    /// Second step: renames the synced temporary file into place and
    /// returns the fsync of the directory that makes the rename durable;
    /// once it synced, [`Segment::index_made_durable`].
    pub(crate) fn install_index_file(&self) -> Result<SyncTarget> {
        let tmp = self.index_path.with_extension("idx.tmp");
        std::fs::rename(&tmp, &self.index_path).at(&self.index_path)?;
        let dir = self.index_path.parent().unwrap_or(Path::new("."));
        crate::storage::durability::dir_target(dir, IoOp::SyncIndexDir)
    }

    /// Records that the index file durably holds `buf`.
    pub(crate) fn index_made_durable(&self, buf: &[u8]) {
        self.index_durable
            .store(index_fingerprint(buf), Ordering::Release);
    }

    /// The active segment's index from its file, at an open after a clean
    /// shutdown (the close wrote it durably): metadata instead of a walk
    /// over every batch header. `None` when the file is missing, does not
    /// decode whole against the recovered end (`end` bytes), or its last
    /// entry does not name a batch from which the headers lead exactly to
    /// the end (a file that decodes but belongs to other data: another
    /// segment's, or one a roll or a cut left behind): the caller rebuilds
    /// it from the data. For the file the close wrote, the check walks at
    /// most one index interval of headers, so the open stays
    /// metadata-sized (C7); the entries before
    /// the last are hints that [`Segment::locate`] and the time lookup
    /// verify when they use them.
    pub(crate) fn load_clean_index_file(&self, end: u64) -> Option<Vec<IndexEntry>> {
        let buf = self.read_index_file().ok().flatten()?;
        let (entries, whole) =
            format_index::decode_index(&buf, self.base_offset, end, self.end_offset());
        if !whole {
            return None;
        }
        if let Some(last) = entries.last() {
            let from = (
                u64::from(last.position),
                self.base_offset + u64::from(last.rel_offset),
            );
            if !headers_reach(&self.committed().ok()?, from, end, self.end_offset()) {
                return None;
            }
        }
        self.index_durable
            .store(index_fingerprint(&buf), Ordering::Release);
        Some(entries)
    }

    /// Whether the index `buf` needs no file: it has at most one entry
    /// (records that fit in one index interval) and there is no file to
    /// replace. An open derives such an index from at most one interval of
    /// batch headers, the walk that checks an index file's last entry
    /// anyway (`Segment::load_clean_index_file`). A clean close and a
    /// scanning open (`recover`) follow this one rule, so neither writes a
    /// file the other would not.
    pub(crate) fn index_file_derivable(&self, buf: &[u8]) -> bool {
        buf.len()
            <= format_index::INDEX_HEADER_LEN
                + format_index::INDEX_ENTRY_LEN
                + format_index::INDEX_TRAILER_LEN
            && !self.index_path.exists()
    }

    /// Makes the index file match the in-memory index (rebuilt by a
    /// recovery scan), writing it durably when it does not. Returns whether
    /// it was rewritten. `recover` uses this so that `verify` is clean again
    /// after a power loss left a stale index.
    pub(crate) fn repair_index_file(&self, hook: &dyn IoHook) -> Result<bool> {
        let guard = self.index.lock();
        let IndexState::Loaded(entries) = &*guard else {
            return Ok(false);
        };
        let want = encode_index_file(self.base_offset, entries);
        drop(guard);
        if !self.writable || self.index_file_derivable(&want) {
            return Ok(false);
        }
        match self.read_index_file() {
            Ok(found) if found.as_deref() == Some(&want[..]) => return Ok(false),
            // Too long to be this segment's index: rewritten below.
            Ok(_) | Err(Error::Corruption { .. }) => {}
            Err(e) => return Err(e),
        }
        self.write_index_bytes(&want, true, hook)?;
        Ok(true)
    }

    /// Replaces an index found not to match the segment with one rebuilt
    /// from the data, in memory and (durably, best effort: the in-memory
    /// one is right either way) on disk.
    pub(super) fn rebuild_stale_index(&self, data: &CommittedBytes, end: u64) -> Vec<IndexEntry> {
        let entries = rebuild_index(data, self.base_offset, end, self.index_interval());
        self.write_rebuilt_index(&entries);
        entries
    }

    /// Writes a rebuilt index to the index file, durably (a segment of a
    /// partition that can write; a cache, so a failure is no error).
    fn write_rebuilt_index(&self, entries: &[IndexEntry]) {
        if self.writable && self.hook.get().is_some() {
            let buf = encode_index_file(self.base_offset, entries);
            let _ = self.write_index_bytes(&buf, true, self.hook());
        }
    }

    /// Finds the file position of the batch holding `offset` (which must be
    /// in `[base_offset, end_offset)`), using the sparse index as a hint.
    pub(crate) fn locate(&self, offset: u64) -> Result<u64> {
        let data = self.committed()?;
        self.locate_in(&data, offset)
    }

    /// [`Segment::locate`] in bytes already taken.
    pub(crate) fn locate_in(&self, data: &CommittedBytes, offset: u64) -> Result<u64> {
        let end = data.end as u64;
        let hint = self.index_hint(data, offset, end);
        match walk_to(data, hint, end, offset) {
            Some(pos) => Ok(pos),
            // The hint was wrong (a damaged cache): rebuild the index and
            // walk from the start.
            None => {
                if self.is_sealed() {
                    // Under the index lock: one reader rebuilds and writes it.
                    let mut guard = self.index.lock();
                    *guard = IndexState::Loaded(self.rebuild_stale_index(data, end));
                }
                walk_to(
                    data,
                    (SEGMENT_HEADER_LEN as u64, self.base_offset),
                    end,
                    offset,
                )
                .ok_or_else(|| {
                    Error::corruption(
                        &self.path,
                        hint.0,
                        format!("no batch holds offset {offset}"),
                    )
                })
            }
        }
    }

    /// Best index entry at or before `offset`: (position, its offset).
    pub(super) fn index_hint(&self, data: &CommittedBytes, offset: u64, end: u64) -> (u64, u64) {
        let mut guard = self.index.lock();
        if matches!(*guard, IndexState::NotLoaded) {
            *guard = IndexState::Loaded(self.load_index(data, end));
        }
        let IndexState::Loaded(entries) = &*guard else {
            unreachable!("loaded just above");
        };
        let rel = offset - self.base_offset;
        let i = entries.partition_point(|e| u64::from(e.rel_offset) <= rel);
        if i == 0 {
            (SEGMENT_HEADER_LEN as u64, self.base_offset)
        } else {
            let e = entries[i - 1];
            (
                u64::from(e.position),
                self.base_offset + u64::from(e.rel_offset),
            )
        }
    }

    /// Reads the index file; one that is missing or does not match the
    /// segment is rebuilt from the data and written again (durably).
    pub(super) fn load_index(&self, data: &CommittedBytes, end: u64) -> Vec<IndexEntry> {
        match self.read_index_file() {
            Ok(Some(buf)) => {
                let (entries, whole) =
                    format_index::decode_index(&buf, self.base_offset, end, self.end_offset());
                if whole {
                    return entries;
                }
            }
            // No file, and data that fits in one index interval: what a
            // clean close leaves (it writes no index a walk of one
            // interval derives), so a read writes none either.
            Ok(None) => {
                let entries = rebuild_index(data, self.base_offset, end, self.index_interval());
                if entries.len() > 1 {
                    self.write_rebuilt_index(&entries);
                }
                return entries;
            }
            Err(_) => {}
        }
        self.rebuild_stale_index(data, end)
    }

    /// Index entries for the time lookup: first position whose batch may hold
    /// a record with timestamp >= `ts`.
    pub(crate) fn time_hint(&self, ts: i64) -> (u64, u64) {
        self.time_hint_and_newest_before(ts).0
    }

    /// [`Segment::time_hint`], with the newest timestamp of the records
    /// before the hint (`i64::MIN` from the start): a walk from the hint
    /// sees only the records after it.
    pub(crate) fn time_hint_and_newest_before(&self, ts: i64) -> ((u64, u64), i64) {
        let start = (SEGMENT_HEADER_LEN as u64, self.base_offset);
        // A hint only: without the bytes (a mapping shortage), the start.
        let Ok(data) = self.committed() else {
            return (start, i64::MIN);
        };
        let end = data.end as u64;
        let mut guard = self.index.lock();
        if matches!(*guard, IndexState::NotLoaded) {
            *guard = IndexState::Loaded(self.load_index(&data, end));
        }
        let IndexState::Loaded(entries) = &*guard else {
            unreachable!("loaded just above");
        };
        let i = entries.partition_point(|e| e.max_ts_before < ts);
        if i <= 1 {
            return (start, i64::MIN);
        }
        let e = entries[i - 1];
        let hint = (
            u64::from(e.position),
            self.base_offset + u64::from(e.rel_offset),
        );
        drop(guard);
        // A hint is a cache entry, as for `locate`: one that does not name
        // the batch of its offset (a damaged or foreign index file) gives
        // way to a walk from the start rather than a corruption error or a
        // wrong answer for intact data.
        let names_its_batch = hint.0 < end
            && batch::parse_header(data.from(hint.0)).is_ok_and(|h| h.base_offset.get() == hint.1);
        if names_its_batch {
            (hint, e.max_ts_before)
        } else {
            (start, i64::MIN)
        }
    }
}

/// What identifies an index file's bytes: their length (high 32 bits;
/// an index file holds a few bytes per 4 KiB of a segment of at most
/// 4 GiB) and CRC-32 (low 32 bits).
pub(super) fn index_fingerprint(buf: &[u8]) -> u64 {
    ((buf.len() as u64 & 0x7fff_ffff) << 32) | u64::from(crc32fast::hash(buf))
}

/// `Segment::index_durable` when nothing is known: no fingerprint has its
/// top bit set.
pub(super) const INDEX_UNKNOWN: u64 = u64::MAX;

/// The bytes of an index file holding `entries`.
pub(super) fn encode_index_file(base_offset: u64, entries: &[IndexEntry]) -> Vec<u8> {
    format_index::encode_index_file(base_offset, entries)
}

/// Walks batch headers from `(pos, offset)` to the batch holding `target`.
pub(super) fn walk_to(
    data: &CommittedBytes,
    start: (u64, u64),
    end: u64,
    target: u64,
) -> Option<u64> {
    let (mut pos, mut next) = start;
    while pos < end {
        let h = batch::parse_header(data.from(pos)).ok()?;
        if h.base_offset.get() != next {
            return None;
        }
        let count = batch_span(&h);
        if target < next + count {
            return Some(pos);
        }
        next += count;
        pos += u64::from(h.batch_len.get());
    }
    None
}

/// Whether the batch headers from `start` (position, its offset) chain to
/// exactly `end` (position) at `end_offset`, each naming the offset that
/// follows the one before.
pub(super) fn headers_reach(
    data: &CommittedBytes,
    start: (u64, u64),
    end: u64,
    end_offset: u64,
) -> bool {
    let (mut pos, mut next) = start;
    while pos < end {
        let Ok(h) = batch::parse_header(data.from(pos)) else {
            return false;
        };
        if h.base_offset.get() != next || h.batch_len.get() == 0 {
            return false;
        }
        next += batch_span(&h);
        pos += u64::from(h.batch_len.get());
    }
    pos == end && next == end_offset
}

/// Offsets a batch spans (records, or lost offsets for a hole batch).
pub fn batch_span(h: &BatchHeader) -> u64 {
    u64::from(h.record_count.get())
}

/// Rebuilds index entries by walking (already validated) batch headers.
pub(crate) fn rebuild_index(
    data: &CommittedBytes,
    base: u64,
    end: u64,
    interval: u64,
) -> Vec<IndexEntry> {
    let mut out = Vec::new();
    let mut pos = SEGMENT_HEADER_LEN as u64;
    let mut last_indexed: Option<u64> = None;
    let mut max_ts = i64::MIN;
    while pos < end {
        let Ok(h) = batch::parse_header(data.from(pos)) else {
            break;
        };
        if last_indexed.is_none_or(|l| pos - l >= interval) {
            out.push(IndexEntry {
                rel_offset: (h.base_offset.get() - base) as u32,
                position: pos as u32,
                max_ts_before: max_ts,
            });
            last_indexed = Some(pos);
        }
        max_ts = max_ts.max(h.max_ts.get());
        pos += u64::from(h.batch_len.get());
    }
    out
}
