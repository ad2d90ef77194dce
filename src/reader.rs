//! The order-keeping reader: drains a parent to its seal offset before it
//! opens the children, and opens a merge child only when both parents are
//! drained, so every key's records come out in append order (C4).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::read::{OwnedRecord, ReadIsolation, Record};
use crate::topic::Topic;

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
/// read. Partitions listed at their seal offset are drained. Serializable so
/// a consumer can checkpoint and resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    /// Topic id the cut belongs to.
    pub topic_id: u32,
    /// Next offset per open partition.
    pub positions: BTreeMap<u32, u64>,
    /// Partitions fully read whose children may not be open yet.
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

/// `RetainedRange::end` of a partition removed from the topology.
const REMOVED_END: u64 = u64::MAX;

/// A lineage-aware reader of one topic.
#[derive(Debug)]
pub struct Reader {
    topic: Topic,
    positions: BTreeMap<u32, u64>,
    drained: BTreeSet<u32>,
    next_rr: usize,
    retained: Vec<RetainedRange>,
    /// See [`Cut::last_records`].
    last_records: BTreeMap<u32, u64>,
    /// None: each partition's default (from its topic's sync policy).
    isolation: Option<ReadIsolation>,
}

/// Fingerprint of a record for [`Cut::last_records`]: SipHash-1-3 (fixed
/// keys) of its offset, timestamp, key and value.
fn record_fingerprint(r: &Record<'_>) -> u64 {
    use std::hash::Hasher;
    let mut h =
        siphasher::sip::SipHasher13::new_with_keys(0x6669_7373_696f_6e6c, 0x6f67_2d63_7574_0001);
    h.write_u64(r.offset);
    h.write_i64(r.timestamp);
    match r.key {
        Some(k) => {
            h.write_u8(1);
            h.write_u64(k.len() as u64);
            h.write(k);
        }
        None => h.write_u8(0),
    }
    h.write(r.value);
    h.finish()
}

impl Topic {
    /// A reader from `start`.
    pub fn reader(&self, start: StartAt) -> Result<Reader> {
        let infos = self.partitions();
        let mut positions = BTreeMap::new();
        let mut drained = BTreeSet::new();
        let mut last_records = BTreeMap::new();
        match start {
            StartAt::Earliest => {
                let ids: BTreeSet<u32> = infos.iter().map(|p| p.id).collect();
                for p in &infos {
                    if p.parents.iter().all(|q| !ids.contains(q)) {
                        positions.insert(p.id, p.start_offset);
                    }
                }
            }
            StartAt::Latest => {
                for p in infos.iter().filter(|p| p.sealed_at.is_none()) {
                    // The written end may lie past what is durable: a cut
                    // taken before any record is read must still tell, after
                    // a power loss cut that tail, that the offsets below its
                    // position now hold other records (C8).
                    let (pos, last) = self.latest_position(p.id, p.end_offset)?;
                    positions.insert(p.id, pos);
                    if let Some(f) = last {
                        last_records.insert(p.id, f);
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
                // position is reported as retained by `advance_lineage`.
                let next_id = self.next_partition_id();
                for &id in cut.positions.keys().chain(&cut.drained) {
                    if id >= next_id {
                        return Err(Error::InvalidCut(format!(
                            "partition {id} is not in the topic"
                        )));
                    }
                }
                for (&id, &pos) in &cut.positions {
                    if infos.iter().any(|p| p.id == id) {
                        self.check_position(id, pos, cut.last_records.get(&id).copied())?;
                    }
                }
                positions = cut.positions;
                drained = cut.drained;
                last_records = cut.last_records;
            }
        }
        let mut r = Reader {
            topic: self.clone(),
            positions,
            drained,
            next_rr: 0,
            retained: Vec::new(),
            last_records,
            isolation: None,
        };
        r.advance_lineage();
        Ok(r)
    }
}

impl Topic {
    /// A `Latest` position in partition `id` whose end was `end`, with the
    /// fingerprint of the record before it. A record that cannot be read
    /// there (a hole, retention, a partition emptied) gives no fingerprint,
    /// as for positions a reader reached by skipping.
    fn latest_position(&self, id: u32, end: u64) -> Result<(u64, Option<u64>)> {
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

impl Reader {
    /// The current position, to save and resume from.
    pub fn cut(&self) -> Cut {
        Cut {
            topic_id: self.topic.id(),
            positions: self.positions.clone(),
            drained: self.drained.clone(),
            last_records: self
                .last_records
                .iter()
                .filter(|(id, _)| self.positions.contains_key(id))
                .map(|(&id, &f)| (id, f))
                .collect(),
        }
    }

    /// Reads with `isolation` from now on, instead of each partition's
    /// default (durable for `SyncPolicy::Always` topics, written otherwise).
    pub fn set_isolation(&mut self, isolation: ReadIsolation) {
        self.isolation = Some(isolation);
    }

    /// Ranges this reader passed over because retention had removed them
    /// (oldest first). Positions are never moved silently: every offset a
    /// reader skips is either here or behind an error it returned.
    pub fn retained(&self) -> &[RetainedRange] {
        &self.retained
    }

    /// Partitions currently being read.
    pub fn open_partitions(&self) -> Vec<u32> {
        self.positions.keys().copied().collect()
    }

    /// Moves drained partitions out and opens children whose parents are
    /// all drained. A partition no longer in the topology was removed once
    /// retention emptied it: as a parent it counts as drained, and a
    /// position still in it is reported as retained.
    fn advance_lineage(&mut self) {
        loop {
            let infos = self.topic.partitions();
            if infos.is_empty() {
                // The log is closed (a topic always has an active
                // partition): nothing was removed.
                return;
            }
            let present: BTreeSet<u32> = infos.iter().map(|p| p.id).collect();
            // Where each removed parent was sealed (its children say).
            let removed_seals: BTreeMap<u32, u64> = infos
                .iter()
                .flat_map(|p| p.removed_parents.iter().copied())
                .collect();
            let mut changed = false;
            let gone: Vec<u32> = self
                .positions
                .keys()
                .filter(|id| !present.contains(id))
                .copied()
                .collect();
            for id in gone {
                // Read to its seal: drained, nothing lost. Below it, or
                // with its seal no longer recorded (its children are gone
                // too): a loss to report.
                let end = removed_seals.get(&id).copied().unwrap_or(REMOVED_END);
                if let Some(start) = self.positions.remove(&id).filter(|&s| s < end) {
                    self.retained.push(RetainedRange {
                        partition: id,
                        start,
                        end,
                    });
                }
                self.last_records.remove(&id);
                changed = true;
            }
            for p in &infos {
                if let (Some(&pos), Some(sealed_at)) = (self.positions.get(&p.id), p.sealed_at) {
                    // After a power loss a sealed parent may hold less than
                    // its recorded seal offset (its unsynced tail is gone):
                    // what it holds is all there will ever be, so it is
                    // drained at its end, not left blocking its children.
                    if pos >= sealed_at.min(p.end_offset) {
                        self.positions.remove(&p.id);
                        self.drained.insert(p.id);
                        changed = true;
                    }
                }
            }
            for p in &infos {
                let known = self.positions.contains_key(&p.id) || self.drained.contains(&p.id);
                if !known
                    && !p.parents.is_empty()
                    && p.parents
                        .iter()
                        .all(|q| self.drained.contains(q) || !present.contains(q))
                {
                    // From the child's first offset, not its first held
                    // one: what retention removed before this reader got
                    // there is then reported by `poll`, not skipped.
                    self.positions.insert(p.id, 0);
                    changed = true;
                }
            }
            if !changed {
                return;
            }
        }
    }

    /// Reads up to `max_records` records that are available now, from one
    /// open partition at a time (rotating), following the lineage.
    pub fn poll(&mut self, max_records: usize) -> Result<Vec<OwnedRecord>> {
        let mut out = Vec::new();
        let mut idle_rounds = 0;
        while out.len() < max_records && idle_rounds < 2 {
            self.advance_lineage();
            let ids: Vec<u32> = self.positions.keys().copied().collect();
            if ids.is_empty() {
                break;
            }
            let mut progressed = false;
            for k in 0..ids.len() {
                let id = ids[(self.next_rr + k) % ids.len()];
                let pos = self.positions[&id];
                let part = match self.topic.partition(id) {
                    Ok(p) => p,
                    // Removed since the lineage was advanced: the next
                    // advance reports it.
                    Err(Error::UnknownPartition { .. }) => continue,
                    Err(e) => return Err(e),
                };
                let iso = self.isolation.unwrap_or(part.default_isolation());
                if pos >= part.visible_end(iso) {
                    continue;
                }
                let batch = match part.read_with(pos, 256 * 1024, iso) {
                    Ok(b) => b,
                    Err(Error::Hole { end, .. }) => {
                        self.positions.insert(id, end);
                        self.last_records.remove(&id);
                        progressed = true;
                        continue;
                    }
                    // Gone before this reader got there: say so, and go on
                    // where the data resumes (a sealed partition retention
                    // emptied is then drained).
                    Err(Error::Retained { start, end, .. }) => {
                        self.retained.push(RetainedRange {
                            partition: id,
                            start,
                            end,
                        });
                        self.positions.insert(id, end);
                        self.last_records.remove(&id);
                        progressed = true;
                        continue;
                    }
                    // Below the first offset held, but not by retention:
                    // recovery reports what it lost; resume at the start.
                    Err(Error::OffsetOutOfRange { offset, start, .. }) if offset < start => {
                        self.positions.insert(id, start);
                        self.last_records.remove(&id);
                        progressed = true;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let room = max_records - out.len();
                // Copy only what fits; the rest is read again next time.
                // Bytes changed under the batch are an error (the position
                // stays, so nothing is skipped).
                let mut next = batch.next_offset();
                let mut last = None;
                for (taken, r) in batch.try_iter().enumerate() {
                    let r = r?;
                    if taken == room {
                        next = r.offset;
                        break;
                    }
                    last = Some(record_fingerprint(&r));
                    out.push(OwnedRecord {
                        partition: id,
                        offset: r.offset,
                        timestamp: r.timestamp,
                        key: r.key.map(<[u8]>::to_vec),
                        value: r.value.to_vec(),
                    });
                }
                self.positions.insert(id, next);
                if let Some(f) = last {
                    self.last_records.insert(id, f);
                }
                progressed = true;
                if out.len() >= max_records {
                    break;
                }
            }
            self.next_rr = self.next_rr.wrapping_add(1);
            if !progressed {
                idle_rounds += 1;
            }
        }
        // A partition read to its seal leaves the positions now, not at the
        // next poll: a cut taken meanwhile names it as drained, so its
        // later removal is not taken for a loss. (A poll that ended idle
        // advanced the lineage after its last read already.)
        if out.len() >= max_records {
            self.advance_lineage();
        }
        Ok(out)
    }

    /// Like [`Reader::poll`], but waits up to `timeout` for data.
    pub fn poll_wait(&mut self, max_records: usize, timeout: Duration) -> Result<Vec<OwnedRecord>> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.poll(max_records)?;
            let now = Instant::now();
            if !got.is_empty() || now >= deadline {
                return Ok(got);
            }
            let wait = (deadline - now).min(Duration::from_millis(10));
            let first = self.positions.iter().next().map(|(&id, &pos)| (id, pos));
            if let Some((Ok(part), pos)) = first.map(|(id, pos)| (self.topic.partition(id), pos)) {
                let iso = self.isolation.unwrap_or(part.default_isolation());
                let _ = part.wait_for_with(pos, wait, iso);
            } else {
                std::thread::sleep(wait);
            }
        }
    }
}
