//! One memory-mapped segment file.
//!
//! # Why the mapping is sound
//!
//! A segment is mapped once, shared and at its full preallocated size, and
//! the mapping lives as long as the `Arc<Segment>` that owns it. Three rules
//! keep every access in bounds and race-free:
//!
//! 1. Exclusivity: the log directory is held with an exclusive `flock` for
//!    the life of the `Log`, so no other fissionlog process writes or
//!    truncates these files. (A foreign process truncating them is outside
//!    what any mmap-based engine can defend against; see docs/FORMAT.md.)
//! 2. Append-only: bytes below `committed_pos` are never written again. The
//!    single writer (serialized by the partition's writer lock and the
//!    `&mut SegmentWriter` borrow) only stores above it, then publishes the
//!    new end with a Release store; readers Acquire it and only form slices
//!    below it. The header (bytes below 64) is never exposed to readers.
//! 3. No shrinking: the file is never truncated below its mapped length
//!    while mapped. Torn tails are cleared with `FALLOC_FL_PUNCH_HOLE`
//!    (which keeps the size; holes read as zeros), and retention unlinks
//!    files, which keeps the inode (and the mapping) alive until the last
//!    `Arc` drops.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use memmap2::MmapRaw;
use parking_lot::Mutex;

use crate::error::{Error, IoContext, Result};
use crate::format::batch::{self, BatchHeader, RecordIn};
use crate::format::index::{self, IndexEntry};
use crate::format::segment::{self, SegmentInfo, SEGMENT_HEADER_LEN};
use crate::storage::fault::{IoHook, IoOp};
use crate::storage::prefault;

/// File name of the segment starting at `base_offset`.
pub fn segment_file_name(base_offset: u64) -> String {
    format!("{base_offset:020}.seg")
}

/// File name of the index of the segment starting at `base_offset`.
pub fn index_file_name(base_offset: u64) -> String {
    format!("{base_offset:020}.idx")
}

/// Parses a segment file name back into its base offset.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".seg")?;
    (stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit())).then(|| stem.parse().ok())?
}

/// The in-memory sparse index of a segment.
#[derive(Debug, Default)]
pub(crate) enum IndexState {
    /// Not read from disk yet (sealed segments load lazily).
    #[default]
    NotLoaded,
    /// Entries in position order.
    Loaded(Vec<IndexEntry>),
}

/// One segment file and its mapping.
#[derive(Debug)]
pub struct Segment {
    path: PathBuf,
    index_path: PathBuf,
    file: File,
    map: MmapRaw,
    /// Mapped (and preallocated) length in bytes.
    capacity: u64,
    /// Offset of the first record.
    pub base_offset: u64,
    /// End of valid data in bytes (Release by the writer, Acquire by readers).
    committed_pos: AtomicU64,
    /// Offset after the last record.
    end_offset: AtomicU64,
    /// Newest record timestamp seen (for retention by age).
    max_timestamp: AtomicI64,
    /// Bytes up to here are known to be on disk.
    synced_pos: AtomicU64,
    /// Rolled: takes no more appends.
    sealed: AtomicBool,
    /// The seal in the header has been synced (a sync round must flush the
    /// header of a segment sealed since the last round, or a power loss can
    /// leave a durable, fully synced segment without its seal).
    seal_synced: AtomicBool,
    pub(crate) index: Mutex<IndexState>,
}

/// Reads the whole file at `path` if it exists.
pub(crate) fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

impl Segment {
    /// Creates, preallocates and maps a new segment file.
    pub fn create(
        dir: &Path,
        ids: (u32, u32),
        base_offset: u64,
        capacity: u64,
        now_ms: i64,
        hook: &dyn IoHook,
    ) -> Result<Segment> {
        let path = dir.join(segment_file_name(base_offset));
        hook.before(IoOp::CreateSegment, &path).at(&path)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .at(&path)?;
        if let Err(e) = preallocate(&file, capacity) {
            drop(file);
            let _ = std::fs::remove_file(&path);
            return Err(Error::io(&path, e));
        }
        let header = segment::encode_header(ids.0, ids.1, base_offset, now_ms);
        file.write_all_at(&header, 0).at(&path)?;
        let seg = Segment::map(path, file, capacity, base_offset, true)?;
        seg.committed_pos
            .store(SEGMENT_HEADER_LEN as u64, Ordering::Release);
        seg.end_offset.store(base_offset, Ordering::Release);
        *seg.index.lock() = IndexState::Loaded(Vec::new());
        Ok(seg)
    }

    /// Creates a small sealed segment holding one hole batch for the lost
    /// offsets `[first, end)` (salvage across a missing segment).
    pub(crate) fn create_hole(
        dir: &Path,
        ids: (u32, u32),
        first: u64,
        end: u64,
        hook: &dyn IoHook,
    ) -> Result<Segment> {
        let path = dir.join(segment_file_name(first));
        let lost = u32::try_from(end - first).map_err(|_| {
            Error::corruption(&path, 0, "a salvage hole spans more than 2^32 offsets")
        })?;
        let mut seg = Segment::create(dir, ids, first, crate::config::MIN_SEGMENT_BYTES, 0, hook)?;
        let hole_end = (SEGMENT_HEADER_LEN + batch::BATCH_HEADER_LEN) as u64;
        seg.write_hole(
            SEGMENT_HEADER_LEN as u64,
            hole_end - SEGMENT_HEADER_LEN as u64,
            first,
            u64::from(lost),
        )?;
        seg.write_seal(end, hole_end);
        seg.sync_data(hook)?;
        crate::storage::sync_dir(hook, IoOp::SyncRecoveryDir, dir)?;
        seg.set_recovered_end(hole_end, end, hole_end, true);
        Ok(seg)
    }

    /// Opens and maps an existing segment file, validating its header. The
    /// returned segment has no data until [`Segment::set_recovered_end`].
    pub fn open(path: &Path) -> Result<(Segment, SegmentInfo)> {
        Segment::open_with(path, true, &crate::storage::fault::NoFaults)
    }

    /// Like [`Segment::open`]; `writable: false` maps read-only (`verify`).
    /// The open goes through `hook` as [`IoOp::OpenSegment`], the mapping
    /// as [`IoOp::MapSegment`].
    pub fn open_with(
        path: &Path,
        writable: bool,
        hook: &dyn IoHook,
    ) -> Result<(Segment, SegmentInfo)> {
        hook.before(IoOp::OpenSegment, path).at(path)?;
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .at(path)?;
        let len = file.metadata().at(path)?.len();
        let mut head = [0u8; SEGMENT_HEADER_LEN];
        let got = read_prefix(&file, &mut head).at(path)?;
        let info = segment::decode_header(&head[..got]).map_err(|e| match e {
            // A newer format is not damage: refuse it in every mode.
            segment::HeaderError::Version(found) => Error::UnsupportedVersion {
                file: path.to_path_buf(),
                found,
                supported: segment::SEGMENT_VERSION,
            },
            e => Error::corruption(path, 0, e.to_string()),
        })?;
        hook.before(IoOp::MapSegment, path).at(path)?;
        let seg = Segment::map(path.to_path_buf(), file, len, info.base_offset, writable)?;
        seg.committed_pos
            .store(SEGMENT_HEADER_LEN as u64, Ordering::Release);
        seg.end_offset.store(info.base_offset, Ordering::Release);
        Ok((seg, info))
    }

    fn map(
        path: PathBuf,
        file: File,
        capacity: u64,
        base_offset: u64,
        writable: bool,
    ) -> Result<Segment> {
        if capacity < SEGMENT_HEADER_LEN as u64 || capacity > crate::config::MAX_SEGMENT_BYTES {
            return Err(Error::corruption(
                &path,
                0,
                format!("segment file size {capacity} is out of range"),
            ));
        }
        let map = if writable {
            MmapRaw::map_raw(&file)
        } else {
            memmap2::MmapOptions::new().map_raw_read_only(&file)
        }
        .at(&path)?;
        let index_path = path.with_extension("idx");
        Ok(Segment {
            path,
            index_path,
            file,
            map,
            capacity,
            base_offset,
            committed_pos: AtomicU64::new(SEGMENT_HEADER_LEN as u64),
            end_offset: AtomicU64::new(base_offset),
            max_timestamp: AtomicI64::new(i64::MIN),
            synced_pos: AtomicU64::new(SEGMENT_HEADER_LEN as u64),
            sealed: AtomicBool::new(false),
            seal_synced: AtomicBool::new(false),
            index: Mutex::new(IndexState::NotLoaded),
        })
    }

    /// Path of the segment file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Path of its index file.
    pub fn index_path(&self) -> &Path {
        &self.index_path
    }

    /// Mapped length.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// End of valid data in bytes.
    pub fn committed_pos(&self) -> u64 {
        self.committed_pos.load(Ordering::Acquire)
    }

    /// Offset after the last record.
    pub fn end_offset(&self) -> u64 {
        self.end_offset.load(Ordering::Acquire)
    }

    /// Newest record timestamp, `i64::MIN` when empty. Computed on first use
    /// for segments recovered without a scan (from the last index entry on).
    pub fn max_timestamp(&self) -> i64 {
        let known = self.max_timestamp.load(Ordering::Acquire);
        if known != i64::MIN || self.end_offset() == self.base_offset {
            return known;
        }
        let (mut pos, _) = self.time_hint(i64::MAX);
        let data = self.committed();
        let end = self.committed_pos();
        let mut max = i64::MIN;
        while pos < end {
            let Ok(h) = batch::parse_header(data.from(pos)) else {
                break;
            };
            if !batch::is_hole(&h) {
                max = max.max(h.max_ts.get());
            }
            pos += u64::from(h.batch_len.get());
        }
        self.max_timestamp.fetch_max(max, Ordering::AcqRel);
        max
    }

    /// Whether the segment was rolled.
    pub fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }

    /// Bytes known to be durable.
    pub fn synced_pos(&self) -> u64 {
        self.synced_pos.load(Ordering::Acquire)
    }

    pub(crate) fn set_synced_pos(&self, pos: u64) {
        self.synced_pos.fetch_max(pos, Ordering::AcqRel);
    }

    /// Whether the segment is sealed but its header seal not yet synced.
    pub(crate) fn needs_seal_sync(&self) -> bool {
        self.is_sealed() && !self.seal_synced.load(Ordering::Acquire)
    }

    /// Records that a sync covered the header seal.
    pub(crate) fn set_seal_synced(&self) {
        self.seal_synced.store(true, Ordering::Release);
    }

    /// Seals a segment that recovery found followed by another one but
    /// without a (valid) seal in its header: a crash kept the next segment
    /// but lost the header page holding the seal. Without this, a later
    /// checkpoint naming the next segment would make this one "durable" and
    /// unsealed, and its trailing zeros would read as corruption.
    pub(crate) fn seal_recovered(&mut self) {
        if !self.is_sealed() {
            self.write_seal(self.end_offset(), self.committed_pos());
        }
    }

    /// Sets the data end found by recovery (before the segment is shared).
    pub(crate) fn set_recovered_end(&self, pos: u64, end_offset: u64, synced: u64, sealed: bool) {
        debug_assert!(pos <= self.capacity);
        self.committed_pos.store(pos, Ordering::Release);
        self.end_offset.store(end_offset, Ordering::Release);
        self.synced_pos.store(synced.min(pos), Ordering::Release);
        self.sealed.store(sealed, Ordering::Release);
        // A seal read from disk is taken as already durable.
        self.seal_synced.store(sealed, Ordering::Release);
    }

    /// The whole mapped file, header included, for recovery before the
    /// segment is shared with readers or the writer.
    pub(crate) fn raw_for_recovery(&mut self) -> &[u8] {
        // SAFETY: `&mut self` proves no reader or writer shares the segment
        // yet; the mapping is `capacity` bytes long and lives as long as self.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.capacity as usize) }
    }

    /// Committed data bytes `[SEGMENT_HEADER_LEN, committed_pos)`, indexed
    /// from the start of the file (the header part reads as an empty gap:
    /// callers index with file positions >= `SEGMENT_HEADER_LEN`).
    pub fn committed(&self) -> Committed<'_> {
        let end = self.committed_pos() as usize;
        // SAFETY: see the module comment: bytes in [SEGMENT_HEADER_LEN, end)
        // were published by the writer's Release store and are never written
        // again; the mapping outlives the borrow of self.
        let data = unsafe {
            std::slice::from_raw_parts(
                self.map.as_ptr().add(SEGMENT_HEADER_LEN),
                end - SEGMENT_HEADER_LEN,
            )
        };
        Committed { data }
    }

    /// fdatasync of a segment created outside a sync round.
    pub fn sync_data(&self, hook: &dyn IoHook) -> Result<()> {
        crate::storage::sync_file(hook, IoOp::SyncNewSegment, &self.file, &self.path, true)
    }

    /// Raw fd for batched syncs.
    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// Zeroes `[from, capacity)` so stale bytes past a recovered end can never
    /// validate again (a torn tail must not be resurrected), without shrinking.
    pub(crate) fn clear_tail(&mut self, from: u64) -> Result<()> {
        let page = 4096u64;
        let aligned = from.div_ceil(page) * page;
        let partial = aligned.min(self.capacity) - from;
        if partial > 0 {
            self.file
                .write_all_at(&vec![0u8; partial as usize], from)
                .at(&self.path)?;
        }
        if aligned < self.capacity {
            let len = (self.capacity - aligned) as libc::off_t;
            // SAFETY: plain syscall on an fd we own; no memory is passed.
            let rc = unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    aligned as libc::off_t,
                    len,
                )
            };
            if rc != 0 {
                // No hole punching on this filesystem: write zeros instead.
                let zeros = vec![0u8; 1 << 20];
                let mut pos = aligned;
                while pos < self.capacity {
                    let n = (self.capacity - pos).min(zeros.len() as u64) as usize;
                    self.file.write_all_at(&zeros[..n], pos).at(&self.path)?;
                    pos += n as u64;
                }
            }
        }
        Ok(())
    }

    /// Populates `[start, start + len)` of the mapping into the page cache
    /// (clean, read-only) so the writer's first store there is cheap. Best
    /// effort: errors (old kernels) are ignored.
    pub(crate) fn populate(&self, start: u64, len: u64) {
        let end = (start + len).min(self.capacity);
        if start >= end {
            return;
        }
        // SAFETY: the range is inside the mapping (clamped), which lives as long
        // as `self`; MADV_POPULATE_READ only faults pages in, never changing bytes.
        unsafe {
            libc::madvise(
                self.map.as_mut_ptr().add(start as usize).cast(),
                (end - start) as usize,
                libc::MADV_POPULATE_READ,
            );
        }
    }

    /// Replaces damaged bytes with a hole batch (salvage).
    pub(crate) fn write_hole(
        &mut self,
        pos: u64,
        len: u64,
        first_offset: u64,
        lost: u64,
    ) -> Result<()> {
        let lost = u32::try_from(lost)
            .map_err(|_| Error::corruption(&self.path, pos, "hole spans too many offsets"))?;
        let mut buf = vec![0u8; len as usize];
        batch::encode_hole(&mut buf, first_offset, lost);
        self.file.write_all_at(&buf, pos).at(&self.path)
    }

    /// Writes the seal (end offset and position) into the header.
    fn write_seal(&self, end_offset: u64, end_pos: u64) {
        let seal = segment::encode_seal(end_offset, end_pos);
        // SAFETY: bytes [SEAL_POS, SEAL_POS+20) lie in the header, which no
        // reader ever forms a slice over; the writer is exclusive (`&mut
        // SegmentWriter`), and the mapping is at least 64 bytes long.
        unsafe {
            std::ptr::copy_nonoverlapping(
                seal.as_ptr(),
                self.map.as_mut_ptr().add(segment::SEAL_POS),
                seal.len(),
            );
        }
        self.sealed.store(true, Ordering::Release);
    }

    /// Writes the in-memory index to the index file (not synced: it is a cache).
    pub(crate) fn write_index_file(&self) -> Result<()> {
        let guard = self.index.lock();
        let IndexState::Loaded(entries) = &*guard else {
            return Ok(());
        };
        let mut buf =
            Vec::with_capacity(index::INDEX_HEADER_LEN + entries.len() * index::INDEX_ENTRY_LEN);
        buf.extend_from_slice(&index::encode_index_header(self.base_offset));
        for e in entries {
            buf.extend_from_slice(&index::encode_entry(e));
        }
        drop(guard);
        let tmp = self.index_path.with_extension("idx.tmp");
        std::fs::write(&tmp, &buf).at(&tmp)?;
        std::fs::rename(&tmp, &self.index_path).at(&self.index_path)
    }

    /// Finds the file position of the batch holding `offset` (which must be
    /// in `[base_offset, end_offset)`), using the sparse index as a hint.
    pub(crate) fn locate(&self, offset: u64) -> Result<u64> {
        let data = self.committed();
        let end = self.committed_pos();
        let hint = self.index_hint(offset, end);
        match walk_to(&data, hint, end, offset) {
            Some(pos) => Ok(pos),
            // The hint was wrong (a damaged cache): walk from the start.
            None => walk_to(
                &data,
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
            }),
        }
    }

    /// Best index entry at or before `offset`: (position, its offset).
    fn index_hint(&self, offset: u64, end: u64) -> (u64, u64) {
        let mut guard = self.index.lock();
        if matches!(*guard, IndexState::NotLoaded) {
            *guard = IndexState::Loaded(self.load_index(end));
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

    /// Reads the index file, falling back to rebuilding from the data.
    fn load_index(&self, end: u64) -> Vec<IndexEntry> {
        if let Ok(Some(buf)) = read_optional(&self.index_path) {
            let (entries, whole) =
                index::decode_index(&buf, self.base_offset, end, self.end_offset());
            if whole {
                return entries;
            }
        }
        rebuild_index(&self.committed(), self.base_offset, end, 4096)
    }

    /// Index entries for the time lookup: first position whose batch may hold
    /// a record with timestamp >= `ts`.
    pub(crate) fn time_hint(&self, ts: i64) -> (u64, u64) {
        let end = self.committed_pos();
        let mut guard = self.index.lock();
        if matches!(*guard, IndexState::NotLoaded) {
            *guard = IndexState::Loaded(self.load_index(end));
        }
        let IndexState::Loaded(entries) = &*guard else {
            unreachable!("loaded just above");
        };
        let i = entries.partition_point(|e| e.max_ts_before < ts);
        if i <= 1 {
            (SEGMENT_HEADER_LEN as u64, self.base_offset)
        } else {
            let e = entries[i - 1];
            (
                u64::from(e.position),
                self.base_offset + u64::from(e.rel_offset),
            )
        }
    }
}

fn read_prefix(file: &File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

fn preallocate(file: &File, len: u64) -> std::io::Result<()> {
    // SAFETY: plain syscall on an fd we own; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
        // Filesystems without fallocate get a sparse file.
        return file.set_len(len);
    }
    Err(err)
}

/// Committed bytes of a segment, addressed by file position.
#[derive(Debug, Clone, Copy)]
pub struct Committed<'a> {
    data: &'a [u8],
}

impl<'a> Committed<'a> {
    /// Bytes from file position `pos` to the committed end.
    pub fn from(&self, pos: u64) -> &'a [u8] {
        let start = (pos as usize)
            .saturating_sub(SEGMENT_HEADER_LEN)
            .min(self.data.len());
        &self.data[start..]
    }

    /// Bytes of file positions `[start, end)`.
    pub fn range(&self, start: u64, end: u64) -> &'a [u8] {
        let s = start as usize - SEGMENT_HEADER_LEN;
        let e = end as usize - SEGMENT_HEADER_LEN;
        &self.data[s..e]
    }
}

/// Walks batch headers from `(pos, offset)` to the batch holding `target`.
fn walk_to(data: &Committed<'_>, start: (u64, u64), end: u64, target: u64) -> Option<u64> {
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

/// Offsets a batch spans (records, or lost offsets for a hole batch).
pub fn batch_span(h: &BatchHeader) -> u64 {
    u64::from(h.record_count.get())
}

/// Rebuilds index entries by walking (already validated) batch headers.
pub(crate) fn rebuild_index(
    data: &Committed<'_>,
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

/// The one handle allowed to write into a segment.
#[derive(Debug)]
pub struct SegmentWriter {
    segment: std::sync::Arc<Segment>,
    write_pos: u64,
    next_offset: u64,
    last_indexed_pos: Option<u64>,
    max_ts: i64,
    index_interval: u64,
    /// Pages below this were handed to the prefault thread.
    prefault_until: u64,
}

impl SegmentWriter {
    /// Takes the writing role for `segment` (its recovered end).
    pub fn new(segment: std::sync::Arc<Segment>, index_interval: u64) -> SegmentWriter {
        let last_indexed_pos = match &*segment.index.lock() {
            IndexState::Loaded(e) => e.last().map(|e| u64::from(e.position)),
            IndexState::NotLoaded => None,
        };
        SegmentWriter {
            write_pos: segment.committed_pos(),
            next_offset: segment.end_offset(),
            max_ts: segment.max_timestamp(),
            prefault_until: segment.committed_pos() & !4095,
            segment,
            last_indexed_pos,
            index_interval,
        }
    }

    /// Keeps pages populated a few MiB ahead of the write position.
    fn prefault_ahead(&mut self) {
        let capacity = self.segment.capacity;
        while self.prefault_until < capacity
            && self.write_pos + prefault::PREFAULT_AHEAD > self.prefault_until
        {
            let len = prefault::PREFAULT_CHUNK.min(capacity - self.prefault_until);
            prefault::request(self.segment.clone(), self.prefault_until, len);
            self.prefault_until += len;
        }
    }

    /// The segment being written.
    pub fn segment(&self) -> &std::sync::Arc<Segment> {
        &self.segment
    }

    /// Bytes still free.
    pub fn remaining(&self) -> u64 {
        self.segment.capacity - self.write_pos
    }

    /// Offset the next record gets.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Encodes `records` at the end and publishes them. The caller checked
    /// that `len == batch_len(records) <= remaining()`.
    pub fn append(&mut self, records: &[RecordIn<'_>], len: usize) -> BatchHeader {
        assert!(
            len as u64 <= self.remaining(),
            "caller rolls before a batch that does not fit"
        );
        let pos = self.write_pos;
        // SAFETY: [pos, pos+len) lies inside the mapping (checked above) and
        // above `committed_pos`, so no reader forms a slice over it; `&mut
        // self` makes this the only writer of the segment.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(self.segment.map.as_mut_ptr().add(pos as usize), len)
        };
        let header = batch::encode_batch(dst, self.next_offset, records);
        debug_assert!(
            batch::validate(dst, Some(self.next_offset)).is_ok(),
            "a batch just written validates"
        );
        if self
            .last_indexed_pos
            .is_none_or(|l| pos - l >= self.index_interval)
        {
            if let IndexState::Loaded(entries) = &mut *self.segment.index.lock() {
                entries.push(IndexEntry {
                    rel_offset: (self.next_offset - self.segment.base_offset) as u32,
                    position: pos as u32,
                    max_ts_before: self.max_ts,
                });
            }
            self.last_indexed_pos = Some(pos);
        }
        self.write_pos += len as u64;
        self.next_offset += records.len() as u64;
        self.max_ts = self.max_ts.max(header.max_ts.get());
        self.segment
            .max_timestamp
            .store(self.max_ts, Ordering::Release);
        self.segment
            .committed_pos
            .store(self.write_pos, Ordering::Release);
        self.segment
            .end_offset
            .store(self.next_offset, Ordering::Release);
        if self.write_pos + prefault::PREFAULT_AHEAD > self.prefault_until {
            self.prefault_ahead();
        }
        header
    }

    /// Seals the segment (header seal + index file); it takes no more appends.
    pub fn seal(&self) -> Result<()> {
        self.segment.write_seal(self.next_offset, self.write_pos);
        self.segment.write_index_file()
    }
}
