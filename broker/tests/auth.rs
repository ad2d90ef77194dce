//! Token authentication with per-topic permissions: a client without a
//! credential, with a wrong one, or with one for another topic gets a
//! refusal and no data.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::TestServer;
use fissionlog_broker::client::{
    Admin, Connection, Consumer, ConsumerConfig, Producer, ProducerConfig,
};
use fissionlog_broker::protocol::{ErrorCode, Isolation, Request, Response, SyncSpec};
use fissionlog_broker::server::{Grant, ServerConfig, TokenAuthorizer};

fn grant(name: &str, token: &str, read: &[&str], write: &[&str], admin: bool) -> Grant {
    Grant {
        name: name.into(),
        token: token.into(),
        read: read.iter().map(|s| s.to_string()).collect(),
        write: write.iter().map(|s| s.to_string()).collect(),
        admin,
    }
}

async fn server() -> TestServer {
    let auth = TokenAuthorizer::new()
        .grant(grant("ops", "ops-token", &["*"], &["*"], true))
        .grant(grant(
            "orders-app",
            "orders-token",
            &["orders"],
            &["orders"],
            false,
        ))
        .grant(grant("audit", "audit-token", &["audit"], &[], false));
    TestServer::start(ServerConfig {
        authorizer: Arc::new(auth),
        ..Default::default()
    })
    .await
}

fn tok(s: &'static str) -> Option<Bytes> {
    Some(Bytes::from_static(s.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_token_or_with_a_wrong_one_is_refused() {
    let srv = server().await;
    for t in [
        None,
        tok("orders-tokeN"),
        tok("orders-token-and-more"),
        tok(""),
    ] {
        let e = Connection::connect(srv.addr, t.clone()).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::Unauthorized), "token {t:?}");
    }
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_for_another_topic_reads_and_writes_nothing_of_this_one() {
    let srv = server().await;
    let ops = Connection::connect(srv.addr, tok("ops-token"))
        .await
        .unwrap();
    let admin = Admin::new(ops.clone());
    admin
        .create_topic("orders", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    admin
        .create_topic("audit", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let p = Producer::new(ops, ProducerConfig::new("orders"));
    p.send(None, Bytes::from_static(b"secret order"))
        .await
        .await
        .unwrap();

    let audit = Connection::connect(srv.addr, tok("audit-token"))
        .await
        .unwrap();
    let fetch = Request::Fetch {
        topic: "orders".into(),
        partition: 0,
        offset: 0,
        max_bytes: 1 << 20,
        max_wait_ms: 0,
        isolation: Isolation::Written,
    };
    let e = audit.call(fetch.clone()).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    let e = Consumer::join(audit.clone(), ConsumerConfig::new("orders", "g"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    let p = Producer::new(audit.clone(), ProducerConfig::new("orders"));
    let e = p
        .send(None, Bytes::from_static(b"forged"))
        .await
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    // Read-only on its own topic.
    let p = Producer::new(audit.clone(), ProducerConfig::new("audit"));
    let e = p
        .send(None, Bytes::from_static(b"x"))
        .await
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    // Not an admin.
    let e = Admin::new(audit.clone())
        .describe("orders")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    let e = Admin::new(audit.clone())
        .create_topic("new", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));

    // The topic's own token reads it; nothing forged landed.
    let app = Connection::connect(srv.addr, tok("orders-token"))
        .await
        .unwrap();
    let Response::Fetched { records, .. } = app.call(fetch).await.unwrap() else {
        panic!("not a fetch answer")
    };
    let values: Vec<&[u8]> = records.iter().map(|r| r.value.as_ref()).collect();
    assert_eq!(values, vec![b"secret order".as_slice()]);
    let mut c = Consumer::join(app, ConsumerConfig::new("orders", "g"))
        .await
        .unwrap();
    assert_eq!(
        c.poll(10, Duration::from_millis(500)).await.unwrap().len(),
        1
    );
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_token_can_neither_split_nor_list_topics_nor_learn_the_routing_key() {
    let srv = server().await;
    let ops = Connection::connect(srv.addr, tok("ops-token"))
        .await
        .unwrap();
    Admin::new(ops)
        .create_topic("audit", 2, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let audit = Connection::connect(srv.addr, tok("audit-token"))
        .await
        .unwrap();
    let admin = Admin::new(audit.clone());
    let e = admin.list_topics().await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    let e = admin
        .split("audit", 0, fissionlog_broker::protocol::SplitSpec::Even)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    let e = admin.merge("audit", 0, 1).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    let e = admin.stats().await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    // The routing key lets a writer aim keys at one partition.
    let e = audit
        .call(Request::Topology {
            topic: "audit".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    // Its own topic still reads.
    assert!(matches!(
        audit
            .call(Request::Fetch {
                topic: "audit".into(),
                partition: 0,
                offset: 0,
                max_bytes: 1 << 20,
                max_wait_ms: 0,
                isolation: Isolation::Written,
            })
            .await,
        Ok(Response::Fetched { .. })
    ));
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_grant_under_one_name_does_not_lend_its_token_the_first_ones_permissions() {
    let auth = TokenAuthorizer::new()
        .grant(grant("svc", "svc-admin-token", &["*"], &["*"], true))
        .grant(grant("svc", "svc-reader-token", &["audit"], &[], false));
    let srv = TestServer::start(ServerConfig {
        authorizer: Arc::new(auth),
        ..Default::default()
    })
    .await;
    // The later grant replaces the earlier one under its name.
    let e = Connection::connect(srv.addr, tok("svc-admin-token"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    let reader = Connection::connect(srv.addr, tok("svc-reader-token"))
        .await
        .unwrap();
    {
        let e = Admin::new(reader.clone())
            .create_topic("orders", 1, SyncSpec::Never, 0, false)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
        let e = reader
            .call(Request::Fetch {
                topic: "orders".into(),
                partition: 0,
                offset: 0,
                max_bytes: 1 << 20,
                max_wait_ms: 0,
                isolation: Isolation::Written,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    }
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_another_principal_cannot_fence_a_producer_id() {
    let srv = server().await;
    let ops = Connection::connect(srv.addr, tok("ops-token"))
        .await
        .unwrap();
    Admin::new(ops)
        .create_topic("orders", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let app = Connection::connect(srv.addr, tok("orders-token"))
        .await
        .unwrap();
    let Response::ProducerInit { producer_id, epoch } = app
        .call(Request::InitProducer { producer_id: None })
        .await
        .unwrap()
    else {
        panic!("a producer id")
    };
    let audit = Connection::connect(srv.addr, tok("audit-token"))
        .await
        .unwrap();
    let e = audit
        .call(Request::InitProducer {
            producer_id: Some(producer_id),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    // The owner's epoch still writes.
    let r = app
        .call(Request::ProduceTo {
            topic: "orders".into(),
            partition: 0,
            acks: fissionlog_broker::protocol::Acks::Leader,
            stamp: Some(fissionlog_broker::protocol::Stamp {
                producer_id,
                epoch,
                first_sequence: 0,
            }),
            records: vec![fissionlog_broker::protocol::ProduceRecord {
                key: Some(Bytes::from_static(b"k")),
                value: Bytes::from_static(b"v"),
                timestamp: None,
            }],
        })
        .await;
    assert!(
        matches!(r, Ok(Response::Produced { .. })),
        "the owner was fenced: {r:?}"
    );
    // Nor write under the owner's id, which would fence it after a restart.
    let ops = Connection::connect(srv.addr, tok("ops-token"))
        .await
        .unwrap();
    let e = ops
        .call(Request::ProduceTo {
            topic: "orders".into(),
            partition: 0,
            acks: fissionlog_broker::protocol::Acks::Leader,
            stamp: Some(fissionlog_broker::protocol::Stamp {
                producer_id,
                epoch: epoch + 1000,
                first_sequence: 0,
            }),
            records: vec![fissionlog_broker::protocol::ProduceRecord {
                key: Some(Bytes::from_static(b"k")),
                value: Bytes::from_static(b"forged"),
                timestamp: None,
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    // The owner itself may still take the next epoch.
    assert!(matches!(
        app.call(Request::InitProducer {
            producer_id: Some(producer_id)
        })
        .await,
        Ok(Response::ProducerInit { .. })
    ));
    srv.stop().await.unwrap();
}
