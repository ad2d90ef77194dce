//! The two liveness clocks and overdue revocations, run on a deadline.
//!
//! A member is dead once no heartbeat came for its session timeout, slow
//! once no poll or commit came for its processing timeout, and a
//! revocation is overdue once its owner did not settle it within that
//! owner's processing timeout. The scan that finds them walks every member
//! and revocation, so a tick runs it only from the earliest moment one of
//! them can pass ([`Coordinator::next_timeout`]): a lower bound kept at the
//! last scan and lowered by every event that sets an earlier deadline (a
//! join, a revocation). Heartbeats, polls and commits only push deadlines
//! later, so they leave the bound as it is; a scan at a bound that has
//! become too early finds nothing and sets the true one. Every scan makes
//! the same decisions as a scan on every tick would: one that runs is that
//! scan, and at a tick before the bound that scan would have found nothing.

use crate::duration::duration_nanos;

use super::coordinator::{Coordinator, Revoke, TopicView};
use super::MemberState;

/// The first instant past `limit` nanoseconds after `from`: the timeouts
/// are strict (`now - from > limit`). Saturates: a timeout too long for
/// the clock never passes, and its deadline is the clock's end.
pub(super) fn deadline_after(from: u64, limit: u64) -> u64 {
    from.saturating_add(limit).saturating_add(1)
}

impl Coordinator {
    /// Runs the timeout scan if its deadline has come: dead members,
    /// slow members, overdue revocations. Returns whether a member died
    /// and whether ownership changed.
    pub(super) fn run_timeouts(&mut self, view: &dyn TopicView, now: u64) -> (bool, bool) {
        #[cfg(test)]
        let due = self.scan_every_tick || now >= self.next_timeout;
        #[cfg(not(test))]
        let due = now >= self.next_timeout;
        if !due {
            return (false, false);
        }
        self.full_walks += 1;
        self.timeout_scans += 1;
        let dead = self.fence_dead(now);
        let mut changed = dead;
        changed |= self.relieve_slow(view, now);
        changed |= self.release_overdue(now);
        self.next_timeout = self.earliest_timeout();
        (dead, changed)
    }

    /// Lowers the timeout deadline to `at` (an event set a deadline then).
    pub(super) fn timeout_at(&mut self, at: u64) {
        self.next_timeout = self.next_timeout.min(at);
    }

    /// The earliest instant any member's session or processing timeout,
    /// or any revocation's, can pass as the state is now. Forgets the
    /// partitions no longer revoking.
    pub(super) fn earliest_timeout(&mut self) -> u64 {
        let mut at = u64::MAX;
        for m in self.members.values() {
            let session = duration_nanos(m.opts.session_timeout);
            let processing = duration_nanos(m.opts.processing_timeout);
            at = at.min(deadline_after(m.last_heartbeat, session));
            // A slow member moves again after another processing timeout
            // counted from when it was last relieved, and only while it
            // still made no progress.
            let stuck_from = match m.state {
                MemberState::Active => m.last_progress,
                MemberState::Slow => m.last_progress.max(m.slow_since),
            };
            at = at.min(deadline_after(stuck_from, processing));
        }
        let owners = &self.owners;
        self.revoking_hint
            .retain(|p| owners.get(p).is_some_and(|o| o.revoking.is_some()));
        for p in &self.revoking_hint {
            let Some(o) = self.owners.get(p) else {
                continue;
            };
            let (Some(r), Some(m)) = (&o.revoking, o.member.and_then(|m| self.members.get(&m)))
            else {
                continue;
            };
            let processing = duration_nanos(m.opts.processing_timeout);
            at = at.min(deadline_after(r.since_nanos, processing));
        }
        at
    }

    /// Removes the members with no heartbeat for their session timeout
    /// (their partitions go back to the balancer). Returns whether any.
    fn fence_dead(&mut self, now: u64) -> bool {
        let dead: Vec<u64> = self
            .members
            .iter()
            .filter(|(_, m)| {
                now.saturating_sub(m.last_heartbeat) > duration_nanos(m.opts.session_timeout)
            })
            .map(|(&id, _)| id)
            .collect();
        for &id in &dead {
            self.stats.dead_detected += 1;
            self.remove_member(id, now);
        }
        !dead.is_empty()
    }

    /// Members that heartbeat but made no progress for their processing
    /// timeout: declared slow and relieved of half their partitions (the
    /// most behind first), then of all of them after another timeout.
    /// Returns whether ownership changed.
    fn relieve_slow(&mut self, view: &dyn TopicView, now: u64) -> bool {
        let mut changed = false;
        let ids: Vec<u64> = self.members.keys().copied().collect();
        for id in ids {
            let m = &self.members[&id];
            let stuck_for = now.saturating_sub(m.last_progress);
            let limit = duration_nanos(m.opts.processing_timeout);
            if stuck_for <= limit {
                continue;
            }
            match m.state {
                MemberState::Active => {
                    self.stats.slow_detected += 1;
                    crate::metrics::member_slow(&self.name);
                    let m = self
                        .members
                        .get_mut(&id)
                        .expect("`id` was taken from `members` above, nothing removed it");
                    m.state = MemberState::Slow;
                    m.slow_since = now;
                    let mut owned = self.owned_by(id);
                    owned.sort_by_key(|&p| std::cmp::Reverse(self.lag(view, p)));
                    let n = owned.len() / 2;
                    for p in owned.into_iter().take(n) {
                        changed |= self.revoke(p, None, now);
                    }
                }
                MemberState::Slow => {
                    // Stuck for another processing timeout: everything it
                    // owns moves now (what it handed out and did not
                    // commit is delivered again).
                    if now.saturating_sub(m.slow_since) > limit {
                        changed |= self.take_all_from(id, now);
                        // What it gets back (nobody else can take it) is
                        // not moved again on the next tick: only after
                        // another processing timeout without progress.
                        if let Some(m) = self.members.get_mut(&id) {
                            m.slow_since = now;
                        }
                    }
                }
            }
        }
        changed
    }

    /// Releases every partition member `id` owns at once. Returns whether
    /// it owned any.
    fn take_all_from(&mut self, id: u64, now: u64) -> bool {
        let all: Vec<u32> = self
            .owners
            .iter()
            .filter(|(_, o)| o.member == Some(id))
            .map(|(&p, _)| p)
            .collect();
        for &p in &all {
            if let Some(o) = self.owners.get_mut(&p) {
                o.revoking.get_or_insert(Revoke {
                    since_nanos: now,
                    to: None,
                });
            }
            self.release(p, now);
        }
        !all.is_empty()
    }

    /// Releases the revocations the owner did not settle within its
    /// processing timeout. Returns whether any. Looks only at the
    /// partitions that may be revoking.
    fn release_overdue(&mut self, now: u64) -> bool {
        let overdue: Vec<u32> = self
            .revoking_hint
            .iter()
            .filter_map(|&p| {
                let o = self.owners.get(&p)?;
                let r = o.revoking.as_ref()?;
                let m = self.members.get(&o.member?)?;
                (now.saturating_sub(r.since_nanos) > duration_nanos(m.opts.processing_timeout))
                    .then_some(p)
            })
            .collect();
        for &p in &overdue {
            self.release(p, now);
        }
        !overdue.is_empty()
    }
}

#[cfg(test)]
pub(super) mod tests;
