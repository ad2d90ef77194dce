//! Keeping a segment that continues the chain: trusting its seal or
//! scanning it, salvaging or cutting what the scan found, and publishing
//! its recovered end.

use std::path::Path;

use crate::config::RecoveryMode;
use crate::error::Result;
use crate::format::batch::{self, BATCH_HEADER_LEN};
use crate::format::segment::{HeaderInfo, SEGMENT_HEADER_LEN};
use crate::recovery::scan::{
    scan_segment, CorruptAction, HoleFix, ScanOutcome, ScanParams, ScanStop,
};
use crate::recovery::FileAction;
use crate::storage::position::DurablePoint;
use crate::storage::segment::{rebuild_index, IndexState, Segment};

use super::apply::Repairs;
use super::classify::{Cursor, CutState, SyncKnowledge};
use super::{problem, ChainParams};

/// How a kept segment's end is found.
#[derive(Debug, Clone, Copy)]
pub enum ScanPlan {
    /// A durable sealed segment that fits its mapping: its seal is its end.
    TrustSeal {
        /// End of data.
        end_pos: u64,
        /// Offset after its last record.
        end_offset: u64,
    },
    /// A sealed partition's last segment that ends where a clean
    /// shutdown's checkpoint says (see [`reaches_checkpoint`]).
    AtCheckpoint {
        /// End of data: the checkpointed position.
        end_pos: u64,
        /// Offset after its last record: the checkpointed end.
        end_offset: u64,
    },
    /// Scan it.
    Scan(ScanParams),
}

/// Where a kept segment ends.
#[derive(Debug, Clone, Copy)]
struct RecoveredEnd {
    end_pos: u64,
    end_offset: u64,
    sealed: bool,
    /// Stale bytes past the end were cleared, not yet durably.
    tail_cleared: bool,
}

/// Where scanning a kept segment starts and what it may take for synced.
/// Pure.
pub fn plan_scan(
    base: u64,
    info: &HeaderInfo,
    capacity: u64,
    sync: &SyncKnowledge<'_>,
    p: &ChainParams<'_>,
) -> ScanPlan {
    let trusted_seal = info
        .seal
        .filter(|_| sync.durable_segment && !p.mode.full_scan);
    if let Some((end_offset, end_pos)) = trusted_seal.filter(|s| s.1 <= capacity) {
        return ScanPlan::TrustSeal {
            end_pos,
            end_offset,
        };
    }
    let header = SEGMENT_HEADER_LEN as u64;
    // A seal below the checkpointed position: the checkpoint describes
    // another file of this name (a repair that a crash stopped before its
    // checkpoint replaced the checkpoint's missing segment with a hole
    // segment). The file's own seal says where its data ends.
    let seal_below_checkpoint = sync
        .checkpoint
        .is_some_and(|c| info.seal.is_some_and(|(_, end_pos)| end_pos < c.position));
    let to_seal = sync.durable_segment || seal_below_checkpoint;
    let (from_pos, from_offset, durable_until) = match (to_seal, sync.checkpoint) {
        // A rolled segment's data ends at its seal: the slack after it is
        // never written, so zeros there are the end.
        (true, _) => (
            header,
            base,
            info.seal.map_or(capacity, |s| s.1.min(capacity)),
        ),
        (false, Some(c)) if !p.mode.full_scan && c.position <= capacity => {
            (c.position, c.end_offset, c.position)
        }
        (false, Some(c)) => (header, base, c.position.min(capacity)),
        (false, None) => (header, base, 0),
    };
    ScanPlan::Scan(ScanParams {
        base_offset: base,
        from_pos,
        from_offset,
        durable_until,
        mode: p.mode.recovery,
        index_interval: p.index_interval,
        batch_version: info.version,
    })
}

/// Where Salvage completes a rolled segment that ends below its seal,
/// however the scan stopped (a torn batch, a cut exactly at a batch
/// boundary, or damage with nothing valid after it in synced data): the
/// segment after it starts at the seal, so what follows the end is known
/// to end there. Salvage keeps the later segments (valid records after
/// damage) and fills the segment up to its seal with one hole batch, as it
/// does for damage inside a segment. Only for data known synced up to the
/// seal (a checkpoint past the segment, or a split or merge that sealed
/// the partition, which syncs it first): otherwise the end below the seal
/// is a power loss of unsynced writes, which leaves a prefix (C3) and is
/// cut as in Truncate. The seal must leave room for a hole batch's header
/// and its length and lost offsets must fit the batch fields. A seal past
/// the topic's segment size was never written by a roll: it is damage, and
/// its word would have Salvage write gigabytes of hole. Pure.
pub fn reseal_target(
    info: &HeaderInfo,
    outcome: &ScanOutcome,
    durable_segment: bool,
    p: &ChainParams<'_>,
) -> Option<(u64, u64)> {
    info.seal.filter(|&(off, pos)| {
        p.mode.write
            && p.mode.recovery == RecoveryMode::Salvage
            && (durable_segment || p.sealed.is_some())
            && off > outcome.end_offset
            && pos >= outcome.end_pos + BATCH_HEADER_LEN as u64
            && pos <= p.segment_bytes
            && u32::try_from(off - outcome.end_offset).is_ok()
            && u32::try_from(pos - outcome.end_pos).is_ok()
    })
}

/// Where a scan that starts at the checkpointed position really starts.
/// The batch headers of the segment must chain to that position: a
/// repair that a crash stopped before it wrote its checkpoint (a cut in
/// synced data, its tail cleared) leaves the old checkpoint naming a
/// position past the cut, and scanning from there would take the cleared
/// bytes for data and append after them, where no read reaches. Then the
/// segment is scanned from its first batch, everything below the
/// checkpointed position counting as synced. The walk starts at
/// `walk_from` (see [`walk_start`]). Pure.
pub fn checked_start(file: &[u8], params: ScanParams, walk_from: (u64, u64)) -> ScanParams {
    let header = SEGMENT_HEADER_LEN as u64;
    if params.from_pos <= header
        || headers_lead_to(file, walk_from, params.from_pos, params.from_offset)
    {
        return params;
    }
    ScanParams {
        from_pos: header,
        from_offset: params.base_offset,
        ..params
    }
}

/// Where the walk of [`checked_start`] begins: after a crash at the first
/// batch (the index rebuild on that path walks every header anyway);
/// after a clean shutdown at the last entry below the checkpointed
/// position of the index file the close wrote, so the open stays
/// metadata-sized (C7). A cleared tail zeroes everything from the cut on,
/// so a walk from any entry crosses it or starts in it.
fn walk_start(
    seg: &Segment,
    base: u64,
    (to_pos, to_offset): (u64, u64),
    p: &ChainParams<'_>,
) -> (u64, u64) {
    let first = (SEGMENT_HEADER_LEN as u64, base);
    if !p.clean || to_pos <= first.0 {
        return first;
    }
    let Ok(Some(buf)) = seg.read_index_file() else {
        return first;
    };
    let (entries, _) = crate::format::index::decode_index(&buf, base, to_pos, to_offset);
    entries.last().map_or(first, |e| {
        (u64::from(e.position), base + u64::from(e.rel_offset))
    })
}

/// Whether the batch headers of `file` from `from` (a position and its
/// offset) chain to exactly `to_pos`, at offset `to_offset`. Pure.
fn headers_lead_to(file: &[u8], from: (u64, u64), to_pos: u64, to_offset: u64) -> bool {
    headers_lead_to_in((file, 0), from, to_pos, to_offset)
}

/// [`headers_lead_to`] over `bytes`, the file's bytes from position `at`
/// on. Pure.
fn headers_lead_to_in(
    (bytes, at): (&[u8], u64),
    from: (u64, u64),
    to_pos: u64,
    to_offset: u64,
) -> bool {
    let (mut pos, mut next) = from;
    while pos < to_pos {
        let Some(rest) = pos
            .checked_sub(at)
            .and_then(|rel| usize::try_from(rel).ok())
            .and_then(|rel| bytes.get(rel..))
        else {
            return false;
        };
        let Ok(h) = batch::parse_header(rest) else {
            return false;
        };
        if h.base_offset.get() != next || h.batch_len.get() == 0 {
            return false;
        }
        next += u64::from(h.record_count.get());
        pos += u64::from(h.batch_len.get());
    }
    pos == to_pos && next == to_offset
}

/// The most bytes [`reaches_checkpoint`] reads to check a segment: an
/// index interval of batch headers and the batch that crosses its end,
/// for the file a clean close wrote. A longer walk is left to the scan.
const CHECKPOINT_WALK_MAX_BYTES: u64 = 64 << 10;

/// Whether the batch headers of `seg` (opened, not mapped, holding its
/// descriptor) lead from its first batch (a segment of at most
/// [`CHECKPOINT_WALK_MAX_BYTES`]) or from its index file's last entry to
/// exactly the checkpointed position and end: what
/// [`checked_start`] checks before a scan from the checkpoint, read with
/// one `pread` instead of a mapping. A repair that a crash stopped before
/// its checkpoint leaves that checkpoint naming a position past a cut,
/// and then the segment is scanned. `false` when the bytes to read exceed
/// [`CHECKPOINT_WALK_MAX_BYTES`] or cannot be read: the scan decides.
pub(super) fn reaches_checkpoint(seg: &Segment, base: u64, p: &ChainParams<'_>) -> bool {
    let Some(c) = p.checkpoint else {
        return false;
    };
    let header = SEGMENT_HEADER_LEN as u64;
    if c.position <= header {
        return c.position == header && c.end_offset == base;
    }
    // A segment this short is read whole, without looking for its index.
    let from = if c.position - header <= CHECKPOINT_WALK_MAX_BYTES {
        (header, base)
    } else {
        walk_start(seg, base, (c.position, c.end_offset), p)
    };
    if c.position - from.0 > CHECKPOINT_WALK_MAX_BYTES {
        return false;
    }
    seg.read_unmapped(from.0, c.position)
        .is_some_and(|bytes| headers_lead_to_in((&bytes, from.0), from, c.position, c.end_offset))
}

/// How a scan's stop cuts the chain: a torn tail is unsynced, corruption
/// is in synced data. Pure.
pub fn stop_cut(stop: &ScanStop) -> CutState {
    match stop {
        ScanStop::End => CutState::None,
        ScanStop::Torn { .. } => CutState::Unsynced,
        ScanStop::Corrupt { .. } => CutState::Synced,
    }
}

/// Recovers the end of `seg`, which continues the chain, and appends it.
/// `settled`: a sealed partition's last segment that ends where a clean
/// shutdown's checkpoint says ([`reaches_checkpoint`]): its end is the
/// checkpoint's, and it is kept unmapped, its index loaded when a read
/// asks.
pub(super) fn keep_segment(
    base: u64,
    path: &Path,
    mut seg: Segment,
    (info, settled): (&HeaderInfo, bool),
    cur: &mut Cursor,
    r: &mut Repairs<'_, '_>,
) -> Result<()> {
    let p = r.p;
    let sync = SyncKnowledge::of(base, p);
    r.report.segments_opened += 1;
    let plan = match sync.checkpoint.filter(|_| settled) {
        Some(c) => ScanPlan::AtCheckpoint {
            end_pos: c.position,
            end_offset: c.end_offset,
        },
        None => plan_scan(base, info, seg.capacity(), &sync, p),
    };
    let end = match plan {
        ScanPlan::AtCheckpoint {
            end_pos,
            end_offset,
        } => RecoveredEnd {
            end_pos,
            end_offset,
            sealed: info.seal.is_some(),
            tail_cleared: false,
        },
        ScanPlan::TrustSeal {
            end_pos,
            end_offset,
        } => RecoveredEnd {
            end_pos,
            end_offset,
            sealed: true,
            tail_cleared: false,
        },
        ScanPlan::Scan(params) => {
            let walk_from = walk_start(&seg, base, (params.from_pos, params.from_offset), p);
            let params = checked_start(&seg.raw_for_recovery()?, params, walk_from);
            scan_and_repair(path, &mut seg, info, &params, &sync, cur, r)?
        }
    };
    let synced = if end.tail_cleared {
        // The cleared tail is not durable yet: until it is, a power loss
        // can bring the stale batches back, and once appends after this
        // open refill the bytes before them they would validate and
        // continue the chain (records this recovery cut, after records
        // appended later). Counted as unsynced, the file is fdatasynced by
        // the open's own sync round, before any append.
        0
    } else if sync.durable_segment {
        end.end_pos
    } else {
        // Never past the end: a checkpoint that describes another file of
        // this name (see `plan_scan`) says nothing of this one's bytes.
        // Without a checkpoint in its data nothing of the file is known
        // durable, its header included (a new topic's first segment, or a
        // rolled one, that a process kill left in the page cache): the
        // open's sync round fdatasyncs it before a checkpoint points into
        // it, even when it holds no record.
        sync.checkpoint.map_or(0, |c| c.position.min(end.end_pos))
    };
    seg.set_recovered_end(end.end_pos, end.end_offset, synced, end.sealed);
    if let Some(c) = sync.checkpoint.filter(|c| c.position <= end.end_pos) {
        r.out.durable = DurablePoint {
            segment_base: base,
            position: c.position,
            end_offset: c.end_offset,
        };
    }
    if matches!(*seg.index.lock(), IndexState::NotLoaded) && !end.sealed && !settled {
        // After a clean shutdown the active segment's index file is what
        // the close made durable: read it (metadata, C7) rather than walk
        // every batch header of the data. Otherwise, or when it does not
        // decode whole, it is rebuilt from the headers.
        let from_file = (p.clean && !p.mode.full_scan)
            .then(|| seg.load_clean_index_file(end.end_pos))
            .flatten();
        let entries = match from_file {
            Some(e) => e,
            None => rebuild_index(&seg.committed()?, base, end.end_pos, p.index_interval),
        };
        *seg.index.lock() = IndexState::Loaded(entries);
    }
    cur.kept(end.end_offset, end.sealed);
    if !p.mode.write {
        // An analysis (`verify`) keeps what it learnt (ends, index), not
        // the mapping: it is under no log's budget, and a partition of
        // more segments than the kernel allows mappings is checked one
        // segment at a time.
        seg.release_fd();
    }
    r.out.segments.push(seg);
    Ok(())
}

/// Scans a kept segment and repairs what the scan found: salvage holes, a
/// reseal, a torn tail or corruption cut, stale bytes past the end, the
/// index.
fn scan_and_repair(
    path: &Path,
    seg: &mut Segment,
    info: &HeaderInfo,
    params: &ScanParams,
    sync: &SyncKnowledge<'_>,
    cur: &mut Cursor,
    r: &mut Repairs<'_, '_>,
) -> Result<RecoveredEnd> {
    let p = r.p;
    let outcome = scan_segment(&seg.raw_for_recovery()?, params);
    r.report.bytes_scanned += outcome.end_pos - params.from_pos;
    r.report.records_scanned += outcome.records;
    r.salvage_holes(path, seg, &outcome.holes)?;
    // Set when Salvage completes a torn rolled segment to its seal.
    let resealed = reseal_target(info, &outcome, sync.durable_segment, p);
    match resealed {
        Some(seal) => r.reseal(path, seg, &outcome, seal)?,
        None => r.note_stop(path, &outcome, cur)?,
    }
    // The chain was not cut before this segment (it is kept): a cut now is
    // this segment's.
    let cut_here = cur.cut != CutState::None;
    if cut_here {
        r.refuse_cut_below_seal(path, outcome.end_offset)?;
    }
    let (end_pos, end_offset) =
        resealed.map_or((outcome.end_pos, outcome.end_offset), |(o, pos)| (pos, o));
    let tail_cleared = clear_past_end(seg, info, end_pos, cut_here, p)?;
    if params.from_pos == SEGMENT_HEADER_LEN as u64 {
        r.load_scanned_index(seg, &outcome, resealed.is_some(), info.seal.is_some());
    }
    Ok(RecoveredEnd {
        end_pos,
        end_offset,
        sealed: info.seal.is_some() && !cut_here && end_pos == info.seal.map_or(0, |s| s.1),
        tail_cleared,
    })
}

/// Past the synced region, stale bytes may lie beyond the end (unsynced
/// batches a crash half kept): clears them (write mode, after a cut or a
/// crash) so they can never validate after later appends. Returns whether
/// the tail was cleared.
fn clear_past_end(
    seg: &mut Segment,
    info: &HeaderInfo,
    end_pos: u64,
    cut_here: bool,
    p: &ChainParams<'_>,
) -> Result<bool> {
    if p.mode.write && cut_here && info.seal.is_some_and(|(_, seal_pos)| seal_pos > end_pos) {
        // The seal of a rolled segment cut below it goes first, durably:
        // a crash after the tail is cleared and before this repair ends
        // would leave the seal naming the cleared bytes, and the next
        // open trusts the seal of a segment the checkpoint passed. Without
        // it, that open scans the segment and finds the cut again.
        if seg.clear_stale_seal()? {
            seg.sync_data(p.hook)?;
        }
    }
    if p.mode.write && (cut_here || !p.clean) {
        return seg.clear_tail(end_pos);
    }
    Ok(false)
}

impl Repairs<'_, '_> {
    /// A sealed partition cut below its seal (at `end_offset`, in this
    /// segment) is missing data (see after the chain): Strict refuses it
    /// here, before the tail is cleared and the segments after it are
    /// removed, so a refusing open changes no file.
    fn refuse_cut_below_seal(&mut self, path: &Path, end_offset: u64) -> Result<()> {
        let p = self.p;
        if !p.mode.write || p.mode.recovery != RecoveryMode::Strict {
            return Ok(());
        }
        if let Some(seal) = p.sealed.filter(|&s| end_offset < s) {
            let lost = end_offset..seal;
            let what = format!(
                "the sealed partition is cut at offset {} but was sealed at {}: offsets {}..{} are missing",
                lost.start, lost.end, lost.start, lost.end
            );
            self.missing(path, lost, what)?;
        }
        Ok(())
    }

    /// After a scan from the header: the index the scan built is the
    /// segment's. A full scan (`recover`) also rewrites an index file that
    /// does not match (a power loss at a roll can leave it stale), and
    /// reports it; it is a cache, so failing to is no error. So does a
    /// salvaged tear (`resealed`): the file may name batches past it. Any
    /// other open rewrites a sealed segment's stale file too, without a
    /// report (nothing else writes that index again, and `verify` would
    /// list it until a `recover`): only the segments an unclean open
    /// scans (those past the checkpoint) get here, only a file that does
    /// not match is written, and an active segment's is the clean close's.
    fn load_scanned_index(
        &mut self,
        seg: &mut Segment,
        outcome: &ScanOutcome,
        resealed: bool,
        sealed: bool,
    ) {
        let p = self.p;
        *seg.index.lock() = IndexState::Loaded(outcome.index.clone());
        if !p.mode.write {
            return;
        }
        // Written after the chain (see `Repairs::index_rewrites`).
        if p.mode.full_scan || resealed {
            self.index_rewrites.push((seg.base_offset, true));
        } else if sealed {
            self.index_rewrites.push((seg.base_offset, false));
        }
    }

    /// Replaces the damaged regions a Salvage scan found with hole batches
    /// (write mode; an analysis names them).
    fn salvage_holes(&mut self, path: &Path, seg: &mut Segment, holes: &[HoleFix]) -> Result<()> {
        let p = self.p;
        for h in holes {
            let lost = h.first_offset..h.first_offset + h.lost;
            self.report.add(
                path,
                FileAction::Salvaged {
                    position: h.position,
                    lost_offsets: lost.clone().into(),
                },
            );
            self.out.holes.push(lost);
            if p.mode.write {
                seg.write_hole(h.position, h.len, h.first_offset, h.lost)?;
            } else {
                self.out.problems.push(problem(
                    path,
                    h.position,
                    "damaged batches".into(),
                    "salvage replaces them with a hole",
                ));
            }
        }
        if p.mode.write && !holes.is_empty() {
            // The segment counts as synced up to its recovered end (below
            // the checkpoint), so no sync round covers the hole batches:
            // sync them here, or a power loss brings the damaged bytes back
            // after a repair that reported success.
            seg.sync_data(p.hook)?;
        }
        Ok(())
    }

    /// Fills a rolled segment from its scanned end up to its seal with one
    /// hole batch (see [`reseal_target`]).
    fn reseal(
        &mut self,
        path: &Path,
        seg: &mut Segment,
        outcome: &ScanOutcome,
        (seal_offset, seal_pos): (u64, u64),
    ) -> Result<()> {
        let position = outcome.end_pos;
        let hole = outcome.end_offset..seal_offset;
        self.report.add(
            path,
            FileAction::Salvaged {
                position,
                lost_offsets: hole.clone().into(),
            },
        );
        self.out.holes.push(hole.clone());
        seg.write_hole_growing(
            position,
            seal_pos - position,
            (hole.start, hole.end - hole.start),
            self.p.hook,
        )?;
        seg.sync_data(self.p.hook)?;
        if seal_pos > seg.capacity() {
            // The tear shortened the file: the hole batch extended it past
            // the mapping, so map it again.
            *seg = Segment::open_with(path, true, self.p.hook)?.0;
        }
        Ok(())
    }

    /// Reports how a scan that found no reseal stopped, and cuts the chain
    /// at a torn tail or at corruption.
    fn note_stop(&mut self, path: &Path, outcome: &ScanOutcome, cur: &mut Cursor) -> Result<()> {
        match &outcome.stop {
            ScanStop::End => {}
            ScanStop::Torn {
                position,
                reason,
                later_valid,
            } => {
                self.unknown_sync(path, *position, reason)?;
                self.report.add(
                    path,
                    FileAction::TruncatedTornTail {
                        position: *position,
                        reason: reason.clone(),
                        discarded_later_batches: *later_valid,
                    },
                );
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
                if *action == CorruptAction::Refused || !self.p.mode.write {
                    self.corrupt(path, *position, what.clone())?;
                }
                self.report.add(
                    path,
                    FileAction::TruncatedCorruption {
                        position: *position,
                        reason: what,
                        first_lost_offset: outcome.end_offset,
                    },
                );
            }
        }
        cur.cut_at(stop_cut(&outcome.stop));
        Ok(())
    }
}
