//! Files and memory maps: segments, durability, fault injection.

pub mod durability;
pub mod fault;
pub mod prefault;
pub mod segment;

/// fsync of a directory, so that creations, renames and deletions in it
/// survive a power loss.
pub fn sync_dir(path: &std::path::Path) -> crate::error::Result<()> {
    use crate::error::IoContext;
    std::fs::File::open(path)
        .and_then(|d| d.sync_all())
        .at(path)
}
