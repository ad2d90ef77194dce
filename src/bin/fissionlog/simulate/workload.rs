//! The simulated workload: a skewed choice of keys, self-describing values,
//! and the producer threads that append them.
//!
//! Every value starts with a 16-byte header `(producer u32, key u32, seq u64)`
//! (little-endian), where `seq` counts that producer's records for that key
//! from 0. Per-key order is defined per producer (two producers writing the
//! same key are not ordered against each other), so a *stream* is the pair
//! (producer, key) and the consumer checks that each stream's sequence
//! numbers arrive as 0, 1, 2, ... exactly once.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fissionlog::{NewRecord, Topic};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use rand_distr::{Distribution as _, Zipf};

/// Bytes of the header every value starts with.
pub const VALUE_HEADER_BYTES: usize = 16;

/// Records per `append_batch` call of one producer.
const BATCH_RECORDS: usize = 32;

/// The key id that carries `--hot-key-share` (Zipf keys are `1..=keys`).
pub const HOT_KEY_ID: u32 = 0;

/// What the producers write.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Zipf keys are `1..=keys`; key 0 is the optional hot key.
    pub keys: u32,
    /// Zipf exponent.
    pub zipf_exponent: f64,
    /// Share of all records that go to key 0.
    pub hot_key_share: Option<f64>,
    /// Bytes per value (at least [`VALUE_HEADER_BYTES`]).
    pub value_bytes: usize,
    /// Producer threads.
    pub producers: u32,
    /// Seed of the key choice (producer `p` uses a seed derived from it).
    pub seed: u64,
}

impl Workload {
    /// The share of all records the most frequent key gets: the Zipf head
    /// `1 / H(keys, s)`, or the extra hot key's share if that is larger.
    pub fn head_share(&self) -> f64 {
        let harmonic: f64 = (1..=self.keys)
            .map(|k| f64::from(k).powf(-self.zipf_exponent))
            .sum();
        let hot = self.hot_key_share.unwrap_or(0.0);
        hot.max((1.0 - hot) / harmonic.max(1.0))
    }
}

/// The key of key id `k`, written into `buf`; returns its length.
pub fn write_key(buf: &mut [u8; 24], k: u32) -> usize {
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    // "key-" plus at most 10 digits always fits 24 bytes.
    let _ = write!(cursor, "key-{k}");
    cursor.position() as usize
}

/// The header of a value: `(producer, key, seq)`, or None if too short.
pub fn decode_value(value: &[u8]) -> Option<(u32, u32, u64)> {
    let p = u32::from_le_bytes(value.get(0..4)?.try_into().ok()?);
    let k = u32::from_le_bytes(value.get(4..8)?.try_into().ok()?);
    let s = u64::from_le_bytes(value.get(8..16)?.try_into().ok()?);
    Some((p, k, s))
}

fn encode_header(value: &mut [u8], producer: u32, key: u32, seq: u64) {
    value[0..4].copy_from_slice(&producer.to_le_bytes());
    value[4..8].copy_from_slice(&key.to_le_bytes());
    value[8..16].copy_from_slice(&seq.to_le_bytes());
}

/// State shared by the producers and the thread that steers them.
#[derive(Debug)]
pub struct Shared {
    /// Producers stop before their next batch.
    pub stop: AtomicBool,
    /// Records/s allowed per producer as `f64` bits; 0.0 means unlimited.
    limit_bits: AtomicU64,
    /// Bumped whenever the limit changes, so producers restart their pacing.
    limit_generation: AtomicU64,
    /// Total records to produce, if bounded.
    records_budget: Option<u64>,
    claimed: AtomicU64,
    /// Records acknowledged (appended) so far.
    pub acked: AtomicU64,
    /// Key + value bytes acknowledged so far.
    pub payload_bytes: AtomicU64,
    /// Acknowledged records per initial hash range (static partitioning).
    pub per_initial_range: Vec<AtomicU64>,
    /// Append failures, one sentence each.
    pub errors: Mutex<Vec<String>>,
}

impl Shared {
    /// Fresh state for `initial_ranges` initial partitions.
    pub fn new(records_budget: Option<u64>, initial_ranges: usize) -> Shared {
        Shared {
            stop: AtomicBool::new(false),
            limit_bits: AtomicU64::new(0f64.to_bits()),
            limit_generation: AtomicU64::new(0),
            records_budget,
            claimed: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            payload_bytes: AtomicU64::new(0),
            per_initial_range: (0..initial_ranges).map(|_| AtomicU64::new(0)).collect(),
            errors: Mutex::new(Vec::new()),
        }
    }

    /// Limits every producer to `records_per_sec` (0 = unlimited).
    pub fn set_limit_per_producer(&self, records_per_sec: f64) {
        self.limit_bits
            .store(records_per_sec.max(0.0).to_bits(), Ordering::Release);
        self.limit_generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Acknowledged records per initial range, now.
    pub fn initial_range_counts(&self) -> Vec<u64> {
        self.per_initial_range
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Claims up to `want` records of the budget; 0 when it is spent.
    fn claim(&self, want: usize) -> usize {
        let Some(budget) = self.records_budget else {
            return want;
        };
        let prev = self.claimed.fetch_add(want as u64, Ordering::AcqRel);
        budget.saturating_sub(prev).min(want as u64) as usize
    }
}

/// Keeps one producer at its allowed rate.
struct Pacer {
    generation: u64,
    since: Instant,
    sent: u64,
}

impl Pacer {
    /// Sleeps until `n` more records fit the current limit (or stop is set).
    fn wait(&mut self, shared: &Shared, n: usize) {
        let generation = shared.limit_generation.load(Ordering::Acquire);
        if generation != self.generation {
            *self = Pacer {
                generation,
                since: Instant::now(),
                sent: 0,
            };
        }
        let limit = f64::from_bits(shared.limit_bits.load(Ordering::Acquire));
        self.sent += n as u64;
        if limit <= 0.0 {
            return;
        }
        let due = Duration::from_secs_f64(self.sent as f64 / limit);
        while !shared.stop.load(Ordering::Acquire) {
            let elapsed = self.since.elapsed();
            if elapsed >= due || shared.limit_generation.load(Ordering::Acquire) != self.generation
            {
                return;
            }
            std::thread::sleep((due - elapsed).min(Duration::from_millis(20)));
        }
    }
}

/// The next key id: key 0 with probability `hot_key_share`, else Zipf.
fn pick_key(rng: &mut SmallRng, zipf: &Zipf<f64>, hot_key_share: Option<f64>, keys: u32) -> u32 {
    if let Some(share) = hot_key_share {
        if rng.random::<f64>() < share {
            return HOT_KEY_ID;
        }
    }
    // Zipf samples are integral floats in [1, keys].
    (zipf.sample(rng) as u32).clamp(1, keys)
}

/// The Zipf distribution of `w`'s keys, or `None` with an error recorded.
fn zipf_of(w: &Workload, producer: u32, shared: &Shared) -> Option<Zipf<f64>> {
    match Zipf::new(f64::from(w.keys), w.zipf_exponent) {
        Ok(z) => Some(z),
        Err(e) => {
            shared
                .errors
                .lock()
                .push(format!("producer {producer}: bad Zipf parameters: {e}"));
            None
        }
    }
}

/// Counts an acknowledged batch of keys `ids` (`payload` bytes of key and
/// value) into the shared totals and the per-initial-range counters;
/// `local_ranges` is the producer's scratch for the latter.
fn credit(
    shared: &Shared,
    ids: &[u32],
    initial_range_of_key: &[u32],
    local_ranges: &mut [u64],
    payload: u64,
) {
    for &k in ids {
        local_ranges[initial_range_of_key[k as usize] as usize] += 1;
    }
    for (c, local) in shared.per_initial_range.iter().zip(local_ranges.iter_mut()) {
        if *local > 0 {
            c.fetch_add(*local, Ordering::Relaxed);
            *local = 0;
        }
    }
    shared.acked.fetch_add(ids.len() as u64, Ordering::AcqRel);
    shared.payload_bytes.fetch_add(payload, Ordering::Relaxed);
}

/// Runs producer `producer` until stopped or the budget is spent; returns,
/// per key id, how many records of that key this producer had acknowledged
/// (its sequence numbers `0..n` were all appended).
///
/// `initial_range_of_key[k]` is the index of the initial (static) hash range
/// key `k` falls in.
pub fn produce(
    topic: &Topic,
    w: &Workload,
    producer: u32,
    shared: &Shared,
    initial_range_of_key: &[u32],
) -> Vec<u64> {
    let Some(zipf) = zipf_of(w, producer, shared) else {
        return vec![0; w.keys as usize + 1];
    };
    let mut rng =
        SmallRng::seed_from_u64(w.seed ^ u64::from(producer).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut next_seq = vec![0u64; w.keys as usize + 1];
    let mut values = vec![0u8; BATCH_RECORDS * w.value_bytes];
    for (i, b) in values.iter_mut().enumerate() {
        *b = b'a' + (i % 26) as u8;
    }
    let mut keys = [[0u8; 24]; BATCH_RECORDS];
    let mut key_lens = [0usize; BATCH_RECORDS];
    let mut ids = [0u32; BATCH_RECORDS];
    let mut local_ranges = vec![0u64; shared.per_initial_range.len()];
    let mut pacer = Pacer {
        generation: u64::MAX,
        since: Instant::now(),
        sent: 0,
    };
    while !shared.stop.load(Ordering::Acquire) {
        let n = shared.claim(BATCH_RECORDS);
        if n == 0 {
            break;
        }
        pacer.wait(shared, n);
        let mut payload = 0u64;
        for i in 0..n {
            let k = pick_key(&mut rng, &zipf, w.hot_key_share, w.keys);
            ids[i] = k;
            let seq = next_seq[k as usize];
            next_seq[k as usize] += 1;
            let v = &mut values[i * w.value_bytes..(i + 1) * w.value_bytes];
            encode_header(v, producer, k, seq);
            if let Some(stamp) = v.get_mut(16..24) {
                // Append time, for the consumers' end-to-end latency.
                stamp.copy_from_slice(&super::group::stamp_micros().to_le_bytes());
            }
            key_lens[i] = write_key(&mut keys[i], k);
            payload += (key_lens[i] + w.value_bytes) as u64;
        }
        let records: Vec<NewRecord<'_>> = (0..n)
            .map(|i| NewRecord {
                key: Some(&keys[i][..key_lens[i]]),
                value: &values[i * w.value_bytes..(i + 1) * w.value_bytes],
                timestamp: None,
            })
            .collect();
        match topic.append_batch(&records) {
            Ok(_) => credit(
                shared,
                &ids[..n],
                initial_range_of_key,
                &mut local_ranges,
                payload,
            ),
            Err(e) => {
                // Not acknowledged: roll the sequence numbers back so the
                // check expects only what was acknowledged.
                for &k in ids[..n].iter().rev() {
                    next_seq[k as usize] -= 1;
                }
                shared
                    .errors
                    .lock()
                    .push(format!("producer {producer}: append failed: {e}"));
                shared.stop.store(true, Ordering::Release);
                break;
            }
        }
    }
    next_seq
}
