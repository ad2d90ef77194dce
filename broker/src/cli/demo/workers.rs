//! The demo's worker processes: a producer and a group consumer, each a
//! child process of the demo printing one line per record.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fissionlog_broker::client::{Connection, Consumer, ConsumerConfig, Producer, ProducerConfig};
use fissionlog_broker::protocol::Acks;

use super::{GROUP, HOT_KEY, HOT_SHARE_PERCENT, TOPIC};
use crate::cli::CmdResult;

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

pub(super) fn now_us() -> u64 {
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
