//! Fuzz target: see `fissionlog::internals::fuzz_checks::check_checkpoint_decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fissionlog::internals::fuzz_checks::check_checkpoint_decode(data);
});
