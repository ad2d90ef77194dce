//! Caller-given durations, turned into deadlines and into the crate's
//! integer clocks without overflow.
//!
//! A caller may pass any `Duration`, up to `Duration::MAX`, as a wait, a
//! timeout or an interval. `Instant::now() + d` panics when the sum is past
//! what the platform's clock can represent, and `d.as_nanos() as u64` keeps
//! the low 64 bits of a 128-bit count, so 18,446,744,074 s becomes 0.29 s.
//! Every such conversion goes through this module instead: a deadline too
//! far away for the clock is no deadline, and a duration too long for a
//! `u64` clock saturates at `u64::MAX` (about 584 years in nanoseconds),
//! which the `u64` clocks never reach.

use std::time::{Duration, Instant};

/// The instant `timeout` from now, or `None` when it is past what
/// `Instant` can represent: wait without a deadline.
pub(crate) fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// `d` in nanoseconds, saturating at `u64::MAX`.
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `d` in milliseconds, saturating at `u64::MAX`.
pub(crate) fn duration_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_past_the_clock_is_none_and_a_near_one_is_in_the_future() {
        assert_eq!(deadline_after(Duration::MAX), None);
        assert_eq!(deadline_after(Duration::from_secs(u64::MAX)), None);
        let before = Instant::now();
        let d = deadline_after(Duration::from_secs(60)).expect("60 s fits the clock");
        assert!(d >= before + Duration::from_secs(60));
    }

    #[test]
    fn durations_past_u64_saturate_instead_of_keeping_their_low_bits() {
        // 18,446,744,074 s is 2^64 ns plus 0.29 s: a cast keeps the 0.29 s.
        let huge = Duration::from_secs(18_446_744_074);
        assert_eq!(duration_nanos(huge), u64::MAX);
        assert_eq!(duration_nanos(Duration::MAX), u64::MAX);
        assert_eq!(duration_nanos(Duration::from_millis(1500)), 1_500_000_000);
        assert_eq!(duration_millis(Duration::MAX), u64::MAX);
        assert_eq!(duration_millis(Duration::from_secs(u64::MAX)), u64::MAX);
        assert_eq!(duration_millis(Duration::from_micros(2500)), 2);
    }
}
