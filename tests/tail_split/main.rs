//! Tail splits: the parent's records from an offset on move into the
//! children, and every record is read exactly once in per-key order
//! through readers started before, during and after the split, saved cuts,
//! group positions and reopens; bad input changes nothing; a kill or power
//! loss leaves the old or the new topology. The reclaim of the moved range
//! releases its bytes and keeps every read exact, and a lost descendant
//! index is rebuilt or reported, never taken for missing data.

#[path = "../common/mod.rs"]
mod common;

mod edges;
mod index_lost;
mod reclaim;
mod reclaim_checks;
mod split;
