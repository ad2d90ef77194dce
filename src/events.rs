//! Topology events: what a broker needs to hear to tell its consumers.

use parking_lot::Mutex;
use serde::Serialize;

/// One topology event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum TopologyEvent {
    /// A topic was created.
    TopicCreated {
        /// Topic name.
        topic: String,
    },
    /// A partition was sealed at `seal_offset` and split into `children`.
    Split {
        /// Topic name.
        topic: String,
        /// The parent.
        parent: u32,
        /// Its end offset.
        seal_offset: u64,
        /// New partitions, in range order.
        children: Vec<u32>,
    },
    /// Two partitions were sealed and merged into `child`.
    Merge {
        /// Topic name.
        topic: String,
        /// The parents and their end offsets.
        parents: Vec<(u32, u64)>,
        /// The new partition.
        child: u32,
    },
    /// A sealed partition retention emptied left the topology (its
    /// `RemovePartition` record is durable); its directory is deleted.
    PartitionRemoved {
        /// Topic name.
        topic: String,
        /// The removed partition.
        partition: u32,
    },
    /// A partition of a single hash value runs hot: one key carries its load.
    /// It is never split again (a one-value range cannot be).
    HotKey {
        /// Topic name.
        topic: String,
        /// The partition `[hash, hash]`.
        partition: u32,
        /// The hash value.
        hash: u64,
    },
}

impl TopologyEvent {
    /// The topic and kind of a topology change, for its metric.
    fn change_kind(&self) -> Option<(&str, &'static str)> {
        match self {
            TopologyEvent::Split { topic, .. } => Some((topic, "split")),
            TopologyEvent::Merge { topic, .. } => Some((topic, "merge")),
            TopologyEvent::HotKey { topic, .. } => Some((topic, "hot_key")),
            TopologyEvent::PartitionRemoved { topic, .. } => Some((topic, "partition_removed")),
            TopologyEvent::TopicCreated { .. } => None,
        }
    }
}

/// Fan-out of events to subscribers (dropped receivers are pruned).
#[derive(Debug, Default)]
pub(crate) struct EventHub {
    subscribers: Mutex<Vec<std::sync::mpsc::Sender<TopologyEvent>>>,
}

impl EventHub {
    pub fn subscribe(&self) -> std::sync::mpsc::Receiver<TopologyEvent> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.subscribers.lock().push(tx);
        rx
    }

    pub fn emit(&self, e: TopologyEvent) {
        if let Some((topic, kind)) = e.change_kind() {
            crate::metrics::topology_change(topic, kind);
        }
        self.subscribers
            .lock()
            .retain(|s| s.send(e.clone()).is_ok());
    }
}
