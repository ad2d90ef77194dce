use std::time::Duration;

use super::*;
use crate::network::NetworkConfig;

const G: GroupId = GroupId(0);

/// A one-node group (a single voter needs no peers), initialised and led
/// by node 1.
async fn single_node() -> (Node, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let network = Network::new(1, NetworkConfig::default());
    let peers = BTreeMap::from([(1, "127.0.0.1:9".to_string())]);
    let node = Node::start(1, dir.path(), &[G], peers, &network)
        .await
        .expect("start");
    let init = node
        .handle(ClientCall::Initialize {
            group: G,
            members: Vec::new(),
        })
        .await;
    assert_eq!(init, ClientReply::Initialized);
    for _ in 0..200 {
        if let ClientReply::Status {
            leader: Some(1), ..
        } = node.handle(ClientCall::Status { group: G }).await
        {
            return (node, dir);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("node 1 did not become leader of its own group");
}

fn stamped(seq: u64) -> ClientCall {
    ClientCall::Append {
        group: G,
        producer: Some(ProducerStamp {
            producer_id: 7,
            epoch: 0,
            first_sequence: seq,
        }),
        records: vec![RecordIn {
            key: Some(b"k".to_vec()),
            value: format!("v{seq}").into_bytes(),
            timestamp_ms: 0,
        }],
    }
}

async fn committed(node: &Node) -> Vec<(u64, Vec<u8>)> {
    committed_of(node, G).await
}

/// The committed records of `group` on `node`: (offset, value).
async fn committed_of(node: &Node, group: GroupId) -> Vec<(u64, Vec<u8>)> {
    match node
        .handle(ClientCall::Read {
            group,
            from_offset: 0,
            max_records: 100,
        })
        .await
    {
        ClientReply::Records { records, .. } => {
            records.into_iter().map(|r| (r.offset, r.value)).collect()
        }
        other => panic!("read failed: {other:?}"),
    }
}

fn applied(base_offset: u64) -> ClientReply {
    ClientReply::Applied(CommandResponse::Appended {
        base_offset,
        count: 1,
    })
}

fn duplicate(base_offset: u64) -> ClientReply {
    ClientReply::Applied(CommandResponse::Duplicate {
        base_offset,
        count: 1,
    })
}

#[tokio::test]
async fn status_reports_the_role_and_term_and_a_stopped_group_as_stopped() {
    let (node, _dir) = single_node().await;
    let ClientReply::Status { role, term, .. } = node.handle(ClientCall::Status { group: G }).await
    else {
        panic!("a status answer");
    };
    assert_eq!(role, Role::Leader);
    assert!(term >= 1, "a leader is in a term of at least 1, not {term}");
    node.shutdown().await;
    let after = node.handle(ClientCall::Status { group: G }).await;
    assert!(
        matches!(
            after,
            ClientReply::Status {
                role: Role::Stopped,
                ..
            }
        ),
        "a group shut down reports itself stopped: {after:?}"
    );
}

#[tokio::test]
async fn a_retried_stamped_append_gets_the_first_copys_offset_and_is_not_appended_again() {
    let (node, _dir) = single_node().await;
    assert_eq!(node.handle(stamped(0)).await, applied(0));
    assert_eq!(node.handle(stamped(0)).await, duplicate(0));
    assert_eq!(node.handle(stamped(1)).await, applied(1));
    assert_eq!(
        committed(&node).await,
        vec![(0, b"v0".to_vec()), (1, b"v1".to_vec())]
    );
    node.shutdown().await;
}

#[tokio::test]
async fn concurrent_copies_of_one_stamped_append_all_get_one_offset_and_land_once() {
    let (node, _dir) = single_node().await;
    let copies: Vec<_> = (0..4)
        .map(|_| {
            let node = node.clone();
            tokio::spawn(async move { node.handle(stamped(0)).await })
        })
        .collect();
    let mut first = 0;
    for c in copies {
        match c.await.expect("no panic") {
            ClientReply::Applied(CommandResponse::Appended { base_offset: 0, .. }) => first += 1,
            ClientReply::Applied(CommandResponse::Duplicate { base_offset: 0, .. }) => {}
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert!(first >= 1, "some copy reported the append");
    assert_eq!(committed(&node).await, vec![(0, b"v0".to_vec())]);
    node.shutdown().await;
}

#[tokio::test]
async fn a_sequence_gap_is_refused_before_anything_is_appended() {
    let (node, _dir) = single_node().await;
    assert_eq!(node.handle(stamped(0)).await, applied(0));
    assert_eq!(
        node.handle(stamped(5)).await,
        ClientReply::Applied(CommandResponse::OutOfOrderSequence {
            producer_id: 7,
            expected: 1,
            received: 5
        })
    );
    assert_eq!(committed(&node).await, vec![(0, b"v0".to_vec())]);
    node.shutdown().await;
}

#[tokio::test]
async fn a_node_that_does_not_lead_the_group_answers_not_leader() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let network = Network::new(2, NetworkConfig::default());
    let node = Node::start(2, dir.path(), &[G], BTreeMap::new(), &network)
        .await
        .expect("start");
    assert!(matches!(
        node.handle(stamped(0)).await,
        ClientReply::NotLeader { leader: None, .. }
    ));
    let unstamped = ClientCall::Append {
        group: G,
        producer: None,
        records: vec![RecordIn {
            key: None,
            value: b"x".to_vec(),
            timestamp_ms: 0,
        }],
    };
    assert!(matches!(
        node.handle(unstamped).await,
        ClientReply::NotLeader { .. }
    ));
    node.shutdown().await;
}

#[tokio::test]
async fn a_read_answer_stops_before_it_outgrows_a_frame() {
    let (node, _dir) = single_node().await;
    let big = vec![7u8; MAX_READ_BYTES / 3 + 1];
    for _ in 0..4 {
        let append = ClientCall::Append {
            group: G,
            producer: None,
            records: vec![RecordIn {
                key: None,
                value: big.clone(),
                timestamp_ms: 0,
            }],
        };
        assert!(matches!(
            node.handle(append).await,
            ClientReply::Applied(CommandResponse::Appended { .. })
        ));
    }
    let offsets: Vec<u64> = committed(&node).await.iter().map(|r| r.0).collect();
    assert_eq!(offsets, vec![0, 1]);
    node.shutdown().await;
}

#[tokio::test]
async fn a_read_at_the_committed_end_answers_no_records_and_the_end_instead_of_failing() {
    let (node, _dir) = single_node().await;
    let read_from = |from_offset| ClientCall::Read {
        group: G,
        from_offset,
        max_records: 100,
    };
    // An empty log: its end is 0.
    assert_eq!(
        node.handle(read_from(0)).await,
        ClientReply::Records {
            records: Vec::new(),
            committed_end: 0
        }
    );
    assert_eq!(node.handle(stamped(0)).await, applied(0));
    assert_eq!(committed(&node).await, vec![(0, b"v0".to_vec())]);
    // A reader that has read everything asks again from the end.
    assert_eq!(
        node.handle(read_from(1)).await,
        ClientReply::Records {
            records: Vec::new(),
            committed_end: 1
        }
    );
    node.shutdown().await;
}

fn topic_on(partitions: &[&[NodeId]]) -> ControllerCommand {
    let mut config = TopicConfig {
        partitions: partitions.len() as u32,
        replicated: true,
        ..TopicConfig::default()
    };
    config.balance.enabled = false;
    ControllerCommand::CreateTopic {
        name: "t".into(),
        config,
        placement: partitions
            .iter()
            .map(|r| crate::controller::ReplicaPlacement {
                replicas: r.to_vec(),
            })
            .collect(),
        hash_key: [1, 2],
    }
}

async fn start_controller_node(dir: &Path) -> Node {
    let network = Network::new(1, NetworkConfig::default());
    let peers = BTreeMap::from([(1, "127.0.0.1:9".to_string())]);
    let options = NodeOptions { controller: true };
    // A restart may find the last run's directory lock not yet released
    // by its storage tasks.
    for _ in 0..100 {
        match Node::start_with(1, dir, &[], peers.clone(), &network, options).await {
            Ok(node) => return node,
            Err(NodeError::Storage { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("start: {e}"),
        }
    }
    panic!("the node did not start on its directory");
}

/// Waits until `node` hosts `group` and leads it.
async fn wait_leading(node: &Node, group: GroupId) {
    for _ in 0..500 {
        if let ClientReply::Status {
            leader: Some(1), ..
        } = node.handle(ClientCall::Status { group }).await
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("node 1 did not lead group {}", group.0);
}

fn stamped_to(group: GroupId, seq: u64) -> ClientCall {
    match stamped(seq) {
        ClientCall::Append {
            producer, records, ..
        } => ClientCall::Append {
            group,
            producer,
            records,
        },
        other => other,
    }
}

#[tokio::test]
async fn a_topic_created_through_the_controller_is_hosted_where_placed_and_again_after_a_restart() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let node = start_controller_node(dir.path()).await;
    let init = node
        .handle(ClientCall::Initialize {
            group: GroupId::CONTROLLER,
            members: Vec::new(),
        })
        .await;
    assert_eq!(init, ClientReply::Initialized);
    wait_leading(&node, GroupId::CONTROLLER).await;
    // Partition 0 here, partition 1 on a node 2 this node never hosts.
    let created = node
        .handle(ClientCall::Controller(Box::new(topic_on(&[&[1], &[2]]))))
        .await;
    let ClientReply::Applied(CommandResponse::Controller(r)) = created else {
        panic!("not a controller answer: {created:?}");
    };
    assert_eq!(r.answer, crate::controller::ControllerAnswer::TopicCreated);
    let routes = node.handle(ClientCall::Topic { name: "t".into() }).await;
    let ClientReply::Topic { id, partitions } = routes else {
        panic!("{routes:?}");
    };
    assert_eq!(id, 1);
    let groups: Vec<(GroupId, Vec<NodeId>)> = partitions
        .into_iter()
        .map(|r| (r.group, r.replicas))
        .collect();
    let (mine, other) = (GroupId::partition(1, 0), GroupId::partition(1, 1));
    assert_eq!(groups, vec![(mine, vec![1]), (other, vec![2])]);

    wait_leading(&node, mine).await;
    assert_eq!(node.hosted(), vec![mine]);
    assert_eq!(node.handle(stamped_to(mine, 0)).await, applied(0));
    assert_eq!(node.handle(stamped_to(mine, 1)).await, applied(1));
    node.shutdown().await;
    drop(node);

    // Restarted: the controller's log applied again hosts the group
    // again, with its log and its membership (not initialised anew).
    let node = start_controller_node(dir.path()).await;
    wait_leading(&node, mine).await;
    assert_eq!(node.hosted(), vec![mine]);
    assert_eq!(node.handle(stamped_to(mine, 1)).await, duplicate(1));
    assert_eq!(node.handle(stamped_to(mine, 2)).await, applied(2));
    assert_eq!(
        committed_of(&node, mine)
            .await
            .into_iter()
            .map(|(_, v)| v)
            .collect::<Vec<_>>(),
        vec![b"v0".to_vec(), b"v1".to_vec(), b"v2".to_vec()]
    );
    assert!(matches!(
        node.handle(ClientCall::Status { group: other }).await,
        ClientReply::Failed { .. }
    ));
    node.shutdown().await;
}

#[tokio::test]
async fn controller_calls_to_a_node_without_it_or_before_it_has_a_leader_are_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let network = Network::new(2, NetworkConfig::default());
    let plain = Node::start(2, dir.path(), &[], BTreeMap::new(), &network)
        .await
        .expect("start");
    let reply = plain
        .handle(ClientCall::Controller(Box::new(topic_on(&[&[2]]))))
        .await;
    assert!(
        matches!(&reply, ClientReply::Failed { reason } if reason.contains("not hosted")),
        "{reply:?}"
    );
    plain.shutdown().await;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let node = start_controller_node(dir.path()).await;
    // Not initialised: no leader to name.
    assert!(matches!(
        node.handle(ClientCall::Controller(Box::new(topic_on(&[&[1]]))))
            .await,
        ClientReply::NotLeader { leader: None, .. }
    ));
    assert!(node.hosted().is_empty());
    node.shutdown().await;
}
