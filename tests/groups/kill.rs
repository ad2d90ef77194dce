//! Committed group positions under SIGKILL: a child process polls and
//! commits in a loop (with manifest compaction every few commits) and
//! prints every acknowledged commit; the parent kills it at a seeded
//! moment, reopens, and checks that the group resumes exactly: at the last
//! acknowledged commit or the one in flight, never behind, never past what
//! was polled, and every record after it is delivered.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use fissionlog::{GroupOptions, Log, LogOptions, MemberOptions, SyncPolicy, TopicConfig};

const CHILD_ENV: &str = "FISSIONLOG_GROUP_KILL_CHILD_DIR";
const RECORDS: u64 = 20_000;

fn log_options() -> LogOptions {
    LogOptions {
        balancer: false,
        manifest_compact_records: 7,
        ..LogOptions::default()
    }
}

fn member() -> MemberOptions {
    MemberOptions {
        background_heartbeat: None,
        ..MemberOptions::default()
    }
}

#[test]
#[ignore = "child process of committed_positions_survive_sigkill"]
fn group_kill_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let log = Log::open(&dir, log_options()).unwrap();
    let t = log.topic("t").unwrap();
    let g = t.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member()).unwrap();
    println!("READY");
    let mut polled: BTreeMap<u32, u64> = BTreeMap::new();
    for i in 0u64.. {
        let got = m.poll(1 + (i * 37 % 200) as usize).unwrap();
        for r in &got {
            polled.insert(r.partition, r.offset + 1);
        }
        // What may be committed next is at most what was polled.
        let line: Vec<String> = polled.iter().map(|(p, o)| format!("{p}={o}")).collect();
        println!("POLLED {}", line.join(","));
        m.commit().unwrap();
        let c = g.committed();
        let line: Vec<String> = c
            .positions
            .iter()
            .map(|(p, o)| format!("{p}={o}"))
            .collect();
        println!("COMMITTED {}", line.join(","));
        if got.is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn parse(line: &str) -> BTreeMap<u32, u64> {
    line.split(',')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.parse().unwrap(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn committed_positions_survive_sigkill() {
    let root = tempfile::tempdir().unwrap();
    for seed in 1..=3u64 {
        let dir = root.path().join(format!("s{seed}"));
        {
            let log = Log::open(&dir, log_options()).unwrap();
            let t = log
                .topic_or_create(
                    "t",
                    TopicConfig {
                        partitions: 3,
                        segment_bytes: 1 << 20,
                        sync: SyncPolicy::Never,
                        ..TopicConfig::default()
                    },
                )
                .unwrap();
            for i in 0..RECORDS {
                t.append(Some(format!("k{}", i % 31).as_bytes()), &i.to_le_bytes())
                    .unwrap();
            }
            log.close().unwrap();
        }
        let mut child = crate::common::log::rerun_command(module_path!(), "group_kill_child")
            .env(CHILD_ENV, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let kill_after = 5 + (seed * 7919) % 40;
        let started = Instant::now();
        let mut acked = BTreeMap::new();
        let mut polled = BTreeMap::new();
        let mut n = 0;
        // Read to the end: what the child printed before the kill landed
        // (still in the pipe) counts as acknowledged too.
        for line in out.lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.strip_prefix("POLLED ") {
                polled = parse(rest);
            } else if let Some(rest) = line.strip_prefix("COMMITTED ") {
                acked = parse(rest);
                n += 1;
                if n == kill_after {
                    child.kill().unwrap();
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "child too slow"
            );
        }
        let status = child.wait().unwrap();
        assert!(!status.success(), "seed {seed}: child ended on its own");
        assert!(!acked.is_empty(), "seed {seed}: no commit acknowledged");

        let log = Log::open(&dir, log_options()).unwrap();
        let t = log.topic("t").unwrap();
        let g = t.group("g", GroupOptions::default()).unwrap();
        let c = g.committed().positions;
        for (p, &o) in &acked {
            let now = c.get(p).copied().unwrap_or(0);
            assert!(
                now >= o,
                "seed {seed}: partition {p} committed {now} behind acked {o}"
            );
            let max = polled.get(p).copied().unwrap_or(0).max(o);
            assert!(
                now <= max,
                "seed {seed}: partition {p} committed {now} past polled {max}"
            );
        }
        // Resume: exactly from the committed positions, to the end.
        let mut m = g.join(member()).unwrap();
        let mut first: BTreeMap<u32, u64> = BTreeMap::new();
        let mut count = 0u64;
        loop {
            let got = m.poll(1000).unwrap();
            if got.is_empty() {
                break;
            }
            for r in &got {
                first.entry(r.partition).or_insert(r.offset);
                count += 1;
            }
        }
        for (p, &o) in &first {
            assert_eq!(
                o,
                c.get(p).copied().unwrap_or(0),
                "seed {seed}: partition {p}"
            );
        }
        let below: u64 = c.values().sum();
        assert_eq!(below + count, RECORDS, "seed {seed}");
        drop(m);
        log.close().unwrap();
    }
}
