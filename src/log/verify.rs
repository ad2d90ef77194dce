//! The offline check of a log directory: reads every file, changes none.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::open::{checkpoint_entries, forget_reclaim_cuts};
use crate::config::RecoveryMode;
use crate::error::{Error, Result};
use crate::format::checkpoint::{Checkpoint, PartitionCheckpoint};
use crate::format::manifest::{ManifestState, PartitionRecord, PartitionState, TopicRecord};
use crate::layout::{topic_dir, LOCK_FILE};
use crate::recovery::partition::{recover_chain, ChainParams, PartitionIds, Problem, RecoverMode};
use crate::recovery::{FileAction, RecoveryReport};
use crate::storage::fault::NoFaults;
use crate::storage::file::{open_optional, Access};
use crate::storage::lock::SharedLock;
use crate::topic::partition_dir;
use crate::topology::manifest::Manifest;

/// How `verify` reads every partition: nothing is written, everything is
/// scanned, and damage is reported as `Strict` would refuse it.
const VERIFY_MODE: RecoverMode = RecoverMode {
    write: false,
    full_scan: true,
    recovery: RecoveryMode::Strict,
};

/// Checks a log directory without changing a byte: every header, batch CRC,
/// offset continuity, index and manifest record. Takes a shared lock on the
/// existing lock file and refuses while a writer holds it.
pub fn verify(dir: impl AsRef<Path>) -> Result<(RecoveryReport, Vec<Problem>)> {
    let dir = dir.as_ref();
    if !dir.is_dir() {
        return Err(Error::NotFound {
            path: dir.to_path_buf(),
        });
    }
    if !Manifest::exists(dir) {
        return Err(Error::NotALog {
            path: dir.to_path_buf(),
        });
    }
    let mut report = RecoveryReport::default();
    let mut problems = Vec::new();
    let _lock = lock_shared(dir, &mut problems)?;
    let Some(state) = read_manifest(dir, &mut report, &mut problems)? else {
        return Ok((report, problems));
    };
    let (ck, bad) = read_checkpoint(dir, &mut problems)?;
    let checkpoint_lost = ck.seq == 0 && state.topics.iter().any(|t| !t.partitions.is_empty());
    for (file, reason) in bad {
        problems.push(Problem {
            file,
            position: 0,
            what: reason,
            repair: "the other checkpoint file is used; the next sync rewrites it".into(),
        });
    }
    let reclaimed = crate::topic::tail_split::reclaimed_checkpoints(dir, &state.topics, &ck);
    let cps = checkpoint_entries(&ck, &reclaimed);
    for t in &state.topics {
        check_tail_indexes(dir, t, &mut problems);
        for p in &t.partitions {
            let ctx = (&cps, &ck, checkpoint_lost);
            check_partition(dir, t, p, ctx, &mut report, &mut problems)?;
        }
    }
    for f in &report.files {
        if let FileAction::TruncatedTornTail {
            position, reason, ..
        } = &f.action
        {
            problems.push(Problem {
                file: f.file.clone(),
                position: *position,
                what: format!("torn tail (unsynced writes): {reason}"),
                repair: "open cuts the torn tail".into(),
            });
        }
    }
    Ok((report, problems))
}

/// A shared lock on the lock file, when it exists: refused while a writer
/// holds the log.
fn lock_shared(dir: &Path, problems: &mut Vec<Problem>) -> Result<Option<SharedLock>> {
    let lock_path = dir.join(LOCK_FILE);
    Ok(match open_optional(&lock_path, Access::Read) {
        Ok(Some(f)) => Some(SharedLock::acquire(f, &lock_path, dir)?),
        // No writer can hold the log either: `Log::open` refuses the lock
        // file too. The check goes on without the lock.
        Err(e @ Error::NotARegularFile { .. }) => {
            problems.extend(odd_file_problem(e));
            None
        }
        Ok(None) | Err(_) => None,
    })
}

/// The manifest's topology, read-only. `None` when the manifest itself is
/// the problem found (listed in `problems`): nothing else can be checked.
fn read_manifest(
    dir: &Path,
    report: &mut RecoveryReport,
    problems: &mut Vec<Problem>,
) -> Result<Option<ManifestState>> {
    let (_, state, mreport) =
        match Manifest::open(dir, RecoveryMode::Strict, true, Arc::new(NoFaults)) {
            Ok(x) => x,
            Err(Error::Corruption {
                file,
                position,
                reason,
            }) => {
                problems.push(Problem {
                    file,
                    position,
                    what: reason,
                    repair: "recover --mode truncate drops the damaged manifest records".into(),
                });
                return Ok(None);
            }
            Err(e @ Error::NotARegularFile { .. }) => {
                problems.extend(odd_file_problem(e));
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
    if let Some((pos, reason)) = &mreport.torn_tail {
        problems.push(Problem {
            file: dir.join(crate::layout::JOURNAL_FILE),
            position: *pos,
            what: format!("torn journal tail: {reason}"),
            repair: "open cuts the torn tail".into(),
        });
    }
    report.manifest = mreport;
    Ok(Some(state))
}

/// Every committed tail split's descendant index: the open refuses the
/// log without it, and once the parent's moved range is reclaimed nothing
/// else says which child holds which offset.
fn check_tail_indexes(dir: &Path, t: &TopicRecord, problems: &mut Vec<Problem>) {
    for m in &t.tail_moves {
        if let Err(e) = crate::topic::tail_split::load_tails(
            &topic_dir(dir, t.id),
            std::slice::from_ref(m),
            None,
        ) {
            let file = match &e {
                Error::Corruption { file, .. } => file.clone(),
                Error::Io { path, .. } | Error::NotARegularFile { path, .. } => path.clone(),
                _ => topic_dir(dir, t.id),
            };
            problems.push(Problem {
                file,
                position: 0,
                what: format!(
                    "descendant index of tail-split partition {} is unusable: {e}",
                    m.parent
                ),
                repair: "restore the file; recover --mode truncate|salvage opens the log without it: positions inside the moved range then resume at the children's first moved records (records may be delivered again)".into(),
            });
        }
    }
}

/// Each partition's checkpoint entry, the checkpoint, and whether it was
/// lost (see `open.rs`).
type CheckpointContext<'a> = (
    &'a HashMap<(u32, u32), &'a PartitionCheckpoint>,
    &'a Checkpoint,
    bool,
);

/// Scans one partition's chain as recovery would, without repairing it,
/// and lists what is wrong with it.
fn check_partition(
    dir: &Path,
    t: &TopicRecord,
    p: &PartitionRecord,
    (cps, ck, checkpoint_lost): CheckpointContext<'_>,
    report: &mut RecoveryReport,
    problems: &mut Vec<Problem>,
) -> Result<()> {
    let pdir = partition_dir(&topic_dir(dir, t.id), p.id);
    let params = ChainParams {
        dir: &pdir,
        ids: PartitionIds {
            topic: t.id,
            partition: p.id,
        },
        index_interval: u64::from(t.config.index_interval_bytes),
        segment_bytes: t.config.segment_bytes,
        checkpoint: cps.get(&(t.id, p.id)).copied(),
        clean: ck.clean,
        sealed: match p.state {
            PartitionState::Sealed { end_offset } => {
                Some(crate::topic::tail_split::recovery_seal(t, p.id, end_offset))
            }
            PartitionState::Active => None,
        },
        checkpoint_lost,
        initial: p.parents.is_empty(),
        mode: VERIFY_MODE,
        parents_checked: false,
        hook: &NoFaults,
    };
    let reclaimed = t.tail_moves.iter().any(|m| m.parent == p.id && m.reclaimed);
    let chain = match recover_chain(&params, report) {
        Ok(chain) => chain,
        Err(e @ Error::NotARegularFile { .. }) => {
            problems.extend(odd_file_problem(e));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    if reclaimed {
        forget_reclaim_cuts(report, &pdir);
    }
    problems.extend(chain.problems);
    if let Some(last) = chain.segments.last() {
        if let PartitionState::Sealed { end_offset } = p.state {
            // Ending below the seal is a cut unsynced tail (allowed);
            // data past the seal would break per-key order.
            if last.end_offset() > end_offset && !reclaimed {
                problems.push(Problem {
                    file: pdir.clone(),
                    position: 0,
                    what: format!(
                        "partition {} was sealed at offset {end_offset} but holds data up to {}",
                        p.id,
                        last.end_offset()
                    ),
                    repair: "recover truncates or salvages per mode".into(),
                });
            }
        }
    }
    for seg in &chain.segments {
        check_index(seg, report, problems);
    }
    Ok(())
}

/// A name that does not hold a regular file, as a problem `verify` lists
/// (`None` for any other error).
fn odd_file_problem(e: Error) -> Option<Problem> {
    let Error::NotARegularFile { path, found } = e else {
        return None;
    };
    Some(Problem {
        what: format!("{} is a {found}, not a regular file", path.display()),
        file: path,
        position: 0,
        repair: "none: every open refuses the log until the file is put back (or what stands in its place is removed, if the file is lost)".into(),
    })
}

/// An index file that does not match its segment is a problem, unless it
/// is of the format's first version: every open rebuilds those, so the
/// report names it as an index to rebuild and the log is not damaged.
fn check_index(
    seg: &crate::storage::segment::Segment,
    report: &mut RecoveryReport,
    problems: &mut Vec<Problem>,
) {
    let buf = match seg.read_index_file() {
        Ok(Some(buf)) => buf,
        Err(e @ Error::NotARegularFile { .. }) => {
            problems.extend(odd_file_problem(e));
            return;
        }
        // Longer than any index of the segment.
        Err(Error::Corruption { .. }) => Vec::new(),
        Ok(None) | Err(_) => return,
    };
    let (_, whole) = crate::format::index::decode_index(
        &buf,
        seg.base_offset,
        seg.committed_pos(),
        seg.end_offset(),
    );
    if !whole
        && crate::format::index::is_first_version(
            &buf,
            seg.base_offset,
            seg.committed_pos(),
            seg.end_offset(),
        )
    {
        report.add(seg.index_path(), FileAction::RebuiltIndex);
    } else if !whole {
        problems.push(Problem {
            file: seg.index_path().to_path_buf(),
            position: 0,
            what: "index does not match its segment".into(),
            repair: "the index is rebuilt from the segment on first use".into(),
        });
    }
}

/// The newest valid checkpoint and the invalid files; a checkpoint name
/// that is not a regular file is a problem, and the other file is used.
fn read_checkpoint(
    dir: &Path,
    problems: &mut Vec<Problem>,
) -> Result<(Checkpoint, Vec<(PathBuf, String)>)> {
    let mut best: Option<Checkpoint> = None;
    let mut bad = Vec::new();
    for name in crate::storage::durability::CHECKPOINT_FILES {
        let path = dir.join(name);
        let read = crate::storage::file::read_optional(
            &path,
            crate::storage::durability::CHECKPOINT_FILE_MAX_BYTES,
        );
        let read = match read {
            Err(e @ Error::NotARegularFile { .. }) => {
                problems.extend(odd_file_problem(e));
                continue;
            }
            read => read?,
        };
        if let Some(buf) = read {
            if buf.is_empty() {
                continue;
            }
            if let Some(found) = crate::format::checkpoint::newer_version(&buf) {
                return Err(Error::UnsupportedVersion {
                    file: path,
                    found,
                    supported: crate::format::checkpoint::CHECKPOINT_VERSION,
                });
            }
            match crate::format::checkpoint::decode_checkpoint(&buf) {
                Ok(c) if best.as_ref().is_none_or(|b| c.seq > b.seq) => best = Some(c),
                Ok(_) => {}
                Err(e) => bad.push((path, e)),
            }
        }
    }
    Ok((best.unwrap_or_default(), bad))
}
