//! Consumer groups as the controller keeps them: members, generations,
//! which member owns which partition, committed positions. A pure state
//! machine over plain values: every input (the event, its `now_ms`, the
//! topic's partitions) comes from the controller's log, so every replica
//! produces the same assignments and fences the same members.
//!
//! The rules, deliberately few (the library's richer coordinator,
//! `fissionlog`'s `group` module, is crate-private and reads its topic
//! itself; see docs/REPLICATION.md, "The controller"):
//!
//! - a member that sent no heartbeat for its session timeout is expired
//!   at the first event whose `now_ms` shows it, and fenced;
//! - every change of the member set or of the topic's partitions starts a
//!   new generation and reassigns: the partitions without a parent in the
//!   topic go round-robin over the members in id order, and a split or
//!   merge child goes to the owner of its first parent, so the records of
//!   one key stay with one member (C9, C4);
//! - a commit is taken only from a live member of the current generation,
//!   for partitions it owns.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::command::{AssignmentChange, ControllerAnswer, GroupEvent};

/// A live member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMember {
    /// Its session timeout.
    pub session_timeout_ms: u64,
    /// The `now_ms` of its last join or heartbeat.
    pub last_heartbeat_ms: u64,
}

/// A partition as the assignment sees it: its id and its parents still in
/// the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPartition {
    /// The partition.
    pub id: u32,
    /// Its parents that are still in the topology.
    pub parents: Vec<u32>,
}

/// One consumer group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupState {
    /// The topic it reads.
    pub topic: String,
    /// The current generation (0 before the first member joined).
    pub generation: u64,
    /// The id the next member gets.
    pub next_member: u64,
    /// Live members by id.
    pub members: BTreeMap<u64, GroupMember>,
    /// Owner of each partition in the current generation.
    pub owners: BTreeMap<u32, u64>,
    /// Committed next offset per partition.
    pub committed: BTreeMap<u32, u64>,
}

impl GroupState {
    /// A group reading `topic`, with no member yet.
    pub fn new(topic: &str) -> GroupState {
        GroupState {
            topic: topic.to_string(),
            next_member: 1,
            ..GroupState::default()
        }
    }

    /// The partitions `member` owns, ascending.
    pub fn owned_by(&self, member: u64) -> Vec<u32> {
        self.owners
            .iter()
            .filter(|(_, &m)| m == member)
            .map(|(&p, _)| p)
            .collect()
    }

    /// Applies one event at `now_ms` over the topic's `partitions` (in id
    /// order). Returns the event's answer and the assignment changes.
    pub fn apply(
        &mut self,
        name: &str,
        now_ms: u64,
        event: &GroupEvent,
        partitions: &[GroupPartition],
    ) -> (ControllerAnswer, Vec<AssignmentChange>) {
        let mut changes = Vec::new();
        let expired = self.expire(now_ms);
        if !expired.is_empty() {
            changes.push(self.reassign(name, partitions, expired));
        }
        let answer = match event {
            GroupEvent::Join { session_timeout_ms } => {
                let member = self.next_member;
                self.next_member += 1;
                self.members.insert(
                    member,
                    GroupMember {
                        session_timeout_ms: *session_timeout_ms,
                        last_heartbeat_ms: now_ms,
                    },
                );
                changes.push(self.reassign(name, partitions, Vec::new()));
                ControllerAnswer::Joined {
                    member,
                    generation: self.generation,
                }
            }
            GroupEvent::Heartbeat { member, .. } => match self.members.get_mut(member) {
                Some(m) => {
                    m.last_heartbeat_ms = now_ms;
                    ControllerAnswer::Alive {
                        generation: self.generation,
                        partitions: self.owned_by(*member),
                    }
                }
                None => self.fenced(*member),
            },
            GroupEvent::Commit {
                member,
                generation,
                positions,
            } => self.commit(*member, *generation, positions, now_ms),
            GroupEvent::Leave { member } => {
                if self.members.remove(member).is_some() {
                    changes.push(self.reassign(name, partitions, vec![*member]));
                    ControllerAnswer::Accepted
                } else {
                    self.fenced(*member)
                }
            }
        };
        (answer, changes)
    }

    /// A new generation after the topic's partitions changed (a split, a
    /// merge, a removal), if the group has members.
    pub fn topology_changed(
        &mut self,
        name: &str,
        partitions: &[GroupPartition],
    ) -> Option<AssignmentChange> {
        (!self.members.is_empty()).then(|| self.reassign(name, partitions, Vec::new()))
    }

    fn fenced(&self, member: u64) -> ControllerAnswer {
        ControllerAnswer::Fenced {
            member,
            generation: self.generation,
        }
    }

    fn commit(
        &mut self,
        member: u64,
        generation: u64,
        positions: &[(u32, u64)],
        now_ms: u64,
    ) -> ControllerAnswer {
        if generation != self.generation {
            return self.fenced(member);
        }
        let Some(m) = self.members.get_mut(&member) else {
            return self.fenced(member);
        };
        // A commit is progress, and proves the member alive.
        m.last_heartbeat_ms = now_ms;
        if let Some((p, _)) = positions
            .iter()
            .find(|(p, _)| self.owners.get(p) != Some(&member))
        {
            return ControllerAnswer::Refused {
                reason: format!(
                    "member {member} does not own partition {p} in generation {generation}"
                ),
            };
        }
        for &(p, offset) in positions {
            self.committed.insert(p, offset);
        }
        ControllerAnswer::Accepted
    }

    /// Removes members whose session ran out by `now_ms`; their ids.
    fn expire(&mut self, now_ms: u64) -> Vec<u64> {
        let dead: Vec<u64> = self
            .members
            .iter()
            .filter(|(_, m)| now_ms.saturating_sub(m.last_heartbeat_ms) > m.session_timeout_ms)
            .map(|(&id, _)| id)
            .collect();
        for id in &dead {
            self.members.remove(id);
        }
        dead
    }

    /// A new generation: every partition given out again.
    fn reassign(
        &mut self,
        name: &str,
        partitions: &[GroupPartition],
        fenced: Vec<u64>,
    ) -> AssignmentChange {
        self.generation += 1;
        self.owners.clear();
        let members: Vec<u64> = self.members.keys().copied().collect();
        let mut next_root = 0usize;
        if !members.is_empty() {
            for p in partitions {
                let inherited = p.parents.iter().find_map(|q| self.owners.get(q).copied());
                let owner = inherited.unwrap_or_else(|| {
                    let m = members[next_root % members.len()];
                    next_root += 1;
                    m
                });
                self.owners.insert(p.id, owner);
            }
        }
        AssignmentChange {
            group: name.to_string(),
            generation: self.generation,
            owners: members.iter().map(|&m| (m, self.owned_by(m))).collect(),
            fenced,
        }
    }
}
