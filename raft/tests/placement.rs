//! The controller hosted by the nodes: three node processes started with
//! `--controller`, the controller group initialised over them, a topic
//! created through it, and its partitions' Raft groups started by the
//! nodes the controller placed them on (the preferred leader initialising
//! each). Appends with `acks=quorum` to each partition's group, committed
//! reads from each replica, and a SIGKILLed replica restarted on its
//! directory hosting the same groups again and catching up.
//!
//! Bounded: a 90 s deadline, every wait inside it limited and saying what
//! did not happen, and every node killed when the test's handles drop.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fissionlog::TopicConfig;
use fissionlog_raft::client::{ClientCall, ClientReply, NodeClient, PartitionRoute};
use fissionlog_raft::controller::{ControllerAnswer, ControllerCommand, ReplicaPlacement};
use fissionlog_raft::types::{CommandResponse, GroupId, NodeId, ProducerStamp, RecordIn};

use common::cluster::{call, read_all_of, run_within, NodeProc, CALL_TIMEOUT};

const DEADLINE: Duration = Duration::from_secs(90);
/// How long one wait inside the test may take.
const WAIT_LIMIT: Duration = Duration::from_secs(20);

/// The placement of the topic's three partitions: the preferred leaders
/// spread over the nodes, partition 0 on all three, the others on two.
fn placement() -> Vec<Vec<NodeId>> {
    vec![vec![1, 2, 3], vec![2, 3], vec![3, 1]]
}

fn controller_args() -> Vec<String> {
    // The controller places every partition group; none from the
    // command line.
    ["--controller", "--groups", "0"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

struct Nodes {
    procs: Vec<NodeProc>,
}

impl Nodes {
    fn addr(&self, id: NodeId) -> String {
        self.proc(id).addr.clone()
    }

    fn proc(&self, id: NodeId) -> &NodeProc {
        self.procs.iter().find(|n| n.id == id).expect("a node")
    }

    fn proc_mut(&mut self, id: NodeId) -> &mut NodeProc {
        self.procs.iter_mut().find(|n| n.id == id).expect("a node")
    }

    /// Calls node `id`, retrying a call that got no answer until the wait
    /// limit.
    async fn ask(&self, id: NodeId, what: &ClientCall) -> ClientReply {
        let started = Instant::now();
        loop {
            if let Some(r) = call(&self.addr(id), what.clone()).await {
                return r;
            }
            assert!(
                started.elapsed() < WAIT_LIMIT,
                "node {id} answered {what:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Proposes `cmd` to the controller, following `NotLeader` hints.
    async fn propose(&self, cmd: ControllerCommand) -> ControllerAnswer {
        let started = Instant::now();
        let mut target = 1;
        loop {
            let reply = call(
                &self.addr(target),
                ClientCall::Controller(Box::new(cmd.clone())),
            )
            .await;
            match reply {
                Some(ClientReply::Applied(CommandResponse::Controller(r))) => return r.answer,
                Some(ClientReply::NotLeader {
                    leader: Some(l), ..
                }) => target = l,
                _ => target = target % 3 + 1,
            }
            assert!(
                started.elapsed() < WAIT_LIMIT,
                "the controller took {cmd:?} (last answer {reply:?})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Appends `value` to `group` with `acks=quorum` as producer
    /// `producer` at `seq`, starting at `first` and following `NotLeader`
    /// hints among `alive`; the offset it got. A retry carries the same
    /// stamp, so a lost answer does not append twice.
    async fn append(
        &self,
        group: GroupId,
        alive: &[NodeId],
        first: NodeId,
        producer: u64,
        seq: u64,
        value: &str,
    ) -> (u64, NodeId) {
        let started = Instant::now();
        let mut target = first;
        let call_for = ClientCall::Append {
            group,
            producer: Some(ProducerStamp {
                producer_id: producer,
                epoch: 0,
                first_sequence: seq,
            }),
            records: vec![RecordIn {
                key: None,
                value: value.as_bytes().to_vec(),
                timestamp_ms: 0,
            }],
        };
        loop {
            let reply = match NodeClient::connect(&self.addr(target), CALL_TIMEOUT).await {
                Ok(mut c) => c.call(call_for.clone(), CALL_TIMEOUT).await.ok(),
                Err(_) => None,
            };
            match reply {
                Some(ClientReply::Applied(
                    CommandResponse::Appended { base_offset, .. }
                    | CommandResponse::Duplicate { base_offset, .. },
                )) => return (base_offset, target),
                Some(ClientReply::NotLeader {
                    leader: Some(l), ..
                }) if alive.contains(&l) => target = l,
                _ => {
                    let i = alive.iter().position(|&n| n == target).unwrap_or(0);
                    target = alive[(i + 1) % alive.len()];
                }
            }
            assert!(
                started.elapsed() < WAIT_LIMIT,
                "group {} took {value} (last answer {reply:?})",
                group.0
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every node of `replicas` reads exactly `values` from
    /// `group`, committed.
    async fn wait_committed(&self, group: GroupId, replicas: &[NodeId], values: &[String]) {
        let started = Instant::now();
        loop {
            let mut seen = BTreeMap::new();
            for &id in replicas {
                let got = read_all_of(&self.addr(id), group)
                    .await
                    .map(|(records, _)| {
                        records
                            .into_iter()
                            .map(|r| String::from_utf8_lossy(&r.value).into_owned())
                            .collect::<Vec<_>>()
                    });
                seen.insert(id, got);
            }
            if seen.values().all(|v| v.as_deref() == Some(values)) {
                return;
            }
            assert!(
                started.elapsed() < WAIT_LIMIT,
                "replicas of group {} read {values:?} committed; they read {seen:?}",
                group.0
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until node `id` hosts `group` and names a leader for it.
    async fn wait_hosted(&self, id: NodeId, group: GroupId) -> NodeId {
        let started = Instant::now();
        loop {
            let reply = self.ask(id, &ClientCall::Status { group }).await;
            if let ClientReply::Status {
                leader: Some(l), ..
            } = reply
            {
                return l;
            }
            assert!(
                started.elapsed() < WAIT_LIMIT,
                "node {id} hosts group {} with a leader (it answers {reply:?})",
                group.0
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn assert_not_hosted(&self, id: NodeId, group: GroupId) {
        let reply = self.ask(id, &ClientCall::Status { group }).await;
        assert!(
            matches!(&reply, ClientReply::Failed { reason } if reason.contains("not hosted")),
            "node {id} is not a replica of group {}, it answers {reply:?}",
            group.0
        );
    }
}

fn topic_config(partitions: u32) -> TopicConfig {
    let mut cfg = TopicConfig {
        partitions,
        replicated: true,
        ..TopicConfig::default()
    };
    cfg.balance.enabled = false;
    cfg
}

#[test]
fn a_topic_created_through_the_controller_becomes_raft_groups_on_its_placed_nodes() {
    run_within(DEADLINE, async {
        let mut nodes = Nodes {
            procs: (1..=3)
                .map(|id| NodeProc::start_with(id, controller_args()))
                .collect(),
        };
        let members: Vec<(NodeId, String)> = (1..=3).map(|id| (id, nodes.addr(id))).collect();
        let init = nodes
            .ask(
                1,
                &ClientCall::Initialize {
                    group: GroupId::CONTROLLER,
                    members,
                },
            )
            .await;
        assert_eq!(init, ClientReply::Initialized);

        let answer = nodes
            .propose(ControllerCommand::CreateTopic {
                name: "orders".into(),
                config: topic_config(3),
                placement: placement()
                    .into_iter()
                    .map(|replicas| ReplicaPlacement { replicas })
                    .collect(),
                hash_key: [3, 4],
            })
            .await;
        assert_eq!(answer, ControllerAnswer::TopicCreated);

        // The first topic takes id 1: its partitions are groups (1, p),
        // as every controller replica says once it applied the create.
        let want: Vec<PartitionRoute> = placement()
            .into_iter()
            .enumerate()
            .map(|(p, replicas)| PartitionRoute {
                partition: p as u32,
                group: GroupId::partition(1, p as u32),
                replicas,
                active: true,
            })
            .collect();
        for id in 1..=3 {
            let started = Instant::now();
            loop {
                let reply = nodes
                    .ask(
                        id,
                        &ClientCall::Topic {
                            name: "orders".into(),
                        },
                    )
                    .await;
                if let ClientReply::Topic {
                    id: topic,
                    partitions,
                } = &reply
                {
                    assert_eq!(*topic, 1);
                    assert_eq!(partitions, &want, "node {id}'s routes");
                    break;
                }
                assert!(
                    started.elapsed() < WAIT_LIMIT,
                    "node {id} knows the topic (it answers {reply:?})"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }

        // Each group runs on its placed replicas only, led by the
        // preferred leader (the one that initialised it, and the only
        // node that could campaign before its membership spread).
        for route in &want {
            for id in 1..=3 {
                if route.replicas.contains(&id) {
                    let leader = nodes.wait_hosted(id, route.group).await;
                    assert_eq!(
                        leader, route.replicas[0],
                        "group {} is led by its preferred leader",
                        route.group.0
                    );
                } else {
                    nodes.assert_not_hosted(id, route.group).await;
                }
            }
        }

        // Appends with acks=quorum to each group, read back committed on
        // each of its replicas.
        let mut written: Vec<Vec<String>> = vec![Vec::new(); want.len()];
        let mut seqs = vec![0u64; want.len()];
        let all = [1, 2, 3];
        for round in 0..5 {
            for (p, route) in want.iter().enumerate() {
                let value = format!("p{p}:{round}");
                let (offset, _) = nodes
                    .append(route.group, &all, 1, p as u64 + 1, seqs[p], &value)
                    .await;
                assert_eq!(offset, written[p].len() as u64, "{value}'s offset");
                seqs[p] += 1;
                written[p].push(value);
            }
        }
        for (p, route) in want.iter().enumerate() {
            nodes
                .wait_committed(route.group, &route.replicas, &written[p])
                .await;
        }

        // Node 1 SIGKILLed: partition 0 (three replicas) keeps a quorum
        // on nodes 2 and 3, partition 1 does not involve node 1, and
        // partition 2 (nodes 3 and 1) waits for it.
        nodes.proc_mut(1).kill();
        let alive = [2, 3];
        for round in 5..10 {
            for p in [0, 1] {
                let value = format!("p{p}:{round}");
                let (offset, by) = nodes
                    .append(want[p].group, &alive, 2, p as u64 + 1, seqs[p], &value)
                    .await;
                assert_ne!(by, 1);
                assert_eq!(offset, written[p].len() as u64, "{value}'s offset");
                seqs[p] += 1;
                written[p].push(value);
            }
        }

        // Restarted on its directory: it hosts the groups placed on it
        // again (from the controller's state as its log is applied), not
        // the one it is no replica of, and catches up.
        nodes.proc_mut(1).restart();
        nodes.wait_hosted(1, want[0].group).await;
        nodes.wait_hosted(1, want[2].group).await;
        nodes.assert_not_hosted(1, want[1].group).await;
        nodes
            .wait_committed(want[0].group, &[1, 2, 3], &written[0])
            .await;
        nodes
            .wait_committed(want[2].group, &[3, 1], &written[2])
            .await;
        // Partition 2 takes appends again now that both replicas run.
        let value = "p2:10".to_string();
        let (offset, _) = nodes
            .append(want[2].group, &all, 3, 3, seqs[2], &value)
            .await;
        assert_eq!(offset, written[2].len() as u64);
        written[2].push(value);
        for (p, route) in want.iter().enumerate() {
            nodes
                .wait_committed(route.group, &route.replicas, &written[p])
                .await;
        }
    });
}
