//! The controller group on three in-process openraft instances over the
//! crate's own transport on 127.0.0.1, each with its Raft log on the
//! partition log storage (`LogStore` over the reserved `__controller`
//! topic of the node's own log) and its local topology in its own log.
//!
//! Bounded: every wait has a timeout and each test a hard deadline.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fissionlog::{HashRange, Log, LogOptions, TopicConfig, TopologyCommand};
use fissionlog_raft::controller::{
    ControllerAnswer, ControllerCommand, ControllerResponse, ControllerState,
    ControllerStateMachine, GroupEvent, OutputSink, ReplicaPlacement, CONTROLLER_TOPIC,
};
use fissionlog_raft::mem_log::MemLogStore;
use fissionlog_raft::network::{Network, NetworkConfig, RaftRegistry, Server};
use fissionlog_raft::node::raft_config;
use fissionlog_raft::{CommandResponse, GroupId, LogStore, NodeId, TypeConfig};
use openraft::{BasicNode, Raft};
use tokio::net::TcpListener;

const DEADLINE: Duration = Duration::from_secs(90);
const WAIT: Duration = Duration::from_secs(20);

#[derive(Default)]
struct Outputs(Mutex<Vec<(u64, ControllerResponse)>>);

impl OutputSink for Outputs {
    fn applied(&self, index: u64, response: &ControllerResponse) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((index, response.clone()));
    }
}

impl Outputs {
    fn all(&self) -> Vec<(u64, ControllerResponse)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn replicated(partitions: u32) -> TopicConfig {
    let mut cfg = TopicConfig {
        partitions,
        replicated: true,
        ..TopicConfig::default()
    };
    cfg.balance.enabled = false;
    cfg.balance.max_partitions = 64;
    cfg
}

/// One running controller replica.
struct Replica {
    raft: Raft<TypeConfig>,
    sm: ControllerStateMachine,
    outputs: Arc<Outputs>,
    _server: Server,
    /// The node's log, holding the controller's Raft log: kept open for
    /// as long as the replica runs (a dropped `Log` closes).
    _log: Option<Log>,
}

/// Where a replica keeps the controller's Raft log.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RaftLog {
    /// `LogStore` over the reserved topic of the node's own log (durable).
    Partition,
    /// The in-memory `MemLogStore` (a node whose storage starts empty).
    Memory,
}

struct Node {
    id: NodeId,
    addr: String,
    dir: PathBuf,
    running: Option<Replica>,
}

async fn start_replica(
    id: NodeId,
    dir: &Path,
    listener: TcpListener,
    config: openraft::Config,
    raft_log: RaftLog,
) -> Replica {
    let outputs = Arc::new(Outputs::default());
    let sm = ControllerStateMachine::open(&dir.join("controller"), outputs.clone()).unwrap();
    let network = Network::new(id, NetworkConfig::default());
    let config = Arc::new(config.validate().unwrap());
    let factory = network.factory(GroupId::CONTROLLER);
    let (raft, log) = match raft_log {
        RaftLog::Partition => {
            let log = Log::open(dir.join("data"), LogOptions::default()).unwrap();
            let topic = match log.topic(CONTROLLER_TOPIC) {
                Ok(t) => t,
                Err(_) => log.create_topic(CONTROLLER_TOPIC, replicated(1)).unwrap(),
            };
            let store = LogStore::open(topic, 0).unwrap();
            let raft = Raft::new(id, config, factory, store, sm.clone()).await;
            (raft.unwrap(), Some(log))
        }
        RaftLog::Memory => {
            let raft = Raft::new(id, config, factory, MemLogStore::new(), sm.clone()).await;
            (raft.unwrap(), None)
        }
    };
    let registry = RaftRegistry::default();
    registry.insert(GroupId::CONTROLLER, raft.clone());
    let server =
        Server::start(listener, NetworkConfig::default(), Arc::new(registry), None).unwrap();
    Replica {
        raft,
        sm,
        outputs,
        _server: server,
        _log: log,
    }
}

struct Cluster {
    nodes: Vec<Node>,
    config: openraft::Config,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Cluster {
        Cluster::start_with(raft_config()).await
    }

    async fn start_with(config: openraft::Config) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = Vec::new();
        for id in 1..=3u64 {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let ndir = dir.path().join(format!("n{id}"));
            let replica =
                start_replica(id, &ndir, listener, config.clone(), RaftLog::Partition).await;
            nodes.push(Node {
                id,
                addr,
                dir: ndir,
                running: Some(replica),
            });
        }
        let members: BTreeMap<NodeId, BasicNode> = nodes
            .iter()
            .map(|n| (n.id, BasicNode::new(n.addr.clone())))
            .collect();
        nodes[0].replica().raft.initialize(members).await.unwrap();
        Cluster {
            nodes,
            config,
            _dir: dir,
        }
    }

    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[(id - 1) as usize]
    }

    /// The current leader, once one is known to a running node.
    async fn leader(&self) -> NodeId {
        let until = tokio::time::Instant::now() + WAIT;
        loop {
            for n in self.nodes.iter().filter(|n| n.running.is_some()) {
                let m = n.replica().raft.metrics().borrow().clone();
                if m.current_leader == Some(n.id) {
                    return n.id;
                }
            }
            assert!(tokio::time::Instant::now() < until, "no leader elected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Commits `cmd` through the leader; its answer and Raft index.
    async fn propose(&self, cmd: &ControllerCommand) -> (u64, ControllerResponse) {
        let until = tokio::time::Instant::now() + WAIT;
        loop {
            let leader = self.leader().await;
            let entry = cmd.to_entry(0).unwrap();
            match self.node(leader).replica().raft.client_write(entry).await {
                Ok(r) => match r.data {
                    CommandResponse::Controller(resp) => return (r.log_id.index, *resp),
                    other => panic!("not a controller answer: {other:?}"),
                },
                Err(e) => {
                    assert!(tokio::time::Instant::now() < until, "write failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Waits until every running node applied `index`.
    async fn applied_everywhere(&self, index: u64) {
        for n in self.nodes.iter().filter(|n| n.running.is_some()) {
            n.replica()
                .raft
                .wait(Some(WAIT))
                .applied_index_at_least(Some(index), "catch up")
                .await
                .unwrap_or_else(|e| {
                    let m = n.replica().raft.metrics().borrow().clone();
                    panic!("node {} did not apply {index}: {e}: {m:?}", n.id)
                });
        }
    }

    fn states(&self) -> Vec<ControllerState> {
        self.nodes
            .iter()
            .filter_map(|n| n.running.as_ref())
            .map(|r| r.sm.with_state(Clone::clone).unwrap())
            .collect()
    }

    /// The active partitions of `topic` in each running node's local log.
    fn local_active(&self, topic: &str) -> Vec<Vec<u32>> {
        self.nodes
            .iter()
            .filter_map(|n| n.running.as_ref())
            .map(|r| {
                r.sm.with_local_log(|l| l.topic(topic).unwrap().active_partitions())
                    .unwrap()
            })
            .collect()
    }

    /// Checks every running node's local topology against its state.
    fn check_local_topologies(&self, topic: &str) {
        for n in self.nodes.iter().filter(|n| n.running.is_some()) {
            let r = n.replica();
            let state = r.sm.with_state(Clone::clone).unwrap();
            r.sm.with_local_log(|l| state.check_topic(l, topic))
                .unwrap()
                .unwrap_or_else(|e| panic!("node {}: {e}", n.id));
        }
    }

    async fn stop(&mut self, id: NodeId) {
        let n = &mut self.nodes[(id - 1) as usize];
        if let Some(r) = n.running.take() {
            r.raft.shutdown().await.unwrap();
            r._server.shutdown();
        }
        // Let the storage tasks finish and the log's lock go.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    async fn restart(&mut self, id: NodeId) {
        self.restart_on(id, RaftLog::Partition).await;
    }

    /// Restarts `id` with nothing of what it had: an empty directory and
    /// an in-memory Raft log (a replacement node with the same id).
    async fn restart_fresh(&mut self, id: NodeId) {
        let n = &self.nodes[(id - 1) as usize];
        std::fs::remove_dir_all(&n.dir).unwrap();
        self.restart_on(id, RaftLog::Memory).await;
    }

    async fn restart_on(&mut self, id: NodeId, raft_log: RaftLog) {
        let n = &mut self.nodes[(id - 1) as usize];
        let until = tokio::time::Instant::now() + WAIT;
        let listener = loop {
            match TcpListener::bind(&n.addr).await {
                Ok(l) => break l,
                Err(e) => {
                    assert!(
                        tokio::time::Instant::now() < until,
                        "rebind {}: {e}",
                        n.addr
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        n.running = Some(start_replica(id, &n.dir, listener, self.config.clone(), raft_log).await);
    }

    async fn shutdown(&mut self) {
        for id in 1..=3 {
            self.stop(id).await;
        }
    }
}

impl Node {
    fn replica(&self) -> &Replica {
        self.running.as_ref().expect("the node is running")
    }
}

fn create(name: &str, partitions: u32) -> ControllerCommand {
    ControllerCommand::CreateTopic {
        name: name.into(),
        config: replicated(partitions),
        placement: (0..partitions)
            .map(|_| ReplicaPlacement {
                replicas: vec![1, 2, 3],
            })
            .collect(),
        hash_key: [5, 6],
    }
}

fn halves(partition: u32, start: u64, end: u64) -> ControllerCommand {
    let mid = start + (end - start) / 2;
    ControllerCommand::Topology {
        topic: "t".into(),
        command: TopologyCommand::Split {
            partition,
            ranges: vec![
                HashRange { start, end: mid },
                HashRange {
                    start: mid + 1,
                    end,
                },
            ],
        },
    }
}

fn group(now_ms: u64, event: GroupEvent) -> ControllerCommand {
    ControllerCommand::Group {
        group: "g".into(),
        topic: "t".into(),
        now_ms,
        event,
    }
}

fn assert_all_equal<T: PartialEq + std::fmt::Debug>(what: &str, values: &[T]) {
    for v in &values[1..] {
        assert_eq!(v, &values[0], "{what} differs between nodes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_committed_on_the_leader_give_every_node_the_same_state_topology_and_group_outputs(
) {
    tokio::time::timeout(DEADLINE, async {
        let mut c = Cluster::start().await;
        let (_, r) = c.propose(&create("t", 1)).await;
        assert_eq!(r.answer, ControllerAnswer::TopicCreated);
        c.propose(&group(
            0,
            GroupEvent::Join {
                session_timeout_ms: 5000,
            },
        ))
        .await;
        c.propose(&group(
            5,
            GroupEvent::Join {
                session_timeout_ms: 1000,
            },
        ))
        .await;
        let (_, split) = c.propose(&halves(0, 0, u64::MAX)).await;
        let ControllerAnswer::TopologyApplied { placed, .. } = &split.answer else {
            panic!("{split:?}");
        };
        // The parent was led by node 1: its children lead elsewhere, apart.
        let leaders: Vec<_> = placed.iter().filter_map(|(_, p)| p.leader()).collect();
        assert_eq!(leaders, vec![2, 3]);
        // The split reassigned the group: both children stay with the
        // parent's owner.
        assert_eq!(split.assignments.len(), 1);
        let (last, _) = c
            .propose(&group(
                2000,
                GroupEvent::Heartbeat {
                    member: 1,
                    generation: 3,
                },
            ))
            .await;
        c.applied_everywhere(last).await;

        let states = c.states();
        assert_all_equal("the controller state", &states);
        assert_eq!(states[0].topics["t"].partitions.len(), 3);
        assert_all_equal("the local topology", &c.local_active("t"));
        assert_eq!(c.local_active("t")[0], vec![1, 2]);
        c.check_local_topologies("t");
        // The coordinator's outputs: the same on every replica, member 2
        // expired at the heartbeat at 2000 on all of them.
        let outputs: Vec<_> = c.nodes.iter().map(|n| n.replica().outputs.all()).collect();
        assert_all_equal("the outputs", &outputs);
        assert_eq!(outputs[0].len(), 5);
        let expired = &outputs[0][4].1.assignments;
        assert_eq!(expired.len(), 1, "{expired:?}");
        assert_eq!(expired[0].fenced, vec![2]);
        assert_eq!(expired[0].owners, vec![(1, vec![0, 1, 2])]);
        c.shutdown().await;
    })
    .await
    .expect("the test's deadline");
}

/// A node that is not the leader.
async fn a_follower(c: &Cluster) -> NodeId {
    let leader = c.leader().await;
    if leader == 3 {
        2
    } else {
        3
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_replays_its_own_log_and_catches_up_on_what_it_missed() {
    tokio::time::timeout(DEADLINE, async {
        let mut c = Cluster::start().await;
        c.propose(&create("t", 1)).await;
        let (i, _) = c.propose(&halves(0, 0, u64::MAX)).await;
        c.applied_everywhere(i).await;
        let down = a_follower(&c).await;
        c.stop(down).await;
        c.propose(&halves(1, 0, u64::MAX / 2)).await;
        let (last, _) = c
            .propose(&group(
                0,
                GroupEvent::Join {
                    session_timeout_ms: 1000,
                },
            ))
            .await;
        c.restart(down).await;
        c.applied_everywhere(last).await;
        assert_all_equal("the controller state", &c.states());
        assert_all_equal("the local topology", &c.local_active("t"));
        assert_eq!(c.local_active("t")[0], vec![3, 4, 2]);
        c.check_local_topologies("t");
        c.shutdown().await;
    })
    .await
    .expect("the test's deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_node_behind_the_leader_s_purged_log_catches_up_from_a_snapshot() {
    tokio::time::timeout(DEADLINE, async {
        let config = openraft::Config {
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(2),
            max_in_snapshot_log_to_keep: 0,
            purge_batch_size: 1,
            ..raft_config()
        };
        let mut c = Cluster::start_with(config).await;
        c.propose(&create("t", 1)).await;
        let down = a_follower(&c).await;
        c.stop(down).await;
        c.propose(&halves(0, 0, u64::MAX)).await;
        c.propose(&group(
            0,
            GroupEvent::Join {
                session_timeout_ms: 1000,
            },
        ))
        .await;
        let (last, _) = c.propose(&halves(1, 0, u64::MAX / 2)).await;
        c.applied_everywhere(last).await;
        // Every running node snapshots (the policy: every two entries)
        // and purges what its snapshot covers: the entries the stopped
        // node missed are gone from every log.
        for n in c.nodes.iter().filter(|n| n.running.is_some()) {
            n.replica()
                .raft
                .wait(Some(WAIT))
                .metrics(
                    |m| m.purged.is_some_and(|p| p.index >= 3),
                    "snapshot built and log purged",
                )
                .await
                .unwrap_or_else(|e| panic!("node {}: {e}", n.id));
        }
        // It comes back with nothing: an empty directory, and its Raft log
        // in memory (a replica on the partition log storage cannot take
        // entries past a snapshot installed beyond its own last entry yet:
        // docs/REPLICATION.md, "The controller").
        c.restart_fresh(down).await;
        c.applied_everywhere(last).await;
        let m = c.node(down).replica().raft.metrics().borrow().clone();
        assert!(
            m.snapshot.is_some_and(|s| s.index >= 3),
            "node {down} caught up from a snapshot: {m:?}"
        );
        assert_all_equal("the controller state", &c.states());
        assert_all_equal("the local topology", &c.local_active("t"));
        c.check_local_topologies("t");
        // And the next command applies on it like everywhere else.
        let (next, _) = c.propose(&halves(2, u64::MAX / 2 + 1, u64::MAX)).await;
        c.applied_everywhere(next).await;
        assert_all_equal("the controller state", &c.states());
        assert_all_equal("the local topology", &c.local_active("t"));
        c.shutdown().await;
    })
    .await
    .expect("the test's deadline");
}
