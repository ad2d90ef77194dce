//! The controller's commands and answers, and how a command travels in the
//! controller's Raft log.
//!
//! The controller group shares the crate's [`TypeConfig`](crate::TypeConfig)
//! with the partition groups (one transport, one log storage, one node
//! registry), so its log entries are [`Command`]s too: a controller command
//! is **one record** of a [`Command::Append`] in the reserved topic
//! [`CONTROLLER_TOPIC`], its value a version byte followed by the postcard
//! encoding of the [`ControllerCommand`]. The log storage keeps it as an
//! ordinary format-2 batch, so the controller's log is a partition like any
//! other (readable by `dump`, recovered by the same rules).

use fissionlog::{TopicConfig, TopologyCommand};
use serde::{Deserialize, Serialize};

use crate::types::{Command, NodeId, RecordIn};

/// The reserved topic whose partition 0 is the controller's Raft log.
/// The double underscore cannot clash with a name users pick by accident;
/// the controller refuses to create a topic of that name.
pub const CONTROLLER_TOPIC: &str = "__controller";

/// The version byte in front of each encoded command.
/// Version 2: `CreateTopic` carries the topic's routing hash key, and
/// `InitProducer` allocates producer ids. A version 1 command is refused
/// (the same way on every replica), never read with the new layout.
pub const COMMAND_VERSION: u8 = 2;

/// Where one partition's replicas live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaPlacement {
    /// The nodes holding a replica, the preferred leader first.
    pub replicas: Vec<NodeId>,
}

impl ReplicaPlacement {
    /// The preferred leader (the first replica), if any.
    pub fn leader(&self) -> Option<NodeId> {
        self.replicas.first().copied()
    }
}

/// A consumer-group event, with the time it happened on the proposer's
/// clock: every replica computes expirations and assignments from the
/// same `now_ms`, never from its own clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupEvent {
    /// A consumer joins; the controller gives it the next member id.
    Join {
        /// No heartbeat for this long: the member is dead and fenced.
        session_timeout_ms: u64,
    },
    /// A member is alive.
    Heartbeat {
        /// The member.
        member: u64,
        /// The generation it believes current.
        generation: u64,
    },
    /// A member commits positions (partition, next offset) it owns.
    Commit {
        /// The member.
        member: u64,
        /// The generation it believes current.
        generation: u64,
        /// Next offset per partition.
        positions: Vec<(u32, u64)>,
    },
    /// A member leaves.
    Leave {
        /// The member.
        member: u64,
    },
}

/// What the controller's log carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ControllerCommand {
    /// Creates a topic on every node, with the replica placement of each
    /// of its first partitions (`placement[i]` for partition `i`).
    CreateTopic {
        /// The topic's name.
        name: String,
        /// Its configuration (the same on every node).
        config: TopicConfig,
        /// One placement per partition.
        placement: Vec<ReplicaPlacement>,
        /// The key of the topic's routing hash (`fissionlog::key_hash`),
        /// 128 random bits the proposer drew: every broker routes keys
        /// with it, and nobody without it can aim keys at a partition.
        hash_key: [u64; 2],
    },
    /// A topology change, applied to every node's local topology through
    /// `Topic::apply`; new partitions are placed by [`super::placement`].
    Topology {
        /// The topic.
        topic: String,
        /// The change.
        command: TopologyCommand,
    },
    /// Moves a partition's replicas (or its preferred leader).
    SetPlacement {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The new placement.
        placement: ReplicaPlacement,
    },
    /// A consumer-group event for the group `group` reading `topic`.
    Group {
        /// The group's name.
        group: String,
        /// The topic it reads.
        topic: String,
        /// The proposer's clock when the event happened (milliseconds).
        now_ms: u64,
        /// The event.
        event: GroupEvent,
    },
    /// Hands out a producer id: a new one (epoch 0), or for `Some(id)`
    /// the id's next epoch, which fences its older ones
    /// ([`super::producers`]).
    InitProducer {
        /// The id asking for its next epoch; `None` for a new id.
        producer_id: Option<u64>,
    },
}

/// A change of a group's assignment: the controller's output for the
/// members (who reads what, from which generation on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignmentChange {
    /// The group.
    pub group: String,
    /// The generation the assignment belongs to.
    pub generation: u64,
    /// Per live member, the partitions it owns (ascending).
    pub owners: Vec<(u64, Vec<u32>)>,
    /// Members removed (expired or left) by this change: fenced, their
    /// commits refused from now on.
    pub fenced: Vec<u64>,
}

/// What a controller command's own effect was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControllerAnswer {
    /// The topic exists on this node now.
    TopicCreated,
    /// A topology change was applied; its new partitions got these
    /// placements (children in range order).
    TopologyApplied {
        /// The new partitions and where they live.
        placed: Vec<(u32, ReplicaPlacement)>,
        /// Partitions that left the topology.
        removed: Vec<u32>,
    },
    /// A placement changed.
    PlacementSet,
    /// A member joined.
    Joined {
        /// Its id.
        member: u64,
        /// The generation it joined in.
        generation: u64,
    },
    /// A live member's heartbeat: the generation now and its partitions.
    Alive {
        /// The group's current generation.
        generation: u64,
        /// The partitions the member owns in it.
        partitions: Vec<u32>,
    },
    /// A commit or a leave was taken.
    Accepted,
    /// The member is not live, or not in that generation: its call is
    /// refused (C9: a fenced member cannot commit).
    Fenced {
        /// The member.
        member: u64,
        /// The group's current generation.
        generation: u64,
    },
    /// A producer id and its epoch were handed out.
    ProducerInit {
        /// The id.
        producer_id: u64,
        /// Its epoch.
        epoch: u32,
    },
    /// The command was refused, the same way on every replica (bad name,
    /// unknown topic, a split the topology does not allow...).
    Refused {
        /// Why.
        reason: String,
    },
}

/// What applying a controller command produced: plain values, the same on
/// every replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerResponse {
    /// The command's own answer.
    pub answer: ControllerAnswer,
    /// Consumer-group assignment changes it caused (a join, a leave, an
    /// expiry noticed at the command's time, a split of a topic a group
    /// reads), in the order they happened.
    pub assignments: Vec<AssignmentChange>,
}

impl ControllerResponse {
    /// An answer that changed no assignment.
    pub fn only(answer: ControllerAnswer) -> ControllerResponse {
        ControllerResponse {
            answer,
            assignments: Vec::new(),
        }
    }
}

/// Why bytes from the controller's log are not a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommandDecodeError {
    /// The entry is not one record of the controller topic.
    #[error("a controller entry is one record, found {records}")]
    NotOneRecord {
        /// Records found.
        records: usize,
    },
    /// The version byte is not one this build reads.
    #[error("controller command version {version}; this build reads {COMMAND_VERSION}")]
    Version {
        /// The byte found.
        version: u8,
    },
    /// The payload does not decode.
    #[error("malformed controller command: {reason}")]
    Malformed {
        /// What postcard said.
        reason: String,
    },
}

impl ControllerCommand {
    /// The record value: a version byte, then postcard.
    pub fn encode(&self) -> Result<Vec<u8>, postcard::Error> {
        let mut out = vec![COMMAND_VERSION];
        postcard::to_io(self, &mut out)?;
        Ok(out)
    }

    /// Decodes what [`ControllerCommand::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<ControllerCommand, CommandDecodeError> {
        let Some((&version, body)) = bytes.split_first() else {
            return Err(CommandDecodeError::Malformed {
                reason: "empty record".into(),
            });
        };
        if version != COMMAND_VERSION {
            return Err(CommandDecodeError::Version { version });
        }
        let (cmd, rest) = postcard::take_from_bytes::<ControllerCommand>(body).map_err(|e| {
            CommandDecodeError::Malformed {
                reason: e.to_string(),
            }
        })?;
        if !rest.is_empty() {
            return Err(CommandDecodeError::Malformed {
                reason: format!("{} bytes after the command", rest.len()),
            });
        }
        Ok(cmd)
    }

    /// The Raft log entry's payload carrying this command, stamped with
    /// the proposer's clock.
    pub fn to_entry(&self, timestamp_ms: i64) -> Result<Command, postcard::Error> {
        Ok(Command::Append {
            producer: None,
            records: vec![RecordIn {
                key: None,
                value: self.encode()?,
                timestamp_ms,
            }],
        })
    }

    /// The controller command an entry's payload carries.
    pub fn from_entry(cmd: &Command) -> Result<ControllerCommand, CommandDecodeError> {
        match cmd {
            Command::Append { records, .. } if records.len() == 1 => {
                ControllerCommand::decode(&records[0].value)
            }
            Command::Append { records, .. } => Err(CommandDecodeError::NotOneRecord {
                records: records.len(),
            }),
            Command::Seal { .. } => Err(CommandDecodeError::NotOneRecord { records: 0 }),
        }
    }
}
