//! Topology changes through the topic's one `apply` path, seen from the
//! public API.

use fissionlog::{Applied, Error, HashRange, Log, SplitPlan, TopicConfig, TopologyCommand};

use crate::common::log::quiet as options;

#[test]
fn splitting_or_merging_a_sealed_partition_returns_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    topic.split(0, SplitPlan::Even).unwrap();
    let err = topic.split(0, SplitPlan::Even).unwrap_err();
    assert!(matches!(err, Error::Sealed { partition: 0, .. }), "{err:?}");
    let err = topic.merge(0, 1).unwrap_err();
    assert!(matches!(err, Error::Sealed { partition: 0, .. }), "{err:?}");
    let err = topic.merge(1, 0).unwrap_err();
    assert!(matches!(err, Error::Sealed { partition: 0, .. }), "{err:?}");
}

#[test]
fn a_split_command_applied_twice_makes_children_once_and_is_then_refused_as_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", TopicConfig::default()).unwrap();
    let cmd = topic.split_command(0, SplitPlan::Even).unwrap();
    let first = topic.apply(cmd.clone()).unwrap();
    let Applied::Split { children } = first else {
        panic!("{first:?}");
    };
    assert!(!topic.active_partitions().contains(&0));
    let err = topic.apply(cmd).unwrap_err();
    assert!(matches!(err, Error::Sealed { .. }), "{err:?}");
    for c in &children {
        assert!(topic.active_partitions().contains(c));
    }
}

#[test]
fn a_split_command_whose_ranges_do_not_tile_the_partition_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", TopicConfig::default()).unwrap();
    let before = topic.active_partitions();
    let info = topic
        .partitions()
        .into_iter()
        .find(|p| p.id == before[0])
        .unwrap();
    let cmd = TopologyCommand::Split {
        partition: info.id,
        ranges: vec![
            HashRange {
                start: info.start,
                end: info.start + 10,
            },
            HashRange {
                start: info.start + 12,
                end: info.end,
            },
        ],
    };
    let err = topic.apply(cmd).unwrap_err();
    assert!(matches!(err, Error::Refused(_)), "{err:?}");
    assert_eq!(topic.active_partitions(), before);
}

#[test]
fn a_merge_command_makes_one_child_of_two_adjacent_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let applied = topic.apply(TopologyCommand::Merge { a: 1, b: 0 }).unwrap();
    let Applied::Merge { child } = applied else {
        panic!("{applied:?}");
    };
    assert_eq!(topic.active_partitions(), vec![child]);
}
