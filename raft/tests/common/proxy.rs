//! A TCP proxy for one node-to-node link, switched between passing
//! traffic and dropping it, and a mesh of them over a cluster's ordered
//! node pairs.
//!
//! A node opens one connection per peer and sends its requests (and reads
//! the peer's answers) on it, so the link `from → to` carries `from`'s
//! calls to `to`. With `--peer-dial`, node `from` dials `to` at the proxy
//! of `from → to`, which connects on to `to`'s listening address.
//!
//! - [`Mode::Pass`]: each accepted connection is forwarded, bytes both
//!   ways, to the target.
//! - [`Mode::Drop`]: every connection the proxy holds is closed, and new
//!   ones are blackholed: accepted, their bytes read and thrown away,
//!   nothing answered (the dialling node sees its calls time out, as
//!   behind a partition that drops packets). Switching back to `Pass`
//!   closes the blackholed connections, so the node reconnects and its
//!   frames start on a fresh stream.
//! - [`Mode::Delay`]: forwarded like `Pass`, each chunk of bytes held for
//!   the delay before it is written on, in order, both ways (a slow or
//!   distant link: the round trip grows by twice the delay).
//!
//! Every connection task ends when the mode changes or the proxy drops.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fissionlog_raft::types::NodeId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What a link does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward it.
    Pass,
    /// Close what is open, blackhole what comes.
    Drop,
    /// Forward it, each byte this much later, both ways.
    Delay(Duration),
}

/// One proxied link. Dropping it ends its listener and connections.
pub struct Proxy {
    addr: String,
    target: Arc<Mutex<Option<String>>>,
    mode: watch::Sender<Mode>,
    /// Forwarding connections a switch closed.
    cut: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free 127.0.0.1 port, passing traffic, with no target
    /// yet (a connection accepted before [`Proxy::set_target`] is closed).
    pub async fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for a proxy");
        let addr = listener.local_addr().expect("a bound address").to_string();
        let target = Arc::new(Mutex::new(None::<String>));
        let (mode, _) = watch::channel(Mode::Pass);
        let cut = Arc::new(AtomicU64::new(0));
        let accept = {
            let (target, mode, cut) = (target.clone(), mode.clone(), cut.clone());
            tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let to = lock(&target).clone();
                    tokio::spawn(serve(inbound, to, mode.subscribe(), cut.clone()));
                }
            })
        };
        Proxy {
            addr,
            target,
            mode,
            cut,
            accept,
        }
    }

    /// Where nodes dial this link.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Where the link leads: the listening address of its node.
    pub fn set_target(&self, target: &str) {
        *lock(&self.target) = Some(target.to_string());
    }

    /// How many forwarding connections a switch has closed: more than
    /// none shows the link's traffic went through this proxy.
    pub fn cut_connections(&self) -> u64 {
        self.cut.load(Ordering::SeqCst)
    }

    /// Switches the link; a change closes every connection it holds.
    pub fn set(&self, mode: Mode) {
        self.mode.send_if_modified(|m| {
            let changed = *m != mode;
            *m = mode;
            changed
        });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One accepted connection, until the mode changes (or the proxy goes).
async fn serve(
    mut inbound: TcpStream,
    target: Option<String>,
    mut mode: watch::Receiver<Mode>,
    cut: Arc<AtomicU64>,
) {
    let current = *mode.borrow_and_update();
    match current {
        Mode::Pass | Mode::Delay(_) => {
            let Some(target) = target else {
                return;
            };
            let outbound = tokio::select! {
                c = TcpStream::connect(&target) => c,
                _ = mode.changed() => return,
            };
            let Ok(mut outbound) = outbound else {
                return;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let forward = async {
                match current {
                    Mode::Delay(by) => {
                        let (in_read, in_write) = inbound.split();
                        let (out_read, out_write) = outbound.split();
                        tokio::select! {
                            _ = delayed(in_read, out_write, by) => {}
                            _ = delayed(out_read, in_write, by) => {}
                        }
                    }
                    _ => {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                }
            };
            tokio::select! {
                _ = forward => {}
                _ = mode.changed() => {
                    cut.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        Mode::Drop => {
            let mut sink = tokio::io::sink();
            tokio::select! {
                _ = tokio::io::copy(&mut inbound, &mut sink) => {}
                _ = mode.changed() => {}
            }
        }
    }
    // Both streams drop here: the node sees its connection closed.
}

/// Copies `from` to `to`, each chunk written `by` after it was read, in
/// order; ends when either side closes or fails.
async fn delayed(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    by: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 || tx.send((Instant::now() + by, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let write = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
    };
    // The writer drains what was read before the reader ended.
    let _ = tokio::join!(read, write);
}

/// A proxy on every ordered pair of a cluster's nodes.
pub struct Mesh {
    links: BTreeMap<(NodeId, NodeId), Proxy>,
}

impl Mesh {
    /// Proxies for every ordered pair of `ids`, passing, targets unset.
    pub async fn start(ids: &[NodeId]) -> Mesh {
        let mut links = BTreeMap::new();
        for &from in ids {
            for &to in ids.iter().filter(|&&to| to != from) {
                links.insert((from, to), Proxy::start().await);
            }
        }
        Mesh { links }
    }

    /// The `--peer-dial` arguments of node `from`: each peer at the
    /// proxy of `from → peer`.
    pub fn dial_args(&self, from: NodeId) -> Vec<String> {
        self.links
            .iter()
            .filter(|((f, _), _)| *f == from)
            .flat_map(|((_, to), p)| ["--peer-dial".to_string(), format!("{to}={}", p.addr())])
            .collect()
    }

    /// Points every link into node `to` at its listening address.
    pub fn set_node_addr(&self, to: NodeId, addr: &str) {
        for ((_, t), p) in &self.links {
            if *t == to {
                p.set_target(addr);
            }
        }
    }

    /// Switches both directions between `a` and `b`.
    pub fn set_between(&self, a: NodeId, b: NodeId, mode: Mode) {
        for key in [(a, b), (b, a)] {
            if let Some(p) = self.links.get(&key) {
                p.set(mode);
            }
        }
    }

    /// Switches the link `from → to` alone: `from`'s calls to `to` (and
    /// their answers), while `to`'s calls to `from` go on as they were.
    pub fn set_one_way(&self, from: NodeId, to: NodeId, mode: Mode) {
        if let Some(p) = self.links.get(&(from, to)) {
            p.set(mode);
        }
    }

    /// Switches every link into and out of `node`: `Drop` cuts it off
    /// from all its peers (clients still reach it; they are not proxied).
    pub fn set_node(&self, node: NodeId, mode: Mode) {
        for ((f, t), p) in &self.links {
            if *f == node || *t == node {
                p.set(mode);
            }
        }
    }

    /// Forwarding connections closed by switches, over every link.
    pub fn cut_connections(&self) -> u64 {
        self.links.values().map(Proxy::cut_connections).sum()
    }

    /// Every link passes again.
    pub fn heal(&self) {
        for p in self.links.values() {
            p.set(Mode::Pass);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
