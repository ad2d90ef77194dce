//! Scanning segment bytes: where valid data ends and what lies after it.
//! Pure: works on a byte slice, so the fuzzer and the tests call it directly.

use crate::config::RecoveryMode;
use crate::format::batch::RaftLogId;
use crate::format::batch::{self, BATCH_HEADER_LEN};
use crate::format::index::IndexEntry;
use crate::format::segment::{SEGMENT_HEADER_LEN, SEGMENT_VERSION_V2};

/// Bytes examined after the end of valid data past the synced region.
pub const TORN_LOOKAHEAD: usize = 64 * 1024;

/// Where and why a scan stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanStop {
    /// Zeros or the end of the file after the last valid batch.
    End,
    /// Invalid bytes past the durable region: a torn write, cut off.
    Torn {
        /// Position of the first invalid byte.
        position: u64,
        /// Why the batch there was rejected.
        reason: String,
        /// Whether valid-looking batches followed (unsynced, discarded).
        later_valid: bool,
    },
    /// Invalid bytes inside the durable region.
    Corrupt {
        /// Position of the damage.
        position: u64,
        /// Why the batch there was rejected.
        reason: String,
        /// Whether a valid batch follows the damage (mid-segment corruption).
        later_valid: bool,
        /// What the scan did about it under the requested mode.
        action: CorruptAction,
    },
}

/// What a scan did with corruption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorruptAction {
    /// Strict mode: nothing; the caller refuses to open.
    Refused,
    /// Truncate (or salvage with nothing to salvage): data ends here.
    Truncated,
}

/// A damaged region that salvage replaces with a hole batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoleFix {
    /// File position where the damage starts.
    pub position: u64,
    /// Bytes up to the next valid batch.
    pub len: u64,
    /// First lost offset.
    pub first_offset: u64,
    /// Number of lost offsets.
    pub lost: u64,
}

/// Result of scanning one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanOutcome {
    /// End of valid data (file position).
    pub end_pos: u64,
    /// Offset after the last valid record.
    pub end_offset: u64,
    /// Newest timestamp seen.
    pub max_ts: i64,
    /// Records found.
    pub records: u64,
    /// Index entries for the scanned part.
    pub index: Vec<IndexEntry>,
    /// Salvaged regions (salvage mode only).
    pub holes: Vec<HoleFix>,
    /// How it ended.
    pub stop: ScanStop,
}

/// Parameters of a scan.
#[derive(Debug, Clone, Copy)]
pub struct ScanParams {
    /// Segment base offset.
    pub base_offset: u64,
    /// File position to start at (a batch boundary).
    pub from_pos: u64,
    /// Offset expected at `from_pos`.
    pub from_offset: u64,
    /// Bytes below this were synced: damage there is corruption.
    pub durable_until: u64,
    /// What to do about corruption.
    pub mode: RecoveryMode,
    /// Index spacing in bytes.
    pub index_interval: u64,
    /// The segment header's version: 1 holds format-1 batches, 2 format-2
    /// batches whose Raft index rises by one from batch to batch and whose
    /// term never falls (a batch of the other format, or out of Raft
    /// order, is invalid there).
    pub batch_version: u16,
}

/// Scans `file` (the whole segment, header included) from `p.from_pos`.
pub fn scan_segment(file: &[u8], p: &ScanParams) -> ScanOutcome {
    let mut out = ScanOutcome {
        end_pos: p.from_pos,
        end_offset: p.from_offset,
        max_ts: i64::MIN,
        records: 0,
        index: Vec::new(),
        holes: Vec::new(),
        stop: ScanStop::End,
    };
    let mut pos = p.from_pos.max(SEGMENT_HEADER_LEN as u64);
    let mut last_indexed: Option<u64> = None;
    // The Raft log id of the batch before `pos`, once the scan has seen one.
    let mut prev_id: Option<RaftLogId> = None;
    loop {
        let rest = file.get(pos as usize..).unwrap_or(&[]);
        let checked = batch::validate(rest, Some(out.end_offset))
            .and_then(|h| raft_order(rest, &h, p.batch_version, prev_id).map(|id| (h, id)));
        let err = match checked {
            Ok((h, id)) => {
                take_batch(&mut out, &h, pos, &mut last_indexed, p);
                // After a hole (salvage) the lost entries' ids are unknown.
                prev_id = id;
                pos = out.end_pos;
                continue;
            }
            Err(e) => e,
        };
        if pos >= p.durable_until {
            if let Some(stop) = past_synced(file, pos, out.end_offset, &err) {
                out.stop = stop;
            }
            return out;
        }
        let next = find_next_valid(file, pos + 1, out.end_offset);
        match (p.mode, next) {
            // A hole batch needs room for its header and at least one lost
            // offset: junk before a batch at the expected offset (nothing
            // lost) cannot be expressed as a hole, so it is cut instead.
            (RecoveryMode::Salvage, Some((npos, nbase)))
                if npos - pos >= BATCH_HEADER_LEN as u64 && nbase > out.end_offset =>
            {
                out.holes.push(HoleFix {
                    position: pos,
                    len: npos - pos,
                    first_offset: out.end_offset,
                    lost: nbase - out.end_offset,
                });
                out.end_offset = nbase;
                pos = npos;
                out.end_pos = pos;
                prev_id = None;
            }
            (mode, next) => {
                let action = if mode == RecoveryMode::Strict {
                    CorruptAction::Refused
                } else {
                    CorruptAction::Truncated
                };
                out.stop = ScanStop::Corrupt {
                    position: pos,
                    reason: err.to_string(),
                    later_valid: next.is_some(),
                    action,
                };
                return out;
            }
        }
    }
}

/// Checks the batch `h` at the start of `rest` against its segment's
/// format (`version`) and, in a format-2 segment, against the Raft log id
/// of the batch before it: index + 1, a term that never falls. Returns
/// the batch's log id (`None` for a format-1 batch or a hole).
fn raft_order(
    rest: &[u8],
    h: &batch::BatchHeader,
    version: u16,
    prev: Option<RaftLogId>,
) -> Result<Option<RaftLogId>, batch::BatchError> {
    let magic = h.magic.get();
    let expected_magic = if version >= SEGMENT_VERSION_V2 && !batch::is_hole(h) {
        batch::BATCH_MAGIC_V2
    } else {
        batch::BATCH_MAGIC
    };
    if magic != expected_magic {
        return Err(batch::BatchError::WrongFormat {
            segment_version: version,
            magic,
        });
    }
    let Some(id) = batch::header_v2(rest).map(|v2| v2.log_id()) else {
        return Ok(None);
    };
    if let Some(prev) = prev {
        if id.index != prev.index.wrapping_add(1) || id.term < prev.term {
            return Err(batch::BatchError::RaftOrder {
                prev_index: prev.index,
                prev_term: prev.term,
                index: id.index,
                term: id.term,
            });
        }
    }
    Ok(Some(id))
}

/// Takes the valid batch `h` at `pos` into `out`, with an index entry when
/// it starts `p.index_interval` bytes or more after the last one.
fn take_batch(
    out: &mut ScanOutcome,
    h: &batch::BatchHeader,
    pos: u64,
    last_indexed: &mut Option<u64>,
    p: &ScanParams,
) {
    if last_indexed.is_none_or(|l| pos - l >= p.index_interval) {
        out.index.push(IndexEntry {
            rel_offset: (out.end_offset - p.base_offset) as u32,
            position: pos as u32,
            max_ts_before: out.max_ts,
        });
        *last_indexed = Some(pos);
    }
    if !batch::is_hole(h) {
        out.records += u64::from(h.record_count.get());
        out.max_ts = out.max_ts.max(h.max_ts.get());
    }
    out.end_offset += u64::from(h.record_count.get());
    out.end_pos = pos + u64::from(h.batch_len.get());
}

/// How a scan stops at invalid bytes at `pos`, past the synced region:
/// zeros are the end of data (`None`); anything else is a torn write. Only
/// a bounded window is examined, so a large preallocated segment costs
/// nothing at open.
fn past_synced(
    file: &[u8],
    pos: u64,
    end_offset: u64,
    err: &impl std::fmt::Display,
) -> Option<ScanStop> {
    let rest = file.get(pos as usize..).unwrap_or(&[]);
    let window = &rest[..rest.len().min(TORN_LOOKAHEAD)];
    if window.iter().all(|&b| b == 0) {
        return None;
    }
    let window_end = (pos as usize + TORN_LOOKAHEAD).min(file.len());
    let later = find_next_valid(&file[..window_end], pos + 1, end_offset);
    Some(ScanStop::Torn {
        position: pos,
        reason: err.to_string(),
        later_valid: later.is_some(),
    })
}

/// First position at or after `from` holding a valid batch whose base offset
/// is at least `min_offset` (a later batch of this partition).
pub fn find_next_valid(file: &[u8], from: u64, min_offset: u64) -> Option<(u64, u64)> {
    let magic = batch::BATCH_MAGIC.to_le_bytes();
    let magic_v2 = batch::BATCH_MAGIC_V2.to_le_bytes();
    let mut pos = from as usize;
    while pos + BATCH_HEADER_LEN <= file.len() {
        if file[pos + 8..pos + 10] == magic || file[pos + 8..pos + 10] == magic_v2 {
            if let Ok(h) = batch::validate(&file[pos..], None) {
                if h.base_offset.get() >= min_offset
                    && u32::try_from(h.base_offset.get() - min_offset).is_ok()
                {
                    return Some((pos as u64, h.base_offset.get()));
                }
            }
        }
        pos += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::batch::{batch_len, encode_batch, RecordIn};
    use crate::format::segment::encode_header;

    fn segment(n: u64) -> (Vec<u8>, Vec<u64>) {
        let mut f = encode_header(1, 0, 100, 0).to_vec();
        let mut starts = Vec::new();
        for i in 0..n {
            let v = vec![i as u8; 50];
            let r = [RecordIn {
                key: Some(b"k"),
                value: &v,
                timestamp: i as i64,
            }];
            let mut b = vec![0; batch_len(&r)];
            encode_batch(&mut b, 100 + i, &r);
            starts.push(f.len() as u64);
            f.extend(b);
        }
        f.resize(f.len() + 500, 0);
        (f, starts)
    }

    fn params(durable: u64, mode: RecoveryMode) -> ScanParams {
        ScanParams {
            base_offset: 100,
            from_pos: 64,
            from_offset: 100,
            durable_until: durable,
            mode,
            index_interval: 4096,
            batch_version: 1,
        }
    }

    #[test]
    fn clean_segment() {
        let (f, starts) = segment(10);
        let o = scan_segment(&f, &params(0, RecoveryMode::Strict));
        assert_eq!(o.end_offset, 110);
        assert_eq!(o.records, 10);
        assert_eq!(o.stop, ScanStop::End);
        assert_eq!(o.end_pos, starts[9] + (starts[1] - starts[0]));
    }

    #[test]
    fn torn_tail_past_durable_region() {
        let (mut f, starts) = segment(10);
        f[starts[7] as usize + 20] ^= 1;
        let o = scan_segment(&f, &params(starts[5], RecoveryMode::Strict));
        assert_eq!(o.end_offset, 107);
        assert!(
            matches!(o.stop, ScanStop::Torn { position, later_valid: true, .. } if position == starts[7])
        );
    }

    #[test]
    fn corruption_in_durable_region_per_mode() {
        let (mut f, starts) = segment(10);
        f[starts[3] as usize + 45] ^= 1;
        let durable = starts[9];
        let o = scan_segment(&f, &params(durable, RecoveryMode::Strict));
        assert!(matches!(
            o.stop,
            ScanStop::Corrupt {
                action: CorruptAction::Refused,
                later_valid: true,
                ..
            }
        ));
        let o = scan_segment(&f, &params(durable, RecoveryMode::Truncate));
        assert_eq!(o.end_offset, 103);
        assert!(matches!(
            o.stop,
            ScanStop::Corrupt {
                action: CorruptAction::Truncated,
                ..
            }
        ));
        let o = scan_segment(&f, &params(durable, RecoveryMode::Salvage));
        assert_eq!(o.end_offset, 110);
        assert_eq!(o.records, 9);
        assert_eq!(
            o.holes,
            vec![HoleFix {
                position: starts[3],
                len: starts[4] - starts[3],
                first_offset: 103,
                lost: 1
            }]
        );
        assert_eq!(o.stop, ScanStop::End);
    }

    #[test]
    fn zeros_inside_durable_region_are_corruption() {
        let (f, starts) = segment(3);
        let o = scan_segment(&f, &params(starts[2] + 1000, RecoveryMode::Strict));
        assert!(matches!(o.stop, ScanStop::Corrupt { .. }));
    }

    /// A version-2 segment of format-2 batches with Raft ids `ids` (one
    /// record each, offsets from 100).
    fn segment_v2(ids: &[(u64, u64)]) -> Vec<u8> {
        use crate::format::batch::{encode_batch_v2, EntryBody, RaftLogId};
        let mut f = crate::format::segment::encode_header_version(2, 1, 0, 100, 0).to_vec();
        for (i, &(term, index)) in ids.iter().enumerate() {
            let recs = [RecordIn {
                key: None,
                value: b"v",
                timestamp: 1,
            }];
            let body = EntryBody::Records(&recs);
            let mut b = vec![0; body.batch_len()];
            let id = RaftLogId {
                term,
                leader: 1,
                index,
            };
            encode_batch_v2(&mut b, 100 + i as u64, id, body, 0);
            f.extend(b);
        }
        f.resize(f.len() + 500, 0);
        f
    }

    #[test]
    fn a_format_2_segment_in_raft_order_scans_to_its_end() {
        let f = segment_v2(&[(1, 5), (1, 6), (3, 7), (3, 8)]);
        let p = ScanParams {
            batch_version: 2,
            ..params(0, RecoveryMode::Strict)
        };
        let o = scan_segment(&f, &p);
        assert_eq!((o.end_offset, o.records, o.stop), (104, 4, ScanStop::End));
    }

    #[test]
    fn a_raft_index_that_skips_or_a_term_that_falls_is_corruption_in_synced_data() {
        for ids in [
            [(1, 5), (1, 7), (1, 8)],
            [(1, 5), (1, 5), (1, 6)],
            [(2, 5), (1, 6), (2, 7)],
        ] {
            let f = segment_v2(&ids);
            let p = ScanParams {
                batch_version: 2,
                ..params(f.len() as u64, RecoveryMode::Strict)
            };
            let o = scan_segment(&f, &p);
            assert_eq!(
                o.end_offset, 101,
                "{ids:?}: data ends after the first entry"
            );
            assert!(
                matches!(&o.stop, ScanStop::Corrupt { reason, action: CorruptAction::Refused, .. } if reason.contains("Raft entry")),
                "{ids:?}: {:?}",
                o.stop
            );
        }
    }

    #[test]
    fn a_batch_of_the_other_format_than_its_segment_is_invalid() {
        // Format-2 batches in a version-1 segment.
        let f = segment_v2(&[(1, 5)]);
        let o = scan_segment(&f, &params(f.len() as u64, RecoveryMode::Strict));
        assert!(
            matches!(&o.stop, ScanStop::Corrupt { reason, .. } if reason.contains("version 1")),
            "{:?}",
            o.stop
        );
        // Format-1 batches in a version-2 segment.
        let (f, _) = segment(2);
        let p = ScanParams {
            batch_version: 2,
            ..params(f.len() as u64, RecoveryMode::Strict)
        };
        let o = scan_segment(&f, &p);
        assert!(
            matches!(&o.stop, ScanStop::Corrupt { reason, .. } if reason.contains("version 2")),
            "{:?}",
            o.stop
        );
        assert_eq!(o.end_offset, 100);
    }
}
