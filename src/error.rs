//! The one public error type of fissionlog.

use std::io;
use std::path::PathBuf;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, with the data a caller needs to act on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system call failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// File or directory the call was about.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Opening the log stopped because a file could not be opened or
    /// mapped: too many open files (EMFILE, ENFILE), no memory or map count
    /// left for a mapping (ENOMEM, `vm.max_map_count`), permissions
    /// (EACCES, EPERM) or an I/O error. This is the environment, not damage:
    /// recovery opens and maps every segment before it repairs any, so no
    /// segment was changed. Fix the cause and open again.
    #[error("cannot open or map {path}: {source}; no segment was changed")]
    OpenFailed {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A name in the log directory where fissionlog keeps one of its files
    /// holds something else: a directory, a symbolic link (also to a
    /// regular file), a FIFO, a socket or a device. fissionlog never reads
    /// or writes through it (a FIFO or `/dev/zero` would block or never
    /// end), in any recovery mode, and changed nothing. Put the file back
    /// (or remove what stands in its place, if the file is lost) and open
    /// again.
    #[error("{path} is a {found}, not a regular file; a log directory holds only regular files, and nothing was changed")]
    NotARegularFile {
        /// The name in the log directory.
        path: PathBuf,
        /// What it is instead ("directory", "symbolic link", "FIFO (named
        /// pipe)", "socket", "character device", ...).
        found: &'static str,
    },
    /// The process ran out of descriptors (EMFILE, ENFILE) or of
    /// mappings (ENOMEM: memory, or `vm.max_map_count`) while an open log
    /// opened or mapped `path` (a segment roll, a read of a segment the
    /// budget had given back, a sync round reopening a sealed segment).
    /// The log's budget ([`crate::LogOptions::max_open_files`],
    /// [`crate::LogOptions::max_mapped_segments`]) gave back what it
    /// caches and the call was tried once more before this was returned:
    /// the operation was not applied, nothing is poisoned, and the same
    /// call can be retried once descriptors or memory are free (or with a
    /// smaller budget, or a higher `RLIMIT_NOFILE`).
    #[error("out of {resource} while opening or mapping {path}: {source}; nothing was changed, retry once some are free")]
    ResourceExhausted {
        /// What ran out.
        resource: Resource,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The device is full; the operation was not applied.
    #[error("no space left on device while writing {path}")]
    NoSpace {
        /// File being written.
        path: PathBuf,
    },
    /// Another `Log` (in this or another process) holds the directory.
    #[error("log directory {path} is locked by another process or handle")]
    Locked {
        /// The log directory.
        path: PathBuf,
    },
    /// The directory exists, is not empty and holds no fissionlog manifest.
    #[error("{path} is not a fissionlog directory (no manifest)")]
    NotALog {
        /// The directory.
        path: PathBuf,
    },
    /// The directory does not exist and creation was not requested.
    #[error("log directory {path} does not exist")]
    NotFound {
        /// The directory.
        path: PathBuf,
    },
    /// Bytes on disk are not what fissionlog wrote.
    #[error("corruption in {file} at byte {position}: {reason}")]
    Corruption {
        /// File holding the bad bytes.
        file: PathBuf,
        /// Byte position of the first bad byte (or of the bad structure).
        position: u64,
        /// What is wrong.
        reason: String,
    },
    /// A checksum did not match while reading data that was valid at open.
    #[error("checksum mismatch in {file} at byte {position}: expected {expected:#010x}, found {actual:#010x}")]
    ChecksumMismatch {
        /// File holding the batch.
        file: PathBuf,
        /// Byte position of the batch.
        position: u64,
        /// CRC stored in the batch header.
        expected: u32,
        /// CRC computed over the bytes.
        actual: u32,
    },
    /// A file was written by an unknown (newer) format version.
    #[error("{file} has format version {found}, this build reads up to {supported}")]
    UnsupportedVersion {
        /// The file.
        file: PathBuf,
        /// Version found in the file.
        found: u16,
        /// Highest version this build understands.
        supported: u16,
    },
    /// A record (or batch) is larger than the topic allows.
    #[error("record of {size} bytes exceeds the maximum of {max} bytes")]
    RecordTooLarge {
        /// Encoded size of the record.
        size: u64,
        /// The topic's limit.
        max: u64,
    },
    /// A topic name that fissionlog will not use as a path.
    #[error("invalid topic name {name:?}: {reason}")]
    InvalidTopicName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// No topic of that name.
    #[error("unknown topic {0:?}")]
    UnknownTopic(String),
    /// The topic exists already.
    #[error("topic {0:?} already exists")]
    TopicExists(String),
    /// No partition of that id in the topic.
    #[error("unknown partition {partition} in topic {topic:?}")]
    UnknownPartition {
        /// Topic name.
        topic: String,
        /// Partition id asked for.
        partition: u32,
    },
    /// The offset is outside what the partition holds.
    #[error("offset {offset} is out of range for partition {partition} (holds {start}..{end})")]
    OffsetOutOfRange {
        /// Partition id.
        partition: u32,
        /// Offset asked for.
        offset: u64,
        /// First offset still held.
        start: u64,
        /// End offset (exclusive).
        end: u64,
    },
    /// Records in this range were lost to corruption and salvaged around.
    #[error(
        "offsets {start}..{end} of partition {partition} were lost to corruption (salvage hole)"
    )]
    Hole {
        /// Partition id.
        partition: u32,
        /// First lost offset.
        start: u64,
        /// End of the lost range (exclusive).
        end: u64,
    },
    /// Retention removed these offsets (expired or over the size limit):
    /// they are gone for good, and reading resumes at `end`.
    #[error("offsets {start}..{end} of partition {partition} were removed by retention")]
    Retained {
        /// Partition id.
        partition: u32,
        /// First removed offset asked for.
        start: u64,
        /// First offset after the removed range: the partition's first
        /// held offset (its end when retention removed everything).
        end: u64,
    },
    /// A batch spanning several partitions failed after the records of
    /// some partitions were written (each partition's share is written
    /// whole or not at all). `landed` has one entry per input record, in
    /// input order: where it was appended, or `None` when it was not. A
    /// retry must send only the `None` ones, or it duplicates the others.
    #[error(
        "{} of {} records of the batch were appended before it failed: {source}",
        landed.iter().filter(|l| l.is_some()).count(),
        landed.len()
    )]
    PartialBatch {
        /// Per input record: where it landed, or `None`.
        landed: Vec<Option<crate::types::Appended>>,
        /// Why the rest was not appended.
        #[source]
        source: Box<Error>,
    },
    /// A saved position (a `Cut`) lies past what the partition holds, or
    /// the record before it is no longer the one that was read: a power
    /// loss cut records the position had passed, and their offsets may
    /// now name new records. Resuming there would skip them silently.
    #[error("position {position} of partition {partition} passed records a crash recovery removed (the partition now ends at {end}); resume from an earlier cut or from the partition's durable records")]
    PositionLost {
        /// Partition id.
        partition: u32,
        /// The saved position.
        position: u64,
        /// The partition's end offset now.
        end: u64,
    },
    /// A Raft entry whose index is not the next one of the partition's log
    /// (`last + 1`), or whose term is below the last entry's.
    #[error("partition {partition} of topic {topic:?} expects Raft index {expected} (term >= {min_term}), got index {index} term {term}")]
    RaftIndexMismatch {
        /// Topic name.
        topic: String,
        /// Partition id.
        partition: u32,
        /// The index the next entry must have.
        expected: u64,
        /// The lowest term the next entry may have.
        min_term: u64,
        /// The entry's index.
        index: u64,
        /// The entry's term.
        term: u64,
    },
    /// A Raft index the partition's log does not hold.
    #[error("partition {partition} of topic {topic:?} holds no Raft entry {index} (it holds {first:?}..={last:?})")]
    RaftIndexOutOfRange {
        /// Topic name.
        topic: String,
        /// Partition id.
        partition: u32,
        /// The index asked for.
        index: u64,
        /// First index held, if any.
        first: Option<u64>,
        /// Last index held, if any.
        last: Option<u64>,
    },
    /// A truncation would remove records below the committed end: Raft
    /// never truncates committed entries, and readers may have seen them.
    #[error("partition {partition}: a cut at offset {offset} is below the committed end {committed_end}")]
    TruncateBelowCommitted {
        /// Partition id.
        partition: u32,
        /// First record offset the cut would remove.
        offset: u64,
        /// The committed end offset it must not go below.
        committed_end: u64,
    },
    /// The call needs a replicated partition (or an unreplicated one): a
    /// replicated partition takes appends only as Raft entries.
    #[error("partition {partition} of topic {topic:?} is {}replicated", if *.replicated { "" } else { "not " })]
    ReplicationMismatch {
        /// Topic name.
        topic: String,
        /// Partition id.
        partition: u32,
        /// Whether the partition is replicated.
        replicated: bool,
    },
    /// The partition is sealed (split or merged) and takes no appends.
    #[error("partition {partition} of topic {topic:?} is sealed")]
    Sealed {
        /// Topic name.
        topic: String,
        /// Partition id.
        partition: u32,
    },
    /// A previous fsync failed; the partition refuses writes until reopened.
    #[error(
        "partition {partition} of topic {topic:?} is poisoned by an earlier failed sync: {reason}"
    )]
    Poisoned {
        /// Topic name.
        topic: String,
        /// Partition id.
        partition: u32,
        /// The original failure.
        reason: String,
    },
    /// A manifest I/O operation failed, so the log no longer knows whether
    /// its last topology change is on disk (or its journal handle is still
    /// the file replay will read). Every later topology change, append and
    /// sync is refused until the log is reopened; reopening replays what
    /// reached the disk.
    #[error("the log is poisoned by an earlier manifest I/O failure (reopen it): {reason}")]
    LogPoisoned {
        /// The original failure.
        reason: String,
    },
    /// A configuration value is out of its allowed range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A duration option is out of its allowed range (for example a zero
    /// interval that would make a background thread spin).
    #[error("invalid {option}: {value:?}; {reason}")]
    InvalidDuration {
        /// The option, by its field name.
        option: &'static str,
        /// The value given.
        value: std::time::Duration,
        /// What it must be instead.
        reason: &'static str,
    },
    /// A topology change was refused (ranges not adjacent, limits, state).
    #[error("topology change refused: {0}")]
    Refused(String),
    /// A saved cursor does not belong to this topic or is malformed.
    #[error("invalid cut: {0}")]
    InvalidCut(String),
    /// The log has been closed.
    #[error("the log is closed")]
    Closed,
    /// A group member was declared dead (no heartbeat for its session
    /// timeout), left, or belongs to an earlier run of the log: it owns
    /// nothing, and its polls and commits are refused. Join again.
    #[error("member {member} of group {group:?} is fenced: {reason}")]
    Fenced {
        /// Group name.
        group: String,
        /// Member id.
        member: u64,
        /// Why.
        reason: String,
    },
    /// A commit named a partition the member does not own (any more): it
    /// was moved to another member. Nothing of the commit was applied.
    #[error("member {member} of group {group:?} does not own partition {partition}; nothing was committed")]
    NotAssigned {
        /// Group name.
        group: String,
        /// Member id.
        member: u64,
        /// The partition.
        partition: u32,
    },
    /// The OS refused to start one of the engine's threads (EAGAIN: a
    /// limit on threads or memory). Retry once the limit allows: a
    /// [`crate::Log::open`] that fails this way had finished recovery, so
    /// the directory is consistent and the next open recovers it again.
    #[error("cannot start thread {thread:?}: {source}")]
    ThreadSpawn {
        /// The thread's name.
        thread: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// No consumer group of that name in the topic.
    #[error("no consumer group {0:?}")]
    UnknownGroup(String),
    /// A commit named a split child before its parents were committed as
    /// read (in this commit or an earlier one): the child's records follow
    /// the parent's per key, so the group cannot pass the parent by it.
    /// Commit the parent to its seal first, or with the child. Nothing of
    /// the commit was applied.
    #[error("member {member} of group {group:?} committed split child {partition} before its parents are committed as read; nothing was committed")]
    CommitBeforeParent {
        /// Group name.
        group: String,
        /// Member id.
        member: u64,
        /// The split child.
        partition: u32,
    },
    /// A hot-key mode the topic's [`crate::HotKeyPolicy`] does not allow,
    /// or with invalid parameters (zero lanes, more than `max_lanes`, a
    /// zero window). Nothing was changed.
    #[error("hot-key mode {mode:?} refused in topic {topic:?}: {reason}")]
    HotKeyMode {
        /// Topic name.
        topic: String,
        /// The mode asked for.
        mode: crate::types::HotKeyMode,
        /// Why it was refused.
        reason: String,
    },
}

impl Error {
    /// Wraps an I/O error with the path it concerns, mapping ENOSPC to [`Error::NoSpace`].
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Error {
        let path = path.into();
        if source.raw_os_error() == Some(libc::ENOSPC) {
            Error::NoSpace { path }
        } else {
            Error::Io { path, source }
        }
    }

    /// An [`Error::Io`] for too many open files (EMFILE, ENFILE) or no
    /// memory (ENOMEM) as [`Error::ResourceExhausted`]; any other error
    /// as it is.
    pub(crate) fn resource_typed(self) -> Error {
        match self {
            Error::Io { path, source } => match source.raw_os_error() {
                Some(libc::EMFILE | libc::ENFILE) => Error::ResourceExhausted {
                    resource: Resource::Descriptors,
                    path,
                    source,
                },
                Some(libc::ENOMEM) => Error::ResourceExhausted {
                    resource: Resource::Mappings,
                    path,
                    source,
                },
                _ => Error::Io { path, source },
            },
            e => e,
        }
    }

    /// A failed `mmap` of `path`: ENOMEM (and EMFILE, ENFILE, which a
    /// hook may inject) as [`Error::ResourceExhausted`].
    pub(crate) fn mapping(path: &std::path::Path, source: io::Error) -> Error {
        Error::io(path, source).resource_typed()
    }

    /// Whether this is [`Error::ResourceExhausted`], or an [`Error::Io`]
    /// that would become one.
    pub(crate) fn is_resource_shortage(&self) -> bool {
        match self {
            Error::ResourceExhausted { .. } => true,
            Error::Io { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
            ),
            _ => false,
        }
    }

    /// Builds a [`Error::Corruption`].
    pub fn corruption(file: impl Into<PathBuf>, position: u64, reason: impl Into<String>) -> Error {
        Error::Corruption {
            file: file.into(),
            position,
            reason: reason.into(),
        }
    }
}

/// What a process ran out of ([`Error::ResourceExhausted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Resource {
    /// File descriptors (EMFILE: `RLIMIT_NOFILE`; ENFILE: the system's).
    Descriptors,
    /// Memory mappings (ENOMEM: memory, or `vm.max_map_count`).
    Mappings,
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Resource::Descriptors => "file descriptors",
            Resource::Mappings => "memory mappings",
        })
    }
}

/// Adds a path to `io::Result`s.
pub(crate) trait IoContext<T> {
    /// Attaches `path` to the error.
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| Error::io(path, e))
    }
}
