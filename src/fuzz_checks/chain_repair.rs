//! `recovery::partition::classify`: chain repair's pure decisions, walked
//! over arbitrary segment chains with a model of what the applier does to
//! the cursor.

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::format::checkpoint::PartitionCheckpoint;
use crate::format::segment::HeaderInfo;
use crate::recovery::partition::classify::{
    classify, damage_response, Cursor, CutState, DamageResponse, Disposal, FileFacts, FileKind,
    SyncKnowledge, Verdict,
};
use crate::recovery::partition::{ChainParams, PartitionIds, RecoverMode};
use crate::storage::fault::NoFaults;

use super::{Input, MODES};

/// One segment file of a generated chain.
enum File {
    Retired,
    Opened {
        header: HeaderInfo,
        /// Records a scan finds in it.
        records: u64,
        /// How a scan of it stops: 0 at the end, 1 torn, 2 corrupt.
        stop: u8,
    },
    Damaged(Error),
}

/// A generated chain and the parameters it is repaired under.
struct Chain {
    mode: RecoverMode,
    checkpoint: Option<PartitionCheckpoint>,
    sealed: Option<u64>,
    checkpoint_lost: bool,
    /// Base offsets (increasing) and files.
    files: Vec<(u64, File)>,
}

/// Decodes a chain: the mode, a checkpoint, a seal, then up to 16 files
/// with increasing base offsets.
fn decode(input: &mut Input<'_>) -> Chain {
    let flags = input.u8();
    let mode = RecoverMode {
        write: flags & 1 != 0,
        full_scan: flags & 2 != 0,
        recovery: MODES[usize::from(flags >> 2) % 3],
    };
    let checkpoint_lost = flags & 0x40 != 0;
    let checkpoint = (flags & 0x80 != 0).then(|| PartitionCheckpoint {
        topic_id: 1,
        partition_id: 2,
        segment_base: u64::from(input.u8()),
        position: u64::from(input.u16()),
        end_offset: u64::from(input.u8()),
        start_offset: u64::from(input.u8() % 8),
        rates: Vec::new(),
    });
    let seal = input.u8();
    let sealed = (seal & 1 != 0).then_some(u64::from(seal >> 1));
    let mut files = Vec::new();
    let mut base = 0u64;
    while !input.done() && files.len() < 16 {
        base += u64::from(input.u8() % 16);
        let kind = input.u8();
        let file = match kind % 4 {
            0 => File::Retired,
            1 => File::Damaged(Error::corruption("seg", 0, "bad segment header")),
            _ => {
                let records = u64::from(input.u8() % 16);
                let wrong = input.u8();
                let seal = (kind & 4 != 0).then_some((base + records, 64 + 100 * records));
                File::Opened {
                    header: HeaderInfo {
                        topic_id: 1,
                        partition_id: if wrong == 0xFF { 9 } else { 2 },
                        base_offset: if wrong == 0xFE { base + 1 } else { base },
                        created_ms: 0,
                        seal,
                        version: crate::format::segment::SEGMENT_VERSION_V1,
                    },
                    records,
                    stop: (kind >> 3) % 3,
                }
            }
        };
        files.push((base, file));
        base += 1;
    }
    Chain {
        mode,
        checkpoint,
        sealed,
        checkpoint_lost,
        files,
    }
}

/// Chain repair's classifier, over an arbitrary chain: the same facts give
/// the same verdict; nothing is kept after a cut; a cut never heals; a
/// segment the checkpoint knows synced is never deleted (it is set aside,
/// or Strict refuses); a kept segment continues the chain; a gap names
/// exactly the missing offsets.
pub fn check_chain_repair(data: &[u8]) {
    let mut input = Input::new(data);
    let Chain {
        mode,
        checkpoint,
        sealed,
        checkpoint_lost,
        files,
    } = decode(&mut input);
    let dir = PathBuf::from("/nonexistent/topics/t1/p2");
    let p = ChainParams {
        dir: &dir,
        ids: PartitionIds {
            topic: 1,
            partition: 2,
        },
        index_interval: 4096,
        segment_bytes: 1 << 20,
        checkpoint: checkpoint.as_ref(),
        clean: false,
        sealed,
        checkpoint_lost,
        initial: false,
        mode,
        hook: &NoFaults,
    };
    let floor = checkpoint.as_ref().map_or(0, |c| c.start_offset);
    let known_end = p
        .checkpoint_in_data()
        .map_or(floor, |c| c.end_offset.max(floor));
    let mut cur = Cursor::start(known_end);
    cur.expected = Some(floor);
    let refuse_unknown_sync = checkpoint_lost && damage_response(&mode) == DamageResponse::Refuse;
    for (base, file) in &files {
        let path = Path::new("seg");
        let kind = match file {
            File::Retired => FileKind::Retired,
            File::Opened { header, .. } => FileKind::Opened(header),
            File::Damaged(e) => FileKind::Damaged(e),
        };
        let facts = FileFacts {
            base: *base,
            path,
            kind,
        };
        let verdict = classify(&facts, &cur, &p);
        assert_eq!(
            verdict,
            classify(&facts, &cur, &p),
            "classify is not deterministic"
        );
        let before = cur.clone();
        let sync = SyncKnowledge::of(*base, &p);
        check_verdict(&verdict, &facts, &before, &sync);
        if !model_apply(&verdict, &mut cur, *base, file, &mode, refuse_unknown_sync) {
            return;
        }
        assert!(cur.cut >= before.cut, "a cut healed: {before:?} -> {cur:?}");
        assert!(
            cur.known_end >= before.known_end,
            "handed-out offsets shrank: {before:?} -> {cur:?}"
        );
    }
}

/// What the applier does to the cursor for `verdict`; false when the mode
/// refuses (the open fails, nothing after it is looked at).
fn model_apply(
    verdict: &Verdict,
    cur: &mut Cursor,
    base: u64,
    file: &File,
    mode: &RecoverMode,
    refuse_unknown_sync: bool,
) -> bool {
    let held = match file {
        File::Retired => 0,
        File::Damaged(_) => base,
        File::Opened {
            header, records, ..
        } => header.seal.map_or(base + records, |s| s.0),
    };
    match verdict {
        Verdict::Discard {
            held_handed_out, ..
        } => {
            if *held_handed_out {
                cur.handed_out(held);
            }
        }
        Verdict::Damaged { .. } => match damage_response(mode) {
            DamageResponse::Refuse => return false,
            DamageResponse::Cut => cur.cut_at(CutState::Synced),
            DamageResponse::Skip => {}
        },
        Verdict::TornCreation { .. } | Verdict::FollowsTornTail { .. } => {
            if refuse_unknown_sync {
                return false;
            }
            cur.cut_at(CutState::Unsynced);
        }
        Verdict::Gap { .. } => match damage_response(mode) {
            DamageResponse::Refuse => return false,
            DamageResponse::Cut => {
                cur.handed_out(held);
                cur.cut_at(CutState::Synced);
            }
            DamageResponse::Skip => keep(cur, base, file),
        },
        Verdict::Keep => keep(cur, base, file),
    }
    true
}

/// A kept segment, as the applier keeps it after its scan.
fn keep(cur: &mut Cursor, base: u64, file: &File) {
    let File::Opened {
        records,
        stop,
        header,
    } = file
    else {
        panic!("a segment whose header did not decode was kept");
    };
    let end = base + records;
    cur.cut_at(match stop {
        0 => CutState::None,
        1 => CutState::Unsynced,
        _ => CutState::Synced,
    });
    let sealed = *stop == 0 && header.seal.is_some_and(|s| s.0 == end);
    cur.kept(end, sealed);
}

/// The invariants of one verdict, given the cursor before it.
fn check_verdict(verdict: &Verdict, facts: &FileFacts<'_>, cur: &Cursor, sync: &SyncKnowledge<'_>) {
    let retired = matches!(facts.kind, FileKind::Retired);
    if cur.cut != CutState::None {
        assert!(
            matches!(verdict, Verdict::Discard { .. }),
            "data kept after a cut: {verdict:?} at {cur:?}"
        );
    }
    let deletes = match verdict {
        Verdict::Discard { disposal, .. } => *disposal == Disposal::Delete,
        Verdict::TornCreation { .. } | Verdict::FollowsTornTail { .. } => true,
        _ => false,
    };
    if deletes && !retired {
        assert!(
            !sync.synced(),
            "a segment holding synced data is deleted: {verdict:?} at {cur:?}"
        );
    }
    if let Verdict::Discard {
        disposal: Disposal::Delete,
        held_handed_out: true,
        ..
    } = verdict
    {
        assert!(retired, "a synced cut deletes a live segment: {verdict:?}");
    }
    match verdict {
        Verdict::Keep => {
            let FileKind::Opened(h) = facts.kind else {
                panic!("kept a file without a valid header: {verdict:?}");
            };
            assert_eq!(
                h.base_offset, facts.base,
                "kept a segment whose header names another base"
            );
            assert!(
                cur.expected.is_none_or(|e| e == facts.base),
                "kept a segment that does not continue the chain: {cur:?}, base {}",
                facts.base
            );
        }
        Verdict::Gap { lost, .. } => {
            assert!(!lost.is_empty(), "an empty gap: {verdict:?}");
            assert_eq!(
                Some(lost.start),
                cur.expected,
                "a gap not at the chain's end"
            );
            assert_eq!(lost.end, facts.base, "a gap not up to the segment");
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_of_every_shape_keep_the_classifier_invariants() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..2000 {
            let bytes: Vec<u8> = (0..48)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            check_chain_repair(&bytes);
        }
    }
}
