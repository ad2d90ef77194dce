//! The group's committed positions and what they leave unread, as pure
//! functions over the lineage: which partitions are ready, which were
//! read, and what retention removed under a committed position.

use std::collections::{BTreeMap, BTreeSet};

use crate::format::manifest::GroupRecord;
use crate::reader::{RetainedRange, REMOVED_END};
use crate::topology::lineage::Lineage;

/// The committed positions, as in the manifest.
#[derive(Debug, Clone, Default)]
pub(crate) struct Committed {
    pub(crate) positions: BTreeMap<u32, u64>,
    pub(crate) last_records: BTreeMap<u32, u64>,
    pub(crate) drained: BTreeSet<u32>,
}

impl Committed {
    pub(crate) fn from_record(g: &GroupRecord) -> Committed {
        Committed {
            positions: g.positions.clone(),
            last_records: g.last_records.clone(),
            drained: g.drained.clone(),
        }
    }

    /// Every partition the group has read to its seal: those listed as
    /// drained and every ancestor of a listed one.
    pub(crate) fn all_drained(&self, lineage: &Lineage) -> BTreeSet<u32> {
        let mut out: BTreeSet<u32> = self.drained.clone();
        out.extend(lineage.ancestors(self.positions.keys().chain(&self.drained).copied()));
        out
    }

    /// Ready partitions: listed with a position, or not drained with every
    /// parent drained (or removed).
    pub(crate) fn ready(&self, lineage: &Lineage) -> BTreeSet<u32> {
        let drained = self.all_drained(lineage);
        let mut out: BTreeSet<u32> = self
            .positions
            .keys()
            .copied()
            .filter(|&p| lineage.contains(p) && !drained.contains(&p))
            .collect();
        let mut candidates: Vec<u32> = lineage.roots().collect();
        for &d in &drained {
            candidates.extend_from_slice(lineage.children(d));
        }
        for c in candidates {
            if drained.contains(&c) || out.contains(&c) {
                continue;
            }
            if lineage
                .parents(c)
                .iter()
                .all(|q| drained.contains(q) || !lineage.contains(*q))
            {
                out.insert(c);
            }
        }
        out
    }

    /// Drops what the topology no longer has (retention removed it), as the
    /// manifest's `RemovePartition` does, except the position in a removed
    /// partition the topic still remembers: what the group had not read
    /// there is a loss to report ([`Loss`]), and the position stays until
    /// a member that was handed the report commits.
    pub(crate) fn forget_removed(&mut self, lineage: &Lineage) {
        self.positions
            .retain(|p, _| lineage.contains(*p) || lineage.removed.contains_key(p));
        self.last_records.retain(|p, _| lineage.contains(*p));
        self.drained.retain(|p| lineage.contains(*p));
    }

    /// What the group's positions in removed partitions leave unread, per
    /// removed partition, as a [`crate::Reader`] from the same cut reports
    /// it: the rest of the partition from the position to its seal, and
    /// every removed partition below it that nothing the group holds is
    /// below (a whole removed generation), each once.
    pub(crate) fn losses(&self, lineage: &Lineage) -> BTreeMap<u32, Loss> {
        let gone: BTreeSet<u32> = self
            .positions
            .keys()
            .filter(|p| !lineage.contains(**p))
            .copied()
            .collect();
        let mut out = BTreeMap::new();
        if gone.is_empty() {
            return out;
        }
        let behind = lineage.removed_ancestors(
            self.positions
                .keys()
                .chain(&self.drained)
                .filter(|p| !gone.contains(p))
                .copied(),
        );
        let passed = self.all_drained(lineage);
        let seal = |q: u32| {
            lineage
                .removed_seals
                .get(&q)
                .copied()
                .unwrap_or(REMOVED_END)
        };
        let mut reported: BTreeSet<u32> = BTreeSet::new();
        for &p in &gone {
            let mut ranges = Vec::new();
            let start = self.positions[&p];
            if start < seal(p) {
                ranges.push(RetainedRange {
                    partition: p,
                    start,
                    end: seal(p),
                });
            }
            let below = lineage.removed_descendants(p);
            for &q in &below {
                if gone.contains(&q) || behind.contains(&q) || !reported.insert(q) {
                    continue;
                }
                if seal(q) > 0 {
                    ranges.push(RetainedRange {
                        partition: q,
                        start: 0,
                        end: seal(q),
                    });
                }
            }
            let through: BTreeSet<u32> = below.iter().copied().chain([p]).collect();
            let heirs = self.heirs(lineage, through, &passed);
            out.insert(
                p,
                Loss {
                    ranges,
                    heirs: heirs.into_iter().collect(),
                    handed: None,
                    handed_ranges: Vec::new(),
                },
            );
        }
        out
    }

    /// The partitions in the topology that continue the removed ones in
    /// `through` and the group has not read: children of them, or
    /// descendants of those the group has read (`passed`).
    fn heirs(
        &self,
        lineage: &Lineage,
        mut through: BTreeSet<u32>,
        passed: &BTreeSet<u32>,
    ) -> BTreeSet<u32> {
        let mut heirs: BTreeSet<u32> = BTreeSet::new();
        loop {
            let mut grew = false;
            for (&id, n) in &lineage.nodes {
                if through.contains(&id)
                    || heirs.contains(&id)
                    || !n.parents.iter().any(|q| through.contains(q))
                {
                    continue;
                }
                if passed.contains(&id) || self.drained.contains(&id) {
                    through.insert(id);
                    grew = true;
                } else {
                    heirs.insert(id);
                }
            }
            if !grew {
                return heirs;
            }
        }
    }
}

/// Whether `listed` holds a descendant of `id` (through partitions in the
/// topology and removed ones alike): the group has passed `id`.
pub(super) fn lists_descendant(lineage: &Lineage, listed: &BTreeSet<u32>, id: u32) -> bool {
    let mut seen = BTreeSet::from([id]);
    let mut stack = vec![id];
    while let Some(x) = stack.pop() {
        let live = lineage.children_naming(x);
        let removed = lineage
            .removed_children
            .get(&x)
            .map_or(&[][..], Vec::as_slice);
        for &c in live.iter().chain(removed) {
            if listed.contains(&c) {
                return true;
            }
            if seen.insert(c) {
                stack.push(c);
            }
        }
    }
    false
}

/// The unread rest of a partition retention removed under a committed
/// position of the group (with the removed partitions below it). Reported
/// through [`super::Member::retained`] to the owner of the first ready partition
/// that continues it (any member when none does), again to each later
/// owner until one of them commits: that commit drops the position from
/// the manifest (at least once, as records are delivered).
#[derive(Debug, Clone)]
pub(super) struct Loss {
    pub(super) ranges: Vec<RetainedRange>,
    /// Partitions in the topology that continue the removed one.
    pub(super) heirs: Vec<u32>,
    /// The member it was handed to, with the tenure of the heir it came
    /// with (0: no heir).
    pub(super) handed: Option<(u64, u64)>,
    /// The ranges handed to it so far.
    pub(super) handed_ranges: Vec<RetainedRange>,
}
