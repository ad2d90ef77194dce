//! Arbitrary operation sequences against the in-memory model.

use super::*;

/// Arbitrary operations (keyed appends, sync, roll, split, merge, reopen,
/// kill-and-reopen) against an in-memory model: after every reopen each
/// record is present byte for byte at its offset (C1/C2 under kill
/// semantics: the page cache survives), and a reader from the earliest
/// position returns every key's records in append order (C4).
pub fn check_ops_model(data: &[u8]) {
    let mut inp = Input::new(data);
    let dir = ScratchDir::new("ops");
    let flags = inp.u8();
    let cfg = TopicConfig {
        partitions: 1 + u32::from(flags % 3),
        segment_bytes: [4096u64, 8192][usize::from((flags >> 2) & 1)],
        index_interval_bytes: 512,
        sync: if flags & 8 != 0 {
            SyncPolicy::Always
        } else {
            SyncPolicy::Never
        },
        ..Default::default()
    };
    let mut log =
        Log::open(dir.path(), options(RecoveryMode::Strict, true)).expect("creating a log");
    let mut topic = log.create_topic("ops", cfg).expect("creating a topic");
    let mut model: HashMap<u32, Vec<Written>> = HashMap::new();
    let mut per_key: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    let mut seq = 0u64;
    let mut reopens = 0;
    let mut ops = 0;
    while !inp.done() && ops < 64 {
        ops += 1;
        let op = inp.u8();
        let arg = inp.u8();
        match op % 10 {
            0..=3 => {
                let key = vec![b'k', arg & 7];
                let value = value_for(seq, usize::from(op >> 4) * 40 + usize::from(arg >> 3));
                seq += 1;
                let at = topic.append(Some(&key), &value).expect("append");
                let m = model.entry(at.partition).or_default();
                assert_eq!(at.offset, m.len() as u64, "append offset is not dense");
                m.push((Some(key.clone()), value.clone(), 0));
                per_key.entry(key).or_default().push(value);
            }
            4 => log.sync().expect("sync"),
            5 => {
                let active = topic.active_partitions();
                let pid = active[usize::from(arg) % active.len()];
                topic
                    .partition(pid)
                    .and_then(|p| p.roll_now())
                    .expect("roll");
            }
            6 => {
                let active = topic.active_partitions();
                let pid = active[usize::from(arg) % active.len()];
                match topic.split(pid, SplitPlan::Even) {
                    Ok(_) | Err(Error::Refused(_)) => {}
                    Err(e) => panic!("split: {e}"),
                }
            }
            7 => {
                let mut active: Vec<(u64, u32)> = topic
                    .partitions()
                    .into_iter()
                    .filter(|p| p.sealed_at.is_none())
                    .map(|p| (p.start, p.id))
                    .collect();
                active.sort_unstable();
                if active.len() >= 2 {
                    let i = usize::from(arg) % (active.len() - 1);
                    match topic.merge(active[i].1, active[i + 1].1) {
                        Ok(_) | Err(Error::Refused(_)) => {}
                        Err(e) => panic!("merge: {e}"),
                    }
                }
            }
            _ if reopens < 4 => {
                reopens += 1;
                drop(topic);
                if op % 10 == 8 {
                    log.close().expect("close");
                } else {
                    log.abandon();
                }
                log = Log::open(dir.path(), options(RecoveryMode::Strict, false)).unwrap_or_else(
                    |e| {
                        panic!(
                            "reopen after {}: {e}",
                            if op % 10 == 8 { "close" } else { "kill" }
                        )
                    },
                );
                topic = log.topic("ops").expect("topic survives reopen");
                check_ops_state(&topic, &model, &per_key);
            }
            _ => {}
        }
    }
    check_ops_state(&topic, &model, &per_key);
    drop(topic);
    log.close().expect("close");
}

pub(super) fn check_ops_state(
    topic: &Topic,
    model: &HashMap<u32, Vec<Written>>,
    per_key: &BTreeMap<Vec<u8>, Vec<Vec<u8>>>,
) {
    for (&pid, written) in model {
        let part = topic
            .partition(pid)
            .unwrap_or_else(|e| panic!("partition {pid} with data is gone: {e}"));
        assert_eq!(
            part.end_offset(),
            written.len() as u64,
            "partition {pid} end offset (C1)"
        );
        let mut at = 0;
        while at < written.len() as u64 {
            let b = topic
                .read(pid, at, 64 * 1024)
                .unwrap_or_else(|e| panic!("partition {pid} offset {at}: {e} (C1)"));
            for r in b.iter() {
                let w = &written[r.offset as usize];
                assert_eq!(
                    (r.key, r.value),
                    (w.0.as_deref(), &w.1[..]),
                    "partition {pid} offset {} differs (C2)",
                    r.offset
                );
            }
            assert!(b.next_offset() > at, "read made no progress");
            at = b.next_offset();
        }
    }
    let mut reader = topic.reader(StartAt::Earliest).expect("reader");
    let mut got: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    loop {
        let batch = reader.poll(1000).expect("reader poll");
        if batch.is_empty() {
            break;
        }
        for r in batch {
            got.entry(r.key.unwrap_or_default())
                .or_default()
                .push(r.value);
        }
    }
    assert_eq!(&got, per_key, "per-key order through the reader (C4)");
}
