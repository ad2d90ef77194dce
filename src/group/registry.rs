//! The groups of a topic: taking a group's coordinator (creating the group
//! durably), listing and deleting groups, and writing a group's commits to
//! the manifest.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::format::manifest::{GroupPosition, GroupRecord, ManifestRecord};
use crate::topic::Topic;
use crate::topology::lineage::Lineage;

use super::committed::Committed;
use super::coordinator::Coordinator;
use super::{Group, GroupOptions, GroupStart, Runtime};

/// The coordinators of one topic's groups taken so far, by group name:
/// every handle of one group in one log shares one. The topic holds it
/// opaque (`topic::GroupSlot`) and drops it when the log closes (each
/// coordinator holds its topic: kept, the two would keep each other
/// alive); handles still held go on answering [`Error::Closed`].
#[derive(Debug, Default)]
struct Registry {
    runtimes: Mutex<HashMap<String, Arc<Runtime>>>,
}

impl Registry {
    /// The registry of `topic`, made by the first call.
    fn of(topic: &Topic) -> Arc<Registry> {
        topic.inner.groups().get_or_default()
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Arc<Runtime>>> {
        self.runtimes.lock()
    }
}

impl Topic {
    /// The consumer group `name` of this topic, created (durably, with its
    /// starting positions) if it does not exist. Every handle of one group
    /// in one log shares one coordinator.
    pub fn group(&self, name: &str, options: GroupOptions) -> Result<Group> {
        self.inner.core().check_not_closed()?;
        crate::topic_name::validate(name).map_err(|e| match e {
            Error::InvalidTopicName { reason, .. } => {
                Error::InvalidConfig(format!("group name {name:?}: {reason}"))
            }
            other => other,
        })?;
        if options.max_moves_per_balancing == 0 {
            return Err(Error::InvalidConfig(
                "max_moves_per_balancing must be at least 1: a group that may move \
                 nothing by load never balances"
                    .into(),
            ));
        }
        let registry = Registry::of(self);
        let mut groups = registry.lock();
        if let Some(runtime) = groups.get(name) {
            return Ok(Group {
                runtime: runtime.clone(),
            });
        }
        let record = self.group_record(name);
        let (lineage, committed, generation) = match record {
            Some(g) => (self.lineage(), Committed::from_record(&g), g.generation),
            None => {
                // Taken again while a topology change commits meanwhile: a
                // `Latest` position read under a lineage from before a
                // tail split, at the parent's new end, would hand the
                // moved records out again from the children (as for
                // `Topic::reader`). A split committing after this only
                // translates the positions (`Coordinator::refresh`).
                let (lineage, c) = loop {
                    let lineage = self.lineage();
                    let got = self.initial_positions(&lineage, options.start);
                    if self.topology_generation() == lineage.generation {
                        break (lineage, got?);
                    }
                };
                self.commit_group(name, 0, &c, &[], &[])?;
                (lineage, c, 0)
            }
        };
        // Before any end is looked up: whatever is published after a look
        // is signalled.
        let signals = self.inner.wake().subscribe();
        let coordinator = Coordinator::new(
            name.to_string(),
            options,
            lineage,
            committed,
            generation,
            member_id_base(),
        );
        let runtime = Arc::new(Runtime {
            topic: self.clone(),
            name: name.to_string(),
            coordinator: Mutex::new(coordinator),
            signals,
        });
        runtime.lock().refresh(self);
        groups.insert(name.to_string(), runtime.clone());
        Ok(Group { runtime })
    }

    /// Names of the topic's consumer groups.
    pub fn groups(&self) -> Vec<String> {
        let topo = self.inner.core().topology.lock();
        topo.state
            .topics
            .iter()
            .find(|t| t.id == self.id())
            .map(|t| t.groups.iter().map(|g| g.name.clone()).collect())
            .unwrap_or_default()
    }

    /// Deletes a group and its committed positions. Members of it that are
    /// still alive are fenced.
    pub fn delete_group(&self, name: &str) -> Result<()> {
        let registry = Registry::of(self);
        let mut groups = registry.lock();
        if self.group_record(name).is_none() {
            return Err(Error::UnknownGroup(name.to_string()));
        }
        // The coordinator's lock is held across the record: a member's
        // commit (which creates the group if it is missing) cannot land
        // after it and bring the group back.
        let runtime = groups.get(name).cloned();
        let mut co = runtime.as_ref().map(|g| g.lock());
        {
            let core = self.inner.core();
            let mut topo = core.topology.lock();
            core.commit(
                &mut topo,
                ManifestRecord::DeleteGroup {
                    topic_id: self.id(),
                    group: name.to_string(),
                },
            )?;
        }
        if let Some(co) = co.as_mut() {
            co.delete();
        }
        drop(co);
        groups.remove(name);
        Ok(())
    }

    pub(crate) fn group_record(&self, name: &str) -> Option<GroupRecord> {
        let topo = self.inner.core().topology.lock();
        topo.state
            .topics
            .iter()
            .find(|t| t.id == self.id())
            .and_then(|t| t.groups.iter().find(|g| g.name == name).cloned())
    }

    fn initial_positions(&self, lineage: &Lineage, start: GroupStart) -> Result<Committed> {
        let mut c = Committed::default();
        if start == GroupStart::Latest {
            for id in lineage.active() {
                let end = self.partition(id)?.end_offset();
                let (pos, last) = self.latest_position(id, end)?;
                c.positions.insert(id, pos);
                if let Some(f) = last {
                    c.last_records.insert(id, f);
                }
            }
        }
        Ok(c)
    }

    /// Writes a group commit to the manifest: durable when this returns.
    pub(super) fn commit_group(
        &self,
        group: &str,
        generation: u64,
        c: &Committed,
        drained: &[u32],
        pruned: &[u32],
    ) -> Result<()> {
        let positions = c
            .positions
            .iter()
            .map(|(&partition, &offset)| GroupPosition {
                partition,
                offset,
                last_record: c.last_records.get(&partition).copied(),
            })
            .collect();
        let core = self.inner.core();
        let mut topo = core.topology.lock();
        core.commit(
            &mut topo,
            ManifestRecord::GroupCommit {
                topic_id: self.id(),
                group: group.to_string(),
                generation,
                positions,
                drained: drained.to_vec(),
                pruned: pruned.to_vec(),
            },
        )
    }
}

/// Member ids are unique across runs of a log (the run's start time in the
/// high bits), so a member of an earlier run is never taken for one of
/// this run.
fn member_id_base() -> u64 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    (secs & 0xFFFF_FFFF) << 24
}
