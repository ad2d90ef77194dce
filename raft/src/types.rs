//! The openraft type configuration of a fissionlog partition group, and the
//! commands its log carries.
//!
//! One configuration serves every group (partition groups and the
//! controller): a group's entries are [`Command`]s, its responses
//! [`CommandResponse`]s. The commands are provisional: they fix the shape
//! (one produce request is one Raft entry is one batch in the segment log)
//! and will grow with the storage (docs/REPLICATION.md).

use std::io::Cursor;

use serde::{Deserialize, Serialize};

/// A node's id in the cluster.
pub type NodeId = u64;

/// A Raft group's id: a partition group (topic id, partition id) or the
/// controller, packed by [`GroupId::partition`] and [`GroupId::CONTROLLER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GroupId(pub u64);

impl GroupId {
    /// The controller group (topology, placement, consumer groups).
    pub const CONTROLLER: GroupId = GroupId(u64::MAX);

    /// The group of partition `partition_id` of topic `topic_id`.
    pub fn partition(topic_id: u32, partition_id: u32) -> GroupId {
        GroupId((u64::from(topic_id) << 32) | u64::from(partition_id))
    }
}

/// A record as a producer sends it: the payload of one record of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordIn {
    /// Routing key, if any.
    pub key: Option<Vec<u8>>,
    /// Payload.
    pub value: Vec<u8>,
    /// Milliseconds since the Unix epoch, set by the leader.
    pub timestamp_ms: i64,
}

/// An idempotent producer's stamp on a batch: a retry carries the same
/// producer id and first sequence, and the state machine answers it with
/// the offsets of the first copy instead of appending again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStamp {
    /// Producer id, assigned by the controller.
    pub producer_id: u64,
    /// The producer's epoch (a restarted producer fences its old self).
    pub epoch: u32,
    /// Sequence number of the batch's first record in this partition.
    pub first_sequence: u64,
}

/// What a partition group's log entry asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Append these records as one batch.
    Append {
        /// Set by idempotent producers.
        producer: Option<ProducerStamp>,
        /// The records, in order.
        records: Vec<RecordIn>,
    },
    /// Seal the partition after this entry: a split committed in the
    /// controller under `topology_epoch`. Every replica cuts at the same
    /// index, so every replica's seal offset is the same.
    Seal {
        /// The controller's topology epoch that ordered the seal.
        topology_epoch: u64,
    },
}

/// What applying a [`Command`] produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResponse {
    /// The batch's records got offsets `base_offset..base_offset + count`.
    Appended {
        /// Offset of the batch's first record.
        base_offset: u64,
        /// Number of records.
        count: u32,
    },
    /// A retry of a batch already in the log: the offsets of the first copy.
    Duplicate {
        /// Offset of the first copy's first record.
        base_offset: u64,
        /// Number of records.
        count: u32,
    },
    /// The partition is sealed at `end_offset`; appends go to its children.
    Sealed {
        /// The seal offset (exclusive end).
        end_offset: u64,
    },
    /// The batch's first sequence is not the producer's next one (a gap,
    /// or a batch older than the ones the dedup table remembers).
    OutOfOrderSequence {
        /// The producer.
        producer_id: u64,
        /// The sequence the partition expected next.
        expected: u64,
        /// The batch's first sequence.
        received: u64,
    },
    /// The batch's producer epoch is older than the partition's: a newer
    /// instance of that producer has fenced this one.
    ProducerFenced {
        /// The producer.
        producer_id: u64,
        /// The batch's epoch.
        epoch: u32,
        /// The epoch the partition knows.
        current_epoch: u32,
    },
    /// A Raft control entry (blank, membership) was applied; it takes no
    /// offset.
    Control,
    /// What a controller command did (the controller group's answers).
    Controller(Box<crate::controller::ControllerResponse>),
}

openraft::declare_raft_types!(
    /// openraft's type configuration for every fissionlog group.
    pub TypeConfig:
        D = Command,
        R = CommandResponse,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A log entry of a fissionlog group.
pub type Entry = openraft::Entry<TypeConfig>;
