//! The coordinator in simulated time: no topic, no clock, no thread. A
//! [`World`] stands for the topic (a lineage and partition ends), `now`
//! is a number the test moves, and a member is only what it tells the
//! coordinator (joins, heartbeats, polls, what it handed out, commits).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::balance::BalancePolicy;
use crate::error::Error;
use crate::format::tail_index::TailIndex;
use crate::group::commit::CommitRequest;
use crate::group::committed::Committed;
use crate::group::{GroupOptions, MemberOptions, MemberState};
use crate::topic::tail_split::TailInfo;
use crate::topology::lineage::{Lineage, LineageNode};

use super::{Coordinator, TopicView};

const SECOND: u64 = 1_000_000_000;

/// What the coordinator sees of a topic.
pub(in crate::group) struct World {
    pub(in crate::group) lineage: Arc<Lineage>,
    pub(in crate::group) ends: HashMap<u32, u64>,
}

impl TopicView for World {
    fn topology_generation(&self) -> u64 {
        self.lineage.generation
    }

    fn lineage(&self) -> Arc<Lineage> {
        self.lineage.clone()
    }

    fn end_offset(&self, id: u32) -> u64 {
        self.ends.get(&id).copied().unwrap_or(0)
    }

    fn balance_policy(&self) -> BalancePolicy {
        BalancePolicy::default()
    }
}

impl World {
    /// Partitions as `(id, parents, sealed_at, end)`.
    pub(in crate::group) fn new(partitions: &[(u32, &[u32], Option<u64>, u64)]) -> World {
        let mut lineage = Lineage {
            generation: 1,
            ..Lineage::default()
        };
        for &(id, parents, sealed_at, _) in partitions {
            lineage.nodes.insert(
                id,
                LineageNode {
                    parents: parents.to_vec(),
                    children: Vec::new(),
                    sealed_at,
                },
            );
        }
        for &(id, parents, _, _) in partitions {
            for q in parents {
                let parent = lineage.nodes.get_mut(q).expect("parents come first");
                parent.children.push(id);
            }
        }
        World {
            lineage: Arc::new(lineage),
            ends: partitions
                .iter()
                .map(|&(id, _, _, end)| (id, end))
                .collect(),
        }
    }
}

/// A coordinator of group "g" that balances at every tick and never
/// splits for lag (the world has no topic to split).
pub(in crate::group) fn coordinator(world: &World) -> Coordinator {
    let options = GroupOptions {
        split_lagging: false,
        rebalance_interval: Duration::ZERO,
        move_cooldown: Duration::ZERO,
        ..GroupOptions::default()
    };
    let mut co = Coordinator::new(
        "g".into(),
        options,
        world.lineage.clone(),
        Committed::default(),
        0,
        1,
    );
    co.refresh(world);
    co
}

pub(in crate::group) fn member_options() -> MemberOptions {
    MemberOptions {
        session_timeout: Duration::from_secs(10),
        processing_timeout: Duration::from_secs(30),
        instance_id: None,
        background_heartbeat: None,
    }
}

pub(in crate::group) fn owner(co: &Coordinator, p: u32) -> Option<u64> {
    co.owners.get(&p).and_then(|o| o.member)
}

/// The ready partitions `id` owns and is not being moved away from.
fn reading(co: &Coordinator, id: u64) -> Vec<u32> {
    co.owned_by(id)
}

fn tenures(co: &Coordinator, id: u64) -> BTreeSet<u64> {
    co.owners
        .values()
        .filter(|o| o.member == Some(id))
        .map(|o| o.epoch)
        .collect()
}

/// Member `id` handed out up to these next offsets, and these partitions
/// to their seal.
pub(in crate::group) fn hand_out(
    co: &mut Coordinator,
    id: u64,
    positions: &[(u32, u64)],
    drained: &[u32],
) {
    let delivered = positions.iter().map(|&(p, o)| (p, (o, None))).collect();
    co.handed_out(id, delivered, drained.iter().copied().collect());
}

/// Member `id` commits, as [`crate::Member`] would once the positions are
/// translated: plan, persist (nothing to persist here), apply.
pub(in crate::group) fn commit(
    co: &mut Coordinator,
    world: &World,
    id: u64,
    positions: &[(u32, u64)],
    drained: &[u32],
    now: u64,
) -> crate::Result<()> {
    co.tick(world, now);
    let handed: BTreeMap<u32, u64> = positions.iter().copied().collect();
    let request = CommitRequest {
        member: id,
        tenures: tenures(co, id),
        positions: positions.to_vec(),
        drained: drained.to_vec(),
        handed: &handed,
        fingerprints: &BTreeMap::new(),
        seals: &world.lineage.clone(),
        told: Vec::new(),
    };
    match co.plan_commit(&request)? {
        None => co.committed_nothing(id, now),
        Some(plan) => co.apply_commit(id, plan, now),
    }
    Ok(())
}

/// C9 in the coordinator's terms: every ready partition and each of its
/// pinned children is read by at most one member, and a partition moving
/// away is read by nobody until it lands.
fn assert_one_reader(co: &Coordinator) {
    let mut seen: BTreeMap<u32, u64> = BTreeMap::new();
    for &id in co.members.keys() {
        for p in reading(co, id) {
            for x in super::closure(&co.lineage, p) {
                if let Some(other) = seen.insert(x, id) {
                    panic!("partition {x} is read by members {other} and {id}");
                }
            }
        }
    }
}

pub(in crate::group) fn two_idle_partitions() -> World {
    World::new(&[(0, &[], None, 100), (1, &[], None, 100)])
}

#[test]
fn a_revoked_partition_moves_only_once_its_owner_commits_what_it_handed_out() {
    let world = two_idle_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    assert_eq!(reading(&co, a), [0, 1]);
    hand_out(&mut co, a, &[(0, 10), (1, 10)], &[]);
    let b = co.join(&world, SECOND, &member_options()).unwrap();
    // One partition is on its way to b, but a handed out records there
    // that nobody committed: it stays a's (paused) until a commits.
    let moving: Vec<u32> = co
        .owners
        .iter()
        .filter(|(_, o)| o.revoking.is_some())
        .map(|(&p, _)| p)
        .collect();
    assert_eq!(moving.len(), 1, "{:?}", co.owners);
    let p = moving[0];
    assert_eq!(owner(&co, p), Some(a));
    assert!(reading(&co, b).is_empty());
    assert_one_reader(&co);
    for t in 2..8 {
        co.tick(&world, t * SECOND);
        assert_eq!(owner(&co, p), Some(a), "moved at {t} s before a's commit");
        assert_one_reader(&co);
    }
    commit(&mut co, &world, a, &[(0, 10), (1, 10)], &[], 8 * SECOND).unwrap();
    assert_eq!(owner(&co, p), Some(b));
    assert_eq!(reading(&co, a).len(), 1);
    assert_eq!(reading(&co, b), [p]);
    assert_eq!(co.stats.redelivered, 0);
    assert_one_reader(&co);
}

#[test]
fn a_revoked_partition_moves_without_a_commit_once_its_owner_is_dead() {
    let world = two_idle_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    hand_out(&mut co, a, &[(0, 10), (1, 10)], &[]);
    let b = co.join(&world, SECOND, &member_options()).unwrap();
    // a stops heartbeating; b keeps polling.
    for t in 2..=10 {
        co.polled(&world, t * SECOND, b).unwrap();
        assert_eq!(owner(&co, 0), Some(a));
        assert_eq!(owner(&co, 1), Some(a));
        assert_one_reader(&co);
    }
    co.polled(&world, 11 * SECOND, b).unwrap();
    assert!(!co.members.contains_key(&a));
    assert_eq!(reading(&co, b), [0, 1]);
    // What a handed out and did not commit is delivered again.
    assert_eq!(co.stats.redelivered, 20);
    assert_eq!(co.stats.dead_detected, 1);
    assert!(matches!(
        co.heartbeat(&world, 12 * SECOND, a),
        Err(Error::Fenced { member, .. }) if member == a
    ));
}

pub(in crate::group) fn four_partitions() -> World {
    World::new(&[
        (0, &[], None, 100),
        (1, &[], None, 100),
        (2, &[], None, 100),
        (3, &[], None, 100),
    ])
}

#[test]
fn a_member_that_heartbeats_without_polling_is_slow_and_relieved_not_fenced() {
    let world = four_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    let b = co.join(&world, 0, &member_options()).unwrap();
    assert_eq!(reading(&co, a).len(), 2);
    for t in 1..=31 {
        co.heartbeat(&world, t * SECOND, a).unwrap();
        co.polled(&world, t * SECOND, b).unwrap();
    }
    assert_eq!(co.members[&a].state, MemberState::Slow);
    assert_eq!(co.stats.slow_detected, 1);
    assert_eq!(co.stats.dead_detected, 0);
    // Half of its partitions went to the member that makes progress.
    assert_eq!(reading(&co, a).len(), 1);
    assert_eq!(reading(&co, b).len(), 3);
    assert_one_reader(&co);
    // A poll makes it active again; it stays a member all along.
    co.polled(&world, 32 * SECOND, a).unwrap();
    assert_eq!(co.members[&a].state, MemberState::Active);
}

#[test]
fn a_member_that_stops_heartbeating_is_dead_and_fenced_after_its_session() {
    let world = four_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    let b = co.join(&world, 0, &member_options()).unwrap();
    for t in 1..=10 {
        co.polled(&world, t * SECOND, b).unwrap();
        assert!(co.members.contains_key(&a), "dead before its session ended");
    }
    co.polled(&world, 11 * SECOND, b).unwrap();
    assert!(!co.members.contains_key(&a));
    assert_eq!(co.stats.dead_detected, 1);
    assert_eq!(co.stats.slow_detected, 0);
    assert_eq!(reading(&co, b), [0, 1, 2, 3]);
}

#[test]
fn a_static_rejoin_inside_the_session_takes_the_old_assignment_and_moves_nothing_else() {
    let world = four_partitions();
    let mut co = coordinator(&world);
    let static_options = MemberOptions {
        instance_id: Some("worker-1".into()),
        ..member_options()
    };
    let a = co.join(&world, 0, &static_options).unwrap();
    let b = co.join(&world, 0, &member_options()).unwrap();
    let a_had = reading(&co, a);
    let b_had = reading(&co, b);
    assert_eq!(a_had.len(), 2);
    hand_out(&mut co, a, &[(a_had[0], 5)], &[]);
    let moves = co.stats.moves;
    // a restarts: its new incarnation joins inside a's session.
    let a2 = co.join(&world, 5 * SECOND, &static_options).unwrap();
    assert_ne!(a2, a);
    assert_eq!(reading(&co, a2), a_had);
    assert_eq!(reading(&co, b), b_had);
    assert!(!co.members.contains_key(&a));
    assert_eq!(co.stats.moves, moves);
    assert_eq!(co.stats.redelivered, 5);
    assert!(matches!(
        co.polled(&world, 6 * SECOND, a),
        Err(Error::Fenced { .. })
    ));
    assert_one_reader(&co);
}

#[test]
fn split_children_stay_with_the_parents_owner_until_it_commits_what_it_read() {
    // 0 was split at 100 into 1 and 2, 50 records each since.
    let world = World::new(&[
        (0, &[], Some(100), 100),
        (1, &[0], None, 50),
        (2, &[0], None, 50),
    ]);
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    let b = co.join(&world, 0, &member_options()).unwrap();
    assert_eq!(reading(&co, a), [0]);
    assert!(reading(&co, b).is_empty(), "the children are pinned to a");
    let tenure = co.owners[&0].epoch;
    hand_out(&mut co, a, &[(1, 50), (2, 50)], &[0]);
    // The parent committed as read: the children are ready, with a, in
    // the tenure a has been reading them in.
    commit(&mut co, &world, a, &[], &[0], SECOND).unwrap();
    assert_eq!(owner(&co, 1), Some(a));
    assert_eq!(owner(&co, 2), Some(a));
    assert_eq!(co.owners[&1].epoch, tenure);
    // One child is on its way to b, after a commits the child's records.
    co.tick(&world, 2 * SECOND);
    let moving: Vec<u32> = [1, 2]
        .into_iter()
        .filter(|p| co.owners[p].revoking.is_some())
        .collect();
    assert_eq!(moving.len(), 1);
    assert!(reading(&co, b).is_empty());
    commit(&mut co, &world, a, &[(1, 50), (2, 50)], &[], 3 * SECOND).unwrap();
    assert_eq!(reading(&co, b), moving);
    assert_eq!(co.stats.redelivered, 0);
    assert_one_reader(&co);
}

#[test]
fn a_split_child_committed_before_its_parent_is_refused_with_its_own_error() {
    let world = World::new(&[
        (0, &[], Some(100), 100),
        (1, &[0], None, 50),
        (2, &[0], None, 50),
    ]);
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    hand_out(&mut co, a, &[(0, 100), (1, 50)], &[]);
    let refused = commit(&mut co, &world, a, &[(1, 50)], &[], SECOND);
    assert!(
        matches!(refused, Err(Error::CommitBeforeParent { partition: 1, .. })),
        "{refused:?}"
    );
    assert!(co.committed.positions.is_empty());
    assert_eq!(co.stats.commits, 0);
}

#[test]
fn a_merge_child_is_ready_once_both_parents_are_read_and_goes_to_who_completed_them() {
    // 0 and 1 were merged into 2 at 10 records each.
    let world = World::new(&[
        (0, &[], Some(10), 10),
        (1, &[], Some(10), 10),
        (2, &[0, 1], None, 30),
    ]);
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    let b = co.join(&world, 0, &member_options()).unwrap();
    let a_parent = match reading(&co, a).as_slice() {
        &[p] => p,
        other => panic!("a reads {other:?}"),
    };
    let b_parent = 1 - a_parent;
    assert_eq!(reading(&co, b), [b_parent]);
    hand_out(&mut co, a, &[], &[a_parent]);
    commit(&mut co, &world, a, &[], &[a_parent], SECOND).unwrap();
    assert!(
        !co.owners.contains_key(&2),
        "ready before both parents are read"
    );
    hand_out(&mut co, b, &[], &[b_parent]);
    commit(&mut co, &world, b, &[], &[b_parent], 2 * SECOND).unwrap();
    assert_eq!(owner(&co, 2), Some(b));
    assert_one_reader(&co);
}

/// 0 (100 records) tail-split at 50: records 50..100 moved to 1 and 2
/// alternately, so 0's offsets 50, 52, ... are 1's 0, 1, ... and 51, 53,
/// ... are 2's.
fn tail_split_world() -> World {
    let mut world = World::new(&[
        (0, &[], Some(50), 50),
        (1, &[0], None, 25),
        (2, &[0], None, 25),
    ]);
    let slots: Vec<u8> = (0..50).map(|i| (i % 2) as u8).collect();
    let lineage = Arc::get_mut(&mut world.lineage).expect("not shared yet");
    lineage.tails.insert(
        0,
        Arc::new(TailInfo {
            children: vec![1, 2],
            index: TailIndex::new(0, 50, 2, slots),
            reclaimed: Default::default(),
        }),
    );
    world
}

#[test]
fn a_child_of_a_tail_split_waits_for_what_its_owner_handed_out_of_the_parent() {
    let world = tail_split_world();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    // a read the parent to 80 before the split moved 50..100 away: 15 of
    // each child's records are out with a.
    hand_out(&mut co, a, &[(0, 80)], &[]);
    commit(&mut co, &world, a, &[], &[0], SECOND).unwrap();
    assert_eq!(owner(&co, 1), Some(a));
    assert_eq!(owner(&co, 2), Some(a));
    let b = co.join(&world, 2 * SECOND, &member_options()).unwrap();
    let moving: Vec<u32> = [1, 2]
        .into_iter()
        .filter(|p| co.owners[p].revoking.is_some())
        .collect();
    assert_eq!(moving.len(), 1);
    assert!(reading(&co, b).is_empty(), "moved with a's records out");
    commit(&mut co, &world, a, &[(1, 15), (2, 15)], &[], 3 * SECOND).unwrap();
    assert_eq!(reading(&co, b), moving);
    assert_eq!(co.stats.redelivered, 0);
    assert_one_reader(&co);
}

#[test]
fn a_heartbeat_after_the_session_expired_is_fenced_even_when_nothing_else_ran() {
    let world = two_idle_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    hand_out(&mut co, a, &[(0, 10), (1, 10)], &[]);
    co.heartbeat(&world, 10 * SECOND, a).unwrap();
    // The next call comes after the session ended: the member is dead
    // first, then told so.
    assert!(matches!(
        co.heartbeat(&world, 21 * SECOND, a),
        Err(Error::Fenced { member, .. }) if member == a
    ));
    assert!(co.member(a).is_err());
    assert_eq!(owner(&co, 0), None);
    assert_eq!(owner(&co, 1), None);
    assert!(co.committed.positions.is_empty());
    assert_eq!(co.stats.redelivered, 20);
    // A new member reads both from the committed positions.
    let b = co.join(&world, 22 * SECOND, &member_options()).unwrap();
    assert_eq!(reading(&co, b), [0, 1]);
    assert_one_reader(&co);
}

#[test]
fn a_leave_while_a_revocation_waits_hands_the_partition_to_its_target_at_once() {
    let world = two_idle_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    hand_out(&mut co, a, &[(0, 10), (1, 10)], &[]);
    let b = co.join(&world, SECOND, &member_options()).unwrap();
    let moving: Vec<u32> = co
        .owners
        .iter()
        .filter(|(_, o)| o.revoking.is_some())
        .map(|(&p, _)| p)
        .collect();
    assert_eq!(moving.len(), 1);
    assert!(reading(&co, b).is_empty());
    co.leave(&world, 2 * SECOND, a).unwrap();
    assert_eq!(reading(&co, b), [0, 1]);
    assert!(co.owners.values().all(|o| o.revoking.is_none()));
    assert_eq!(co.stats.redelivered, 20);
    assert_one_reader(&co);
    // The member that left cannot commit what it handed out.
    assert!(co.member(a).is_err());
}

#[test]
fn a_split_while_a_revocation_waits_keeps_the_parent_and_its_children_with_one_reader() {
    let world = two_idle_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    hand_out(&mut co, a, &[(0, 10), (1, 10)], &[]);
    let b = co.join(&world, SECOND, &member_options()).unwrap();
    let p = *co
        .owners
        .iter()
        .find(|(_, o)| o.revoking.is_some())
        .map(|(p, _)| p)
        .unwrap();
    let q = 1 - p;
    // The topic splits the partition being revoked at 100 into 2 and 3.
    let mut parts: Vec<(u32, &[u32], Option<u64>, u64)> =
        vec![(p, &[], Some(100), 100), (q, &[], None, 100)];
    parts.sort_by_key(|x| x.0);
    let children = [p];
    parts.push((2, &children, None, 5));
    parts.push((3, &children, None, 5));
    let mut split = World::new(&parts);
    Arc::get_mut(&mut split.lineage).unwrap().generation = 2;
    for t in 2..6 {
        co.tick(&split, t * SECOND);
        assert_eq!(owner(&co, p), Some(a), "moved at {t} s before a's commit");
        assert!(reading(&co, b).is_empty(), "b reads before a's commit");
        assert_one_reader(&co);
    }
    // a commits what it handed out: the parent moves whole, with its
    // pinned children, to b.
    commit(&mut co, &split, a, &[(0, 10), (1, 10)], &[], 6 * SECOND).unwrap();
    assert_eq!(owner(&co, p), Some(b));
    assert_eq!(reading(&co, b), [p]);
    assert_eq!(reading(&co, a), [q]);
    assert_eq!(co.stats.redelivered, 0);
    assert_one_reader(&co);
}

#[test]
fn a_late_commit_of_a_partition_that_moved_on_never_moves_its_position_back() {
    let world = two_idle_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    hand_out(&mut co, a, &[(0, 10), (1, 10)], &[]);
    let b = co.join(&world, SECOND, &member_options()).unwrap();
    let p = *co
        .owners
        .iter()
        .find(|(_, o)| o.revoking.is_some())
        .map(|(p, _)| p)
        .unwrap();
    let q = 1 - p;
    // a keeps heartbeating but never commits: the revocation is overdue
    // after its processing timeout and the partition moves without it.
    for t in 2..=32 {
        co.heartbeat(&world, t * SECOND, a).unwrap();
        co.polled(&world, t * SECOND, b).unwrap();
    }
    assert_eq!(owner(&co, p), Some(b));
    hand_out(&mut co, b, &[(p, 20)], &[]);
    commit(&mut co, &world, b, &[(p, 20)], &[], 33 * SECOND).unwrap();
    assert_eq!(co.committed_position(p), 20);
    // a's commit names the old position of the partition it lost, which
    // the group passed already: its other partition commits, the moved
    // one stays where b put it.
    commit(&mut co, &world, a, &[(p, 10), (q, 10)], &[], 34 * SECOND).unwrap();
    assert_eq!(co.committed_position(p), 20);
    assert_eq!(co.committed_position(q), 10);
    assert_one_reader(&co);
}

#[test]
fn two_members_joining_at_the_same_instant_share_the_partitions_without_overlap() {
    let world = four_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    let b = co.join(&world, 0, &member_options()).unwrap();
    assert_eq!(reading(&co, a).len(), 2);
    assert_eq!(reading(&co, b).len(), 2);
    assert_one_reader(&co);
    let c = co.join(&world, 0, &member_options()).unwrap();
    let counts: Vec<usize> = [a, b, c].iter().map(|&m| reading(&co, m).len()).collect();
    assert_eq!(counts.iter().sum::<usize>(), 4, "{counts:?}");
    assert!(counts.iter().all(|&n| (1..=2).contains(&n)), "{counts:?}");
    assert_one_reader(&co);
}

#[test]
fn a_commit_below_the_committed_position_never_moves_it_back() {
    let world = two_idle_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    hand_out(&mut co, a, &[(0, 50)], &[]);
    commit(&mut co, &world, a, &[(0, 50)], &[], SECOND).unwrap();
    commit(&mut co, &world, a, &[(0, 30)], &[], 2 * SECOND).unwrap();
    assert_eq!(co.committed_position(0), 50);
    let commits = co.stats.commits;
    commit(&mut co, &world, a, &[(0, 50)], &[], 3 * SECOND).unwrap();
    assert_eq!(co.stats.commits, commits, "a commit with nothing new wrote");
}
