//! Many small segments in one partition: the CPU a roll costs as the
//! segment count S grows, and the mappings and descriptors the process
//! holds for the log (`/proc/self/maps`, `/proc/self/fd`) against the
//! budget (`LogOptions::max_mapped_segments`, `max_open_files`), while
//! building and after reading every segment back.
//!
//! Every append of a 3,000-byte record into 4 KiB segments rolls. The
//! figure at S is the thread CPU time (`CLOCK_THREAD_CPUTIME_ID`) per roll
//! of the 1,000 appends (so 1,000 rolls) that take the log from S to
//! S + 1,000 segments: the median of 10 chunks of 100; the directory
//! fsync each roll makes waits off the CPU. A sync round every 64 rolls
//! closes the sealed segments' descriptors, as an application's syncs
//! would. Beside it, in the same run, the baseline of what each roll
//! cost before the segment list became append-only: one copy of a list
//! of S `Arc`s (median of 21).
//!
//! A plain binary, not criterion: one run builds all of S.
//!
//! ```text
//! cargo bench --bench segments                      # S up to 100,000
//! SEGMENTS_MAX=1000000 cargo bench --bench segments # up to 1,000,000 (4 GB)
//! ```
//!
//! Knobs: `SEGMENTS_MAX` (100,000), `SEGMENTS_BUDGET_MAPS` (4,096, the
//! default budget), `SEGMENTS_BUDGET_FILES` (128). Data lives under
//! `target/bench-data` (or `FISSIONLOG_BENCH_DIR`).

mod common;

use std::path::Path;
use std::time::Duration;

use fissionlog::{Log, LogOptions, NewRecord, SyncPolicy, TopicConfig};

use common::*;

const RECORD: usize = 3000;
const WINDOW: u64 = 1000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, owned `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn mappings_under(dir: &Path) -> usize {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().filter(|l| l.contains(dir.as_str())).count())
        .unwrap_or(0)
}

fn descriptors_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|t| t.starts_with(dir))
                .count()
        })
        .unwrap_or(0)
}

/// The median CPU time of copying a list of `n` `Arc`s, as every roll did
/// before the list became append-only (`(**list).clone()` plus a push).
fn list_copy(n: usize) -> Duration {
    let list: Vec<std::sync::Arc<u64>> = (0..n as u64).map(std::sync::Arc::new).collect();
    let mut times: Vec<Duration> = (0..21)
        .map(|_| {
            let start = thread_cpu();
            let mut v = list.clone();
            v.push(std::sync::Arc::new(0));
            std::hint::black_box(&v);
            drop(v);
            thread_cpu() - start
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn append(log: &Log, value: &[u8]) {
    log.topic("t")
        .and_then(|t| {
            t.append_to(
                0,
                &[NewRecord {
                    key: None,
                    value,
                    timestamp: None,
                }],
            )
        })
        .expect("append");
}

fn main() {
    let smoke = !is_bench_run();
    let max = if smoke {
        2 * WINDOW
    } else {
        env_u64("SEGMENTS_MAX").unwrap_or(100_000)
    };
    let maps = env_u64("SEGMENTS_BUDGET_MAPS").unwrap_or(4096) as usize;
    let files = env_u64("SEGMENTS_BUDGET_FILES").unwrap_or(128) as usize;
    let dir = bench_dir("segments");
    let log = Log::open(
        &dir,
        LogOptions {
            balancer: false,
            background_retention: false,
            max_mapped_segments: maps,
            max_open_files: files,
            ..LogOptions::default()
        },
    )
    .expect("open");
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: 4096,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        },
    )
    .expect("create");
    let value = vec![7u8; RECORD];
    println!("budget: {maps} mappings, {files} descriptors of sealed segments");
    println!(
        "{:>10} {:>14} {:>16} {:>10} {:>12}",
        "segments", "CPU per roll", "S-Arc list copy", "mappings", "descriptors"
    );
    let mut marks: Vec<u64> = [100, 1_000, 10_000, 100_000, 1_000_000]
        .into_iter()
        .filter(|&s| s + WINDOW <= max.max(2 * WINDOW))
        .collect();
    if smoke {
        marks = vec![100];
    }
    let mut built = 1u64;
    for &mark in &marks {
        while built < mark {
            append(&log, &value);
            built += 1;
            if built.is_multiple_of(64) {
                log.sync().expect("sync");
            }
        }
        let mut chunks = Vec::new();
        for _ in 0..10 {
            let start = thread_cpu();
            for _ in 0..WINDOW / 10 {
                append(&log, &value);
                built += 1;
                if built.is_multiple_of(64) {
                    log.sync().expect("sync");
                }
            }
            chunks.push((thread_cpu() - start) / (WINDOW / 10) as u32);
        }
        chunks.sort();
        let per_roll = chunks[chunks.len() / 2];
        println!(
            "{:>10} {:>11.1} µs {:>13.1} µs {:>10} {:>12}",
            mark,
            per_roll.as_secs_f64() * 1e6,
            list_copy(mark as usize).as_secs_f64() * 1e6,
            mappings_under(&dir),
            descriptors_under(&dir)
        );
    }
    log.sync().expect("sync");
    let p = log
        .topic("t")
        .and_then(|t| t.partition(0))
        .expect("partition");
    let mut next = p.start_offset();
    while next < p.end_offset() {
        next = p.read(next, 1 << 20).expect("read").next_offset();
    }
    let stats = log.resource_stats();
    println!(
        "read back {next} records: {} mappings, {} descriptors under the log; budget holds {} mapped, {} open, {} mappings evicted",
        mappings_under(&dir),
        descriptors_under(&dir),
        stats.mapped_segments,
        stats.open_segment_files,
        stats.mappings_evicted
    );
    drop(p);
    log.close().expect("close");
    remove_dir(&dir);
}
