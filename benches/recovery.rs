//! Recovery: scanning segment data that is in the page cache (directly
//! with `scan_segment`, and as `Log::open` with `full_scan` after an
//! abandoned run), a clean reopen of a log with 1,000 segments, and an
//! unclean reopen of 1,000 partitions with the first sync after it (which
//! fsyncs every partition's directory: docs/ARCHITECTURE.md, "Recovered
//! names").

mod common;

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use fissionlog::internals::scan::{scan_segment, ScanParams};
use fissionlog::RecoveryMode;
use fissionlog::{Log, LogOptions, NewRecord, TopicConfig};

use common::*;

fn records() -> usize {
    std::env::var("FISSIONLOG_BENCH_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000)
}

/// Writes `n` 100-byte records (100 per batch) into a one-partition log
/// with segments of `segment_bytes`, rolling after every `roll_every`
/// batches when set. Returns the log, still open.
fn build(dir: &Path, n: usize, segment_bytes: u64, roll_every: Option<usize>) -> Log {
    let log = Log::open(dir, LogOptions::default()).expect("open log");
    let topic = log
        .create_topic(
            "bench",
            TopicConfig {
                partitions: 1,
                segment_bytes,
                ..Default::default()
            },
        )
        .expect("create topic");
    let vals = values(1024, 100);
    let recs: Vec<NewRecord<'_>> = (0..n)
        .map(|i| NewRecord {
            key: None,
            value: &vals[i % vals.len()],
            timestamp: None,
        })
        .collect();
    let part = topic.partition(0).expect("partition 0");
    for (i, c) in recs.chunks(100.min(n)).enumerate() {
        topic.append_to(0, c).expect("append_to");
        if roll_every.is_some_and(|r| (i + 1) % r == 0) {
            part.roll_now().expect("roll");
        }
    }
    log
}

/// Segment files under `dir`, sorted.
fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "seg") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn scan_params(base: u64) -> ScanParams {
    ScanParams {
        base_offset: base,
        from_pos: 64,
        from_offset: base,
        durable_until: 0,
        mode: RecoveryMode::Strict,
        index_interval: 4096,
        batch_version: 1,
    }
}

fn base_of(seg: &Path) -> u64 {
    seg.file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .expect("segment file name is its base offset")
}

fn scan_summary(n: usize) {
    let dir = bench_dir("recovery-scan");
    let log = build(&dir, n, 256 << 20, None);
    log.abandon();
    let seg = segment_files(&dir).pop().expect("a segment");
    let map = map_read(&seg);
    let params = scan_params(base_of(&seg));
    let out = scan_segment(&map, &params);
    assert_eq!(out.records, n as u64, "scan finds every record");
    let data = out.end_pos - 64;
    let (mut scan, mut crc) = (vec![], vec![]);
    for _ in 0..runs() {
        let t0 = Instant::now();
        black_box(scan_segment(&map, &params));
        scan.push(t0.elapsed());
        let t0 = Instant::now();
        black_box(crc32fast::hash(&map[64..out.end_pos as usize]));
        crc.push(t0.elapsed());
    }
    let mut opens = vec![];
    for _ in 0..runs() {
        let t0 = Instant::now();
        let log = Log::open(
            &dir,
            LogOptions {
                full_scan: true,
                ..Default::default()
            },
        )
        .expect("reopen");
        opens.push(t0.elapsed());
        log.abandon();
    }
    drop(map);
    remove_dir(&dir);
    let b = data as f64;
    table_header(&format!(
        "5. recovery scan of {:.0} MB in the page cache (bytes/s; target 1 GB/s)",
        b / 1e6
    ));
    row_rate(
        "scan_segment vs crc32 of the same bytes",
        "B",
        b,
        &scan,
        &crc,
    );
    row_value(
        "Log::open full_scan after abandon",
        fmt_rate(b / median_secs(&opens), "B"),
    );
    row_value(
        "  (median open time)",
        format!("{:.1} ms", median_secs(&opens) * 1e3),
    );
}

fn many_segments_summary() -> PathBuf {
    let dir = bench_dir("recovery-1000");
    // 1,000 segments of 16 KiB holding 100 records each.
    let log = build(&dir, 100_000, 16 << 10, Some(1));
    log.close().expect("close");
    let segs = segment_files(&dir).len();
    let mut clean = vec![];
    let mut full = vec![];
    for _ in 0..runs() {
        let t0 = Instant::now();
        let log = Log::open(&dir, LogOptions::default()).expect("reopen");
        clean.push(t0.elapsed());
        assert!(log.recovery_report().clean_shutdown);
        log.close().expect("close");
        let t0 = Instant::now();
        let log = Log::open(
            &dir,
            LogOptions {
                full_scan: true,
                ..Default::default()
            },
        )
        .expect("reopen");
        full.push(t0.elapsed());
        log.close().expect("close");
    }
    row_value(
        &format!("clean reopen, {segs} segments (target < 200 ms)"),
        format!("{:.1} ms", median_secs(&clean) * 1e3),
    );
    row_value(
        &format!("full_scan reopen, {segs} segments"),
        format!("{:.1} ms", median_secs(&full) * 1e3),
    );
    dir
}

/// 1,000 partitions holding one record each, reopened after an abandoned
/// run (unclean) and after a clean close: the open, and the first and
/// second `Log::sync` after it.
fn many_partitions_summary() {
    let dir = bench_dir("recovery-partitions");
    let log = Log::open(&dir, LogOptions::default()).expect("open log");
    let topic = log
        .create_topic(
            "bench",
            TopicConfig {
                partitions: 1000,
                segment_bytes: 1 << 20,
                ..Default::default()
            },
        )
        .expect("create topic");
    for p in 0..1000 {
        let rec = [NewRecord {
            key: None,
            value: b"v",
            timestamp: None,
        }];
        topic.append_to(p, &rec).expect("append");
    }
    drop(topic);
    log.sync().expect("sync");
    log.abandon();
    let mut rows: [Vec<Duration>; 6] = Default::default();
    for _ in 0..runs() {
        for (k, clean) in [(0, false), (3, true)] {
            let t0 = Instant::now();
            let log = Log::open(&dir, LogOptions::default()).expect("reopen");
            rows[k].push(t0.elapsed());
            assert_eq!(log.recovery_report().clean_shutdown, clean);
            for i in 1..3 {
                let t0 = Instant::now();
                log.sync().expect("sync");
                rows[k + i].push(t0.elapsed());
            }
            if clean {
                log.abandon();
            } else {
                log.close().expect("close");
            }
        }
    }
    for (k, label) in [
        "unclean reopen, 1000 partitions",
        "  first sync after it (every directory fsynced)",
        "  second sync",
        "clean reopen, 1000 partitions",
        "  first sync after it",
        "  second sync",
    ]
    .iter()
    .enumerate()
    {
        row_value(label, format!("{:.1} ms", median_secs(&rows[k]) * 1e3));
    }
    remove_dir(&dir);
}

fn criterion_groups(c: &mut Criterion) {
    let dir = bench_dir("recovery-criterion");
    let log = build(&dir, 100_000, 64 << 20, None);
    log.abandon();
    let seg = segment_files(&dir).pop().expect("a segment");
    let map = map_read(&seg);
    let params = scan_params(base_of(&seg));
    let end = scan_segment(&map, &params).end_pos;
    let mut g = c.benchmark_group("recovery");
    g.throughput(Throughput::Bytes(end - 64));
    g.bench_function("scan_segment_11MB", |b| {
        b.iter(|| scan_segment(&map, &params))
    });
    g.bench_function("crc32_same_bytes", |b| {
        b.iter(|| crc32fast::hash(&map[64..end as usize]))
    });
    g.finish();
    drop(map);
    remove_dir(&dir);
}

fn main() {
    if is_bench_run() {
        scan_summary(records());
        let dir = many_segments_summary();
        remove_dir(&dir);
        many_partitions_summary();
    }
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    criterion_groups(&mut c);
    c.final_summary();
}
