//! The timeout scan on a deadline, in simulated time: it fires at the
//! same tick as a scan on every tick would, and not before.

use std::fmt::Write as _;
use std::time::Duration;

use crate::group::coordinator::tests::{
    commit, coordinator, four_partitions, hand_out, member_options, owner, two_idle_partitions,
    World,
};
use crate::group::coordinator::Coordinator;
use crate::group::{MemberOptions, MemberState};

const SECOND: u64 = 1_000_000_000;

/// Everything the timeouts decide, as one comparable text.
pub(in crate::group) fn state(co: &Coordinator) -> String {
    let mut s = format!("generation {}\n", co.generation);
    for (id, m) in &co.members {
        let _ = writeln!(
            s,
            "member {id}: {:?} heartbeat {} progress {} slow since {}",
            m.state, m.last_heartbeat, m.last_progress, m.slow_since
        );
    }
    for (p, o) in &co.owners {
        let _ = writeln!(
            s,
            "partition {p}: {:?} gen {} epoch {} revoking {:?} unowned {:?} moved {:?} pause {:?}",
            o.member,
            o.generation,
            o.epoch,
            o.revoking.as_ref().map(|r| (r.since_nanos, r.to)),
            o.unowned_since,
            o.moved_nanos,
            o.pause_from
        );
    }
    let _ = writeln!(s, "{:?}\n{:?}", co.stats, co.committed.positions);
    s
}

/// A small deterministic generator (the seed is in every failure).
pub(in crate::group) struct Rng(pub(in crate::group) u64);

impl Rng {
    pub(in crate::group) fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    pub(in crate::group) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn short_options(rng: &mut Rng) -> MemberOptions {
    MemberOptions {
        session_timeout: Duration::from_nanos(50 + rng.below(100)),
        processing_timeout: Duration::from_nanos(80 + rng.below(200)),
        ..member_options()
    }
}

/// A deadline of the state now, to land on it, just before or just after.
fn some_deadline(co: &Coordinator, rng: &mut Rng) -> Option<u64> {
    let mut all = Vec::new();
    for m in co.members.values() {
        let session = m.opts.session_timeout.as_nanos() as u64;
        let processing = m.opts.processing_timeout.as_nanos() as u64;
        all.push(m.last_heartbeat + session);
        all.push(m.last_progress + processing);
        all.push(m.slow_since.max(m.last_progress) + processing);
    }
    for o in co.owners.values() {
        if let (Some(r), Some(m)) = (&o.revoking, o.member.and_then(|m| co.members.get(&m))) {
            all.push(r.since_nanos + m.opts.processing_timeout.as_nanos() as u64);
        }
    }
    if all.is_empty() {
        return None;
    }
    let at = all[rng.below(all.len() as u64) as usize];
    Some(at + rng.below(3)).map(|t| t.saturating_sub(1))
}

/// One random event, applied to both coordinators; their results agree.
fn step(rng: &mut Rng, world: &World, now: &mut u64, pair: [&mut Coordinator; 2]) {
    let [new, old] = pair;
    match rng.below(10) {
        0 | 1 => {
            *now = match some_deadline(old, rng) {
                Some(t) if t > *now => t,
                _ => *now + 1 + rng.below(40),
            }
        }
        2 => *now += 1 + rng.below(120),
        3 if old.members.len() < 4 => {
            let opts = short_options(rng);
            let a = new.join(world, *now, &opts).map_err(|e| e.to_string());
            let b = old.join(world, *now, &opts).map_err(|e| e.to_string());
            assert_eq!(a, b, "join");
        }
        4 => {
            new.tick(world, *now);
            old.tick(world, *now);
        }
        kind => {
            // An event of a member, dead ones included (it is fenced).
            let ids: Vec<u64> = old.members.keys().copied().collect();
            let Some(&id) = ids.get(rng.below(ids.len() as u64 + 1) as usize) else {
                return;
            };
            let (a, b) = match kind {
                5 | 6 => (
                    new.heartbeat(world, *now, id).map_err(|e| e.to_string()),
                    old.heartbeat(world, *now, id).map_err(|e| e.to_string()),
                ),
                7 => (
                    new.polled(world, *now, id).map_err(|e| e.to_string()),
                    old.polled(world, *now, id).map_err(|e| e.to_string()),
                ),
                8 => {
                    let handed: Vec<(u32, u64)> = old
                        .owned_by(id)
                        .into_iter()
                        .map(|p| (p, old.committed_position(p) + rng.below(5)))
                        .collect();
                    hand_out(new, id, &handed, &[]);
                    hand_out(old, id, &handed, &[]);
                    (Ok(()), Ok(()))
                }
                _ => {
                    let handed: Vec<(u32, u64)> = old.members[&id]
                        .delivered
                        .iter()
                        .map(|(&p, &(o, _))| (p, o))
                        .collect();
                    (
                        commit(new, world, id, &handed, &[], *now).map_err(|e| e.to_string()),
                        commit(old, world, id, &handed, &[], *now).map_err(|e| e.to_string()),
                    )
                }
            };
            assert_eq!(a, b, "event {kind} of member {id}");
        }
    }
}

#[test]
fn the_deadline_driven_timeouts_decide_as_a_scan_at_every_tick_would() {
    let world = four_partitions();
    for seed in 1..=12u64 {
        let mut rng = Rng(seed);
        let mut new = coordinator(&world);
        let mut old = coordinator(&world);
        old.scan_every_tick = true;
        let mut now = 0;
        for i in 0..3_000 {
            step(&mut rng, &world, &mut now, [&mut new, &mut old]);
            assert_eq!(
                state(&new),
                state(&old),
                "seed {seed}, step {i} at {now} ns"
            );
        }
        assert!(
            new.timeout_scans < old.timeout_scans,
            "seed {seed}: {} scans on a deadline, {} on every tick",
            new.timeout_scans,
            old.timeout_scans
        );
        assert!(
            old.stats.dead_detected + old.stats.slow_detected > 0,
            "seed {seed} tried no timeout"
        );
    }
}

#[test]
fn a_member_is_dead_at_the_first_nanosecond_past_its_session_and_not_scanned_for_before() {
    let world = four_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    let b = co.join(&world, 0, &member_options()).unwrap();
    let scans = co.timeout_scans;
    // b polls every second; a never heartbeats again. Session: 10 s.
    for t in 1..=10 {
        co.polled(&world, t * SECOND, b).unwrap();
        assert!(co.members.contains_key(&a));
    }
    assert_eq!(co.timeout_scans, scans, "a scan before any deadline");
    co.polled(&world, 10 * SECOND + 1, b).unwrap();
    assert!(!co.members.contains_key(&a), "alive past its session");
    assert_eq!(co.stats.dead_detected, 1);
    assert_eq!(co.timeout_scans, scans + 1);
}

#[test]
fn a_heartbeat_moves_the_death_later_and_the_scan_at_the_old_deadline_finds_nothing() {
    let world = two_idle_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    let b = co.join(&world, 0, &member_options()).unwrap();
    co.heartbeat(&world, 5 * SECOND, a).unwrap();
    co.polled(&world, 5 * SECOND, b).unwrap();
    let scans = co.timeout_scans;
    // The deadline kept is the one before the heartbeats: the scan there
    // finds both alive and sets the next one at 15 s.
    co.tick(&world, 10 * SECOND + 1);
    assert_eq!(co.timeout_scans, scans + 1);
    assert_eq!(co.members.len(), 2);
    co.polled(&world, 12 * SECOND, b).unwrap();
    co.tick(&world, 15 * SECOND);
    assert_eq!(co.timeout_scans, scans + 1, "scanned before 15 s");
    assert!(co.members.contains_key(&a));
    co.tick(&world, 15 * SECOND + 1);
    assert!(!co.members.contains_key(&a), "alive past 15 s");
    assert_eq!(co.timeout_scans, scans + 2);
}

#[test]
fn a_member_without_progress_is_slow_at_the_first_nanosecond_past_its_processing_timeout() {
    let world = four_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    let b = co.join(&world, 0, &member_options()).unwrap();
    // a heartbeats and never polls; processing timeout: 30 s.
    for t in 1..=30 {
        co.heartbeat(&world, t * SECOND, a).unwrap();
        co.polled(&world, t * SECOND, b).unwrap();
    }
    assert_eq!(co.members[&a].state, MemberState::Active);
    co.heartbeat(&world, 30 * SECOND + 1, a).unwrap();
    assert_eq!(co.members[&a].state, MemberState::Slow);
    assert_eq!(co.stats.slow_detected, 1);
    assert_eq!(co.owned_by(a).len(), 1, "half of it moved");
    // Stuck for another timeout from then (30 s + 1 ns): everything it
    // owns moves, at the first nanosecond past it.
    for t in 31..=60 {
        co.heartbeat(&world, t * SECOND, a).unwrap();
        co.polled(&world, t * SECOND, b).unwrap();
    }
    co.heartbeat(&world, 60 * SECOND + 1, a).unwrap();
    assert_eq!(co.owned_by(a).len(), 1, "moved before the second timeout");
    co.heartbeat(&world, 60 * SECOND + 2, a).unwrap();
    assert!(
        co.owned_by(a).is_empty(),
        "a still owns {:?}",
        co.owned_by(a)
    );
    assert_eq!(co.members.len(), 2, "slow is not dead");
}

#[test]
fn a_revocation_is_overdue_at_the_first_nanosecond_past_its_owners_processing_timeout() {
    let world = two_idle_partitions();
    let mut co = coordinator(&world);
    let a = co.join(&world, 0, &member_options()).unwrap();
    hand_out(&mut co, a, &[(0, 10), (1, 10)], &[]);
    let b = co.join(&world, SECOND, &member_options()).unwrap();
    let p = *co
        .owners
        .iter()
        .find(|(_, o)| o.revoking.is_some())
        .map(|(p, _)| p)
        .unwrap();
    // a polls (it makes progress) but never commits what it handed out.
    for t in 2..=31 {
        co.polled(&world, t * SECOND, a).unwrap();
        co.polled(&world, t * SECOND, b).unwrap();
        assert_eq!(owner(&co, p), Some(a), "released at {t} s");
    }
    co.polled(&world, 31 * SECOND + 1, b).unwrap();
    assert_eq!(owner(&co, p), Some(b), "not released past the timeout");
    assert_eq!(co.stats.redelivered, 10);
}
