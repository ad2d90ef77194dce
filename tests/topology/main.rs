//! Topology: splits and merges keep per-key order (C4) through the
//! lineage-aware reader, saved cuts and reopens, and are atomic across
//! failures, kills and power losses (C5); a tail reader follows rolls,
//! splits, merges and retention without a gap or a duplicate; partitions
//! retention emptied leave the topology durably; topology changes applied as
//! commands are validated and refused as a whole; the balancer converges
//! without thrash.

#[path = "../common/mod.rs"]
mod common;

mod balance;
mod commands;
mod lineage;
mod reader_scale;
mod retention_removal;
mod split_crash;
mod tail_reader;
mod wide_readers;
