//! Tail splits: a split that also moves the parent's backlog from an offset
//! on into the children (see `docs/TAIL_SPLIT.md`).
//!
//! The children are created unrouted; the parent's records from `from` on
//! are copied into them (each into the child owning its key hash) while
//! appends to the parent go on, in rounds that catch up with its end, and
//! synced; then the parent's writer lock is taken for the last short
//! range, the rest of the children, the descendant index and the parent
//! are synced, and one `TailSplit` manifest record commits it all. From then on the parent
//! logically ends at `from`, and its offsets `from..seal` live in the
//! children, before anything appended to them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{Error, IoContext, Result};
use crate::events::TopologyEvent;
use crate::format::batch::RecordIn;
use crate::format::manifest::{ManifestRecord, PartitionRecord, TailGroupMove, TailMove};
use crate::format::tail_index::{self, TailIndex};
use crate::partition::Partition;
use crate::read::ReadIsolation;
use crate::storage::fault::IoOp;
use crate::storage::{sync_dir, sync_file};
use crate::topic::{key_hash, partition_dir, SplitPlan, Topic};
use crate::topology::command::{Applied, TopologyCommand};
pub use crate::topology::command::{TailFrom, TailSplitOptions};
use crate::topology::lineage::Lineage;
pub(crate) use crate::topology::tail::TailInfo;
pub use crate::topology::tail::{MovedChild, MovedRange};

pub use crate::topology::tail::TailSplitOutcome;

/// Records copied at once into one child (and the most read at once from
/// the parent).
const CHUNK_BYTES: usize = 256 * 1024;
/// Catch-up stops when at most this many records are left for the sealed
/// round, after `MAX_ROUNDS` rounds, or when a round did not shrink what
/// is left (appends outrun the copy).
const CATCH_UP_RECORDS: u64 = 4096;
const MAX_ROUNDS: u32 = 16;

/// Copies records `pos..to` of the parent into the children.
struct Copier<'a> {
    topic: &'a Topic,
    parent: &'a Partition,
    kids: &'a [Arc<Partition>],
    ranges: &'a [(u64, u64)],
    /// Next parent offset to copy.
    pos: u64,
    slots: Vec<u8>,
    bytes: u64,
    started: Instant,
    throttle: u64,
}

impl Copier<'_> {
    fn slot(&self, hash: Option<u64>, offset: u64) -> Result<usize> {
        match hash {
            // Keyed: the child owning the hash (ranges tile the parent's).
            // A record `append_to` put here whose hash lies outside the
            // range (below it: the first child; above it: the last) has no
            // routed order to keep. A hot key's lane records, which also
            // lie outside, never get here: `split_tail` refuses partitions
            // holding such lanes.
            Some(h) => Ok(self
                .ranges
                .partition_point(|&(s, _)| s <= h)
                .saturating_sub(1)),
            // Keyless records have no order to keep: spread by offset.
            None => Ok((offset % self.ranges.len() as u64) as usize),
        }
    }

    /// The rounds that copy while appends to the parent go on, until the
    /// gap left is small, stops shrinking (appends outrun the copy) or
    /// `MAX_ROUNDS` ran: the rest goes in the sealed round. Returns the
    /// rounds run.
    fn catch_up(&mut self) -> Result<u32> {
        let mut rounds = 0;
        let mut last_gap = u64::MAX;
        loop {
            let target = self.parent.end_offset();
            let gap = target.saturating_sub(self.pos);
            // A round that did not shrink the gap means appends outrun the
            // copy (its budget): the rest goes in the sealed round.
            if gap <= CATCH_UP_RECORDS || rounds >= MAX_ROUNDS || gap >= last_gap {
                break Ok(rounds);
            }
            last_gap = gap;
            rounds += 1;
            if let Err(e) = self.copy_to(target, true) {
                break Err(e);
            }
        }
    }

    /// Copies the parent's records `pos..to` into the children (at the
    /// throttle's pace when `throttled`).
    fn copy_to(&mut self, to: u64, throttled: bool) -> Result<()> {
        while self.pos < to {
            let batch = self.read_moved()?;
            let next = self.copy_batch(&batch, to)?;
            self.bytes += batch.len_bytes();
            self.pos = next;
            if throttled {
                self.throttle();
            }
        }
        Ok(())
    }

    /// The parent's batches from `pos` on, at most about a chunk. A hole
    /// salvage left in the moved range is refused.
    fn read_moved(&self) -> Result<crate::read::ReadBatch> {
        match self
            .parent
            .read_with(self.pos, CHUNK_BYTES, ReadIsolation::Written)
        {
            Err(Error::Hole { start, end, .. }) => Err(Error::Refused(format!(
                "offsets {start}..{end} of the moved range are a salvage hole: \
                 a tail split moves only contiguous records"
            ))),
            other => other,
        }
    }

    /// Appends the records of `batch` from `pos` up to `to` to the children
    /// owning them, in chunks, and notes each one's child in `slots`.
    /// Returns the parent offset after the last record copied.
    fn copy_batch(&mut self, batch: &crate::read::ReadBatch, to: u64) -> Result<u64> {
        let mut per: Vec<(Vec<RecordIn<'_>>, Vec<Option<u64>>, usize)> = (0..self.kids.len())
            .map(|_| (Vec::new(), Vec::new(), 0))
            .collect();
        let mut next = self.pos;
        for r in batch.try_iter() {
            let r = r?;
            if r.offset < self.pos {
                continue;
            }
            if r.offset >= to {
                break;
            }
            if r.offset != next {
                return Err(Error::Refused(format!(
                    "offset {next} of the moved range is missing"
                )));
            }
            let hash = r.key.map(|k| key_hash(self.topic.inner.hash_key, k));
            let s = self.slot(hash, r.offset)?;
            self.slots.push(s as u8);
            let rec = RecordIn {
                key: r.key,
                value: r.value,
                timestamp: r.timestamp,
            };
            let size = rec.encoded_len();
            let (recs, hashes, bytes) = &mut per[s];
            if *bytes + size > CHUNK_BYTES && !recs.is_empty() {
                self.kids[s].append(recs, hashes)?;
                recs.clear();
                hashes.clear();
                *bytes = 0;
            }
            recs.push(rec);
            hashes.push(hash);
            *bytes += size;
            next = r.offset + 1;
        }
        if next == self.pos {
            return Err(Error::Refused(format!(
                "no record at offset {} of the moved range",
                self.pos
            )));
        }
        for (s, (recs, hashes, _)) in per.iter().enumerate() {
            if !recs.is_empty() {
                self.kids[s].append(recs, hashes)?;
            }
        }
        Ok(next)
    }

    /// Sleeps while the copy runs ahead of its byte budget.
    fn throttle(&self) {
        if self.throttle > 0 {
            let due = Duration::from_secs_f64(self.bytes as f64 / self.throttle as f64);
            let spent = self.started.elapsed();
            if due > spent {
                std::thread::sleep(due - spent);
            }
        }
    }
}

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

/// The first offset of the batch holding `offset` in `part` (`offset`
/// itself at the end).
fn batch_start(part: &Partition, offset: u64) -> Result<u64> {
    if offset >= part.end_offset() {
        return Ok(offset);
    }
    let b = part.read_with(offset, 1, ReadIsolation::Written)?;
    Ok(b.first_batch_base())
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

/// What [`Topic::reclaim_tail`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TailReclaimOutcome {
    /// The parent's moved range (`from..to`).
    pub from: u64,
    /// End of the moved range (the parent's seal).
    pub to: u64,
    /// The `TailReclaimed` record was written by this call.
    pub recorded: bool,
    /// Bytes of the parent's files released by this call (allocated blocks
    /// before minus after).
    pub released_bytes: u64,
    /// The parent's files now end at `from`. `false` while a read batch
    /// of the segment holding `from` is alive (one taken before the split
    /// may cover records past `from`): that segment's part past `from` is
    /// released by a later call (retention's pass, the next open).
    pub complete: bool,
}

impl Topic {
    /// Releases the bytes of a tail-split parent's moved range (its records
    /// `from..seal` live in the children).
    ///
    /// Nothing reads them any more once the split committed: reads of the
    /// parent stop at `from`, and every position past it (a `Cut`, a live
    /// reader, a group's committed or reading position) is translated to
    /// the children before anything is read. So the range is reclaimed
    /// right away, with one exception: a read batch taken before the split
    /// (a reader's pending records) may still cover bytes past `from`, so
    /// the segment holding `from` is cut only while no read batch of it is
    /// alive.
    ///
    /// Steps, each crash-safe: a durable `TailReclaimed` record (from then
    /// on recovery takes the parent as ending anywhere in `from..seal`);
    /// the segments wholly past `from` unlinked, newest first; the segment
    /// holding `from` cut there (its bytes past `from` punched out, the
    /// file keeping its size, so no mapping faults). An interrupted reclaim
    /// is finished at the next open, and by the next call.
    ///
    /// [`Log::enforce_retention`](crate::Log::enforce_retention) calls it
    /// for every tail-split parent of every topic. Errors:
    /// [`Error::UnknownPartition`] (not in the topology), [`Error::Refused`]
    /// (not a tail-split parent).
    pub fn reclaim_tail(&self, partition: u32) -> Result<TailReclaimOutcome> {
        let _change = self.inner.change.lock();
        self.check_live()?;
        let (part, info) = {
            let st = self.inner.state.read();
            let n = st
                .nodes
                .get(&partition)
                .ok_or_else(|| Error::UnknownPartition {
                    topic: self.name().into(),
                    partition,
                })?;
            let info = st.tails.get(&partition).cloned().ok_or_else(|| {
                Error::Refused(format!("partition {partition} is not a tail-split parent"))
            })?;
            (n.part.clone(), info)
        };
        self.reclaim_locked(&part, &info)
    }

    /// Reclaims every tail-split parent still holding bytes of its moved
    /// range (retention's pass). Returns the bytes released.
    pub(crate) fn reclaim_tails(&self) -> Result<u64> {
        let _change = self.inner.change.lock();
        if self.is_deleted() {
            // Its files went with it.
            return Ok(0);
        }
        let todo: Vec<(Arc<Partition>, Arc<TailInfo>)> = {
            let st = self.inner.state.read();
            st.tails
                .iter()
                .filter_map(|(id, t)| Some((st.nodes.get(id)?.part.clone(), t.clone())))
                .collect()
        };
        let mut released = 0;
        for (part, info) in todo {
            released += self.reclaim_locked(&part, &info)?.released_bytes;
        }
        Ok(released)
    }

    fn reclaim_locked(&self, part: &Arc<Partition>, info: &TailInfo) -> Result<TailReclaimOutcome> {
        use std::sync::atomic::Ordering;
        let (from, to) = (info.index.from, info.index.seal);
        let mut out = TailReclaimOutcome {
            from,
            to,
            recorded: false,
            released_bytes: 0,
            complete: true,
        };
        if from >= to || part.is_removed() {
            return Ok(out);
        }
        let ends_at = |p: &Partition| p.segments().last().is_none_or(|s| s.end_offset() <= from);
        if info.reclaimed.load(Ordering::Acquire) && ends_at(part) {
            return Ok(out);
        }
        let before = allocated_bytes(part.dir());
        if !info.reclaimed.load(Ordering::Acquire) {
            let core = &self.inner.core;
            // A split written before the index moved to the topic's
            // directory: once the bytes go the index cannot be derived
            // again, so it is copied there first (an orphan the next open
            // removes if the record does not follow) and the record moves
            // the entry to the new rule.
            let old_layout = {
                let topo = core.topology.lock();
                topo.state
                    .topics
                    .iter()
                    .find(|t| t.id == self.inner.id)
                    .and_then(|t| t.tail_moves.iter().find(|m| m.parent == part.id()))
                    .is_some_and(|m| !m.index_in_topic_dir)
            };
            // (An index whose file was lost has nothing to copy.)
            let old_layout = old_layout && !info.index.is_lost();
            if old_layout {
                let path = self.inner.dir.join(tail_index::file_name(part.id()));
                write_index(self, &path, &info.index.encode())?;
            }
            let mut topo = core.topology.lock();
            core.commit(
                &mut topo,
                ManifestRecord::TailReclaimed {
                    topic_id: self.inner.id,
                    parent: part.id(),
                    index_in_topic_dir: old_layout,
                },
            )?;
            drop(topo);
            info.reclaimed.store(true, Ordering::Release);
            out.recorded = true;
        }
        out.complete = part.reclaim_past(from)?;
        out.released_bytes = before.saturating_sub(allocated_bytes(part.dir()));
        Ok(out)
    }
}

/// The seal recovery checks a sealed partition's files against: for a
/// tail-split parent whose moved range was reclaimed, its logical end (its
/// files may end anywhere from there to the seal); else the seal.
pub(crate) fn recovery_seal(
    rec: &crate::format::manifest::TopicRecord,
    partition: u32,
    seal: u64,
) -> u64 {
    rec.tail_moves
        .iter()
        .find(|m| m.parent == partition && m.reclaimed)
        .map_or(seal, |m| m.from.min(seal))
}

/// Checkpoint entries of reclaimed tail-split parents that name more than
/// their files hold: a reclaim cut the files after the checkpoint was
/// written (a segment past the logical end unlinked, or the segment
/// holding it cut there). Each is replaced by the end of the files as they
/// are (the segment holding the logical end, walked to its last batch), so
/// recovery does not take the released range for missing data.
pub(crate) fn reclaimed_checkpoints(
    dir: &std::path::Path,
    topics: &[crate::format::manifest::TopicRecord],
    ck: &crate::format::checkpoint::Checkpoint,
) -> std::collections::HashMap<(u32, u32), crate::format::checkpoint::PartitionCheckpoint> {
    let mut out = std::collections::HashMap::new();
    for t in topics {
        let tdir = crate::layout::topic_dir(dir, t.id);
        for m in t.tail_moves.iter().filter(|m| m.reclaimed) {
            let Some(cp) = ck
                .partitions
                .iter()
                .find(|c| c.topic_id == t.id && c.partition_id == m.parent)
            else {
                continue;
            };
            if let Some(c) = reclaimed_checkpoint(&partition_dir(&tdir, m.parent), m.from, cp) {
                out.insert((t.id, m.parent), c);
            }
        }
    }
    out
}

fn reclaimed_checkpoint(
    pdir: &std::path::Path,
    from: u64,
    cp: &crate::format::checkpoint::PartitionCheckpoint,
) -> Option<crate::format::checkpoint::PartitionCheckpoint> {
    use crate::storage::segment::{parse_segment_file_name, segment_file_name};
    // A checkpoint naming nothing past `from` names what a reclaim keeps
    // (it never cuts below `from`). A walk that stops below it met damage,
    // not the reclaim's cut: taken as the end, it would turn the valid
    // batches after the damage into an unsynced tail.
    if cp.end_offset <= from {
        return None;
    }
    let bases: Vec<u64> = std::fs::read_dir(pdir)
        .ok()?
        .flatten()
        .filter_map(|e| parse_segment_file_name(&e.file_name().to_string_lossy()))
        .collect();
    let Some(keep) = bases.iter().copied().filter(|&b| b <= from).max() else {
        // Retention deleted every segment (the parent's records all aged
        // out before it could go): nothing is held, neither below the
        // logical end nor in the released range past it. The checkpoint
        // named offsets up to the physical seal; the parent ends at `from`.
        return (bases.is_empty() && cp.end_offset > from).then(|| {
            crate::format::checkpoint::PartitionCheckpoint {
                end_offset: from,
                ..cp.clone()
            }
        });
    };
    if cp.segment_base < keep
        || cp.segment_base > keep && pdir.join(segment_file_name(cp.segment_base)).exists()
    {
        return None;
    }
    let data = crate::storage::file::read_optional(
        &pdir.join(segment_file_name(keep)),
        crate::config::MAX_SEGMENT_BYTES,
    )
    .ok()??;
    let mut pos = crate::format::segment::SEGMENT_HEADER_LEN;
    let mut next = keep;
    while pos < data.len() {
        let Ok(h) = crate::format::batch::parse_header(&data[pos..]) else {
            break;
        };
        if h.base_offset.get() != next || h.batch_len.get() == 0 {
            break;
        }
        next += u64::from(h.record_count.get());
        pos += h.batch_len.get() as usize;
    }
    if cp.segment_base == keep && cp.end_offset <= next {
        return None;
    }
    Some(crate::format::checkpoint::PartitionCheckpoint {
        segment_base: keep,
        position: pos as u64,
        end_offset: next,
        ..cp.clone()
    })
}

/// Bytes allocated to the files of a directory (`du`).
pub(crate) fn allocated_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

/// Writes the descendant index durably: the file, then its directory.
fn write_index(topic: &Topic, path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let hook = &*topic.inner.core.hook;
    hook.before(IoOp::WriteIndex, path).at(path)?;
    let mut f = crate::storage::file::create_scratch(path)?;
    f.write_all(bytes).at(path)?;
    sync_file(hook, IoOp::SyncNewSegment, &f, path, true)?;
    let dir = path.parent().expect("the topic directory");
    sync_dir(hook, IoOp::SyncNewDir, dir)
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

/// Where a committed tail split's descendant index is: the topic's
/// directory, or the first child's for splits written before.
fn index_path(topic_dir: &std::path::Path, m: &TailMove, first: u32) -> PathBuf {
    if m.index_in_topic_dir {
        topic_dir.join(tail_index::file_name(m.parent))
    } else {
        partition_dir(topic_dir, first).join(tail_index::file_name(m.parent))
    }
}

/// Loads a topic's committed tail splits at open: reads and checks each
/// descendant index. Returns them by parent.
///
/// An index file that is missing or does not match its manifest record
/// is damage: `Strict` refuses the log naming the file. `Truncate` and
/// `Salvage` (with `report`) go on with the split's range and counts from
/// the manifest and a conservative translation (positions inside the
/// moved range resume the children at their first moved record, so
/// records may be read again but none is skipped), and report it at every
/// open. Any other error reading the file (permissions, descriptors) is
/// not damage and fails the open.
pub(crate) fn load_tails(
    topic_dir: &std::path::Path,
    moves: &[TailMove],
    mut report: Option<(
        crate::config::RecoveryMode,
        &mut crate::recovery::RecoveryReport,
    )>,
) -> Result<BTreeMap<u32, Arc<TailInfo>>> {
    let mut out = BTreeMap::new();
    for m in moves {
        let Some(&first) = m.children.first() else {
            continue;
        };
        let path = index_path(topic_dir, m, first);
        let index = match read_index(&path, m) {
            Ok(index) => index,
            Err(e) => {
                let damage = match &e {
                    Error::Corruption { .. } => true,
                    Error::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
                    _ => false,
                };
                match report.as_mut() {
                    Some((mode, report))
                        if damage && *mode != crate::config::RecoveryMode::Strict =>
                    {
                        report.add(
                            &path,
                            crate::recovery::FileAction::DescendantIndexLost {
                                parent: m.parent,
                                moved_offsets: (m.from, m.seal_offset),
                                reason: e.to_string(),
                            },
                        );
                        TailIndex::without_slots(m.parent, m.from, m.seal_offset, m.counts.clone())
                    }
                    _ => return Err(e),
                }
            }
        };
        out.insert(
            m.parent,
            Arc::new(TailInfo {
                children: m.children.clone(),
                index,
                reclaimed: m.reclaimed.into(),
            }),
        );
    }
    Ok(out)
}

/// The longest descendant index of the move `m` that is read: exactly
/// the length of the file its split wrote (a slot byte per moved record,
/// which no fixed cap bounds). A longer file is not that index, and is
/// refused before it is read whole.
fn index_max_bytes(m: &TailMove) -> u64 {
    TailIndex::file_len(m.from, m.seal_offset)
}

/// Reads a descendant index and checks it against its manifest record.
fn read_index(path: &std::path::Path, m: &TailMove) -> Result<TailIndex> {
    let file = crate::storage::file::open_file(path, crate::storage::file::Access::Read)?;
    let bytes = crate::storage::file::read_to_end(&file, path, index_max_bytes(m))?;
    let bad = |reason: String| Error::Corruption {
        file: path.to_path_buf(),
        position: 0,
        reason,
    };
    if TailIndex::crc(&bytes) != m.index_crc {
        return Err(bad(
            "descendant index does not match its manifest record".into()
        ));
    }
    let index = TailIndex::decode(&bytes).map_err(bad)?;
    if index.from != m.from || index.seal != m.seal_offset || index.counts() != m.counts {
        return Err(bad(
            "descendant index does not match its manifest record".into()
        ));
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read cap of a descendant index admits the file a split of any
    /// size writes (a slot byte per moved record: a split moving more
    /// than 2^30 records writes more than a GiB), and nothing longer.
    #[test]
    fn the_descendant_index_cap_admits_the_index_of_a_split_of_any_size() {
        for moved in [0u64, 1, 4096, 1 << 30, 1 << 31, 1 << 40] {
            let m = TailMove {
                parent: 0,
                from: 7,
                seal_offset: 7 + moved,
                children: vec![1, 2],
                counts: vec![moved, 0],
                index_crc: 0,
                reclaimed: false,
                index_in_topic_dir: true,
            };
            assert_eq!(
                index_max_bytes(&m),
                TailIndex::file_len(m.from, m.seal_offset),
                "{moved} records moved"
            );
        }
    }
}
