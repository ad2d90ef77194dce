//! The live view's data: one JSON snapshot of every topic (the partition
//! tree, rates, hot keys, groups with members, assignments and lag) and
//! the fan-out of snapshots to the page's server-sent-event streams.
//!
//! Each client gets a bounded queue of [`CLIENT_QUEUE_FRAMES`] events;
//! one whose queue is full when a snapshot is published reads too slowly
//! and is dropped (its stream ends; the page's `EventSource` reconnects),
//! so a stalled browser costs at most that many snapshots of memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use fissionlog::{GroupOptions, Log};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::metrics::names;
use super::topology::HeardEvent;

/// Events queued per live-view client before it counts as too slow.
pub const CLIENT_QUEUE_FRAMES: usize = 8;

fn hex(h: u64) -> String {
    format!("{h:#018x}")
}

/// The whole state the page draws, as JSON.
pub(crate) fn snapshot(log: &Log, recent: Vec<HeardEvent>) -> Value {
    let mut topics = Vec::new();
    let mut names_sorted = log.topics();
    names_sorted.sort();
    for name in names_sorted {
        let Ok(t) = log.topic(&name) else { continue };
        let partitions: Vec<Value> = t
            .partitions()
            .iter()
            .map(|p| {
                let rate = p.rates.first();
                json!({
                    "id": p.id,
                    "parents": p.parents,
                    "children": p.children,
                    "state": if p.sealed_at.is_some() { "sealed" } else { "active" },
                    "key_start": hex(p.start),
                    "key_end": hex(p.end),
                    "start_offset": p.start_offset,
                    "end_offset": p.end_offset,
                    "bytes": p.bytes,
                    "records_per_sec": rate.map_or(0.0, |r| r.records_per_sec),
                    "bytes_per_sec": rate.map_or(0.0, |r| r.bytes_per_sec),
                    "hot_key": p.hot_key,
                })
            })
            .collect();
        let hot_keys: Vec<Value> = t
            .hot_keys()
            .into_iter()
            .map(
                |k| json!({"hash": hex(k.hash), "mode": format!("{:?}", k.mode), "lanes": k.lanes}),
            )
            .collect();
        let mut groups = Vec::new();
        for g in t.groups() {
            let Ok(group) = t.group(&g, GroupOptions::default()) else {
                continue;
            };
            let d = group.describe();
            groups.push(json!({
                "name": d.name,
                "generation": d.generation,
                "lag_records": d.lag_records,
                "members": d.members,
                "assignments": d.assignments,
                "rebalances": d.stats.rebalances,
            }));
        }
        topics.push(json!({
            "name": name,
            "generation": t.topology_generation(),
            "partitions": partitions,
            "hot_keys": hot_keys,
            "groups": groups,
        }));
    }
    json!({"topics": topics, "events": recent})
}

/// One server-sent event carrying `data` (a JSON document on one line).
pub(crate) fn sse_frame(event: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// The live-view clients and their bounded queues.
pub(crate) struct Hub {
    clients: Mutex<Vec<mpsc::Sender<Bytes>>>,
    max_clients: usize,
    /// Clients dropped for reading too slowly.
    pub dropped: AtomicU64,
}

impl Hub {
    pub fn new(max_clients: usize) -> Hub {
        Hub {
            clients: Mutex::new(Vec::new()),
            max_clients,
            dropped: AtomicU64::new(0),
        }
    }

    /// A new client's queue, holding `first`; `None` at the client limit.
    pub fn join(&self, first: Bytes) -> Option<mpsc::Receiver<Bytes>> {
        let mut c = self.clients.lock().ok()?;
        c.retain(|tx| !tx.is_closed());
        if c.len() >= self.max_clients {
            return None;
        }
        let (tx, rx) = mpsc::channel(CLIENT_QUEUE_FRAMES);
        let _ = tx.try_send(first);
        c.push(tx);
        metrics::gauge!(names::VIEW_CLIENTS).set(c.len() as f64);
        Some(rx)
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        self.clients.lock().map_or(0, |mut c| {
            c.retain(|tx| !tx.is_closed());
            c.len()
        })
    }

    /// Queues `frame` for every client; drops those whose queue is full.
    pub fn publish(&self, frame: Bytes) {
        let Ok(mut c) = self.clients.lock() else {
            return;
        };
        c.retain(|tx| match tx.try_send(frame.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(names::VIEW_CLIENTS_DROPPED).increment(1);
                tracing::debug!("a live-view client read too slowly: dropped");
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
        metrics::gauge!(names::VIEW_CLIENTS).set(c.len() as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_that_stops_reading_is_dropped_after_its_queue_fills_and_the_others_stay() {
        let hub = Hub::new(4);
        let mut reader = hub.join(Bytes::from_static(b"first")).unwrap();
        let _stalled = hub.join(Bytes::from_static(b"first")).unwrap();
        for i in 0..CLIENT_QUEUE_FRAMES * 2 {
            hub.publish(Bytes::from(format!("frame {i}")));
            while reader.try_recv().is_ok() {}
        }
        assert_eq!(hub.dropped.load(Ordering::Relaxed), 1);
        assert_eq!(hub.clients(), 1, "only the reading client is left");
        hub.publish(Bytes::from_static(b"after"));
        assert_eq!(reader.try_recv().unwrap(), Bytes::from_static(b"after"));
    }

    #[test]
    fn clients_past_the_limit_are_refused_and_a_closed_one_frees_its_place() {
        let hub = Hub::new(2);
        let a = hub.join(Bytes::new()).unwrap();
        let _b = hub.join(Bytes::new()).unwrap();
        assert!(hub.join(Bytes::new()).is_none());
        drop(a);
        assert!(hub.join(Bytes::new()).is_some());
    }

    #[test]
    fn an_event_frame_is_one_data_line_ended_by_a_blank_line() {
        let f = sse_frame("state", &json!({"a": "x\ny"}));
        let s = std::str::from_utf8(&f).unwrap();
        assert!(s.starts_with("event: state\ndata: {"));
        assert!(s.ends_with("}\n\n"));
        assert_eq!(
            s.matches('\n').count(),
            3,
            "the JSON's newline is escaped: {s:?}"
        );
    }
}
