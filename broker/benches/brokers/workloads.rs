//! The client workloads, the same for every system.
//!
//! - P1: one producer, one acknowledged record at a time;
//! - P16: 16 producers, each on its own connection, each waiting for its
//!   own acknowledgement;
//! - PB: one connection with up to 256 records unacknowledged;
//! - C1, C4: a group of 1 or 4 members, each on its own connection,
//!   consumes the stored records in batches of up to 500, acknowledging
//!   (committing) each batch; the latency is that of one batch, poll to
//!   acknowledgement.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;

use crate::stats::{Figure, Samples};
use crate::systems::{Sender, Shape, Target};
use crate::{KEY_BYTES, R, RECORD_BYTES};

/// Records a PB connection has unacknowledged at most.
pub const WINDOW: usize = 256;
/// Distinct keys the records cycle through.
const KEYS: usize = 1024;
/// Longest a consume workload may take before it counts as failed.
const CONSUME_LIMIT: Duration = Duration::from_secs(300);

/// The keys (16 bytes each) and the value (1 KiB) every system gets.
pub struct Records {
    keys: Vec<Bytes>,
    value: Bytes,
}

impl Records {
    pub fn new() -> Records {
        let keys = (0..KEYS)
            .map(|i| {
                let k = format!("key-{i:012}");
                debug_assert_eq!(k.len(), KEY_BYTES);
                Bytes::from(k)
            })
            .collect();
        let value = (0..RECORD_BYTES).map(|i| (i % 251) as u8).collect();
        Records { keys, value }
    }

    fn key(&self, n: usize) -> Bytes {
        self.keys[n % self.keys.len()].clone()
    }
}

/// When a pipelined producer stops sending.
#[derive(Clone, Copy)]
enum Stop {
    At(Instant),
    After(u64),
}

/// P1 (`producers` 1) and P16: each producer sends its next record once
/// the last one was acknowledged, for `secs`.
pub async fn serial(
    target: &Target,
    recs: &Arc<Records>,
    producers: usize,
    secs: Duration,
) -> R<Figure> {
    let mut senders = Vec::with_capacity(producers);
    for _ in 0..producers {
        senders.push(target.sender(Shape::One, false).await?);
    }
    let t0 = Instant::now();
    let deadline = t0 + secs;
    let tasks: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(p, sender)| {
            let recs = recs.clone();
            tokio::spawn(async move {
                let mut s = Samples::default();
                let mut n = p * 7;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    sender.start(recs.key(n), recs.value.clone()).await?.await?;
                    s.record(t, 1);
                    n += 1;
                }
                R::Ok(s)
            })
        })
        .collect();
    let mut all = Samples::default();
    for t in tasks {
        all.merge(t.await??);
    }
    Ok(all.figure(t0.elapsed()))
}

/// PB: one connection keeps up to `window` records unacknowledged, for `secs`.
pub async fn pipelined(target: &Target, recs: &Records, shape: Shape, secs: Duration) -> R<Figure> {
    let sender = target.sender(shape, false).await?;
    let t0 = Instant::now();
    let s = window(&sender, recs, WINDOW, Stop::At(t0 + secs)).await?;
    Ok(s.figure(t0.elapsed()))
}

/// Stores `messages` records in the consume topic.
pub async fn preload(target: &Target, recs: &Records, shape: Shape, messages: u64) -> R<()> {
    let sender = target.sender(shape, true).await?;
    window(&sender, recs, 4 * WINDOW, Stop::After(messages)).await?;
    Ok(())
}

async fn window(sender: &Sender, recs: &Records, window: usize, stop: Stop) -> R<Samples> {
    let mut s = Samples::default();
    let mut in_flight = FuturesUnordered::new();
    let mut sent = 0u64;
    loop {
        while in_flight.len() < window
            && match stop {
                Stop::At(t) => Instant::now() < t,
                Stop::After(n) => sent < n,
            }
        {
            let t = Instant::now();
            let ack = sender
                .start(recs.key(sent as usize), recs.value.clone())
                .await?;
            in_flight.push(async move { ack.await.map(|()| t) });
            sent += 1;
        }
        match in_flight.next().await {
            Some(r) => s.record(r?, 1),
            None => return Ok(s),
        }
    }
}

/// C1 (`members` 1) and C4: the group reads `messages` stored records.
pub async fn consume(target: &Target, group: &str, members: usize, messages: u64) -> R<Figure> {
    target.create_group(group).await?;
    // Every member joins before the clock starts.
    let mut receivers = Vec::with_capacity(members);
    for i in 0..members {
        receivers.push(target.receiver(group, i).await?);
    }
    let total = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let tasks: Vec<_> = receivers
        .into_iter()
        .map(|mut r| {
            let total = total.clone();
            tokio::spawn(async move {
                let mut s = Samples::default();
                while total.load(Ordering::Relaxed) < messages {
                    if t0.elapsed() > CONSUME_LIMIT {
                        let got = total.load(Ordering::Relaxed);
                        return Err(format!(
                            "consumed {got} of {messages} records in {CONSUME_LIMIT:?}"
                        )
                        .into());
                    }
                    let t = Instant::now();
                    let got = r.batch().await?;
                    if got == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    total.fetch_add(got, Ordering::Relaxed);
                    s.record(t, got);
                }
                R::Ok(s)
            })
        })
        .collect();
    let mut all = Samples::default();
    for t in tasks {
        all.merge(t.await??);
    }
    Ok(all.figure(t0.elapsed()))
}
