//! Topology changes through the topic's one `apply` path, seen from the
//! public API.

use fissionlog::{Error, Log, LogOptions, SplitPlan, TopicConfig};

fn options() -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    }
}

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
