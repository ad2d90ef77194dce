//! Topics, partitions, key ranges and lineage, and the manifest that
//! stores them.

pub mod manifest;
pub mod model;
