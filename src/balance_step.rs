//! Applying the balance policy to a topic: gather loads, decide, commit.

use crate::balance::{decide, Decision, PartitionLoad, SplitAt};
use crate::error::Result;
use crate::events::TopologyEvent;
use crate::format::manifest::PartitionState;
use crate::topic::{SplitPlan, Topic};

impl Topic {
    /// One balancer pass: decides from current rates and load maps and
    /// applies the decisions (each re-checked when committed).
    pub fn balance_step(&self) -> Result<Vec<Decision>> {
        let policy = self.config().balance;
        let now = self.inner.core.clock.now_nanos();
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
        let loads: Vec<PartitionLoad> = nodes
            .into_iter()
            .map(|(rec, last_change_nanos, hot_key_reported, part)| {
                let (rates, split_point, hot_key) = part.with_writer(|w| {
                    (
                        w.rates.rates(now),
                        w.load.split_point(),
                        w.load.hot_key(policy.hot_key_share),
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
                }
            })
            .collect();
        let decisions = decide(&policy, now, &loads);
        let mut applied = Vec::new();
        for d in decisions {
            let ok = match d {
                Decision::Split { partition, at } => {
                    let plan = match at {
                        SplitAt::Point(p) => SplitPlan::At(p),
                        SplitAt::Quantiles(k) => SplitPlan::LoadQuantiles(k),
                        SplitAt::IsolateKey(h) => SplitPlan::IsolateHash(h),
                    };
                    self.split(partition, plan).is_ok()
                }
                Decision::Merge { left, right } => self.merge(left, right).is_ok(),
                Decision::HotKey { partition, hash } => {
                    if let Some(n) = self.inner.write_state().nodes.get_mut(&partition) {
                        n.hot_key_reported = true;
                    }
                    self.inner.core.events.emit(TopologyEvent::HotKey {
                        topic: self.name().into(),
                        partition,
                        hash,
                    });
                    true
                }
            };
            if ok {
                applied.push(d);
            }
        }
        Ok(applied)
    }
}
