//! Helpers of the hot-key test suites: one hot key, a 100 ms window, a
//! fixed base time and topics that allow the modes asked for.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fissionlog::{HotKeyMode, HotKeyPolicy, LogOptions, NewRecord, Topic, TopicConfig};

/// The hot key.
pub const HOT: &[u8] = b"the-hot-key";
/// Windows of 100 ms.
pub const W100: HotKeyMode = HotKeyMode::Windowed(Duration::from_millis(100));
/// A fixed base time (ms since the epoch) for explicit timestamps.
pub const T0: i64 = 1_700_000_000_000;

/// No balancer, no background retention.
pub fn opts() -> LogOptions {
    LogOptions {
        topic_hash_seed: Some(super::log::HASH_SEED),
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    }
}

/// `partitions` partitions of 1 MiB segments allowing the windowed and
/// spread modes as asked, with up to 4 lanes.
pub fn config(partitions: u32, windowed: bool, spread: bool) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: 1 << 20,
        hot_keys: HotKeyPolicy {
            allow_windowed: windowed,
            allow_spread: spread,
            max_lanes: 4,
            auto_window: None,
        },
        ..TopicConfig::default()
    }
}

/// Fills partition `id` (4 KiB segments) with one-record batches like
/// `like` until a batch of `first` such records still fits in its segment
/// and one more one-record batch after it does not (`first = 0`: the next
/// batch rolls).
pub fn fill_until(topic: &Topic, id: u32, first: u64, like: NewRecord<'_>) {
    let part = topic.partition(id).unwrap();
    let data = |p: &fissionlog::Partition| p.segment_infos().last().unwrap().data_bytes;
    let before = data(&part);
    topic.append_to(id, &[like]).unwrap();
    let one = data(&part) - before;
    topic.append_to(id, &[like, like]).unwrap();
    let rec = data(&part) - before - 2 * one;
    let room = if first == 0 {
        0
    } else {
        one - rec + first * rec
    };
    while 4096 - 64 - data(&part) >= room + one {
        topic.append_to(id, &[like]).unwrap();
    }
    assert!(4096 - 64 - data(&part) >= room, "room left for {first}");
    assert_eq!(part.segment_count(), 1, "no roll while filling");
}

/// How far the writers of a test racing mode changes got: records each
/// appended, and whether it stopped on its own. The thread changing modes
/// waits on it between changes instead of sleeping, so every change races
/// appends however late the writers were scheduled.
pub struct Progress {
    appended: Vec<AtomicU64>,
    stopped: Vec<AtomicBool>,
}

impl Progress {
    /// Progress of `writers` writers, none appended yet.
    pub fn new(writers: usize) -> Progress {
        Progress {
            appended: (0..writers).map(|_| AtomicU64::new(0)).collect(),
            stopped: (0..writers).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Writer `w` has appended `n` records in all.
    pub fn appended(&self, w: usize, n: u64) {
        self.appended[w].store(n, Ordering::Release);
    }

    /// Writer `w` stopped on its own: nothing more to wait for from it.
    pub fn stopped(&self, w: usize) {
        self.stopped[w].store(true, Ordering::Release);
    }

    /// Waits until every writer still running appended `by` records more
    /// than when called. After 10 s it sets `stop` (so the writers end)
    /// and panics.
    pub fn wait_for_more(&self, by: u64, stop: &AtomicBool) {
        let from: Vec<u64> = self
            .appended
            .iter()
            .map(|a| a.load(Ordering::Acquire))
            .collect();
        let limit = Instant::now() + Duration::from_secs(10);
        let behind = |w: usize| {
            !self.stopped[w].load(Ordering::Acquire)
                && self.appended[w].load(Ordering::Acquire) < from[w] + by
        };
        while (0..from.len()).any(behind) {
            if Instant::now() > limit {
                stop.store(true, Ordering::Relaxed);
                panic!("the writers stopped appending at {from:?}");
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}
