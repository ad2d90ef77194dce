//! The order-keeping reader: drains a parent to its seal offset before it
//! opens the children, and opens a merge child only when both parents are
//! drained, so every key's records come out in append order (C4). A key
//! given a windowed or spread hot-key mode is the exception: its lanes are
//! other hash points, so its records come out per lane, and
//! [`crate::Topic::key_reader`] gives them back in per-key order.
//!
//! A reader's cost does not grow with the topic's history. It follows the
//! lineage through a shared snapshot ([`Lineage`]) that is rebuilt only when
//! the topology generation moves, it looks only at the partitions it has
//! open, and its [`Cut`] names only those and the drained parents whose
//! children are not all open yet: every other partition it passed is an
//! ancestor of one named, and so known to be drained.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

mod cursor;
pub(crate) mod key_reader;
mod walk;

pub(crate) use cursor::LineageCursor;

use crate::error::{Error, Result};
use crate::read::{OwnedRecord, ReadBatch, ReadIsolation, Record};
use crate::topic::Topic;
use crate::topology::lineage::Lineage;

/// How many bytes of batches one read of a partition takes (at least one
/// batch). What a poll does not hand out waits in the reader for the next.
const READ_BYTES: usize = 256 * 1024;

/// Where a reader starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest data: the root partitions from their first offset.
    Earliest,
    /// Only records appended from now on.
    Latest,
    /// A saved position.
    Cut(Cut),
}

/// How far a reader has consumed a topic: per partition, the next offset to
/// read. Serializable so a consumer can checkpoint and resume.
///
/// A partition the reader finished is listed in `drained` until all its
/// children are open; after that it is an ancestor of a listed partition,
/// and every ancestor of a listed partition counts as drained. So a cut
/// stays as small as the set of partitions being read, however many
/// splits and merges the topic went through. Cuts that list every drained
/// partition (as older versions wrote them) resume the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    /// Topic id the cut belongs to.
    pub topic_id: u32,
    /// Next offset per open partition.
    pub positions: BTreeMap<u32, u64>,
    /// Partitions fully read whose children are not all open yet (a merge
    /// parent waiting for the other parent to be drained).
    pub drained: BTreeSet<u32>,
    /// Per open partition, a fingerprint of the last record read before
    /// its position. After a power loss recovery cuts a partition's
    /// unsynced tail and later appends reuse those offsets; a reader
    /// resumed from this cut checks that the record before its position is
    /// still the one it read, and gets [`Error::PositionLost`] instead of
    /// silently skipping the new records (C8). Absent in cuts of older
    /// versions (not checked then).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub last_records: BTreeMap<u32, u64>,
    /// Removed partitions the reader does not report when it opens their
    /// children without having read them: those already gone when it
    /// started (from `Earliest` or `Latest`: never its to read), and those
    /// it reported already. Only ids the topology still names as a parent
    /// are kept. Absent in cuts of older versions (every removed partition
    /// the reader did not read is then reported).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub removed_before: BTreeSet<u32>,
}

impl Cut {
    /// Encodes the cut as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a cut always serializes")
    }

    /// Decodes a cut.
    pub fn from_bytes(b: &[u8]) -> Result<Cut> {
        serde_json::from_slice(b).map_err(|e| Error::InvalidCut(e.to_string()))
    }
}

/// Offsets a [`Reader`] passed over because retention had removed them
/// before the reader got there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainedRange {
    /// Partition id.
    pub partition: u32,
    /// First offset the reader had not read yet.
    pub start: u64,
    /// Where it resumed (exclusive end of what it missed). For a
    /// partition that left the topology before the reader finished it
    /// (retention emptied it and it was removed), its seal offset, as its
    /// children record it; `u64::MAX` when that is no longer recorded
    /// either (its children were removed too).
    pub end: u64,
}

/// What one read of a partition at a consumer's position gave.
pub(crate) enum ReadStep {
    /// Nothing visible past the position.
    Nothing,
    /// Batches from the position.
    Batch(ReadBatch),
    /// Nothing to read from the position up to `to`: a salvage hole, what
    /// retention removed (`retained`, to report), or what recovery cut
    /// below the first offset held (recovery reported it). Go on there.
    Skip {
        /// Where the data resumes.
        to: u64,
        /// The range retention removed, if that is why.
        retained: Option<RetainedRange>,
    },
}

/// Reads up to [`READ_BYTES`] of `part` at `pos` for a consumer (a
/// [`Reader`] or a group member), telling holes and retained ranges from
/// errors.
pub(crate) fn read_step(
    part: &crate::partition::Partition,
    pos: u64,
    iso: ReadIsolation,
) -> Result<ReadStep> {
    if pos >= part.visible_end(iso) {
        return Ok(ReadStep::Nothing);
    }
    match part.read_with(pos, READ_BYTES, iso) {
        Ok(b) => Ok(ReadStep::Batch(b)),
        Err(Error::Hole { end, .. }) => Ok(ReadStep::Skip {
            to: end,
            retained: None,
        }),
        // Gone before the consumer got there: say so, and go on where the
        // data resumes (a sealed partition retention emptied is then
        // drained).
        Err(Error::Retained { start, end, .. }) => Ok(ReadStep::Skip {
            to: end,
            retained: Some(RetainedRange {
                partition: part.id(),
                start,
                end,
            }),
        }),
        // Below the first offset held, but not by retention: recovery
        // reports what it lost; resume at the start.
        Err(Error::OffsetOutOfRange { offset, start, .. }) if offset < start => {
            Ok(ReadStep::Skip {
                to: start,
                retained: None,
            })
        }
        Err(e) => Err(e),
    }
}

/// Copies a batch's records at or after `pos` into `pending`. Bytes
/// changed under the batch are an error once no record before them is
/// left to hand out (the position stays, so nothing is skipped). Returns
/// where to move the position when the batch held no record at or after
/// `pos` (none are written that way): step over it rather than read it
/// again.
pub(crate) fn take_batch(
    pending: &mut VecDeque<OwnedRecord>,
    id: u32,
    pos: u64,
    batch: &ReadBatch,
) -> Result<Option<u64>> {
    let before = pending.len();
    for r in batch.try_iter() {
        match r {
            Ok(r) if r.offset >= pos => pending.push_back(OwnedRecord {
                partition: id,
                offset: r.offset,
                timestamp: r.timestamp,
                key: r.key.map(<[u8]>::to_vec),
                value: r.value.to_vec(),
            }),
            Ok(_) => {}
            Err(e) if pending.is_empty() => return Err(e),
            Err(_) => break,
        }
    }
    Ok((pending.len() == before && batch.next_offset() > pos).then(|| batch.next_offset()))
}

/// Whether a consumer at `pos` in partition `id` has nothing more to read
/// there: the partition is sealed and `pos` is at its seal. After a power
/// loss a sealed parent may hold less than its recorded seal offset (its
/// unsynced tail is gone): what it holds is all there will ever be, so it
/// is drained at its end, not left blocking its children. (Recovery records
/// the lower end, so this only matters for a topology changed since.)
pub(crate) fn drained_at(topic: &Topic, lineage: &Lineage, id: u32, pos: u64) -> bool {
    let Some(sealed_at) = lineage.sealed_at(id) else {
        return false;
    };
    pos >= sealed_at || topic.partition(id).is_ok_and(|p| pos >= p.end_offset())
}

/// Moves every position past a tail-split parent's logical end to the
/// parent's children: per child, its first moved record at or after the
/// position (a child already listed keeps its own position), and so on
/// down through children tail-split in turn. The parent leaves the
/// positions: it is an ancestor of its children, so drained. Returns the
/// partitions that left the positions so (every parent of the chain).
pub(crate) fn translate_tails(
    lineage: &Lineage,
    positions: &mut BTreeMap<u32, u64>,
    last_records: &mut BTreeMap<u32, u64>,
) -> Vec<u32> {
    let mut left = Vec::new();
    // Until nothing moves: a child may itself have been tail-split past
    // the position it was given.
    loop {
        let moved: Vec<(u32, Vec<(u32, u64)>)> = positions
            .iter()
            .filter_map(|(&id, &pos)| Some((id, Topic::translate_tail(lineage, id, pos)?)))
            .collect();
        if moved.is_empty() {
            return left;
        }
        for (id, kids) in &moved {
            left.push(*id);
            positions.remove(id);
            last_records.remove(id);
            for &(c, off) in kids {
                positions.entry(c).or_insert(off);
            }
        }
    }
}

/// `RetainedRange::end` of a partition removed from the topology.
pub(crate) const REMOVED_END: u64 = u64::MAX;

/// A lineage-aware reader of one topic.
///
/// It reads one partition at a time, a read of up to 256 KiB of batches,
/// and hands the records out over as many polls as it takes; the next read
/// goes to the next open partition (by id, wrapping). So the sequence of
/// records does not depend on how many each poll asks for.
#[derive(Debug)]
pub struct Reader {
    topic: Topic,
    /// Lineage, positions, what was read and not handed out.
    cursor: LineageCursor,
    /// See [`Cut::removed_before`].
    removed_before: BTreeSet<u32>,
    /// None: each partition's default (from its topic's sync policy).
    isolation: Option<ReadIsolation>,
    /// Positions taken at a partition's end (`StartAt::Latest`) whose
    /// fingerprint ([`Cut::last_records`]) is not computed yet: reading the
    /// record before each would cost a file read per partition when the
    /// reader is made. The record at an offset below the end never changes
    /// while the log is open, so it is fingerprinted when a cut first needs
    /// it, while the position is still there (a position that moved has
    /// its own fingerprint). Behind a lock because [`Reader::cut`] takes
    /// `&self`.
    unfingerprinted: Mutex<BTreeMap<u32, Fingerprint>>,
}

/// A deferred fingerprint of the record before a `Latest` position.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fingerprint {
    /// The position it belongs to.
    pub(crate) position: u64,
    /// Computed: the fingerprint, or `None` when no record can be read
    /// there. Not yet: `None`.
    pub(crate) computed: Option<Option<u64>>,
}

/// Fingerprint of a record for [`Cut::last_records`]: SipHash-1-3 (fixed
/// keys) of its offset, timestamp, key and value.
fn record_fingerprint(r: &Record<'_>) -> u64 {
    fingerprint(r.offset, r.timestamp, r.key, r.value)
}

pub(crate) fn fingerprint(offset: u64, timestamp: i64, key: Option<&[u8]>, value: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h =
        siphasher::sip::SipHasher13::new_with_keys(0x6669_7373_696f_6e6c, 0x6f67_2d63_7574_0001);
    h.write_u64(offset);
    h.write_i64(timestamp);
    match key {
        Some(k) => {
            h.write_u8(1);
            h.write_u64(k.len() as u64);
            h.write(k);
        }
        None => h.write_u8(0),
    }
    h.write(value);
    h.finish()
}

/// Where a new reader starts: its lineage and the state it keeps.
struct Start {
    lineage: Arc<Lineage>,
    positions: BTreeMap<u32, u64>,
    drained: BTreeSet<u32>,
    last_records: BTreeMap<u32, u64>,
    removed_before: BTreeSet<u32>,
    /// `Latest` positions whose fingerprint is due (see
    /// [`Reader::unfingerprinted`]).
    unfingerprinted: BTreeMap<u32, Fingerprint>,
}

impl Topic {
    /// A reader from `start`.
    pub fn reader(&self, start: StartAt) -> Result<Reader> {
        self.inner.core().check_not_closed()?;
        // Before any partition is looked at: whatever is published after
        // a look is signalled.
        let signals = self.inner.wake().subscribe();
        let latest = start == StartAt::Latest;
        // Positions are read from the partitions after the lineage was
        // taken. A tail split committed in between cuts its parent at the
        // new end once the generation moved: a `Latest` position at that
        // end would read the moved records again from the children, and a
        // cut's position past it would look lost. So the start is taken
        // again until no topology change came in between.
        let Start {
            lineage,
            positions,
            drained,
            last_records,
            removed_before,
            unfingerprinted,
        } = loop {
            let lineage = self.lineage();
            let got = self.start_positions(lineage.clone(), start.clone());
            if self.topology_generation() == lineage.generation {
                break got?;
            }
        };
        let mut r = Reader {
            topic: self.clone(),
            cursor: LineageCursor::new(lineage, positions, drained, last_records, signals),
            removed_before,
            isolation: None,
            unfingerprinted: Mutex::new(unfingerprinted),
        };
        r.drop_removed();
        r.settle();
        r.cursor.look_at_all();
        r.advance_lineage();
        if latest && r.cursor.lineage.generation == self.topology_generation() {
            // At the ends, taken after the subscription: a partition has
            // something for this reader only once it is signalled.
            r.cursor.candidates.clear();
        }
        Ok(r)
    }

    /// The positions a reader from `start` begins at, under `lineage`.
    fn start_positions(&self, lineage: Arc<Lineage>, start: StartAt) -> Result<Start> {
        let mut positions = BTreeMap::new();
        let mut drained = BTreeSet::new();
        let mut last_records = BTreeMap::new();
        let mut unfingerprinted = BTreeMap::new();
        // Gone before a reader from the oldest data or from now started.
        let mut removed_before: BTreeSet<u32> = lineage.removed_named.iter().copied().collect();
        match start {
            StartAt::Earliest => {
                for id in lineage.roots() {
                    positions.insert(id, self.partition(id)?.start_offset());
                }
            }
            StartAt::Latest => {
                for id in lineage.active() {
                    // The written end may lie past what is durable: a cut
                    // taken before any record is read must still tell, after
                    // a power loss cut that tail, that the offsets below its
                    // position now hold other records (C8). The record before
                    // it is fingerprinted when a cut needs it.
                    let end = self.partition(id)?.end_offset();
                    positions.insert(id, end);
                    if end > 0 {
                        unfingerprinted.insert(
                            id,
                            Fingerprint {
                                position: end,
                                computed: None,
                            },
                        );
                    }
                }
            }
            StartAt::Cut(cut) => {
                if cut.topic_id != self.id() {
                    return Err(Error::InvalidCut(format!(
                        "cut belongs to topic id {}, not {}",
                        cut.topic_id,
                        self.id()
                    )));
                }
                // An id below the next one handed out that the topology no
                // longer has was removed (retention emptied it): its
                // position is reported as retained (`drop_removed`).
                let next_id = self.next_partition_id();
                for &id in cut.positions.keys().chain(&cut.drained) {
                    if !lineage.contains(id) && id >= next_id {
                        return Err(Error::InvalidCut(format!(
                            "partition {id} is not in the topic"
                        )));
                    }
                }
                let mut cut = cut;
                translate_tails(&lineage, &mut cut.positions, &mut cut.last_records);
                for (&id, &pos) in &cut.positions {
                    if lineage.contains(id) {
                        self.check_position(id, pos, cut.last_records.get(&id).copied())?;
                    }
                }
                positions = cut.positions;
                drained = cut.drained;
                last_records = cut.last_records;
                removed_before = cut.removed_before;
            }
        }
        Ok(Start {
            lineage,
            positions,
            drained,
            last_records,
            removed_before,
            unfingerprinted,
        })
    }
}

impl Topic {
    /// A `Latest` position in partition `id` whose end was `end`, with the
    /// fingerprint of the record before it. A record that cannot be read
    /// there (a hole, retention, a partition emptied) gives no fingerprint,
    /// as for positions a reader reached by skipping.
    pub(crate) fn latest_position(&self, id: u32, end: u64) -> Result<(u64, Option<u64>)> {
        let Some(prev) = end.checked_sub(1) else {
            return Ok((end, None));
        };
        let part = self.partition(id)?;
        match part.read_with(prev, 1, ReadIsolation::Written) {
            Ok(b) => match b.try_iter().next() {
                Some(Ok(r)) if r.offset == prev => Ok((end, Some(record_fingerprint(&r)))),
                Some(Err(e)) => Err(e),
                _ => Ok((end, None)),
            },
            Err(Error::Retained { .. } | Error::Hole { .. } | Error::OffsetOutOfRange { .. }) => {
                Ok((end, None))
            }
            Err(e) => Err(e),
        }
    }

    /// Checks that a saved position still names what it named: not past
    /// the partition's end, and (with a fingerprint) the record before it
    /// is the one that was read there. Recovery cutting an unsynced tail
    /// below `pos` fails one of the two, until and after new appends reuse
    /// the offsets.
    fn check_position(&self, id: u32, pos: u64, last: Option<u64>) -> Result<()> {
        let part = self.partition(id)?;
        let end = part.end_offset();
        let lost = || Error::PositionLost {
            partition: id,
            position: pos,
            end,
        };
        if pos > end {
            return Err(lost());
        }
        let (Some(want), Some(prev)) = (last, pos.checked_sub(1)) else {
            return Ok(());
        };
        match part.read_with(prev, 1, ReadIsolation::Written) {
            Ok(b) => match b.try_iter().next() {
                Some(Ok(r)) if r.offset == prev && record_fingerprint(&r) == want => Ok(()),
                Some(Err(e)) => Err(e),
                _ => Err(lost()),
            },
            // Gone by retention or salvage: nothing left to compare with,
            // and `poll` reports the range.
            Err(Error::Retained { .. } | Error::Hole { .. }) => Ok(()),
            Err(Error::OffsetOutOfRange { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
