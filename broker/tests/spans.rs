//! Tracing: produce, fetch, group join/poll/commit, splits and merges run
//! in spans that name their topic and partition (or group and member), and
//! no token, right or wrong, shows in any field or message at debug level.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::TestServer;
use fissionlog_broker::client::{
    Admin, Connection, Consumer, ConsumerConfig, Producer, ProducerConfig,
};
use fissionlog_broker::protocol::{Isolation, Request, SplitSpec, SyncSpec};
use fissionlog_broker::server::{Grant, ServerConfig, TokenAuthorizer};
use tracing_subscriber::fmt::format::FmtSpan;

const TOKEN: &str = "sekrit-token-value-123";
const WRONG: &str = "wrong-token-value-456";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_run_in_spans_naming_topic_and_partition_and_no_token_is_ever_logged() {
    let out = Captured::default();
    let writer = out.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let auth = TokenAuthorizer::new().grant(Grant {
        name: "app".into(),
        token: TOKEN.into(),
        read: vec!["*".into()],
        write: vec!["*".into()],
        admin: true,
    });
    let srv = TestServer::start(ServerConfig {
        authorizer: Arc::new(auth),
        ..Default::default()
    })
    .await;
    assert!(
        Connection::connect(srv.addr, Some(Bytes::from_static(WRONG.as_bytes())))
            .await
            .is_err()
    );
    let conn = Connection::connect(srv.addr, Some(Bytes::from_static(TOKEN.as_bytes())))
        .await
        .unwrap();
    let admin = Admin::new(conn.clone());
    admin
        .create_topic("spanned", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let producer = Producer::new(conn.clone(), ProducerConfig::new("spanned"));
    for i in 0..10u32 {
        producer
            .send(Some(Bytes::from(format!("k{i}"))), Bytes::from_static(b"v"))
            .await
            .await
            .unwrap();
    }
    conn.call(Request::Fetch {
        topic: "spanned".into(),
        partition: 0,
        offset: 0,
        max_bytes: 1 << 20,
        max_wait_ms: 0,
        isolation: Isolation::Written,
    })
    .await
    .unwrap();
    let mut consumer = Consumer::join(conn.clone(), ConsumerConfig::new("spanned", "g"))
        .await
        .unwrap();
    consumer.poll(10, Duration::from_millis(100)).await.unwrap();
    consumer.commit().await.unwrap();
    let split = admin.split("spanned", 0, SplitSpec::Even).await.unwrap();
    let kids: Vec<u32> = split["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap() as u32)
        .collect();
    admin.merge("spanned", kids[0], kids[1]).await.unwrap();
    consumer.leave().await.unwrap();
    // The topology thread logs the split and merge on its own time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
        if text.contains("partitions merged") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no merge logged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    srv.stop().await.unwrap();

    let text = String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
    for needle in [
        "produce{topic=spanned",
        "fetch{topic=spanned partition=0 offset=0}",
        "group_join{topic=spanned group=g}",
        "group_poll{member=",
        "group_commit{member=",
        "split{topic=spanned partition=0}",
        "merge{topic=spanned partition=",
        "split_request{topic=spanned partition=0}",
    ] {
        assert!(text.contains(needle), "no {needle:?} in the log:\n{text}");
    }
    assert!(
        text.contains("partitions=[0]"),
        "a produce span names its partitions:\n{text}"
    );
    assert!(!text.contains(TOKEN), "the token was logged:\n{text}");
    assert!(!text.contains(WRONG), "a refused token was logged:\n{text}");
}
