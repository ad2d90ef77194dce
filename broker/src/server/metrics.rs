//! Metrics through the `metrics` facade, rendered as Prometheus text at
//! `/metrics` (see [`super::http`]).
//!
//! Request counts, latencies, bytes and sync rounds are recorded where
//! they happen. What the log already knows (per-partition rates and
//! offsets, group lag and members, the server's connection counters) is
//! sampled into gauges when `/metrics` is scraped, so it costs nothing
//! between scrapes. Split and merge counts come from the log's topology
//! events (see [`super::topology`]).
//!
//! The recorder is process-wide (the facade has one global recorder): the
//! first server installs a Prometheus recorder. A process that installed
//! its own recorder before keeps it and receives the broker's metrics
//! there; `/metrics` then answers 503.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fissionlog::{GroupOptions, Log, MemberState};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use super::stats::StatsSnapshot;

/// The series the broker exports (docs/BROKER.md lists them with their labels).
pub mod names {
    /// Requests answered, by `op` and `outcome` (`ok`, `error`).
    pub const REQUESTS: &str = "fissionlog_broker_requests_total";
    /// Request latency from read to answer queued, by `op` (seconds).
    pub const REQUEST_SECONDS: &str = "fissionlog_broker_request_duration_seconds";
    /// Records appended by produce requests.
    pub const RECORDS_PRODUCED: &str = "fissionlog_broker_records_produced_total";
    /// Records sent by fetches and group polls.
    pub const RECORDS_SENT: &str = "fissionlog_broker_records_sent_total";
    /// Bytes read from clients (frames, TLS excluded).
    pub const BYTES_IN: &str = "fissionlog_broker_bytes_in_total";
    /// Bytes written to clients (frames, TLS excluded).
    pub const BYTES_OUT: &str = "fissionlog_broker_bytes_out_total";
    /// Connections open now.
    pub const CONNECTIONS_OPEN: &str = "fissionlog_broker_connections_open";
    /// Connections accepted since start.
    pub const CONNECTIONS_ACCEPTED: &str = "fissionlog_broker_connections_accepted_total";
    /// Connections refused at the connection limit.
    pub const CONNECTIONS_REFUSED: &str = "fissionlog_broker_connections_refused_total";
    /// TLS handshakes that failed or timed out.
    pub const TLS_HANDSHAKES_FAILED: &str = "fissionlog_broker_tls_handshakes_failed_total";
    /// Frames refused as malformed or oversized.
    pub const BAD_FRAMES: &str = "fissionlog_broker_bad_frames_total";
    /// Per partition (`topic`, `partition`): appended records per second,
    /// the library's shortest rate window.
    pub const PARTITION_RECORDS_PER_SEC: &str = "fissionlog_partition_append_records_per_second";
    /// Per partition: appended bytes per second.
    pub const PARTITION_BYTES_PER_SEC: &str = "fissionlog_partition_append_bytes_per_second";
    /// Per partition: its end offset.
    pub const PARTITION_END_OFFSET: &str = "fissionlog_partition_end_offset";
    /// Per partition: 1 once sealed (split or merged away), 0 while active.
    pub const PARTITION_SEALED: &str = "fissionlog_partition_sealed";
    /// Per topic: active partitions.
    pub const TOPIC_ACTIVE_PARTITIONS: &str = "fissionlog_topic_active_partitions";
    /// Per group (`topic`, `group`): records past the committed positions.
    pub const GROUP_LAG: &str = "fissionlog_group_lag_records";
    /// Per group and member `state` (`active`, `slow`): members.
    pub const GROUP_MEMBERS: &str = "fissionlog_group_members";
    /// Per group: rebalances since its coordinator started.
    pub const GROUP_REBALANCES: &str = "fissionlog_group_rebalances_total";
    /// Splits (tail splits included), by `topic`.
    pub const SPLITS: &str = "fissionlog_splits_total";
    /// Merges, by `topic`.
    pub const MERGES: &str = "fissionlog_merges_total";
    /// Partitions reported as carrying one hot key, by `topic`.
    pub const HOT_KEYS: &str = "fissionlog_hot_key_partitions_total";
    /// Sync rounds run for `acks quorum` produces (seconds each).
    pub const SYNC_ROUND_SECONDS: &str = "fissionlog_broker_sync_round_duration_seconds";
    /// Live-view clients connected to `/events`.
    pub const VIEW_CLIENTS: &str = "fissionlog_broker_view_clients";
    /// Live-view clients dropped because they read too slowly.
    pub const VIEW_CLIENTS_DROPPED: &str = "fissionlog_broker_view_clients_dropped_total";
}

/// Histogram buckets for every `_seconds` series: 50 µs to 10 s.
const BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

static PROMETHEUS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder once per process; `None` when another
/// recorder was installed first. `serve` calls it; a process that opens
/// its log before serving calls it first, so that the library's
/// per-partition series, registered when a partition is made, reach it.
pub fn install() -> Option<&'static PrometheusHandle> {
    PROMETHEUS
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .ok()?
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            let upkeep = handle.clone();
            // Histograms are folded on scrape; without scrapes this keeps
            // their buffers from growing.
            let _ = std::thread::Builder::new()
                .name("broker-metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(Duration::from_secs(5));
                    upkeep.run_upkeep();
                });
            Some(handle)
        })
        .as_ref()
}

/// One request answered: its count and latency.
pub(crate) fn request_done(op: &'static str, started: Instant, ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    metrics::counter!(names::REQUESTS, "op" => op, "outcome" => outcome).increment(1);
    metrics::histogram!(names::REQUEST_SECONDS, "op" => op).record(started.elapsed());
}

/// Samples what the log and the server's counters know into gauges.
/// Blocking (reads every partition's rates and every group): call it off
/// the async threads.
pub(crate) fn sample(log: &Log, stats: &StatsSnapshot) {
    use metrics::{counter, gauge};
    gauge!(names::CONNECTIONS_OPEN).set(stats.connections_open as f64);
    counter!(names::CONNECTIONS_ACCEPTED).absolute(stats.connections_accepted);
    counter!(names::CONNECTIONS_REFUSED).absolute(stats.connections_refused);
    counter!(names::TLS_HANDSHAKES_FAILED).absolute(stats.tls_handshakes_failed);
    counter!(names::BAD_FRAMES).absolute(stats.bad_frames);
    counter!(names::RECORDS_PRODUCED).absolute(stats.records_produced);
    counter!(names::RECORDS_SENT).absolute(stats.records_sent);
    for name in log.topics() {
        let Ok(t) = log.topic(&name) else { continue };
        let parts = t.partitions();
        let active = parts.iter().filter(|p| p.sealed_at.is_none()).count();
        gauge!(names::TOPIC_ACTIVE_PARTITIONS, "topic" => name.clone()).set(active as f64);
        for p in &parts {
            let labels = [("topic", name.clone()), ("partition", p.id.to_string())];
            let rate = p.rates.first();
            gauge!(names::PARTITION_RECORDS_PER_SEC, &labels)
                .set(rate.map_or(0.0, |r| r.records_per_sec));
            gauge!(names::PARTITION_BYTES_PER_SEC, &labels)
                .set(rate.map_or(0.0, |r| r.bytes_per_sec));
            gauge!(names::PARTITION_END_OFFSET, &labels).set(p.end_offset as f64);
            gauge!(names::PARTITION_SEALED, &labels).set(if p.sealed_at.is_some() {
                1.0
            } else {
                0.0
            });
        }
        for g in t.groups() {
            let Ok(group) = t.group(&g, GroupOptions::default()) else {
                continue;
            };
            let d = group.describe();
            let labels = [("topic", name.clone()), ("group", g.clone())];
            gauge!(names::GROUP_LAG, &labels).set(d.lag_records as f64);
            counter!(names::GROUP_REBALANCES, &labels).absolute(d.stats.rebalances);
            for (state, label) in [(MemberState::Active, "active"), (MemberState::Slow, "slow")] {
                let n = d.members.iter().filter(|m| m.state == state).count();
                gauge!(names::GROUP_MEMBERS, "topic" => name.clone(), "group" => g.clone(), "state" => label)
                    .set(n as f64);
            }
        }
    }
}
