//! Members over many active partitions: an idle poll reads no partition
//! and a poll after one append reads that one only, whatever the number
//! owned; two members of a 2,000-partition topic read every record exactly
//! once, in order per partition; appends racing a member's polls are
//! never missed nor delayed past the next poll.

use crate::common;

use common::groups::*;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fissionlog::{GroupOptions, ManualClock, Member, NewRecord, OwnedRecord, Topic};

/// Partitions of the wide topic (`FISSIONLOG_WIDE_PARTITIONS` overrides).
fn wide() -> u32 {
    std::env::var("FISSIONLOG_WIDE_PARTITIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000)
}

fn put(topic: &Topic, p: u32, seq: u64) {
    let v = format!("{p}:{seq}");
    let rec = NewRecord {
        key: None,
        value: v.as_bytes(),
        timestamp: None,
    };
    topic.append_to(p, &[rec]).unwrap();
}

fn decode(r: &OwnedRecord) -> (u32, u64) {
    let v = std::str::from_utf8(&r.value).unwrap();
    let (p, s) = v.split_once(':').unwrap();
    (p.parse().unwrap(), s.parse().unwrap())
}

/// Every record once, each partition's in the order written, each from
/// the partition its value names; `want` is the count per partition.
fn assert_once_in_order(records: &[OwnedRecord], want: &BTreeMap<u32, u64>) {
    let mut next: BTreeMap<u32, u64> = BTreeMap::new();
    for r in records {
        let (p, seq) = decode(r);
        assert_eq!(r.partition, p, "record {p}:{seq} read from {}", r.partition);
        let n = next.entry(p).or_insert(0);
        assert_eq!(seq, *n, "partition {p}: record {seq} where {n} was due");
        *n += 1;
    }
    assert_eq!(&next, want, "records per partition");
}

#[test]
fn an_idle_member_poll_reads_no_partition_and_a_poll_after_one_append_that_one() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.create_topic("t", config(300)).unwrap();
    for p in 0..300 {
        put(&topic, p, 0);
    }
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert_eq!(m.assignment().partitions.len(), 300);
    assert_eq!(drain(&mut m).len(), 300);
    m.commit().unwrap();
    for _ in 0..3 {
        assert!(m.poll(100).unwrap().is_empty());
        assert_eq!(m.partitions_examined(), &[] as &[u32], "an idle poll");
    }
    put(&topic, 123, 1);
    let got = m.poll(100).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(decode(&got[0]), (123, 1));
    let looked = m.partitions_examined();
    assert!(!looked.is_empty());
    assert!(
        looked.iter().all(|&p| p == 123),
        "a poll after an append to 123 looked at {looked:?}"
    );
    assert!(m.poll(100).unwrap().is_empty());
    assert_eq!(m.partitions_examined(), &[] as &[u32]);
    log.close().unwrap();
}

#[test]
fn an_idle_member_poll_walks_no_partition_list_until_a_balancing_or_timeout_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.create_topic("t", config(300)).unwrap();
    for p in 0..300 {
        put(&topic, p, 0);
    }
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert_eq!(drain(&mut m).len(), 300);
    m.commit().unwrap();
    for _ in 0..3 {
        assert!(m.poll(100).unwrap().is_empty());
        assert_eq!(m.partitions_examined(), &[] as &[u32]);
        assert_eq!(m.full_walks_in_last_poll(), 0, "an idle poll");
    }
    // One append: that partition is read and reported, nothing else.
    put(&topic, 42, 1);
    assert_eq!(m.poll(100).unwrap().len(), 1);
    let looked = m.partitions_examined();
    assert!(
        !looked.is_empty() && looked.iter().all(|&p| p == 42),
        "{looked:?}"
    );
    assert_eq!(m.full_walks_in_last_poll(), 0, "a poll after one append");
    // The balancing interval (1 s) passes: the next poll balances, and
    // the one after it is idle again.
    clock.advance(std::time::Duration::from_secs(2));
    assert!(m.poll(100).unwrap().is_empty());
    assert!(m.full_walks_in_last_poll() > 0, "no balancing after 2 s");
    assert!(m.poll(100).unwrap().is_empty());
    assert_eq!(m.full_walks_in_last_poll(), 0);
    // So does the session deadline set at its join (10 s; it heartbeats
    // with each poll, so the scan there finds it alive).
    clock.advance(std::time::Duration::from_secs(9));
    assert!(m.poll(100).unwrap().is_empty());
    assert!(m.full_walks_in_last_poll() > 0);
    assert!(m.poll(100).unwrap().is_empty());
    assert_eq!(m.full_walks_in_last_poll(), 0);
    assert_eq!(m.assignment().partitions.len(), 300);
    log.close().unwrap();
}

#[test]
fn the_append_rates_are_folded_without_walking_the_partitions_on_an_idle_poll() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.create_topic("t", config(300)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert!(m.poll(100).unwrap().is_empty());
    // Past the rate fold interval (100 ms), not the balancing's (1 s): an
    // idle poll folds nothing and walks nothing.
    for _ in 0..3 {
        clock.advance(std::time::Duration::from_millis(150));
        assert!(m.poll(100).unwrap().is_empty());
        assert_eq!(
            m.full_walks_in_last_poll(),
            0,
            "an idle poll after a fold interval"
        );
    }
    // Appends to one partition: the poll that folds them walks nothing
    // either, and that partition alone has a rate.
    for seq in 0..10 {
        put(&topic, 77, seq);
    }
    clock.advance(std::time::Duration::from_millis(150));
    assert_eq!(m.poll(100).unwrap().len(), 10);
    assert_eq!(
        m.full_walks_in_last_poll(),
        0,
        "a poll after appends to one"
    );
    let described = group.describe();
    let rated: Vec<(u32, f64)> = described
        .assignments
        .iter()
        .filter(|a| a.append_rate > 0.0)
        .map(|a| (a.partition, a.append_rate))
        .collect();
    assert_eq!(rated.len(), 1, "{rated:?}");
    assert_eq!(rated[0].0, 77);
    // 10 records over the 0.15 s since the last fold, weighted by
    // 1 - exp(-0.15 / 2).
    let want = 10.0 / 0.15 * (1.0 - (-0.15f64 / 2.0).exp());
    assert!(
        (rated[0].1 - want).abs() < 1e-6 * want,
        "{rated:?}, want {want}"
    );
    log.close().unwrap();
}

#[test]
fn two_members_of_two_thousand_partitions_read_every_record_once_in_order() {
    let n = wide();
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.create_topic("t", config(n)).unwrap();
    let mut want: BTreeMap<u32, u64> = BTreeMap::new();
    for p in 0..n {
        for seq in 0..2 {
            put(&topic, p, seq);
        }
        want.insert(p, 2);
    }
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let mut b = group.join(member_opts()).unwrap();
    // The join of `b` moved half of `a`'s partitions: `a` learns of it at
    // its next poll, before it reads.
    let mut members: [&mut Member; 2] = [&mut a, &mut b];
    let mut got: Vec<OwnedRecord> = Vec::new();
    for m in members.iter_mut() {
        got.extend(drain(m));
        m.commit().unwrap();
    }
    for m in members.iter_mut() {
        got.extend(drain(m));
    }
    let owned: Vec<BTreeSet<u32>> = members
        .iter()
        .map(|m| m.assignment().partitions.into_iter().collect())
        .collect();
    assert!(owned[0].is_disjoint(&owned[1]));
    assert_eq!(owned[0].len() + owned[1].len(), n as usize);
    assert_once_in_order(&got, &want);

    // A second round on every eleventh partition reaches its owner only.
    for p in (0..n).step_by(11) {
        put(&topic, p, 2);
        *want.get_mut(&p).unwrap() = 3;
    }
    for (i, m) in members.iter_mut().enumerate() {
        let late = drain(m);
        assert!(late.iter().all(|r| owned[i].contains(&r.partition)));
        got.extend(late);
    }
    assert_once_in_order(&got, &want);
    log.close().unwrap();
}

#[test]
fn appends_racing_member_polls_are_never_missed_nor_delayed_past_the_next_poll() {
    const PARTS: u32 = 64;
    const ROUNDS: u64 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(dir.path(), &clock);
    let topic = log.create_topic("t", config(PARTS)).unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = group.join(member_opts()).unwrap();
    assert!(m.poll(10).unwrap().is_empty());
    let acked = Arc::new(AtomicU64::new(0));
    let (t2, a2) = (topic.clone(), acked.clone());
    let producer = std::thread::spawn(move || {
        let mut per: BTreeMap<u32, u64> = BTreeMap::new();
        for i in 0..ROUNDS {
            let p = ((i * 17) % u64::from(PARTS)) as u32;
            let seq = per.entry(p).or_insert(0);
            put(&t2, p, *seq);
            *seq += 1;
            a2.fetch_add(1, Ordering::SeqCst);
        }
        per
    });
    let mut got: Vec<OwnedRecord> = Vec::new();
    while (got.len() as u64) < ROUNDS {
        let before = acked.load(Ordering::SeqCst);
        got.extend(m.poll(usize::MAX).unwrap());
        assert!(
            got.len() as u64 >= before,
            "{before} appends had returned before the poll, it brought the total to {}",
            got.len()
        );
    }
    let per = producer.join().unwrap();
    assert_once_in_order(&got, &per);
    assert!(m.poll(100).unwrap().is_empty());
    log.close().unwrap();
}
