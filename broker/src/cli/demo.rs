//! `demo`: the distributed main job on loopback. A broker process, producer
//! processes with a skewed key workload, a consumer group of processes;
//! partitions split under load, one consumer is SIGKILLed mid-run, and a
//! checked summary ends it (docs/BROKER.md defines every field).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fissionlog_broker::client::{
    Admin, Connection, Consumer, ConsumerConfig, Producer, ProducerConfig,
};
use fissionlog_broker::protocol::{Acks, SplitSpec, SyncSpec};
use serde_json::{json, Value};

use super::{CmdResult, Failure};

const TOPIC: &str = "demo";
const GROUP: &str = "demo-group";
/// The hot key: this share of every producer's records.
const HOT_KEY: &str = "k0";
const HOT_SHARE_PERCENT: u64 = 40;

#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// Records per producer.
    #[arg(long, default_value_t = 6000)]
    records: u64,
    /// Producer processes.
    #[arg(long, default_value_t = 2)]
    producers: u32,
    /// Consumer processes in the group.
    #[arg(long, default_value_t = 3)]
    consumers: u32,
    /// Distinct keys.
    #[arg(long, default_value_t = 32)]
    keys: u64,
    /// Records per second per producer.
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// Seed of the key choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub(crate) struct ProducerArgs {
    #[arg(long)]
    server: String,
    #[arg(long)]
    id: u32,
    #[arg(long)]
    records: u64,
    #[arg(long)]
    keys: u64,
    #[arg(long)]
    rate: u64,
    #[arg(long)]
    seed: u64,
}

#[derive(clap::Args)]
pub(crate) struct ConsumerArgs {
    #[arg(long)]
    server: String,
    #[arg(long)]
    id: u32,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// xorshift64*: a small deterministic generator for the key choice.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A producer process: prints `A KEY SEQ PARTITION OFFSET` per
/// acknowledged record, then `D`.
pub(crate) async fn producer(a: ProducerArgs) -> CmdResult {
    let conn = Connection::connect(a.server.as_str(), None).await?;
    let cfg = ProducerConfig {
        acks: Acks::Leader,
        linger: Duration::from_millis(2),
        ..ProducerConfig::new(TOPIC)
    };
    let p = Producer::new(conn, cfg);
    let mut rng = Rng(a.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut seqs: HashMap<String, u64> = HashMap::new();
    let start = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let printer = tokio::spawn(async move {
        let mut out = std::io::BufWriter::new(std::io::stdout());
        let mut failed = 0u64;
        while let Some((key, seq, fut)) = rx.recv().await {
            let fut: fissionlog_broker::client::SendFuture = fut;
            match fut.await {
                Ok(Some((part, off))) => {
                    let _ = writeln!(out, "A {key} {seq} {part} {off}");
                    if rx.is_empty() {
                        let _ = out.flush();
                    }
                }
                Ok(None) => {}
                Err(_) => failed += 1,
            }
        }
        let _ = writeln!(out, "D {failed}");
        let _ = out.flush();
    });
    for i in 0..a.records {
        let key = if rng.next() % 100 < HOT_SHARE_PERCENT {
            HOT_KEY.to_string()
        } else {
            format!("k{}", 1 + rng.next() % a.keys.saturating_sub(1).max(1))
        };
        let seq = seqs.entry(key.clone()).or_insert(0);
        let s = *seq;
        *seq += 1;
        let value = format!("p{} {} {} {}", a.id, key, s, now_us());
        let fut = p
            .send(Some(Bytes::from(key.clone())), Bytes::from(value))
            .await;
        if tx.send((key, s, fut)).await.is_err() {
            break;
        }
        // Pace: i records by now at `rate` a second.
        let due = Duration::from_micros(i * 1_000_000 / a.rate.max(1));
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    drop(tx);
    let _ = printer.await;
    Ok(())
}

/// A consumer process: prints `J MEMBER` once joined, then
/// `R VALUE... RECV_US PARTITION OFFSET` per record, commits after each
/// poll, and leaves when its stdin closes.
pub(crate) async fn consumer(a: ConsumerArgs) -> CmdResult {
    let conn = Connection::connect(a.server.as_str(), None).await?;
    let cfg = ConsumerConfig {
        session_timeout: Duration::from_millis(1500),
        processing_timeout: Duration::from_secs(10),
        heartbeat_interval: Duration::from_millis(250),
        instance_id: None,
        ..ConsumerConfig::new(TOPIC, GROUP)
    };
    let mut c = Consumer::join(conn, cfg).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        s2.store(true, Ordering::Relaxed);
    });
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "J {}", c.member_id());
        let _ = out.flush();
    }
    while !stop.load(Ordering::Relaxed) {
        let recs = c.poll(500, Duration::from_millis(100)).await?;
        if recs.is_empty() {
            continue;
        }
        let recv = now_us();
        let mut out = std::io::stdout().lock();
        for r in &recs {
            let v = String::from_utf8_lossy(&r.value);
            let _ = writeln!(out, "R {v} {recv} {} {}", r.partition, r.offset);
        }
        let _ = out.flush();
        drop(out);
        c.commit().await?;
    }
    let _ = c.commit().await;
    c.leave().await?;
    let _ = writeln!(std::io::stdout(), "L");
    Ok(())
}

/// Children killed and reaped however the demo ends.
#[derive(Default)]
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

enum Line {
    Broker(String),
    Producer(u32, String),
    Consumer(u32, String),
    Closed,
}

fn pipe_lines(
    child: &mut Child,
    tx: mpsc::Sender<Line>,
    wrap: impl Fn(String) -> Line + Send + 'static,
) {
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(l) = line else { break };
                if tx.send(wrap(l)).is_err() {
                    break;
                }
            }
            let _ = tx.send(Line::Closed);
        });
    }
}

fn spawn(args: &[String]) -> Result<Child, Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::usage(format!("cannot find this program: {e}")))?;
    Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Failure::usage(format!("cannot start a child process: {e}")))
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// What the parent saw, record by record.
#[derive(Default)]
struct Tally {
    acked: HashSet<(u32, String, u64)>,
    /// Per record: the consumers that delivered it, in order.
    deliveries: HashMap<(u32, String, u64), Vec<u32>>,
    /// Per consumer and key stream, the highest sequence delivered.
    last_seq: HashMap<(u32, u32, String), u64>,
    order_violations: u64,
    latencies_ms: Vec<f64>,
    failed_acks: u64,
}

impl Tally {
    fn delivered(&mut self, consumer: u32, line: &str) {
        // R p{P} KEY SEQ SEND_US RECV_US PARTITION OFFSET
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() != 8 {
            return; // a line cut by the kill
        }
        let (Some(p), Ok(seq), Ok(sent), Ok(recv)) = (
            f[1].strip_prefix('p').and_then(|p| p.parse::<u32>().ok()),
            f[3].parse::<u64>(),
            f[4].parse::<u64>(),
            f[5].parse::<u64>(),
        ) else {
            return;
        };
        let key = f[2].to_string();
        let id = (p, key.clone(), seq);
        let seen_before = self.deliveries.contains_key(&id);
        let stream = (consumer, p, key);
        if let Some(&last) = self.last_seq.get(&stream) {
            if seq < last && !seen_before {
                self.order_violations += 1;
            }
        }
        let e = self.last_seq.entry(stream).or_insert(seq);
        *e = (*e).max(seq);
        if !seen_before {
            self.latencies_ms
                .push(recv.saturating_sub(sent) as f64 / 1000.0);
        }
        self.deliveries.entry(id).or_default().push(consumer);
    }
}

struct Plan {
    split_hot_at: usize,
    kill_at: usize,
    split_even_at: usize,
}

pub(crate) async fn run(a: DemoArgs) -> CmdResult {
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("fissionlog-broker-demo")
        .tempdir()
        .map_err(|e| Failure::usage(format!("cannot create a temporary directory: {e}")))?;
    let mut kids = Children::default();
    let (tx, rx) = mpsc::channel::<Line>();

    let mut broker = spawn(&[
        "serve".into(),
        "--dir".into(),
        dir.path().display().to_string(),
        "--listen".into(),
        "127.0.0.1:0".into(),
    ])?;
    pipe_lines(&mut broker, tx.clone(), Line::Broker);
    let broker_pid = broker.id();
    kids.0.push(broker);
    let addr = loop {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Line::Broker(l)) => {
                if let Some(a) = l.strip_prefix("listening on ") {
                    break a.to_string();
                }
            }
            Ok(Line::Closed) | Err(_) => return Err(Failure::refused("the broker did not start")),
            Ok(_) => {}
        }
    };
    let admin = Admin::new(Connection::connect(addr.as_str(), None).await?);
    admin
        .create_topic(TOPIC, 2, SyncSpec::Never, 0, false)
        .await?;

    let mut consumers = Vec::new();
    for i in 0..a.consumers {
        let mut c = spawn(&[
            "demo-consumer".into(),
            "--server".into(),
            addr.clone(),
            "--id".into(),
            i.to_string(),
        ])?;
        pipe_lines(&mut c, tx.clone(), move |l| Line::Consumer(i, l));
        consumers.push(kids.0.len());
        kids.0.push(c);
    }
    let mut joined = 0;
    while joined < a.consumers {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Line::Consumer(_, l)) if l.starts_with('J') => joined += 1,
            Ok(_) => {}
            Err(_) => return Err(Failure::refused("the consumers did not join")),
        }
    }
    for i in 0..a.producers {
        let mut p = spawn(&[
            "demo-producer".into(),
            "--server".into(),
            addr.clone(),
            "--id".into(),
            i.to_string(),
            "--records".into(),
            a.records.to_string(),
            "--keys".into(),
            a.keys.to_string(),
            "--rate".into(),
            a.rate.to_string(),
            "--seed".into(),
            (a.seed + u64::from(i)).to_string(),
        ])?;
        pipe_lines(&mut p, tx.clone(), move |l| Line::Producer(i, l));
        kids.0.push(p);
    }
    drop(tx);

    let total = (a.records * u64::from(a.producers)) as usize;
    let plan = Plan {
        split_hot_at: total * 3 / 10,
        kill_at: total / 2,
        split_even_at: total * 6 / 10,
    };
    let mut t = Tally::default();
    let mut producers_done = 0;
    let mut splits = 0u64;
    let (mut did_hot, mut did_kill, mut did_even) = (false, false, false);
    let killed = 0u32;
    let mut done_at: Option<Instant> = None;
    let hard_deadline = Instant::now() + Duration::from_secs(40);
    loop {
        if Instant::now() > hard_deadline {
            break;
        }
        if let Some(d) = done_at {
            let consumed_all = t.acked.iter().all(|r| t.deliveries.contains_key(r));
            if consumed_all || d.elapsed() > Duration::from_secs(10) {
                break;
            }
        }
        let line = match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(l) => l,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        match line {
            Line::Producer(p, l) => {
                let f: Vec<&str> = l.split(' ').collect();
                if f.first() == Some(&"A") && f.len() == 5 {
                    if let Ok(seq) = f[2].parse() {
                        t.acked.insert((p, f[1].to_string(), seq));
                    }
                } else if f.first() == Some(&"D") {
                    t.failed_acks += f.get(1).and_then(|n| n.parse().ok()).unwrap_or(0);
                    producers_done += 1;
                    if producers_done == a.producers {
                        done_at = Some(Instant::now());
                    }
                }
            }
            Line::Consumer(c, l) if l.starts_with("R ") => t.delivered(c, &l),
            _ => {}
        }
        let n = t.acked.len();
        if !did_hot && n >= plan.split_hot_at {
            did_hot = true;
            splits += split_partition(&admin, true).await;
        }
        if !did_kill && n >= plan.kill_at {
            did_kill = true;
            if let Some(c) = kids.0.get_mut(consumers[killed as usize]) {
                let _ = c.kill(); // SIGKILL
                let _ = c.wait();
            }
        }
        if !did_even && n >= plan.split_even_at {
            did_even = true;
            splits += split_partition(&admin, false).await;
        }
    }
    let groups = admin.groups(Some(TOPIC)).await.unwrap_or(Value::Null);
    let describe = admin.describe(TOPIC).await.unwrap_or(Value::Null);
    // Stop the consumers (stdin closes), then the broker (SIGTERM).
    for (i, &k) in consumers.iter().enumerate() {
        if i as u32 != killed {
            if let Some(c) = kids.0.get_mut(k) {
                drop(c.stdin.take());
            }
        }
    }
    let until = Instant::now() + Duration::from_secs(5);
    for &k in &consumers {
        if let Some(c) = kids.0.get_mut(k) {
            while Instant::now() < until && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // SAFETY: kill(2) on the pid of our own child process, which has not
    // been reaped yet (it is in `kids`), so the pid names that process.
    unsafe {
        libc::kill(broker_pid as libc::pid_t, libc::SIGTERM);
    }
    let broker_clean = match kids.0.first_mut() {
        Some(b) => {
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                match b.try_wait() {
                    Ok(Some(s)) => break s.success(),
                    Ok(None) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => break false,
                }
            }
        }
        None => false,
    };
    drop(kids);

    let summary = summarize(
        &a,
        &t,
        &groups,
        &describe,
        splits,
        killed,
        broker_clean,
        started.elapsed(),
    );
    let ok = summary["ok"].as_bool() == Some(true);
    if a.json {
        println!("{summary}");
    } else {
        print_text(&summary);
    }
    drop(dir);
    if ok {
        Ok(())
    } else {
        Err(Failure::refused("the check failed: records missing, out of order or duplicated beyond the kill's redelivery"))
    }
}

/// Splits the active partition holding the hot key (isolating it), or the
/// widest other active partition in the middle. Returns 1 if it split.
async fn split_partition(admin: &Admin, hot: bool) -> u64 {
    let Ok(d) = admin.describe(TOPIC).await else {
        return 0;
    };
    let active: Vec<&Value> = d["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["state"] == "active")
        .collect();
    let target = if hot {
        // The producers' first records went everywhere; the partition with
        // the most records holds the hot key.
        active
            .iter()
            .max_by_key(|p| p["end_offset"].as_u64().unwrap_or(0))
    } else {
        active.iter().max_by_key(|p| {
            p["end"]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(p["start"].as_u64().unwrap_or(0))
        })
    };
    let Some(p) = target.and_then(|p| p["id"].as_u64()) else {
        return 0;
    };
    let plan = if hot {
        SplitSpec::HotKey(Bytes::from_static(HOT_KEY.as_bytes()))
    } else {
        SplitSpec::Even
    };
    match admin.split(TOPIC, p as u32, plan).await {
        Ok(_) => 1,
        Err(_) if hot => match admin.split(TOPIC, p as u32, SplitSpec::Even).await {
            Ok(_) => 1,
            Err(_) => 0,
        },
        Err(_) => 0,
    }
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    a: &DemoArgs,
    t: &Tally,
    groups: &Value,
    describe: &Value,
    splits: u64,
    killed: u32,
    broker_clean: bool,
    elapsed: Duration,
) -> Value {
    let missing = t
        .acked
        .iter()
        .filter(|r| !t.deliveries.contains_key(*r))
        .count() as u64;
    let mut raw_dups = 0u64;
    let mut unexplained = 0u64;
    for who in t.deliveries.values() {
        raw_dups += who.len() as u64 - 1;
        let by_killed = who.iter().filter(|&&c| c == killed).count() as u64;
        let by_live = who.len() as u64 - by_killed;
        unexplained += by_killed.saturating_sub(1) + by_live.saturating_sub(1);
    }
    let mut lat = t.latencies_ms.clone();
    lat.sort_by(f64::total_cmp);
    let g = groups["groups"].get(0).cloned().unwrap_or(Value::Null);
    let mut pauses: Vec<f64> = g["stats"]["pauses_ms"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_f64)
        .collect();
    pauses.sort_by(f64::total_cmp);
    let active = describe["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["state"] == "active")
        .count();
    let mut per_partition: BTreeMap<u64, u64> = BTreeMap::new();
    for p in describe["partitions"].as_array().into_iter().flatten() {
        per_partition.insert(
            p["id"].as_u64().unwrap_or(0),
            p["end_offset"].as_u64().unwrap_or(0),
        );
    }
    let ok = missing == 0 && t.order_violations == 0 && unexplained == 0 && !t.acked.is_empty();
    json!({
        "ok": ok,
        "produced": a.records * u64::from(a.producers),
        "acknowledged": t.acked.len(),
        "failed_acks": t.failed_acks,
        "consumed": t.deliveries.len(),
        "deliveries": t.deliveries.values().map(Vec::len).sum::<usize>(),
        "missing_records": missing,
        "duplicate_records": raw_dups,
        "unexplained_duplicates": unexplained,
        "order_violations": t.order_violations,
        "killed_consumer": killed,
        "rebalances": g["stats"]["rebalances"],
        "redelivered": g["stats"]["redelivered"],
        "rebalance_pauses": pauses.len(),
        "rebalance_pause_ms_p50": percentile(&pauses, 0.5),
        "rebalance_pause_ms_max": pauses.last().copied().unwrap_or(0.0),
        "e2e_latency_ms_p50": percentile(&lat, 0.5),
        "e2e_latency_ms_p99": percentile(&lat, 0.99),
        "splits": splits,
        "active_partitions": active,
        "records_per_partition": per_partition,
        "broker_clean_shutdown": broker_clean,
        "seconds": (elapsed.as_secs_f64() * 10.0).round() / 10.0,
    })
}

fn print_text(s: &Value) {
    println!(
        "produced {} records ({} acknowledged), consumed {} ({} deliveries) through {} splits, consumer {} killed",
        s["produced"], s["acknowledged"], s["consumed"], s["deliveries"], s["splits"], s["killed_consumer"]
    );
    println!(
        "rebalances {}, pauses {} (p50 {} ms, max {} ms); e2e latency p50 {} ms, p99 {} ms",
        s["rebalances"],
        s["rebalance_pauses"],
        s["rebalance_pause_ms_p50"],
        s["rebalance_pause_ms_max"],
        s["e2e_latency_ms_p50"],
        s["e2e_latency_ms_p99"]
    );
    println!(
        "check: {} missing_records={} duplicate_records={} unexplained_duplicates={} order_violations={} ({} s)",
        if s["ok"] == true { "ok" } else { "FAILED" },
        s["missing_records"], s["duplicate_records"], s["unexplained_duplicates"], s["order_violations"], s["seconds"]
    );
}
