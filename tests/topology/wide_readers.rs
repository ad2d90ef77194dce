//! Readers over many active partitions: an idle poll looks at no
//! partition and a poll after one append looks at that one only, whatever
//! the number open; every record comes out exactly once, in order per
//! partition, at 2,000 partitions; appends racing polls are never missed
//! nor delayed past the next poll, and never slept through by `poll_wait`.

use crate::common::log::no_balancer;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fissionlog::{
    Log, NewRecord, OwnedRecord, Reader, SplitPlan, StartAt, SyncPolicy, Topic, TopicConfig,
};

/// Partitions of the wide topics (`FISSIONLOG_WIDE_PARTITIONS` overrides:
/// 10,000 takes a minute in a debug build, most of it creating the topic).
fn wide() -> u32 {
    std::env::var("FISSIONLOG_WIDE_PARTITIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000)
}

fn config(partitions: u32) -> TopicConfig {
    let mut c = TopicConfig {
        partitions,
        segment_bytes: 64 << 10,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    };
    c.balance.max_partitions = partitions + 16;
    c
}

/// Value of the `seq`-th record written to partition `p`.
fn value(p: u32, seq: u64) -> Vec<u8> {
    format!("{p}:{seq}").into_bytes()
}

fn decode(r: &OwnedRecord) -> (u32, u64) {
    let v = std::str::from_utf8(&r.value).unwrap();
    let (p, s) = v.split_once(':').unwrap();
    (p.parse().unwrap(), s.parse().unwrap())
}

fn append_to(topic: &Topic, p: u32, seq: u64) {
    let v = value(p, seq);
    let rec = NewRecord {
        key: None,
        value: &v,
        timestamp: None,
    };
    topic.append_to(p, &[rec]).unwrap();
}

/// Polls until a poll returns nothing.
fn drain(r: &mut Reader) -> Vec<OwnedRecord> {
    let mut out = Vec::new();
    loop {
        let got = r.poll(1000).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend(got);
    }
}

/// Every record once, each partition's in the order written, each from
/// the partition its value names.
fn assert_once_in_order(records: &[OwnedRecord], want: &BTreeMap<u32, u64>) {
    let mut next: BTreeMap<u32, u64> = BTreeMap::new();
    for r in records {
        let (p, seq) = decode(r);
        assert_eq!(r.partition, p, "record {p}:{seq} read from {}", r.partition);
        let n = next.entry(p).or_insert(0);
        assert_eq!(seq, *n, "partition {p}: record {seq} where {n} was due");
        *n += 1;
    }
    let got: BTreeMap<u32, u64> = next.into_iter().filter(|&(_, n)| n > 0).collect();
    let want: BTreeMap<u32, u64> = want
        .iter()
        .filter(|&(_, &n)| n > 0)
        .map(|(&p, &n)| (p, n))
        .collect();
    assert_eq!(got, want, "records per partition");
}

#[test]
fn an_idle_poll_looks_at_no_partition_and_a_poll_after_one_append_at_that_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(300)).unwrap();
    for p in 0..300 {
        append_to(&topic, p, 0);
    }
    let mut latest = topic.reader(StartAt::Latest).unwrap();
    let mut earliest = topic.reader(StartAt::Earliest).unwrap();
    assert_eq!(drain(&mut earliest).len(), 300);
    for r in [&mut latest, &mut earliest] {
        for _ in 0..3 {
            assert!(r.poll(100).unwrap().is_empty());
            assert_eq!(r.partitions_examined(), &[] as &[u32], "an idle poll");
        }
    }
    append_to(&topic, 217, 1);
    for r in [&mut latest, &mut earliest] {
        let got = r.poll(100).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(decode(&got[0]), (217, 1));
        let looked = r.partitions_examined();
        assert!(!looked.is_empty());
        assert!(
            looked.iter().all(|&p| p == 217),
            "a poll after an append to 217 looked at {looked:?}"
        );
        assert!(r.poll(100).unwrap().is_empty());
        assert_eq!(r.partitions_examined(), &[] as &[u32]);
    }

    // A split looks at every open partition once (any may have moved),
    // and the polls after it are idle again.
    let kids = topic.split(5, SplitPlan::Even).unwrap();
    for r in [&mut latest, &mut earliest] {
        assert!(r.poll(100).unwrap().is_empty());
        assert!(r.poll(100).unwrap().is_empty());
        assert_eq!(r.partitions_examined(), &[] as &[u32], "idle after a split");
        assert_eq!(
            r.open_partitions().len(),
            301,
            "the children open, 5 drained"
        );
    }
    append_to(&topic, kids[1], 0);
    for r in [&mut latest, &mut earliest] {
        let got = r.poll(100).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].partition, kids[1]);
        assert!(r.partitions_examined().iter().all(|&p| p == kids[1]));
    }
    log.close().unwrap();
}

#[test]
fn a_reader_of_two_thousand_partitions_reads_every_record_once_in_order() {
    let n = wide();
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(n)).unwrap();
    let mut want: BTreeMap<u32, u64> = BTreeMap::new();
    for p in 0..n {
        for seq in 0..3 {
            append_to(&topic, p, seq);
        }
        want.insert(p, 3);
    }
    let mut earliest = topic.reader(StartAt::Earliest).unwrap();
    let mut latest = topic.reader(StartAt::Latest).unwrap();
    let first = drain(&mut earliest);
    assert_once_in_order(&first, &want);
    assert!(latest.poll(1000).unwrap().is_empty());
    assert!(latest.partitions_examined().is_empty());

    // A second round on every seventh partition: both readers get exactly
    // it, the one from `Latest` nothing before it.
    let mut second: BTreeMap<u32, u64> = BTreeMap::new();
    for p in (0..n).step_by(7) {
        append_to(&topic, p, 3);
        append_to(&topic, p, 4);
        *want.get_mut(&p).unwrap() = 5;
        second.insert(p, 2);
    }
    let mut all = first;
    all.extend(drain(&mut earliest));
    assert_once_in_order(&all, &want);
    let late = drain(&mut latest);
    assert_eq!(late.len() as u64, second.values().sum::<u64>());
    for r in &late {
        let (p, seq) = decode(r);
        assert!(
            second.contains_key(&p) && (3..5).contains(&seq),
            "{p}:{seq}"
        );
    }
    let distinct: BTreeSet<(u32, u64)> = late.iter().map(decode).collect();
    assert_eq!(distinct.len(), late.len(), "no record twice");
    log.close().unwrap();
}

#[test]
fn appends_racing_polls_are_never_missed_nor_delayed_past_the_next_poll() {
    const PARTS: u32 = 64;
    const ROUNDS: u64 = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(PARTS)).unwrap();
    let mut reader = topic.reader(StartAt::Latest).unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let (t2, a2) = (topic.clone(), acked.clone());
    let producer = std::thread::spawn(move || {
        let mut per: BTreeMap<u32, u64> = BTreeMap::new();
        for i in 0..ROUNDS {
            let p = ((i * 13) % u64::from(PARTS)) as u32;
            let seq = per.entry(p).or_insert(0);
            append_to(&t2, p, *seq);
            *seq += 1;
            a2.fetch_add(1, Ordering::SeqCst);
        }
        per
    });
    let mut got: Vec<OwnedRecord> = Vec::new();
    while (got.len() as u64) < ROUNDS {
        let before = acked.load(Ordering::SeqCst);
        got.extend(reader.poll(usize::MAX).unwrap());
        assert!(
            got.len() as u64 >= before,
            "{before} appends had returned before the poll, it brought the total to {}",
            got.len()
        );
    }
    let per = producer.join().unwrap();
    assert_once_in_order(&got, &per);
    assert!(reader.poll(100).unwrap().is_empty());
    log.close().unwrap();
}

#[test]
fn poll_wait_is_woken_by_an_append_to_any_of_many_partitions() {
    const PARTS: u32 = 64;
    const RECORDS: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(PARTS)).unwrap();
    let mut reader = topic.reader(StartAt::Latest).unwrap();
    let t2 = topic.clone();
    let producer = std::thread::spawn(move || {
        let mut per: BTreeMap<u32, u64> = BTreeMap::new();
        for i in 0..RECORDS {
            let p = ((i * 29 + 3) % u64::from(PARTS)) as u32;
            let seq = per.entry(p).or_insert(0);
            append_to(&t2, p, *seq);
            *seq += 1;
            // Often enough the reader is asleep when the append lands.
            if i % 3 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        per
    });
    let mut got = Vec::new();
    let mut timed_out = 0;
    while (got.len() as u64) < RECORDS {
        // Long enough that a wake-up slept through shows as a timeout.
        let batch = reader.poll_wait(1000, Duration::from_secs(20)).unwrap();
        if batch.is_empty() {
            timed_out += 1;
            break;
        }
        got.extend(batch);
    }
    let per = producer.join().unwrap();
    assert_eq!(timed_out, 0, "poll_wait slept through an append");
    assert_once_in_order(&got, &per);
    log.close().unwrap();
}

#[test]
fn a_cut_from_latest_fingerprints_the_last_record_of_every_partition_that_has_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(40)).unwrap();
    // Partitions 0..30 hold records, 30..40 none.
    for p in 0..30 {
        append_to(&topic, p, 0);
        append_to(&topic, p, 1);
    }
    let mut r = topic.reader(StartAt::Latest).unwrap();
    assert!(r.poll(10).unwrap().is_empty());
    let cut = r.cut();
    assert_eq!(cut.positions.len(), 40);
    let fingerprinted: BTreeSet<u32> = cut.last_records.keys().copied().collect();
    assert_eq!(
        fingerprinted,
        (0..30).collect(),
        "one per partition with a record"
    );
    assert_eq!(r.cut(), cut, "a second cut is the same");

    // A record read moves the position and its fingerprint with it.
    append_to(&topic, 3, 2);
    append_to(&topic, 35, 0);
    assert_eq!(r.poll(10).unwrap().len(), 2);
    let moved = r.cut();
    assert_ne!(moved.last_records[&3], cut.last_records[&3]);
    assert!(moved.last_records.contains_key(&35));
    assert_eq!(moved.last_records[&4], cut.last_records[&4]);

    // Both cuts resume exactly: the first gives the two records again.
    let mut again = topic.reader(StartAt::Cut(cut)).unwrap();
    let got: BTreeSet<(u32, u64)> = drain(&mut again).iter().map(decode).collect();
    assert_eq!(got, BTreeSet::from([(3, 2), (35, 0)]));
    let mut after = topic.reader(StartAt::Cut(moved)).unwrap();
    assert!(drain(&mut after).is_empty());
    log.close().unwrap();
}
