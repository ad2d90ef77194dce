//! The controller's replicated metadata, and how one command changes it.
//!
//! [`ControllerState`] is plain data (serde): per topic its configuration,
//! the topology commands applied so far, and each partition's range,
//! lineage and replica placement; the consumer groups. Applying a command
//! is deterministic from the command and the state. Topology commands are
//! also applied to the node's local [`Log`] through `Topic::apply`, the
//! library's one path for them, and the partitions the state records are
//! read back from that topology: so every node's local topology and every
//! replica's state agree, or the node stops (see [`ApplyError`]).

use std::collections::BTreeMap;

use fissionlog::{Log, PartitionInfo, TopicConfig, TopologyCommand};
use openraft::{BasicNode, LogId, StoredMembership};
use serde::{Deserialize, Serialize};

use super::command::{
    AssignmentChange, ControllerAnswer, ControllerCommand, ControllerResponse, GroupEvent,
    ReplicaPlacement, CONTROLLER_TOPIC,
};
use super::groups::{GroupPartition, GroupState};
use super::placement::{place_children, NodeLoad};
use super::producers::ProducerIds;
use crate::types::{GroupId, NodeId};

/// One partition as the controller records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMeta {
    /// First hash value owned.
    pub start: u64,
    /// Last hash value owned (inclusive).
    pub end: u64,
    /// Parents (none for a topic's first partitions).
    pub parents: Vec<u32>,
    /// Takes appends (false once sealed by a split or merge).
    pub active: bool,
    /// Where its replicas live.
    pub placement: ReplicaPlacement,
}

/// One topic as the controller records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicMeta {
    /// Its id, given in creation order from 1 (see
    /// [`ControllerState::last_topic_id`]): partition `p` of the topic is
    /// Raft group [`GroupId::partition`]`(id, p)` on every node.
    pub id: u32,
    /// Its configuration.
    pub config: TopicConfig,
    /// The topology commands applied to it, in log order: replaying them
    /// on a fresh topic rebuilds its topology (snapshot install).
    pub history: Vec<TopologyCommand>,
    /// Its partitions by id.
    pub partitions: BTreeMap<u32, PartitionMeta>,
    /// The key of its routing hash, as its `CreateTopic` carried it: a
    /// record with key `k` belongs to the partition whose range holds
    /// `fissionlog::key_hash(hash_key, k)`, on every broker.
    pub hash_key: [u64; 2],
}

/// Why a command could not be applied on this node while it may have
/// been applied on others: the local topology can no longer be trusted to
/// match, so the state machine stops (openraft stops the group) instead
/// of going on with a different state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// The local log failed (I/O, a full disk, a poisoned log).
    #[error("local log failed applying {what}: {source}")]
    Local {
        /// What was being applied.
        what: String,
        /// The library's error.
        #[source]
        source: fissionlog::Error,
    },
    /// The local topology does not hold what the controller recorded.
    #[error("local topology of {topic} diverges from the controller's: {reason}")]
    Diverged {
        /// The topic.
        topic: String,
        /// What differs.
        reason: String,
    },
}

/// The library errors that are answers, the same on every replica for the
/// same topology: anything else is a local failure.
fn is_refusal(e: &fissionlog::Error) -> bool {
    use fissionlog::Error as E;
    matches!(
        e,
        E::Refused(_)
            | E::UnknownPartition { .. }
            | E::UnknownTopic(_)
            | E::TopicExists(_)
            | E::Sealed { .. }
            | E::HotKeyMode { .. }
            | E::InvalidConfig(_)
            | E::InvalidTopicName { .. }
            | E::InvalidDuration { .. }
    )
}

/// The controller's state: what its committed log prefix leaves behind.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ControllerState {
    /// The last entry applied.
    pub last_applied: Option<LogId<NodeId>>,
    /// The controller group's last membership: its nodes are the nodes
    /// partitions are placed on.
    pub membership: StoredMembership<NodeId, BasicNode>,
    /// Topics by name.
    pub topics: BTreeMap<String, TopicMeta>,
    /// Consumer groups by name.
    pub groups: BTreeMap<String, GroupState>,
    /// The id the last created topic took (0: none yet). Ids are never
    /// reused; topic id 0 stays for the groups a node is told to host on
    /// its command line (`--groups`).
    pub last_topic_id: u32,
    /// The producer ids handed out and their latest epochs.
    pub producers: ProducerIds,
}

fn refused(reason: impl Into<String>) -> ControllerResponse {
    ControllerResponse::only(ControllerAnswer::Refused {
        reason: reason.into(),
    })
}

/// The local topic's partitions as the controller records them (ranges,
/// parents still present, active), keyed by id.
fn local_partitions(infos: &[PartitionInfo]) -> BTreeMap<u32, (u64, u64, Vec<u32>, bool)> {
    infos
        .iter()
        .map(|p| {
            let parents = p
                .parents
                .iter()
                .copied()
                .filter(|q| infos.iter().any(|i| i.id == *q))
                .collect();
            (p.id, (p.start, p.end, parents, p.sealed_at.is_none()))
        })
        .collect()
}

impl ControllerState {
    /// The nodes partitions are placed on: the controller's voters and
    /// learners, ascending.
    pub fn nodes(&self) -> Vec<NodeId> {
        self.membership.nodes().map(|(&id, _)| id).collect()
    }

    /// Every partition placed with `node` among its replicas: its Raft
    /// group and its placement (the preferred leader first), in group
    /// order.
    pub fn groups_of(&self, node: NodeId) -> Vec<(GroupId, ReplicaPlacement)> {
        let mut out: Vec<(GroupId, ReplicaPlacement)> = self
            .topics
            .values()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .filter(|(_, p)| p.placement.replicas.contains(&node))
                    .map(|(&pid, p)| (GroupId::partition(t.id, pid), p.placement.clone()))
            })
            .collect();
        out.sort_by_key(|(g, _)| *g);
        out
    }

    /// Leaders and replicas per node over every partition placed.
    pub fn load(&self) -> NodeLoad {
        NodeLoad::of(
            self.topics
                .values()
                .flat_map(|t| t.partitions.values().map(|p| &p.placement)),
        )
    }

    /// Applies one command; `log` is the node's local log.
    pub fn apply(
        &mut self,
        log: &Log,
        cmd: &ControllerCommand,
    ) -> Result<ControllerResponse, ApplyError> {
        match cmd {
            ControllerCommand::CreateTopic {
                name,
                config,
                placement,
                hash_key,
            } => self.create_topic(log, name, config, placement, *hash_key),
            ControllerCommand::Topology { topic, command } => self.topology(log, topic, command),
            ControllerCommand::SetPlacement {
                topic,
                partition,
                placement,
            } => Ok(self.set_placement(topic, *partition, placement)),
            ControllerCommand::Group {
                group,
                topic,
                now_ms,
                event,
            } => Ok(self.group(group, topic, *now_ms, event)),
            ControllerCommand::InitProducer { producer_id } => {
                Ok(match self.producers.init(*producer_id) {
                    Ok((producer_id, epoch)) => {
                        ControllerResponse::only(ControllerAnswer::ProducerInit {
                            producer_id,
                            epoch,
                        })
                    }
                    Err(e) => refused(e.to_string()),
                })
            }
        }
    }

    fn create_topic(
        &mut self,
        log: &Log,
        name: &str,
        config: &TopicConfig,
        placement: &[ReplicaPlacement],
        hash_key: [u64; 2],
    ) -> Result<ControllerResponse, ApplyError> {
        if name == CONTROLLER_TOPIC {
            return Ok(refused(format!("{CONTROLLER_TOPIC} is reserved")));
        }
        if self.topics.contains_key(name) {
            return Ok(refused(format!("topic {name} exists")));
        }
        // u32::MAX is the controller's own group's topic half.
        let id = self.last_topic_id + 1;
        if id == u32::MAX {
            return Ok(refused("no topic id left"));
        }
        if placement.len() != config.partitions as usize
            || placement.iter().any(|p| p.replicas.is_empty())
        {
            return Ok(refused(format!(
                "{} placements for {} partitions (each needs a replica)",
                placement.len(),
                config.partitions
            )));
        }
        let topic = match log.create_topic(name, config.clone()) {
            Ok(t) => t,
            Err(e) if is_refusal(&e) => return Ok(refused(e.to_string())),
            Err(source) => {
                return Err(ApplyError::Local {
                    what: format!("create topic {name}"),
                    source,
                })
            }
        };
        let partitions = local_partitions(&topic.partitions())
            .into_iter()
            .zip(placement)
            .map(|((id, (start, end, parents, active)), placement)| {
                let meta = PartitionMeta {
                    start,
                    end,
                    parents,
                    active,
                    placement: placement.clone(),
                };
                (id, meta)
            })
            .collect();
        self.topics.insert(
            name.to_string(),
            TopicMeta {
                id,
                config: config.clone(),
                history: Vec::new(),
                partitions,
                hash_key,
            },
        );
        self.last_topic_id = id;
        Ok(ControllerResponse::only(ControllerAnswer::TopicCreated))
    }

    fn topology(
        &mut self,
        log: &Log,
        name: &str,
        command: &TopologyCommand,
    ) -> Result<ControllerResponse, ApplyError> {
        if !self.topics.contains_key(name) {
            return Ok(refused(format!("unknown topic {name}")));
        }
        let local_err = |source| ApplyError::Local {
            what: format!("{command:?} on {name}"),
            source,
        };
        let topic = log.topic(name).map_err(local_err)?;
        match topic.apply(command.clone()) {
            Ok(_) => {}
            Err(e) if is_refusal(&e) => return Ok(refused(e.to_string())),
            Err(e) => return Err(local_err(e)),
        }
        let local = local_partitions(&topic.partitions());
        let nodes = self.nodes();
        let mut load = self.load();
        let meta = self
            .topics
            .get_mut(name)
            .ok_or_else(|| ApplyError::Diverged {
                topic: name.to_string(),
                reason: "topic vanished".into(),
            })?;
        meta.history.push(command.clone());
        let removed: Vec<u32> = meta
            .partitions
            .keys()
            .copied()
            .filter(|id| !local.contains_key(id))
            .collect();
        // New partitions, grouped by their first parent (one placement
        // round per split or merge), in id order.
        let mut by_parent: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
        for (id, (_, _, parents, _)) in &local {
            if !meta.partitions.contains_key(id) {
                by_parent
                    .entry(parents.first().copied())
                    .or_default()
                    .push(*id);
            }
        }
        let mut placed = Vec::new();
        for (parent, children) in by_parent {
            let parent_placement = parent.and_then(|p| meta.partitions.get(&p));
            let leader = parent_placement.and_then(|p| p.placement.leader());
            let replication = parent_placement.map_or(1, |p| p.placement.replicas.len());
            let placements = place_children(&nodes, leader, &load, children.len(), replication);
            for (i, id) in children.into_iter().enumerate() {
                // No nodes known (no membership applied yet): the parent's
                // replicas, so the partition is still somewhere.
                let placement = placements.get(i).cloned().unwrap_or_else(|| {
                    parent_placement.map_or(ReplicaPlacement { replicas: vec![] }, |p| {
                        p.placement.clone()
                    })
                });
                if let Some(l) = placement.leader() {
                    *load.leaders.entry(l).or_default() += 1;
                }
                for &r in &placement.replicas {
                    *load.replicas.entry(r).or_default() += 1;
                }
                placed.push((id, placement));
            }
        }
        for id in &removed {
            meta.partitions.remove(id);
        }
        for (id, (start, end, parents, active)) in &local {
            match meta.partitions.get_mut(id) {
                Some(p) => {
                    p.active = *active;
                    p.parents.clone_from(parents);
                }
                None => {
                    let placement = placed
                        .iter()
                        .find(|(c, _)| c == id)
                        .map(|(_, p)| p.clone())
                        .unwrap_or(ReplicaPlacement { replicas: vec![] });
                    meta.partitions.insert(
                        *id,
                        PartitionMeta {
                            start: *start,
                            end: *end,
                            parents: parents.clone(),
                            active: *active,
                            placement,
                        },
                    );
                }
            }
        }
        let assignments = self.topology_changed(name);
        Ok(ControllerResponse {
            answer: ControllerAnswer::TopologyApplied { placed, removed },
            assignments,
        })
    }

    fn group_partitions(&self, topic: &str) -> Vec<GroupPartition> {
        self.topics.get(topic).map_or_else(Vec::new, |t| {
            t.partitions
                .iter()
                .map(|(&id, p)| GroupPartition {
                    id,
                    parents: p.parents.clone(),
                })
                .collect()
        })
    }

    fn topology_changed(&mut self, topic: &str) -> Vec<AssignmentChange> {
        let partitions = self.group_partitions(topic);
        self.groups
            .iter_mut()
            .filter(|(_, g)| g.topic == topic)
            .filter_map(|(name, g)| g.topology_changed(name, &partitions))
            .collect()
    }

    fn set_placement(
        &mut self,
        topic: &str,
        partition: u32,
        placement: &ReplicaPlacement,
    ) -> ControllerResponse {
        if placement.replicas.is_empty() {
            return refused("a placement needs at least one replica");
        }
        match self
            .topics
            .get_mut(topic)
            .and_then(|t| t.partitions.get_mut(&partition))
        {
            Some(p) => {
                p.placement = placement.clone();
                ControllerResponse::only(ControllerAnswer::PlacementSet)
            }
            None => refused(format!("unknown partition {partition} of topic {topic}")),
        }
    }

    fn group(
        &mut self,
        group: &str,
        topic: &str,
        now_ms: u64,
        event: &GroupEvent,
    ) -> ControllerResponse {
        if !self.topics.contains_key(topic) {
            return refused(format!("unknown topic {topic}"));
        }
        if let Some(g) = self.groups.get(group) {
            if g.topic != topic {
                return refused(format!("group {group} reads topic {}", g.topic));
            }
        }
        let partitions = self.group_partitions(topic);
        let g = self
            .groups
            .entry(group.to_string())
            .or_insert_with(|| GroupState::new(topic));
        let (answer, assignments) = g.apply(group, now_ms, event, &partitions);
        ControllerResponse {
            answer,
            assignments,
        }
    }

    /// Rebuilds the local topology of every topic from its history on a
    /// log that holds none of them (snapshot install, open), and checks
    /// it ends where the state says.
    pub fn rebuild(&self, log: &Log) -> Result<(), ApplyError> {
        for (name, meta) in &self.topics {
            let local_err = |source| ApplyError::Local {
                what: format!("rebuild of topic {name}"),
                source,
            };
            let topic = log
                .create_topic(name, meta.config.clone())
                .map_err(local_err)?;
            for cmd in &meta.history {
                topic.apply(cmd.clone()).map_err(local_err)?;
            }
            self.check_topic(log, name)?;
        }
        Ok(())
    }

    /// Checks that the local topology of `name` holds the partitions the
    /// state records (ids, ranges, lineage, state).
    pub fn check_topic(&self, log: &Log, name: &str) -> Result<(), ApplyError> {
        let diverged = |reason: String| ApplyError::Diverged {
            topic: name.to_string(),
            reason,
        };
        let meta = self
            .topics
            .get(name)
            .ok_or_else(|| diverged("not in the controller's state".into()))?;
        let topic = log.topic(name).map_err(|e| diverged(e.to_string()))?;
        let local = local_partitions(&topic.partitions());
        let recorded: BTreeMap<u32, (u64, u64, Vec<u32>, bool)> = meta
            .partitions
            .iter()
            .map(|(&id, p)| (id, (p.start, p.end, p.parents.clone(), p.active)))
            .collect();
        if local != recorded {
            return Err(diverged(format!("local {local:?}, recorded {recorded:?}")));
        }
        Ok(())
    }
}
