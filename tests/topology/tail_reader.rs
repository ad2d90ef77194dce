//! A lineage-aware reader following the tail of a topic while the writer
//! rolls segments, splits and merges partitions, and retention deletes old
//! segments. The reader must never see a gap, a
//! duplicate or a key out of order, except for ranges retention removed,
//! which it reports.

use crate::common::log::no_balancer;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fissionlog::{Log, SplitPlan, StartAt, SyncPolicy, TopicConfig};

const KEYS: u64 = 16;

fn key(i: u64) -> Vec<u8> {
    format!("key-{}", i % KEYS).into_bytes()
}

/// Value of the `n`-th record of key `k`: (k, n) little-endian.
fn value(k: u64, n: u64) -> Vec<u8> {
    let mut v = k.to_le_bytes().to_vec();
    v.extend_from_slice(&n.to_le_bytes());
    v.resize(300, 7);
    v
}

fn decode(v: &[u8]) -> (u64, u64) {
    (
        u64::from_le_bytes(v[0..8].try_into().unwrap()),
        u64::from_le_bytes(v[8..16].try_into().unwrap()),
    )
}

/// Appends `total` records over `KEYS` keys while splitting and merging,
/// with a tail reader checking every key's sequence as it goes.
fn run(total: u64, sync: SyncPolicy, retention: Option<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                segment_bytes: 16 << 10,
                sync,
                retention_bytes: retention,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let reader_topic = topic.clone();
    let reader_done = done.clone();
    let reader = std::thread::spawn(move || {
        let mut r = reader_topic.reader(StartAt::Earliest).unwrap();
        let mut next: HashMap<u64, u64> = HashMap::new();
        let mut seen = 0u64;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let batch = r.poll_wait(500, Duration::from_millis(20)).unwrap();
            let finished = batch.is_empty() && reader_done.load(Ordering::SeqCst);
            for rec in batch {
                let (k, n) = decode(&rec.value);
                assert_eq!(rec.key.as_deref(), Some(key(k).as_slice()));
                let want = next.entry(k).or_insert(0);
                if retention.is_none() {
                    assert_eq!(
                        n, *want,
                        "key {k}: got record {n}, expected {} (partition {} offset {})",
                        *want, rec.partition, rec.offset
                    );
                } else {
                    // Retention may remove records the reader had not read
                    // yet (reported below); order and uniqueness still hold.
                    assert!(n >= *want, "key {k}: record {n} after {}", *want);
                }
                *want = n + 1;
                seen += 1;
            }
            if finished {
                // One more poll after the writer stopped: nothing left.
                if r.poll(500).unwrap().is_empty() {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "reader stalled at {seen}");
        }
        (seen, next, r.retained().to_vec())
    });
    let mut counts = vec![0u64; KEYS as usize];
    let (mut splits, mut merges, mut retired) = (0, 0, 0);
    for i in 0..total {
        let k = i % KEYS;
        let kb = key(i);
        let v = value(k, counts[k as usize]);
        counts[k as usize] += 1;
        topic
            .append(Some(&kb), &v)
            .map(|_| ())
            .or_else(|e| {
                // A split racing the append seals the target: append again.
                if matches!(e, fissionlog::Error::Sealed { .. }) {
                    topic.append(Some(&kb), &v).map(|_| ())
                } else {
                    Err(e)
                }
            })
            .unwrap();
        if i % 700 == 350 {
            let active = topic.active_partitions();
            splits += usize::from(
                topic
                    .split(active[i as usize % active.len()], SplitPlan::Even)
                    .is_ok(),
            );
        }
        if i % 1500 == 1400 {
            let active = topic.active_partitions();
            if active.len() > 2 {
                // Adjacent partitions in hash order may merge.
                let infos = topic.partitions();
                let mut ranges: Vec<(u64, u32)> = infos
                    .iter()
                    .filter(|p| active.contains(&p.id))
                    .map(|p| (p.start, p.id))
                    .collect();
                ranges.sort();
                merges += usize::from(topic.merge(ranges[0].1, ranges[1].1).is_ok());
            }
        }
        if retention.is_some() && i % 500 == 0 {
            retired += log.enforce_retention().unwrap();
        }
    }
    log.sync().unwrap();
    done.store(true, Ordering::SeqCst);
    // The run exercised what it is about.
    assert!(
        splits >= 3 && merges >= 1,
        "splits {splits}, merges {merges}"
    );
    assert!(
        retention.is_none() || retired > 0,
        "retention removed nothing"
    );
    let (seen, next, retained) = reader.join().unwrap();
    if retention.is_none() {
        assert_eq!(seen, total, "the reader saw every record once");
        for k in 0..KEYS {
            assert_eq!(next.get(&k).copied().unwrap_or(0), counts[k as usize]);
        }
        assert!(retained.is_empty());
    } else {
        // Every key's last record arrives (retention never takes the tail).
        for k in 0..KEYS {
            assert_eq!(next.get(&k).copied().unwrap_or(0), counts[k as usize]);
        }
        if seen < total {
            assert!(
                !retained.is_empty(),
                "{} records missed without a retention report",
                total - seen
            );
        }
    }
    drop(topic);
    log.close().unwrap();
}

#[test]
fn tail_reader_through_rolls_splits_and_merges_sees_every_record_in_key_order() {
    run(6_000, SyncPolicy::Never, None);
}

#[test]
fn durable_tail_reader_through_rolls_splits_and_merges() {
    run(3_000, SyncPolicy::Always, None);
}

#[test]
fn tail_reader_under_retention_reports_what_it_missed() {
    run(6_000, SyncPolicy::Never, Some(64 << 10));
}
