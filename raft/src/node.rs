//! A fissionlog node: the partition groups it hosts, the transport that
//! carries their RPCs, and the client calls (append with `acks=quorum`,
//! read committed) served over the same frames.
//!
//! ## Idempotent appends on the leader
//!
//! One Raft entry is one batch in the partition's segment log, written
//! when the entry is appended, before it commits. The state machine
//! answers a retried batch with the first copy's offsets, but by then the
//! retry's bytes are in the log too. So the leader checks a stamped batch
//! *before* proposing it, and proposes it only when it is the producer's
//! next one:
//!
//! 1. it waits until its state machine has applied every entry its log
//!    held when it first checked a stamp in this term (and an entry of its
//!    own term): then the dedup table knows every earlier copy that could
//!    still commit. An entry of its own term alone is not enough: openraft
//!    0.9 restores a restarted leader whose vote is committed at once, in
//!    its old term and with no new blank, and its log can then hold
//!    entries of that term beyond what it has applied;
//! 2. under a per-group lock, it looks at the batches it proposed itself
//!    and that are not applied yet (a retry of one of those waits for that
//!    one's answer), then at the dedup table;
//! 3. only a batch that is neither is proposed.
//!
//! The state machine's own check stays as the deterministic answer every
//! replica agrees on.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fissionlog::{Log, LogOptions, Partition, ReadIsolation, TopicConfig};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Config, Raft, ServerState};
use tokio::sync::watch;

use crate::client::{ClientCall, ClientReply, ClientRequest, ClientResponse, ReadRecord};
use crate::log_store::LogStore;
use crate::network::{BoxFuture, ClientDispatch, Network, RaftRegistry};
use crate::state_machine::{CommittedEndSink, PartitionState, PartitionStateMachine, StampVerdict};
use crate::types::{Command, CommandResponse, GroupId, NodeId, ProducerStamp, RecordIn};

/// Most records one read call returns.
pub const MAX_READ_RECORDS: u32 = 10_000;
/// Most payload bytes one read call returns (beyond its first record):
/// half the default frame maximum, so an answer always fits a frame.
pub const MAX_READ_BYTES: usize = (crate::frame::DEFAULT_MAX_FRAME_BYTES / 2) as usize;

/// openraft's timing for fissionlog groups: heartbeats every 60 ms, an
/// election after 300–600 ms of silence. openraft 0.9 also refuses votes
/// while the old leader's lease runs, so a killed leader is replaced (a
/// new one acknowledging appends) in about 1–2 s on loopback; shorter
/// timeouts buy little on a loaded machine and cost spurious elections.
pub fn raft_config() -> Config {
    Config {
        heartbeat_interval: 60,
        election_timeout_min: 300,
        election_timeout_max: 600,
        // Raft never purges: retention decides what the log drops.
        max_in_snapshot_log_to_keep: u64::MAX,
        ..Config::default()
    }
}

type InFlightKey = (u64, u32, u64);

/// One hosted partition group.
struct Group {
    raft: Raft<crate::types::TypeConfig>,
    sm: PartitionStateMachine,
    /// The group's partition: the Raft log and what clients read.
    part: Arc<Partition>,
    /// Serialises the dedup check and the proposal of stamped batches.
    propose: tokio::sync::Mutex<HashMap<InFlightKey, watch::Receiver<Option<ClientReply>>>>,
    /// `(term, index)`: the last log index when this process first
    /// checked a stamp as leader in `term`. Entries up to it may be copies
    /// this leader did not propose; they must be applied before a stamp
    /// is checked against the dedup table.
    inherited_end: std::sync::Mutex<Option<(u64, u64)>>,
}

/// A node: its groups and its client calls.
#[derive(Clone)]
pub struct Node {
    id: NodeId,
    groups: Arc<HashMap<GroupId, Arc<Group>>>,
    registry: RaftRegistry,
    peers: Arc<BTreeMap<NodeId, String>>,
    /// Held open while the node runs (its directory lock too).
    _log: Arc<Log>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// openraft refused the configuration.
    #[error("raft configuration refused: {0}")]
    Config(#[from] openraft::ConfigError),
    /// The node's log directory, or a group's storage in it, could not
    /// be opened.
    #[error("storage of {what} did not open: {reason}")]
    Storage {
        /// The directory or the group's topic.
        what: String,
        /// What the library said.
        reason: String,
    },
    /// openraft could not start a group.
    #[error("group {group} did not start: {reason}")]
    GroupStart {
        /// The group.
        group: u64,
        /// What openraft said.
        reason: String,
    },
}

impl Node {
    /// Starts node `id` hosting `groups` on the fissionlog log in `dir`
    /// (created if absent; a restarted node finds its groups' logs, votes
    /// and committed ids there), its peers (id → address, itself
    /// included) used to initialise a group that is given none.
    ///
    /// Each group is its own replicated topic, `group-<id>`, of one
    /// partition: a group's storage (segments, vote, `raft-meta`,
    /// `raft-stamps`) is one directory, hosting a group is creating a
    /// topic, and there is no topic-wide partition count for a restart with
    /// other groups to disagree with. The log's sync round covers every
    /// topic, so the groups still share one group commit.
    pub async fn start(
        id: NodeId,
        dir: &Path,
        groups: &[GroupId],
        peers: BTreeMap<NodeId, String>,
        network: &Network,
    ) -> Result<Node, NodeError> {
        let config = Arc::new(raft_config().validate()?);
        let registry = RaftRegistry::default();
        let storage = |what: String| {
            move |e: fissionlog::Error| NodeError::Storage {
                what,
                reason: e.to_string(),
            }
        };
        let log =
            Log::open(dir, LogOptions::default()).map_err(storage(dir.display().to_string()))?;
        let mut hosted = HashMap::new();
        for &group in groups {
            let name = group_topic(group);
            let topic = match log.topic(&name) {
                Ok(t) => t,
                Err(fissionlog::Error::UnknownTopic(_)) => log
                    .create_topic(&name, group_topic_config())
                    .map_err(storage(name.clone()))?,
                Err(e) => return Err(storage(name)(e)),
            };
            let store = LogStore::open(topic, 0).map_err(|e| NodeError::Storage {
                what: name.clone(),
                reason: e.to_string(),
            })?;
            let part = store.partition().clone();
            // The state machine starts empty: openraft applies the log
            // again up to the saved committed id, which rebuilds the
            // offsets, the dedup table and the high watermark.
            let sm = PartitionStateMachine::new(
                PartitionState::default(),
                Arc::new(PartitionCommittedEnd(part.clone())),
            );
            let raft = Raft::new(
                id,
                config.clone(),
                network.factory(group),
                store,
                sm.clone(),
            )
            .await
            .map_err(|e| NodeError::GroupStart {
                group: group.0,
                reason: e.to_string(),
            })?;
            registry.insert(group, raft.clone());
            hosted.insert(
                group,
                Arc::new(Group {
                    raft,
                    sm,
                    part,
                    propose: tokio::sync::Mutex::new(HashMap::new()),
                    inherited_end: std::sync::Mutex::new(None),
                }),
            );
        }
        Ok(Node {
            id,
            groups: Arc::new(hosted),
            registry,
            peers: Arc::new(peers),
            _log: Arc::new(log),
        })
    }

    /// The dispatch of peers' Raft RPCs to this node's groups.
    pub fn registry(&self) -> RaftRegistry {
        self.registry.clone()
    }

    /// Stops every group.
    pub async fn shutdown(&self) {
        for g in self.groups.values() {
            let _ = g.raft.shutdown().await;
        }
    }

    async fn handle(&self, call: ClientCall) -> ClientReply {
        let group_of = |g: GroupId| self.groups.get(&g).cloned();
        match call {
            ClientCall::Append {
                group,
                producer,
                records,
            } => match group_of(group) {
                Some(g) => append(&g, producer, records).await,
                None => not_hosted(group),
            },
            ClientCall::Read {
                group,
                from_offset,
                max_records,
            } => match group_of(group) {
                Some(g) => read(&g, from_offset, max_records),
                None => not_hosted(group),
            },
            ClientCall::Status { group } => match group_of(group) {
                Some(g) => {
                    let leader = g.raft.metrics().borrow().current_leader;
                    let committed_end = g.sm.with_state(|s| s.committed_end).unwrap_or(0);
                    ClientReply::Status {
                        leader,
                        committed_end,
                    }
                }
                None => not_hosted(group),
            },
            ClientCall::Initialize { group, members } => match group_of(group) {
                Some(g) => {
                    let members: BTreeMap<NodeId, BasicNode> = if members.is_empty() {
                        self.peers
                            .iter()
                            .map(|(id, a)| (*id, BasicNode::new(a)))
                            .collect()
                    } else {
                        members
                            .into_iter()
                            .map(|(id, a)| (id, BasicNode::new(a)))
                            .collect()
                    };
                    match g.raft.initialize(members).await {
                        Ok(()) => ClientReply::Initialized,
                        Err(e) => ClientReply::Failed {
                            reason: e.to_string(),
                        },
                    }
                }
                None => not_hosted(group),
            },
        }
    }
}

impl ClientDispatch for Node {
    fn call(&self, request: ClientRequest) -> BoxFuture<ClientResponse> {
        let node = self.clone();
        Box::pin(async move {
            let reply = node.handle(request.call).await;
            ClientResponse {
                call_id: request.call_id,
                reply,
            }
        })
    }
}

/// The replicated topic holding `group`'s log.
fn group_topic(group: GroupId) -> String {
    format!("group-{}", group.0)
}

fn group_topic_config() -> TopicConfig {
    let mut cfg = TopicConfig {
        partitions: 1,
        replicated: true,
        // Any record a read answer can carry (one frame).
        max_record_bytes: MAX_READ_BYTES as u32,
        ..TopicConfig::default()
    };
    // A replicated topic's splits are the controller's.
    cfg.balance.enabled = false;
    cfg
}

/// Publishes the state machine's high watermark to the partition, where
/// `ReadIsolation::Committed` reads see it.
struct PartitionCommittedEnd(Arc<Partition>);

impl CommittedEndSink for PartitionCommittedEnd {
    fn publish(&self, end_offset: u64) {
        self.0.set_committed_end(end_offset);
    }
}

fn not_hosted(group: GroupId) -> ClientReply {
    ClientReply::Failed {
        reason: format!("group {} is not hosted on this node", group.0),
    }
}

fn read(g: &Group, from_offset: u64, max_records: u32) -> ClientReply {
    let Ok(committed_end) = g.sm.with_state(|s| s.committed_end) else {
        return ClientReply::Failed {
            reason: "the group's state machine stopped".to_string(),
        };
    };
    let max = max_records.min(MAX_READ_RECORDS) as usize;
    // The partition's committed reads: below the high watermark the state
    // machine published and below the durable end.
    let batch = match g
        .part
        .read_with(from_offset, MAX_READ_BYTES, ReadIsolation::Committed)
    {
        Ok(b) => b,
        // At or past what is visible: nothing to read yet. A reader that
        // has read everything asks again from the end, and must not be
        // told it failed.
        Err(fissionlog::Error::OffsetOutOfRange { offset, end, .. }) if offset >= end => {
            return ClientReply::Records {
                records: Vec::new(),
                committed_end,
            }
        }
        Err(e) => {
            return ClientReply::Failed {
                reason: e.to_string(),
            }
        }
    };
    let mut records = Vec::new();
    // The answer must fit one frame: keep at least one record and stop
    // before the payload bytes pass the bound.
    let mut bytes = 0usize;
    for r in batch.try_iter() {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                return ClientReply::Failed {
                    reason: e.to_string(),
                }
            }
        };
        if r.offset < from_offset {
            continue;
        }
        bytes += r.value.len() + r.key.map_or(0, <[u8]>::len) + 32;
        if records.len() >= max || (bytes > MAX_READ_BYTES && !records.is_empty()) {
            break;
        }
        records.push(ReadRecord {
            offset: r.offset,
            key: r.key.map(<[u8]>::to_vec),
            value: r.value.to_vec(),
        });
    }
    ClientReply::Records {
        records,
        committed_end,
    }
}

/// How long an append may wait for this leader's first entry to apply.
const LEADER_READY_WAIT: Duration = Duration::from_secs(5);

fn not_leader(g: &Group) -> ClientReply {
    let m = g.raft.metrics().borrow().clone();
    let leader_addr = m.current_leader.and_then(|l| {
        m.membership_config
            .membership()
            .get_node(&l)
            .map(|n| n.addr.clone())
    });
    ClientReply::NotLeader {
        leader: m.current_leader,
        leader_addr,
    }
}

/// The last log index this leader inherited in `term` (see [`Group`]):
/// fixed at the first call in that term.
fn inherited_end(g: &Group, term: u64, last_log_index: u64) -> u64 {
    let mut at = g
        .inherited_end
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    match *at {
        Some((t, index)) if t == term => index,
        _ => {
            *at = Some((term, last_log_index));
            last_log_index
        }
    }
}

/// Waits until this node leads the group and has applied an entry of its
/// own term and every entry its log held when it first checked a stamp in
/// this term; `Err` with the answer to give when it is not the leader.
async fn leader_ready(g: &Group) -> Result<(), ClientReply> {
    let mut metrics = g.raft.metrics();
    let wait = async {
        loop {
            {
                let m = metrics.borrow_and_update();
                if m.state != ServerState::Leader {
                    return false;
                }
                let target = inherited_end(g, m.current_term, m.last_log_index.unwrap_or(0));
                if let Some(applied) = m.last_applied {
                    if applied.leader_id.term == m.current_term && applied.index >= target {
                        return true;
                    }
                }
            }
            if metrics.changed().await.is_err() {
                return false;
            }
        }
    };
    match tokio::time::timeout(LEADER_READY_WAIT, wait).await {
        Ok(true) => Ok(()),
        Ok(false) | Err(_) => Err(not_leader(g)),
    }
}

async fn append(g: &Group, producer: Option<ProducerStamp>, records: Vec<RecordIn>) -> ClientReply {
    if records.is_empty() {
        return ClientReply::Failed {
            reason: "an append needs at least one record".to_string(),
        };
    }
    let Ok(count) = u32::try_from(records.len()) else {
        return ClientReply::Failed {
            reason: format!("{} records do not fit one batch", records.len()),
        };
    };
    let cmd = Command::Append { producer, records };
    let Some(stamp) = producer else {
        return propose(g, cmd).await;
    };
    if let Err(reply) = leader_ready(g).await {
        return reply;
    }
    let key = (stamp.producer_id, stamp.epoch, stamp.first_sequence);
    let (done_tx, rx) = loop {
        let mut in_flight = g.propose.lock().await;
        if let Some(rx) = in_flight.get(&key).cloned() {
            drop(in_flight);
            return wait_for(rx).await;
        }
        // Another batch of this producer is still in flight: wait for it,
        // then check again against the table it leaves (one batch per
        // producer in flight on the leader; many producers at once).
        let earlier = in_flight
            .iter()
            .find(|((p, _, _), _)| *p == stamp.producer_id)
            .map(|(_, rx)| rx.clone());
        if let Some(rx) = earlier {
            drop(in_flight);
            wait_for(rx).await;
            continue;
        }
        let verdict = match g.sm.with_state(|s| s.check_stamp(&stamp, count)) {
            Ok(v) => v,
            Err(e) => {
                return ClientReply::Failed {
                    reason: e.to_string(),
                }
            }
        };
        if let Some(answer) = refusal(&stamp, verdict) {
            return ClientReply::Applied(answer);
        }
        let rx = match g.raft.client_write_ff(cmd).await {
            Ok(rx) => rx,
            Err(e) => {
                return ClientReply::Failed {
                    reason: e.to_string(),
                }
            }
        };
        let (done_tx, done_rx) = watch::channel(None);
        in_flight.insert(key, done_rx);
        break (done_tx, rx);
    };
    let reply = write_reply(g, rx.await.map_err(|e| e.to_string())).await;
    g.propose.lock().await.remove(&key);
    let _ = done_tx.send(Some(reply.clone()));
    reply
}

/// The answer for a stamped batch that must not be proposed, if any.
fn refusal(stamp: &ProducerStamp, verdict: StampVerdict) -> Option<CommandResponse> {
    match verdict {
        StampVerdict::Fresh => None,
        StampVerdict::Duplicate(b) => Some(CommandResponse::Duplicate {
            base_offset: b.base_offset,
            count: b.count,
        }),
        StampVerdict::OutOfOrder { expected } => Some(CommandResponse::OutOfOrderSequence {
            producer_id: stamp.producer_id,
            expected,
            received: stamp.first_sequence,
        }),
        StampVerdict::Fenced { current_epoch } => Some(CommandResponse::ProducerFenced {
            producer_id: stamp.producer_id,
            epoch: stamp.epoch,
            current_epoch,
        }),
    }
}

async fn wait_for(mut rx: watch::Receiver<Option<ClientReply>>) -> ClientReply {
    loop {
        if let Some(r) = rx.borrow_and_update().clone() {
            return r;
        }
        if rx.changed().await.is_err() {
            return ClientReply::Failed {
                reason: "the first copy's proposal ended without an answer; retry".to_string(),
            };
        }
    }
}

type WriteResult = Result<
    openraft::raft::ClientWriteResponse<crate::types::TypeConfig>,
    ClientWriteError<NodeId, BasicNode>,
>;

async fn propose(g: &Group, cmd: Command) -> ClientReply {
    match g.raft.client_write(cmd).await {
        Ok(r) => ClientReply::Applied(r.data),
        Err(RaftError::APIError(e)) => api_error(g, e),
        Err(e) => ClientReply::Failed {
            reason: e.to_string(),
        },
    }
}

async fn write_reply(g: &Group, r: Result<WriteResult, String>) -> ClientReply {
    match r {
        Ok(Ok(resp)) => ClientReply::Applied(resp.data),
        Ok(Err(e)) => api_error(g, e),
        Err(reason) => ClientReply::Failed { reason },
    }
}

fn api_error(g: &Group, e: ClientWriteError<NodeId, BasicNode>) -> ClientReply {
    match e {
        ClientWriteError::ForwardToLeader(f) => match f.leader_id {
            Some(_) => ClientReply::NotLeader {
                leader: f.leader_id,
                leader_addr: f.leader_node.map(|n| n.addr),
            },
            None => not_leader(g),
        },
        other => ClientReply::Failed {
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests;
