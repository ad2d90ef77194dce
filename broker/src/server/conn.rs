//! One connection: a reader loop, a writer task, one task per request.
//!
//! Generic over the byte stream (`AsyncRead + AsyncWrite`), so TLS slots
//! in as a wrapper around the TCP stream without touching this file.

use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::auth::Principal;
use super::cluster::handlers as cluster_handlers;
use super::handlers;
use super::stats::ServerStats;
use super::Shared;
use crate::protocol::{
    frame_len, negotiate_version, split_frame, ErrorCode, ProtocolError, Request, Response,
    LEN_PREFIX, MIN_CLUSTER_PROTOCOL_VERSION, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

/// A group member joined on this connection.
pub(crate) struct Joined {
    pub member: fissionlog::Member,
    /// What the topic's largest record costs in a poll answer: the most
    /// one record handed out can add to it.
    pub max_record_cost: usize,
}

pub(crate) type MemberSlot = Arc<Mutex<Joined>>;

/// What the request tasks of one connection share.
pub(crate) struct Conn {
    pub shared: Arc<Shared>,
    pub principal: Principal,
    pub members: Mutex<HashMap<u64, MemberSlot>>,
    /// Produce requests, appended one after another in the order they
    /// were read: per-key order across a client's pipelined batches.
    /// Taken when the connection ends, so the append queue drains and stops.
    pub produce_tx: Mutex<Option<mpsc::Sender<handlers::ProduceJob>>>,
    out: Outbox,
}

/// The sending side of the write queue, counting its depth.
#[derive(Clone)]
pub(crate) struct Outbox {
    tx: mpsc::Sender<Vec<Bytes>>,
    depth: Arc<AtomicU64>,
    stats: Arc<ServerStats>,
}

impl Outbox {
    /// Queues a frame; waits while the queue is full. False once the
    /// writer is gone.
    pub async fn send(&self, frame: Vec<Bytes>) -> bool {
        if self.tx.send(frame).await.is_err() {
            return false;
        }
        let d = self.depth.fetch_add(1, Ordering::Relaxed) + 1;
        ServerStats::raise(&self.stats.write_queue_max, d);
        true
    }
}

/// One request counted in flight on its connection. Released (once) just
/// before its response is queued: a client that sends its next request
/// as each answer arrives then never finds its slot still taken. Dropping
/// it releases it too (a request that ends without an answer).
pub(crate) struct InFlight(Option<Arc<AtomicU64>>);

impl InFlight {
    pub fn release(&mut self) {
        if let Some(c) = self.0.take() {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.release();
    }
}

impl Conn {
    pub async fn respond(&self, request_id: u32, r: Response) -> bool {
        self.out.send(r.encode(request_id)).await
    }
}

/// Serves one connection until it closes, fails or the server stops.
pub(crate) async fn handle<S>(stream: S, peer: SocketAddr, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let stats = shared.stats.clone();
    stats.connections_open.fetch_add(1, Ordering::Relaxed);
    stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
    let span = tracing::debug_span!("connection", %peer);
    let _ = tracing::Instrument::instrument(serve(stream, shared), span).await;
    stats.connections_open.fetch_sub(1, Ordering::Relaxed);
}

/// The longest first frame (the `Hello`: versions, the client's name, a
/// token) the server reads from a client that has not authenticated yet.
const HELLO_MAX_BYTES: u32 = 64 << 10;

async fn serve<S>(stream: S, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, wr) = tokio::io::split(stream);
    let cfg = &shared.config;
    let (tx, rx) = mpsc::channel::<Vec<Bytes>>(cfg.write_queue_frames.max(1));
    let depth = Arc::new(AtomicU64::new(0));
    let out = Outbox {
        tx,
        depth: depth.clone(),
        stats: shared.stats.clone(),
    };
    let (done_tx, mut writer_done) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_loop(
        wr,
        rx,
        depth,
        shared.clone(),
        WriterDone(done_tx),
    ));
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let max = cfg.max_frame_bytes;

    // The handshake: exactly one Hello, first, within the handshake
    // timeout and at most `HELLO_MAX_BYTES`: before it, the client is
    // nobody, and must not hold a connection slot or a frame's buffer.
    let hello = tokio::time::timeout(
        cfg.tls_handshake_timeout,
        read_frame(&mut rd, &mut buf, max.min(HELLO_MAX_BYTES), &shared),
    )
    .await;
    let Ok(hello) = hello else {
        tracing::debug!("no Hello within the handshake timeout: closed");
        return finish(writer, out).await;
    };
    let principal = match hello {
        Ok(Some(frame)) => match Request::decode(frame.opcode, frame.body) {
            Ok(Request::Hello {
                min_version,
                max_version,
                token,
                ..
            }) => {
                let cluster = shared.config.cluster.is_some();
                let Some(version) = negotiate_version(min_version, max_version, cluster) else {
                    let lowest = if cluster {
                        MIN_CLUSTER_PROTOCOL_VERSION
                    } else {
                        MIN_PROTOCOL_VERSION
                    };
                    let msg = format!(
                        "this server speaks protocol versions {lowest}..={PROTOCOL_VERSION}, the client asked for {min_version}..={max_version}"
                    );
                    close_with(
                        &out,
                        frame.request_id,
                        frame.opcode,
                        ErrorCode::UnsupportedVersion,
                        msg,
                    )
                    .await;
                    return finish(writer, out).await;
                };
                match cfg
                    .authorizer
                    .authenticate(token.as_ref().map(|t| &t.0[..]))
                {
                    Some(p) => {
                        let ok = Response::HelloOk {
                            version,
                            max_frame_bytes: max,
                            max_in_flight: cfg.max_in_flight,
                            server: "fissionlog-broker".into(),
                        };
                        if !out.send(ok.encode(frame.request_id)).await {
                            return finish(writer, out).await;
                        }
                        p
                    }
                    None => {
                        close_with(
                            &out,
                            frame.request_id,
                            frame.opcode,
                            ErrorCode::Unauthorized,
                            "the credential was refused".into(),
                        )
                        .await;
                        return finish(writer, out).await;
                    }
                }
            }
            Ok(_) => {
                close_with(
                    &out,
                    frame.request_id,
                    frame.opcode,
                    ErrorCode::HandshakeRequired,
                    "the first request must be Hello".into(),
                )
                .await;
                return finish(writer, out).await;
            }
            Err(e) => {
                shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                close_with(
                    &out,
                    frame.request_id,
                    frame.opcode,
                    ErrorCode::Malformed,
                    e.to_string(),
                )
                .await;
                return finish(writer, out).await;
            }
        },
        Ok(None) => return finish(writer, out).await,
        Err(e) => {
            reject_stream(&out, e, &shared).await;
            return finish(writer, out).await;
        }
    };

    let (produce_tx, produce_rx) = mpsc::channel(cfg.max_in_flight.max(1) as usize);
    let conn = Arc::new(Conn {
        shared: shared.clone(),
        principal,
        members: Mutex::new(HashMap::new()),
        produce_tx: Mutex::new(Some(produce_tx)),
        out: out.clone(),
    });
    let producer = tokio::spawn(handlers::produce_loop(conn.clone(), produce_rx));
    // Cluster mode: produces go one after another through the partition
    // groups, everything else through the cluster's handlers.
    let cluster = shared.config.cluster.clone();
    let (cluster_tx, cluster_producer) = match &cluster {
        Some(c) => {
            let (tx, rx) = mpsc::channel(cfg.max_in_flight.max(1) as usize);
            let task = tokio::spawn(cluster_handlers::produce_loop(conn.clone(), c.clone(), rx));
            (Some(tx), Some(task))
        }
        None => (None, None),
    };
    let in_flight = Arc::new(AtomicU64::new(0));
    let mut shutdown = shared.shutdown.clone();
    loop {
        let frame = tokio::select! {
            f = read_frame(&mut rd, &mut buf, max, &shared) => f,
            _ = shutdown.wait_for(|s| *s) => break,
            // The writer gave up (a stalled or closed socket): so does the reader.
            _ = writer_done.wait_for(|d| *d) => break,
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                reject_stream(&out, e, &shared).await;
                break;
            }
        };
        shared.stats.requests.fetch_add(1, Ordering::Relaxed);
        let req = match Request::decode(frame.opcode, frame.body) {
            Ok(Request::Hello { .. }) => {
                close_with(
                    &out,
                    frame.request_id,
                    frame.opcode,
                    ErrorCode::HandshakeRequired,
                    "a second Hello".into(),
                )
                .await;
                break;
            }
            Ok(r) => r,
            Err(e) => {
                shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                close_with(
                    &out,
                    frame.request_id,
                    frame.opcode,
                    ErrorCode::Malformed,
                    e.to_string(),
                )
                .await;
                break;
            }
        };
        let n = in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        if n > u64::from(cfg.max_in_flight) {
            in_flight.fetch_sub(1, Ordering::AcqRel);
            shared
                .stats
                .in_flight_refused
                .fetch_add(1, Ordering::Relaxed);
            let r = Response::Error {
                opcode: frame.opcode,
                code: ErrorCode::TooManyInFlight,
                message: format!(
                    "more than {} requests outstanding on this connection",
                    cfg.max_in_flight
                ),
            };
            // Waits while the write queue is full: a client that floods
            // and never reads stops being read.
            if !conn.respond(frame.request_id, r).await {
                break;
            }
            continue;
        }
        ServerStats::raise(&shared.stats.in_flight_max, n);
        let slot = InFlight(Some(in_flight.clone()));
        let id = frame.request_id;
        if let (Some(c), Some(tx)) = (&cluster, &cluster_tx) {
            if matches!(req, Request::Produce { .. } | Request::ProduceTo { .. }) {
                // Queued here, in read order.
                if tx.send((id, req, slot)).await.is_err() {
                    break;
                }
            } else {
                tokio::spawn(cluster_handlers::dispatch(
                    conn.clone(),
                    c.clone(),
                    id,
                    req,
                    slot,
                ));
            }
        } else if let Request::Produce {
            topic,
            acks,
            records,
        } = req
        {
            // Queued here, in read order; answered by the append queue.
            handlers::enqueue_produce(&conn, id, topic, acks, records, None, slot).await;
        } else if let Request::ProduceTo {
            topic,
            partition,
            acks,
            stamp,
            records,
        } = req
        {
            let target = Some((partition, stamp));
            handlers::enqueue_produce(&conn, id, topic, acks, records, target, slot).await;
        } else {
            let conn2 = conn.clone();
            tokio::spawn(async move {
                handlers::dispatch(&conn2, id, req, slot).await;
            });
        }
        // Backpressure: while the write queue is full, don't read more.
        tokio::select! {
            slot = out.tx.reserve() => if slot.is_err() { break },
            _ = shutdown.wait_for(|s| *s) => break,
        }
    }
    // Let in-flight requests finish (they stop waiting on shutdown), for
    // at most the grace period.
    let deadline = tokio::time::Instant::now() + cfg.shutdown_grace;
    while in_flight.load(Ordering::Acquire) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    if let Ok(mut p) = conn.produce_tx.lock() {
        p.take();
    }
    drop(cluster_tx);
    if let Some(t) = cluster_producer {
        let _ = t.await;
    }
    drop(conn);
    let _ = producer.await;
    finish(writer, out).await;
}

/// Closes the write queue and waits for the writer to flush it.
async fn finish(writer: tokio::task::JoinHandle<()>, out: Outbox) {
    drop(out);
    let _ = writer.await;
}

async fn close_with(out: &Outbox, request_id: u32, opcode: u8, code: ErrorCode, message: String) {
    tracing::debug!(%code, %message, "closing connection");
    let r = Response::Error {
        opcode,
        code,
        message,
    };
    let _ = out.send(r.encode(request_id)).await;
}

/// Answers a stream-level error (an oversized or short frame) and closes.
async fn reject_stream(out: &Outbox, e: ReadError, shared: &Shared) {
    match e {
        ReadError::Protocol(p) => {
            shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
            let code = match p {
                ProtocolError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
                _ => ErrorCode::Malformed,
            };
            close_with(out, 0, 0, code, p.to_string()).await;
        }
        ReadError::Io(e) => tracing::debug!(error = %e, "read failed"),
    }
}

/// Tells the reader the writer ended, however it ends.
struct WriterDone(tokio::sync::watch::Sender<bool>);

impl Drop for WriterDone {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

pub(crate) enum ReadError {
    Protocol(ProtocolError),
    Io(std::io::Error),
}

/// Reads until one whole frame is buffered. `Ok(None)`: the peer closed
/// between frames. The buffer grows only to the announced length once it
/// was checked against the limit.
async fn read_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    max: u32,
    shared: &Shared,
) -> Result<Option<crate::protocol::RawFrame>, ReadError> {
    loop {
        if let Some(len) = frame_len(buf, max).map_err(ReadError::Protocol)? {
            let whole = LEN_PREFIX + len;
            if buf.len() >= whole {
                let bytes: Bytes = buf.split_to(whole).freeze();
                return match split_frame(&bytes, max) {
                    Ok(Some((f, _))) => Ok(Some(f)),
                    Ok(None) => Err(ReadError::Protocol(ProtocolError::Truncated {
                        what: "frame",
                    })),
                    Err(e) => Err(ReadError::Protocol(e)),
                };
            }
            buf.reserve((whole - buf.len()).min(1 << 20));
        } else {
            buf.reserve(8 * 1024);
        }
        let _ = shared;
        let n = rd.read_buf(buf).await.map_err(ReadError::Io)?;
        metrics::counter!(super::metrics::names::BYTES_IN).increment(n as u64);
        if n == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(ReadError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed inside a frame",
            )));
        }
    }
}

/// Writes queued frames with vectored writes (record values go from the
/// mapped segment to the socket without a copy). A socket that takes no
/// byte for the stall timeout closes the connection.
async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::Receiver<Vec<Bytes>>,
    depth: Arc<AtomicU64>,
    shared: Arc<Shared>,
    _done: WriterDone,
) {
    let stall = shared.config.stall_timeout;
    while let Some(mut chunks) = rx.recv().await {
        let mut idx = 0usize;
        while idx < chunks.len() {
            let slices: Vec<IoSlice<'_>> = chunks[idx..]
                .iter()
                .take(64)
                .map(|c| IoSlice::new(c))
                .collect();
            let n = match tokio::time::timeout(stall, wr.write_vectored(&slices)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(n)) => n,
                Err(_) => {
                    shared.stats.stalled_closed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("client took no bytes for the stall timeout: closed");
                    return;
                }
            };
            drop(slices);
            metrics::counter!(super::metrics::names::BYTES_OUT).increment(n as u64);
            let mut left = n;
            while left > 0 && idx < chunks.len() {
                let c = &mut chunks[idx];
                if c.len() <= left {
                    left -= c.len();
                    idx += 1;
                } else {
                    c.advance(left);
                    left = 0;
                }
            }
            while idx < chunks.len() && chunks[idx].is_empty() {
                idx += 1;
            }
        }
        depth.fetch_sub(1, Ordering::Relaxed);
        if rx.is_empty() && wr.flush().await.is_err() {
            return;
        }
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), wr.shutdown()).await;
}
