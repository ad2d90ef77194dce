//! The transport between nodes: one TCP connection per ordered pair of
//! nodes, shared by every group on that pair.
//!
//! - [`Network`] owns this node's outgoing connections ([`PeerLink`], one
//!   per peer, connected lazily, reconnected with a doubling backoff).
//! - [`NetworkFactory`] is openraft's `RaftNetworkFactory` for one group: a
//!   cheap handle on the shared [`Network`]; its [`GroupClient`]s send
//!   [`PeerMessage`] requests with a call id and await the matching
//!   response with the `RPCOption`'s TTL as the timeout (a timeout, a full
//!   queue or a lost connection is `RPCError::Unreachable`, which openraft
//!   retries with its backoff).
//! - [`Server`] accepts connections; the first frame of each is a
//!   [`Hello`] saying whether a peer or a client speaks, then requests are
//!   dispatched to the addressed group (through [`GroupDispatch`]) or to
//!   the node's client calls, and answered out of order.
//!
//! Every frame is a [`FrameCodec`] frame: malformed, truncated, oversized
//! and unknown-version frames are typed errors that close the connection.

mod link;
mod server;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{Deserialize, Serialize};

pub use link::{LinkStats, PeerLink};
pub use server::{BoxFuture, ClientDispatch, ConnectionErrors, GroupDispatch, Server};

use crate::frame::{FrameCodec, RaftRequest, RaftResponse};
use crate::types::{GroupId, NodeId, TypeConfig};

/// The first frame on every connection: who is speaking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hello {
    /// Another node; [`PeerMessage`]s follow.
    Peer {
        /// The sender's node id.
        from: NodeId,
    },
    /// A client; [`crate::client::ClientRequest`]s follow.
    Client,
}

/// The transport's knobs.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// The frame codec (and so the maximum frame size).
    pub codec: FrameCodec,
    /// How long a connect may take.
    pub connect_timeout: Duration,
    /// First wait after a failed connect; doubled on each failure.
    pub backoff_min: Duration,
    /// Longest wait between connect attempts.
    pub backoff_max: Duration,
    /// Request frames that may wait for one peer's connection; a call that
    /// finds the queue full fails at once (`Unreachable`).
    pub queue_frames: usize,
    /// Requests one incoming connection may have in progress at once.
    pub max_in_flight: usize,
    /// How long the writer waits for more frames to join a write. Zero:
    /// only frames already queued behind the first join it, which adds no
    /// latency and still coalesces whatever queued during the last write.
    pub coalesce_window: Duration,
    /// How long a new connection may take to send its hello.
    pub hello_timeout: Duration,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            codec: FrameCodec::default(),
            connect_timeout: Duration::from_millis(500),
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
            queue_frames: 4096,
            max_in_flight: 256,
            coalesce_window: Duration::ZERO,
            hello_timeout: Duration::from_secs(5),
        }
    }
}

/// Why a call to a peer got no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// No answer within the call's TTL.
    #[error("node {target} did not answer within {after:?}")]
    Timeout {
        /// The peer.
        target: NodeId,
        /// The TTL that ran out.
        after: Duration,
    },
    /// The connection broke (or could not be made) before the answer came.
    #[error("connection to node {target} lost")]
    ConnectionLost {
        /// The peer.
        target: NodeId,
    },
    /// The queue of frames waiting for this peer is full.
    #[error("send queue to node {target} is full")]
    QueueFull {
        /// The peer.
        target: NodeId,
    },
    /// The peer answered that it cannot hand the request to the group.
    #[error("node {target} cannot serve the group: {reason}")]
    Unavailable {
        /// The peer.
        target: NodeId,
        /// What it said.
        reason: String,
    },
    /// The peer answered with the wrong kind of response.
    #[error("node {target} answered a {asked} request with another kind")]
    WrongResponse {
        /// The peer.
        target: NodeId,
        /// The request kind.
        asked: &'static str,
    },
    /// The request could not be encoded as a frame (too large, most often).
    #[error("cannot encode the request: {0}")]
    Encode(#[source] crate::error::Error),
}

/// Each peer's address and the link to it.
type Links = HashMap<NodeId, (String, Arc<PeerLink>)>;

/// This node's outgoing connections, one per peer. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Network {
    me: NodeId,
    cfg: NetworkConfig,
    links: Arc<Mutex<Links>>,
    /// Where to dial a peer instead of the address its membership names
    /// (a proxy in front of it, say); peers not in it are dialled there.
    dial: Arc<HashMap<NodeId, String>>,
}

impl Network {
    /// The outgoing side of node `me`.
    pub fn new(me: NodeId, cfg: NetworkConfig) -> Network {
        Network {
            me,
            cfg,
            links: Arc::default(),
            dial: Arc::default(),
        }
    }

    /// This network, dialling each peer in `dial` at the address given
    /// there whatever address the group's membership names for it. The
    /// membership (what every node agrees on) keeps the address the peer
    /// listens on; only this node's outgoing connections go elsewhere.
    pub fn with_dial_overrides(mut self, dial: HashMap<NodeId, String>) -> Network {
        self.dial = Arc::new(dial);
        self
    }

    /// The shared link to `target` at `addr` (or at its dial override);
    /// a new address replaces the link (the old one ends when its last
    /// handle goes).
    pub fn link(&self, target: NodeId, addr: &str) -> Arc<PeerLink> {
        let addr = self.dial.get(&target).map_or(addr, String::as_str);
        let mut links = link::lock(&self.links);
        if let Some((known, l)) = links.get(&target) {
            if known == addr {
                return l.clone();
            }
        }
        let l = PeerLink::start(self.me, target, addr.to_string(), &self.cfg);
        links.insert(target, (addr.to_string(), l.clone()));
        l
    }

    /// openraft's network factory for `group`.
    pub fn factory(&self, group: GroupId) -> NetworkFactory {
        NetworkFactory {
            group,
            network: self.clone(),
        }
    }
}

/// openraft's `RaftNetworkFactory` of one group over the shared [`Network`].
#[derive(Clone, Debug)]
pub struct NetworkFactory {
    group: GroupId,
    network: Network,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = GroupClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> GroupClient {
        GroupClient {
            group: self.group,
            target,
            link: self.network.link(target, &node.addr),
        }
    }
}

/// One group's client of one peer: a handle on the shared link.
#[derive(Clone, Debug)]
pub struct GroupClient {
    group: GroupId,
    target: NodeId,
    link: Arc<PeerLink>,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

impl GroupClient {
    async fn call(&self, body: RaftRequest, ttl: Duration) -> Result<RaftResponse, TransportError> {
        match self.link.call(self.group, body, ttl).await? {
            RaftResponse::Unavailable { reason } => Err(TransportError::Unavailable {
                target: self.target,
                reason,
            }),
            other => Ok(other),
        }
    }

    fn wrong(&self, asked: &'static str) -> TransportError {
        TransportError::WrongResponse {
            target: self.target,
            asked,
        }
    }
}

fn unreachable<E: std::error::Error>(e: TransportError) -> RPCError<NodeId, BasicNode, E> {
    match e {
        // Our own frame could not be built: retrying will not help, but
        // openraft has no better bucket than a network error for it.
        TransportError::Encode(_) | TransportError::WrongResponse { .. } => {
            RPCError::Network(NetworkError::new(&e))
        }
        _ => RPCError::Unreachable(Unreachable::new(&e)),
    }
}

impl RaftNetwork<TypeConfig> for GroupClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        match self
            .call(RaftRequest::AppendEntries(rpc), option.hard_ttl())
            .await
            .map_err(unreachable)?
        {
            RaftResponse::AppendEntries(r) => Ok(r),
            _ => Err(unreachable(self.wrong("AppendEntries"))),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        match self
            .call(RaftRequest::InstallSnapshot(rpc), option.hard_ttl())
            .await
            .map_err(unreachable)?
        {
            RaftResponse::InstallSnapshot(r) => Ok(r),
            _ => Err(unreachable(self.wrong("InstallSnapshot"))),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        match self
            .call(RaftRequest::Vote(rpc), option.hard_ttl())
            .await
            .map_err(unreachable)?
        {
            RaftResponse::Vote(r) => Ok(r),
            _ => Err(unreachable(self.wrong("Vote"))),
        }
    }
}

/// A [`GroupDispatch`] over the `Raft` handles this node hosts.
#[derive(Clone, Default)]
pub struct RaftRegistry {
    groups: Arc<Mutex<HashMap<GroupId, openraft::Raft<TypeConfig>>>>,
}

impl std::fmt::Debug for RaftRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftRegistry").finish_non_exhaustive()
    }
}

impl RaftRegistry {
    /// Hosts `raft` as `group`.
    pub fn insert(&self, group: GroupId, raft: openraft::Raft<TypeConfig>) {
        link::lock(&self.groups).insert(group, raft);
    }

    /// The handle of `group`, if hosted.
    pub fn get(&self, group: GroupId) -> Option<openraft::Raft<TypeConfig>> {
        link::lock(&self.groups).get(&group).cloned()
    }

    /// Every hosted group.
    pub fn all(&self) -> Vec<(GroupId, openraft::Raft<TypeConfig>)> {
        link::lock(&self.groups)
            .iter()
            .map(|(g, r)| (*g, r.clone()))
            .collect()
    }
}

impl GroupDispatch for RaftRegistry {
    fn dispatch(&self, group: GroupId, request: RaftRequest) -> BoxFuture<RaftResponse> {
        let raft = self.get(group);
        Box::pin(async move {
            let Some(raft) = raft else {
                return RaftResponse::Unavailable {
                    reason: format!("group {} is not hosted here", group.0),
                };
            };
            let unavailable = |e: &dyn std::fmt::Display| RaftResponse::Unavailable {
                reason: e.to_string(),
            };
            match request {
                RaftRequest::AppendEntries(r) => match raft.append_entries(r).await {
                    Ok(a) => RaftResponse::AppendEntries(a),
                    Err(e) => unavailable(&e),
                },
                RaftRequest::Vote(r) => match raft.vote(r).await {
                    Ok(a) => RaftResponse::Vote(a),
                    Err(e) => unavailable(&e),
                },
                RaftRequest::InstallSnapshot(r) => match raft.install_snapshot(r).await {
                    Ok(a) => RaftResponse::InstallSnapshot(a),
                    Err(e) => unavailable(&e),
                },
            }
        })
    }
}

#[cfg(test)]
mod tests;
