//! What a topic looks like: partition infos, the lineage snapshot, key and hash chains.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::format::manifest::PartitionState;
use crate::partition::Partition;
use crate::topology::lineage::{Lineage, LineageNode};

use super::{ChainLink, Node, PartitionInfo, RemovedParent, Topic};

impl Topic {
    /// Every partition in the topology: the active ones and the sealed
    /// ones not yet removed (a sealed partition leaves once retention has
    /// emptied it and its parents are gone, see [`crate::Log::enforce_retention`]).
    /// A `parents` entry may name a partition that was removed.
    pub fn partitions(&self) -> Vec<PartitionInfo> {
        let now = self.inner.core.clock.now_nanos();
        // Rates need each partition's writer lock, which a split or merge
        // holds while it waits for the state lock to install its children:
        // take them only after the state lock is released (lock order:
        // writer, then state; never the other way round).
        let snapshot: Vec<(PartitionInfo, Arc<Partition>)> = {
            let st = self.inner.state.read();
            st.nodes
                .values()
                .map(|n| {
                    let mut info = self.info_of(n);
                    info.moved = st.tails.get(&n.rec.id).map(|t| t.moved_range());
                    (info, n.part.clone())
                })
                .collect()
        };
        snapshot
            .into_iter()
            .map(|(mut info, part)| {
                info.rates = part.with_writer(|w| w.rates.rates(now));
                info
            })
            .collect()
    }

    /// A node's description, without rates.
    pub(super) fn info_of(&self, n: &Node) -> PartitionInfo {
        PartitionInfo {
            id: n.rec.id,
            start: n.rec.start,
            end: n.rec.end,
            parents: n.rec.parents.clone(),
            removed_parents: n
                .rec
                .removed_parents
                .iter()
                .map(|&(partition, end_offset)| RemovedParent {
                    partition,
                    end_offset,
                })
                .collect(),
            children: n.children.clone(),
            sealed_at: match n.rec.state {
                PartitionState::Active => None,
                PartitionState::Sealed { end_offset } => Some(end_offset),
            },
            start_offset: n.part.start_offset(),
            end_offset: n.part.end_offset(),
            bytes: n.part.size_bytes(),
            segments: n.part.segments().len(),
            rates: Vec::new(),
            hot_key: n.hot_key_reported,
            moved: None,
        }
    }

    /// The topology generation: a counter that moves with every change of
    /// the topic's partitions (split, merge, removal of an emptied
    /// partition, close). Two equal readings mean the same partitions with
    /// the same parents, children and seal offsets; it may also move for a
    /// change that leaves those alone (a hot key reported). Counted per
    /// open log, from zero: not kept across a reopen. One atomic load.
    pub fn topology_generation(&self) -> u64 {
        self.inner.generation.load(Ordering::SeqCst)
    }

    /// The lineage at the current generation: the cached snapshot if it is
    /// current, else a new one built under the state's read lock (no
    /// partition's lock, no offsets or rates).
    pub(crate) fn lineage(&self) -> Arc<Lineage> {
        let want = self.topology_generation();
        if let Some(l) = &*self.inner.lineage.lock() {
            if l.generation == want {
                return l.clone();
            }
        }
        let built = {
            let st = self.inner.state.read();
            Arc::new(Lineage {
                // Stable while the read lock is held.
                generation: self.topology_generation(),
                nodes: st
                    .nodes
                    .values()
                    .map(|n| {
                        let sealed_at = match n.rec.state {
                            PartitionState::Active => None,
                            PartitionState::Sealed { end_offset } => Some(end_offset),
                        };
                        let node = LineageNode {
                            parents: n.rec.parents.clone(),
                            children: n.children.clone(),
                            sealed_at,
                        };
                        (n.rec.id, node)
                    })
                    .collect(),
                removed_seals: st
                    .removed
                    .iter()
                    .map(|r| (r.id, r.end_offset))
                    .chain(
                        st.nodes
                            .values()
                            .flat_map(|n| n.rec.removed_parents.iter().copied()),
                    )
                    .collect(),
                removed: st
                    .removed
                    .iter()
                    .map(|r| (r.id, r.parents.clone()))
                    .collect(),
                removed_named: st
                    .nodes
                    .values()
                    .flat_map(|n| n.rec.removed_parents.iter().map(|r| r.0))
                    .collect(),
                removed_children: st.removed.iter().fold(
                    HashMap::new(),
                    |mut m: HashMap<u32, Vec<u32>>, r| {
                        for &q in &r.parents {
                            m.entry(q).or_default().push(r.id);
                        }
                        m
                    },
                ),
                tails: st.tails.iter().map(|(&k, v)| (k, v.clone())).collect(),
            })
        };
        let mut cache = self.inner.lineage.lock();
        if cache
            .as_ref()
            .is_none_or(|c| c.generation < built.generation)
        {
            *cache = Some(built.clone());
        }
        built
    }

    /// Ids of the active partitions, in hash-range order.
    pub fn active_partitions(&self) -> Vec<u32> {
        self.inner.state.read().routes.values().copied().collect()
    }

    /// The partitions that have held `key`, oldest first, each with its seal
    /// offset: reading them in this order returns the key's records in order.
    ///
    /// For a key given a hot-key mode (docs/HOT_KEYS.md), the links come
    /// era by era and, inside an era, lane by lane, each with its mode,
    /// lane, first window and the offsets bounding the era in it: reading
    /// each era's lanes and taking windows in sequence (as
    /// [`Topic::read_key`] does) returns the key's records in order.
    pub fn key_chain(&self, key: &[u8]) -> Vec<crate::topic::hot_keys::KeyLink> {
        self.key_links(key)
    }

    /// [`Topic::key_chain`] for a hash value.
    pub fn hash_chain(&self, h: u64) -> Vec<ChainLink> {
        let st = self.inner.state.read();
        let covers = |id: &u32| {
            st.nodes
                .get(id)
                .is_some_and(|n| n.rec.start <= h && h <= n.rec.end)
        };
        // From the active partition that owns `h` (an O(log n) lookup) up
        // through the parent covering `h` (one of at most two), to the
        // oldest one still in the topology: an ancestor retention emptied
        // and removed ends the walk, whichever side of a merge it was on.
        let owner = st
            .routes
            .range(..=h)
            .next_back()
            .map(|(_, &id)| id)
            .filter(covers);
        let mut out = Vec::new();
        let mut cur = owner;
        while let Some(id) = cur {
            let n = &st.nodes[&id];
            let sealed_at = match n.rec.state {
                PartitionState::Sealed { end_offset } => Some(end_offset),
                PartitionState::Active => None,
            };
            out.push(ChainLink {
                partition: id,
                sealed_at,
            });
            cur = n.rec.parents.iter().copied().find(|p| covers(p));
        }
        out.reverse();
        out
    }
}
