//! Hostile frames: the committed corpus (tests/corpus/frames/) replayed
//! against the decoder and against a live server, which answers each
//! with an error frame or a close, never a panic or a hang, and keeps
//! serving others.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{closed_by_server, raw_hello, TestServer};
use fissionlog_broker::client::{Admin, Connection};
use fissionlog_broker::server::ServerConfig;
use tokio::io::AsyncWriteExt;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/frames");
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("the frame corpus is committed")
        .map(|e| {
            let p = e.expect("a corpus entry").path();
            (
                p.display().to_string(),
                std::fs::read(&p).expect("a corpus file reads"),
            )
        })
        .collect();
    v.sort();
    assert!(v.len() >= 10, "the corpus has its frames");
    v
}

#[test]
fn the_decoder_survives_every_corpus_frame() {
    for (name, bytes) in corpus() {
        let r = std::panic::catch_unwind(|| fissionlog_broker::check_decode(&bytes));
        assert!(r.is_ok(), "{name} panicked the decoder");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_server_answers_every_corpus_frame_with_an_error_or_a_close_and_keeps_serving() {
    let srv = TestServer::start(ServerConfig {
        max_frame_bytes: 1 << 20,
        ..Default::default()
    })
    .await;
    for (name, bytes) in corpus() {
        let mut s = raw_hello(srv.addr).await;
        s.write_all(&bytes).await.unwrap();
        // A frame cut short leaves the server waiting for the rest: the
        // client's half-close ends it.
        let _ = s.shutdown().await;
        let closed = tokio::time::timeout(Duration::from_secs(10), closed_by_server(&mut s)).await;
        assert_eq!(
            closed,
            Ok(true),
            "{name}: the server neither answered nor closed"
        );
    }
    // Still serving.
    let admin = Admin::new(Connection::connect(srv.addr, None).await.unwrap());
    assert!(admin.list_topics().await.is_ok());
    assert!(srv.stats.snapshot().bad_frames >= 8);
    srv.stop().await.unwrap();
}

/// A seeded stream of well-formed but arbitrary requests: unknown and bad
/// topic names, partitions and offsets out of range, members that don't
/// exist, splits at any point, hot-key modes the topic refuses.
fn arbitrary_requests(seed: u64, n: usize) -> Vec<fissionlog_broker::protocol::Request> {
    use bytes::Bytes;
    use fissionlog_broker::protocol::{
        Acks, HotKeyModeSpec, Isolation, ProduceRecord, Request, SplitSpec, SyncSpec, TailFromSpec,
    };
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let topics = ["t", "u", "bad name!", "", ".", "t2"];
    let mut out = Vec::new();
    for _ in 0..n {
        let topic = topics[(next() % topics.len() as u64) as usize].to_string();
        let partition = (next() % 6) as u32;
        let small = next() % 50;
        let r = match next() % 14 {
            0 => Request::Produce {
                topic,
                acks: [Acks::None, Acks::Leader, Acks::Quorum][(next() % 3) as usize],
                records: (0..small % 5)
                    .map(|i| ProduceRecord {
                        key: (i % 2 == 0).then(|| Bytes::from(format!("k{}", next() % 4))),
                        value: Bytes::from(vec![b'v'; (next() % 300) as usize]),
                        timestamp: (i % 3 == 0).then(|| next() as i64),
                    })
                    .collect(),
            },
            1 => Request::Fetch {
                topic,
                partition,
                offset: if next() % 2 == 0 { small } else { next() },
                max_bytes: (next() % 100_000) as u32,
                max_wait_ms: (next() % 30) as u32,
                isolation: [Isolation::Default, Isolation::Durable, Isolation::Written]
                    [(next() % 3) as usize],
            },
            2 => Request::JoinGroup {
                topic,
                group: "g".into(),
                session_timeout_ms: (next() % 3) as u32 * 1000,
                processing_timeout_ms: 5000,
                instance_id: None,
            },
            3 => Request::Heartbeat { member: small },
            4 => Request::GroupPoll {
                member: small,
                max_records: (next() % 10) as u32,
                max_bytes: (next() % 5000) as u32,
                max_wait_ms: 5,
            },
            5 => Request::Commit { member: small },
            6 => Request::LeaveGroup { member: small },
            7 => Request::CreateTopic {
                topic,
                partitions: (next() % 4) as u32,
                sync: [
                    SyncSpec::Never,
                    SyncSpec::IntervalMs(next() % 50),
                    SyncSpec::Always,
                ][(next() % 3) as usize],
                max_record_bytes: (next() % 3) as u32 * 4096,
                target_bytes_per_sec: next() % 2,
                auto_balance: next() % 2 == 0,
            },
            8 => Request::Describe { topic },
            9 => Request::Split {
                topic,
                partition,
                plan: [
                    SplitSpec::Even,
                    SplitSpec::LoadMedian,
                    SplitSpec::At(next()),
                    SplitSpec::HotKey(Bytes::from_static(b"k1")),
                ][(next() % 4) as usize]
                    .clone(),
            },
            10 => Request::Merge {
                topic,
                a: partition,
                b: (next() % 6) as u32,
            },
            11 => Request::TailSplit {
                topic,
                partition,
                plan: SplitSpec::Even,
                from: if next() % 2 == 0 {
                    TailFromSpec::Offset(small)
                } else {
                    TailFromSpec::SlowestGroup
                },
            },
            12 => Request::SetHotKeyMode {
                topic,
                key: Bytes::from_static(b"k0"),
                mode: [
                    HotKeyModeSpec::Strict,
                    HotKeyModeSpec::WindowedMs(next() % 100),
                    HotKeyModeSpec::Spread,
                ][(next() % 3) as usize],
                lanes: (next() % 70) as u32,
            },
            _ => Request::ListGroups {
                topic: (next() % 2 == 0).then_some(topic),
            },
        };
        out.push(r);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_well_formed_requests_each_get_an_answer_and_the_server_keeps_serving() {
    let seed = 0x00b0_c4e7;
    let srv = TestServer::start(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    let admin = Admin::new(conn.clone());
    admin
        .create_topic(
            "t",
            2,
            fissionlog_broker::protocol::SyncSpec::Never,
            0,
            false,
        )
        .await
        .unwrap();
    let reqs = arbitrary_requests(seed, 600);
    // Pipelined, many at a time, as a client may.
    let mut tasks = Vec::new();
    for (i, r) in reqs.into_iter().enumerate() {
        let c = conn.clone();
        tasks.push(tokio::spawn(async move {
            (i, format!("{r:?}"), c.call(r).await)
        }));
    }
    for t in tasks {
        let (i, what, r) = tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .unwrap_or_else(|_| panic!("seed {seed:#x}: a request got no answer within 30 s"))
            .expect("the task does not panic");
        if let Err(e) = r {
            assert!(
                e.code().is_some(),
                "seed {seed:#x}, request {i} {what}: not a server error: {e}"
            );
            assert_ne!(
                e.code(),
                Some(fissionlog_broker::protocol::ErrorCode::Internal),
                "seed {seed:#x}, request {i} {what}: {e}"
            );
        }
    }
    assert!(admin.list_topics().await.is_ok());
    assert!(
        srv.stop_and_reopen_is_clean().await,
        "seed {seed:#x}: the log did not close cleanly"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_connects_and_never_sends_its_hello_is_closed_and_frees_its_slot() {
    let srv = TestServer::start(ServerConfig {
        max_connections: 1,
        tls_handshake_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let mut silent = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    assert!(
        closed_by_server(&mut silent).await,
        "a connection without a Hello is held open"
    );
    // Half a Hello, then silence: the same.
    let mut partial = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    partial.write_all(&[40, 0, 0, 0, 1]).await.unwrap();
    assert!(
        closed_by_server(&mut partial).await,
        "a connection with half a Hello is held open"
    );
    let admin = Admin::new(Connection::connect(srv.addr, None).await.unwrap());
    assert!(admin.list_topics().await.is_ok(), "the slot was freed");
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_frame_longer_than_any_hello_is_refused_before_its_body_is_read() {
    use fissionlog_broker::protocol::{ErrorCode, Response};
    let srv = TestServer::start(ServerConfig::default()).await;
    let mut s = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    // 8 MiB announced (under the frame limit), none of it sent: an
    // unauthenticated client must not get the server to buffer that much.
    s.write_all(&(8u32 << 20).to_le_bytes()).await.unwrap();
    match common::read_response(&mut s).await {
        Some((_, Response::Error { code, .. })) => assert_eq!(code, ErrorCode::FrameTooLarge),
        other => panic!("no refusal of the oversized Hello: {other:?}"),
    }
    assert!(closed_by_server(&mut s).await);
    srv.stop().await.unwrap();
}
