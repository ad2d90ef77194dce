//! Topics, partitions, key ranges and lineage, and the manifest that
//! stores them.

pub(crate) mod command;
pub(crate) mod hot_keys;
pub(crate) mod lineage;
pub(crate) mod manifest;
pub(crate) mod model;
pub(crate) mod ranges;
pub(crate) mod tail;
