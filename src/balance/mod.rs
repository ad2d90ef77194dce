//! Load balancing: rate tracking, hot/cold detection and split-point choice.
//!
//! Everything in this module is pure: no I/O, no threads, no reading of the
//! system clock except through [`Clock`]. Time enters as a `now_nanos: u64`
//! argument (monotonic nanoseconds from [`Clock::now_nanos`]), so every
//! decision can be replayed in simulated time and unit-tested
//! deterministically.
//!
//! The pieces, bottom-up:
//!
//! - [`RateTracker`]: bytes/s and records/s of one partition as
//!   continuous-time EWMAs over several windows (default 1 s, 10 s, 60 s),
//!   cheap enough for the append path, persisted as a [`RateSnapshot`].
//! - [`LoadMap`]: where inside a partition's hash range the load lands — a
//!   decayed histogram (for the load-weighted median split point) and a
//!   Space-Saving top-k sketch (for single hot keys).
//! - [`BalancePolicy`] and [`decide`]: the pure function that turns the
//!   loads of a topic's active partitions into [`Decision`]s (split, merge,
//!   report a hot key), with hysteresis, a minimum age and partition caps.
//! - `assign`: which consumer-group member reads which partition, from
//!   partition weights and member loads (the group coordinator applies it).
//!
//! Robustness rule for the whole module: no input panics. NaN or negative
//! rates are treated as unknown, zero durations are clamped to a small
//! positive minimum, and a clock that goes backwards is clamped (the elapsed
//! time is taken as zero).

mod assign;
mod clock;
mod cuts;
mod decision;
mod loadmap;
mod policy;
mod rate;
#[cfg(test)]
mod sim;

pub(crate) use assign::{best_single_move, plan_counts, plan_moves};
#[cfg(any(test, feature = "testing"))]
pub use clock::ManualClock;
pub use clock::{Clock, SystemClock};
pub use decision::{decide, CutPoints, Decision, PartitionLoad, SplitAt};
#[cfg(any(test, feature = "internals"))]
pub use loadmap::LoadMapConfig;
#[cfg(not(any(test, feature = "internals")))]
pub(crate) use loadmap::LoadMapConfig;
pub use loadmap::{HotKey, LoadMap};
pub use policy::BalancePolicy;
pub use rate::{RateSnapshot, RateTracker, WindowRate, WindowRateSnapshot, DEFAULT_WINDOWS};

pub(crate) use crate::duration::duration_nanos;
