//! The "callback before durable" pitfall of openraft's v2 log storage
//! (docs/REPLICATION.md, "The four openraft-storage pitfalls"): the
//! `LogFlushed` callback of `append` fires only after an fsync of the
//! entry's segment that started after the entry was written.
//!
//! A single-node group runs on `LogStore` over a replicated partition
//! whose log records its segment fsyncs through an `IoHook`. A single
//! node commits an entry exactly when its own append callback fired, and
//! the state machine then publishes the committed end: so each published
//! end `E` must come after a completed segment fsync that started when
//! the partition's written end was already at least `E` (the writer
//! publishes that end after the bytes are in place). The same check run
//! over the in-memory `MemLogStore`, which calls the callback as soon as
//! it holds the entries, reports the violation.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use fissionlog::{IoHook, IoOp, Log, LogOptions, Partition, TopicConfig};
use fissionlog_raft::mem_log::MemLogStore;
use fissionlog_raft::network::{Network, NetworkConfig};
use fissionlog_raft::node::raft_config;
use fissionlog_raft::{
    Command, CommittedEndSink, GroupId, LogStore, PartitionState, PartitionStateMachine, RecordIn,
    TypeConfig,
};
use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, Raft};

#[derive(Clone, Debug, PartialEq)]
enum Event {
    /// A segment fsync started while the partition's written end was `end`.
    SyncStart { seq: u64, end: u64 },
    /// That fsync returned successfully.
    SyncDone { seq: u64 },
    /// The state machine published committed end `end`.
    Committed { end: u64 },
}

#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<Event>>,
    part: OnceLock<Arc<Partition>>,
    next: Mutex<(u64, BTreeMap<std::path::PathBuf, Vec<u64>>)>,
}

impl Recorder {
    fn push(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(e);
    }
    fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Recorder")
    }
}

fn is_segment_sync(op: IoOp, path: &Path) -> bool {
    matches!(op, IoOp::SyncSegment | IoOp::SyncNewSegment)
        && path.extension().is_some_and(|e| e == "seg")
}

impl IoHook for Recorder {
    fn before(&self, op: IoOp, path: &Path) -> io::Result<()> {
        if is_segment_sync(op, path) {
            if let Some(p) = self.part.get() {
                let mut n = self.next.lock().unwrap_or_else(|e| e.into_inner());
                n.0 += 1;
                let seq = n.0;
                n.1.entry(path.to_path_buf()).or_default().push(seq);
                self.push(Event::SyncStart {
                    seq,
                    end: p.end_offset(),
                });
            }
        }
        Ok(())
    }

    fn after(&self, op: IoOp, path: &Path, result: io::Result<()>) -> io::Result<()> {
        if is_segment_sync(op, path) && result.is_ok() {
            let seq = self
                .next
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .1
                .get_mut(path)
                .and_then(|v| (!v.is_empty()).then(|| v.remove(0)));
            if let Some(seq) = seq {
                self.push(Event::SyncDone { seq });
            }
        }
        result
    }
}

impl CommittedEndSink for Recorder {
    fn publish(&self, end_offset: u64) {
        self.push(Event::Committed { end: end_offset });
    }
}

/// The first committed end published before a completed segment fsync
/// that started with the written end at or past it, if any.
fn first_early_callback(events: &[Event]) -> Option<String> {
    let mut started = BTreeMap::new();
    let mut covered = 0;
    for (i, e) in events.iter().enumerate() {
        match *e {
            Event::SyncStart { seq, end } => {
                started.insert(seq, end);
            }
            Event::SyncDone { seq } => {
                covered = covered.max(started.get(&seq).copied().unwrap_or(0));
            }
            Event::Committed { end } if end > covered => {
                return Some(format!(
                    "event {i}: committed end {end} published while completed fsyncs cover only {covered}: {:?}",
                    &events[..=i]
                ));
            }
            Event::Committed { .. } => {}
        }
    }
    None
}

const APPENDS: u64 = 12;

/// Runs a single-node group over `log` (a `RaftLogStorage`), writes
/// `APPENDS` one-record commands, and returns how many were committed.
async fn run_group<LS>(log: LS, rec: Arc<Recorder>) -> u64
where
    LS: RaftLogStorage<TypeConfig>,
{
    let config = Arc::new(raft_config().validate().unwrap());
    let network = Network::new(1, NetworkConfig::default());
    let sm = PartitionStateMachine::new(PartitionState::default(), rec);
    let raft = Raft::new(1, config, network.factory(GroupId(0)), log, sm)
        .await
        .unwrap();
    let members = BTreeMap::from([(1, BasicNode::new("127.0.0.1:1"))]);
    raft.initialize(members).await.unwrap();
    // A single voter elects itself, but not at once: a write before it
    // leads is refused with ForwardToLeader.
    raft.wait(Some(Duration::from_secs(10)))
        .current_leader(1, "the single voter leads")
        .await
        .unwrap();
    let mut done = 0;
    for i in 0..APPENDS {
        let cmd = Command::Append {
            producer: None,
            records: vec![RecordIn {
                key: Some(b"k".to_vec()),
                value: format!("value {i}").into_bytes(),
                timestamp_ms: i as i64,
            }],
        };
        raft.client_write(cmd).await.unwrap();
        done += 1;
    }
    raft.shutdown().await.unwrap();
    done
}

fn replicated() -> TopicConfig {
    let mut cfg = TopicConfig {
        replicated: true,
        ..TopicConfig::default()
    };
    cfg.balance.enabled = false;
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_append_callback_fires_only_after_an_fsync_of_its_segment_that_started_after_the_write()
{
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recorder::default());
    let log = Log::open_with_hook(dir.path(), LogOptions::default(), rec.clone()).unwrap();
    let topic = log.create_topic("r", replicated()).unwrap();
    rec.part.set(topic.partition(0).unwrap()).unwrap();
    let store = LogStore::open(topic, 0).unwrap();
    assert_eq!(run_group(store, rec.clone()).await, APPENDS);
    let events = rec.events();
    let last = events.iter().rev().find_map(|e| match e {
        Event::Committed { end } => Some(*end),
        _ => None,
    });
    assert_eq!(last, Some(APPENDS), "every record committed: {events:?}");
    if let Some(bad) = first_early_callback(&events) {
        panic!("{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_store_that_calls_the_append_callback_on_write_is_caught_by_the_same_check() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recorder::default());
    // The partition is there (and its fsyncs recorded), but the entries
    // live in memory and the callback fires as they arrive.
    let log = Log::open_with_hook(dir.path(), LogOptions::default(), rec.clone()).unwrap();
    let topic = log.create_topic("r", replicated()).unwrap();
    rec.part.set(topic.partition(0).unwrap()).unwrap();
    assert_eq!(run_group(MemLogStore::new(), rec.clone()).await, APPENDS);
    let bad = first_early_callback(&rec.events());
    assert!(
        bad.is_some_and(|b| b.contains("committed end 1 ")),
        "the first commit is reported as before any fsync"
    );
}
