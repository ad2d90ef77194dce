//! Durable appends: 64 x 1 KiB batches made durable one at a time against
//! one write(2) + fdatasync per batch (baseline (c)), and group commit of
//! 8 writer threads over 64 partitions with `SyncPolicy::Always`, io_uring
//! against the syscall fallback.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use fissionlog::{Log, LogOptions, NewRecord, SyncBackend, SyncPolicy, Topic, TopicConfig};

use common::*;

const PER_BATCH: usize = 64;
const VALUE_LEN: usize = 1024;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn open(dir: &std::path::Path, sync: SyncPolicy, partitions: u32, io_uring: bool) -> (Log, Topic) {
    let log = Log::open(
        dir,
        LogOptions {
            use_io_uring: io_uring,
            ..Default::default()
        },
    )
    .expect("open log");
    let topic = log
        .create_topic(
            "bench",
            TopicConfig {
                partitions,
                segment_bytes: 64 << 20,
                sync,
                ..Default::default()
            },
        )
        .expect("create topic");
    (log, topic)
}

/// Per-batch latencies of `batches` durable 64 x 1 KiB batches.
fn engine_batches(name: &str, batches: usize, always: bool) -> Vec<Duration> {
    let dir = bench_dir(name);
    let policy = if always {
        SyncPolicy::Always
    } else {
        SyncPolicy::Never
    };
    let (log, topic) = open(&dir, policy, 1, true);
    let vals = values(PER_BATCH, VALUE_LEN);
    let recs: Vec<NewRecord<'_>> = vals
        .iter()
        .map(|v| NewRecord {
            key: None,
            value: v,
            timestamp: None,
        })
        .collect();
    let mut lat = Vec::with_capacity(batches);
    for _ in 0..batches {
        let t0 = Instant::now();
        if always {
            topic.append_batch(&recs).expect("append_batch");
        } else {
            topic.append_to(0, &recs).expect("append_to");
            log.sync().expect("sync");
        }
        lat.push(t0.elapsed());
    }
    drop(topic);
    log.abandon();
    remove_dir(&dir);
    lat
}

fn durable_summary() {
    let batches = env_usize("FISSIONLOG_BENCH_DURABLE_BATCHES", 300);
    let runs = runs().min(3);
    let base_dir = bench_dir("durable-raw");
    let (mut never, mut always, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        never.extend(engine_batches("durable-never", batches, false));
        raw.extend(raw_durable_batches(
            &base_dir, batches, PER_BATCH, VALUE_LEN,
        ));
        always.extend(engine_batches("durable-always", batches, true));
    }
    remove_dir(&base_dir);
    let bytes = (PER_BATCH * VALUE_LEN) as f64;
    table_header(&format!(
        "3. durable batches, 64 x 1 KiB, {batches} batches x {runs} runs (batches/s; p50/p99)"
    ));
    // Throughput from the median batch latency (the medians are robust to
    // the shared machine's stalls; totals are printed too).
    let total = |v: &[Duration]| v.iter().sum::<Duration>().as_secs_f64();
    row_rate("Never + log.sync() vs (c)", "batch", 1.0, &never, &raw);
    row_rate("Always + append_batch vs (c)", "batch", 1.0, &always, &raw);
    let n = never.len() as f64;
    row_value(
        "Never+sync MB/s (total) / (c) MB/s (total)",
        format!(
            "{:.1} / {:.1}",
            bytes * n / total(&never) / 1e6,
            bytes * n / total(&raw) / 1e6
        ),
    );
    for (name, v) in [
        ("Never + sync", &never),
        ("Always", &always),
        ("(c) raw", &raw),
    ] {
        row_value(
            &format!("{name} p50 / p99 latency"),
            format!("{} / {}", us(percentile(v, 50.0)), us(percentile(v, 99.0))),
        );
    }
    let p99 = |v: &[Duration]| percentile(v, 99.0).as_secs_f64();
    row_value(
        "p99 ratio Never+sync / (c), Always / (c)",
        format!(
            "{:.2} / {:.2}",
            p99(&never) / p99(&raw),
            p99(&always) / p99(&raw)
        ),
    );
}

/// 8 writers over `partitions` (a multiple of 8) partitions with
/// `SyncPolicy::Always` for `secs`, each writer cycling over its eighth.
/// Returns (backend, records, wall time, per-append latencies).
fn group_commit_run(
    io_uring: bool,
    secs: f64,
    partitions: u32,
) -> (SyncBackend, u64, Duration, Vec<Duration>) {
    let dir = bench_dir(if io_uring { "gc-uring" } else { "gc-syscalls" });
    let (log, topic) = open(&dir, SyncPolicy::Always, partitions, io_uring);
    let backend = log.sync_backend();
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..8u32)
        .map(|t| {
            let topic = topic.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let value = vec![t as u8; 100];
                let rec = [NewRecord {
                    key: None,
                    value: &value,
                    timestamp: None,
                }];
                let mut lat = Vec::new();
                let mut i = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let p = t + 8 * (i % (partitions / 8));
                    let s = Instant::now();
                    topic.append_to(p, &rec).expect("append_to");
                    lat.push(s.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.join().expect("writer thread"));
    }
    let wall = t0.elapsed();
    drop(topic);
    log.abandon();
    remove_dir(&dir);
    (backend, lat.len() as u64, wall, lat)
}

fn group_commit_summary() {
    let secs = env_usize("FISSIONLOG_BENCH_GC_MILLIS", 2000) as f64 / 1000.0;
    let partitions = (env_usize("FISSIONLOG_BENCH_GC_PARTITIONS", 64) as u32 / 8).max(1) * 8;
    let runs = runs().min(3);
    let mut res: [(Option<SyncBackend>, Vec<f64>, Vec<Duration>); 2] = [
        (None, Vec::new(), Vec::new()),
        (None, Vec::new(), Vec::new()),
    ];
    for _ in 0..runs {
        for (k, uring) in [true, false].into_iter().enumerate() {
            let (backend, n, wall, lat) = group_commit_run(uring, secs, partitions);
            res[k].0 = Some(backend);
            res[k].1.push(n as f64 / wall.as_secs_f64());
            res[k].2.extend(lat);
        }
    }
    table_header(&format!(
        "6. {partitions} partitions, SyncPolicy::Always, 8 writers x 100 B, {runs} x {secs:.1} s"
    ));
    for (name, (backend, rates, lat)) in ["use_io_uring: true", "use_io_uring: false"]
        .iter()
        .zip(&res)
    {
        let mut r = rates.clone();
        r.sort_by(f64::total_cmp);
        row_value(
            &format!("{name} -> {:?}", backend.expect("ran")),
            fmt_rate(r[r.len() / 2], "rec"),
        );
        row_value(
            "  p50 / p99 append latency",
            format!(
                "{} / {}",
                us(percentile(lat, 50.0)),
                us(percentile(lat, 99.0))
            ),
        );
    }
    let med = |v: &Vec<f64>| {
        let mut r = v.clone();
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    row_value(
        "records/s ratio io_uring / syscalls",
        format!("{:.3}", med(&res[0].1) / med(&res[1].1)),
    );
}

fn criterion_groups(c: &mut Criterion) {
    let dir = bench_dir("durable-criterion");
    let (log, topic) = open(&dir, SyncPolicy::Never, 1, true);
    let vals = values(PER_BATCH, VALUE_LEN);
    let recs: Vec<NewRecord<'_>> = vals
        .iter()
        .map(|v| NewRecord {
            key: None,
            value: v,
            timestamp: None,
        })
        .collect();
    let mut g = c.benchmark_group("durable");
    g.throughput(Throughput::Bytes((PER_BATCH * VALUE_LEN) as u64));
    g.bench_function("engine_64x1KiB_append_to_then_sync", |b| {
        b.iter(|| {
            topic.append_to(0, &recs).expect("append_to");
            log.sync().expect("sync");
        })
    });
    g.bench_function("raw_c_write_fdatasync_64x1KiB", |b| {
        b.iter_custom(|iters| {
            raw_durable_batches(&dir, iters as usize, PER_BATCH, VALUE_LEN)
                .iter()
                .sum()
        })
    });
    g.finish();
    drop(topic);
    log.abandon();
    remove_dir(&dir);
}

fn main() {
    if is_bench_run() {
        durable_summary();
        group_commit_summary();
    }
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    criterion_groups(&mut c);
    c.final_summary();
}
