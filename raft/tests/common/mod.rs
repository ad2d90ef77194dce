//! Fixtures shared by the raft crate's integration tests. Each test binary
//! uses a part of them.
#![allow(dead_code)]

pub mod cluster;
pub mod history;
pub mod proxy;
