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
        min_version: fissionlog_broker::protocol::PROTOCOL_VERSION + 1,
        max_version: fissionlog_broker::protocol::PROTOCOL_VERSION + 8,
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

/// The version a single node answers a `Hello` with: the newest both
/// sides speak. Version 3 added codes 25 and 26, which a single node never
/// sends, so it still takes a version 2 client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_answers_the_newest_common_version_and_still_takes_version_2() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let newest = fissionlog_broker::protocol::PROTOCOL_VERSION;
    assert!(newest >= 3, "codes 25 and 26 came with version 3");
    for (min, max, want) in [(2, 2, 2), (2, 3, 3), (3, 3, 3), (2, newest + 5, newest)] {
        let mut s = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
        let hello = Request::Hello {
            min_version: min,
            max_version: max,
            client: "versions".into(),
            token: None,
        };
        s.write_all(&concat(&hello.encode(1))).await.unwrap();
        match read_response(&mut s).await {
            Some((1, Response::HelloOk { version, .. })) => assert_eq!(
                version, want,
                "a Hello for {min}..={max} is answered with version {want}"
            ),
            other => panic!("a Hello for {min}..={max} is taken: {other:?}"),
        }
    }
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

fn one_record(topic: &str, acks: Acks, key: Option<&str>, value: Vec<u8>) -> Request {
    Request::Produce {
        topic: topic.into(),
        acks,
        records: vec![fissionlog_broker::protocol::ProduceRecord {
            key: key.map(|k| Bytes::from(k.to_string())),
            value: Bytes::from(value),
            timestamp: None,
        }],
    }
}

/// Starts every request before waiting for any: they queue on the
/// connection's append queue together. Returns each answer, in order.
async fn pipelined(
    conn: &Connection,
    reqs: Vec<Request>,
) -> Vec<Result<Response, fissionlog_broker::client::ClientError>> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let c = conn.clone();
    let sender = tokio::spawn(async move {
        for r in reqs {
            let call = c.start(r).await.unwrap();
            if tx.send(call).is_err() {
                break;
            }
        }
    });
    let mut out = Vec::new();
    while let Some(call) = rx.recv().await {
        out.push(call.wait().await);
    }
    sender.await.unwrap();
    out
}

/// Every record of a partition, as (key, value).
async fn read_all(conn: &Connection, topic: &str, partition: u32) -> Vec<(Option<Bytes>, Bytes)> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let r = conn
            .call(Request::Fetch {
                topic: topic.into(),
                partition,
                offset,
                max_bytes: 1 << 20,
                max_wait_ms: 0,
                isolation: Isolation::Written,
            })
            .await
            .unwrap();
        let Response::Fetched {
            next_offset,
            high_watermark,
            records,
            ..
        } = r
        else {
            panic!("not a fetch answer: {r:?}");
        };
        for rec in records {
            out.push((rec.key, rec.value));
        }
        if next_offset >= high_watermark {
            return out;
        }
        offset = next_offset;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_single_record_produces_are_each_answered_with_their_own_increasing_offsets_per_key(
) {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    Admin::new(conn.clone())
        .create_topic("t", 3, SyncSpec::Always, 0, false)
        .await
        .unwrap();
    let n = 2000usize;
    let keys = ["a", "b", "c", "d", "e"];
    for acks in [Acks::Leader, Acks::Quorum] {
        let reqs = (0..n)
            .map(|i| {
                one_record(
                    "t",
                    acks,
                    Some(keys[i % keys.len()]),
                    format!("{acks:?}{i}").into_bytes(),
                )
            })
            .collect();
        let answers = pipelined(&conn, reqs).await;
        let mut last: std::collections::HashMap<&str, (u32, u64)> = Default::default();
        let mut seen = std::collections::HashSet::new();
        for (i, a) in answers.into_iter().enumerate() {
            let Ok(Response::Produced { positions }) = a else {
                panic!("request {i}: {a:?}");
            };
            assert_eq!(positions.len(), 1, "request {i} has its own one position");
            let (p, o) = positions[0];
            assert!(seen.insert((p, o)), "position {p}/{o} answered twice");
            let k = keys[i % keys.len()];
            if let Some(&(lp, lo)) = last.get(k) {
                assert_eq!(p, lp, "key {k} changed partition");
                assert!(o > lo, "key {k}: offset {o} after {lo}");
            }
            last.insert(k, (p, o));
        }
    }
    // Nothing duplicated or lost, and each key's values in the order sent.
    let mut by_key: std::collections::HashMap<Bytes, Vec<Bytes>> = Default::default();
    for p in 0..3 {
        for (k, v) in read_all(&conn, "t", p).await {
            by_key.entry(k.unwrap()).or_default().push(v);
        }
    }
    assert_eq!(by_key.values().map(Vec::len).sum::<usize>(), 2 * n);
    for (ki, k) in keys.iter().enumerate() {
        let want: Vec<Bytes> = [Acks::Leader, Acks::Quorum]
            .iter()
            .flat_map(|acks| {
                (0..n)
                    .filter(move |i| i % keys.len() == ki)
                    .map(move |i| Bytes::from(format!("{acks:?}{i}")))
            })
            .collect();
        assert_eq!(by_key[&Bytes::from(k.to_string())], want, "key {k}");
    }
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_request_among_pipelined_produces_fails_alone() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    conn.call(Request::CreateTopic {
        topic: "t".into(),
        partitions: 1,
        sync: SyncSpec::Always,
        max_record_bytes: 512,
        target_bytes_per_sec: 0,
        auto_balance: false,
    })
    .await
    .unwrap();
    let n = 600usize;
    let bad = |i: usize| i % 100 == 57;
    let reqs = (0..n)
        .map(|i| {
            let len = if bad(i) { 4096 } else { 8 };
            let mut v = format!("{i:08}").into_bytes();
            v.resize(len, b'x');
            if i % 150 == 99 {
                one_record("nope", Acks::Leader, None, v)
            } else {
                one_record("t", Acks::Leader, Some("k"), v)
            }
        })
        .collect();
    let answers = pipelined(&conn, reqs).await;
    let mut next = 0u64;
    for (i, a) in answers.into_iter().enumerate() {
        if bad(i) {
            let e = a.expect_err("a too large record fails");
            assert_eq!(
                e.code(),
                Some(ErrorCode::RecordTooLarge),
                "request {i}: {e}"
            );
        } else if i % 150 == 99 {
            let e = a.expect_err("an unknown topic fails");
            assert_eq!(e.code(), Some(ErrorCode::UnknownTopic), "request {i}: {e}");
        } else {
            let Ok(Response::Produced { positions }) = a else {
                panic!("request {i}: {a:?}");
            };
            assert_eq!(positions, vec![(0, next)], "request {i}");
            next += 1;
        }
    }
    let got = read_all(&conn, "t", 0).await;
    let want: Vec<usize> = (0..n).filter(|&i| !bad(i) && i % 150 != 99).collect();
    assert_eq!(got.len(), want.len());
    for ((_, v), i) in got.iter().zip(want) {
        assert_eq!(&v[..8], format!("{i:08}").as_bytes());
    }
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_acks_none_produces_are_answered_at_once_and_all_appended_in_order() {
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    Admin::new(conn.clone())
        .create_topic("t", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let n = 1500usize;
    let mut reqs: Vec<Request> = (0..n)
        .map(|i| one_record("t", Acks::None, Some("k"), format!("{i}").into_bytes()))
        .collect();
    reqs.push(one_record("t", Acks::Leader, Some("k"), b"last".to_vec()));
    let answers = pipelined(&conn, reqs).await;
    for (i, a) in answers.iter().take(n).enumerate() {
        assert!(
            matches!(a, Ok(Response::Produced { positions }) if positions.is_empty()),
            "request {i}: {a:?}"
        );
    }
    // The acknowledged produce after them lands after all of them.
    assert!(
        matches!(&answers[n], Ok(Response::Produced { positions }) if positions == &vec![(0, n as u64)]),
        "{:?}",
        answers[n]
    );
    let got = read_all(&conn, "t", 0).await;
    assert_eq!(got.len(), n + 1);
    for (i, (_, v)) in got.iter().take(n).enumerate() {
        assert_eq!(v, &Bytes::from(format!("{i}")));
    }
    srv.stop().await.unwrap();
}
