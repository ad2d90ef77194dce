//! The async client: a multiplexed [`Connection`] (responses matched to
//! requests by id, so they may come back in any order), a batching
//! [`Producer`], a group [`Consumer`], a partition [`Fetcher`] that follows
//! a cluster's leaders, and an [`Admin`].

mod admin;
mod consumer;
mod fetcher;
mod idempotent;
mod producer;
mod reconnect;

pub use admin::Admin;
pub use consumer::{Consumer, ConsumerConfig};
pub use fetcher::{Fetcher, FetcherConfig};
pub use producer::{Producer, ProducerConfig, SendFuture};
pub use reconnect::{Endpoint, Reconnect};

use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::sync::{oneshot, Semaphore};

use crate::protocol::{
    frame_len, split_frame, ErrorCode, ProtocolError, Request, Response, LEN_PREFIX,
    MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

/// Largest response frame the client accepts.
const CLIENT_MAX_FRAME: u32 = 64 << 20;

/// How long a call waits for its response unless
/// [`Connection::set_request_timeout`] says otherwise. Long enough for a
/// fetch's longest server-side wait; short enough that a server that
/// accepted and then went silent does not hang its caller for ever.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What a client call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server answered with an error code.
    #[error("{code}: {message}")]
    Server {
        /// The code.
        code: ErrorCode,
        /// The server's sentence.
        message: String,
    },
    /// Cluster mode: the broker does not lead what the request needs;
    /// nothing was carried out. `leader` is the leader broker's client
    /// address when that broker knows it.
    #[error("not_leader: {message}")]
    NotLeader {
        /// The server's sentence.
        message: String,
        /// Where to send the request instead.
        leader: Option<String>,
    },
    /// The connection failed or closed before the answer came.
    #[error("connection lost: {0}")]
    Disconnected(String),
    /// Connecting failed.
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    /// The TLS handshake failed: the server's certificate is not trusted
    /// or doesn't name the server, or the server refused ours.
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
    /// The server sent bytes that don't parse.
    #[error("bad frame from the server: {0}")]
    Protocol(#[from] ProtocolError),
    /// The server answered with a response of another kind.
    #[error("unexpected response: {0}")]
    Unexpected(String),
    /// No response came within the connection's request timeout. The
    /// request may or may not have taken effect; its late response, if
    /// one ever comes, is discarded (responses are matched by request id,
    /// and the id is forgotten here).
    #[error("no response within {waited:?}")]
    Timeout {
        /// How long the call waited.
        waited: Duration,
    },
    /// The connection was lost and no new one could be made within the
    /// producer's reconnect deadline. A record failed with this may or may
    /// not have been appended before the loss.
    #[error(
        "broker {addr} unreachable for {waited:?} ({attempts} attempts); last error: {last_error}"
    )]
    Unavailable {
        /// The address tried.
        addr: String,
        /// Connection attempts made.
        attempts: u32,
        /// Time since the connection was lost.
        waited: std::time::Duration,
        /// Why the last attempt failed.
        last_error: String,
    },
}

impl ClientError {
    /// The server's error code, if it sent one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            ClientError::NotLeader { .. } => Some(ErrorCode::NotLeader),
            _ => None,
        }
    }
}

type Pending = Arc<Mutex<Option<HashMap<u32, oneshot::Sender<Response>>>>>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// One connection to a broker, shared by any number of tasks (cheap to
/// clone). At most the server's in-flight limit of requests is sent at
/// once; more wait for a slot.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

struct Inner {
    writer: tokio::sync::Mutex<Writer>,
    pending: Pending,
    next_id: AtomicU32,
    request_timeout_ms: AtomicU64,
    slots: Semaphore,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects over TCP and shakes hands.
    pub async fn connect(
        addr: impl ToSocketAddrs,
        token: Option<Bytes>,
    ) -> Result<Connection, ClientError> {
        let s = TcpStream::connect(addr)
            .await
            .map_err(ClientError::Connect)?;
        let _ = s.set_nodelay(true);
        Connection::handshake(s, token).await
    }

    /// Connects over TCP, then TLS (checking the server's certificate
    /// against `tls`), and shakes hands. The token travels encrypted.
    pub async fn connect_tls(
        addr: impl ToSocketAddrs,
        tls: &crate::tls::ClientTls,
        token: Option<Bytes>,
    ) -> Result<Connection, ClientError> {
        let s = TcpStream::connect(addr)
            .await
            .map_err(ClientError::Connect)?;
        let _ = s.set_nodelay(true);
        let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
        let s = connector
            .connect(tls.server_name.clone(), s)
            .await
            .map_err(ClientError::Tls)?;
        Connection::handshake(s, token).await
    }

    /// Shakes hands over any byte stream (TCP, TLS, an in-memory pipe).
    pub async fn handshake<S>(stream: S, token: Option<Bytes>) -> Result<Connection, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let hello = Request::Hello {
            // A version 2 server (a single node of an older build) never
            // sends the codes version 3 added: this client reads both.
            min_version: MIN_PROTOCOL_VERSION,
            max_version: PROTOCOL_VERSION,
            client: "fissionlog-broker-client".into(),
            token: token.map(crate::protocol::Token),
        };
        write_frame(&mut wr, hello.encode(0))
            .await
            .map_err(|e| ClientError::Disconnected(e.to_string()))?;
        let mut buf = BytesMut::new();
        let (_, resp) =
            tokio::time::timeout(DEFAULT_REQUEST_TIMEOUT, read_response(&mut rd, &mut buf))
                .await
                .map_err(|_| ClientError::Timeout {
                    waited: DEFAULT_REQUEST_TIMEOUT,
                })??;
        let max_in_flight = match resp {
            Response::HelloOk { max_in_flight, .. } => max_in_flight,
            Response::Error { code, message, .. } => {
                return Err(ClientError::Server { code, message })
            }
            other => return Err(ClientError::Unexpected(format!("{other:?}"))),
        };
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let p2 = pending.clone();
        let reader = tokio::spawn(async move {
            while let Ok((id, r)) = read_response(&mut rd, &mut buf).await {
                let tx = p2
                    .lock()
                    .ok()
                    .and_then(|mut m| m.as_mut().and_then(|m| m.remove(&id)));
                if let Some(tx) = tx {
                    let _ = tx.send(r);
                } else if let Response::Error { code, message, .. } = r {
                    // A connection-level error (request id 0): the server closes.
                    tracing::debug!(%code, %message, "server error");
                }
            }
            // Fail every waiting call.
            if let Ok(mut m) = p2.lock() {
                m.take();
            }
        });
        Ok(Connection {
            inner: Arc::new(Inner {
                writer: tokio::sync::Mutex::new(Box::new(wr)),
                pending,
                next_id: AtomicU32::new(1),
                request_timeout_ms: AtomicU64::new(DEFAULT_REQUEST_TIMEOUT.as_millis() as u64),
                slots: Semaphore::new(max_in_flight.max(1) as usize),
                reader,
            }),
        })
    }

    /// Sets how long every later call on this connection (and on its
    /// clones: the producer's, consumer's and admin's calls go through it)
    /// waits for its response before failing with [`ClientError::Timeout`].
    pub fn set_request_timeout(&self, timeout: Duration) {
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.inner.request_timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// The current request timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.request_timeout_ms.load(Ordering::Relaxed))
    }

    /// Sends a request and waits for its response; a server error becomes
    /// [`ClientError::Server`].
    pub async fn call(&self, req: Request) -> Result<Response, ClientError> {
        self.start(req).await?.wait().await
    }

    /// Sends a request; returns once it is written, with the handle that
    /// waits for its response. Requests started one after another from
    /// one task reach the server in that order.
    pub async fn start(&self, req: Request) -> Result<PendingCall, ClientError> {
        let slot = self
            .inner
            .slots
            .acquire()
            .await
            .map_err(|_| ClientError::Disconnected("closed".into()))?;
        let mut id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut m = self
                .inner
                .pending
                .lock()
                .map_err(|_| ClientError::Disconnected("poisoned".into()))?;
            match m.as_mut() {
                Some(m) => m.insert(id, tx),
                None => return Err(ClientError::Disconnected("the connection closed".into())),
            };
        }
        {
            let mut w = self.inner.writer.lock().await;
            if let Err(e) = write_frame(&mut *w, req.encode(id)).await {
                return Err(ClientError::Disconnected(e.to_string()));
            }
        }
        slot.forget();
        Ok(PendingCall {
            rx,
            id,
            conn: self.clone(),
        })
    }
}

/// A request written to the server whose response is not read yet.
pub struct PendingCall {
    rx: oneshot::Receiver<Response>,
    id: u32,
    conn: Connection,
}

impl PendingCall {
    /// Waits for the response, at most the connection's request timeout.
    pub async fn wait(self) -> Result<Response, ClientError> {
        let PendingCall { rx, id, conn } = self;
        let waited = conn.request_timeout();
        let r = tokio::time::timeout(waited, rx).await;
        conn.inner.slots.add_permits(1);
        let r = match r {
            Ok(r) => r,
            Err(_) => {
                // Forget the id: a late response finds no waiter and is
                // dropped, so it can never answer another request.
                if let Ok(mut m) = conn.inner.pending.lock() {
                    if let Some(m) = m.as_mut() {
                        m.remove(&id);
                    }
                }
                return Err(ClientError::Timeout { waited });
            }
        };
        match r {
            Ok(Response::Error { code, message, .. }) => Err(ClientError::Server { code, message }),
            Ok(Response::NotLeader {
                message, leader, ..
            }) => Err(ClientError::NotLeader { message, leader }),
            Ok(r) => Ok(r),
            Err(_) => Err(ClientError::Disconnected(
                "the connection closed before the answer".into(),
            )),
        }
    }
}

async fn write_frame<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    mut chunks: Vec<Bytes>,
) -> std::io::Result<()> {
    let mut idx = 0;
    while idx < chunks.len() {
        let slices: Vec<IoSlice<'_>> = chunks[idx..]
            .iter()
            .take(64)
            .map(|c| IoSlice::new(c))
            .collect();
        let mut n = w.write_vectored(&slices).await?;
        drop(slices);
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "socket closed",
            ));
        }
        while n > 0 && idx < chunks.len() {
            if chunks[idx].len() <= n {
                n -= chunks[idx].len();
                idx += 1;
            } else {
                chunks[idx].advance(n);
                n = 0;
            }
        }
        while idx < chunks.len() && chunks[idx].is_empty() {
            idx += 1;
        }
    }
    w.flush().await
}

async fn read_response<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
) -> Result<(u32, Response), ClientError> {
    loop {
        if let Some(len) = frame_len(buf, CLIENT_MAX_FRAME)? {
            if buf.len() >= LEN_PREFIX + len {
                let b = buf.split_to(LEN_PREFIX + len).freeze();
                let (f, _) = split_frame(&b, CLIENT_MAX_FRAME)?
                    .ok_or(ProtocolError::Truncated { what: "frame" })?;
                return Ok((f.request_id, Response::decode(f.opcode, f.body)?));
            }
            buf.reserve((LEN_PREFIX + len - buf.len()).min(1 << 20));
        } else {
            buf.reserve(8192);
        }
        let n = rd
            .read_buf(buf)
            .await
            .map_err(|e| ClientError::Disconnected(e.to_string()))?;
        if n == 0 {
            return Err(ClientError::Disconnected(
                "the server closed the connection".into(),
            ));
        }
    }
}
