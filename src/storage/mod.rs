//! Files and memory maps: segments, durability, fault injection.

pub(crate) mod budget;
pub(crate) mod durability;
pub(crate) mod fault;
pub(crate) mod file;
pub(crate) mod lock;
pub(crate) mod position;
pub(crate) mod segment;

use std::path::Path;

use crate::error::{IoContext, Result};
use fault::{IoHook, IoOp};

/// fsync of a directory, so that creations, renames and deletions in it
/// survive a power loss. Goes through the hook as `op`.
pub(crate) fn sync_dir(hook: &dyn IoHook, op: IoOp, path: &Path) -> Result<()> {
    hook.before(op, path).at(path)?;
    let result = file::open_dir(path).and_then(|d| d.sync_all());
    hook.after(op, path, result).at(path)
}

/// fsync (`datasync`: fdatasync) of an open file, through the hook as `op`.
pub(crate) fn sync_file(
    hook: &dyn IoHook,
    op: IoOp,
    file: &std::fs::File,
    path: &Path,
    datasync: bool,
) -> Result<()> {
    hook.before(op, path).at(path)?;
    let result = if datasync {
        file.sync_data()
    } else {
        file.sync_all()
    };
    hook.after(op, path, result).at(path)
}
