//! `Topic::append_batch` is all-or-nothing per partition and says exactly
//! which records landed when it fails part-way.

use crate::common;
use common::log::quiet;
use std::sync::Arc;

use fissionlog::IoOp;
use fissionlog::{Appended, Error, Log, NewRecord, Topic, TopicConfig};

fn config() -> TopicConfig {
    TopicConfig {
        partitions: 2,
        segment_bytes: 4096,
        max_record_bytes: 1024,
        ..TopicConfig::default()
    }
}

/// A key routed to partition `p`.
fn key_for(t: &Topic, p: u32) -> Vec<u8> {
    (0u32..)
        .map(|i| format!("key-{i}").into_bytes())
        .find(|k| t.route(k) == p)
        .unwrap()
}

/// A record too large for the topic, routed to a
/// partition written after another one, fails the whole batch before any
/// record is written (a retrying caller gets no duplicates).
#[test]
fn append_batch_validates_every_group_before_writing_any() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log.create_topic("t", config()).unwrap();
    let (k0, k1) = (key_for(&t, 0), key_for(&t, 1));
    let big = vec![1u8; 2000];
    let batch = [
        NewRecord {
            key: Some(&k0),
            value: b"small",
            timestamp: None,
        },
        NewRecord {
            key: Some(&k1),
            value: &big,
            timestamp: None,
        },
    ];
    assert!(matches!(
        t.append_batch(&batch),
        Err(Error::RecordTooLarge { .. })
    ));
    for p in 0..2 {
        assert_eq!(
            t.partition(p).unwrap().end_offset(),
            0,
            "partition {p} got records of a refused batch"
        );
    }
}

/// When a later partition's group fails with an I/O
/// error after an earlier group was written, the error names exactly the
/// records that landed and where.
#[test]
fn append_batch_reports_which_records_landed_when_a_later_group_fails() {
    let dir = tempfile::tempdir().unwrap();
    // Fails segment creation in partition 1's directory while armed.
    let hook = Arc::new(
        common::faults::Fail::new(IoOp::CreateSegment, libc::EIO)
            .in_path("/p1/")
            .disarmed(),
    );
    let log = Log::open_with_hook(dir.path(), quiet(), hook.clone()).unwrap();
    let t = log.create_topic("t", config()).unwrap();
    let (k0, k1) = (key_for(&t, 0), key_for(&t, 1));
    // Fill partition 1's segment so its next batch rolls.
    let filler = vec![2u8; 900];
    for _ in 0..4 {
        t.append_to(
            1,
            &[NewRecord {
                key: None,
                value: &filler,
                timestamp: None,
            }],
        )
        .unwrap();
    }
    let before1 = t.partition(1).unwrap().end_offset();
    hook.arm();
    let batch = [
        NewRecord {
            key: Some(&k1),
            value: &filler,
            timestamp: None,
        },
        NewRecord {
            key: Some(&k0),
            value: b"lands",
            timestamp: None,
        },
        NewRecord {
            key: Some(&k0),
            value: b"lands too",
            timestamp: None,
        },
    ];
    match t.append_batch(&batch) {
        Err(Error::PartialBatch { landed, source }) => {
            assert!(matches!(*source, Error::Io { .. }), "{source}");
            assert_eq!(
                landed,
                vec![
                    None,
                    Some(Appended {
                        partition: 0,
                        offset: 0
                    }),
                    Some(Appended {
                        partition: 0,
                        offset: 1
                    }),
                ]
            );
        }
        other => panic!("expected a partial batch, got {other:?}"),
    }
    let got = t.read(0, 0, 4096).unwrap().to_owned_records().unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].value, b"lands");
    assert_eq!(t.partition(1).unwrap().end_offset(), before1);
}
