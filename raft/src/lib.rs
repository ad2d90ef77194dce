//! Replication for fissionlog on openraft 0.9.25 (`storage-v2`).
//!
//! The design is docs/REPLICATION.md. This crate holds the first pieces
//! of it, each under its own tests:
//!
//! - [`TypeConfig`]: openraft's type configuration for every fissionlog
//!   group, with the [`Command`]s a partition group's log carries;
//! - [`VoteFile`]: a group's vote, saved durably (tmp + fsync + rename +
//!   fsync of the directory, a version byte and a CRC) with all I/O through
//!   [`VoteIo`], so tests check the order of the steps and what a power
//!   loss keeps;
//! - [`FrameCodec`]: the node-to-node frames (length prefix, version byte,
//!   postcard payload, a maximum size checked before buffering) and the
//!   [`PeerMessage`]s they carry.
//!
//! ## Not done yet
//!
//! Built since: [`LogStore`] / [`LogReader`], openraft's log storage over a
//! replicated partition, and the [`MetaFile`] (purged and committed ids).
//! Nothing here runs a Raft group yet. Missing, in the order
//! docs/REPLICATION.md builds them: the state machine and its snapshot; the transport's
//! connection manager and `RaftNetworkFactory`; the controller group;
//! splits across nodes; the multi-process tests and benchmarks.
//!
//! The single-node library does not depend on this crate: a broker that
//! does not replicate compiles none of openraft, tokio or postcard.

#![warn(missing_docs)]

pub mod error;
pub mod frame;
pub mod log_store;
pub mod meta;
pub mod types;
pub mod vote;

pub use error::{Error, Result};
pub use frame::{FrameCodec, PeerMessage, RaftRequest, RaftResponse};
pub use log_store::{LogReader, LogStore};
pub use meta::{Meta, MetaFile};
pub use types::{Command, CommandResponse, GroupId, NodeId, ProducerStamp, RecordIn, TypeConfig};
pub use vote::{DirLock, StdVoteIo, VoteFile, VoteIo};
