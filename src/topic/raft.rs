//! A replicated topic's Raft log operations that need the log's sync
//! rounds: truncation and purge of a partition's entries
//! (`Partition::append_entry` and the reads need none).

use std::path::PathBuf;

use crate::error::Result;
use crate::topic::Topic;

impl Topic {
    /// Removes every entry of `partition`'s Raft log from `index` on,
    /// durably before it returns (openraft's `truncate`); refuses a cut
    /// below `committed_end` with [`crate::Error::TruncateBelowCommitted`].
    /// The crash order is [`crate::Partition`]'s (docs/REPLICATION.md,
    /// "Truncation after an uncommitted index"): a checkpoint at the cut,
    /// then the files, each step synced.
    pub fn truncate_from_index(
        &self,
        partition: u32,
        index: u64,
        committed_end: u64,
    ) -> Result<()> {
        let p = self.partition(partition)?;
        let core = &self.inner.core;
        p.truncate_from_index_with(index, committed_end, &|| {
            core.request_checkpoint();
            core.sync()
        })
    }

    /// Deletes the whole segments of `partition` whose entries all lie at
    /// or below Raft index `index` (openraft's `purge`), after a
    /// checkpoint carrying the new start is durable. Returns the files
    /// removed; entries above `index` in a partly purged segment stay.
    pub fn purge_through_index(&self, partition: u32, index: u64) -> Result<Vec<PathBuf>> {
        let p = self.partition(partition)?;
        let core = &self.inner.core;
        p.purge_through_index_with(index, &|| {
            core.request_checkpoint();
            core.sync()
        })
    }
}
