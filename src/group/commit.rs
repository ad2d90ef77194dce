//! A member's commit, in named steps: translate through tail splits,
//! attribute each named partition to a tenure of the member, validate,
//! persist (the manifest's `GroupCommit`), apply to the coordinator.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Error, Result};
use crate::reader::translate_tails;
use crate::topology::lineage::Lineage;

use super::committed::Committed;
use super::coordinator::Coordinator;
use super::{Member, MemberState, Runtime};

impl Member {
    /// Commits everything this member has handed out, atomically across its
    /// partitions, durably (in the manifest) when this returns. Refused
    /// with [`Error::Fenced`] if the member was declared dead; a partition
    /// revoked in the meantime moves to its new owner once committed.
    pub fn commit(&mut self) -> Result<()> {
        let positions: Vec<(u32, u64)> = self
            .cursor
            .positions
            .iter()
            .map(|(&p, &o)| (p, o))
            .collect();
        let drained: Vec<u32> = self.cursor.drained.iter().copied().collect();
        self.commit_handed(&positions, &drained)
    }

    /// Commits the given next offsets (each at most what was handed out),
    /// atomically. A partition must be one this member reads (one
    /// retention removed has nothing left to commit and is passed over);
    /// a split child only together with (or after) its parent read to its
    /// seal, else the commit is refused ([`Error::CommitBeforeParent`]); an
    /// offset past what was handed out is refused
    /// ([`Error::InvalidConfig`]). A partition named twice commits the
    /// higher offset.
    pub fn commit_positions(&mut self, positions: &[(u32, u64)]) -> Result<()> {
        let mut highest: BTreeMap<u32, u64> = BTreeMap::new();
        for &(p, o) in positions {
            let e = highest.entry(p).or_insert(o);
            *e = (*e).max(o);
        }
        let mut pos = Vec::new();
        let mut drained = Vec::new();
        // Offsets of records handed out from a tail-split parent before the
        // split, past its logical end: the children's translated positions,
        // the parent read (as this member's positions were translated).
        let lineage = self.cursor.lineage.clone();
        for p in translate_tails(&lineage, &mut highest, &mut BTreeMap::new()) {
            if self.cursor.drained.contains(&p) {
                drained.push(p);
            }
        }
        for (p, o) in highest {
            let handed = match self.cursor.positions.get(&p) {
                Some(&h) => h,
                None if self.cursor.drained.contains(&p) => {
                    self.cursor.lineage.sealed_at(p).unwrap_or(0)
                }
                // Removed by retention (this member reported what it had
                // not handed out there): nothing left to commit, as in
                // `commit`.
                None if !self.cursor.lineage.contains(p)
                    && self.cursor.lineage.removed.contains_key(&p) =>
                {
                    continue
                }
                None => {
                    return Err(Error::NotAssigned {
                        group: self.runtime.name.clone(),
                        member: self.id,
                        partition: p,
                    })
                }
            };
            if o > handed {
                return Err(Error::InvalidConfig(format!(
                    "commit of offset {o} in partition {p} past what was handed out ({handed})"
                )));
            }
            if self.cursor.drained.contains(&p) && o >= handed {
                drained.push(p);
            } else {
                pos.push((p, o));
            }
        }
        self.commit_handed(&pos, &drained)
    }

    /// A commit the caller made (not one a poll made by itself): it covers
    /// the losses this member was told of before it.
    fn commit_handed(&mut self, positions: &[(u32, u64)], drained: &[u32]) -> Result<()> {
        let runtime = self.runtime.clone();
        let now = runtime.now();
        let mut co = runtime.lock();
        self.begin_commit(&runtime, &mut co, now)?;
        let told = self.told_losses(&co);
        self.commit_under(&runtime, &mut co, now, positions, drained, told)
    }

    /// Commits as read the partitions of `drained` (a poll's own commit of
    /// empty drained partitions): it covers no loss.
    pub(super) fn commit_empty_drains(&mut self, drained: &[u32]) -> Result<()> {
        let runtime = self.runtime.clone();
        let now = runtime.now();
        let mut co = runtime.lock();
        self.begin_commit(&runtime, &mut co, now)?;
        self.commit_under(&runtime, &mut co, now, &[], drained, Vec::new())
    }

    /// The timeouts first: a member past its session timeout is fenced
    /// here, not allowed to commit until something else notices. Then what
    /// it handed out, for the revocations the commit may settle.
    fn begin_commit(&mut self, runtime: &Runtime, co: &mut Coordinator, now: u64) -> Result<()> {
        runtime.tick(co, now);
        co.member(self.id)?;
        self.report(co);
        Ok(())
    }

    /// Translates, validates, persists and applies a commit, with the
    /// coordinator held: the steps of [`CommitRequest`] and
    /// [`Coordinator::plan_commit`].
    fn commit_under(
        &mut self,
        runtime: &Runtime,
        co: &mut Coordinator,
        now: u64,
        positions: &[(u32, u64)],
        drained: &[u32],
        told: Vec<u32>,
    ) -> Result<()> {
        let (positions, drained) = translate_through_tails(&co.lineage, positions, drained);
        let request = CommitRequest {
            member: self.id,
            tenures: self.tenures().clone(),
            positions,
            drained,
            handed: &self.cursor.positions,
            fingerprints: &self.cursor.last_records,
            seals: &self.cursor.lineage,
            told,
        };
        match co.plan_commit(&request)? {
            None => co.committed_nothing(self.id, now),
            Some(plan) => {
                runtime.topic.commit_group(
                    &runtime.name,
                    co.generation,
                    &plan.delta,
                    &plan.drained,
                    &plan.pruned,
                )?;
                co.apply_commit(self.id, plan, now);
            }
        }
        // Partitions read may have left the ready set and their children
        // joined it, a revocation the commit covered may have moved.
        if self.assignment_moved(co) {
            self.take_assignment(co);
        }
        Ok(())
    }
}

/// A position past a tail-split parent's logical end (records handed out
/// before the split) is committed as what it means: the parent read, the
/// children at the translated positions. Written as the parent's, it would
/// be lost with the parent's removal. Unchanged (in the caller's order)
/// when no position is past a split.
fn translate_through_tails(
    lineage: &Lineage,
    positions: &[(u32, u64)],
    drained: &[u32],
) -> (Vec<(u32, u64)>, Vec<u32>) {
    let mut moved: BTreeMap<u32, u64> = positions.iter().copied().collect();
    let left = translate_tails(lineage, &mut moved, &mut BTreeMap::new());
    if left.is_empty() {
        (positions.to_vec(), drained.to_vec())
    } else {
        let drained = drained.iter().copied().chain(left).collect();
        (moved.into_iter().collect(), drained)
    }
}

/// A commit member `member` asks for, in the coordinator's terms (positions
/// already translated through tail splits).
pub(super) struct CommitRequest<'a> {
    pub(super) member: u64,
    /// The tenures the member's reading state belongs to: only partitions
    /// held in one of them are committed (one taken away and given back
    /// since is not committed from what the member remembers of it).
    pub(super) tenures: BTreeSet<u64>,
    /// Next offsets to commit.
    pub(super) positions: Vec<(u32, u64)>,
    /// Partitions read to their seal.
    pub(super) drained: Vec<u32>,
    /// What the member handed out per partition, and the fingerprint of
    /// the last record there: a position committed where the member is
    /// carries that fingerprint.
    pub(super) handed: &'a BTreeMap<u32, u64>,
    pub(super) fingerprints: &'a BTreeMap<u32, u64>,
    /// The member's lineage (the seals of the drained partitions it names).
    pub(super) seals: &'a Lineage,
    /// The group's losses the member was told of in full: the commit drops
    /// their positions.
    pub(super) told: Vec<u32>,
}

/// What a commit makes durable (a `GroupCommit` record: `delta`, `drained`,
/// `pruned`) and the committed positions once it is.
#[derive(Debug)]
pub(super) struct CommitPlan {
    pub(super) delta: Committed,
    pub(super) drained: Vec<u32>,
    pub(super) pruned: Vec<u32>,
    next: Committed,
    told: Vec<u32>,
}

impl Coordinator {
    /// Plans `request`: attributes each named partition to a tenure of the
    /// member, validates it, and builds the record to make durable. `None`:
    /// nothing to write (everything named is committed already).
    pub(super) fn plan_commit(&self, request: &CommitRequest<'_>) -> Result<Option<CommitPlan>> {
        // Which ready partition each named one belongs to.
        let root_of = self.readable_by(request.member, &request.tenures);
        let all_drained = self.committed.all_drained(&self.lineage);
        self.validate_commit(request, &root_of, &all_drained)?;
        let delta = self.commit_delta(request, &root_of, &all_drained);
        if delta.positions.is_empty() && delta.drained.is_empty() {
            return Ok(None);
        }
        let (next, pruned) = self.after_commit(&delta, &request.told);
        Ok(Some(CommitPlan {
            drained: delta.drained.iter().copied().collect(),
            delta,
            pruned,
            next,
            told: request.told.clone(),
        }))
    }

    /// Every named partition: one not held is fine only if nothing handed
    /// out there would be lost; one held is a split child only once its
    /// parent is (being) read, refused rather than left out of a commit
    /// that reports success.
    fn validate_commit(
        &self,
        request: &CommitRequest<'_>,
        root_of: &BTreeMap<u32, u32>,
        all_drained: &BTreeSet<u32>,
    ) -> Result<()> {
        let lineage = &self.lineage;
        let drained_now: BTreeSet<u32> = request.drained.iter().copied().collect();
        let named = request.positions.iter().copied().chain(
            request
                .drained
                .iter()
                .map(|&d| (d, request.seals.sealed_at(d).unwrap_or(u64::MAX))),
        );
        for (p, o) in named {
            if !root_of.contains_key(&p) {
                // Moved away: fine when the group committed this far
                // already (the partition was released with nothing
                // pending), refused when records handed out here would be
                // lost to the commit. A partition retention removed has
                // nothing left to commit.
                let committed = self.committed.positions.get(&p).copied();
                let harmless = all_drained.contains(&p)
                    || committed.is_some_and(|c| c >= o)
                    || o == 0
                    || !lineage.contains(p);
                if !harmless {
                    return Err(Error::NotAssigned {
                        group: self.name.clone(),
                        member: request.member,
                        partition: p,
                    });
                }
            } else if !lineage.parents(p).iter().all(|q| {
                all_drained.contains(q) || drained_now.contains(q) || !lineage.contains(*q)
            }) {
                return Err(Error::CommitBeforeParent {
                    group: self.name.clone(),
                    member: request.member,
                    partition: p,
                });
            }
        }
        Ok(())
    }

    /// What `request` adds to the committed positions: positions past the
    /// committed ones, newly drained partitions with their split children
    /// listed, told losses with the partitions that continue them listed.
    fn commit_delta(
        &self,
        request: &CommitRequest<'_>,
        root_of: &BTreeMap<u32, u32>,
        all_drained: &BTreeSet<u32>,
    ) -> Committed {
        let lineage = &self.lineage;
        let mut delta = Committed::default();
        for &(p, o) in &request.positions {
            if !root_of.contains_key(&p) {
                continue;
            }
            if self.committed.positions.get(&p).is_some_and(|&c| c >= o) {
                // Never backwards (a commit of older positions after a
                // newer one), and nothing to write for a position the
                // group lists already (an idle consumer loop commits after
                // every empty poll: each would cost a manifest fsync). An
                // unlisted partition is listed once, even at 0.
                continue;
            }
            delta.positions.insert(p, o);
            if request.handed.get(&p) == Some(&o) {
                if let Some(&f) = request.fingerprints.get(&p) {
                    delta.last_records.insert(p, f);
                }
            }
        }
        for &d in &request.drained {
            if root_of.contains_key(&d) && !all_drained.contains(&d) {
                delta.drained.insert(d);
            }
        }
        // A drained partition's split children are listed (at 0 if unread)
        // so the parent can be pruned and the children become ready.
        for &d in &delta.drained.clone() {
            for &c in lineage.children(d) {
                if lineage.parents(c).len() == 1
                    && !delta.positions.contains_key(&c)
                    && !delta.drained.contains(&c)
                    && !self.committed.positions.contains_key(&c)
                {
                    delta.positions.insert(c, 0);
                }
            }
        }
        // Losses the member was told of leave the committed positions now
        // (drained and pruned at once: a removed partition has no children
        // to list); the partitions that continue them are listed (at 0 if
        // unread), so their own removal is reported in turn.
        for p in &request.told {
            delta.drained.insert(*p);
            for &h in &self.losses[p].heirs {
                if self.owners.contains_key(&h)
                    && !self.committed.positions.contains_key(&h)
                    && !delta.positions.contains_key(&h)
                    && !delta.drained.contains(&h)
                {
                    delta.positions.insert(h, 0);
                }
            }
        }
        delta
    }

    /// The committed positions once `delta` is durable, and the drained
    /// partitions it prunes (all children listed, or a told loss).
    fn after_commit(&self, delta: &Committed, told: &[u32]) -> (Committed, Vec<u32>) {
        let lineage = &self.lineage;
        let mut next = self.committed.clone();
        for (&p, &o) in &delta.positions {
            next.positions.insert(p, o);
            match delta.last_records.get(&p) {
                Some(&f) => next.last_records.insert(p, f),
                None => next.last_records.remove(&p),
            };
            next.drained.remove(&p);
        }
        for &d in &delta.drained {
            next.positions.remove(&d);
            next.last_records.remove(&d);
            next.drained.insert(d);
        }
        let pruned: Vec<u32> = next
            .drained
            .iter()
            .copied()
            .filter(|&d| {
                let children = lineage.children(d);
                !children.is_empty()
                    && children
                        .iter()
                        .all(|c| next.positions.contains_key(c) || next.drained.contains(c))
            })
            .chain(told.iter().copied())
            .collect();
        for d in &pruned {
            next.drained.remove(d);
        }
        (next, pruned)
    }

    /// A commit of member `id` that had nothing to write: progress all the
    /// same, and its revocations may settle.
    pub(super) fn committed_nothing(&mut self, id: u64, now: u64) {
        if let Some(m) = self.members.get_mut(&id) {
            m.last_progress = now;
        }
        self.settle_revoked(id, now);
    }

    /// `plan` (of member `id`) is durable: the committed positions move,
    /// told losses go, partitions read leave the ready set (their children
    /// become ready with the member), revocations the commit covers
    /// release.
    pub(super) fn apply_commit(&mut self, id: u64, plan: CommitPlan, now: u64) {
        self.committed = plan.next;
        self.committed_moved();
        for p in &plan.told {
            self.losses.remove(p);
        }
        if !self.losses.is_empty() {
            // The commit may have read partitions that continued a loss:
            // it goes on with what continues them.
            self.refresh_losses();
        }
        self.stats.commits += 1;
        if let Some(m) = self.members.get_mut(&id) {
            m.last_progress = now;
            if m.state == MemberState::Slow {
                m.state = MemberState::Active;
            }
        }
        let before: BTreeSet<u32> = self.owners.keys().copied().collect();
        self.recompute_ready(Some(id));
        if self.owners.keys().copied().collect::<BTreeSet<u32>>() != before {
            self.generation += 1;
        }
        // Revoked partitions whose handed-out records are now committed move.
        for p in self.revoking_of(id) {
            self.try_release(p, now);
        }
        self.assign_unowned(now);
    }
}
