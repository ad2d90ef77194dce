//! openraft's `RaftLogStorage` and `RaftLogReader` over a replicated
//! fissionlog partition (docs/REPLICATION.md, "The partition's segment
//! log as the Raft log").
//!
//! - `append` writes each entry as one format-2 batch
//!   (`Partition::append_entry`: readable on return), then a task runs the
//!   log's group-committed sync (`Topic::sync`, shared with every other
//!   group appending at the same time) and calls
//!   `LogFlushed::log_io_completed` only once the round covered the last
//!   entry (`Partition::is_entry_durable`): never after a page-cache write
//!   alone.
//! - `save_vote` goes through [`VoteFile`] (tmp + fsync + rename + fsync
//!   of the directory) and waits while an append callback is still
//!   outstanding: a vote must never become durable ahead of an append
//!   issued before it (openraft 0.9 does ask for a vote save mid-append).
//! - `truncate` and `purge` are `Topic::truncate_from_index` and
//!   `Topic::purge_through_index`, durable before they return; the purged
//!   id is saved in the group's `raft-meta` file first. A truncation, as a
//!   vote save, waits for outstanding append callbacks first.
//! - Blank and membership entries (and `Command::Seal`) are control
//!   batches: they take no record offset and no consumer sees them.
//! - A producer-stamped append's stamp goes to the `raft-stamps` side
//!   file ([`stamps`]), durable before the entry is written, and is put
//!   back on the entry when it is read.

#![allow(
    clippy::result_large_err,
    reason = "openraft's StorageError is the error type its storage traits return"
)]

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fissionlog::{ControlKind, EntryBody, Partition, RaftEntry, RaftEntryBody, RaftLogId, Topic};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, CommittedLeaderId, EntryPayload, LogId, RaftLogReader, StorageError, StorageIOError,
    Vote,
};

use crate::meta::{Meta, MetaFile};
use crate::types::{Command, Entry, NodeId, RecordIn, TypeConfig};
use crate::vote::{StdVoteIo, VoteFile, VoteIo};

pub mod stamps;

use stamps::Stamps;

/// Entries read per `try_get_log_entries` call at most, in bytes (at least
/// one entry is always read).
const READ_BYTES_MAX: usize = 1 << 20;

fn write_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write_logs(AnyError::new(&e)).into()
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read_logs(AnyError::new(&e)).into()
}

fn to_raft(id: &LogId<NodeId>) -> RaftLogId {
    RaftLogId {
        term: id.leader_id.term,
        leader: id.leader_id.node_id,
        index: id.index,
    }
}

fn from_raft(id: RaftLogId) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(id.term, id.leader), id.index)
}

/// Reads entries of one partition's Raft log (a cheap clone per reader).
#[derive(Debug, Clone)]
pub struct LogReader {
    part: Arc<Partition>,
    /// Index after the last purged entry (0: none purged): entries below
    /// it may still be in a segment a purge keeps whole, and are hidden.
    readable_from: Arc<AtomicU64>,
    stamps: Arc<Mutex<Stamps>>,
}

impl LogReader {
    fn stamp(
        &self,
        id: RaftLogId,
    ) -> Result<Option<crate::types::ProducerStamp>, StorageError<NodeId>> {
        match self.stamps.lock() {
            Ok(s) => Ok(s.get(id)),
            Err(_) => Err(read_err(std::io::Error::other(
                "the stamps table was poisoned by a panic",
            ))),
        }
    }

    fn entry(&self, e: &RaftEntry<'_>) -> Result<Entry, StorageError<NodeId>> {
        let log_id = from_raft(e.id);
        let payload = match &e.body {
            RaftEntryBody::Control(ControlKind::Blank, _) => EntryPayload::Blank,
            RaftEntryBody::Control(ControlKind::Membership, body) => {
                EntryPayload::Membership(postcard::from_bytes(body).map_err(read_err)?)
            }
            RaftEntryBody::Control(ControlKind::Seal, body) => {
                EntryPayload::Normal(postcard::from_bytes::<Command>(body).map_err(read_err)?)
            }
            RaftEntryBody::Records(records) => EntryPayload::Normal(Command::Append {
                producer: self.stamp(e.id)?,
                records: records
                    .iter()
                    .map(|r| RecordIn {
                        key: r.key.map(<[u8]>::to_vec),
                        value: r.value.to_vec(),
                        timestamp_ms: r.timestamp,
                    })
                    .collect(),
            }),
            _ => {
                return Err(read_err(std::io::Error::other(format!(
                    "unknown control entry at index {}",
                    e.id.index
                ))))
            }
        };
        Ok(Entry { log_id, payload })
    }

    fn read_range(&self, start: u64, end: u64) -> Result<Vec<Entry>, StorageError<NodeId>> {
        let mut out = Vec::new();
        let mut next = start;
        while next < end {
            let batch = match self.part.read_entries(next, READ_BYTES_MAX) {
                Ok(b) => b,
                Err(fissionlog::Error::RaftIndexOutOfRange { .. }) => break,
                Err(e) => return Err(read_err(e)),
            };
            for e in batch.entries() {
                let e = e.map_err(read_err)?;
                if e.id.index >= end {
                    return Ok(out);
                }
                out.push(self.entry(&e)?);
            }
            next = batch.next_index();
        }
        Ok(out)
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => u64::MAX,
        };
        let start = start
            .max(self.part.first_log_id().map_or(start, |f| f.index))
            .max(self.readable_from.load(Ordering::SeqCst));
        self.read_range(start, end)
    }
}

/// How long an append's durability wait goes before it says so (then
/// again at each doubling).
const DURABLE_WAIT_WARN: std::time::Duration = std::time::Duration::from_secs(5);

/// The log's group commit for one append: one round shared with every
/// group syncing now, repeated while a round that started before the
/// append finished without covering its last entry `last`. A wait that
/// goes on past [`DURABLE_WAIT_WARN`] is reported with the entry, its
/// position and what the partition has made durable, once and again at
/// each doubling of the time waited: rounds that keep passing the entry
/// by are a stall of the group (its follower answers no append).
fn wait_durable(
    topic: &Topic,
    part: &Partition,
    last: &fissionlog::EntryPos,
) -> std::io::Result<()> {
    let start = std::time::Instant::now();
    let mut warn_at = DURABLE_WAIT_WARN;
    let mut rounds = 0u64;
    while !part.is_entry_durable(last) {
        topic
            .sync()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        rounds += 1;
        let waited = start.elapsed();
        if waited >= warn_at && !part.is_entry_durable(last) {
            tracing::warn!(
                partition = %part.dir().display(),
                index = last.id.index,
                term = last.id.term,
                segment_base = last.segment_base,
                end_position = last.end_position,
                end_offset = last.end_offset,
                written_end_offset = part.end_offset(),
                durable_end_offset = part.durable_end_offset(),
                rounds,
                waited_ms = waited.as_millis() as u64,
                "an appended entry is still not durable after sync rounds"
            );
            warn_at = warn_at.saturating_mul(2);
        }
    }
    Ok(())
}

/// openraft's log storage over one replicated partition.
#[derive(Debug)]
pub struct LogStore {
    topic: Topic,
    part: Arc<Partition>,
    vote: VoteFile,
    meta_file: MetaFile,
    meta: Meta,
    /// Append callbacks not yet called.
    outstanding: Arc<AtomicUsize>,
    /// See [`LogReader`].
    readable_from: Arc<AtomicU64>,
    stamps: Arc<Mutex<Stamps>>,
}

impl LogStore {
    /// The log storage of partition `partition` of the replicated topic
    /// `topic`; its vote and meta files live in the partition's directory.
    pub fn open(topic: Topic, partition: u32) -> crate::Result<LogStore> {
        LogStore::open_with_io(topic, partition, Arc::new(StdVoteIo))
    }

    /// [`LogStore::open`], with the group's own files (vote, `raft-meta`,
    /// `raft-stamps`) written through `io`: a test's power-loss model sees
    /// their fsyncs as the log's hook sees the segments'.
    pub fn open_with_io(
        topic: Topic,
        partition: u32,
        io: Arc<dyn VoteIo>,
    ) -> crate::Result<LogStore> {
        let part = topic.partition(partition).map_err(|e| crate::Error::Io {
            op: "open",
            path: std::path::PathBuf::from(topic.name()),
            source: std::io::Error::other(e.to_string()),
        })?;
        let dir = part.dir().to_path_buf();
        let meta_file = MetaFile::with_io(&dir, io.clone());
        let meta = meta_file.read()?;
        if let Some(purged) = meta.purged {
            // A purge at or past the log's end (a snapshot installed past
            // it) is done again: the partition takes `purged + 1` next,
            // whatever step a crash interrupted.
            if part.last_log_id().is_none_or(|l| l.index <= purged.index) {
                topic
                    .purge_through_index(partition, purged.index)
                    .map_err(|e| crate::Error::Io {
                        op: "purge",
                        path: dir.clone(),
                        source: std::io::Error::other(e.to_string()),
                    })?;
            }
        }
        let readable_from = Arc::new(AtomicU64::new(meta.purged.map_or(0, |p| p.index + 1)));
        let stamps = Arc::new(Mutex::new(Stamps::open(&dir, io.clone())?));
        Ok(LogStore {
            stamps,
            readable_from,
            topic,
            vote: VoteFile::with_io(&dir, io),
            meta_file,
            meta,
            part,
            outstanding: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The partition this storage writes.
    pub fn partition(&self) -> &Arc<Partition> {
        &self.part
    }

    /// Append callbacks not yet called (at most one in openraft 0.9).
    pub fn outstanding_appends(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }

    fn save_meta(&mut self, meta: Meta) -> Result<(), StorageError<NodeId>> {
        self.meta_file.save(&meta).map_err(write_err)?;
        self.meta = meta;
        Ok(())
    }

    fn write_entry(&self, entry: &Entry) -> Result<fissionlog::EntryPos, StorageError<NodeId>> {
        let id = to_raft(&entry.log_id);
        let appended = match &entry.payload {
            EntryPayload::Blank => self
                .part
                .append_entry(id, EntryBody::Control(ControlKind::Blank, b"")),
            EntryPayload::Membership(m) => {
                let body = postcard::to_allocvec(m).map_err(write_err)?;
                self.part
                    .append_entry(id, EntryBody::Control(ControlKind::Membership, &body))
            }
            EntryPayload::Normal(cmd @ Command::Seal { .. }) => {
                let body = postcard::to_allocvec(cmd).map_err(write_err)?;
                self.part
                    .append_entry(id, EntryBody::Control(ControlKind::Seal, &body))
            }
            // The stamp, if any, is already in the side file (`append`).
            EntryPayload::Normal(Command::Append { records, .. }) => {
                let recs: Vec<fissionlog::RecordIn<'_>> = records
                    .iter()
                    .map(|r| fissionlog::RecordIn {
                        key: r.key.as_deref(),
                        value: &r.value,
                        timestamp: r.timestamp_ms,
                    })
                    .collect();
                self.part.append_entry(id, EntryBody::Records(&recs))
            }
        };
        appended.map_err(write_err)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        let mut r = LogReader {
            part: self.part.clone(),
            readable_from: self.readable_from.clone(),
            stamps: self.stamps.clone(),
        };
        r.try_get_log_entries(range).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let purged = self.meta.purged;
        let last = self.part.last_log_id().map(from_raft).or(purged);
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last.max(purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            part: self.part.clone(),
            readable_from: self.readable_from.clone(),
            stamps: self.stamps.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        // openraft 0.9 can ask for a vote save while an append's callback
        // is outstanding (a vote request arriving mid-append); a refusal
        // would be a storage error, fatal to the group. Waiting keeps the
        // order: the vote becomes durable only after the appends issued
        // before it. The callback task only waits on the log's sync round.
        while self.outstanding.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        self.vote
            .save(vote)
            .map_err(|e| StorageIOError::write_vote(AnyError::new(&e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.vote
            .read()
            .map_err(|e| StorageIOError::read_vote(AnyError::new(&e)).into())
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        let meta = Meta {
            committed,
            ..self.meta
        };
        self.save_meta(meta)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.meta.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let stamped: Vec<_> = entries
            .iter()
            .filter_map(|e| match &e.payload {
                EntryPayload::Normal(Command::Append {
                    producer: Some(s), ..
                }) => Some((to_raft(&e.log_id), *s)),
                _ => None,
            })
            .collect();
        if !stamped.is_empty() {
            // Durable before any entry is written: an entry that survives
            // a crash always finds its stamp.
            match self.stamps.lock() {
                Ok(mut s) => s.save(&stamped).map_err(write_err)?,
                Err(_) => {
                    return Err(write_err(std::io::Error::other(
                        "the stamps table was poisoned by a panic",
                    )))
                }
            }
        }
        let mut last = None;
        for entry in &entries {
            last = Some(self.write_entry(entry)?);
        }
        let Some(last) = last else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        let topic = self.topic.clone();
        let part = self.part.clone();
        let outstanding = self.outstanding.clone();
        tokio::task::spawn_blocking(move || {
            // A panic in the wait (a sync round's) still reaches openraft,
            // as a storage error: a callback dropped without a call, and
            // the count never released, would leave the group answering
            // nothing and every later vote save or truncation waiting.
            let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                wait_durable(&topic, &part, &last)
            }));
            let result = waited.unwrap_or_else(|_| {
                tracing::error!(
                    partition = %part.dir().display(),
                    index = last.id.index,
                    "the wait for an appended entry to become durable panicked"
                );
                Err(std::io::Error::other(
                    "the wait for an appended entry to become durable panicked",
                ))
            });
            // Released before the callback: openraft may start its next
            // I/O (a vote save) as soon as the callback fires.
            outstanding.fetch_sub(1, Ordering::SeqCst);
            callback.log_io_completed(result);
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        // openraft 0.9 issues a truncation with no condition on the log
        // being flushed, so an append's callback may still be waiting for
        // a sync round to cover entries this cut removes: its durable
        // position would then be reached only by later appends, and until
        // then the callback task spins on sync rounds, to report removed
        // entries flushed at last. Waiting keeps the order, as for a vote.
        while self.outstanding.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        self.topic
            .truncate_from_index(self.part.id(), log_id.index, self.part.committed_end())
            .map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        // The purged id is durable before any segment goes: a crash in
        // between leaves segments below it, which the log ignores.
        if self.meta.purged.is_none_or(|p| p < log_id) {
            let meta = Meta {
                purged: Some(log_id),
                ..self.meta
            };
            self.save_meta(meta)?;
        }
        self.readable_from
            .fetch_max(log_id.index + 1, Ordering::SeqCst);
        self.topic
            .purge_through_index(self.part.id(), log_id.index)
            .map(|_| ())
            .map_err(write_err)
    }
}

#[cfg(test)]
mod suite;
