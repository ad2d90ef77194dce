//! The outgoing side: one long-lived TCP connection from this node to one
//! peer, shared by every group on the pair.
//!
//! Callers queue encoded request frames on a bounded queue and wait for the
//! response with the matching call id; a single task owns the connection,
//! writes whatever is queued in one `write_all` (frame-level coalescing:
//! N groups' heartbeats that meet in the queue cost one syscall), and a
//! reader task routes responses to their callers in whatever order they
//! come. When the connection breaks, every waiting caller is failed at
//! once and the task reconnects with a doubling backoff.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::{Hello, NetworkConfig, TransportError};
use crate::frame::{FrameCodec, PeerMessage, RaftRequest, RaftResponse};
use crate::types::{GroupId, NodeId};

/// Upper bound on the bytes gathered into one write.
const MAX_COALESCED_BYTES: usize = 1 << 20;

/// An encoded request frame waiting for the connection.
pub(crate) struct Outgoing {
    pub(crate) call_id: u64,
    pub(crate) frame: Vec<u8>,
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<RaftResponse>>>>;

/// Counters a test or an operator can read.
#[derive(Debug, Default)]
pub struct LinkStats {
    /// Request frames written.
    pub frames_written: AtomicU64,
    /// `write_all` calls that carried them.
    pub writes: AtomicU64,
    /// Connections established.
    pub connects: AtomicU64,
}

/// The shared connection to one peer.
pub struct PeerLink {
    target: NodeId,
    codec: FrameCodec,
    queue: mpsc::Sender<Outgoing>,
    pending: Pending,
    next_call_id: AtomicU64,
    stats: Arc<LinkStats>,
}

impl std::fmt::Debug for PeerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerLink")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl PeerLink {
    /// Starts the connection task for `target` at `addr` (it connects
    /// lazily, on the first queued frame) and returns the handle.
    pub(crate) fn start(
        me: NodeId,
        target: NodeId,
        addr: String,
        cfg: &NetworkConfig,
    ) -> Arc<PeerLink> {
        let (tx, rx) = mpsc::channel(cfg.queue_frames.max(1));
        let pending: Pending = Arc::default();
        let stats = Arc::new(LinkStats::default());
        let link = Arc::new(PeerLink {
            target,
            codec: cfg.codec,
            queue: tx,
            pending: pending.clone(),
            next_call_id: AtomicU64::new(1),
            stats: stats.clone(),
        });
        let task = LinkTask {
            me,
            addr,
            cfg: cfg.clone(),
            pending,
            stats,
        };
        tokio::spawn(task.run(rx));
        link
    }

    /// The link's counters.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    /// Sends `body` to `group` on the peer and waits at most `ttl` for
    /// its answer.
    pub async fn call(
        &self,
        group: GroupId,
        body: RaftRequest,
        ttl: Duration,
    ) -> Result<RaftResponse, TransportError> {
        let call_id = self.next_call_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::new();
        self.codec
            .encode(
                &PeerMessage::Request {
                    call_id,
                    group,
                    body,
                },
                &mut frame,
            )
            .map_err(TransportError::Encode)?;
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(call_id, tx);
        let guard = PendingGuard {
            pending: &self.pending,
            call_id,
        };
        let sent = self.queue.try_send(Outgoing { call_id, frame });
        if sent.is_err() {
            return Err(TransportError::QueueFull {
                target: self.target,
            });
        }
        let answer = tokio::time::timeout(ttl, rx).await;
        drop(guard);
        match answer {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(_)) => Err(TransportError::ConnectionLost {
                target: self.target,
            }),
            Err(_) => Err(TransportError::Timeout {
                target: self.target,
                after: ttl,
            }),
        }
    }
}

/// Removes a call's slot when its caller stops waiting, however it stops.
struct PendingGuard<'a> {
    pending: &'a Pending,
    call_id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        lock(self.pending).remove(&self.call_id);
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps behind these locks are only inserted into and removed from;
    // a panic elsewhere cannot leave them half-updated, so a poisoned lock
    // is still safe to use.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct LinkTask {
    me: NodeId,
    addr: String,
    cfg: NetworkConfig,
    pending: Pending,
    stats: Arc<LinkStats>,
}

impl LinkTask {
    async fn run(self, mut rx: mpsc::Receiver<Outgoing>) {
        let mut backoff = self.cfg.backoff_min;
        // Wait for the first frame before connecting: a peer nobody calls
        // costs no connection.
        let Some(mut first) = rx.recv().await else {
            return;
        };
        loop {
            match self.connect().await {
                Ok(stream) => {
                    backoff = self.cfg.backoff_min;
                    self.stats.connects.fetch_add(1, Ordering::Relaxed);
                    match self.serve(stream, first, &mut rx).await {
                        Some(next) => first = next,
                        None => return,
                    }
                }
                Err(_) => {
                    // Fail what is queued now instead of letting each caller
                    // wait out its whole TTL against a peer that is down.
                    self.fail(first.call_id);
                    while let Ok(o) = rx.try_recv() {
                        self.fail(o.call_id);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.cfg.backoff_max);
                    match rx.recv().await {
                        Some(next) => first = next,
                        None => return,
                    }
                }
            }
        }
    }

    fn fail(&self, call_id: u64) {
        lock(&self.pending).remove(&call_id);
    }

    async fn connect(&self) -> std::io::Result<TcpStream> {
        let stream = tokio::time::timeout(self.cfg.connect_timeout, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
            })??;
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    /// Runs one connection until it breaks; returns the next frame to send
    /// on a new one, or `None` when every sender is gone.
    async fn serve(
        &self,
        stream: TcpStream,
        first: Outgoing,
        rx: &mut mpsc::Receiver<Outgoing>,
    ) -> Option<Outgoing> {
        let (read_half, mut write_half) = stream.into_split();
        let mut reader = tokio::spawn(read_responses(
            BufReader::new(read_half),
            self.cfg.codec,
            self.pending.clone(),
        ));
        let mut buf = Vec::new();
        if self
            .cfg
            .codec
            .encode(&Hello::Peer { from: self.me }, &mut buf)
            .is_err()
        {
            return None;
        }
        let mut next = Some(first);
        let open = loop {
            let Some(first) = next.take() else {
                tokio::select! {
                    got = rx.recv() => match got {
                        Some(o) => { next = Some(o); continue; }
                        None => break false,
                    },
                    _ = &mut reader => break true,
                }
            };
            let frames = gather(first, rx, &mut buf, self.cfg.coalesce_window).await;
            let written = write_half.write_all(&buf).await;
            buf.clear();
            if written.is_err() {
                break true;
            }
            self.stats
                .frames_written
                .fetch_add(frames, Ordering::Relaxed);
            self.stats.writes.fetch_add(1, Ordering::Relaxed);
        };
        reader.abort();
        // Whatever was waiting on this connection will never be answered:
        // fail it now, before waiting for the next caller.
        lock(&self.pending).clear();
        if open {
            rx.recv().await
        } else {
            None
        }
    }
}

/// Appends `first` and every frame queued behind it (waiting up to
/// `window` for more when it is not zero) to `buf`, up to
/// [`MAX_COALESCED_BYTES`]; returns how many frames it took.
pub(crate) async fn gather(
    first: Outgoing,
    rx: &mut mpsc::Receiver<Outgoing>,
    buf: &mut Vec<u8>,
    window: Duration,
) -> u64 {
    buf.extend_from_slice(&first.frame);
    let mut frames = 1;
    let deadline = tokio::time::Instant::now() + window;
    while buf.len() < MAX_COALESCED_BYTES {
        let more = match rx.try_recv() {
            Ok(o) => Some(o),
            Err(mpsc::error::TryRecvError::Disconnected) => None,
            Err(mpsc::error::TryRecvError::Empty) if window.is_zero() => None,
            Err(mpsc::error::TryRecvError::Empty) => tokio::time::timeout_at(deadline, rx.recv())
                .await
                .ok()
                .flatten(),
        };
        let Some(o) = more else { break };
        buf.extend_from_slice(&o.frame);
        frames += 1;
    }
    frames
}

async fn read_responses<R>(mut reader: R, codec: FrameCodec, pending: Pending)
where
    R: tokio::io::AsyncRead + Unpin,
{
    loop {
        match codec.read_frame::<PeerMessage, _>(&mut reader).await {
            Ok(Some(PeerMessage::Response { call_id, body, .. })) => {
                if let Some(tx) = lock(&pending).remove(&call_id) {
                    // The caller may have timed out already; that is fine.
                    let _ = tx.send(body);
                }
            }
            // A request on our own outgoing connection, a frame error or the
            // end of the stream: the connection is no longer trusted.
            Ok(Some(PeerMessage::Request { .. })) | Ok(None) | Err(_) => return,
        }
    }
}
