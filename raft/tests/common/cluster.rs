//! The three-process cluster the replication tests drive: node processes
//! on 127.0.0.1 (each on its own temporary directory), idempotent
//! producers appending with `acks=quorum`, a concurrent committed reader,
//! and the history check over everything acknowledged and read against
//! the committed log every live node converges on.
//!
//! Bounded: every node is killed when its handle drops (and exits by
//! itself when its stdin closes, should the harness die), and every run
//! has a hard deadline.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fissionlog_raft::client::{ClientCall, ClientReply, NodeClient, ReadRecord};
use fissionlog_raft::types::{CommandResponse, GroupId, NodeId, ProducerStamp, RecordIn};

use super::history::{self, Acked, Isolation, Observed};
use super::proxy::Mesh;

pub const DEADLINE: Duration = Duration::from_secs(120);
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
pub const PRODUCERS: u64 = 8;
/// Appends acknowledged before the kill, and by the new leader after it.
pub const ACKS_PER_PHASE: usize = 80;
pub const GROUP: GroupId = GroupId(0);

/// A node process, SIGKILLed when dropped. Its data lives in `data/` of
/// its temporary directory and its stderr (tracing at `RUST_LOG`, `info`
/// for fissionlog and openraft's warnings when unset) in `node.log` beside
/// it, appended to across restarts; a failing test prints each node's log
/// tail and keeps the directory.
pub struct NodeProc {
    pub id: NodeId,
    pub addr: String,
    pub child: Child,
    pub dir: tempfile::TempDir,
    /// Given to the binary at every start (`--peer-dial`, say).
    pub extra_args: Vec<String>,
}

/// Lines of each node's log printed when a test fails.
pub const LOG_TAIL_LINES: usize = 80;

impl NodeProc {
    pub fn start(id: NodeId) -> NodeProc {
        NodeProc::start_with(id, Vec::new())
    }

    /// Starts node `id` with `extra_args` on the command line, now and at
    /// every restart.
    pub fn start_with(id: NodeId, extra_args: Vec<String>) -> NodeProc {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (child, addr) = spawn_node(id, dir.path(), "127.0.0.1:0", &extra_args);
        NodeProc {
            id,
            addr,
            child,
            dir,
            extra_args,
        }
    }

    /// Starts the node again on its directory and its address (peers
    /// know it by the address in the group's membership).
    pub fn restart(&mut self) {
        self.kill();
        let (child, addr) = spawn_node(self.id, self.dir.path(), &self.addr, &self.extra_args);
        assert_eq!(addr, self.addr, "node {} kept its address", self.id);
        self.child = child;
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("node.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

pub fn spawn_node(
    id: NodeId,
    base: &std::path::Path,
    listen: &str,
    extra_args: &[String],
) -> (Child, String) {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(base.join("node.log"))
        .expect("open the node's log file");
    let filter = std::env::var("RUST_LOG")
        .unwrap_or_else(|_| "warn,fissionlog_raft=info,fissionlog=info".to_string());
    let mut child = Command::new(env!("CARGO_BIN_EXE_fissionlog-raft"))
        .arg("--dir")
        .arg(base.join("data"))
        .args(["--node-id", &id.to_string(), "--listen", listen])
        .arg("--exit-on-stdin-close")
        .args(extra_args)
        .env("RUST_LOG", filter)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn the node binary");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut line = String::new();
    // The node prints its address once it serves; a node that dies
    // first closes stdout and the read returns empty.
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the node's first line");
    let addr = line
        .strip_prefix("listening ")
        .unwrap_or_else(|| {
            let log = std::fs::read_to_string(base.join("node.log")).unwrap_or_default();
            panic!("node {id} did not start: {line:?}\n{log}")
        })
        .trim()
        .to_string();
    (child, addr)
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            // Kept for a look at the whole log and the data.
            self.dir.disable_cleanup(true);
            eprintln!(
                "--- node {} log tail ({}) ---\n{}",
                self.id,
                self.dir.path().join("node.log").display(),
                self.log_tail()
            );
        }
    }
}

/// Where producers send: the addresses of the live nodes and the leader
/// last heard of.
#[derive(Default)]
pub struct Routing {
    pub alive: BTreeMap<NodeId, String>,
    pub leader: Option<NodeId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub key: String,
    pub seq: u64,
    pub offset: u64,
    pub by: NodeId,
    /// When the acknowledgement arrived.
    pub at: Instant,
}

pub async fn call(addr: &str, call: ClientCall) -> Option<ClientReply> {
    let mut c = NodeClient::connect(addr, CALL_TIMEOUT).await.ok()?;
    c.call(call, CALL_TIMEOUT).await.ok()
}

pub async fn leader_of(routing: &Mutex<Routing>) -> Option<NodeId> {
    let alive: Vec<(NodeId, String)> = lock(routing)
        .alive
        .iter()
        .map(|(i, a)| (*i, a.clone()))
        .collect();
    for (_, addr) in &alive {
        if let Some(ClientReply::Status {
            leader: Some(l), ..
        }) = call(addr, ClientCall::Status { group: GROUP }).await
        {
            if alive.iter().any(|(i, _)| *i == l) {
                return Some(l);
            }
        }
    }
    None
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One idempotent producer: key `k{id}`, values `k{id}:{seq}`, one batch
/// of one record per sequence, each retried (same stamp) until acked, and
/// so on until `stop`.
pub async fn produce(
    id: u64,
    routing: Arc<Mutex<Routing>>,
    acks: Arc<Mutex<Vec<Ack>>>,
    stop: Arc<AtomicBool>,
) {
    let key = format!("k{id}");
    let mut conns: HashMap<NodeId, NodeClient> = HashMap::new();
    for seq in 0.. {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let stamp = ProducerStamp {
            producer_id: id,
            epoch: 0,
            first_sequence: seq,
        };
        let records = vec![RecordIn {
            key: Some(key.clone().into_bytes()),
            value: format!("{key}:{seq}").into_bytes(),
            timestamp_ms: 0,
        }];
        loop {
            let target = {
                let r = lock(&routing);
                r.leader
                    .and_then(|l| r.alive.get(&l).map(|a| (l, a.clone())))
                    .or_else(|| r.alive.iter().next().map(|(i, a)| (*i, a.clone())))
            };
            let Some((node, addr)) = target else {
                // Every node is down (killed together): wait for restarts.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            if let std::collections::hash_map::Entry::Vacant(e) = conns.entry(node) {
                match NodeClient::connect(&addr, CALL_TIMEOUT).await {
                    Ok(c) => {
                        e.insert(c);
                    }
                    Err(_) => {
                        lock(&routing).leader = None;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                }
            }
            let Some(conn) = conns.get_mut(&node) else {
                continue;
            };
            let call = ClientCall::Append {
                group: GROUP,
                producer: Some(stamp),
                records: records.clone(),
            };
            match conn.call(call, CALL_TIMEOUT).await {
                Ok(ClientReply::Applied(
                    answer @ (CommandResponse::Appended { base_offset, .. }
                    | CommandResponse::Duplicate { base_offset, .. }),
                )) => {
                    if matches!(answer, CommandResponse::Duplicate { .. }) {
                        eprintln!("producer {id} sequence {seq}: a retry found its first copy");
                    }
                    lock(&acks).push(Ack {
                        key: key.clone(),
                        seq,
                        offset: base_offset,
                        by: node,
                        at: Instant::now(),
                    });
                    break;
                }
                Ok(ClientReply::Applied(other)) => {
                    panic!("producer {id} sequence {seq} refused: {other:?}")
                }
                Ok(ClientReply::NotLeader { leader, .. }) => {
                    {
                        let mut r = lock(&routing);
                        r.leader = leader.filter(|l| r.alive.contains_key(l) && *l != node);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(_) | Err(_) => {
                    conns.remove(&node);
                    {
                        // Try the next live node after this one.
                        let mut r = lock(&routing);
                        let next = r
                            .alive
                            .range(node + 1..)
                            .next()
                            .or_else(|| r.alive.iter().next())
                            .map(|(i, _)| *i);
                        r.leader = next;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// Reads every committed record of the group from `addr`.
pub async fn read_all(addr: &str) -> Option<(Vec<ReadRecord>, u64)> {
    read_all_of(addr, GROUP).await
}

/// Reads every committed record of `group` from `addr`.
pub async fn read_all_of(addr: &str, group: GroupId) -> Option<(Vec<ReadRecord>, u64)> {
    let mut c = NodeClient::connect(addr, CALL_TIMEOUT).await.ok()?;
    let mut out = Vec::new();
    loop {
        let reply = c
            .call(
                ClientCall::Read {
                    group,
                    from_offset: out.len() as u64,
                    max_records: 1000,
                },
                CALL_TIMEOUT,
            )
            .await
            .ok()?;
        let ClientReply::Records {
            records,
            committed_end,
        } = reply
        else {
            return None;
        };
        if records.is_empty() {
            return Some((out, committed_end));
        }
        out.extend(records);
    }
}

/// What a cluster test runs on its nodes: the idempotent producers,
/// where they send, what they were acknowledged, and a consumer reading
/// committed records meanwhile.
pub struct Load {
    pub routing: Arc<Mutex<Routing>>,
    pub acks: Arc<Mutex<Vec<Ack>>>,
    pub observed: Arc<Mutex<Vec<ReadRecord>>>,
    pub stop: Arc<AtomicBool>,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    pub reader: tokio::task::JoinHandle<()>,
}

impl Load {
    /// Initialises the group over `members` (asked of the first), then
    /// starts the producers and the committed reader.
    pub async fn start(members: &[(NodeId, String)]) -> Load {
        let init = call(
            &members[0].1,
            ClientCall::Initialize {
                group: GROUP,
                members: members.to_vec(),
            },
        )
        .await;
        assert_eq!(init, Some(ClientReply::Initialized));
        let routing = Arc::new(Mutex::new(Routing {
            alive: members.iter().cloned().collect(),
            leader: None,
        }));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (1..=PRODUCERS)
            .map(|id| tokio::spawn(produce(id, routing.clone(), acks.clone(), stop.clone())))
            .collect();
        let observed = Arc::new(Mutex::new(Vec::<ReadRecord>::new()));
        let reader = {
            let (routing, observed) = (routing.clone(), observed.clone());
            tokio::spawn(async move {
                loop {
                    let addrs: Vec<String> = lock(&routing).alive.values().cloned().collect();
                    for a in addrs {
                        if let Some((records, _)) = read_all(&a).await {
                            lock(&observed).extend(records);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        Load {
            routing,
            acks,
            observed,
            stop,
            tasks,
            reader,
        }
    }
}

/// A running cluster under load: its node processes, where producers
/// send, what they were acknowledged and what a concurrent reader saw.
pub struct Cluster {
    pub nodes: Vec<NodeProc>,
    pub routing: Arc<Mutex<Routing>>,
    pub acks: Arc<Mutex<Vec<Ack>>>,
    pub observed: Arc<Mutex<Vec<ReadRecord>>>,
    pub stop: Arc<AtomicBool>,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    pub reader: Option<tokio::task::JoinHandle<()>>,
    /// The proxies on the node-to-node links, when started with them.
    pub mesh: Option<Mesh>,
}

impl Cluster {
    /// Three nodes, the group initialised over them, the producers and
    /// the committed reader running.
    pub async fn start() -> Cluster {
        let nodes: Vec<NodeProc> = (1..=3).map(NodeProc::start).collect();
        Cluster::start_on(nodes, None).await
    }

    /// The same with every node-to-node link through a [`Mesh`] proxy
    /// (passing until a test switches it); clients reach the nodes
    /// directly.
    pub async fn start_with_proxies() -> Cluster {
        let ids: Vec<NodeId> = (1..=3).collect();
        let mesh = Mesh::start(&ids).await;
        let nodes: Vec<NodeProc> = ids
            .iter()
            .map(|&id| NodeProc::start_with(id, mesh.dial_args(id)))
            .collect();
        for n in &nodes {
            mesh.set_node_addr(n.id, &n.addr);
        }
        Cluster::start_on(nodes, Some(mesh)).await
    }

    /// The proxies; panics on a cluster started without them.
    pub fn mesh(&self) -> &Mesh {
        self.mesh.as_ref().expect("a cluster started with proxies")
    }

    async fn start_on(nodes: Vec<NodeProc>, mesh: Option<Mesh>) -> Cluster {
        let members: Vec<(NodeId, String)> = nodes.iter().map(|n| (n.id, n.addr.clone())).collect();
        let Load {
            routing,
            acks,
            observed,
            stop,
            tasks,
            reader,
        } = Load::start(&members).await;
        Cluster {
            nodes,
            routing,
            acks,
            observed,
            stop,
            tasks,
            reader: Some(reader),
            mesh,
        }
    }

    pub fn acked(&self) -> usize {
        lock(&self.acks).len()
    }

    /// Waits until `count` more appends than `from` were acknowledged by
    /// nodes other than `not_by`.
    pub async fn wait_acks(&self, from: usize, count: usize, not_by: Option<NodeId>) {
        loop {
            let n = lock(&self.acks)[from..]
                .iter()
                .filter(|a| Some(a.by) != not_by)
                .count();
            if n >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn leader(&self) -> NodeId {
        loop {
            if let Some(l) = leader_of(&self.routing).await {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn node(&mut self, id: NodeId) -> &mut NodeProc {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// Sends `signal` (`STOP`, `CONT`) to node `id`'s process. A stopped
    /// node stays in the routing: producers and the reader time out on it
    /// and move on, as they would on a node that hangs.
    pub fn signal(&mut self, id: NodeId, signal: &str) {
        let pid = self.node(id).child.id().to_string();
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("run kill(1)");
        assert!(sent.success(), "SIG{signal} to node {id}");
        eprintln!("SIG{signal} to node {id}");
    }

    /// Appends one record of key `probe` without a producer stamp to node
    /// `id` directly, never retried; an acknowledgement joins the history.
    pub async fn probe(&mut self, id: NodeId, seq: u64) -> Option<ClientReply> {
        let addr = self.node(id).addr.clone();
        let reply = call(
            &addr,
            ClientCall::Append {
                group: GROUP,
                producer: None,
                records: vec![RecordIn {
                    key: Some(b"probe".to_vec()),
                    value: format!("probe:{seq}").into_bytes(),
                    timestamp_ms: 0,
                }],
            },
        )
        .await;
        if let Some(ClientReply::Applied(CommandResponse::Appended { base_offset, .. })) = &reply {
            lock(&self.acks).push(Ack {
                key: "probe".to_string(),
                seq,
                offset: *base_offset,
                by: id,
                at: Instant::now(),
            });
        }
        reply
    }

    /// Waits until node `id` names another node as leader and refuses an
    /// append as not the leader.
    pub async fn wait_stepped_down(&mut self, id: NodeId, probe_seq: u64) {
        let addr = self.node(id).addr.clone();
        let started = Instant::now();
        loop {
            let names_another = matches!(
                call(&addr, ClientCall::Status { group: GROUP }).await,
                Some(ClientReply::Status { leader: Some(l), .. }) if l != id
            );
            if names_another {
                let reply = self.probe(id, probe_seq).await;
                assert!(
                    matches!(reply, Some(ClientReply::NotLeader { .. })),
                    "node {id}, a follower by its status, answered an append with {reply:?}"
                );
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "node {id} stepped down"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILLs node `id`; producers and the reader stop sending to it.
    pub fn kill(&mut self, id: NodeId) {
        lock(&self.routing).alive.remove(&id);
        self.node(id).kill();
        eprintln!("killed node {id}");
    }

    /// Starts node `id` again on its directory and address.
    pub fn restart(&mut self, id: NodeId) {
        let node = self.node(id);
        node.restart();
        let addr = node.addr.clone();
        lock(&self.routing).alive.insert(id, addr);
        eprintln!("restarted node {id}");
    }

    /// Stops the producers (each after an acknowledged append) and the
    /// reader; waits until every node holds the same committed log,
    /// covering every acknowledgement, and checks the history against it.
    pub async fn finish_and_check(mut self) -> (Vec<Ack>, Vec<ReadRecord>) {
        self.stop.store(true, Ordering::SeqCst);
        for p in std::mem::take(&mut self.tasks) {
            p.await.expect("a producer panicked");
        }
        if let Some(r) = self.reader.take() {
            r.abort();
        }
        let acks = lock(&self.acks).clone();
        let addrs: Vec<String> = lock(&self.routing).alive.values().cloned().collect();
        let final_log = converge(&addrs, &acks).await;
        check_history(&acks, &lock(&self.observed), &final_log);
        (acks, final_log)
    }
}

/// Waits until every node at `addrs` holds the same committed log, dense
/// from 0 and reaching past every acknowledged offset; returns it.
pub async fn converge(addrs: &[String], acks: &[Ack]) -> Vec<ReadRecord> {
    let max_acked = acks.iter().map(|a| a.offset + 1).max().unwrap_or(0);
    let mut last_report = Instant::now();
    loop {
        let mut logs = Vec::new();
        for a in addrs {
            logs.push(read_all(a).await);
        }
        let settled = logs
            .iter()
            .all(|l| matches!(l, Some((r, end)) if *end >= max_acked && r.len() as u64 == *end));
        if settled && !logs.is_empty() && logs.windows(2).all(|w| w[0] == w[1]) {
            if let Some((log, _)) = logs.swap_remove(0) {
                return log;
            }
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            last_report = Instant::now();
            let seen: Vec<Option<(usize, u64)>> = logs
                .iter()
                .map(|l| l.as_ref().map(|(r, end)| (r.len(), *end)))
                .collect();
            eprintln!("not converged yet: (records, committed end) per node {seen:?}, acknowledged up to {max_acked}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `scenario` on a multi-threaded runtime under the hard deadline.
pub fn run<F: std::future::Future<Output = ()>>(scenario: F) {
    run_within(DEADLINE, scenario);
}

/// Runs `scenario` on a multi-threaded runtime under `deadline`.
pub fn run_within<F: std::future::Future<Output = ()>>(deadline: Duration, scenario: F) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        tokio::time::timeout(deadline, scenario)
            .await
            .expect("the scenario finished within its deadline");
    });
}

/// The history check (`common::history`) over the whole run, then what
/// the producers' shape adds: a producer stops after an acknowledged
/// append and retries each sequence with its stamp until acknowledged, so
/// its key holds exactly the sequences acknowledged to it, each once and
/// in order. Other keys (probes written without a stamp, never retried)
/// are held to the history rules only.
pub fn check_history(acks: &[Ack], observed: &[ReadRecord], final_log: &[ReadRecord]) {
    let acked: Vec<Acked> = acks
        .iter()
        .map(|a| Acked {
            key: a.key.clone(),
            value: format!("{}:{}", a.key, a.seq),
            offset: a.offset,
        })
        .collect();
    let observed: Vec<Observed> = observed
        .iter()
        .map(|r| Observed {
            record: r.clone(),
            isolation: Isolation::Committed,
        })
        .collect();
    if let Err(v) = history::check(&acked, &observed, final_log) {
        panic!("the history check failed: {v:?}");
    }
    let producer_keys: HashSet<String> = (1..=PRODUCERS).map(|id| format!("k{id}")).collect();
    let mut per_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in final_log {
        let key = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
        if !producer_keys.contains(&key) {
            continue;
        }
        let value = String::from_utf8_lossy(&r.value).into_owned();
        let seq = value
            .rsplit(':')
            .next()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("a value the test did not write: {value:?}"));
        per_key.entry(key).or_default().push(seq);
    }
    let mut acked_per_key: BTreeMap<String, HashSet<u64>> = BTreeMap::new();
    for a in acks.iter().filter(|a| producer_keys.contains(&a.key)) {
        acked_per_key
            .entry(a.key.clone())
            .or_default()
            .insert(a.seq);
    }
    assert_eq!(acked_per_key.len() as u64, PRODUCERS);
    for (key, seqs) in per_key {
        let acked = acked_per_key.get(&key).map_or(0, |s| s.len() as u64);
        let want: Vec<u64> = (0..acked).collect();
        assert_eq!(
            seqs, want,
            "key {key}: every sequence once, in order (no duplicate from a retry)"
        );
    }
}
