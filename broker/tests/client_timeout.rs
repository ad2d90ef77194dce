//! The client's request timeout: a server that accepted the connection and
//! then goes silent ends the wait with a typed error, and a late response
//! is never delivered to a later request.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use fissionlog_broker::client::{ClientError, Connection};
use fissionlog_broker::protocol::{frame_len, split_frame, Request, Response, LEN_PREFIX};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TIMEOUT: Duration = Duration::from_millis(200);
/// The heartbeat opcode (docs/PROTOCOL.md): its answer is `Done`.
const HEARTBEAT: u8 = 0x11;

/// Reads one request frame; None when the client closed.
async fn read_request(s: &mut TcpStream, buf: &mut BytesMut) -> Option<(u32, Request)> {
    loop {
        if let Some(len) = frame_len(buf, 1 << 20).expect("frame length") {
            if buf.len() >= LEN_PREFIX + len {
                let b = buf.split_to(LEN_PREFIX + len).freeze();
                let (f, _) = split_frame(&b, 1 << 20).expect("frame").expect("whole");
                let req = Request::decode(f.opcode, f.body).expect("request");
                return Some((f.request_id, req));
            }
        }
        if s.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

async fn write_response(s: &mut TcpStream, id: u32, r: Response) {
    for chunk in r.encode(id) {
        s.write_all(&chunk).await.expect("write");
    }
}

/// A fake broker that answers the handshake, then hands each request to
/// `answer`, which says after how long to reply (None: never).
async fn fake_server(answer: fn(u32) -> Option<Duration>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut buf = BytesMut::new();
        let (id, _) = read_request(&mut s, &mut buf).await.expect("hello");
        let hello = Response::HelloOk {
            version: fissionlog_broker::protocol::PROTOCOL_VERSION,
            max_frame_bytes: 1 << 20,
            max_in_flight: 8,
            server: "fake".into(),
        };
        write_response(&mut s, id, hello).await;
        let mut nth = 0;
        let mut late = Vec::new();
        while let Some((id, _)) = read_request(&mut s, &mut buf).await {
            if let Some(delay) = answer(nth) {
                late.push((Instant::now() + delay, id, nth));
            }
            nth += 1;
            late.sort();
            // Answer everything due, in due order, before reading on.
            while let Some(&(at, id, n)) = late.first() {
                tokio::time::sleep_until(at.into()).await;
                late.remove(0);
                let generation = n as u64;
                write_response(
                    &mut s,
                    id,
                    Response::Done {
                        opcode: HEARTBEAT,
                        generation,
                    },
                )
                .await;
            }
        }
    });
    addr
}

fn topology() -> Request {
    Request::Topology { topic: "t".into() }
}

#[tokio::test]
async fn a_silent_server_ends_the_wait_with_timeout() {
    let addr = fake_server(|_| None).await;
    let conn = Connection::connect(addr, None).await.expect("connect");
    conn.set_request_timeout(TIMEOUT);
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(10), conn.call(topology()))
        .await
        .expect("the call must end by itself");
    assert!(
        matches!(r, Err(ClientError::Timeout { waited }) if waited == TIMEOUT),
        "{r:?}"
    );
    assert!(started.elapsed() >= TIMEOUT);
    // The timed-out call gave its in-flight slot back: more calls can start.
    for _ in 0..20 {
        let r = conn.call(topology()).await;
        assert!(matches!(r, Err(ClientError::Timeout { .. })), "{r:?}");
    }
}

#[tokio::test]
async fn a_late_response_is_not_delivered_to_the_next_request() {
    // The first request is answered after the client gave up on it; the
    // second at once after that. The second must get its own answer
    // (generation 1), never the first's (generation 0).
    let addr = fake_server(|n| Some(if n == 0 { TIMEOUT * 3 } else { Duration::ZERO })).await;
    let conn = Connection::connect(addr, None).await.expect("connect");
    conn.set_request_timeout(TIMEOUT);
    let first = conn.call(topology()).await;
    assert!(
        matches!(first, Err(ClientError::Timeout { .. })),
        "{first:?}"
    );
    // Wait long enough now that the first's late answer reaches the
    // client while the second is waiting.
    conn.set_request_timeout(TIMEOUT * 20);
    let second = tokio::time::timeout(Duration::from_secs(10), conn.call(topology()))
        .await
        .expect("bounded");
    assert!(
        matches!(second, Ok(Response::Done { generation: 1, .. })),
        "{second:?}"
    );
}
