//! Issue 8's W5 alone, for profiling: 8 threads share 2,000 batches of
//! 64 × 1 KiB, each `append_to` with `SyncPolicy::Always` (durable before
//! the thread goes on), one partition, 1 GiB segments. Prints records/s
//! and the batch latency median and p99.
//!
//! ```text
//! cargo run --release --example durable_w5 -- [BATCHES] [DIR]
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fissionlog::{Log, LogOptions, NewRecord, SyncPolicy, TopicConfig};

fn main() -> fissionlog::Result<()> {
    let mut args = std::env::args().skip(1);
    let batches: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2_000);
    let dir = args.next().map_or_else(
        || std::env::temp_dir().join(format!("fissionlog-w5-{}", std::process::id())),
        Into::into,
    );
    let log = Log::open(
        &dir,
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )?;
    let topic = log.topic_or_create(
        "w5",
        TopicConfig {
            partitions: 1,
            segment_bytes: 1 << 30,
            sync: SyncPolicy::Always,
            ..TopicConfig::default()
        },
    )?;
    let value = vec![7u8; 1024];
    let batch: Vec<NewRecord<'_>> = (0..64)
        .map(|_| NewRecord {
            key: None,
            value: &value,
            timestamp: None,
        })
        .collect();
    let next = AtomicUsize::new(0);
    let latencies = Mutex::new(Vec::with_capacity(batches));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                let mut mine = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < batches {
                    let t = Instant::now();
                    topic.append_to(0, &batch).expect("append_to");
                    mine.push(t.elapsed());
                }
                latencies.lock().expect("not poisoned").extend(mine);
            });
        }
    });
    let elapsed = t0.elapsed();
    let mut lat: Vec<Duration> = latencies.into_inner().expect("not poisoned");
    lat.sort();
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    println!(
        "W5 engine: {:.1} k records/s, batch p50 {:?} p99 {:?}",
        (batches * 64) as f64 / elapsed.as_secs_f64() / 1e3,
        at(0.5),
        at(0.99)
    );
    drop(topic);
    log.abandon();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
