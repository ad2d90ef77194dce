//! A consumer-group member: joins through the broker, heartbeats in the
//! background, polls and commits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{ClientError, Connection};
use crate::protocol::{PolledRecord, Request, Response};

/// Settings of a [`Consumer`].
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Topic.
    pub topic: String,
    /// Group.
    pub group: String,
    /// No heartbeat for this long: the member is dead and its partitions move.
    pub session_timeout: Duration,
    /// Heartbeats but no poll or commit for this long: the member is slow.
    pub processing_timeout: Duration,
    /// Heartbeat interval.
    pub heartbeat_interval: Duration,
    /// Static membership: rejoin with the same id takes the old assignment.
    pub instance_id: Option<String>,
}

impl ConsumerConfig {
    /// Defaults: 10 s session, 30 s processing, heartbeat every second.
    pub fn new(topic: &str, group: &str) -> ConsumerConfig {
        ConsumerConfig {
            topic: topic.into(),
            group: group.into(),
            session_timeout: Duration::from_secs(10),
            processing_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(1),
            instance_id: None,
        }
    }
}

/// One member of a consumer group.
#[derive(Debug)]
pub struct Consumer {
    conn: Connection,
    member: u64,
    generation: u64,
    fenced: Arc<AtomicBool>,
    heartbeats: tokio::task::JoinHandle<()>,
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

fn ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

impl Consumer {
    /// Joins the group and starts heartbeating.
    pub async fn join(conn: Connection, config: ConsumerConfig) -> Result<Consumer, ClientError> {
        let r = conn
            .call(Request::JoinGroup {
                topic: config.topic.clone(),
                group: config.group.clone(),
                session_timeout_ms: ms(config.session_timeout),
                processing_timeout_ms: ms(config.processing_timeout),
                instance_id: config.instance_id.clone(),
            })
            .await?;
        let Response::Joined { member, generation } = r else {
            return Err(ClientError::Unexpected(format!("{r:?}")));
        };
        let fenced = Arc::new(AtomicBool::new(false));
        let (c2, f2) = (conn.clone(), fenced.clone());
        let every = config.heartbeat_interval;
        let heartbeats = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                match c2.call(Request::Heartbeat { member }).await {
                    Ok(_) => {}
                    Err(ClientError::Server { .. }) => {
                        f2.store(true, Ordering::Relaxed);
                        return;
                    }
                    Err(_) => return,
                }
            }
        });
        Ok(Consumer {
            conn,
            member,
            generation,
            fenced,
            heartbeats,
        })
    }

    /// The member id the broker gave.
    pub fn member_id(&self) -> u64 {
        self.member
    }

    /// The generation of the last poll.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a heartbeat was refused (the member was declared dead).
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Relaxed)
    }

    /// Up to `max_records` records of this member's partitions, waiting
    /// up to `max_wait` for some.
    pub async fn poll(
        &mut self,
        max_records: u32,
        max_wait: Duration,
    ) -> Result<Vec<PolledRecord>, ClientError> {
        let r = self
            .conn
            .call(Request::GroupPoll {
                member: self.member,
                max_records,
                max_bytes: 8 << 20,
                max_wait_ms: ms(max_wait),
            })
            .await?;
        match r {
            Response::Polled {
                generation,
                records,
            } => {
                self.generation = generation;
                Ok(records)
            }
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Commits everything the polls answered so far handed out (durable
    /// when this returns).
    pub async fn commit(&mut self) -> Result<(), ClientError> {
        self.conn
            .call(Request::Commit {
                member: self.member,
            })
            .await
            .map(|_| ())
    }

    /// Leaves the group: its partitions go to the others at once.
    pub async fn leave(self) -> Result<(), ClientError> {
        self.heartbeats.abort();
        self.conn
            .call(Request::LeaveGroup {
                member: self.member,
            })
            .await
            .map(|_| ())
    }
}
