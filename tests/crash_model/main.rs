//! The crash model: a model-based property test of the engine under the
//! per-file power-loss model of `common/durable.rs` (C1, C2, C3, C5, C7),
//! its named cases, the proof that it can fail (each fsync call site
//! removed in turn is caught), and the self-tests of the power-loss
//! images it is built on.

#[path = "../common/mod.rs"]
mod common;
mod harness;

mod harness_selftest;
mod model;
mod mutations;
mod named_cases;
mod raft_log;
