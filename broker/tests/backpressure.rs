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
