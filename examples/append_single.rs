//! Appends single 100-byte records as fast as it can and prints the rate:
//! a target for profilers (`perf record`) of the single-record append path.
//!
//! `cargo run --release --example append_single -- [records] [dir]`

use std::time::Instant;

use fissionlog::{Log, LogOptions, TopicConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2_000_000);
    let dir = args.next().map_or_else(
        || std::env::temp_dir().join(format!("fissionlog-append-{}", std::process::id())),
        Into::into,
    );
    let log = Log::open(
        &dir,
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )?;
    let config = TopicConfig {
        segment_bytes: 512 << 20,
        ..TopicConfig::default()
    };
    let topic = log.create_topic("bench", config)?;
    let value = [7u8; 100];
    let started = Instant::now();
    for _ in 0..n {
        topic.append(None, &value)?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{n} records in {secs:.3} s: {:.2} M records/s, {:.0} ns/record",
        n as f64 / secs / 1e6,
        secs * 1e9 / n as f64
    );
    log.abandon();
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
