//! Helpers of the tail-split test suites: one partition, no balancer, and
//! records numbered by their value (`i`, or `i:...`).

use std::collections::BTreeMap;

use fissionlog::{LogOptions, OwnedRecord, Reader, StartAt, SyncPolicy, Topic, TopicConfig};

/// No balancer, no background retention.
pub fn options() -> LogOptions {
    LogOptions {
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
