//! The consumer: reads the topic back with the order-keeping reader and
//! counts order violations, duplicates and (at the end) missing records
//! exactly, per stream (producer, key).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fissionlog::{StartAt, Topic};

use super::workload::{decode_value, HOT_KEY_ID};

/// The order the hot key's mode promises, which the checker holds its
/// records to (every other key is checked per key).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HotOrder {
    /// Per key (per producer stream).
    #[default]
    Strict,
    /// Per time window of this many ms (by record timestamp).
    Windowed(i64),
    /// None.
    Spread,
}

/// After the producers stop, the consumer gives up waiting for missing
/// records once the topic has been quiet this long.
const DRAIN_IDLE: Duration = Duration::from_secs(3);

/// Exact per-stream bookkeeping of sequence numbers.
///
/// For each stream, every seq below `next` was seen exactly once; seqs seen
/// above `next` (only after a gap, i.e. never in a correct run) are kept in
/// `ahead`. Memory is two words per stream plus the anomalies.
#[derive(Debug)]
pub struct Checker {
    keys_per_producer: usize,
    next: Vec<u64>,
    /// Highest seq seen + 1.
    max_seen: Vec<u64>,
    ahead: HashMap<usize, BTreeSet<u64>>,
    /// Records received.
    pub received: u64,
    /// Records that arrived after a later record of their stream.
    pub order_violations: u64,
    /// Records received more than once.
    pub duplicates: u64,
    /// Records whose value or key did not decode, or named an unknown stream.
    pub malformed: u64,
    /// The order the hot key (key 0) is checked for.
    pub hot_order: HotOrder,
    /// Windowed hot key: highest seq + 1 seen per (stream, window).
    window_max: HashMap<(usize, i64), u64>,
}

/// What the final comparison with the producers' acknowledgements found.
#[derive(Debug, Clone, Copy, Default)]
pub struct Comparison {
    /// Acknowledged records never read.
    pub missing: u64,
    /// Records read that no producer had acknowledged (an append that
    /// failed part-way may leave some).
    pub unacknowledged: u64,
}

impl Checker {
    /// A checker for `producers` × `keys_per_producer` streams.
    pub fn new(producers: usize, keys_per_producer: usize) -> Checker {
        let n = producers * keys_per_producer;
        Checker {
            keys_per_producer,
            next: vec![0; n],
            max_seen: vec![0; n],
            ahead: HashMap::new(),
            received: 0,
            order_violations: 0,
            duplicates: 0,
            malformed: 0,
            hot_order: HotOrder::Strict,
            window_max: HashMap::new(),
        }
    }

    /// Records one received value.
    #[cfg(test)]
    pub fn receive(&mut self, value: &[u8]) {
        self.receive_at(value, 0);
    }

    /// Records one received value with its timestamp (which places a
    /// windowed hot key's record in its window).
    pub fn receive_at(&mut self, value: &[u8], timestamp: i64) {
        self.received += 1;
        let Some((p, k, seq)) = decode_value(value) else {
            self.malformed += 1;
            return;
        };
        let (p, k) = (p as usize, k as usize);
        if k >= self.keys_per_producer || p >= self.next.len() / self.keys_per_producer.max(1) {
            self.malformed += 1;
            return;
        }
        let s = p * self.keys_per_producer + k;
        let ahead = self.ahead.get(&s);
        if seq < self.next[s] || ahead.is_some_and(|a| a.contains(&seq)) {
            self.duplicates += 1;
            return;
        }
        let late = match (k as u32 == HOT_KEY_ID, self.hot_order) {
            (true, HotOrder::Spread) => false,
            (true, HotOrder::Windowed(ms)) => {
                let m = self
                    .window_max
                    .entry((s, timestamp.div_euclid(ms.max(1))))
                    .or_default();
                let late = seq < *m;
                *m = (*m).max(seq + 1);
                late
            }
            _ => seq < self.max_seen[s],
        };
        if late {
            self.order_violations += 1;
        }
        self.max_seen[s] = self.max_seen[s].max(seq + 1);
        if seq == self.next[s] {
            self.next[s] += 1;
            if let Some(a) = self.ahead.get_mut(&s) {
                while a.remove(&self.next[s]) {
                    self.next[s] += 1;
                }
                if a.is_empty() {
                    self.ahead.remove(&s);
                }
            }
        } else {
            self.ahead.entry(s).or_default().insert(seq);
        }
    }

    /// Compares with what each producer acknowledged: `acked[p][k]` records
    /// of key `k` by producer `p` (seqs `0..acked`).
    pub fn compare(&self, acked: &[Vec<u64>]) -> Comparison {
        let mut c = Comparison::default();
        for (s, &next) in self.next.iter().enumerate() {
            let (p, k) = (s / self.keys_per_producer, s % self.keys_per_producer);
            let want = acked.get(p).and_then(|a| a.get(k)).copied().unwrap_or(0);
            let ahead = self.ahead.get(&s);
            let ahead_below = ahead.map_or(0, |a| a.range(..want).count() as u64);
            let ahead_above = ahead.map_or(0, |a| a.range(want..).count() as u64);
            let seen_below = next.min(want) + ahead_below;
            c.missing += want - seen_below.min(want);
            c.unacknowledged += next.saturating_sub(want) + ahead_above;
        }
        c
    }
}

/// Progress shared between the consumer and the thread that steers the run.
#[derive(Debug, Default)]
pub struct ConsumerShared {
    /// Records read so far.
    pub read: AtomicU64,
    /// Set once the producers have stopped and `final_acked` is valid.
    pub producers_done: AtomicBool,
    /// Records the producers acknowledged in total.
    pub final_acked: AtomicU64,
    /// Stop reading at once, without draining (calibration).
    pub stop_now: AtomicBool,
    /// A line about the consumer group for the live view (empty without one).
    pub status: std::sync::Mutex<String>,
    /// The order the hot key is checked for.
    pub hot_order: HotOrder,
}

/// Reads `topic` from the earliest records until the producers are done and
/// everything they acknowledged was read (or the topic stayed quiet for
/// [`DRAIN_IDLE`]). Returns the checker, or the reader's error.
pub fn consume(
    topic: &Topic,
    producers: usize,
    keys_per_producer: usize,
    shared: &ConsumerShared,
) -> Result<Checker, String> {
    let mut checker = Checker::new(producers, keys_per_producer);
    checker.hot_order = shared.hot_order;
    let mut reader = topic
        .reader(StartAt::Earliest)
        .map_err(|e| format!("cannot open a reader: {e}"))?;
    let mut idle_since: Option<Instant> = None;
    while !shared.stop_now.load(Ordering::Acquire) {
        let records = reader
            .poll_wait(8192, Duration::from_millis(50))
            .map_err(|e| format!("reading the topic failed: {e}"))?;
        if records.is_empty() {
            if shared.producers_done.load(Ordering::Acquire) {
                if checker.received >= shared.final_acked.load(Ordering::Acquire) {
                    break;
                }
                if idle_since.get_or_insert_with(Instant::now).elapsed() >= DRAIN_IDLE {
                    break;
                }
            }
            continue;
        }
        idle_since = None;
        for r in &records {
            checker.receive_at(&r.value, r.timestamp);
        }
        shared
            .read
            .fetch_add(records.len() as u64, Ordering::Relaxed);
    }
    Ok(checker)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(p: u32, k: u32, seq: u64) -> Vec<u8> {
        let mut v = vec![0u8; 16];
        v[0..4].copy_from_slice(&p.to_le_bytes());
        v[4..8].copy_from_slice(&k.to_le_bytes());
        v[8..16].copy_from_slice(&seq.to_le_bytes());
        v
    }

    #[test]
    fn counts_violations_duplicates_and_missing_exactly() {
        let mut c = Checker::new(2, 3);
        for seq in [0, 1, 3, 2, 2, 5] {
            c.receive(&value(1, 2, seq));
        }
        c.receive(&value(0, 0, 0));
        c.receive(&[1, 2, 3]);
        assert_eq!(c.order_violations, 1, "2 after 3");
        assert_eq!(c.duplicates, 1, "second 2");
        assert_eq!(c.malformed, 1);
        let acked = vec![vec![2, 0, 0], vec![0, 0, 5]];
        let cmp = c.compare(&acked);
        // Producer 0 key 0: seq 1 missing; producer 1 key 2: seq 4 missing,
        // seq 5 was never acknowledged.
        assert_eq!(cmp.missing, 2);
        assert_eq!(cmp.unacknowledged, 1);
    }

    #[test]
    fn a_windowed_hot_key_is_checked_per_window_and_spread_not_at_all() {
        let hot = |seq| value(0, HOT_KEY_ID, seq);
        let mut c = Checker::new(1, 2);
        c.hot_order = HotOrder::Windowed(100);
        // Window 1 read before window 0: no violation; inside window 1, 5
        // after 6 is one.
        for (seq, ts) in [(4, 100), (6, 150), (5, 140), (0, 0), (1, 10)] {
            c.receive_at(&hot(seq), ts);
        }
        assert_eq!(c.order_violations, 1);
        let mut c = Checker::new(1, 2);
        c.hot_order = HotOrder::Spread;
        for seq in [3, 0, 2, 1] {
            c.receive_at(&hot(seq), 0);
        }
        assert_eq!((c.order_violations, c.duplicates), (0, 0));
        c.receive_at(&hot(2), 0);
        assert_eq!(c.duplicates, 1, "duplicates still count");
    }

    #[test]
    fn a_clean_stream_has_no_findings() {
        let mut c = Checker::new(1, 1);
        for seq in 0..100 {
            c.receive(&value(0, 0, seq));
        }
        assert_eq!((c.order_violations, c.duplicates, c.malformed), (0, 0, 0));
        let cmp = c.compare(&[vec![100]]);
        assert_eq!((cmp.missing, cmp.unacknowledged), (0, 0));
    }
}
