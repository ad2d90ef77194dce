//! Tail splits: a split that also moves the parent's backlog from an offset
//! on into the children (see `docs/TAIL_SPLIT.md`).
//!
//! The children are created unrouted; the parent's records from `from` on
//! are copied into them (each into the child owning its key hash) while
//! appends to the parent go on, in rounds that catch up with its end, and
//! synced; then the parent's writer lock is taken for the last short
//! range, the rest of the children, the descendant index and the parent
//! are synced, and one `TailSplit` manifest record commits it all. From
//! then on the parent logically ends at `from`, and its offsets `from..seal` live in the
//! children, before anything appended to them.
//!
//! This file builds and commits the split; `copy.rs` moves the records,
//! `index.rs` writes and loads the descendant index, and `reclaim.rs`
//! releases the parent's moved range afterwards.

mod copy;
mod index;
mod reclaim;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::events::TopologyEvent;
use crate::format::manifest::{ManifestRecord, PartitionRecord, TailGroupMove};
use crate::format::tail_index::{self, TailIndex};
use crate::partition::Partition;
use crate::topic::{SplitPlan, Topic};
use crate::topology::command::{Applied, TopologyCommand};
pub use crate::topology::command::{TailFrom, TailSplitOptions};
use crate::topology::lineage::Lineage;
pub(crate) use crate::topology::tail::TailInfo;
pub use crate::topology::tail::{MovedChild, MovedRange};

pub use crate::topology::tail::TailSplitOutcome;

use copy::{batch_start, Copier};
pub(crate) use index::load_tails;
use index::write_index;
pub use reclaim::TailReclaimOutcome;
pub(crate) use reclaim::{reclaimed_checkpoints, recovery_seal};

/// A tail split being built, before its record commits.
struct TailBuild {
    /// The parent.
    partition: u32,
    /// The parent's first moved offset (its logical end once committed).
    from: u64,
    /// The children's ids.
    ids: Vec<u32>,
    /// The children as the manifest record names them.
    children: Vec<PartitionRecord>,
    /// The children, unrouted until the record commits.
    kids: Vec<Arc<Partition>>,
    /// Where the descendant index goes.
    index_path: PathBuf,
}

impl Topic {
    /// Splits an active partition as [`Topic::split`] does, and also moves
    /// its records from an offset on into the children, so the backlog is
    /// spread over them instead of waiting in the parent.
    ///
    /// Each moved record goes to the child owning its key's hash (keyless
    /// records by their offset modulo the number of children), and lands
    /// there before anything appended to the child later: per-key order
    /// holds. The copy runs while appends to the parent go on (throttled by
    /// [`TailSplitOptions::throttle_bytes_per_sec`]), then a short final
    /// round runs with appends to the parent waiting; one durable manifest
    /// record commits the move. From then on the parent logically ends at
    /// the returned `from`: reads, readers, `key_chain` and consumer
    /// groups continue in the children (positions inside the moved range
    /// are translated to the children's).
    ///
    /// Errors, with nothing changed: [`Error::UnknownPartition`],
    /// [`Error::Sealed`] (the partition is sealed),
    /// [`Error::OffsetOutOfRange`] (the offset is past the partition's end
    /// or below its first offset held), [`Error::Refused`] (as for
    /// [`Topic::split`], or no consumer group for
    /// [`TailFrom::SlowestGroup`]).
    pub fn split_tail(
        &self,
        partition: u32,
        plan: SplitPlan,
        options: TailSplitOptions,
    ) -> Result<TailSplitOutcome> {
        match self.apply(self.split_tail_command(partition, plan, options)?)? {
            Applied::SplitTail(out) => Ok(out),
            other => unreachable!("a tail split command applies as a tail split: {other:?}"),
        }
    }

    /// The command of a tail split of `partition` by `plan` (resolved
    /// here into the children's ranges, as [`Topic::split_command`] does).
    pub fn split_tail_command(
        &self,
        partition: u32,
        plan: SplitPlan,
        options: TailSplitOptions,
    ) -> Result<TopologyCommand> {
        Ok(TopologyCommand::SplitTail {
            partition,
            ranges: self.children_ranges(partition, plan)?,
            options,
        })
    }

    /// Builds and commits a validated tail split of `partition` into
    /// children `ids` with `ranges`. Under the change lock.
    pub(super) fn split_tail_locked(
        &self,
        partition: u32,
        ids: Vec<u32>,
        ranges: Vec<(u64, u64)>,
        options: TailSplitOptions,
    ) -> Result<TailSplitOutcome> {
        let (range, parent) = self.tail_parent(partition)?;
        let from = self.tail_start(partition, &parent, range, options.from)?;
        let build = self.build_tail_children(partition, from, ids, &ranges)?;
        let core = self.inner.core.clone();
        let mut copier = Copier {
            topic: self,
            parent: &parent,
            kids: &build.kids,
            ranges: &ranges,
            pos: from,
            slots: Vec::new(),
            bytes: 0,
            started: Instant::now(),
            throttle: options.throttle_bytes_per_sec,
        };
        let caught_up = copier.catch_up();
        let rounds = caught_up.as_ref().map_or(0, |&r| r);
        // The bulk of the children's bytes is synced before the parent's
        // writer lock is taken: under it only the last round's remain.
        let caught_up =
            caught_up.and_then(|_| build.kids.iter().try_for_each(|k| k.sync_now(&core.syncer)));
        let result = caught_up.and_then(|()| {
            parent.seal_with(&core.syncer, |seal_offset| {
                self.commit_tail_sealed(&build, &mut copier, seal_offset)
            })
        });
        let copied_bytes = copier.bytes;
        match result {
            Ok((seal_offset, moved)) => {
                self.seed_children(&[&parent], &build.ids);
                core.events.emit(TopologyEvent::Split {
                    topic: self.name().into(),
                    parent: partition,
                    seal_offset: from,
                    children: build.ids.clone(),
                });
                Ok(TailSplitOutcome {
                    children: build.ids,
                    from,
                    seal_offset,
                    moved,
                    copied_bytes,
                    rounds,
                })
            }
            Err(e) => {
                // After a failed commit the record may be on disk: keep the
                // children for the replay (an open that does not find the
                // record removes them as orphans).
                // Otherwise the parent's sync may have failed (it is then
                // poisoned): log-wide syncs report it.
                if !matches!(e, Error::LogPoisoned { .. }) {
                    core.note_poisoned(&parent);
                    self.remove_partition_files(&build.ids);
                    let _ = std::fs::remove_file(&build.index_path);
                }
                Err(e)
            }
        }
    }

    /// The range and handle of the partition a tail split starts from.
    fn tail_parent(&self, partition: u32) -> Result<((u64, u64), Arc<Partition>)> {
        let st = self.inner.state.read();
        let n = st
            .nodes
            .get(&partition)
            .ok_or_else(|| Error::UnknownPartition {
                topic: self.name().into(),
                partition,
            })?;
        Ok(((n.rec.start, n.rec.end), n.part.clone()))
    }

    /// Creates the children `ids` of a tail split of `partition` from
    /// `from`, with their files, unrouted: no sync round or checkpoint may
    /// name them before the record commits (their ids are reused if this
    /// fails).
    fn build_tail_children(
        &self,
        partition: u32,
        from: u64,
        ids: Vec<u32>,
        ranges: &[(u64, u64)],
    ) -> Result<TailBuild> {
        let segs = self.create_partition_files(&ids)?;
        let kids: Vec<Arc<Partition>> = ids
            .iter()
            .zip(ranges)
            .zip(segs)
            .map(|((&id, &r), s)| {
                let p = self.make_partition(id, vec![s], r, false, (0, 64, 0));
                p.mark_removed();
                p
            })
            .collect();
        let children = crate::topology::ranges::child_records(
            partition,
            &ids,
            ranges,
            crate::partition::now_ms(),
        );
        Ok(TailBuild {
            partition,
            from,
            ids,
            children,
            kids,
            // In the topic's directory: it outlives the children, as long
            // as a saved position in the parent may need it.
            index_path: self.inner.dir.join(tail_index::file_name(partition)),
        })
    }

    /// The sealed round, under the parent's writer lock at `seal_offset`:
    /// copies the last short range, syncs the children, writes the
    /// descendant index, commits the `TailSplit` record and installs the
    /// children. Returns the seal and the records moved per child.
    fn commit_tail_sealed(
        &self,
        build: &TailBuild,
        copier: &mut Copier<'_>,
        seal_offset: u64,
    ) -> Result<(u64, Vec<u64>)> {
        let core = &self.inner.core;
        copier.copy_to(seal_offset, false)?;
        for k in &build.kids {
            k.sync_now(&core.syncer)?;
        }
        let slots = std::mem::take(&mut copier.slots);
        let index = TailIndex::new(build.partition, build.from, build.ids.len(), slots);
        let bytes = index.encode();
        write_index(self, &build.index_path, &bytes)?;
        let counts = index.counts();
        let info = Arc::new(TailInfo {
            children: build.ids.clone(),
            index,
            reclaimed: false.into(),
        });
        let mut topo = core.topology.lock();
        let groups = translate_groups(&topo.state, self.inner.id, build.partition, &info);
        let rec = ManifestRecord::TailSplit {
            topic_id: self.inner.id,
            parent: build.partition,
            from: build.from,
            seal_offset,
            children: build.children.clone(),
            counts: counts.clone(),
            index_crc: TailIndex::crc(&bytes),
            groups,
            index_in_topic_dir: true,
        };
        core.commit(&mut topo, rec)?;
        drop(topo);
        for k in &build.kids {
            k.unmark_removed();
        }
        // Caps the parent at `from` with the generation moved (see
        // `install_children_with`).
        self.install_tail_children(
            build.partition,
            build.from,
            &build.children,
            build.kids.clone(),
            info,
        );
        Ok((seal_offset, counts))
    }

    /// Where a tail split of `partition` starts: the offset `from` asks
    /// for, rounded down to its batch's start, refused when it is outside
    /// the partition's records or a hot key's lanes or mode change sit in
    /// what would move.
    fn tail_start(
        &self,
        partition: u32,
        parent: &Partition,
        (start, end): (u64, u64),
        from: TailFrom,
    ) -> Result<u64> {
        let wanted = match from {
            TailFrom::Offset(x) => x,
            TailFrom::SlowestGroup => self.slowest_group_position(partition, parent)?,
        };
        let (held, now_end) = (parent.start_offset(), parent.end_offset());
        if wanted > now_end || wanted < held {
            return Err(Error::OffsetOutOfRange {
                partition,
                offset: wanted,
                start: held,
                end: now_end,
            });
        }
        let from = batch_start(parent, wanted)?;
        if self
            .inner
            .hot
            .blocks_tail_split(partition, (start, end), from)
        {
            // A windowed or spread key's records sit at its lane points,
            // not at its hash, and an era boundary is an offset of the
            // partition: moving them by key hash would break both.
            return Err(Error::Refused(format!(
                "partition {partition} holds lanes of a windowed or spread hot key, or a hot-key mode change past offset {from}"
            )));
        }
        Ok(from)
    }

    /// The slowest committed position of the topic's groups in `id`.
    fn slowest_group_position(&self, id: u32, part: &Partition) -> Result<u64> {
        let topo = self.inner.core.topology.lock();
        let t = topo
            .state
            .topics
            .iter()
            .find(|t| t.id == self.inner.id)
            .ok_or_else(|| Error::UnknownTopic(self.name().into()))?;
        if t.groups.is_empty() {
            return Err(Error::Refused(
                "no consumer group reads the topic: give the offset to move from".into(),
            ));
        }
        Ok(t.groups
            .iter()
            .map(|g| {
                g.positions
                    .get(&id)
                    .copied()
                    .unwrap_or_else(|| part.start_offset())
            })
            .min()
            .expect("at least one group"))
    }

    /// Updates the in-memory topology after a committed tail split: the
    /// parent sealed at its logical end, the children routed.
    fn install_tail_children(
        &self,
        parent: u32,
        from: u64,
        children: &[PartitionRecord],
        kids: Vec<Arc<Partition>>,
        info: Arc<TailInfo>,
    ) {
        self.install_children_with(&[(parent, from)], children, kids, Some((parent, info)));
    }

    /// Where a position of a tail-split parent continues (see
    /// [`TailInfo::translate`]).
    pub(crate) fn translate_tail(lineage: &Lineage, id: u32, pos: u64) -> Option<Vec<(u32, u64)>> {
        lineage.tails.get(&id).and_then(|t| t.translate(pos))
    }
}

/// Group positions of `parent` inside the moved range, translated.
fn translate_groups(
    state: &crate::format::manifest::ManifestState,
    topic_id: u32,
    parent: u32,
    info: &TailInfo,
) -> Vec<TailGroupMove> {
    let Some(t) = state.topics.iter().find(|t| t.id == topic_id) else {
        return Vec::new();
    };
    t.groups
        .iter()
        .filter_map(|g| {
            let pos = *g.positions.get(&parent)?;
            Some(TailGroupMove {
                group: g.name.clone(),
                positions: info.translate(pos)?,
            })
        })
        .collect()
}
