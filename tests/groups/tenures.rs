//! Consumer-group edge cases, second round: tenures (partial commits across
//! a hand-over and back, a partition released and given back within one
//! poll), static rejoins while a partition is revoking, split-then-merge
//! chains while members die, and a seeded simulation that also commits
//! partial positions, rejoins statically and checks that no committed
//! record is delivered again.

use crate::common;

use common::crash::SplitMix64;
use common::groups::*;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fissionlog::{
    Error, GroupOptions, Log, LogOptions, ManualClock, Member, MemberOptions, NewRecord,
    OwnedRecord, SplitPlan, Topic, TopicConfig,
};

/// How many times each sequence number was delivered beyond the first.
fn extra_deliveries(all: &[&[OwnedRecord]]) -> (BTreeSet<u64>, u64) {
    let mut n = 0u64;
    let mut unique = BTreeSet::new();
    for rs in all {
        for r in rs.iter() {
            n += 1;
            unique.insert(seq(r));
        }
    }
    let extra = n - unique.len() as u64;
    (unique, extra)
}

/// `a` hands out 60 records, gets stuck and loses its only partition to
/// `b`, which reads 80 and commits 40, then leaves: the partition comes
/// back to `a` before `a` polls again. A partial `commit_positions` from
/// what `a` remembers of its earlier tenure (50, past the group's 40) is
/// refused, never applied; `a` then reads from the committed 40, and every
/// extra delivery is counted.
#[test]
fn a_partial_commit_from_an_earlier_tenure_is_refused_and_reading_resumes_at_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append_rr(&topic, 0, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let first_a = a.poll(60).unwrap();
    assert_eq!(first_a.len(), 60);
    let mut b = group.join(member_opts()).unwrap();
    pass(
        &clock,
        PROCESSING * 2 + Duration::from_secs(3),
        &[&a],
        &mut [&mut b],
    );
    let got_b = b.poll(80).unwrap();
    assert_eq!(seqs(&got_b), (0..80).collect(), "moved to `b` from 0");
    b.commit_positions(&[(0, 40)]).unwrap();
    b.leave().unwrap();
    assert_eq!(group.committed().positions.get(&0), Some(&40));
    // `a` has not polled since: it remembers 60 handed out in partition 0.
    let r = a.commit_positions(&[(0, 50)]);
    assert!(
        matches!(r, Err(Error::NotAssigned { .. })),
        "a commit from an earlier tenure: {r:?}"
    );
    assert_eq!(group.committed().positions.get(&0), Some(&40));
    let r = a.commit();
    assert!(matches!(r, Err(Error::NotAssigned { .. })), "{r:?}");
    let again_a = drain(&mut a);
    assert_eq!(seqs(&again_a), (40..100).collect());
    a.commit().unwrap();
    assert_eq!(group.committed().positions.get(&0), Some(&100));
    let (unique, extra) = extra_deliveries(&[&first_a, &got_b, &again_a]);
    assert_eq!(unique, (0..100).collect());
    let d = group.describe();
    assert!(
        extra <= d.stats.redelivered,
        "{extra} extra deliveries, {} counted",
        d.stats.redelivered
    );
    log.close().unwrap();
}

/// The only member is stuck past twice its processing timeout: the
/// coordinator releases its partition and gives it straight back (there
/// is nobody else). Its next poll reads from the committed position, the
/// window is counted once, and the partition is not moved over and over
/// while it stays stuck.
#[test]
fn a_partition_released_and_given_back_to_a_stuck_sole_member_is_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append_rr(&topic, 0, 100);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let first = a.poll(50).unwrap();
    a.commit_positions(&[(0, 20)]).unwrap();
    pass(
        &clock,
        PROCESSING * 2 + Duration::from_secs(10),
        &[&a],
        &mut [],
    );
    let again = drain(&mut a);
    assert_eq!(seqs(&again), (20..100).collect());
    let d = group.describe();
    assert_eq!(d.stats.redelivered, 30, "{d:#?}");
    let (_, extra) = extra_deliveries(&[&first, &again]);
    assert_eq!(extra, 30);
    assert!(
        d.stats.moves <= 1,
        "a partition with one possible owner moved {} times",
        d.stats.moves
    );
    log.close().unwrap();
}

/// A static member rejoins while one of its partitions is being revoked
/// towards a newcomer: the new incarnation takes both (reading from the
/// committed positions), the old handle is fenced, the newcomer gets its
/// share at the next balancing, and nothing is read by two members at once
/// or lost.
#[test]
fn a_static_rejoin_while_a_partition_is_revoking_keeps_one_owner() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append_rr(&topic, 0, 200);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(static_opts("a")).unwrap();
    let mut first_a = Vec::new();
    for _ in 0..3 {
        first_a.extend(a.poll(20).unwrap());
    }
    let mut b = group.join(member_opts()).unwrap();
    let d = group.describe();
    assert_eq!(d.assignments.iter().filter(|x| x.revoking).count(), 1);
    assert!(b.poll(10).unwrap().is_empty(), "not released yet");
    let mut a2 = group.join(static_opts("a")).unwrap();
    assert!(matches!(a.poll(1), Err(Error::Fenced { .. })));
    assert!(matches!(a.commit(), Err(Error::Fenced { .. })));
    let d = group.describe();
    assert!(d.assignments.iter().all(|x| !x.revoking), "{d:#?}");
    let mut got_a2 = Vec::new();
    let mut got_b = Vec::new();
    for _ in 0..6 {
        clock.advance(Duration::from_millis(700));
        got_a2.extend(a2.poll(15).unwrap());
        a2.commit().unwrap();
        got_b.extend(b.poll(15).unwrap());
        b.commit().unwrap();
    }
    got_a2.extend(drain(&mut a2));
    got_b.extend(drain(&mut b));
    a2.commit().unwrap();
    b.commit().unwrap();
    assert!(!got_b.is_empty(), "the newcomer never got a partition");
    assert_partition_order(&got_a2);
    assert_partition_order(&got_b);
    assert!(seqs(&got_a2).is_disjoint(&seqs(&got_b)));
    let (unique, extra) = extra_deliveries(&[&first_a, &got_a2, &got_b]);
    assert_eq!(unique, (0..200).collect());
    let d = group.describe();
    assert!(
        extra <= d.stats.redelivered,
        "{extra} > {}",
        d.stats.redelivered
    );
    assert_eq!(d.lag_records, 0);
    log.close().unwrap();
}

/// A partition is split, its children merged, and the merge child split
/// again, while the member reading the chain dies at each stage in turn:
/// everything is delivered, extra deliveries are counted, and the last
/// partitions end up read (nothing waits forever).
#[test]
fn split_then_merge_chains_while_members_die_lose_nothing_and_finish() {
    for die_at in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let log = open(dir.path(), &clock);
        let topic = log.topic_or_create("t", config(1)).unwrap();
        let group = topic.group("g", GroupOptions::default()).unwrap();
        let mut appended = 0u64;
        let mut deliveries: Vec<OwnedRecord> = Vec::new();
        let mut members: Vec<Member> = vec![group.join(member_opts()).unwrap()];
        let mut stage = 0;
        let mut step = |topic: &Topic, members: &mut Vec<Member>, deliveries: &mut Vec<_>| {
            append(topic, 8, appended, 40);
            appended += 40;
            for m in members.iter_mut() {
                deliveries.extend(m.poll(25).unwrap());
                let _ = m.commit();
                deliveries.extend(m.poll(10).unwrap());
            }
            if stage == die_at {
                // The first member dies with a window; a new one joins.
                let dead = members.remove(0);
                drop(dead);
                members.push(group.join(member_opts()).unwrap());
            }
            stage += 1;
        };
        step(&topic, &mut members, &mut deliveries);
        let kids = topic.split(0, SplitPlan::Even).unwrap();
        step(&topic, &mut members, &mut deliveries);
        let m = topic.merge(kids[0], kids[1]).unwrap();
        step(&topic, &mut members, &mut deliveries);
        topic.split(m, SplitPlan::Even).unwrap();
        step(&topic, &mut members, &mut deliveries);
        for _ in 0..(SESSION.as_secs() + 5) {
            clock.advance(Duration::from_secs(1));
            for m in members.iter_mut() {
                deliveries.extend(drain(m));
                match m.commit() {
                    Ok(()) | Err(Error::NotAssigned { .. }) => {}
                    Err(e) => panic!("die_at {die_at}: {e}"),
                }
            }
        }
        let (unique, extra) = extra_deliveries(&[&deliveries]);
        let missing: Vec<u64> = (0..appended).filter(|s| !unique.contains(s)).collect();
        assert!(missing.is_empty(), "die_at {die_at}: missing {missing:?}");
        let d = group.describe();
        assert!(
            extra <= d.stats.redelivered,
            "die_at {die_at}: {extra} extra, {} counted",
            d.stats.redelivered
        );
        assert_eq!(d.lag_records, 0, "die_at {die_at}: {d:#?}");
        drop(members);
        log.close().unwrap();
    }
}

struct Sim {
    member: Member,
    instance: Option<String>,
    frozen: bool,
    /// Per partition, the next offset after the last record it got.
    handed: BTreeMap<u32, u64>,
}

/// Like the seeded simulation of `handover`, with static members that
/// rejoin (replacing a live incarnation), partial `commit_positions`, and
/// a check that no record below the group's committed position is ever
/// delivered.
#[test]
fn seeded_simulation_with_rejoins_and_partial_commits_never_delivers_a_committed_record() {
    let seeds = std::env::var("GROUP_SIM2_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8u64);
    for seed in 0..seeds {
        simulate(seed);
    }
}

fn simulate(seed: u64) {
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    let keyed = seed % 2 == 1;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut members: Vec<Sim> = Vec::new();
    let mut appended = 0u64;
    let mut deliveries: Vec<u64> = Vec::new();
    let mut next_instance = 0u32;
    let check_committed = |got: &[OwnedRecord], before: &fissionlog::Cut, what: &str| {
        for r in got {
            if let Some(&c) = before.positions.get(&r.partition) {
                assert!(
                    r.offset >= c,
                    "seed {seed}: {what}: partition {} offset {} delivered, committed {c}",
                    r.partition,
                    r.offset
                );
            }
            assert!(
                !before.drained.contains(&r.partition),
                "seed {seed}: {what}: partition {} committed as read, offset {} delivered",
                r.partition,
                r.offset
            );
        }
    };
    // Per key, the latest sequence number delivered for the first time:
    // a key's records are first delivered in append order (through
    // splits, merges and moves), whoever gets them.
    let mut first: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut seen: BTreeSet<u64> = BTreeSet::new();
    let mut poll = |s: &mut Sim, n: usize, deliveries: &mut Vec<u64>| {
        let before = group.committed();
        let got = s.member.poll(n).unwrap();
        check_committed(&got, &before, "poll");
        for r in &got {
            s.handed.insert(r.partition, r.offset + 1);
            let q = seq(r);
            if seen.insert(q) {
                if let Some(k) = &r.key {
                    if let Some(&prev) = first.get(k) {
                        assert!(
                            q > prev,
                            "seed {seed}: key {:?}: {q} first delivered after {prev}",
                            String::from_utf8_lossy(k)
                        );
                    }
                    first.insert(k.clone(), q);
                }
            }
        }
        deliveries.extend(got.iter().map(seq));
    };
    for _step in 0..400 {
        match rng.below(110) {
            0..=19 => {
                let n = 1 + rng.below(20);
                if keyed {
                    append(&topic, 6, appended, n);
                } else {
                    append_rr(&topic, appended, n);
                }
                appended += n;
            }
            20..=44 if !members.is_empty() => {
                let i = rng.below(members.len() as u64) as usize;
                if !members[i].frozen {
                    let n = 1 + rng.below(40) as usize;
                    poll(&mut members[i], n, &mut deliveries);
                }
            }
            45..=54 if !members.is_empty() => {
                let i = rng.below(members.len() as u64) as usize;
                if !members[i].frozen {
                    match members[i].member.commit() {
                        Ok(()) | Err(Error::NotAssigned { .. }) => {}
                        Err(e) => panic!("seed {seed}: commit: {e}"),
                    }
                }
            }
            55..=59 if !members.is_empty() => {
                let i = rng.below(members.len() as u64) as usize;
                let s = &mut members[i];
                if !s.frozen && !s.handed.is_empty() {
                    let k = rng.below(s.handed.len() as u64) as usize;
                    let (&p, &h) = s.handed.iter().nth(k).unwrap();
                    let o = rng.below(h + 1);
                    match s.member.commit_positions(&[(p, o)]) {
                        Ok(())
                        | Err(Error::NotAssigned { .. })
                        | Err(Error::InvalidConfig(_))
                        | Err(Error::CommitBeforeParent { .. }) => {}
                        Err(e) => panic!("seed {seed}: commit_positions: {e}"),
                    }
                }
            }
            60..=74 => {
                clock.advance(Duration::from_secs(1 + rng.below(3)));
                for m in &members {
                    m.member.heartbeat().unwrap();
                }
                group.tick();
            }
            75..=79 if members.len() < 3 => {
                let instance = (rng.below(2) == 0).then(|| {
                    next_instance += 1;
                    format!("i{next_instance}")
                });
                let opts = MemberOptions {
                    instance_id: instance.clone(),
                    ..member_opts()
                };
                members.push(Sim {
                    member: group.join(opts).unwrap(),
                    instance,
                    frozen: false,
                    handed: BTreeMap::new(),
                });
            }
            80..=84 if !members.is_empty() => {
                let i = rng.below(members.len() as u64) as usize;
                let m = members.remove(i);
                if rng.below(2) == 0 && !m.frozen {
                    let _ = m.member.leave();
                } else {
                    drop(m);
                }
            }
            85..=88 if !members.is_empty() => {
                let i = rng.below(members.len() as u64) as usize;
                members[i].frozen = !members[i].frozen;
            }
            89..=92 => {
                let active: Vec<u32> = topic
                    .partitions()
                    .into_iter()
                    .filter(|p| p.sealed_at.is_none())
                    .map(|p| p.id)
                    .collect();
                if active.len() < 6 {
                    let p = active[rng.below(active.len() as u64) as usize];
                    topic.split(p, SplitPlan::Even).unwrap();
                }
            }
            93..=96 => {
                let mut active: Vec<(u64, u32)> = topic
                    .partitions()
                    .into_iter()
                    .filter(|p| p.sealed_at.is_none())
                    .map(|p| (p.start, p.id))
                    .collect();
                active.sort_unstable();
                if active.len() > 1 {
                    let i = rng.below(active.len() as u64 - 1) as usize;
                    topic.merge(active[i].1, active[i + 1].1).unwrap();
                }
            }
            97..=104 => {
                // A static member rejoins: its old incarnation (maybe
                // frozen, maybe mid-window) is replaced.
                let statics: Vec<usize> = members
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.instance.is_some())
                    .map(|(i, _)| i)
                    .collect();
                if !statics.is_empty() {
                    let i = statics[rng.below(statics.len() as u64) as usize];
                    let instance = members[i].instance.clone();
                    let old = members.remove(i);
                    let opts = MemberOptions {
                        instance_id: instance.clone(),
                        ..member_opts()
                    };
                    // The old incarnation may have been declared dead
                    // already: then this is a plain join.
                    let member = group.join(opts).unwrap();
                    let mut old = old;
                    assert!(
                        old.member.poll(1).is_err(),
                        "seed {seed}: a replaced incarnation still polls"
                    );
                    members.push(Sim {
                        member,
                        instance,
                        frozen: false,
                        handed: BTreeMap::new(),
                    });
                }
            }
            _ => {}
        }
    }
    for m in &mut members {
        m.frozen = false;
    }
    if members.is_empty() {
        members.push(Sim {
            member: group.join(member_opts()).unwrap(),
            instance: None,
            frozen: false,
            handed: BTreeMap::new(),
        });
    }
    for _ in 0..40 {
        clock.advance(Duration::from_secs(1));
        for m in &mut members {
            m.member.heartbeat().unwrap();
            loop {
                let before = deliveries.len();
                poll(m, 1000, &mut deliveries);
                if deliveries.len() == before {
                    break;
                }
            }
            match m.member.commit() {
                Ok(()) | Err(Error::NotAssigned { .. }) => {}
                Err(e) => panic!("seed {seed}: final commit: {e}"),
            }
        }
    }
    let unique: BTreeSet<u64> = deliveries.iter().copied().collect();
    let missing: Vec<u64> = (0..appended).filter(|s| !unique.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "seed {seed}: {} records never delivered: {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    let extra = deliveries.len() as u64 - unique.len() as u64;
    let d = group.describe();
    assert!(
        extra <= d.stats.redelivered,
        "seed {seed}: {extra} extra deliveries, {} counted as redelivered",
        d.stats.redelivered
    );
    assert_eq!(d.lag_records, 0, "seed {seed}: {d:#?}");
    drop(members);
    log.close().unwrap();
}

/// Real threads and the system clock: three members poll and commit
/// (some commits partial), a fourth joins and leaves over and over, one
/// thread appends keyed records and another splits and merges partitions
/// meanwhile. Every record is delivered, extra deliveries never exceed the
/// counted windows, no record is delivered below the committed position it
/// had when the poll began, and each key's records are first delivered in
/// append order.
#[test]
fn members_racing_splits_merges_and_churn_keep_every_group_promise() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(
        dir.path(),
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )
    .unwrap();
    let topic = log.topic_or_create("t", config(4)).unwrap();
    let initial = 3_000u64;
    let later = 3_000u64;
    let total = initial + later;
    append(&topic, 32, 0, initial);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    struct Seen {
        count: BTreeMap<u64, u32>,
        first: BTreeMap<Vec<u8>, u64>,
    }
    let seen = Mutex::new(Seen {
        count: BTreeMap::new(),
        first: BTreeMap::new(),
    });
    let record = |got: &[OwnedRecord], before: &fissionlog::Cut| {
        let mut seen = seen.lock().unwrap();
        for r in got {
            if let Some(&c) = before.positions.get(&r.partition) {
                assert!(
                    r.offset >= c,
                    "partition {} offset {} below committed {c}",
                    r.partition,
                    r.offset
                );
            }
            let q = seq(r);
            let n = seen.count.entry(q).or_default();
            *n += 1;
            if *n == 1 {
                let k = r.key.clone().unwrap();
                if let Some(&prev) = seen.first.get(&k) {
                    assert!(
                        q > prev,
                        "key {:?}: {q} first delivered after {prev}",
                        String::from_utf8_lossy(&k)
                    );
                }
                seen.first.insert(k, q);
            }
        }
    };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let record = &record;
            let stop = &stop;
            let group = &group;
            s.spawn(move || {
                let mut m = group.join(member_opts()).unwrap();
                let mut i = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let before = group.committed();
                    let got = m.poll(61).unwrap();
                    record(&got, &before);
                    i += 1;
                    let r = if (i + t).is_multiple_of(3) {
                        // Partial: up to the middle of what this poll got
                        // in one partition.
                        match got.get(got.len() / 2) {
                            Some(r) => m.commit_positions(&[(r.partition, r.offset)]),
                            None => m.commit(),
                        }
                    } else {
                        m.commit()
                    };
                    match r {
                        Ok(())
                        | Err(Error::NotAssigned { .. })
                        | Err(Error::InvalidConfig(_))
                        | Err(Error::CommitBeforeParent { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                m.leave().unwrap();
            });
        }
        s.spawn(|| {
            while seen.lock().unwrap().count.len() < total as usize {
                let mut m = group.join(member_opts()).unwrap();
                let before = group.committed();
                record(&m.poll(17).unwrap(), &before);
                let _ = m.commit();
                m.leave().unwrap();
            }
            stop.store(true, Ordering::Release);
        });
        s.spawn(|| {
            for chunk in 0..10 {
                append(&topic, 32, initial + chunk * later / 10, later / 10);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        s.spawn(|| {
            for round in 0..6 {
                std::thread::sleep(Duration::from_millis(8));
                let mut active: Vec<(u64, u32)> = topic
                    .partitions()
                    .into_iter()
                    .filter(|p| p.sealed_at.is_none())
                    .map(|p| (p.start, p.id))
                    .collect();
                active.sort_unstable();
                if round % 2 == 0 || active.len() < 2 {
                    let p = active[round % active.len()].1;
                    topic.split(p, SplitPlan::Even).unwrap();
                } else {
                    let i = round % (active.len() - 1);
                    topic.merge(active[i].1, active[i + 1].1).unwrap();
                }
            }
        });
    });
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.count.len() as u64, total);
    let again: u64 = seen.count.values().map(|&n| u64::from(n - 1)).sum();
    let d = group.describe();
    assert!(
        again <= d.stats.redelivered,
        "{again} records delivered again, {} counted as an uncommitted window",
        d.stats.redelivered
    );
    log.close().unwrap();
}

/// A member's commit from the reading state of an earlier tenure is
/// refused, but it publishes that stale state as what the member handed
/// out. A partition revoked from the member just then waits for records
/// the member no longer holds: its next poll drops the stale state, and
/// the partition must move then, not only when the processing timeout
/// runs out.
#[test]
fn a_revocation_waiting_on_stale_handed_out_state_settles_at_the_next_poll() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append_rr(&topic, 0, 200);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut first_a = Vec::new();
    for _ in 0..3 {
        first_a.extend(a.poll(20).unwrap());
    }
    // Stuck past twice the processing timeout, alone: both partitions are
    // released and given back in new tenures.
    pass(
        &clock,
        PROCESSING * 2 + Duration::from_secs(3),
        &[&a],
        &mut [],
    );
    assert!(matches!(a.commit(), Err(Error::NotAssigned { .. })));
    let mut b = group.join(member_opts()).unwrap();
    let d = group.describe();
    let revoking = d.assignments.iter().filter(|x| x.revoking).count();
    // `a` polls (nothing: it keeps the records for later) and so drops
    // what it remembered of the earlier tenures.
    a.poll(0).unwrap();
    clock.advance(Duration::from_millis(10));
    let got_b = b.poll(10).unwrap();
    let d = group.describe();
    assert!(
        revoking == 0 || !got_b.is_empty(),
        "the revoked partition still waits after the owner's poll: {d:#?}"
    );
    assert_eq!(
        d.assignments
            .iter()
            .filter(|x| x.member == Some(b.id()))
            .count(),
        1,
        "{d:#?}"
    );
    log.close().unwrap();
}

/// A partition moves to a member that dies before it ever polls, and then
/// to a third member: nobody read it from its first revocation until the
/// third member's poll, and its pause says so (not only the time since
/// the second owner was declared dead).
#[test]
fn a_pause_spans_every_owner_that_never_took_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(1)).unwrap();
    append_rr(&topic, 0, 50);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let a = group.join(member_opts()).unwrap();
    let b = group.join(member_opts()).unwrap();
    // `a` owns the partition; it leaves and the partition goes to `b`,
    // which never polls again and stops heartbeating.
    assert_eq!(a.assignment().partitions, [0]);
    a.leave().unwrap();
    drop(b);
    let mut c = group.join(member_opts()).unwrap();
    // `c` polls all along; `b` is declared dead after its session timeout.
    pass(&clock, SESSION + Duration::from_secs(2), &[], &mut [&mut c]);
    assert_eq!(c.assignment().partitions, [0]);
    let d = group.describe();
    assert_eq!(d.stats.dead_detected, 1);
    let longest = d.stats.pauses_ms.iter().copied().fold(0.0, f64::max);
    assert!(
        longest >= SESSION.as_millis() as f64,
        "nobody read the partition for over {} ms; longest pause {longest} ms: {:?}",
        SESSION.as_millis(),
        d.stats.pauses_ms
    );
    log.close().unwrap();
}

fn append_old(topic: &Topic, from: u64, n: u64) {
    for i in from..from + n {
        let value = format!("r:{i}");
        topic
            .append_batch(&[NewRecord {
                key: None,
                value: value.as_bytes(),
                timestamp: Some(1_000),
            }])
            .unwrap();
    }
}

/// Both parents of a merge are removed by retention while two members
/// hold them with uncommitted records: the merge child becomes ready at
/// once, goes to one of them, is read from its start, and both members'
/// commits of what they handed out in the removed parents succeed.
#[test]
fn a_merge_child_of_parents_retention_removed_under_their_owners_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log
        .topic_or_create(
            "t",
            TopicConfig {
                segment_bytes: 4096,
                retention_age: Some(Duration::from_secs(3600)),
                ..config(2)
            },
        )
        .unwrap();
    append_old(&topic, 0, 80);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    a.commit().unwrap();
    let got_a = a.poll(10).unwrap();
    let got_b = b.poll(10).unwrap();
    assert_eq!((got_a.len(), got_b.len()), (10, 10));
    let m = topic.merge(0, 1).unwrap();
    append_rr(&topic, 80, 30);
    let removed = log.enforce_retention().unwrap();
    assert!(removed > 0);
    assert!(topic.partition(0).is_err() && topic.partition(1).is_err());
    a.commit().unwrap();
    b.commit().unwrap();
    let mut rest = drain(&mut a);
    rest.extend(drain(&mut b));
    assert_eq!(
        seqs(&rest),
        (80..110).collect(),
        "the merge child's records"
    );
    assert_eq!(rest.len(), 30);
    a.commit().unwrap();
    b.commit().unwrap();
    let c = group.committed();
    assert_eq!(c.positions.get(&m), Some(&30), "{c:?}");
    assert_eq!(group.describe().lag_records, 0);
    log.close().unwrap();
}

/// Split children are read by two members, then merged, and retention
/// removes their parent: the merge child becomes ready once both children
/// are committed as read, and every record is delivered.
#[test]
fn a_merge_of_split_children_whose_parent_retention_removed_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log
        .topic_or_create(
            "t",
            TopicConfig {
                segment_bytes: 4096,
                retention_age: Some(Duration::from_secs(3600)),
                ..config(1)
            },
        )
        .unwrap();
    append_old(&topic, 0, 60);
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    append_rr(&topic, 60, 40);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut got = drain(&mut a);
    a.commit().unwrap();
    let mut b = group.join(member_opts()).unwrap();
    b.poll(0).unwrap();
    got.extend(drain(&mut a));
    a.commit().unwrap();
    let m = topic.merge(kids[0], kids[1]).unwrap();
    append_rr(&topic, 100, 20);
    log.enforce_retention().unwrap();
    assert!(topic.partition(0).is_err(), "the old parent is gone");
    let mut got_b = Vec::new();
    for _ in 0..3 {
        got.extend(drain(&mut a));
        a.commit().unwrap();
        got_b.extend(drain(&mut b));
        b.commit().unwrap();
    }
    let all: BTreeSet<u64> = seqs(&got).union(&seqs(&got_b)).copied().collect();
    assert_eq!(all, (0..120).collect());
    let c = group.committed();
    assert_eq!(c.positions.get(&m), Some(&20), "{c:?}");
    log.close().unwrap();
}

/// A consumer loop commits after every poll, also when the poll returned
/// nothing: such a commit changes no position and must not cost a manifest
/// record and its fsync (the journal would grow by one record per idle
/// poll of every member).
#[test]
fn a_commit_with_nothing_new_writes_no_manifest_record() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append_rr(&topic, 0, 40);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut a).len(), 40);
    a.commit().unwrap();
    let journal = dir.path().join(fissionlog::layout::JOURNAL_FILE);
    let size = std::fs::metadata(&journal).unwrap().len();
    let commits = group.describe().stats.commits;
    for _ in 0..5 {
        assert!(a.poll(100).unwrap().is_empty());
        a.commit().unwrap();
    }
    assert_eq!(group.describe().stats.commits, commits);
    assert_eq!(
        std::fs::metadata(&journal).unwrap().len(),
        size,
        "idle commits wrote manifest records"
    );
    // A commit that moves something still writes.
    append_rr(&topic, 40, 4);
    assert_eq!(drain(&mut a).len(), 4);
    a.commit().unwrap();
    assert_eq!(group.describe().stats.commits, commits + 1);
    let c = group.committed();
    assert_eq!(c.positions.values().sum::<u64>(), 44);
    log.close().unwrap();
}

/// Real threads with short timeouts: two members poll and commit, one
/// thread keeps replacing a static member (the replaced handle must be
/// fenced), and another joins members that read a little and vanish
/// without leaving (declared dead after 200 ms). Nothing is lost, extra
/// deliveries stay within the counted windows, nothing below the committed
/// position is delivered, and each key is first delivered in order.
#[test]
fn members_racing_static_rejoins_and_crashes_keep_every_group_promise() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(
        dir.path(),
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )
    .unwrap();
    let topic = log.topic_or_create("t", config(6)).unwrap();
    let total = 3_000u64;
    append(&topic, 48, 0, total);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let short = MemberOptions {
        session_timeout: Duration::from_millis(200),
        processing_timeout: Duration::from_millis(400),
        instance_id: None,
        background_heartbeat: None,
    };
    struct Seen {
        count: BTreeMap<u64, u32>,
        first: BTreeMap<Vec<u8>, u64>,
    }
    let seen = Mutex::new(Seen {
        count: BTreeMap::new(),
        first: BTreeMap::new(),
    });
    let record = |got: &[OwnedRecord], before: &fissionlog::Cut| {
        let mut seen = seen.lock().unwrap();
        for r in got {
            if let Some(&c) = before.positions.get(&r.partition) {
                assert!(
                    r.offset >= c,
                    "partition {} offset {} below committed {c}",
                    r.partition,
                    r.offset
                );
            }
            let q = seq(r);
            let n = seen.count.entry(q).or_default();
            *n += 1;
            if *n == 1 {
                let k = r.key.clone().unwrap();
                if let Some(&prev) = seen.first.get(&k) {
                    assert!(
                        q > prev,
                        "key {:?}: {q} first delivered after {prev}",
                        String::from_utf8_lossy(&k)
                    );
                }
                seen.first.insert(k, q);
            }
        }
    };
    let done = || seen.lock().unwrap().count.len() >= total as usize;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut m = group.join(short.clone()).unwrap();
                while !stop.load(Ordering::Acquire) {
                    let before = group.committed();
                    // A thread that waited for a core past its 200 ms
                    // session is declared dead and fenced like the
                    // vanishing members: it joins again, and what it held
                    // uncommitted is a counted window.
                    match m.poll(53) {
                        Ok(got) => record(&got, &before),
                        Err(Error::Fenced { .. }) => {
                            m = group.join(short.clone()).unwrap();
                            continue;
                        }
                        Err(e) => panic!("{e}"),
                    }
                    match m.commit() {
                        Ok(()) | Err(Error::NotAssigned { .. }) => {}
                        Err(Error::Fenced { .. }) => m = group.join(short.clone()).unwrap(),
                        Err(e) => panic!("{e}"),
                    }
                }
                let _ = m.leave();
            });
        }
        s.spawn(|| {
            let opts = MemberOptions {
                instance_id: Some("s".into()),
                ..short.clone()
            };
            let mut cur = group.join(opts.clone()).unwrap();
            let mut rejoins = 0;
            while !stop.load(Ordering::Acquire) && rejoins < 30 {
                rejoins += 1;
                for _ in 0..3 {
                    let before = group.committed();
                    match cur.poll(29) {
                        Ok(got) => record(&got, &before),
                        Err(Error::Fenced { .. }) => break,
                        Err(e) => panic!("{e}"),
                    }
                    let _ = cur.commit();
                }
                let mut old = std::mem::replace(&mut cur, group.join(opts.clone()).unwrap());
                assert!(
                    matches!(old.poll(1), Err(Error::Fenced { .. })),
                    "a replaced static incarnation still polls"
                );
            }
            let _ = cur.commit();
            let _ = cur.leave();
        });
        s.spawn(|| {
            for _ in 0..4 {
                let mut m = group.join(short.clone()).unwrap();
                let before = group.committed();
                record(&m.poll(11).unwrap(), &before);
                drop(m);
                std::thread::sleep(Duration::from_millis(60));
            }
            while !done() {
                std::thread::sleep(Duration::from_millis(5));
            }
            stop.store(true, Ordering::Release);
        });
    });
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.count.len() as u64, total);
    let again: u64 = seen.count.values().map(|&n| u64::from(n - 1)).sum();
    let d = group.describe();
    assert!(d.stats.dead_detected > 0, "{:?}", d.stats);
    assert!(
        again <= d.stats.redelivered,
        "{again} records delivered again, {} counted as an uncommitted window",
        d.stats.redelivered
    );
    log.close().unwrap();
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `poll_wait` while one of the member's partitions is being revoked and
/// has records past what the member handed out there: the member may not
/// read them, so there is nothing to wake for; the wait must sleep, not
/// spin on the paused partition until its timeout.
#[test]
fn poll_wait_does_not_spin_on_a_revoking_partition_with_new_records() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.topic_or_create("t", config(2)).unwrap();
    append_rr(&topic, 0, 40);
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut a).len(), 40);
    let _b = group.join(member_opts()).unwrap();
    let d = group.describe();
    assert_eq!(d.assignments.iter().filter(|x| x.revoking).count(), 1);
    append_rr(&topic, 40, 20);
    let got = a.poll_wait(100, Duration::from_millis(50)).unwrap();
    assert_eq!(got.len(), 10, "the partition it keeps");
    let cpu = thread_cpu();
    let wall = std::time::Instant::now();
    let got = a.poll_wait(100, Duration::from_millis(400)).unwrap();
    let used = thread_cpu() - cpu;
    assert!(got.is_empty());
    assert!(wall.elapsed() >= Duration::from_millis(400));
    assert!(
        used < Duration::from_millis(150),
        "poll_wait burned {used:?} of CPU in 400 ms waiting for nothing"
    );
    log.close().unwrap();
}
