//! On-disk encodings: pure functions over byte slices, no I/O.
//! The byte layout of every file is documented in `docs/FORMAT.md`.

pub mod batch;
pub mod checkpoint;
pub mod index;
pub mod manifest;
pub mod segment;
