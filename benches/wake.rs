//! Awaiting durability across many partitions: 64 producer tasks, one per
//! partition, each appending one 100-byte record and awaiting
//! `Topic::durable` for it before the next, on one executor thread, while
//! a sync thread runs `Log::sync` whenever something is unsynced.
//!
//! The raw baseline runs the same tasks on the same executor over 64 plain
//! files: `write(2)` of a framed record, then a future on that file's
//! synced count, woken (only for that file) by a sync thread that
//! `fdatasync`s the files written since its last round. Every figure is
//! the median of `FISSIONLOG_BENCH_RUNS` (default 5) runs, engine and
//! baseline alternating; the ratio is engine / baseline of the same run.
//!
//! Besides throughput it reports polls per resolved future (2 is the least:
//! the first poll and the one after the wake of the round that covered it)
//! and CPU time per record of the whole process.
//!
//! ```text
//! cargo bench --bench wake
//! FISSIONLOG_BENCH_WAKE_PARTITIONS=64 FISSIONLOG_BENCH_WAKE_RECORDS=200 cargo bench --bench wake
//! ```

mod common;

use std::collections::VecDeque;
use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use fissionlog::{Log, LogOptions, NewRecord, SyncPolicy, TopicConfig};

use common::*;

const VALUE_LEN: usize = 100;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// User + system CPU time of the process so far.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    assert_eq!(rc, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The executor's run queue.
#[derive(Default)]
struct Queue {
    ready: Mutex<VecDeque<usize>>,
    cv: Condvar,
}

struct TaskWaker {
    id: usize,
    queued: AtomicBool,
    queue: Arc<Queue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.queue.ready.lock().unwrap().push_back(self.id);
            self.queue.cv.notify_one();
        }
    }
}

/// Runs `tasks` to completion on this thread; returns the number of polls.
fn run_tasks(tasks: Vec<Task>) -> u64 {
    let queue = Arc::new(Queue::default());
    let wakers: Vec<Arc<TaskWaker>> = (0..tasks.len())
        .map(|id| {
            Arc::new(TaskWaker {
                id,
                queued: AtomicBool::new(true),
                queue: queue.clone(),
            })
        })
        .collect();
    let mut tasks: Vec<Option<Task>> = tasks.into_iter().map(Some).collect();
    queue.ready.lock().unwrap().extend(0..tasks.len());
    let mut left = tasks.len();
    let mut polls = 0u64;
    while left > 0 {
        let id = {
            let mut q = queue.ready.lock().unwrap();
            loop {
                if let Some(id) = q.pop_front() {
                    break id;
                }
                q = queue.cv.wait(q).unwrap();
            }
        };
        wakers[id].queued.store(false, Ordering::Release);
        let Some(task) = tasks[id].as_mut() else {
            continue;
        };
        polls += 1;
        let waker = Waker::from(wakers[id].clone());
        if task
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
        {
            tasks[id] = None;
            left -= 1;
        }
    }
    polls
}

struct Outcome {
    secs: f64,
    polls_per_future: f64,
    cpu_per_record: Duration,
}

fn engine(partitions: u32, per_task: u64) -> Outcome {
    let dir = bench_dir("wake-engine");
    let log = Arc::new(
        Log::open(
            &dir,
            LogOptions {
                balancer: false,
                ..LogOptions::default()
            },
        )
        .expect("open"),
    );
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions,
                segment_bytes: 16 << 20,
                sync: SyncPolicy::Never,
                ..TopicConfig::default()
            },
        )
        .expect("topic");
    let appended = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (log, appended, stop) = (log.clone(), appended.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = 0;
            while !stop.load(Ordering::Acquire) {
                let now = appended.load(Ordering::Acquire);
                if now != seen {
                    seen = now;
                    log.sync().expect("sync");
                } else {
                    std::thread::yield_now();
                }
            }
        })
    };
    let value = vec![7u8; VALUE_LEN];
    let tasks: Vec<Task> = (0..partitions)
        .map(|p| {
            let (topic, appended, value) = (topic.clone(), appended.clone(), value.clone());
            Box::pin(async move {
                for _ in 0..per_task {
                    let off = topic
                        .append_to(
                            p,
                            &[NewRecord {
                                key: None,
                                value: &value,
                                timestamp: None,
                            }],
                        )
                        .expect("append");
                    appended.fetch_add(1, Ordering::Release);
                    topic.durable(p, off).await.expect("durable");
                }
            }) as Task
        })
        .collect();
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let polls = run_tasks(tasks);
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_time() - cpu0;
    stop.store(true, Ordering::Release);
    syncer.join().expect("syncer");
    drop(topic);
    match Arc::try_unwrap(log) {
        Ok(log) => log.abandon(),
        Err(_) => panic!("the sync thread still holds the log"),
    }
    remove_dir(&dir);
    let futures = u64::from(partitions) * per_task;
    Outcome {
        secs,
        polls_per_future: polls as f64 / futures as f64,
        cpu_per_record: cpu / futures as u32,
    }
}

/// One raw file: its synced record count and the wakers waiting on it.
struct RawFile {
    file: Mutex<File>,
    written: AtomicU64,
    synced: AtomicU64,
    wakers: Mutex<Vec<Waker>>,
}

/// Resolves once `file.synced > n`.
struct RawDurable {
    file: Arc<RawFile>,
    n: u64,
}

impl Future for RawDurable {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.file.synced.load(Ordering::SeqCst) > self.n {
            return Poll::Ready(());
        }
        self.file.wakers.lock().unwrap().push(cx.waker().clone());
        if self.file.synced.load(Ordering::SeqCst) > self.n {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

fn raw(partitions: u32, per_task: u64) -> Outcome {
    let dir = bench_dir("wake-raw");
    let files: Arc<Vec<Arc<RawFile>>> = Arc::new(
        (0..partitions)
            .map(|p| {
                Arc::new(RawFile {
                    file: Mutex::new(File::create(dir.join(format!("{p}.dat"))).expect("create")),
                    written: AtomicU64::new(0),
                    synced: AtomicU64::new(0),
                    wakers: Mutex::new(Vec::new()),
                })
            })
            .collect(),
    );
    let appended = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (files, appended, stop) = (files.clone(), appended.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = 0;
            while !stop.load(Ordering::Acquire) {
                let now = appended.load(Ordering::Acquire);
                if now == seen {
                    std::thread::yield_now();
                    continue;
                }
                seen = now;
                for f in files.iter() {
                    let w = f.written.load(Ordering::Acquire);
                    if w > f.synced.load(Ordering::SeqCst) {
                        f.file.lock().unwrap().sync_data().expect("fdatasync");
                        f.synced.store(w, Ordering::SeqCst);
                        for waker in std::mem::take(&mut *f.wakers.lock().unwrap()) {
                            waker.wake();
                        }
                    }
                }
            }
        })
    };
    let value = vec![7u8; VALUE_LEN];
    let tasks: Vec<Task> = (0..partitions as usize)
        .map(|p| {
            let (files, appended, value) = (files.clone(), appended.clone(), value.clone());
            Box::pin(async move {
                let f = files[p].clone();
                let mut buf = vec![0u8; RAW_HEADER + VALUE_LEN];
                for i in 0..per_task {
                    let n = frame(&mut buf, i, &value);
                    f.file.lock().unwrap().write_all(&buf[..n]).expect("write");
                    f.written.store(i + 1, Ordering::Release);
                    appended.fetch_add(1, Ordering::Release);
                    RawDurable {
                        file: f.clone(),
                        n: i,
                    }
                    .await;
                }
            }) as Task
        })
        .collect();
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let polls = run_tasks(tasks);
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_time() - cpu0;
    stop.store(true, Ordering::Release);
    syncer.join().expect("syncer");
    remove_dir(&dir);
    let futures = u64::from(partitions) * per_task;
    Outcome {
        secs,
        polls_per_future: polls as f64 / futures as f64,
        cpu_per_record: cpu / futures as u32,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let partitions = env_usize("FISSIONLOG_BENCH_WAKE_PARTITIONS", 64) as u32;
    let per_task = env_usize("FISSIONLOG_BENCH_WAKE_RECORDS", 200) as u64;
    let runs = if is_bench_run() { runs() } else { 1 };
    let per_task = if is_bench_run() { per_task } else { 5 };
    let records = (u64::from(partitions) * per_task) as f64;
    let (mut rate, mut raw_rate, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    let (mut polls, mut raw_polls, mut cpu, mut raw_cpu) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        let e = engine(partitions, per_task);
        let r = raw(partitions, per_task);
        println!(
            "run {run}: engine {:.1} k rec/s, {:.2} polls/future, {:.1} us CPU/rec; \
             raw {:.1} k rec/s, {:.2} polls/future, {:.1} us CPU/rec; ratio {:.3}",
            records / e.secs / 1e3,
            e.polls_per_future,
            e.cpu_per_record.as_secs_f64() * 1e6,
            records / r.secs / 1e3,
            r.polls_per_future,
            r.cpu_per_record.as_secs_f64() * 1e6,
            r.secs / e.secs
        );
        rate.push(records / e.secs);
        raw_rate.push(records / r.secs);
        ratio.push(r.secs / e.secs);
        polls.push(e.polls_per_future);
        raw_polls.push(r.polls_per_future);
        cpu.push(e.cpu_per_record.as_secs_f64() * 1e6);
        raw_cpu.push(r.cpu_per_record.as_secs_f64() * 1e6);
    }
    table_header(&format!(
        "awaiting durability: {partitions} tasks x {per_task} records of {VALUE_LEN} B, \
         one partition each, {runs} runs"
    ));
    println!(
        "| {:<44} | {:>14} | {:>14} | {:>7.3} |",
        "records/s (ratio: median of per-run ratios)",
        fmt_rate(median(rate), "rec"),
        fmt_rate(median(raw_rate), "rec"),
        median(ratio)
    );
    println!(
        "| {:<44} | {:>14.2} | {:>14.2} | {:>7} |",
        "polls per resolved future",
        median(polls),
        median(raw_polls),
        ""
    );
    println!(
        "| {:<44} | {:>14.1} | {:>14.1} | {:>7} |",
        "CPU us per record (whole process)",
        median(cpu),
        median(raw_cpu),
        ""
    );
}
