//! The idempotent, routing producer: retries answered with their first
//! copy, sequence gaps and fenced epochs refused, and `moved` answers
//! followed through splits without losing, duplicating or reordering a
//! key's records.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::TestServer;
use fissionlog_broker::client::{
    Admin, ClientError, Connection, Consumer, ConsumerConfig, Producer, ProducerConfig,
};
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

/// A plain producer's refused batch fails each record with the server's
/// code and sentence as the server sent them: the code's name shows once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_producers_refused_record_carries_the_servers_error_once() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    let direct = conn
        .call(Request::Produce {
            topic: "missing".into(),
            acks: Acks::Leader,
            records: records(&["k"]),
        })
        .await;
    let Err(ClientError::Server { code, message }) = direct else {
        panic!("a produce to a missing topic is refused: {direct:?}");
    };
    let p = Producer::new(conn.clone(), ProducerConfig::new("missing"));
    let got = p
        .send(Some(Bytes::from_static(b"k")), Bytes::from_static(b"v"))
        .await
        .await;
    match &got {
        Err(ClientError::Server {
            code: c,
            message: m,
        }) => assert_eq!((c, m), (&code, &message), "the server's own error"),
        other => panic!("the record fails with the server's error: {other:?}"),
    }
    let text = got.unwrap_err().to_string();
    assert_eq!(text, format!("{}: {message}", code.name()));
    assert_eq!(
        text.matches(code.name()).count(),
        message.matches(code.name()).count() + 1
    );
    srv.stop().await.unwrap();
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
async fn a_batch_stamped_with_an_id_never_handed_out_is_refused_so_it_cannot_shadow_its_future_owner(
) {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = one_partition_topic(&srv).await;
    let (first, epoch) = init(&conn, None).await;
    let p = topology(&conn, "t").await[0].partition;
    let ahead = Stamp {
        producer_id: first + 1,
        epoch,
        first_sequence: 0,
    };
    let made_up = conn
        .call(produce_to(p, ahead, records(&["x", "y"])))
        .await
        .unwrap_err();
    assert_eq!(made_up.code(), Some(ErrorCode::InvalidRequest));
    // The id is handed out next; its first batch is new, not a duplicate
    // of the made-up one.
    let (next, epoch) = init(&conn, None).await;
    assert_eq!(next, first + 1);
    let stamp = Stamp {
        producer_id: next,
        epoch,
        first_sequence: 0,
    };
    conn.call(produce_to(p, stamp, records(&["a", "b"])))
        .await
        .unwrap();
    let values = fetch_values(&conn, p).await;
    assert_eq!(
        values,
        vec![Bytes::from("value of a"), Bytes::from("value of b")]
    );
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

const PRODUCERS: usize = 16;
/// Each producer sends at least this many records, and goes on until the
/// splits are done.
const PER_PRODUCER: usize = 200;
const KEYS: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producers_keep_every_acknowledged_record_once_and_in_key_order_while_partitions_split(
) {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = one_partition_topic(&srv).await;
    let splits_done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..PRODUCERS {
        let c = Connection::connect(srv.addr, None).await.unwrap();
        let done = splits_done.clone();
        tasks.push(tokio::spawn(async move {
            let p = Producer::new(
                c,
                ProducerConfig {
                    idempotent: true,
                    batch_records: 40,
                    ..ProducerConfig::new("t")
                },
            );
            let mut acks = Vec::new();
            let mut n = 0;
            while n < PER_PRODUCER || !done.load(Ordering::Acquire) {
                let key = format!("k{}", n % KEYS);
                let value = format!("{i} {key} {}", n / KEYS);
                acks.push(p.send(Some(Bytes::from(key)), Bytes::from(value)).await);
                if n % 20 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                n += 1;
            }
            let mut out = Vec::new();
            for a in acks {
                out.push(a.await.expect("every record is acknowledged"));
            }
            out
        }));
    }
    // Split the widest active partition while they run.
    let admin = Admin::new(conn.clone());
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(15)).await;
        let widest = topology(&conn, "t")
            .await
            .into_iter()
            .max_by_key(|o| o.end - o.start)
            .expect("an active partition");
        admin
            .split("t", widest.partition, SplitSpec::Even)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(15)).await;
    splits_done.store(true, Ordering::Release);
    let mut positions = HashSet::new();
    for t in tasks {
        for at in t.await.unwrap() {
            let at = at.expect("leader acks carry a position");
            assert!(positions.insert(at), "position {at:?} acknowledged twice");
        }
    }
    let total = positions.len();
    assert!(total >= PRODUCERS * PER_PRODUCER);
    let partitions: HashSet<u32> = positions.iter().map(|p| p.0).collect();
    assert!(
        partitions.len() > 2,
        "the producers followed the splits: {partitions:?}"
    );

    let mut c = Consumer::join(conn.clone(), ConsumerConfig::new("t", "g"))
        .await
        .unwrap();
    let mut seen = HashSet::new();
    let mut last: HashMap<(String, String), u64> = HashMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while seen.len() < total && std::time::Instant::now() < deadline {
        for r in c.poll(2000, Duration::from_millis(100)).await.unwrap() {
            let v = String::from_utf8(r.value.to_vec()).expect("UTF-8 values");
            let f: Vec<&str> = v.split(' ').collect();
            let (who, key, seq) = (
                f[0].to_string(),
                f[1].to_string(),
                f[2].parse::<u64>().unwrap(),
            );
            assert!(seen.insert(v.clone()), "{v} read twice");
            if let Some(prev) = last.insert((who, key), seq) {
                assert!(seq > prev, "{v} after sequence {prev} of its key");
            }
        }
        c.commit().await.unwrap();
    }
    assert_eq!(seen.len(), total);
    c.leave().await.unwrap();
    srv.stop().await.unwrap();
}

/// A loopback proxy to `server` whose first connection stops passing the
/// server's bytes to the client once `stall` is set (the server still
/// reads and acts on every request); later connections pass everything.
async fn stalling_proxy(
    server: std::net::SocketAddr,
    stall: Arc<AtomicBool>,
) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut nth = 0;
        while let Ok((client, _)) = listener.accept().await {
            let first = nth == 0;
            nth += 1;
            let upstream = tokio::net::TcpStream::connect(server).await.unwrap();
            let (mut cr, mut cw) = client.into_split();
            let (mut ur, mut uw) = upstream.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut cr, &mut uw).await;
            });
            let stall = stall.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match ur.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if first && stall.load(Ordering::SeqCst) {
                        continue;
                    }
                    if cw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A batch whose response is lost on a stalled connection is sent again
/// with its sequence over a new connection when the request timeout
/// passes: the record is acknowledged at the offset it was first
/// appended at, and appended once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_answer_never_comes_is_resent_on_a_new_connection_and_appended_once() {
    use fissionlog_broker::client::Endpoint;
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = one_partition_topic(&srv).await;
    let stall = Arc::new(AtomicBool::new(false));
    let proxy = stalling_proxy(srv.addr, stall.clone()).await;
    let endpoint =
        Endpoint::new(proxy.to_string()).with_request_timeout(Duration::from_millis(300));
    let p = Producer::connect(
        endpoint,
        ProducerConfig {
            idempotent: true,
            ..ProducerConfig::new("t")
        },
    )
    .await
    .expect("the producer connects");
    let send = |v: &'static str| {
        p.send(
            Some(Bytes::from_static(b"k")),
            Bytes::from_static(v.as_bytes()),
        )
    };
    let first = send("one").await.await.expect("acknowledged");
    stall.store(true, Ordering::SeqCst);
    let second = tokio::time::timeout(Duration::from_secs(20), send("two").await)
        .await
        .expect("the ack comes by itself")
        .expect("acknowledged after a resend, not failed with a timeout");
    let third = send("three").await.await.expect("acknowledged");
    let values = fetch_values(&conn, 0).await;
    assert_eq!(
        values,
        vec![
            Bytes::from_static(b"one"),
            Bytes::from_static(b"two"),
            Bytes::from_static(b"three")
        ],
        "each record once, in order"
    );
    let offsets: Vec<u64> = [first, second, third]
        .iter()
        .map(|a| a.expect("a position").1)
        .collect();
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]),
        "positions in append order: {offsets:?}"
    );
}
