//! The lineage reader at scale: what an idle `poll` costs and how large a
//! `Cut` is over a topic with 1, 301 and 3,001 partitions ever created
//! (split and merge cycles keep one partition active, so only the history
//! grows), next to a raw baseline that does the least an idle reader must
//! (look up its one open partition and load its end). Then small polls
//! against large ones over the same records, and how soon `poll_wait`
//! returns for a record appended to a partition other than the first.

mod common;

use std::hint::black_box;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use fissionlog::{Log, LogOptions, NewRecord, Reader, SplitPlan, StartAt, Topic, TopicConfig};

use common::*;

fn options() -> LogOptions {
    LogOptions {
        balancer: false,
        ..LogOptions::default()
    }
}

fn config(partitions: u32) -> TopicConfig {
    let mut c = TopicConfig {
        partitions,
        segment_bytes: 64 << 10,
        ..TopicConfig::default()
    };
    c.balance.min_partitions = 1;
    c.balance.max_partitions = 64;
    c
}

/// Splits the single active partition and merges its two children back,
/// `cycles` times (three partitions created per cycle), with one keyed
/// record appended before each change so every partition holds data.
fn grow(topic: &Topic, cycles: usize) {
    for i in 0..cycles {
        let key = format!("k{i}");
        topic.append(Some(key.as_bytes()), b"v").expect("append");
        let active = topic.active_partitions();
        assert_eq!(active.len(), 1);
        let kids = topic.split(active[0], SplitPlan::Even).expect("split");
        topic.append(Some(key.as_bytes()), b"w").expect("append");
        topic.merge(kids[0], kids[1]).expect("merge");
    }
}

/// Reads everything there is; returns the number of records.
fn drain(r: &mut Reader) -> usize {
    let mut n = 0;
    loop {
        let got = r.poll(4096).expect("poll");
        if got.is_empty() {
            return n;
        }
        n += got.len();
    }
}

/// Median duration of one call of `f`, timed in loops of at least
/// `min_calls` calls and `min_time`, `runs()` times.
fn per_call(min_calls: u32, min_time: Duration, mut f: impl FnMut()) -> Duration {
    let mut meds = Vec::new();
    for _ in 0..runs() {
        let t0 = Instant::now();
        let mut n = 0u32;
        while n < min_calls || t0.elapsed() < min_time {
            f();
            n += 1;
        }
        meds.push(t0.elapsed() / n);
    }
    Duration::from_secs_f64(median_secs(&meds))
}

/// Idle `poll(1)` of a caught-up reader, and its baseline: look up the one
/// open partition and load its end.
fn idle_figures(topic: &Topic, r: &mut Reader) -> (Duration, Duration, usize) {
    assert!(r.poll(1).expect("poll").is_empty(), "reader caught up");
    let open = r.open_partitions();
    let engine = per_call(20, Duration::from_millis(200), || {
        black_box(r.poll(1).expect("poll"));
    });
    let base = per_call(20, Duration::from_millis(200), || {
        for &id in &open {
            black_box(topic.partition(id).expect("partition").end_offset());
        }
    });
    (engine, base, r.cut().to_bytes().len())
}

fn scale_summary(topic: &Topic, nodes: &[usize], c: &mut Criterion) {
    table_header("1. idle poll(1) of a caught-up reader (polls/s)");
    let mut cut_rows = Vec::new();
    let mut built = 1;
    for &n in nodes {
        grow(topic, (n - built) / 3);
        built = n;
        assert_eq!(topic.partitions().len(), n);
        let mut r = topic.reader(StartAt::Earliest).expect("reader");
        let read = drain(&mut r);
        assert_eq!(read, 2 * (n - 1) / 3, "every record once");
        let (engine, base, cut_bytes) = idle_figures(topic, &mut r);
        row_rate(
            &format!("{n} nodes: poll(1) vs end of open partition"),
            "poll",
            1.0,
            &[engine],
            &[base],
        );
        row_value(&format!("{n} nodes: idle poll(1) median"), us(engine));
        cut_rows.push((n, cut_bytes));
        c.bench_function(&format!("reader_idle_poll/nodes_{n}"), |b| {
            b.iter(|| black_box(r.poll(1).expect("poll")))
        });
    }
    println!();
    println!("== 2. Cut of a caught-up reader (bytes, JSON) ==");
    for (n, bytes) in cut_rows {
        println!("| {:<44} | {:>14} |", format!("{n} nodes"), bytes);
    }
}

/// `n` records in one partition, appended 100 per batch.
fn fill(topic: &Topic, n: usize) {
    let vals = values(1024, 100);
    let recs: Vec<NewRecord<'_>> = (0..n)
        .map(|i| NewRecord {
            key: None,
            value: &vals[i % vals.len()],
            timestamp: None,
        })
        .collect();
    for chunk in recs.chunks(100) {
        topic.append_to(0, chunk).expect("append_to");
    }
}

fn poll_size_summary(topic: &Topic, n: usize, c: &mut Criterion) {
    let read_all = |max: usize| {
        let mut r = topic.reader(StartAt::Earliest).expect("reader");
        let mut got = 0;
        while got < n {
            got += r.poll(max).expect("poll").len();
        }
        assert_eq!(got, n);
    };
    let (mut small, mut large) = (Vec::new(), Vec::new());
    for _ in 0..runs() {
        let t0 = Instant::now();
        read_all(1);
        small.push(t0.elapsed());
        let t0 = Instant::now();
        read_all(1000);
        large.push(t0.elapsed());
    }
    table_header(&format!(
        "3. reading {n} x 100 B records, page cache (records/s)"
    ));
    row_rate("poll(1) vs poll(1000)", "rec", n as f64, &small, &large);
    let chunk = n.min(2_000);
    c.bench_function(&format!("reader_poll_1/{chunk}_records"), |b| {
        b.iter(|| {
            let mut r = topic.reader(StartAt::Earliest).expect("reader");
            for _ in 0..chunk {
                black_box(r.poll(1).expect("poll"));
            }
        })
    });
}

/// Time from an append to the second partition until a reader blocked in
/// `poll_wait` returns it, `samples` times.
fn wake_summary(topic: &Topic, samples: usize) {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (at_tx, at_rx) = mpsc::channel::<Instant>();
    let writer_topic = topic.clone();
    let writer = std::thread::spawn(move || {
        for _ in go_rx {
            // Let the reader block first.
            std::thread::sleep(Duration::from_millis(2));
            let t = Instant::now();
            writer_topic
                .append_to(
                    1,
                    &[NewRecord {
                        key: None,
                        value: b"wake",
                        timestamp: None,
                    }],
                )
                .expect("append_to");
            at_tx.send(t).expect("send");
        }
    });
    let mut r = topic.reader(StartAt::Latest).expect("reader");
    let mut lat = Vec::new();
    for _ in 0..samples {
        go_tx.send(()).expect("send");
        let got = r.poll_wait(10, Duration::from_secs(5)).expect("poll_wait");
        let back = Instant::now();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].partition, 1);
        lat.push(back - at_rx.recv().expect("recv"));
    }
    drop(go_tx);
    writer.join().expect("writer");
    table_header("4. poll_wait wake-up, append to a non-first partition");
    row_value("median", us(percentile(&lat, 50.0)));
    row_value("p99", us(percentile(&lat, 99.0)));
}

fn main() {
    let bench = is_bench_run();
    let dir = bench_dir("reader");
    let log = Log::open(&dir, options()).expect("open log");
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let nodes: &[usize] = if bench { &[1, 301, 3001] } else { &[1, 31] };
    let history = log.create_topic("history", config(1)).expect("topic");
    scale_summary(&history, nodes, &mut c);
    // Default segments (128 MiB): a read is bounded by its 256 KiB, not
    // by the segment.
    let flat = log
        .create_topic("flat", TopicConfig::default())
        .expect("topic");
    let n = if bench { 100_000 } else { 2_000 };
    fill(&flat, n);
    poll_size_summary(&flat, n, &mut c);
    let two = log.create_topic("two", config(2)).expect("topic");
    wake_summary(&two, if bench { 50 } else { 3 });
    c.final_summary();
    drop((history, flat, two));
    log.abandon();
    remove_dir(&dir);
}
