//! C1 under SIGKILL: a child process appends with `SyncPolicy::Always`
//! from two threads and prints every acknowledged record; the parent kills
//! it at a seeded random moment, reopens, and checks every acknowledged
//! record byte for byte.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use fissionlog::{Log, LogOptions, SyncPolicy, TopicConfig};

const CHILD_ENV: &str = "FISSIONLOG_KILL_CHILD_DIR";

fn value(thread: u64, i: u64) -> Vec<u8> {
    let len = ((thread * 1000 + i) * 2654435761 % 400) as usize + 8;
    let mut v = format!("{thread}:{i}:").into_bytes();
    v.resize(len, (i % 251) as u8);
    v
}

fn hash(v: &[u8]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
#[ignore = "child process of acknowledged_records_survive_sigkill"]
fn kill_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let log = Log::open(
        &dir,
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )
    .unwrap();
    let t = log
        .topic_or_create(
            "t",
            TopicConfig {
                partitions: 2,
                segment_bytes: 16384,
                sync: SyncPolicy::Always,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    println!("READY");
    std::thread::scope(|s| {
        for th in 0..2u64 {
            let t = t.clone();
            s.spawn(move || {
                for i in 0.. {
                    let v = value(th, i);
                    let key = format!("k{}", i % 5);
                    let a = t.append(Some(key.as_bytes()), &v).unwrap();
                    println!("ACK {} {} {} {}", a.partition, a.offset, v.len(), hash(&v));
                }
            });
        }
    });
}

#[test]
fn acknowledged_records_survive_sigkill() {
    let root = tempfile::tempdir().unwrap();
    for seed in 1..=4u64 {
        let dir = root.path().join(format!("s{seed}"));
        let mut acked = Vec::new();
        for round in 0..2u64 {
            let mut child = crate::common::log::rerun_command(module_path!(), "kill_child")
                .env(CHILD_ENV, &dir)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let out = BufReader::new(child.stdout.take().unwrap());
            // Kill after a seeded number of acknowledgements.
            let kill_after = 50 + (seed * 7919 + round * 104_729) % 400;
            let started = Instant::now();
            let mut n = 0;
            for line in out.lines() {
                let line = line.unwrap();
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.first() == Some(&"ACK") {
                    let nums: Vec<u64> = f[1..].iter().map(|x| x.parse().unwrap()).collect();
                    acked.push((nums[0] as u32, nums[1], nums[2], nums[3]));
                    n += 1;
                    if n == kill_after {
                        child.kill().unwrap();
                        break;
                    }
                }
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "child too slow"
                );
            }
            let status = child.wait().unwrap();
            assert!(!status.success(), "seed {seed}: child ended on its own");
            let log = Log::open(&dir, LogOptions::default()).unwrap();
            let t = log.topic("t").unwrap();
            for &(p, off, len, h) in &acked {
                let b = t
                    .read(p, off, 1)
                    .unwrap_or_else(|e| panic!("seed {seed}: acked {p}/{off} lost: {e}"));
                let r = b.iter().next().unwrap();
                assert_eq!(r.offset, off);
                assert_eq!(
                    (r.value.len() as u64, hash(r.value)),
                    (len, h),
                    "seed {seed}: acked record {p}/{off} differs"
                );
            }
            assert!(!log.recovery_report().clean_shutdown);
            log.close().unwrap();
        }
    }
}
