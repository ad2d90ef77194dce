//! Cluster mode end to end: three `fissionlog-broker serve --node-id
//! --peers` processes on 127.0.0.1, a topic of three partitions created
//! through the controller, an idempotent producer with `acks=quorum`
//! through the client, the broker leading a partition SIGKILLed while
//! records are in flight, and everything committed read back from the
//! survivors.
//!
//! Bounded: each test runs under a deadline, every wait inside it is
//! limited and says what did not happen, and every broker is killed when
//! the test's handles drop.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fissionlog_broker::client::{
    Admin, ClientError, Connection, Endpoint, Fetcher, FetcherConfig, Producer, ProducerConfig,
};
use fissionlog_broker::protocol::{
    Acks, ErrorCode, FetchedRecord, Isolation, ProduceRecord, RangeOwner, Request, Response, Stamp,
    SyncSpec,
};

const BIN: &str = env!("CARGO_BIN_EXE_fissionlog-broker");
const DEADLINE: Duration = Duration::from_secs(150);
/// How long one wait inside a test may take.
const WAIT_LIMIT: Duration = Duration::from_secs(30);
const KEYS: usize = 12;

/// One broker process, SIGKILLed when dropped. Its stderr goes to
/// `broker.log` beside its data; a failing test prints each log's tail.
struct Broker {
    id: u64,
    addr: String,
    child: Option<Child>,
    dir: PathBuf,
    /// The `--peers` it was started with.
    peers: String,
}

/// Starts broker `id` on `dir/data` listening on `addr`; its first
/// stdout line must say it listens there.
fn spawn_broker(id: u64, addr: &str, dir: &Path, peers: &str) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("broker.log"))
        .expect("the broker's log");
    let mut child = Command::new(BIN)
        .args(["serve", "--dir"])
        .arg(dir.join("data"))
        .args([
            "--listen",
            addr,
            "--node-id",
            &id.to_string(),
            "--peers",
            peers,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("the broker starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("the broker's first line");
    if line.trim() != format!("listening on {addr}") {
        let _ = child.kill();
        let _ = child.wait();
        panic!("broker {id} listens where its peers know it ({addr}); it printed {line:?}");
    }
    child
}

impl Broker {
    /// Starts it again on its directory and address.
    fn restart(&mut self) {
        self.kill();
        self.child = Some(spawn_broker(self.id, &self.addr, &self.dir, &self.peers));
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

struct Cluster {
    brokers: Vec<Broker>,
    base: Option<tempfile::TempDir>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let failing = std::thread::panicking();
        for b in &mut self.brokers {
            b.kill();
            if failing {
                eprintln!(
                    "--- broker {} ({}) log tail:\n{}",
                    b.id,
                    b.addr,
                    b.log_tail()
                );
            }
        }
        if failing {
            if let Some(base) = self.base.take() {
                eprintln!(
                    "the brokers' directories are kept in {}",
                    base.keep().display()
                );
            }
        }
    }
}

/// Three free loopback addresses, chosen by the OS: bound, read, let go
/// (the brokers must know each other's address before they start).
fn free_addrs(n: usize) -> Vec<String> {
    let ls: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port"))
        .collect();
    ls.iter()
        .map(|l| l.local_addr().expect("an address").to_string())
        .collect()
}

fn start_cluster() -> Cluster {
    start_cluster_of(3)
}

/// A cluster of `n` brokers, ids 1 to `n`.
fn start_cluster_of(n: usize) -> Cluster {
    let base = tempfile::tempdir().expect("a temporary directory");
    let addrs = free_addrs(n);
    let peers: String = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut brokers = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let id = i as u64 + 1;
        let dir = base.path().join(format!("b{id}"));
        std::fs::create_dir_all(&dir).expect("the broker's directory");
        let child = spawn_broker(id, addr, &dir, &peers);
        brokers.push(Broker {
            id,
            addr: addr.clone(),
            child: Some(child),
            dir,
            peers: peers.clone(),
        });
    }
    Cluster {
        brokers,
        base: Some(base),
    }
}

fn run_within(body: impl std::future::Future<Output = ()> + Send + 'static) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        tokio::time::timeout(DEADLINE, body)
            .await
            .expect("the test finishes within its deadline")
    });
    rt.shutdown_timeout(Duration::from_secs(1));
}

/// Creates `topic` through broker `addr`, retrying while the controller
/// elects its first leader.
async fn create_topic(addr: &str, topic: &str, partitions: u32) {
    let started = Instant::now();
    loop {
        let last = match Connection::connect(addr, None).await {
            Ok(c) => {
                let r = Admin::new(c)
                    .create_topic(topic, partitions, SyncSpec::Always, 0, false)
                    .await;
                match r {
                    Ok(_) => return,
                    Err(e) => e.to_string(),
                }
            }
            Err(e) => e.to_string(),
        };
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "the cluster created {topic} (last answer: {last})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each partition's leader as broker `addr` describes it, once it names
/// one for every partition.
async fn leaders(addr: &str, topic: &str) -> BTreeMap<u32, u64> {
    let started = Instant::now();
    loop {
        let mut last = String::new();
        if let Ok(c) = Connection::connect(addr, None).await {
            match Admin::new(c).describe(topic).await {
                Ok(v) => {
                    let parts = v["partitions"].as_array().cloned().unwrap_or_default();
                    let got: BTreeMap<u32, u64> = parts
                        .iter()
                        .filter_map(|p| Some((p["id"].as_u64()? as u32, p["leader"].as_u64()?)))
                        .collect();
                    if !parts.is_empty() && got.len() == parts.len() {
                        assert!(
                            parts
                                .iter()
                                .all(|p| p["replicas"].as_array().map(Vec::len) == Some(3)),
                            "every partition has three replicas: {v}"
                        );
                        return got;
                    }
                    last = v.to_string();
                }
                Err(e) => last = e.to_string(),
            }
        }
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "broker {addr} names a leader for every partition of {topic} (it says {last})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn fetch(conn: &Connection, topic: &str, partition: u32, offset: u64) -> Response {
    conn.call(Request::Fetch {
        topic: topic.into(),
        partition,
        offset,
        max_bytes: 1 << 20,
        max_wait_ms: 0,
        isolation: Isolation::Written,
    })
    .await
    .expect("a fetch answer")
}

/// Every record of `partition` below the high watermark broker `addr`
/// reports once that covers `at_least`, and the high watermark; asserts
/// no answer carries a record at or past its own high watermark.
async fn read_all(
    addr: &str,
    topic: &str,
    partition: u32,
    at_least: u64,
) -> (Vec<FetchedRecord>, u64) {
    let conn = Connection::connect(addr, None)
        .await
        .expect("connect to a survivor");
    let started = Instant::now();
    loop {
        let mut out = Vec::new();
        let mut offset = 0;
        let hw = loop {
            let Response::Fetched {
                records,
                next_offset,
                high_watermark,
                ..
            } = fetch(&conn, topic, partition, offset).await
            else {
                panic!("a fetch of partition {partition} answers records");
            };
            for r in &records {
                assert!(
                    r.offset < high_watermark,
                    "partition {partition}: offset {} fetched at high watermark {high_watermark}",
                    r.offset
                );
            }
            let done = records.is_empty();
            out.extend(records);
            offset = next_offset;
            if done {
                break high_watermark;
            }
        };
        if hw >= at_least {
            return (out, hw);
        }
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "broker {addr}'s high watermark of partition {partition} reaches {at_least} (it is {hw})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `(key, seq)` of a value `k<key> <seq>`.
fn parse(value: &[u8]) -> (String, u64) {
    let s = std::str::from_utf8(value).expect("UTF-8 values");
    let (k, seq) = s.split_once(' ').expect("a value is KEY SEQ");
    (k.to_string(), seq.parse().expect("a sequence number"))
}

type Acked = Vec<((String, u64), (u32, u64))>;

/// Sends records `from..to` (record `i` has key `k{i % KEYS}`), and
/// returns each one's acknowledgement future, in send order.
async fn send_range(
    p: &Producer,
    from: u64,
    to: u64,
) -> Vec<((String, u64), fissionlog_broker::client::SendFuture)> {
    let mut out = Vec::new();
    for i in from..to {
        let key = format!("k{}", i % KEYS as u64);
        let value = format!("{key} {i}");
        let f = p
            .send(Some(Bytes::from(key.clone())), Bytes::from(value))
            .await;
        out.push(((key, i), f));
    }
    out
}

async fn await_acks(
    sent: Vec<((String, u64), fissionlog_broker::client::SendFuture)>,
    acked: &mut Acked,
) {
    for (rec, f) in sent {
        match f.await {
            Ok(Some(pos)) => acked.push((rec, pos)),
            other => panic!("record {rec:?} is acknowledged through the leader change: {other:?}"),
        }
    }
}

#[test]
fn acknowledged_records_survive_the_partition_leaders_kill_exactly_once_and_in_key_order() {
    leader_killed_mid_stream(false);
}

/// The same, the killed leader being the broker the producer was given.
#[test]
fn acknowledged_records_survive_the_kill_of_the_producers_own_broker() {
    leader_killed_mid_stream(true);
}

/// Produces 750 keyed records through broker 1, SIGKILLs the leader of a
/// partition (broker 1 itself with `endpoint_dies`) with records in
/// flight, and checks what the survivors hold.
fn leader_killed_mid_stream(endpoint_dies: bool) {
    let mut cluster = start_cluster();
    let addrs: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    run_within(async move {
        let topic = "orders";
        create_topic(&addrs[0], topic, 3).await;
        let before = leaders(&addrs[0], topic).await;
        for a in &addrs[1..] {
            leaders(a, topic).await;
        }
        // The victim leads a partition; it is the producer's
        // endpoint (broker 1) or another broker.
        let (&victim_partition, &victim) = before
            .iter()
            .find(|(_, &l)| (l == 1) == endpoint_dies)
            .expect("a partition led by the broker to kill");
        let config = ProducerConfig {
            acks: Acks::Quorum,
            idempotent: true,
            max_in_flight: 8,
            ..ProducerConfig::new(topic)
        };
        let producer = Producer::connect(Endpoint::new(addrs[0].clone()), config)
            .await
            .expect("the producer connects");
        let mut acked: Acked = Vec::new();
        let sent = send_range(&producer, 0, 300).await;
        await_acks(sent, &mut acked).await;
        // Mid-stream: records in flight when the leader dies.
        let in_flight = send_range(&producer, 300, 450).await;
        let v = victim as usize - 1;
        cluster.brokers[v].kill();
        let after = send_range(&producer, 450, 750).await;
        await_acks(in_flight, &mut acked).await;
        await_acks(after, &mut acked).await;
        assert_eq!(acked.len(), 750);

        let survivors: Vec<&String> = addrs
            .iter()
            .enumerate()
            .filter(|(i, _)| *i as u64 + 1 != victim)
            .map(|(_, a)| a)
            .collect();
        // The keys are routed with the topic's random routing key, so
        // the victim's partition may have been sent nothing after the
        // kill: its survivors then elect a leader only when their
        // election timeout runs out, which can be after the last ack.
        let started = Instant::now();
        loop {
            let now = leaders(survivors[0], topic).await;
            if now[&victim_partition] != victim {
                break;
            }
            assert!(
                started.elapsed() < WAIT_LIMIT,
                "partition {victim_partition} has a new leader (broker {} still names {victim})",
                survivors[0]
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        check(&acked, &survivors, topic).await;

        // Restarted on its directory and address, the victim hosts its
        // partitions again and catches up to the same committed log.
        cluster.brokers[v].restart();
        check(&acked, &[&addrs[v], survivors[0]], topic).await;
    });
}

/// Every acknowledged record is read back from every survivor at its
/// acknowledged position, exactly once; each key's records are in send
/// order; the survivors' committed prefixes are the same.
async fn check(acked: &Acked, survivors: &[&String], topic: &str) {
    let mut need: HashMap<u32, u64> = HashMap::new();
    for (_, (p, o)) in acked {
        let e = need.entry(*p).or_insert(0);
        *e = (*e).max(o + 1);
    }
    let mut read: Vec<BTreeMap<u32, Vec<FetchedRecord>>> = Vec::new();
    for addr in survivors {
        let mut parts = BTreeMap::new();
        for p in 0..3 {
            let (recs, _) = read_all(addr, topic, p, need.get(&p).copied().unwrap_or(0)).await;
            parts.insert(p, recs);
        }
        read.push(parts);
    }
    for p in 0..3u32 {
        let (a, b) = (&read[0][&p], &read[1][&p]);
        let n = a.len().min(b.len());
        let same = a[..n]
            .iter()
            .zip(&b[..n])
            .all(|(x, y)| (x.offset, &x.key, &x.value) == (y.offset, &y.key, &y.value));
        assert!(
            same,
            "partition {p}: the survivors' committed prefixes differ"
        );
    }
    let parts = &read[0];
    let mut seen: HashSet<(String, u64)> = HashSet::new();
    let mut at: HashMap<(u32, u64), (String, u64)> = HashMap::new();
    for (p, recs) in parts {
        let mut last: HashMap<String, u64> = HashMap::new();
        for (i, r) in recs.iter().enumerate() {
            assert_eq!(r.offset, i as u64, "partition {p}'s offsets are dense");
            let rec = parse(&r.value);
            assert!(seen.insert(rec.clone()), "{rec:?} is read twice");
            if let Some(&l) = last.get(&rec.0) {
                assert!(
                    rec.1 > l,
                    "key {} went from {l} to {} in partition {p}",
                    rec.0,
                    rec.1
                );
            }
            last.insert(rec.0.clone(), rec.1);
            at.insert((*p, r.offset), rec);
        }
    }
    for (rec, pos) in acked {
        assert_eq!(
            at.get(pos),
            Some(rec),
            "acknowledged {rec:?} is read back at {pos:?}"
        );
    }
}

/// With two of three replicas gone, the leader of a partition still
/// writes a produce to its log, but cannot commit it: a fetch from it
/// never returns that record, though the leader's partition holds it.
#[test]
fn a_record_the_leader_wrote_but_could_not_commit_is_never_fetched() {
    let mut cluster = start_cluster();
    let addrs: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u64>>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let dirs: Vec<PathBuf> = cluster.brokers.iter().map(|b| b.dir.clone()).collect();
    let run = std::thread::spawn(move || {
        run_within(async move {
            let topic = "audit";
            create_topic(&addrs[0], topic, 1).await;
            let leader = leaders(&addrs[0], topic).await[&0];
            let addr = addrs[leader as usize - 1].clone();
            let conn = Connection::connect(&addr, None).await.expect("connect");
            let Response::ProducerInit { producer_id, epoch } = conn
                .call(Request::InitProducer { producer_id: None })
                .await
                .expect("a producer id")
            else {
                panic!("a producer id");
            };
            let produce = |seq: u64, value: &'static str| Request::ProduceTo {
                topic: topic.into(),
                partition: 0,
                acks: Acks::Quorum,
                stamp: Some(Stamp {
                    producer_id,
                    epoch,
                    first_sequence: seq,
                }),
                records: vec![ProduceRecord {
                    key: None,
                    value: Bytes::from_static(value.as_bytes()),
                    timestamp: None,
                }],
            };
            // A follower does not append: it names the leader.
            let follower = addrs[leader as usize % 3].clone();
            let fconn = Connection::connect(&follower, None).await.expect("connect");
            let r = fconn.call(produce(0, "committed")).await;
            match r {
                Err(ClientError::NotLeader {
                    leader: Some(named),
                    ..
                }) => assert_eq!(
                    named, addr,
                    "the follower names the leader's client address"
                ),
                other => panic!("a follower answers not_leader naming the leader: {other:?}"),
            }
            // What cluster mode does not do yet is refused with its own code.
            let r = fconn
                .call(Request::JoinGroup {
                    topic: topic.into(),
                    group: "g".into(),
                    session_timeout_ms: 10_000,
                    processing_timeout_ms: 10_000,
                    instance_id: None,
                })
                .await;
            assert!(
                matches!(&r, Err(e) if e.code() == Some(ErrorCode::Unsupported)),
                "groups are unsupported in cluster mode: {r:?}"
            );
            let r = conn.call(produce(0, "committed")).await.expect("committed");
            assert_eq!(
                r,
                Response::Produced {
                    positions: vec![(0, 0)]
                }
            );
            let others: Vec<u64> = (1..=3).filter(|&i| i != leader).collect();
            tx.send(others).expect("the killer listens");
            go_rx.await.expect("the followers were killed");
            conn.set_request_timeout(Duration::from_secs(2));
            let r = conn.call(produce(1, "uncommitted")).await;
            assert!(
                matches!(r, Err(ClientError::Timeout { .. })),
                "without a quorum the produce is not acknowledged: {r:?}"
            );
            for _ in 0..5 {
                let Response::Fetched {
                    records,
                    high_watermark,
                    ..
                } = fetch(&conn, topic, 0, 0).await
                else {
                    panic!("a fetch answer");
                };
                let values: Vec<&[u8]> = records.iter().map(|r| &r.value[..]).collect();
                assert_eq!(values, vec![&b"committed"[..]]);
                assert_eq!(high_watermark, 1);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    });
    let others = rx
        .recv_timeout(DEADLINE)
        .expect("the run names the followers");
    for id in others {
        if let Some(b) = cluster.brokers.iter_mut().find(|b| b.id == id) {
            b.kill();
        }
    }
    let _ = go_tx.send(());
    if let Err(e) = run.join() {
        std::panic::resume_unwind(e);
    }
    // The leader's own partition holds the record it could not commit.
    for b in &mut cluster.brokers {
        b.kill();
    }
    let held = dirs
        .iter()
        .any(|d| written_values(&d.join("data/raft")).contains(&b"uncommitted".to_vec()));
    assert!(held, "the leader's log holds the uncommitted record");
}

/// Every record written to any partition group of the node log in `dir`
/// (committed or not).
fn written_values(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(log) = fissionlog::Log::open(dir, fissionlog::LogOptions::default()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in log.topics() {
        if !name.starts_with("group-") {
            continue;
        }
        let Ok(t) = log.topic(&name) else { continue };
        let Ok(part) = t.partition(0) else { continue };
        let Ok(batch) = part.read_with(0, 1 << 20, fissionlog::ReadIsolation::Written) else {
            continue;
        };
        for r in batch.try_iter().flatten() {
            out.push(r.value.to_vec());
        }
    }
    out
}

fn run_cli(args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    let mut c = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    c.stdin
        .take()
        .expect("piped stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let deadline = Instant::now() + WAIT_LIMIT;
    while c.try_wait().expect("its status").is_none() {
        if Instant::now() > deadline {
            let _ = c.kill();
            panic!("{args:?} did not finish");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    c.wait_with_output().expect("its output")
}

/// The README's three-node run: `produce --idempotent --ack-level quorum`
/// through one broker reaches every partition's leader, `describe` names
/// replicas and leaders, `describe` and `fetch` given a dead broker first
/// go on through the next (and `fetch` reads every record once from each
/// partition's leader), and what cluster mode does not take is refused.
#[test]
fn the_command_line_produces_to_and_describes_a_three_broker_cluster() {
    let cluster = start_cluster();
    let (b2, b3) = (&cluster.brokers[1].addr, &cluster.brokers[2].addr);
    let lines: String = (0..30).map(|i| format!("k{i}\tv{i}\n")).collect();
    let started = Instant::now();
    let out = loop {
        let out = run_cli(
            &[
                "produce",
                "--server",
                b2,
                "--topic",
                "t",
                "--create",
                "--partitions",
                "3",
                "--ack-level",
                "quorum",
                "--idempotent",
                "--acks",
            ],
            &lines,
        );
        // The controller may still be electing its first leader.
        if out.status.success() || started.elapsed() > WAIT_LIMIT {
            break out;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        out.status.success(),
        "produce: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let acks: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(acks.len(), 30);
    let partitions: HashSet<u64> = acks
        .iter()
        .filter_map(|a| a["partition"].as_u64())
        .collect();
    assert_eq!(partitions.len(), 3, "keys reach every partition: {acks:?}");

    // A replica learns its leader from the leader's first heartbeat,
    // which may come after the produce was committed by the other two.
    let started = Instant::now();
    loop {
        let out = run_cli(&["describe", "--server", b3, "--topic", "t", "--json"], "");
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON document");
        let parts = v["partitions"].as_array().expect("partitions").clone();
        assert_eq!(parts.len(), 3, "{v}");
        for p in &parts {
            assert_eq!(p["replicas"].as_array().map(Vec::len), Some(3), "{p}");
        }
        if parts.iter().all(|p| p["leader"].is_u64()) {
            break;
        }
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "broker 3 names every partition's leader: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Several brokers, the first one down: describe and fetch go on
    // through the next, and fetch reaches each partition's leader.
    let dead = free_addrs(1).remove(0);
    let out = run_cli(
        &[
            "describe", "--server", &dead, "--server", b3, "--topic", "t", "--json",
        ],
        "",
    );
    assert!(
        out.status.success(),
        "describe through the second --server: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut fetched = Vec::new();
    for p in 0..3u32 {
        let out = run_cli(
            &[
                "fetch",
                "--server",
                &dead,
                "--server",
                b3,
                "--topic",
                "t",
                "--partition",
                &p.to_string(),
                "--idle-ms",
                "500",
                "--json",
            ],
            "",
        );
        assert!(
            out.status.success(),
            "fetch of partition {p}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            assert_eq!(v["partition"].as_u64(), Some(u64::from(p)), "{v}");
            fetched.push((
                v["key"].clone(),
                v["value"].clone(),
                v["partition"].clone(),
                v["offset"].clone(),
            ));
        }
    }
    let mut want: Vec<_> = acks
        .iter()
        .map(|a| {
            (
                a["key"].clone(),
                a["partition"].clone(),
                a["offset"].clone(),
            )
        })
        .collect();
    let mut have: Vec<_> = fetched
        .iter()
        .map(|(k, v, p, o)| {
            assert_eq!(
                v.as_str().map(|v| v.trim_start_matches('v')),
                k.as_str().map(|k| k.trim_start_matches('k')),
                "each key's value"
            );
            (k.clone(), p.clone(), o.clone())
        })
        .collect();
    want.sort_by_key(|x| x.0.to_string());
    have.sort_by_key(|x| x.0.to_string());
    assert_eq!(
        have, want,
        "every produced record is fetched once, where it was acknowledged"
    );

    let out = run_cli(&["produce", "--server", b3, "--topic", "t"], "k\tv\n");
    assert_eq!(out.status.code(), Some(1), "an unrouted produce is refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("unsupported:").count(),
        1,
        "the code's name shows once: {stderr}"
    );

    let out = run_cli(&["serve", "--dir", "/nonexistent", "--node-id", "1"], "");
    assert_eq!(out.status.code(), Some(2), "--node-id needs --peers");
}

/// Topic `topic`'s routing key and active partitions as broker `addr`
/// gives them, once its controller replica has the topic.
async fn topology(addr: &str, topic: &str) -> ([u64; 2], Vec<RangeOwner>) {
    let started = Instant::now();
    loop {
        let last = match Connection::connect(addr, None).await {
            Ok(c) => match c
                .call(Request::Topology {
                    topic: topic.into(),
                })
                .await
            {
                Ok(Response::Topology {
                    routing_key,
                    partitions,
                    ..
                }) => return (routing_key, partitions),
                other => format!("{other:?}"),
            },
            Err(e) => e.to_string(),
        };
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "broker {addr} gives the topology of {topic} (last answer: {last})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The partition each of `keys` routes to under `routing`.
fn routes(routing: &([u64; 2], Vec<RangeOwner>), keys: &[String]) -> Vec<u32> {
    keys.iter()
        .map(|k| {
            let h = fissionlog::key_hash(routing.0, k.as_bytes());
            routing
                .1
                .iter()
                .find(|o| o.start <= h && h <= o.end)
                .map(|o| o.partition)
                .expect("the active partitions tile the hash space")
        })
        .collect()
}

/// `InitProducer` through broker `addr`, retried while the controller
/// has no leader (it is being elected).
async fn init_producer(addr: &str, id: Option<u64>) -> (u64, u32) {
    let started = Instant::now();
    loop {
        let last = match Connection::connect(addr, None).await {
            Ok(c) => match c.call(Request::InitProducer { producer_id: id }).await {
                Ok(Response::ProducerInit { producer_id, epoch }) => return (producer_id, epoch),
                other => format!("{other:?}"),
            },
            Err(e) => e.to_string(),
        };
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "broker {addr} hands out a producer id (last answer: {last})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The controller's leader as some broker of `addrs` knows it.
async fn controller_leader(addrs: &[String]) -> u64 {
    use fissionlog_raft::client::{ClientCall, ClientReply, NodeClient};
    use fissionlog_raft::types::GroupId;
    let started = Instant::now();
    loop {
        for a in addrs {
            let Ok(mut nc) = NodeClient::connect(a, Duration::from_secs(2)).await else {
                continue;
            };
            let call = ClientCall::Status {
                group: GroupId::CONTROLLER,
            };
            if let Ok(ClientReply::Status {
                leader: Some(l), ..
            }) = nc.call(call, Duration::from_secs(2)).await
            {
                return l;
            }
        }
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "a broker names the controller's leader"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A topic's routing key is drawn at random when it is created and kept
/// by the controller: every broker of a cluster routes keys the same way,
/// and the same topic (same name, same id) in another cluster routes them
/// differently. A version 2 client, which cannot read `not_leader` or
/// `unsupported`, is refused at the handshake.
#[test]
fn every_broker_routes_with_the_topics_random_key_and_another_cluster_draws_another() {
    let three = start_cluster();
    let one = start_cluster_of(1);
    let addrs: Vec<String> = three.brokers.iter().map(|b| b.addr.clone()).collect();
    let other = one.brokers[0].addr.clone();
    run_within(async move {
        create_topic(&addrs[0], "orders", 3).await;
        create_topic(&other, "orders", 3).await;
        let keys: Vec<String> = (0..200).map(|i| format!("customer-{i}")).collect();
        let here = topology(&addrs[0], "orders").await;
        for a in &addrs[1..] {
            let t = topology(a, "orders").await;
            assert_eq!(t.0, here.0, "broker {a} gives the same routing key");
            assert_eq!(
                routes(&t, &keys),
                routes(&here, &keys),
                "broker {a} routes alike"
            );
        }
        let there = topology(&other, "orders").await;
        assert_eq!(
            there.1.iter().map(|o| (o.start, o.end)).collect::<Vec<_>>(),
            here.1.iter().map(|o| (o.start, o.end)).collect::<Vec<_>>(),
            "both topics have the same ranges"
        );
        assert_ne!(there.0, here.0, "another cluster drew another key");
        let differ = routes(&there, &keys)
            .iter()
            .zip(routes(&here, &keys))
            .filter(|(a, b)| **a != *b)
            .count();
        // Under independent keys each key lands elsewhere with chance
        // 2/3: all 200 alike would be a 3^-200 event.
        assert!(differ > 0, "the other cluster routes some key elsewhere");

        let mut s = tokio::net::TcpStream::connect(&addrs[0])
            .await
            .expect("connect");
        let hello = Request::Hello {
            min_version: 2,
            max_version: 2,
            client: "version 2".into(),
            token: None,
        };
        use tokio::io::AsyncWriteExt;
        s.write_all(&fissionlog_broker::protocol::concat(&hello.encode(1)))
            .await
            .expect("write the hello");
        match common::read_response(&mut s).await {
            Some((
                1,
                Response::Error {
                    code: ErrorCode::UnsupportedVersion,
                    ..
                },
            )) => {}
            other => panic!("a version 2 client is refused by a cluster broker: {other:?}"),
        }
    });
    drop((three, one));
}

/// Producer ids come from the controller: ids handed out by different
/// brokers never repeat and count up, a known id's next epoch fences its
/// older one, and after the controller's leader is killed no id is
/// handed out again and epochs go on from where they were.
#[test]
fn producer_ids_come_from_the_controller_and_survive_its_leaders_kill() {
    let mut cluster = start_cluster();
    let addrs: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let run = std::thread::spawn(move || {
        run_within(async move {
            let topic = "ids";
            create_topic(&addrs[0], topic, 1).await;
            let mut ids = Vec::new();
            for a in addrs.iter().chain(addrs.iter()) {
                let (id, epoch) = init_producer(a, None).await;
                assert_eq!(epoch, 0, "a new id starts at epoch 0");
                ids.push(id);
            }
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "ids from every broker come from one rising sequence: {ids:?}"
            );
            let first = ids[0];
            assert_eq!(init_producer(&addrs[2], Some(first)).await, (first, 1));

            // The new epoch writes; the old one is fenced.
            let leader = leaders(&addrs[0], topic).await[&0];
            let conn = Connection::connect(&addrs[leader as usize - 1], None)
                .await
                .expect("connect to the partition's leader");
            let produce = |epoch: u32| Request::ProduceTo {
                topic: topic.into(),
                partition: 0,
                acks: Acks::Quorum,
                stamp: Some(Stamp {
                    producer_id: first,
                    epoch,
                    first_sequence: 0,
                }),
                records: vec![ProduceRecord {
                    key: None,
                    value: Bytes::from_static(b"v"),
                    timestamp: None,
                }],
            };
            let r = conn.call(produce(1)).await;
            assert!(
                matches!(r, Ok(Response::Produced { .. })),
                "epoch 1 writes: {r:?}"
            );
            let r = conn.call(produce(0)).await;
            assert!(
                matches!(&r, Err(e) if e.code() == Some(ErrorCode::ProducerFenced)),
                "epoch 0 is fenced: {r:?}"
            );

            let victim = controller_leader(&addrs).await;
            tx.send(victim).expect("the killer listens");
            go_rx.await.expect("the controller's leader was killed");
            let survivors: Vec<&String> = addrs
                .iter()
                .enumerate()
                .filter(|(i, _)| *i as u64 + 1 != victim)
                .map(|(_, a)| a)
                .collect();
            let max = ids.iter().copied().max().expect("ids");
            for a in &survivors {
                let (id, epoch) = init_producer(a, None).await;
                assert!(
                    id > max,
                    "id {id} after the leader's kill was never handed out (the last was {max})"
                );
                assert_eq!(epoch, 0);
            }
            assert_eq!(
                init_producer(survivors[0], Some(first)).await,
                (first, 2),
                "the epoch goes on from the one before the kill"
            );
        });
    });
    // A run that failed before naming the leader shows its own panic.
    if let Ok(victim) = rx.recv_timeout(DEADLINE) {
        if let Some(b) = cluster.brokers.iter_mut().find(|b| b.id == victim) {
            b.kill();
        }
    }
    let _ = go_tx.send(());
    if let Err(e) = run.join() {
        std::panic::resume_unwind(e);
    }
}

/// A producer given every broker of the cluster goes on through another
/// when the broker it connected to dies before it connected to any other
/// (that broker led every partition it wrote to).
#[test]
fn a_producer_given_several_brokers_goes_on_through_another_when_its_only_broker_dies() {
    let mut cluster = start_cluster();
    let addrs: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let run = std::thread::spawn(move || {
        run_within(async move {
            let topic = "solo";
            create_topic(&addrs[0], topic, 1).await;
            // Partition 0's first leader is its preferred leader, broker 1.
            assert_eq!(leaders(&addrs[0], topic).await[&0], 1);
            let config = ProducerConfig {
                acks: Acks::Quorum,
                idempotent: true,
                max_in_flight: 4,
                ..ProducerConfig::new(topic)
            };
            let producer = Producer::connect(Endpoint::with_bootstrap(addrs.clone()), config)
                .await
                .expect("the producer connects");
            let mut acked: Acked = Vec::new();
            await_acks(send_range(&producer, 0, 50).await, &mut acked).await;
            tx.send(()).expect("the killer listens");
            go_rx.await.expect("broker 1 was killed");
            await_acks(send_range(&producer, 50, 100).await, &mut acked).await;
            assert_eq!(acked.len(), 100);
            let need = acked.iter().map(|(_, (_, o))| o + 1).max().unwrap_or(0);
            let (recs, _) = read_all(&addrs[1], topic, 0, need).await;
            let mut seen = HashSet::new();
            for r in &recs {
                assert!(seen.insert(parse(&r.value)), "{:?} is read twice", r.value);
            }
            for (rec, (p, o)) in &acked {
                let got = recs
                    .iter()
                    .find(|r| r.offset == *o)
                    .map(|r| parse(&r.value));
                assert_eq!(
                    (*p, got.as_ref()),
                    (0, Some(rec)),
                    "acknowledged {rec:?} is read back at offset {o}"
                );
            }
        });
    });
    if rx.recv_timeout(DEADLINE).is_ok() {
        cluster.brokers[0].kill();
    }
    let _ = go_tx.send(());
    if let Err(e) = run.join() {
        std::panic::resume_unwind(e);
    }
}

/// Fetches with `f` until it holds `n` records (more is a failure of
/// the caller's count), within the wait limit.
async fn fetch_until(f: &mut Fetcher, got: &mut Vec<FetchedRecord>, n: usize) {
    let started = Instant::now();
    while got.len() < n {
        match f.fetch().await {
            Ok(recs) => got.extend(recs),
            Err(e) => panic!("the fetcher reads on at offset {}: {e}", f.offset()),
        }
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "the fetcher reaches {n} records (it has {})",
            got.len()
        );
    }
}

/// Partition 0's replicas and leader as broker `addr` describes them.
async fn placement(addr: &str, topic: &str) -> (Vec<u64>, u64) {
    let leader = leaders(addr, topic).await[&0];
    let c = Connection::connect(addr, None).await.expect("connect");
    let v = Admin::new(c).describe(topic).await.expect("a description");
    let replicas = v["partitions"][0]["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .filter_map(|r| r.as_u64())
        .collect();
    (replicas, leader)
}

/// Partition 0 of `topic` from its start, in long polls of 200 ms.
fn fetch_config_of(topic: &str) -> FetcherConfig {
    FetcherConfig {
        max_wait: Duration::from_millis(200),
        ..FetcherConfig::new(topic, 0)
    }
}

/// In a cluster of four, a fetcher given first the broker that hosts no
/// replica of the partition follows its `not_leader` to the leader; once
/// the leader is SIGKILLed it goes on from its offset through another
/// replica it was given: every acknowledged record once, in order. A
/// fetcher given only the broker without a replica is then sent to a
/// replica that is alive (the broker asks the replicas who leads), and
/// reads the same records.
#[test]
fn a_fetcher_follows_not_leader_and_reads_every_acknowledged_record_once_through_the_leaders_kill()
{
    let mut cluster = start_cluster_of(4);
    let addrs: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let run = std::thread::spawn(move || {
        run_within(async move {
            let topic = "reads";
            create_topic(&addrs[0], topic, 1).await;
            let (replicas, leader) = placement(&addrs[0], topic).await;
            let addr_of = |id: u64| addrs[id as usize - 1].clone();
            let outsider = (1..=4u64)
                .find(|id| !replicas.contains(id))
                .expect("a broker without a replica");
            let other = *replicas
                .iter()
                .find(|&&r| r != leader)
                .expect("a replica that does not lead");
            let config = ProducerConfig {
                acks: Acks::Quorum,
                idempotent: true,
                max_in_flight: 4,
                ..ProducerConfig::new(topic)
            };
            let producer = Producer::connect(Endpoint::with_bootstrap(addrs.clone()), config)
                .await
                .expect("the producer connects");
            let mut acked: Acked = Vec::new();
            await_acks(send_range(&producer, 0, 60).await, &mut acked).await;

            let endpoint = Endpoint::with_bootstrap([addr_of(outsider), addr_of(other)]);
            let mut f = Fetcher::new(endpoint, fetch_config_of(topic));
            let mut got = Vec::new();
            fetch_until(&mut f, &mut got, 60).await;
            assert_eq!(f.offset(), 60);
            assert_eq!(
                f.broker(),
                Some(addr_of(leader).as_str()),
                "the fetcher followed not_leader to broker {leader}"
            );

            tx.send(leader as usize - 1).expect("the killer listens");
            go_rx.await.expect("the leader was killed");
            await_acks(send_range(&producer, 60, 120).await, &mut acked).await;
            fetch_until(&mut f, &mut got, 120).await;
            assert_ne!(f.broker(), Some(addr_of(leader).as_str()));

            assert_eq!(got.len(), 120, "no record is fetched twice");
            for (i, r) in got.iter().enumerate() {
                assert_eq!(r.offset, i as u64, "offsets in order, none skipped");
            }
            for (rec, (p, o)) in &acked {
                let at = got.get(*o as usize).map(|r| parse(&r.value));
                assert_eq!(
                    (*p, at.as_ref()),
                    (0, Some(rec)),
                    "acknowledged {rec:?} is fetched at offset {o}"
                );
            }

            // Given only the broker without a replica, a new fetcher is
            // sent to a replica that answers, not to the dead one.
            let endpoint = Endpoint::with_bootstrap([addr_of(outsider)]);
            let mut alone = Fetcher::new(endpoint, fetch_config_of(topic));
            let mut again = Vec::new();
            fetch_until(&mut alone, &mut again, 120).await;
            assert_ne!(alone.broker(), Some(addr_of(leader).as_str()));
            let values =
                |v: &[FetchedRecord]| v.iter().map(|r| r.value.clone()).collect::<Vec<_>>();
            assert_eq!(values(&again), values(&got), "the same records, once each");
        });
    });
    if let Ok(v) = rx.recv_timeout(DEADLINE) {
        cluster.brokers[v].kill();
    }
    let _ = go_tx.send(());
    if let Err(e) = run.join() {
        std::panic::resume_unwind(e);
    }
}
