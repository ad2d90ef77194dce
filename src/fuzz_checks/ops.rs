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
    let cfg = ops_config(inp.u8());
    let log = Log::open(dir.path(), options(RecoveryMode::Strict, true)).expect("creating a log");
    let topic = log.create_topic("ops", cfg).expect("creating a topic");
    let mut run = OpsRun {
        dir: dir.path(),
        log,
        topic,
        model: HashMap::new(),
        per_key: BTreeMap::new(),
        seq: 0,
        reopens: 0,
    };
    let mut ops = 0;
    while !inp.done() && ops < 64 {
        ops += 1;
        let op = inp.u8();
        let arg = inp.u8();
        run = run.apply(op, arg);
    }
    check_ops_state(&run.topic, &run.model, &run.per_key);
    let OpsRun { log, topic, .. } = run;
    drop(topic);
    log.close().expect("close");
}

/// The topic of a run, from its first byte: 1-3 partitions, 4 or 8 KiB
/// segments, syncing every append or never.
fn ops_config(flags: u8) -> TopicConfig {
    TopicConfig {
        partitions: 1 + u32::from(flags % 3),
        segment_bytes: [4096u64, 8192][usize::from((flags >> 2) & 1)],
        index_interval_bytes: 512,
        sync: if flags & 8 != 0 {
            SyncPolicy::Always
        } else {
            SyncPolicy::Never
        },
        ..Default::default()
    }
}

/// A log under a run of operations, and what the model expects of it.
struct OpsRun<'a> {
    dir: &'a Path,
    log: Log,
    topic: Topic,
    /// Per partition, every record written to it, by offset.
    model: HashMap<u32, Vec<Written>>,
    /// Per key, its values in append order.
    per_key: BTreeMap<Vec<u8>, Vec<Vec<u8>>>,
    seq: u64,
    reopens: u32,
}

impl OpsRun<'_> {
    /// One operation: `op % 10` picks it (0-3 append, 4 sync, 5 roll,
    /// 6 split, 7 merge, 8 close and open, 9 kill and open; at most four
    /// reopens), `arg` its key, size or partition. Takes the run by value,
    /// since a reopen replaces its log.
    fn apply(mut self, op: u8, arg: u8) -> Self {
        match op % 10 {
            0..=3 => self.append(op, arg),
            4 => self.log.sync().expect("sync"),
            5 => {
                let active = self.topic.active_partitions();
                let pid = active[usize::from(arg) % active.len()];
                self.topic
                    .partition(pid)
                    .and_then(|p| p.roll_now())
                    .expect("roll");
            }
            6 => {
                let active = self.topic.active_partitions();
                let pid = active[usize::from(arg) % active.len()];
                match self.topic.split(pid, SplitPlan::Even) {
                    Ok(_) | Err(Error::Refused(_)) => {}
                    Err(e) => panic!("split: {e}"),
                }
            }
            7 => self.merge(arg),
            _ if self.reopens < 4 => return self.reopen(op % 10 == 8),
            _ => {}
        }
        self
    }

    fn append(&mut self, op: u8, arg: u8) {
        let key = vec![b'k', arg & 7];
        let value = value_for(self.seq, usize::from(op >> 4) * 40 + usize::from(arg >> 3));
        self.seq += 1;
        let at = self.topic.append(Some(&key), &value).expect("append");
        let m = self.model.entry(at.partition).or_default();
        assert_eq!(at.offset, m.len() as u64, "append offset is not dense");
        m.push((Some(key.clone()), value.clone(), 0));
        self.per_key.entry(key).or_default().push(value);
    }

    /// Merges two adjacent active partitions, the `arg`-th pair.
    fn merge(&mut self, arg: u8) {
        let mut active: Vec<(u64, u32)> = self
            .topic
            .partitions()
            .into_iter()
            .filter(|p| p.sealed_at.is_none())
            .map(|p| (p.start, p.id))
            .collect();
        active.sort_unstable();
        if active.len() >= 2 {
            let i = usize::from(arg) % (active.len() - 1);
            match self.topic.merge(active[i].1, active[i + 1].1) {
                Ok(_) | Err(Error::Refused(_)) => {}
                Err(e) => panic!("merge: {e}"),
            }
        }
    }

    /// Closes (`clean`) or abandons the log, opens it again and checks it
    /// against the model.
    fn reopen(self, clean: bool) -> Self {
        let OpsRun {
            dir,
            log,
            topic,
            model,
            per_key,
            seq,
            reopens,
        } = self;
        drop(topic);
        if clean {
            log.close().expect("close");
        } else {
            log.abandon();
        }
        let log = Log::open(dir, options(RecoveryMode::Strict, false)).unwrap_or_else(|e| {
            panic!("reopen after {}: {e}", if clean { "close" } else { "kill" })
        });
        let topic = log.topic("ops").expect("topic survives reopen");
        check_ops_state(&topic, &model, &per_key);
        OpsRun {
            dir,
            log,
            topic,
            model,
            per_key,
            seq,
            reopens: reopens + 1,
        }
    }
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
