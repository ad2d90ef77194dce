//! Server counters, readable through the `Stats` request.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Counters of one server since it started.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Connections open now.
    pub connections_open: AtomicU64,
    /// Connections accepted since start.
    pub connections_accepted: AtomicU64,
    /// Connections refused at the connection limit.
    pub connections_refused: AtomicU64,
    /// Requests read.
    pub requests: AtomicU64,
    /// Requests refused with `too_many_in_flight`.
    pub in_flight_refused: AtomicU64,
    /// Most requests one connection had in flight at once.
    pub in_flight_max: AtomicU64,
    /// Most responses one connection had queued (or being written) at once.
    pub write_queue_max: AtomicU64,
    /// Frames refused as malformed or oversized.
    pub bad_frames: AtomicU64,
    /// Connections closed because their socket took nothing for the stall timeout.
    pub stalled_closed: AtomicU64,
    /// Records appended.
    pub records_produced: AtomicU64,
    /// Records sent by fetches and group polls.
    pub records_sent: AtomicU64,
    /// TLS handshakes that failed or timed out.
    pub tls_handshakes_failed: AtomicU64,
}

/// A plain copy of [`ServerStats`], as the `Stats` request returns it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct StatsSnapshot {
    pub connections_open: u64,
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub requests: u64,
    pub in_flight_refused: u64,
    pub in_flight_max: u64,
    pub write_queue_max: u64,
    pub bad_frames: u64,
    pub stalled_closed: u64,
    pub records_produced: u64,
    pub records_sent: u64,
    #[serde(default)]
    pub tls_handshakes_failed: u64,
}

impl ServerStats {
    /// Raises `counter` to `v` if below.
    pub(crate) fn raise(counter: &AtomicU64, v: u64) {
        counter.fetch_max(v, Ordering::Relaxed);
    }

    /// A copy of every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            connections_open: l(&self.connections_open),
            connections_accepted: l(&self.connections_accepted),
            connections_refused: l(&self.connections_refused),
            requests: l(&self.requests),
            in_flight_refused: l(&self.in_flight_refused),
            in_flight_max: l(&self.in_flight_max),
            write_queue_max: l(&self.write_queue_max),
            bad_frames: l(&self.bad_frames),
            stalled_closed: l(&self.stalled_closed),
            records_produced: l(&self.records_produced),
            records_sent: l(&self.records_sent),
            tls_handshakes_failed: l(&self.tls_handshakes_failed),
        }
    }
}
