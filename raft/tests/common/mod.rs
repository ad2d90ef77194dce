//! Fixtures shared by the raft crate's integration tests.

pub mod history;
