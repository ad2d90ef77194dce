//! A committed tail split as the topology holds it: the parent's moved
//! range, which children hold it, and the translation of a parent
//! position past the parent's logical end into the children's offsets.
//! Pure: no I/O.

use serde::Serialize;

use crate::format::tail_index::TailIndex;

/// A committed tail split, as readers need it: where the parent's moved
/// range went.
#[derive(Debug)]
pub(crate) struct TailInfo {
    pub children: Vec<u32>,
    pub index: TailIndex,
    /// The `TailReclaimed` record is durable.
    pub reclaimed: std::sync::atomic::AtomicBool,
}

impl TailInfo {
    /// Where a position `pos` of the parent continues: `None` if it is at
    /// or below the logical end (the parent holds it), else per child the
    /// first moved record at or after it.
    pub(crate) fn translate(&self, pos: u64) -> Option<Vec<(u32, u64)>> {
        (pos > self.index.from).then(|| {
            self.children
                .iter()
                .copied()
                .zip(self.index.translate(pos))
                .collect()
        })
    }
}

/// A child of a tail split and how many of the parent's moved records it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MovedChild {
    /// The child's id.
    pub partition: u32,
    /// Moved records it holds.
    pub records: u64,
}

/// A partition's moved range, as `Topic::partitions` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MovedRange {
    /// First moved offset (the logical end).
    pub from: u64,
    /// End of the moved range (the physical seal).
    pub to: u64,
    /// The children holding it, with how many records each.
    pub children: Vec<MovedChild>,
    /// The parent's bytes of the range were released.
    pub reclaimed: bool,
}

impl TailInfo {
    pub(crate) fn moved_range(&self) -> MovedRange {
        MovedRange {
            from: self.index.from,
            to: self.index.seal,
            children: self
                .children
                .iter()
                .copied()
                .zip(self.index.counts())
                .map(|(partition, records)| MovedChild { partition, records })
                .collect(),
            reclaimed: self.reclaimed.load(std::sync::atomic::Ordering::Acquire),
        }
    }
}

/// What a tail split did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TailSplitOutcome {
    /// Children, in range order.
    pub children: Vec<u32>,
    /// First moved offset of the parent: its logical end now.
    pub from: u64,
    /// The parent's physical end (its seal).
    pub seal_offset: u64,
    /// Moved records per child (in `children` order).
    pub moved: Vec<u64>,
    /// Bytes of batches read from the parent and copied.
    pub copied_bytes: u64,
    /// Copy rounds run before the parent was sealed.
    pub rounds: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(slots: Vec<u8>) -> TailInfo {
        TailInfo {
            children: vec![7, 8],
            index: TailIndex::new(3, 10, 2, slots),
            reclaimed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    #[test]
    fn a_position_at_or_below_the_logical_end_stays_in_the_parent() {
        let t = info(vec![0, 1, 0]);
        assert_eq!(t.translate(0), None);
        assert_eq!(t.translate(10), None);
    }

    #[test]
    fn a_position_past_the_logical_end_continues_in_each_child_at_its_next_moved_record() {
        // Records 10, 11, 12 went to children 7, 8, 7.
        let t = info(vec![0, 1, 0]);
        assert_eq!(t.translate(11), Some(vec![(7, 1), (8, 0)]));
        assert_eq!(t.translate(12), Some(vec![(7, 1), (8, 1)]));
        assert_eq!(t.translate(13), Some(vec![(7, 2), (8, 1)]));
        // Past the seal: every child past its moved records.
        assert_eq!(t.translate(99), Some(vec![(7, 2), (8, 1)]));
    }

    #[test]
    fn the_moved_range_names_each_child_with_its_record_count() {
        let t = info(vec![0, 1, 0]);
        let m = t.moved_range();
        assert_eq!((m.from, m.to, m.reclaimed), (10, 13, false));
        assert_eq!(
            m.children,
            vec![
                MovedChild {
                    partition: 7,
                    records: 2
                },
                MovedChild {
                    partition: 8,
                    records: 1
                }
            ]
        );
    }
}
