//! The read path under rolls, retention, recovery and a closed `Log`
//! (issue 7, findings 3, 10, 12, 18).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fissionlog::{Error, Log, LogOptions, NewRecord, TopicConfig};

fn opts() -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    }
}

/// Issue 7, finding 3: a reader following the tail while the writer rolls
/// segments never gets `Error::Hole` for live data. The partition's segment
/// list used to be snapshotted before its end offset was loaded, so a roll
/// in between made a just-appended offset look like a gap after the old
/// active segment.
#[test]
fn tail_reader_during_rolls_never_sees_a_hole() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 4096,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let p = t.partition(0).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let appends: u64 = std::env::var("FISSIONLOG_TAIL_APPENDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6_000);
    // More readers than cores: a reader preempted between its two loads
    // lets the writer roll in between, which is the window this test hunts.
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let p = p.clone();
            let done = done.clone();
            std::thread::spawn(move || -> Result<u64, String> {
                let mut next = 0u64;
                loop {
                    let finished = done.load(Ordering::Acquire);
                    match p.read(next, 64 * 1024) {
                        Ok(b) => {
                            for r in b.iter() {
                                if r.offset != next {
                                    return Err(format!("expected {next}, got {}", r.offset));
                                }
                                next += 1;
                            }
                        }
                        Err(Error::OffsetOutOfRange { .. }) if finished => return Ok(next),
                        Err(Error::OffsetOutOfRange { .. }) => {}
                        Err(e) => return Err(format!("read at {next}: {e}")),
                    }
                }
            })
        })
        .collect();
    let v = [7u8; 40];
    for _ in 0..appends {
        t.append_to(
            0,
            &[NewRecord {
                key: None,
                value: &v,
                timestamp: None,
            }],
        )
        .unwrap();
    }
    done.store(true, Ordering::Release);
    for r in readers {
        assert_eq!(r.join().unwrap().unwrap(), appends);
    }
    assert!(p.segments().len() > 100, "the test rolled segments");
}
