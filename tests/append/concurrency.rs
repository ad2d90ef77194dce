//! C6 under concurrency: readers while appending, rolling and retention
//! deleting segments never see torn or wrong bytes and never crash.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use fissionlog::{Error, Log, LogOptions, NewRecord, TopicConfig};

fn value(offset: u64) -> Vec<u8> {
    let len = (offset * 7919 % 300) as usize;
    (0..len).map(|i| (offset as usize * 13 + i) as u8).collect()
}

fn check(offset: u64, v: &[u8]) {
    assert_eq!(v, value(offset).as_slice(), "record {offset} torn or wrong");
}

#[test]
fn readers_during_appends_rolls_and_retention() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(
        dir.path(),
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )
    .unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 8192,
                retention_bytes: Some(32 * 1024),
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let p = t.partition(0).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    // The readers are reading before the first append, and appends go on
    // until each has checked `MIN_SEEN` records while they ran: every run
    // checks reads that raced appends, rolls and retention, however late
    // the threads were scheduled.
    const READERS: usize = 2;
    const MIN_SEEN: u64 = 20_000;
    let start = Arc::new(Barrier::new(READERS + 1));
    let seen: Arc<[AtomicU64; READERS]> = Arc::default();
    let readers: Vec<_> = (0..READERS)
        .map(|me| {
            let (p, done, start, seen) = (p.clone(), done.clone(), start.clone(), seen.clone());
            std::thread::spawn(move || {
                start.wait();
                while !done.load(Ordering::Acquire) {
                    let mut next = p.start_offset();
                    while next < p.end_offset() {
                        match p.read(next, 4096) {
                            Ok(b) => {
                                let from = next;
                                for r in b.iter() {
                                    assert_eq!(r.offset, next);
                                    check(r.offset, r.value);
                                    next += 1;
                                }
                                seen[me].fetch_add(next - from, Ordering::Relaxed);
                            }
                            // Retention removed it meanwhile: start again.
                            Err(Error::Retained { end, .. }) => next = end.max(next),
                            Err(e) => panic!("read at {next}: {e}"),
                        }
                    }
                }
            })
        })
        .collect();
    start.wait();
    // A batch held across retention deleting its segment stays readable.
    let mut held = None;
    let limit = Instant::now() + Duration::from_secs(60);
    let enough = |r: usize| seen[r].load(Ordering::Relaxed) >= MIN_SEEN;
    let mut i = 0u64;
    while i < 6000 || !(0..READERS).all(enough) {
        assert!(
            !i.is_multiple_of(500) || Instant::now() < limit,
            "after {i} appends the readers checked {:?} records",
            seen.iter()
                .map(|n| n.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        );
        let v = value(i);
        let base = t
            .append_to(
                0,
                &[NewRecord {
                    key: None,
                    value: &v,
                    timestamp: None,
                }],
            )
            .unwrap();
        assert_eq!(base, i);
        if i == 10 {
            held = Some(p.read(0, 1 << 20).unwrap());
        }
        if i.is_multiple_of(500) {
            log.sync().unwrap();
            log.sync().unwrap();
            log.enforce_retention().unwrap();
        }
        i += 1;
    }
    log.sync().unwrap();
    log.sync().unwrap();
    log.enforce_retention().unwrap();
    done.store(true, Ordering::Release);
    for r in readers {
        r.join().unwrap();
    }
    assert!(p.start_offset() > 0, "retention deleted the first segment");
    let held = held.unwrap();
    let mut n = 0;
    for r in held.iter() {
        check(r.offset, r.value);
        n += 1;
    }
    assert!(n >= 11);
    let bytes = held.to_bytes();
    assert_eq!(bytes.len() as u64, held.len_bytes());
}
