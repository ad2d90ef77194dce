//! C1 under concurrent durable writers: a sync round captures where each
//! partition's data ends without the writer lock (appends go on while it
//! captures), so the capture must still never miss an append that
//! finished before the round began. Here many threads append with
//! `SyncPolicy::Always` into small segments (a roll every few batches,
//! large and small batches, so both the mapping and the `pwrite` paths
//! publish), while another thread calls `Log::sync` over and over so that
//! rounds start at every point of an append. Every append must return
//! only once the partition's durable end covers it, and after a close and
//! reopen every record must be there once, in order.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fissionlog::{Log, LogOptions, NewRecord, SyncPolicy, TopicConfig};

const THREADS: u64 = 6;
const APPENDS_PER_THREAD: u64 = 150;

/// Value of the `i`-th append of thread `t`, `n` records of which this is
/// record `k`: the bytes say who wrote it.
fn value(t: u64, i: u64, k: u64, len: usize) -> Vec<u8> {
    let mut v = vec![(t * 31 + i + k) as u8; len];
    v[..8].copy_from_slice(&(t << 48 | i << 16 | k).to_le_bytes());
    v
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[test]
fn every_durable_append_is_covered_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || LogOptions {
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    };
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                segment_bytes: 96 * 1024,
                sync: SyncPolicy::Always,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let stop = AtomicBool::new(false);
    let appended = AtomicU64::new(0);
    std::thread::scope(|s| {
        // Stops the syncing thread however this closure ends (a writer's
        // failure too), so a failure cannot turn into a hang.
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                log.sync().unwrap();
            }
        });
        let writers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (topic, appended) = (&topic, &appended);
                s.spawn(move || {
                    for i in 0..APPENDS_PER_THREAD {
                        // 1, 3 or 20 records of 1 KiB: below and above the
                        // size from which batches are written with pwrite.
                        let n = [1u64, 3, 20][((t + i) % 3) as usize];
                        let vals: Vec<Vec<u8>> = (0..n).map(|k| value(t, i, k, 1024)).collect();
                        let recs: Vec<NewRecord<'_>> = vals
                            .iter()
                            .map(|v| NewRecord {
                                key: None,
                                value: v,
                                timestamp: None,
                            })
                            .collect();
                        let pid = ((t + i) % 2) as u32;
                        let base = topic.append_to(pid, &recs).unwrap();
                        let durable = topic.partition(pid).unwrap().durable_end_offset();
                        assert!(
                            durable >= base + n,
                            "thread {t} append {i}: records {base}..{} returned durable \
                             with the durable end at {durable}",
                            base + n
                        );
                        appended.fetch_add(n, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
    });
    let total = appended.load(Ordering::Relaxed);
    let segments: usize = (0..2)
        .map(|p| topic.partition(p).unwrap().segment_count())
        .sum();
    assert!(segments > 10, "only {segments} segments: too few rolls");
    drop(topic);
    log.close().unwrap();

    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.topic("t").unwrap();
    let mut seen = std::collections::HashSet::new();
    for pid in 0..2u32 {
        // Each thread's records in this partition come in its append order.
        let mut last: Vec<Option<(u64, u64)>> = vec![None; THREADS as usize];
        let mut off = 0;
        while off < topic.partition(pid).unwrap().end_offset() {
            let rb = topic.read(pid, off, 1 << 20).unwrap();
            for r in rb.iter() {
                let tag = u64::from_le_bytes(r.value[..8].try_into().unwrap());
                let (t, i, k) = (tag >> 48, (tag >> 16) & 0xffff_ffff, tag & 0xffff);
                assert_eq!(
                    r.value,
                    value(t, i, k, 1024).as_slice(),
                    "record {} torn",
                    r.offset
                );
                let prev = last[t as usize].replace((i, k));
                assert!(
                    prev < Some((i, k)),
                    "thread {t}: {:?} after {prev:?}",
                    (i, k)
                );
                assert!(seen.insert((t, i, k)), "thread {t}: record {i}/{k} twice");
            }
            off = rb.next_offset();
        }
    }
    let seen = seen.len() as u64;
    assert_eq!(seen, total, "records after reopen");
}
