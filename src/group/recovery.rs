//! The open-time check of the groups' committed positions against what
//! recovery kept.

use crate::error::Result;
use crate::recovery::LostGroupPosition;
use crate::topic::Topic;

use super::committed::Committed;

/// After recovery: every group position past its partition's recovered end
/// (records the group consumed that a power loss cut, whose offsets new
/// appends would reuse) is moved back to the end, durably, and reported,
/// before anything can be appended.
pub(crate) fn check_group_positions(topics: &[Topic]) -> Result<Vec<LostGroupPosition>> {
    let mut lost = Vec::new();
    for t in topics {
        for name in t.groups() {
            let Some(g) = t.group_record(&name) else {
                continue;
            };
            let mut rewind = Committed::default();
            let lineage = t.lineage();
            for (&p, &pos) in &g.positions {
                let Ok(part) = t.partition(p) else { continue };
                let end = part.end_offset();
                // Past a tail-split parent's logical end, up to its seal, a
                // position continues in the children (translated at the
                // group's first look): a commit that raced the split wrote
                // it, from records handed out before. Not lost.
                if lineage
                    .tails
                    .get(&p)
                    .is_some_and(|tail| pos <= tail.index.seal)
                {
                    continue;
                }
                if pos > end {
                    let (at, last) = t.latest_position(p, end)?;
                    rewind.positions.insert(p, at);
                    if let Some(f) = last {
                        rewind.last_records.insert(p, f);
                    }
                    lost.push(LostGroupPosition {
                        topic: t.name().to_string(),
                        group: name.clone(),
                        partition: p,
                        committed: pos,
                        end,
                    });
                }
            }
            if !rewind.positions.is_empty() {
                t.commit_group(&name, g.generation, &rewind, &[], &[])?;
            }
        }
    }
    Ok(lost)
}
