//! Topology changes: split, merge, the children they install and the removal of emptied partitions.

use std::sync::Arc;

use crate::balance::{LoadMap, RateTracker};
use crate::error::{Error, Result};
use crate::events::TopologyEvent;
use crate::format::manifest::{ManifestRecord, PartitionRecord, PartitionState};
use crate::partition::{now_ms, Partition, PartitionParams};
use crate::read::ReadIsolation;
use crate::storage::fault::IoOp;
use crate::storage::segment::Segment;
use crate::storage::sync_dir;

use super::{partition_dir, Node, SplitPlan, Topic};
use crate::topology::ranges::{child_records, split_ranges, LoadCuts};

impl Topic {
    /// Creates the directories and empty first segments of new partitions.
    /// On failure, removes whatever it created (ids are reused by the next
    /// attempt, so no half-built directory may stay behind).
    pub(crate) fn create_partition_files(&self, ids: &[u32]) -> Result<Vec<Arc<Segment>>> {
        let result = self.try_create_partition_files(ids);
        if result.is_err() {
            self.remove_partition_files(ids);
        }
        result
    }

    pub(super) fn try_create_partition_files(&self, ids: &[u32]) -> Result<Vec<Arc<Segment>>> {
        let cfg = self.config();
        let mut out = Vec::new();
        for &id in ids {
            let dir = partition_dir(&self.inner.dir, id);
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            let seg = Segment::create(
                &dir,
                (self.inner.id, id),
                0,
                cfg.segment_bytes,
                now_ms(),
                &*self.inner.core.hook,
            )?;
            seg.sync_data(&*self.inner.core.hook)?;
            sync_dir(&*self.inner.core.hook, IoOp::SyncNewDir, &dir)?;
            out.push(Arc::new(seg));
        }
        sync_dir(&*self.inner.core.hook, IoOp::SyncNewDir, &self.inner.dir)?;
        Ok(out)
    }

    pub(crate) fn remove_partition_files(&self, ids: &[u32]) {
        for &id in ids {
            let _ = std::fs::remove_dir_all(partition_dir(&self.inner.dir, id));
        }
    }

    /// Builds a partition over `seg`; `durable` is (segment base, byte
    /// position, end offset) known to be on disk.
    pub(crate) fn make_partition(
        &self,
        id: u32,
        seg: Vec<Arc<Segment>>,
        (start, end): (u64, u64),
        sealed: bool,
        durable: (u64, u64, u64),
    ) -> Arc<Partition> {
        let cfg = self.config();
        let now = self.inner.core.clock.now_nanos();
        Arc::new_cyclic(|me| {
            Partition::new(
                PartitionParams {
                    topic: self.inner.name.clone(),
                    topic_id: self.inner.id,
                    id,
                    dir: partition_dir(&self.inner.dir, id),
                    segment_bytes: cfg.segment_bytes,
                    index_interval: u64::from(cfg.index_interval_bytes),
                    max_record_bytes: cfg.effective_max_record_bytes(),
                    lock: self.inner.lock.lock().clone(),
                    isolation: if cfg.sync == crate::config::SyncPolicy::Always {
                        ReadIsolation::Durable
                    } else {
                        ReadIsolation::Written
                    },
                    wake: self.inner.wake.clone(),
                },
                seg,
                sealed,
                durable,
                RateTracker::new(&crate::balance::DEFAULT_WINDOWS, now),
                LoadMap::new(start, end, now),
                self.inner.core.hook.clone(),
                self.inner.core.clock.clone(),
                (self.inner.core.dirty.clone(), me.clone()),
            )
        })
    }

    /// Splits an active partition: children are created first, then one
    /// durable manifest record commits the split while appends to the
    /// parent wait (only for that commit). Returns the children, in range order.
    ///
    /// A sealed partition is refused with [`Error::Sealed`], as
    /// [`Topic::split_tail`] refuses it.
    pub fn split(&self, partition: u32, plan: SplitPlan) -> Result<Vec<u32>> {
        let _change = self.inner.change.lock();
        // Checked under the change lock: a split that failed to commit
        // poisons the log and keeps its children's files (its record may be
        // on disk); no later change may reuse their ids. A deleted topic
        // takes no children into its removed directory.
        self.check_live()?;
        let (start, end, parent) = {
            let st = self.inner.state.read();
            let n = st
                .nodes
                .get(&partition)
                .ok_or_else(|| Error::UnknownPartition {
                    topic: self.name().into(),
                    partition,
                })?;
            if n.rec.state != PartitionState::Active {
                return Err(Error::Sealed {
                    topic: self.name().into(),
                    partition,
                });
            }
            (n.rec.start, n.rec.end, n.part.clone())
        };
        let ranges = plan_ranges(start, end, plan, &parent)?;
        let max = self.config().balance.max_partitions as usize;
        let active = self.inner.state.read().routes.len();
        if active - 1 + ranges.len() > max {
            return Err(Error::Refused(format!(
                "split would exceed max_partitions ({max})"
            )));
        }
        let first_id = self.next_partition_id();
        let ids: Vec<u32> = (0..ranges.len() as u32).map(|i| first_id + i).collect();
        let segs = self.create_partition_files(&ids)?;
        let children = child_records(partition, &ids, &ranges, now_ms());
        let core = self.inner.core.clone();
        let result = parent.seal_with(&core.syncer, |seal_offset| {
            let mut topo = core.topology.lock();
            let rec = ManifestRecord::Split {
                topic_id: self.inner.id,
                parent: partition,
                seal_offset,
                children: children.clone(),
            };
            core.commit(&mut topo, rec)?;
            drop(topo);
            self.install_children(&[(partition, seal_offset)], &children, segs.clone());
            Ok(seal_offset)
        });
        match result {
            Ok(seal_offset) => {
                self.seed_children(&[&parent], &ids);
                core.events.emit(TopologyEvent::Split {
                    topic: self.name().into(),
                    parent: partition,
                    seal_offset,
                    children: ids.clone(),
                });
                Ok(ids)
            }
            Err(e) => {
                drop(segs);
                // After a failed commit the record may be on disk: keep the
                // children for the replay (an open that does not find the
                // record removes them as orphans). Otherwise the parent's
                // sync may have failed: log-wide syncs report it.
                if !matches!(e, Error::LogPoisoned { .. }) {
                    core.note_poisoned(&parent);
                    self.remove_partition_files(&ids);
                }
                Err(e)
            }
        }
    }

    /// Merges two active partitions with adjacent ranges into one child.
    /// A sealed one is refused with [`Error::Sealed`].
    pub fn merge(&self, a: u32, b: u32) -> Result<u32> {
        let _change = self.inner.change.lock();
        self.check_live()?;
        let (left, right) = {
            let st = self.inner.state.read();
            let get = |id: u32| -> Result<&Node> {
                let n = st.nodes.get(&id).ok_or_else(|| Error::UnknownPartition {
                    topic: self.name().into(),
                    partition: id,
                })?;
                if n.rec.state != PartitionState::Active {
                    return Err(Error::Sealed {
                        topic: self.name().into(),
                        partition: id,
                    });
                }
                Ok(n)
            };
            let (na, nb) = (get(a)?, get(b)?);
            let (l, r) = if na.rec.start < nb.rec.start {
                (na, nb)
            } else {
                (nb, na)
            };
            if l.rec.end.checked_add(1) != Some(r.rec.start) {
                return Err(Error::Refused(format!(
                    "partitions {a} and {b} do not have adjacent ranges"
                )));
            }
            let min = self.config().balance.min_partitions as usize;
            if st.routes.len() - 1 < min {
                return Err(Error::Refused(format!(
                    "merge would go below min_partitions ({min})"
                )));
            }
            (
                (l.rec.id, l.rec.start, l.part.clone()),
                (r.rec.id, r.rec.end, r.part.clone()),
            )
        };
        let id = self.next_partition_id();
        let segs = self.create_partition_files(&[id])?;
        let child = PartitionRecord {
            id,
            start: left.1,
            end: right.1,
            parents: vec![left.0, right.0],
            state: PartitionState::Active,
            created_ms: now_ms(),
            removed_parents: Vec::new(),
        };
        let core = self.inner.core.clone();
        let result = left.2.seal_with(&core.syncer, |lend| {
            right.2.seal_with(&core.syncer, |rend| {
                let mut topo = core.topology.lock();
                let parents = vec![(left.0, lend), (right.0, rend)];
                core.commit(
                    &mut topo,
                    ManifestRecord::Merge {
                        topic_id: self.inner.id,
                        parents: parents.clone(),
                        child: child.clone(),
                    },
                )?;
                drop(topo);
                self.install_children(&parents, std::slice::from_ref(&child), segs.clone());
                Ok(parents)
            })
        });
        match result {
            Ok(parents) => {
                self.seed_children(&[&left.2, &right.2], &[id]);
                core.events.emit(TopologyEvent::Merge {
                    topic: self.name().into(),
                    parents,
                    child: id,
                });
                Ok(id)
            }
            Err(e) => {
                drop(segs);
                if !matches!(e, Error::LogPoisoned { .. }) {
                    core.note_poisoned(&left.2);
                    core.note_poisoned(&right.2);
                    self.remove_partition_files(&[id]);
                }
                Err(e)
            }
        }
    }

    /// Removes the sealed partitions that retention emptied, oldest first
    /// (one whose parent is still there waits for it: until then a reader
    /// may still be draining the parent, and must find this partition to
    /// continue the lineage in order). Returns how many were removed.
    pub(crate) fn remove_emptied(&self) -> Result<usize> {
        let _change = self.inner.change.lock();
        if self.is_deleted() {
            // Its partitions went with it.
            return Ok(0);
        }
        let mut removed = 0;
        loop {
            let next = {
                let st = self.inner.state.read();
                st.nodes
                    .values()
                    .find(|n| {
                        n.rec.state != PartitionState::Active
                            && n.rec.parents.iter().all(|p| !st.nodes.contains_key(p))
                            && n.part.fully_retired()
                    })
                    .map(|n| (n.rec.id, n.part.clone()))
            };
            let Some((id, part)) = next else {
                return Ok(removed);
            };
            self.remove_partition(id, &part)?;
            removed += 1;
        }
    }

    /// Removes one emptied sealed partition, in the order that keeps every
    /// crash recoverable in Strict mode: (1) a durable `RemovePartition`
    /// record (a crash before it finds the partition with its retention
    /// floor at its end: empty, not damaged), (2) out of the in-memory
    /// topology and the checkpoint, (3) its directory deleted and the
    /// topic directory fsynced (a crash before that leaves a directory no
    /// manifest record names: recovery removes it as an orphan and
    /// reports it). Called under the change lock.
    pub(super) fn remove_partition(&self, id: u32, part: &Arc<Partition>) -> Result<()> {
        let core = &self.inner.core;
        let dropped_indexes = {
            let mut topo = core.topology.lock();
            let kept = |topo: &crate::core::Topology| -> Vec<u32> {
                topo.state
                    .topics
                    .iter()
                    .find(|t| t.id == self.inner.id)
                    .map(|t| {
                        t.tail_moves
                            .iter()
                            .filter(|m| m.index_in_topic_dir)
                            .map(|m| m.parent)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let before = kept(&topo);
            core.commit(
                &mut topo,
                ManifestRecord::RemovePartition {
                    topic_id: self.inner.id,
                    partition: id,
                },
            )?;
            let after = kept(&topo);
            before
                .into_iter()
                .filter(|p| !after.contains(p))
                .collect::<Vec<u32>>()
        };
        part.mark_removed();
        {
            // Through `write_state`: the topology generation moves, so
            // readers take a lineage without the removed partition.
            // A tail split's index stays for this run: a reader still
            // positioned past the removed parent's logical end is
            // translated at its next look, not sent back to the children's
            // first offsets.
            let mut st = self.inner.write_state();
            if let Some(n) = st.nodes.remove(&id) {
                // As the record did in the manifest (with the seal readers
                // used: the recovered end, where that is lower).
                if let PartitionState::Sealed { end_offset } = n.rec.state {
                    for c in &n.children {
                        if let Some(child) = st.nodes.get_mut(c) {
                            child.rec.removed_parents.push((id, end_offset));
                        }
                    }
                    st.removed.push(crate::format::manifest::RemovedPartition {
                        id,
                        parents: n.rec.parents.clone(),
                        end_offset,
                    });
                    crate::topology::model::bound_removed(&mut st.removed);
                }
            }
        }
        core.ck_cache.lock().remove_partition(self.inner.id, id);
        // A reader waiting on the removed partition moves on.
        self.inner.wake.notify_partition(id);
        core.events.emit(TopologyEvent::PartitionRemoved {
            topic: self.name().into(),
            partition: id,
        });
        // Committed: a failure from here on leaves an orphan directory for
        // the next open to remove, never a partition the manifest misses.
        let dir = partition_dir(&self.inner.dir, id);
        core.hook
            .before(IoOp::RemovePartitionDir, &dir)
            .and_then(|()| std::fs::remove_dir_all(&dir))
            .map_err(|e| Error::io(&dir, e))?;
        // Descendant indexes whose tail entry the record dropped (the
        // parent left the removed list); this run's readers keep theirs in
        // memory. A crash before this leaves them for the next open.
        for parent in dropped_indexes {
            let path = self
                .inner
                .dir
                .join(crate::format::tail_index::file_name(parent));
            let _ = std::fs::remove_file(&path);
        }
        sync_dir(&*core.hook, IoOp::SyncNewDir, &self.inner.dir)
    }

    pub(crate) fn next_partition_id(&self) -> u32 {
        let topo = self.inner.core.topology.lock();
        topo.state
            .topics
            .iter()
            .find(|t| t.id == self.inner.id)
            .map_or(0, |t| t.next_partition_id)
    }

    /// Updates the in-memory topology after a committed split or merge.
    pub(super) fn install_children(
        &self,
        parents: &[(u32, u64)],
        children: &[PartitionRecord],
        segs: Vec<Arc<Segment>>,
    ) {
        let parts: Vec<Arc<Partition>> = children
            .iter()
            .zip(segs)
            .map(|(c, s)| self.make_partition(c.id, vec![s], (c.start, c.end), false, (0, 64, 0)))
            .collect();
        self.install_children_with(parents, children, parts, None);
    }

    /// [`Topic::install_children`] with the children's partitions built.
    pub(crate) fn install_children_with(
        &self,
        parents: &[(u32, u64)],
        children: &[PartitionRecord],
        parts: Vec<Arc<Partition>>,
        tail: Option<(u32, Arc<crate::topic::tail_split::TailInfo>)>,
    ) {
        let now = self.inner.core.clock.now_nanos();
        let mut st = self.inner.write_state();
        // A tail split's entry goes in with the seal, under one write: a
        // reader taking the lineage in between would see the parent sealed
        // at its logical end without it, take a position past that end for
        // drained, and read the moved records again from the children.
        if let Some((parent, info)) = tail {
            // The parent's reads stop at `from` from here on: after the
            // generation moved (`write_state`), so whoever sees the parent
            // cut there also sees the new generation and finds the moved
            // records in the children (a key reader takes a read that stops
            // short of its bound for the end of the parent only when the
            // generation did not move); and under the write lock, so a
            // lineage built under the read lock sees the cut with it (a
            // reader seeing the new lineage reads the parent up to `from`
            // only).
            if let Some(n) = st.nodes.get(&parent) {
                n.part.set_logical_end(info.index.from);
            }
            st.tails.insert(parent, info);
        }
        for &(pid, end_offset) in parents {
            if let Some(n) = st.nodes.get_mut(&pid) {
                n.rec.state = PartitionState::Sealed { end_offset };
                n.children.extend(children.iter().map(|c| c.id));
                n.part.mark_sealed();
                let start = n.rec.start;
                st.routes.remove(&start);
            }
        }
        for (c, p) in children.iter().zip(parts) {
            st.routes.insert(c.start, c.id);
            st.nodes.insert(
                c.id,
                Node {
                    rec: c.clone(),
                    children: Vec::new(),
                    part: p,
                    last_change_nanos: now,
                    hot_key_reported: false,
                },
            );
        }
    }
}

/// The children ranges of a split of `parent`'s `[start, end]` by `plan`:
/// reads what the plan needs from the parent's recent load, then the pure
/// [`split_ranges`].
pub(crate) fn plan_ranges(
    start: u64,
    end: u64,
    plan: SplitPlan,
    parent: &Partition,
) -> Result<Vec<(u64, u64)>> {
    split_ranges(start, end, plan, &load_cuts(plan, parent))
}

/// What `plan` needs from `parent`'s load map (nothing for a plan that
/// names its points).
fn load_cuts(plan: SplitPlan, parent: &Partition) -> LoadCuts {
    let median = || parent.with_writer(|w| w.load.split_point());
    match plan {
        SplitPlan::LoadMedian => LoadCuts {
            median: median(),
            quantiles: Vec::new(),
        },
        SplitPlan::LoadQuantiles(k) if (2..=16).contains(&k) => {
            let quantiles = parent.with_writer(|w| w.load.quantile_points(usize::from(k)));
            LoadCuts {
                median: if quantiles.len() < 2 { median() } else { None },
                quantiles,
            }
        }
        _ => LoadCuts::default(),
    }
}
