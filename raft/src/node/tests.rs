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
    match node
        .handle(ClientCall::Read {
            group: G,
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
