use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::{CommittedLeaderId, EntryPayload, LogId, Membership};
use proptest::prelude::*;

use super::*;
use crate::types::{Command, ProducerStamp, RecordIn};

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn records(n: usize) -> Vec<RecordIn> {
    (0..n)
        .map(|i| RecordIn {
            key: Some(vec![i as u8]),
            value: vec![0; 3],
            timestamp_ms: 7,
        })
        .collect()
}

fn append(index: u64, stamp: Option<ProducerStamp>, n: usize) -> Entry {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Normal(Command::Append {
            producer: stamp,
            records: records(n),
        }),
    }
}

fn stamp(producer_id: u64, epoch: u32, first_sequence: u64) -> ProducerStamp {
    ProducerStamp {
        producer_id,
        epoch,
        first_sequence,
    }
}

#[derive(Default)]
struct Recorder(AtomicU64);

impl CommittedEndSink for Recorder {
    fn publish(&self, end_offset: u64) {
        self.0.store(end_offset, Ordering::SeqCst);
    }
}

#[test]
fn appends_take_dense_offsets_and_raise_the_high_watermark() {
    let mut s = PartitionState::default();
    assert_eq!(
        s.apply(&append(1, None, 3)),
        CommandResponse::Appended {
            base_offset: 0,
            count: 3
        }
    );
    assert_eq!(
        s.apply(&append(2, None, 2)),
        CommandResponse::Appended {
            base_offset: 3,
            count: 2
        }
    );
    assert_eq!(s.committed_end, 5);
    assert_eq!(s.last_applied, Some(log_id(1, 2)));
}

#[test]
fn control_entries_take_no_offset_and_membership_is_remembered() {
    let mut s = PartitionState::default();
    let m = Membership::new(vec![[1u64, 2, 3].into_iter().collect()], None);
    let blank = Entry {
        log_id: log_id(1, 1),
        payload: EntryPayload::Blank,
    };
    let member = Entry {
        log_id: log_id(1, 2),
        payload: EntryPayload::Membership(m.clone()),
    };
    assert_eq!(s.apply(&blank), CommandResponse::Control);
    assert_eq!(s.apply(&member), CommandResponse::Control);
    assert_eq!(s.next_offset, 0);
    assert_eq!(s.membership.membership(), &m);
    assert_eq!(s.membership.log_id(), &Some(log_id(1, 2)));
}

#[test]
fn a_retried_batch_is_answered_with_the_first_copys_offsets() {
    let mut s = PartitionState::default();
    s.apply(&append(1, Some(stamp(9, 0, 0)), 2));
    s.apply(&append(2, Some(stamp(9, 0, 2)), 3));
    assert_eq!(
        s.check_stamp(&stamp(9, 0, 0), 2),
        StampVerdict::Duplicate(ProducerBatch {
            first_sequence: 0,
            count: 2,
            base_offset: 0
        })
    );
    assert_eq!(
        s.apply(&append(3, Some(stamp(9, 0, 2)), 3)),
        CommandResponse::Duplicate {
            base_offset: 2,
            count: 3
        }
    );
    assert_eq!(s.producers[&9].next_sequence, 5);
}

#[test]
fn a_sequence_gap_is_refused_with_the_expected_sequence() {
    let mut s = PartitionState::default();
    s.apply(&append(1, Some(stamp(9, 0, 0)), 2));
    assert_eq!(
        s.apply(&append(2, Some(stamp(9, 0, 5)), 1)),
        CommandResponse::OutOfOrderSequence {
            producer_id: 9,
            expected: 2,
            received: 5
        }
    );
    assert_eq!(s.producers[&9].next_sequence, 2);
}

#[test]
fn a_batch_older_than_the_remembered_five_is_out_of_order() {
    let mut s = PartitionState::default();
    for i in 0..7u64 {
        s.apply(&append(i + 1, Some(stamp(9, 0, i)), 1));
    }
    assert_eq!(s.producers[&9].batches.len(), PRODUCER_BATCHES_KEPT);
    assert_eq!(
        s.check_stamp(&stamp(9, 0, 1), 1),
        StampVerdict::OutOfOrder { expected: 7 }
    );
    assert!(matches!(
        s.check_stamp(&stamp(9, 0, 2), 1),
        StampVerdict::Duplicate(_)
    ));
}

#[test]
fn an_older_epoch_is_fenced_and_a_newer_one_restarts_at_sequence_zero() {
    let mut s = PartitionState::default();
    s.apply(&append(1, Some(stamp(9, 3, 0)), 4));
    assert_eq!(
        s.apply(&append(2, Some(stamp(9, 2, 4)), 1)),
        CommandResponse::ProducerFenced {
            producer_id: 9,
            epoch: 2,
            current_epoch: 3
        }
    );
    assert_eq!(
        s.check_stamp(&stamp(9, 4, 1), 1),
        StampVerdict::OutOfOrder { expected: 0 }
    );
    assert!(matches!(
        s.apply(&append(3, Some(stamp(9, 4, 0)), 1)),
        CommandResponse::Appended { .. }
    ));
    assert_eq!(s.producers[&9].epoch, 4);
    assert_eq!(s.producers[&9].batches.len(), 1);
}

#[test]
fn the_producer_table_forgets_the_producer_with_the_oldest_batch_when_full() {
    let mut s = PartitionState::new(2);
    s.apply(&append(1, Some(stamp(1, 0, 0)), 1));
    s.apply(&append(2, Some(stamp(2, 0, 0)), 1));
    s.apply(&append(3, Some(stamp(1, 0, 1)), 1));
    s.apply(&append(4, Some(stamp(3, 0, 0)), 1));
    let kept: Vec<u64> = s.producers.keys().copied().collect();
    assert_eq!(kept, vec![1, 3]);
}

#[test]
fn after_a_seal_appends_are_answered_sealed_and_the_high_watermark_stays() {
    let mut s = PartitionState::default();
    s.apply(&append(1, None, 4));
    let seal = Entry {
        log_id: log_id(1, 2),
        payload: EntryPayload::Normal(Command::Seal { topology_epoch: 8 }),
    };
    assert_eq!(s.apply(&seal), CommandResponse::Sealed { end_offset: 4 });
    assert_eq!(
        s.apply(&append(3, None, 2)),
        CommandResponse::Sealed { end_offset: 4 }
    );
    assert_eq!(s.committed_end, 4);
    assert_eq!(
        s.next_offset, 6,
        "the refused batch still holds its offsets"
    );
    assert_eq!(
        s.sealed,
        Some(SealState {
            end_offset: 4,
            topology_epoch: 8
        })
    );
}

#[test]
fn a_snapshot_decodes_to_the_state_it_was_encoded_from() {
    let mut s = PartitionState::default();
    s.apply(&append(1, Some(stamp(5, 1, 0)), 3));
    s.log_start_offset = 2;
    s.log_start_index = 1;
    let bytes = encode_snapshot(&s).expect("encoding a state in memory");
    assert_eq!(decode_snapshot(&bytes), Ok(s));
}

#[test]
fn a_snapshot_of_another_version_empty_or_with_trailing_bytes_is_refused() {
    let s = PartitionState::default();
    let mut bytes = encode_snapshot(&s).expect("encoding a state in memory");
    assert!(decode_snapshot(&[]).is_err());
    let mut other = bytes.clone();
    other[0] = SNAPSHOT_VERSION + 1;
    assert!(decode_snapshot(&other).unwrap_err().contains("version"));
    bytes.push(0);
    assert!(decode_snapshot(&bytes).unwrap_err().contains("after"));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime")
}

#[test]
fn apply_publishes_the_high_watermark_and_an_installed_snapshot_restores_it() {
    runtime().block_on(async {
        let sink = Arc::new(Recorder::default());
        let mut leader = PartitionStateMachine::new(PartitionState::default(), sink.clone());
        let answers = leader
            .apply([append(1, Some(stamp(1, 0, 0)), 3), append(2, None, 2)])
            .await
            .expect("apply in memory");
        assert_eq!(answers.len(), 2);
        assert_eq!(sink.0.load(Ordering::SeqCst), 5);

        let snap = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build in memory");
        assert_eq!(snap.meta.last_log_id, Some(log_id(1, 2)));

        let follower_sink = Arc::new(Recorder::default());
        let mut follower =
            PartitionStateMachine::new(PartitionState::default(), follower_sink.clone());
        let mut data = follower
            .begin_receiving_snapshot()
            .await
            .expect("in memory");
        *data = *snap.snapshot;
        follower
            .install_snapshot(&snap.meta, data)
            .await
            .expect("install a snapshot built by the leader");
        assert_eq!(follower_sink.0.load(Ordering::SeqCst), 5);
        let dedup = follower
            .with_state(|s| s.check_stamp(&stamp(1, 0, 0), 3))
            .expect("not poisoned");
        assert!(matches!(dedup, StampVerdict::Duplicate(_)));
    });
}

#[test]
fn a_snapshot_whose_state_disagrees_with_its_metadata_is_refused() {
    runtime().block_on(async {
        let mut leader =
            PartitionStateMachine::new(PartitionState::default(), Arc::new(NoCommittedEnd));
        leader.apply([append(1, None, 1)]).await.expect("in memory");
        let snap = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("in memory");
        let mut meta = snap.meta.clone();
        meta.last_log_id = Some(log_id(1, 9));
        let mut follower =
            PartitionStateMachine::new(PartitionState::default(), Arc::new(NoCommittedEnd));
        assert!(follower
            .install_snapshot(&meta, snap.snapshot)
            .await
            .is_err());
        let applied = follower
            .with_state(|s| s.last_applied)
            .expect("not poisoned");
        assert_eq!(applied, None);
    });
}

/// One generated operation: an append (with or without a stamp drawn from
/// a small space, so retries, gaps and epochs collide) or a seal.
fn entry_strategy() -> impl Strategy<Value = Op> {
    (
        proptest::option::of((0u64..3, 0u32..2, 0u64..6)),
        1usize..4,
        proptest::bool::weighted(0.05),
    )
}

/// A generated entry: an optional (producer, epoch, sequence), a record
/// count, and whether it is a seal instead.
type Op = (Option<(u64, u32, u64)>, usize, bool);

fn entries_from(ops: &[Op]) -> Vec<Entry> {
    ops.iter()
        .enumerate()
        .map(|(i, (st, n, seal))| {
            let index = i as u64 + 1;
            if *seal {
                Entry {
                    log_id: log_id(1, index),
                    payload: EntryPayload::Normal(Command::Seal { topology_epoch: 1 }),
                }
            } else {
                append(index, st.map(|(p, e, q)| stamp(p, e, q)), *n)
            }
        })
        .collect()
}

proptest! {
    #[test]
    fn applying_the_same_entries_gives_the_same_state_and_answers(
        ops in proptest::collection::vec(entry_strategy(), 0..60),
        cut in 0usize..60,
    ) {
        let entries = entries_from(&ops);
        let mut a = PartitionState::new(2);
        let mut b = PartitionState::new(2);
        let ra: Vec<_> = entries.iter().map(|e| a.apply(e)).collect();
        let rb: Vec<_> = entries.iter().map(|e| b.apply(e)).collect();
        prop_assert_eq!(&ra, &rb);
        prop_assert_eq!(&a, &b);

        // A replica that starts from a snapshot taken part-way and applies
        // the rest ends in the same state with the same answers.
        let cut = cut.min(entries.len());
        let mut c = PartitionState::new(2);
        for e in &entries[..cut] {
            c.apply(e);
        }
        let bytes = encode_snapshot(&c).expect("in memory");
        let mut d = decode_snapshot(&bytes).expect("own encoding");
        let rd: Vec<_> = entries[cut..].iter().map(|e| d.apply(e)).collect();
        prop_assert_eq!(&rd[..], &ra[cut..]);
        prop_assert_eq!(&d, &a);
        prop_assert!(a.committed_end <= a.next_offset);
    }
}
