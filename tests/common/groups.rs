//! Shared pieces of the consumer-group tests: a log on a `ManualClock`,
//! members that heartbeat by hand, records whose values carry their
//! sequence number.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fissionlog::{
    Log, LogOptions, ManualClock, Member, MemberOptions, OwnedRecord, SyncPolicy, Topic,
    TopicConfig,
};

/// Session timeout of the members.
pub const SESSION: Duration = Duration::from_secs(10);
/// Processing timeout of the members.
pub const PROCESSING: Duration = Duration::from_secs(30);

/// The simulated clock, no background balancer or retention.
pub fn options(clock: &Arc<ManualClock>) -> LogOptions {
    LogOptions {
        clock: clock.clone(),
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    }
}

pub fn config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: 1 << 20,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    }
}

pub fn member_opts() -> MemberOptions {
    MemberOptions {
        session_timeout: SESSION,
        processing_timeout: PROCESSING,
        instance_id: None,
        background_heartbeat: None,
    }
}

pub fn static_opts(id: &str) -> MemberOptions {
    MemberOptions {
        instance_id: Some(id.to_string()),
        ..member_opts()
    }
}

/// Appends `n` records with keys `k0..k{keys}` and values `key:seq`.
pub fn append(topic: &Topic, keys: u32, from: u64, n: u64) {
    for i in from..from + n {
        let key = format!("k{}", i % u64::from(keys));
        topic
            .append(Some(key.as_bytes()), format!("{key}:{i}").as_bytes())
            .unwrap();
    }
}

/// Appends `n` records without keys, spread round-robin (every partition
/// gets its share whatever the topic's random hash key), values `r:seq`.
pub fn append_rr(topic: &Topic, from: u64, n: u64) {
    for i in from..from + n {
        topic.append(None, format!("r:{i}").as_bytes()).unwrap();
    }
}

pub fn seq(r: &OwnedRecord) -> u64 {
    let v = std::str::from_utf8(&r.value).unwrap();
    v.split(':').nth(1).unwrap().parse().unwrap()
}

pub fn seqs(records: &[OwnedRecord]) -> BTreeSet<u64> {
    records.iter().map(seq).collect()
}

/// Polls until a poll returns nothing.
pub fn drain(m: &mut Member) -> Vec<OwnedRecord> {
    let mut out = Vec::new();
    loop {
        let got = m.poll(1000).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend(got);
    }
}

/// Per key, the sequence numbers must rise.
pub fn assert_key_order(records: &[OwnedRecord]) {
    let mut last: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for r in records {
        let s = seq(r);
        let k = r.key.clone().unwrap();
        if let Some(&prev) = last.get(&k) {
            assert!(
                s > prev,
                "key {:?}: {s} after {prev}",
                String::from_utf8_lossy(&k)
            );
        }
        last.insert(k, s);
    }
}

pub fn open(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Log {
    Log::open(dir, options(clock)).unwrap()
}

/// Per partition, offsets handed out rise.
pub fn assert_partition_order(records: &[OwnedRecord]) {
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for r in records {
        if let Some(&prev) = last.get(&r.partition) {
            assert!(
                r.offset > prev,
                "partition {}: {} after {prev}",
                r.partition,
                r.offset
            );
        }
        last.insert(r.partition, r.offset);
    }
}

/// Advances the clock in steps of a second, heartbeating `beat` and
/// polling (zero records) `progress` at every step.
pub fn pass(clock: &ManualClock, total: Duration, beat: &[&Member], progress: &mut [&mut Member]) {
    let mut left = total;
    while !left.is_zero() {
        let step = left.min(Duration::from_secs(1));
        clock.advance(step);
        left -= step;
        for m in beat {
            m.heartbeat().unwrap();
        }
        for m in progress.iter_mut() {
            m.poll(0).unwrap();
        }
    }
}
