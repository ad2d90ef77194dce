//! On-disk encodings: pure functions over byte slices, no I/O.
//! The byte layout of every file is documented in `docs/FORMAT.md`.

pub(crate) mod batch;
pub(crate) mod checkpoint;
pub(crate) mod config_record;
pub(crate) mod index;
pub(crate) mod manifest;
pub(crate) mod segment;
pub(crate) mod tail_index;
