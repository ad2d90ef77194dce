//! Shared fixtures: an in-process server on loopback, raw-socket helpers.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fissionlog::{Log, LogOptions};
use fissionlog_broker::protocol::{concat, split_frame, Request, Response, PROTOCOL_VERSION};
use fissionlog_broker::server::{serve_with_http, ServerConfig, ServerStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct TestServer {
    pub addr: SocketAddr,
    /// The HTTP listener (metrics, live view), when started with one.
    pub http_addr: Option<SocketAddr>,
    pub stats: Arc<ServerStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<fissionlog::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub async fn start(config: ServerConfig) -> TestServer {
        TestServer::start_inner(config, false).await
    }

    /// A server with an HTTP listener on loopback too.
    pub async fn start_with_http(config: ServerConfig) -> TestServer {
        TestServer::start_inner(config, true).await
    }

    async fn start_inner(config: ServerConfig, with_http: bool) -> TestServer {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = Log::open(dir.path(), LogOptions::default()).expect("a fresh log opens");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let http = if with_http {
            Some(
                tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("a loopback port"),
            )
        } else {
            None
        };
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(serve_with_http(
            log,
            listener,
            http,
            config,
            async move {
                let _ = rx.await;
            },
            move |h| {
                let _ = ready_tx.send(h);
            },
        ));
        let h = ready_rx.await.expect("the server starts");
        TestServer {
            addr: h.addr,
            http_addr: h.http_addr,
            stats: h.stats,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
    }

    /// Stops the server, then reopens its log: whether the close was clean
    /// (the reopen scanned nothing).
    pub async fn stop_and_reopen_is_clean(mut self) -> bool {
        let dir = std::mem::replace(
            &mut self._dir,
            tempfile::tempdir().expect("a temporary directory"),
        );
        self.stop().await.expect("the log closes");
        let log = Log::open(dir.path(), LogOptions::default()).expect("the log reopens");
        log.recovery_report().clean_shutdown
    }

    /// Stops the server and waits for the log to close.
    pub async fn stop(mut self) -> fissionlog::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.task.take() {
            Some(t) => tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("the server stops within 20 s")
                .expect("the server task does not panic"),
            None => Ok(()),
        }
    }
}

/// A plain HTTP/1.1 GET on loopback: the status code and the body
/// (`Connection: close`, so the body is everything after the head).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.expect("the HTTP listener");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .expect("the request is sent");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the answer comes within 10 s")
        .expect("the answer is read");
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

/// A raw connection that has sent its Hello.
pub async fn raw_hello(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let hello = Request::Hello {
        min_version: PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        client: "raw".into(),
        token: None,
    };
    s.write_all(&concat(&hello.encode(0)))
        .await
        .expect("write hello");
    match read_response(&mut s).await {
        Some((_, Response::HelloOk { .. })) => s,
        other => panic!("no HelloOk: {other:?}"),
    }
}

/// Reads one response; `None` when the server closed (or 5 s passed).
pub async fn read_response(s: &mut TcpStream) -> Option<(u32, Response)> {
    let mut len = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut len))
        .await
        .ok()?
        .ok()?;
    let n = u32::from_le_bytes(len) as usize;
    assert!(n < 64 << 20, "response length {n}");
    let mut body = vec![0u8; n];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut body))
        .await
        .ok()?
        .ok()?;
    let mut whole = len.to_vec();
    whole.extend_from_slice(&body);
    let (f, _) = split_frame(&Bytes::from(whole), u32::MAX)
        .expect("the server sends valid frames")
        .expect("whole");
    Some((
        f.request_id,
        Response::decode(f.opcode, f.body).expect("the server's response decodes"),
    ))
}

/// Reads until the server closes the connection (or 5 s pass); true if closed.
pub async fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}
