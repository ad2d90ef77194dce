//! Names of the files and directories inside a log directory
//! (docs/FORMAT.md), for operators' tools that inspect or back up a log.
//! Writing to these files while a [`crate::Log`] (or any handle or batch
//! read from it) is alive is not supported: the directory lock says who
//! owns them.
//!
//! A leaf: every layer that builds a path inside the log directory takes
//! the names from here, and this module imports nothing from the crate.

use std::path::{Path, PathBuf};

/// Name of the lock file.
pub const LOCK_FILE: &str = "fissionlog.lock";
/// Folder holding one folder per topic.
pub const TOPICS_DIR: &str = "topics";
/// Manifest journal file name.
pub const JOURNAL_FILE: &str = "manifest.log";
/// Manifest snapshot file name.
pub const SNAPSHOT_FILE: &str = "manifest.snap";

/// The directory of topic `id` in the log directory `dir`.
pub(crate) fn topic_dir(dir: &Path, id: u32) -> PathBuf {
    dir.join(TOPICS_DIR).join(format!("t{id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_directory_is_named_by_its_id_under_the_topics_folder() {
        assert_eq!(
            topic_dir(Path::new("/log"), 7),
            PathBuf::from("/log/topics/t7")
        );
    }
}
