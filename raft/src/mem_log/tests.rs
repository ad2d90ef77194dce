use std::sync::Arc;

use openraft::storage::RaftLogStorage;
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, EntryPayload, LogId, StorageError};

use super::*;
use crate::state_machine::{NoCommittedEnd, PartitionState, PartitionStateMachine};
use crate::types::RecordIn;

struct Builder;

impl StoreBuilder<TypeConfig, MemLogStore, PartitionStateMachine, ()> for Builder {
    async fn build(
        &self,
    ) -> Result<((), MemLogStore, PartitionStateMachine), StorageError<NodeId>> {
        let sm = PartitionStateMachine::new(PartitionState::default(), Arc::new(NoCommittedEnd));
        Ok(((), MemLogStore::new(), sm))
    }
}

#[test]
fn openraft_storage_suite_passes_on_the_memory_log_and_the_partition_state_machine() {
    Suite::test_all(Builder).expect("openraft's storage suite");
}

fn data(index: u64, keys: &[&str]) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Command::Append {
            producer: None,
            records: keys
                .iter()
                .map(|k| RecordIn {
                    key: Some(k.as_bytes().to_vec()),
                    value: k.as_bytes().to_vec(),
                    timestamp_ms: 0,
                })
                .collect(),
        }),
    }
}

fn keys(records: &[ReadRecord]) -> Vec<(u64, String)> {
    records
        .iter()
        .map(|r| (r.offset, String::from_utf8_lossy(&r.value).into_owned()))
        .collect()
}

#[tokio::test]
async fn committed_reads_take_dense_offsets_skip_control_entries_and_stop_at_the_high_watermark() {
    let mut log = MemLogStore::new();
    let blank = Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
        payload: EntryPayload::Blank,
    };
    {
        let mut inner = log.guard().expect("fresh lock");
        inner.push(blank);
        inner.push(data(2, &["a", "b"]));
        inner.push(data(3, &["c"]));
        inner.push(data(4, &["d", "e"]));
    }
    let all = log.read_committed(0, 100, 4).expect("in memory");
    assert_eq!(
        keys(&all),
        vec![
            (0, "a".into()),
            (1, "b".into()),
            (2, "c".into()),
            (3, "d".into())
        ]
    );
    let from_two = log.read_committed(2, 1, 5).expect("in memory");
    assert_eq!(keys(&from_two), vec![(2, "c".into())]);

    log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 3))
        .await
        .expect("in memory");
    log.guard().expect("lock").push(data(3, &["x"]));
    let after = log.read_committed(0, 100, 3).expect("in memory");
    assert_eq!(
        keys(&after),
        vec![(0, "a".into()), (1, "b".into()), (2, "x".into())]
    );
}
