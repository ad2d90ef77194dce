//! Hot-key modes: `Windowed` keys rotate windows over lanes with order
//! inside each window, `Spread` keys go round-robin, and a strict reader
//! (`Topic::read_key`) gets full per-key order back across eras, splits,
//! clock jumps, reopens and power losses; batches mixing windowed,
//! spread, strict and keyless records are written in rounds that keep
//! those orders; bad input on a key is a typed error.

#[path = "../common/mod.rs"]
mod common;

mod edges;
mod modes;
mod windowed_batches;
