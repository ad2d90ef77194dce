//! Fuzz target: see `fissionlog::internals::fuzz_checks::check_batch_v2`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fissionlog::internals::fuzz_checks::check_batch_v2(data);
});
