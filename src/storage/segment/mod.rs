//! One memory-mapped segment file.
//!
//! This file is over the crate's ~800-line limit on purpose: it is the one
//! home of `impl Segment` (about 770 lines), and every method in it keeps one
//! of the mapping rules below (what is mapped, allocated, published or
//! trimmed). Spreading the impl over several files would put the soundness
//! argument away from most of the code it constrains. What does not touch
//! the mapping already lives beside it: allocation steps (`alloc.rs`), the
//! sparse index (`index.rs`), the segment list (`list.rs`) and the writer
//! (`writer.rs`).
//!
//! # Why the mapping is sound
//!
//! A segment is mapped once, shared, and the mapping lives as long as the
//! `Arc<Segment>` that owns it. The active segment is mapped at the full
//! segment size while its file grows in bounded chunks ahead of the writer
//! (see "Allocation" below), so the mapping may extend past the end of the
//! file; touching a page wholly past EOF raises SIGBUS. These rules keep
//! every access in bounds, below EOF and race-free:
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
//! 3. Stores stay below `allocated`: every byte below it is allocated on
//!    disk (`fallocate`, or written zeros where the filesystem has no
//!    `fallocate`) and below the end of the file, and it is published only
//!    after that holds. The file's length may run ahead of `allocated` (an
//!    active segment's file is as long as the segment can grow, sparse past
//!    what is allocated), never behind it. [`SegmentWriter::reserve`]
//!    allocates before the writer stores past `allocated`, and the store
//!    path asserts it. Large batches are not stored through the mapping but
//!    written with `pwrite`, which allocates what it writes; `allocated` is
//!    raised only after the write returned, and the batch is published
//!    after that. `committed_pos <= allocated <= file length` always holds,
//!    so readers stay below EOF too.
//! 4. The file shrinks only in two places. [`Segment::trim`] truncates a
//!    segment that takes no more appends (rolled, or its partition sealed)
//!    to exactly `committed_pos`. That is sound because no reader ever forms
//!    a slice past `committed_pos`, `committed_pos` of a shared segment
//!    never decreases, no store happens there any more, and the page that
//!    holds the new EOF stays accessible as a whole (its bytes past EOF read
//!    as zeros). Recovery may truncate before the segment is shared (`&mut
//!    self`). Torn tails are cleared without shrinking the file, and
//!    retention unlinks files, which keeps the inode (and the mapping) alive
//!    until the last `Arc` drops.
//!
//! # Allocation
//!
//! A store into a page of the mapping that has no disk block behind it
//! allocates inside the page fault, and a full disk then kills the process
//! with SIGBUS. So the writer never stores into unallocated space: a new
//! segment's file has its header and [`ALLOC_CHUNK_MIN_BYTES`] allocated;
//! the writer allocates ahead of itself in steps that double with the data
//! written (up to [`ALLOC_CHUNK_MAX_BYTES`]), so at most
//! [`crate::config::ACTIVE_HEADROOM_MAX_BYTES`] are allocated and unwritten
//! per active partition, and a full disk is `Error::NoSpace` from the
//! append that needed the space, with nothing changed.
//!
//! The file's *length* is set to the segment's full size when the segment
//! is created (or readied for appends after recovery), sparse past what is
//! allocated. Growing the length in chunks instead kept the kernel from
//! mapping whole large folios on a write fault: the writer took a fault on
//! nearly every 4 KiB page (30 times as many, measured in
//! docs/PERFORMANCE.md). Since the length says nothing about allocation,
//! `allocated` lives in memory only: an opened active segment counts as
//! allocated only up to its data (rounded to a page), and recovery punches
//! out a torn tail (it reads as zeros, and is allocated again before the
//! writer stores there). A segment that takes no more appends is truncated
//! to its data.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::config::{ALLOC_CHUNK_MAX_BYTES, ALLOC_CHUNK_MIN_BYTES};
use crate::error::{Error, IoContext, Result};
use crate::format::batch::{self, BatchHeader, RecordIn};
use crate::format::index::{self as format_index, IndexEntry};
use crate::format::segment::{self, HeaderInfo, SEGMENT_HEADER_LEN};
use crate::storage::budget::{Budget, Mapping, Resident};
use crate::storage::durability::SyncTarget;
use crate::storage::fault::{IoHook, IoOp, NoFaults};
use crate::storage::file::{create_scratch, open_file, read_optional, Access};

mod alloc;
mod index;
mod list;
mod writer;

use alloc::*;
pub(crate) use index::rebuild_index;
use index::*;
pub(crate) use list::Segments;
pub use writer::SegmentWriter;

/// How a segment file is opened: read-only for `verify` and analyses.
fn access(writable: bool) -> Access {
    if writable {
        Access::ReadWrite
    } else {
        Access::Read
    }
}

/// File name of the segment starting at `base_offset`.
pub fn segment_file_name(base_offset: u64) -> String {
    format!("{base_offset:020}.seg")
}

/// Extension of the scratch file a hole segment is written under before it
/// is renamed to its segment name (`<base>.seg.tmp`): a leftover of an
/// interrupted repair, which the next one replaces.
pub(crate) const SCRATCH_EXTENSION: &str = "seg.tmp";

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
    /// Its open file and its mapping (see `storage/budget.rs`). The file
    /// is closed once the segment takes no more appends and is fully
    /// synced (a mapping stays valid after its descriptor is closed), or
    /// earlier by the budget; the mapping of such a segment is given back
    /// by the budget and mapped again by the next read.
    res: Arc<Resident>,
    /// Mapped length in bytes: the most data the segment can hold.
    capacity: u64,
    /// Every byte below it is allocated on disk and inside the file (see
    /// the module comment). Grows ahead of the writer.
    allocated: AtomicU64,
    /// Length of the file (at least `allocated`; sparse past it).
    file_len: AtomicU64,
    /// Mapped writable.
    writable: bool,
    /// The log's I/O hook, attached when a partition takes the segment.
    hook: OnceLock<Arc<dyn IoHook>>,
    /// Bytes of data between two index entries when a read rebuilds the
    /// index: its topic's `index_interval_bytes`, set when a partition
    /// takes the segment (the default interval until then).
    index_interval: AtomicU64,
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
    /// The last segment of a sealed partition: takes no more appends
    /// either, but carries no seal in its header.
    frozen: AtomicBool,
    /// The seal in the header has been synced (a sync round must flush the
    /// header of a segment sealed since the last round, or a power loss can
    /// leave a durable, fully synced segment without its seal).
    seal_synced: AtomicBool,
    /// The header on disk is known to carry no seal (read so at open, or
    /// written so): recovery need not map the file to look for a stale
    /// one.
    unsealed_head: AtomicBool,
    pub(crate) index: Mutex<IndexState>,
    /// Length and CRC-32 of the index file's bytes when they are known to
    /// be durably on disk (written and synced, or read at an open after a
    /// clean shutdown, which made them durable): a clean close rewrites
    /// the file only when the index changed since. [`INDEX_UNKNOWN`] when
    /// unknown.
    index_durable: AtomicU64,
}

/// A segment file's length must hold a header and stay within the
/// largest segment.
fn check_file_len(path: &Path, file_len: u64) -> Result<()> {
    if file_len < SEGMENT_HEADER_LEN as u64 || file_len > crate::config::MAX_SEGMENT_BYTES {
        return Err(Error::corruption(
            path,
            0,
            format!("segment file size {file_len} is out of range"),
        ));
    }
    Ok(())
}

/// The longest index of a segment of `segment_bytes`: an entry per batch
/// at most, and every batch is longer than an entry. A longer file is
/// damage, refused before it is read whole (a sparse file of gigabytes
/// would otherwise be allocated).
fn index_max_bytes(segment_bytes: u64) -> u64 {
    let entries = segment_bytes / batch::BATCH_HEADER_LEN as u64 + 1;
    (format_index::INDEX_HEADER_LEN + format_index::INDEX_TRAILER_LEN) as u64
        + entries * format_index::INDEX_ENTRY_LEN as u64
}

impl Segment {
    /// Creates a new segment file with its first chunk allocated and maps it
    /// at `capacity`. On any failure the file is removed again, so a retry
    /// (the next roll) starts from the same state.
    #[cfg(test)]
    pub fn create(
        dir: &Path,
        ids: (u32, u32),
        base_offset: u64,
        capacity: u64,
        now_ms: i64,
        hook: &dyn IoHook,
    ) -> Result<Segment> {
        let v1 = segment::SEGMENT_VERSION_V1;
        Segment::create_version(dir, ids, base_offset, capacity, (now_ms, v1), hook)
    }

    /// [`Segment::create`] of a segment of header `version` (2: a
    /// replicated partition's, holding batch format 2).
    pub fn create_version(
        dir: &Path,
        ids: (u32, u32),
        base_offset: u64,
        capacity: u64,
        (now_ms, version): (i64, u16),
        hook: &dyn IoHook,
    ) -> Result<Segment> {
        let path = dir.join(segment_file_name(base_offset));
        hook.before(IoOp::CreateSegment, &path).at(&path)?;
        let file = open_file(&path, Access::CreateNew)?;
        let initial = page_up(SEGMENT_HEADER_LEN as u64 + ALLOC_CHUNK_MIN_BYTES).min(capacity);
        let built = (|| {
            hook.before(IoOp::AllocateSegment, &path).at(&path)?;
            allocate_range(&file, 0, initial).at(&path)?;
            let header = segment::encode_header_version(version, ids.0, ids.1, base_offset, now_ms);
            file.write_all_at(&header, 0).at(&path)?;
            // The full length, sparse past the allocated chunk (see the
            // module comment: whole large folios on write faults).
            file.set_len(capacity).at(&path)?;
            hook.before(IoOp::MapSegment, &path).at(&path)?;
            Segment::map(
                path.clone(),
                file,
                capacity,
                (capacity, initial),
                base_offset,
                true,
            )
        })();
        let seg = match built {
            Ok(seg) => seg,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        seg.committed_pos
            .store(SEGMENT_HEADER_LEN as u64, Ordering::Release);
        // Nothing of the new file is durable yet, not even its header and
        // allocated length: the next sync round (or `sync_data`) fdatasyncs
        // it even before records follow. Counting the header as synced let
        // a round fsync the directory naming a rolled segment, and the next
        // checkpoint point into it, while the file itself could come back
        // empty after a power loss ("file shorter than a segment header").
        seg.synced_pos.store(0, Ordering::Release);
        seg.end_offset.store(base_offset, Ordering::Release);
        seg.unsealed_head.store(true, Ordering::Release);
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
        // The whole file (header, seal, one hole batch) is written and
        // synced under a scratch name, then renamed into place: a kill or
        // a power loss at any step leaves the name as it was or holding
        // the finished hole. Created in place, an interrupted creation left
        // a segment with a valid header and zeros where a batch belongs,
        // which the next open takes for corruption in synced data (and
        // Truncate and Salvage cut the chain there, losing what follows).
        let hole_end = (SEGMENT_HEADER_LEN + batch::BATCH_HEADER_LEN) as u64;
        let mut bytes =
            segment::encode_header_version(segment::SEGMENT_VERSION_V1, ids.0, ids.1, first, 0)
                .to_vec();
        bytes[segment::SEAL_POS..segment::SEAL_POS + 20]
            .copy_from_slice(&segment::encode_seal(end, hole_end));
        let batch_len = batch::BATCH_HEADER_LEN as u32;
        bytes.extend_from_slice(&batch::hole_header(batch_len, first, lost));
        let tmp = path.with_extension(SCRATCH_EXTENSION);
        hook.before(IoOp::CreateSegment, &tmp).at(&tmp)?;
        let file = create_scratch(&tmp)?;
        file.write_all_at(&bytes, 0).at(&tmp)?;
        crate::storage::sync_file(hook, IoOp::SyncNewSegment, &file, &tmp, true)?;
        drop(file);
        std::fs::rename(&tmp, &path).at(&path)?;
        crate::storage::sync_dir(hook, IoOp::SyncRecoveryDir, dir)?;
        let (seg, _) = Segment::open_with(&path, true, hook)?;
        seg.set_recovered_end(hole_end, end, hole_end, true);
        *seg.index.lock() = IndexState::Loaded(Vec::new());
        Ok(seg)
    }

    /// Opens and maps an existing segment file, validating its header. The
    /// returned segment has no data until [`Segment::set_recovered_end`].
    /// `writable: false` maps read-only (`verify`). The open goes through
    /// `hook` as [`IoOp::OpenSegment`], the mapping as [`IoOp::MapSegment`].
    pub fn open_with(
        path: &Path,
        writable: bool,
        hook: &dyn IoHook,
    ) -> Result<(Segment, HeaderInfo)> {
        let (file, len, info) = Segment::open_header(path, writable, hook)?;
        let seg = Segment::from_file(path, (file, len), &info, writable, Some(hook))?;
        Ok((seg, info))
    }

    /// Opens an existing segment file and reads its header: the file, its
    /// length and the header (the open goes through `hook` as
    /// [`IoOp::OpenSegment`]). A header that does not decode is
    /// [`Error::Corruption`], a newer version [`Error::UnsupportedVersion`].
    pub(crate) fn open_header(
        path: &Path,
        writable: bool,
        hook: &dyn IoHook,
    ) -> Result<(File, u64, HeaderInfo)> {
        hook.before(IoOp::OpenSegment, path).at(path)?;
        let file = open_file(path, access(writable))?;
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
        Ok((file, len, info))
    }

    /// The segment of a file [`Segment::open_header`] opened, keeping the
    /// descriptor: mapped through `map_hook` (as [`IoOp::MapSegment`]),
    /// or, without a hook, not mapped (a read maps it,
    /// [`Segment::mapping`]): recovery opens so the segments it neither
    /// scans nor repairs, which then cost no mapping.
    pub(crate) fn from_file(
        path: &Path,
        (file, len): (File, u64),
        info: &HeaderInfo,
        writable: bool,
        map_hook: Option<&dyn IoHook>,
    ) -> Result<Segment> {
        let seg = match map_hook {
            Some(hook) => {
                hook.before(IoOp::MapSegment, path).at(path)?;
                Segment::map(
                    path.to_path_buf(),
                    file,
                    len,
                    (len, len),
                    info.base_offset,
                    writable,
                )?
            }
            None => {
                check_file_len(path, len)?;
                Segment::assemble(
                    path.to_path_buf(),
                    Resident::new(None, Some(Arc::new(file))),
                    len,
                    (len, len),
                    info.base_offset,
                    writable,
                )
            }
        };
        seg.committed_pos
            .store(SEGMENT_HEADER_LEN as u64, Ordering::Release);
        seg.end_offset.store(info.base_offset, Ordering::Release);
        seg.unsealed_head
            .store(info.seal.is_none(), Ordering::Release);
        Ok(seg)
    }

    /// Maps `capacity` bytes of `file`, whose length is `file_len` and
    /// whose bytes below `allocated` are allocated.
    fn map(
        path: PathBuf,
        file: File,
        capacity: u64,
        (file_len, allocated): (u64, u64),
        base_offset: u64,
        writable: bool,
    ) -> Result<Segment> {
        check_file_len(&path, file_len)?;
        debug_assert!(allocated <= file_len);
        // An `Error::Io`: recovery makes it `OpenFailed`, a roll
        // `ResourceExhausted`.
        let map = map_file(&file, capacity, writable).at(&path)?;
        let res = Resident::new(Some(Arc::new(Mapping::new(map))), Some(Arc::new(file)));
        Ok(Segment::assemble(
            path,
            res,
            capacity,
            (file_len, allocated),
            base_offset,
            writable,
        ))
    }

    fn assemble(
        path: PathBuf,
        res: Arc<Resident>,
        capacity: u64,
        (file_len, allocated): (u64, u64),
        base_offset: u64,
        writable: bool,
    ) -> Segment {
        let index_path = path.with_extension("idx");
        Segment {
            path,
            index_path,
            res,
            capacity,
            allocated: AtomicU64::new(allocated),
            file_len: AtomicU64::new(file_len),
            writable,
            hook: OnceLock::new(),
            index_interval: AtomicU64::new(u64::from(crate::config::DEFAULT_INDEX_INTERVAL_BYTES)),
            base_offset,
            committed_pos: AtomicU64::new(SEGMENT_HEADER_LEN as u64),
            end_offset: AtomicU64::new(base_offset),
            max_timestamp: AtomicI64::new(i64::MIN),
            synced_pos: AtomicU64::new(SEGMENT_HEADER_LEN as u64),
            sealed: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            seal_synced: AtomicBool::new(false),
            unsealed_head: AtomicBool::new(false),
            index: Mutex::new(IndexState::NotLoaded),
            index_durable: AtomicU64::new(INDEX_UNKNOWN),
        }
    }

    /// Path of the segment file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Path of its index file.
    pub fn index_path(&self) -> &Path {
        &self.index_path
    }

    /// Reads its index file if it exists; one longer than any index of
    /// this segment is [`Error::Corruption`] (see [`index_max_bytes`]).
    pub(crate) fn read_index_file(&self) -> Result<Option<Vec<u8>>> {
        let cap = index_max_bytes(self.capacity.max(self.file_len()));
        read_optional(&self.index_path, cap)
    }

    /// Mapped length: the most data the segment can hold.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Every byte below it is allocated (and inside the file).
    pub fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Acquire)
    }

    /// Length of the file.
    pub(crate) fn file_len(&self) -> u64 {
        self.file_len.load(Ordering::Acquire)
    }

    /// Attaches the log's I/O hook (the partition that takes the segment
    /// does); ops of a segment without one go unobserved.
    pub(crate) fn attach_hook(&self, hook: &Arc<dyn IoHook>) {
        let _ = self.hook.set(hook.clone());
    }

    /// Sets the interval a read rebuilds the index at: the one the writer
    /// and recovery index the segment at, so that an index a clean close
    /// leaves unwritten (one entry) is rebuilt as that one entry.
    pub(crate) fn set_index_interval(&self, bytes: u64) {
        self.index_interval.store(bytes.max(1), Ordering::Relaxed);
    }

    /// See [`Segment::set_index_interval`].
    pub(super) fn index_interval(&self) -> u64 {
        self.index_interval.load(Ordering::Relaxed)
    }

    /// Puts the segment's mapping and descriptor under the log's budget
    /// (the partition that takes the segment does). The descriptor counts
    /// from now on, also while the segment takes appends; the mapping
    /// once it takes no more.
    pub(crate) fn attach_budget(&self, budget: &Arc<Budget>) {
        self.res.attach(budget);
        if self.writable {
            self.res.make_file_evictable();
        }
    }

    /// Closes the descriptor and keeps the mapping: a new topic's first
    /// segments once synced, and every segment recovery opened, so that
    /// neither holds a descriptor per partition. The writer and the sync
    /// round open the file again when they need it.
    pub(crate) fn close_file(&self) {
        self.res.take_file();
    }

    /// The segment takes no more appends (it was rolled, or it is the last
    /// segment of a sealed partition): its mapping and descriptor may be
    /// given back, and it needs no descriptor once synced.
    pub(crate) fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
        self.res.make_evictable();
        self.release_fd_if_settled();
    }

    /// Takes no more appends: sealed, or frozen with its partition.
    pub(crate) fn takes_no_appends(&self) -> bool {
        self.is_sealed() || self.frozen.load(Ordering::Acquire)
    }

    /// Drops the cache's mapping: retention unlinked the file, whose
    /// space comes back once no reader holds the mapping either.
    pub(crate) fn drop_mapping(&self) {
        self.res.take_map();
        self.res.take_file();
    }

    /// The mapping: cached, or mapped again (a read of a segment the
    /// budget evicted). Mapping again opens the file for this call only
    /// (through the hook as [`IoOp::OpenSegment`] and
    /// [`IoOp::MapSegment`]); a descriptor or mapping shortage makes the
    /// budget give back what it holds and the map is tried once more,
    /// then it is [`Error::ResourceExhausted`], with nothing changed.
    pub(crate) fn mapping(&self) -> Result<Arc<Mapping>> {
        if let Some(m) = self.res.map() {
            return Ok(m);
        }
        match self.map_again() {
            Err(e) if e.is_resource_shortage() && self.shed() => self.map_again(),
            r => r,
        }
    }

    /// Asks the budget to give back what it caches; whether it did.
    fn shed(&self) -> bool {
        self.res.budget().is_some_and(|b| b.shed())
    }

    fn map_again(&self) -> Result<Arc<Mapping>> {
        let hook = self.hook();
        let file = match self.res.file() {
            Some(f) => f,
            None => {
                hook.before(IoOp::OpenSegment, &self.path)
                    .map_err(|e| Error::io(&self.path, e).resource_typed())?;
                Arc::new(
                    open_file(&self.path, access(self.writable)).map_err(Error::resource_typed)?,
                )
            }
        };
        hook.before(IoOp::MapSegment, &self.path)
            .map_err(|e| Error::mapping(&self.path, e))?;
        // A segment that takes appends is never evicted (pinned), so this
        // maps a segment whose file is as long as its data (trimmed) or
        // longer: never past what readers may address.
        let len = self.file_len().max(SEGMENT_HEADER_LEN as u64);
        let raw = map_file(&file, len, self.writable).map_err(|e| Error::mapping(&self.path, e))?;
        Ok(self.res.set_map(Arc::new(Mapping::new(raw))))
    }

    fn hook(&self) -> &dyn IoHook {
        match self.hook.get() {
            Some(h) => &**h,
            None => &NoFaults,
        }
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
    /// `i64::MIN` too while the segment cannot be mapped (a shortage):
    /// a caller that must tell the two apart asks `newest_timestamp`.
    pub fn max_timestamp(&self) -> i64 {
        self.newest_timestamp().unwrap_or(i64::MIN)
    }

    /// [`Segment::max_timestamp`], or the error of mapping the segment
    /// when it must be read to know (nothing cached then, so the next
    /// call tries again): a time lookup that cannot read a segment fails
    /// rather than pass over it.
    pub(crate) fn newest_timestamp(&self) -> Result<i64> {
        let known = self.max_timestamp.load(Ordering::Acquire);
        if known != i64::MIN || self.end_offset() == self.base_offset {
            return Ok(known);
        }
        let data = self.committed()?;
        let ((mut pos, _), mut max) = self.time_hint_and_newest_before(i64::MAX);
        let end = self.committed_pos();
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
        Ok(max)
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
        self.release_fd_if_settled();
    }

    /// Whether the segment is sealed but its header seal not yet synced.
    pub(crate) fn needs_seal_sync(&self) -> bool {
        self.is_sealed() && !self.seal_synced.load(Ordering::Acquire)
    }

    /// Records that a sync covered the header seal.
    pub(crate) fn set_seal_synced(&self) {
        self.seal_synced.store(true, Ordering::Release);
        self.release_fd_if_settled();
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

    /// Removes a seal from the header of a segment recovery keeps as the
    /// active one: a power loss at a roll can keep the header page with
    /// the seal but lose records below it, and the segment then holds less
    /// than its seal says. Left there, the next open would take the seal
    /// and start a new segment (a second open that is not a no-op), and
    /// appends would land in a segment marked sealed. The cleared header
    /// page is made durable by the first sync round that syncs the file;
    /// until then a power loss brings the seal back and recovery clears it
    /// again. Recovery only (`&mut self`: no reader or writer yet).
    pub(crate) fn clear_stale_seal(&mut self) -> Result<bool> {
        if self.is_sealed() || self.unsealed_head.load(Ordering::Acquire) {
            return Ok(false);
        }
        let raw = self.raw_for_recovery()?;
        let sealed_head =
            segment::decode_header(&raw[..SEGMENT_HEADER_LEN]).is_ok_and(|h| h.seal.is_some());
        drop(raw);
        if !sealed_head {
            return Ok(false);
        }
        self.file()?
            .write_all_at(&[0u8; 20], segment::SEAL_POS as u64)
            .at(&self.path)?;
        self.unsealed_head.store(true, Ordering::Release);
        Ok(true)
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
        if sealed {
            self.res.make_evictable();
        }
        self.release_fd_if_settled();
    }

    /// The whole mapped file, header included, for recovery before the
    /// segment is shared with readers or the writer.
    pub(crate) fn raw_for_recovery(&mut self) -> Result<RawBytes> {
        let map = self.mapping()?;
        let upto = self.allocated().min(self.capacity).min(map.len());
        // Only up to the end of the file's data: past it an active
        // segment's file is sparse, and a read fault on a hole of a shared
        // mapping allocates a page on some filesystems (tmpfs), which on a
        // full one is a SIGBUS. The sparse tail reads as zeros, which is
        // what the scan sees at the end of the slice as well. Asked here,
        // not at open, so segments recovery does not scan cost nothing.
        let len = match self.file() {
            Ok(f) => data_end(&f, upto).clamp(SEGMENT_HEADER_LEN as u64, upto),
            Err(_) => upto,
        };
        Ok(RawBytes {
            map,
            len: len as usize,
        })
    }

    /// The file's bytes `[from, to)` read with `pread` through the
    /// descriptor it holds, for a recovery check of a segment it does not
    /// map; `None` without a descriptor or when a read fails.
    pub(crate) fn read_unmapped(&self, from: u64, to: u64) -> Option<Vec<u8>> {
        let file = self.res.file()?;
        let mut buf = vec![0u8; usize::try_from(to.checked_sub(from)?).ok()?];
        file.read_exact_at(&mut buf, from).ok()?;
        Some(buf)
    }

    /// Committed data bytes `[SEGMENT_HEADER_LEN, committed_pos)`, indexed
    /// from the start of the file (the header part reads as an empty gap:
    /// callers index with file positions >= `SEGMENT_HEADER_LEN`).
    /// The bytes come with the mapping they lie in, which they keep
    /// mapped; a segment the budget evicted is mapped again
    /// ([`Segment::mapping`]).
    pub fn committed(&self) -> Result<CommittedBytes> {
        let map = self.mapping()?;
        let end = self.committed_pos();
        if end > map.len() {
            // Only a file cut by something outside fissionlog is shorter
            // than its committed data.
            return Err(Error::corruption(
                &self.path,
                map.len(),
                format!("the file ends before its committed data ({end} bytes)"),
            ));
        }
        Ok(CommittedBytes {
            map,
            end: end as usize,
        })
    }

    /// fdatasync of a segment created outside a sync round.
    pub fn sync_data(&self, hook: &dyn IoHook) -> Result<()> {
        let file = self.file()?;
        let pos = self.committed_pos();
        crate::storage::sync_file(hook, IoOp::SyncNewSegment, &file, &self.path, true)?;
        self.set_synced_pos(pos);
        Ok(())
    }

    /// The open file, for a sync round; `None` once the segment is settled
    /// (sealed, seal and data synced: nothing to sync). A segment whose
    /// descriptor was released while it still has unsynced bytes (recovery
    /// opens sealed segments without keeping their descriptors, then may
    /// repair them) opens its file again and keeps it until settled.
    pub(crate) fn sync_handle(&self) -> Result<Option<Arc<File>>> {
        if let Some(f) = self.res.file() {
            return Ok(Some(f));
        }
        if self.is_settled() {
            return Ok(None);
        }
        // A descriptor opened after the write still reports a writeback
        // error nobody has seen (the kernel samples the file's error
        // sequence at open as "unseen"), and only this log syncs the file.
        let f = match open_file(&self.path, access(self.writable)) {
            Err(e) if e.is_resource_shortage() && self.shed() => {
                open_file(&self.path, access(self.writable))
            }
            r => r,
        }
        .map_err(Error::resource_typed)?;
        Ok(Some(self.res.set_file(Arc::new(f))))
    }

    /// Closes the descriptor now and drops the mapping;
    /// [`Segment::sync_handle`] and the repair calls open the file again
    /// when they need it, and a read maps it again. Recovery does this for
    /// the settled sealed segments it opens, so an open of a log with many
    /// segments holds a descriptor and a mapping per partition, not per
    /// segment.
    pub(crate) fn release_fd(&self) {
        self.res.take_file();
        self.res.take_map();
    }

    /// Takes no more appends, and everything it holds (its seal, if it
    /// carries one) is synced: nothing writes or syncs it again.
    fn is_settled(&self) -> bool {
        let frozen = self.frozen.load(Ordering::Acquire);
        let sealed_synced = self.is_sealed() && self.seal_synced.load(Ordering::Acquire);
        ((frozen && !self.needs_seal_sync()) || sealed_synced)
            && self.synced_pos() >= self.committed_pos()
    }

    /// The open file, or the file opened again when its descriptor was
    /// released: kept (under the budget) for a segment that takes appends
    /// in a partition (the writer's next allocation or `pwrite` needs it
    /// too), for this call only otherwise (a trim of a sealed segment, a
    /// repair at open). A shortage makes the budget give back what it
    /// holds and the open is tried once more, then it is
    /// [`Error::ResourceExhausted`] with nothing changed.
    fn file(&self) -> Result<Arc<File>> {
        if let Some(f) = self.res.file() {
            return Ok(f);
        }
        let f = match open_file(&self.path, access(self.writable)) {
            Err(e) if e.is_resource_shortage() && self.shed() => {
                open_file(&self.path, access(self.writable))
            }
            r => r,
        }
        .map_err(Error::resource_typed)?;
        let f = Arc::new(f);
        if self.res.budget().is_some() && !self.takes_no_appends() {
            return Ok(self.res.set_file(f));
        }
        Ok(f)
    }

    /// Closes the descriptor of a segment that is sealed, whose seal is
    /// synced and whose data is synced: nothing writes or syncs it again,
    /// and its mapping stays valid without it.
    fn release_fd_if_settled(&self) {
        if self.is_settled() {
            self.res.take_file();
        }
    }

    /// Zeroes `[from, end of file)` so stale bytes past a recovered end can
    /// never validate again (a torn tail must not be resurrected). The page
    /// holding `from` is zeroed in place; past it the file is punched out
    /// (`FALLOC_FL_PUNCH_HOLE`: it reads as zeros and holds no space), and
    /// `allocated` drops to the page boundary, so the writer allocates again
    /// before it stores there and a full disk stays `Error::NoSpace`, never
    /// a SIGBUS. Where punching is not supported, a tail of at most the
    /// active headroom is overwritten with zeros and a longer one cut off.
    /// Only what holds data is cleared: bytes already zero in the page of
    /// `from`, and ranges past it the filesystem reports as holes
    /// (`SEEK_DATA`; unwritten preallocated space too), are left alone, so
    /// an open after a crash costs nothing for a partition with nothing
    /// past its end (punching the preallocated headroom discards its blocks,
    /// milliseconds per file). Returns whether anything was cleared: the
    /// caller makes the cleared range durable (see
    /// `recovery::partition::repair_chain`).
    pub(crate) fn clear_tail(&mut self, from: u64) -> Result<bool> {
        let end = self.file_len.load(Ordering::Acquire);
        if from >= end {
            return Ok(false);
        }
        let file = self.file()?;
        let aligned = page_up(from).min(end);
        let mut cleared = false;
        if aligned > from {
            let mut page = vec![0u8; (aligned - from) as usize];
            let got = file.read_at(&mut page, from).at(&self.path)?;
            if page[..got].iter().any(|&b| b != 0) {
                page.fill(0);
                file.write_all_at(&page, from).at(&self.path)?;
                cleared = true;
            }
        }
        self.allocated.fetch_min(aligned, Ordering::AcqRel);
        let data_end = data_end(&file, end);
        if aligned >= data_end {
            return Ok(cleared);
        }
        let len = data_end - aligned;
        // SAFETY: plain syscall on an fd we own; no memory is passed.
        let rc = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                aligned as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            return Ok(true);
        }
        if len <= crate::config::ACTIVE_HEADROOM_MAX_BYTES {
            write_zeros(&file, aligned, len).at(&self.path)?;
            return Ok(true);
        }
        // Cut off; the writer allocates (and extends the file) again
        // before it stores there.
        file.set_len(aligned).at(&self.path)?;
        self.file_len.store(aligned, Ordering::Release);
        Ok(true)
    }

    /// Releases the bytes of a sealed segment from `pos` (a batch start,
    /// holding `end_offset`) on: a tail-split parent's moved records, once
    /// the `TailReclaimed` record is durable. The caller guarantees that no
    /// reader holds the segment (nothing may read the released bytes
    /// through the mapping: they read as zeros).
    ///
    /// Crash order: the header seal (a rolled segment's) is cleared and
    /// synced first, so a segment whose data was cut never keeps a seal
    /// past its data; then the page holding `pos` is zeroed from `pos` on
    /// and the rest of the file punched out (`FALLOC_FL_PUNCH_HOLE`, the
    /// file keeps its size, so no mapping can fault past its end), and
    /// synced. Each state a power loss leaves is a sealed partition's last
    /// segment ending at `end_offset` or further. Returns the bytes punched.
    pub(crate) fn release_past(&self, pos: u64, end_offset: u64) -> Result<u64> {
        let hook = self.hook();
        hook.before(IoOp::TrimSegment, &self.path).at(&self.path)?;
        let file = open_file(&self.path, Access::ReadWrite)?;
        let head = self.file_prefix(&file)?;
        if segment::decode_header(&head).is_ok_and(|h| h.seal.is_some()) {
            file.write_all_at(&[0u8; 20], segment::SEAL_POS as u64)
                .at(&self.path)?;
            crate::storage::sync_file(hook, IoOp::SyncNewSegment, &file, &self.path, true)?;
        }
        let end = self.file_len.load(Ordering::Acquire).max(pos);
        let aligned = page_up(pos).min(end);
        if aligned > pos {
            file.write_all_at(&vec![0u8; (aligned - pos) as usize], pos)
                .at(&self.path)?;
        }
        let mut released = 0;
        if end > aligned {
            // SAFETY: plain syscall on an fd we own; no memory is passed.
            let rc = unsafe {
                libc::fallocate(
                    file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    aligned as libc::off_t,
                    (end - aligned) as libc::off_t,
                )
            };
            if rc == 0 {
                released = end - aligned;
            } else {
                // No punching here: zeros keep the segment consistent, and
                // the space goes with the partition.
                write_zeros(&file, aligned, end - aligned).at(&self.path)?;
            }
        }
        crate::storage::sync_file(hook, IoOp::SyncNewSegment, &file, &self.path, true)?;
        self.allocated.fetch_min(aligned, Ordering::AcqRel);
        self.committed_pos.store(pos, Ordering::Release);
        self.end_offset.store(end_offset, Ordering::Release);
        self.synced_pos.store(pos, Ordering::Release);
        if let IndexState::Loaded(entries) = &mut *self.index.lock() {
            entries.retain(|e| u64::from(e.position) < pos);
        }
        // The index file names batches past `pos`: a stale cache, which
        // an open rebuilds from the data; removed rather than rewritten.
        self.index_durable.store(INDEX_UNKNOWN, Ordering::Release);
        let _ = std::fs::remove_file(&self.index_path);
        Ok(released)
    }

    fn file_prefix(&self, file: &File) -> Result<Vec<u8>> {
        let mut head = vec![0u8; SEGMENT_HEADER_LEN];
        let n = read_prefix(file, &mut head).at(&self.path)?;
        head.truncate(n);
        Ok(head)
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
        let len32 = u32::try_from(len)
            .map_err(|_| Error::corruption(&self.path, pos, "hole longer than a batch"))?;
        let header = batch::hole_header(len32, first_offset, lost);
        let file = self.file()?;
        // The zeroed payload in bounded pieces, then the header over it.
        write_zeros(&file, pos, len).at(&self.path)?;
        file.write_all_at(&header, pos).at(&self.path)
    }

    /// [`Segment::write_hole`] of a hole that ends past the end of the
    /// file (Salvage completing a rolled segment cut short up to its
    /// seal). The hole's header goes in and is made durable before the
    /// file grows to the hole's end: a power loss between the two leaves
    /// the file shorter than its seal, so the next open scans it and makes
    /// the same repair. Grown first, a power loss can keep the new length
    /// and lose the header, and the next open trusts the seal of a file
    /// whose bytes below it hold no batch (reads of the lost offsets fail
    /// as corruption instead of reading as a hole). The caller syncs the
    /// grown length.
    pub(crate) fn write_hole_growing(
        &mut self,
        pos: u64,
        len: u64,
        (first_offset, lost): (u64, u64),
        hook: &dyn IoHook,
    ) -> Result<()> {
        let file = self.file()?;
        let file_len = file.metadata().at(&self.path)?.len();
        let end = pos + len;
        if end <= file_len {
            drop(file);
            return self.write_hole(pos, len, first_offset, lost);
        }
        let lost = u32::try_from(lost)
            .map_err(|_| Error::corruption(&self.path, pos, "hole spans too many offsets"))?;
        let len32 = u32::try_from(len)
            .map_err(|_| Error::corruption(&self.path, pos, "hole longer than a batch"))?;
        let header = batch::hole_header(len32, first_offset, lost);
        // What the file holds past `pos` is damage: zeroed, then the header.
        write_zeros(&file, pos, file_len.saturating_sub(pos)).at(&self.path)?;
        file.write_all_at(&header, pos).at(&self.path)?;
        crate::storage::sync_file(hook, IoOp::SyncNewSegment, &file, &self.path, true)?;
        file.set_len(end).at(&self.path)
    }

    /// Writes the seal (end offset and position) into the header, then
    /// lets the budget evict the segment's mapping and descriptor.
    ///
    /// A segment that takes appends is pinned, so its mapping is cached
    /// and this stores into it; should it not be (never, as the code is),
    /// the seal goes in with `pwrite`, and should that fail too, the
    /// segment is sealed in memory only and recovery seals it again
    /// ([`Segment::seal_recovered`]: a segment followed by another one).
    fn write_seal(&self, end_offset: u64, end_pos: u64) {
        let seal = segment::encode_seal(end_offset, end_pos);
        match self.mapping() {
            // SAFETY: bytes [SEAL_POS, SEAL_POS+20) lie in the header, which
            // no reader ever forms a slice over; the writer is exclusive
            // (`&mut SegmentWriter`), and the mapping (held for the copy)
            // is at least 64 bytes long.
            Ok(map) => unsafe {
                std::ptr::copy_nonoverlapping(
                    seal.as_ptr(),
                    map.as_mut_ptr().add(segment::SEAL_POS),
                    seal.len(),
                );
            },
            Err(_) => {
                if let Ok(f) = self.file() {
                    let _ = f.write_all_at(&seal, segment::SEAL_POS as u64);
                }
            }
        }
        self.sealed.store(true, Ordering::Release);
        self.unsealed_head.store(false, Ordering::Release);
        // A seal written again (a rolled segment a Raft truncation cut and
        // rolled from) is not synced yet.
        self.seal_synced.store(false, Ordering::Release);
        self.res.make_evictable();
    }
}

/// Readies a partition's recovered segments (oldest first) for use: every
/// segment that takes no more appends is trimmed to its data (this also
/// gives back the space of files from versions that preallocated whole
/// segments), and the last one, when the partition is active and the
/// segment unsealed, is prepared to take appends at `segment_bytes`.
pub(crate) fn prepare_recovered_chain(
    segments: &mut [Segment],
    partition_sealed: bool,
    segment_bytes: u64,
    hook: &Arc<dyn IoHook>,
) -> Result<()> {
    let n = segments.len();
    for (i, seg) in segments.iter_mut().enumerate() {
        seg.attach_hook(hook);
        if i + 1 == n && !partition_sealed && !seg.is_sealed() {
            seg.prepare_for_appends(segment_bytes)?;
        } else {
            // Only space is at stake: a failed trim keeps it.
            let _ = seg.trim();
        }
    }
    Ok(())
}

/// The committed bytes of a segment, addressed by file position, with
/// the mapping they lie in (kept mapped while this lives, whatever the
/// budget does meanwhile).
#[derive(Debug, Clone)]
pub struct CommittedBytes {
    map: Arc<Mapping>,
    /// The committed end when taken (a file position, at most the
    /// mapping's length).
    end: usize,
}

impl CommittedBytes {
    /// The committed end (a file position) when the bytes were taken.
    pub fn end_pos(&self) -> u64 {
        self.end as u64
    }

    /// `[SEGMENT_HEADER_LEN, end)` of the mapping.
    fn data(&self) -> &[u8] {
        // Bytes in [SEGMENT_HEADER_LEN, end) were published by the writer's
        // Release store (or recovered before the segment was shared) and
        // are never written again (the module comment); `end` is at most
        // the mapping's length (checked when taken).
        // SAFETY: in bounds and immutable; the `Arc` keeps the mapping alive.
        unsafe {
            std::slice::from_raw_parts(
                self.map.as_ptr().add(SEGMENT_HEADER_LEN),
                self.end - SEGMENT_HEADER_LEN,
            )
        }
    }

    /// Bytes from file position `pos` to the committed end.
    pub fn from(&self, pos: u64) -> &[u8] {
        let data = self.data();
        let start = (pos as usize)
            .saturating_sub(SEGMENT_HEADER_LEN)
            .min(data.len());
        &data[start..]
    }

    /// Bytes of file positions `[start, end)`.
    pub fn range(&self, start: u64, end: u64) -> &[u8] {
        let s = start as usize - SEGMENT_HEADER_LEN;
        let e = end as usize - SEGMENT_HEADER_LEN;
        &self.data()[s..e]
    }
}

/// A whole mapped file for recovery, header included, with its mapping.
#[derive(Debug)]
pub(crate) struct RawBytes {
    map: Arc<Mapping>,
    len: usize,
}

impl std::ops::Deref for RawBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // Taken by `raw_for_recovery` under `&mut Segment`: no reader or
        // writer shares the segment yet, and the mapping and the file's
        // data are at least `len` bytes.
        // SAFETY: in bounds and unshared; the `Arc` keeps the mapping alive.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.len) }
    }
}
