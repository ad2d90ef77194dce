//! Model-based property test of the core engine under the per-file crash
//! model (contracts C1, C2, C3, C5, C7). The harness is `tests/crash_model/harness.rs`;
//! docs/TESTING.md says how to reproduce a failure and run a long campaign.
//!
//! Each run explores new cases: the proptest seed comes from
//! `FISSIONLOG_SEED` (or `PROPTEST_RNG_SEED`) when set, else from the clock,
//! and is printed (shown by `cargo test` when the test fails). Failing cases
//! are persisted in `tests/model.proptest-regressions` and replayed first on
//! every later run.
//!
//! Cases: 256 by default; `FISSIONLOG_MODEL_CASES` or `PROPTEST_CASES` set more.

use crate::harness;

use harness::{case_strategy, try_case, Settings};
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, RngSeed};

fn cases() -> u32 {
    ["FISSIONLOG_MODEL_CASES", "PROPTEST_CASES"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(256)
}

/// From the environment, else from the clock; printed either way.
fn rng_seed() -> RngSeed {
    let seed = ["FISSIONLOG_SEED", "PROPTEST_RNG_SEED"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    eprintln!("model seed {seed}: reproduce with FISSIONLOG_SEED={seed}");
    RngSeed::Fixed(seed)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2000,
        rng_seed: rng_seed(),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_model(case in case_strategy()) {
        if let Err(report) = try_case(&case, Settings::default()) {
            panic!("{report}");
        }
    }
}
