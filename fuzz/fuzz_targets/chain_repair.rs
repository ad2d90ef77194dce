//! Fuzz target: see `fissionlog::internals::fuzz_checks::check_chain_repair`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fissionlog::internals::fuzz_checks::check_chain_repair(data);
});
