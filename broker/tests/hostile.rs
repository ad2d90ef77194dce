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
