//! What a member tells the coordinator it handed out, and when it reads
//! its assignment again: only what changed since it last did.
//!
//! The coordinator keeps a copy of each member's handed-out positions (what
//! a revocation waits for, what a release delivers again). A member sends
//! the whole of it only when its reading state may have changed anywhere
//! (it took its assignment, or cut its state to what it owns) or when the
//! coordinator's copy may differ from its last report (a release drops the
//! released partitions from it, and moves [`Coordinator::ownership`]).
//! Otherwise it sends the partitions it handed out, passed over, drained or
//! opened since: an idle poll sends nothing, and a poll after an append to
//! one partition sends that one.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::read::OwnedRecord;

use super::coordinator::Coordinator;
use super::Member;

/// The partitions whose handed-out state (next offset, fingerprint, read
/// to the seal) changed since the last report.
#[derive(Debug)]
pub(super) struct Unreported {
    /// Any may have: the next report is a full one.
    all: bool,
    ids: BTreeSet<u32>,
    /// [`Coordinator::ownership`] at the last report.
    reported_ownership: Option<u64>,
}

impl Unreported {
    /// Nothing reported yet: the first report is a full one.
    pub(super) fn all() -> Unreported {
        Unreported {
            all: true,
            ids: BTreeSet::new(),
            reported_ownership: None,
        }
    }

    /// Partition `p`'s handed-out state changed.
    pub(super) fn mark(&mut self, p: u32) {
        if !self.all {
            self.ids.insert(p);
        }
    }

    /// Any partition's may have changed.
    pub(super) fn mark_all(&mut self) {
        self.all = true;
        self.ids.clear();
    }
}

impl Member {
    /// Whether what this member reads of the coordinator moved since it
    /// last took its assignment: an owner, a tenure or a revocation
    /// ([`Coordinator::ownership`]), the generation, the lineage, or its
    /// own state was cut to what it owns.
    pub(super) fn assignment_moved(&self, co: &Coordinator) -> bool {
        self.retake
            || co.ownership != self.seen_ownership
            || co.generation != self.generation
            || !Arc::ptr_eq(&self.cursor.lineage, &co.lineage)
    }

    /// Publishes what this member handed out (under the group lock): in
    /// full after a change anywhere, else the partitions that changed.
    pub(super) fn report(&mut self, co: &mut Coordinator) {
        let u = &mut self.unreported;
        if u.all || u.reported_ownership != Some(co.ownership) {
            self.full_walks += 1;
            let delivered = self
                .cursor
                .positions
                .iter()
                .map(|(&p, &pos)| (p, (pos, self.cursor.last_records.get(&p).copied())))
                .collect();
            co.handed_out(self.id, delivered, self.cursor.drained.clone());
        } else if !u.ids.is_empty() {
            let cursor = &self.cursor;
            let changes = u.ids.iter().map(|&p| {
                let at = cursor
                    .positions
                    .get(&p)
                    .map(|&pos| (pos, cursor.last_records.get(&p).copied()));
                (p, at, cursor.drained.contains(&p))
            });
            co.handed_out_changes(self.id, changes);
        }
        let u = &mut self.unreported;
        u.all = false;
        u.ids.clear();
        u.reported_ownership = Some(co.ownership);
        #[cfg(debug_assertions)]
        self.assert_reported(co);
    }

    /// The coordinator's copy of what this member handed out is its whole
    /// reading state, as a full report would make it (checked in debug
    /// builds: a change the member did not mark would leave the copy
    /// behind, and a revocation would release records still out).
    #[cfg(debug_assertions)]
    fn assert_reported(&self, co: &Coordinator) {
        let Some(m) = co.members.get(&self.id) else {
            return;
        };
        let delivered: std::collections::BTreeMap<u32, (u64, Option<u64>)> = self
            .cursor
            .positions
            .iter()
            .map(|(&p, &pos)| (p, (pos, self.cursor.last_records.get(&p).copied())))
            .collect();
        assert_eq!(m.delivered, delivered, "member {}'s positions", self.id);
        assert_eq!(
            m.delivered_drained, self.cursor.drained,
            "member {}'s drained partitions",
            self.id
        );
    }

    /// Whether every record of `out` is of a partition this member still
    /// reads as the coordinator knows it: one lookup per partition of
    /// `out` (and its split ancestors), whatever the number it owns.
    pub(super) fn all_readable(&self, co: &Coordinator, out: &[OwnedRecord]) -> bool {
        let mut seen: Option<u32> = None;
        let fast = out.iter().all(|r| {
            // Records come in runs of one partition.
            if seen == Some(r.partition) {
                return true;
            }
            seen = Some(r.partition);
            co.reads(self.id, self.tenures(), r.partition)
        });
        debug_assert_eq!(
            fast,
            {
                let mine = co.readable_by(self.id, self.tenures());
                out.iter().all(|r| mine.contains_key(&r.partition))
            },
            "the walk up from each partition read and the full ownership agree"
        );
        fast
    }
}
