//! The [`Reader`] state machine: it follows the lineage (drained parents,
//! children opened once all their parents are drained, partitions
//! retention removed) and hands out records in per-key order.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::read::{OwnedRecord, ReadBatch, ReadIsolation};
use crate::topology::lineage::Lineage;

use super::{
    read_step, take_batch, translate_tails, Cut, ReadStep, Reader, RetainedRange, REMOVED_END,
};

impl Reader {
    /// The current position, to save and resume from: every record handed
    /// out is before it, every other one after it.
    pub fn cut(&self) -> Cut {
        let mut last_records: std::collections::BTreeMap<u32, u64> = self
            .cursor
            .last_records
            .iter()
            .filter(|(id, _)| self.cursor.positions.contains_key(id))
            .map(|(&id, &f)| (id, f))
            .collect();
        last_records.extend(self.deferred_fingerprints());
        Cut {
            topic_id: self.topic.id(),
            positions: self.cursor.positions.clone(),
            drained: self.cursor.drained.clone(),
            last_records,
            // Only those still named matter: bounded by the topology.
            removed_before: self
                .removed_before
                .iter()
                .filter(|id| self.cursor.lineage.removed_named.contains(id))
                .copied()
                .collect(),
        }
    }

    /// The fingerprints of `Latest` positions still where the reader
    /// started, computed the first time a cut asks (see
    /// `Reader::unfingerprinted`); entries whose position moved are
    /// dropped (hand-outs fingerprint their own). A record that cannot be
    /// read there gives none, as at a position reached by skipping; so
    /// does an error reading it (the log closed, the bytes damaged), for
    /// this cut only: the position is then resumed without the check, as
    /// a cut of an older version is.
    fn deferred_fingerprints(&self) -> Vec<(u32, u64)> {
        let mut due = self.unfingerprinted.lock();
        if due.is_empty() {
            return Vec::new();
        }
        let positions = &self.cursor.positions;
        let fingerprinted = &self.cursor.last_records;
        due.retain(|id, f| {
            positions.get(id) == Some(&f.position) && !fingerprinted.contains_key(id)
        });
        let mut out = Vec::new();
        for (&id, f) in due.iter_mut() {
            let computed = match f.computed {
                Some(c) => c,
                // An error is not kept: the next cut tries again.
                None => match self.topic.latest_position(id, f.position) {
                    Ok((_, last)) => {
                        f.computed = Some(last);
                        last
                    }
                    Err(_) => None,
                },
            };
            if let Some(fp) = computed {
                out.push((id, fp));
            }
        }
        out
    }

    /// Reads with `isolation` from now on, instead of each partition's
    /// default (durable for `SyncPolicy::Always` topics, written otherwise).
    pub fn set_isolation(&mut self, isolation: ReadIsolation) {
        self.isolation = Some(isolation);
        // Read under the old isolation: read again under the new one.
        self.cursor.pending.clear();
        // What the new isolation shows was never signalled to it.
        self.cursor.look_at_all();
    }

    /// Ranges this reader passed over because retention had removed them
    /// (oldest first). Positions are never moved silently: every offset a
    /// reader skips is either here or behind an error it returned.
    pub fn retained(&self) -> &[RetainedRange] {
        &self.cursor.retained
    }

    /// Partitions currently being read.
    pub fn open_partitions(&self) -> Vec<u32> {
        self.cursor.positions.keys().copied().collect()
    }

    /// The partitions the last poll looked at, one entry per drained
    /// check or read: none for an idle poll, whatever the number open, and
    /// only the one that got data after an append. Not part of the API: it
    /// proves in tests that a poll's cost does not grow with the
    /// partitions open.
    #[cfg(feature = "testing")]
    pub fn partitions_examined(&self) -> &[u32] {
        &self.cursor.examined
    }

    /// Takes the current lineage snapshot if the topology generation moved
    /// since the last one (one atomic load otherwise). Every open partition
    /// is then looked at again: a seal, a tail split or a removal may have
    /// moved any of them.
    fn refresh_lineage(&mut self) {
        if self.topic.topology_generation() != self.cursor.lineage.generation {
            self.cursor.lineage = self.topic.lineage();
            // Records of a tail-split parent read before its split committed
            // and not handed out yet: those past its logical end are read
            // again from the children.
            let lineage = self.cursor.lineage.clone();
            self.cursor.pending.retain(|r| {
                lineage
                    .tails
                    .get(&r.partition)
                    .is_none_or(|t| r.offset < t.index.from)
            });
            translate_tails(
                &lineage,
                &mut self.cursor.positions,
                &mut self.cursor.last_records,
            );
            self.drop_removed();
            // No partition will name a removed one no partition names now.
            let named = &self.cursor.lineage.removed_named;
            self.removed_before.retain(|id| named.contains(id));
            self.cursor.look_at_all();
        }
    }

    /// Handles partitions this reader knows that left the topology:
    /// retention emptied them and they were removed. An open one becomes a
    /// reported loss from its position up to where it was sealed (nothing,
    /// if the reader had read it to there; up to `u64::MAX` when no child
    /// records the seal any more), records of it read and not handed out
    /// included, since their files are gone too. Either way it counts as
    /// drained: its children open once their other parents are drained.
    pub(super) fn drop_removed(&mut self) {
        let lineage = self.cursor.lineage.clone();
        let gone: BTreeSet<u32> = self
            .cursor
            .positions
            .keys()
            .chain(&self.cursor.drained)
            .filter(|id| !lineage.contains(**id))
            .copied()
            .collect();
        if gone.is_empty() {
            return;
        }
        // Removed partitions behind what the reader holds: read, or passed.
        let behind = lineage.removed_ancestors(
            self.cursor
                .positions
                .keys()
                .chain(&self.cursor.drained)
                .filter(|id| !gone.contains(id))
                .copied(),
        );
        let mut opened = Vec::new();
        for &id in &gone {
            if let Some(start) = self.cursor.positions.remove(&id) {
                self.cursor.pending.retain(|r| r.partition != id);
                let end = lineage
                    .removed_seals
                    .get(&id)
                    .copied()
                    .unwrap_or(REMOVED_END);
                if start < end {
                    self.cursor.retained.push(RetainedRange {
                        partition: id,
                        start,
                        end,
                    });
                }
            }
            self.cursor.last_records.remove(&id);
            self.cursor.drained.remove(&id);
            for c in lineage.children_naming(id) {
                if self.may_open(&lineage, c) {
                    // From the child's first offset: see `open_children`.
                    self.cursor.open(c, 0);
                    opened.push(c);
                }
            }
        }
        self.report_removed_generations(&lineage, &gone, &behind);
        self.open_orphans(&lineage, &mut opened);
        self.keep_waiting_parents(&lineage, &gone);
        // A removed parent of a partition opened here that the reader did
        // not know was never read.
        for c in opened {
            self.report_unread_parents(c, &gone);
        }
    }

    /// Removed partitions below a gone one that no partition left names
    /// (retention removed a whole generation): the reader never got to
    /// them, so all they held is reported.
    fn report_removed_generations(
        &mut self,
        lineage: &Lineage,
        gone: &BTreeSet<u32>,
        behind: &std::collections::HashSet<u32>,
    ) {
        for &id in gone {
            for q in lineage.removed_descendants(id) {
                if gone.contains(&q) || behind.contains(&q) || self.removed_before.contains(&q) {
                    continue;
                }
                let end = lineage
                    .removed_seals
                    .get(&q)
                    .copied()
                    .unwrap_or(REMOVED_END);
                if end > 0 {
                    self.cursor.retained.push(RetainedRange {
                        partition: q,
                        start: 0,
                        end,
                    });
                }
                self.removed_before.insert(q);
            }
        }
    }

    /// Descendants whose whole ancestry is gone too (retention removed
    /// children after their parents): partitions left without a parent in
    /// the topology that the reader neither reads nor passed. None of their
    /// ancestors is still readable (a partition is removed only after its
    /// parents), so nothing of the reader's is before them. Opened at 0.
    fn open_orphans(&mut self, lineage: &Lineage, opened: &mut Vec<u32>) {
        let passed = lineage.ancestors(
            self.cursor
                .positions
                .keys()
                .chain(&self.cursor.drained)
                .copied(),
        );
        let orphans: Vec<u32> = lineage
            .roots()
            .filter(|&r| {
                !lineage.parents(r).is_empty()
                    && !self.cursor.positions.contains_key(&r)
                    && !self.cursor.drained.contains(&r)
                    && !passed.contains(&r)
            })
            .collect();
        for r in orphans {
            self.cursor.open(r, 0);
            opened.push(r);
        }
    }

    /// A removed partition the reader had read (or was reading) stays in
    /// `drained` while one of its children is not open yet (a merge child
    /// waiting for its other parent), as any drained partition does: the
    /// cut then still says it was passed.
    fn keep_waiting_parents(&mut self, lineage: &Lineage, gone: &BTreeSet<u32>) {
        let passed = lineage.ancestors(
            self.cursor
                .positions
                .keys()
                .chain(&self.cursor.drained)
                .copied(),
        );
        for &id in gone {
            let waiting = lineage.children_naming(id).into_iter().any(|c| {
                !self.cursor.positions.contains_key(&c)
                    && !self.cursor.drained.contains(&c)
                    && !passed.contains(&c)
            });
            if waiting {
                self.cursor.drained.insert(id);
            }
        }
    }

    /// Brings a reader made from a cut (of any version) to the form the
    /// reader keeps: children of drained partitions opened once all their
    /// parents are drained, and drained partitions that are ancestors of
    /// another listed one left out (they are implied). Costs up to the
    /// number of ancestors, once per reader.
    pub(super) fn settle(&mut self) {
        let lineage = self.cursor.lineage.clone();
        let passed = lineage.ancestors(
            self.cursor
                .positions
                .keys()
                .chain(&self.cursor.drained)
                .copied(),
        );
        let known = |r: &Reader, id: u32| {
            r.cursor.positions.contains_key(&id)
                || r.cursor.drained.contains(&id)
                || passed.contains(&id)
        };
        let drained: Vec<u32> = self.cursor.drained.iter().copied().collect();
        for x in drained {
            for &c in lineage.children(x) {
                if !known(self, c)
                    && lineage.parents(c).iter().all(|q| {
                        self.cursor.drained.contains(q)
                            || passed.contains(q)
                            || !lineage.contains(*q)
                    })
                {
                    // From the child's first offset: see `open_children`.
                    self.cursor.open(c, 0);
                }
            }
        }
        let positions = &self.cursor.positions;
        self.cursor.drained.retain(|x| {
            !passed.contains(x)
                && !lineage
                    .children(*x)
                    .iter()
                    .any(|c| positions.contains_key(c))
        });
    }

    /// Moves open partitions read to their seal into `drained`, opens
    /// children whose parents are all drained, and drops from `drained`
    /// the parents whose children are all open. Looks only at the
    /// candidates: a partition reaches its seal either by being read to it
    /// (a candidate, since it gave records) or by being sealed (a new
    /// generation, which makes every open partition one). Returns whether
    /// anything changed.
    pub(super) fn advance_lineage(&mut self) -> bool {
        self.refresh_lineage();
        let mut changed = false;
        loop {
            let done = self.cursor.drained_candidates(&self.topic);
            if done.is_empty() {
                return changed;
            }
            changed = true;
            for &id in &done {
                self.cursor.positions.remove(&id);
                self.cursor.candidates.remove(&id);
                self.cursor.drained.insert(id);
            }
            for id in done {
                self.open_children(id);
            }
        }
    }

    /// Whether `c` is neither open nor drained and all its parents are
    /// drained (a parent no longer in the topology was removed: drained).
    fn may_open(&self, lineage: &Lineage, c: u32) -> bool {
        let known = self.cursor.positions.contains_key(&c) || self.cursor.drained.contains(&c);
        !known
            && lineage
                .parents(c)
                .iter()
                .all(|q| self.cursor.drained.contains(q) || !lineage.contains(*q))
    }

    /// Opens the children of drained `x` whose parents are all drained,
    /// and forgets drained parents whose children are then all open.
    fn open_children(&mut self, x: u32) {
        let lineage = self.cursor.lineage.clone();
        for &c in lineage.children(x) {
            if !self.may_open(&lineage, c) {
                continue;
            }
            // From the child's first offset, not its first held one: what
            // retention removed before this reader got there is then
            // reported by `poll`, not skipped.
            self.cursor.open(c, 0);
            self.report_unread_parents(c, &BTreeSet::new());
            for &q in lineage.parents(c) {
                // A removed parent's children are found by their naming it.
                let children = if lineage.contains(q) {
                    lineage.children(q).to_vec()
                } else {
                    lineage.children_naming(q)
                };
                if children.iter().all(|s| {
                    self.cursor.positions.contains_key(s) || self.cursor.drained.contains(s)
                }) {
                    // An ancestor of an open partition: implied drained.
                    self.cursor.drained.remove(&q);
                }
            }
        }
    }

    /// Reports the removed parents of `c` (just opened) that this reader
    /// never read: not in `drained` (where a removed partition it read
    /// stays until its children are open), not in `gone` (handled by the
    /// caller), not gone before it started and not reported already
    /// ([`Cut::removed_before`]). Their records went with them, from
    /// their first offset to their seal.
    fn report_unread_parents(&mut self, c: u32, gone: &BTreeSet<u32>) {
        let lineage = self.cursor.lineage.clone();
        for &q in lineage.parents(c) {
            if lineage.contains(q)
                || gone.contains(&q)
                || self.cursor.drained.contains(&q)
                || self.removed_before.contains(&q)
            {
                continue;
            }
            let end = lineage
                .removed_seals
                .get(&q)
                .copied()
                .unwrap_or(REMOVED_END);
            if end > 0 {
                self.cursor.retained.push(RetainedRange {
                    partition: q,
                    start: 0,
                    end,
                });
            }
            self.removed_before.insert(q);
        }
    }

    /// Reads up to `max_records` records that are available now, following
    /// the lineage. Records already read and not yet handed out come
    /// first; then reads go to the open partitions in turn.
    ///
    /// An error met after some records were collected ends this poll with
    /// those records; the next poll meets it again (positions move only
    /// past records handed out).
    pub fn poll(&mut self, max_records: usize) -> Result<Vec<OwnedRecord>> {
        self.topic.inner.core().check_not_closed()?;
        self.cursor.examined.clear();
        let mut out = Vec::new();
        while out.len() < max_records {
            if self.cursor.pending.is_empty() {
                match self.fill() {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(e) if out.is_empty() => return Err(e),
                    Err(_) => break,
                }
            }
            let room = max_records - out.len();
            self.cursor.hand_out(&mut out, room);
        }
        // A partition read to its seal leaves the positions now, not at the
        // next poll: a cut taken meanwhile names it drained, so its later
        // removal is never taken for a loss.
        if out.len() >= max_records && self.cursor.pending.is_empty() {
            self.advance_lineage();
        }
        Ok(out)
    }

    /// Reads the next candidate (in turn) that has records into
    /// `pending`, passing over holes and retained ranges; a candidate with
    /// nothing to read stops being one until it is signalled again.
    /// Returns whether anything moved (records read, a position or the
    /// lineage changed).
    fn fill(&mut self) -> Result<bool> {
        // Before the reads: a notification taken here is of state they see.
        self.cursor.take_signals();
        let mut moved = self.advance_lineage();
        let ids = self.cursor.turn();
        for id in ids {
            let pos = self.cursor.positions[&id];
            self.cursor.examined.push(id);
            let part = match self.topic.partition(id) {
                Ok(p) => p,
                // Removed since the lineage was taken: the next refresh
                // reports it (and looks at every open partition again).
                Err(Error::UnknownPartition { .. }) => {
                    self.cursor.candidates.remove(&id);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let iso = self.isolation.unwrap_or(part.default_isolation());
            let batch = match read_step(&part, pos, iso)? {
                ReadStep::Nothing => {
                    self.cursor.candidates.remove(&id);
                    continue;
                }
                ReadStep::Skip { to, retained } => {
                    self.cursor.retained.extend(retained);
                    self.skip_to(id, to);
                    moved = true;
                    continue;
                }
                ReadStep::Batch(b) => b,
            };
            self.cursor.next_rr = id.wrapping_add(1);
            self.take_batch(id, pos, &batch)?;
            return Ok(true);
        }
        Ok(moved)
    }

    fn skip_to(&mut self, id: u32, pos: u64) {
        self.cursor.positions.insert(id, pos);
        self.cursor.last_records.remove(&id);
    }

    /// Copies a batch's records into `pending` (see [`take_batch`]).
    fn take_batch(&mut self, id: u32, pos: u64, batch: &ReadBatch) -> Result<()> {
        if let Some(to) = take_batch(&mut self.cursor.pending, id, pos, batch)? {
            self.skip_to(id, to);
        }
        Ok(())
    }

    /// Whether a poll could move now: a topology change, or what
    /// [`LineageCursor::can_move`] says under the reader's isolation.
    fn can_move(&self) -> bool {
        self.topic.topology_generation() != self.cursor.lineage.generation
            || self
                .cursor
                .can_move(&self.topic, self.isolation, &BTreeSet::new())
    }

    /// Like [`Reader::poll`], but waits up to `timeout` for data. Any open
    /// partition wakes it: an append (written reads) or a sync round
    /// (durable reads) on any of them, or a seal that lets the reader move
    /// on to children.
    pub fn poll_wait(&mut self, max_records: usize, timeout: Duration) -> Result<Vec<OwnedRecord>> {
        let deadline = crate::duration::deadline_after(timeout);
        let wake = self.cursor.signals.wake().clone();
        loop {
            let got = self.poll(max_records)?;
            if !got.is_empty() || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(got);
            }
            wake.wait_until(deadline, || self.can_move());
        }
    }
}
