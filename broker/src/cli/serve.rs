//! `serve`: one node on an embedded log.

use std::collections::BTreeMap;
use std::path::PathBuf;

use fissionlog::{Log, LogOptions};
use fissionlog_broker::server::cluster::{Cluster, ClusterConfig};
use fissionlog_broker::server::{serve_with_http, ServerConfig, TokenAuthorizer};

use super::{CmdResult, Failure};

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// Log directory (created when missing).
    #[arg(long)]
    dir: PathBuf,
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:9092")]
    listen: String,
    /// Connections served at once.
    #[arg(long, default_value_t = 1024)]
    max_connections: u32,
    /// Requests outstanding per connection.
    #[arg(long, default_value_t = 256)]
    max_in_flight: u32,
    /// Largest frame in bytes.
    #[arg(long, default_value_t = fissionlog_broker::protocol::DEFAULT_MAX_FRAME_BYTES)]
    max_frame_bytes: u32,
    /// Token authentication with per-topic permissions, from a JSON file
    /// `{"tokens": [{"name", "token", "read": [topics], "write": [topics], "admin"}]}`
    /// ("*" names every topic). Without it everyone may do everything.
    #[arg(long)]
    auth_file: Option<PathBuf>,
    /// Also serve HTTP here: `/metrics` (Prometheus) and the live view at
    /// `/` (port 0: any free port; printed on the second stdout line).
    #[arg(long)]
    http: Option<String>,
    /// Serve over TLS with this certificate chain (PEM, leaf first).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: accept only clients with a certificate from these CAs (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Cluster mode: this broker's node id in the cluster (with
    /// `--peers`). The log then lives in `DIR/raft`, every topic is
    /// replicated, and peers reach this node on the `--listen` port.
    #[arg(long, requires = "peers")]
    node_id: Option<u64>,
    /// Cluster mode: every broker of the cluster as `ID=HOST:PORT,...`
    /// (this one included), the address each listens on (`--listen`).
    #[arg(long, requires = "node_id", value_parser = parse_peers)]
    peers: Option<BTreeMap<u64, String>>,
    /// Log at debug level (stderr).
    #[arg(long)]
    verbose: bool,
}

/// `ID=HOST:PORT,...` into node ids and addresses.
fn parse_peers(v: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut out = BTreeMap::new();
    for p in v.split(',').filter(|p| !p.is_empty()) {
        let (id, addr) = p
            .split_once('=')
            .ok_or_else(|| format!("{p:?} is not ID=HOST:PORT"))?;
        let id = id
            .parse::<u64>()
            .map_err(|_| format!("node id {id:?} is not a number"))?;
        if out.insert(id, addr.to_string()).is_some() {
            return Err(format!("node id {id} is named twice"));
        }
    }
    if out.is_empty() {
        return Err("no peers".into());
    }
    Ok(out)
}

pub(crate) async fn run(a: ServeArgs) -> CmdResult {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(if a.verbose {
            tracing::Level::DEBUG
        } else {
            tracing::Level::INFO
        })
        .try_init();
    if let Err(e) = std::fs::create_dir_all(&a.dir) {
        return Err(Failure::usage(format!(
            "cannot create {}: {e}",
            a.dir.display()
        )));
    }
    // Before the log opens: its partitions register their series with the
    // recorder installed when they are made.
    fissionlog_broker::server::metrics::install();
    // Cluster mode: the replicated log in DIR/raft, the broker's own
    // (producer ids, nothing else in use) in DIR/local, so neither finds
    // the other's files.
    let (dir, raft_dir) = match a.node_id {
        Some(_) => (a.dir.join("local"), Some(a.dir.join("raft"))),
        None => (a.dir.clone(), None),
    };
    let log_dir = dir.clone();
    let log = tokio::task::spawn_blocking(move || Log::open(&log_dir, LogOptions::default()))
        .await
        .map_err(|e| Failure::refused(format!("open failed: {e}")))?
        .map_err(|e| Failure::usage(format!("cannot open the log at {}: {e}", dir.display())))?;
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .map_err(|e| Failure::usage(format!("cannot listen on {}: {e}", a.listen)))?;
    let http = match &a.http {
        Some(h) => Some(
            tokio::net::TcpListener::bind(h)
                .await
                .map_err(|e| Failure::usage(format!("cannot listen on {h}: {e}")))?,
        ),
        None => None,
    };
    let mut config = ServerConfig {
        max_connections: a.max_connections,
        max_in_flight: a.max_in_flight,
        max_frame_bytes: a.max_frame_bytes,
        ..Default::default()
    };
    if let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) {
        let tls = fissionlog_broker::tls::server_config(cert, key, a.tls_client_ca.as_deref())
            .map_err(|e| Failure::usage(e.to_string()))?;
        config.tls = Some(tls);
    }
    if let Some(f) = &a.auth_file {
        let text = std::fs::read_to_string(f)
            .map_err(|e| Failure::usage(format!("cannot read {}: {e}", f.display())))?;
        let auth = TokenAuthorizer::from_json(&text).map_err(Failure::usage)?;
        config.authorizer = std::sync::Arc::new(auth);
    }
    if let (Some(node_id), Some(peers), Some(raft_dir)) = (a.node_id, a.peers.clone(), &raft_dir) {
        let local = listener
            .local_addr()
            .map_err(|e| Failure::usage(format!("no local address: {e}")))?;
        let c = Cluster::start(ClusterConfig { node_id, peers }, raft_dir, local)
            .await
            .map_err(Failure::usage)?;
        config.cluster = Some(c);
    }
    let cluster = config.cluster.clone();
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    serve_with_http(log, listener, http, config, shutdown, |h| {
        // The first stdout line: what scripts and the demo wait for.
        println!("listening on {}", h.addr);
        if let Some(a) = h.http_addr {
            println!("http on http://{a}/");
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
    })
    .await
    .map_err(|e| Failure::refused(format!("closing the log failed: {e}")))?;
    if let Some(c) = cluster {
        c.shutdown().await;
    }
    Ok(())
}
