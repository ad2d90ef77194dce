//! The log's topology events, heard once per server: counted into the
//! split/merge metrics, logged inside a span, kept (the latest
//! [`RECENT_EVENTS`]) for the live view, and passed on to it as they
//! happen so a split shows without waiting for the next refresh.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fissionlog::{Log, TopologyEvent};
use serde::Serialize;
use tokio::sync::broadcast;

use super::metrics::names;

/// Topology events the view lists.
pub const RECENT_EVENTS: usize = 64;

/// One event with the time it was heard.
#[derive(Debug, Clone, Serialize)]
pub struct HeardEvent {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The event.
    pub event: TopologyEvent,
}

/// The listening thread and what it keeps.
pub(crate) struct Topology {
    pub recent: Arc<Mutex<VecDeque<HeardEvent>>>,
    pub changes: broadcast::Sender<()>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Topology {
    pub fn start(log: &Log) -> Topology {
        let rx = log.subscribe();
        let recent: Arc<Mutex<VecDeque<HeardEvent>>> = Arc::default();
        let (changes, _) = broadcast::channel(16);
        let stop = Arc::new(AtomicBool::new(false));
        let (r, c, s) = (recent.clone(), changes.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("broker-topology".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    match rx.recv_timeout(Duration::from_millis(100)) {
                        Ok(e) => heard(&r, &c, e),
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
            })
            .ok();
        Topology {
            recent,
            changes,
            stop,
            thread: Mutex::new(thread),
        }
    }

    /// A copy of the recent events, oldest first.
    pub fn recent(&self) -> Vec<HeardEvent> {
        self.recent
            .lock()
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = h.join();
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.stop();
    }
}

fn heard(recent: &Mutex<VecDeque<HeardEvent>>, changes: &broadcast::Sender<()>, e: TopologyEvent) {
    match &e {
        TopologyEvent::Split {
            topic,
            parent,
            children,
            seal_offset,
        } => {
            let _span = tracing::info_span!("split", topic = %topic, partition = parent).entered();
            metrics::counter!(names::SPLITS, "topic" => topic.clone()).increment(1);
            tracing::info!(?children, seal_offset, "partition split");
        }
        TopologyEvent::Merge {
            topic,
            parents,
            child,
        } => {
            let _span = tracing::info_span!("merge", topic = %topic, partition = child).entered();
            metrics::counter!(names::MERGES, "topic" => topic.clone()).increment(1);
            tracing::info!(?parents, "partitions merged");
        }
        TopologyEvent::HotKey {
            topic, partition, ..
        } => {
            metrics::counter!(names::HOT_KEYS, "topic" => topic.clone()).increment(1);
            tracing::info!(topic = %topic, partition, "hot key partition");
        }
        _ => {}
    }
    let at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if let Ok(mut r) = recent.lock() {
        if r.len() == RECENT_EVENTS {
            r.pop_front();
        }
        r.push_back(HeardEvent { at_ms, event: e });
    }
    let _ = changes.send(());
}
