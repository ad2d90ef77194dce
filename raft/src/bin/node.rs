//! `fissionlog-raft`: one fissionlog node.
//!
//! ```text
//! fissionlog-raft --dir DIR --node-id N --listen HOST:PORT
//!                 [--peers ID=HOST:PORT,...] [--peer-dial ID=HOST:PORT,...]
//!                 [--groups N] [--controller] [--exit-on-stdin-close]
//! fissionlog-raft --help
//! ```
//!
//! `--peer-dial ID=ADDR` makes this node dial peer `ID` at `ADDR` instead
//! of the address the group's membership names for it (which stays the
//! one that peer listens on); the tests put a proxy there to cut links.
//! It may be given more than once.
//!
//! It hosts partition groups `(topic 0, partition 0..N)` and, with
//! `--controller`, the controller group (its voters: the `--peers` set,
//! once a client initialises it) and every partition group the controller
//! places on this node (topic ids from 1). It listens for peers
//! and clients on one port (port 0: the OS picks; the chosen address is
//! printed as `listening HOST:PORT` on stdout once it serves), and stops
//! cleanly on SIGTERM or SIGINT (and, with `--exit-on-stdin-close`, when
//! its stdin closes, so a test harness that dies takes its nodes with it).
//! Exit codes: 0 after a clean stop, 1 when it cannot start, 2 on a usage
//! error.
//!
//! It logs to stderr, filtered by `RUST_LOG` (`warn` when unset) in the
//! target syntax `warn,openraft=info,fissionlog_raft=debug`; a filter that
//! does not parse is a usage error.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use fissionlog_raft::network::{Network, NetworkConfig, Server};
use fissionlog_raft::node::{Node, NodeOptions};
use fissionlog_raft::types::{GroupId, NodeId};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

#[derive(Debug)]
struct Args {
    dir: PathBuf,
    node_id: NodeId,
    listen: String,
    peers: BTreeMap<NodeId, String>,
    peer_dial: BTreeMap<NodeId, String>,
    groups: u32,
    controller: bool,
    exit_on_stdin_close: bool,
}

const USAGE: &str = "usage: fissionlog-raft --dir DIR --node-id N --listen HOST:PORT \
[--peers ID=HOST:PORT,...] [--peer-dial ID=HOST:PORT,...] [--groups N] [--controller] \
[--exit-on-stdin-close]";

const HELP: &str = "\
One fissionlog node: hosts partition groups (topic 0, partition 0..N) and
serves peers and clients on one port.

  --dir DIR              the node's log directory (created if absent)
  --node-id N            this node's id
  --listen HOST:PORT     where to listen (port 0: the OS picks; printed as
                         `listening HOST:PORT` on stdout)
  --peers ID=ADDR,...    the peers, used to initialise a group given none
  --peer-dial ID=ADDR,...
                         dial peer ID at ADDR instead of the address the
                         group's membership names for it (a proxy, say);
                         may be repeated
  --groups N             partition groups hosted (default 1)
  --controller           host the controller group (initialised over the
                         peers) and the partition groups it places here
  --exit-on-stdin-close  stop when stdin closes
  --help                 print this and exit

Exit codes: 0 after a clean stop, 1 when it cannot start, 2 on a usage error.
Logs to stderr, filtered by RUST_LOG (default `warn`).";

/// `ID=HOST:PORT,...` into `into`, as `flag`'s value.
fn parse_addrs(flag: &str, value: &str, into: &mut BTreeMap<NodeId, String>) -> Result<(), String> {
    for p in value.split(',').filter(|p| !p.is_empty()) {
        let (id, addr) = p
            .split_once('=')
            .ok_or_else(|| format!("{flag} {p:?} is not ID=HOST:PORT"))?;
        let id = id
            .parse::<NodeId>()
            .map_err(|_| format!("{flag} id {id:?} is not a number"))?;
        into.insert(id, addr.to_string());
    }
    Ok(())
}

/// What the command line asks for: a node to run, or the help text.
#[derive(Debug)]
enum Cli {
    Run(Args),
    Help,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Cli, String> {
    let (mut dir, mut node_id, mut listen) = (None, None, None);
    let mut peers = BTreeMap::new();
    let mut peer_dial = BTreeMap::new();
    let mut groups = 1u32;
    let mut exit_on_stdin_close = false;
    let mut controller = false;
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Ok(Cli::Help);
        }
        if flag == "--exit-on-stdin-close" {
            exit_on_stdin_close = true;
            continue;
        }
        if flag == "--controller" {
            controller = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--dir" => dir = Some(PathBuf::from(value)),
            "--node-id" => {
                node_id = Some(
                    value
                        .parse::<NodeId>()
                        .map_err(|_| format!("--node-id {value:?} is not a number"))?,
                )
            }
            "--listen" => listen = Some(value),
            "--groups" => {
                groups = value
                    .parse()
                    .map_err(|_| format!("--groups {value:?} is not a number"))?
            }
            "--peers" => parse_addrs(&flag, &value, &mut peers)?,
            "--peer-dial" => parse_addrs(&flag, &value, &mut peer_dial)?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(Cli::Run(Args {
        dir: dir.ok_or("--dir is required")?,
        node_id: node_id.ok_or("--node-id is required")?,
        listen: listen.ok_or("--listen is required")?,
        peers,
        peer_dial,
        groups,
        controller,
        exit_on_stdin_close,
    }))
}

/// Installs the stderr subscriber; `Err` names a `RUST_LOG` that does not
/// parse.
fn init_logging() -> Result<(), String> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let spec = std::env::var("RUST_LOG").unwrap_or_default();
    let spec = if spec.trim().is_empty() {
        "warn"
    } else {
        spec.trim()
    };
    let filter: tracing_subscriber::filter::Targets = spec
        .parse()
        .map_err(|e| format!("RUST_LOG {spec:?} does not parse: {e}"))?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    // A second subscriber cannot be installed in this process anyway.
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(filter)
        .try_init();
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(Cli::Run(a)) => a,
        Ok(Cli::Help) => {
            println!("{USAGE}\n\n{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = init_logging() {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(args));
    // The stdin watcher sits in a blocking read(2) that nothing can
    // cancel; do not wait for it.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    // Before anything else, so a SIGTERM sent as soon as the node says it
    // listens is a clean stop, not the default kill.
    let stop = StopSignals::install()?;
    std::fs::create_dir_all(&args.dir)
        .map_err(|e| format!("cannot create {}: {e}", args.dir.display()))?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("no local address: {e}"))?;
    let mut peers = args.peers.clone();
    peers.insert(args.node_id, local.to_string());
    let cfg = NetworkConfig::default();
    let network = Network::new(args.node_id, cfg.clone())
        .with_dial_overrides(args.peer_dial.clone().into_iter().collect());
    let groups: Vec<GroupId> = (0..args.groups).map(|p| GroupId::partition(0, p)).collect();
    let options = NodeOptions {
        controller: args.controller,
    };
    let node = Node::start_with(args.node_id, &args.dir, &groups, peers, &network, options)
        .await
        .map_err(|e| e.to_string())?;
    let server = Server::start(
        listener,
        cfg,
        std::sync::Arc::new(node.registry()),
        Some(std::sync::Arc::new(node.clone())),
    )
    .map_err(|e| format!("cannot serve: {e}"))?;
    tracing::info!(node = args.node_id, %local, dir = %args.dir.display(), "listening");
    println!("listening {local}");

    stop.wait(args.exit_on_stdin_close).await;
    server.shutdown();
    node.shutdown().await;
    Ok(())
}

struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> Result<StopSignals, String> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?,
            int: signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT: {e}"))?,
        })
    }

    /// Returns on SIGTERM, SIGINT or (with `watch_stdin`) the end of stdin.
    async fn wait(mut self, watch_stdin: bool) {
        let stdin_closed = async {
            if !watch_stdin {
                return std::future::pending().await;
            }
            let mut stdin = tokio::io::stdin();
            let mut buf = [0u8; 64];
            while let Ok(n) = stdin.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
            _ = stdin_closed => {}
        }
    }
}
