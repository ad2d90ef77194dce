#![doc(hidden)]
//! Check functions shared by the fuzz targets (`fuzz/`) and the corpus
//! replay tests (`tests/fuzz_corpus.rs`).
//!
//! Every `check_*` takes arbitrary bytes. It must never panic on bad input
//! (C6); it panics only when fissionlog breaks one of its contracts, with a
//! message naming the contract. The inputs are decoded by hand (no
//! `arbitrary`), so a stable `cargo test` replays the committed corpus
//! through exactly the code the fuzzer runs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::{LogOptions, RecoveryMode, SyncPolicy, TopicConfig};
use crate::error::Error;
use crate::format::batch::{self, RecordIter};
use crate::format::checkpoint;
use crate::format::manifest as mfmt;
use crate::format::segment::{encode_header, SEGMENT_HEADER_LEN};
use crate::log::Log;
use crate::reader::StartAt;
use crate::recovery::scan::{scan_segment, ScanParams, ScanStop};
use crate::topic::{NewRecord, SplitPlan, Topic};
use crate::topology::{manifest, model};

mod chain_repair;
mod format;
mod log_recovery;
mod manifest_replay;
mod ops;
mod scratch;

pub use chain_repair::check_chain_repair;
pub use format::{check_batch_decode, check_batch_v2, check_checkpoint_decode, check_segment_scan};
pub use log_recovery::check_log_recovery;
pub use manifest_replay::check_manifest_replay;
pub use ops::check_ops_model;
pub use scratch::ScratchDir;
use scratch::*;

const MODES: [RecoveryMode; 3] = [
    RecoveryMode::Strict,
    RecoveryMode::Truncate,
    RecoveryMode::Salvage,
];

/// Reads an input as a stream of numbers; past its end every read is zero,
/// so any input decodes to something.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    fn new(data: &'a [u8]) -> Input<'a> {
        Input { data, pos: 0 }
    }
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
}
