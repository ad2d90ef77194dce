//! Consumer groups in simulated time: membership, assignment and
//! hand-overs, commits and tenures, what retention removed under a
//! committed position (reported to the member that takes over, settled by
//! one commit, C8), groups over splits, tail splits and hot keys, a
//! model-based property test, and committed positions through power
//! losses and SIGKILL.

#[path = "../common/mod.rs"]
mod common;

mod crash;
mod handover;
mod interplay;
mod kill;
mod membership;
mod model;
mod retention_loss;
mod retention_reports;
mod tenures;
mod wide_members;
