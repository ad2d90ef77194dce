//! Measures a tail split: a partition with a backlog of
//! `records` records (100-byte values, 10,000 keys) is split into 4 with
//! the whole backlog moved, while one appender keeps appending single
//! records to the topic. Prints:
//!
//! - the copy throughput (bytes of batches copied / time of the split)
//!   against a raw copy of the parent's segment files (read + write +
//!   fdatasync of the same bytes);
//! - the appender's p50/p99/max latency during the split, against the same
//!   appender with no split running;
//! - the time 4 consumer threads take to drain the moved backlog (one
//!   child each) against one thread reading the same records.
//!
//! `cargo bench --bench tail_split_measure -- [records] [dir]`

mod args;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fissionlog::{
    Log, LogOptions, NewRecord, SplitPlan, SyncPolicy, TailSplitOptions, Topic, TopicConfig,
};

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Appends single records until `stop`, returning each append's latency.
fn appender(topic: Topic, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<Duration>> {
    std::thread::spawn(move || {
        let value = [7u8; 100];
        let mut lat = Vec::new();
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let key = format!("live-{}", i % 1000);
            let t = Instant::now();
            topic.append(Some(key.as_bytes()), &value).unwrap();
            lat.push(t.elapsed());
            i += 1;
            // About 20,000 appends/s: a steady producer, not a saturating one.
            std::thread::sleep(Duration::from_micros(50));
        }
        lat
    })
}

fn report(name: &str, lat: &mut [Duration]) {
    let n = lat.len();
    let p50 = percentile(lat, 0.50);
    let p99 = percentile(lat, 0.99);
    let max = lat.iter().max().copied().unwrap_or_default();
    println!("{name}: {n} appends, p50 {p50:?}, p99 {p99:?}, max {max:?}");
}

/// Reads partition `id` from 0 to `end`; returns the records read.
fn drain(topic: &Topic, id: u32, end: u64) -> u64 {
    let mut pos = 0;
    let mut n = 0;
    while pos < end {
        let b = topic.read(id, pos, 1 << 20).unwrap();
        n += b.iter().filter(|r| r.offset < end).count() as u64;
        pos = b.next_offset();
    }
    n
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = args::harness_args(&["2000"]).into_iter();
    let n: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let dir = args.next().map_or_else(
        || std::env::temp_dir().join(format!("fissionlog-tail-{}", std::process::id())),
        Into::into,
    );
    let _ = std::fs::remove_dir_all(&dir);
    let log = Log::open(
        &dir,
        LogOptions {
            balancer: false,
            background_retention: false,
            ..LogOptions::default()
        },
    )?;
    let topic = log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        },
    )?;
    let value = [1u8; 100];
    let keys: Vec<String> = (0..10_000).map(|k| format!("key-{k}")).collect();
    let mut i = 0u64;
    while i < n {
        let m = (n - i).min(1000);
        let recs: Vec<NewRecord<'_>> = (i..i + m)
            .map(|j| NewRecord {
                key: Some(keys[(j % 10_000) as usize].as_bytes()),
                value: &value,
                timestamp: None,
            })
            .collect();
        topic.append_batch(&recs)?;
        i += m;
    }
    log.sync()?;
    let parent = topic.partition(0)?;
    let bytes = parent.size_bytes();
    println!(
        "backlog: {n} records, {bytes} bytes in {} segment(s)",
        parent.segment_count()
    );

    // Raw copy of the same bytes.
    let raw_dir = dir.join("raw-copy");
    std::fs::create_dir_all(&raw_dir)?;
    let t = Instant::now();
    for e in std::fs::read_dir(parent.dir())?.flatten() {
        if e.path().extension().is_some_and(|x| x == "seg") {
            // Only the written bytes (segment files are preallocated).
            use std::io::{Read, Write};
            let mut data = Vec::new();
            std::fs::File::open(e.path())?
                .take(bytes + 4096)
                .read_to_end(&mut data)?;
            let f = std::fs::File::create(raw_dir.join(e.file_name()))?;
            (&f).write_all(&data)?;
            f.sync_data()?;
        }
    }
    let raw = t.elapsed();
    std::fs::remove_dir_all(&raw_dir)?;
    drop(parent);

    // Appender latency with nothing else running.
    let stop = Arc::new(AtomicBool::new(false));
    let h = appender(topic.clone(), stop.clone());
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let mut idle = h.join().unwrap();

    // The tail split, with the appender running.
    let stop = Arc::new(AtomicBool::new(false));
    let h = appender(topic.clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let out = topic.split_tail(
        0,
        SplitPlan::LoadQuantiles(4),
        TailSplitOptions::from_offset(0),
    )?;
    let split = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut during = h.join().unwrap();

    println!(
        "tail split into {:?}: moved {} records ({:?} per child) in {} rounds, {} bytes in {split:?} = {:.0} MB/s",
        out.children,
        out.seal_offset - out.from,
        out.moved,
        out.rounds,
        out.copied_bytes,
        out.copied_bytes as f64 / split.as_secs_f64() / 1e6
    );
    println!(
        "raw copy of the parent's {bytes} bytes (read + write + fdatasync): {raw:?} = {:.0} MB/s",
        bytes as f64 / raw.as_secs_f64() / 1e6
    );
    report("appender, no split", &mut idle);
    report("appender, during the tail split", &mut during);

    // Draining the moved backlog: 4 consumers against 1.
    let ends: Vec<(u32, u64)> = out
        .children
        .iter()
        .copied()
        .zip(out.moved.clone())
        .collect();
    let t = Instant::now();
    let total: u64 = ends.iter().map(|&(id, end)| drain(&topic, id, end)).sum();
    let one = t.elapsed();
    let t = Instant::now();
    let handles: Vec<_> = ends
        .iter()
        .map(|&(id, end)| {
            let topic = topic.clone();
            std::thread::spawn(move || drain(&topic, id, end))
        })
        .collect();
    let total4: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let four = t.elapsed();
    assert_eq!(total, total4);
    println!(
        "drain {total} moved records: 1 consumer {one:?}, {} consumers in parallel {four:?} ({} cores available)",
        ends.len(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    drop(topic);
    log.close()?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
