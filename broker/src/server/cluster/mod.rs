//! Cluster mode: the broker as a member of a replicated cluster on
//! fissionlog-raft (docs/BROKER.md, "Cluster mode").
//!
//! A [`Cluster`] is a fissionlog-raft [`Node`] hosting the controller
//! group, and with it every partition group the controller places on this
//! node, beside the broker's client listener. Peer traffic shares the
//! client port: the first four bytes of a connection tell them apart (a
//! node-to-node frame's hello is at most [`PEER_HELLO_MAX_LEN`] bytes
//! long, a broker `Hello` frame is longer, a TLS record's first bytes read
//! as a length far over both), so each broker is known by one address,
//! the one in `--peers`, and a Raft leader hint is already the address a
//! client connects to.
//!
//! The client protocol is the same as on a single node; what each
//! request does here is [`handlers`].

pub(crate) mod handlers;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fissionlog_raft::client::{ClientCall, ClientReply, ClientRequest};
use fissionlog_raft::network::{ClientDispatch, Network, NetworkConfig, Server};
use fissionlog_raft::node::{Node, NodeOptions};
use fissionlog_raft::types::{GroupId, NodeId};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// The longest length prefix a node-to-node hello frame has (a version
/// byte and a postcard `Hello`: at most 12 bytes). A broker `Hello` frame
/// is at least 21 bytes long.
pub const PEER_HELLO_MAX_LEN: u32 = 16;

/// How a broker joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This broker's node id.
    pub node_id: NodeId,
    /// Every broker of the cluster (this one included) by node id: the
    /// address each listens on for clients and peers alike.
    pub peers: BTreeMap<NodeId, String>,
}

/// A running cluster member: the Raft node and the server of its peer
/// connections.
pub struct Cluster {
    node_id: NodeId,
    node: Node,
    peers: BTreeMap<NodeId, String>,
    handed: mpsc::Sender<TcpStream>,
    server: Server,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node_id", &self.node_id)
            .field("peers", &self.peers)
            .finish_non_exhaustive()
    }
}

/// What kind of connection came in on the shared port.
pub(crate) enum Incoming {
    /// Another node (or a node client).
    Peer,
    /// A broker client (plain or TLS).
    Client,
    /// Closed or silent before four bytes arrived.
    Gone,
}

impl Cluster {
    /// Starts node `config.node_id` on the log in `dir` (created if
    /// absent), with the controller; `local` is the address the broker
    /// listens on, which must be this node's entry in `config.peers`.
    ///
    /// The broker with the lowest id initialises the controller group
    /// over every peer the first time it starts (its log then holds the
    /// membership, so a restart does not do it again); the others wait to
    /// hear from the controller's leader.
    pub async fn start(
        config: ClusterConfig,
        dir: &Path,
        local: SocketAddr,
    ) -> Result<Arc<Cluster>, String> {
        let me = config.node_id;
        let mut peers = config.peers.clone();
        match peers.get(&me) {
            Some(a) if a != &local.to_string() && !a.ends_with(&format!(":{}", local.port())) => {
                return Err(format!(
                    "--peers names {a} for node {me}, but it listens on {local}"
                ))
            }
            Some(_) => {}
            None => {
                peers.insert(me, local.to_string());
            }
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cfg = NetworkConfig::default();
        let network = Network::new(me, cfg.clone());
        let options = NodeOptions { controller: true };
        let node = Node::start_with(me, dir, &[], peers.clone(), &network, options)
            .await
            .map_err(|e| e.to_string())?;
        let (handed, incoming) = mpsc::channel(64);
        let server = Server::start_handed(
            incoming,
            local,
            cfg,
            Arc::new(node.registry()),
            Some(Arc::new(node.clone())),
        );
        let c = Arc::new(Cluster {
            node_id: me,
            node,
            peers,
            handed,
            server,
        });
        if c.peers.keys().next() == Some(&me) {
            c.bootstrap().await;
        }
        Ok(c)
    }

    /// Initialises the controller group over the peers, unless its log
    /// holds a membership already (a restart).
    async fn bootstrap(&self) {
        let members = self.peers.iter().map(|(id, a)| (*id, a.clone())).collect();
        let reply = self
            .call(ClientCall::Initialize {
                group: GroupId::CONTROLLER,
                members,
            })
            .await;
        match reply {
            ClientReply::Initialized => {
                tracing::info!(peers = ?self.peers, "initialised the controller group")
            }
            other => {
                tracing::info!(answer = ?other, "the controller group was initialised before")
            }
        }
    }

    /// This broker's node id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The brokers of the cluster by node id.
    pub fn peers(&self) -> &BTreeMap<NodeId, String> {
        &self.peers
    }

    /// The node's client call, in process.
    pub(crate) async fn call(&self, call: ClientCall) -> ClientReply {
        self.node
            .call(ClientRequest { call_id: 0, call })
            .await
            .reply
    }

    pub(crate) fn node(&self) -> &Node {
        &self.node
    }

    /// Tells a peer's connection from a client's by its first four
    /// bytes, waiting at most `timeout` for them.
    pub(crate) async fn classify(stream: &TcpStream, timeout: Duration) -> Incoming {
        let peek = async {
            let mut buf = [0u8; 4];
            loop {
                match stream.peek(&mut buf).await {
                    Ok(0) | Err(_) => return Incoming::Gone,
                    Ok(n) if n >= 4 => break,
                    // Part of the prefix: wait for the rest.
                    Ok(_) => tokio::time::sleep(Duration::from_millis(2)).await,
                }
            }
            if u32::from_le_bytes(buf) <= PEER_HELLO_MAX_LEN {
                Incoming::Peer
            } else {
                Incoming::Client
            }
        };
        tokio::time::timeout(timeout, peek)
            .await
            .unwrap_or(Incoming::Gone)
    }

    /// Hands a peer's connection to the node's server.
    pub(crate) async fn hand_over(&self, stream: TcpStream) {
        let _ = self.handed.send(stream).await;
    }

    /// Stops serving peers and stops every group.
    pub async fn shutdown(&self) {
        self.server.shutdown();
        self.node.shutdown().await;
    }
}
