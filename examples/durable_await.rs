//! Eight producers make 64 x 1 KiB batches durable, two ways, in one
//! process: `SyncPolicy::Always` (each `append_to` blocks in the group
//! commit) and `SyncPolicy::Never` + awaiting `Topic::durable` (a future,
//! woken by a sync thread that runs `Log::sync` back to back while there
//! is something to sync). The raw baseline is write(2) under a mutex with
//! a leader/follower fdatasync, as W5 of the peers bench. Each way checks
//! that every batch it acknowledged is durable.
//!
//! ```text
//! cargo run --example durable_await                                 # 200 batches, seconds
//! cargo run --release --example durable_await -- [BATCHES] [RUNS] [DIR]
//! ```
//!
//! docs/PERFORMANCE.md quotes `-- 2000 3`.

use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use fissionlog::{Log, LogOptions, NewRecord, SyncPolicy, Topic, TopicConfig};

const THREADS: usize = 8;
const PER_BATCH: usize = 64;
const VALUE_LEN: usize = 1024;

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `f` on this thread, parking between polls.
fn block_on<F: Future + Unpin>(mut f: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = Pin::new(&mut f).poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

fn open(dir: &Path, sync: SyncPolicy) -> (Log, Topic) {
    let _ = std::fs::remove_dir_all(dir);
    let log = Log::open(
        dir,
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )
    .expect("open");
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 1 << 30,
                sync,
                ..TopicConfig::default()
            },
        )
        .expect("topic");
    (log, topic)
}

/// Runs `batch(thread, i)` for `batches` batches shared by the threads;
/// returns (records/s, per-batch latencies).
fn run(batches: usize, batch: impl Fn(usize) + Sync) -> (f64, Vec<Duration>) {
    let next = AtomicU64::new(0);
    let lat = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let mut mine = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= batches {
                        break;
                    }
                    let t = Instant::now();
                    batch(i);
                    mine.push(t.elapsed());
                }
                lat.lock().unwrap().extend(mine);
            });
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    (
        (batches * PER_BATCH) as f64 / secs,
        lat.into_inner().unwrap(),
    )
}

/// One batch: `PER_BATCH` records of `value`, no key.
fn batch_of(value: &[u8]) -> Vec<NewRecord<'_>> {
    (0..PER_BATCH)
        .map(|_| NewRecord {
            key: None,
            value,
            timestamp: None,
        })
        .collect()
}

fn always(dir: &Path, batches: usize, value: &[u8]) -> (f64, Vec<Duration>) {
    let (log, topic) = open(dir, SyncPolicy::Always);
    let recs = batch_of(value);
    let r = run(batches, |_| {
        topic.append_to(0, &recs).expect("append");
    });
    assert_all_durable(&topic, batches);
    drop(topic);
    log.close().expect("close");
    r
}

fn awaited(dir: &Path, batches: usize, value: &[u8]) -> (f64, Vec<Duration>) {
    let (log, topic) = open(dir, SyncPolicy::Never);
    let log = Arc::new(log);
    let recs = batch_of(value);
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (log, topic, stop) = (log.clone(), topic.clone(), stop.clone());
        std::thread::spawn(move || {
            let p = topic.partition(0).expect("partition");
            while !stop.load(Ordering::Relaxed) {
                if p.durable_end_offset() < p.end_offset() {
                    log.sync().expect("sync");
                } else {
                    // Nothing to sync: wait for the next append.
                    p.wait_for_with(
                        p.end_offset(),
                        Duration::from_millis(5),
                        fissionlog::ReadIsolation::Written,
                    );
                }
            }
        })
    };
    let r = run(batches, |_| {
        let first = topic.append_to(0, &recs).expect("append");
        block_on(topic.durable(0, first + PER_BATCH as u64 - 1)).expect("durable");
    });
    stop.store(true, Ordering::Relaxed);
    syncer.join().expect("syncer");
    assert_all_durable(&topic, batches);
    drop(topic);
    match Arc::try_unwrap(log) {
        Ok(log) => log.close().expect("close"),
        Err(_) => panic!("the sync thread still holds the log"),
    }
    r
}

/// Every batch a producer saw acknowledged is covered by a sync.
fn assert_all_durable(topic: &Topic, batches: usize) {
    let p = topic.partition(0).expect("partition");
    let appended = (batches * PER_BATCH) as u64;
    assert_eq!(p.end_offset(), appended, "every batch was appended");
    assert_eq!(p.durable_end_offset(), appended, "every batch is durable");
}

fn raw(dir: &Path, batches: usize, value: &[u8]) -> (f64, Vec<Duration>) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("dir");
    let file = File::create(dir.join("raw.dat")).expect("file");
    // Leader/follower: `written` counts batches written, `synced` those a
    // completed fdatasync covers.
    struct G {
        written: u64,
        synced: u64,
        syncing: bool,
    }
    let g = Mutex::new((
        G {
            written: 0,
            synced: 0,
            syncing: false,
        },
        file,
    ));
    let cv = Condvar::new();
    let mut frame = Vec::with_capacity(PER_BATCH * (VALUE_LEN + 16));
    for _ in 0..PER_BATCH {
        frame.extend_from_slice(&[0u8; 16]);
        frame.extend_from_slice(value);
    }
    run(batches, |_| {
        let mut l = g.lock().unwrap();
        l.1.write_all(&frame).expect("write");
        l.0.written += 1;
        let mine = l.0.written;
        loop {
            if l.0.synced >= mine {
                return;
            }
            if !l.0.syncing {
                l.0.syncing = true;
                let upto = l.0.written;
                let f = l.1.try_clone().expect("clone");
                drop(l);
                f.sync_data().expect("fdatasync");
                l = g.lock().unwrap();
                l.0.syncing = false;
                l.0.synced = upto;
                cv.notify_all();
            } else {
                l = cv.wait(l).unwrap();
            }
        }
    })
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize - 1;
    v[i.min(v.len() - 1)].as_secs_f64() * 1e3
}

fn main() {
    let mut args = std::env::args().skip(1);
    let batches: usize = args.next().map_or(200, |s| s.parse().expect("BATCHES"));
    let runs: usize = args.next().map_or(1, |s| s.parse().expect("RUNS"));
    let dir = args.next().map_or_else(
        || std::env::temp_dir().join(format!("fissionlog-await-{}", std::process::id())),
        Into::into,
    );
    let value = vec![7u8; VALUE_LEN];
    type Mode = fn(&Path, usize, &[u8]) -> (f64, Vec<Duration>);
    let modes: [(&str, Mode); 3] = [("raw", raw), ("always", always), ("await", awaited)];
    let mut res: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); 3];
    for _ in 0..runs {
        let mut raw_rate = 0.0;
        for (k, (name, f)) in modes.iter().enumerate() {
            let (rate, mut lat) = f(&dir.join(name), batches, &value);
            if k == 0 {
                raw_rate = rate;
            }
            println!(
                "{name:>7}: {:>8.0} records/s ({:.2} x raw), batch p50 {:.2} ms, p99 {:.2} ms",
                rate,
                rate / raw_rate,
                pct(&mut lat, 50.0),
                pct(&mut lat, 99.0)
            );
            res[k].0.push(rate / raw_rate);
            res[k].1.push(pct(&mut lat, 99.0));
        }
    }
    for (k, (name, _)) in modes.iter().enumerate() {
        let r = &mut res[k].0;
        r.sort_by(f64::total_cmp);
        println!("{name:>7}: median ratio to raw {:.2}", r[r.len() / 2]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
