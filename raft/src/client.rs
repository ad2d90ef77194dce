//! The node's client-facing calls, over the same frames as the peers
//! (a connection says [`Hello::Client`] first), and a small client.
//!
//! Two calls matter: append a batch with `acks=quorum` (answered once the
//! entry is committed and applied, i.e. fdatasynced on a majority), and
//! read committed records (never past the high watermark). A node that is
//! not the group's leader answers an append with [`ClientReply::NotLeader`]
//! naming the leader it knows.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::controller::ControllerCommand;
use crate::error::{Error, Result};
use crate::frame::FrameCodec;
use crate::network::Hello;
use crate::types::{CommandResponse, GroupId, NodeId, ProducerStamp, RecordIn};

/// A client's request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientRequest {
    /// Echoed in the response.
    pub call_id: u64,
    /// What is asked.
    pub call: ClientCall,
}

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClientCall {
    /// Append the records as one batch, answered once a quorum holds it.
    Append {
        /// The partition group.
        group: GroupId,
        /// An idempotent producer's stamp.
        producer: Option<ProducerStamp>,
        /// The records (at least one).
        records: Vec<RecordIn>,
    },
    /// Read committed records from `from_offset`, at most `max_records`.
    Read {
        /// The partition group.
        group: GroupId,
        /// First offset wanted.
        from_offset: u64,
        /// At most this many records.
        max_records: u32,
    },
    /// Who leads the group, and its high watermark here.
    Status {
        /// The partition group.
        group: GroupId,
    },
    /// Initialise the group with these voters (id, address); with none,
    /// the node's configured peers.
    Initialize {
        /// The partition group.
        group: GroupId,
        /// The voters.
        members: Vec<(NodeId, String)>,
    },
    /// Propose a command to the controller group, answered once committed
    /// and applied ([`ClientReply::Applied`] with
    /// [`CommandResponse::Controller`]), or [`ClientReply::NotLeader`].
    /// Boxed: a command is several times the size of the other calls.
    Controller(Box<ControllerCommand>),
    /// Where a topic's partitions live, as this node's controller replica
    /// has applied it (it may lag the controller's leader).
    Topic {
        /// The topic's name.
        name: String,
    },
}

/// One partition of a topic, as [`ClientReply::Topic`] gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRoute {
    /// The partition's id in its topic.
    pub partition: u32,
    /// Its Raft group: [`GroupId::partition`]`(topic id, partition)`.
    pub group: GroupId,
    /// Its replicas, the preferred leader first.
    pub replicas: Vec<NodeId>,
    /// Whether it takes appends (false once sealed).
    pub active: bool,
}

/// A client's response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientResponse {
    /// The request's call id.
    pub call_id: u64,
    /// The answer.
    pub reply: ClientReply,
}

/// One committed record, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadRecord {
    /// Its offset.
    pub offset: u64,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Vec<u8>,
    /// Its timestamp (milliseconds since the Unix epoch), as appended.
    pub timestamp_ms: i64,
}

/// The answer to a [`ClientCall`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientReply {
    /// The append was committed (or refused by the state machine: a
    /// duplicate, a sequence gap, a fenced epoch, a sealed partition).
    Applied(CommandResponse),
    /// This node does not lead the group.
    NotLeader {
        /// The leader it knows, if any.
        leader: Option<NodeId>,
        /// That leader's address.
        leader_addr: Option<String>,
    },
    /// Committed records from the asked offset (fewer than asked at the
    /// high watermark).
    Records {
        /// The records, in offset order.
        records: Vec<ReadRecord>,
        /// The high watermark on this node.
        committed_end: u64,
    },
    /// The group's status on this node.
    Status {
        /// The leader it knows.
        leader: Option<NodeId>,
        /// The high watermark on this node (for the controller group:
        /// the Raft index of the last entry applied here).
        committed_end: u64,
        /// What this node is in the group now.
        role: Role,
        /// The term this node is in.
        term: u64,
    },
    /// A topic's id and partitions ([`ClientCall::Topic`]).
    Topic {
        /// The topic's id.
        id: u32,
        /// Its partitions, in id order.
        partitions: Vec<PartitionRoute>,
    },
    /// The group was initialised.
    Initialized,
    /// The call failed; the reason is for people.
    Failed {
        /// What went wrong.
        reason: String,
    },
}

/// A client connection to one node, one call at a time.
#[derive(Debug)]
pub struct NodeClient {
    stream: BufReader<TcpStream>,
    codec: FrameCodec,
    next_call_id: u64,
}

impl NodeClient {
    /// Connects to the node at `addr` within `timeout`.
    pub async fn connect(addr: &str, timeout: Duration) -> Result<NodeClient> {
        let io = |op, source| Error::Io {
            op,
            path: addr.into(),
            source,
        };
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| io("connect", std::io::ErrorKind::TimedOut.into()))?
            .map_err(|e| io("connect", e))?;
        stream.set_nodelay(true).map_err(|e| io("connect", e))?;
        let codec = FrameCodec::default();
        let mut c = NodeClient {
            stream: BufReader::new(stream),
            codec,
            next_call_id: 1,
        };
        let mut buf = Vec::new();
        codec.encode(&Hello::Client, &mut buf)?;
        c.stream
            .get_mut()
            .write_all(&buf)
            .await
            .map_err(|e| io("write", e))?;
        Ok(c)
    }

    /// Sends `call` and waits at most `timeout` for its answer.
    pub async fn call(&mut self, call: ClientCall, timeout: Duration) -> Result<ClientReply> {
        let call_id = self.next_call_id;
        self.next_call_id += 1;
        let mut buf = Vec::new();
        self.codec
            .encode(&ClientRequest { call_id, call }, &mut buf)?;
        let exchange = async {
            self.stream
                .get_mut()
                .write_all(&buf)
                .await
                .map_err(|source| Error::Io {
                    op: "write",
                    path: "<node connection>".into(),
                    source,
                })?;
            loop {
                let resp: Option<ClientResponse> = self.codec.read_frame(&mut self.stream).await?;
                match resp {
                    Some(r) if r.call_id == call_id => return Ok(r.reply),
                    // An answer to an earlier call that timed out: skip it.
                    Some(_) => continue,
                    None => {
                        return Err(Error::TruncatedFrame { have: 0, need: 1 });
                    }
                }
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| Error::Io {
                op: "call",
                path: "<node connection>".into(),
                source: std::io::ErrorKind::TimedOut.into(),
            })?
    }
}

/// What a node is in a group, as [`ClientReply::Status`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// It leads the group.
    Leader,
    /// It follows a leader, or waits for one.
    Follower,
    /// It campaigns for leadership.
    Candidate,
    /// It replicates without a vote.
    Learner,
    /// Its group stopped on this node (shut down, or a storage error).
    Stopped,
}

impl Role {
    /// The role of an openraft server state.
    pub fn of(state: openraft::ServerState) -> Role {
        match state {
            openraft::ServerState::Leader => Role::Leader,
            openraft::ServerState::Follower => Role::Follower,
            openraft::ServerState::Candidate => Role::Candidate,
            openraft::ServerState::Learner => Role::Learner,
            openraft::ServerState::Shutdown => Role::Stopped,
        }
    }
}
