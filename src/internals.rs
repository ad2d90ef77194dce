//! Internals for fissionlog's own fuzz targets, corpus tests and
//! benchmarks, behind the non-default `internals` feature.
//!
//! Not part of the API: nothing here is stable, and nothing here is
//! needed to use a log. What is re-exported is pure (encoders, the segment
//! scanner, rate and load trackers over plain memory) or drives a log only
//! through the public API (the `check_*` functions), so enabling the
//! feature gives safe code no way around the log's invariants: segment
//! files, their mappings and writers stay crate-private either way.

/// Check functions shared by the fuzz targets (`fuzz/`) and the corpus
/// replay tests (`tests/fuzz_corpus.rs`): see `src/fuzz_checks.rs`.
pub mod fuzz_checks {
    pub use crate::fuzz_checks::{
        check_batch_decode, check_batch_v2, check_chain_repair, check_checkpoint_decode,
        check_log_recovery, check_manifest_replay, check_ops_model, check_segment_scan, ScratchDir,
    };
}

/// Pure encoders of the on-disk format (docs/FORMAT.md), for building
/// fuzz seeds.
pub mod format {
    pub use crate::format::batch::{
        batch_len, encode_batch, encode_batch_v2, encode_hole, BatchHeader, BatchHeaderV2,
        ControlKind, EntryBody, RaftLogId, RecordIn, BATCH_HEADER_LEN, BATCH_HEADER_V2_LEN,
        BATCH_MAGIC, BATCH_MAGIC_V2,
    };
    pub use crate::format::checkpoint::{
        decode_checkpoint, encode_checkpoint, Checkpoint, PartitionCheckpoint, WindowState,
    };
    pub use crate::format::index::IndexEntry;
    pub use crate::format::segment::encode_header;
}

/// The pure segment scanner recovery runs over a mapped segment.
pub mod scan {
    pub use crate::recovery::scan::{
        scan_segment, CorruptAction, HoleFix, ScanOutcome, ScanParams, ScanStop,
    };
}

/// The per-partition rate and load trackers of the append path.
pub mod balance {
    pub use crate::balance::{
        HotKey, LoadMap, LoadMapConfig, RateSnapshot, RateTracker, WindowRateSnapshot,
    };
}
