//! The pure state of a partition group: what applying its committed log
//! prefix leaves behind, and nothing else (no records, no I/O).

use std::collections::{BTreeMap, VecDeque};

use openraft::{BasicNode, EntryPayload, LogId, StoredMembership};
use serde::{Deserialize, Serialize};

use crate::types::{Command, CommandResponse, Entry, NodeId, ProducerStamp};

/// How many of a producer's last batches the dedup table remembers: a
/// producer keeps at most this many batches in flight per partition, so a
/// retry of any of them is recognised (Kafka keeps 5).
pub const PRODUCER_BATCHES_KEPT: usize = 5;

/// Default bound on the producers a partition remembers. When a new
/// producer would exceed it, the one whose last batch is oldest (lowest
/// Raft index) is forgotten; its next batch is then taken as a first one.
pub const DEFAULT_MAX_PRODUCERS: usize = 4096;

/// One remembered batch of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerBatch {
    /// The batch's first sequence.
    pub first_sequence: u64,
    /// Its record count.
    pub count: u32,
    /// The offset its first record got.
    pub base_offset: u64,
}

/// What the partition remembers of one producer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerEntry {
    /// The producer's current epoch.
    pub epoch: u32,
    /// The sequence its next batch must start at.
    pub next_sequence: u64,
    /// Its last batches, oldest first, at most [`PRODUCER_BATCHES_KEPT`].
    pub batches: VecDeque<ProducerBatch>,
    /// Raft index of its last accepted batch (the eviction order).
    pub last_index: u64,
}

/// A seal: the partition takes no more records from `end_offset` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealState {
    /// The seal offset (exclusive end of the partition's records).
    pub end_offset: u64,
    /// The controller's topology epoch that ordered it.
    pub topology_epoch: u64,
}

/// What a producer stamp would get if its batch were applied now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StampVerdict {
    /// The batch is the producer's next one (or its first): append it.
    Fresh,
    /// A retry of a remembered batch: answer with the first copy.
    Duplicate(ProducerBatch),
    /// A gap, or a batch older than the remembered ones.
    OutOfOrder {
        /// The sequence expected next.
        expected: u64,
    },
    /// An epoch older than the producer's current one.
    Fenced {
        /// The producer's current epoch.
        current_epoch: u32,
    },
}

/// The state of one partition group. `apply` is a pure function of the
/// state and the entry, so every replica that applies the same committed
/// prefix holds the same state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// The last entry applied.
    pub last_applied: Option<LogId<NodeId>>,
    /// The last membership applied.
    pub membership: StoredMembership<NodeId, BasicNode>,
    /// The offset the next data batch's first record takes: every data
    /// entry in the log occupies its records' offsets, whatever it was
    /// answered, because the segment log holds its bytes.
    pub next_offset: u64,
    /// The high watermark: records below it are committed and readable.
    /// Equal to `next_offset` until a seal, then fixed at the seal offset.
    pub committed_end: u64,
    /// The producer dedup table.
    pub producers: BTreeMap<u64, ProducerEntry>,
    /// Set once the partition is sealed.
    pub sealed: Option<SealState>,
    /// Offset of the first record the log still holds (after retention).
    pub log_start_offset: u64,
    /// Raft index of the first entry the log still holds.
    pub log_start_index: u64,
    /// The bound on `producers`, part of the state so every replica
    /// evicts the same producer.
    pub max_producers: usize,
}

impl Default for PartitionState {
    fn default() -> Self {
        PartitionState::new(DEFAULT_MAX_PRODUCERS)
    }
}

impl PartitionState {
    /// An empty partition remembering at most `max_producers` producers
    /// (at least one).
    pub fn new(max_producers: usize) -> PartitionState {
        PartitionState {
            last_applied: None,
            membership: StoredMembership::default(),
            next_offset: 0,
            committed_end: 0,
            producers: BTreeMap::new(),
            sealed: None,
            log_start_offset: 0,
            log_start_index: 0,
            max_producers: max_producers.max(1),
        }
    }

    /// What a batch of `count` records stamped `stamp` would get now.
    pub fn check_stamp(&self, stamp: &ProducerStamp, count: u32) -> StampVerdict {
        let Some(p) = self.producers.get(&stamp.producer_id) else {
            // Unknown (new, or forgotten by eviction): its first batch sets
            // the baseline, as Kafka does for producers whose state expired.
            return StampVerdict::Fresh;
        };
        if stamp.epoch < p.epoch {
            return StampVerdict::Fenced {
                current_epoch: p.epoch,
            };
        }
        if stamp.epoch > p.epoch {
            // A new epoch restarts its sequences at 0.
            return if stamp.first_sequence == 0 {
                StampVerdict::Fresh
            } else {
                StampVerdict::OutOfOrder { expected: 0 }
            };
        }
        if stamp.first_sequence == p.next_sequence {
            return StampVerdict::Fresh;
        }
        match p
            .batches
            .iter()
            .find(|b| b.first_sequence == stamp.first_sequence && b.count == count)
        {
            Some(b) => StampVerdict::Duplicate(*b),
            None => StampVerdict::OutOfOrder {
                expected: p.next_sequence,
            },
        }
    }

    /// Applies one committed entry and answers it.
    pub fn apply(&mut self, entry: &Entry) -> CommandResponse {
        self.last_applied = Some(entry.log_id);
        match &entry.payload {
            EntryPayload::Blank => CommandResponse::Control,
            EntryPayload::Membership(m) => {
                self.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                CommandResponse::Control
            }
            EntryPayload::Normal(Command::Append { producer, records }) => {
                // A batch holds at most u32::MAX records (the batch header's
                // record count); more cannot have been written as one batch.
                let count = u32::try_from(records.len()).unwrap_or(u32::MAX);
                self.apply_append(entry.log_id.index, producer.as_ref(), count)
            }
            EntryPayload::Normal(Command::Seal { topology_epoch }) => {
                let seal = *self.sealed.get_or_insert(SealState {
                    end_offset: self.next_offset,
                    topology_epoch: *topology_epoch,
                });
                self.committed_end = seal.end_offset;
                CommandResponse::Sealed {
                    end_offset: seal.end_offset,
                }
            }
        }
    }

    fn apply_append(
        &mut self,
        index: u64,
        stamp: Option<&ProducerStamp>,
        count: u32,
    ) -> CommandResponse {
        let base_offset = self.next_offset;
        self.next_offset = self.next_offset.saturating_add(u64::from(count));
        if let Some(seal) = self.sealed {
            return CommandResponse::Sealed {
                end_offset: seal.end_offset,
            };
        }
        self.committed_end = self.next_offset;
        let Some(stamp) = stamp else {
            return CommandResponse::Appended { base_offset, count };
        };
        match self.check_stamp(stamp, count) {
            StampVerdict::Fresh => {
                self.remember(index, stamp, count, base_offset);
                CommandResponse::Appended { base_offset, count }
            }
            StampVerdict::Duplicate(b) => CommandResponse::Duplicate {
                base_offset: b.base_offset,
                count: b.count,
            },
            StampVerdict::OutOfOrder { expected } => CommandResponse::OutOfOrderSequence {
                producer_id: stamp.producer_id,
                expected,
                received: stamp.first_sequence,
            },
            StampVerdict::Fenced { current_epoch } => CommandResponse::ProducerFenced {
                producer_id: stamp.producer_id,
                epoch: stamp.epoch,
                current_epoch,
            },
        }
    }

    fn remember(&mut self, index: u64, stamp: &ProducerStamp, count: u32, base_offset: u64) {
        if !self.producers.contains_key(&stamp.producer_id)
            && self.producers.len() >= self.max_producers
        {
            let oldest = self
                .producers
                .iter()
                .min_by_key(|(id, p)| (p.last_index, **id))
                .map(|(id, _)| *id);
            if let Some(id) = oldest {
                self.producers.remove(&id);
            }
        }
        let p = self
            .producers
            .entry(stamp.producer_id)
            .or_insert(ProducerEntry {
                epoch: stamp.epoch,
                next_sequence: 0,
                batches: VecDeque::new(),
                last_index: index,
            });
        if p.epoch != stamp.epoch {
            p.epoch = stamp.epoch;
            p.batches.clear();
        }
        p.next_sequence = stamp.first_sequence.saturating_add(u64::from(count));
        p.last_index = index;
        if p.batches.len() == PRODUCER_BATCHES_KEPT {
            p.batches.pop_front();
        }
        p.batches.push_back(ProducerBatch {
            first_sequence: stamp.first_sequence,
            count,
            base_offset,
        });
    }
}
