//! The incoming side: accept connections, read the hello, then serve
//! either a peer (Raft RPCs dispatched to the addressed group's `Raft`)
//! or a client (the node's client calls), answering each request as soon
//! as it is done, in whatever order that is.
//!
//! Every connection is bounded: at most `max_in_flight` requests are being
//! handled at once (the reader stops reading until one finishes, so a
//! stalled or flooding sender cannot grow this node's memory), answers
//! wait on a bounded queue, a hello must arrive within `hello_timeout`,
//! and any frame error closes the connection after recording the typed
//! error.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

use super::{Hello, NetworkConfig};
use crate::client::{ClientRequest, ClientResponse};
use crate::error::Error;
use crate::frame::{FrameCodec, PeerMessage, RaftRequest, RaftResponse};
use crate::network::link::lock;
use crate::types::GroupId;

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Hands a peer's Raft RPC to the addressed group.
pub trait GroupDispatch: Send + Sync + 'static {
    /// Answers `request` for `group` (`RaftResponse::Unavailable` when the
    /// group is not hosted here or has stopped).
    fn dispatch(&self, group: GroupId, request: RaftRequest) -> BoxFuture<RaftResponse>;
}

/// Answers a client's call.
pub trait ClientDispatch: Send + Sync + 'static {
    /// Answers one client request.
    fn call(&self, request: ClientRequest) -> BoxFuture<ClientResponse>;
}

/// How many connection errors the server keeps for inspection.
const ERRORS_KEPT: usize = 32;

/// The last connection errors (typed), newest last.
#[derive(Debug, Default, Clone)]
pub struct ConnectionErrors(Arc<Mutex<Vec<Error>>>);

impl ConnectionErrors {
    fn record(&self, e: Error) {
        let mut v = lock(&self.0);
        if v.len() == ERRORS_KEPT {
            v.remove(0);
        }
        v.push(e);
    }

    /// Runs `f` over the recorded errors.
    pub fn with<T>(&self, f: impl FnOnce(&[Error]) -> T) -> T {
        f(&lock(&self.0))
    }
}

/// A running server. [`Server::shutdown`] stops it, and so does dropping
/// it: keep it for as long as the node serves.
#[derive(Debug)]
pub struct Server {
    stop: watch::Sender<bool>,
    errors: ConnectionErrors,
    local_addr: std::net::SocketAddr,
}

impl Server {
    /// Serves `listener` until [`Server::shutdown`].
    pub fn start(
        listener: TcpListener,
        cfg: NetworkConfig,
        groups: Arc<dyn GroupDispatch>,
        clients: Option<Arc<dyn ClientDispatch>>,
    ) -> std::io::Result<Server> {
        let local_addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let errors = ConnectionErrors::default();
        let ctx = Arc::new(ConnCtx {
            cfg,
            groups,
            clients,
            errors: errors.clone(),
            stopped: stopped.clone(),
        });
        tokio::spawn(accept_loop(listener, ctx, stopped));
        Ok(Server {
            stop,
            errors,
            local_addr,
        })
    }

    /// Serves the connections handed over on `incoming` (accepted by a
    /// listener that also serves another protocol, such as the broker's
    /// port in cluster mode) until [`Server::shutdown`] or until
    /// `incoming` closes; `local_addr` is the address they came in on.
    pub fn start_handed(
        incoming: mpsc::Receiver<TcpStream>,
        local_addr: std::net::SocketAddr,
        cfg: NetworkConfig,
        groups: Arc<dyn GroupDispatch>,
        clients: Option<Arc<dyn ClientDispatch>>,
    ) -> Server {
        let (stop, stopped) = watch::channel(false);
        let errors = ConnectionErrors::default();
        let ctx = Arc::new(ConnCtx {
            cfg,
            groups,
            clients,
            errors: errors.clone(),
            stopped: stopped.clone(),
        });
        tokio::spawn(handed_loop(incoming, ctx, stopped));
        Server {
            stop,
            errors,
            local_addr,
        }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.local_addr
    }

    /// The typed errors that closed connections.
    pub fn errors(&self) -> &ConnectionErrors {
        &self.errors
    }

    /// Stops accepting and closes every connection it serves.
    pub fn shutdown(&self) {
        let _ = self.stop.send(true);
    }
}

struct ConnCtx {
    cfg: NetworkConfig,
    groups: Arc<dyn GroupDispatch>,
    clients: Option<Arc<dyn ClientDispatch>>,
    errors: ConnectionErrors,
    stopped: watch::Receiver<bool>,
}

async fn accept_loop(listener: TcpListener, ctx: Arc<ConnCtx>, mut stopped: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => spawn_connection(stream, ctx.clone()),
                // Out of descriptors and the like: wait a little, go on.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            },
        }
    }
}

async fn handed_loop(
    mut incoming: mpsc::Receiver<TcpStream>,
    ctx: Arc<ConnCtx>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            handed = incoming.recv() => match handed {
                Some(stream) => spawn_connection(stream, ctx.clone()),
                None => return,
            },
        }
    }
}

fn spawn_connection(stream: TcpStream, ctx: Arc<ConnCtx>) {
    tokio::spawn(async move {
        let mut stopped = ctx.stopped.clone();
        tokio::select! {
            _ = stopped.changed() => {}
            _ = serve_connection(stream, ctx.clone()) => {}
        }
    });
}

async fn serve_connection(stream: TcpStream, ctx: Arc<ConnCtx>) {
    let _ = stream.set_nodelay(true);
    let (read_half, write_half) = stream.into_split();
    let mut reader = BufReader::new(read_half);
    let codec = ctx.cfg.codec;
    let hello = tokio::time::timeout(
        ctx.cfg.hello_timeout,
        codec.read_frame::<Hello, _>(&mut reader),
    )
    .await;
    let hello = match hello {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) | Err(_) => return,
        Ok(Err(e)) => return ctx.errors.record(e),
    };
    let (tx, rx) = mpsc::channel::<Vec<u8>>(ctx.cfg.max_in_flight.max(1));
    let writer = tokio::spawn(write_answers(write_half, rx));
    let result = match hello {
        Hello::Peer { .. } => {
            let groups = ctx.groups.clone();
            rpc_loop(
                reader,
                codec,
                ctx.cfg.max_in_flight,
                tx,
                move |msg: PeerMessage| {
                    let PeerMessage::Request {
                        call_id,
                        group,
                        body,
                    } = msg
                    else {
                        return Err(Error::MalformedFrame {
                            reason: "a response on an incoming peer connection".to_string(),
                        });
                    };
                    let fut = groups.dispatch(group, body);
                    Ok(Box::pin(async move {
                        let body = fut.await;
                        PeerMessage::Response {
                            call_id,
                            group,
                            body,
                        }
                    }) as BoxFuture<PeerMessage>)
                },
            )
            .await
        }
        Hello::Client => match ctx.clients.clone() {
            Some(clients) => {
                rpc_loop(
                    reader,
                    codec,
                    ctx.cfg.max_in_flight,
                    tx,
                    move |req: ClientRequest| Ok(clients.call(req)),
                )
                .await
            }
            None => {
                drop(tx);
                Err(Error::MalformedFrame {
                    reason: "this server takes no client connections".to_string(),
                })
            }
        },
    };
    if let Err(e) = result {
        ctx.errors.record(e);
    }
    // Answers already queued still go out; then the writer ends.
    let _ = writer.await;
}

/// Reads requests of type `In`, runs `handle`'s future for each (at most
/// `max_in_flight` at once) and queues the encoded answers on `tx`.
async fn rpc_loop<R, In, Out, H>(
    mut reader: R,
    codec: FrameCodec,
    max_in_flight: usize,
    tx: mpsc::Sender<Vec<u8>>,
    handle: H,
) -> Result<(), Error>
where
    R: AsyncRead + Unpin,
    In: DeserializeOwned,
    Out: Serialize + Send + 'static,
    H: Fn(In) -> Result<BoxFuture<Out>, Error>,
{
    let slots = Arc::new(Semaphore::new(max_in_flight.max(1)));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return Ok(());
        };
        let Some(msg) = codec.read_frame::<In, _>(&mut reader).await? else {
            return Ok(());
        };
        let fut = handle(msg)?;
        let tx = tx.clone();
        tokio::spawn(async move {
            let answer = fut.await;
            let mut frame = Vec::new();
            if codec.encode(&answer, &mut frame).is_ok() {
                let _ = tx.send(frame).await;
            }
            drop(permit);
        });
    }
}

async fn write_answers(mut w: tokio::net::tcp::OwnedWriteHalf, mut rx: mpsc::Receiver<Vec<u8>>) {
    let mut buf = Vec::new();
    while let Some(frame) = rx.recv().await {
        buf.extend_from_slice(&frame);
        while let Ok(more) = rx.try_recv() {
            buf.extend_from_slice(&more);
            if buf.len() >= 1 << 20 {
                break;
            }
        }
        if w.write_all(&buf).await.is_err() {
            return;
        }
        buf.clear();
    }
}
