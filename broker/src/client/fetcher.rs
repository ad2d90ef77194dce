//! Reading one partition from an offset through a cluster: each fetch
//! goes to the partition's leader, `not_leader` answers are followed to
//! the broker they name, and a lost broker (or one that names no leader)
//! sends the next attempt to the other known brokers, with the bounded
//! backoff of [`Reconnect`].
//!
//! Exactly once: the fetcher's offset moves only past records it
//! returned (to the last one's offset + 1), and a record below it in an
//! answer (a retry answered from an older offset) is dropped, so no
//! record is returned twice or skipped, whichever broker answers.

use std::time::Duration;

use tokio::time::Instant;

use super::idempotent::MAX_REDIRECTS;
use super::reconnect::{is_lost, Endpoint, Reconnect};
use super::{ClientError, Connection};
use crate::protocol::{FetchedRecord, Isolation, Request, Response};

/// What a [`Fetcher`] reads and how long it keeps trying.
#[derive(Clone, Debug)]
pub struct FetcherConfig {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// The first offset to read.
    pub offset: u64,
    /// Most bytes of records one answer carries.
    pub max_bytes: u32,
    /// How long a broker holds a fetch that finds no record (long poll).
    pub max_wait: Duration,
    /// Which records a broker returns.
    pub isolation: Isolation,
    /// Backoff between attempts after a lost broker, and how long one
    /// [`Fetcher::fetch`] keeps trying before it fails with
    /// [`ClientError::Unavailable`].
    pub reconnect: Reconnect,
}

impl FetcherConfig {
    /// `topic`'s `partition` from offset 0, 1 MiB per answer, up to
    /// 500 ms of long poll, the topic's default isolation.
    pub fn new(topic: impl Into<String>, partition: u32) -> FetcherConfig {
        FetcherConfig {
            topic: topic.into(),
            partition,
            offset: 0,
            max_bytes: 1 << 20,
            max_wait: Duration::from_millis(500),
            isolation: Isolation::Default,
            reconnect: Reconnect::default(),
        }
    }
}

/// Reads one partition in order through any broker of an [`Endpoint`]
/// (a single node works the same way: it always leads).
pub struct Fetcher {
    endpoint: Endpoint,
    config: FetcherConfig,
    /// Every broker known: the endpoint's, then its bootstrap brokers,
    /// then leaders named by `not_leader` answers.
    brokers: Vec<String>,
    /// The broker tried when no leader is known.
    next_broker: usize,
    /// The partition's leader as last named.
    leader: Option<String>,
    /// The connection in use, and its broker's address.
    conn: Option<(String, Connection)>,
    /// The broker that answered the last fetch.
    answered_by: Option<String>,
    /// The next offset to return.
    offset: u64,
    high_watermark: u64,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("topic", &self.config.topic)
            .field("partition", &self.config.partition)
            .field("offset", &self.offset)
            .field("leader", &self.leader)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    /// A fetcher of `config`'s partition through `endpoint`. It connects
    /// at the first [`fetch`](Fetcher::fetch).
    pub fn new(endpoint: Endpoint, config: FetcherConfig) -> Fetcher {
        let mut brokers = vec![endpoint.addr.clone()];
        for b in &endpoint.bootstrap {
            if !brokers.contains(b) {
                brokers.push(b.clone());
            }
        }
        Fetcher {
            offset: config.offset,
            endpoint,
            config,
            brokers,
            next_broker: 0,
            leader: None,
            conn: None,
            answered_by: None,
            high_watermark: 0,
        }
    }

    /// The offset the next fetch starts at: the one after the last
    /// record returned.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The broker (its address) that answered the last fetch: the
    /// partition's leader or another replica.
    pub fn broker(&self) -> Option<&str> {
        self.answered_by.as_deref()
    }

    /// The partition's high watermark in the last answer.
    pub fn high_watermark(&self) -> u64 {
        self.high_watermark
    }

    /// The next records from [`offset`](Fetcher::offset), waiting up to
    /// the configured `max_wait` for one; empty when none came. Fails with
    /// [`ClientError::Unavailable`] once no broker answered within the
    /// reconnect deadline or after [`MAX_REDIRECTS`] `not_leader` hops,
    /// and at once with any refusal another broker would repeat.
    pub async fn fetch(&mut self) -> Result<Vec<FetchedRecord>, ClientError> {
        let since = Instant::now();
        let policy = self.config.reconnect.clone();
        let mut backoff = policy.backoff_min.max(Duration::from_millis(1));
        let mut attempts = 0u32;
        let mut redirects = 0u32;
        // Brokers lost during this call: a broker that names one of them
        // (its hint is stale, or it names a replica it can't know is
        // down) is taken as naming no leader.
        let mut lost: Vec<String> = Vec::new();
        loop {
            attempts += 1;
            let target = self.target();
            let err = match self.fetch_from(&target).await {
                Ok(records) => return Ok(records),
                Err(ClientError::NotLeader {
                    leader: Some(l), ..
                }) if l != target && !lost.contains(&l) && redirects < MAX_REDIRECTS => {
                    // Straight to the named leader: no backoff.
                    redirects += 1;
                    self.follow(l);
                    continue;
                }
                Err(e @ ClientError::NotLeader { .. }) => e,
                Err(e) if is_lost(&e) || matches!(e, ClientError::Timeout { .. }) => {
                    self.conn = None;
                    lost.push(target.clone());
                    e
                }
                Err(e) => return Err(e),
            };
            // The broker is gone or knows no leader: another one next.
            self.leader = None;
            self.next_broker = (self.brokers.iter().position(|b| *b == target).unwrap_or(0) + 1)
                % self.brokers.len();
            let waited = since.elapsed();
            if waited + backoff > policy.deadline || redirects >= MAX_REDIRECTS {
                return Err(ClientError::Unavailable {
                    addr: target,
                    attempts,
                    waited,
                    last_error: err.to_string(),
                });
            }
            tracing::debug!(broker = %target, attempts, error = %err, "fetching through another broker");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(policy.backoff_max.max(backoff));
        }
    }

    /// Where the next attempt goes: the leader when known, else the
    /// next broker in turn.
    fn target(&self) -> String {
        self.leader
            .clone()
            .unwrap_or_else(|| self.brokers[self.next_broker % self.brokers.len()].clone())
    }

    fn follow(&mut self, leader: String) {
        if !self.brokers.contains(&leader) {
            self.brokers.push(leader.clone());
        }
        self.leader = Some(leader);
    }

    /// One fetch from the broker at `addr`, over the connection kept
    /// for it or a new one made with the endpoint's TLS and token.
    async fn fetch_from(&mut self, addr: &str) -> Result<Vec<FetchedRecord>, ClientError> {
        let conn = match &self.conn {
            Some((a, c)) if a == addr => c.clone(),
            _ => {
                self.conn = None;
                let mut ep = self.endpoint.clone();
                ep.addr = addr.to_string();
                // This broker or none: the fetcher picks the next one itself.
                ep.bootstrap.clear();
                let c = ep.connect().await?;
                // A long poll must not look like a stalled connection.
                if c.request_timeout() <= self.config.max_wait {
                    c.set_request_timeout(self.config.max_wait + Duration::from_secs(5));
                }
                self.conn = Some((addr.to_string(), c.clone()));
                c
            }
        };
        let answer = conn
            .call(Request::Fetch {
                topic: self.config.topic.clone(),
                partition: self.config.partition,
                offset: self.offset,
                max_bytes: self.config.max_bytes,
                max_wait_ms: u32::try_from(self.config.max_wait.as_millis()).unwrap_or(u32::MAX),
                isolation: self.config.isolation,
            })
            .await?;
        let Response::Fetched {
            records,
            high_watermark,
            ..
        } = answer
        else {
            return Err(ClientError::Unexpected(format!("{answer:?}")));
        };
        self.high_watermark = high_watermark;
        self.answered_by = Some(addr.to_string());
        let records: Vec<FetchedRecord> = records
            .into_iter()
            .filter(|r| r.offset >= self.offset)
            .collect();
        for w in records.windows(2) {
            if w[1].offset <= w[0].offset {
                return Err(ClientError::Unexpected(format!(
                    "offsets out of order in a fetch answer: {} then {}",
                    w[0].offset, w[1].offset
                )));
            }
        }
        if let Some(last) = records.last() {
            self.offset = last.offset + 1;
        }
        Ok(records)
    }
}
