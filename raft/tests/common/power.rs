//! One cluster node in this process on the library's per-file crash model,
//! and the check of its power-loss images against what it had promised.
//! Shared by the power-loss tests; each declares the crash model's modules
//! (`crash`, `durable`, `model_hook`) at its root.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fissionlog::{IoOp, Log, LogOptions};
use fissionlog_raft::log_store::LogStore;
use fissionlog_raft::network::{Network, NetworkConfig, Server};
use fissionlog_raft::node::{Node, NodeOptions, NodeStorage};
use fissionlog_raft::types::{Command, NodeId};
use fissionlog_raft::vote::{DirLock, StdVoteIo, VoteIo};
use openraft::storage::RaftLogStorage;
use openraft::{EntryPayload, LogId, RaftLogReader, ServerState, Vote};
use tokio::net::TcpListener;

use crate::common::cluster::{lock, Ack, GROUP};
use crate::crash::CrashOptions;
use crate::model_hook::{CrashPoint, ModelHook};

/// How long a wait inside a case may take before it fails saying what did
/// not happen.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);
/// A group's segment size here: the model reads a whole file at each of
/// its fsyncs.
pub const SEGMENT_BYTES: u64 = 1 << 20;

/// The group's own files of one node, on the real file system, with their
/// fsyncs reported to the node's model; every call fails once its power
/// is off.
#[derive(Debug)]
pub struct ModelFiles {
    pub hook: Arc<ModelHook>,
    /// Syncs of a file of this name are not made durable in the model.
    pub ignore: Option<&'static str>,
    pub off: AtomicBool,
}

impl ModelFiles {
    fn powered(&self) -> io::Result<()> {
        if self.off.load(Ordering::SeqCst) {
            Err(io::Error::other("power lost"))
        } else {
            Ok(())
        }
    }

    fn ignored(&self, path: &Path) -> bool {
        self.ignore
            .is_some_and(|n| path.file_name().is_some_and(|f| f == n))
    }
}

impl VoteIo for ModelFiles {
    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.powered()?;
        StdVoteIo.write_file(path, bytes)
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        self.powered()?;
        self.hook
            .sync_outside(path, self.ignored(path), || StdVoteIo.sync_file(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.powered()?;
        StdVoteIo.rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.powered()?;
        self.hook
            .sync_outside(dir, false, || StdVoteIo.sync_dir(dir))
    }

    fn read_file(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        StdVoteIo.read_file(path)
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        StdVoteIo.lock_dir(dir)
    }

    fn sync_held(&self, file: &File, path: &Path) -> io::Result<()> {
        self.powered()?;
        self.hook
            .sync_outside(path, self.ignored(path), || StdVoteIo.sync_held(file, path))
    }
}

/// One node of the cluster, in this process.
pub struct Member {
    pub id: NodeId,
    pub addr: String,
    pub node: Node,
    pub server: Server,
    /// The model its storage runs on (none once restarted on an image).
    pub model: Option<(Arc<ModelHook>, Arc<ModelFiles>)>,
}

impl Member {
    pub async fn start(
        id: NodeId,
        dir: &Path,
        listener: TcpListener,
        peers: BTreeMap<NodeId, String>,
        model: Option<(Option<IoOp>, Option<&'static str>)>,
    ) -> Member {
        std::fs::create_dir_all(dir).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (storage, model) = if let Some((drop_op, ignore)) = model {
            let hook = ModelHook::new(dir, drop_op);
            let log = Log::open_with_hook(dir, LogOptions::default(), hook.clone()).unwrap();
            let files = Arc::new(ModelFiles {
                hook: hook.clone(),
                ignore,
                off: AtomicBool::new(false),
            });
            let storage = NodeStorage {
                file_io: files.clone(),
                ..NodeStorage::new(log)
            };
            (storage, Some((hook, files)))
        } else {
            let log = Log::open(dir, LogOptions::default()).unwrap();
            (NodeStorage::new(log), None)
        };
        let storage = NodeStorage {
            segment_bytes: SEGMENT_BYTES,
            ..storage
        };
        let cfg = NetworkConfig::default();
        let network = Network::new(id, cfg.clone());
        let node = Node::start_on(
            id,
            dir,
            storage,
            &[GROUP],
            peers,
            &network,
            NodeOptions::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("node {id} starts on {}: {e}", dir.display()));
        let server = Server::start(
            listener,
            cfg,
            Arc::new(node.registry()),
            Some(Arc::new(node.clone())),
        )
        .unwrap();
        Member {
            id,
            addr,
            node,
            server,
            model,
        }
    }

    pub fn raft(&self) -> openraft::Raft<fissionlog_raft::types::TypeConfig> {
        self.node
            .registry()
            .get(GROUP)
            .expect("the group is hosted")
    }

    pub async fn stop(self) {
        self.server.shutdown();
        self.node.shutdown().await;
    }
}

/// What the node that lost power had promised, read from the cluster just
/// before the power went: the last log id the leader counted as durable
/// on it, and its vote.
#[derive(Debug, Clone, Copy)]
pub struct Promised {
    pub matched: Option<LogId<NodeId>>,
    pub vote: Vote<NodeId>,
}

/// Checks one power-loss image of the node's directory against what it
/// promised: opens the log there as a restart would, and reads the vote
/// and the entry at the matched log id through the group's `LogStore`.
pub async fn check_image(dir: &Path, promised: Promised) -> Result<(), String> {
    let log = Log::open(dir, LogOptions::default()).map_err(|e| format!("the log opens: {e}"))?;
    let topic = log
        .topic(&format!("group-{}", GROUP.0))
        .map_err(|e| format!("the group's topic is there: {e}"))?;
    let mut store = LogStore::open(topic, 0).map_err(|e| format!("the store opens: {e}"))?;
    let vote = store
        .read_vote()
        .await
        .map_err(|e| format!("the vote reads: {e}"))?;
    if vote.is_none_or(|v| v < promised.vote) {
        return Err(format!(
            "the vote went back: {vote:?}, it held {:?}",
            promised.vote
        ));
    }
    if let Some(m) = promised.matched {
        let entries = store
            .try_get_log_entries(0..=m.index)
            .await
            .map_err(|e| format!("the entries read: {e}"))?;
        match entries.last() {
            Some(last) if last.log_id == m && entries.len() as u64 == m.index + 1 => {}
            last => {
                return Err(format!(
                    "the log lost what the leader counted as durable: it reaches {:?} \
                     ({} entries), the leader had {m:?}",
                    last.map(|e| e.log_id),
                    entries.len()
                ))
            }
        }
        for e in &entries {
            if let EntryPayload::Normal(Command::Append { producer: None, .. }) = &e.payload {
                return Err(format!("entry {:?} lost its producer stamp", e.log_id));
            }
        }
    }
    drop(store);
    log.close().map_err(|e| format!("the log closes: {e}"))?;
    Ok(())
}

/// The outcome of each image's check, by seed (`seeds` images made with
/// `opts`, written under `root` as `image-<seed>`).
pub fn check_images(
    point: &CrashPoint,
    promised: Promised,
    root: &Path,
    seeds: u64,
    opts: &CrashOptions,
) -> Vec<Result<(), String>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    (0..seeds)
        .map(|seed| {
            let (image, _) = point.image(seed, opts);
            let dir = root.join(format!("image-{seed}"));
            std::fs::create_dir_all(&dir).unwrap();
            image.write_to(&dir).unwrap();
            runtime.block_on(check_image(&dir, promised))
        })
        .collect()
}

/// Starts nodes 1–3 on 127.0.0.1, each in `root/node-<id>` on the crash
/// model (`model` as in [`Member::start`]); returns them and their
/// addresses.
pub async fn start_three(
    root: &Path,
    model: (Option<IoOp>, Option<&'static str>),
) -> (Vec<Member>, BTreeMap<NodeId, String>) {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let peers: BTreeMap<NodeId, String> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| (i as NodeId + 1, l.local_addr().unwrap().to_string()))
        .collect();
    let mut members = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let id = i as NodeId + 1;
        let dir = root.join(format!("node-{id}"));
        members.push(Member::start(id, &dir, l, peers.clone(), Some(model)).await);
    }
    (members, peers)
}

pub async fn wait_acks(acks: &Mutex<Vec<Ack>>, count: usize) {
    let started = Instant::now();
    while lock(acks).len() < count {
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "{count} appends were acknowledged (only {})",
            lock(acks).len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The leader and a follower that both see it as leader and the follower
/// as matched past `min_index`.
pub async fn leader_and_follower(members: &[Member], min_index: u64) -> (usize, usize) {
    let started = Instant::now();
    loop {
        for (l, m) in members.iter().enumerate() {
            let metrics = m.raft().metrics().borrow().clone();
            if metrics.state != ServerState::Leader {
                continue;
            }
            let Some(replication) = metrics.replication.as_ref() else {
                continue;
            };
            if let Some(f) = members.iter().position(|f| {
                f.id != m.id
                    && replication
                        .get(&f.id)
                        .copied()
                        .flatten()
                        .is_some_and(|id| id.index >= min_index)
            }) {
                return (l, f);
            }
        }
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "a leader with a follower matched past index {min_index}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
