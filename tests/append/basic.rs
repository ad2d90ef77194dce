//! End-to-end basics: create, append, read, reopen, splits, reader order.

use fissionlog::{Error, Log, LogOptions, NewRecord, SplitPlan, StartAt, SyncPolicy, TopicConfig};

fn small() -> TopicConfig {
    TopicConfig {
        partitions: 2,
        segment_bytes: 64 * 1024,
        ..Default::default()
    }
}

#[test]
fn append_read_reopen() {
    // The balancer off: a split it starts on a loaded machine would seal
    // partition 0 before its small segments roll.
    let quiet = || LogOptions {
        balancer: false,
        ..LogOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut written = Vec::new();
    {
        let log = Log::open(dir.path(), quiet()).unwrap();
        let t = log.create_topic("events", small()).unwrap();
        for i in 0..5000u32 {
            let key = format!("k{}", i % 17);
            let v = format!("value-{i}");
            let a = t.append(Some(key.as_bytes()), v.as_bytes()).unwrap();
            written.push((a, key, v));
        }
        log.close().unwrap();
    }
    let log = Log::open(dir.path(), quiet()).unwrap();
    let rep = log.recovery_report();
    assert!(rep.clean_shutdown, "{rep:?}");
    assert_eq!(rep.bytes_scanned, 0, "a clean open scans nothing");
    let t = log.topic("events").unwrap();
    for (a, key, v) in &written {
        let b = t.read(a.partition, a.offset, 1).unwrap();
        let r = b.iter().next().unwrap();
        assert_eq!(r.offset, a.offset);
        assert_eq!(r.key, Some(key.as_bytes()));
        assert_eq!(r.value, v.as_bytes());
    }
    assert!(
        t.partition(0).unwrap().segment_count() > 1,
        "small segments rolled"
    );
    assert!(matches!(
        log.create_topic("events", small()),
        Err(Error::TopicExists(_))
    ));
    assert!(matches!(
        Log::open(dir.path(), quiet()),
        Err(Error::Locked { .. })
    ));
}

#[test]
fn split_keeps_key_order_for_readers() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    let t = log
        .create_topic(
            "s",
            TopicConfig {
                partitions: 1,
                sync: SyncPolicy::Never,
                ..small()
            },
        )
        .unwrap();
    let mut n = 0u64;
    let mut put = |t: &fissionlog::Topic, rounds: u32| {
        for _ in 0..rounds {
            for k in 0..20 {
                let key = format!("key{k}");
                t.append_batch(&[NewRecord {
                    key: Some(key.as_bytes()),
                    value: &n.to_le_bytes(),
                    timestamp: None,
                }])
                .unwrap();
                n += 1;
            }
        }
    };
    put(&t, 50);
    let kids = t.split(0, SplitPlan::Even).unwrap();
    assert_eq!(kids.len(), 2);
    put(&t, 50);
    let k2 = t.split(kids[0], SplitPlan::LoadMedian).unwrap();
    put(&t, 50);
    t.merge(k2[1], kids[1]).unwrap();
    put(&t, 50);
    log.sync().unwrap();
    let mut r = t.reader(StartAt::Earliest).unwrap();
    let mut last: std::collections::HashMap<Vec<u8>, u64> = Default::default();
    let mut total = 0;
    loop {
        let got = r.poll(1000).unwrap();
        if got.is_empty() {
            break;
        }
        for rec in got {
            let seq = u64::from_le_bytes(rec.value[..8].try_into().unwrap());
            let k = rec.key.clone().unwrap();
            if let Some(prev) = last.insert(k, seq) {
                assert!(prev < seq, "per-key order");
            }
            total += 1;
        }
    }
    assert_eq!(total, n);
    drop(log);
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    let t = log.topic("s").unwrap();
    assert_eq!(
        t.active_partitions().len(),
        2,
        "children 3 and 5 (the merge of 4 and 2)"
    );
    let chain = t.key_chain(b"key3");
    assert!(
        chain.len() >= 2 && chain.last().unwrap().sealed_at.is_none(),
        "{chain:?}"
    );
}
