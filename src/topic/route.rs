//! Key routing: the routing hash, the active owner of a hash, keyless round-robin.

use std::sync::atomic::Ordering;

use super::{key_hash, Topic, TopicState};

impl Topic {
    /// The routing hash of `key` in this topic.
    pub fn hash(&self, key: &[u8]) -> u64 {
        key_hash(self.inner.hash_key, key)
    }

    /// The key of this topic's routing hash ([`crate::key_hash`]), for a
    /// client that routes its records itself.
    pub fn routing_key(&self) -> [u64; 2] {
        self.inner.hash_key
    }

    /// The active partition that owns `key` now.
    pub fn route(&self, key: &[u8]) -> u32 {
        self.route_hash(self.hash(key))
    }

    pub(super) fn route_hash(&self, h: u64) -> u32 {
        self.inner.state.read().owner(h)
    }

    /// The next partition for keyless records (round-robin over the active ones).
    pub(super) fn next_keyless(&self, st: &TopicState) -> u32 {
        if st.routes.len() == 1 {
            // One active partition: no shared counter to bump (an atomic
            // read-modify-write per append, contended between appenders).
            return *st
                .routes
                .values()
                .next()
                .expect("active ranges tile the hash space");
        }
        let i = self.inner.round_robin.fetch_add(1, Ordering::Relaxed) % st.routes.len() as u64;
        *st.routes
            .values()
            .nth(i as usize)
            .expect("index below the count")
    }
}
