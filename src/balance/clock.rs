//! Time sources.
//!
//! Balancing code never reads the system clock directly: it takes
//! `now_nanos` from a [`Clock`], so tests drive it with a `ManualClock` and
//! production uses [`SystemClock`]. Nanoseconds in a `u64` cover 584 years,
//! which is why a plain integer is used instead of `Instant` (an `Instant`
//! cannot be constructed in a test, serialized, or subtracted without a
//! panic when the order is wrong).

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::duration_nanos;

/// A monotonic time source in nanoseconds from an arbitrary fixed origin.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Nanoseconds since this clock's origin. A real clock never goes
    /// backwards; consumers nevertheless clamp if it does.
    fn now_nanos(&self) -> u64;

    /// Wall-clock milliseconds since the Unix epoch (0 if unknown). Unlike
    /// [`Clock::now_nanos`] it means the same across restarts: saved rates
    /// are stamped with it, so a reopen can decay them by the downtime.
    /// The default reads the system's real-time clock.
    fn wall_millis(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, crate::duration::duration_millis)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_nanos(&self) -> u64 {
        (**self).now_nanos()
    }

    fn wall_millis(&self) -> u64 {
        (**self).wall_millis()
    }
}

/// The system's monotonic clock (coarse: see `now_nanos`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl SystemClock {
    /// A handle on the process-wide monotonic clock.
    pub fn new() -> Self {
        SystemClock
    }
}

/// The process-wide origin: shared so that every `SystemClock` agrees.
fn process_origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl Clock for SystemClock {
    /// `CLOCK_MONOTONIC_COARSE`: a few nanoseconds per read (it is read on
    /// every append) at the kernel tick's resolution (1–4 ms), ample for
    /// rates folded every 100 ms. Falls back to `Instant` if unavailable.
    fn now_nanos(&self) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec into the valid, owned `ts`.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        if rc == 0 {
            (ts.tv_sec as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(ts.tv_nsec as u64)
        } else {
            duration_nanos(process_origin().elapsed())
        }
    }
}

#[cfg(any(test, feature = "testing"))]
pub use manual::ManualClock;

#[cfg(any(test, feature = "testing"))]
mod manual {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::{duration_nanos, Clock};

    /// A clock that only moves when told to: for tests and simulations
    /// (behind the `testing` feature).
    ///
    /// It may be shared between threads (`Arc<ManualClock>` is a `Clock` too).
    /// [`ManualClock::set_nanos`] may move it backwards, on purpose, so tests can
    /// check that consumers clamp.
    #[derive(Debug, Default)]
    pub struct ManualClock {
        nanos: AtomicU64,
    }

    impl ManualClock {
        /// A clock reading `start_nanos`.
        pub fn new(start_nanos: u64) -> Self {
            ManualClock {
                nanos: AtomicU64::new(start_nanos),
            }
        }

        /// Moves the clock forward by `by`, saturating at `u64::MAX`.
        pub fn advance(&self, by: Duration) {
            let by = duration_nanos(by);
            // SeqCst: a test clock should behave like a sequentially consistent
            // global variable; the cost does not matter here.
            let _ = self
                .nanos
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    Some(n.saturating_add(by))
                });
        }

        /// Sets the clock to `nanos`, which may be earlier than the current
        /// reading.
        pub fn set_nanos(&self, nanos: u64) {
            self.nanos.store(nanos, Ordering::SeqCst);
        }
    }

    impl Clock for ManualClock {
        fn now_nanos(&self) -> u64 {
            self.nanos.load(Ordering::SeqCst)
        }

        /// The same reading in milliseconds: a test that reopens a log with a
        /// new `ManualClock` set later than the old one simulates that much
        /// downtime.
        fn wall_millis(&self) -> u64 {
            self.now_nanos() / 1_000_000
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn manual_clock_advances_and_saturates() {
        let clock = ManualClock::new(5);
        assert_eq!(clock.now_nanos(), 5);
        clock.advance(Duration::from_millis(2));
        assert_eq!(clock.now_nanos(), 2_000_005);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now_nanos(), u64::MAX);
        clock.set_nanos(7);
        assert_eq!(clock.now_nanos(), 7, "set_nanos may go backwards");
    }

    #[test]
    fn wall_clocks_are_epoch_milliseconds() {
        let manual = ManualClock::new(3_000_000_123);
        assert_eq!(manual.wall_millis(), 3_000);
        let shared: Arc<dyn Clock> = Arc::new(manual);
        assert_eq!(shared.wall_millis(), 3_000);
        // After 2020-01-01 and before 2200-01-01.
        let real = SystemClock.wall_millis();
        assert!(
            (1_577_836_800_000..7_258_118_400_000).contains(&real),
            "{real}"
        );
    }

    #[test]
    fn manual_clock_through_arc_dyn() {
        let clock = Arc::new(ManualClock::default());
        let shared: Arc<dyn Clock> = clock.clone();
        clock.advance(Duration::from_nanos(42));
        assert_eq!(shared.now_nanos(), 42);
    }

    #[test]
    fn system_clock_is_monotonic_and_shared() {
        let a = SystemClock::new();
        let b = SystemClock;
        let t0 = a.now_nanos();
        let t1 = b.now_nanos();
        let t2 = a.now_nanos();
        assert!(t0 <= t1 && t1 <= t2);
    }
}
