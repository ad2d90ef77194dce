//! Recovery: every open after a crash or power loss finds the records
//! synced before it (C1), never reuses an offset (C3, C8), tells a torn
//! tail from damage and says what it repaired, and a second open after a
//! repair changes nothing (C7). Strict refuses damage and missing files
//! without touching the disk; Truncate and Salvage repair durably. An I/O
//! error while opening is an error, never taken for damage.

#[path = "../common/mod.rs"]
mod common;

mod chain_shapes;
mod full_scan;
mod header_only_repair;
mod index_lies;
mod last_batch_bytes;
mod missing_segments;
mod open_costs;
mod open_errors;
mod power_loss_images;
mod power_loss_repairs;
mod salvage;
mod salvage_gap;
mod scenarios;
mod sealed_strict;
mod settled_sealed;
mod timestamps;
