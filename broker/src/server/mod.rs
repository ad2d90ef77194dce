//! The server: one tokio task per connection over an embedded
//! [`fissionlog::Log`], bounded queues everywhere, graceful shutdown.
//!
//! Memory per connection is bounded by the limits in [`ServerConfig`]:
//! at most `max_in_flight` requests being handled, at most
//! `write_queue_frames` responses waiting for the socket, each at most
//! `max_frame_bytes`. When the write queue is full the connection stops
//! reading requests, so a client that never reads its socket stalls only
//! itself, and one that stays stalled past `stall_timeout` is closed.

mod auth;
pub mod cluster;
mod conn;
mod handlers;
mod handlers_admin;
mod handlers_group;
mod http;
pub mod metrics;
mod owners;
pub mod producers;
mod routed;
mod stats;
mod syncer;
mod topology;
mod view;

pub use auth::{constant_time_eq, Access, AllowAll, Authorizer, Grant, Principal, TokenAuthorizer};
pub use stats::{ServerStats, StatsSnapshot};
pub use topology::HeardEvent;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fissionlog::Log;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::protocol::{ErrorCode, Response, DEFAULT_MAX_FRAME_BYTES};

/// Limits and knobs of a server.
#[derive(Clone)]
pub struct ServerConfig {
    /// Largest frame accepted (length prefix excluded); a bigger one gets
    /// an error frame and the connection is closed.
    pub max_frame_bytes: u32,
    /// Requests one connection may have outstanding; more get
    /// [`ErrorCode::TooManyInFlight`] without being carried out.
    pub max_in_flight: u32,
    /// Connections served at once; one more gets
    /// [`ErrorCode::TooManyConnections`] and is closed.
    pub max_connections: u32,
    /// Responses queued per connection before it stops reading requests.
    pub write_queue_frames: usize,
    /// A connection whose socket takes no bytes for this long is closed.
    pub stall_timeout: Duration,
    /// Longest long poll (fetch or group poll) the server honours.
    pub max_wait: Duration,
    /// Appends being carried out at once, server-wide (each holds its
    /// request's records): bounds the memory of `acks none` floods.
    pub max_concurrent_appends: usize,
    /// Longest a quorum produce waits for its sync round.
    pub durable_timeout: Duration,
    /// In-flight requests get this long to finish on shutdown.
    pub shutdown_grace: Duration,
    /// Group members one connection may hold.
    pub max_members_per_connection: usize,
    /// Who may do what.
    pub authorizer: Arc<dyn Authorizer>,
    /// Serve the protocol over TLS with this configuration (see
    /// [`crate::tls::server_config`]); `None`: plain TCP.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    /// The handshake's bound: a TLS handshake not done within this is
    /// abandoned (a plaintext client, a silent socket), and so is a
    /// connection whose `Hello` (after TLS, or first on plain TCP) hasn't
    /// arrived within it: the connection closes and frees its slot.
    pub tls_handshake_timeout: Duration,
    /// HTTP connections (metrics scrapes, live-view pages) served at once.
    pub http_max_connections: usize,
    /// Live-view event streams open at once.
    pub view_max_clients: usize,
    /// How often the live view gets a fresh snapshot (topology changes
    /// are sent at once).
    pub view_refresh: Duration,
    /// Records at the end of each partition read at start to rebuild the
    /// idempotent producers' sequence state: a retry of a batch further
    /// back than this, after a restart, is not recognised.
    pub producer_scan_records: u64,
    /// Cluster mode: the node this broker is a member through. Its peers'
    /// connections come in on the same listener and are handed to it;
    /// requests are carried out through the replicated partitions
    /// ([`cluster`]). `None`: a single node on the embedded log.
    pub cluster: Option<Arc<cluster::Cluster>>,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_connections", &self.max_connections)
            .field("write_queue_frames", &self.write_queue_frames)
            .field("tls", &self.tls.is_some())
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_in_flight: 256,
            max_connections: 1024,
            write_queue_frames: 64,
            stall_timeout: Duration::from_secs(30),
            max_wait: Duration::from_secs(30),
            max_concurrent_appends: 256,
            durable_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(5),
            max_members_per_connection: 64,
            authorizer: Arc::new(AllowAll),
            tls: None,
            tls_handshake_timeout: Duration::from_secs(10),
            http_max_connections: 64,
            view_max_clients: 16,
            view_refresh: Duration::from_secs(1),
            producer_scan_records: 100_000,
            cluster: None,
        }
    }
}

/// What every connection task shares.
pub(crate) struct Shared {
    pub log: Arc<Log>,
    pub config: ServerConfig,
    pub stats: Arc<ServerStats>,
    pub syncer: syncer::Syncer,
    pub appends: Semaphore,
    pub shutdown: watch::Receiver<bool>,
    pub topology: topology::Topology,
    pub hub: view::Hub,
    pub producers: producers::Producers,
}

impl Shared {
    pub fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// A running server's handle: its address and counters.
#[derive(Debug, Clone)]
pub struct ServerHandle {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The HTTP listener's address (metrics, live view), if it has one.
    pub http_addr: Option<SocketAddr>,
    /// Its counters.
    pub stats: Arc<ServerStats>,
}

/// Serves `log` on `listener` until `shutdown` resolves, then stops
/// accepting, lets in-flight requests finish (or fail with
/// [`ErrorCode::ShuttingDown`] once the grace period is over), and closes
/// the log cleanly. `on_ready` gets the handle once accepting.
pub async fn serve(
    log: Log,
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
    on_ready: impl FnOnce(ServerHandle),
) -> fissionlog::Result<()> {
    serve_with_http(log, listener, None, config, shutdown, on_ready).await
}

/// [`serve`], and with `http` also `/metrics` and the live view on that
/// listener (see docs/BROKER.md).
pub async fn serve_with_http(
    log: Log,
    listener: TcpListener,
    http: Option<TcpListener>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
    on_ready: impl FnOnce(ServerHandle),
) -> fissionlog::Result<()> {
    let io = |e: std::io::Error| fissionlog::Error::Io {
        path: log.dir().to_path_buf(),
        source: e,
    };
    let addr = listener.local_addr().map_err(io)?;
    let http_addr = http
        .as_ref()
        .map(|l| l.local_addr())
        .transpose()
        .map_err(io)?;
    metrics::install();
    let topology = topology::Topology::start(&log);
    let log = Arc::new(log);
    let producers = {
        let (l, scan) = (log.clone(), config.producer_scan_records);
        tokio::task::spawn_blocking(move || producers::Producers::open(&l, scan))
            .await
            .map_err(|e| fissionlog::Error::Io {
                path: log.dir().to_path_buf(),
                source: std::io::Error::other(e.to_string()),
            })??
    };
    let stats = Arc::new(ServerStats::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        syncer: syncer::Syncer::start(log.clone()),
        appends: Semaphore::new(config.max_concurrent_appends),
        log,
        stats: stats.clone(),
        shutdown: stop_rx,
        topology,
        hub: view::Hub::new(config.view_max_clients),
        producers,
        config: config.clone(),
    });
    let http_task = http.map(|l| tokio::spawn(http::run(l, shared.clone())));
    let slots = Arc::new(Semaphore::new(config.max_connections as usize));
    let tls = config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    on_ready(ServerHandle {
        addr,
        http_addr,
        stats: stats.clone(),
    });
    tracing::info!(%addr, ?http_addr, "serving");
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of file descriptors and the like: keep serving the others.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                match slots.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let shared = shared.clone();
                        let tls = tls.clone();
                        conns.spawn(async move {
                            if let Some(c) = &shared.config.cluster {
                                let wait = shared.config.tls_handshake_timeout;
                                match cluster::Cluster::classify(&stream, wait).await {
                                    cluster::Incoming::Client => {}
                                    cluster::Incoming::Peer => return c.hand_over(stream).await,
                                    cluster::Incoming::Gone => return,
                                }
                            }
                            match tls {
                                Some(acceptor) => {
                                    if let Some(s) = tls_accept(&acceptor, stream, peer, &shared).await {
                                        conn::handle(s, peer, shared).await;
                                    }
                                }
                                None => conn::handle(stream, peer, shared).await,
                            }
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        stats.connections_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tokio::spawn(refuse_connection(stream));
                    }
                }
            }
        }
    }
    tracing::info!("shutting down: no new connections");
    drop(listener);
    let _ = stop_tx.send(true);
    let grace = tokio::time::sleep(config.shutdown_grace + Duration::from_secs(1));
    tokio::pin!(grace);
    loop {
        tokio::select! {
            next = conns.join_next() => if next.is_none() { break },
            _ = &mut grace => {
                tracing::warn!("connections still open after the grace period: aborted");
                conns.abort_all();
                while conns.join_next().await.is_some() {}
                break;
            }
        }
    }
    if let Some(t) = http_task {
        let _ = t.await;
    }
    // Request tasks and blocking calls still running hold the shared
    // state; they end soon after their connection did.
    let mut shared = shared;
    let shared = loop {
        match Arc::try_unwrap(shared) {
            Ok(s) => break s,
            Err(s) if grace_left(&grace) => {
                shared = s;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => {
                tracing::warn!("requests still running after the grace period: the log closes when the last of them ends");
                return Ok(());
            }
        }
    };
    shared.syncer.stop();
    shared.topology.stop();
    let log = shared.log;
    // Blocking tasks that hold a clone end soon after their connection.
    let mut log = log;
    for _ in 0..100 {
        match Arc::try_unwrap(log) {
            Ok(l) => {
                let r = tokio::task::spawn_blocking(move || l.close()).await;
                tracing::info!("log closed");
                return r.unwrap_or(Ok(()));
            }
            Err(l) => {
                log = l;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    tracing::warn!("the log is still in use: dropped without a clean close");
    Ok(())
}

fn grace_left(grace: &std::pin::Pin<&mut tokio::time::Sleep>) -> bool {
    !grace.is_elapsed()
}

/// The server side of a TLS handshake, bounded in time. A client that
/// speaks plaintext, distrusts the certificate or stays silent is closed
/// here, before any request is read.
async fn tls_accept(
    acceptor: &tokio_rustls::TlsAcceptor,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    shared: &Shared,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let mut stop = shared.shutdown.clone();
    tokio::select! {
        r = tokio::time::timeout(shared.config.tls_handshake_timeout, acceptor.accept(stream)) => match r {
            Ok(Ok(s)) => Some(s),
            Ok(Err(e)) => {
                shared.stats.tls_handshakes_failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                shared.stats.tls_handshakes_failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(%peer, "TLS handshake timed out");
                None
            }
        },
        _ = stop.wait_for(|s| *s) => None,
    }
}

/// One error frame, then the connection closes.
async fn refuse_connection(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let frame = Response::Error {
        opcode: 0,
        code: ErrorCode::TooManyConnections,
        message: "the server is at its connection limit".into(),
    }
    .encode(0);
    for chunk in frame {
        if stream.write_all(&chunk).await.is_err() {
            return;
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
}
