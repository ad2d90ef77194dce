//! `recovery::partition::classify`: chain repair's pure decisions, walked
//! over arbitrary segment chains with a model of what the applier does to
//! the cursor.

use std::path::Path;

use crate::error::Error;
use crate::format::batch::{
    batch_len, encode_batch, RecordIn, BATCH_HEADER_LEN, RECORD_HEADER_LEN,
};
use crate::format::checkpoint::PartitionCheckpoint;
use crate::format::segment::{encode_seal, HeaderInfo, SEAL_POS};
use crate::recovery::partition::classify::{
    classify, damage_response, Cursor, CutState, DamageResponse, Disposal, FileFacts, FileKind,
    SyncKnowledge, Verdict,
};
use crate::recovery::partition::{recover_chain, ChainParams, PartitionIds, RecoverMode};
use crate::recovery::{FileAction, RecoveryReport};
use crate::storage::fault::NoFaults;
use crate::storage::position::DurablePoint;
use crate::storage::segment::segment_file_name;

use super::{encode_header, Input, ScratchDir, MODES, SEGMENT_HEADER_LEN};

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
    /// One of the partitions the topic was created with.
    initial: bool,
    /// Base offsets (increasing) and files.
    files: Vec<(u64, File)>,
}

/// Decodes a chain: the mode, a checkpoint, a seal (bit 0 sealed, bits 1..6
/// its offset, bit 7 an initial partition), then up to 16 files with
/// increasing base offsets.
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
    let sealed = (seal & 1 != 0).then_some(u64::from((seal >> 1) & 0x3F));
    let initial = seal & 0x80 != 0;
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
        initial,
        files,
    }
}

/// Chain repair's classifier, over an arbitrary chain: the same facts give
/// the same verdict; nothing is kept after a cut; a cut never heals; a
/// segment the checkpoint knows synced is never deleted (it is set aside,
/// or Strict refuses); a kept segment continues the chain; a gap names
/// exactly the missing offsets. Then the same chain, written to files, goes
/// through chain repair itself (see [`check_repair_of_files`]).
pub fn check_chain_repair(data: &[u8]) {
    let mut input = Input::new(data);
    let Chain {
        mode,
        checkpoint,
        sealed,
        checkpoint_lost,
        initial,
        files,
    } = decode(&mut input);
    let scratch = ScratchDir::new("chain");
    let dir = scratch.path().join("topics/t1/p2");
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
        initial,
        mode,
        parents_checked: false,
        hook: &NoFaults,
    };
    let floor = checkpoint.as_ref().map_or(0, |c| c.start_offset);
    let known_end = p
        .checkpoint_in_data()
        .map_or(floor, |c| c.end_offset.max(floor));
    let mut cur = Cursor::start(known_end);
    cur.expected = Some(floor);
    let refuse_unknown_sync = checkpoint_lost && damage_response(&mode) == DamageResponse::Refuse;
    walk_classifier(&p, &files, cur, refuse_unknown_sync);
    check_repair_of_files(&p, &files);
}

/// Walks `files` through the classifier with the model of the applier.
fn walk_classifier(
    p: &ChainParams<'_>,
    files: &[(u64, File)],
    mut cur: Cursor,
    refuse_unknown_sync: bool,
) {
    let mode = p.mode;
    for (base, file) in files {
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
        let verdict = classify(&facts, &cur, p);
        assert_eq!(
            verdict,
            classify(&facts, &cur, p),
            "classify is not deterministic"
        );
        let before = cur.clone();
        let sync = SyncKnowledge::of(*base, p);
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

/// Bytes of every batch a generated segment holds (one record each), so
/// the positions the decoded checkpoints and seals name (64 + 100 n) fall
/// on batch boundaries.
const BATCH_BYTES: usize = 100;

/// The batch holding the one record at `offset`, [`BATCH_BYTES`] long.
fn batch_at(offset: u64) -> Vec<u8> {
    let value = vec![offset as u8; BATCH_BYTES - BATCH_HEADER_LEN - RECORD_HEADER_LEN];
    let recs = [RecordIn {
        key: None,
        value: &value,
        timestamp: offset as i64,
    }];
    let mut b = vec![0; batch_len(&recs)];
    encode_batch(&mut b, offset, &recs);
    debug_assert_eq!(b.len(), BATCH_BYTES);
    b
}

/// The bytes of a generated segment file at `base`. A retired one is a
/// valid empty segment (below the checkpoint's floor recovery never opens
/// it; above it, it is an empty segment). A damaged one is empty, shorter
/// than a header, or a header whose CRC does not match. An opened one holds
/// its records from its header's base, its seal when it has one, then its
/// stop: nothing, half a batch (torn), or a batch with a flipped byte and a
/// valid one after it (corrupt). Zeros fill it to 4 KiB, as preallocation
/// leaves a segment.
fn file_bytes(base: u64, file: &File) -> Vec<u8> {
    let mut out = match file {
        File::Retired => encode_header(1, 2, base, 0).to_vec(),
        File::Damaged(_) => match base % 3 {
            0 => return Vec::new(),
            1 => return encode_header(1, 2, base, 0)[..SEGMENT_HEADER_LEN / 2].to_vec(),
            _ => {
                let mut h = encode_header(1, 2, base, 0).to_vec();
                h[20] ^= 0xFF;
                h
            }
        },
        File::Opened {
            header,
            records,
            stop,
        } => {
            let mut out = crate::format::segment::encode_header_version(
                header.version,
                header.topic_id,
                header.partition_id,
                header.base_offset,
                0,
            )
            .to_vec();
            let first = header.base_offset;
            for o in first..first + records {
                out.extend(batch_at(o));
            }
            if let Some((end_offset, _)) = header.seal {
                let seal = encode_seal(end_offset, out.len() as u64);
                out[SEAL_POS..SEAL_POS + seal.len()].copy_from_slice(&seal);
            }
            let next = first + records;
            match stop {
                1 => out.extend(&batch_at(next)[..BATCH_BYTES / 2]),
                2 => {
                    let mut bad = batch_at(next);
                    bad[BATCH_BYTES - 1] ^= 0xFF;
                    out.extend(bad);
                    out.extend(batch_at(next + 1));
                }
                _ => {}
            }
            out
        }
    };
    out.resize(out.len().max(4096), 0);
    out
}

/// Whether `file`, the first a new topic's partition has, may be what a
/// power loss left of a first segment no sync reached: torn (its header
/// does not decode), or a header naming this partition at its base, with
/// whatever bytes follow it, and no other segment file after it.
fn may_be_unsynced_first(base: u64, file: &File, alone: bool) -> bool {
    match file {
        File::Damaged(_) => true,
        File::Retired => alone,
        File::Opened { header, .. } => {
            alone && header.base_offset == base && (header.topic_id, header.partition_id) == (1, 2)
        }
    }
}

/// Chain repair itself (`recover_chain`) over `files` written to `p.dir`.
/// Never a panic, and a refusal only where the mode refuses damage (Strict,
/// repairing), as a corruption error. Nothing the checkpoint calls durable
/// is handed out again (an analysis that reports a problem hands nothing
/// out), and a repair leaves a chain that covers it (with
/// its records or a hole) or reports the loss. The durable point the chain
/// hands on calls durable only what a kept segment holds, and nothing when
/// no checkpoint entry names data. A new topic's partition that nothing
/// says was ever synced ([`ChainParams::first_segment_may_be_unsynced`])
/// with no segment file, a torn first one, or only an empty (or unsynced)
/// one is no loss: it recovers in every mode with nothing reported lost or
/// damaged, and without a readable first segment the chain comes back
/// empty at its floor, for the open to create the first segment again.
/// Any other active partition without a segment file is reported.
fn check_repair_of_files(p: &ChainParams<'_>, files: &[(u64, File)]) {
    std::fs::create_dir_all(p.dir).expect("creating the partition directory");
    for (base, file) in files {
        let path = p.dir.join(segment_file_name(*base));
        std::fs::write(&path, file_bytes(*base, file)).expect("writing a segment file");
    }
    let floor = p.checkpoint.map_or(0, |c| c.start_offset);
    let known_end = p
        .checkpoint_in_data()
        .map_or(floor, |c| c.end_offset.max(floor));
    let live: Vec<&(u64, File)> = files.iter().filter(|(b, _)| *b >= floor).collect();
    let unsynced_start = p.first_segment_may_be_unsynced()
        && live
            .first()
            .is_none_or(|(b, f)| *b == floor && may_be_unsynced_first(*b, f, live.len() == 1));
    let no_first_segment = unsynced_start
        && live
            .first()
            .is_none_or(|(_, f)| matches!(f, File::Damaged(_)));
    let mut report = RecoveryReport::default();
    let result = recover_chain(p, &mut report);
    let lost: Vec<_> = report
        .files
        .iter()
        .filter(|f| matches!(f.action, FileAction::MissingData { .. }))
        .collect();
    let out = match result {
        Err(e) => {
            assert!(
                !unsynced_start,
                "a new topic's partition whose first segment may never have been synced was refused: {e}"
            );
            assert_eq!(
                damage_response(&p.mode),
                DamageResponse::Refuse,
                "chain repair failed in a mode that does not refuse: {e}"
            );
            assert!(
                matches!(e, Error::Corruption { .. }),
                "a refusal that is not a corruption error: {e}"
            );
            return;
        }
        Ok(out) => out,
    };
    if unsynced_start {
        assert!(
            lost.is_empty() && out.problems.is_empty() && out.holes.is_empty(),
            "a never-synced first segment of a new topic's partition reads as a loss: {lost:?}, {:?}, holes {:?}",
            out.problems,
            out.holes
        );
    }
    if no_first_segment {
        assert!(
            out.segments.is_empty() && out.next_offset == floor,
            "a missing or torn first segment is not left for the open to create at {floor}: next offset {}, {} segments",
            out.next_offset,
            out.segments.len()
        );
    }
    if live.is_empty() && p.sealed.is_none() && !p.first_segment_may_be_unsynced() {
        assert!(
            !lost.is_empty() || !out.problems.is_empty(),
            "an active partition whose first segment was durable has no segment file, and nothing is reported"
        );
    }
    // An analysis that reports a problem hands nothing out.
    assert!(
        out.next_offset >= known_end || !p.mode.write && !out.problems.is_empty(),
        "offsets the checkpoint calls durable are handed out again: next offset {}, durable up to {known_end}",
        out.next_offset
    );
    for w in out.segments.windows(2) {
        assert_eq!(
            w[1].base_offset,
            w[0].end_offset(),
            "the recovered chain is not contiguous"
        );
    }
    let covered = known_end <= floor
        || out.segments.first().is_some_and(|s| s.base_offset <= floor)
            && out
                .segments
                .last()
                .is_some_and(|s| s.end_offset() >= known_end);
    assert!(
        covered || !lost.is_empty() || !out.problems.is_empty(),
        "offsets {floor}..{known_end} the checkpoint calls durable are neither in the chain nor reported lost"
    );
    if p.mode.write {
        assert!(
            covered,
            "a repair left offsets {floor}..{known_end} the checkpoint calls durable without a segment or a hole"
        );
    }
    if p.checkpoint_in_data().is_none() {
        assert_eq!(
            out.durable,
            DurablePoint::NOTHING,
            "a chain no checkpoint names data in calls something durable"
        );
    } else if out.durable != DurablePoint::NOTHING {
        let d = out.durable;
        let held = out
            .segments
            .iter()
            .find(|s| s.base_offset == d.segment_base)
            .unwrap_or_else(|| panic!("the durable point names a segment not kept: {d:?}"));
        assert!(
            d.position <= held.committed_pos(),
            "the durable point is past its segment's end: {d:?}, end {}",
            held.committed_pos()
        );
    }
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
