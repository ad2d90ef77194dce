//! The topic lifecycle: `Log::create_topic` and `Log::delete_topic`, a
//! topic created again under a deleted one's name, handles of a deleted
//! topic (refused, never resurrecting it), crashes and power losses in
//! between, and a delete racing a topology change or changes parked in
//! I/O of the same topic.

#[path = "../common/mod.rs"]
mod common;

mod creation;
mod creation_probes;
mod creation_unwritten_probes;
mod delete;
mod delete_races;
mod lifecycle;
