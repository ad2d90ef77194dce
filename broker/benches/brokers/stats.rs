//! What one run of a workload measured, and the median of several runs.

use std::time::{Duration, Instant};

/// Latencies in microseconds and the count of acknowledged messages.
#[derive(Default)]
pub struct Samples {
    pub latencies_us: Vec<u64>,
    pub messages: u64,
}

impl Samples {
    pub fn record(&mut self, started: Instant, messages: u64) {
        self.latencies_us.push(micros(started.elapsed()));
        self.messages += messages;
    }

    pub fn merge(&mut self, other: Samples) {
        self.latencies_us.extend(other.latencies_us);
        self.messages += other.messages;
    }

    /// Messages per second over `elapsed`, with the latency percentiles.
    pub fn figure(mut self, elapsed: Duration) -> Figure {
        self.latencies_us.sort_unstable();
        let secs = elapsed.as_secs_f64().max(1e-9);
        Figure {
            msgs_per_sec: self.messages as f64 / secs,
            p50_us: percentile(&self.latencies_us, 50.0),
            p99_us: percentile(&self.latencies_us, 99.0),
            messages: self.messages,
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Nearest-rank percentile of sorted values (0 when there are none).
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One workload's result.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Figure {
    pub msgs_per_sec: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub messages: u64,
}

/// The median of each field over runs, taken separately.
pub fn median(runs: &[Figure]) -> Option<Figure> {
    if runs.is_empty() {
        return None;
    }
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Some(Figure {
        msgs_per_sec: mid(runs.iter().map(|f| f.msgs_per_sec).collect()),
        p50_us: mid(runs.iter().map(|f| f.p50_us as f64).collect()) as u64,
        p99_us: mid(runs.iter().map(|f| f.p99_us as f64).collect()) as u64,
        messages: mid(runs.iter().map(|f| f.messages as f64).collect()) as u64,
    })
}
