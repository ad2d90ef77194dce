//! Durability: an acknowledged or synced record survives a power loss or a
//! SIGKILL (C1). Covers `Topic::durable` futures, concurrent durable
//! writers, what a failed fsync or manifest write leaves behind, the cost
//! of a sync round, the checkpoint cadence, and the lock-free capture of
//! each partition's end by a sync round.

#[path = "../common/mod.rs"]
mod common;

mod capture_edges;
mod checkpoint_interval;
mod concurrent_writers;
mod future;
mod kill;
mod sync_capture;
mod sync_failures;
mod sync_scale;
