//! Replication for fissionlog on openraft 0.9.25 (`storage-v2`).
//!
//! The design is docs/REPLICATION.md. This crate holds these pieces of
//! it, each under its own tests:
//!
//! - [`TypeConfig`]: openraft's type configuration for every fissionlog
//!   group, with the [`Command`]s a partition group's log carries;
//! - [`VoteFile`]: a group's vote, saved durably (tmp + fsync + rename +
//!   fsync of the directory, a version byte and a CRC) with all I/O through
//!   [`VoteIo`], so tests check the order of the steps and what a power
//!   loss keeps;
//! - [`FrameCodec`]: the node-to-node frames (length prefix, version byte,
//!   postcard payload, a maximum size checked before buffering) and the
//!   [`PeerMessage`]s they carry;
//! - [`state_machine`]: the partition group's state machine (high
//!   watermark, producer dedup, membership, seal) and its snapshots;
//! - [`network`]: the node-to-node transport (one shared connection per
//!   node pair) and the server; [`client`]: the client calls;
//! - [`node`]: a node hosting groups (and, with the controller, the
//!   groups the controller places on it), and the `fissionlog-raft`
//!   binary.
//! - [`controller`]: the controller group's commands and state machine
//!   (topology, placement, consumer groups) and its snapshots.
//!
//! ## Not done yet
//!
//! The node's groups run on [`LogStore`] / [`LogReader`] over replicated
//! partitions, with the [`MetaFile`] (purged and committed ids);
//! [`mem_log::MemLogStore`] is kept for tests only. A node started with
//! the controller ([`node::NodeOptions`]) hosts the controller group and
//! every partition group it places there. Missing: splits across nodes
//! driven by the controller, the balancer, replica set changes; the fault
//! campaigns and benchmarks (docs/REPLICATION.md, "The controller").
//!
//! The single-node library does not depend on this crate: a broker that
//! does not replicate compiles none of openraft, tokio or postcard.

#![warn(missing_docs)]

pub mod client;
pub mod controller;
pub mod error;
pub mod frame;
pub mod log_store;
pub mod mem_log;
pub mod meta;
pub mod network;
pub mod node;
pub mod state_machine;
pub mod types;
pub mod vote;

pub use controller::{ControllerCommand, ControllerResponse, ControllerStateMachine};
pub use error::{Error, Result};
pub use frame::{FrameCodec, PeerMessage, RaftRequest, RaftResponse};
pub use log_store::{LogReader, LogStore};
pub use meta::{Meta, MetaFile};
pub use state_machine::{CommittedEndSink, PartitionState, PartitionStateMachine};
pub use types::{Command, CommandResponse, GroupId, NodeId, ProducerStamp, RecordIn, TypeConfig};
pub use vote::{DirLock, StdVoteIo, VoteFile, VoteIo};
