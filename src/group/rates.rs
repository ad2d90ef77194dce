//! The append rate and the lag of every ready partition, kept without
//! walking the ready set on an idle call.
//!
//! The shell hands the coordinator the partitions its topic signalled
//! since the last call ([`Coordinator::note_moved`], from the group's own
//! [`crate::wake::ReadySet`]): every change of a partition's end is
//! signalled (readers rely on the same). Each signalled partition marks
//! the ready partitions whose lineage closure holds it; only those are
//! folded at the next rate fold, which looks their closure's ends up (once
//! per fold, however often they were signalled) and keeps them for their
//! lag.
//!
//! A balancing's lag walk (the trend a split for lag reads) is skipped
//! when nothing it reads moved and the last walk left no trend (see
//! [`Coordinator::lag_walk_due`]); when it runs, each lag costs lookups in
//! memory, no end look-up. What stays O(owned) per balancing interval is
//! the load balancing among two or more members (their loads are sums
//! over every partition), and the relief rule's lags per member.
//!
//! The fold of a partition whose end did not move is a pure decay
//! (`rate *= exp(-dt / tau)` with no new appends), and decays compose:
//! so an idle partition keeps `(rate, at)` and is decayed when it is read
//! or when its end moves, to the same value (up to rounding) as the fold
//! of every partition every 100 ms that this replaces. Folds are at least
//! [`RATE_FOLD_NANOS`] apart, so once a partition has been folded it
//! takes part in every fold after, and the last fold it took part in is
//! [`Coordinator::last_rates`] (or its own `at`, see
//! [`PartitionRate::folded_until`]).

use std::collections::HashSet;

use crate::wake::Signals;

use super::coordinator::{closure, Coordinator, TopicView};
use super::RATE_TAU_S;

/// Append rates are folded at most this often (a tick runs on every member
/// call), and every fold is at least this long after the previous one.
pub(super) const RATE_FOLD_NANOS: u64 = 100_000_000;

#[derive(Debug, Default)]
pub(super) struct PartitionRate {
    /// The closure's end at its last fold, and that fold's time.
    pub(super) end: u64,
    pub(super) at: u64,
    /// The rate as of `at` (decayed from there on read, see
    /// [`Coordinator::rate`]).
    pub(super) rate: f64,
    /// Its lag at the last balancing, and for how many balancings in a
    /// row it grew.
    pub(super) lag: u64,
    pub(super) lag_rounds: u32,
    /// The end of the partition itself and the sum of the ends of the rest
    /// of its closure (its pinned split descendants), as of the last fold
    /// it took part in (or its creation): its lag without a look-up while
    /// nothing of it was signalled since.
    pub(super) head_end: u64,
    pub(super) rest_end: u64,
}

impl PartitionRate {
    /// The time of the last fold this entry took part in, given the time
    /// of the coordinator's last fold: that fold if it was at least a fold
    /// interval after `at` (every fold after the first one past `at` is),
    /// else `at` itself (no fold since it was folded or created).
    fn folded_until(&self, last_fold: u64) -> u64 {
        if last_fold >= self.at && last_fold - self.at >= RATE_FOLD_NANOS {
            last_fold
        } else {
            self.at
        }
    }
}

/// `rate` decayed over `nanos` without appends.
fn decayed(rate: f64, nanos: u64) -> f64 {
    if nanos == 0 || rate == 0.0 {
        return rate;
    }
    rate * (-(nanos as f64 / 1e9) / RATE_TAU_S).exp()
}

/// Partitions signalled by the topic and not looked at yet.
#[derive(Debug, Default)]
pub(super) struct Moved {
    ids: HashSet<u32>,
    /// Every partition may have moved, or the closures changed (a new
    /// lineage): every ready partition's ends are looked up again.
    all: bool,
    /// Ready partitions whose closure's end may have moved since the last
    /// fold: the only ones the next fold looks at (and whose
    /// [`PartitionRate::head_end`] and `rest_end` may be behind).
    pub(super) to_fold: HashSet<u32>,
    /// Some lag may have moved since the last balancing's lag walk (an end
    /// was signalled, a commit moved committed positions, the ready set or
    /// the closures changed).
    pub(super) lags_moved: bool,
    /// The last lag walk left some partition's lag growing
    /// ([`PartitionRate::lag_rounds`] above 0).
    pub(super) lag_rounds_left: bool,
}

impl Coordinator {
    /// The topic signalled these partitions (see the module comment).
    /// O(signalled); nothing is looked up before the next tick.
    pub(crate) fn note_moved(&mut self, signals: Signals) {
        match signals {
            Signals::None => {}
            Signals::Some(ids) => self.moved.ids.extend(ids),
            Signals::All => self.moved.all = true,
        }
    }

    /// Marks the ready partitions whose closure holds a signalled
    /// partition for the next fold (their ends are looked up there, once
    /// per fold however often they were signalled). After
    /// [`Coordinator::refresh`]: under the lineage the closures are of.
    fn absorb_moved(&mut self) {
        if !self.moved.all && self.moved.ids.is_empty() {
            // An idle call: nothing signalled.
            return;
        }
        let marked: Vec<u32> = if std::mem::take(&mut self.moved.all) {
            self.moved.ids.clear();
            self.full_walks += 1;
            self.owners.keys().copied().collect()
        } else {
            let mut marked = Vec::new();
            // Drained in place: the set keeps its room for the next call.
            let mut ids = std::mem::take(&mut self.moved.ids);
            for x in ids.drain() {
                // Up through single parents: every ready partition whose
                // closure holds `x` (see `closure`).
                let mut y = x;
                loop {
                    if self.owners.contains_key(&y) {
                        marked.push(y);
                    }
                    match self.lineage.parents(y) {
                        [q] => y = *q,
                        _ => break,
                    }
                }
            }
            self.moved.ids = ids;
            marked
        };
        self.moved.lags_moved |= !marked.is_empty();
        self.moved.to_fold.extend(marked);
    }

    /// The end of ready `p` and the sum of the ends of the rest of its
    /// closure, looked up.
    fn closure_ends(&self, view: &dyn TopicView, p: u32) -> (u64, u64) {
        if self.lineage.children(p).is_empty() {
            return (view.end_offset(p), 0);
        }
        let mut head = 0;
        let mut rest = 0;
        for x in closure(&self.lineage, p) {
            let end = view.end_offset(x);
            if x == p {
                head = end;
            } else {
                rest += end;
            }
        }
        (head, rest)
    }

    /// A new lineage: closures may have changed, so every ready
    /// partition's ends are looked up again at the next tick.
    pub(super) fn closures_changed(&mut self) {
        self.moved.all = true;
        self.moved.lags_moved = true;
    }

    /// Committed positions moved: lags did.
    pub(super) fn committed_moved(&mut self) {
        self.moved.lags_moved = true;
    }

    /// Whether a balancing's walk over every ready partition's lag (the
    /// trend a split for lag looks at) can change anything, and if so,
    /// that it is being made now. It cannot when no lag moved since the
    /// last walk and that walk left no trend above 0: it would find every
    /// lag as it was, set every trend to 0 again and find no candidate.
    pub(super) fn lag_walk_due(&mut self) -> bool {
        #[cfg(test)]
        if self.fold_every_partition {
            return true;
        }
        if !self.moved.lags_moved && !self.moved.lag_rounds_left {
            return false;
        }
        self.moved.lags_moved = false;
        true
    }

    /// Folds the append rates of the ready partitions whose end moved
    /// since the last fold, at most every [`RATE_FOLD_NANOS`]; a ready
    /// partition new since the last tick gets its entry at once (rate 0).
    /// O(what was signalled) on an idle call.
    pub(super) fn update_rates(&mut self, view: &dyn TopicView, now: u64) {
        self.absorb_moved();
        if self.ready_changed {
            self.ready_changed = false;
            self.sync_rates(view, now);
        }
        if now.saturating_sub(self.last_rates) < RATE_FOLD_NANOS {
            return;
        }
        let prev = std::mem::replace(&mut self.last_rates, now);
        #[cfg(test)]
        if self.fold_every_partition {
            self.fold_all(view, now);
            return;
        }
        let mut waiting = HashSet::new();
        for p in std::mem::take(&mut self.moved.to_fold) {
            let (head, rest) = self.closure_ends(view, p);
            let Some(r) = self.rates.get_mut(&p) else {
                continue;
            };
            r.head_end = head;
            r.rest_end = rest;
            let from = r.folded_until(prev);
            if now - from < RATE_FOLD_NANOS {
                // Created less than a fold interval ago: folded with its
                // appends at the next fold, as the full fold would.
                waiting.insert(p);
                continue;
            }
            r.rate = decayed(r.rate, from - r.at);
            let end = r.head_end + r.rest_end;
            let dt = (now - from) as f64 / 1e9;
            let inst = end.saturating_sub(r.end) as f64 / dt;
            let a = 1.0 - (-dt / RATE_TAU_S).exp();
            r.rate += a * (inst - r.rate);
            r.end = end;
            r.at = now;
        }
        self.moved.to_fold = waiting;
    }

    /// The full fold, every partition looked up (what the incremental fold
    /// is held to by the tests).
    #[cfg(test)]
    fn fold_all(&mut self, view: &dyn TopicView, now: u64) {
        self.full_walks += 1;
        self.moved.to_fold.clear();
        let ready: Vec<u32> = self.owners.keys().copied().collect();
        for p in ready {
            let end: u64 = closure(&self.lineage, p)
                .into_iter()
                .map(|x| view.end_offset(x))
                .sum();
            let Some(r) = self.rates.get_mut(&p) else {
                continue;
            };
            let dt = now.saturating_sub(r.at) as f64 / 1e9;
            if now.saturating_sub(r.at) >= RATE_FOLD_NANOS {
                let inst = end.saturating_sub(r.end) as f64 / dt;
                let a = 1.0 - (-dt / RATE_TAU_S).exp();
                r.rate += a * (inst - r.rate);
                r.end = end;
                r.at = now;
            }
        }
    }

    /// Gives every new ready partition an entry (rate 0 from now, its ends
    /// looked up) and drops those of partitions no longer ready. A walk,
    /// made only when the ready set changed (itself a walk).
    fn sync_rates(&mut self, view: &dyn TopicView, now: u64) {
        self.full_walks += 1;
        self.moved.lags_moved = true;
        self.rates.retain(|p, _| self.owners.contains_key(p));
        self.moved.to_fold.retain(|p| self.owners.contains_key(p));
        let new: Vec<u32> = self
            .owners
            .keys()
            .filter(|p| !self.rates.contains_key(p))
            .copied()
            .collect();
        for p in new {
            let (head, rest) = self.closure_ends(view, p);
            self.rates.insert(
                p,
                PartitionRate {
                    end: head + rest,
                    at: now,
                    rate: 0.0,
                    lag: 0,
                    lag_rounds: 0,
                    head_end: head,
                    rest_end: rest,
                },
            );
        }
    }

    /// The append rate of ready `p` as of the last fold (records per
    /// second; 0 before its first).
    pub(super) fn rate(&self, p: u32) -> f64 {
        self.rates.get(&p).map_or(0.0, |r| {
            let until = r.folded_until(self.last_rates);
            decayed(r.rate, until - r.at)
        })
    }

    /// Load of ready `p` for balancing: appends per second (plus one, so
    /// idle partitions still spread by count).
    pub(super) fn weight(&self, p: u32) -> f64 {
        self.rate(p) + 1.0
    }

    /// Records of ready `p` (with its pinned children) past the committed
    /// positions: from the ends the last fold looked up when nothing was
    /// signalled for it since (no look-up), else looked up.
    pub(super) fn lag(&self, view: &dyn TopicView, p: u32) -> u64 {
        let fresh =
            self.moved.ids.is_empty() && !self.moved.all && !self.moved.to_fold.contains(&p);
        #[cfg(test)]
        let fresh = fresh && !self.fold_every_partition;
        if let Some(r) = self.rates.get(&p).filter(|_| fresh) {
            return r.head_end.saturating_sub(self.committed_position(p)) + r.rest_end;
        }
        closure(&self.lineage, p)
            .into_iter()
            .map(|x| {
                let end = view.end_offset(x);
                let start = if x == p {
                    self.committed_position(p)
                } else {
                    0
                };
                end.saturating_sub(start)
            })
            .sum()
    }
}

#[cfg(test)]
mod tests;
