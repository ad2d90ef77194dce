//! Admin requests: each answers one JSON document.

use bytes::Bytes;
use serde_json::Value;

use super::{ClientError, Connection};
use crate::protocol::{HotKeyModeSpec, Request, Response, SplitSpec, SyncSpec, TailFromSpec};

/// Topic and group administration over a [`Connection`].
#[derive(Debug, Clone)]
pub struct Admin {
    conn: Connection,
}

impl Admin {
    /// Admin calls over `conn`.
    pub fn new(conn: Connection) -> Admin {
        Admin { conn }
    }

    async fn json(&self, req: Request) -> Result<Value, ClientError> {
        match self.conn.call(req).await? {
            Response::Json { json, .. } => serde_json::from_str(&json)
                .map_err(|e| ClientError::Unexpected(format!("bad JSON from the server: {e}"))),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Creates a topic.
    pub async fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
        sync: SyncSpec,
        target_bytes_per_sec: u64,
        auto_balance: bool,
    ) -> Result<Value, ClientError> {
        self.json(Request::CreateTopic {
            topic: topic.into(),
            partitions,
            sync,
            max_record_bytes: 0,
            target_bytes_per_sec,
            auto_balance,
        })
        .await
    }

    /// `{"topics": [names]}`.
    pub async fn list_topics(&self) -> Result<Value, ClientError> {
        self.json(Request::ListTopics).await
    }

    /// A topic's partitions and hot keys.
    pub async fn describe(&self, topic: &str) -> Result<Value, ClientError> {
        self.json(Request::Describe {
            topic: topic.into(),
        })
        .await
    }

    /// Splits a partition forward.
    pub async fn split(
        &self,
        topic: &str,
        partition: u32,
        plan: SplitSpec,
    ) -> Result<Value, ClientError> {
        self.json(Request::Split {
            topic: topic.into(),
            partition,
            plan,
        })
        .await
    }

    /// Merges two adjacent active partitions.
    pub async fn merge(&self, topic: &str, a: u32, b: u32) -> Result<Value, ClientError> {
        self.json(Request::Merge {
            topic: topic.into(),
            a,
            b,
        })
        .await
    }

    /// Splits a partition and moves its tail into the children.
    pub async fn split_tail(
        &self,
        topic: &str,
        partition: u32,
        plan: SplitSpec,
        from: TailFromSpec,
    ) -> Result<Value, ClientError> {
        self.json(Request::TailSplit {
            topic: topic.into(),
            partition,
            plan,
            from,
        })
        .await
    }

    /// Sets a key's hot-key mode (`lanes` 0: the topic's maximum).
    pub async fn set_hot_key_mode(
        &self,
        topic: &str,
        key: Bytes,
        mode: HotKeyModeSpec,
        lanes: u32,
    ) -> Result<Value, ClientError> {
        self.json(Request::SetHotKeyMode {
            topic: topic.into(),
            key,
            mode,
            lanes,
        })
        .await
    }

    /// Groups of a topic, or of every topic.
    pub async fn groups(&self, topic: Option<&str>) -> Result<Value, ClientError> {
        self.json(Request::ListGroups {
            topic: topic.map(str::to_string),
        })
        .await
    }

    /// The server's counters.
    pub async fn stats(&self) -> Result<Value, ClientError> {
        self.json(Request::Stats).await
    }
}
