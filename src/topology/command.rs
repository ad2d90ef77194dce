//! Topology changes as values. A split, merge, tail split, hot-key mode
//! change or partition removal is a [`TopologyCommand`]: the balancer, the
//! CLI and the API all produce commands, and one path applies them
//! ([`crate::Topic::apply`]). Its first step, [`validate`], is pure: every
//! check that depends only on the committed topology and the command,
//! so the same command against the same topology always gives the same
//! outcome. What it returns (a [`Plan`]: the new partitions' ids and
//! ranges) is what the topic then commits. Replication can feed the same
//! path from a replicated log: the commands are serde-serializable.

use serde::{Deserialize, Serialize};

use crate::config::HotKeyMode;
use crate::error::{Error, Result};
use crate::format::manifest::{PartitionState, TopicRecord};

/// An inclusive range of the key-hash space, `[start, end]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HashRange {
    /// First hash value.
    pub start: u64,
    /// Last hash value (inclusive).
    pub end: u64,
}

/// Where a tail split starts moving the parent's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TailFrom {
    /// From this offset (rounded down to the start of the batch holding
    /// it: batches are never cut). The parent's end moves everything
    /// appended so far; nothing is moved then, as in a forward split.
    Offset(u64),
    /// From the slowest committed position of the topic's consumer groups
    /// in the partition (a group with no position there counts as at the
    /// partition's first offset). Refused when the topic has no group.
    SlowestGroup,
}

/// Options of [`crate::Topic::split_tail`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailSplitOptions {
    /// Where the move starts.
    pub from: TailFrom,
    /// Copy budget in bytes per second for the rounds that run while
    /// appends to the parent go on (0: no limit). The final round, under
    /// the parent's writer lock, is not throttled.
    pub throttle_bytes_per_sec: u64,
}

impl TailSplitOptions {
    /// From an offset, unthrottled.
    pub fn from_offset(offset: u64) -> TailSplitOptions {
        TailSplitOptions {
            from: TailFrom::Offset(offset),
            throttle_bytes_per_sec: 0,
        }
    }
}

/// A change of a topic's topology, as a value (see
/// [`crate::Topic::apply`]). The children of a split are given as their
/// hash ranges, not as a plan that reads the partition's load: a command
/// applied twice, or on another replica, makes the same children.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum TopologyCommand {
    /// A forward split of an active partition into children with these
    /// ranges (at least two, tiling the partition's range in order).
    Split {
        /// The partition split.
        partition: u32,
        /// The children's ranges, in hash order.
        ranges: Vec<HashRange>,
    },
    /// A merge of two active partitions with adjacent ranges (either order).
    Merge {
        /// One partition.
        a: u32,
        /// The other.
        b: u32,
    },
    /// A tail split: as `Split`, and the records from `options.from` on
    /// move into the children by key.
    SplitTail {
        /// The partition split.
        partition: u32,
        /// The children's ranges, in hash order.
        ranges: Vec<HashRange>,
        /// Where the move starts and its copy budget.
        options: TailSplitOptions,
    },
    /// A hot-key mode for the keys with this routing hash, over `lanes`
    /// lanes (`Strict` takes one).
    SetHotKeyMode {
        /// The keys' routing hash.
        hash: u64,
        /// The mode.
        mode: HotKeyMode,
        /// Lanes asked for (1 to the topic's `max_lanes`).
        lanes: u32,
    },
    /// Removes a sealed partition retention emptied, whose parents are gone.
    RemovePartition {
        /// The partition removed.
        partition: u32,
    },
}

/// What a committed command did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Applied {
    /// A split made these children, in range order.
    Split {
        /// The children's ids.
        children: Vec<u32>,
    },
    /// A merge made this child.
    Merge {
        /// The child's id.
        child: u32,
    },
    /// A tail split.
    SplitTail(crate::topology::tail::TailSplitOutcome),
    /// The hot-key mode is in force (a mode already in force changes nothing).
    HotKeyMode,
    /// The partition left the topology.
    PartitionRemoved,
}

/// A validated command: what the topic commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// A split (forward, or tail with its options) of `parent` into
    /// children `ids` with `ranges`, pairwise.
    Split {
        parent: u32,
        ids: Vec<u32>,
        ranges: Vec<(u64, u64)>,
        tail: Option<TailSplitOptions>,
    },
    /// A merge of `left` and `right` (in hash order) into `child`.
    Merge {
        left: u32,
        right: u32,
        child: u32,
        range: (u64, u64),
    },
    /// A hot-key mode over `lanes` lanes (checked against the policy).
    HotKeyMode {
        hash: u64,
        mode: HotKeyMode,
        lanes: u32,
    },
    /// The removal of a partition.
    RemovePartition { partition: u32 },
}

/// Checks `cmd` against the committed topology of its topic: the
/// partitions named exist and are in the state the command needs, the
/// ranges tile the parent, the partition limits and the hot-key policy
/// hold. Returns what to commit; no I/O, no clock.
pub(crate) fn validate(topic: &TopicRecord, cmd: &TopologyCommand) -> Result<Plan> {
    match cmd {
        TopologyCommand::Split { partition, ranges } => {
            validate_split(topic, *partition, ranges, None)
        }
        TopologyCommand::SplitTail {
            partition,
            ranges,
            options,
        } => validate_split(topic, *partition, ranges, Some(*options)),
        TopologyCommand::Merge { a, b } => validate_merge(topic, *a, *b),
        TopologyCommand::SetHotKeyMode { hash, mode, lanes } => Ok(Plan::HotKeyMode {
            hash: *hash,
            mode: *mode,
            lanes: check_hot_key_mode(topic, *mode, *lanes)?,
        }),
        TopologyCommand::RemovePartition { partition } => {
            let p = sealed_or_active(topic, *partition)?;
            if p.state == PartitionState::Active {
                return Err(Error::Refused(format!(
                    "partition {partition} is active: only a sealed one leaves the topology"
                )));
            }
            if let Some(q) = p
                .parents
                .iter()
                .find(|q| topic.partitions.iter().any(|r| r.id == **q))
            {
                return Err(Error::Refused(format!(
                    "partition {partition} waits for its parent {q} to leave first"
                )));
            }
            Ok(Plan::RemovePartition {
                partition: *partition,
            })
        }
    }
}

/// The partition `id` of the topic, in any state.
fn sealed_or_active(
    topic: &TopicRecord,
    id: u32,
) -> Result<&crate::format::manifest::PartitionRecord> {
    topic
        .partitions
        .iter()
        .find(|p| p.id == id)
        .ok_or_else(|| Error::UnknownPartition {
            topic: topic.name.clone(),
            partition: id,
        })
}

/// The active partition `id` of the topic ([`Error::Sealed`] if sealed).
fn active(topic: &TopicRecord, id: u32) -> Result<&crate::format::manifest::PartitionRecord> {
    let p = sealed_or_active(topic, id)?;
    if p.state != PartitionState::Active {
        return Err(Error::Sealed {
            topic: topic.name.clone(),
            partition: id,
        });
    }
    Ok(p)
}

fn active_count(topic: &TopicRecord) -> usize {
    topic
        .partitions
        .iter()
        .filter(|p| p.state == PartitionState::Active)
        .count()
}

fn validate_split(
    topic: &TopicRecord,
    partition: u32,
    ranges: &[HashRange],
    tail: Option<TailSplitOptions>,
) -> Result<Plan> {
    let p = active(topic, partition)?;
    let tiles = ranges.len() >= 2
        && ranges.first().map(|r| r.start) == Some(p.start)
        && ranges.last().map(|r| r.end) == Some(p.end)
        && ranges.iter().all(|r| r.start <= r.end)
        && ranges
            .windows(2)
            .all(|w| w[0].end.checked_add(1) == Some(w[1].start));
    if !tiles {
        return Err(Error::Refused(format!(
            "children ranges {ranges:x?} do not tile partition {partition}'s [{:#x}, {:#x}]",
            p.start, p.end
        )));
    }
    if tail.is_some() && ranges.len() > usize::from(u8::MAX) {
        return Err(Error::Refused("too many children".into()));
    }
    let max = topic.config.balance.max_partitions as usize;
    if active_count(topic) - 1 + ranges.len() > max {
        return Err(Error::Refused(format!(
            "split would exceed max_partitions ({max})"
        )));
    }
    let first = topic.next_partition_id;
    Ok(Plan::Split {
        parent: partition,
        ids: (0..ranges.len() as u32).map(|i| first + i).collect(),
        ranges: ranges.iter().map(|r| (r.start, r.end)).collect(),
        tail,
    })
}

fn validate_merge(topic: &TopicRecord, a: u32, b: u32) -> Result<Plan> {
    let (pa, pb) = (active(topic, a)?, active(topic, b)?);
    let (l, r) = if pa.start < pb.start {
        (pa, pb)
    } else {
        (pb, pa)
    };
    if l.end.checked_add(1) != Some(r.start) {
        return Err(Error::Refused(format!(
            "partitions {a} and {b} do not have adjacent ranges"
        )));
    }
    let min = topic.config.balance.min_partitions as usize;
    if active_count(topic) - 1 < min {
        return Err(Error::Refused(format!(
            "merge would go below min_partitions ({min})"
        )));
    }
    Ok(Plan::Merge {
        left: l.id,
        right: r.id,
        child: topic.next_partition_id,
        range: (l.start, r.end),
    })
}

/// The lanes a mode takes under the topic's hot-key policy, or
/// [`Error::HotKeyMode`] naming why the policy refuses it.
fn check_hot_key_mode(topic: &TopicRecord, mode: HotKeyMode, lanes: u32) -> Result<u32> {
    let cfg = &topic.config.hot_keys;
    let refuse = |reason: String| {
        Err(Error::HotKeyMode {
            topic: topic.name.clone(),
            mode,
            reason,
        })
    };
    // Checked for every mode, as documented: `Strict` takes one lane
    // whatever it is given, but a count outside the range is still bad
    // input (it was accepted and switched the key to strict).
    if lanes == 0 || lanes > cfg.max_lanes {
        return refuse(format!(
            "{lanes} lanes; the topic allows 1 to {}",
            cfg.max_lanes
        ));
    }
    match mode {
        HotKeyMode::Strict => Ok(1),
        HotKeyMode::Windowed(d) => {
            if !cfg.allow_windowed {
                return refuse("the topic does not allow windowed keys".into());
            }
            if d.as_millis() == 0 {
                return refuse("a window is at least 1 ms".into());
            }
            Ok(lanes)
        }
        HotKeyMode::Spread => {
            if !cfg.allow_spread {
                return refuse("the topic does not allow spread keys".into());
            }
            Ok(lanes)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::TopicConfig;
    use crate::format::manifest::PartitionRecord;

    fn part(id: u32, start: u64, end: u64, parents: &[u32], sealed: bool) -> PartitionRecord {
        PartitionRecord {
            id,
            start,
            end,
            parents: parents.to_vec(),
            state: if sealed {
                PartitionState::Sealed { end_offset: 10 }
            } else {
                PartitionState::Active
            },
            created_ms: 0,
            removed_parents: Vec::new(),
        }
    }

    /// Partition 0 `[0, 99]` was split into 2 `[0, 49]` and 3 `[50, 99]`;
    /// 1 `[100, MAX]` is active.
    fn topology() -> TopicRecord {
        let mut config = TopicConfig {
            partitions: 2,
            ..TopicConfig::default()
        };
        config.balance.min_partitions = 1;
        config.balance.max_partitions = 4;
        config.hot_keys.max_lanes = 4;
        config.hot_keys.allow_windowed = true;
        config.hot_keys.allow_spread = false;
        TopicRecord {
            id: 1,
            name: "t".into(),
            config: config.to_record(),
            hash_key: [0, 0],
            next_partition_id: 4,
            partitions: vec![
                part(0, 0, 99, &[], true),
                part(1, 100, u64::MAX, &[], false),
                part(2, 0, 49, &[0], false),
                part(3, 50, 99, &[0], false),
            ],
            groups: Vec::new(),
            removed: Vec::new(),
            tail_moves: Vec::new(),
            hot_keys: Vec::new(),
        }
    }

    fn ranges(r: &[(u64, u64)]) -> Vec<HashRange> {
        r.iter()
            .map(|&(start, end)| HashRange { start, end })
            .collect()
    }

    fn split(partition: u32, r: &[(u64, u64)]) -> TopologyCommand {
        TopologyCommand::Split {
            partition,
            ranges: ranges(r),
        }
    }

    #[test]
    fn a_split_that_tiles_an_active_partition_takes_the_next_ids() {
        let plan = validate(&topology(), &split(2, &[(0, 9), (10, 49)])).unwrap();
        assert_eq!(
            plan,
            Plan::Split {
                parent: 2,
                ids: vec![4, 5],
                ranges: vec![(0, 9), (10, 49)],
                tail: None,
            }
        );
    }

    #[test]
    fn a_split_of_an_unknown_or_sealed_partition_is_refused_by_name() {
        let t = topology();
        let err = validate(&t, &split(9, &[(0, 9), (10, 49)])).unwrap_err();
        assert!(
            matches!(err, Error::UnknownPartition { partition: 9, .. }),
            "{err}"
        );
        let err = validate(&t, &split(0, &[(0, 9), (10, 99)])).unwrap_err();
        assert!(matches!(err, Error::Sealed { partition: 0, .. }), "{err}");
    }

    #[test]
    fn a_split_whose_ranges_do_not_tile_the_parent_is_refused() {
        let t = topology();
        for bad in [
            vec![(0, 49)],                    // one child
            vec![(0, 9), (11, 49)],           // a gap
            vec![(0, 10), (10, 49)],          // an overlap
            vec![(1, 9), (10, 49)],           // short at the start
            vec![(0, 9), (10, 48)],           // short at the end
            vec![(0, 9), (10, 60)],           // past the end
            vec![(0, 9), (30, 20), (21, 49)], // reversed
        ] {
            let err = validate(&t, &split(2, &bad)).unwrap_err();
            assert!(matches!(err, Error::Refused(_)), "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_split_past_max_partitions_is_refused() {
        // Three active, at most four: one more child fits, two do not.
        let t = topology();
        assert!(validate(&t, &split(2, &[(0, 9), (10, 49)])).is_ok());
        let err = validate(&t, &split(2, &[(0, 9), (10, 19), (20, 49)])).unwrap_err();
        assert!(matches!(err, Error::Refused(_)), "{err}");
    }

    #[test]
    fn a_tail_split_is_validated_as_a_split_and_keeps_its_options() {
        let options = TailSplitOptions::from_offset(3);
        let cmd = TopologyCommand::SplitTail {
            partition: 3,
            ranges: ranges(&[(50, 59), (60, 99)]),
            options,
        };
        match validate(&topology(), &cmd).unwrap() {
            Plan::Split {
                parent, ids, tail, ..
            } => {
                assert_eq!((parent, ids, tail), (3, vec![4, 5], Some(options)));
            }
            other => panic!("{other:?}"),
        }
        let cmd = TopologyCommand::SplitTail {
            partition: 0,
            ranges: ranges(&[(0, 9), (10, 99)]),
            options,
        };
        assert!(matches!(
            validate(&topology(), &cmd),
            Err(Error::Sealed { partition: 0, .. })
        ));
    }

    #[test]
    fn a_merge_of_adjacent_active_partitions_in_either_order_is_one_plan() {
        let t = topology();
        let expected = Plan::Merge {
            left: 2,
            right: 3,
            child: 4,
            range: (0, 99),
        };
        assert_eq!(
            validate(&t, &TopologyCommand::Merge { a: 2, b: 3 }).unwrap(),
            expected
        );
        assert_eq!(
            validate(&t, &TopologyCommand::Merge { a: 3, b: 2 }).unwrap(),
            expected
        );
    }

    #[test]
    fn a_merge_of_sealed_unknown_or_distant_partitions_or_below_the_floor_is_refused() {
        let mut t = topology();
        let merge = |a, b| TopologyCommand::Merge { a, b };
        assert!(matches!(
            validate(&t, &merge(0, 1)),
            Err(Error::Sealed { partition: 0, .. })
        ));
        assert!(matches!(
            validate(&t, &merge(2, 7)),
            Err(Error::UnknownPartition { partition: 7, .. })
        ));
        assert!(matches!(validate(&t, &merge(2, 1)), Err(Error::Refused(_))));
        t.config.balance.min_partitions = 3;
        assert!(matches!(validate(&t, &merge(2, 3)), Err(Error::Refused(_))));
    }

    #[test]
    fn a_hot_key_mode_is_checked_against_the_topic_s_policy() {
        let t = topology();
        let mode = |mode, lanes| TopologyCommand::SetHotKeyMode {
            hash: 7,
            mode,
            lanes,
        };
        let windowed = HotKeyMode::Windowed(Duration::from_millis(100));
        assert_eq!(
            validate(&t, &mode(windowed, 3)).unwrap(),
            Plan::HotKeyMode {
                hash: 7,
                mode: windowed,
                lanes: 3,
            }
        );
        // Strict takes one lane whatever it is given inside the range.
        assert_eq!(
            validate(&t, &mode(HotKeyMode::Strict, 4)).unwrap(),
            Plan::HotKeyMode {
                hash: 7,
                mode: HotKeyMode::Strict,
                lanes: 1,
            }
        );
        for bad in [
            mode(windowed, 0),
            mode(windowed, 5),
            mode(HotKeyMode::Windowed(Duration::from_micros(10)), 2),
            mode(HotKeyMode::Spread, 2),
        ] {
            let err = validate(&t, &bad).unwrap_err();
            assert!(matches!(err, Error::HotKeyMode { .. }), "{bad:?}: {err}");
        }
    }

    #[test]
    fn only_a_sealed_partition_whose_parents_are_gone_may_be_removed() {
        let mut t = topology();
        let remove = |partition| TopologyCommand::RemovePartition { partition };
        assert_eq!(
            validate(&t, &remove(0)).unwrap(),
            Plan::RemovePartition { partition: 0 }
        );
        // Active.
        assert!(matches!(validate(&t, &remove(2)), Err(Error::Refused(_))));
        assert!(matches!(
            validate(&t, &remove(8)),
            Err(Error::UnknownPartition { partition: 8, .. })
        ));
        // Sealed, but its parent 0 is still there.
        t.partitions[2].state = PartitionState::Sealed { end_offset: 1 };
        assert!(matches!(validate(&t, &remove(2)), Err(Error::Refused(_))));
    }

    #[test]
    fn the_same_command_against_the_same_topology_gives_the_same_outcome() {
        let t = topology();
        let cmds = [
            split(2, &[(0, 9), (10, 49)]),
            split(0, &[(0, 9), (10, 99)]),
            split(2, &[(0, 9)]),
            TopologyCommand::Merge { a: 3, b: 2 },
            TopologyCommand::Merge { a: 2, b: 1 },
            TopologyCommand::SetHotKeyMode {
                hash: 1,
                mode: HotKeyMode::Spread,
                lanes: 2,
            },
            TopologyCommand::RemovePartition { partition: 0 },
        ];
        for cmd in &cmds {
            let first = format!("{:?}", validate(&t, cmd));
            for _ in 0..3 {
                assert_eq!(format!("{:?}", validate(&t, cmd)), first, "{cmd:?}");
            }
            // And after the command made a round trip as bytes, as a
            // replicated log would carry it.
            let bytes = serde_json::to_vec(cmd).unwrap();
            let back: TopologyCommand = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(&back, cmd);
            assert_eq!(format!("{:?}", validate(&t, &back)), first, "{cmd:?}");
        }
    }
}
