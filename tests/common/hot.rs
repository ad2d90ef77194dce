//! Helpers of the hot-key test suites: one hot key, a 100 ms window, a
//! fixed base time and topics that allow the modes asked for.

use std::time::Duration;

use fissionlog::{HotKeyMode, HotKeyPolicy, LogOptions, TopicConfig};

/// The hot key.
pub const HOT: &[u8] = b"the-hot-key";
/// Windows of 100 ms.
pub const W100: HotKeyMode = HotKeyMode::Windowed(Duration::from_millis(100));
/// A fixed base time (ms since the epoch) for explicit timestamps.
pub const T0: i64 = 1_700_000_000_000;

/// No balancer, no background retention.
pub fn opts() -> LogOptions {
    LogOptions {
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
