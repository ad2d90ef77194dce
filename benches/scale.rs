//! Scale on one node: one topic of N partitions (N = 10, 100, 1,000,
//! 10,000) with about 1 KiB written to each, every scenario in a fresh
//! directory. Reports, per N: creating the topic, a clean `close`, a clean
//! `open`, `reader(StartAt::Latest)`, an idle reader `poll`, an `open` after
//! an unclean shutdown (`Log::abandon`, which keeps the page cache as a
//! killed process would), and the descriptors the process holds after a
//! clean open (`/proc/self/fd`), with the cost per partition and the growth
//! from one N to the next.
//!
//! Beside the clean close, in the same scenario, a raw baseline of the
//! work it cannot skip: by hand, in the "same durability" tree below,
//! 1 KiB written into each partition's file, then each file
//! `fdatasync`ed and each partition directory fsynced (the first
//! segment's name, which a creation leaves to the first sync round), one
//! after another, and one file of a checkpoint's size (40 bytes per
//! partition) written and fsynced with its directory.
//!
//! Beside the creation, in the same scenario, two raw baselines, the same
//! files made by hand without the engine (per partition a directory and a
//! file with a header, sized like a segment; then the topic directory's
//! `fsync`): "raw, same durability" makes durable what the engine's
//! creation does (the partition directories' names; each first segment
//! becomes durable with its first records), "raw, every file durable"
//! adds each file's `fdatasync` and its directory's `fsync`, one after
//! another, as a creation that syncs everything up front would. The raw
//! trees sit beside the log and are removed only after the scenario: ext4
//! searches its inode bitmap past recently deleted inodes, so a removal
//! just before the engine's creation would slow it.
//!
//! A plain binary, not criterion: one scenario takes seconds at the large
//! N. Medians of `SCALE_RUNS` runs (3) for N up to 1,000, one run above.
//!
//! ```text
//! cargo bench --bench scale                          # N up to 10,000
//! SCALE_MAX_PARTITIONS=1000 cargo bench --bench scale
//! ```
//!
//! Knobs: `SCALE_MAX_PARTITIONS` caps N, `SCALE_RUNS` sets the runs per
//! figure, `SCALE_RECORD_BYTES` the record size (100: ten records make the
//! 1 KiB; 1024 writes one record), `SCALE_SEGMENT_BYTES` the topic's
//! segment size (the default config's when unset). Data lives under
//! `target/bench-data` (or `FISSIONLOG_BENCH_DIR`).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use fissionlog::{Log, LogOptions, NewRecord, StartAt, TopicConfig};

use common::*;

const TOPIC: &str = "scale";
const BYTES_PER_PARTITION: usize = 1024;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

struct Params {
    record_bytes: usize,
    segment_bytes: Option<u64>,
}

fn config(n: u32, p: &Params) -> TopicConfig {
    let mut c = TopicConfig {
        partitions: n,
        ..Default::default()
    };
    if let Some(s) = p.segment_bytes {
        c.segment_bytes = s;
    }
    c
}

fn options() -> LogOptions {
    LogOptions {
        // The figures are the open's own work, not a balancer pass.
        balancer: false,
        ..Default::default()
    }
}

/// One scenario's figures.
#[derive(Default, Clone, Copy)]
struct Figures {
    create: Duration,
    raw_create: Duration,
    raw_create_light: Duration,
    close: Duration,
    raw_close: Duration,
    open: Duration,
    reader: Duration,
    idle_poll: Duration,
    unclean_open: Duration,
    /// Why the open after an unclean shutdown failed (too many open files).
    unclean_error: Option<&'static str>,
    fds: usize,
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Creates the topic in a fresh log and writes about 1 KiB to each
/// partition. Returns the log, still open, and the time the creation took.
fn build(dir: &Path, n: u32, p: &Params) -> (Log, Duration) {
    let log = Log::open(dir, options()).expect("open a fresh log");
    let t = Instant::now();
    let topic = log
        .create_topic(TOPIC, config(n, p))
        .expect("create the topic");
    let create = t.elapsed();
    let vals = values(16, p.record_bytes);
    let per = BYTES_PER_PARTITION.div_ceil(p.record_bytes);
    let recs: Vec<NewRecord<'_>> = (0..per)
        .map(|i| NewRecord {
            key: None,
            value: &vals[i % vals.len()],
            timestamp: None,
        })
        .collect();
    for pid in 0..n {
        topic.append_to(pid, &recs).expect("append_to");
    }
    (log, create)
}

/// A raw baseline of a topic creation, by hand, in `dir/name`: with
/// `sync_each`, every file and directory made durable one after another.
fn raw_create(dir: &Path, name: &str, n: u32, p: &Params, sync_each: bool) -> Duration {
    use std::fs::{create_dir, File, OpenOptions};
    use std::os::unix::fs::FileExt;
    let capacity = p
        .segment_bytes
        .unwrap_or(TopicConfig::default().segment_bytes);
    let header = [0x5au8; 64];
    let t = Instant::now();
    let tdir = dir.join(name);
    create_dir(&tdir).expect("topic dir");
    for i in 0..n {
        let pdir = tdir.join(i.to_string());
        create_dir(&pdir).expect("partition dir");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(pdir.join("00000000000000000000.log"))
            .expect("segment file");
        f.write_all_at(&header, 0).expect("header");
        f.set_len(capacity).expect("size");
        if sync_each {
            f.sync_data().expect("fdatasync");
            File::open(&pdir)
                .and_then(|d| d.sync_all())
                .expect("dir fsync");
        }
    }
    File::open(&tdir)
        .and_then(|d| d.sync_all())
        .expect("dir fsync");
    File::open(dir)
        .and_then(|d| d.sync_all())
        .expect("dir fsync");
    t.elapsed()
}

/// A raw baseline of a clean close, by hand, on the files
/// [`raw_create`] made in `dir/name`: 1 KiB written into each, each
/// fdatasynced and each directory fsynced one after another, then a
/// checkpoint-sized file written and made durable.
fn raw_close(dir: &Path, name: &str, n: u32) -> Duration {
    use std::fs::{File, OpenOptions};
    use std::os::unix::fs::FileExt;
    let data = [0xa5u8; BYTES_PER_PARTITION];
    let tdir = dir.join(name);
    let files: Vec<File> = (0..n)
        .map(|i| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(tdir.join(i.to_string()).join("00000000000000000000.log"))
                .expect("raw segment file")
        })
        .collect();
    let t = Instant::now();
    for f in &files {
        f.write_all_at(&data, 64).expect("write");
    }
    for f in &files {
        f.sync_data().expect("fdatasync");
    }
    // The first segment's name, which the creation left to the first
    // sync round: each partition directory's fsync.
    for i in 0..n {
        File::open(tdir.join(i.to_string()))
            .and_then(|d| d.sync_all())
            .expect("partition dir fsync");
    }
    let cp = tdir.join("checkpoint");
    let f = File::create(&cp).expect("checkpoint file");
    f.write_all_at(&vec![1u8; 40 * n as usize], 0)
        .expect("checkpoint write");
    f.sync_data().expect("checkpoint fdatasync");
    File::open(&tdir)
        .and_then(|d| d.sync_all())
        .expect("dir fsync");
    t.elapsed()
}

fn scenario(n: u32, p: &Params, run: usize) -> Figures {
    let mut f = Figures::default();
    let dir = bench_dir(&format!("scale-{n}-{run}"));
    let raw = bench_dir(&format!("scale-raw-{n}-{run}"));
    f.raw_create_light = raw_create(&raw, "light", n, p, false);
    f.raw_create = raw_create(&raw, "synced", n, p, true);
    progress(n, "raw baseline create", f.raw_create);

    // Create, write, clean close.
    let (log, create) = build(&dir, n, p);
    f.create = create;
    let t = Instant::now();
    log.close().expect("clean close");
    f.close = t.elapsed();
    progress(n, "create and close", f.create + f.close);
    f.raw_close = raw_close(&raw, "light", n);
    progress(n, "raw baseline close", f.raw_close);

    // Clean open, descriptors, reader, idle poll.
    let fds_before = open_fds();
    let t = Instant::now();
    let log = Log::open(&dir, options()).expect("clean open");
    f.open = t.elapsed();
    progress(n, "clean open", f.open);
    assert!(log.recovery_report().clean_shutdown, "open after a close");
    f.fds = open_fds().saturating_sub(fds_before);
    let topic = log.topic(TOPIC).expect("topic");
    let t = Instant::now();
    let mut reader = topic.reader(StartAt::Latest).expect("reader");
    f.reader = t.elapsed();
    let polls = if n >= 10_000 { 20 } else { 200 };
    let mut samples = Vec::with_capacity(polls);
    for _ in 0..polls {
        let t = Instant::now();
        let got = reader.poll(100).expect("idle poll");
        samples.push(t.elapsed());
        assert!(got.is_empty(), "nothing was appended since Latest");
    }
    f.idle_poll = median(&mut samples);
    drop(reader);
    drop(topic);

    // Unclean shutdown: the open above cleared the clean mark, and
    // `abandon` writes no checkpoint, as a killed process would.
    log.abandon();
    let t = Instant::now();
    match Log::open(&dir, options()) {
        Ok(log) => {
            f.unclean_open = t.elapsed();
            assert!(!log.recovery_report().clean_shutdown, "abandon is unclean");
            log.close().expect("close");
        }
        Err(e) => {
            // Reported, not fatal: today a crashed log of 10,000
            // partitions needs more descriptors than a clean one.
            eprintln!("N = {n}: open after an unclean shutdown failed: {e}");
            f.unclean_open = t.elapsed();
            f.unclean_error = Some("failed");
        }
    }
    remove_dir(&dir);
    remove_dir(&raw);
    f
}

/// At the large N a scenario takes minutes: say where it is.
fn progress(n: u32, what: &str, d: Duration) {
    if n >= 10_000 {
        eprintln!("N = {n}: {what} took {}", fmt(d));
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn fmt(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

fn main() {
    let max = env_u64("SCALE_MAX_PARTITIONS").unwrap_or(10_000);
    let runs = env_u64("SCALE_RUNS").unwrap_or(3).max(1) as usize;
    let p = Params {
        record_bytes: env_u64("SCALE_RECORD_BYTES")
            .unwrap_or(100)
            .clamp(1, BYTES_PER_PARTITION as u64) as usize,
        segment_bytes: env_u64("SCALE_SEGMENT_BYTES"),
    };
    // `cargo test --benches` runs this as a smoke test: the smallest N once.
    let (max, runs) = if is_bench_run() { (max, runs) } else { (10, 1) };
    println!(
        "scale: one topic, N partitions, {} B per partition in records of {} B, segment {} B",
        BYTES_PER_PARTITION,
        p.record_bytes,
        p.segment_bytes
            .unwrap_or(TopicConfig::default().segment_bytes)
    );
    // `SCALE_N=10000` (a comma-separated list) runs only those N.
    let ns: Vec<u32> = match std::env::var("SCALE_N") {
        Ok(list) if is_bench_run() => list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect(),
        _ => [10u32, 100, 1_000, 10_000]
            .into_iter()
            .filter(|&n| u64::from(n) <= max)
            .collect(),
    };
    let mut rows: Vec<(u32, Figures)> = Vec::new();
    for &n in &ns {
        let r = if n <= 1_000 { runs } else { 1 };
        let all: Vec<Figures> = (0..r).map(|i| scenario(n, &p, i)).collect();
        let pick = |g: fn(&Figures) -> Duration| {
            let mut v: Vec<Duration> = all.iter().map(g).collect();
            median(&mut v)
        };
        let f = Figures {
            create: pick(|f| f.create),
            raw_create: pick(|f| f.raw_create),
            raw_create_light: pick(|f| f.raw_create_light),
            close: pick(|f| f.close),
            raw_close: pick(|f| f.raw_close),
            open: pick(|f| f.open),
            reader: pick(|f| f.reader),
            idle_poll: pick(|f| f.idle_poll),
            unclean_open: pick(|f| f.unclean_open),
            unclean_error: all.iter().find_map(|f| f.unclean_error),
            fds: all.iter().map(|f| f.fds).max().unwrap_or(0),
        };
        report(n, r, &f, rows.last());
        rows.push((n, f));
    }
}

fn report(n: u32, runs: usize, f: &Figures, prev: Option<&(u32, Figures)>) {
    println!("\nN = {n} (median of {runs})");
    let line = |name: &str, d: Duration, before: Option<Duration>| {
        let per = d / n;
        let growth = before
            .filter(|b| !b.is_zero())
            .map(|b| {
                format!(
                    "  x{:.1} from the previous N",
                    d.as_secs_f64() / b.as_secs_f64()
                )
            })
            .unwrap_or_default();
        println!(
            "  {name:<28} {:>10}  {:>10} per partition{growth}",
            fmt(d),
            fmt(per)
        );
    };
    let pf = prev.map(|(_, f)| *f);
    line("create topic", f.create, pf.map(|f| f.create));
    let ratio_of = |name: &str, d: Duration, raw: Duration| {
        println!(
            "  {name:<28} {:>10.2}",
            d.as_secs_f64() / raw.as_secs_f64().max(1e-9)
        );
    };
    let ratio = |name: &str, raw: Duration| ratio_of(name, f.create, raw);
    line(
        "  raw, same durability",
        f.raw_create_light,
        pf.map(|f| f.raw_create_light),
    );
    ratio("  create / raw, same", f.raw_create_light);
    line(
        "  raw, every file durable",
        f.raw_create,
        pf.map(|f| f.raw_create),
    );
    ratio("  create / raw, every file", f.raw_create);
    line("clean close", f.close, pf.map(|f| f.close));
    line(
        "  raw, one after another",
        f.raw_close,
        pf.map(|f| f.raw_close),
    );
    ratio_of("  close / raw", f.close, f.raw_close);
    line("clean open", f.open, pf.map(|f| f.open));
    line("reader(Latest)", f.reader, pf.map(|f| f.reader));
    line("idle poll", f.idle_poll, pf.map(|f| f.idle_poll));
    match f.unclean_error {
        None => line(
            "open after unclean stop",
            f.unclean_open,
            pf.map(|f| f.unclean_open),
        ),
        Some(e) => println!(
            "  {:<28} {:>10}  after {}",
            "open after unclean stop",
            e,
            fmt(f.unclean_open)
        ),
    }
    println!(
        "  {:<28} {:>10}  ({:.2} per partition)",
        "descriptors after open",
        f.fds,
        f.fds as f64 / f64::from(n)
    );
}
