//! A batching producer: records wait up to `linger` (or until a batch is
//! full) and go out as one produce request; at most `max_in_flight`
//! batches are unanswered at once. Batches are written in the order their
//! records were sent, and the server appends one connection's batches in
//! the order it read them, so per-key order holds.
//!
//! A producer made with [`Producer::connect`] connects again when its
//! connection drops (bounded by [`ProducerConfig::reconnect`]). The
//! idempotent one sends its unanswered batches again with the same
//! producer id and sequence numbers, so the server's dedup drops what it
//! had appended; the plain one can't tell what landed, so it fails its
//! unanswered batches and sends the next ones over the new connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::reconnect::{is_lost, redial, Endpoint, Reconnect};
use super::{ClientError, Connection};
use crate::protocol::{Acks, ProduceRecord, Request, Response};

/// Settings of a [`Producer`].
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// Topic to produce to.
    pub topic: String,
    /// What an acknowledgement means.
    pub acks: Acks,
    /// Longest a record waits for its batch to fill.
    pub linger: Duration,
    /// Records per batch at most.
    pub batch_records: usize,
    /// Bytes of keys and values per batch at most.
    pub batch_bytes: usize,
    /// Batches unanswered at once at most.
    pub max_in_flight: usize,
    /// Route records to partitions here, stamp each batch with a producer
    /// id and sequence numbers, and follow `moved` answers: a retry is
    /// never appended twice and a split never reorders a key (see
    /// docs/BROKER.md, "The idempotent producer").
    pub idempotent: bool,
    /// How a producer made with [`Producer::connect`] reconnects after
    /// its connection drops (unused by [`Producer::new`]).
    pub reconnect: Reconnect,
}

impl ProducerConfig {
    /// Defaults for `topic`: leader acks, 1 ms linger, 1,000 records or
    /// 1 MiB a batch, 8 batches in flight, [`Reconnect::default`].
    pub fn new(topic: &str) -> ProducerConfig {
        ProducerConfig {
            topic: topic.into(),
            acks: Acks::Leader,
            linger: Duration::from_millis(1),
            batch_records: 1000,
            batch_bytes: 1 << 20,
            max_in_flight: 8,
            idempotent: false,
            reconnect: Reconnect::default(),
        }
    }
}

pub(super) type Ack = Result<Option<(u32, u64)>, ClientError>;

pub(super) struct Item {
    pub(super) record: ProduceRecord,
    pub(super) ack: oneshot::Sender<Ack>,
}

/// Resolves to the record's partition and offset once acknowledged
/// (`None` under acks none).
pub struct SendFuture {
    rx: oneshot::Receiver<Ack>,
}

impl Future for SendFuture {
    type Output = Ack;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Ack> {
        Pin::new(&mut self.rx).poll(cx).map(|r| {
            r.unwrap_or_else(|_| Err(ClientError::Disconnected("the producer stopped".into())))
        })
    }
}

/// A batching producer over one [`Connection`].
#[derive(Debug, Clone)]
pub struct Producer {
    tx: mpsc::Sender<Item>,
}

impl Producer {
    /// Starts the producer's batching task over `conn`; a lost
    /// connection fails the records sent after it.
    pub fn new(conn: Connection, config: ProducerConfig) -> Producer {
        Producer::start(conn, None, config)
    }

    /// Connects to `endpoint` and starts a producer that connects again
    /// (TLS and token included) whenever its connection drops, within
    /// `config.reconnect`. Fails if the first connection can't be made.
    pub async fn connect(
        endpoint: Endpoint,
        config: ProducerConfig,
    ) -> Result<Producer, ClientError> {
        let conn = endpoint.connect().await?;
        Ok(Producer::start(conn, Some(endpoint), config))
    }

    fn start(conn: Connection, endpoint: Option<Endpoint>, config: ProducerConfig) -> Producer {
        let (tx, rx) = mpsc::channel(config.batch_records.max(1) * 2);
        if config.idempotent {
            tokio::spawn(super::idempotent::run(conn, endpoint, config, rx));
        } else {
            tokio::spawn(run(conn, endpoint, config, rx));
        }
        Producer { tx }
    }

    /// Queues one record (waits while the queue is full).
    pub async fn send(&self, key: Option<Bytes>, value: Bytes) -> SendFuture {
        let (ack, rx) = oneshot::channel();
        let item = Item {
            record: ProduceRecord {
                key,
                value,
                timestamp: None,
            },
            ack,
        };
        if let Err(mpsc::error::SendError(item)) = self.tx.send(item).await {
            let _ = item.ack.send(Err(ClientError::Disconnected(
                "the producer stopped".into(),
            )));
        }
        SendFuture { rx }
    }
}

/// A batch: `first` and what comes within the linger, up to the size
/// limits; `false` once the producer's queue closed.
pub(super) async fn gather(
    first: Item,
    rx: &mut mpsc::Receiver<Item>,
    config: &ProducerConfig,
) -> (Vec<Item>, bool) {
    let mut bytes = first.record.value.len();
    let mut batch = vec![first];
    let deadline = tokio::time::Instant::now() + config.linger;
    while batch.len() < config.batch_records && bytes < config.batch_bytes {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(item)) => {
                bytes += item.record.value.len() + item.record.key.as_ref().map_or(0, Bytes::len);
                batch.push(item);
            }
            Ok(None) => return (batch, false),
            Err(_) => break,
        }
    }
    (batch, true)
}

async fn run(
    mut conn: Connection,
    endpoint: Option<Endpoint>,
    config: ProducerConfig,
    mut rx: mpsc::Receiver<Item>,
) {
    let in_flight = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let mut open = true;
    while open {
        let Some(first) = rx.recv().await else { break };
        let (batch, still_open) = gather(first, &mut rx, &config).await;
        open = still_open;
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let (records, acks): (Vec<ProduceRecord>, Vec<oneshot::Sender<Ack>>) =
            batch.into_iter().map(|i| (i.record, i.ack)).unzip();
        let req = Request::Produce {
            topic: config.topic.clone(),
            acks: config.acks,
            records,
        };
        let mut started = conn.start(req.clone()).await;
        if let (Err(e), Some(ep)) = (&started, &endpoint) {
            // The write failed: the server got at most part of the frame,
            // which it never carries out, so it goes again over a new
            // connection.
            if is_lost(e) {
                let ready = |_| async { Ok(()) };
                started =
                    match redial(ep, &config.reconnect, tokio::time::Instant::now(), ready).await {
                        Ok((c, ())) => {
                            conn = c;
                            conn.start(req).await
                        }
                        Err(e) => Err(e),
                    };
            }
        }
        let pending = match started {
            Ok(p) => p,
            Err(e) => {
                for a in acks {
                    let _ = a.send(Err(super::reconnect::copy_error(&e)));
                }
                continue;
            }
        };
        tokio::spawn(async move {
            let r = pending.wait().await;
            drop(permit);
            match r {
                Ok(Response::Produced { positions }) => {
                    for (i, a) in acks.into_iter().enumerate() {
                        let _ = a.send(Ok(positions.get(i).copied()));
                    }
                }
                Ok(other) => {
                    for a in acks {
                        let _ = a.send(Err(ClientError::Unexpected(format!("{other:?}"))));
                    }
                }
                Err(e) => {
                    // Each record gets the server's own code and sentence
                    // (its `Display` adds the code's name once).
                    for a in acks {
                        let _ = a.send(Err(super::reconnect::copy_error(&e)));
                    }
                }
            }
        });
    }
}
