//! Proves the crash model can fail: each fsync call site of the engine
//! (every `IoOp::Sync*`) is removed in turn, as the model sees it (the hook
//! ignores that op's success, which is what deleting the call would do to
//! durability), and the model-based crash test must catch it with a
//! contract violation. docs/TESTING.md has the resulting table.
//!
//! An op that is expected not to be caught carries the reason in
//! [`EXPECTED`]; the test fails if a removal expected to be caught goes
//! unnoticed (the model lost power), and if one expected to go unnoticed is
//! caught (the table is out of date).

use crate::common;
use crate::harness;

use common::model_hook::SYNC_OPS;
use fissionlog::IoOp;
use harness::{
    case_strategy, recovery_steps_case, retention_case, roll_chain_case, try_case, Settings,
};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Cases per removed op (generated from a fixed seed, so the run repeats);
/// `FISSIONLOG_MUTATION_CASES` sets more.
fn cases() -> usize {
    std::env::var("FISSIONLOG_MUTATION_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Runs the crash tests with `op` removed; the first violation: which
/// test, which case, and the report.
fn first_violation(op: IoOp) -> Option<(&'static str, usize, String)> {
    let with_drop = |settings: Settings| Settings {
        drop_op: Some(op),
        ..settings
    };
    // tests/crash_model/named_cases.rs, power_loss_after_retention.
    for seed in 0..32 {
        if let Err(r) = try_case(&retention_case(seed), with_drop(Settings::default())) {
            return Some(("crash_model::power_loss_after_retention", seed as usize, r));
        }
    }
    // tests/crash_model/named_cases.rs, power_loss_after_rolls.
    for seed in 0..32 {
        if let Err(r) = try_case(&roll_chain_case(seed), with_drop(Settings::default())) {
            return Some(("crash_model::power_loss_after_rolls", seed as usize, r));
        }
    }
    // tests/crash_model/named_cases.rs, power_loss_at_every_step_of_recovery.
    let every_step = with_drop(Settings {
        recovery_crash_points: usize::MAX,
        ..Settings::default()
    });
    for seed in 0..6 {
        if let Err(r) = try_case(&recovery_steps_case(seed), every_step) {
            return Some((
                "crash_model::power_loss_at_every_step_of_recovery",
                seed as usize,
                r,
            ));
        }
    }
    // tests/crash_model/model.rs: generated cases from a fixed seed.
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[0x5A; 32]),
    );
    let strategy = case_strategy();
    for i in 0..cases() {
        let case = strategy
            .new_tree(&mut runner)
            .expect("generate a case")
            .current();
        if let Err(r) = try_case(&case, with_drop(Settings::default())) {
            return Some(("model::engine_matches_model", i, r));
        }
    }
    None
}

#[test]
fn every_removed_fsync_is_caught() {
    // Each violation panics inside the harness: keep the output readable.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut rows = Vec::new();
    let only = std::env::var("FISSIONLOG_MUTATION_OP").ok();
    for op in SYNC_OPS {
        if only.as_ref().is_some_and(|o| *o != format!("{op:?}")) {
            continue;
        }
        let got = first_violation(op);
        rows.push((op, got));
    }
    std::panic::set_hook(hook);
    for (op, got) in &rows {
        match got {
            Some((test, i, report)) => {
                let first = report.lines().next().unwrap_or("");
                eprintln!("{op:?}: caught by {test} case {i}: {first}");
            }
            None => eprintln!("{op:?}: not caught in {} cases", cases()),
        }
    }
    let missed: Vec<_> = rows
        .iter()
        .filter(|(_, g)| g.is_none())
        .map(|(op, _)| *op)
        .collect();
    assert!(missed.is_empty(), "removed fsyncs not caught: {missed:?}");
}
