//! A hot partition split while it runs, with per-key order kept through the
//! split. A topic of 2 partitions gets a skewed load: nine records in ten
//! go to keys that live in partition 0. The background balancer sees
//! partition 0 run above its target and splits it where its load is; the
//! producer keeps appending throughout, so each hot key has records in the
//! parent before the split and in a child after it. An order-keeping
//! reader then reads the whole topic (a parent is drained before its
//! children) and the example checks that every key's records come back
//! complete and in append order.
//!
//! ```sh
//! cargo run --example hot_partition
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fissionlog::{
    BalancePolicy, Log, LogOptions, NewRecord, StartAt, Topic, TopicConfig, TopologyEvent,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Records per second per partition the balancer aims for.
const TARGET_RECORDS_PER_SEC: f64 = 2_000.0;

/// `n` keys that the topic routes to `partition` today.
fn keys_routed_to(topic: &Topic, partition: u32, n: usize, tag: &str) -> Vec<Vec<u8>> {
    (0u64..)
        .map(|i| format!("{tag}-{i}").into_bytes())
        .filter(|k| topic.route(k) == partition)
        .take(n)
        .collect()
}

/// A record's value: its key's index in `keys` and its sequence number
/// within that key.
fn encode(key: usize, seq: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&(key as u64).to_le_bytes());
    v[8..].copy_from_slice(&seq.to_le_bytes());
    v
}

fn decode(value: &[u8]) -> Result<(usize, u64), BoxError> {
    let key = <[u8; 8]>::try_from(value.get(..8).ok_or("value too short")?)?;
    let seq = <[u8; 8]>::try_from(value.get(8..16).ok_or("value too short")?)?;
    Ok((
        usize::try_from(u64::from_le_bytes(key))?,
        u64::from_le_bytes(seq),
    ))
}

fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    // The background balancer (on by default) applies each topic's policy.
    let log = Log::open(dir.path(), LogOptions::default())?;
    let events = log.subscribe();
    let topic = log.create_topic(
        "orders",
        TopicConfig {
            partitions: 2,
            balance: BalancePolicy {
                target_records_per_sec: Some(TARGET_RECORDS_PER_SEC),
                // Short enough for an example; a broker keeps the default
                // (10 s) so a partition is not changed again right away.
                min_age: Duration::from_secs(1),
                check_interval: Duration::from_millis(100),
                max_partitions: 8,
                ..BalancePolicy::default()
            },
            ..TopicConfig::default()
        },
    )?;

    // 64 hot keys in partition 0, 64 cooler ones in partition 1: no single
    // key carries most of the load, so the balancer splits the range
    // instead of isolating one key.
    let mut keys = keys_routed_to(&topic, 0, 64, "hot");
    keys.extend(keys_routed_to(&topic, 1, 64, "cool"));
    let hot = 0..64;

    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let (appended, split) = std::thread::scope(|s| -> Result<_, BoxError> {
        let producer = s.spawn(|| -> fissionlog::Result<Vec<u64>> {
            let mut seq = vec![0u64; keys.len()];
            let mut i = 0usize;
            while !stop.load(Ordering::Acquire) {
                // 100 records every 10 ms, about 10,000 records/s: 9,000/s
                // for partition 0 (4.5 × its target), 1,000/s for partition 1.
                let mut values = Vec::with_capacity(100);
                for _ in 0..100 {
                    let k = if i % 10 == 9 { 64 + i % 64 } else { i % 64 };
                    values.push((k, encode(k, seq[k])));
                    seq[k] += 1;
                    i += 1;
                }
                let batch: Vec<NewRecord<'_>> = values
                    .iter()
                    .map(|(k, v)| NewRecord {
                        key: Some(&keys[*k]),
                        value: v,
                        timestamp: None,
                    })
                    .collect();
                topic.append_batch(&batch)?;
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(seq)
        });

        // Wait for the balancer to split partition 0.
        let deadline = started + Duration::from_secs(30);
        let split = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match events.recv_timeout(left) {
                Ok(TopologyEvent::Split {
                    parent: 0,
                    seal_offset,
                    children,
                    ..
                }) => break Ok((seal_offset, children)),
                Ok(_) => continue,
                Err(_) => break Err("partition 0 was not split within 30 s"),
            }
        };
        // Keep producing a little, into the children.
        if split.is_ok() {
            std::thread::sleep(Duration::from_millis(500));
        }
        stop.store(true, Ordering::Release);
        let appended = producer
            .join()
            .map_err(|_| "the producer thread panicked")??;
        Ok((appended, split?))
    })?;
    let (seal_offset, children) = split;
    println!(
        "after {:.1?}: partition 0 sealed at offset {seal_offset}, split into {children:?}",
        started.elapsed()
    );

    // Each hot key now has a chain: the parent up to its seal offset, then
    // the child that took over its hash.
    let chain = topic.key_chain(&keys[hot.start]);
    println!(
        "key {:?} lives in partitions {:?}",
        String::from_utf8_lossy(&keys[hot.start]),
        chain.iter().map(|l| l.partition).collect::<Vec<_>>()
    );
    assert!(chain.len() >= 2, "a hot key's chain shows no split");

    // Read everything back in lineage order and check each key.
    let total: u64 = appended.iter().sum();
    let mut reader = topic.reader(StartAt::Earliest)?;
    let mut next = vec![0u64; keys.len()];
    let mut read = 0u64;
    let mut in_children = 0u64;
    while read < total {
        let batch = reader.poll_wait(10_000, Duration::from_millis(500))?;
        if batch.is_empty() {
            return Err(format!("the reader stopped at {read} of {total} records").into());
        }
        for record in batch {
            let (k, seq) = decode(&record.value)?;
            assert_eq!(
                seq, next[k],
                "key {k}: record {seq} arrived where {} was due",
                next[k]
            );
            next[k] += 1;
            read += 1;
            if hot.contains(&k) && children.contains(&record.partition) {
                in_children += 1;
            }
        }
    }
    assert_eq!(next, appended, "every key's records came back");
    assert!(
        in_children > 0,
        "no hot record was appended after the split"
    );
    println!(
        "read {read} records of {} keys in append order per key; \
         {in_children} hot records were appended to the children after the split",
        keys.len()
    );
    drop(topic);
    log.close()?;
    Ok(())
}
