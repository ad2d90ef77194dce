//! The crate's one error type.

use std::io;
use std::path::PathBuf;

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in the replication crate, with the data a
/// caller needs to act on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system call failed. `op` names the step (for the vote
    /// file: `lock`, `write`, `fsync`, `rename`, `fsync-dir`, `read`).
    #[error("{op} of {path} failed: {source}")]
    Io {
        /// The step that failed.
        op: &'static str,
        /// The file or directory it was applied to.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },

    /// The vote file exists but does not hold a valid vote: wrong length,
    /// wrong magic, a checksum mismatch or an impossible field. The vote is
    /// not guessed: a group whose vote is unreadable must not take part in
    /// an election (it could vote twice in one term).
    #[error("vote file {path} is corrupt: {reason}")]
    CorruptVote {
        /// The vote file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The vote file was written by a newer format version.
    #[error("vote file {path} has format version {version}; this build reads up to {supported}")]
    UnsupportedVoteVersion {
        /// The vote file.
        path: PathBuf,
        /// The version byte found.
        version: u8,
        /// The highest version this build reads.
        supported: u8,
    },

    /// An earlier save of this vote file failed part-way (after a write or
    /// an fsync failed, the file's durable state is unknown). Reopen the
    /// group to read what is on disk before voting again.
    #[error("vote file {path} refuses saves after an earlier failure: {reason}")]
    VoteFilePoisoned {
        /// The vote file.
        path: PathBuf,
        /// The failure that poisoned it.
        reason: String,
    },

    /// Another vote file (in this process or another) holds the group's
    /// directory: two writers could interleave their saves and one would
    /// acknowledge a vote the file no longer holds. Stop the other first.
    #[error("vote directory {dir} is held by another writer")]
    VoteFileLocked {
        /// The group's directory.
        dir: PathBuf,
    },

    /// A frame announces (or would need) more payload bytes than allowed.
    /// Checked from the length prefix alone, before anything is buffered.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    FrameTooLarge {
        /// The announced or encoded length.
        len: u64,
        /// The configured maximum.
        max: u32,
    },

    /// A frame's version byte is not one this build speaks.
    #[error("frame version {version} is not supported (this build speaks {supported})")]
    UnsupportedFrameVersion {
        /// The version byte found.
        version: u8,
        /// The version this build speaks.
        supported: u8,
    },

    /// A frame's payload is not a valid encoding of the expected message.
    #[error("malformed frame: {reason}")]
    MalformedFrame {
        /// What the decoder said.
        reason: String,
    },

    /// A frame decoded to a message but left payload bytes unread.
    #[error("frame has {unused} bytes after its message")]
    TrailingFrameBytes {
        /// How many bytes were left.
        unused: usize,
    },

    /// The stream ended inside a frame (after `have` of `need` bytes).
    #[error("stream ended inside a frame after {have} of {need} bytes")]
    TruncatedFrame {
        /// Bytes of the frame received.
        have: usize,
        /// Bytes the frame needed.
        need: usize,
    },

    /// A saved controller snapshot does not hold a valid snapshot (wrong
    /// length or version, a checksum mismatch, an undecodable state). The
    /// replica does not start from a guess: remove the file to have it
    /// fetch a snapshot from the leader again.
    #[error("snapshot file {path} is corrupt: {reason}")]
    CorruptSnapshot {
        /// The snapshot file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}
