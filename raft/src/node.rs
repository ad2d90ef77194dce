//! A fissionlog node: the partition groups it hosts, the transport that
//! carries their RPCs, and the client calls (append with `acks=quorum`,
//! read committed) served over the same frames.
//!
//! ## The controller and the groups it places
//!
//! Started with [`NodeOptions::controller`], a node also hosts the
//! controller group and proposes clients' controller commands to it.
//! Partition `p` of the topic with controller id `t` is Raft group
//! [`GroupId::partition`]`(t, p)`: topic ids come from the controller's
//! applied log (creation order, from 1), so every replica derives the
//! same group. Each controller output on this replica wakes a task that
//! reads the applied state and hosts every partition placed with this
//! node among its replicas; the preferred leader (the first replica)
//! initialises the group's membership to the replicas, unless its log
//! already holds one. Only the controller's applied state decides what is
//! hosted, so a restart hosts the same groups again as the controller's
//! log is re-applied. Replica moves, seals of a split's parent and the
//! balancer are not acted on yet.
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
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Config, Raft, ServerState};
use tokio::sync::watch;

use crate::client::{
    ClientCall, ClientReply, ClientRequest, ClientResponse, PartitionRoute, ReadRecord, Role,
};
use crate::controller::{ControllerCommand, ControllerStateMachine, OutputSink, CONTROLLER_TOPIC};
use crate::log_store::LogStore;
use crate::network::{BoxFuture, ClientDispatch, Network, RaftRegistry};
use crate::state_machine::{CommittedEndSink, PartitionState, PartitionStateMachine, StampVerdict};
use crate::types::{Command, CommandResponse, GroupId, NodeId, ProducerStamp, RecordIn};
use crate::vote::{StdVoteIo, VoteIo};

/// Most records one read call returns.
pub const MAX_READ_RECORDS: u32 = 10_000;
/// Most payload bytes one read call returns (beyond its first record):
/// half the default frame maximum, so an answer always fits a frame.
pub const MAX_READ_BYTES: usize = (crate::frame::DEFAULT_MAX_FRAME_BYTES / 2) as usize;

/// openraft's timing for fissionlog groups: heartbeats every 100 ms, an
/// election after 400–800 ms of silence.
///
/// openraft 0.9 gives every `AppendEntries` the heartbeat interval as its
/// timeout, heartbeats and appends of entries alike, and a follower
/// answers an append only once its entries are durable. So the interval
/// bounds a link's round trip plus a follower's write and fsync of one
/// batch: past it every append to that follower times out and is sent
/// again, for ever, and a group with no such follower in its quorum
/// acknowledges nothing. At 60 ms, 40 ms of delay each way stopped a
/// loopback cluster dead; 100 ms leaves a slow fsync about 30 ms beside
/// such a link. openraft 0.9 also refuses votes while the old leader's
/// lease runs, so a killed leader is replaced (a new one acknowledging
/// appends) in about 1.3–1.7 s on loopback, with a tail to a few seconds
/// when a vote splits.
pub fn raft_config() -> Config {
    Config {
        heartbeat_interval: 100,
        election_timeout_min: 400,
        election_timeout_max: 800,
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

/// What a node hosts beyond the groups it is given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeOptions {
    /// Host the controller group ([`GroupId::CONTROLLER`]), and with it
    /// every partition group the controller places on this node.
    pub controller: bool,
}

/// What a node stores its groups on: its log, and the file operations of
/// each group's own files.
pub struct NodeStorage {
    /// The node's log (segments, checkpoint, manifest).
    pub log: Log,
    /// The vote, `raft-meta` and `raft-stamps` files' operations.
    pub file_io: Arc<dyn VoteIo>,
    /// The segment size of a group's topic, taken when the group is first
    /// hosted on this node (a restart keeps what the topic was created
    /// with).
    pub segment_bytes: u64,
}

impl NodeStorage {
    /// `log`, the real file operations and the library's segment size.
    pub fn new(log: Log) -> NodeStorage {
        NodeStorage {
            log,
            file_io: Arc::new(StdVoteIo),
            segment_bytes: TopicConfig::default().segment_bytes,
        }
    }
}

impl std::fmt::Debug for NodeStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStorage")
            .field("file_io", &self.file_io)
            .field("segment_bytes", &self.segment_bytes)
            .finish_non_exhaustive()
    }
}

/// What every hosted group shares: the node's log, its Raft settings,
/// the transport and the registry peers' RPCs are dispatched through.
struct Host {
    id: NodeId,
    config: Arc<Config>,
    network: Network,
    registry: RaftRegistry,
    groups: std::sync::RwLock<HashMap<GroupId, Arc<Group>>>,
    /// Held open while the node runs (its directory lock too).
    log: Arc<Log>,
    /// The groups' own files (vote, `raft-meta`, `raft-stamps`) go
    /// through it.
    file_io: Arc<dyn VoteIo>,
    /// The configuration of a group's topic, when it is created.
    group_config: TopicConfig,
}

impl Host {
    fn group(&self, group: GroupId) -> Option<Arc<Group>> {
        self.groups
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&group)
            .cloned()
    }

    fn all(&self) -> Vec<Arc<Group>> {
        self.groups
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Starts hosting `group` on its own replicated topic of the node's
    /// log (created if absent; a restart finds the log, the vote and the
    /// committed id there). Only one caller at a time hosts a given
    /// group: [`Node::start`] before anything else runs, then the
    /// placement task alone.
    async fn host(&self, group: GroupId) -> Result<Arc<Group>, NodeError> {
        if let Some(g) = self.group(group) {
            return Ok(g);
        }
        let name = group_topic(group);
        let store = open_store(&self.log, &self.file_io, &self.group_config, &name)
            .map_err(storage_error(&name))?;
        let part = store.partition().clone();
        // The state machine starts empty: openraft applies the log
        // again up to the saved committed id, which rebuilds the
        // offsets, the dedup table and the high watermark.
        let sm = PartitionStateMachine::new(
            PartitionState::default(),
            Arc::new(PartitionCommittedEnd(part.clone())),
        );
        let raft = Raft::new(
            self.id,
            self.config.clone(),
            self.network.factory(group),
            store,
            sm.clone(),
        )
        .await
        .map_err(|e| NodeError::GroupStart {
            group: group.0,
            reason: e.to_string(),
        })?;
        let g = Arc::new(Group {
            raft: raft.clone(),
            sm,
            part,
            propose: tokio::sync::Mutex::new(HashMap::new()),
            inherited_end: std::sync::Mutex::new(None),
        });
        self.groups
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(group, g.clone());
        self.registry.insert(group, raft);
        Ok(g)
    }
}

/// `LogStore` over partition 0 of the replicated topic `name` of `log`,
/// created if absent; what failed as [`NodeError::Storage`]'s reason.
fn open_store(
    log: &Log,
    io: &Arc<dyn VoteIo>,
    config: &TopicConfig,
    name: &str,
) -> Result<LogStore, String> {
    let topic = match log.topic(name) {
        Ok(t) => t,
        Err(fissionlog::Error::UnknownTopic(_)) => log
            .create_topic(name, config.clone())
            .map_err(|e| e.to_string())?,
        Err(e) => return Err(e.to_string()),
    };
    LogStore::open_with_io(topic, 0, io.clone()).map_err(|e| e.to_string())
}

fn storage_error(what: &str) -> impl FnOnce(String) -> NodeError + '_ {
    move |reason| NodeError::Storage {
        what: what.to_string(),
        reason,
    }
}

/// The controller group hosted on this node.
struct ControllerGroup {
    raft: Raft<crate::types::TypeConfig>,
    sm: ControllerStateMachine,
}

/// The controller's outputs on this replica wake the placement task,
/// which reads the placements from the applied state (not from the
/// output itself: the state also covers what a snapshot brought).
struct PlacementWake(Arc<tokio::sync::Notify>);

impl OutputSink for PlacementWake {
    fn applied(&self, _index: u64, _response: &crate::controller::ControllerResponse) {
        self.0.notify_one();
    }
}

/// How often the placement task looks at the controller's state without
/// being woken (a snapshot installed, a group whose start failed).
const PLACEMENT_RECHECK: Duration = Duration::from_secs(1);

/// A node: its groups and its client calls.
#[derive(Clone)]
pub struct Node {
    host: Arc<Host>,
    controller: Option<Arc<ControllerGroup>>,
    /// The task hosting the groups the controller places here.
    placement: Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>>,
    peers: Arc<BTreeMap<NodeId, String>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.host.id)
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
        Node::start_with(id, dir, groups, peers, network, NodeOptions::default()).await
    }

    /// [`Node::start`], and with `options.controller` the controller
    /// group too: its Raft log is `LogStore` over partition 0 of the
    /// reserved topic `__controller` of the node's log, its state machine
    /// keeps its files in `dir/controller` (the local topology and the
    /// saved snapshot). Every partition the controller's applied state
    /// places with this node among its replicas becomes a hosted group
    /// ([`GroupId::partition`]`(topic id, partition)`), and the
    /// partition's preferred leader (its first replica) initialises the
    /// group's membership to the placed replicas. After a restart the
    /// same groups are hosted again as the controller's log is applied.
    pub async fn start_with(
        id: NodeId,
        dir: &Path,
        groups: &[GroupId],
        peers: BTreeMap<NodeId, String>,
        network: &Network,
        options: NodeOptions,
    ) -> Result<Node, NodeError> {
        let log = Log::open(dir, LogOptions::default()).map_err(|e| NodeError::Storage {
            what: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        Node::start_on(
            id,
            dir,
            NodeStorage::new(log),
            groups,
            peers,
            network,
            options,
        )
        .await
    }

    /// [`Node::start_with`] on storage the caller opened: `storage.log`
    /// must be the log in `dir`. A test opens it with an I/O hook and
    /// gives a [`VoteIo`] of its own, so a power-loss model sees every
    /// fsync the node issues for its groups.
    pub async fn start_on(
        id: NodeId,
        dir: &Path,
        storage: NodeStorage,
        groups: &[GroupId],
        peers: BTreeMap<NodeId, String>,
        network: &Network,
        options: NodeOptions,
    ) -> Result<Node, NodeError> {
        let config = Arc::new(raft_config().validate()?);
        let host = Arc::new(Host {
            id,
            config,
            network: network.clone(),
            registry: RaftRegistry::default(),
            groups: std::sync::RwLock::new(HashMap::new()),
            log: Arc::new(storage.log),
            file_io: storage.file_io,
            group_config: TopicConfig {
                segment_bytes: storage.segment_bytes,
                ..group_topic_config()
            },
        });
        for &group in groups {
            host.host(group).await?;
        }
        let peers = Arc::new(peers);
        let mut node = Node {
            host: host.clone(),
            controller: None,
            placement: Arc::new(std::sync::Mutex::new(None)),
            peers: peers.clone(),
        };
        if options.controller {
            let wake = Arc::new(tokio::sync::Notify::new());
            let sm = ControllerStateMachine::open(
                &dir.join("controller"),
                Arc::new(PlacementWake(wake.clone())),
            )
            .map_err(|e| NodeError::Storage {
                what: "the controller's state".to_string(),
                reason: e.to_string(),
            })?;
            let store = open_store(
                &host.log,
                &host.file_io,
                &host.group_config,
                CONTROLLER_TOPIC,
            )
            .map_err(storage_error(CONTROLLER_TOPIC))?;
            let raft = Raft::new(
                id,
                host.config.clone(),
                network.factory(GroupId::CONTROLLER),
                store,
                sm.clone(),
            )
            .await
            .map_err(|e| NodeError::GroupStart {
                group: GroupId::CONTROLLER.0,
                reason: e.to_string(),
            })?;
            host.registry.insert(GroupId::CONTROLLER, raft.clone());
            let ctl = Arc::new(ControllerGroup { raft, sm });
            let task = tokio::spawn(place_groups(host, ctl.clone(), peers, wake));
            *node
                .placement
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(task);
            node.controller = Some(ctl);
        }
        Ok(node)
    }

    /// The dispatch of peers' Raft RPCs to this node's groups.
    pub fn registry(&self) -> RaftRegistry {
        self.host.registry.clone()
    }

    /// The groups hosted now (the controller group not included).
    pub fn hosted(&self) -> Vec<GroupId> {
        let mut out: Vec<GroupId> = self
            .host
            .groups
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .keys()
            .copied()
            .collect();
        out.sort();
        out
    }

    /// Runs `f` on the controller's state as this replica has applied it
    /// (it may lag the controller's leader); `None` without the
    /// controller, or once it stopped.
    pub fn with_controller_state<T>(
        &self,
        f: impl FnOnce(&crate::controller::ControllerState) -> T,
    ) -> Option<T> {
        self.controller.as_ref()?.sm.with_state(f).ok()
    }

    /// Stops every group (the placement task first, so none starts
    /// behind it).
    pub async fn shutdown(&self) {
        let task = self
            .placement
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
        if let Some(c) = &self.controller {
            let _ = c.raft.shutdown().await;
        }
        for g in self.host.all() {
            let _ = g.raft.shutdown().await;
        }
    }

    async fn handle(&self, call: ClientCall) -> ClientReply {
        let group_of = |g: GroupId| self.host.group(g);
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
            ClientCall::Status { group } => {
                if let (GroupId::CONTROLLER, Some(c)) = (group, &self.controller) {
                    let (leader, role, term) = status_of(&c.raft);
                    let applied =
                        c.sm.with_state(|s| s.last_applied.map_or(0, |l| l.index))
                            .unwrap_or(0);
                    return ClientReply::Status {
                        leader,
                        committed_end: applied,
                        role,
                        term,
                    };
                }
                match group_of(group) {
                    Some(g) => {
                        let (leader, role, term) = status_of(&g.raft);
                        let committed_end = g.sm.with_state(|s| s.committed_end).unwrap_or(0);
                        ClientReply::Status {
                            leader,
                            committed_end,
                            role,
                            term,
                        }
                    }
                    None => not_hosted(group),
                }
            }
            ClientCall::Initialize { group, members } => {
                let raft = match (group, &self.controller) {
                    (GroupId::CONTROLLER, Some(c)) => Some(c.raft.clone()),
                    _ => group_of(group).map(|g| g.raft.clone()),
                };
                let Some(raft) = raft else {
                    return not_hosted(group);
                };
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
                match raft.initialize(members).await {
                    Ok(()) => ClientReply::Initialized,
                    Err(e) => ClientReply::Failed {
                        reason: e.to_string(),
                    },
                }
            }
            ClientCall::Controller(cmd) => match &self.controller {
                Some(c) => propose_controller(c, &cmd).await,
                None => not_hosted(GroupId::CONTROLLER),
            },
            ClientCall::Topic { name } => match &self.controller {
                Some(c) => topic_routes(c, &name),
                None => not_hosted(GroupId::CONTROLLER),
            },
        }
    }
}

/// Hosts every group the controller's applied state places on this node,
/// and initialises those this node is the preferred leader of; woken by
/// each controller output on this replica, and every
/// [`PLACEMENT_RECHECK`] regardless.
async fn place_groups(
    host: Arc<Host>,
    ctl: Arc<ControllerGroup>,
    peers: Arc<BTreeMap<NodeId, String>>,
    wake: Arc<tokio::sync::Notify>,
) {
    // Groups whose membership is known to be set (by this node or before).
    let mut initialised = std::collections::HashSet::new();
    loop {
        place_once(&host, &ctl, &peers, &mut initialised).await;
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(PLACEMENT_RECHECK) => {}
        }
    }
}

async fn place_once(
    host: &Host,
    ctl: &ControllerGroup,
    peers: &BTreeMap<NodeId, String>,
    initialised: &mut std::collections::HashSet<GroupId>,
) {
    let Ok((mine, addrs)) = ctl.sm.with_state(|s| {
        let addrs: BTreeMap<NodeId, String> = s
            .membership
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect();
        (s.groups_of(host.id), addrs)
    }) else {
        return;
    };
    for (group, placement) in mine {
        let g = match host.host(group).await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(group = group.0, error = %e, "cannot host a placed group");
                continue;
            }
        };
        if placement.leader() != Some(host.id) || initialised.contains(&group) {
            continue;
        }
        let has_members = g
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .next()
            .is_some();
        if has_members {
            initialised.insert(group);
            continue;
        }
        let members: Option<BTreeMap<NodeId, BasicNode>> = placement
            .replicas
            .iter()
            .map(|r| {
                addrs
                    .get(r)
                    .or_else(|| peers.get(r))
                    .map(|a| (*r, BasicNode::new(a)))
            })
            .collect();
        let Some(members) = members else {
            tracing::warn!(group = group.0, replicas = ?placement.replicas, "a placed replica has no known address");
            continue;
        };
        match g.raft.initialize(members).await {
            Ok(()) => {
                tracing::info!(group = group.0, replicas = ?placement.replicas, "initialised a placed group");
                initialised.insert(group);
            }
            // Its log holds a membership already (a restart, say).
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                initialised.insert(group);
            }
            Err(e) => {
                tracing::warn!(group = group.0, error = %e, "cannot initialise a placed group");
            }
        }
    }
}

async fn propose_controller(c: &ControllerGroup, cmd: &ControllerCommand) -> ClientReply {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let entry = match cmd.to_entry(now_ms) {
        Ok(e) => e,
        Err(e) => {
            return ClientReply::Failed {
                reason: format!("cannot encode the command: {e}"),
            }
        }
    };
    match c.raft.client_write(entry).await {
        Ok(r) => ClientReply::Applied(r.data),
        Err(RaftError::APIError(e)) => api_error(&c.raft, e),
        Err(e) => ClientReply::Failed {
            reason: e.to_string(),
        },
    }
}

fn topic_routes(c: &ControllerGroup, name: &str) -> ClientReply {
    let found = c.sm.with_state(|s| {
        s.topics.get(name).map(|t| ClientReply::Topic {
            id: t.id,
            partitions: t
                .partitions
                .iter()
                .map(|(&p, m)| PartitionRoute {
                    partition: p,
                    group: GroupId::partition(t.id, p),
                    replicas: m.placement.replicas.clone(),
                    active: m.active,
                })
                .collect(),
        })
    });
    match found {
        Ok(Some(reply)) => reply,
        Ok(None) => ClientReply::Failed {
            reason: format!("unknown topic {name}"),
        },
        Err(e) => ClientReply::Failed {
            reason: e.to_string(),
        },
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
/// The leader a group's replica knows, its role and its term.
fn status_of(raft: &Raft<crate::types::TypeConfig>) -> (Option<NodeId>, Role, u64) {
    let m = raft.metrics().borrow().clone();
    let role = if m.running_state.is_err() {
        Role::Stopped
    } else {
        Role::of(m.state)
    };
    (m.current_leader, role, m.current_term)
}

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
            timestamp_ms: r.timestamp,
        });
    }
    ClientReply::Records {
        records,
        committed_end,
    }
}

/// How long an append may wait for this leader's first entry to apply.
const LEADER_READY_WAIT: Duration = Duration::from_secs(5);

fn not_leader(raft: &Raft<crate::types::TypeConfig>) -> ClientReply {
    let m = raft.metrics().borrow().clone();
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
        Ok(false) | Err(_) => Err(not_leader(&g.raft)),
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
    // Whether this node confirmed it still leads since the table was
    // found behind the batch (see below).
    let mut confirmed = false;
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
        // A sequence past what the table expects may be a gap, or a table
        // behind the group: a leader cut off from a quorum does not know it
        // was replaced, and the batches between may have committed under
        // the new leader. A producer takes the refusal as final, so it is
        // given only once this node has confirmed, with a quorum, that it
        // still leads and has applied everything committed (a duplicate or
        // an older epoch is a fact of what was applied, whoever leads).
        if matches!(verdict, StampVerdict::OutOfOrder { .. }) && !confirmed {
            drop(in_flight);
            if let Err(reply) = confirm_leader(g).await {
                return reply;
            }
            confirmed = true;
            continue;
        }
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

/// Confirms with a quorum that this node still leads the group and waits
/// until it has applied everything committed as of the confirmation;
/// `Err` with the answer to give otherwise (not the leader, or no quorum
/// within [`LEADER_READY_WAIT`]).
async fn confirm_leader(g: &Group) -> Result<(), ClientReply> {
    match tokio::time::timeout(LEADER_READY_WAIT, g.raft.ensure_linearizable()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) | Err(_) => Err(not_leader(&g.raft)),
    }
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
        Err(RaftError::APIError(e)) => api_error(&g.raft, e),
        Err(e) => ClientReply::Failed {
            reason: e.to_string(),
        },
    }
}

async fn write_reply(g: &Group, r: Result<WriteResult, String>) -> ClientReply {
    match r {
        Ok(Ok(resp)) => ClientReply::Applied(resp.data),
        Ok(Err(e)) => api_error(&g.raft, e),
        Err(reason) => ClientReply::Failed { reason },
    }
}

fn api_error(
    raft: &Raft<crate::types::TypeConfig>,
    e: ClientWriteError<NodeId, BasicNode>,
) -> ClientReply {
    match e {
        ClientWriteError::ForwardToLeader(f) => match f.leader_id {
            Some(_) => ClientReply::NotLeader {
                leader: f.leader_id,
                leader_addr: f.leader_node.map(|n| n.addr),
            },
            None => not_leader(raft),
        },
        other => ClientReply::Failed {
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests;
