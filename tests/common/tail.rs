//! Helpers of the tail-split test suites: one partition, no balancer, and
//! records numbered by their value (`i`, or `i:...`).

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
