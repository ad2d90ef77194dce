//! Helpers of the tail-split test suites: one partition, no balancer, and
//! records numbered by their value (`i`, or `i:...`).

use std::collections::BTreeMap;

use fissionlog::{LogOptions, OwnedRecord, Reader, StartAt, SyncPolicy, Topic, TopicConfig};

/// No balancer, no background retention.
pub fn options() -> LogOptions {
    LogOptions {
        topic_hash_seed: Some(super::log::HASH_SEED),
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    }
}

/// One partition of 64 KiB segments, synced by the tests themselves.
pub fn config() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 64 * 1024,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    }
}

/// Appends records `from..from + n`, one per call (one batch each), with
/// keys `k{i % keys}` and values `i`; every fifth record is keyless.
pub fn append(topic: &Topic, from: u64, n: u64, keys: u64) {
    for i in from..from + n {
        let key = format!("k{}", i % keys);
        let key = (i % 5 != 4).then_some(key.as_bytes());
        topic.append(key, i.to_string().as_bytes()).unwrap();
    }
}

/// As [`append`], with values padded to about 1 KiB (`i:xxx...`).
pub fn append_big(topic: &Topic, from: u64, n: u64, keys: u64) {
    let pad = "x".repeat(1000);
    for i in from..from + n {
        let key = format!("k{}", i % keys);
        let key = (i % 5 != 4).then_some(key.as_bytes());
        topic.append(key, format!("{i}:{pad}").as_bytes()).unwrap();
    }
}

/// Every record of `want` exactly once, and each key's records in append
/// order.
pub fn check_exactly_once(seen: &[OwnedRecord], want: std::ops::Range<u64>, ctx: &str) {
    let mut per_key: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for r in seen {
        if let Some(k) = &r.key {
            let s = seq(r);
            if let Some(&last) = per_key.get(k) {
                assert!(s > last, "{ctx}: key {k:?}: {s} after {last}");
            }
            per_key.insert(k.clone(), s);
        }
    }
    let mut all: Vec<u64> = seen.iter().map(seq).collect();
    all.sort_unstable();
    let want: Vec<u64> = want.collect();
    assert_eq!(all.len(), want.len(), "{ctx}: count");
    assert_eq!(all, want, "{ctx}: every record exactly once");
}

/// The number a record's value starts with.
pub fn seq(r: &OwnedRecord) -> u64 {
    let v = std::str::from_utf8(&r.value).unwrap();
    v.split(':').next().unwrap().parse().unwrap()
}

/// Polls `r` until it has nothing more, into `out`.
pub fn drain(r: &mut Reader, out: &mut Vec<OwnedRecord>) {
    loop {
        let got = r.poll(97).unwrap();
        if got.is_empty() {
            return;
        }
        out.extend(got);
    }
}

/// Every record of the topic, read from the earliest.
pub fn read_all(topic: &Topic) -> Vec<OwnedRecord> {
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    let mut out = Vec::new();
    drain(&mut r, &mut out);
    out
}

/// Rounds of the tail-split churn (`FISSIONLOG_TAIL_LATEST_ROUNDS`, else
/// `default`).
pub fn churn_rounds(default: u32) -> u32 {
    std::env::var("FISSIONLOG_TAIL_LATEST_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A writer thread beside which readers are made and read: for `rounds`
/// rounds it appends 20 records of key `k` (values 0, 1, 2, ... as text),
/// then tail-splits the key's partition `back` records from its end and
/// merges the two children back. `started` counts appends that began and
/// `appended` appends that returned: a record is visible once its append
/// began and certainly once it returned.
pub struct SplitChurn {
    pub started: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub appended: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    writer: std::thread::JoinHandle<()>,
}

impl SplitChurn {
    pub fn start(topic: &Topic, rounds: u32, back: u64) -> SplitChurn {
        use fissionlog::{SplitPlan, TailSplitOptions};
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let started = Arc::new(AtomicU64::new(0));
        let appended = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (topic, started, appended, stop) = (
                topic.clone(),
                started.clone(),
                appended.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    let n = appended.load(Ordering::SeqCst);
                    for i in n..n + 20 {
                        started.store(i + 1, Ordering::SeqCst);
                        topic.append(Some(b"k"), i.to_string().as_bytes()).unwrap();
                        appended.store(i + 1, Ordering::SeqCst);
                    }
                    let p = topic.route(b"k");
                    let end = topic.partition(p).unwrap().end_offset();
                    let out = topic
                        .split_tail(
                            p,
                            SplitPlan::Even,
                            TailSplitOptions::from_offset(end - back),
                        )
                        .unwrap();
                    topic.merge(out.children[0], out.children[1]).unwrap();
                }
                stop.store(true, Ordering::SeqCst);
            })
        };
        SplitChurn {
            started,
            appended,
            stop,
            writer,
        }
    }

    /// Appends that returned so far.
    pub fn appended(&self) -> u64 {
        self.appended.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Appends that began so far.
    pub fn started(&self) -> u64 {
        self.started.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether the writer is still going.
    pub fn running(&self) -> bool {
        !self.stop.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits for the writer; its panic fails the test.
    pub fn join(self) {
        self.writer.join().unwrap();
    }
}
