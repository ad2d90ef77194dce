//! Appends and reads: records written are read back byte for byte at
//! their offsets, batches are all-or-nothing per partition, per-key order
//! holds while splits land, readers race rolls and retention safely, and
//! bad input is a typed error that loses nothing (C2, C4, C6).

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod basic;
mod batch;
mod batch_split_race;
mod boundaries;
mod concurrency;
mod read_path;
