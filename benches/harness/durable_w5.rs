//! The peers bench's W5 alone, for profiling: 8 threads share 2,000 batches of
//! 64 × 1 KiB, each `append_to` with `SyncPolicy::Always` (durable before
//! the thread goes on), one partition, 1 GiB segments. Prints records/s
//! and the batch latency median and p99.
//!
//! With `raw` as the third argument it runs the peers bench's raw W5
//! baseline instead (write(2) under a mutex, leader/follower fdatasync,
//! one sync covering every write before it), so the two can alternate.
//!
//! ```text
//! cargo bench --bench durable_w5 -- [BATCHES] [DIR] [engine|raw]
//! ```

mod args;

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use fissionlog::{Log, LogOptions, NewRecord, SyncPolicy, TopicConfig};

fn main() -> fissionlog::Result<()> {
    let mut args = args::harness_args(&["20"]).into_iter();
    let batches: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2_000);
    let dir = args.next().map_or_else(
        || std::env::temp_dir().join(format!("fissionlog-w5-{}", std::process::id())),
        Into::into,
    );
    if args.next().as_deref() == Some("raw") {
        raw(batches, &dir);
        return Ok(());
    }
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
    report(
        "engine",
        batches,
        t0.elapsed(),
        latencies.into_inner().expect("not poisoned"),
    );
    drop(topic);
    log.abandon();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn report(what: &str, batches: usize, elapsed: Duration, mut lat: Vec<Duration>) {
    lat.sort();
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    println!(
        "W5 {what}: {:.1} k records/s, batch p50 {:?} p99 {:?}",
        (batches * 64) as f64 / elapsed.as_secs_f64() / 1e3,
        at(0.5),
        at(0.99)
    );
}

/// The raw baseline: 64 records of 1 KiB + 16-byte frame per batch,
/// `write(2)` under a mutex, then leader/follower `fdatasync`.
fn raw(batches: usize, dir: &std::path::Path) {
    std::fs::create_dir_all(dir).expect("create dir");
    let file = File::create(dir.join("raw-group.dat")).expect("create raw file");
    let sync_fd = file.try_clone().expect("dup");
    let file = Mutex::new(file);
    let written = AtomicU64::new(0);
    // (synced, syncing)
    let state = Mutex::new((0u64, false));
    let cv = Condvar::new();
    let buf = vec![7u8; 64 * (1024 + 16)];
    let next = AtomicUsize::new(0);
    let latencies = Mutex::new(Vec::with_capacity(batches));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                let mut mine = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < batches {
                    let t = Instant::now();
                    let end = {
                        let mut f = file.lock().expect("write lock");
                        f.write_all(&buf).expect("write");
                        written.fetch_add(buf.len() as u64, Ordering::AcqRel) + buf.len() as u64
                    };
                    let mut st = state.lock().expect("sync state");
                    while st.0 < end {
                        if st.1 {
                            st = cv.wait(st).expect("sync state");
                            continue;
                        }
                        st.1 = true;
                        drop(st);
                        let target = written.load(Ordering::Acquire);
                        sync_fd.sync_data().expect("fdatasync");
                        st = state.lock().expect("sync state");
                        st.1 = false;
                        st.0 = st.0.max(target);
                        cv.notify_all();
                    }
                    drop(st);
                    mine.push(t.elapsed());
                }
                latencies.lock().expect("not poisoned").extend(mine);
            });
        }
    });
    report(
        "raw",
        batches,
        t0.elapsed(),
        latencies.into_inner().expect("not poisoned"),
    );
    let _ = std::fs::remove_dir_all(dir);
}
