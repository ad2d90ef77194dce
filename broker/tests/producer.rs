//! The idempotent, routing producer: retries answered with their first
//! copy, sequence gaps and fenced epochs refused, and `moved` answers
//! followed through splits without losing, duplicating or reordering a
//! key's records.

mod common;

use bytes::Bytes;
use common::TestServer;
use fissionlog_broker::client::{Admin, Connection};
use fissionlog_broker::protocol::{
    Acks, ErrorCode, Isolation, ProduceRecord, RangeOwner, Request, Response, SplitSpec, Stamp,
    SyncSpec,
};
use fissionlog_broker::server::ServerConfig;

async fn topology(conn: &Connection, topic: &str) -> Vec<RangeOwner> {
    match conn
        .call(Request::Topology {
            topic: topic.into(),
        })
        .await
        .expect("the topology")
    {
        Response::Topology { partitions, .. } => partitions,
        other => panic!("{other:?}"),
    }
}

async fn init(conn: &Connection, id: Option<u64>) -> (u64, u32) {
    match conn
        .call(Request::InitProducer { producer_id: id })
        .await
        .expect("a producer id")
    {
        Response::ProducerInit { producer_id, epoch } => (producer_id, epoch),
        other => panic!("{other:?}"),
    }
}

fn records(keys: &[&str]) -> Vec<ProduceRecord> {
    keys.iter()
        .map(|k| ProduceRecord {
            key: Some(Bytes::from(k.to_string())),
            value: Bytes::from(format!("value of {k}")),
            timestamp: None,
        })
        .collect()
}

fn produce_to(partition: u32, stamp: Stamp, recs: Vec<ProduceRecord>) -> Request {
    Request::ProduceTo {
        topic: "t".into(),
        partition,
        acks: Acks::Leader,
        stamp: Some(stamp),
        records: recs,
    }
}

/// The values a fetch of `partition` from 0 returns.
async fn fetch_values(conn: &Connection, partition: u32) -> Vec<Bytes> {
    match conn
        .call(Request::Fetch {
            topic: "t".into(),
            partition,
            offset: 0,
            max_bytes: 1 << 20,
            max_wait_ms: 0,
            isolation: Isolation::Written,
        })
        .await
        .expect("a fetch")
    {
        Response::Fetched { records, .. } => records.into_iter().map(|r| r.value).collect(),
        other => panic!("{other:?}"),
    }
}

async fn one_partition_topic(srv: &TestServer) -> Connection {
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    Admin::new(conn.clone())
        .create_topic("t", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_batch_is_answered_with_its_first_offsets_and_appended_once() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = one_partition_topic(&srv).await;
    let (pid, epoch) = init(&conn, None).await;
    let p = topology(&conn, "t").await[0].partition;
    let stamp = Stamp {
        producer_id: pid,
        epoch,
        first_sequence: 0,
    };
    let req = produce_to(p, stamp, records(&["a", "b", "c"]));
    let first = conn.call(req.clone()).await.unwrap();
    let again = conn.call(req).await.unwrap();
    assert!(matches!(&first, Response::Produced { positions } if positions.len() == 3));
    assert_eq!(first, again);
    // Fetches never show the stamp: three records, once.
    assert_eq!(fetch_values(&conn, p).await.len(), 3);
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_gap_is_out_of_order_and_an_older_epoch_is_fenced() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = one_partition_topic(&srv).await;
    let (pid, epoch) = init(&conn, None).await;
    let p = topology(&conn, "t").await[0].partition;
    let at = |first_sequence, epoch| Stamp {
        producer_id: pid,
        epoch,
        first_sequence,
    };
    conn.call(produce_to(p, at(0, epoch), records(&["a", "b"])))
        .await
        .unwrap();
    let gap = conn
        .call(produce_to(p, at(5, epoch), records(&["c"])))
        .await
        .unwrap_err();
    assert_eq!(gap.code(), Some(ErrorCode::OutOfOrderSequence));
    let (same, newer) = init(&conn, Some(pid)).await;
    assert_eq!((same, newer), (pid, epoch + 1));
    let old = conn
        .call(produce_to(p, at(2, epoch), records(&["c"])))
        .await
        .unwrap_err();
    assert_eq!(old.code(), Some(ErrorCode::ProducerFenced));
    conn.call(produce_to(p, at(0, newer), records(&["c"])))
        .await
        .unwrap();
    assert_eq!(fetch_values(&conn, p).await.len(), 3);
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_reaches_the_parent_after_it_split_is_still_recognised_and_new_batches_are_moved(
) {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = one_partition_topic(&srv).await;
    let (pid, epoch) = init(&conn, None).await;
    let p = topology(&conn, "t").await[0].partition;
    let at = |first_sequence| Stamp {
        producer_id: pid,
        epoch,
        first_sequence,
    };
    let req = produce_to(p, at(0), records(&["a", "b"]));
    let first = conn.call(req.clone()).await.unwrap();
    Admin::new(conn.clone())
        .split("t", p, SplitSpec::Even)
        .await
        .unwrap();
    assert_eq!(conn.call(req).await.unwrap(), first);
    match conn
        .call(produce_to(p, at(2), records(&["c"])))
        .await
        .unwrap()
    {
        Response::Moved { partitions, .. } => {
            assert_eq!(partitions.len(), 2);
            assert_eq!(partitions[0].start, 0);
            assert_eq!(partitions[1].end, u64::MAX);
            assert_eq!(partitions[0].end + 1, partitions[1].start);
        }
        other => panic!("expected moved, got {other:?}"),
    }
    assert_eq!(fetch_values(&conn, p).await.len(), 2);
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batch_behind_a_moved_one_to_the_sealed_partition_is_moved_too() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = one_partition_topic(&srv).await;
    let (pid, epoch) = init(&conn, None).await;
    let p = topology(&conn, "t").await[0].partition;
    let at = |first_sequence| Stamp {
        producer_id: pid,
        epoch,
        first_sequence,
    };
    conn.call(produce_to(p, at(0), records(&["a"])))
        .await
        .unwrap();
    Admin::new(conn.clone())
        .split("t", p, SplitSpec::Even)
        .await
        .unwrap();
    // Pipelined behind each other, as a producer sends them.
    let second = conn
        .start(produce_to(p, at(1), records(&["b", "c"])))
        .await
        .unwrap();
    let third = conn
        .start(produce_to(p, at(3), records(&["d"])))
        .await
        .unwrap();
    for r in [second.wait().await, third.wait().await] {
        assert!(matches!(r, Ok(Response::Moved { .. })), "{r:?}");
    }
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_keyed_with_the_reserved_stamp_key_is_refused() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = one_partition_topic(&srv).await;
    let e = conn
        .call(Request::Produce {
            topic: "t".into(),
            acks: Acks::Leader,
            records: vec![ProduceRecord {
                key: Some(Bytes::from_static(
                    fissionlog_broker::server::producers::STAMP_KEY,
                )),
                value: Bytes::from_static(b"x"),
                timestamp: None,
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidRequest));
    srv.stop().await.unwrap();
}
