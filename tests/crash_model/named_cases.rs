//! Named crash-model cases (tests/crash_model/harness.rs under the per-file
//! crash model of tests/common/durable.rs): power loss at every I/O step of
//! recovery, and each engine gap the model found that is still open (each
//! `#[ignore]`d with its reason until the engine closes it; the model test
//! grants it meanwhile, see `harness::KnownGaps`).

use crate::harness;

use harness::{
    recovery_steps_case, retention_case, roll_chain_case, try_case, Case, KnownGaps, Op, Settings,
    Size,
};

fn keyed(k: usize, size: Size) -> (Option<usize>, Size) {
    (Some(k), size)
}

fn crash(seed: u64) -> Op {
    Op::Crash {
        seed,
        torn_any_byte: false,
    }
}

/// Runs `case(seed)` for every seed in `seeds`; panics with the first
/// violation's report.
fn all_hold(seeds: std::ops::Range<u64>, settings: Settings, case: impl Fn(u64) -> Case) {
    for seed in seeds {
        if let Err(report) = try_case(&case(seed), settings) {
            panic!("seed {seed}: {report}");
        }
    }
}

/// A power loss before each I/O step of recovery (and of the recovery that
/// follows it), for logs with rolled, sealed, split and merged partitions:
/// C1-C3 and C5 hold after recovering again.
#[test]
fn power_loss_at_every_step_of_recovery() {
    let settings = Settings {
        recovery_crash_points: usize::MAX,
        ..Settings::default()
    };
    all_hold(0..6, settings, recovery_steps_case);
}

/// Retention unlinks several segments; a power loss before their directory
/// is synced brings back any subset of them. Recovery must not mistake a
/// partial resurrection for a gap or a torn tail (the retention floor in
/// the checkpoint tells it which segments were retired).
#[test]
fn power_loss_after_retention() {
    all_hold(0..32, Settings::default(), retention_case);
}

/// Rolls with no sync round between them, then a power loss: no segment's
/// name survives while an earlier segment's is lost (each roll makes the
/// earlier names durable first), so recovery never finds a segment missing
/// before one that is there, and a strict open succeeds.
#[test]
fn power_loss_after_rolls() {
    all_hold(0..32, Settings::default(), roll_chain_case);
}

/// A forced roll, a sync, a power loss: the new segment's name is durable
/// (the sync round fsyncs the directory) and the checkpoint points into it,
/// but its header was never fdatasynced (no records follow it yet), so a
/// strict open refuses the log: "file shorter than a segment header".
#[test]
fn empty_rolled_segment_survives_power_loss() {
    let settings = Settings {
        gaps: KnownGaps {
            segment_headers: false,
            ..KnownGaps::OPEN
        },
        ..Settings::default()
    };
    all_hold(0..16, settings, |seed| Case {
        segment_bytes: 4096,
        retention: false,
        ops: vec![
            Op::Append(vec![keyed(0, Size::Small(100))]),
            Op::Roll(0),
            Op::Sync,
            crash(seed),
        ],
    });
}

/// Recovery deletes the segments that follow a torn tail without fsyncing
/// the directory. New appends reuse those offsets; once a split seals the
/// partition exactly where a deleted segment began, a second power loss
/// brings that segment back, and its stale records continue the sealed
/// chain: phantom records past the seal (C2).
#[test]
fn segments_deleted_by_recovery_stay_deleted() {
    let settings = Settings {
        gaps: KnownGaps {
            recovery_deletions: false,
            ..KnownGaps::OPEN
        },
        recovery_crash_points: 0,
        ..Settings::default()
    };
    // Shrunk from a model run (FISSIONLOG_SEED=1796072818473320903).
    let case = Case {
        segment_bytes: 8192,
        retention: false,
        ops: vec![
            Op::Merge(0),
            Op::Append(vec![(None, Size::Small(0)), (None, Size::Small(0))]),
            Op::Append(vec![(None, Size::Small(126)), (None, Size::Small(201))]),
            Op::Append(vec![
                (Some(0), Size::Small(212)),
                (Some(2), Size::Small(114)),
                (Some(2), Size::Small(245)),
            ]),
            Op::Append(vec![
                (Some(2), Size::Small(265)),
                (Some(2), Size::Small(198)),
            ]),
            Op::Append(vec![
                (None, Size::Small(111)),
                (Some(0), Size::Small(189)),
                (Some(0), Size::Small(84)),
            ]),
            Op::Append(vec![(Some(2), Size::Small(39))]),
            Op::Append(vec![(None, Size::Small(81))]),
            Op::Append(vec![(None, Size::Small(141))]),
            Op::Append(vec![(None, Size::Small(297))]),
            Op::Append(vec![
                (Some(0), Size::Small(88)),
                (Some(2), Size::Small(282)),
                (None, Size::Small(57)),
            ]),
            Op::Sync,
            Op::Append(vec![(None, Size::NearSegment(0)), (None, Size::Small(0))]),
            Op::Append(vec![
                (None, Size::Small(100)),
                (Some(2), Size::Small(186)),
                (Some(2), Size::Small(153)),
            ]),
            Op::Crash {
                seed: 3840289082523955637,
                torn_any_byte: false,
            },
            Op::Append(vec![(None, Size::Small(0)), (None, Size::Small(0))]),
            Op::Split(0),
        ],
    };
    if let Err(report) = try_case(&case, settings) {
        panic!("{report}");
    }
}

/// A split used to commit without syncing its parent,
/// so a power loss kept the seal but lost the parent's unsynced records
/// below it: the parent came back sealed lower than committed (C5).
#[test]
fn split_commit_keeps_the_parents_records() {
    let settings = Settings {
        gaps: KnownGaps {
            split_parent_unsynced: false,
            ..KnownGaps::OPEN
        },
        ..Settings::default()
    };
    all_hold(0..16, settings, |seed| Case {
        segment_bytes: 4096,
        retention: false,
        ops: vec![
            Op::Append(vec![keyed(0, Size::Small(40)), keyed(0, Size::Small(41))]),
            Op::Split(0),
            crash(seed),
        ],
    });
}

/// A power loss right after a roll keeps the old segment's header page
/// (with its seal) but not its last records. Recovery cuts the torn tail
/// and keeps the segment as the active one with the seal still in its
/// header; the next open sees the seal and starts a new segment, so a
/// second open is not a no-op (C7), and appends land in a segment whose
/// header says sealed. Found by the model
/// test (FISSIONLOG_SEED=1796072910103595480, shrunk).
#[test]
fn torn_roll_recovers_to_a_stable_state() {
    let settings = Settings {
        gaps: KnownGaps {
            torn_seal_reopen: false,
            ..KnownGaps::OPEN
        },
        ..Settings::default()
    };
    let case = Case {
        segment_bytes: 8192,
        retention: false,
        ops: vec![
            Op::Split(1),
            Op::Append(vec![
                (Some(2), Size::NearSegment(0)),
                (Some(2), Size::NearSegment(20)),
            ]),
            Op::Append(vec![(Some(2), Size::Small(129))]),
            Op::Append(vec![(Some(2), Size::Small(196))]),
            Op::Append(vec![(Some(2), Size::Small(190))]),
            Op::Append(vec![(Some(2), Size::Small(238))]),
            Op::Append(vec![(Some(2), Size::Small(265))]),
            Op::Reopen,
            Op::Append(vec![
                (Some(2), Size::NearSegment(0)),
                (None, Size::Small(0)),
            ]),
            Op::Crash {
                seed: 4809492079984608739,
                torn_any_byte: false,
            },
            Op::Roll(191),
            Op::Crash {
                seed: 5778943697257851243,
                torn_any_byte: false,
            },
        ],
    };
    if let Err(report) = try_case(&case, settings) {
        panic!("{report}");
    }
}
