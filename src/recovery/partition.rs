//! Recovering one partition's segment chain.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::RecoveryMode;
use crate::error::{Error, IoContext, Result};
use crate::format::batch::BATCH_HEADER_LEN;
use crate::format::checkpoint::PartitionCheckpoint;
use crate::format::segment::{SegmentInfo, SEGMENT_HEADER_LEN};
use crate::recovery::scan::{scan_segment, CorruptAction, ScanParams, ScanStop};
use crate::recovery::{FileAction, RecoveryReport};
use crate::storage::fault::IoOp;
use crate::storage::segment::{
    parse_segment_file_name, rebuild_index, segment_file_name, IndexState, Segment,
};

/// How recovery may act.
#[derive(Debug, Clone, Copy)]
pub struct RecoverMode {
    /// Repair files (false: analyse only, as `verify` and `--dry-run` do).
    pub write: bool,
    /// Scan everything, not only what follows the checkpoint.
    pub full_scan: bool,
    /// What to do with corruption in synced data.
    pub recovery: RecoveryMode,
}

/// A problem found in analyse-only mode (or refused in strict mode).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// File.
    pub file: PathBuf,
    /// Byte position.
    pub position: u64,
    /// What is wrong.
    pub what: String,
    /// What `recover` would do about it.
    pub repair: String,
}

/// A recovered partition's segments and durable position.
#[derive(Debug)]
pub struct RecoveredChain {
    /// Segments, oldest first (may be empty for a sealed partition).
    pub segments: Vec<Segment>,
    /// (segment_base, position, end_offset) known durable.
    pub durable: (u64, u64, u64),
    /// Salvage holes.
    pub holes: Vec<(u64, u64)>,
    /// Problems found (analyse-only mode).
    pub problems: Vec<Problem>,
    /// Offset the partition continues at: the end of the chain, never below
    /// an offset the checkpoint knows was handed out.
    pub next_offset: u64,
}

/// Inputs of partition recovery.
#[derive(Debug)]
pub struct ChainParams<'a> {
    /// Partition directory.
    pub dir: &'a Path,
    /// (topic id, partition id).
    pub ids: (u32, u32),
    /// Index spacing.
    pub index_interval: u64,
    /// The topic's segment size: no segment of it holds data past this
    /// position, so a seal that names a later one is damage.
    pub segment_bytes: u64,
    /// Checkpoint entry, when the checkpoint has one.
    pub checkpoint: Option<&'a PartitionCheckpoint>,
    /// The checkpoint was written by a clean shutdown.
    pub clean: bool,
    /// The manifest says the partition is sealed at this offset (retention
    /// may have emptied it). Every offset below the seal was handed out.
    pub sealed: Option<u64>,
    /// No valid checkpoint exists although the manifest knows partitions:
    /// both checkpoint files were damaged or removed (every log writes one
    /// at its first open, before any topic exists).
    pub checkpoint_lost: bool,
    /// What recovery may do.
    pub mode: RecoverMode,
    /// Sees the fsyncs recovery makes after a repair.
    pub hook: &'a dyn crate::storage::fault::IoHook,
}

/// One segment file of a partition, opened and mapped before recovery
/// decides anything about it.
#[derive(Debug)]
enum SegmentFile {
    /// Below the retention floor: retired, not opened.
    Retired,
    /// Opened and mapped; the header is valid.
    Opened(Segment, SegmentInfo),
    /// The bytes prove damage: the header does not decode (torn or
    /// corrupt) or the file size is impossible.
    Damaged(Error),
}

/// A partition's files, each opened (or proven damaged) before any repair.
#[derive(Debug)]
pub struct OpenedChain {
    files: Vec<(u64, PathBuf, SegmentFile)>,
    foreign: Vec<PathBuf>,
    /// Base offsets of segments an earlier repair set aside (`.seg.damaged`).
    set_aside: Vec<u64>,
    /// Offset after the last record those segments held (0 without any).
    set_aside_end: u64,
    /// The partition directory does not exist.
    dir_missing: bool,
}

/// What a partition directory holds.
#[derive(Debug, Default)]
struct Listing {
    /// Segment files `(base offset, path)`, oldest first.
    segments: Vec<(u64, PathBuf)>,
    /// Files that are not ours (set-aside segments included).
    foreign: Vec<PathBuf>,
    /// Segments a repair set aside: (base offset, path).
    set_aside: Vec<(u64, PathBuf)>,
    /// The directory does not exist.
    dir_missing: bool,
}

/// Lists a partition directory.
fn list_segments(dir: &Path) -> Result<Listing> {
    let mut out = Listing::default();
    // The partition's directory, its topic's and `topics`: none may be a
    // symlink (see `storage::file::refuse_symlinked_dir`).
    for d in dir.ancestors().take(3) {
        crate::storage::file::refuse_symlinked_dir(d)?;
    }
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            out.dir_missing = true;
            return Ok(out);
        }
        Err(e) => return Err(Error::io(dir, e)),
    };
    for entry in rd {
        let entry = entry.at(dir)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(base) = parse_segment_file_name(&name) {
            crate::storage::file::check_listed(&entry)?;
            out.segments.push((base, entry.path()));
        } else if name.ends_with(".idx") && name.len() == 24
            || crate::format::tail_index::is_file_name(&name)
        {
            // Index caches and tail splits' descendant indexes belong to us.
            crate::storage::file::check_listed(&entry)?;
        } else if name.ends_with(".idx.tmp") {
            // An interrupted index write: scratch, replaced by the next one.
        } else {
            if let Some(base) = name
                .strip_suffix(".damaged")
                .and_then(parse_segment_file_name)
            {
                out.set_aside.push((base, entry.path()));
            }
            out.foreign.push(entry.path());
        }
    }
    out.segments.sort();
    Ok(out)
}

/// Phase one of partition recovery: lists, opens and maps every segment
/// file, changing nothing. A failing OS call (EMFILE, ENFILE, ENOMEM from
/// `mmap`, EACCES, EIO) or a newer format version fails here with its own
/// typed error, before any file of any partition is repaired: an error
/// while opening a file is never taken for damage. Only bytes that decode
/// as invalid are [`SegmentFile::Damaged`].
pub fn open_chain(p: &ChainParams<'_>) -> Result<OpenedChain> {
    let listing = list_segments(p.dir).map_err(open_failed)?;
    let mut files = Vec::with_capacity(listing.segments.len());
    for (base, path) in listing.segments {
        let file = if p.checkpoint.is_some_and(|c| base < c.start_offset) {
            SegmentFile::Retired
        } else {
            match Segment::open_with(&path, p.mode.write, p.hook) {
                Ok((seg, info)) => {
                    // A durable sealed segment already trimmed to its seal is
                    // neither scanned nor changed by the repair phase (without
                    // a full scan), and an analysis (`verify`, dry runs)
                    // changes nothing: keep the mapping, not the descriptor,
                    // so an open holds descriptors for what follows the
                    // checkpoint, not for every segment. Any other segment
                    // keeps its descriptor, so repairs never need to open a
                    // file again after this phase.
                    let settled = !p.mode.write
                        || info.seal.is_some_and(|(_, end_pos)| {
                            seg.file_len() == end_pos
                                && p.checkpoint.is_some_and(|c| base < c.segment_base)
                                && !p.mode.full_scan
                        });
                    if settled {
                        seg.release_fd();
                    }
                    SegmentFile::Opened(seg, info)
                }
                Err(e @ Error::Corruption { .. }) => SegmentFile::Damaged(e),
                Err(e) => return Err(open_failed(e)),
            }
        };
        files.push((base, path, file));
    }
    // Offsets a set-aside segment held were handed out: a repair that
    // a crash interrupted after setting segments aside (before the hole
    // that covers them was written), or a checkpoint older than their
    // last records, must not let the partition continue below them.
    let mut set_aside_end = 0;
    for (base, path) in &listing.set_aside {
        let held = match Segment::open_with(path, false, p.hook) {
            Ok((mut seg, info))
                if info.base_offset == *base && (info.topic_id, info.partition_id) == p.ids =>
            {
                held_until(&mut seg, &info, p)
            }
            Ok(_) | Err(Error::Corruption { .. }) => *base,
            Err(e) => return Err(open_failed(e)),
        };
        set_aside_end = set_aside_end.max(held);
    }
    Ok(OpenedChain {
        files,
        foreign: listing.foreign,
        set_aside: listing.set_aside.into_iter().map(|(b, _)| b).collect(),
        set_aside_end,
        dir_missing: listing.dir_missing,
    })
}

fn problem(file: &Path, position: u64, what: String, repair: &str) -> Problem {
    Problem {
        file: file.to_path_buf(),
        position,
        what,
        repair: repair.to_string(),
    }
}

/// An OS error while opening or mapping becomes [`Error::OpenFailed`].
fn open_failed(e: Error) -> Error {
    match e {
        Error::Io { path, source } => Error::OpenFailed { path, source },
        e => e,
    }
}

/// Recovers the chain of segments of one partition: [`open_chain`], then
/// [`repair_chain`].
pub fn recover_chain(p: &ChainParams<'_>, report: &mut RecoveryReport) -> Result<RecoveredChain> {
    let opened = open_chain(p)?;
    repair_chain(p, opened, report)
}

/// Phase two of partition recovery: validates the opened files against the
/// checkpoint and repairs what the mode allows.
pub fn repair_chain(
    p: &ChainParams<'_>,
    mut opened: OpenedChain,
    report: &mut RecoveryReport,
) -> Result<RecoveredChain> {
    for f in &opened.foreign {
        report.add(f, FileAction::ForeignFile);
    }
    let cp = p
        .checkpoint
        .filter(|c| c.position >= SEGMENT_HEADER_LEN as u64);
    let mut out = RecoveredChain {
        segments: Vec::new(),
        durable: (0, SEGMENT_HEADER_LEN as u64, 0),
        holes: Vec::new(),
        problems: Vec::new(),
        next_offset: 0,
    };
    let floor = p.checkpoint.map_or(0, |c| c.start_offset);
    // Offsets known to have been handed out: what the checkpoint calls
    // durable, and what segments set aside by a repair held.
    let mut known_end = cp
        .map_or(floor, |c| c.end_offset.max(floor))
        .max(opened.set_aside_end);
    let mut expected: Option<u64> = None;
    // A cut (torn tail or damage): every later segment leaves the chain.
    let mut cut = false;
    // The cut is in synced data (Truncate): later segments are set aside.
    let mut synced_cut = false;
    // A segment file was removed: the directory is fsynced below.
    let mut removed = false;
    // A segment created after the last checkpointed sync whose header does
    // not decode (a torn creation): removed only after the removals of the
    // segments after it are durable. Removed first, a power loss could keep
    // its removal and lose theirs, and the next open would find a segment
    // missing before one that is there: lost data, not a crash artifact.
    let mut torn_creation: Option<PathBuf> = None;
    let live: Vec<u64> = opened
        .files
        .iter()
        .filter(|f| !matches!(f.2, SegmentFile::Retired))
        .map(|f| f.0)
        .collect();
    // Checked before anything is changed, so Strict refuses untouched.
    if let Some(&first) = live.first().filter(|&&b| b > floor) {
        // The first segment file of the chain is gone: the partition's
        // first segment is durable from its creation on, and retention
        // only removes files below a floor a durable checkpoint holds.
        let lost = (floor, first);
        let path = p.dir.join(segment_file_name(floor));
        let what = format!(
            "segment file {} holding offsets {}..{} is missing",
            path.display(),
            lost.0,
            lost.1
        );
        match missing(p, &path, lost, what, &mut out, report)? {
            Decision::Cut => {
                cut = true;
                synced_cut = true;
            }
            Decision::Continue => {
                out.segments
                    .extend(fill_hole(p, lost, report, &mut out.holes)?);
                expected = Some(first);
            }
        }
    }
    if expected.is_none() && !cut {
        expected = Some(floor);
    }
    for (base, path, mut file) in std::mem::take(&mut opened.files) {
        let durable_segment = cp.is_some_and(|c| base < c.segment_base);
        let cp_segment = cp.filter(|c| c.segment_base == base);
        let sealed_repair = p.sealed.is_some() && p.mode.recovery == RecoveryMode::Salvage;
        if cut && synced_cut {
            // A segment a synced cut leaves out held offsets from `base`
            // on (to its seal, or to its last valid batch when it has no
            // seal): never hand them out again.
            known_end = known_end.max(match &mut file {
                SegmentFile::Opened(seg, info) => held_until(seg, info, p),
                SegmentFile::Damaged(_) => base,
                SegmentFile::Retired => 0,
            });
        }
        if cut {
            if synced_cut && matches!(file, SegmentFile::Retired) {
                delete_segment(
                    &path,
                    p.mode.write,
                    "retired by retention, back after a crash",
                    report,
                    &mut removed,
                )?;
            } else if synced_cut || durable_segment || cp_segment.is_some() {
                // Synced data after the cut point: kept aside, never deleted.
                set_aside(p, &path, "follows a truncation point", report)?;
            } else {
                delete_segment(
                    &path,
                    p.mode.write,
                    "follows a truncation point",
                    report,
                    &mut removed,
                )?;
            }
            continue;
        }
        let (mut seg, info) = match file {
            SegmentFile::Retired => {
                // Retention recorded this segment as retired before
                // unlinking it; a crash brought the file back.
                delete_segment(
                    &path,
                    p.mode.write,
                    "retired by retention, back after a crash",
                    report,
                    &mut removed,
                )?;
                continue;
            }
            SegmentFile::Opened(seg, info) => (seg, info),
            // In a sealed partition every segment is synced (the split or
            // merge that sealed it synced them first): Salvage takes an
            // unreadable one for damage, never a torn creation, and keeps
            // the segments after it (Strict refuses the partition below its
            // seal after the chain, naming the offsets; Truncate cuts).
            // A sealed partition's segments were all synced, headers
            // included, before the split or merge that sealed it
            // committed: an unreadable header there is damage, in every
            // mode, never a torn creation (whose later segments would be
            // deleted as unsynced).
            SegmentFile::Damaged(e)
                if durable_segment || cp_segment.is_some() || p.sealed.is_some() =>
            {
                let mut what = format!("unreadable segment in synced data: {e}");
                if let Some(seal) = p.sealed.filter(|&s| s > base) {
                    what.push_str(&format!(
                        " (offsets {base}..{seal} of the sealed partition are missing from here on)"
                    ));
                }
                let decision = corrupt(p, &path, 0, what, &mut out)?;
                set_aside(p, &path, "damaged", report)?;
                match decision {
                    Decision::Continue => continue,
                    Decision::Cut => {
                        cut = true;
                        synced_cut = true;
                        continue;
                    }
                }
            }
            SegmentFile::Damaged(e) => {
                // Created after the last checkpointed sync and its header
                // does not decode: a torn creation.
                unknown_sync(p, &path, 0, &e.to_string(), &mut out)?;
                delete_segment(
                    &path,
                    false,
                    "segment created after the last sync is unreadable (torn)",
                    report,
                    &mut removed,
                )?;
                if p.mode.write {
                    torn_creation = Some(path);
                }
                cut = true;
                continue;
            }
        };
        if info.base_offset != base || info.topic_id != p.ids.0 || info.partition_id != p.ids.1 {
            let what = format!(
                "segment header names topic {} partition {} base {} but the file is {}",
                info.topic_id,
                info.partition_id,
                info.base_offset,
                path.display()
            );
            let decision = corrupt(p, &path, 0, what, &mut out)?;
            set_aside(p, &path, "damaged", report)?;
            match decision {
                Decision::Continue => continue,
                Decision::Cut => {
                    cut = true;
                    synced_cut = true;
                    continue;
                }
            }
        }
        if let Some(exp) = expected {
            // The previous segment holds all its records up to its seal at
            // `exp`: a segment starting at `exp` was created (a roll seals
            // a segment at the base of the next one, after creating it),
            // and its name was durable before any later segment was
            // created (`Partition::roll`). A later segment here with none
            // at `exp` means a segment file is missing, not a torn tail.
            let after_complete = out
                .segments
                .last()
                .is_some_and(|s| s.is_sealed() && s.end_offset() == exp);
            if base != exp {
                let known_synced = durable_segment || cp_segment.is_some() || sealed_repair;
                if !(known_synced || (after_complete && base > exp)) {
                    // Written after the last checkpointed sync: the previous
                    // segment's unsynced tail was lost, so this one is too.
                    let what = format!("segment starts at offset {base}, expected {exp}");
                    unknown_sync(p, &path, 0, &what, &mut out)?;
                    delete_segment(
                        &path,
                        p.mode.write,
                        "follows a torn tail",
                        report,
                        &mut removed,
                    )?;
                    cut = true;
                    continue;
                } else if base > exp {
                    // Segments are missing between two that are here: named
                    // by the checkpoint as synced, or created before this
                    // one and after a complete segment.
                    let gap = p.dir.join(segment_file_name(exp));
                    let what = format!(
                        "offsets {exp}..{base} are missing: the chain ends at {exp} and there is no segment file {}",
                        gap.display()
                    );
                    match missing(p, &gap, (exp, base), what, &mut out, report)? {
                        Decision::Continue => {
                            out.segments
                                .extend(fill_hole(p, (exp, base), report, &mut out.holes)?);
                        }
                        Decision::Cut => {
                            known_end = known_end.max(held_until(&mut seg, &info, p));
                            set_aside(p, &path, "follows missing segments", report)?;
                            cut = true;
                            synced_cut = true;
                            continue;
                        }
                    }
                } else {
                    let what = format!("segment starts at offset {base}, expected {exp}");
                    let decision = corrupt(p, &path, 0, what, &mut out)?;
                    set_aside(p, &path, "damaged", report)?;
                    match decision {
                        Decision::Continue => continue,
                        Decision::Cut => {
                            cut = true;
                            synced_cut = true;
                            continue;
                        }
                    }
                }
            }
        }
        report.segments_opened += 1;
        let trusted_seal = info.seal.filter(|_| durable_segment && !p.mode.full_scan);
        let mut tail_cleared = false;
        let (end_pos, end_offset, sealed) = if let Some((end_offset, end_pos)) =
            trusted_seal.filter(|s| s.1 <= seg.capacity())
        {
            (end_pos, end_offset, true)
        } else {
            let (from_pos, from_offset, durable_until) = match (durable_segment, cp_segment) {
                // A rolled segment's data ends at its seal: the slack
                // after it is never written, so zeros there are the end.
                (true, _) => (
                    SEGMENT_HEADER_LEN as u64,
                    base,
                    info.seal
                        .map_or(seg.capacity(), |s| s.1.min(seg.capacity())),
                ),
                (false, Some(c)) if !p.mode.full_scan && c.position <= seg.capacity() => {
                    (c.position, c.end_offset, c.position)
                }
                (false, Some(c)) => (
                    SEGMENT_HEADER_LEN as u64,
                    base,
                    c.position.min(seg.capacity()),
                ),
                (false, None) => (SEGMENT_HEADER_LEN as u64, base, 0),
            };
            let params = ScanParams {
                base_offset: base,
                from_pos,
                from_offset,
                durable_until,
                mode: p.mode.recovery,
                index_interval: p.index_interval,
            };
            let outcome = scan_segment(seg.raw_for_recovery(), &params);
            // Set when Salvage completes a torn rolled segment to its seal.
            let mut resealed = None;
            report.bytes_scanned += outcome.end_pos - from_pos;
            report.records_scanned += outcome.records;
            for h in &outcome.holes {
                report.add(
                    &path,
                    FileAction::Salvaged {
                        position: h.position,
                        lost_offsets: (h.first_offset, h.first_offset + h.lost),
                    },
                );
                out.holes.push((h.first_offset, h.first_offset + h.lost));
                if p.mode.write {
                    seg.write_hole(h.position, h.len, h.first_offset, h.lost)?;
                } else {
                    out.problems.push(problem(
                        &path,
                        h.position,
                        "damaged batches".into(),
                        "salvage replaces them with a hole",
                    ));
                }
            }
            if p.mode.write && !outcome.holes.is_empty() {
                // The segment counts as synced up to its recovered end
                // (below the checkpoint), so no sync round covers the
                // hole batches: sync them here, or a power loss brings
                // the damaged bytes back after a repair that reported
                // success.
                seg.sync_data(p.hook)?;
            }
            // A rolled segment that ends below its seal, however the scan
            // stopped (a torn batch, a cut exactly at a batch boundary, or
            // damage with nothing valid after it in synced data): the
            // segment after it starts at the seal, so what follows the end
            // is known to end there. Salvage keeps the later segments
            // (valid records after damage) and fills the segment up to its
            // seal with one hole batch, as it does for damage inside a
            // segment. Only for data known synced up to the seal (a
            // checkpoint past the segment, or a split or merge that sealed
            // the partition, which syncs it first): otherwise the end below
            // the seal is a power loss of unsynced writes, which leaves a
            // prefix (C3) and is cut as in Truncate. The seal must leave
            // room for a hole batch's header and its length and lost
            // offsets must fit the batch fields. A seal past the topic's
            // segment size was never written by a roll: it is damage, and
            // its word would have Salvage write gigabytes of hole.
            let reseal = info.seal.filter(|&(off, pos)| {
                p.mode.write
                    && p.mode.recovery == RecoveryMode::Salvage
                    && (durable_segment || p.sealed.is_some())
                    && off > outcome.end_offset
                    && pos >= outcome.end_pos + BATCH_HEADER_LEN as u64
                    && pos <= p.segment_bytes
                    && u32::try_from(off - outcome.end_offset).is_ok()
                    && u32::try_from(pos - outcome.end_pos).is_ok()
            });
            match &outcome.stop {
                _ if reseal.is_some() => {
                    let (seal_offset, seal_pos) = reseal.expect("guarded");
                    let position = outcome.end_pos;
                    let hole = (outcome.end_offset, seal_offset);
                    report.add(
                        &path,
                        FileAction::Salvaged {
                            position,
                            lost_offsets: hole,
                        },
                    );
                    out.holes.push(hole);
                    seg.write_hole(position, seal_pos - position, hole.0, hole.1 - hole.0)?;
                    seg.sync_data(p.hook)?;
                    if seal_pos > seg.capacity() {
                        // The tear shortened the file: the hole batch
                        // extended it past the mapping, so map it again.
                        (seg, _) = Segment::open_with(&path, true, p.hook)?;
                    }
                    resealed = Some((seal_offset, seal_pos));
                }
                ScanStop::End => {}
                ScanStop::Torn {
                    position,
                    reason,
                    later_valid,
                } => {
                    unknown_sync(p, &path, *position, reason, &mut out)?;
                    report.add(
                        &path,
                        FileAction::TruncatedTornTail {
                            position: *position,
                            reason: reason.clone(),
                            discarded_later_batches: *later_valid,
                        },
                    );
                    cut = true;
                }
                ScanStop::Corrupt {
                    position,
                    reason,
                    later_valid,
                    action,
                } => {
                    let what = format!(
                        "{reason}{}",
                        if *later_valid {
                            " (valid records follow: mid-segment corruption)"
                        } else {
                            ""
                        }
                    );
                    if *action == CorruptAction::Refused || !p.mode.write {
                        corrupt(p, &path, *position, what.clone(), &mut out)?;
                    }
                    report.add(
                        &path,
                        FileAction::TruncatedCorruption {
                            position: *position,
                            reason: what,
                            first_lost_offset: outcome.end_offset,
                        },
                    );
                    cut = true;
                    synced_cut = true;
                }
            }
            // A sealed partition cut below its seal is missing data (see
            // after the chain): Strict refuses it here, before the tail
            // is cleared and the segments after it are removed, so a
            // refusing open changes no file.
            if cut && p.mode.write && p.mode.recovery == RecoveryMode::Strict {
                if let Some(seal) = p.sealed.filter(|&s| outcome.end_offset < s) {
                    let lost = (outcome.end_offset, seal);
                    let what = format!(
                            "the sealed partition is cut at offset {} but was sealed at {}: offsets {}..{} are missing",
                            lost.0, lost.1, lost.0, lost.1
                        );
                    missing(p, &path, lost, what, &mut out, report)?;
                }
            }
            // Past the synced region, stale bytes may lie beyond the end
            // (unsynced batches a crash half kept): clear them so they can
            // never validate after later appends.
            let (end_pos, end_offset) =
                resealed.map_or((outcome.end_pos, outcome.end_offset), |(o, pos)| (pos, o));
            if p.mode.write && (cut || !p.clean) {
                tail_cleared = seg.clear_tail(end_pos)?;
            }
            if from_pos == SEGMENT_HEADER_LEN as u64 {
                *seg.index.lock() = IndexState::Loaded(outcome.index.clone());
                // A full scan (`recover`) also rewrites an index file
                // that does not match (a power loss at a roll can leave
                // it stale); it is a cache, so failing to is no error. So
                // does a salvaged tear: the file may name batches past it.
                if p.mode.write
                    && (p.mode.full_scan || resealed.is_some())
                    && matches!(seg.repair_index_file(p.hook), Ok(true))
                {
                    report.add(seg.index_path(), FileAction::RebuiltIndex);
                }
            }
            (
                end_pos,
                end_offset,
                info.seal.is_some() && !cut && end_pos == info.seal.map_or(0, |s| s.1),
            )
        };
        let synced = if tail_cleared {
            // The cleared tail is not durable yet: until it is, a power
            // loss can bring the stale batches back, and once appends after
            // this open refill the bytes before them they would validate
            // and continue the chain (records this recovery cut, after
            // records appended later). Counted as unsynced, the file is
            // fdatasynced by the open's own sync round, before any append.
            0
        } else if durable_segment {
            end_pos
        } else {
            cp_segment.map_or(SEGMENT_HEADER_LEN as u64, |c| c.position)
        };
        seg.set_recovered_end(end_pos, end_offset, synced, sealed);
        if let Some(c) = cp_segment {
            if c.position <= end_pos {
                out.durable = (base, c.position, c.end_offset);
            }
        }
        if matches!(*seg.index.lock(), IndexState::NotLoaded) && !sealed {
            // After a clean shutdown the active segment's index file is
            // what the close made durable: read it (metadata, C7) rather
            // than walk every batch header of the data. Otherwise, or when
            // it does not decode whole, it is rebuilt from the headers.
            let from_file = (p.clean && !p.mode.full_scan)
                .then(|| seg.load_clean_index_file(end_pos))
                .flatten();
            let entries = from_file.unwrap_or_else(|| {
                rebuild_index(&seg.committed(), base, end_pos, p.index_interval)
            });
            *seg.index.lock() = IndexState::Loaded(entries);
        }
        expected = Some(end_offset);
        out.segments.push(seg);
    }
    if removed {
        // The segments after a torn tail (or retired ones a crash brought
        // back) must stay deleted: without this fsync a second power loss
        // can bring them back after new appends reused their offsets, and
        // their stale records would continue the chain (phantoms, C2).
        crate::storage::sync_dir(p.hook, IoOp::SyncRecoveryDir, p.dir)?;
    }
    let chain_end = out.segments.last().map_or(floor, |s| s.end_offset());
    // The checkpoint's segment is gone (not retired, not set aside by an
    // earlier repair), or an active partition has no segment at all (its
    // directory and first segment are durable before the manifest commits
    // it): the end of the partition is missing.
    let cp_file_missing = cp.is_some_and(|c| {
        c.segment_base >= floor
            && !live.contains(&c.segment_base)
            && !opened.set_aside.contains(&c.segment_base)
    });
    let no_segment = live.is_empty()
        && opened.set_aside.is_empty()
        && (p.sealed.is_none() || p.checkpoint.is_none());
    // The chain ends with a rolled segment, complete up to its seal: the
    // segment after it existed (whatever followed it here was cut or is
    // missing).
    let ends_rolled = out.segments.last().is_some_and(|s| s.is_sealed());
    // A sealed partition whose files hold less than its seal lost data
    // whatever its files look like (its only segment unreadable, say): the
    // split or merge that sealed it synced its segments and their names
    // before its record committed.
    if p.sealed.is_some() || no_segment || synced_cut || ends_rolled {
        // Data is missing from a sealed partition: its offsets up to the
        // manifest's seal were handed out (its children continue after
        // them), whether or not a checkpoint recorded them. Below the seal
        // they read as a hole, never as nothing: an empty chain that ends
        // at the seal without a durable floor is not a state a later open
        // can tell from missing files. A chain that ends with a rolled
        // segment below the seal lost the files after it: a split or merge
        // syncs the parent (and the name of every segment it rolled to)
        // before its record commits, and the checkpoint, written only when
        // due, need not name them.
        known_end = known_end.max(p.sealed.unwrap_or(0));
    }
    if !synced_cut && (chain_end < known_end || cp_file_missing || no_segment) {
        let lost = (chain_end, known_end.max(chain_end));
        let (path, what) = if opened.dir_missing {
            (
                p.dir.to_path_buf(),
                format!(
                    "partition directory {} is missing (offsets {}..{} lost)",
                    p.dir.display(),
                    lost.0,
                    lost.1
                ),
            )
        } else if cp_file_missing || no_segment {
            let named = cp.map_or(chain_end, |c| c.segment_base.max(chain_end));
            let path = p.dir.join(segment_file_name(named));
            let what = format!(
                "segment file {} is missing: offsets {}..{} the checkpoint calls durable are gone",
                path.display(),
                lost.0,
                lost.1
            );
            (path, what)
        } else {
            // The files are there but end early (a segment shorter than
            // the checkpointed position, or lost with the ones after it).
            let path = out
                .segments
                .last()
                .map_or_else(|| p.dir.to_path_buf(), |s| s.path().to_path_buf());
            let by_checkpoint = cp.map_or(floor, |c| c.end_offset.max(floor));
            let what = if ends_rolled && p.sealed == Some(lost.1) && by_checkpoint < lost.1 {
                format!(
                    "the partition ends at offset {} with a rolled segment but was sealed at {}: offsets {}..{} are missing",
                    lost.0, lost.1, lost.0, lost.1
                )
            } else {
                format!(
                    "the partition ends at offset {} but the checkpoint says offsets up to {} are durable: offsets {}..{} are missing",
                    lost.0, lost.1, lost.0, lost.1
                )
            };
            (path, what)
        };
        missing(p, &path, lost, what, &mut out, report)?;
    }
    // Removed only now: a mode that refuses missing data (above) leaves
    // every file as it was.
    if let Some(path) = torn_creation {
        std::fs::remove_file(&path).at(&path)?;
        let _ = std::fs::remove_file(path.with_extension("idx"));
        crate::storage::sync_dir(p.hook, IoOp::SyncRecoveryDir, p.dir)?;
    }
    if p.mode.write && known_end > chain_end {
        // Offsets below `known_end` were handed out (and may sit in a saved
        // Cut): they read as a hole, and appends continue after them.
        out.segments.extend(fill_hole(
            p,
            (chain_end, known_end),
            report,
            &mut out.holes,
        )?);
    }
    out.next_offset = out.segments.last().map_or(known_end, |s| s.end_offset());
    if p.mode.write {
        // Every segment but the last was rolled: make sure its header says
        // so (a crash may have kept the next segment but not the seal).
        let n = out.segments.len();
        for seg in out.segments.iter_mut().take(n.saturating_sub(1)) {
            seg.seal_recovered();
        }
        // The last one, unless recovery found it sealed, takes appends: a
        // seal a torn roll left in its header is not true any more.
        if let Some(last) = out.segments.last_mut() {
            last.clear_stale_seal()?;
        }
    }
    Ok(out)
}

/// The offset after the last record a segment that repair leaves out of
/// the chain held: its seal, or for a segment without one (the active
/// segment) the end of its valid batches. Records synced after the last
/// checkpoint lie past the checkpoint's end, so neither that nor the base
/// offset bounds what was handed out.
fn held_until(seg: &mut Segment, info: &SegmentInfo, p: &ChainParams<'_>) -> u64 {
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
    };
    scan_segment(seg.raw_for_recovery(), &params).end_offset
}

/// Invalid bytes past the checkpointed position are a torn tail of
/// unsynced writes and are cut in every mode. Without any valid checkpoint
/// (both files damaged or gone while the manifest knows partitions) nothing
/// says where synced data ends, so they may be synced data: Strict refuses
/// instead of cutting, Truncate and Salvage cut and report as usual.
fn unknown_sync(
    p: &ChainParams<'_>,
    path: &Path,
    position: u64,
    reason: &str,
    out: &mut RecoveredChain,
) -> Result<()> {
    if p.checkpoint_lost {
        let what = format!(
            "{reason}; there is no valid recovery checkpoint, so this may be synced data, not a torn tail of unsynced writes"
        );
        corrupt(p, path, position, what, out)?;
    }
    Ok(())
}

/// Handles data known to exist whose file (or directory) is missing:
/// refused in Strict; in Truncate and Salvage the report names the file and
/// the offsets lost with it.
fn missing(
    p: &ChainParams<'_>,
    path: &Path,
    lost: (u64, u64),
    what: String,
    out: &mut RecoveredChain,
    report: &mut RecoveryReport,
) -> Result<Decision> {
    let decision = corrupt(p, path, 0, what, out)?;
    if p.mode.write {
        report.add(path, FileAction::MissingData { lost_offsets: lost });
    }
    Ok(decision)
}

/// Writes a segment holding one hole batch for `[lost.0, lost.1)` (write
/// mode only), so the chain stays continuous: the next open, in any mode,
/// finds no gap, reads of the range report the hole, and the offsets are
/// never handed out again.
fn fill_hole(
    p: &ChainParams<'_>,
    lost: (u64, u64),
    report: &mut RecoveryReport,
    holes: &mut Vec<(u64, u64)>,
) -> Result<Option<Segment>> {
    if lost.0 >= lost.1 {
        return Ok(None);
    }
    holes.push(lost);
    if !p.mode.write {
        return Ok(None);
    }
    if !p.dir.exists() {
        std::fs::create_dir_all(p.dir).at(p.dir)?;
        if let Some(parent) = p.dir.parent() {
            crate::storage::sync_dir(p.hook, IoOp::SyncRecoveryDir, parent)?;
        }
    }
    let filler = Segment::create_hole(p.dir, p.ids, lost.0, lost.1, p.hook)?;
    report.add(
        filler.path(),
        FileAction::Salvaged {
            position: SEGMENT_HEADER_LEN as u64,
            lost_offsets: lost,
        },
    );
    Ok(Some(filler))
}

enum Decision {
    Continue,
    Cut,
}

/// Handles corruption in synced data according to the mode.
fn corrupt(
    p: &ChainParams<'_>,
    file: &Path,
    position: u64,
    what: String,
    out: &mut RecoveredChain,
) -> Result<Decision> {
    if !p.mode.write {
        let repair = match p.mode.recovery {
            RecoveryMode::Strict => "recover --mode truncate cuts the partition here; --mode salvage keeps the valid records after it",
            RecoveryMode::Truncate => "truncate cuts the partition here",
            RecoveryMode::Salvage => "salvage keeps the valid records after the damage and records a hole",
        };
        out.problems.push(problem(file, position, what, repair));
        return Ok(Decision::Cut);
    }
    match p.mode.recovery {
        RecoveryMode::Strict => Err(Error::corruption(
            file,
            position,
            format!("{what}; open with RecoveryMode::Truncate or Salvage (fissionlog recover --mode truncate|salvage) to repair"),
        )),
        RecoveryMode::Truncate => Ok(Decision::Cut),
        RecoveryMode::Salvage => Ok(Decision::Continue),
    }
}

/// Removes a segment file (write mode) and notes it in `removed`: the
/// caller fsyncs the directory before anything relies on the removal.
fn delete_segment(
    path: &Path,
    write: bool,
    reason: &str,
    report: &mut RecoveryReport,
    removed: &mut bool,
) -> Result<()> {
    if write {
        std::fs::remove_file(path).at(path)?;
        let _ = std::fs::remove_file(path.with_extension("idx"));
        *removed = true;
    }
    report.add(
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
fn set_aside(
    p: &ChainParams<'_>,
    path: &Path,
    why: &str,
    report: &mut RecoveryReport,
) -> Result<()> {
    if !p.mode.write {
        return Ok(());
    }
    let to = path.with_extension("seg.damaged");
    std::fs::rename(path, &to).at(path)?;
    let _ = std::fs::remove_file(path.with_extension("idx"));
    if let Some(dir) = path.parent() {
        crate::storage::sync_dir(p.hook, crate::storage::fault::IoOp::SyncRecoveryDir, dir)?;
    }
    report.add(
        path,
        FileAction::DeletedSegment {
            reason: format!("{why}; moved to {}", to.display()),
        },
    );
    Ok(())
}

/// Shares recovered segments.
pub fn into_arcs(segments: Vec<Segment>) -> Vec<Arc<Segment>> {
    segments.into_iter().map(Arc::new).collect()
}
