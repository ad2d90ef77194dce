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

/// The index files under `dir`, by path.
fn index_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "idx") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// A clean close writes no index file for an active segment whose records
/// fit in one index interval (an open derives that index from its batch
/// headers), and one for a segment that holds more. A scanning open (what
/// `recover` runs) follows the same rule: it writes no file the close did
/// not, so it leaves the same files, and `verify` is clean after both.
#[test]
fn a_scanning_open_writes_the_index_files_a_clean_close_writes() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogOptions::default()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 4,
                index_interval_bytes: 1024,
                ..Default::default()
            },
        )
        .unwrap();
    let value = [7u8; 300];
    let rec = [NewRecord {
        key: None,
        value: &value,
        timestamp: None,
    }];
    // Partitions 0 and 1 hold one batch; partition 2 holds batches over
    // several index intervals; partition 3 holds nothing.
    topic.append_to(0, &rec).unwrap();
    topic.append_to(1, &rec).unwrap();
    for _ in 0..20 {
        topic.append_to(2, &rec).unwrap();
    }
    drop(topic);
    log.close().unwrap();
    let closed = index_files(dir.path());
    assert_eq!(
        closed.len(),
        1,
        "only the partition over several intervals has an index file: {closed:#?}"
    );
    assert!(closed[0].to_string_lossy().contains("/p2/"), "{closed:#?}");

    let log = Log::open(
        dir.path(),
        LogOptions {
            full_scan: true,
            ..Default::default()
        },
    )
    .unwrap();
    let topic = log.topic("t").unwrap();
    for (p, end) in [(0, 1), (1, 1), (2, 20), (3, 0)] {
        assert_eq!(
            topic.partition(p).unwrap().end_offset(),
            end,
            "partition {p}"
        );
    }
    assert_eq!(
        index_files(dir.path()),
        closed,
        "the scanning open wrote index files"
    );
    drop(topic);
    log.close().unwrap();
    assert_eq!(index_files(dir.path()), closed, "the close after the scan");
    let (_report, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}
