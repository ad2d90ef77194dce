//! A topic's lineage as plain data: which partitions exist, their parents,
//! their children and where the sealed ones end. It is what a reader needs
//! to follow keys from parents to children, and nothing else: no offsets,
//! sizes or rates, so building it takes no partition's lock.
//!
//! A snapshot is built under the topic state's read lock and tagged with
//! the topology generation it describes; readers share it (an `Arc`) and
//! build a new one only once the generation moved (a split, merge or
//! partition removal), so an idle poll costs nothing that grows with the
//! number of partitions ever created.

use std::collections::{HashMap, HashSet};

/// One partition in a [`Lineage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LineageNode {
    pub parents: Vec<u32>,
    pub children: Vec<u32>,
    /// End offset once sealed; `None` while it takes appends.
    pub sealed_at: Option<u64>,
}

/// The partitions of a topic at one topology generation.
#[derive(Debug, Default)]
pub(crate) struct Lineage {
    pub generation: u64,
    pub nodes: HashMap<u32, LineageNode>,
    /// Partitions removed from the topology (retention emptied them), with
    /// the offset each was sealed at, as their children record it.
    pub removed_seals: HashMap<u32, u64>,
    /// Partitions removed from the topology, with their parents: the
    /// lineage below a removed partition that no partition left names.
    pub removed: HashMap<u32, Vec<u32>>,
    /// The removed partitions naming each partition as a parent.
    pub removed_children: HashMap<u32, Vec<u32>>,
    /// Removed partitions a partition in the topology names as a parent:
    /// the ones a reader may still have to report or skip by id (a cut's
    /// `removed_before` lists only these, so it stays bounded by the
    /// topology).
    pub removed_named: HashSet<u32>,
    /// Committed tail splits by parent: where a position past a parent's
    /// logical end continues in its children.
    pub tails: HashMap<u32, std::sync::Arc<crate::topology::tail::TailInfo>>,
}

impl Lineage {
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.nodes.contains_key(&id)
    }

    pub(crate) fn sealed_at(&self, id: u32) -> Option<u64> {
        self.nodes.get(&id).and_then(|n| n.sealed_at)
    }

    pub(crate) fn children(&self, id: u32) -> &[u32] {
        self.nodes.get(&id).map_or(&[], |n| &n.children)
    }

    pub(crate) fn parents(&self, id: u32) -> &[u32] {
        self.nodes.get(&id).map_or(&[], |n| &n.parents)
    }

    /// Partitions that name `id` as a parent (for a removed `id`, whose own
    /// node is gone).
    pub(crate) fn children_naming(&self, id: u32) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.parents.contains(&id))
            .map(|(&c, _)| c)
            .collect();
        out.sort_unstable();
        out
    }

    /// Removed partitions that name `id` as a parent, and the removed
    /// partitions below those, transitively (a removed partition's
    /// parents were removed before it: retention removes oldest first).
    pub(crate) fn removed_descendants(&self, id: u32) -> Vec<u32> {
        let mut out = HashSet::new();
        let mut stack = vec![id];
        while let Some(q) = stack.pop() {
            for &c in self.removed_children.get(&q).map_or(&[][..], Vec::as_slice) {
                if out.insert(c) {
                    stack.push(c);
                }
            }
        }
        let mut out: Vec<u32> = out.into_iter().collect();
        out.sort_unstable();
        out
    }

    /// Every removed partition that is a strict ancestor of `ids`, through
    /// partitions still in the topic and removed ones alike.
    pub(crate) fn removed_ancestors(&self, ids: impl IntoIterator<Item = u32>) -> HashSet<u32> {
        let parents_of = |id: u32| -> &[u32] {
            match self.nodes.get(&id) {
                Some(n) => &n.parents,
                None => self.removed.get(&id).map_or(&[], Vec::as_slice),
            }
        };
        let mut seen = HashSet::new();
        let mut stack: Vec<u32> = ids
            .into_iter()
            .flat_map(|id| parents_of(id).to_vec())
            .collect();
        while let Some(id) = stack.pop() {
            if seen.insert(id) {
                stack.extend_from_slice(parents_of(id));
            }
        }
        seen.retain(|id| self.removed.contains_key(id));
        seen
    }

    /// Partitions none of whose parents is still in the topic: where every
    /// key's lineage begins.
    pub(crate) fn roots(&self) -> impl Iterator<Item = u32> + '_ {
        self.nodes
            .iter()
            .filter(|(_, n)| n.parents.iter().all(|q| !self.contains(*q)))
            .map(|(&id, _)| id)
    }

    /// Partitions taking appends.
    pub(crate) fn active(&self) -> impl Iterator<Item = u32> + '_ {
        self.nodes
            .iter()
            .filter(|(_, n)| n.sealed_at.is_none())
            .map(|(&id, _)| id)
    }

    /// Every strict ancestor of `ids` (their parents, the parents'
    /// parents, ...) still in the topic.
    pub(crate) fn ancestors(&self, ids: impl IntoIterator<Item = u32>) -> HashSet<u32> {
        let mut out = HashSet::new();
        let mut stack: Vec<u32> = ids
            .into_iter()
            .flat_map(|id| self.parents(id).iter().copied())
            .collect();
        while let Some(id) = stack.pop() {
            if self.contains(id) && out.insert(id) {
                stack.extend_from_slice(self.parents(id));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(parents: &[u32], children: &[u32], sealed_at: Option<u64>) -> LineageNode {
        LineageNode {
            parents: parents.to_vec(),
            children: children.to_vec(),
            sealed_at,
        }
    }

    /// 0 splits into 1 and 2; 1 and 2 merge into 3; 4 is a second root.
    fn sample() -> Lineage {
        Lineage {
            generation: 7,
            removed_seals: HashMap::new(),
            removed: HashMap::new(),
            removed_children: HashMap::new(),
            removed_named: HashSet::new(),
            tails: HashMap::new(),
            nodes: HashMap::from([
                (0, node(&[], &[1, 2], Some(5))),
                (1, node(&[0], &[3], Some(2))),
                (2, node(&[0], &[3], Some(4))),
                (3, node(&[1, 2], &[], None)),
                (4, node(&[], &[], None)),
            ]),
        }
    }

    #[test]
    fn roots_active_and_ancestors() {
        let l = sample();
        let mut roots: Vec<u32> = l.roots().collect();
        roots.sort_unstable();
        assert_eq!(roots, [0, 4]);
        let mut active: Vec<u32> = l.active().collect();
        active.sort_unstable();
        assert_eq!(active, [3, 4]);
        assert_eq!(l.ancestors([3]), HashSet::from([0, 1, 2]));
        assert_eq!(l.ancestors([1]), HashSet::from([0]));
        assert!(l.ancestors([0, 4]).is_empty());
        assert_eq!(l.sealed_at(2), Some(4));
        assert_eq!(l.children(9), &[] as &[u32]);
    }

    #[test]
    fn a_removed_parent_makes_its_child_a_root() {
        let mut l = sample();
        l.nodes.remove(&0);
        let mut roots: Vec<u32> = l.roots().collect();
        roots.sort_unstable();
        assert_eq!(roots, [1, 2, 4]);
        assert_eq!(l.ancestors([3]), HashSet::from([1, 2]));
    }
}
