//! Per-key order when splits land while multi-record batches are routed.
//!
//! Regression: `append_batch` used to route records one at a time, so a
//! split installed mid-batch could send a key's first record to the parent
//! and its second to a child; the parent's group was refused as sealed and
//! retried after the child's group had been appended: order broken. The
//! window is the instant a split installs its children, so this is a
//! stress test that fails only when that interleaving happens; the bug was
//! seen once as an order violation in a CI run of `simulate` and this test
//! did not reproduce it locally.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use fissionlog::{Log, LogOptions, NewRecord, SplitPlan, StartAt, TopicConfig};

#[test]
fn batches_keep_per_key_order_across_concurrent_splits() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(
        dir.path(),
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )
    .unwrap();
    let mut config = TopicConfig {
        partitions: 1,
        segment_bytes: 1 << 20,
        ..TopicConfig::default()
    };
    config.balance.max_partitions = 4096;
    let topic = log.create_topic("race", config).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // The producers are appending before the first split, and the splits
    // go on until each producer has appended `MIN_BATCHES` batches while
    // they ran: every run routes batches across splits, however late the
    // threads were scheduled.
    const PRODUCERS: usize = 2;
    const MIN_SPLITS: u32 = 120;
    const MAX_SPLITS: u32 = 1000;
    const MIN_BATCHES: u64 = 200;
    let start = Arc::new(Barrier::new(PRODUCERS + 1));
    let batches: Arc<[AtomicU64; PRODUCERS]> = Arc::default();
    let keys: Vec<String> = (0..64).map(|k| format!("key-{k}")).collect();
    let producers: Vec<_> = (0..PRODUCERS as u8)
        .map(|p| {
            let (topic, stop, keys) = (topic.clone(), stop.clone(), keys.clone());
            let (start, batches) = (start.clone(), batches.clone());
            std::thread::spawn(move || {
                let mut seq: HashMap<usize, u64> = HashMap::new();
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    // Each batch carries two consecutive records of every key.
                    let mut values = Vec::new();
                    for k in 0..keys.len() {
                        for _ in 0..2 {
                            let s = seq.entry(k).or_insert(0);
                            values.push((k, [p, (*s >> 8) as u8, *s as u8, (*s >> 16) as u8]));
                            *s += 1;
                        }
                    }
                    let recs: Vec<NewRecord<'_>> = values
                        .iter()
                        .map(|(k, v)| NewRecord {
                            key: Some(keys[*k].as_bytes()),
                            value: v,
                            timestamp: None,
                        })
                        .collect();
                    topic.append_batch(&recs).unwrap();
                    batches[usize::from(p)].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    start.wait();
    // Keep splitting the active partitions while the producers run.
    let enough = |splits: u32| {
        splits >= MIN_SPLITS
            && batches
                .iter()
                .all(|b| b.load(Ordering::Relaxed) >= MIN_BATCHES)
    };
    let mut splits = 0;
    'split: while !enough(splits) {
        for id in topic.active_partitions() {
            if enough(splits) {
                break 'split;
            }
            assert!(
                splits < MAX_SPLITS,
                "{splits} splits and the producers appended {:?} batches",
                batches
                    .iter()
                    .map(|b| b.load(Ordering::Relaxed))
                    .collect::<Vec<_>>()
            );
            let info = topic.partitions().into_iter().find(|p| p.id == id).unwrap();
            if info.start < info.end && topic.split(id, SplitPlan::Even).is_ok() {
                splits += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.join().unwrap();
    }
    let mut reader = topic.reader(StartAt::Earliest).unwrap();
    let mut last: HashMap<(u8, Vec<u8>), u64> = HashMap::new();
    let mut total = 0u64;
    loop {
        let got = reader.poll(10_000).unwrap();
        if got.is_empty() {
            break;
        }
        for r in got {
            let v = &r.value;
            let s = u64::from(v[1]) << 8 | u64::from(v[2]) | u64::from(v[3]) << 16;
            let key = (v[0], r.key.clone().unwrap());
            if let Some(prev) = last.insert(key.clone(), s) {
                assert!(
                    s == prev + 1,
                    "key {key:?}: record {s} came after {prev} ({splits} splits)"
                );
            }
            total += 1;
        }
    }
    assert!(total >= PRODUCERS as u64 * MIN_BATCHES * 128);
}
