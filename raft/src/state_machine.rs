//! The state machine of a partition group: openraft's `RaftStateMachine`
//! over a small [`PartitionState`].
//!
//! The records themselves live in the partition's segment log, which *is*
//! the Raft log (docs/REPLICATION.md): applying an entry does not copy its
//! records anywhere. What applying keeps is small: the last applied log id,
//! the membership, the high watermark (the committed end offset), the
//! producer dedup table and the seal. `apply` is pure over that state; the
//! one effect is publishing the new high watermark through a
//! [`CommittedEndSink`], which the node wires to the partition's
//! `set_committed_end` so committed reads stop there.
//!
//! A snapshot is that state (with the log's start offset and index),
//! postcard-encoded behind a version byte: a few hundred bytes plus the
//! dedup table, never a copy of the records. The state is not persisted
//! on `apply`: on open openraft re-applies the log from the last snapshot
//! to the saved committed index.

mod state;

use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};

pub use state::{
    PartitionState, ProducerBatch, ProducerEntry, SealState, StampVerdict, DEFAULT_MAX_PRODUCERS,
    PRODUCER_BATCHES_KEPT,
};

use crate::types::{CommandResponse, Entry, NodeId, TypeConfig};

/// The snapshot format version this build writes and reads.
pub const SNAPSHOT_VERSION: u8 = 1;

/// Where the state machine publishes the high watermark after each apply:
/// the partition's `set_committed_end` in a node, a recorder in tests.
pub trait CommittedEndSink: Send + Sync + 'static {
    /// Records below `end_offset` are committed. Called with a value that
    /// never falls, except after a snapshot is installed.
    fn publish(&self, end_offset: u64);
}

/// A sink that drops the value (a group whose reads are not served here).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCommittedEnd;

impl CommittedEndSink for NoCommittedEnd {
    fn publish(&self, _end_offset: u64) {}
}

/// The bytes of a snapshot: a version byte, then the postcard encoding of
/// the [`PartitionState`].
pub fn encode_snapshot(state: &PartitionState) -> Result<Vec<u8>, postcard::Error> {
    encode_versioned(SNAPSHOT_VERSION, state)
}

/// Decodes the bytes [`encode_snapshot`] wrote; the reason for a refusal
/// as text for openraft's error.
pub fn decode_snapshot(bytes: &[u8]) -> Result<PartitionState, String> {
    decode_versioned(SNAPSHOT_VERSION, "snapshot", bytes)
}

/// A version byte, then `value`'s postcard: every snapshot this crate
/// writes (the partitions' and the controller's).
pub(crate) fn encode_versioned<T: serde::Serialize>(
    version: u8,
    value: &T,
) -> Result<Vec<u8>, postcard::Error> {
    let mut out = vec![version];
    postcard::to_io(value, &mut out)?;
    Ok(out)
}

/// Decodes what [`encode_versioned`] wrote with `version`, refusing any
/// other version and trailing bytes; `what` names it in the refusal.
pub(crate) fn decode_versioned<T: serde::de::DeserializeOwned>(
    version: u8,
    what: &str,
    bytes: &[u8],
) -> Result<T, String> {
    let Some((&found, body)) = bytes.split_first() else {
        return Err(format!("empty {what}"));
    };
    if found != version {
        return Err(format!(
            "{what} version {found}; this build reads {version}"
        ));
    }
    let (value, rest) = postcard::take_from_bytes::<T>(body).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the {what}'s state", rest.len()));
    }
    Ok(value)
}

/// A snapshot as built or installed: its metadata and bytes.
#[derive(Debug, Clone)]
pub(crate) struct StoredSnapshot {
    pub(crate) meta: SnapshotMeta<NodeId, BasicNode>,
    pub(crate) data: Vec<u8>,
}

#[derive(Default)]
struct Shared {
    state: PartitionState,
    current: Option<StoredSnapshot>,
    snapshots_built: u64,
}

/// A partition group's state machine. Cheap to clone: clones share the
/// state, so the node can read the dedup table and high watermark while
/// openraft applies.
#[derive(Clone)]
pub struct PartitionStateMachine {
    shared: Arc<Mutex<Shared>>,
    sink: Arc<dyn CommittedEndSink>,
}

impl std::fmt::Debug for PartitionStateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionStateMachine")
            .finish_non_exhaustive()
    }
}

impl PartitionStateMachine {
    /// An empty state machine publishing its high watermark to `sink`.
    pub fn new(state: PartitionState, sink: Arc<dyn CommittedEndSink>) -> PartitionStateMachine {
        PartitionStateMachine {
            shared: Arc::new(Mutex::new(Shared {
                state,
                ..Shared::default()
            })),
            sink,
        }
    }

    /// Runs `f` on the current state (for the leader's dedup pre-check and
    /// committed reads).
    pub fn with_state<T>(
        &self,
        f: impl FnOnce(&PartitionState) -> T,
    ) -> Result<T, StateMachineGone> {
        let shared = self.lock().map_err(|_| StateMachineGone)?;
        Ok(f(&shared.state))
    }

    // openraft's trait methods all return `StorageError`; this feeds them.
    #[allow(clippy::result_large_err)]
    fn lock(&self) -> Result<MutexGuard<'_, Shared>, StorageError<NodeId>> {
        // A poisoned lock means an apply panicked half-way: the state may
        // be inconsistent, so the group stops rather than go on with it.
        self.shared.lock().map_err(|_| {
            StorageIOError::new(
                ErrorSubject::StateMachine,
                ErrorVerb::Read,
                AnyError::error("state machine lock poisoned by a panic in apply"),
            )
            .into()
        })
    }
}

/// The state machine's lock was poisoned by a panic: the group is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the partition's state machine stopped after a panic")]
pub struct StateMachineGone;

impl RaftSnapshotBuilder<TypeConfig> for PartitionStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let mut shared = self.lock()?;
        let data = encode_snapshot(&shared.state)
            .map_err(|e| StorageIOError::write_snapshot(None, AnyError::new(&e)))?;
        shared.snapshots_built += 1;
        let last = shared.state.last_applied;
        let snapshot_id = match last {
            Some(id) => format!("{}-{}-{}", id.leader_id, id.index, shared.snapshots_built),
            None => format!("none-{}", shared.snapshots_built),
        };
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: shared.state.membership.clone(),
            snapshot_id,
        };
        shared.current = Some(StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        });
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for PartitionStateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>>
    {
        let shared = self.lock()?;
        Ok((shared.state.last_applied, shared.state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResponse>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let end = {
            let mut shared = self.lock()?;
            let answers: Vec<CommandResponse> = entries
                .into_iter()
                .map(|e| shared.state.apply(&e))
                .collect();
            let end = shared.state.committed_end;
            drop(shared);
            (answers, end)
        };
        self.sink.publish(end.1);
        Ok(end.0)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let refuse = |reason: String| -> StorageError<NodeId> {
            StorageIOError::read_snapshot(Some(meta.signature()), AnyError::error(reason)).into()
        };
        let state = decode_snapshot(&data).map_err(refuse)?;
        if state.last_applied != meta.last_log_id {
            return Err(refuse(format!(
                "snapshot state ends at {:?} but its metadata says {:?}",
                state.last_applied, meta.last_log_id
            )));
        }
        let end = state.committed_end;
        {
            let mut shared = self.lock()?;
            shared.state = state;
            shared.current = Some(StoredSnapshot {
                meta: meta.clone(),
                data,
            });
        }
        self.sink.publish(end);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let shared = self.lock()?;
        Ok(shared.current.as_ref().map(|s| Snapshot {
            meta: s.meta.clone(),
            snapshot: Box::new(Cursor::new(s.data.clone())),
        }))
    }
}

#[cfg(test)]
mod tests;
