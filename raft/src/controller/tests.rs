use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use fissionlog::{HashRange, Log, LogOptions, TopicConfig, TopologyCommand};
use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, StoredMembership,
};

use super::*;
use crate::types::{Command, GroupId};

fn config(partitions: u32) -> TopicConfig {
    let mut cfg = TopicConfig {
        partitions,
        replicated: true,
        ..TopicConfig::default()
    };
    cfg.balance.enabled = false;
    cfg.balance.max_partitions = 64;
    cfg
}

fn placed(replicas: &[NodeId]) -> ReplicaPlacement {
    ReplicaPlacement {
        replicas: replicas.to_vec(),
    }
}

fn membership(nodes: &[NodeId]) -> Membership<NodeId, BasicNode> {
    let voters: BTreeSet<NodeId> = nodes.iter().copied().collect();
    let map: BTreeMap<NodeId, BasicNode> = nodes
        .iter()
        .map(|&n| (n, BasicNode::new(format!("127.0.0.1:{n}"))))
        .collect();
    Membership::new(vec![voters], map)
}

/// A test topic's routing key: fixed per name, so runs repeat.
fn key_of(name: &str) -> [u64; 2] {
    [fissionlog::key_hash([7, 0], name.as_bytes()), 7]
}

fn create(name: &str, partitions: u32, leaders: &[NodeId]) -> ControllerCommand {
    ControllerCommand::CreateTopic {
        name: name.into(),
        config: config(partitions),
        placement: leaders
            .iter()
            .map(|&l| placed(&[l, l % 3 + 1, (l + 1) % 3 + 1]))
            .collect(),
        hash_key: key_of(name),
    }
}

fn split_in_two(topic: &str, partition: u32, start: u64, end: u64) -> ControllerCommand {
    let mid = start + (end - start) / 2;
    ControllerCommand::Topology {
        topic: topic.into(),
        command: TopologyCommand::Split {
            partition,
            ranges: vec![
                HashRange { start, end: mid },
                HashRange {
                    start: mid + 1,
                    end,
                },
            ],
        },
    }
}

fn group(now_ms: u64, event: GroupEvent) -> ControllerCommand {
    ControllerCommand::Group {
        group: "g".into(),
        topic: "t".into(),
        now_ms,
        event,
    }
}

fn open_log() -> (tempfile::TempDir, Log) {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    (dir, log)
}

fn state_on(nodes: &[NodeId]) -> ControllerState {
    ControllerState {
        membership: StoredMembership::new(None, membership(nodes)),
        ..ControllerState::default()
    }
}

// ---- placement ----

#[test]
fn a_split_s_children_lead_on_nodes_other_than_the_parent_s_leader_and_each_other() {
    let load = NodeLoad::default();
    let p = place_children(&[1, 2, 3], Some(1), &load, 2, 3);
    let leaders: Vec<_> = p.iter().map(|p| p.leader()).collect();
    assert_eq!(leaders, vec![Some(2), Some(3)]);
    for c in &p {
        assert_eq!(c.replicas.len(), 3);
        let set: BTreeSet<_> = c.replicas.iter().collect();
        assert_eq!(set.len(), 3, "replicas are distinct: {c:?}");
    }
}

#[test]
fn children_leaders_go_to_the_nodes_that_lead_the_fewest_partitions() {
    let load = NodeLoad {
        leaders: BTreeMap::from([(1, 5), (2, 4), (3, 0), (4, 1)]),
        replicas: BTreeMap::new(),
    };
    let p = place_children(&[4, 3, 2, 1], Some(3), &load, 2, 1);
    // Not 3 (the parent's leader), then the least loaded: 4, then 2.
    assert_eq!(p, vec![placed(&[4]), placed(&[2])]);
}

#[test]
fn placement_is_a_function_of_its_arguments() {
    let load = NodeLoad {
        leaders: BTreeMap::from([(1, 2), (2, 2), (3, 1)]),
        replicas: BTreeMap::from([(1, 3), (2, 1), (3, 2)]),
    };
    let first = place_children(&[1, 2, 3], Some(3), &load, 3, 2);
    for _ in 0..5 {
        assert_eq!(place_children(&[3, 1, 2], Some(3), &load, 3, 2), first);
    }
    // Two children away from 3 on 1 and 2; the third has to share.
    let leaders: Vec<_> = first.iter().filter_map(|p| p.leader()).collect();
    assert_eq!(&leaders[..2], &[1, 2]);
}

#[test]
fn with_fewer_nodes_than_children_leaders_still_differ_where_they_can() {
    let p = place_children(&[1, 2], Some(1), &NodeLoad::default(), 2, 5);
    let leaders: Vec<_> = p.iter().filter_map(|p| p.leader()).collect();
    assert_eq!(leaders, vec![2, 1]);
    assert!(p.iter().all(|c| c.replicas.len() == 2), "{p:?}");
    assert!(place_children(&[], Some(1), &NodeLoad::default(), 2, 3).is_empty());
}

// ---- commands ----

#[test]
fn a_command_makes_a_round_trip_through_a_log_entry() {
    let cmds = [
        create("t", 2, &[1, 2]),
        split_in_two("t", 0, 0, 99),
        ControllerCommand::SetPlacement {
            topic: "t".into(),
            partition: 1,
            placement: placed(&[3, 1]),
        },
        group(
            7,
            GroupEvent::Commit {
                member: 1,
                generation: 2,
                positions: vec![(0, 5)],
            },
        ),
        ControllerCommand::InitProducer { producer_id: None },
        ControllerCommand::InitProducer {
            producer_id: Some(9),
        },
    ];
    for cmd in &cmds {
        let entry = cmd.to_entry(1).unwrap();
        assert_eq!(&ControllerCommand::from_entry(&entry).unwrap(), cmd);
    }
}

#[test]
fn bytes_that_are_not_a_command_are_refused_with_the_reason() {
    let good = create("t", 1, &[1]).encode().unwrap();
    let mut newer = good.clone();
    newer[0] = COMMAND_VERSION + 1;
    assert!(matches!(
        ControllerCommand::decode(&newer),
        Err(CommandDecodeError::Version { .. })
    ));
    let mut trailing = good.clone();
    trailing.push(0);
    assert!(matches!(
        ControllerCommand::decode(&trailing),
        Err(CommandDecodeError::Malformed { .. })
    ));
    assert!(ControllerCommand::decode(&good[..good.len() - 1]).is_err());
    assert!(ControllerCommand::decode(&[]).is_err());
    let two = Command::Append {
        producer: None,
        records: vec![],
    };
    assert!(matches!(
        ControllerCommand::from_entry(&two),
        Err(CommandDecodeError::NotOneRecord { records: 0 })
    ));
}

use super::command::COMMAND_VERSION;

// ---- state ----

#[test]
fn creating_a_topic_creates_it_in_the_local_log_with_its_placement() {
    let (_d, log) = open_log();
    let mut s = state_on(&[1, 2, 3]);
    let r = s.apply(&log, &create("t", 2, &[1, 2])).unwrap();
    assert_eq!(r.answer, ControllerAnswer::TopicCreated);
    let t = &s.topics["t"];
    assert_eq!(t.partitions.len(), 2);
    assert_eq!(t.partitions[&0].placement.leader(), Some(1));
    assert_eq!(t.partitions[&1].placement.leader(), Some(2));
    assert_eq!(log.topic("t").unwrap().active_partitions(), vec![0, 1]);
    s.check_topic(&log, "t").unwrap();
}

#[test]
fn topics_take_ids_in_creation_order_and_each_node_s_groups_derive_from_them() {
    let (_d, log) = open_log();
    let mut s = state_on(&[1, 2, 3]);
    s.apply(&log, &create("b", 2, &[1, 2])).unwrap();
    // A refused create takes no id.
    s.apply(&log, &create("bad/name", 1, &[1])).unwrap();
    s.apply(&log, &create("a", 1, &[3])).unwrap();
    assert_eq!((s.topics["b"].id, s.topics["a"].id), (1, 2));
    assert_eq!(s.last_topic_id, 2);
    // Partition p of topic id t is group (t, p); the node's groups are
    // the partitions placed with it among the replicas.
    let groups = |node| -> Vec<(GroupId, Vec<NodeId>)> {
        s.groups_of(node)
            .into_iter()
            .map(|(g, p)| (g, p.replicas))
            .collect()
    };
    assert_eq!(
        groups(1),
        vec![
            (GroupId::partition(1, 0), vec![1, 2, 3]),
            (GroupId::partition(1, 1), vec![2, 3, 1]),
            (GroupId::partition(2, 0), vec![3, 1, 2]),
        ]
    );
    let mut only_two = state_on(&[1, 2, 3]);
    only_two
        .apply(
            &log,
            &ControllerCommand::CreateTopic {
                name: "c".into(),
                config: config(2),
                placement: vec![placed(&[2]), placed(&[3, 2])],
                hash_key: key_of("c"),
            },
        )
        .unwrap();
    assert!(only_two.groups_of(1).is_empty());
    assert_eq!(only_two.groups_of(2).len(), 2);
    assert_eq!(
        only_two.groups_of(3),
        vec![(GroupId::partition(1, 1), placed(&[3, 2]))]
    );
}

#[test]
fn a_bad_create_is_refused_and_changes_nothing() {
    let (_d, log) = open_log();
    let mut s = state_on(&[1, 2, 3]);
    s.apply(&log, &create("t", 1, &[1])).unwrap();
    let before = s.clone();
    for bad in [
        create("t", 1, &[1]),
        create(CONTROLLER_TOPIC, 1, &[1]),
        create("bad/name", 1, &[1]),
        ControllerCommand::CreateTopic {
            name: "u".into(),
            config: config(2),
            placement: vec![placed(&[1])],
            hash_key: key_of("u"),
        },
    ] {
        let r = s.apply(&log, &bad).unwrap();
        assert!(
            matches!(r.answer, ControllerAnswer::Refused { .. }),
            "{bad:?}: {r:?}"
        );
        assert_eq!(s, before, "{bad:?}");
    }
    assert_eq!(log.topics(), vec!["t".to_string()]);
}

#[test]
fn a_split_applies_to_the_local_topology_and_places_the_children_away_from_the_parent() {
    let (_d, log) = open_log();
    let mut s = state_on(&[1, 2, 3]);
    s.apply(&log, &create("t", 1, &[1])).unwrap();
    let r = s.apply(&log, &split_in_two("t", 0, 0, u64::MAX)).unwrap();
    let ControllerAnswer::TopologyApplied { placed, removed } = r.answer else {
        panic!("{r:?}");
    };
    assert!(removed.is_empty());
    let ids: Vec<u32> = placed.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![1, 2]);
    let leaders: Vec<_> = placed.iter().filter_map(|(_, p)| p.leader()).collect();
    assert_eq!(leaders, vec![2, 3]);
    assert_eq!(log.topic("t").unwrap().active_partitions(), vec![1, 2]);
    let t = &s.topics["t"];
    assert!(!t.partitions[&0].active);
    assert_eq!(t.partitions[&1].parents, vec![0]);
    assert_eq!(t.history.len(), 1);
    s.check_topic(&log, "t").unwrap();
}

#[test]
fn a_split_the_topology_refuses_is_answered_and_leaves_state_and_log_alone() {
    let (_d, log) = open_log();
    let mut s = state_on(&[1, 2, 3]);
    s.apply(&log, &create("t", 1, &[1])).unwrap();
    let before = s.clone();
    // Ranges that do not tile the parent, an unknown partition, an
    // unknown topic.
    for bad in [
        split_in_two("t", 0, 0, 99),
        split_in_two("t", 5, 0, u64::MAX),
        split_in_two("nope", 0, 0, u64::MAX),
    ] {
        let r = s.apply(&log, &bad).unwrap();
        assert!(
            matches!(r.answer, ControllerAnswer::Refused { .. }),
            "{r:?}"
        );
    }
    assert_eq!(s, before);
    assert_eq!(log.topic("t").unwrap().active_partitions(), vec![0]);
}

#[test]
fn the_same_commands_on_two_nodes_give_the_same_state_and_the_same_outputs() {
    let cmds = [
        create("t", 2, &[1, 2]),
        group(
            0,
            GroupEvent::Join {
                session_timeout_ms: 100,
            },
        ),
        group(
            10,
            GroupEvent::Join {
                session_timeout_ms: 100,
            },
        ),
        split_in_two("t", 0, 0, u64::MAX / 2),
        split_in_two("t", 0, 0, 1),
        group(
            50,
            GroupEvent::Heartbeat {
                member: 1,
                generation: 3,
            },
        ),
        // Member 2's session (last seen at 10) ran out at 111.
        group(
            140,
            GroupEvent::Heartbeat {
                member: 1,
                generation: 3,
            },
        ),
        ControllerCommand::SetPlacement {
            topic: "t".into(),
            partition: 1,
            placement: placed(&[3]),
        },
    ];
    let run = || {
        let (d, log) = open_log();
        let mut s = state_on(&[1, 2, 3]);
        let out: Vec<ControllerResponse> = cmds.iter().map(|c| s.apply(&log, c).unwrap()).collect();
        (d, log, s, out)
    };
    let (_d1, log1, s1, out1) = run();
    let (_d2, log2, s2, out2) = run();
    assert_eq!(s1, s2);
    assert_eq!(out1, out2);
    s1.check_topic(&log1, "t").unwrap();
    s2.check_topic(&log2, "t").unwrap();
    // The expiry was noticed at the heartbeat at 140 and fenced member 2.
    assert_eq!(out1[6].assignments.len(), 1, "{:?}", out1[6]);
    assert_eq!(out1[6].assignments[0].fenced, vec![2]);
}

// ---- groups ----

#[test]
fn members_share_the_root_partitions_and_a_split_child_stays_with_its_parent_s_owner() {
    let (_d, log) = open_log();
    let mut s = state_on(&[1, 2, 3]);
    s.apply(&log, &create("t", 2, &[1, 2])).unwrap();
    let j1 = s
        .apply(
            &log,
            &group(
                0,
                GroupEvent::Join {
                    session_timeout_ms: 1000,
                },
            ),
        )
        .unwrap();
    assert_eq!(
        j1.answer,
        ControllerAnswer::Joined {
            member: 1,
            generation: 1
        }
    );
    assert_eq!(j1.assignments[0].owners, vec![(1, vec![0, 1])]);
    let j2 = s
        .apply(
            &log,
            &group(
                1,
                GroupEvent::Join {
                    session_timeout_ms: 1000,
                },
            ),
        )
        .unwrap();
    assert_eq!(j2.assignments[0].generation, 2);
    assert_eq!(j2.assignments[0].owners, vec![(1, vec![0]), (2, vec![1])]);
    // Partition 1 covers the upper half: split it; its children 2 and 3
    // stay with member 2, in a new generation.
    let r = s
        .apply(&log, &split_in_two("t", 1, u64::MAX / 2 + 1, u64::MAX))
        .unwrap();
    assert_eq!(r.assignments.len(), 1);
    assert_eq!(r.assignments[0].generation, 3);
    assert_eq!(
        r.assignments[0].owners,
        vec![(1, vec![0]), (2, vec![1, 2, 3])]
    );
}

#[test]
fn a_commit_from_an_old_generation_an_unknown_member_or_for_another_s_partition_is_refused() {
    let (_d, log) = open_log();
    let mut s = state_on(&[1]);
    s.apply(&log, &create("t", 2, &[1, 1])).unwrap();
    s.apply(
        &log,
        &group(
            0,
            GroupEvent::Join {
                session_timeout_ms: 1000,
            },
        ),
    )
    .unwrap();
    s.apply(
        &log,
        &group(
            0,
            GroupEvent::Join {
                session_timeout_ms: 1000,
            },
        ),
    )
    .unwrap();
    let commit = |member, generation, p| {
        group(
            5,
            GroupEvent::Commit {
                member,
                generation,
                positions: vec![(p, 9)],
            },
        )
    };
    let a = |s: &mut ControllerState, c| s.apply(&log, &c).unwrap().answer;
    assert_eq!(
        a(&mut s, commit(1, 1, 0)),
        ControllerAnswer::Fenced {
            member: 1,
            generation: 2
        }
    );
    assert_eq!(
        a(&mut s, commit(7, 2, 0)),
        ControllerAnswer::Fenced {
            member: 7,
            generation: 2
        }
    );
    assert!(matches!(
        a(&mut s, commit(1, 2, 1)),
        ControllerAnswer::Refused { .. }
    ));
    assert!(s.groups["g"].committed.is_empty());
    assert_eq!(a(&mut s, commit(1, 2, 0)), ControllerAnswer::Accepted);
    assert_eq!(s.groups["g"].committed, BTreeMap::from([(0, 9)]));
}

#[test]
fn a_member_past_its_session_timeout_is_fenced_and_its_partitions_move() {
    let (_d, log) = open_log();
    let mut s = state_on(&[1]);
    s.apply(&log, &create("t", 2, &[1, 1])).unwrap();
    s.apply(
        &log,
        &group(
            0,
            GroupEvent::Join {
                session_timeout_ms: 100,
            },
        ),
    )
    .unwrap();
    s.apply(
        &log,
        &group(
            0,
            GroupEvent::Join {
                session_timeout_ms: 100,
            },
        ),
    )
    .unwrap();
    // Exactly at its timeout a member is still alive.
    let r = s
        .apply(
            &log,
            &group(
                100,
                GroupEvent::Heartbeat {
                    member: 1,
                    generation: 2,
                },
            ),
        )
        .unwrap();
    assert!(r.assignments.is_empty(), "{r:?}");
    let r = s
        .apply(
            &log,
            &group(
                101,
                GroupEvent::Heartbeat {
                    member: 1,
                    generation: 2,
                },
            ),
        )
        .unwrap();
    assert_eq!(r.assignments.len(), 1);
    assert_eq!(r.assignments[0].fenced, vec![2]);
    assert_eq!(r.assignments[0].owners, vec![(1, vec![0, 1])]);
    assert_eq!(
        r.answer,
        ControllerAnswer::Alive {
            generation: 3,
            partitions: vec![0, 1]
        }
    );
    let late = s
        .apply(
            &log,
            &group(
                102,
                GroupEvent::Heartbeat {
                    member: 2,
                    generation: 2,
                },
            ),
        )
        .unwrap();
    assert!(matches!(
        late.answer,
        ControllerAnswer::Fenced { member: 2, .. }
    ));
}

// ---- snapshot and the state machine ----

#[derive(Default)]
struct Recorder(Mutex<Vec<(u64, ControllerResponse)>>);

impl OutputSink for Recorder {
    fn applied(&self, index: u64, response: &ControllerResponse) {
        self.0.lock().unwrap().push((index, response.clone()));
    }
}

fn entry(index: u64, payload: EntryPayload<TypeConfig>) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload,
    }
}

fn entries(cmds: &[ControllerCommand]) -> Vec<Entry<TypeConfig>> {
    let mut out = vec![entry(1, EntryPayload::Membership(membership(&[1, 2, 3])))];
    for (i, c) in cmds.iter().enumerate() {
        out.push(entry(
            i as u64 + 2,
            EntryPayload::Normal(c.to_entry(0).unwrap()),
        ));
    }
    out
}

#[tokio::test]
async fn a_snapshot_installed_on_a_fresh_node_rebuilds_the_same_state_and_topology() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recorder::default());
    let mut sm = ControllerStateMachine::open(&dir.path().join("a"), rec.clone()).unwrap();
    let cmds = [
        create("t", 1, &[1]),
        split_in_two("t", 0, 0, u64::MAX),
        split_in_two("t", 1, 0, u64::MAX / 2),
        group(
            0,
            GroupEvent::Join {
                session_timeout_ms: 100,
            },
        ),
    ];
    let answers = sm.apply(entries(&cmds)).await.unwrap();
    assert_eq!(answers.len(), 5);
    assert_eq!(answers[0], CommandResponse::Control);
    assert_eq!(rec.0.lock().unwrap().len(), 4, "one output per command");
    let snap = openraft::RaftSnapshotBuilder::build_snapshot(&mut sm)
        .await
        .unwrap();

    let mut fresh =
        ControllerStateMachine::open(&dir.path().join("b"), Arc::new(NoOutputs)).unwrap();
    fresh
        .install_snapshot(&snap.meta, snap.snapshot)
        .await
        .unwrap();
    let a = sm.with_state(Clone::clone).unwrap();
    let b = fresh.with_state(Clone::clone).unwrap();
    assert_eq!(a, b);
    assert_eq!(b.last_applied.map(|l| l.index), Some(5));
    fresh
        .with_local_log(|log| b.check_topic(log, "t"))
        .unwrap()
        .unwrap();
    let active = |m: &ControllerStateMachine| {
        m.with_local_log(|l| l.topic("t").unwrap().active_partitions())
            .unwrap()
    };
    assert_eq!(active(&sm), active(&fresh));
    // In hash order: 3 and 4 split the lower half, 2 is the upper half.
    assert_eq!(active(&fresh), vec![3, 4, 2]);
    // The next command applies on both the same way.
    let next = [entry(
        6,
        EntryPayload::Normal(
            split_in_two("t", 2, u64::MAX / 2 + 1, u64::MAX)
                .to_entry(0)
                .unwrap(),
        ),
    )];
    let x = sm.apply(next.clone()).await.unwrap();
    let y = fresh.apply(next).await.unwrap();
    assert_eq!(x, y);
    assert_eq!(
        sm.with_state(Clone::clone).unwrap(),
        fresh.with_state(Clone::clone).unwrap()
    );
}

#[tokio::test]
async fn a_snapshot_whose_bytes_or_metadata_are_wrong_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = ControllerStateMachine::open(&dir.path().join("a"), Arc::new(NoOutputs)).unwrap();
    sm.apply(entries(&[create("t", 1, &[1])])).await.unwrap();
    let snap = openraft::RaftSnapshotBuilder::build_snapshot(&mut sm)
        .await
        .unwrap();
    let bytes = snap.snapshot.into_inner();
    let mut fresh =
        ControllerStateMachine::open(&dir.path().join("b"), Arc::new(NoOutputs)).unwrap();
    let mut newer = bytes.clone();
    newer[0] = CONTROLLER_SNAPSHOT_VERSION + 1;
    let mut trailing = bytes.clone();
    trailing.push(1);
    for bad in [newer, trailing, Vec::new()] {
        let r = fresh
            .install_snapshot(&snap.meta, Box::new(Cursor::new(bad)))
            .await;
        assert!(r.is_err());
    }
    let mut meta = snap.meta.clone();
    meta.last_log_id = None;
    assert!(fresh
        .install_snapshot(&meta, Box::new(Cursor::new(bytes)))
        .await
        .is_err());
    assert_eq!(fresh.with_state(|s| s.topics.len()).unwrap(), 0);
}

#[tokio::test]
async fn an_entry_that_is_not_a_command_is_refused_the_same_way_on_every_replica() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = ControllerStateMachine::open(dir.path(), Arc::new(NoOutputs)).unwrap();
    let junk = Command::Append {
        producer: None,
        records: vec![crate::types::RecordIn {
            key: None,
            value: vec![COMMAND_VERSION, 0xff, 0xff],
            timestamp_ms: 0,
        }],
    };
    let answers = sm
        .apply([entry(1, EntryPayload::Normal(junk))])
        .await
        .unwrap();
    assert!(matches!(
        &answers[0],
        CommandResponse::Controller(r) if matches!(r.answer, ControllerAnswer::Refused { .. })
    ));
    assert_eq!(
        sm.with_state(|s| s.last_applied.map(|l| l.index)).unwrap(),
        Some(1)
    );
}

#[test]
fn opening_the_state_machine_clears_the_local_topology_it_rebuilds() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path().join("topology"), LogOptions::default()).unwrap();
        log.create_topic("old", config(1)).unwrap();
        log.close().unwrap();
    }
    let sm = ControllerStateMachine::open(dir.path(), Arc::new(NoOutputs)).unwrap();
    assert!(sm.with_local_log(|l| l.topics()).unwrap().is_empty());
}

#[tokio::test]
async fn a_reopened_state_machine_starts_from_its_saved_snapshot_with_the_topology_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let cmds = [
        create("t", 1, &[1]),
        split_in_two("t", 0, 0, u64::MAX),
        group(
            0,
            GroupEvent::Join {
                session_timeout_ms: 100,
            },
        ),
    ];
    let before = {
        let mut sm = ControllerStateMachine::open(dir.path(), Arc::new(NoOutputs)).unwrap();
        sm.apply(entries(&cmds)).await.unwrap();
        openraft::RaftSnapshotBuilder::build_snapshot(&mut sm)
            .await
            .unwrap();
        sm.with_state(Clone::clone).unwrap()
    };
    let mut sm = ControllerStateMachine::open(dir.path(), Arc::new(NoOutputs)).unwrap();
    assert_eq!(sm.with_state(Clone::clone).unwrap(), before);
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.map(|l| l.index), Some(4));
    sm.with_local_log(|l| before.check_topic(l, "t"))
        .unwrap()
        .unwrap();
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta.last_log_id.map(|l| l.index), Some(4));
}

#[test]
fn a_damaged_snapshot_file_is_refused_never_taken_for_no_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let file = snapshot_file::SnapshotFile::new(dir.path());
    assert!(file.read().unwrap().is_none());
    let meta = openraft::SnapshotMeta {
        last_log_id: Some(LogId::new(CommittedLeaderId::new(2, 1), 9)),
        last_membership: StoredMembership::default(),
        snapshot_id: "s".into(),
    };
    file.save(&meta, b"state bytes").unwrap();
    let (m, data) = file.read().unwrap().unwrap();
    assert_eq!((m, data.as_slice()), (meta, &b"state bytes"[..]));
    let good = std::fs::read(file.path()).unwrap();
    for cut in [0, 1, 4, good.len() - 1] {
        std::fs::write(file.path(), &good[..cut]).unwrap();
        assert!(
            matches!(file.read(), Err(crate::Error::CorruptSnapshot { .. })),
            "cut at {cut}"
        );
    }
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x10;
        std::fs::write(file.path(), &bad).unwrap();
        assert!(
            matches!(file.read(), Err(crate::Error::CorruptSnapshot { .. })),
            "flip at {i}"
        );
    }
    std::fs::write(file.path(), &good).unwrap();
    let d = dir.path().join("topology");
    std::fs::create_dir_all(&d).unwrap();
    // A state machine refuses to start over it (the state bytes are junk).
    assert!(matches!(
        ControllerStateMachine::open(dir.path(), Arc::new(NoOutputs)),
        Err(crate::Error::CorruptSnapshot { .. })
    ));
}

#[test]
fn a_topic_keeps_the_routing_key_its_create_carried() {
    let (_d, log) = open_log();
    let mut s = state_on(&[1, 2, 3]);
    let mut cmd = create("t", 2, &[1, 2]);
    if let ControllerCommand::CreateTopic { hash_key, .. } = &mut cmd {
        *hash_key = [0x1234, 0x5678];
    }
    s.apply(&log, &cmd).unwrap();
    assert_eq!(s.topics["t"].hash_key, [0x1234, 0x5678]);
}

fn init_producer(producer_id: Option<u64>) -> ControllerCommand {
    ControllerCommand::InitProducer { producer_id }
}

fn producer_answer(answers: &[CommandResponse]) -> Vec<ControllerAnswer> {
    answers
        .iter()
        .filter_map(|a| match a {
            CommandResponse::Controller(r) => Some(r.answer.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn producer_ids_are_never_handed_out_again_after_a_snapshot_install_or_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = ControllerStateMachine::open(&dir.path().join("a"), Arc::new(NoOutputs)).unwrap();
    let cmds = [
        init_producer(None),
        init_producer(None),
        init_producer(Some(1)),
        init_producer(Some(7)),
    ];
    let answers = producer_answer(&sm.apply(entries(&cmds)).await.unwrap());
    assert_eq!(
        &answers[..3],
        &[
            ControllerAnswer::ProducerInit {
                producer_id: 1,
                epoch: 0
            },
            ControllerAnswer::ProducerInit {
                producer_id: 2,
                epoch: 0
            },
            ControllerAnswer::ProducerInit {
                producer_id: 1,
                epoch: 1
            },
        ]
    );
    assert!(
        matches!(&answers[3], ControllerAnswer::Refused { reason } if reason.contains("never handed out")),
        "{answers:?}"
    );
    let snap = openraft::RaftSnapshotBuilder::build_snapshot(&mut sm)
        .await
        .unwrap();
    let mut fresh =
        ControllerStateMachine::open(&dir.path().join("b"), Arc::new(NoOutputs)).unwrap();
    fresh
        .install_snapshot(&snap.meta, snap.snapshot)
        .await
        .unwrap();
    // The replica opened again starts from the snapshot file it saved.
    drop(fresh);
    let mut reopened =
        ControllerStateMachine::open(&dir.path().join("b"), Arc::new(NoOutputs)).unwrap();
    let next = [
        entry(
            6,
            EntryPayload::Normal(init_producer(None).to_entry(0).unwrap()),
        ),
        entry(
            7,
            EntryPayload::Normal(init_producer(Some(1)).to_entry(0).unwrap()),
        ),
    ];
    let got = producer_answer(&reopened.apply(next.clone()).await.unwrap());
    assert_eq!(
        got,
        vec![
            ControllerAnswer::ProducerInit {
                producer_id: 3,
                epoch: 0
            },
            ControllerAnswer::ProducerInit {
                producer_id: 1,
                epoch: 2
            },
        ]
    );
    assert_eq!(producer_answer(&sm.apply(next).await.unwrap()), got);
}

#[test]
fn a_snapshot_of_the_previous_version_is_refused_with_both_versions_named() {
    let mut bytes = encode_controller_snapshot(&ControllerState::default()).unwrap();
    bytes[0] = CONTROLLER_SNAPSHOT_VERSION - 1;
    let reason = decode_controller_snapshot(&bytes).unwrap_err();
    assert!(
        reason.contains(&format!(
            "version {}; this build reads {CONTROLLER_SNAPSHOT_VERSION}",
            CONTROLLER_SNAPSHOT_VERSION - 1
        )),
        "{reason}"
    );
}
