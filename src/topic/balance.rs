//! Applying the balance policy to a topic: gather loads, decide, commit.

use std::sync::Arc;

use crate::balance::{decide, Decision, LoadMap, PartitionLoad, RateTracker, SplitAt};
use crate::error::Result;
use crate::events::TopologyEvent;
use crate::format::manifest::PartitionState;
use crate::partition::Partition;
use crate::topic::{SplitPlan, Topic};
use crate::topology::command::TopologyCommand;

impl Topic {
    /// One balancer pass: decides from current rates and load maps and
    /// applies the decisions (each re-checked when committed).
    pub fn balance_step(&self) -> Result<Vec<Decision>> {
        let policy = self.config().balance;
        let now = self.inner.core.clock.now_nanos();
        let loads = self.active_loads(now);
        let decisions = decide(&policy, now, &loads);
        let mut applied = Vec::new();
        for d in decisions {
            if self.apply_decision(d) {
                applied.push(d);
            }
        }
        Ok(applied)
    }

    /// The load of each active partition at `now`.
    fn active_loads(&self, now: u64) -> Vec<PartitionLoad> {
        // Snapshot the active nodes first, then read each writer's rates and
        // load map with the state lock released: a split or merge holds the
        // parent's writer lock while it waits for the state lock (lock
        // order: writer, then state).
        let nodes: Vec<_> = {
            let st = self.inner.state.read();
            st.nodes
                .values()
                .filter(|n| n.rec.state == PartitionState::Active)
                .map(|n| {
                    (
                        n.rec.clone(),
                        n.last_change_nanos,
                        n.hot_key_reported,
                        n.part.clone(),
                    )
                })
                .collect()
        };
        nodes
            .into_iter()
            .map(|(rec, last_change_nanos, hot_key_reported, part)| {
                let (rates, split_point, hot_key, profile) = part.with_writer(|w| {
                    (
                        w.rates.rates(now),
                        w.load.split_point(),
                        w.load.hot_key(0.0),
                        w.load.profile(),
                    )
                });
                PartitionLoad {
                    id: rec.id,
                    start: rec.start,
                    end: rec.end,
                    rates,
                    last_change_nanos,
                    split_point,
                    hot_key,
                    hot_key_reported,
                    profile,
                    parents: rec.parents,
                }
            })
            .collect()
    }

    /// Carries out one decision; returns whether it was applied.
    fn apply_decision(&self, d: Decision) -> bool {
        match d {
            Decision::Split { partition, at } => {
                let plan = match at {
                    SplitAt::Point(p) => SplitPlan::At(p),
                    SplitAt::Quantiles(k) => SplitPlan::LoadQuantiles(k),
                    SplitAt::IsolateKey(h) => SplitPlan::IsolateHash(h),
                    SplitAt::Cuts(points) => SplitPlan::Cuts(points),
                };
                self.split_command(partition, plan)
                    .and_then(|cmd| self.apply(cmd))
                    .is_ok()
            }
            Decision::Merge { left, right } => self
                .apply(TopologyCommand::Merge { a: left, b: right })
                .is_ok(),
            Decision::HotKey { partition, hash } => {
                if let Some(n) = self.inner.write_state().nodes.get_mut(&partition) {
                    n.hot_key_reported = true;
                }
                self.inner.core.events.emit(TopologyEvent::HotKey {
                    topic: self.name().into(),
                    partition,
                    hash,
                });
                self.auto_window(hash);
                true
            }
        }
    }
}

impl Topic {
    /// The hot-key rule: a key alone in its partition and still above the
    /// target goes windowed over `max_lanes` lanes when the topic's
    /// `hot_keys.auto_window` says so. Only a key never given a mode: one
    /// with any era (even one a broker set back to `Strict`) keeps the mode
    /// it or a broker chose, so a key's mode cannot flap.
    fn auto_window(&self, hash: u64) {
        let cfg = self.config().hot_keys;
        let Some(window) = cfg.auto_window.filter(|_| cfg.allow_windowed) else {
            return;
        };
        // A key with a mode already, or one of such a key's lanes (its
        // records reach the load map under the lane's hash point): never
        // changed by the balancer.
        if self.hot_keys().iter().any(|k| k.hash == hash) || self.is_lane_point(hash) {
            return;
        }
        let _ = self.apply(TopologyCommand::SetHotKeyMode {
            hash,
            mode: crate::config::HotKeyMode::Windowed(window),
            lanes: cfg.max_lanes,
        });
    }

    /// Seeds the rates and load maps of the children of a committed split
    /// or merge from their sealed parents: each child of a split inherits
    /// its share of the parent's load (by the parent's load map, or an even
    /// share if it is empty), the child of a merge the sum of both. Without
    /// it a child starts at zero: its long windows look cold for a minute
    /// (a merge right after the split) and its empty load map knows nothing
    /// about where to cut next. Appends the children took since the commit
    /// are kept (added to the seed).
    pub(crate) fn seed_children(&self, parents: &[&Arc<Partition>], children: &[u32]) {
        let now = self.inner.core.clock.now_nanos();
        let kids: Vec<(u64, u64, Arc<Partition>)> = {
            let st = self.inner.state.read();
            children
                .iter()
                .filter_map(|id| st.nodes.get(id))
                .map(|n| (n.rec.start, n.rec.end, n.part.clone()))
                .collect()
        };
        if kids.len() != children.len() {
            return; // changed again meanwhile: nothing sensible to seed
        }
        // Parents are sealed: their trackers no longer move.
        let seeds: Vec<(RateTracker, LoadMap)> = parents
            .iter()
            .map(|p| p.with_writer(|w| (w.rates.clone(), w.load.clone())))
            .collect();
        let even = 1.0 / kids.len() as f64;
        for (start, end, kid) in kids {
            kid.with_writer(|w| {
                for (rates, load) in &seeds {
                    let share = if parents.len() == 1 {
                        load.child_share(start, end).unwrap_or(even)
                    } else {
                        1.0
                    };
                    w.rates = rates.scaled(share, now).merged(&w.rates, now);
                    w.load.absorb(load);
                }
            });
        }
    }
}
