//! Three node processes on 127.0.0.1, each on its own directory: a group
//! initialised over them, idempotent producers appending with
//! `acks=quorum`, a concurrent committed reader, SIGKILLs part-way (the
//! leader; a follower, restarted; all three, restarted; the leader,
//! restarted), and a history check over everything acknowledged and read
//! against the committed log every live node converges on.
//!
//! Bounded: every node is killed when the harness drops (and exits by
//! itself when its stdin closes, should the harness die), and the whole
//! run has a hard deadline.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fissionlog_raft::client::{ClientCall, ClientReply, NodeClient, ReadRecord};
use fissionlog_raft::types::{CommandResponse, GroupId, NodeId, ProducerStamp, RecordIn};

use common::history::{self, Acked, Isolation, Observed};

const DEADLINE: Duration = Duration::from_secs(120);
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
const PRODUCERS: u64 = 8;
/// Appends acknowledged before the kill, and by the new leader after it.
const ACKS_PER_PHASE: usize = 80;
const GROUP: GroupId = GroupId(0);

/// A node process, SIGKILLed when dropped. Its data lives in `data/` of
/// its temporary directory and its stderr (tracing at `RUST_LOG`, `info`
/// for fissionlog and openraft's warnings when unset) in `node.log` beside
/// it, appended to across restarts; a failing test prints each node's log
/// tail and keeps the directory.
struct NodeProc {
    id: NodeId,
    addr: String,
    child: Child,
    dir: tempfile::TempDir,
}

/// Lines of each node's log printed when a test fails.
const LOG_TAIL_LINES: usize = 80;

impl NodeProc {
    fn start(id: NodeId) -> NodeProc {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (child, addr) = spawn_node(id, dir.path(), "127.0.0.1:0");
        NodeProc {
            id,
            addr,
            child,
            dir,
        }
    }

    /// Starts the node again on its directory and its address (peers
    /// know it by the address in the group's membership).
    fn restart(&mut self) {
        self.kill();
        let (child, addr) = spawn_node(self.id, self.dir.path(), &self.addr);
        assert_eq!(addr, self.addr, "node {} kept its address", self.id);
        self.child = child;
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("node.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

fn spawn_node(id: NodeId, base: &std::path::Path, listen: &str) -> (Child, String) {
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
struct Routing {
    alive: BTreeMap<NodeId, String>,
    leader: Option<NodeId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Ack {
    key: String,
    seq: u64,
    offset: u64,
    by: NodeId,
}

async fn call(addr: &str, call: ClientCall) -> Option<ClientReply> {
    let mut c = NodeClient::connect(addr, CALL_TIMEOUT).await.ok()?;
    c.call(call, CALL_TIMEOUT).await.ok()
}

async fn leader_of(routing: &Mutex<Routing>) -> Option<NodeId> {
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One idempotent producer: key `k{id}`, values `k{id}:{seq}`, one batch
/// of one record per sequence, each retried (same stamp) until acked, and
/// so on until `stop`.
async fn produce(
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
async fn read_all(addr: &str) -> Option<(Vec<ReadRecord>, u64)> {
    let mut c = NodeClient::connect(addr, CALL_TIMEOUT).await.ok()?;
    let mut out = Vec::new();
    loop {
        let reply = c
            .call(
                ClientCall::Read {
                    group: GROUP,
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

/// A running cluster under load: its node processes, where producers
/// send, what they were acknowledged and what a concurrent reader saw.
struct Cluster {
    nodes: Vec<NodeProc>,
    routing: Arc<Mutex<Routing>>,
    acks: Arc<Mutex<Vec<Ack>>>,
    observed: Arc<Mutex<Vec<ReadRecord>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    /// Three nodes, the group initialised over them, the producers and
    /// the committed reader running.
    async fn start() -> Cluster {
        let nodes: Vec<NodeProc> = (1..=3).map(NodeProc::start).collect();
        let members: Vec<(NodeId, String)> = nodes.iter().map(|n| (n.id, n.addr.clone())).collect();
        let init = call(
            &nodes[0].addr,
            ClientCall::Initialize {
                group: GROUP,
                members: members.clone(),
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
        // A consumer reading committed records while all this goes on.
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
        Cluster {
            nodes,
            routing,
            acks,
            observed,
            stop,
            tasks,
            reader: Some(reader),
        }
    }

    fn acked(&self) -> usize {
        lock(&self.acks).len()
    }

    /// Waits until `count` more appends than `from` were acknowledged by
    /// nodes other than `not_by`.
    async fn wait_acks(&self, from: usize, count: usize, not_by: Option<NodeId>) {
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

    async fn leader(&self) -> NodeId {
        loop {
            if let Some(l) = leader_of(&self.routing).await {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn node(&mut self, id: NodeId) -> &mut NodeProc {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// Sends `signal` (`STOP`, `CONT`) to node `id`'s process. A stopped
    /// node stays in the routing: producers and the reader time out on it
    /// and move on, as they would on a node that hangs.
    fn signal(&mut self, id: NodeId, signal: &str) {
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
    async fn probe(&mut self, id: NodeId, seq: u64) -> Option<ClientReply> {
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
            });
        }
        reply
    }

    /// Waits until node `id` names another node as leader and refuses an
    /// append as not the leader.
    async fn wait_stepped_down(&mut self, id: NodeId, probe_seq: u64) {
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
    fn kill(&mut self, id: NodeId) {
        lock(&self.routing).alive.remove(&id);
        self.node(id).kill();
        eprintln!("killed node {id}");
    }

    /// Starts node `id` again on its directory and address.
    fn restart(&mut self, id: NodeId) {
        let node = self.node(id);
        node.restart();
        let addr = node.addr.clone();
        lock(&self.routing).alive.insert(id, addr);
        eprintln!("restarted node {id}");
    }

    /// Stops the producers (each after an acknowledged append) and the
    /// reader; waits until every node holds the same committed log,
    /// covering every acknowledgement, and checks the history against it.
    async fn finish_and_check(mut self) {
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
    }
}

/// Waits until every node at `addrs` holds the same committed log, dense
/// from 0 and reaching past every acknowledged offset; returns it.
async fn converge(addrs: &[String], acks: &[Ack]) -> Vec<ReadRecord> {
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
fn run<F: std::future::Future<Output = ()>>(scenario: F) {
    run_within(DEADLINE, scenario);
}

/// Runs `scenario` on a multi-threaded runtime under `deadline`.
fn run_within<F: std::future::Future<Output = ()>>(deadline: Duration, scenario: F) {
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
fn check_history(acks: &[Ack], observed: &[ReadRecord], final_log: &[ReadRecord]) {
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

#[test]
fn a_killed_leader_is_replaced_and_every_acknowledged_append_is_read_back_at_its_offset() {
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE, None).await;
        let leader = c.leader().await;
        let killed_at = Instant::now();
        c.kill(leader);
        let before = c.acked();
        c.wait_acks(before, 1, Some(leader)).await;
        eprintln!(
            "a new leader acknowledged an append {:?} after the kill",
            killed_at.elapsed()
        );
        c.wait_acks(before, ACKS_PER_PHASE, Some(leader)).await;
        c.finish_and_check().await;
    });
}

/// Leader kills in the failover campaign.
const FAILOVER_KILLS: usize = 20;
/// The campaign's hard deadline: each kill, restart and catch-up takes a
/// few seconds.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(600);

/// Waits until restarted node `id` names another node as leader and its
/// committed end reaches the leader's as it was when the wait began.
async fn wait_rejoined(c: &mut Cluster, id: NodeId) {
    let started = Instant::now();
    let target = loop {
        let leader = c.leader().await;
        let addr = c.node(leader).addr.clone();
        if let Some(ClientReply::Status {
            leader: Some(l),
            committed_end,
        }) = call(&addr, ClientCall::Status { group: GROUP }).await
        {
            if l == leader && l != id {
                break committed_end;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let addr = c.node(id).addr.clone();
    loop {
        if let Some(ClientReply::Status {
            leader: Some(l),
            committed_end,
        }) = call(&addr, ClientCall::Status { group: GROUP }).await
        {
            if l != id && committed_end >= target {
                return;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "node {id} rejoined and caught up to {target}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The failover figure: under the producers' load, SIGKILL the leader,
/// time the first append acknowledged by another node, restart the
/// killed node on its directory and wait until it has caught up; twenty
/// times, then the history check over the whole campaign. Prints the
/// median, p90 and maximum with every sample.
#[test]
#[ignore = "opt-in campaign of 20 leader kills, a few minutes"]
fn failover_over_twenty_leader_kills() {
    run_within(FAILOVER_DEADLINE, async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE, None).await;
        let mut samples = Vec::with_capacity(FAILOVER_KILLS);
        for kill in 1..=FAILOVER_KILLS {
            let leader = c.leader().await;
            c.wait_acks(c.acked(), ACKS_PER_PHASE / 4, None).await;
            let before = c.acked();
            let killed_at = Instant::now();
            c.kill(leader);
            c.wait_acks(before, 1, Some(leader)).await;
            let failover = killed_at.elapsed();
            eprintln!("kill {kill}: node {leader}, failover {failover:?}");
            samples.push(failover);
            c.restart(leader);
            wait_rejoined(&mut c, leader).await;
        }
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 4, None).await;
        c.finish_and_check().await;
        samples.sort();
        let at = |q: usize| samples[(samples.len() * q / 100).min(samples.len() - 1)];
        println!(
            "failover over {} leader kills: median {:?}, p90 {:?}, max {:?}; samples (sorted) {:?}",
            samples.len(),
            at(50),
            at(90),
            samples[samples.len() - 1],
            samples
        );
    });
}

#[test]
fn a_follower_killed_under_load_and_restarted_on_its_directory_catches_up_to_the_same_committed_log(
) {
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let leader = c.leader().await;
        let follower = (1..=3).find(|&n| n != leader).unwrap_or(1);
        c.kill(follower);
        // The other two are a quorum: acknowledgements go on without it.
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        c.restart(follower);
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        // All three nodes, the restarted one included, converge.
        c.finish_and_check().await;
    });
}

#[test]
fn every_acknowledged_append_survives_a_sigkill_of_all_three_nodes_once_and_in_order() {
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE, None).await;
        // Producers keep sending while every node dies: some appends are
        // in flight, written on some nodes and acknowledged to no one.
        for id in 1..=3 {
            c.kill(id);
        }
        let acked_before_kill = c.acked();
        for id in 1..=3 {
            c.restart(id);
        }
        // The restarted nodes elect a leader from their own logs and
        // votes, and the producers' retries find their first copies.
        c.wait_acks(acked_before_kill, ACKS_PER_PHASE / 2, None)
            .await;
        c.finish_and_check().await;
    });
}

#[test]
fn a_killed_leader_restarted_on_its_directory_rejoins_as_a_follower_and_converges() {
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE, None).await;
        let old = c.leader().await;
        c.kill(old);
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, Some(old)).await;
        c.restart(old);
        // The restarted node learns of the new leader instead of
        // standing for election with its old term's log.
        let addr = c.node(old).addr.clone();
        let started = Instant::now();
        loop {
            if let Some(ClientReply::Status {
                leader: Some(l), ..
            }) = call(&addr, ClientCall::Status { group: GROUP }).await
            {
                if l != old {
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "node {old} learned of a leader after its restart"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, Some(old)).await;
        c.finish_and_check().await;
    });
}

#[test]
fn a_leader_paused_past_the_election_timeout_steps_down_on_resume_and_loses_no_acknowledged_append()
{
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let old = c.leader().await;
        c.signal(old, "STOP");
        let paused_at = Instant::now();
        let before = c.acked();
        // The producers fail over: the other two elect a leader and
        // acknowledge without the paused one.
        c.wait_acks(before, ACKS_PER_PHASE / 2, Some(old)).await;
        eprintln!(
            "acknowledgements resumed without node {old} {:?} after its pause",
            paused_at.elapsed()
        );
        let new = c.leader().await;
        assert_ne!(new, old, "another node leads while node {old} is paused");
        c.signal(old, "CONT");
        // Whatever the old leader took in while paused it cannot commit
        // at its old term: it names the new leader and refuses appends,
        // and an acknowledgement it gave is checked like any other.
        c.wait_stepped_down(old, 0).await;
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, Some(old)).await;
        c.finish_and_check().await;
    });
}

#[test]
fn a_leader_with_both_followers_paused_acknowledges_nothing_until_they_resume() {
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let leader = c.leader().await;
        let followers: Vec<NodeId> = (1..=3).filter(|&n| n != leader).collect();
        for &f in &followers {
            c.signal(f, "STOP");
        }
        // Appends in flight when the followers stopped may already be
        // committed; let their answers land.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let acked_when_paused = c.acked();
        for seq in 0..2 {
            let reply = c.probe(leader, seq).await;
            eprintln!("an append to the leader without a quorum: {reply:?}");
            assert!(
                !matches!(reply, Some(ClientReply::Applied(_))),
                "the leader without a quorum acknowledged an append: {reply:?}"
            );
        }
        assert_eq!(
            c.acked(),
            acked_when_paused,
            "nothing was acknowledged while only the leader ran"
        );
        for &f in &followers {
            c.signal(f, "CONT");
        }
        // The cluster serves again; the probes that timed out may be
        // committed now, once each, and the history check holds them to
        // that.
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        c.finish_and_check().await;
    });
}

#[test]
fn a_node_stops_cleanly_on_sigterm() {
    let mut node = NodeProc::start(1);
    let sent = Command::new("kill")
        .args(["-TERM", &node.child.id().to_string()])
        .status()
        .expect("run kill(1)");
    assert!(sent.success());
    let started = Instant::now();
    let status = loop {
        if let Some(s) = node.child.try_wait().expect("wait for the node") {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the node did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn a_node_without_its_required_options_exits_with_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_fissionlog-raft"))
        .args(["--node-id", "x"])
        .output()
        .expect("run the node binary");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--node-id \"x\" is not a number"),
        "{stderr}"
    );
    assert!(stderr.contains("usage:"), "{stderr}");
}
