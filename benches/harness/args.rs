//! Command-line arguments of the profiling harnesses.
//!
//! The harnesses are bench targets (`harness = false`), so cargo runs them
//! in two ways: `cargo bench` passes `--bench` after the user's arguments,
//! and `cargo test --benches` (or `--all-targets`) passes nothing at all.
//! The first is a measurement: `--bench` is dropped and the positional
//! arguments (or the harness's defaults) apply. The second is a smoke run
//! that keeps the harness compiling and working: `smoke` stands in for the
//! arguments, sized to finish in a moment.
//!
//! Flags other than `--bench` (`cargo bench -- --noplot zzz`, meant for
//! the criterion benches) are not for a harness: it says so and exits
//! without running, so a sweep over every bench goes on.

/// The harness's positional arguments, as described above.
pub fn harness_args(smoke: &[&str]) -> Vec<String> {
    let given: Vec<String> = std::env::args().skip(1).collect();
    if given.is_empty() {
        return smoke.iter().map(|s| (*s).to_owned()).collect();
    }
    let args: Vec<String> = given.into_iter().filter(|a| a != "--bench").collect();
    if let Some(flag) = args.iter().find(|a| a.starts_with('-')) {
        println!(
            "skipped: this harness takes positional arguments, not {flag} (docs/PERFORMANCE.md)"
        );
        std::process::exit(0);
    }
    args
}
