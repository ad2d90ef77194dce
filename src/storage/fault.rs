//! Fault injection and observation on the I/O paths that decide durability
//! (file creation, preallocation, every fsync), so tests drive ENOSPC, EIO
//! and fsync failures through the same code that runs in production, and a
//! crash model can see which file was made durable when.
//!
//! Every fsync/fdatasync the engine issues goes through [`IoHook::before`]
//! and [`IoHook::after`] with an [`IoOp`] naming its call site. A hook that
//! ignores the success of one op models "that fsync was never called": the
//! crash-model tests use this to prove they notice each missing fsync.
//!
//! The engine always calls through a hook ([`NoFaults`] in production);
//! outside the crate the hook types and `Log::open_with_hook` exist only
//! with the `testing` feature, as test seams, not as an extension point.

use std::io;
use std::path::Path;

/// An I/O operation a hook may observe or fail. The `Sync*` ops name each
/// fsync/fdatasync call site of the engine. New call sites add variants:
/// a hook matches with a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IoOp {
    /// Creating a segment file.
    CreateSegment,
    /// Allocating space in a segment file (its first chunk at creation, the
    /// writer growing it ahead of itself, the free tail at open).
    AllocateSegment,
    /// Truncating a segment that takes no more appends to its data.
    TrimSegment,
    /// Writing an index file (a cache of the segment).
    WriteIndex,
    /// fdatasync of a rebuilt index file before it is renamed into place.
    SyncIndex,
    /// fsync of a partition directory after a rebuilt index was renamed
    /// into place.
    SyncIndexDir,
    /// fdatasync of a segment file in a sync round.
    SyncSegment,
    /// fsync of a partition directory in a sync round (after a roll or a
    /// retention delete).
    SyncDir,
    /// fsync of a partition directory at a roll, before the new segment is
    /// created, when no directory fsync completed since the previous roll:
    /// a segment's name is never durable before an earlier segment's.
    SyncRollDir,
    /// Writing the checkpoint.
    WriteCheckpoint,
    /// fdatasync of the checkpoint file in a sync round.
    SyncCheckpoint,
    /// Appending to the manifest journal.
    WriteManifest,
    /// fdatasync of the manifest journal after a record (the commit point
    /// of a topology change).
    SyncManifest,
    /// fsync of a manifest file written whole (new journal, snapshot,
    /// torn-tail cut).
    SyncManifestFile,
    /// fsync of the log directory after a manifest file was created or
    /// renamed.
    SyncManifestDir,
    /// fdatasync of a segment created or repaired outside a sync round (a
    /// new topic's or child partition's first segment, a salvage hole
    /// segment, hole batches salvage wrote into an existing segment).
    SyncNewSegment,
    /// fsync of a directory after files or directories were created or
    /// removed in it outside a sync round (new log, topic, partition, topic
    /// deletion, partition removal).
    SyncNewDir,
    /// fsync of a directory after recovery moved or removed files in it.
    SyncRecoveryDir,
    /// Opening an existing segment file and reading its header (recovery,
    /// `verify`). Fails like `open(2)`/`read(2)` would: EMFILE, ENFILE,
    /// EACCES, EIO.
    OpenSegment,
    /// Mapping a segment file (`mmap(2)`), new or opened: ENOMEM when
    /// memory or `vm.max_map_count` runs out.
    MapSegment,
    /// Deleting the directory of a partition removed from the topology
    /// (after its `RemovePartition` record is durable; the topic directory
    /// is then fsynced as `SyncNewDir`).
    RemovePartitionDir,
}

/// Sees each [`IoOp`] before and after the OS call.
pub trait IoHook: Send + Sync + std::fmt::Debug {
    /// Decides the fate of one operation on `path` before it runs; an `Err`
    /// is returned to the caller as if the OS had failed the call.
    fn before(&self, op: IoOp, path: &Path) -> io::Result<()>;

    /// Sees the OS's result of an fsync-type operation and returns what the
    /// engine gets. A hook may turn success into failure (EIO after the
    /// write reached the page cache: the fsyncgate case).
    fn after(&self, _op: IoOp, _path: &Path, result: io::Result<()>) -> io::Result<()> {
        result
    }
}

/// A hook that never fails.
#[derive(Debug, Default)]
pub struct NoFaults;

impl IoHook for NoFaults {
    fn before(&self, _op: IoOp, _path: &Path) -> io::Result<()> {
        Ok(())
    }
}
