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
use crate::format::manifest::TopicRecord;
use crate::topology::command::{validate, Applied, HashRange, Plan, TopologyCommand};
use crate::topology::ranges::{child_records, split_ranges, LoadCuts};

/// The load map of a partition made over `[start, end]`. A sealed one
/// takes no more appends, so nothing is ever observed into its map and no
/// split point is ever chosen from it: it gets a map of one bucket and one
/// counter instead of the default 64 and 16 (about 900 bytes), which a
/// topic with a long history keeps once per partition ever sealed.
fn load_map(start: u64, end: u64, sealed: bool, now: u64) -> LoadMap {
    if !sealed {
        return LoadMap::new(start, end, now);
    }
    let config = crate::balance::LoadMapConfig {
        buckets: 1,
        top_k: 1,
        ..Default::default()
    };
    LoadMap::with_config(start, end, &config, now)
}

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
            let seg = Segment::create_version(
                &dir,
                (self.inner.id, id),
                0,
                cfg.segment_bytes,
                (now_ms(), crate::partition::segment_version(cfg.replicated)),
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
                    budget: self.inner.core.budget.clone(),
                    replicated: cfg.replicated,
                },
                seg,
                sealed,
                durable,
                RateTracker::new(&crate::balance::DEFAULT_WINDOWS, now),
                load_map(start, end, sealed, now),
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
        match self.apply(self.split_command(partition, plan)?)? {
            Applied::Split { children } => Ok(children),
            other => unreachable!("a split command applies as a split: {other:?}"),
        }
    }

    /// The command of a forward split of `partition` by `plan`: the plan
    /// is resolved here, against the partition's range and recent load,
    /// into the children's ranges, so applying the command does not depend
    /// on the load any more. Errors as [`Topic::split`] (for the state of
    /// the partition now; [`Topic::apply`] checks again).
    pub fn split_command(&self, partition: u32, plan: SplitPlan) -> Result<TopologyCommand> {
        Ok(TopologyCommand::Split {
            partition,
            ranges: self.children_ranges(partition, plan)?,
        })
    }

    /// The children's ranges of a split of the active `partition` by `plan`.
    pub(super) fn children_ranges(
        &self,
        partition: u32,
        plan: SplitPlan,
    ) -> Result<Vec<HashRange>> {
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
        Ok(plan_ranges(start, end, plan, &parent)?
            .into_iter()
            .map(|(start, end)| HashRange { start, end })
            .collect())
    }

    /// Applies a topology change: the one path every split, merge, tail
    /// split, hot-key mode change and partition removal takes, whether the
    /// API, the balancer or the CLI made the command. Under the topic's
    /// change lock, [`validate`] checks the command against the committed
    /// topology (deterministic: the same command against the same topology
    /// gives the same outcome), then the change is built and committed by
    /// one durable manifest record.
    ///
    /// Errors, with nothing changed: [`Error::UnknownPartition`],
    /// [`Error::Sealed`] (a split, tail split or merge of a sealed
    /// partition), [`Error::Refused`] (ranges that do not tile the parent,
    /// a partition limit, a removal the topology does not allow yet),
    /// [`Error::HotKeyMode`], and those of [`Topic::split_tail`].
    pub fn apply(&self, cmd: TopologyCommand) -> Result<Applied> {
        let _change = self.inner.change.lock();
        // Checked under the change lock: a split that failed to commit
        // poisons the log and keeps its children's files (its record may be
        // on disk); no later change may reuse their ids. A deleted topic
        // takes no children into its removed directory.
        self.check_live()?;
        self.apply_locked(&cmd)
    }

    /// [`Topic::apply`] under the change lock.
    pub(super) fn apply_locked(&self, cmd: &TopologyCommand) -> Result<Applied> {
        let plan = self.with_topic_record(|t| validate(t, cmd))?;
        match plan {
            Plan::Split {
                parent,
                ids,
                ranges,
                tail: None,
            } => self
                .commit_split(parent, ids, ranges)
                .map(|children| Applied::Split { children }),
            Plan::Split {
                parent,
                ids,
                ranges,
                tail: Some(options),
            } => self
                .split_tail_locked(parent, ids, ranges, options)
                .map(Applied::SplitTail),
            Plan::Merge {
                left,
                right,
                child,
                range,
            } => self
                .commit_merge(left, right, child, range)
                .map(|child| Applied::Merge { child }),
            Plan::HotKeyMode { hash, mode, lanes } => self
                .set_hash_mode_locked(hash, mode, lanes)
                .map(|()| Applied::HotKeyMode),
            Plan::RemovePartition { partition } => {
                let part = self.part_of(partition)?;
                if !part.fully_retired() {
                    return Err(Error::Refused(format!(
                        "partition {partition} still holds records retention keeps"
                    )));
                }
                self.remove_partition(partition, &part)
                    .map(|()| Applied::PartitionRemoved)
            }
        }
    }

    /// The partition `id` of the topology (open or not: a change under the
    /// change lock finds it whatever the log's state).
    fn part_of(&self, id: u32) -> Result<Arc<Partition>> {
        self.inner
            .state
            .read()
            .nodes
            .get(&id)
            .map(|n| n.part.clone())
            .ok_or_else(|| Error::UnknownPartition {
                topic: self.name().into(),
                partition: id,
            })
    }

    /// Runs `f` on the committed topology of the topic, as the manifest
    /// holds it, under the topology lock: borrowed, not copied, since a
    /// topic with a long history holds a record per partition ever made.
    fn with_topic_record<R>(&self, f: impl FnOnce(&TopicRecord) -> Result<R>) -> Result<R> {
        let topo = self.inner.core.topology.lock();
        let t = topo
            .state
            .topics
            .iter()
            .find(|t| t.id == self.inner.id)
            .ok_or_else(|| Error::UnknownTopic(self.name().into()))?;
        f(t)
    }

    /// Builds and commits a validated forward split of `partition` into
    /// children `ids` with `ranges`.
    fn commit_split(
        &self,
        partition: u32,
        ids: Vec<u32>,
        ranges: Vec<(u64, u64)>,
    ) -> Result<Vec<u32>> {
        let parent = self.part_of(partition)?;

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
        match self.apply(TopologyCommand::Merge { a, b })? {
            Applied::Merge { child } => Ok(child),
            other => unreachable!("a merge command applies as a merge: {other:?}"),
        }
    }

    /// Builds and commits a validated merge of `left` and `right` (in hash
    /// order) into `id` over `range`.
    fn commit_merge(&self, left: u32, right: u32, id: u32, range: (u64, u64)) -> Result<u32> {
        let left = (left, range.0, self.part_of(left)?);
        let right = (right, range.1, self.part_of(right)?);

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
            drop(part);
            self.apply_locked(&TopologyCommand::RemovePartition { partition: id })?;
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
        let dropped_indexes = self.commit_removal(id)?;
        part.mark_removed();
        self.forget_removed(id);
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

    /// Step (1) of [`Topic::remove_partition`]: the durable record. Returns
    /// the parents whose descendant index file the record dropped (their
    /// tail entry left the manifest with the removed list).
    fn commit_removal(&self, id: u32) -> Result<Vec<u32>> {
        let core = &self.inner.core;
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
        Ok(before.into_iter().filter(|p| !after.contains(p)).collect())
    }

    /// Step (2) of [`Topic::remove_partition`]: out of the in-memory
    /// topology, as the record did in the manifest.
    fn forget_removed(&self, id: u32) {
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
