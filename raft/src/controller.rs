//! The controller group: one Raft group replicating the cluster's metadata
//! as commands (docs/REPLICATION.md, "The controller").
//!
//! - [`ControllerCommand`]: create a topic (configuration and replica
//!   placement of each partition), a topology change (a library
//!   [`fissionlog::TopologyCommand`]), a replica placement change, a
//!   consumer-group event with the proposer's `now_ms` in it. Each is one
//!   record of a [`crate::Command::Append`] entry ([`command`]).
//! - [`ControllerStateMachine`]: openraft's `RaftStateMachine`. Applying
//!   is deterministic; topology commands go to the node's local
//!   [`fissionlog::Log`] through `Topic::apply`; the outputs (placements,
//!   assignment changes, fenced members) are plain values, answered to
//!   the proposer in [`crate::CommandResponse::Controller`] and published
//!   to an [`OutputSink`] on every replica.
//! - [`placement::place_children`]: where a split's children go.
//! - [`producers`]: producer ids and epochs, one sequence for the
//!   cluster.
//!
//! The snapshot is the [`ControllerState`] behind a version byte
//! (postcard): placement, topic histories and routing keys, groups,
//! producer ids, the applied log id. A snapshot of another version is
//! refused with the versions in the reason, never read.
//! Installing one wipes the local topology and rebuilds it from the
//! topics' histories. Each snapshot built or installed is also saved in
//! the state machine's directory ([`snapshot_file`]): once openraft purged
//! the entries a snapshot covers, a restarted replica can only start from
//! that file, not by re-applying its log.

pub mod command;
pub mod groups;
pub mod placement;
pub mod producers;
pub mod snapshot_file;
pub mod state;

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use fissionlog::{Log, LogOptions};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend,
    RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};

pub use command::{
    AssignmentChange, CommandDecodeError, ControllerAnswer, ControllerCommand, ControllerResponse,
    GroupEvent, ReplicaPlacement, CONTROLLER_TOPIC,
};
pub use placement::{place_children, NodeLoad};
pub use producers::{ProducerIds, ProducerInitError};
pub use state::{ApplyError, ControllerState, PartitionMeta, TopicMeta};

use crate::state_machine::{decode_versioned, encode_versioned, StoredSnapshot};
use crate::types::{CommandResponse, Entry, NodeId, TypeConfig};

/// The snapshot format version this build writes and reads.
/// Version 2: topics carry the id their partition groups derive from.
/// Version 3: topics carry their routing hash key, and the state the
/// producer ids handed out ([`producers`]).
pub const CONTROLLER_SNAPSHOT_VERSION: u8 = 3;

/// Where a replica publishes what each applied controller command
/// produced: the node's reaction (create the children's groups, tell the
/// members) in a node, a recorder in tests. Called in log order, once per
/// applied command, on every replica.
pub trait OutputSink: Send + Sync + 'static {
    /// The command at Raft index `index` produced `response`.
    fn applied(&self, index: u64, response: &ControllerResponse);
}

/// A sink that drops everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoOutputs;

impl OutputSink for NoOutputs {
    fn applied(&self, _index: u64, _response: &ControllerResponse) {}
}

/// A snapshot's bytes: the version byte, then the state's postcard.
pub fn encode_controller_snapshot(state: &ControllerState) -> Result<Vec<u8>, postcard::Error> {
    encode_versioned(CONTROLLER_SNAPSHOT_VERSION, state)
}

/// Decodes what [`encode_controller_snapshot`] wrote; the reason for a
/// refusal as text (for openraft's error).
pub fn decode_controller_snapshot(bytes: &[u8]) -> Result<ControllerState, String> {
    decode_versioned(CONTROLLER_SNAPSHOT_VERSION, "controller snapshot", bytes)
}

struct Shared {
    state: ControllerState,
    /// The node's local topology: the controller's topics, as the
    /// library holds them.
    log: Option<Log>,
    /// Where the local topology lives (`DIR/topology`).
    dir: PathBuf,
    /// The saved snapshot (`DIR/snapshot`).
    file: snapshot_file::SnapshotFile,
    current: Option<StoredSnapshot>,
    snapshots_built: u64,
}

/// The controller group's state machine. Cheap to clone: clones share the
/// state, so the node reads placement and groups while openraft applies.
#[derive(Clone)]
pub struct ControllerStateMachine {
    shared: Arc<Mutex<Shared>>,
    sink: Arc<dyn OutputSink>,
}

impl std::fmt::Debug for ControllerStateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerStateMachine")
            .finish_non_exhaustive()
    }
}

/// The controller's state machine stopped: a panic while applying, or a
/// command that failed on this node's local log ([`ApplyError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the controller's state machine stopped")]
pub struct ControllerGone;

fn sm_error(verb: ErrorVerb, reason: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::new(
        ErrorSubject::StateMachine,
        verb,
        AnyError::error(reason.to_string()),
    )
    .into()
}

/// Removes `dir` and opens a fresh log there.
fn fresh_log(dir: &Path) -> Result<Log, crate::Error> {
    let io = |op, source| crate::Error::Io {
        op,
        path: dir.to_path_buf(),
        source,
    };
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove", e)),
    }
    Log::open(dir, LogOptions::default())
        .map_err(|e| io("open", std::io::Error::other(e.to_string())))
}

impl ControllerStateMachine {
    /// A state machine keeping its files in `dir`: the local topology in
    /// `dir/topology`, the last snapshot in `dir/snapshot`.
    ///
    /// The state starts from the saved snapshot (or empty), and openraft
    /// re-applies the controller's log from there, so the local topology
    /// is rebuilt with it: whatever `dir/topology` held is removed first
    /// and the snapshot's topics are replayed into it.
    pub fn open(dir: &Path, sink: Arc<dyn OutputSink>) -> crate::Result<ControllerStateMachine> {
        let topology_dir = dir.join("topology");
        let file = snapshot_file::SnapshotFile::new(dir);
        let saved = file.read()?;
        let log = fresh_log(&topology_dir)?;
        let (state, current) = match saved {
            Some((meta, data)) => {
                let state = decode_controller_snapshot(&data).map_err(|reason| {
                    crate::Error::CorruptSnapshot {
                        path: file.path().to_path_buf(),
                        reason,
                    }
                })?;
                state.rebuild(&log).map_err(|e| crate::Error::Io {
                    op: "rebuild",
                    path: topology_dir.clone(),
                    source: std::io::Error::other(e.to_string()),
                })?;
                (state, Some(StoredSnapshot { meta, data }))
            }
            None => (ControllerState::default(), None),
        };
        Ok(ControllerStateMachine {
            shared: Arc::new(Mutex::new(Shared {
                state,
                log: Some(log),
                dir: topology_dir,
                file,
                current,
                snapshots_built: 0,
            })),
            sink,
        })
    }

    /// Runs `f` on the current state.
    pub fn with_state<T>(
        &self,
        f: impl FnOnce(&ControllerState) -> T,
    ) -> Result<T, ControllerGone> {
        let shared = self.shared.lock().map_err(|_| ControllerGone)?;
        Ok(f(&shared.state))
    }

    /// Runs `f` on the node's local topology log.
    pub fn with_local_log<T>(&self, f: impl FnOnce(&Log) -> T) -> Result<T, ControllerGone> {
        let shared = self.shared.lock().map_err(|_| ControllerGone)?;
        shared.log.as_ref().map(f).ok_or(ControllerGone)
    }

    // openraft's trait methods all return `StorageError`; this feeds them.
    #[allow(clippy::result_large_err)]
    fn lock(&self) -> Result<MutexGuard<'_, Shared>, StorageError<NodeId>> {
        // Poisoned: an apply panicked half-way, the state (and the local
        // topology) may disagree with the other replicas.
        self.shared
            .lock()
            .map_err(|_| sm_error(ErrorVerb::Read, "controller state lock poisoned by a panic"))
    }
}

/// Applies one entry to `shared`; the controller's answer, if the entry
/// was a command.
#[allow(clippy::result_large_err)]
fn apply_entry(
    shared: &mut Shared,
    entry: &Entry,
) -> Result<Option<ControllerResponse>, StorageError<NodeId>> {
    shared.state.last_applied = Some(entry.log_id);
    let cmd = match &entry.payload {
        EntryPayload::Blank => return Ok(None),
        EntryPayload::Membership(m) => {
            shared.state.membership = StoredMembership::new(Some(entry.log_id), m.clone());
            return Ok(None);
        }
        EntryPayload::Normal(cmd) => cmd,
    };
    // The same bytes on every replica: a command that does not decode is
    // refused the same way everywhere.
    let cmd = match ControllerCommand::from_entry(cmd) {
        Ok(cmd) => cmd,
        Err(e) => {
            return Ok(Some(ControllerResponse::only(ControllerAnswer::Refused {
                reason: e.to_string(),
            })))
        }
    };
    let Some(log) = shared.log.as_ref() else {
        return Err(sm_error(ErrorVerb::Write, "the local topology log is gone"));
    };
    match shared.state.apply(log, &cmd) {
        Ok(response) => Ok(Some(response)),
        Err(e) => {
            // This replica can no longer apply what the others do: stop.
            shared.log = None;
            Err(sm_error(
                ErrorVerb::Write,
                format!("entry {}: {e}", entry.log_id.index),
            ))
        }
    }
}

impl RaftSnapshotBuilder<TypeConfig> for ControllerStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let mut shared = self.lock()?;
        let data = encode_controller_snapshot(&shared.state)
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
        // Saved before openraft hears of it: it may purge the log up to
        // the snapshot as soon as it does.
        shared.file.save(&meta, &data).map_err(|e| {
            StorageIOError::write_snapshot(Some(meta.signature()), AnyError::new(&e))
        })?;
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

impl RaftStateMachine<TypeConfig> for ControllerStateMachine {
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
        // Metadata changes are rare and each is a manifest commit on the
        // local log (an fsync): done inline, under the state's lock, so a
        // reader never sees the state and the local topology disagree.
        let mut shared = self.lock()?;
        let mut answers = Vec::new();
        for entry in entries {
            match apply_entry(&mut shared, &entry)? {
                Some(response) => {
                    self.sink.applied(entry.log_id.index, &response);
                    answers.push(CommandResponse::Controller(Box::new(response)));
                }
                None => answers.push(CommandResponse::Control),
            }
        }
        Ok(answers)
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
        let state = decode_controller_snapshot(&data).map_err(refuse)?;
        if state.last_applied != meta.last_log_id {
            return Err(refuse(format!(
                "snapshot state ends at {:?} but its metadata says {:?}",
                state.last_applied, meta.last_log_id
            )));
        }
        let mut shared = self.lock()?;
        shared.file.save(meta, &data).map_err(|e| {
            StorageIOError::write_snapshot(Some(meta.signature()), AnyError::new(&e))
        })?;
        // The local topology is rebuilt from the topics' histories on an
        // empty log: the one it had may be behind or ahead of the snapshot.
        if let Some(old) = shared.log.take() {
            old.close()
                .map_err(|e| sm_error(ErrorVerb::Write, format!("closing the local log: {e}")))?;
        }
        let log = fresh_log(&shared.dir).map_err(|e| sm_error(ErrorVerb::Write, e))?;
        state
            .rebuild(&log)
            .map_err(|e| sm_error(ErrorVerb::Write, e))?;
        shared.log = Some(log);
        shared.state = state;
        shared.current = Some(StoredSnapshot {
            meta: meta.clone(),
            data,
        });
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
