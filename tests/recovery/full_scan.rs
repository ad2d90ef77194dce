//! Regression: a full scan (`LogOptions::full_scan`, as `verify` does) of a
//! log whose rolled segments end before their capacity must not report the
//! never-written slack after the seal as corruption.

use fissionlog::{Log, LogOptions, NewRecord, TopicConfig};

#[test]
fn full_scan_accepts_slack_after_sealed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                segment_bytes: 16 << 10,
                ..Default::default()
            },
        )
        .unwrap();
    let value = [7u8; 100];
    let recs = [NewRecord {
        key: None,
        value: &value,
        timestamp: None,
    }; 10];
    let part = topic.partition(0).unwrap();
    for _ in 0..5 {
        topic.append_to(0, &recs).unwrap();
        part.roll_now().unwrap();
    }
    topic.append_to(0, &recs).unwrap();
    drop((topic, part));
    log.close().unwrap();

    let log = Log::open(
        dir.path(),
        LogOptions {
            full_scan: true,
            ..Default::default()
        },
    )
    .unwrap();
    let topic = log.topic("t").unwrap();
    assert_eq!(topic.partition(0).unwrap().end_offset(), 60);
    let mut off = 0;
    let mut n = 0;
    while off < 60 {
        let rb = topic.read(0, off, 1 << 20).unwrap();
        n += rb.iter().count();
        off = rb.next_offset();
    }
    assert_eq!(n, 60);
    drop(topic);
    log.close().unwrap();
    let (_report, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}
