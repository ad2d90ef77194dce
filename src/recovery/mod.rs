//! Recovery: turning whatever a crash left into a consistent log, and
//! saying exactly what was done.

pub(crate) mod partition;
pub(crate) mod scan;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

/// Offsets `[start, end)`. In JSON, `[start, end]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OffsetRange {
    /// The first offset of the range.
    pub start: u64,
    /// The offset after its last.
    pub end: u64,
}

impl OffsetRange {
    /// The offsets as a `Range`.
    pub fn as_range(&self) -> std::ops::Range<u64> {
        self.start..self.end
    }
}

impl From<std::ops::Range<u64>> for OffsetRange {
    fn from(r: std::ops::Range<u64>) -> OffsetRange {
        OffsetRange {
            start: r.start,
            end: r.end,
        }
    }
}

impl Serialize for OffsetRange {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (self.start, self.end).serialize(s)
    }
}

/// Offsets of one partition that read as a hole after recovery: salvaged
/// damage, or data whose file was missing. In JSON, `[topic, partition,
/// start, end]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hole {
    /// The topic's name.
    pub topic: String,
    /// The partition's id.
    pub partition: u32,
    /// The lost offsets.
    pub offsets: OffsetRange,
}

impl Serialize for Hole {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (
            &self.topic,
            self.partition,
            self.offsets.start,
            self.offsets.end,
        )
            .serialize(s)
    }
}

/// What a crash recovery cut under a group's committed position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LostGroupPosition {
    /// Topic name.
    pub topic: String,
    /// Group name.
    pub group: String,
    /// Partition id.
    pub partition: u32,
    /// The committed position.
    pub committed: u64,
    /// Where the partition ends now; the group resumes here.
    pub end: u64,
}

/// What recovery did to one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FileAction {
    /// A torn tail (unsynced writes) was cut off.
    TruncatedTornTail {
        /// New end of data.
        position: u64,
        /// Why the batch there was invalid.
        reason: String,
        /// Valid-looking unsynced batches after the tear were discarded.
        discarded_later_batches: bool,
    },
    /// Corruption in synced data was cut off (truncate mode).
    TruncatedCorruption {
        /// New end of data.
        position: u64,
        /// What was wrong.
        reason: String,
        /// Offsets lost from here (exclusive end unknown when None).
        first_lost_offset: u64,
    },
    /// Damaged batches were replaced by a hole (salvage mode).
    Salvaged {
        /// Position of the damage.
        position: u64,
        /// The offsets lost with the damage.
        lost_offsets: OffsetRange,
    },
    /// A segment after the truncation point was deleted.
    DeletedSegment {
        /// Why.
        reason: String,
    },
    /// An index was rebuilt from its segment; in `verify`'s report, an
    /// index of the format's first version that an open will rebuild.
    RebuiltIndex,
    /// A file from an uncommitted topology change was removed.
    RemovedOrphan,
    /// A topic or partition directory the manifest no longer knows because
    /// damaged manifest records were cut (truncate/salvage): it may hold
    /// synced data, so it was renamed, not deleted.
    SetAsideOrphan {
        /// Where it was moved.
        moved_to: PathBuf,
    },
    /// A file fissionlog does not know; left untouched.
    ForeignFile,
    /// A missing active segment was recreated empty.
    CreatedSegment,
    /// A segment file or partition directory that held data the checkpoint
    /// or the manifest knows of is missing (Truncate and Salvage go on
    /// without it; Strict refuses). The offsets are never handed out again:
    /// they read as a hole.
    MissingData {
        /// The offsets that were lost with it.
        lost_offsets: OffsetRange,
    },
    /// A checkpoint file was invalid (the other one was used).
    InvalidCheckpoint {
        /// Why.
        reason: String,
    },
    /// A tail split's descendant index is missing or damaged (Truncate and
    /// Salvage go on; Strict refuses). Which moved record went to which
    /// child is lost: a position saved inside the moved range resumes the
    /// children at their first moved record, so records may be delivered
    /// again; none is skipped. Reported at every open.
    DescendantIndexLost {
        /// The tail-split parent.
        parent: u32,
        /// Its moved range `[from, seal)`.
        moved_offsets: (u64, u64),
        /// Why the file is unusable.
        reason: String,
    },
}

/// One entry of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileReport {
    /// The file.
    pub file: PathBuf,
    /// What was done.
    #[serde(flatten)]
    pub action: FileAction,
}

/// Everything `open` found and did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecoveryReport {
    /// The log was closed cleanly: no data was scanned.
    pub clean_shutdown: bool,
    /// A valid checkpoint was found.
    pub checkpoint_found: bool,
    /// Segment files opened.
    pub segments_opened: u64,
    /// Bytes of segment data validated.
    pub bytes_scanned: u64,
    /// Records found while scanning.
    pub records_scanned: u64,
    /// Manifest replay.
    pub manifest: crate::topology::manifest::ManifestReport,
    /// Per-file actions.
    pub files: Vec<FileReport>,
    /// Offsets that read as holes: salvaged damage and missing data.
    pub holes: Vec<Hole>,
    /// Consumer group positions past what recovery kept: moved back to the
    /// partition's end (durably, before any append) and reported here.
    pub group_positions_lost: Vec<LostGroupPosition>,
    /// Wall time of open.
    #[serde(serialize_with = "ser_duration_ms")]
    pub duration: Duration,
}

fn ser_duration_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

impl RecoveryReport {
    pub(crate) fn add(&mut self, file: impl Into<PathBuf>, action: FileAction) {
        self.files.push(FileReport {
            file: file.into(),
            action,
        });
    }

    /// Whether recovery changed or discarded anything.
    pub fn changed_anything(&self) -> bool {
        self.files
            .iter()
            .any(|f| !matches!(f.action, FileAction::ForeignFile | FileAction::RebuiltIndex))
            || self.manifest.torn_tail.is_some()
            || self.manifest.corruption_truncated.is_some()
            || !self.group_positions_lost.is_empty()
    }
}
