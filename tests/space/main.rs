//! Disk space, allocation and descriptors: a full disk is a typed error
//! and never a SIGBUS (also for large batches written with `pwrite` into
//! sparse segment files), every write path survives ENOSPC with nothing
//! acknowledged lost, files hold their data plus a bounded headroom, and
//! descriptors do not grow with the number of segments. Scenarios that
//! can kill the process run in a child process on a size-limited tmpfs.

#[path = "../common/mod.rs"]
mod common;

mod active_partitions;
mod allocation;
mod budget;
mod budget_probes;
mod enospc_paths;
mod large_batches;
mod partition_descriptors;
mod sync_round_shortage;
