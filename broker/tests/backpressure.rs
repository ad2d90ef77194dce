//! Backpressure: a client that pipelines fetches and never reads its
//! socket stalls only itself. The server stops reading it once its write
//! queue is full (the per-connection queue never holds more than its cap),
//! closes it after the stall timeout, and serves others all along.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{raw_hello, TestServer};
use fissionlog_broker::client::{Admin, Connection, Producer, ProducerConfig};
use fissionlog_broker::protocol::{concat, Isolation, Request, SyncSpec};
use fissionlog_broker::server::ServerConfig;
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_not_read_either_and_its_queue_stays_at_its_cap() {
    let queue = 8usize;
    let in_flight = 16u32;
    let srv = TestServer::start(ServerConfig {
        write_queue_frames: queue,
        max_in_flight: in_flight,
        stall_timeout: Duration::from_secs(2),
        ..Default::default()
    })
    .await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    let admin = Admin::new(conn.clone());
    admin
        .create_topic("t", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let p = Producer::new(conn.clone(), ProducerConfig::new("t"));
    let value = Bytes::from(vec![b'x'; 16 * 1024]);
    let mut acks = Vec::new();
    for _ in 0..64 {
        acks.push(p.send(None, value.clone()).await);
    }
    for a in acks {
        a.await.unwrap();
    }
    // ~1 MiB per response, 5,000 requests: 5 GB if the server buffered them.
    let mut s = raw_hello(srv.addr).await;
    let f = Request::Fetch {
        topic: "t".into(),
        partition: 0,
        offset: 0,
        max_bytes: 1 << 20,
        max_wait_ms: 0,
        isolation: Isolation::Written,
    };
    let one = concat(&f.encode(1));
    let writer = tokio::spawn(async move {
        for _ in 0..5000 {
            if s.write_all(&one).await.is_err() {
                break;
            }
        }
        s
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = srv.stats.snapshot();
    // The server is not reading the stalled client any more.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = srv.stats.snapshot();
    assert!(
        after.requests < 5000,
        "the server read every request ({})",
        after.requests
    );
    assert!(
        after.write_queue_max <= queue as u64 + 1,
        "queue depth {} over its cap {queue}",
        after.write_queue_max
    );
    assert!(after.in_flight_max <= u64::from(in_flight));
    // Another client is served meanwhile.
    let t0 = std::time::Instant::now();
    admin.list_topics().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1));
    // After the stall timeout the stalled connection is closed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while srv.stats.snapshot().stalled_closed == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(srv.stats.snapshot().stalled_closed, 1, "before {before:?}");
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    srv.stop().await.unwrap();
}

/// Keeps exactly `limit` requests outstanding on one connection, sending
/// the next one as each answer arrives; returns how many were refused as
/// too many in flight, and any other failure.
async fn keep_the_limit_outstanding(
    conn: &Connection,
    rounds: usize,
    make: impl Fn(usize) -> Request + Send + 'static,
) -> (usize, Vec<String>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let sender = {
        let conn = conn.clone();
        tokio::spawn(async move {
            for i in 0..rounds {
                // Waits for a free slot: the client never holds more than
                // the limit the server announced.
                match conn.start(make(i)).await {
                    Ok(call) => {
                        if tx.send(call).is_err() {
                            break;
                        }
                    }
                    Err(e) => panic!("send {i}: {e}"),
                }
            }
        })
    };
    let mut refused = 0usize;
    let mut other = Vec::new();
    while let Some(call) = rx.recv().await {
        match call.wait().await {
            Ok(_) => {}
            Err(e) if e.code() == Some(fissionlog_broker::protocol::ErrorCode::TooManyInFlight) => {
                refused += 1
            }
            Err(e) => other.push(e.to_string()),
        }
    }
    sender.await.unwrap();
    (refused, other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_keeps_exactly_the_in_flight_limit_outstanding_is_never_refused() {
    let limit = 2u32;
    let srv = TestServer::start(ServerConfig {
        max_in_flight: limit,
        ..Default::default()
    })
    .await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    Admin::new(conn.clone())
        .create_topic("t", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let produce = |i: usize| Request::Produce {
        topic: "t".into(),
        acks: fissionlog_broker::protocol::Acks::Leader,
        records: vec![fissionlog_broker::protocol::ProduceRecord {
            key: None,
            value: Bytes::from(format!("v{i}")),
            timestamp: None,
        }],
    };
    let (refused, other) = keep_the_limit_outstanding(&conn, 3000, produce).await;
    assert!(other.is_empty(), "produce failures: {other:?}");
    assert_eq!(refused, 0, "produces refused within the limit");
    // The other request kinds count in flight the same way.
    let fetch = |_| Request::Fetch {
        topic: "t".into(),
        partition: 0,
        offset: 0,
        max_bytes: 1024,
        max_wait_ms: 0,
        isolation: Isolation::Written,
    };
    let (refused, other) = keep_the_limit_outstanding(&conn, 3000, fetch).await;
    assert!(other.is_empty(), "fetch failures: {other:?}");
    assert_eq!(refused, 0, "fetches refused within the limit");
    // Unknown-topic produces are answered from the reader itself.
    let unknown = |i: usize| Request::Produce {
        topic: "nope".into(),
        acks: fissionlog_broker::protocol::Acks::Leader,
        records: vec![fissionlog_broker::protocol::ProduceRecord {
            key: None,
            value: Bytes::from(format!("v{i}")),
            timestamp: None,
        }],
    };
    let (refused, other) = keep_the_limit_outstanding(&conn, 1000, unknown).await;
    assert_eq!(other.len(), 1000, "every unknown-topic produce fails");
    assert_eq!(refused, 0, "failing produces refused within the limit");
    assert_eq!(srv.stats.snapshot().in_flight_refused, 0);
    srv.stop().await.unwrap();
}
