//! Fault injection on the rare I/O paths (file creation, preallocation,
//! sync), so tests drive ENOSPC and fsync failures through the same code
//! that runs in production. The append path itself stores into a
//! preallocated mapping and cannot fail with ENOSPC.

use std::io;
use std::path::Path;

/// A rare I/O operation that a hook may fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Creating and preallocating a segment file.
    CreateSegment,
    /// fdatasync of a segment file.
    SyncSegment,
    /// fsync of a directory.
    SyncDir,
    /// Writing the checkpoint.
    WriteCheckpoint,
    /// Appending to the manifest journal.
    WriteManifest,
}

/// Called before each [`IoOp`]; an `Err` is returned to the caller as if the
/// OS had failed the call.
pub trait IoHook: Send + Sync + std::fmt::Debug {
    /// Decides the fate of one operation on `path`.
    fn before(&self, op: IoOp, path: &Path) -> io::Result<()>;
}

/// A hook that never fails.
#[derive(Debug, Default)]
pub struct NoFaults;

impl IoHook for NoFaults {
    fn before(&self, _op: IoOp, _path: &Path) -> io::Result<()> {
        Ok(())
    }
}
