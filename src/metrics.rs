//! The library's metrics, through the [`metrics`](https://docs.rs/metrics)
//! facade, behind the `metrics` feature: whatever recorder the embedding
//! process installs (a Prometheus exporter, a test recorder) gets them.
//! Without the feature every function here is an empty inline one and the
//! crate compiles nothing of the facade.
//!
//! | series | type | labels | recorded |
//! |---|---|---|---|
//! | `fissionlog_partition_appended_records_total` | counter | `topic`, `partition` | per append |
//! | `fissionlog_partition_appended_bytes_total` | counter | `topic`, `partition` | per append (encoded batch bytes) |
//! | `fissionlog_sync_round_seconds` | histogram | | per sync round |
//! | `fissionlog_sync_round_files` | histogram | | per sync round: files fsynced together |
//! | `fissionlog_topology_changes_total` | counter | `topic`, `kind` (`split`, `merge`, `hot_key`, `partition_removed`) | per topology event (a tail split is a split) |
//! | `fissionlog_group_rebalance_pause_seconds` | histogram | `group` | per moved partition, once its new owner takes it |
//! | `fissionlog_group_members` | gauge | `group` | on join, leave and death |
//! | `fissionlog_group_members_slow_total` | counter | `group` | a member declared slow |
//!
//! Call sites are few and cheap: a partition registers its two counters
//! once, when it is made, so an append costs two relaxed atomic adds and
//! allocates nothing; sync rounds, topology changes and group events are
//! rare next to appends.

/// Series names.
pub mod names {
    /// Records appended, per partition.
    pub const APPENDED_RECORDS: &str = "fissionlog_partition_appended_records_total";
    /// Encoded bytes appended, per partition.
    pub const APPENDED_BYTES: &str = "fissionlog_partition_appended_bytes_total";
    /// Duration of one sync round.
    pub const SYNC_ROUND_SECONDS: &str = "fissionlog_sync_round_seconds";
    /// Files one sync round fsynced.
    pub const SYNC_ROUND_FILES: &str = "fissionlog_sync_round_files";
    /// Topology changes by kind.
    pub const TOPOLOGY_CHANGES: &str = "fissionlog_topology_changes_total";
    /// How long a moved partition had no reader.
    pub const REBALANCE_PAUSE_SECONDS: &str = "fissionlog_group_rebalance_pause_seconds";
    /// Members of a group.
    pub const GROUP_MEMBERS: &str = "fissionlog_group_members";
    /// Members declared slow.
    pub const GROUP_MEMBERS_SLOW: &str = "fissionlog_group_members_slow_total";
}

#[cfg(feature = "metrics")]
mod imp {
    use crate::metrics::names;

    /// A partition's counters, registered once.
    #[derive(Clone)]
    pub(crate) struct PartitionMetrics {
        records: metrics::Counter,
        bytes: metrics::Counter,
    }

    impl std::fmt::Debug for PartitionMetrics {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("PartitionMetrics")
        }
    }

    impl PartitionMetrics {
        pub(crate) fn new(topic: &str, partition: u32) -> PartitionMetrics {
            let labels = [
                ("topic", topic.to_string()),
                ("partition", partition.to_string()),
            ];
            PartitionMetrics {
                records: metrics::counter!(names::APPENDED_RECORDS, &labels),
                bytes: metrics::counter!(names::APPENDED_BYTES, &labels),
            }
        }

        #[inline]
        pub(crate) fn appended(&self, records: usize, bytes: usize) {
            self.records.increment(records as u64);
            self.bytes.increment(bytes as u64);
        }
    }

    /// A sync round of `files` files took `elapsed`.
    pub(crate) fn sync_round(elapsed: std::time::Duration, files: usize) {
        metrics::histogram!(names::SYNC_ROUND_SECONDS).record(elapsed.as_secs_f64());
        metrics::histogram!(names::SYNC_ROUND_FILES).record(files as f64);
    }

    /// A topology change of `kind` (`split`, `merge`, ...) in `topic`.
    pub(crate) fn topology_change(topic: &str, kind: &'static str) {
        metrics::counter!(names::TOPOLOGY_CHANGES, "topic" => topic.to_string(), "kind" => kind)
            .increment(1);
    }

    pub(crate) fn rebalance_pause(group: &str, seconds: f64) {
        metrics::histogram!(names::REBALANCE_PAUSE_SECONDS, "group" => group.to_string())
            .record(seconds);
    }

    pub(crate) fn group_members(group: &str, members: usize) {
        metrics::gauge!(names::GROUP_MEMBERS, "group" => group.to_string()).set(members as f64);
    }

    pub(crate) fn member_slow(group: &str) {
        metrics::counter!(names::GROUP_MEMBERS_SLOW, "group" => group.to_string()).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {

    /// Nothing without the `metrics` feature.
    #[derive(Debug, Clone)]
    pub(crate) struct PartitionMetrics;

    impl PartitionMetrics {
        #[inline(always)]
        pub(crate) fn new(_topic: &str, _partition: u32) -> PartitionMetrics {
            PartitionMetrics
        }
        #[inline(always)]
        pub(crate) fn appended(&self, _records: usize, _bytes: usize) {}
    }

    #[inline(always)]
    pub(crate) fn sync_round(_elapsed: std::time::Duration, _files: usize) {}
    #[inline(always)]
    pub(crate) fn topology_change(_topic: &str, _kind: &'static str) {}
    #[inline(always)]
    pub(crate) fn rebalance_pause(_group: &str, _seconds: f64) {}
    #[inline(always)]
    pub(crate) fn group_members(_group: &str, _members: usize) {}
    #[inline(always)]
    pub(crate) fn member_slow(_group: &str) {}
}

pub(crate) use imp::*;

#[cfg(test)]
#[cfg(feature = "metrics")]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use crate::metrics::names;
    use crate::{Log, LogOptions, SplitPlan, SyncPolicy, TopicConfig};

    /// One series of a snapshot: name, labels, value.
    type Series = (String, Vec<(String, String)>, DebugValue);

    fn counter(snapshot: &[Series], name: &str) -> u64 {
        snapshot
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, _, v)| match v {
                DebugValue::Counter(c) => *c,
                _ => 0,
            })
            .sum()
    }

    #[test]
    fn appends_syncs_and_splits_move_the_library_series() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let dir = tempfile::tempdir().expect("a temporary directory");
        metrics::with_local_recorder(&recorder, || {
            let log = Log::open(dir.path(), LogOptions::default()).expect("a fresh log");
            let t = log
                .create_topic(
                    "t",
                    TopicConfig {
                        partitions: 1,
                        sync: SyncPolicy::Always,
                        ..Default::default()
                    },
                )
                .expect("a topic");
            for i in 0..10u32 {
                t.append(Some(format!("k{i}").as_bytes()), b"value")
                    .expect("an append");
            }
            t.split(0, SplitPlan::Even).expect("a split");
            log.close().expect("a clean close");
        });
        let snap: Vec<Series> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(k, _, _, v)| {
                let key = k.key();
                let labels = key
                    .labels()
                    .map(|l| (l.key().to_string(), l.value().to_string()))
                    .collect();
                (key.name().to_string(), labels, v)
            })
            .collect();
        assert_eq!(counter(&snap, names::APPENDED_RECORDS), 10);
        assert!(counter(&snap, names::APPENDED_BYTES) >= 10 * 5);
        let splits: u64 = snap
            .iter()
            .filter(|(n, l, _)| {
                n == names::TOPOLOGY_CHANGES && l.iter().any(|(k, v)| k == "kind" && v == "split")
            })
            .map(|(_, _, v)| match v {
                DebugValue::Counter(c) => *c,
                _ => 0,
            })
            .sum();
        assert_eq!(splits, 1);
        let rounds = snap
            .iter()
            .find(|(n, _, _)| n == names::SYNC_ROUND_SECONDS)
            .map(|(_, _, v)| match v {
                DebugValue::Histogram(h) => h.len(),
                _ => 0,
            })
            .unwrap_or(0);
        assert!(
            rounds >= 10,
            "one round per always-synced append at least: {rounds}"
        );
    }
}
