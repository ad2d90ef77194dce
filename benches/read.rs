//! Sequential read of everything written (records iterated, values
//! touched) against walking a raw mapping with the same per-record framing
//! and CRC check. Data is in the page cache for both.

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use fissionlog::{Log, LogOptions, NewRecord, Topic, TopicConfig};

use common::*;

const VALUE_LEN: usize = 100;

fn records() -> usize {
    std::env::var("FISSIONLOG_BENCH_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000)
}

/// A log holding `n` 100-byte records in partition 0, appended 100 per batch.
fn build_log(dir: &std::path::Path, n: usize) -> (Log, Topic) {
    let log = Log::open(dir, LogOptions::default()).expect("open log");
    let topic = log
        .create_topic(
            "bench",
            TopicConfig {
                partitions: 1,
                segment_bytes: 256 << 20,
                ..Default::default()
            },
        )
        .expect("create topic");
    let vals = values(1024, VALUE_LEN);
    let recs: Vec<NewRecord<'_>> = (0..n)
        .map(|i| NewRecord {
            key: None,
            value: &vals[i % vals.len()],
            timestamp: None,
        })
        .collect();
    for c in recs.chunks(100) {
        topic.append_to(0, c).expect("append_to");
    }
    (log, topic)
}

/// Reads partition 0 from the start to `end`; returns (records, touch sum).
fn engine_read(topic: &Topic, end: u64, max_bytes: usize) -> (u64, u64) {
    let mut off = 0;
    let mut n = 0u64;
    let mut touch = 0u64;
    while off < end {
        let rb = topic.read(0, off, max_bytes).expect("read");
        for r in rb.iter() {
            touch = touch.wrapping_add(touch_value(r.value));
            n += 1;
        }
        off = rb.next_offset();
    }
    (n, touch)
}

fn summary(topic: &Topic, raw: &std::path::Path, n: usize) {
    let end = n as u64;
    let map = map_read(raw);
    let map_rand = map_read(raw);
    map_rand.advise(memmap2::Advice::Random).expect("madvise");
    // Warm both (page cache and mapping).
    assert_eq!(engine_read(topic, end, 1 << 20).0, end);
    assert_eq!(raw_read(&map).0, end);
    let (mut eng, mut eng64k, mut base, mut base_rand) = (vec![], vec![], vec![], vec![]);
    for _ in 0..runs() {
        let t0 = Instant::now();
        black_box(engine_read(topic, end, 1 << 20));
        eng.push(t0.elapsed());
        let t0 = Instant::now();
        black_box(raw_read(&map));
        base.push(t0.elapsed());
        let t0 = Instant::now();
        black_box(engine_read(topic, end, 64 << 10));
        eng64k.push(t0.elapsed());
        let t0 = Instant::now();
        black_box(raw_read(&map_rand));
        base_rand.push(t0.elapsed());
    }
    let nf = n as f64;
    table_header(&format!(
        "4. sequential read of {n} x {VALUE_LEN} B records, page cache (records/s)"
    ));
    row_rate(
        "read(max 1 MiB) vs raw mapping walk",
        "rec",
        nf,
        &eng,
        &base,
    );
    row_rate(
        "read(max 64 KiB) vs raw mapping walk",
        "rec",
        nf,
        &eng64k,
        &base,
    );
    row_rate(
        "raw walk MADV_RANDOM vs MADV_NORMAL",
        "rec",
        nf,
        &base_rand,
        &base,
    );
    row_value(
        "engine value bytes/s (1 MiB reads)",
        fmt_rate(nf * VALUE_LEN as f64 / median_secs(&eng), "B"),
    );
}

fn cold_mapping_summary(raw: &std::path::Path, n: usize) {
    // First touch of a fresh mapping (pages cached, page tables empty): the
    // cost MADV_RANDOM adds by disabling fault-around.
    let (mut normal, mut random) = (vec![], vec![]);
    for _ in 0..runs() {
        let m = map_read(raw);
        let t0 = Instant::now();
        black_box(raw_read(&m));
        normal.push(t0.elapsed());
        drop(m);
        let m = map_read(raw);
        m.advise(memmap2::Advice::Random).expect("madvise");
        let t0 = Instant::now();
        black_box(raw_read(&m));
        random.push(t0.elapsed());
    }
    row_rate(
        "fresh mapping: MADV_RANDOM vs MADV_NORMAL",
        "rec",
        n as f64,
        &random,
        &normal,
    );
}

/// W4 of the peers bench: 1 KiB records appended one per call (so one
/// record per batch), read back in 1 MiB reads, against the raw mapping
/// walk over the same records. Alternating, `runs()` times each.
fn single_record_batches_summary(dir: &std::path::Path) {
    const LEN: usize = 1024;
    let n = std::env::var("FISSIONLOG_BENCH_W4_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000usize);
    let log_dir = dir.join("w4");
    let log = Log::open(&log_dir, LogOptions::default()).expect("open log");
    let topic = log
        .create_topic(
            "w4",
            TopicConfig {
                partitions: 1,
                segment_bytes: 1 << 30,
                ..Default::default()
            },
        )
        .expect("create topic");
    let vals = values(1024, LEN);
    for i in 0..n {
        topic
            .append_to(
                0,
                &[NewRecord {
                    key: None,
                    value: &vals[i % vals.len()],
                    timestamp: None,
                }],
            )
            .expect("append_to");
    }
    let raw_dir = dir.join("w4-raw");
    std::fs::create_dir_all(&raw_dir).expect("raw dir");
    let raw = raw_file_for_read(&raw_dir, n, LEN);
    let map = map_read(&raw);
    let end = n as u64;
    assert_eq!(engine_read(&topic, end, 1 << 20).0, end);
    assert_eq!(raw_read(&map).0, end);
    let (mut eng, mut base) = (vec![], vec![]);
    for _ in 0..runs() {
        let t0 = Instant::now();
        black_box(engine_read(&topic, end, 1 << 20));
        eng.push(t0.elapsed());
        let t0 = Instant::now();
        black_box(raw_read(&map));
        base.push(t0.elapsed());
    }
    row_rate(
        &format!("W4: {n} x 1 KiB, 1 per batch, read 1 MiB"),
        "rec",
        n as f64,
        &eng,
        &base,
    );
    drop(topic);
    log.abandon();
    remove_dir(&log_dir);
    remove_dir(&raw_dir);
}

fn criterion_groups(c: &mut Criterion, topic: &Topic, raw: &std::path::Path) {
    let map = map_read(raw);
    let end = topic.partition(0).expect("partition 0").end_offset();
    let chunk = 10_000u64.min(end);
    let raw_chunk = chunk as usize * (RAW_HEADER + VALUE_LEN);
    let mut g = c.benchmark_group("read");
    g.throughput(Throughput::Elements(chunk));
    g.bench_function("engine_read_10k_records", |b| {
        b.iter(|| {
            let mut off = 0;
            let mut touch = 0u64;
            while off < chunk {
                let rb = topic.read(0, off, 1 << 20).expect("read");
                for r in rb.iter().take((chunk - off) as usize) {
                    touch = touch.wrapping_add(touch_value(r.value));
                }
                off = rb.next_offset();
            }
            touch
        })
    });
    g.bench_function("raw_walk_10k_records", |b| {
        b.iter(|| {
            let mut pos = 0;
            let mut touch = 0u64;
            while pos < raw_chunk {
                let len = u32::from_le_bytes(map[pos..pos + 4].try_into().expect("4")) as usize;
                let crc = u32::from_le_bytes(map[pos + 4..pos + 8].try_into().expect("4"));
                let body = &map[pos + 8..pos + RAW_HEADER + len];
                assert_eq!(crc32fast::hash(body), crc);
                touch = touch.wrapping_add(touch_value(&body[8..]));
                pos += RAW_HEADER + len;
            }
            touch
        })
    });
    g.finish();
}

fn main() {
    let bench = is_bench_run();
    let n = if bench { records() } else { 20_000 };
    let dir = bench_dir("read");
    let (log, topic) = build_log(&dir, n);
    let raw = raw_file_for_read(&dir, n, VALUE_LEN);
    if bench {
        summary(&topic, &raw, n);
        cold_mapping_summary(&raw, n);
        single_record_batches_summary(&dir);
    }
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    criterion_groups(&mut c, &topic, &raw);
    c.final_summary();
    drop(topic);
    log.abandon();
    remove_dir(&dir);
}
