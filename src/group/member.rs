//! A group member: reads the partitions the coordinator gives it, in
//! lineage order, and tells the coordinator what it handed out.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::read::OwnedRecord;
use crate::reader::{
    read_step, take_batch, translate_tails, LineageCursor, ReadStep, RetainedRange, REMOVED_END,
};
use crate::topology::lineage::Lineage;

use super::coordinator::{closure, Coordinator};
use super::heartbeat::{spawn_heartbeat, HeartbeatThread};
use super::{Assignment, Runtime};

/// One member of a group: polls records of the partitions it owns, commits
/// what it processed, heartbeats. Dropping it without [`Member::leave`]
/// stops its heartbeats: it is declared dead after its session timeout
/// (unless a member with its instance id rejoins first).
#[derive(Debug)]
pub struct Member {
    pub(super) runtime: Arc<Runtime>,
    pub(super) id: u64,
    pub(super) generation: u64,
    /// Ready partitions owned, as of `generation`.
    pub(super) owned: BTreeSet<u32>,
    /// Lineage and reading state: positions per partition being read
    /// (owned ones and their pinned split children), those read to their
    /// seal and not committed yet, what was read and not handed out.
    pub(super) cursor: LineageCursor,
    /// Partitions being moved away: not read any more, their handed-out
    /// positions kept for the commit that releases them.
    pub(super) paused: BTreeSet<u32>,
    /// Per ready partition owned, the tenure
    /// ([`super::coordinator::Owner::epoch`]) its
    /// reading state belongs to.
    pub(super) tenure: BTreeMap<u32, u64>,
    /// The distinct tenures of `tenure`.
    pub(super) held: BTreeSet<u64>,
    /// The coordinator's [`Coordinator::ownership`] when this member last
    /// took its assignment: it takes it again only once that, the
    /// generation or the lineage moved, or `retake` is set.
    pub(super) seen_ownership: u64,
    /// The reading state was cut to what the coordinator says is this
    /// member's outside of [`Member::take_assignment`]: take it again.
    pub(super) retake: bool,
    /// What the next report tells the coordinator (see `report.rs`).
    pub(super) unreported: super::report::Unreported,
    /// Walks this member made over everything it reads (taking its
    /// assignment, full reports), and where the count (with the
    /// coordinator's) stood when the current poll began.
    pub(super) full_walks: u64,
    pub(super) walks_at_poll: Option<u64>,
    /// Walks the group made during the last poll (see
    /// `Member::full_walks_in_last_poll`).
    pub(super) last_poll_walks: u64,
    /// Removed partitions this member was reading (or had read to their
    /// seal) when it saw them go: it reported their rest from its own
    /// position, so the group's [`super::committed::Loss`] is not reported for them again.
    pub(super) own_gone: BTreeSet<u32>,
    /// Per partition, the last run of offsets this member skipped because
    /// retention removed them (reported in `retained`): `(from, to, poll)`,
    /// `poll` being the [`Member::polls`] count of the poll that reported it.
    pub(super) skipped: BTreeMap<u32, (u64, u64, u64)>,
    /// Calls of `poll` and `poll_wait` made so far (each returns to the
    /// application, which can look at `retained` before the next).
    pub(super) polls: u64,
    pub(super) heartbeat: Option<HeartbeatThread>,
}

impl Member {
    /// A member `id` that just joined: its heartbeat thread started (if
    /// asked for) and its first assignment taken.
    pub(super) fn start(
        runtime: Arc<Runtime>,
        id: u64,
        background_heartbeat: Option<Duration>,
    ) -> Result<Member> {
        // Before any partition is looked at: whatever is published after
        // a look is signalled.
        let signals = runtime.topic.inner.wake().subscribe();
        let lineage = runtime.topic.lineage();
        let mut m = Member {
            runtime: runtime.clone(),
            id,
            generation: 0,
            cursor: LineageCursor::new(
                lineage,
                BTreeMap::new(),
                BTreeSet::new(),
                BTreeMap::new(),
                signals,
            ),
            owned: BTreeSet::new(),
            paused: BTreeSet::new(),
            tenure: BTreeMap::new(),
            held: BTreeSet::new(),
            seen_ownership: 0,
            retake: true,
            unreported: super::report::Unreported::all(),
            full_walks: 0,
            walks_at_poll: None,
            last_poll_walks: 0,
            own_gone: BTreeSet::new(),
            skipped: BTreeMap::new(),
            polls: 0,
            heartbeat: None,
        };
        if let Some(every) = background_heartbeat {
            match spawn_heartbeat(Arc::downgrade(&runtime), id, every) {
                Ok(thread) => m.heartbeat = Some(thread),
                Err(e) => {
                    // Not left a member that nothing heartbeats. It joined
                    // under this lock's previous hold; leaving fails only
                    // if it is already gone, which is what is wanted.
                    let _ = m.leave();
                    return Err(e);
                }
            }
        }
        m.sync()?;
        Ok(m)
    }

    /// The tenures ([`super::coordinator::Owner::epoch`]) this member's
    /// reading state belongs to.
    pub(super) fn tenures(&self) -> &BTreeSet<u64> {
        &self.held
    }

    /// Member id (unique across runs of the log).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The generation of the assignment this member last saw.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The ready partitions this member reads (with their split children),
    /// as of its last poll.
    pub fn assignment(&self) -> Assignment {
        Assignment {
            generation: self.generation,
            partitions: self.owned.iter().copied().collect(),
        }
    }

    /// Ranges passed over because retention had removed them first,
    /// including the unread rest of a partition this member was reading
    /// when retention emptied it and removed it from the topology (up to
    /// the seal its children record, `u64::MAX` when none does any more).
    /// Also what the group had not read of a partition retention removed
    /// under its committed position (with the removed partitions below
    /// it), when this member takes over what continues it: told again to
    /// the next owner, also after a reopen, until a member told of it
    /// commits.
    pub fn retained(&self) -> &[RetainedRange] {
        &self.cursor.retained
    }

    /// Tells the coordinator this member is alive (independently of
    /// processing). [`Error::Fenced`] if it was declared dead.
    pub fn heartbeat(&self) -> Result<()> {
        self.runtime.heartbeat(self.id)
    }

    /// Takes the current assignment: drops partitions moved away, starts
    /// new ones at the committed positions. Called under no lock.
    fn sync(&mut self) -> Result<()> {
        let runtime = self.runtime.clone();
        let now = runtime.now();
        let mut co = runtime.lock();
        self.walks_at_poll
            .get_or_insert(co.full_walks + self.full_walks);
        let polled = co.polled(&runtime.topic, now, self.id);
        runtime.carry_out(&mut co, now);
        polled?;
        // Report what was handed out since the last sync, once the
        // assignment has dropped the state of tenures that ended (else a
        // revocation would wait on records this member no longer holds).
        // Nothing a member reads of the coordinator changed: its
        // assignment stands, and the walk over it is not made.
        if self.assignment_moved(&co) {
            self.take_assignment(&co);
        }
        self.report(&mut co);
        if co.settle_revoked(self.id, now) {
            self.take_assignment(&co);
        }
        self.take_losses(&mut co);
        co.end_pauses(&self.owned, now);
        Ok(())
    }

    /// Brings the member's reading state to the coordinator's assignment
    /// (under the group lock): drops partitions moved away or read and
    /// committed, pauses those being revoked, starts new ones at their
    /// committed positions.
    ///
    /// A new lineage makes every partition being read a candidate again
    /// (a seal or a tail split may have moved any), as does a partition
    /// whose revocation ended; one started here is a candidate from the
    /// start.
    pub(super) fn take_assignment(&mut self, co: &Coordinator) {
        self.full_walks += 1;
        self.seen_ownership = co.ownership;
        self.retake = false;
        // Positions may have gone or come anywhere.
        self.unreported.mark_all();
        let new_lineage = !Arc::ptr_eq(&self.cursor.lineage, &co.lineage);
        self.cursor.lineage = co.lineage.clone();
        let lineage = self.cursor.lineage.clone();
        self.follow_lineage(&lineage);
        let was_paused = std::mem::take(&mut self.paused);
        self.take_ownership(co, &lineage);
        if new_lineage {
            self.cursor.look_at_all();
        } else {
            for p in was_paused.difference(&self.paused) {
                if self.cursor.positions.contains_key(p) {
                    self.cursor.candidates.insert(*p);
                }
            }
        }
    }

    /// Brings the reading state to a new `lineage`: positions past a tail
    /// split's logical end continue in the children, and what retention
    /// removed of the partitions being read is reported.
    fn follow_lineage(&mut self, lineage: &Lineage) {
        // A tail split moved what this member read past its parent's
        // logical end: read it from the children, at translated positions.
        self.cursor.pending.retain(|r| {
            lineage
                .tails
                .get(&r.partition)
                .is_none_or(|t| r.offset < t.index.from)
        });
        // The parents it read past their logical ends are read to the end
        // this member needs: drained (else the parent, still this member's
        // until a commit says otherwise, is read again from the committed
        // position, and a commit naming the children is refused).
        let left = translate_tails(
            lineage,
            &mut self.cursor.positions,
            &mut self.cursor.last_records,
        );
        self.cursor.drained.extend(left);
        // Partitions this member was reading that retention emptied and
        // removed: what it had not handed out is gone with their files, and
        // is reported (up to the seal their children record) as a reader
        // reports it, not dropped silently with the position below.
        let gone: Vec<(u32, u64)> = self
            .cursor
            .positions
            .iter()
            .filter(|(p, _)| !lineage.contains(**p))
            .map(|(&p, &o)| (p, o))
            .collect();
        self.own_gone.extend(
            self.cursor
                .drained
                .iter()
                .filter(|p| !lineage.contains(**p))
                .copied(),
        );
        for (p, pos) in gone {
            self.own_gone.insert(p);
            let start = self
                .cursor
                .pending
                .iter()
                .filter(|r| r.partition == p)
                .map(|r| r.offset)
                .min()
                .unwrap_or(pos);
            let end = lineage
                .removed_seals
                .get(&p)
                .copied()
                .unwrap_or(REMOVED_END);
            if start < end {
                self.tell(RetainedRange {
                    partition: p,
                    start,
                    end,
                });
            }
        }
    }

    /// Keeps the reading state of the partitions this member owns in the
    /// tenure it belongs to, pauses those being revoked and starts new
    /// ones at their committed positions.
    fn take_ownership(&mut self, co: &Coordinator, lineage: &Lineage) {
        // Ours, in a tenure this member's reading state belongs to (the
        // same one, or its parent's for a split child it kept). A
        // partition taken away and given back since is read again from
        // the committed position: someone else may have read and
        // committed past what this member remembers.
        let held = std::mem::take(&mut self.held);
        let mut mine: BTreeMap<u32, bool> = BTreeMap::new();
        let mut fresh: Vec<u32> = Vec::new();
        let mut tenure = BTreeMap::new();
        for (&p, o) in &co.owners {
            if o.member != Some(self.id) {
                continue;
            }
            mine.insert(p, o.revoking.is_some());
            tenure.insert(p, o.epoch);
            if !held.contains(&o.epoch) {
                fresh.push(p);
            }
        }
        self.tenure = tenure;
        self.held = self.tenure.values().copied().collect();
        let keep: BTreeSet<u32> = mine
            .keys()
            .filter(|p| !fresh.contains(p))
            .flat_map(|&p| closure(lineage, p))
            .collect();
        self.paused = mine
            .iter()
            .filter(|(_, &revoking)| revoking)
            .flat_map(|(&p, _)| closure(lineage, p))
            .collect();
        self.cursor.positions.retain(|p, _| keep.contains(p));
        self.cursor.drained.retain(|p| keep.contains(p));
        self.cursor.last_records.retain(|p, _| keep.contains(p));
        let paused = &self.paused;
        self.cursor
            .pending
            .retain(|r| keep.contains(&r.partition) && !paused.contains(&r.partition));
        let owned: BTreeSet<u32> = mine
            .iter()
            .filter(|(_, &revoking)| !revoking)
            .map(|(&p, _)| p)
            .collect();
        for &p in &owned {
            if self.cursor.positions.contains_key(&p) || self.cursor.drained.contains(&p) {
                continue;
            }
            // New to this member: from the committed position.
            let pos = co.committed_position(p);
            self.cursor.open(p, pos);
            if let Some(&f) = co.committed.last_records.get(&p) {
                self.cursor.last_records.insert(p, f);
            }
        }
        self.owned = owned;
        self.generation = co.generation;
    }

    /// Adds a range to `retained` unless this member was told exactly that
    /// range already (the group's loss and the member's own reading can
    /// both come to the same removed partition).
    fn tell(&mut self, r: RetainedRange) {
        if !self.cursor.retained.contains(&r) {
            self.cursor.retained.push(r);
        }
    }

    /// Takes the group's losses this member is to be told of into
    /// `retained` (under the group lock): each range once per member
    /// (a later tenure of the heir with the same member tells nothing
    /// new), none this member reported from its own reading state.
    fn take_losses(&mut self, co: &mut Coordinator) {
        if co.losses.is_empty() {
            // Only those the group may still report matter: none.
            self.own_gone.clear();
            return;
        }
        let held = self.tenures();
        let mine: Vec<(u32, (u64, u64))> = co
            .losses
            .iter()
            .filter_map(|(&p, l)| Some((p, co.loss_holder(l)?)))
            .filter(|&(_, (m, e))| m == self.id && (e == 0 || held.contains(&e)))
            .collect();
        for (p, holder) in mine {
            let loss = co.losses.get_mut(&p).expect("listed");
            if loss.handed != Some(holder) {
                // A new tenure of this same member (what continues the
                // loss merged or moved back to it): its `retained` holds
                // the ranges already, they are not told again.
                if loss.handed.map(|(m, _)| m) != Some(holder.0) {
                    loss.handed_ranges.clear();
                }
                loss.handed = Some(holder);
            }
            for r in &loss.ranges {
                if loss.handed_ranges.contains(r) {
                    continue;
                }
                loss.handed_ranges.push(*r);
                if !self.own_gone.contains(&r.partition) {
                    self.tell(*r);
                }
            }
        }
        // Only those the group may still report matter.
        let named: BTreeSet<u32> = co
            .losses
            .values()
            .flat_map(|l| l.ranges.iter().map(|r| r.partition))
            .collect();
        self.own_gone.retain(|p| named.contains(p));
    }

    /// The group's losses this member was told of in full, in tenures it
    /// still holds, and those with nothing to tell: a commit of the
    /// member drops their positions. A range of a partition this member
    /// was reading when retention removed it counts as told: the member
    /// handed out what it read there since the committed position and
    /// reported the rest from its own position.
    pub(super) fn told_losses(&self, co: &Coordinator) -> Vec<u32> {
        let held = self.tenures();
        co.losses
            .iter()
            .filter(|(_, l)| {
                let handed_here = l
                    .handed
                    .is_some_and(|(m, e)| m == self.id && (e == 0 || held.contains(&e)));
                l.ranges.iter().all(|r| {
                    self.own_gone.contains(&r.partition)
                        || (handed_here && l.handed_ranges.contains(r))
                })
            })
            .map(|(&p, _)| p)
            .collect()
    }

    /// Up to `max_records` records of this member's partitions that are
    /// available now. Per key, records come in append order, through
    /// splits and merges. [`Error::Fenced`] if the member was declared dead.
    pub fn poll(&mut self, max_records: usize) -> Result<Vec<OwnedRecord>> {
        self.polls += 1;
        self.cursor.examined.clear();
        self.walks_at_poll = None;
        self.poll_once(max_records)
    }

    /// The partitions the last poll looked at, one entry per drained
    /// check or read: none for an idle poll, whatever the number owned.
    /// Not part of the API: it proves in tests that a poll's reads do not
    /// grow with the partitions owned.
    #[cfg(feature = "testing")]
    pub fn partitions_examined(&self) -> &[u32] {
        &self.cursor.examined
    }

    /// Walks over every partition made during the last poll, by the group's
    /// coordinator (its timeout scan, the unowned check, a balancing, a
    /// ready-set rebuild) or by this member (taking its assignment, a full
    /// report of what it handed out): none for an idle
    /// poll before a timeout or balancing is due. Not part of the API: it
    /// proves in tests that an idle poll's cost does not grow with the
    /// partitions owned.
    #[cfg(feature = "testing")]
    pub fn full_walks_in_last_poll(&self) -> u64 {
        self.last_poll_walks
    }

    /// One round of [`Member::poll`], counted in [`Member::polls`] by its
    /// caller: the calls the application makes count, not the rounds
    /// [`Member::poll_wait`] makes while it waits (a loss reported by one
    /// of them is not yet seen by the application).
    fn poll_once(&mut self, max_records: usize) -> Result<Vec<OwnedRecord>> {
        let mut out = Vec::new();
        // A few rounds when a round only passed empty sealed partitions:
        // committing those lets merge children become ready.
        for _ in 0..8 {
            self.sync()?;
            self.take(&mut out, max_records)?;
            self.advance();
            if !out.is_empty() || !self.settle_empty_drains()? {
                break;
            }
        }
        self.advance();
        let runtime = self.runtime.clone();
        let mut co = runtime.lock();
        // Records are handed out only from partitions still this member's
        // as the coordinator learns of them: one released meanwhile (its
        // new owner starts at the committed position) gives nothing here,
        // so no record reaches two live members.
        co.member(self.id)?;
        if !self.all_readable(&co, &out) {
            let mine: BTreeSet<u32> = co
                .readable_by(self.id, self.tenures())
                .into_keys()
                .collect();
            out.retain(|r| mine.contains(&r.partition));
            self.cursor.positions.retain(|p, _| mine.contains(p));
            self.cursor.last_records.retain(|p, _| mine.contains(p));
            self.cursor.drained.retain(|p| mine.contains(p));
            self.cursor.pending.retain(|r| mine.contains(&r.partition));
            self.unreported.mark_all();
            self.retake = true;
        }
        co.count_handed_out(self.id, out.len() as u64, runtime.now());
        self.report(&mut co);
        co.settle_revoked(self.id, runtime.now());
        if let Some(from) = self.walks_at_poll {
            self.last_poll_walks = (co.full_walks + self.full_walks).saturating_sub(from);
        }
        Ok(out)
    }

    /// Hands out pending and newly read records into `out`, up to `max`.
    fn take(&mut self, out: &mut Vec<OwnedRecord>, max: usize) -> Result<()> {
        while out.len() < max {
            if self.cursor.pending.is_empty() {
                match self.fill() {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(e) if out.is_empty() => return Err(e),
                    Err(_) => break,
                }
            }
            let room = max - out.len();
            let from = out.len();
            self.cursor.hand_out(out, room);
            for r in &out[from..] {
                self.unreported.mark(r.partition);
            }
        }
        Ok(())
    }

    /// Commits as read the partitions this member read to their seal that
    /// hold nothing past the group's committed position (empty sealed
    /// partitions, or all committed already): no record is at stake, and
    /// without it a consumer that commits only after records would never
    /// let a merge child behind them become ready. Returns whether the
    /// group's positions moved.
    fn settle_empty_drains(&mut self) -> Result<bool> {
        let done: Vec<u32> = {
            let co = self.runtime.lock();
            let candidates: Vec<u32> = self
                .cursor
                .drained
                .iter()
                .copied()
                .filter(|&d| {
                    let seal = self.cursor.lineage.sealed_at(d).unwrap_or(u64::MAX);
                    let end = self
                        .runtime
                        .topic
                        .partition(d)
                        .map_or(seal, |p| p.end_offset().min(seal));
                    let committed = co.committed.positions.get(&d).copied().unwrap_or(0);
                    // Or nothing is left between the committed position and
                    // the end but what retention removed, and this member
                    // reported that in an earlier poll (its caller has seen
                    // `retained` since): committing it as read hands out
                    // nothing and keeps the loss reported at least once.
                    let skipped = self.skipped.get(&d).is_some_and(|&(from, to, poll)| {
                        from <= committed && to >= end && poll < self.polls
                    });
                    (committed >= end || skipped) && !co.committed.drained.contains(&d)
                })
                .collect();
            if candidates.is_empty() {
                // Nothing to settle: not worth the walk over every
                // committed partition's ancestors below.
                return Ok(false);
            }
            // Parents first: a split child only with (or after) its
            // parents committed as read.
            let read = co.committed.all_drained(&self.cursor.lineage);
            let mut done: Vec<u32> = Vec::new();
            loop {
                let before = done.len();
                for &d in &candidates {
                    if !done.contains(&d)
                        && self.cursor.lineage.parents(d).iter().all(|q| {
                            read.contains(q)
                                || done.contains(q)
                                || !self.cursor.lineage.contains(*q)
                        })
                    {
                        done.push(d);
                    }
                }
                if done.len() == before {
                    break done;
                }
            }
        };
        if done.is_empty() {
            return Ok(false);
        }
        let before = self.runtime.lock().stats.commits;
        self.commit_empty_drains(&done)?;
        Ok(self.runtime.lock().stats.commits > before)
    }

    /// Like [`Member::poll`], but waits up to `timeout` for records.
    pub fn poll_wait(&mut self, max_records: usize, timeout: Duration) -> Result<Vec<OwnedRecord>> {
        let deadline = crate::duration::deadline_after(timeout);
        let wake = self.cursor.signals.wake().clone();
        self.polls += 1;
        self.cursor.examined.clear();
        self.walks_at_poll = None;
        loop {
            let got = self.poll_once(max_records)?;
            let now = Instant::now();
            if !got.is_empty() || deadline.is_some_and(|d| now >= d) {
                return Ok(got);
            }
            // Wake at least every 50 ms to run the coordinator's timeouts.
            let tick = now + Duration::from_millis(50);
            let until = deadline.map_or(tick, |d| d.min(tick));
            wake.wait_until(Some(until), || self.can_move());
        }
    }

    /// Partitions being revoked are not read: records there are no reason
    /// to wake (the wait would spin until its timeout).
    fn can_move(&self) -> bool {
        self.cursor
            .can_move(&self.runtime.topic, None, &self.paused)
    }

    /// Moves partitions handed out to their seal into `drained` and opens
    /// their split children. Merge children wait for the group's commit.
    /// Looks only at the candidates (see [`LineageCursor`]): a partition
    /// reaches its seal by being read to it, or by being sealed, which
    /// brings a new lineage.
    fn advance(&mut self) -> bool {
        let mut changed = false;
        loop {
            let topic = self.runtime.topic.clone();
            let mut done = self.cursor.drained_candidates(&topic);
            done.retain(|&id| !self.cursor.pending.iter().any(|r| r.partition == id));
            if done.is_empty() {
                return changed;
            }
            changed = true;
            for id in done {
                self.cursor.positions.remove(&id);
                self.cursor.candidates.remove(&id);
                self.cursor.last_records.remove(&id);
                self.cursor.drained.insert(id);
                self.unreported.mark(id);
                let lineage = self.cursor.lineage.clone();
                for &c in lineage.children(id) {
                    if lineage.parents(c).len() == 1 && !self.cursor.positions.contains_key(&c) {
                        self.cursor.open(c, 0);
                        self.unreported.mark(c);
                    }
                }
            }
        }
    }

    /// Reads the next partition (in turn) with records into `pending`.
    /// A candidate with nothing to read stops being one until it is
    /// signalled again; a paused one stays one for when its pause ends.
    fn fill(&mut self) -> Result<bool> {
        // Before the reads: a notification taken here is of state they see.
        self.cursor.take_signals();
        let mut moved = self.advance();
        let ids = self.cursor.turn();
        for id in ids {
            if self.paused.contains(&id) {
                continue;
            }
            let pos = self.cursor.positions[&id];
            self.cursor.examined.push(id);
            let part = match self.runtime.topic.partition(id) {
                Ok(p) => p,
                Err(Error::UnknownPartition { .. }) => {
                    self.cursor.candidates.remove(&id);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let batch = match read_step(&part, pos, part.default_isolation())? {
                ReadStep::Nothing => {
                    self.cursor.candidates.remove(&id);
                    continue;
                }
                ReadStep::Skip { to, retained } => {
                    if let Some(r) = retained {
                        self.tell(r);
                    }
                    let from = match self.skipped.get(&id) {
                        Some(&(from, end, _)) if end == pos => from,
                        _ => pos,
                    };
                    self.skipped.insert(id, (from, to, self.polls));
                    self.cursor.positions.insert(id, to);
                    self.cursor.last_records.remove(&id);
                    self.unreported.mark(id);
                    moved = true;
                    continue;
                }
                ReadStep::Batch(b) => b,
            };
            self.cursor.next_rr = id.wrapping_add(1);
            if let Some(to) = take_batch(&mut self.cursor.pending, id, pos, &batch)? {
                self.cursor.positions.insert(id, to);
                self.unreported.mark(id);
            }
            return Ok(true);
        }
        Ok(moved)
    }

    /// Leaves the group: its partitions go to the others at once, from the
    /// committed positions (commit first, or what was handed out since the
    /// last commit is delivered again).
    pub fn leave(mut self) -> Result<()> {
        self.heartbeat.take();
        let runtime = self.runtime.clone();
        let now = runtime.now();
        let mut co = runtime.lock();
        co.member(self.id)?;
        self.report(&mut co);
        let left = co.leave(&runtime.topic, now, self.id);
        runtime.carry_out(&mut co, now);
        left
    }
}

/// Stops the heartbeat: without [`Member::leave`], the member is declared
/// dead once its session timeout passes.
impl Drop for Member {
    fn drop(&mut self) {
        self.heartbeat.take();
    }
}
