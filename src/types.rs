//! Leaf value types that several layers share: the error type names them,
//! the API hands them out, the manifest records one of them. This module
//! imports nothing from the crate, so any layer may import it without
//! pulling a higher one in.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where an appended record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Appended {
    /// Partition id.
    pub partition: u32,
    /// Offset in it.
    pub offset: u64,
}

/// How much order a hot key's records keep, and so how far they spread.
/// Set per key with [`crate::Topic::set_hot_key_mode`] (or by the balancer,
/// see [`crate::HotKeyPolicy::auto_window`]); a key never set is `Strict`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum HotKeyMode {
    /// All the key's records go to one lane (the partition owning its
    /// hash), in order: today's routing.
    #[default]
    Strict,
    /// Records are grouped into time windows of this length by their
    /// timestamp; all records of one window go to one lane in order, and
    /// successive windows rotate over the key's lanes. Reading the windows
    /// in sequence ([`crate::Topic::read_key`]) gives full per-key order.
    Windowed(Duration),
    /// Round-robin over the key's lanes: no order at all.
    Spread,
}
