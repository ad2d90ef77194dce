//! Manifest journal and snapshot framing.
//!
//! The manifest is the topology: topics, partitions, key ranges, lineage.
//! It is an append-only journal of CRC-framed records; a topology change is
//! committed exactly when its record is durable. Now and then the journal is
//! compacted into a snapshot (tmp + fsync + rename + fsync(dir)).
//!
//! ```text
//! file header (16 bytes): magic (8) | version u16 | reserved (6)
//!   journal magic b"FSNLMAN\0", snapshot magic b"FSNLSNP\0"
//! frame: payload_len u32 | crc u32 (of seq and payload) | seq u64 | payload
//! ```
//!
//! Payloads are JSON (serde) of [`ManifestRecord`] or [`ManifestState`]:
//! topology changes are rare and small, and JSON keeps the manifest readable
//! with a hex dump and extensible without a format bump. A topic's
//! configuration is a [`TopicConfigRecord`], the format's own type: the
//! public config types never reach the encoding.

use serde::{Deserialize, Serialize};

pub use super::config_record::TopicConfigRecord;

/// Journal magic.
pub const JOURNAL_MAGIC: [u8; 8] = *b"FSNLMAN\0";
/// Snapshot magic.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"FSNLSNP\0";
/// Manifest format version this build writes. Version 2 added consumer
/// group records ([`ManifestRecord::GroupCommit`], [`TopicRecord::groups`]);
/// a build that reads only version 1 refuses a version 2 file rather than
/// cut the group records it cannot parse as damage. Version 3 added tail
/// splits ([`ManifestRecord::TailSplit`], [`TopicRecord::tail_moves`],
/// [`ManifestRecord::TailReclaimed`]) and hot-key mode records
/// ([`ManifestRecord::HotKeyMode`], [`TopicRecord::hot_keys`]).
pub const MANIFEST_VERSION: u16 = 3;
/// Oldest manifest format version this build reads.
pub const MANIFEST_MIN_VERSION: u16 = 1;
/// File header length.
pub const MANIFEST_HEADER_LEN: usize = 16;
/// Frame header length.
pub const FRAME_HEADER_LEN: usize = 16;
/// Largest payload accepted (a bound against garbage lengths).
pub const MAX_PAYLOAD: usize = 64 << 20;

/// State of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartitionState {
    /// Takes appends.
    Active,
    /// Sealed by a split or merge: holds offsets `< end_offset`.
    Sealed {
        /// End offset (exclusive).
        end_offset: u64,
    },
}

/// A partition as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRecord {
    /// Id, unique in its topic, never reused.
    pub id: u32,
    /// First hash value owned (inclusive).
    pub start: u64,
    /// Last hash value owned (inclusive).
    pub end: u64,
    /// Parents: none for initial partitions, one after a split, two after a merge.
    pub parents: Vec<u32>,
    /// Active or sealed.
    pub state: PartitionState,
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
    /// Parents removed from the topology (retention emptied them), each
    /// with the end offset it was sealed at: what a reader resuming with a
    /// position in one needs to tell a drained position from a lost range.
    /// Filled in when a `RemovePartition` record applies; absent (empty)
    /// otherwise, and in manifests written before removals existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_parents: Vec<(u32, u64)>,
}

/// A topic as the manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicRecord {
    /// Topic id, unique in the log, never reused.
    pub id: u32,
    /// Topic name.
    pub name: String,
    /// Configuration, in the manifest's own record (converted to and from
    /// the public `TopicConfig` in `config.rs`).
    pub config: TopicConfigRecord,
    /// SipHash-1-3 key for routing.
    pub hash_key: [u64; 2],
    /// Next partition id to hand out.
    pub next_partition_id: u32,
    /// Every partition that still holds data or is active.
    pub partitions: Vec<PartitionRecord>,
    /// Consumer groups of the topic with their committed positions
    /// (format version 2; absent before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupRecord>,
    /// Partitions retention emptied and removed, with their parents and
    /// seal: what a reader resuming before them needs to report each one,
    /// also once no partition left names it. Absent in manifests written
    /// before it existed (a build that does not know it ignores it, and
    /// reports less, as it did).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<RemovedPartition>,
    /// Tail splits whose parent is still in the topology: where each
    /// parent logically ends and where its moved records went (format
    /// version 3; absent before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tail_moves: Vec<TailMove>,
    /// Keys given a hot-key mode, with every mode era they went through
    /// (format version 3; absent before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hot_keys: Vec<HotKeyRecord>,
}

/// A partition removed from the topology (see [`TopicRecord::removed`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedPartition {
    /// Its id (never reused).
    pub id: u32,
    /// Its parents.
    pub parents: Vec<u32>,
    /// The offset it was sealed at.
    pub end_offset: u64,
}

/// A committed tail split, as the topic remembers it while its parent is
/// in the topology or its `removed` list (see
/// [`TailMove::index_in_topic_dir`]). The parent is sealed at `seal_offset` (its physical
/// end, what recovery checks its files against) but logically ends at
/// `from`: its records `from..seal_offset` were copied into `children`,
/// child `children[i]` holding `counts[i]` of them at its offsets
/// `0..counts[i]`, in their parent order. Which child holds which parent
/// offset is the descendant index, a file in the topic's directory (the
/// first child's for older splits; see `docs/FORMAT.md`) whose CRC-32 is
/// `index_crc`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailMove {
    /// The parent partition.
    pub parent: u32,
    /// First moved offset: the parent's logical end.
    pub from: u64,
    /// The parent's physical end (its seal).
    pub seal_offset: u64,
    /// Children in range order.
    pub children: Vec<u32>,
    /// Moved records per child (same order as `children`).
    pub counts: Vec<u64>,
    /// CRC-32 (IEEE) of the descendant index file.
    pub index_crc: u32,
    /// The parent's bytes past `from` were released (a
    /// [`ManifestRecord::TailReclaimed`] record): from then on its files
    /// may end anywhere in `from..seal_offset`, and that is not a loss.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reclaimed: bool,
    /// The descendant index lives in the topic's directory, and the entry
    /// stays while the topology or the topic's `removed` list names the
    /// parent. Absent (false) for splits written before: their index is
    /// in the first child's directory, and the entry goes with that child.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub index_in_topic_dir: bool,
}

/// A consumer group's committed position translated by a tail split: the
/// position it had in the parent, past the parent's new logical end,
/// becomes one position per child (the first moved record at or after
/// it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailGroupMove {
    /// Group name.
    pub group: String,
    /// Position per child.
    pub positions: Vec<(u32, u64)>,
}

/// One period of a hot key's routing, from a mode change to the next.
///
/// Lanes are hash points: a lane's records go to the active partition
/// owning its point, so a lane follows splits and merges exactly like a
/// key with that hash would (its lineage chain keeps its order). `starts`
/// bounds the era in offsets: at the change, no append of the key was in
/// flight, and each partition listed then held this many records; the
/// key's records of this era in a listed partition sit at or above it,
/// those of the previous era below it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotKeyEra {
    /// The mode of the era.
    pub mode: crate::types::HotKeyMode,
    /// Lane hash points; `lanes[0]` is the key's own hash (so `Strict` is
    /// `[hash]`).
    pub lanes: Vec<u64>,
    /// The time of the change (ms since the epoch). Windowed: the anchor
    /// of the rotation, its first window being the one holding it: window
    /// `w` (timestamp / window length) goes to lane `(w - first window)
    /// mod lanes`, wrapping. Records may carry earlier timestamps (the
    /// caller's, raised only to the key's newest in the era), which rotate
    /// the same way.
    pub from_ms: i64,
    /// End offset, at the change, of every active partition that owned a
    /// lane point of this era or of the previous one.
    pub starts: Vec<(u32, u64)>,
}

/// A key (by routing hash) that was given a hot-key mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotKeyRecord {
    /// The key's routing hash (keys sharing a hash share their mode, as
    /// they share their partition).
    pub hash: u64,
    /// Its eras, oldest first; the last is in force. Before the first,
    /// the key was `Strict`.
    pub eras: Vec<HotKeyEra>,
}

/// A consumer group's committed positions in one topic, in the form of a
/// reader's cut: the next offset per partition of the group's frontier,
/// and the partitions read to their seal whose children are not all
/// listed yet. Every ancestor of a listed partition counts as read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// Group name.
    pub name: String,
    /// Highest member generation that committed: a restarted log hands out
    /// generations above it, so a member of an earlier run is fenced.
    pub generation: u64,
    /// Next offset to consume per partition.
    pub positions: std::collections::BTreeMap<u32, u64>,
    /// Per listed partition, the fingerprint of the record before its
    /// position (see the reader's cut): tells a committed position that
    /// crash recovery cut below from one still naming what was consumed.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub last_records: std::collections::BTreeMap<u32, u64>,
    /// Partitions read to their seal whose children are not all listed.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub drained: std::collections::BTreeSet<u32>,
}

/// One partition's part of a [`ManifestRecord::GroupCommit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPosition {
    /// Partition id.
    pub partition: u32,
    /// Next offset to consume.
    pub offset: u64,
    /// Fingerprint of the record before `offset`, when one was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_record: Option<u64>,
}

/// One committed topology change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ManifestRecord {
    /// A topic was created with its initial partitions.
    CreateTopic(TopicRecord),
    /// A topic was deleted.
    DeleteTopic {
        /// Its id.
        topic_id: u32,
    },
    /// A partition was sealed at `seal_offset` and replaced by `children`.
    Split {
        /// Topic id.
        topic_id: u32,
        /// The split partition.
        parent: u32,
        /// Its end offset from now on.
        seal_offset: u64,
        /// Children, tiling the parent's range.
        children: Vec<PartitionRecord>,
    },
    /// Two adjacent partitions were sealed and replaced by one child.
    Merge {
        /// Topic id.
        topic_id: u32,
        /// The two parents and their end offsets.
        parents: Vec<(u32, u64)>,
        /// The child.
        child: PartitionRecord,
    },
    /// A sealed partition whose data all expired left the topology.
    RemovePartition {
        /// Topic id.
        topic_id: u32,
        /// Partition id.
        partition: u32,
    },
    /// A topic's configuration changed.
    UpdateConfig {
        /// Topic id.
        topic_id: u32,
        /// New configuration.
        config: TopicConfigRecord,
    },
    /// A consumer group committed positions (creating the group if it is
    /// new): atomic across every partition it names.
    GroupCommit {
        /// Topic id.
        topic_id: u32,
        /// Group name.
        group: String,
        /// Generation of the member that committed.
        generation: u64,
        /// New positions.
        positions: Vec<GroupPosition>,
        /// Partitions read to their seal: they leave the positions.
        drained: Vec<u32>,
        /// Drained partitions that no longer need listing (their children
        /// are all listed now).
        pruned: Vec<u32>,
    },
    /// A tail split: the parent is sealed at `seal_offset` and replaced by
    /// `children` (as [`ManifestRecord::Split`]), and its records
    /// `from..seal_offset` were copied into the children before the record
    /// (synced, with the descendant index file): the parent logically
    /// ends at `from` (format version 3).
    TailSplit {
        /// Topic id.
        topic_id: u32,
        /// The split partition.
        parent: u32,
        /// First moved offset (the parent's logical end from now on).
        from: u64,
        /// Its physical end offset.
        seal_offset: u64,
        /// Children, tiling the parent's range.
        children: Vec<PartitionRecord>,
        /// Moved records per child, in `children` order.
        counts: Vec<u64>,
        /// CRC-32 (IEEE) of the descendant index file.
        index_crc: u32,
        /// Group positions inside the moved range, translated.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        groups: Vec<TailGroupMove>,
        /// The descendant index was written into the topic's directory
        /// (see [`TailMove::index_in_topic_dir`]); absent before.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        index_in_topic_dir: bool,
    },
    /// The bytes of a tail-split parent past its logical end are released
    /// from this record on (format version 3; written before the first
    /// byte goes): recovery takes a parent ending anywhere in its moved
    /// range for reclaimed, not lost, and the open finishes the release.
    TailReclaimed {
        /// Topic id.
        topic_id: u32,
        /// The tail-split parent.
        parent: u32,
        /// The descendant index of a split written before
        /// [`TailMove::index_in_topic_dir`] was copied into the topic's
        /// directory (durably, before this record): the entry follows the
        /// new rule from now on. Absent (false) otherwise.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        index_in_topic_dir: bool,
    },
    /// A key entered a new hot-key mode era (format version 3).
    HotKeyMode {
        /// Topic id.
        topic_id: u32,
        /// The key's routing hash.
        hash: u64,
        /// The new era.
        era: HotKeyEra,
    },
    /// A consumer group was deleted with its positions.
    DeleteGroup {
        /// Topic id.
        topic_id: u32,
        /// Group name.
        group: String,
    },
}

/// The whole topology (snapshot payload).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ManifestState {
    /// Next topic id to hand out.
    pub next_topic_id: u32,
    /// Live topics.
    pub topics: Vec<TopicRecord>,
}

/// Encodes a file header.
pub fn encode_file_header(magic: [u8; 8]) -> [u8; MANIFEST_HEADER_LEN] {
    let mut out = [0u8; MANIFEST_HEADER_LEN];
    out[..8].copy_from_slice(&magic);
    out[8..10].copy_from_slice(&MANIFEST_VERSION.to_le_bytes());
    out
}

/// The version of a manifest file (`magic` matches) written by a newer
/// format than this build reads; such a file is refused, never repaired.
pub fn newer_version(buf: &[u8], magic: [u8; 8]) -> Option<u16> {
    let version = u16::from_le_bytes([*buf.get(8)?, *buf.get(9)?]);
    (buf[..8] == magic && version > MANIFEST_VERSION).then_some(version)
}

/// The format version a manifest file's header names (None: too short).
pub fn file_version(buf: &[u8]) -> Option<u16> {
    Some(u16::from_le_bytes([*buf.get(8)?, *buf.get(9)?]))
}

impl ManifestRecord {
    /// The oldest manifest format version that can hold this record.
    pub fn min_version(&self) -> u16 {
        match self {
            ManifestRecord::GroupCommit { .. } | ManifestRecord::DeleteGroup { .. } => 2,
            ManifestRecord::TailSplit { .. }
            | ManifestRecord::TailReclaimed { .. }
            | ManifestRecord::HotKeyMode { .. } => 3,
            _ => 1,
        }
    }
}

/// Checks a file header; returns a reason when it is wrong.
pub fn check_file_header(buf: &[u8], magic: [u8; 8]) -> Result<(), String> {
    if buf.len() < MANIFEST_HEADER_LEN {
        return Err("file shorter than its header".into());
    }
    if buf[..8] != magic {
        return Err("bad magic".into());
    }
    let version = u16::from_le_bytes([buf[8], buf[9]]);
    if !(MANIFEST_MIN_VERSION..=MANIFEST_VERSION).contains(&version) {
        return Err(format!("unsupported manifest version {version}"));
    }
    Ok(())
}

/// Encodes one frame.
pub fn encode_frame(seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(payload);
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// A frame read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Sequence number.
    pub seq: u64,
    /// Payload bytes.
    pub payload: &'a [u8],
    /// Total frame length.
    pub len: usize,
}

/// Decodes the frame at the start of `buf`, or says why it is not one.
pub fn decode_frame(buf: &[u8]) -> Result<Frame<'_>, &'static str> {
    if buf.len() < FRAME_HEADER_LEN {
        return Err("truncated frame header");
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let crc = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    if len == 0 && crc == 0 {
        return Err("zeroed frame");
    }
    if len > MAX_PAYLOAD || FRAME_HEADER_LEN + len > buf.len() {
        return Err("frame length out of bounds");
    }
    let body = &buf[8..FRAME_HEADER_LEN + len];
    if crc32fast::hash(body) != crc {
        return Err("frame CRC mismatch");
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&buf[8..16]);
    Ok(Frame {
        seq: u64::from_le_bytes(seq),
        payload: &buf[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len],
        len: FRAME_HEADER_LEN + len,
    })
}

/// How a journal ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalTail {
    /// Every byte after the header belongs to a valid frame (or is zero).
    Clean,
    /// An invalid frame with nothing valid after it: a torn last write.
    Torn {
        /// Where the valid journal ends.
        position: u64,
        /// Why the frame there was rejected.
        reason: &'static str,
    },
    /// An invalid region followed by a valid frame: damage, not a torn write.
    Corrupt {
        /// Where the invalid region starts.
        position: u64,
        /// Why the frame there was rejected.
        reason: &'static str,
        /// Where the next valid frame starts.
        resumes_at: u64,
    },
}

/// A decoded journal: frames in order (with their positions) and how it ends.
#[derive(Debug)]
pub struct DecodedJournal<'a> {
    /// Valid frames before the first invalid one.
    pub frames: Vec<(u64, Frame<'a>)>,
    /// End of the valid prefix, in bytes.
    pub valid_end: u64,
    /// What follows the valid prefix.
    pub tail: JournalTail,
}

/// Decodes a journal file (header included). Seq numbers must increase.
pub fn decode_journal(buf: &[u8]) -> Result<DecodedJournal<'_>, String> {
    check_file_header(buf, JOURNAL_MAGIC)?;
    let mut pos = MANIFEST_HEADER_LEN;
    let mut frames = Vec::new();
    let mut last_seq = 0u64;
    loop {
        if pos >= buf.len() || buf[pos..].iter().all(|&b| b == 0) {
            return Ok(DecodedJournal {
                frames,
                valid_end: pos as u64,
                tail: JournalTail::Clean,
            });
        }
        let reason = match decode_frame(&buf[pos..]) {
            Ok(f) if f.seq > last_seq => {
                last_seq = f.seq;
                let len = f.len;
                frames.push((pos as u64, f));
                pos += len;
                continue;
            }
            Ok(_) => "sequence number does not increase",
            Err(reason) => reason,
        };
        let resumes = (pos + 1..buf.len())
            .find(|&p| matches!(decode_frame(&buf[p..]), Ok(f) if f.seq > last_seq));
        let tail = match resumes {
            Some(r) => JournalTail::Corrupt {
                position: pos as u64,
                reason,
                resumes_at: r as u64,
            },
            None => JournalTail::Torn {
                position: pos as u64,
                reason,
            },
        };
        return Ok(DecodedJournal {
            frames,
            valid_end: pos as u64,
            tail,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal(payloads: &[&[u8]]) -> Vec<u8> {
        let mut v = encode_file_header(JOURNAL_MAGIC).to_vec();
        for (i, p) in payloads.iter().enumerate() {
            v.extend(encode_frame(i as u64 + 1, p));
        }
        v
    }

    #[test]
    fn round_trip_and_zero_tail() {
        let mut j = journal(&[b"a", b"bb"]);
        j.extend_from_slice(&[0; 100]);
        let d = decode_journal(&j).unwrap();
        assert_eq!(d.frames.len(), 2);
        assert_eq!(d.frames[1].1.payload, b"bb");
        assert_eq!(d.tail, JournalTail::Clean);
    }

    #[test]
    fn torn_tail_vs_corruption() {
        let j = journal(&[b"aaaa", b"bbbb", b"cccc"]);
        let third = j.len() - (FRAME_HEADER_LEN + 4);
        let mut torn = j.clone();
        torn[third + 17] ^= 1;
        let d = decode_journal(&torn).unwrap();
        assert_eq!(d.frames.len(), 2);
        assert!(matches!(d.tail, JournalTail::Torn { position, .. } if position as usize == third));
        let second = third - (FRAME_HEADER_LEN + 4);
        let mut bad = j;
        bad[second + 17] ^= 1;
        let d = decode_journal(&bad).unwrap();
        assert_eq!(d.frames.len(), 1);
        assert!(
            matches!(d.tail, JournalTail::Corrupt { resumes_at, .. } if resumes_at as usize == third)
        );
    }

    /// A tail split written before the descendant index moved to the
    /// topic's directory loads with `index_in_topic_dir` false, and only
    /// a true flag is written out.
    #[test]
    fn tail_split_payloads_without_the_index_flag_still_load() {
        let old = r#"{"TailSplit":{"topic_id":0,"parent":0,"from":4,"seal_offset":10,"children":[],"counts":[6],"index_crc":7}}"#;
        let rec: ManifestRecord = serde_json::from_str(old).unwrap();
        assert!(matches!(
            rec,
            ManifestRecord::TailSplit {
                index_in_topic_dir: false,
                ..
            }
        ));
        assert_eq!(serde_json::to_string(&rec).unwrap(), old);
        let old_move =
            r#"{"parent":0,"from":4,"seal_offset":10,"children":[1],"counts":[6],"index_crc":7}"#;
        let mut m: TailMove = serde_json::from_str(old_move).unwrap();
        assert!(!m.index_in_topic_dir && !m.reclaimed);
        m.index_in_topic_dir = true;
        assert!(serde_json::to_string(&m)
            .unwrap()
            .contains(r#""index_in_topic_dir":true"#));
    }

    #[test]
    fn headers_are_checked() {
        assert!(decode_journal(b"short").is_err());
        let mut j = journal(&[]);
        j[0] = b'X';
        assert!(decode_journal(&j).is_err());
        let mut j = journal(&[]);
        j[8] = 9;
        assert!(decode_journal(&j).is_err());
        assert!(decode_frame(&[0xff; 16]).is_err());
    }
}
