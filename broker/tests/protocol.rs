//! Protocol round trips through a live server, and its limits: oversized
//! frames, too many requests in flight, too many connections, a bad
//! version, a request before the handshake.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{closed_by_server, raw_hello, read_response, TestServer};
use fissionlog_broker::client::{
    Admin, Connection, Consumer, ConsumerConfig, Producer, ProducerConfig,
};
use fissionlog_broker::protocol::{
    concat, Acks, ErrorCode, Isolation, Request, Response, SplitSpec, SyncSpec,
};
use fissionlog_broker::server::ServerConfig;
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produced_records_come_back_from_fetch_and_from_a_group_in_key_order() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    let admin = Admin::new(conn.clone());
    admin
        .create_topic("t", 2, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    for acks in [Acks::Leader, Acks::Quorum, Acks::None] {
        let p = Producer::new(
            conn.clone(),
            ProducerConfig {
                acks,
                ..ProducerConfig::new("t")
            },
        );
        let mut futs = Vec::new();
        for i in 0..300u32 {
            let key = Bytes::from(format!("k{}", i % 7));
            futs.push(
                p.send(Some(key), Bytes::from(format!("{acks:?} {i}")))
                    .await,
            );
        }
        for f in futs {
            let at = f.await.unwrap();
            assert_eq!(at.is_some(), acks != Acks::None);
        }
    }
    // Splitting under the group changes nothing of what it reads.
    admin.split("t", 0, SplitSpec::Even).await.unwrap();
    let r = conn
        .call(Request::Fetch {
            topic: "t".into(),
            partition: 1,
            offset: 0,
            max_bytes: 1 << 20,
            max_wait_ms: 100,
            isolation: Isolation::Written,
        })
        .await
        .unwrap();
    let Response::Fetched { records, .. } = r else {
        panic!("{r:?}")
    };
    assert!(!records.is_empty());
    let mut c = Consumer::join(conn.clone(), ConsumerConfig::new("t", "g"))
        .await
        .unwrap();
    let mut got: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // acks none gives no position, but the server appends it all the same.
    while got.len() < 900 && std::time::Instant::now() < deadline {
        for r in c.poll(1000, Duration::from_millis(100)).await.unwrap() {
            got.push(format!(
                "{} {}",
                String::from_utf8_lossy(r.key.as_deref().unwrap()),
                String::from_utf8_lossy(&r.value)
            ));
        }
        c.commit().await.unwrap();
    }
    assert_eq!(got.len(), 900);
    for k in 0..7 {
        let per_key: Vec<&String> = got
            .iter()
            .filter(|l| l.starts_with(&format!("k{k} ")))
            .collect();
        let mut sorted = per_key.clone();
        sorted.sort_by_key(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                ["Leader", "Quorum", "None"]
                    .iter()
                    .position(|x| *x == f[1])
                    .unwrap(),
                f[2].parse::<u32>().unwrap(),
            )
        });
        assert_eq!(per_key, sorted, "key k{k} out of order");
    }
    c.leave().await.unwrap();
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_limit_gets_an_error_frame_and_the_connection_closes() {
    let srv = TestServer::start(ServerConfig {
        max_frame_bytes: 4096,
        ..Default::default()
    })
    .await;
    let mut s = raw_hello(srv.addr).await;
    s.write_all(&(1u32 << 20).to_le_bytes()).await.unwrap();
    match read_response(&mut s).await {
        Some((
            _,
            Response::Error {
                code: ErrorCode::FrameTooLarge,
                ..
            },
        )) => {}
        other => panic!("expected frame_too_large, got {other:?}"),
    }
    assert!(closed_by_server(&mut s).await);
    assert_eq!(srv.stats.snapshot().bad_frames, 1);
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_in_flight_limit_are_refused_with_an_error_frame() {
    let srv = TestServer::start(ServerConfig {
        max_in_flight: 4,
        ..Default::default()
    })
    .await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    Admin::new(conn)
        .create_topic("t", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let mut s = raw_hello(srv.addr).await;
    // Ten long polls at once on an empty partition: four wait, six are refused.
    let mut bytes = Vec::new();
    for id in 1..=10u32 {
        let f = Request::Fetch {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            max_bytes: 1024,
            max_wait_ms: 1500,
            isolation: Isolation::Written,
        };
        bytes.extend(concat(&f.encode(id)));
    }
    s.write_all(&bytes).await.unwrap();
    let mut refused = 0;
    let mut answered = 0;
    for _ in 0..10 {
        match read_response(&mut s).await {
            Some((
                _,
                Response::Error {
                    code: ErrorCode::TooManyInFlight,
                    ..
                },
            )) => refused += 1,
            Some((_, Response::Fetched { .. })) => answered += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((refused, answered), (6, 4));
    assert_eq!(srv.stats.snapshot().in_flight_max, 4);
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_past_the_limit_gets_an_error_frame_and_is_closed() {
    let srv = TestServer::start(ServerConfig {
        max_connections: 2,
        ..Default::default()
    })
    .await;
    let _a = raw_hello(srv.addr).await;
    let _b = raw_hello(srv.addr).await;
    let mut c = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    match read_response(&mut c).await {
        Some((
            0,
            Response::Error {
                code: ErrorCode::TooManyConnections,
                ..
            },
        )) => {}
        other => panic!("expected too_many_connections, got {other:?}"),
    }
    assert!(closed_by_server(&mut c).await);
    assert_eq!(srv.stats.snapshot().connections_refused, 1);
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_without_a_common_version_is_refused_and_closed() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let mut s = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    let hello = Request::Hello {
        min_version: 2,
        max_version: 9,
        client: "future".into(),
        token: None,
    };
    s.write_all(&concat(&hello.encode(3))).await.unwrap();
    match read_response(&mut s).await {
        Some((
            3,
            Response::Error {
                code: ErrorCode::UnsupportedVersion,
                ..
            },
        )) => {}
        other => panic!("expected unsupported_version, got {other:?}"),
    }
    assert!(closed_by_server(&mut s).await);
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_before_the_handshake_is_refused_and_closed() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let mut s = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(&concat(&Request::ListTopics.encode(4)))
        .await
        .unwrap();
    match read_response(&mut s).await {
        Some((
            4,
            Response::Error {
                code: ErrorCode::HandshakeRequired,
                ..
            },
        )) => {}
        other => panic!("expected handshake_required, got {other:?}"),
    }
    assert!(closed_by_server(&mut s).await);
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_errors_name_the_unknown_topic_and_partition() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    let admin = Admin::new(conn.clone());
    assert_eq!(
        admin.describe("nope").await.unwrap_err().code(),
        Some(ErrorCode::UnknownTopic)
    );
    admin
        .create_topic("t", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    assert_eq!(
        admin
            .create_topic("t", 1, SyncSpec::Never, 0, false)
            .await
            .unwrap_err()
            .code(),
        Some(ErrorCode::TopicExists)
    );
    let e = conn
        .call(Request::Fetch {
            topic: "t".into(),
            partition: 9,
            offset: 0,
            max_bytes: 10,
            max_wait_ms: 0,
            isolation: Isolation::Default,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::UnknownPartition));
    assert_eq!(
        admin
            .split("t", 0, SplitSpec::At(u64::MAX))
            .await
            .unwrap_err()
            .code(),
        Some(ErrorCode::Refused)
    );
    // Past the end of an active partition: refused at once, not waited on.
    let t0 = std::time::Instant::now();
    let e = conn
        .call(Request::Fetch {
            topic: "t".into(),
            partition: 0,
            offset: 100,
            max_bytes: 10,
            max_wait_ms: 5000,
            isolation: Isolation::Default,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::OffsetOutOfRange));
    assert!(t0.elapsed() < Duration::from_secs(2));
    let e = conn.call(Request::Commit { member: 42 }).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::UnknownMember));
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_in_flight_is_answered_when_the_server_stops_and_the_log_closes_cleanly() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    Admin::new(conn.clone())
        .create_topic("t", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let poll = tokio::spawn(async move {
        conn.call(Request::Fetch {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            max_bytes: 1024,
            max_wait_ms: 25_000,
            isolation: Isolation::Written,
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = std::time::Instant::now();
    assert!(
        srv.stop_and_reopen_is_clean().await,
        "the log was not closed cleanly"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "stopping took {:?}",
        t0.elapsed()
    );
    match tokio::time::timeout(Duration::from_secs(5), poll).await {
        Ok(Ok(Ok(Response::Fetched { records, .. }))) => assert!(records.is_empty()),
        other => panic!("the long poll was not answered: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_poll_answer_stays_within_its_max_bytes_and_loses_nothing() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    conn.call(Request::CreateTopic {
        topic: "big".into(),
        partitions: 1,
        sync: SyncSpec::Never,
        max_record_bytes: 64 * 1024,
        target_bytes_per_sec: 0,
        auto_balance: false,
    })
    .await
    .unwrap();
    let p = Producer::new(conn.clone(), ProducerConfig::new("big"));
    let mut acks = Vec::new();
    for i in 0..100u32 {
        let mut v = vec![b'v'; 60 * 1024];
        v[..4].copy_from_slice(&i.to_le_bytes());
        acks.push(p.send(None, Bytes::from(v)).await);
    }
    for a in acks {
        a.await.unwrap();
    }
    let join = Request::JoinGroup {
        topic: "big".into(),
        group: "g".into(),
        session_timeout_ms: 10_000,
        processing_timeout_ms: 30_000,
        instance_id: None,
    };
    let Response::Joined { member, .. } = conn.call(join).await.unwrap() else {
        panic!("not joined")
    };
    let max_bytes = 256 * 1024;
    let mut seen = Vec::new();
    for _ in 0..200 {
        let poll = Request::GroupPoll {
            member,
            max_records: 1000,
            max_bytes,
            max_wait_ms: 200,
        };
        let Response::Polled { records, .. } = conn.call(poll).await.unwrap() else {
            panic!("not a poll answer")
        };
        let bytes: usize = records.iter().map(|r| r.value.len()).sum();
        // At most one record past the budget, never the whole backlog.
        assert!(
            bytes <= max_bytes as usize + 64 * 1024,
            "{bytes} bytes for a {max_bytes}-byte poll"
        );
        seen.extend(
            records
                .iter()
                .map(|r| u32::from_le_bytes(r.value[..4].try_into().unwrap())),
        );
        conn.call(Request::Commit { member }).await.unwrap();
        if seen.len() >= 100 {
            break;
        }
    }
    assert_eq!(seen, (0..100).collect::<Vec<u32>>());
    srv.stop().await.unwrap();
}
