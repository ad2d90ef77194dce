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

    /// A reader racing a writer never sees a mix of two stores: every
    /// value stored keeps `v[1] == 3 * v[0]`, `v[2] == v[0] ^ MASK` and
    /// `v[3] == !v[0]`, which a torn load (fields from different stores)
    /// breaks. Loads are also monotonic, as the writer's values are.
    #[test]
    fn loads_never_mix_two_stores() {
        const MASK: u64 = 0x5555_5555_5555_5555;
        let cell = PositionCell::new([0, 0, MASK, !0]);
        let stop = AtomicBool::new(false);
        let checked = std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let (mut last, mut n) = (0u64, 0u64);
                        while !stop.load(Ordering::Acquire) {
                            let v = cell.load();
                            assert_eq!(v[1], v[0].wrapping_mul(3), "torn load {v:?}");
                            assert_eq!(v[2], v[0] ^ MASK, "torn load {v:?}");
                            assert_eq!(v[3], !v[0], "torn load {v:?}");
                            assert!(v[0] >= last, "went back from {last} to {}", v[0]);
                            last = v[0];
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            for i in 1..=300_000u64 {
                cell.store([i, i.wrapping_mul(3), i ^ MASK, !i]);
            }
            stop.store(true, Ordering::Release);
            readers
                .into_iter()
                .map(|r| r.join().expect("reader"))
                .sum::<u64>()
        });
        assert!(checked > 0);
        assert_eq!(cell.load(), [300_000, 900_000, 300_000 ^ MASK, !300_000]);
    }
}
