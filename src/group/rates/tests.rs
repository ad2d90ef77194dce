//! The incremental rate fold in simulated time: a coordinator that folds
//! only the partitions the topic signalled, against one that folds every
//! ready partition at every fold and looks every lag up, over random
//! appends, clock jumps around the fold interval, joins, polls, commits
//! and a split whose children become ready. Equal decisions at every step
//! and equal rates within rounding.

use std::fmt::Write as _;

use crate::group::coordinator::tests::{coordinator, hand_out, member_options, World};
use crate::group::coordinator::{tests::commit, Coordinator};
use crate::group::timeouts::tests::{state, Rng};
use crate::wake::Signals;

use super::RATE_FOLD_NANOS;

/// Four active partitions and one split at 100 into two children (pinned
/// to its owner until it commits the parent as read).
fn world() -> World {
    World::new(&[
        (0, &[], None, 100),
        (1, &[], None, 100),
        (2, &[], None, 0),
        (3, &[], Some(100), 100),
        (4, &[3], None, 10),
        (5, &[3], None, 0),
        (6, &[], None, 5),
    ])
}

const ACTIVE: [u32; 6] = [0, 1, 2, 4, 5, 6];

/// What the balancer read of the lags, as one comparable text.
fn lags(co: &Coordinator) -> String {
    let mut s = String::new();
    let mut rates: Vec<_> = co.rates.iter().collect();
    rates.sort_by_key(|(p, _)| **p);
    for (p, r) in rates {
        let _ = writeln!(s, "partition {p}: lag {} rounds {}", r.lag, r.lag_rounds);
    }
    for (id, m) in &co.members {
        let _ = writeln!(s, "member {id}: last lag {}", m.last_lag);
    }
    s
}

fn assert_rates_agree(new: &Coordinator, old: &Coordinator, at: &str) {
    let mut keys: Vec<u32> = new.rates.keys().copied().collect();
    let mut old_keys: Vec<u32> = old.rates.keys().copied().collect();
    keys.sort_unstable();
    old_keys.sort_unstable();
    assert_eq!(keys, old_keys, "{at}: partitions with a rate");
    for p in keys {
        let (a, b) = (new.rate(p), old.rate(p));
        let tolerance = 1e-9 * a.abs().max(b.abs()) + 1e-12;
        assert!(
            (a - b).abs() <= tolerance,
            "{at}: partition {p}: rate {a} folded lazily, {b} folded in full"
        );
    }
}

/// One random event, applied to both coordinators.
fn step(
    rng: &mut Rng,
    world: &mut World,
    now: &mut u64,
    new: &mut Coordinator,
    old: &mut Coordinator,
) {
    match rng.below(11) {
        0 | 1 => {
            // Around the fold interval, and across several.
            *now += match rng.below(4) {
                0 => RATE_FOLD_NANOS - 1,
                1 => RATE_FOLD_NANOS,
                2 => 1 + rng.below(RATE_FOLD_NANOS / 3),
                _ => 1 + rng.below(4 * RATE_FOLD_NANOS),
            }
        }
        2 | 3 => {
            let x = ACTIVE[rng.below(ACTIVE.len() as u64) as usize];
            *world.ends.entry(x).or_default() += 1 + rng.below(50);
            // What the shell hands over from the topic's signals.
            new.note_moved(Signals::Some(vec![x]));
        }
        4 if old.members.len() < 3 => {
            let a = new
                .join(world, *now, &member_options())
                .map_err(|e| e.to_string());
            let b = old
                .join(world, *now, &member_options())
                .map_err(|e| e.to_string());
            assert_eq!(a, b, "join");
        }
        5 => {
            new.tick(world, *now);
            old.tick(world, *now);
        }
        kind => {
            let ids: Vec<u64> = old.members.keys().copied().collect();
            let Some(&id) = ids.get(rng.below(ids.len() as u64) as usize) else {
                return;
            };
            let (a, b) = match kind {
                6 => (
                    new.heartbeat(world, *now, id).map_err(|e| e.to_string()),
                    old.heartbeat(world, *now, id).map_err(|e| e.to_string()),
                ),
                7 => (
                    new.polled(world, *now, id).map_err(|e| e.to_string()),
                    old.polled(world, *now, id).map_err(|e| e.to_string()),
                ),
                8 => {
                    // Up to the end; a sealed one read to its seal drains.
                    let mut handed = Vec::new();
                    let mut drained = Vec::new();
                    for p in old.owned_by(id) {
                        let end = world.ends.get(&p).copied().unwrap_or(0);
                        let to = (old.committed_position(p) + rng.below(60)).min(end);
                        match world.lineage.sealed_at(p) {
                            Some(seal) if to >= seal => drained.push(p),
                            _ => handed.push((p, to)),
                        }
                    }
                    hand_out(new, id, &handed, &drained);
                    hand_out(old, id, &handed, &drained);
                    (Ok(()), Ok(()))
                }
                _ => {
                    let m = &old.members[&id];
                    let handed: Vec<(u32, u64)> =
                        m.delivered.iter().map(|(&p, &(o, _))| (p, o)).collect();
                    let drained: Vec<u32> = m.delivered_drained.iter().copied().collect();
                    (
                        commit(new, world, id, &handed, &drained, *now).map_err(|e| e.to_string()),
                        commit(old, world, id, &handed, &drained, *now).map_err(|e| e.to_string()),
                    )
                }
            };
            assert_eq!(a, b, "event {kind} of member {id}");
        }
    }
}

#[test]
fn rates_folded_for_signalled_partitions_only_equal_a_fold_of_every_partition() {
    let mut children_ready = 0;
    for seed in 1..=12u64 {
        let mut rng = Rng(seed);
        let mut world = world();
        let mut new = coordinator(&world);
        let mut old = coordinator(&world);
        old.fold_every_partition = true;
        // The lag trends a split for lag reads are compared too.
        new.options.split_lagging = true;
        old.options.split_lagging = true;
        let mut now = 0;
        let mut moving = 0;
        for i in 0..3_000 {
            step(&mut rng, &mut world, &mut now, &mut new, &mut old);
            let at = format!("seed {seed}, step {i} at {now} ns");
            assert_eq!(state(&new), state(&old), "{at}");
            assert_eq!(lags(&new), lags(&old), "{at}");
            assert_eq!(new.lag_split, old.lag_split, "{at}: split for lag");
            assert_rates_agree(&new, &old, &at);
            moving += new.rates.keys().filter(|&&p| new.rate(p) > 1.0).count();
        }
        assert!(moving > 0, "seed {seed}: no partition ever had a rate");
        children_ready += usize::from(new.owners.contains_key(&4));
        assert!(
            new.full_walks < old.full_walks,
            "seed {seed}: {} walks folding what moved, {} folding all",
            new.full_walks,
            old.full_walks
        );
    }
    assert!(
        children_ready > 0,
        "no seed made the split's children ready"
    );
}
