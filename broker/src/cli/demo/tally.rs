//! What the demo's parent saw, and the checked summary made from it
//! (docs/BROKER.md defines every field).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use serde_json::{json, Value};

use super::DemoArgs;

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// What the parent saw, record by record.
#[derive(Default)]
pub(super) struct Tally {
    pub acked: HashSet<(u32, String, u64)>,
    /// Per record: the consumers that delivered it, in order.
    pub deliveries: HashMap<(u32, String, u64), Vec<u32>>,
    /// Per consumer and key stream, the highest sequence delivered.
    last_seq: HashMap<(u32, u32, String), u64>,
    pub order_violations: u64,
    latencies_ms: Vec<f64>,
    pub failed_acks: u64,
    /// The consumer the demo kills, once it is killed: when (µs since the
    /// epoch), the partitions it had been reading, and when another
    /// consumer first received a record of one of them after the kill.
    pub killed: Option<(u32, u64)>,
    killed_partitions: HashSet<u32>,
    resumed_at_us: Option<u64>,
}

impl Tally {
    /// Takes a producer's line; true when it was its last (`D`).
    pub fn acknowledged(&mut self, producer: u32, line: &str) -> bool {
        let f: Vec<&str> = line.split(' ').collect();
        if f.first() == Some(&"A") && f.len() == 5 {
            if let Ok(seq) = f[2].parse() {
                self.acked.insert((producer, f[1].to_string(), seq));
            }
        } else if f.first() == Some(&"D") {
            self.failed_acks += f.get(1).and_then(|n| n.parse().ok()).unwrap_or(0);
            return true;
        }
        false
    }

    pub fn delivered(&mut self, consumer: u32, line: &str) {
        // R p{P} KEY SEQ SEND_US RECV_US PARTITION OFFSET
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() != 8 {
            return; // a line cut by the kill
        }
        let (Some(p), Ok(seq), Ok(sent), Ok(recv)) = (
            f[1].strip_prefix('p').and_then(|p| p.parse::<u32>().ok()),
            f[3].parse::<u64>(),
            f[4].parse::<u64>(),
            f[5].parse::<u64>(),
        ) else {
            return;
        };
        let partition = f[6].parse::<u32>().unwrap_or(u32::MAX);
        match self.killed {
            None => {
                if consumer == super::KILLED {
                    self.killed_partitions.insert(partition);
                }
            }
            Some((k, at)) => {
                if consumer != k
                    && self.resumed_at_us.is_none()
                    && recv > at
                    && self.killed_partitions.contains(&partition)
                {
                    self.resumed_at_us = Some(recv);
                }
            }
        }
        let key = f[2].to_string();
        let id = (p, key.clone(), seq);
        let seen_before = self.deliveries.contains_key(&id);
        let stream = (consumer, p, key);
        if let Some(&last) = self.last_seq.get(&stream) {
            if seq < last && !seen_before {
                self.order_violations += 1;
            }
        }
        let e = self.last_seq.entry(stream).or_insert(seq);
        *e = (*e).max(seq);
        if !seen_before {
            self.latencies_ms
                .push(recv.saturating_sub(sent) as f64 / 1000.0);
        }
        self.deliveries.entry(id).or_default().push(consumer);
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn summarize(
    a: &DemoArgs,
    t: &Tally,
    groups: &Value,
    describe: &Value,
    splits: u64,
    killed: u32,
    broker_clean: bool,
    elapsed: Duration,
) -> Value {
    let missing = t
        .acked
        .iter()
        .filter(|r| !t.deliveries.contains_key(*r))
        .count() as u64;
    let mut raw_dups = 0u64;
    let mut unexplained = 0u64;
    for who in t.deliveries.values() {
        raw_dups += who.len() as u64 - 1;
        let by_killed = who.iter().filter(|&&c| c == killed).count() as u64;
        let by_live = who.len() as u64 - by_killed;
        unexplained += by_killed.saturating_sub(1) + by_live.saturating_sub(1);
    }
    let mut lat = t.latencies_ms.clone();
    lat.sort_by(f64::total_cmp);
    let g = groups["groups"].get(0).cloned().unwrap_or(Value::Null);
    let mut pauses: Vec<f64> = g["stats"]["pauses_ms"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_f64)
        .collect();
    pauses.sort_by(f64::total_cmp);
    let active = describe["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["state"] == "active")
        .count();
    let mut per_partition: BTreeMap<u64, u64> = BTreeMap::new();
    for p in describe["partitions"].as_array().into_iter().flatten() {
        per_partition.insert(
            p["id"].as_u64().unwrap_or(0),
            p["end_offset"].as_u64().unwrap_or(0),
        );
    }
    let ok = missing == 0 && t.order_violations == 0 && unexplained == 0 && !t.acked.is_empty();
    json!({
        "ok": ok,
        "produced": a.records * u64::from(a.producers),
        "acknowledged": t.acked.len(),
        "failed_acks": t.failed_acks,
        "consumed": t.deliveries.len(),
        "deliveries": t.deliveries.values().map(Vec::len).sum::<usize>(),
        "missing_records": missing,
        "duplicate_records": raw_dups,
        "unexplained_duplicates": unexplained,
        "order_violations": t.order_violations,
        "killed_consumer": killed,
        "rebalances": g["stats"]["rebalances"],
        "redelivered": g["stats"]["redelivered"],
        "kill_to_resume_ms": match (t.killed, t.resumed_at_us) {
            (Some((_, at)), Some(r)) => json!(r.saturating_sub(at) as f64 / 1000.0),
            _ => Value::Null,
        },
        "rebalance_pauses": pauses.len(),
        "rebalance_pause_ms_p50": percentile(&pauses, 0.5),
        "rebalance_pause_ms_max": pauses.last().copied().unwrap_or(0.0),
        "e2e_latency_ms_p50": percentile(&lat, 0.5),
        "e2e_latency_ms_p99": percentile(&lat, 0.99),
        "splits": splits,
        "active_partitions": active,
        "records_per_partition": per_partition,
        "broker_clean_shutdown": broker_clean,
        "seconds": (elapsed.as_secs_f64() * 10.0).round() / 10.0,
    })
}

pub(super) fn print_text(s: &Value) {
    println!(
        "produced {} records ({} acknowledged), consumed {} ({} deliveries) through {} splits, consumer {} killed",
        s["produced"], s["acknowledged"], s["consumed"], s["deliveries"], s["splits"], s["killed_consumer"]
    );
    println!(
        "rebalances {}, the killed consumer's partitions resumed after {} ms, pauses {} (p50 {} ms, max {} ms); e2e latency p50 {} ms, p99 {} ms",
        s["rebalances"],
        s["kill_to_resume_ms"],
        s["rebalance_pauses"],
        s["rebalance_pause_ms_p50"],
        s["rebalance_pause_ms_max"],
        s["e2e_latency_ms_p50"],
        s["e2e_latency_ms_p99"]
    );
    println!(
        "check: {} missing_records={} duplicate_records={} unexplained_duplicates={} order_violations={} ({} s)",
        if s["ok"] == true { "ok" } else { "FAILED" },
        s["missing_records"], s["duplicate_records"], s["unexplained_duplicates"], s["order_violations"], s["seconds"]
    );
}
