//! The client commands: `produce`, `consume`, `fetch`, `describe`, `groups`,
//! `split`.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fissionlog_broker::client::{
    Admin, ClientError, Connection, Consumer, ConsumerConfig, Endpoint, Fetcher, FetcherConfig,
    Producer, ProducerConfig,
};
use fissionlog_broker::protocol::{Acks, ErrorCode, SplitSpec, SyncSpec, TailFromSpec};
use serde_json::{json, Value};

use super::{CmdResult, Failure};

#[derive(clap::Args)]
pub(crate) struct Server {
    /// Broker address; give it several times for a cluster: each command
    /// tries them in order until one answers.
    #[arg(long = "server", default_value = "127.0.0.1:9092")]
    servers: Vec<String>,
    /// Connect over TLS, trusting the CA certificates of this PEM file.
    #[arg(long)]
    tls_ca: Option<std::path::PathBuf>,
    /// The name the server's certificate must carry (default: the host
    /// part of the first `--server`).
    #[arg(long, requires = "tls_ca")]
    tls_server_name: Option<String>,
}

impl Server {
    /// `host` of the first `host:port` (brackets of an IPv6 address removed).
    fn host(&self) -> &str {
        let first = self.servers.first().map_or("", String::as_str);
        let h = first.rsplit_once(':').map_or(first, |(h, _)| h);
        h.trim_start_matches('[').trim_end_matches(']')
    }
}

/// The credential the client commands send: `FISSIONLOG_BROKER_TOKEN`
/// (an environment variable, not a flag, so it doesn't show in `ps`).
pub(crate) fn token() -> Option<Bytes> {
    std::env::var("FISSIONLOG_BROKER_TOKEN")
        .ok()
        .map(Bytes::from)
}

/// The brokers as an [`Endpoint`]: the first `--server`, the others as
/// bootstrap brokers, TLS and the token included, so a producer connects
/// again (and to other brokers) the same way.
fn endpoint(s: &Server) -> Result<Endpoint, Failure> {
    let mut ep = Endpoint::with_bootstrap(s.servers.iter().cloned());
    if let Some(ca) = &s.tls_ca {
        let name = s.tls_server_name.as_deref().unwrap_or_else(|| s.host());
        let tls = fissionlog_broker::tls::ClientTls::from_ca_file(ca, name)
            .map_err(|e| Failure::usage(e.to_string()))?;
        ep = ep.with_tls(tls);
    }
    if let Some(t) = token() {
        ep = ep.with_token(t);
    }
    Ok(ep)
}

/// A connection to the first `--server` that answers (the endpoint's
/// order); a refusal (a bad token) is not tried elsewhere.
async fn connect(s: &Server) -> Result<Connection, Failure> {
    let tried = s.servers.join(", ");
    endpoint(s)?.connect().await.map_err(|e| match e {
        ClientError::Server { .. } => {
            Failure::refused(format!("the broker at {tried} refused: {e}"))
        }
        e => Failure::usage(format!("cannot reach the broker at {tried}: {e}")),
    })
}

#[derive(clap::Args)]
pub(crate) struct ProduceArgs {
    #[command(flatten)]
    server: Server,
    /// Topic.
    #[arg(long)]
    topic: String,
    /// Create the topic when missing.
    #[arg(long)]
    create: bool,
    /// Partitions of a topic created by --create.
    #[arg(long, default_value_t = 1, requires = "create")]
    partitions: u32,
    /// What an acknowledgement waits for: none, leader (appended) or
    /// quorum (on a single node: fsynced).
    #[arg(long, default_value = "leader")]
    ack_level: String,
    /// Print one JSON line per acknowledged record, in input order.
    #[arg(long)]
    acks: bool,
    /// Route each record to its partition and stamp every batch, so a
    /// retry is never appended twice; it follows a cluster's `not_leader`
    /// answers to each partition's leader. A broker in cluster mode takes
    /// only these produces, with `--ack-level quorum`.
    #[arg(long)]
    idempotent: bool,
}

fn split_line(line: &[u8]) -> (Option<&[u8]>, &[u8]) {
    match line.iter().position(|&b| b == b'\t') {
        Some(i) => (Some(&line[..i]), &line[i + 1..]),
        None => (None, line),
    }
}

pub(crate) async fn produce(a: ProduceArgs) -> CmdResult {
    let acks = match a.ack_level.as_str() {
        "none" => Acks::None,
        "leader" => Acks::Leader,
        "quorum" => Acks::Quorum,
        other => {
            return Err(Failure::usage(format!(
                "--ack-level must be none, leader or quorum, not {other:?}"
            )))
        }
    };
    let conn = connect(&a.server).await?;
    if a.create {
        match Admin::new(conn.clone())
            .create_topic(&a.topic, a.partitions, SyncSpec::Never, 0, false)
            .await
        {
            Ok(_) => {}
            Err(e) if e.code() == Some(ErrorCode::TopicExists) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let config = ProducerConfig {
        acks,
        idempotent: a.idempotent,
        ..ProducerConfig::new(&a.topic)
    };
    let producer = if a.idempotent {
        drop(conn);
        Producer::connect(endpoint(&a.server)?, config).await?
    } else {
        Producer::new(conn, config)
    };
    // Lines are read on a thread (stdin blocks) and sent in order.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(1024);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut lock = stdin.lock();
        loop {
            let mut line = Vec::new();
            match lock.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if line.last() == Some(&b'\n') {
                        line.pop();
                        if line.last() == Some(&b'\r') {
                            line.pop();
                        }
                    }
                    if tx.blocking_send(line).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut waiting = std::collections::VecDeque::new();
    let mut count = 0u64;
    let mut out = std::io::stdout().lock();
    let mut failure = None;
    while let Some(line) = rx.recv().await {
        let (key, value) = split_line(&line);
        let key_b = key.map(Bytes::copy_from_slice);
        let fut = producer
            .send(key_b.clone(), Bytes::copy_from_slice(value))
            .await;
        waiting.push_back((key_b, fut));
        // Print what is acknowledged, in order, without holding everything.
        while waiting.len() > 4096 {
            if let Some((k, f)) = waiting.pop_front() {
                if let Err(e) = ack_line(&mut out, a.acks, k, f.await) {
                    failure = Some(e);
                    break;
                }
                count += 1;
            }
        }
        if failure.is_some() {
            break;
        }
    }
    while failure.is_none() {
        let Some((k, f)) = waiting.pop_front() else {
            break;
        };
        match ack_line(&mut out, a.acks, k, f.await) {
            Ok(()) => count += 1,
            Err(e) => failure = Some(e),
        }
    }
    let _ = out.flush();
    if let Some(f) = failure {
        return Err(f);
    }
    if !a.acks {
        eprintln!("appended {count} records to topic {:?}", a.topic);
    }
    Ok(())
}

fn ack_line(
    out: &mut impl Write,
    print: bool,
    key: Option<Bytes>,
    r: Result<Option<(u32, u64)>, ClientError>,
) -> Result<(), Failure> {
    let at = r?;
    if print {
        let mut v = serde_json::Map::new();
        put_bytes(&mut v, "key", key.as_deref());
        if let Some((p, o)) = at {
            v.insert("offset".into(), json!(o));
            v.insert("partition".into(), json!(p));
        }
        let _ = writeln!(out, "{}", Value::Object(v));
    }
    Ok(())
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub(crate) fn base64(data: &[u8]) -> String {
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= c.len() {
                s.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// `name` as UTF-8 text, or `name_base64`; `null` when absent.
fn put_bytes(v: &mut serde_json::Map<String, Value>, name: &str, b: Option<&[u8]>) {
    match b {
        None => {
            v.insert(name.into(), Value::Null);
        }
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => {
                v.insert(name.into(), json!(s));
            }
            Err(_) => {
                v.insert(format!("{name}_base64"), json!(base64(b)));
            }
        },
    }
}

fn escape(b: &[u8]) -> String {
    let mut s = String::new();
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\t' => s.push_str("\\t"),
                '\n' => s.push_str("\\n"),
                '\r' => s.push_str("\\r"),
                '\\' => s.push_str("\\\\"),
                c if c.is_control() => s.push_str(&format!("\\x{:02x}", c as u32)),
                c => s.push(c),
            }
        }
        for &x in chunk.invalid() {
            s.push_str(&format!("\\x{x:02x}"));
        }
    }
    s
}

#[derive(clap::Args)]
pub(crate) struct ConsumeArgs {
    #[command(flatten)]
    server: Server,
    /// Topic.
    #[arg(long)]
    topic: String,
    /// Consumer group to join.
    #[arg(long, default_value = "fissionlog-broker-cli")]
    group: String,
    /// Stop after this many records.
    #[arg(long)]
    max_records: Option<u64>,
    /// Stop once no record came for this many milliseconds.
    #[arg(long, default_value_t = 1000)]
    idle_ms: u64,
    /// The member's session timeout: no heartbeat for this long and its
    /// partitions move to the others.
    #[arg(long, default_value_t = 10_000)]
    session_timeout_ms: u64,
    /// One JSON object per record.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn consume(a: ConsumeArgs) -> CmdResult {
    let conn = connect(&a.server).await?;
    let session = Duration::from_millis(a.session_timeout_ms.max(1));
    let cfg = ConsumerConfig {
        session_timeout: session,
        heartbeat_interval: (session / 4).max(Duration::from_millis(10)),
        ..ConsumerConfig::new(&a.topic, &a.group)
    };
    let mut c = Consumer::join(conn, cfg).await?;
    let mut out = std::io::stdout().lock();
    let mut seen = 0u64;
    let mut last = Instant::now();
    let limit = a.max_records.unwrap_or(u64::MAX);
    while seen < limit && last.elapsed() < Duration::from_millis(a.idle_ms) {
        let want = (limit - seen).min(1000) as u32;
        let recs = c.poll(want, Duration::from_millis(100)).await?;
        if recs.is_empty() {
            continue;
        }
        last = Instant::now();
        for r in &recs {
            let line = record_line(
                a.json,
                r.partition,
                r.offset,
                r.timestamp,
                r.key.as_deref(),
                &r.value,
            );
            if writeln!(out, "{line}").is_err() {
                return Ok(()); // a closed pipe ends quietly
            }
        }
        seen += recs.len() as u64;
        let _ = out.flush();
        c.commit().await?;
    }
    c.leave().await?;
    Ok(())
}

/// One record as `consume` and `fetch` print it: a JSON object, or
/// `partition TAB offset TAB key TAB value` with tabs, newlines and
/// control bytes escaped.
fn record_line(
    json: bool,
    partition: u32,
    offset: u64,
    timestamp: i64,
    key: Option<&[u8]>,
    value: &[u8],
) -> String {
    if json {
        let mut v = serde_json::Map::new();
        v.insert("partition".into(), json!(partition));
        v.insert("offset".into(), json!(offset));
        v.insert("timestamp".into(), json!(timestamp));
        put_bytes(&mut v, "key", key);
        put_bytes(&mut v, "value", Some(value));
        Value::Object(v).to_string()
    } else {
        format!(
            "{partition}\t{offset}\t{}\t{}",
            key.map_or(String::new(), escape),
            escape(value)
        )
    }
}

#[derive(clap::Args)]
pub(crate) struct FetchArgs {
    #[command(flatten)]
    server: Server,
    /// Topic.
    #[arg(long)]
    topic: String,
    /// Partition.
    #[arg(long)]
    partition: u32,
    /// The first offset to read.
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Stop after this many records.
    #[arg(long)]
    max_records: Option<u64>,
    /// Stop once no record came for this many milliseconds.
    #[arg(long, default_value_t = 1000)]
    idle_ms: u64,
    /// One JSON object per record.
    #[arg(long)]
    json: bool,
}

/// Reads a partition through a [`Fetcher`], which sends each fetch to
/// the partition's leader and goes on through another `--server` when
/// one is down; no group, no commit.
pub(crate) async fn fetch(a: FetchArgs) -> CmdResult {
    let idle = Duration::from_millis(a.idle_ms);
    let config = FetcherConfig {
        offset: a.offset,
        // The long poll ends in time to notice the idle limit.
        max_wait: idle.clamp(Duration::from_millis(1), Duration::from_millis(500)),
        ..FetcherConfig::new(&a.topic, a.partition)
    };
    let mut f = Fetcher::new(endpoint(&a.server)?, config);
    let mut out = std::io::stdout().lock();
    let mut seen = 0u64;
    let mut last = Instant::now();
    let limit = a.max_records.unwrap_or(u64::MAX);
    while seen < limit && last.elapsed() < idle {
        let recs = f.fetch().await?;
        if recs.is_empty() {
            continue;
        }
        last = Instant::now();
        for r in recs
            .iter()
            .take((limit - seen).min(usize::MAX as u64) as usize)
        {
            let line = record_line(
                a.json,
                a.partition,
                r.offset,
                r.timestamp,
                r.key.as_deref(),
                &r.value,
            );
            if writeln!(out, "{line}").is_err() {
                return Ok(()); // a closed pipe ends quietly
            }
            seen += 1;
        }
        let _ = out.flush();
    }
    Ok(())
}

#[derive(clap::Args)]
pub(crate) struct DescribeArgs {
    #[command(flatten)]
    server: Server,
    /// Topic (all topics' names when absent).
    #[arg(long)]
    topic: Option<String>,
    /// One JSON document.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn describe(a: DescribeArgs) -> CmdResult {
    let admin = Admin::new(connect(&a.server).await?);
    let Some(topic) = a.topic else {
        let v = admin.list_topics().await?;
        if a.json {
            println!("{v}");
        } else if let Some(ts) = v["topics"].as_array() {
            for t in ts {
                println!("{}", t.as_str().unwrap_or_default());
            }
        }
        return Ok(());
    };
    let v = admin.describe(&topic).await?;
    if a.json {
        println!("{v}");
        return Ok(());
    }
    println!(
        "topic {:?} (topology generation {})",
        topic, v["generation"]
    );
    for p in v["partitions"].as_array().into_iter().flatten() {
        println!(
            "  p{} {} [{}..={}] offsets {}..{} parents {} children {}{}{}",
            p["id"],
            p["state"].as_str().unwrap_or("?"),
            p["key_start"].as_str().unwrap_or("?"),
            p["key_end"].as_str().unwrap_or("?"),
            p["start_offset"],
            p["end_offset"],
            p["parents"],
            p["children"],
            if p["hot_key"].as_bool() == Some(true) {
                " hot key"
            } else {
                ""
            },
            // Cluster mode: where the partition's replicas are.
            if p["replicas"].is_array() {
                format!(" replicas {} leader {}", p["replicas"], p["leader"])
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

#[derive(clap::Args)]
pub(crate) struct GroupsArgs {
    #[command(flatten)]
    server: Server,
    /// Only this topic's groups.
    #[arg(long)]
    topic: Option<String>,
    /// One JSON document.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn groups(a: GroupsArgs) -> CmdResult {
    let admin = Admin::new(connect(&a.server).await?);
    let v = admin.groups(a.topic.as_deref()).await?;
    if a.json {
        println!("{v}");
        return Ok(());
    }
    for g in v["groups"].as_array().into_iter().flatten() {
        println!(
            "group {} of topic {}: generation {}, lag {} records, {} members",
            g["group"],
            g["topic"],
            g["generation"],
            g["lag_records"],
            g["members"].as_array().map_or(0, Vec::len)
        );
        for p in g["partitions"].as_array().into_iter().flatten() {
            println!(
                "  p{} committed {} lag {} member {}",
                p["partition"], p["committed"], p["lag_records"], p["member"]
            );
        }
    }
    Ok(())
}

#[derive(clap::Args)]
pub(crate) struct SplitArgs {
    #[command(flatten)]
    server: Server,
    /// Topic.
    #[arg(long)]
    topic: String,
    /// Partition to split.
    #[arg(long)]
    partition: u32,
    /// Children [start, HASH] and [HASH+1, end] (decimal or 0x hex).
    #[arg(long, conflicts_with_all = ["even", "hot_key"])]
    at: Option<String>,
    /// In the middle of the range.
    #[arg(long, conflicts_with = "hot_key")]
    even: bool,
    /// Isolate this key's hash in a one-value partition.
    #[arg(long)]
    hot_key: Option<String>,
    /// Move the tail from this offset (or `slowest-group`) into the children.
    #[arg(long)]
    tail_from: Option<String>,
    /// One JSON document.
    #[arg(long)]
    json: bool,
}

fn parse_hash(s: &str) -> Result<u64, Failure> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| {
        Failure::usage(format!(
            "--at takes a 64-bit hash (decimal or 0x hex), not {s:?}"
        ))
    })
}

pub(crate) async fn split(a: SplitArgs) -> CmdResult {
    let plan = if let Some(h) = &a.at {
        SplitSpec::At(parse_hash(h)?)
    } else if a.even {
        SplitSpec::Even
    } else if let Some(k) = &a.hot_key {
        SplitSpec::HotKey(Bytes::copy_from_slice(k.as_bytes()))
    } else {
        SplitSpec::LoadMedian
    };
    let from = match a.tail_from.as_deref() {
        None => None,
        Some("slowest-group") => Some(TailFromSpec::SlowestGroup),
        Some(o) => Some(TailFromSpec::Offset(o.parse().map_err(|_| {
            Failure::usage(format!(
                "--tail-from takes an offset or slowest-group, not {o:?}"
            ))
        })?)),
    };
    let admin = Admin::new(connect(&a.server).await?);
    let v = match from {
        None => admin.split(&a.topic, a.partition, plan).await?,
        Some(f) => admin.split_tail(&a.topic, a.partition, plan, f).await?,
    };
    if a.json {
        println!("{v}");
        return Ok(());
    }
    let kids: Vec<String> = v["children"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "p{} [{}..={}]",
                c["id"],
                c["key_start"].as_str().unwrap_or("?"),
                c["key_end"].as_str().unwrap_or("?")
            )
        })
        .collect();
    println!(
        "split partition {} of topic {:?} into {}",
        a.partition,
        a.topic,
        kids.join(", ")
    );
    if let Some(m) = v.get("moved") {
        println!(
            "moved offsets {}..{} of the parent into the children ({} records each)",
            m["from"], m["to"], m["records"]
        );
    }
    Ok(())
}
