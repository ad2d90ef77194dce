//! What repair does with each segment file of a chain, decided without any
//! I/O from what phase one found (the file's header, or the proof it is
//! damaged) and from how far the chain got. [`super::apply`] carries the
//! verdicts out.

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::config::RecoveryMode;
use crate::error::Error;
use crate::format::checkpoint::PartitionCheckpoint;
use crate::format::segment::HeaderInfo;
use crate::storage::segment::segment_file_name;

use super::{ChainParams, RecoverMode};

/// Whether the chain was cut before the file at hand, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CutState {
    /// No cut: the file may continue the chain.
    None,
    /// Cut at a torn tail of unsynced writes: later unsynced segments are
    /// deleted, later synced ones set aside.
    Unsynced,
    /// Cut in synced data (Truncate, a missing segment): every later
    /// segment is set aside, never deleted, and the offsets it held count
    /// as handed out.
    Synced,
}

/// How far repair got along the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The offset the next segment must start at (`None` only after a cut
    /// before the first file).
    pub expected: Option<u64>,
    /// Offsets known to have been handed out: what the checkpoint calls
    /// durable, what segments set aside held, the manifest's seal.
    pub known_end: u64,
    /// Whether (and where) the chain was cut.
    pub cut: CutState,
    /// The last segment kept so far is sealed and ends at this offset (a
    /// roll created the segment after it before sealing it).
    pub complete_until: Option<u64>,
    /// Base offset of the last segment kept so far.
    pub last_kept: Option<u64>,
}

impl Cursor {
    /// The cursor before the first file: nothing cut, nothing kept.
    pub fn start(known_end: u64) -> Cursor {
        Cursor {
            expected: None,
            known_end,
            cut: CutState::None,
            complete_until: None,
            last_kept: None,
        }
    }

    /// Cuts the chain. A cut never heals, and one in synced data stays one.
    pub fn cut_at(&mut self, cut: CutState) {
        self.cut = self.cut.max(cut);
    }

    /// Offsets below `end` were handed out.
    pub fn handed_out(&mut self, end: u64) {
        self.known_end = self.known_end.max(end);
    }

    /// A segment joined the chain: the next one starts where it ends.
    pub fn kept(&mut self, end_offset: u64, sealed: bool) {
        self.expected = Some(end_offset);
        self.complete_until = sealed.then_some(end_offset);
    }
}

/// The facts repair knows about one segment file before touching it.
#[derive(Debug, Clone, Copy)]
pub struct FileFacts<'a> {
    /// The base offset its name gives.
    pub base: u64,
    /// Its path.
    pub path: &'a Path,
    /// What phase one found in it.
    pub kind: FileKind<'a>,
}

/// What phase one found in a segment file.
#[derive(Debug, Clone, Copy)]
pub enum FileKind<'a> {
    /// Below the retention floor: retired, not opened.
    Retired,
    /// Its header decodes.
    Opened(&'a HeaderInfo),
    /// Its bytes prove damage.
    Damaged(&'a Error),
}

/// What the checkpoint says about one segment.
#[derive(Debug, Clone, Copy)]
pub struct SyncKnowledge<'a> {
    /// A segment before the checkpoint's: synced whole, up to its seal.
    pub durable_segment: bool,
    /// The checkpoint names this segment: synced up to its position.
    pub checkpoint: Option<&'a PartitionCheckpoint>,
    /// Salvage of a sealed partition, whose segments were all synced.
    pub sealed_repair: bool,
}

impl SyncKnowledge<'_> {
    /// What `p`'s checkpoint says of the segment based at `base`.
    pub fn of<'a>(base: u64, p: &ChainParams<'a>) -> SyncKnowledge<'a> {
        let cp = p.checkpoint_in_data();
        SyncKnowledge {
            durable_segment: cp.is_some_and(|c| base < c.segment_base),
            checkpoint: cp.filter(|c| c.segment_base == base),
            sealed_repair: p.sealed.is_some() && p.mode.recovery == RecoveryMode::Salvage,
        }
    }

    /// The checkpoint knows some of the segment's data synced.
    pub fn synced(&self) -> bool {
        self.durable_segment || self.checkpoint.is_some()
    }
}

/// How a segment leaves the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposal {
    /// Unlinked (unsynced data, or retired by retention).
    Delete,
    /// Renamed to `<name>.seg.damaged`: it may hold synced data.
    SetAside,
}

/// What repair does with one segment file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The file leaves the chain without a repair decision of its own: it
    /// follows a cut, or retention retired it.
    Discard {
        /// Deleted or set aside.
        disposal: Disposal,
        /// The reason the report gives.
        reason: &'static str,
        /// The chain was cut in synced data: the offsets the file held
        /// were handed out and are never handed out again.
        held_handed_out: bool,
    },
    /// Damage in synced data: refused in Strict, set aside otherwise; the
    /// chain is cut (Truncate) or goes on without it (Salvage).
    Damaged {
        /// What is wrong.
        what: String,
    },
    /// A segment created after the last checkpointed sync whose header
    /// does not decode: removed (after the chain), and the chain is cut.
    TornCreation {
        /// Why the header is invalid.
        reason: String,
    },
    /// A segment that does not continue the chain, written after the last
    /// checkpointed sync: the previous segment's unsynced tail was lost, so
    /// this one is too. Deleted, and the chain is cut.
    FollowsTornTail {
        /// What does not match.
        what: String,
    },
    /// Offsets are missing before this segment: refused in Strict; a hole
    /// in Salvage (then the segment is kept); Truncate cuts before it.
    Gap {
        /// The missing offsets.
        lost: Range<u64>,
        /// The file that should have held them.
        missing_file: PathBuf,
        /// What is missing.
        what: String,
    },
    /// The segment continues the chain: scan (or trust) it and keep it.
    Keep,
}

/// How the mode answers damage in synced data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DamageResponse {
    /// Strict, repairing: the open fails and no file changes.
    Refuse,
    /// Truncate, or an analysis (which notes the problem): the chain is cut
    /// in synced data.
    Cut,
    /// Salvage: the chain goes on without the damaged part.
    Skip,
}

/// How `mode` answers damage in synced data. Pure.
pub fn damage_response(mode: &RecoverMode) -> DamageResponse {
    if !mode.write {
        return DamageResponse::Cut;
    }
    match mode.recovery {
        RecoveryMode::Strict => DamageResponse::Refuse,
        RecoveryMode::Truncate => DamageResponse::Cut,
        RecoveryMode::Salvage => DamageResponse::Skip,
    }
}

/// Why a retired segment is deleted.
pub const RETIRED_BACK: &str = "retired by retention, back after a crash";
/// Why a segment after a cut leaves the chain.
pub const AFTER_CUT: &str = "follows a truncation point";

/// Decides what repair does with `file`, given how far the chain got.
/// Pure: the same facts give the same verdict.
pub fn classify(file: &FileFacts<'_>, cur: &Cursor, p: &ChainParams<'_>) -> Verdict {
    let sync = SyncKnowledge::of(file.base, p);
    if cur.cut != CutState::None {
        return after_cut(file, cur.cut, &sync);
    }
    let info = match file.kind {
        // Retention recorded this segment as retired before unlinking it;
        // a crash brought the file back.
        FileKind::Retired => {
            return Verdict::Discard {
                disposal: Disposal::Delete,
                reason: RETIRED_BACK,
                held_handed_out: false,
            }
        }
        FileKind::Opened(info) => info,
        // A sealed partition's segments were all synced, headers included,
        // before the split or merge that sealed it committed: an unreadable
        // header there is damage, in every mode, never a torn creation
        // (whose later segments would be deleted as unsynced). Salvage
        // keeps the segments after it; Strict refuses the partition below
        // its seal after the chain, naming the offsets; Truncate cuts.
        FileKind::Damaged(e) if sync.synced() || p.sealed.is_some() => {
            let mut what = format!("unreadable segment in synced data: {e}");
            if let Some(seal) = p.sealed.filter(|&s| s > file.base) {
                what.push_str(&format!(
                    " (offsets {}..{seal} of the sealed partition are missing from here on)",
                    file.base
                ));
            }
            return Verdict::Damaged { what };
        }
        // Created after the last checkpointed sync and its header does not
        // decode: a torn creation.
        FileKind::Damaged(e) => {
            return Verdict::TornCreation {
                reason: e.to_string(),
            }
        }
    };
    if info.base_offset != file.base
        || info.topic_id != p.ids.topic
        || info.partition_id != p.ids.partition
    {
        let what = format!(
            "segment header names topic {} partition {} base {} but the file is {}",
            info.topic_id,
            info.partition_id,
            info.base_offset,
            file.path.display()
        );
        return Verdict::Damaged { what };
    }
    match cur.expected {
        Some(exp) if file.base != exp => discontinuity(file.base, exp, cur, &sync, p),
        _ => Verdict::Keep,
    }
}

/// A file after a cut leaves the chain: synced data is set aside, never
/// deleted.
fn after_cut(file: &FileFacts<'_>, cut: CutState, sync: &SyncKnowledge<'_>) -> Verdict {
    let synced_cut = cut == CutState::Synced;
    // A segment a synced cut leaves out held offsets from its base on (to
    // its seal, or to its last valid batch when it has no seal).
    let held_handed_out = synced_cut;
    let (disposal, reason) = if synced_cut && matches!(file.kind, FileKind::Retired) {
        (Disposal::Delete, RETIRED_BACK)
    } else if synced_cut || sync.synced() {
        (Disposal::SetAside, AFTER_CUT)
    } else {
        (Disposal::Delete, AFTER_CUT)
    };
    Verdict::Discard {
        disposal,
        reason,
        held_handed_out,
    }
}

/// A segment that starts elsewhere than where the chain ends, at `exp`.
fn discontinuity(
    base: u64,
    exp: u64,
    cur: &Cursor,
    sync: &SyncKnowledge<'_>,
    p: &ChainParams<'_>,
) -> Verdict {
    // The previous segment holds all its records up to its seal at `exp`:
    // a segment starting at `exp` was created (a roll seals a segment at
    // the base of the next one, after creating it), and its name was
    // durable before any later segment was created (`Partition::roll`). A
    // later segment here with none at `exp` means a segment file is
    // missing, not a torn tail.
    let after_complete = cur.complete_until == Some(exp);
    let known_synced = sync.synced() || sync.sealed_repair;
    if !(known_synced || (after_complete && base > exp)) {
        return Verdict::FollowsTornTail {
            what: format!("segment starts at offset {base}, expected {exp}"),
        };
    }
    if base > exp {
        // Segments are missing between two that are here: named by the
        // checkpoint as synced, or created before this one and after a
        // complete segment.
        // After a segment complete up to its seal, the file at `exp` is
        // missing; otherwise the chain ends early inside a file that is
        // there (a segment that lost records, or lost its seal), and the
        // problem names that file, not one that was never expected.
        let short = cur.last_kept.filter(|_| !after_complete);
        let (missing_file, what) = match short {
            Some(kept) => {
                let file = p.dir.join(segment_file_name(kept));
                let what = format!(
                    "offsets {exp}..{base} are missing: segment file {} ends at offset {exp} but the next segment starts at {base}",
                    file.display()
                );
                (file, what)
            }
            None => {
                let gap = p.dir.join(segment_file_name(exp));
                let what = format!(
                    "offsets {exp}..{base} are missing: the chain ends at {exp} and there is no segment file {}",
                    gap.display()
                );
                (gap, what)
            }
        };
        return Verdict::Gap {
            lost: exp..base,
            missing_file,
            what,
        };
    }
    Verdict::Damaged {
        what: format!("segment starts at offset {base}, expected {exp}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RecoveryMode;
    use crate::recovery::partition::PartitionIds;
    use crate::storage::fault::NoFaults;

    fn params<'a>(cp: Option<&'a PartitionCheckpoint>, recovery: RecoveryMode) -> ChainParams<'a> {
        ChainParams {
            dir: Path::new("/nonexistent/p"),
            ids: PartitionIds {
                topic: 1,
                partition: 2,
            },
            index_interval: 4096,
            segment_bytes: 1 << 20,
            checkpoint: cp,
            clean: false,
            sealed: None,
            checkpoint_lost: false,
            initial: false,
            mode: RecoverMode {
                write: true,
                full_scan: false,
                recovery,
            },
            parents_checked: false,
            hook: &NoFaults,
        }
    }

    fn header(base: u64) -> HeaderInfo {
        HeaderInfo {
            topic_id: 1,
            partition_id: 2,
            base_offset: base,
            created_ms: 0,
            seal: None,
            version: crate::format::segment::SEGMENT_VERSION_V1,
        }
    }

    fn checkpoint(segment_base: u64) -> PartitionCheckpoint {
        PartitionCheckpoint {
            topic_id: 1,
            partition_id: 2,
            start_offset: 0,
            segment_base,
            position: 64,
            end_offset: segment_base,
            rates: Vec::new(),
        }
    }

    fn at(expected: u64) -> Cursor {
        let mut c = Cursor::start(0);
        c.expected = Some(expected);
        c
    }

    #[test]
    fn a_segment_that_continues_the_chain_is_kept() {
        let h = header(10);
        let f = FileFacts {
            base: 10,
            path: Path::new("x"),
            kind: FileKind::Opened(&h),
        };
        assert_eq!(
            classify(&f, &at(10), &params(None, RecoveryMode::Strict)),
            Verdict::Keep
        );
    }

    #[test]
    fn an_unsynced_segment_after_a_torn_tail_is_deleted_with_the_tail() {
        let h = header(20);
        let f = FileFacts {
            base: 20,
            path: Path::new("x"),
            kind: FileKind::Opened(&h),
        };
        let v = classify(&f, &at(10), &params(None, RecoveryMode::Strict));
        assert!(matches!(v, Verdict::FollowsTornTail { .. }), "{v:?}");
    }

    #[test]
    fn a_synced_segment_after_missing_offsets_is_a_gap_not_a_torn_tail() {
        let cp = checkpoint(30);
        let h = header(20);
        let f = FileFacts {
            base: 20,
            path: Path::new("x"),
            kind: FileKind::Opened(&h),
        };
        let v = classify(&f, &at(10), &params(Some(&cp), RecoveryMode::Salvage));
        assert!(
            matches!(&v, Verdict::Gap { lost, .. } if *lost == (10..20)),
            "{v:?}"
        );
    }

    #[test]
    fn a_segment_after_a_complete_rolled_one_with_offsets_missing_is_a_gap() {
        let h = header(20);
        let f = FileFacts {
            base: 20,
            path: Path::new("x"),
            kind: FileKind::Opened(&h),
        };
        let mut cur = at(10);
        cur.complete_until = Some(10);
        let v = classify(&f, &cur, &params(None, RecoveryMode::Truncate));
        assert!(matches!(v, Verdict::Gap { .. }), "{v:?}");
    }

    #[test]
    fn synced_segments_after_a_cut_are_set_aside_and_unsynced_ones_deleted() {
        let cp = checkpoint(30);
        let p = params(Some(&cp), RecoveryMode::Truncate);
        let (early, late) = (header(20), header(40));
        let mut cur = at(10);
        cur.cut_at(CutState::Unsynced);
        let synced = FileFacts {
            base: 20,
            path: Path::new("a"),
            kind: FileKind::Opened(&early),
        };
        let unsynced = FileFacts {
            base: 40,
            path: Path::new("b"),
            kind: FileKind::Opened(&late),
        };
        let disposal = |v: Verdict| match v {
            Verdict::Discard { disposal, .. } => disposal,
            v => panic!("{v:?}"),
        };
        assert_eq!(disposal(classify(&synced, &cur, &p)), Disposal::SetAside);
        assert_eq!(disposal(classify(&unsynced, &cur, &p)), Disposal::Delete);
        cur.cut_at(CutState::Synced);
        assert_eq!(disposal(classify(&unsynced, &cur, &p)), Disposal::SetAside);
    }

    #[test]
    fn a_cut_never_heals() {
        let mut cur = Cursor::start(0);
        cur.cut_at(CutState::Synced);
        cur.cut_at(CutState::Unsynced);
        cur.cut_at(CutState::None);
        assert_eq!(cur.cut, CutState::Synced);
    }

    #[test]
    fn an_unreadable_header_is_damage_when_synced_and_a_torn_creation_otherwise() {
        let e = Error::corruption("x", 0, "bad header");
        let f = FileFacts {
            base: 30,
            path: Path::new("x"),
            kind: FileKind::Damaged(&e),
        };
        let cp = checkpoint(30);
        let v = classify(&f, &at(30), &params(Some(&cp), RecoveryMode::Strict));
        assert!(matches!(v, Verdict::Damaged { .. }), "{v:?}");
        let v = classify(&f, &at(30), &params(None, RecoveryMode::Strict));
        assert!(matches!(v, Verdict::TornCreation { .. }), "{v:?}");
    }

    #[test]
    fn a_header_naming_another_partition_is_damage() {
        let mut h = header(10);
        h.partition_id = 9;
        let f = FileFacts {
            base: 10,
            path: Path::new("x"),
            kind: FileKind::Opened(&h),
        };
        let v = classify(&f, &at(10), &params(None, RecoveryMode::Salvage));
        assert!(matches!(v, Verdict::Damaged { .. }), "{v:?}");
    }
}
