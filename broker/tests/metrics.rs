//! `/metrics` on the HTTP listener: after produce, fetch, group and
//! split/merge traffic, the named series exist and their values moved.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{http_get, TestServer};
use fissionlog_broker::client::{
    Admin, Connection, Consumer, ConsumerConfig, Producer, ProducerConfig,
};
use fissionlog_broker::protocol::{Acks, Isolation, Request, SplitSpec, SyncSpec};
use fissionlog_broker::server::metrics::names;
use fissionlog_broker::server::ServerConfig;

/// The value of the first sample of `name` whose labels include `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let (label_part, value) = match rest.strip_prefix('{') {
            Some(r) => {
                let (ls, v) = r.split_once('}')?;
                (ls, v)
            }
            None if rest.starts_with(' ') => ("", rest),
            None => return None,
        };
        let ok = labels
            .iter()
            .all(|(k, v)| label_part.contains(&format!("{k}=\"{v}\"")));
        if !ok {
            return None;
        }
        value.trim().parse().ok()
    })
}

async fn scrape(srv: &TestServer) -> String {
    let (status, body) = http_get(srv.http_addr.expect("an HTTP listener"), "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_name_the_traffic_and_move_with_it() {
    let srv = TestServer::start_with_http(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    let admin = Admin::new(conn.clone());
    admin
        .create_topic("metered", 2, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let before = scrape(&srv).await;
    let produced_before = sample(
        &before,
        names::REQUESTS,
        &[("op", "produce"), ("outcome", "ok")],
    )
    .unwrap_or(0.0);

    let mut consumer = Consumer::join(conn.clone(), ConsumerConfig::new("metered", "g"))
        .await
        .unwrap();
    let mut cfg = ProducerConfig::new("metered");
    cfg.acks = Acks::Quorum; // through the sync thread: sync rounds are timed
    let producer = Producer::new(conn.clone(), cfg);
    let mut acks = Vec::new();
    for i in 0..200u32 {
        let key = Bytes::from(format!("key-{}", i % 17));
        acks.push(producer.send(Some(key), Bytes::from(vec![b'x'; 100])).await);
    }
    for a in acks {
        a.await.unwrap();
    }
    conn.call(Request::Fetch {
        topic: "metered".into(),
        partition: 0,
        offset: 0,
        max_bytes: 1 << 20,
        max_wait_ms: 0,
        isolation: Isolation::Written,
    })
    .await
    .unwrap();
    let got = consumer.poll(50, Duration::from_millis(200)).await.unwrap();
    assert!(!got.is_empty());
    consumer.commit().await.unwrap();
    let split = admin.split("metered", 0, SplitSpec::Even).await.unwrap();
    let children: Vec<u32> = split["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap() as u32)
        .collect();
    admin
        .merge("metered", children[0], children[1])
        .await
        .unwrap();

    // Topology events arrive on their own thread: wait for them.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        let text = scrape(&srv).await;
        let topic = [("topic", "metered")];
        if sample(&text, names::SPLITS, &topic).unwrap_or(0.0) >= 1.0
            && sample(&text, names::MERGES, &topic).unwrap_or(0.0) >= 1.0
        {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no split/merge counts within 10 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let v = |name: &str, labels: &[(&str, &str)]| {
        sample(&after, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in\n{after}"))
    };
    let produced = v(names::REQUESTS, &[("op", "produce"), ("outcome", "ok")]);
    assert!(produced > produced_before, "{produced} > {produced_before}");
    assert!(v(names::REQUESTS, &[("op", "fetch"), ("outcome", "ok")]) >= 1.0);
    assert!(v(names::REQUESTS, &[("op", "group_join"), ("outcome", "ok")]) >= 1.0);
    assert!(v(names::REQUESTS, &[("op", "group_poll"), ("outcome", "ok")]) >= 1.0);
    assert!(
        v(
            names::REQUESTS,
            &[("op", "group_commit"), ("outcome", "ok")]
        ) >= 1.0
    );
    let fetch_count = format!("{}_count", names::REQUEST_SECONDS);
    assert!(v(&fetch_count, &[("op", "fetch")]) >= 1.0);
    let produce_buckets = format!("{}_bucket", names::REQUEST_SECONDS);
    assert!(v(&produce_buckets, &[("op", "produce"), ("le", "+Inf")]) >= 1.0);
    let sync_rounds = format!("{}_count", names::SYNC_ROUND_SECONDS);
    assert!(v(&sync_rounds, &[]) >= 1.0);
    assert!(v(names::BYTES_IN, &[]) > 200.0 * 100.0);
    assert!(v(names::BYTES_OUT, &[]) > 0.0);
    assert!(v(names::CONNECTIONS_OPEN, &[]) >= 1.0);
    assert!(v(names::CONNECTIONS_ACCEPTED, &[]) >= 1.0);
    assert!(v(names::RECORDS_PRODUCED, &[]) >= 200.0);
    assert!(v(names::RECORDS_SENT, &[]) >= 1.0);
    let rate_of = |p: &str| {
        sample(
            &after,
            names::PARTITION_RECORDS_PER_SEC,
            &[("topic", "metered"), ("partition", p)],
        )
        .unwrap_or(0.0)
    };
    assert!(
        rate_of("0") + rate_of("1") > 0.0,
        "an append rate moved:\n{after}"
    );
    assert_eq!(
        v(
            names::PARTITION_SEALED,
            &[("topic", "metered"), ("partition", "0")]
        ),
        1.0
    );
    assert!(v(names::TOPIC_ACTIVE_PARTITIONS, &[("topic", "metered")]) >= 2.0);
    let group = [("topic", "metered"), ("group", "g")];
    assert!(v(names::GROUP_LAG, &group) >= 0.0);
    assert_eq!(
        v(
            names::GROUP_MEMBERS,
            &[("topic", "metered"), ("group", "g"), ("state", "active")]
        ),
        1.0
    );
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_listener_answers_unknown_paths_with_404_and_serves_the_page() {
    let srv = TestServer::start_with_http(ServerConfig::default()).await;
    let addr = srv.http_addr.unwrap();
    let (status, _) = http_get(addr, "/nothing-here").await;
    assert_eq!(status, 404);
    let (status, page) = http_get(addr, "/").await;
    assert_eq!(status, 200);
    assert!(page.contains("new EventSource(\"/events\")"));
    let (status, state) = http_get(addr, "/state").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert!(v["topics"].is_array());
    srv.stop().await.unwrap();
}

/// Sends `raw` on a fresh connection and reads the answer (or the close)
/// within 15 s: the status code, 0 when the server closed without one.
async fn raw_http(addr: std::net::SocketAddr, raw: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(raw).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut out))
        .await
        .expect("the server answers or closes within 15 s");
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_http_requests_get_an_error_or_a_close_and_the_listener_keeps_serving() {
    let srv = TestServer::start_with_http(ServerConfig::default()).await;
    let addr = srv.http_addr.unwrap();
    for method in [
        "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "TRACE", "CONNECT",
    ] {
        let req = format!("{method} /state HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (status, _) = raw_http(addr, req.as_bytes()).await;
        assert_eq!(status, 405, "{method}");
    }
    for path in [
        "/../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "//etc/passwd",
        "/state/../x",
    ] {
        let (status, body) = http_get(addr, path).await;
        assert_eq!(status, 404, "{path}");
        assert!(!body.contains("root:"), "{path}");
    }
    let (status, _) = http_get(addr, "/state?topic=../../x&a=b").await;
    assert_eq!(status, 200);
    // A request line and a header of a megabyte each.
    let long_path = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(1 << 20));
    let (status, _) = raw_http(addr, long_path.as_bytes()).await;
    assert!(
        status == 0 || status >= 400,
        "a 1 MiB request line got {status}"
    );
    let long_header = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "b".repeat(1 << 20)
    );
    let (status, _) = raw_http(addr, long_header.as_bytes()).await;
    assert!(status == 0 || status >= 400, "a 1 MiB header got {status}");
    // Garbage, a bare HTTP/1.0 request, and pipelined keep-alive requests.
    let (status, _) = raw_http(addr, b"\x16\x03\x01\x00\xff garbage\r\n\r\n").await;
    assert!(status == 0 || status >= 400);
    let (status, _) = raw_http(addr, b"GET /state HTTP/1.0\r\n\r\n").await;
    assert_eq!(status, 200);
    let pipelined = "GET /state HTTP/1.1\r\nHost: x\r\n\r\n".repeat(50)
        + "GET /state HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let (status, text) = raw_http(addr, pipelined.as_bytes()).await;
    assert_eq!(status, 200);
    assert_eq!(text.matches("HTTP/1.1 200").count(), 51);
    let (status, _) = http_get(addr, "/state").await;
    assert_eq!(status, 200);
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_http_connections_past_the_limit_are_closed_and_the_silent_ones_time_out() {
    use tokio::io::AsyncReadExt;
    let srv = TestServer::start_with_http(ServerConfig {
        http_max_connections: 2,
        ..ServerConfig::default()
    })
    .await;
    let addr = srv.http_addr.unwrap();
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The third is closed at once.
    let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf))
        .await
        .expect("a connection past the limit is closed at once");
    assert!(matches!(n, Ok(0) | Err(_)));
    // The silent ones are closed by the 10 s header timeout.
    let started = std::time::Instant::now();
    for mut s in silent {
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
            .await
            .expect("a silent connection is closed by the header timeout");
        assert!(matches!(n, Ok(0) | Err(_)));
    }
    assert!(started.elapsed() < Duration::from_secs(15));
    let (status, _) = http_get(addr, "/state").await;
    assert_eq!(status, 200);
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_librarys_own_series_show_on_the_brokers_metrics() {
    use fissionlog::metrics::names as lib;
    let srv = TestServer::start_with_http(ServerConfig::default()).await;
    let conn = Connection::connect(srv.addr, None).await.unwrap();
    let admin = Admin::new(conn.clone());
    admin
        .create_topic("libmetered", 1, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let mut cfg = ProducerConfig::new("libmetered");
    cfg.acks = Acks::Quorum; // a sync round per batch at least
    let producer = Producer::new(conn.clone(), cfg);
    let mut acks = Vec::new();
    for i in 0..50u32 {
        let key = Bytes::from(format!("key-{i}"));
        acks.push(producer.send(Some(key), Bytes::from(vec![b'x'; 10])).await);
    }
    for a in acks {
        a.await.unwrap();
    }
    admin.split("libmetered", 0, SplitSpec::Even).await.unwrap();
    let text = scrape(&srv).await;
    let topic = [("topic", "libmetered"), ("partition", "0")];
    assert_eq!(
        sample(&text, lib::APPENDED_RECORDS, &topic),
        Some(50.0),
        "{text}"
    );
    assert!(sample(&text, lib::APPENDED_BYTES, &topic).unwrap_or(0.0) >= 500.0);
    let splits = [("topic", "libmetered"), ("kind", "split")];
    assert_eq!(
        sample(&text, lib::TOPOLOGY_CHANGES, &splits),
        Some(1.0),
        "{text}"
    );
    let rounds = format!("{}_count", lib::SYNC_ROUND_SECONDS);
    assert!(sample(&text, &rounds, &[]).unwrap_or(0.0) >= 1.0, "{text}");
    srv.stop().await.unwrap();
}
