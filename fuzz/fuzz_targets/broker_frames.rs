//! Fuzz target: see `fissionlog_broker::protocol::check_decode`: any bytes
//! from a client are split into frames and decoded without a panic, an
//! allocation sized by the input past the frame cap, or a request that
//! does not survive its own round trip.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fissionlog_broker::protocol::check_decode(data);
});
