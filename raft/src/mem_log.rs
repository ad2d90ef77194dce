//! An in-memory `RaftLogStorage`: a stepping stone, NOT replication.
//!
//! It keeps a group's vote and entries in memory only, so a node that
//! restarts has forgotten both: it must never rejoin a cluster with the
//! same id (it could vote twice in one term, and it has lost entries a
//! quorum counted). The node runs on the partition-backed log storage
//! (`log_store.rs`); this one is kept for two tests: the real state
//! machine's run of openraft's storage suite (whose cases include a log
//! with a hole, which a partition refuses), and the append-callback
//! test's control run, which must fail because this storage calls the
//! callback on write.
//!
//! It also answers committed reads the way the partition will: a data
//! entry's records take dense offsets, control entries take none.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader,
    StorageError, StorageIOError, Vote,
};

use crate::client::ReadRecord;
use crate::types::{Command, Entry, NodeId, TypeConfig};

#[derive(Debug, Default)]
struct Inner {
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
    entries: BTreeMap<u64, Entry>,
    /// base offset → index, for the data entries held.
    by_offset: BTreeMap<u64, u64>,
    /// The offset the next data entry's first record takes.
    next_offset: u64,
}

impl Inner {
    fn push(&mut self, e: Entry) {
        if let EntryPayload::Normal(Command::Append { records, .. }) = &e.payload {
            self.by_offset.insert(self.next_offset, e.log_id.index);
            self.next_offset += records.len() as u64;
        }
        self.entries.insert(e.log_id.index, e);
    }
}

/// A panic while the log was locked: its content is not trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the in-memory log stopped after a panic")]
pub struct LogPoisoned;

/// A group's log and vote, in memory. Cheap to clone: clones share them.
#[derive(Debug, Clone, Default)]
pub struct MemLogStore {
    inner: Arc<Mutex<Inner>>,
}

impl MemLogStore {
    /// An empty log.
    pub fn new() -> MemLogStore {
        MemLogStore::default()
    }

    fn guard(&self) -> Result<std::sync::MutexGuard<'_, Inner>, LogPoisoned> {
        self.inner.lock().map_err(|_| LogPoisoned)
    }

    // openraft's trait methods all return `StorageError`; this feeds them.
    #[allow(clippy::result_large_err)]
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StorageError<NodeId>> {
        self.guard().map_err(|e| {
            StorageIOError::new(ErrorSubject::Logs, ErrorVerb::Read, AnyError::new(&e)).into()
        })
    }

    /// Up to `max_records` records from `from_offset`, none at or past
    /// `committed_end`.
    pub fn read_committed(
        &self,
        from_offset: u64,
        max_records: usize,
        committed_end: u64,
    ) -> Result<Vec<ReadRecord>, LogPoisoned> {
        let inner = self.guard()?;
        let start_index = inner
            .by_offset
            .range(..=from_offset)
            .next_back()
            .map(|(_, i)| *i)
            .or_else(|| inner.by_offset.values().next().copied());
        let Some(start_index) = start_index else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let bases: Vec<(u64, u64)> = inner
            .by_offset
            .iter()
            .filter(|(_, i)| **i >= start_index)
            .map(|(o, i)| (*o, *i))
            .collect();
        for (base, index) in bases {
            let Some(EntryPayload::Normal(Command::Append { records, .. })) =
                inner.entries.get(&index).map(|e| &e.payload)
            else {
                continue;
            };
            for (i, r) in records.iter().enumerate() {
                let offset = base + i as u64;
                if offset >= committed_end || out.len() >= max_records {
                    return Ok(out);
                }
                if offset >= from_offset {
                    out.push(ReadRecord {
                        offset,
                        key: r.key.clone(),
                        value: r.value.clone(),
                        timestamp_ms: r.timestamp_ms,
                    });
                }
            }
        }
        Ok(out)
    }
}

impl RaftLogReader<TypeConfig> for MemLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        let inner = self.lock()?;
        let start = match range.start_bound() {
            Bound::Included(s) => Bound::Included(*s),
            Bound::Excluded(s) => Bound::Excluded(*s),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(s) => Bound::Included(*s),
            Bound::Excluded(s) => Bound::Excluded(*s),
            Bound::Unbounded => Bound::Unbounded,
        };
        Ok(inner
            .entries
            .range((start, end))
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for MemLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let inner = self.lock()?;
        let last = inner
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(inner.last_purged);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.lock()?.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.lock()?.vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.lock()?.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.lock()?.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        {
            let mut inner = self.lock()?;
            for e in entries {
                inner.push(e);
            }
        }
        // Memory is as durable as this store gets.
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.lock()?;
        let removed = inner.entries.split_off(&log_id.index);
        let first_cut = inner
            .by_offset
            .iter()
            .find(|(_, i)| **i >= log_id.index)
            .map(|(o, _)| *o);
        if let Some(o) = first_cut {
            inner.by_offset.split_off(&o);
            inner.next_offset = o;
        }
        drop(removed);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.lock()?;
        let keep = inner.entries.split_off(&log_id.index.saturating_add(1));
        inner.entries = keep;
        inner.by_offset.retain(|_, i| *i > log_id.index);
        inner.last_purged = Some(log_id);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
