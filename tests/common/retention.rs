//! Helpers of the suites on consumer groups under retention: one
//! partition of 4 KiB segments with a one-hour retention age, records
//! routed to a chosen partition, and what a member was told was removed.

use std::time::Duration;

use fissionlog::{Member, NewRecord, Topic, TopicConfig};

/// Old enough for a one-hour retention age.
pub const OLD_TS: i64 = 1_000;

pub fn config() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 4096,
        retention_age: Some(Duration::from_secs(3600)),
        ..TopicConfig::default()
    }
}

/// Appends `n` records routed to partition `p` (old ones when `old`).
pub fn fill(topic: &Topic, p: u32, n: u32, old: bool) {
    let k = (0..)
        .map(|k| format!("key-{k}"))
        .find(|k| topic.route(k.as_bytes()) == p)
        .unwrap();
    for i in 0..n {
        topic
            .append_batch(&[NewRecord {
                key: Some(k.as_bytes()),
                value: format!("{p}:{i}").as_bytes(),
                timestamp: old.then_some(OLD_TS),
            }])
            .unwrap();
    }
}

/// The ranges a member was told retention removed, sorted.
pub fn lost(m: &Member) -> Vec<(u32, u64, u64)> {
    let mut v: Vec<_> = m
        .retained()
        .iter()
        .map(|g| (g.partition, g.start, g.end))
        .collect();
    v.sort_unstable();
    v
}
