//! Where new partitions' replicas go: a pure function of the cluster's
//! nodes and the current placement, so every controller replica computes
//! the same answer from the same state.
//!
//! A split exists to move load off a hot partition, and the load follows
//! the leader: so the children's leaders go to nodes other than the
//! parent's leader, one child per node where there are enough nodes,
//! each on the node that leads the fewest partitions now (ties: the lower
//! node id). The followers are the nodes holding the fewest replicas.

use std::collections::BTreeMap;

use super::command::ReplicaPlacement;
use crate::types::NodeId;

/// Leaders and replicas per node, counted over the current placement.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLoad {
    /// Partitions each node leads (is the preferred leader of).
    pub leaders: BTreeMap<NodeId, usize>,
    /// Replicas each node holds.
    pub replicas: BTreeMap<NodeId, usize>,
}

impl NodeLoad {
    /// The counts over `placements`.
    pub fn of<'a>(placements: impl IntoIterator<Item = &'a ReplicaPlacement>) -> NodeLoad {
        let mut load = NodeLoad::default();
        for p in placements {
            if let Some(l) = p.leader() {
                *load.leaders.entry(l).or_default() += 1;
            }
            for &r in &p.replicas {
                *load.replicas.entry(r).or_default() += 1;
            }
        }
        load
    }
}

/// Placements for `children` new partitions split off (or merged from) a
/// parent led by `parent_leader`, each with `replication` replicas (at
/// most the number of nodes), over `nodes`. Deterministic: the same
/// arguments give the same placements. Empty when there are no nodes.
pub fn place_children(
    nodes: &[NodeId],
    parent_leader: Option<NodeId>,
    load: &NodeLoad,
    children: usize,
    replication: usize,
) -> Vec<ReplicaPlacement> {
    let mut nodes: Vec<NodeId> = nodes.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    if nodes.is_empty() {
        return Vec::new();
    }
    let replication = replication.clamp(1, nodes.len());
    let mut leaders = load.leaders.clone();
    let mut replicas = load.replicas.clone();
    let mut sibling_leaders: Vec<NodeId> = Vec::new();
    let mut out = Vec::with_capacity(children);
    for _ in 0..children {
        // The widest candidate set that still keeps the rules: not the
        // parent's leader and not a sibling's; then not a sibling's; then
        // any node (more children than nodes).
        let fresh = |n: &NodeId| !sibling_leaders.contains(n);
        let away = |n: &NodeId| Some(*n) != parent_leader && fresh(n);
        let candidates: Vec<NodeId> = [
            nodes.iter().copied().filter(away).collect::<Vec<_>>(),
            nodes.iter().copied().filter(fresh).collect(),
            nodes.clone(),
        ]
        .into_iter()
        .find(|c| !c.is_empty())
        .unwrap_or_default();
        let Some(leader) = candidates
            .iter()
            .copied()
            .min_by_key(|n| (leaders.get(n).copied().unwrap_or(0), *n))
        else {
            break;
        };
        if sibling_leaders.len() + 1 >= nodes.len() {
            // Every node leads a sibling now: the next round may reuse them.
            sibling_leaders.clear();
        } else {
            sibling_leaders.push(leader);
        }
        *leaders.entry(leader).or_default() += 1;
        *replicas.entry(leader).or_default() += 1;
        let mut followers: Vec<NodeId> = nodes.iter().copied().filter(|&n| n != leader).collect();
        followers.sort_by_key(|n| (replicas.get(n).copied().unwrap_or(0), *n));
        followers.truncate(replication - 1);
        for f in &followers {
            *replicas.entry(*f).or_default() += 1;
        }
        let mut set = vec![leader];
        set.extend(followers);
        out.push(ReplicaPlacement { replicas: set });
    }
    out
}
