//! The partition fetcher against one broker: every record once and in
//! order across answers, from a chosen offset, with long polling; a
//! broker that can't be reached skipped for the next; no broker at all
//! ends in a typed error within the reconnect deadline.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::TestServer;
use fissionlog_broker::client::{
    Admin, ClientError, Connection, Endpoint, Fetcher, FetcherConfig, Producer, ProducerConfig,
    Reconnect,
};
use fissionlog_broker::protocol::{Acks, SyncSpec};
use fissionlog_broker::server::ServerConfig;

/// A loopback address nothing listens on: bound, read, let go.
fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("an address").to_string()
}

async fn produce(conn: &Connection, from: u64, to: u64) {
    let p = Producer::new(
        conn.clone(),
        ProducerConfig {
            acks: Acks::Leader,
            ..ProducerConfig::new("t")
        },
    );
    let mut acks = Vec::new();
    for i in from..to {
        acks.push(p.send(None, Bytes::from(format!("v{i}"))).await);
    }
    for (i, a) in (from..to).zip(acks) {
        assert_eq!(
            a.await.expect("acknowledged"),
            Some((0, i)),
            "record {i} is appended at its offset"
        );
    }
}

#[tokio::test]
async fn a_fetcher_returns_every_record_once_in_order_through_the_broker_that_answers() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.expect("connect");
    Admin::new(conn.clone())
        .create_topic("t", 1, SyncSpec::Never, 0, false)
        .await
        .expect("the topic");
    produce(&conn, 0, 40).await;

    // The first broker is down: the fetcher goes on through the second.
    let endpoint = Endpoint::with_bootstrap([dead_addr(), srv.addr.to_string()]);
    let config = FetcherConfig {
        offset: 5,
        // A few records per answer: the offset must carry across answers.
        max_bytes: 64,
        max_wait: Duration::from_millis(100),
        ..FetcherConfig::new("t", 0)
    };
    let mut f = Fetcher::new(endpoint, config);
    let mut got = Vec::new();
    let mut answers = 0;
    while got.len() < 35 {
        let recs = tokio::time::timeout(Duration::from_secs(10), f.fetch())
            .await
            .expect("a fetch answers in time")
            .expect("a fetch answers");
        assert!(!recs.is_empty(), "records are there to fetch");
        answers += 1;
        got.extend(recs);
    }
    assert!(answers > 1, "the reads span several answers ({answers})");
    let offsets: Vec<u64> = got.iter().map(|r| r.offset).collect();
    assert_eq!(
        offsets,
        (5..40).collect::<Vec<_>>(),
        "each record once, in order"
    );
    for r in &got {
        assert_eq!(r.value, Bytes::from(format!("v{}", r.offset)));
    }
    assert_eq!(f.offset(), 40);
    assert_eq!(f.high_watermark(), 40);

    // Nothing new: the long poll waits, then answers empty.
    let started = Instant::now();
    let recs = f.fetch().await.expect("an empty answer");
    assert!(recs.is_empty(), "{recs:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(50),
        "the fetch waited"
    );

    // A record produced during the long poll is returned by it.
    let waiting = tokio::spawn(async move {
        let r = f.fetch().await;
        (f, r)
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    produce(&conn, 40, 41).await;
    let (mut f, r) = waiting.await.expect("the fetch task");
    let mut recs = r.expect("the new record");
    if recs.is_empty() {
        recs = f.fetch().await.expect("the new record");
    }
    let offsets: Vec<u64> = recs.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, vec![40]);
    assert_eq!(f.offset(), 41);
}

#[tokio::test]
async fn a_fetcher_with_no_broker_to_reach_fails_unavailable_within_its_deadline() {
    let config = FetcherConfig {
        reconnect: Reconnect {
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
            deadline: Duration::from_millis(400),
        },
        ..FetcherConfig::new("t", 0)
    };
    let mut f = Fetcher::new(Endpoint::with_bootstrap([dead_addr(), dead_addr()]), config);
    let started = Instant::now();
    let e = f.fetch().await.expect_err("no broker answers");
    assert!(
        matches!(e, ClientError::Unavailable { attempts, .. } if attempts > 1),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(f.offset(), 0);
}
