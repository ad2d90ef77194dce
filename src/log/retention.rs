//! Retention: expired sealed segments go (once the checkpoint no longer
//! needs them), then sealed partitions left empty leave the topology.

use std::sync::atomic::Ordering;

use super::TopicMap;
use crate::core::Core;
use crate::error::Result;

/// Retires expired segments, then removes the sealed partitions that
/// hold nothing any more (`Topic::remove_emptied`). Returns the number of
/// segments deleted.
pub(super) fn enforce_retention(core: &Core, topic_map: &TopicMap) -> Result<usize> {
    let topics = topic_map.all();
    // Tail-split parents give back their moved ranges (every topic: this
    // is not retention's policy, nothing readable goes). A failure is
    // returned after retention ran, which does not depend on it.
    let reclaimed = topics.iter().try_for_each(|t| t.reclaim_tails().map(drop));
    let deleted = retire_segments(core, topic_map)?;
    for t in topics {
        let cfg = t.config();
        if cfg.retention_age.is_some() || cfg.retention_bytes.is_some() {
            t.remove_emptied()?;
        }
    }
    reclaimed?;
    Ok(deleted)
}

fn retire_segments(core: &Core, topic_map: &TopicMap) -> Result<usize> {
    let topics = topic_map.all();
    let now = crate::partition::now_ms();
    let mut parts = Vec::new();
    let mut waits = false;
    for t in topics {
        let cfg = t.config();
        if cfg.retention_age.is_none() && cfg.retention_bytes.is_none() {
            continue;
        }
        for p in t.all_partition_handles() {
            let plan = p.plan_retention(cfg.retention_age, cfg.retention_bytes, now);
            waits |= plan.waits_for_checkpoint;
            if plan.floor_moved {
                parts.push(p);
            }
        }
    }
    // Segments held only because a recent checkpoint names them: have
    // every round write the checkpoint until they are released, rather
    // than wait for the checkpoint interval.
    core.checkpoint_for_retention
        .store(waits, Ordering::Release);
    if parts.is_empty() {
        return Ok(0);
    }
    // The new floors reach the checkpoint (durably) before any file goes.
    core.request_checkpoint();
    core.sync()?;
    let mut n = 0;
    for p in parts {
        n += p.delete_retired()?.len();
    }
    Ok(n)
}
