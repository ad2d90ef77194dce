//! Consumer groups at scale: 8 members of one group over a topic with 1,
//! 301 and 3,001 partitions ever created (split and merge cycles keep one
//! partition active, so only the history grows). Per size: what an idle
//! `poll(1)` of a member costs, beside a plain caught-up `Reader`'s idle
//! poll and the raw baseline (look up the active partition and load its
//! end); and the end-to-end latency from an append to the owning member's
//! `poll_wait` returning it, beside a `Reader`'s. Then topics of N active
//! partitions (`GROUPS_WIDE`, default 100 and 1,000): an idle poll, and a
//! poll after an append to one partition, of one member owning them all
//! and of a `Reader` from `Latest`, beside the raw end lookup; and each
//! idle poll of that member timed alone over 2.5 s (median, 99.9th
//! percentile, slowest, how many took 100 µs or more of wall time and of
//! the thread's CPU time, which a loaded machine does not inflate): the
//! work the clock triggers shows there.

mod common;

use std::hint::black_box;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fissionlog::{
    GroupOptions, Log, LogOptions, Member, MemberOptions, NewRecord, SplitPlan, StartAt, Topic,
    TopicConfig,
};

use common::*;

const MEMBERS: usize = 8;

fn config() -> TopicConfig {
    let mut c = TopicConfig {
        partitions: 1,
        segment_bytes: 64 << 10,
        ..TopicConfig::default()
    };
    c.balance.min_partitions = 1;
    c.balance.max_partitions = 64;
    c
}

/// Split and merge back `cycles` times, a keyed record before each change.
fn grow(topic: &Topic, cycles: usize) {
    for i in 0..cycles {
        let key = format!("k{i}");
        topic.append(Some(key.as_bytes()), b"v").expect("append");
        let active = topic.active_partitions();
        let kids = topic.split(active[0], SplitPlan::Even).expect("split");
        topic.append(Some(key.as_bytes()), b"w").expect("append");
        topic.merge(kids[0], kids[1]).expect("merge");
    }
}

fn per_call(min_calls: u32, min_time: Duration, mut f: impl FnMut()) -> Vec<Duration> {
    (0..runs())
        .map(|_| {
            let t0 = Instant::now();
            let mut n = 0u32;
            while n < min_calls || t0.elapsed() < min_time {
                f();
                n += 1;
            }
            t0.elapsed() / n
        })
        .collect()
}

/// Every member polls and commits until nobody gets anything.
fn settle(members: &mut [Member]) -> usize {
    let mut total = 0;
    loop {
        let mut got = 0;
        for m in members.iter_mut() {
            let n = m.poll(4096).expect("poll").len();
            m.commit().expect("commit");
            got += n;
        }
        if got == 0 {
            return total;
        }
        total += got;
    }
}

/// Time from an append to `poll_wait` returning it, `samples` times.
fn e2e(topic: &Topic, samples: usize, mut wait: impl FnMut() -> usize) -> Vec<Duration> {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (at_tx, at_rx) = mpsc::channel::<Instant>();
    let writer_topic = topic.clone();
    let writer = std::thread::spawn(move || {
        for _ in go_rx {
            std::thread::sleep(Duration::from_millis(2));
            let t = Instant::now();
            let p = writer_topic.active_partitions()[0];
            writer_topic
                .append_to(
                    p,
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
    let mut lat = Vec::new();
    for _ in 0..samples {
        go_tx.send(()).expect("send");
        let n = wait();
        let back = Instant::now();
        assert_eq!(n, 1);
        lat.push(back - at_rx.recv().expect("recv"));
    }
    drop(go_tx);
    writer.join().expect("writer");
    lat
}

/// Per N: idle poll of the member, of the reader; poll after one append
/// of the member, of the reader; the raw end lookup; each idle poll of the
/// member over [`SPREAD_TIME`].
type WideRow = (
    u32,
    Vec<Duration>,
    Vec<Duration>,
    Vec<Duration>,
    Vec<Duration>,
    Vec<Duration>,
    Vec<(Duration, Duration)>,
);

/// How long each idle poll of the member is timed alone: long enough for
/// the work the clock triggers (rate folds every 100 ms, a balancing every
/// second) to land in it.
const SPREAD_TIME: Duration = Duration::from_millis(2_500);

/// CPU time of the calling thread: unlike wall time, it does not count
/// the time the thread waited for a core, so it survives a loaded machine.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, owned struct.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Each call of `f` timed alone, for `time`: its wall time and its
/// thread's CPU time.
fn each_call(time: Duration, mut f: impl FnMut()) -> Vec<(Duration, Duration)> {
    let t0 = Instant::now();
    let mut out = Vec::with_capacity(1 << 20);
    while t0.elapsed() < time {
        let c = thread_cpu();
        let t = Instant::now();
        f();
        let wall = t.elapsed();
        out.push((wall, thread_cpu() - c));
    }
    out
}

/// Idle polls and polls after one append over a topic of `n` active
/// partitions, one member owning all of them, and a `Reader`.
fn wide(log: &Log, n: u32) -> WideRow {
    let mut c = config();
    c.partitions = n;
    c.balance.max_partitions = n;
    let topic = log.create_topic(&format!("wide{n}"), c).expect("topic");
    let group = topic.group("g", GroupOptions::default()).expect("group");
    let mut m = group
        .join(MemberOptions {
            background_heartbeat: None,
            ..MemberOptions::default()
        })
        .expect("join");
    assert_eq!(m.assignment().partitions.len(), n as usize);
    while !m.poll(4096).expect("poll").is_empty() {}
    let mut reader = topic.reader(StartAt::Latest).expect("reader");
    while !reader.poll(4096).expect("poll").is_empty() {}
    let idle_member = per_call(20, Duration::from_millis(200), || {
        black_box(m.poll(1).expect("poll"));
    });
    let idle_reader = per_call(20, Duration::from_millis(200), || {
        black_box(reader.poll(1).expect("poll"));
    });
    let spread = each_call(SPREAD_TIME, || {
        black_box(m.poll(1).expect("poll"));
    });
    // The poll that returns one record appended to one partition (the
    // append is not timed: the clock stops around each poll).
    let mut next = 0u32;
    let mut after_one = |poll: &mut dyn FnMut() -> usize| {
        (0..runs())
            .map(|_| {
                let mut total = Duration::ZERO;
                let calls = 200u32;
                for _ in 0..calls {
                    next = (next + 7919) % n;
                    topic
                        .append_to(
                            next,
                            &[NewRecord {
                                key: None,
                                value: b"one",
                                timestamp: None,
                            }],
                        )
                        .expect("append_to");
                    let t = Instant::now();
                    assert_eq!(poll(), 1);
                    total += t.elapsed();
                }
                total / calls
            })
            .collect::<Vec<Duration>>()
    };
    let one_member = after_one(&mut || m.poll(10).expect("poll").len());
    while !reader.poll(4096).expect("poll").is_empty() {}
    let one_reader = after_one(&mut || reader.poll(10).expect("poll").len());
    let base = per_call(20, Duration::from_millis(200), || {
        black_box(topic.partition(n / 2).expect("partition").end_offset());
    });
    drop(reader);
    m.leave().expect("leave");
    (
        n,
        idle_member,
        idle_reader,
        one_member,
        one_reader,
        base,
        spread,
    )
}

fn main() {
    let bench = is_bench_run();
    let dir = bench_dir("groups");
    let log = Log::open(
        &dir,
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )
    .expect("open log");
    let topic = log.create_topic("history", config()).expect("topic");
    let sizes: &[usize] = if bench { &[1, 301, 3001] } else { &[1, 31] };
    let samples = if bench { 50 } else { 3 };
    let mut built = 1;
    let mut idle_rows = Vec::new();
    let mut e2e_rows = Vec::new();
    // Records the latency runs appended (two per sample and size).
    let mut extra = 0;
    for &n in sizes {
        grow(&topic, (n - built) / 3);
        built = n;
        assert_eq!(topic.partitions().len(), n);
        let group = topic
            .group(&format!("g{n}"), GroupOptions::default())
            .expect("group");
        let opts = MemberOptions {
            background_heartbeat: None,
            ..MemberOptions::default()
        };
        let mut members: Vec<Member> = (0..MEMBERS)
            .map(|_| group.join(opts.clone()).expect("join"))
            .collect();
        let read = settle(&mut members);
        assert_eq!(read, 2 * (n - 1) / 3 + extra, "every record once");
        extra += 2 * samples;
        let owner = members
            .iter()
            .position(|m| !m.assignment().partitions.is_empty())
            .expect("one member owns the active partition");
        let idle_owner = per_call(20, Duration::from_millis(200), || {
            black_box(members[owner].poll(1).expect("poll"));
        });
        let other = (owner + 1) % MEMBERS;
        let idle_other = per_call(20, Duration::from_millis(200), || {
            black_box(members[other].poll(1).expect("poll"));
        });
        let mut reader = topic.reader(StartAt::Latest).expect("reader");
        let idle_reader = per_call(20, Duration::from_millis(200), || {
            black_box(reader.poll(1).expect("poll"));
        });
        let base = per_call(20, Duration::from_millis(200), || {
            let p = topic.active_partitions()[0];
            black_box(topic.partition(p).expect("partition").end_offset());
        });
        idle_rows.push((n, idle_owner, idle_other, idle_reader, base));
        let m = &mut members[owner];
        let lat_member = e2e(&topic, samples, || {
            m.poll_wait(10, Duration::from_secs(5))
                .expect("poll_wait")
                .len()
        });
        while !reader.poll(4096).expect("poll").is_empty() {}
        let lat_reader = e2e(&topic, samples, || {
            reader
                .poll_wait(10, Duration::from_secs(5))
                .expect("poll_wait")
                .len()
        });
        e2e_rows.push((n, lat_member, lat_reader));
        for m in members {
            m.leave().expect("leave");
        }
    }
    table_header("1. idle poll(1) of a caught-up group member, 8 members (polls/s)");
    for (n, owner, other, reader, base) in &idle_rows {
        row_rate(
            &format!("{n} nodes: owner vs end lookup"),
            "poll",
            1.0,
            owner,
            base,
        );
        row_rate(
            &format!("{n} nodes: member owning nothing vs end"),
            "poll",
            1.0,
            other,
            base,
        );
        row_rate(
            &format!("{n} nodes: plain Reader vs end lookup"),
            "poll",
            1.0,
            reader,
            base,
        );
    }
    table_header("2. append to poll_wait return (owner member vs Reader)");
    for (n, m, r) in &e2e_rows {
        row_value(
            &format!("{n} nodes: member median / p99"),
            format!("{} / {}", us(percentile(m, 50.0)), us(percentile(m, 99.0))),
        );
        row_value(
            &format!("{n} nodes: reader median / p99"),
            format!("{} / {}", us(percentile(r, 50.0)), us(percentile(r, 99.0))),
        );
    }
    let widths: Vec<u32> = match std::env::var("GROUPS_WIDE") {
        Ok(list) if bench => list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect(),
        _ if bench => vec![100, 1_000],
        _ => vec![10],
    };
    let wide_rows: Vec<WideRow> = widths.iter().map(|&n| wide(&log, n)).collect();
    table_header("3. N active partitions, one member owning all, a Reader (polls/s)");
    for (n, idle_m, idle_r, one_m, one_r, base, spread) in &wide_rows {
        row_rate(
            &format!("{n} active: idle member vs end"),
            "poll",
            1.0,
            idle_m,
            base,
        );
        row_rate(
            &format!("{n} active: idle Reader vs end"),
            "poll",
            1.0,
            idle_r,
            base,
        );
        row_rate(
            &format!("{n} active: member, one append vs end"),
            "poll",
            1.0,
            one_m,
            base,
        );
        row_rate(
            &format!("{n} active: Reader, one append vs end"),
            "poll",
            1.0,
            one_r,
            base,
        );
        let wall: Vec<Duration> = spread.iter().map(|x| x.0).collect();
        let cpu: Vec<Duration> = spread.iter().map(|x| x.1).collect();
        let slowest = wall.iter().max().copied().unwrap_or_default();
        row_value(
            &format!("{n} active: idle member p50/p99.9/max"),
            format!(
                "{} / {} / {}",
                us(percentile(&wall, 50.0)),
                us(percentile(&wall, 99.9)),
                us(slowest)
            ),
        );
        let slow = |v: &[Duration]| {
            v.iter()
                .filter(|d| **d >= Duration::from_micros(100))
                .count()
        };
        row_value(
            &format!("{n} active: idle polls >= 100 us, of"),
            format!("{} of {}", slow(&wall), spread.len()),
        );
        row_value(
            &format!("{n} active: idle polls >= 100 us CPU, max"),
            format!(
                "{} / {}",
                slow(&cpu),
                us(cpu.iter().max().copied().unwrap_or_default())
            ),
        );
    }
    drop(topic);
    log.abandon();
    remove_dir(&dir);
}
