//! A position published by one writer and read whole without its lock.
//!
//! A sync round has to capture where a partition's data ends (segment,
//! byte position, offset, and the roll that created the segment) as one
//! consistent set: the first three become the durable position a
//! checkpoint names, and recovery reads `end_offset` as the offset found
//! at `position`. Taking the partition's writer lock for
//! that made every round wait behind the appends in flight, a 64 KiB
//! `pwrite` each under concurrent durable writers (about 90 µs a round out
//! of 440, docs/PERFORMANCE.md, Run 9). The writer publishes the values
//! here after each change, still under its lock; a round reads it without
//! any lock.
//!
//! It is a sequence lock built only from atomics (so no read is a data
//! race): the writer makes the sequence odd, stores the fields, and makes
//! it even again; a reader retries until it saw the same even sequence
//! before and after the fields. Writers are serialised by the caller (the
//! partition's writer lock), and a store is four relaxed stores and two
//! sequence stores, so a reader spins for at most that long.

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Where a partition's data is known durable: the segment, the byte
/// position in it up to which data is on disk, and the offset found there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DurablePoint {
    /// Base offset of the segment `position` refers to.
    pub segment_base: u64,
    /// Byte position in that segment up to which data is durable.
    pub position: u64,
    /// Offset matching `position` (exclusive end).
    pub end_offset: u64,
}

impl DurablePoint {
    /// Nothing durable at all, not even the first segment's header (a new
    /// topic's partition, or a chain recovery found no checkpoint in): a
    /// position below the header, which a checkpoint entry records and
    /// recovery reads as saying nothing of the segment's bytes.
    pub(crate) const NOTHING: DurablePoint = DurablePoint {
        segment_base: 0,
        position: 0,
        end_offset: 0,
    };
}

impl From<DurablePoint> for (u64, u64, u64) {
    /// `(segment_base, position, end_offset)`, as `Topic::make_partition`
    /// takes it.
    fn from(d: DurablePoint) -> (u64, u64, u64) {
        (d.segment_base, d.position, d.end_offset)
    }
}

/// How many values a cell holds.
pub(crate) const FIELDS: usize = 4;

/// `u64`s stored by one writer at a time and loaded as a unit.
#[derive(Debug, Default)]
pub(crate) struct PositionCell {
    seq: AtomicU64,
    fields: [AtomicU64; FIELDS],
}

impl PositionCell {
    /// A cell holding `v`.
    pub(crate) fn new(v: [u64; FIELDS]) -> PositionCell {
        let cell = PositionCell::default();
        cell.store(v);
        cell
    }

    /// Publishes `v`. Callers must not store concurrently (the partition
    /// stores under its writer lock); everything the caller wrote before
    /// this call is visible to a reader that loads `v`.
    pub(crate) fn store(&self, v: [u64; FIELDS]) {
        let s = self.seq.load(Ordering::Relaxed);
        debug_assert!(s.is_multiple_of(2), "one writer at a time");
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd sequence before the fields: a reader that sees a
        // new field also sees the sequence moved, and retries.
        fence(Ordering::Release);
        for (f, x) in self.fields.iter().zip(v) {
            f.store(x, Ordering::Relaxed);
        }
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The last value stored, whole.
    pub(crate) fn load(&self) -> [u64; FIELDS] {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before.is_multiple_of(2) {
                let v = std::array::from_fn(|i| self.fields[i].load(Ordering::Relaxed));
                // Orders the field loads before the second sequence load
                // (pairs with the writer's Release fence).
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return v;
                }
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Barrier;
    use std::time::{Duration, Instant};

    /// A reader racing a writer never sees a mix of two stores: every
    /// value stored keeps `v[1] == 3 * v[0]`, `v[2] == v[0] ^ MASK` and
    /// `v[3] == !v[0]`, which a torn load (fields from different stores)
    /// breaks. Loads are also monotonic, as the writer's values are.
    ///
    /// The readers are running before the writer starts (a barrier), and
    /// the writer goes on until each reader has checked `LOADS` loads and
    /// seen `CHANGES` different values, so every run checks loads that
    /// raced stores however late the threads were scheduled.
    #[test]
    fn loads_never_mix_two_stores() {
        const MASK: u64 = 0x5555_5555_5555_5555;
        const READERS: usize = 2;
        const LOADS: u64 = 100_000;
        const CHANGES: u64 = 1_000;
        let cell = PositionCell::new([0, 0, MASK, !0]);
        let stop = AtomicBool::new(false);
        let start = Barrier::new(READERS + 1);
        let loads: [AtomicU64; READERS] = Default::default();
        let changes: [AtomicU64; READERS] = Default::default();
        let stores = std::thread::scope(|s| {
            let readers: Vec<_> = (0..READERS)
                .map(|r| {
                    let (cell, stop, start) = (&cell, &stop, &start);
                    let (loads, changes) = (&loads[r], &changes[r]);
                    s.spawn(move || {
                        start.wait();
                        let mut last = 0u64;
                        while !stop.load(Ordering::Acquire) {
                            let v = cell.load();
                            assert_eq!(v[1], v[0].wrapping_mul(3), "torn load {v:?}");
                            assert_eq!(v[2], v[0] ^ MASK, "torn load {v:?}");
                            assert_eq!(v[3], !v[0], "torn load {v:?}");
                            assert!(v[0] >= last, "went back from {last} to {}", v[0]);
                            if v[0] != last {
                                changes.fetch_add(1, Ordering::Relaxed);
                            }
                            last = v[0];
                            loads.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            start.wait();
            // A reader that stopped (its assertion failed) or never ran
            // ends the run after a minute instead of hanging it.
            let limit = Instant::now() + Duration::from_secs(60);
            let enough = |r: usize| {
                loads[r].load(Ordering::Relaxed) >= LOADS
                    && changes[r].load(Ordering::Relaxed) >= CHANGES
            };
            let mut i = 0u64;
            while !(0..READERS).all(enough) && (!i.is_multiple_of(1024) || Instant::now() < limit) {
                i += 1;
                cell.store([i, i.wrapping_mul(3), i ^ MASK, !i]);
            }
            stop.store(true, Ordering::Release);
            for r in readers {
                r.join().expect("reader");
            }
            i
        });
        for r in 0..READERS {
            let (n, c) = (
                loads[r].load(Ordering::Relaxed),
                changes[r].load(Ordering::Relaxed),
            );
            assert!(
                n >= LOADS && c >= CHANGES,
                "reader {r}: {n} loads, {c} changes"
            );
        }
        assert_eq!(cell.load(), [stores, stores * 3, stores ^ MASK, !stores]);
    }
}
