//! The reader over a topic with a long history of splits and merges: every
//! record exactly once in per-key order, cuts that stay small (drained
//! partitions are left out once their children are open) and still resume
//! exactly (also after a reopen, also from cuts that list every drained
//! partition), `poll_wait` woken by any partition, and small polls that
//! return the same sequence as large ones.

use crate::common::log::no_balancer;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use fissionlog::{
    Cut, Log, NewRecord, OwnedRecord, ReadIsolation, Reader, SplitPlan, StartAt, SyncPolicy, Topic,
    TopicConfig,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEYS: u32 = 12;

fn config(partitions: u32) -> TopicConfig {
    let mut c = TopicConfig {
        partitions,
        segment_bytes: 16 << 10,
        ..TopicConfig::default()
    };
    c.balance.min_partitions = 1;
    c.balance.max_partitions = 16;
    c
}

fn key(k: u32) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

/// Value: key index and per-key sequence number, little-endian.
fn value(k: u32, seq: u64) -> Vec<u8> {
    let mut v = k.to_le_bytes().to_vec();
    v.extend_from_slice(&seq.to_le_bytes());
    v
}

fn decode(r: &OwnedRecord) -> (u32, u64) {
    let k = u32::from_le_bytes(r.value[..4].try_into().unwrap());
    let seq = u64::from_le_bytes(r.value[4..12].try_into().unwrap());
    assert_eq!(r.key.as_deref(), Some(key(k).as_slice()));
    (k, seq)
}

/// Appends records and changes the topology: `changes` splits and merges
/// chosen by `seed`, with a few records (single appends and batches) for
/// random keys between changes. `next` holds the next sequence number per
/// key (records appended so far) and is kept up to date.
fn history(topic: &Topic, changes: usize, seed: u64, next: &mut BTreeMap<u32, u64>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut append = |rng: &mut StdRng| {
        let n = rng.random_range(1..6);
        let recs: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
            .map(|_| {
                let k = rng.random_range(0..KEYS);
                let seq = next.entry(k).or_insert(0);
                *seq += 1;
                (key(k), value(k, *seq - 1))
            })
            .collect();
        if n == 1 {
            topic.append(Some(&recs[0].0), &recs[0].1).unwrap();
        } else {
            let batch: Vec<NewRecord<'_>> = recs
                .iter()
                .map(|(k, v)| NewRecord {
                    key: Some(k),
                    value: v,
                    timestamp: None,
                })
                .collect();
            topic.append_batch(&batch).unwrap();
        }
    };
    for _ in 0..changes {
        for _ in 0..rng.random_range(1..4) {
            append(&mut rng);
        }
        let mut active: Vec<(u64, u32)> = topic
            .partitions()
            .iter()
            .filter(|p| p.sealed_at.is_none())
            .map(|p| (p.start, p.id))
            .collect();
        active.sort_unstable();
        if active.len() > 1 && (active.len() >= 6 || rng.random_bool(0.5)) {
            let i = rng.random_range(0..active.len() - 1);
            topic.merge(active[i].1, active[i + 1].1).unwrap();
        } else {
            let i = rng.random_range(0..active.len());
            topic.split(active[i].1, SplitPlan::Even).unwrap();
        }
    }
    append(&mut rng);
}

/// Checks records in reader order against `next` (the next sequence
/// expected per key): gaps, duplicates and reordering all fail.
fn check_order(records: &[OwnedRecord], next: &mut BTreeMap<u32, u64>, ctx: &str) {
    for r in records {
        let (k, seq) = decode(r);
        let want = next.entry(k).or_insert(0);
        assert_eq!(
            seq, *want,
            "{ctx}: key {k} at {}@{}: got {seq}, expected {want}",
            r.partition, r.offset
        );
        *want += 1;
    }
}

fn drain(r: &mut Reader, max: usize) -> Vec<OwnedRecord> {
    let mut out = Vec::new();
    loop {
        let got = r.poll(max).unwrap();
        if got.is_empty() {
            return out;
        }
        assert!(got.len() <= max);
        out.extend(got);
    }
}

fn active(topic: &Topic) -> BTreeSet<u32> {
    topic.active_partitions().into_iter().collect()
}

#[test]
fn poll_after_many_splits_and_merges_returns_every_record_once_in_key_order() {
    for seed in [1, 2, 3] {
        let ctx = format!("seed {seed}");
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), no_balancer()).unwrap();
        let topic = log.create_topic("t", config(2)).unwrap();
        // A reader that follows along while the history is made, and one
        // that starts after it.
        let mut live = topic.reader(StartAt::Earliest).unwrap();
        let mut live_next = BTreeMap::new();
        let mut appended = BTreeMap::new();
        for round in 0..4 {
            history(&topic, 15, seed * 100 + round, &mut appended);
            check_order(&live.poll(50).unwrap(), &mut live_next, &ctx);
        }
        let nodes = topic.partitions().len();
        assert!(nodes > 60, "{ctx}: only {nodes} partitions made");
        check_order(&drain(&mut live, 1000), &mut live_next, &ctx);
        assert_eq!(live_next, appended, "{ctx}: the live reader saw everything");
        let mut r = topic.reader(StartAt::Earliest).unwrap();
        let all = drain(&mut r, 1000);
        let mut next = BTreeMap::new();
        check_order(&all, &mut next, &ctx);
        assert_eq!(next, appended, "{ctx}: every record");
        // Caught up: reading the active partitions, nothing else listed.
        for cut in [r.cut(), live.cut()] {
            let open: BTreeSet<u32> = cut.positions.keys().copied().collect();
            assert_eq!(open, active(&topic), "{ctx}");
            assert!(cut.drained.is_empty(), "{ctx}: {:?}", cut.drained);
        }
        drop(topic);
        log.close().unwrap();
    }
}

#[test]
fn cut_taken_after_pruning_resumes_exactly_after_serialization_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(2)).unwrap();
    let mut appended = BTreeMap::new();
    history(&topic, 50, 7, &mut appended);
    let total: u64 = appended.values().sum();
    let nodes = topic.partitions().len();
    assert!(nodes > 50);
    // The whole sequence, as one reader returns it.
    let all = drain(&mut topic.reader(StartAt::Earliest).unwrap(), 1000);
    assert_eq!(all.len() as u64, total);
    check_order(&all, &mut BTreeMap::new(), "full read");
    // Cuts at several points of the sequence, each taken after reading
    // that far in steps of varying size.
    let points = [
        1,
        17,
        all.len() / 3,
        all.len() / 2,
        all.len() - 5,
        all.len(),
    ];
    let mut cuts = Vec::new();
    for &at in &points {
        let mut r = topic.reader(StartAt::Earliest).unwrap();
        let mut read = Vec::new();
        let mut step = 1;
        while read.len() < at {
            read.extend(r.poll(step.min(at - read.len())).unwrap());
            step = step % 13 + 1;
        }
        assert_eq!(read, all[..at], "reading up to {at}");
        let cut = r.cut();
        // Pruned: nothing listed that is an ancestor of an open partition.
        // Only open partitions and merge parents waiting for their sibling.
        assert!(
            cut.positions.len() + cut.drained.len() <= 2 * active(&topic).len() + 2,
            "cut at {at} lists {} open and {} drained of {nodes} partitions",
            cut.positions.len(),
            cut.drained.len()
        );
        assert!(cut.to_bytes().len() < 1024, "{}", cut.to_bytes().len());
        cuts.push((at, cut.to_bytes()));
    }
    let resume_all = |t: &Topic, ctx: &str| {
        for (at, bytes) in &cuts {
            let cut = Cut::from_bytes(bytes).unwrap();
            let mut r = t.reader(StartAt::Cut(cut)).unwrap();
            let rest = drain(&mut r, 64);
            assert_eq!(rest, all[*at..], "{ctx}: resumed from the cut at {at}");
        }
    };
    resume_all(&topic, "same log");
    drop(topic);
    log.close().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.topic("t").unwrap();
    resume_all(&topic, "after reopen");
    drop(topic);
    log.abandon();
    // After a reopen that recovers (no clean close) as well.
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.topic("t").unwrap();
    resume_all(&topic, "after an unclean reopen");
    drop(topic);
    log.close().unwrap();
}

#[test]
fn a_merge_parent_stays_in_the_cut_until_the_other_parent_is_drained() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(2)).unwrap();
    let put = |p: u32, v: &[u8]| {
        topic
            .append_to(
                p,
                &[NewRecord {
                    key: None,
                    value: v,
                    timestamp: None,
                }],
            )
            .unwrap();
    };
    for i in 0..3u8 {
        put(0, &[0, i]);
        put(1, &[1, i]);
    }
    let child = topic.merge(0, 1).unwrap();
    put(child, &[2, 0]);
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    // Partition 0 whole, then one record of partition 1.
    assert_eq!(r.poll(3).unwrap().len(), 3);
    let got = r.poll(1).unwrap();
    assert_eq!((got[0].partition, got[0].offset), (1, 0));
    let cut = r.cut();
    assert_eq!(cut.drained, BTreeSet::from([0]));
    assert_eq!(cut.positions, BTreeMap::from([(1, 1)]));
    // Resumed: the rest of 1, then the child; and the merge parents leave
    // the cut once the child is open.
    let mut resumed = topic.reader(StartAt::Cut(cut.clone())).unwrap();
    let rest = drain(&mut resumed, 100);
    let at: Vec<(u32, u64)> = rest.iter().map(|r| (r.partition, r.offset)).collect();
    assert_eq!(at, [(1, 1), (1, 2), (child, 0)]);
    let done = resumed.cut();
    assert!(done.drained.is_empty(), "{:?}", done.drained);
    assert_eq!(done.positions, BTreeMap::from([(child, 1)]));
    drop(topic);
    log.close().unwrap();
}

#[test]
fn cuts_listing_every_drained_partition_still_resume_and_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(1)).unwrap();
    // 0 splits into 1, 2; they merge into 3; 3 splits into 4, 5.
    topic.append(Some(b"a"), b"0").unwrap();
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    topic.append(Some(b"a"), b"1").unwrap();
    let m = topic.merge(kids[0], kids[1]).unwrap();
    topic.append(Some(b"a"), b"2").unwrap();
    let last = topic.split(m, SplitPlan::Even).unwrap();
    topic.append(Some(b"a"), b"3").unwrap();
    let a_at = topic.route(b"a");
    // What an older reader wrote after reading "0".."2" and nothing of
    // the last children: every drained partition listed, no fingerprints.
    let json = format!(
        r#"{{"topic_id":{},"positions":{{"{}":0,"{}":0}},"drained":[0,{},{},{}]}}"#,
        topic.id(),
        last[0],
        last[1],
        kids[0],
        kids[1],
        m
    );
    let old = Cut::from_bytes(json.as_bytes()).unwrap();
    assert_eq!(old.drained.len(), 4);
    let mut r = topic.reader(StartAt::Cut(old)).unwrap();
    assert!(r.cut().drained.is_empty(), "{:?}", r.cut().drained);
    let rest = drain(&mut r, 10);
    assert_eq!(rest.len(), 1);
    assert_eq!(
        (rest[0].partition, rest[0].value.as_slice()),
        (a_at, &b"3"[..])
    );
    // An older cut taken right when 0 was drained, before its children
    // were opened: they open on resume.
    let json = format!(
        r#"{{"topic_id":{},"positions":{{}},"drained":[0]}}"#,
        topic.id()
    );
    let mut r = topic
        .reader(StartAt::Cut(Cut::from_bytes(json.as_bytes()).unwrap()))
        .unwrap();
    let values: Vec<Vec<u8>> = drain(&mut r, 10).into_iter().map(|r| r.value).collect();
    assert_eq!(values, [b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]);
    drop(topic);
    log.close().unwrap();
}

#[test]
fn poll_one_at_a_time_returns_the_same_sequence_as_poll_thousand() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(3)).unwrap();
    // Batches of many records (a small poll must not skip or repeat the
    // rest of a batch), segment rolls (16 KiB segments) and a history.
    let big = vec![9u8; 300];
    for i in 0..40u32 {
        let recs: Vec<NewRecord<'_>> = (0..25)
            .map(|_| NewRecord {
                key: None,
                value: &big,
                timestamp: Some(i64::from(i)),
            })
            .collect();
        topic.append_batch(&recs).unwrap();
    }
    let mut appended = BTreeMap::new();
    history(&topic, 20, 11, &mut appended);
    let total = 1000 + appended.values().sum::<u64>() as usize;
    let seq = |max: usize| -> Vec<(u32, u64)> {
        let mut r = topic.reader(StartAt::Earliest).unwrap();
        drain(&mut r, max)
            .iter()
            .map(|r| (r.partition, r.offset))
            .collect()
    };
    let large = seq(1000);
    assert_eq!(large.len(), total);
    let distinct: BTreeSet<&(u32, u64)> = large.iter().collect();
    assert_eq!(distinct.len(), total, "no record twice");
    assert_eq!(seq(1), large);
    assert_eq!(seq(7), large);
    drop(topic);
    log.close().unwrap();
}

/// Appends one record to `partition` from another thread after 50 ms (then
/// runs `after`), while the reader waits up to 5 s: it must return that
/// record well before its timeout.
fn assert_wakes(topic: &Topic, r: &mut Reader, partition: u32, after: impl FnOnce() + Send) {
    std::thread::scope(|s| {
        let t0 = Instant::now();
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            topic
                .append_to(
                    partition,
                    &[NewRecord {
                        key: None,
                        value: b"late",
                        timestamp: None,
                    }],
                )
                .unwrap();
            after();
        });
        let got = r.poll_wait(10, Duration::from_secs(5)).unwrap();
        let elapsed = t0.elapsed();
        assert_eq!(got.len(), 1, "after {elapsed:?}");
        assert_eq!(got[0].partition, partition);
        assert_eq!(got[0].value, b"late");
        assert!(elapsed < Duration::from_secs(2), "woke after {elapsed:?}");
    });
}

#[test]
fn poll_wait_wakes_for_data_on_a_non_first_partition() {
    for sync in [SyncPolicy::Never, SyncPolicy::Always] {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), no_balancer()).unwrap();
        let topic = log
            .create_topic("t", TopicConfig { sync, ..config(4) })
            .unwrap();
        let mut r = topic.reader(StartAt::Latest).unwrap();
        assert!(r.poll(10).unwrap().is_empty());
        assert_wakes(&topic, &mut r, 3, || {});
        assert_wakes(&topic, &mut r, 2, || {});
        drop(topic);
        log.close().unwrap();
    }
}

#[test]
fn durable_poll_wait_wakes_on_the_sync_of_a_non_first_partition() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(3)).unwrap();
    let mut r = topic.reader(StartAt::Latest).unwrap();
    r.set_isolation(ReadIsolation::Durable);
    // The append alone shows nothing to a durable reader (it wakes, finds
    // nothing durable, sleeps again): the sync 50 ms later does.
    let syncing = AtomicBool::new(false);
    std::thread::scope(|s| {
        let t0 = Instant::now();
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            topic
                .append_to(
                    2,
                    &[NewRecord {
                        key: None,
                        value: b"late",
                        timestamp: None,
                    }],
                )
                .unwrap();
            std::thread::sleep(Duration::from_millis(50));
            syncing.store(true, Ordering::SeqCst);
            topic.sync().unwrap();
        });
        let got = r.poll_wait(10, Duration::from_secs(5)).unwrap();
        let elapsed = t0.elapsed();
        assert!(syncing.load(Ordering::SeqCst), "returned before the sync");
        assert_eq!(got.len(), 1, "after {elapsed:?}");
        assert_eq!(
            (got[0].partition, got[0].value.as_slice()),
            (2, &b"late"[..])
        );
        assert!(elapsed < Duration::from_secs(2), "woke after {elapsed:?}");
    });
    drop(topic);
    log.close().unwrap();
}

#[test]
fn poll_wait_wakes_when_a_split_opens_children() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(2)).unwrap();
    let mut r = topic.reader(StartAt::Latest).unwrap();
    let generation = topic.topology_generation();
    let kids = std::thread::scope(|s| {
        let t0 = Instant::now();
        let splitter = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            let kids = topic.split(1, SplitPlan::Even).unwrap();
            topic
                .append_to(
                    kids[1],
                    &[NewRecord {
                        key: None,
                        value: b"child",
                        timestamp: None,
                    }],
                )
                .unwrap();
            kids
        });
        let mut got = Vec::new();
        while got.is_empty() && t0.elapsed() < Duration::from_secs(5) {
            got = r.poll_wait(10, Duration::from_secs(5)).unwrap();
        }
        let elapsed = t0.elapsed();
        let kids = splitter.join().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].partition, kids[1]);
        assert!(elapsed < Duration::from_secs(2), "woke after {elapsed:?}");
        kids
    });
    assert!(topic.topology_generation() > generation);
    let mut open = r.open_partitions();
    open.sort_unstable();
    assert_eq!(open, [0, kids[0], kids[1]]);
    drop(topic);
    log.close().unwrap();
}

#[test]
fn topology_generation_moves_with_splits_and_merges_only() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(1)).unwrap();
    let g0 = topic.topology_generation();
    topic.append(Some(b"k"), b"v").unwrap();
    topic.sync().unwrap();
    let _ = topic.reader(StartAt::Earliest).unwrap().poll(10).unwrap();
    assert_eq!(topic.topology_generation(), g0, "appends and reads");
    let kids = topic.split(0, SplitPlan::Even).unwrap();
    let g1 = topic.topology_generation();
    assert!(g1 > g0);
    topic.merge(kids[0], kids[1]).unwrap();
    assert!(topic.topology_generation() > g1);
    drop(topic);
    log.close().unwrap();
}

#[test]
fn poll_wait_returns_closed_when_the_log_closes() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let topic = log.create_topic("t", config(2)).unwrap();
    let mut r = topic.reader(StartAt::Latest).unwrap();
    let t0 = Instant::now();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        log.close().unwrap();
    });
    let got = r.poll_wait(10, Duration::from_secs(5));
    let elapsed = t0.elapsed();
    closer.join().unwrap();
    assert!(
        matches!(got, Err(fissionlog::Error::Closed)),
        "{got:?} after {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(2), "woke after {elapsed:?}");
}
