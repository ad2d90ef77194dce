//! Carrying out repair's verdicts: the only part of chain repair that
//! changes files (and only in write mode).

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::config::RecoveryMode;
use crate::error::{Error, IoContext, Result};
use crate::format::segment::{HeaderInfo, SEGMENT_HEADER_LEN};
use crate::recovery::scan::{scan_segment, ScanParams};
use crate::recovery::{FileAction, RecoveryReport};
use crate::storage::fault::IoOp;
use crate::storage::segment::{segment_file_name, Segment};

use super::classify::{damage_response, Cursor, CutState, DamageResponse, Disposal, Verdict};
use super::keep::keep_segment;
use super::{problem, ChainParams, RecoveredChain, SegmentFile};

/// What repairing a chain has done so far, and the I/O it owes.
pub(super) struct Repairs<'a, 'b> {
    pub p: &'b ChainParams<'a>,
    pub report: &'b mut RecoveryReport,
    pub out: RecoveredChain,
    /// A segment file was removed: the directory is fsynced after the chain.
    pub removed: bool,
    /// A segment created after the last checkpointed sync whose header does
    /// not decode (a torn creation): removed only after the removals of the
    /// segments after it are durable. Removed first, a power loss could keep
    /// its removal and lose theirs, and the next open would find a segment
    /// missing before one that is there: lost data, not a crash artifact.
    pub torn_creation: Option<PathBuf>,
    /// Kept segments whose index file is rewritten from their scan (base
    /// offset, and whether the report names it): only once the chain is
    /// repaired, so a Strict open that refuses a later file (or data
    /// missing at the end) leaves every file as it was.
    pub index_rewrites: Vec<(u64, bool)>,
}

/// Carries out `verdict` for one file of the chain.
pub(super) fn apply(
    verdict: Verdict,
    base: u64,
    path: &Path,
    mut file: SegmentFile,
    cur: &mut Cursor,
    r: &mut Repairs<'_, '_>,
) -> Result<()> {
    let write = r.p.mode.write;
    match verdict {
        Verdict::Discard {
            disposal,
            reason,
            held_handed_out,
        } => {
            if held_handed_out {
                cur.handed_out(held_by(&mut file, base, r.p));
            }
            match disposal {
                Disposal::Delete => r.delete_segment(path, write, reason),
                Disposal::SetAside => r.set_aside(path, reason),
            }
        }
        Verdict::Damaged { what } => {
            let response = r.corrupt(path, 0, what)?;
            r.set_aside(path, "damaged")?;
            if response != DamageResponse::Skip {
                cur.cut_at(CutState::Synced);
            }
            Ok(())
        }
        Verdict::TornCreation { reason } => {
            r.unknown_sync(path, 0, &reason)?;
            // Reported now, removed after the chain (see `torn_creation`).
            r.delete_segment(
                path,
                false,
                "segment created after the last sync is unreadable (torn)",
            )?;
            if write {
                r.torn_creation = Some(path.to_path_buf());
            }
            cur.cut_at(CutState::Unsynced);
            Ok(())
        }
        Verdict::FollowsTornTail { what } => {
            r.unknown_sync(path, 0, &what)?;
            r.delete_segment(path, write, "follows a torn tail")?;
            cur.cut_at(CutState::Unsynced);
            Ok(())
        }
        Verdict::Gap {
            lost,
            missing_file,
            what,
        } => match r.missing(&missing_file, lost.clone(), what)? {
            DamageResponse::Skip => {
                r.fill_hole(lost)?;
                keep(base, path, file, cur, r)
            }
            DamageResponse::Refuse | DamageResponse::Cut => {
                cur.handed_out(held_by(&mut file, base, r.p));
                r.set_aside(path, "follows missing segments")?;
                cur.cut_at(CutState::Synced);
                Ok(())
            }
        },
        Verdict::Keep => keep(base, path, file, cur, r),
    }
}

fn keep(
    base: u64,
    path: &Path,
    file: SegmentFile,
    cur: &mut Cursor,
    r: &mut Repairs<'_, '_>,
) -> Result<()> {
    match file {
        SegmentFile::Opened(seg, info, settled) => {
            keep_segment(base, path, seg, (&info, settled), cur, r)
        }
        // `classify` keeps only files whose header decoded.
        SegmentFile::Retired | SegmentFile::Damaged(_) => {
            unreachable!("only an opened segment is kept")
        }
    }
}

/// The offsets a file that leaves the chain held: up to its seal or its
/// last valid batch when opened, from its base on when damaged, nothing
/// when retired.
fn held_by(file: &mut SegmentFile, base: u64, p: &ChainParams<'_>) -> u64 {
    match file {
        SegmentFile::Opened(seg, info, _) => held_until(seg, info, p),
        SegmentFile::Damaged(_) => base,
        SegmentFile::Retired => 0,
    }
}

/// The offset after the last record a segment that repair leaves out of
/// the chain held: its seal, or for a segment without one (the active
/// segment) the end of its valid batches. Records synced after the last
/// checkpoint lie past the checkpoint's end, so neither that nor the base
/// offset bounds what was handed out.
pub(super) fn held_until(seg: &mut Segment, info: &HeaderInfo, p: &ChainParams<'_>) -> u64 {
    if let Some((end_offset, _)) = info.seal {
        return end_offset;
    }
    let params = ScanParams {
        base_offset: info.base_offset,
        from_pos: SEGMENT_HEADER_LEN as u64,
        from_offset: info.base_offset,
        durable_until: 0,
        mode: RecoveryMode::Truncate,
        index_interval: p.index_interval,
        batch_version: info.version,
    };
    // Mapped since phase one; should a mapping not be had, its base
    // bounds it as for a damaged file.
    match seg.raw_for_recovery() {
        Ok(raw) => scan_segment(&raw, &params).end_offset,
        Err(_) => info.base_offset,
    }
}

impl Repairs<'_, '_> {
    /// The first segment file of the chain is gone: the partition's first
    /// segment is durable from its creation on, and retention only removes
    /// files below a floor a durable checkpoint holds.
    pub(super) fn first_segment_missing(
        &mut self,
        lost: Range<u64>,
        cur: &mut Cursor,
    ) -> Result<()> {
        let path = self.p.dir.join(segment_file_name(lost.start));
        let what = format!(
            "segment file {} holding offsets {}..{} is missing",
            path.display(),
            lost.start,
            lost.end
        );
        match self.missing(&path, lost.clone(), what)? {
            DamageResponse::Refuse | DamageResponse::Cut => cur.cut_at(CutState::Synced),
            DamageResponse::Skip => {
                let first = lost.end;
                self.fill_hole(lost)?;
                cur.expected = Some(first);
            }
        }
        Ok(())
    }

    /// Invalid bytes past the checkpointed position are a torn tail of
    /// unsynced writes and are cut in every mode. Without any valid
    /// checkpoint (both files damaged or gone while the manifest knows
    /// partitions) nothing says where synced data ends, so they may be
    /// synced data: Strict refuses instead of cutting, Truncate and Salvage
    /// cut and report as usual.
    pub(super) fn unknown_sync(&mut self, path: &Path, position: u64, reason: &str) -> Result<()> {
        if self.p.checkpoint_lost {
            let what = format!(
                "{reason}; there is no valid recovery checkpoint, so this may be synced data, not a torn tail of unsynced writes"
            );
            self.corrupt(path, position, what)?;
        }
        Ok(())
    }

    /// Handles data known to exist whose file (or directory) is missing:
    /// refused in Strict; in Truncate and Salvage the report names the file
    /// and the offsets lost with it.
    pub(super) fn missing(
        &mut self,
        path: &Path,
        lost: Range<u64>,
        what: String,
    ) -> Result<DamageResponse> {
        let response = self.corrupt(path, 0, what)?;
        if self.p.mode.write {
            self.report.add(
                path,
                FileAction::MissingData {
                    lost_offsets: lost.clone().into(),
                },
            );
        }
        Ok(response)
    }

    /// Rewrites the index files [`Repairs::index_rewrites`] names, of the
    /// segments still in the chain. An index is a cache: failing to write
    /// one is no error.
    pub(super) fn rewrite_indexes(&mut self) {
        for (base, reported) in std::mem::take(&mut self.index_rewrites) {
            let Some(seg) = self.out.segments.iter().find(|s| s.base_offset == base) else {
                continue;
            };
            if matches!(seg.repair_index_file(self.p.hook), Ok(true)) && reported {
                self.report.add(seg.index_path(), FileAction::RebuiltIndex);
            }
        }
    }

    /// Writes a segment holding one hole batch for `lost` (write mode
    /// only), so the chain stays continuous: the next open, in any mode,
    /// finds no gap, reads of the range report the hole, and the offsets
    /// are never handed out again.
    pub(super) fn fill_hole(&mut self, lost: Range<u64>) -> Result<()> {
        let p = self.p;
        if lost.is_empty() {
            return Ok(());
        }
        self.out.holes.push(lost.clone());
        if !p.mode.write {
            return Ok(());
        }
        if !p.dir.exists() {
            std::fs::create_dir_all(p.dir).at(p.dir)?;
            if let Some(parent) = p.dir.parent() {
                crate::storage::sync_dir(p.hook, IoOp::SyncRecoveryDir, parent)?;
            }
        }
        // A kept segment that starts where the hole does holds no record
        // (the chain ends at its base): a synced segment that came back
        // with only its header. The hole takes its name and its place; a
        // power loss before the hole is durable leaves the same repair to
        // the next open.
        if let Some(empty) = self
            .out
            .segments
            .pop_if(|s| s.base_offset == lost.start && s.end_offset() == lost.start)
        {
            let path = empty.path().to_path_buf();
            drop(empty);
            std::fs::remove_file(&path).at(&path)?;
            let _ = std::fs::remove_file(path.with_extension("idx"));
            self.report.add(
                &path,
                FileAction::DeletedSegment {
                    reason: "holds no record; replaced by the hole for its lost offsets"
                        .to_string(),
                },
            );
        }
        let ids = (p.ids.topic, p.ids.partition);
        let filler = Segment::create_hole(p.dir, ids, lost.start, lost.end, p.hook)?;
        self.report.add(
            filler.path(),
            FileAction::Salvaged {
                position: SEGMENT_HEADER_LEN as u64,
                lost_offsets: lost.clone().into(),
            },
        );
        self.out.segments.push(filler);
        Ok(())
    }

    /// Handles corruption in synced data according to the mode (see
    /// [`damage_response`]): an analysis notes the problem and cuts, Strict
    /// refuses, Truncate cuts, Salvage skips it. Never answers `Refuse`.
    pub(super) fn corrupt(
        &mut self,
        file: &Path,
        position: u64,
        what: String,
    ) -> Result<DamageResponse> {
        let p = self.p;
        if !p.mode.write {
            let repair = match p.mode.recovery {
                RecoveryMode::Strict => "recover --mode truncate cuts the partition here; --mode salvage keeps the valid records after it",
                RecoveryMode::Truncate => "truncate cuts the partition here",
                RecoveryMode::Salvage => "salvage keeps the valid records after the damage and records a hole",
            };
            self.out
                .problems
                .push(problem(file, position, what, repair));
            return Ok(DamageResponse::Cut);
        }
        match damage_response(&p.mode) {
            DamageResponse::Refuse => Err(Error::corruption(
                file,
                position,
                format!("{what}; open with RecoveryMode::Truncate or Salvage (fissionlog recover --mode truncate|salvage) to repair"),
            )),
            response => Ok(response),
        }
    }

    /// Removes a segment file (write mode) and notes it in `removed`: the
    /// directory is fsynced before anything relies on the removal.
    pub(super) fn delete_segment(&mut self, path: &Path, write: bool, reason: &str) -> Result<()> {
        if write {
            std::fs::remove_file(path).at(path)?;
            let _ = std::fs::remove_file(path.with_extension("idx"));
            self.removed = true;
        }
        self.report.add(
            path,
            FileAction::DeletedSegment {
                reason: reason.to_string(),
            },
        );
        Ok(())
    }

    /// Moves a segment that repair leaves out of the chain to
    /// `<name>.seg.damaged` (kept for inspection, as Redpanda's
    /// `.cannotrecover`), so the next open does not trip over it again (C7).
    pub(super) fn set_aside(&mut self, path: &Path, why: &str) -> Result<()> {
        if !self.p.mode.write {
            return Ok(());
        }
        let to = path.with_extension("seg.damaged");
        std::fs::rename(path, &to).at(path)?;
        let _ = std::fs::remove_file(path.with_extension("idx"));
        if let Some(dir) = path.parent() {
            crate::storage::sync_dir(self.p.hook, IoOp::SyncRecoveryDir, dir)?;
        }
        self.report.add(
            path,
            FileAction::DeletedSegment {
                reason: format!("{why}; moved to {}", to.display()),
            },
        );
        Ok(())
    }
}
