//! Topology history at scale: a topic that went through K splits and
//! merges (K = 100, 1,000, 10,000; 100,000 with `HISTORY_MAX_CHANGES`).
//! Reports, per K:
//!
//! - the worst and the 99th-percentile latency of one change (a split or
//!   a merge, manifest compaction included) while the history is built;
//! - a clean `open` of the log, in total and per partition ever created;
//! - the heap the open log holds (a counting allocator: live bytes after
//!   the open minus before it), per partition ever created, and the
//!   process's resident set growth for comparison.
//!
//! The history alternates: split the one active partition in two, merge
//! the two children back into one. After K changes the topic has made
//! about 1.5 K partitions, one or two of them active, the rest sealed
//! (each with one small segment of a few records).
//!
//! A plain binary, not criterion: building K = 10,000 takes tens of
//! seconds on a shared disk.
//!
//! ```text
//! cargo bench --bench history                          # K up to 10,000
//! HISTORY_MAX_CHANGES=1000 cargo bench --bench history
//! HISTORY_MAX_CHANGES=100000 cargo bench --bench history
//! ```
//!
//! Data lives under `target/bench-data` (or `FISSIONLOG_BENCH_DIR`).
//!
//! `HISTORY_KEEP=DIR` builds each history once into `DIR/history-K` and
//! keeps it; a later run finds it there and only times the opens (the
//! change latencies then print as `-`). Each run times three clean opens
//! and prints their median; the first one after a build also waits on the
//! filesystem writing the build back, so run `sync` between build and
//! timing when comparing.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use fissionlog::{Log, LogOptions, NewRecord, SplitPlan, TopicConfig};

use common::*;

/// Counts the bytes the process holds on the heap.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call forwards to the system allocator with the same
// layout; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: as the caller promised for `l`.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE_BYTES.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` with `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` with `l`.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const TOPIC: &str = "history";

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// CPU time the process has used, user and system, every thread.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed `rusage` it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn options() -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        ..Default::default()
    }
}

struct Figures {
    partitions: u32,
    /// The worst and the 99th-percentile change; `None` for a kept
    /// history that was not built in this run.
    changes: Option<(Duration, Duration)>,
    open: Duration,
    /// CPU time of that open (user and system).
    open_cpu: Duration,
    heap_bytes: isize,
    rss_bytes: u64,
}

/// Builds the history of `k` changes in `dir` and closes it cleanly;
/// returns the partition count and each change's latency.
fn build(dir: &Path, k: u32) -> (u32, Vec<Duration>) {
    let log = Log::open(dir, options()).expect("open a fresh log");
    let cfg = TopicConfig {
        partitions: 1,
        segment_bytes: fissionlog::MIN_SEGMENT_BYTES,
        ..Default::default()
    };
    let topic = log.create_topic(TOPIC, cfg).expect("create the topic");
    let value = [7u8; 64];
    let rec = [NewRecord {
        key: None,
        value: &value,
        timestamp: None,
    }];
    let mut active = vec![0u32];
    let mut lat = Vec::with_capacity(k as usize);
    for i in 0..k {
        for &p in &active {
            topic.append_to(p, &rec).expect("append_to");
        }
        let t = Instant::now();
        active = if active.len() == 1 {
            topic.split(active[0], SplitPlan::Even).expect("split")
        } else {
            vec![topic.merge(active[0], active[1]).expect("merge")]
        };
        lat.push(t.elapsed());
        if (i + 1) % 1000 == 0 {
            progress(k, &format!("{} changes", i + 1), lat.iter().sum());
        }
    }
    let partitions = topic.partitions().len() as u32;
    drop(topic);
    log.close().expect("clean close");
    (partitions, lat)
}

/// One clean open of `dir`: its time and CPU time, the heap it holds and
/// its resident set growth, and the partition count.
fn open_once(dir: &Path) -> ((Duration, Duration), isize, u64, u32) {
    let heap_before = LIVE_BYTES.load(Ordering::Relaxed);
    let rss_before = rss_bytes();
    let cpu = cpu_time();
    let t = Instant::now();
    let log = Log::open(dir, options()).expect("clean open");
    let open = (t.elapsed(), cpu_time().saturating_sub(cpu));
    let heap_bytes = LIVE_BYTES.load(Ordering::Relaxed) - heap_before;
    let rss = rss_bytes().saturating_sub(rss_before);
    assert!(log.recovery_report().clean_shutdown, "open after a close");
    let partitions = log.topic(TOPIC).expect("the topic").partitions().len() as u32;
    log.close().expect("close");
    (open, heap_bytes, rss, partitions)
}

fn scenario(k: u32) -> Figures {
    let keep = std::env::var_os("HISTORY_KEEP").map(PathBuf::from);
    let (dir, kept) = match &keep {
        Some(root) => {
            let dir = root.join(format!("history-{k}"));
            let built = dir.join("built");
            if !built.exists() {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).expect("create the kept history's dir");
            }
            (dir, built.exists())
        }
        None => (bench_dir(&format!("history-{k}")), false),
    };
    let changes = if kept {
        None
    } else {
        let (_, mut lat) = build(&dir.join("log"), k);
        if keep.is_some() {
            std::fs::write(dir.join("built"), b"").expect("mark the history built");
        }
        lat.sort_unstable();
        let worst = lat.last().copied().unwrap_or_default();
        Some((worst, lat[(lat.len() * 99 / 100).min(lat.len() - 1)]))
    };
    let mut opens: Vec<_> = (0..3).map(|_| open_once(&dir.join("log"))).collect();
    opens.sort_by_key(|o| o.0 .0);
    let ((open, open_cpu), heap_bytes, rss, partitions) = opens[1];
    if keep.is_none() {
        remove_dir(&dir);
    }
    Figures {
        partitions,
        changes,
        open,
        open_cpu,
        heap_bytes,
        rss_bytes: rss,
    }
}

fn progress(k: u32, what: &str, d: Duration) {
    eprintln!("  K={k}: {what} ({:.1} s)", d.as_secs_f64());
}

fn main() {
    if !is_bench_run() {
        // `cargo test --benches` runs this as a smoke test: one tiny case.
        let f = scenario(10);
        assert!(f.partitions >= 10);
        return;
    }
    let max: u32 = std::env::var("HISTORY_MAX_CHANGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    println!(
        "{:>7} {:>10} {:>12} {:>12} {:>10} {:>12} {:>10} {:>12} {:>10}",
        "K",
        "partitions",
        "worst change",
        "p99 change",
        "open",
        "open/part",
        "open cpu",
        "heap/part",
        "rss/part"
    );
    for k in [100u32, 1_000, 10_000, 100_000] {
        if k > max {
            break;
        }
        let f = scenario(k);
        let n = f64::from(f.partitions.max(1));
        let ms = |d: Option<Duration>| {
            d.map_or_else(
                || "-".to_string(),
                |d| format!("{:.2} ms", d.as_secs_f64() * 1e3),
            )
        };
        println!(
            "{:>7} {:>10} {:>12} {:>12} {:>7.1} ms {:>9.2} µs {:>7.1} ms {:>9.0} B {:>7.0} B",
            k,
            f.partitions,
            ms(f.changes.map(|c| c.0)),
            ms(f.changes.map(|c| c.1)),
            f.open.as_secs_f64() * 1e3,
            f.open.as_secs_f64() * 1e6 / n,
            f.open_cpu.as_secs_f64() * 1e3,
            f.heap_bytes as f64 / n,
            f.rss_bytes as f64 / n,
        );
    }
}
