//! Releasing a tail-split parent's moved range once the split committed,
//! and what recovery needs to know of a reclaimed parent.

use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::manifest::ManifestRecord;
use crate::format::tail_index;
use crate::partition::Partition;
use crate::topic::{partition_dir, Topic};

use super::{write_index, TailInfo};

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
fn allocated_bytes(dir: &std::path::Path) -> u64 {
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
