//! # fissionlog-broker
//!
//! A sample network broker on the fissionlog storage engine: the binary
//! protocol ([`protocol`], docs/PROTOCOL.md), a tokio server over an
//! embedded [`fissionlog::Log`] ([`server`]) or, in cluster mode, over
//! replicated partitions on fissionlog-raft ([`server::cluster`]), and an
//! async client with a batching [`client::Producer`], a group
//! [`client::Consumer`] and an [`client::Admin`].

#![warn(missing_docs)]

pub mod client;
pub mod protocol;
pub mod server;
pub mod tls;

/// The rustls the broker's TLS is built on (for root stores and configs).
pub use tokio_rustls::rustls;

pub use protocol::check_decode;
