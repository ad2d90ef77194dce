//! The traversal state a consumer keeps while it follows a topic's
//! lineage, shared by [`super::Reader`] and a group's member: the lineage
//! it reads under, its positions, what it read and has not handed out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::read::{OwnedRecord, ReadIsolation};
use crate::topic::Topic;
use crate::topology::lineage::Lineage;
use crate::wake::{Signals, Subscription};

use super::{drained_at, fingerprint, RetainedRange};

/// Where a consumer is in a topic's lineage.
///
/// What differs between a reader and a member stays with them: which
/// partitions it opens after a seal (a reader opens every child whose
/// parents are drained; a member only split children, a merge child waits
/// for the group's commit), and what it does when it passes over offsets
/// (a member also remembers the run for its commits). So `fill` is theirs;
/// the state, handing out and the wake-up test are here.
///
/// A consumer looks only at its `candidates`: the open partitions that may
/// have something for it. A partition becomes one when the topic's
/// notifications signal it (an append, a sync round, a seal: see
/// [`crate::wake`]), when it is opened, or for every open partition when
/// the topology generation moved (or the log closed); it stops being one
/// when a read at its position finds nothing. So an idle poll looks at no
/// partition, and a poll after one partition got data at that one.
#[derive(Debug)]
pub(crate) struct LineageCursor {
    /// The lineage at the generation last seen.
    pub(crate) lineage: Arc<Lineage>,
    /// Next offset to hand out, per open partition.
    pub(crate) positions: BTreeMap<u32, u64>,
    /// Per open partition, the fingerprint of the last record handed out
    /// before its position (see [`super::Cut::last_records`]).
    pub(crate) last_records: BTreeMap<u32, u64>,
    /// Partitions read to their seal (see [`super::Cut::drained`]).
    pub(crate) drained: BTreeSet<u32>,
    /// Records read and not handed out yet: consecutive records of one
    /// partition, the first at that partition's position.
    pub(crate) pending: VecDeque<OwnedRecord>,
    /// The next read looks at open partitions from this id on (wrapping).
    pub(crate) next_rr: u32,
    /// Ranges passed over because retention removed them first.
    pub(crate) retained: Vec<RetainedRange>,
    /// Open partitions that may have something to read or be drained.
    pub(crate) candidates: BTreeSet<u32>,
    /// The topic's notifications to this consumer.
    pub(crate) signals: Subscription,
    /// Partitions looked at (a drained check or a read, one entry each)
    /// since it was last cleared: what proves, without a clock, that a
    /// poll's cost does not grow with the partitions open.
    pub(crate) examined: Vec<u32>,
}

impl LineageCursor {
    pub(crate) fn new(
        lineage: Arc<Lineage>,
        positions: BTreeMap<u32, u64>,
        drained: BTreeSet<u32>,
        last_records: BTreeMap<u32, u64>,
        signals: Subscription,
    ) -> LineageCursor {
        let candidates = positions.keys().copied().collect();
        LineageCursor {
            lineage,
            positions,
            last_records,
            drained,
            pending: VecDeque::new(),
            next_rr: 0,
            retained: Vec::new(),
            candidates,
            signals,
            examined: Vec::new(),
        }
    }

    /// Opens partition `id` at `pos` (or moves it there), to be looked at.
    pub(crate) fn open(&mut self, id: u32, pos: u64) {
        self.positions.insert(id, pos);
        self.candidates.insert(id);
    }

    /// Makes every open partition a candidate: after a change that may
    /// have moved any of them (a new lineage, a new isolation, an
    /// assignment).
    pub(crate) fn look_at_all(&mut self) {
        self.candidates = self.positions.keys().copied().collect();
    }

    /// Takes the partitions signalled since the last take into
    /// `candidates` (those open; others are looked at when opened).
    pub(crate) fn take_signals(&mut self) {
        match self.signals.ready().take() {
            Signals::None => {}
            Signals::Some(ids) => {
                for id in ids {
                    if self.positions.contains_key(&id) {
                        self.candidates.insert(id);
                    }
                }
            }
            Signals::All => self.look_at_all(),
        }
    }

    /// The candidates in the order the next read looks at them: from
    /// `next_rr` on, wrapping. Drops candidates no longer open.
    pub(crate) fn turn(&mut self) -> Vec<u32> {
        let positions = &self.positions;
        self.candidates.retain(|id| positions.contains_key(id));
        self.candidates
            .range(self.next_rr..)
            .chain(self.candidates.range(..self.next_rr))
            .copied()
            .collect()
    }

    /// The open candidates read to their seal, each counted as examined.
    pub(crate) fn drained_candidates(&mut self, topic: &Topic) -> Vec<u32> {
        let mut done = Vec::new();
        for &id in &self.candidates {
            let Some(&pos) = self.positions.get(&id) else {
                continue;
            };
            self.examined.push(id);
            if drained_at(topic, &self.lineage, id, pos) {
                done.push(id);
            }
        }
        done
    }

    /// Moves up to `room` pending records into `out` and the position past
    /// them.
    pub(crate) fn hand_out(&mut self, out: &mut Vec<OwnedRecord>, room: usize) {
        let n = room.min(self.pending.len());
        out.extend(self.pending.drain(..n));
        if let Some(r) = out.last().filter(|_| n > 0) {
            self.positions.insert(r.partition, r.offset + 1);
            let f = fingerprint(r.offset, r.timestamp, r.key.as_deref(), &r.value);
            self.last_records.insert(r.partition, f);
        }
    }

    /// Whether open partition `id` at `pos` has nothing more to give.
    pub(crate) fn is_drained_at(&self, topic: &Topic, id: u32, pos: u64) -> bool {
        drained_at(topic, &self.lineage, id, pos)
    }

    /// Whether a poll could move now: records pending, a notification not
    /// taken yet, or a candidate not in `paused` with records past its
    /// position (under `isolation`, else the partition's default) or
    /// drained, or the log closed. What it loads with SeqCst is what
    /// appends, sync rounds, seals and close publish before they notify
    /// the topic's [`crate::wake::TailWake`] (the ready set's flag among
    /// them).
    pub(crate) fn can_move(
        &self,
        topic: &Topic,
        isolation: Option<ReadIsolation>,
        paused: &BTreeSet<u32>,
    ) -> bool {
        if !self.pending.is_empty() || self.signals.ready().is_signalled() {
            return true;
        }
        self.candidates.iter().any(|&id| {
            let Some(&pos) = self.positions.get(&id) else {
                return false;
            };
            if paused.contains(&id) {
                return false;
            }
            let Ok(part) = topic.partition(id) else {
                // Closed: the next poll says so.
                return true;
            };
            let iso = isolation.unwrap_or(part.default_isolation());
            part.visible_end(iso) > pos || self.is_drained_at(topic, id, pos)
        })
    }
}
