//! The three systems behind one small client surface: a [`Sender`] that
//! starts a produce and hands back the future of its acknowledgement, and
//! a [`Receiver`] that takes one batch from a consumer group and
//! acknowledges (commits) it.
//!
//! - fissionlog-broker: [`Producer`] over a [`Connection`], [`Consumer`]
//!   (poll, then commit: durable when it returns);
//! - Redis Streams: `XADD` on a multiplexed connection (concurrent calls
//!   are pipelined), `XREADGROUP` then one `XACK` of the batch;
//! - NATS JetStream: publish and await the `PubAck`, a durable pull
//!   consumer with explicit acks (`fetch`, then `ack` each message).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use fissionlog_broker::client::{
    Admin, Connection, Consumer, ConsumerConfig, Producer, ProducerConfig,
};
use fissionlog_broker::protocol::{Acks, SyncSpec};
use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;

use crate::R;

/// Topic (stream) the produce workloads write to.
const PRODUCE: &str = "p";
/// Topic (stream) the consume workloads read, filled beforehand.
const CONSUME: &str = "c";
/// Partitions of a fissionlog topic: one per consumer of the 4-member group.
const PARTITIONS: u32 = 4;
/// Records one consume call asks for at most.
pub const POLL_RECORDS: usize = 500;

/// Which system, and for fissionlog how durable an acknowledgement is.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Fissionlog { sync: SyncSpec, acks: Acks },
    Redis,
    Nats,
}

/// A running system's client side.
pub struct Target {
    pub kind: Kind,
    pub port: u16,
}

/// How a sender pipelines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One request per record, one outstanding.
    One,
    /// One request per record, up to 256 outstanding.
    Window,
    /// fissionlog's producer batching (1 ms linger, up to 256 records a
    /// request): many records per request, each acknowledged.
    Batching,
}

/// Resolves once the record it was made for is acknowledged.
pub type AckFuture = Pin<Box<dyn Future<Output = R<()>> + Send>>;

/// One connection that produces.
pub enum Sender {
    Fissionlog(Producer),
    Redis(MultiplexedConnection, &'static str),
    Nats(jetstream::Context, &'static str),
}

/// One consumer-group member.
pub enum Receiver {
    Fissionlog(Consumer),
    Redis {
        conn: MultiplexedConnection,
        group: String,
        name: String,
    },
    Nats(Box<jetstream::consumer::PullConsumer>),
}

fn redis_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

async fn redis_conn(port: u16) -> R<MultiplexedConnection> {
    let client = redis::Client::open(redis_url(port))?;
    // A busy machine and fsync-per-write replies can take longer than the
    // client's default half second.
    let cfg = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(60)))
        .set_connection_timeout(Some(Duration::from_secs(10)));
    Ok(client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await?)
}

async fn nats_context(port: u16) -> R<jetstream::Context> {
    let client = async_nats::connect(format!("127.0.0.1:{port}")).await?;
    Ok(jetstream::new(client))
}

impl Target {
    async fn fl_conn(&self) -> R<Connection> {
        Ok(Connection::connect(("127.0.0.1", self.port), None).await?)
    }

    /// Creates the produce and consume topics (streams).
    pub async fn setup(&self) -> R<()> {
        match self.kind {
            Kind::Fissionlog { sync, .. } => {
                let admin = Admin::new(self.fl_conn().await?);
                for t in [PRODUCE, CONSUME] {
                    admin.create_topic(t, PARTITIONS, sync, 0, false).await?;
                }
            }
            Kind::Redis => {
                let mut c = redis_conn(self.port).await?;
                let _: () = redis::cmd("PING").query_async(&mut c).await?;
            }
            Kind::Nats => {
                let js = nats_context(self.port).await?;
                for (name, subjects) in [("P", "p.>"), ("C", "c.>")] {
                    js.create_stream(jetstream::stream::Config {
                        name: name.into(),
                        subjects: vec![subjects.into()],
                        storage: jetstream::stream::StorageType::File,
                        ..Default::default()
                    })
                    .await?;
                }
            }
        }
        Ok(())
    }

    /// A sender to the produce topic, or with `preload` to the consume topic.
    pub async fn sender(&self, shape: Shape, preload: bool) -> R<Sender> {
        let topic = if preload { CONSUME } else { PRODUCE };
        Ok(match self.kind {
            Kind::Fissionlog { acks, .. } => {
                let base = ProducerConfig {
                    acks,
                    ..ProducerConfig::new(topic)
                };
                let cfg = match shape {
                    Shape::One | Shape::Window => ProducerConfig {
                        linger: Duration::ZERO,
                        batch_records: 1,
                        max_in_flight: if shape == Shape::One { 1 } else { 256 },
                        ..base
                    },
                    Shape::Batching => ProducerConfig {
                        linger: Duration::from_millis(1),
                        batch_records: 256,
                        max_in_flight: 8,
                        ..base
                    },
                };
                Sender::Fissionlog(Producer::new(self.fl_conn().await?, cfg))
            }
            Kind::Redis => Sender::Redis(redis_conn(self.port).await?, topic),
            Kind::Nats => Sender::Nats(nats_context(self.port).await?, topic),
        })
    }

    /// Makes `group` exist on the consume topic, reading from its start.
    pub async fn create_group(&self, group: &str) -> R<()> {
        match self.kind {
            // A fissionlog group starts at the earliest record on first join.
            Kind::Fissionlog { .. } => {}
            Kind::Redis => {
                let mut c = redis_conn(self.port).await?;
                let _: () = redis::cmd("XGROUP")
                    .arg("CREATE")
                    .arg(CONSUME)
                    .arg(group)
                    .arg("0")
                    .arg("MKSTREAM")
                    .query_async(&mut c)
                    .await?;
            }
            Kind::Nats => {
                let js = nats_context(self.port).await?;
                let stream = js.get_stream("C").await?;
                stream
                    .create_consumer(jetstream::consumer::pull::Config {
                        durable_name: Some(group.into()),
                        ack_policy: jetstream::consumer::AckPolicy::Explicit,
                        // Room for every member's batch to be unacknowledged at once.
                        max_ack_pending: 64 * POLL_RECORDS as i64,
                        ..Default::default()
                    })
                    .await?;
            }
        }
        Ok(())
    }

    /// Member `idx` of `group`, on a connection of its own.
    pub async fn receiver(&self, group: &str, idx: usize) -> R<Receiver> {
        Ok(match self.kind {
            Kind::Fissionlog { .. } => {
                let cfg = ConsumerConfig {
                    // Generous: a busy machine must not declare a member dead.
                    session_timeout: Duration::from_secs(30),
                    processing_timeout: Duration::from_secs(60),
                    ..ConsumerConfig::new(CONSUME, group)
                };
                Receiver::Fissionlog(Consumer::join(self.fl_conn().await?, cfg).await?)
            }
            Kind::Redis => Receiver::Redis {
                conn: redis_conn(self.port).await?,
                group: group.into(),
                name: format!("c{idx}"),
            },
            Kind::Nats => {
                let js = nats_context(self.port).await?;
                let stream = js.get_stream("C").await?;
                Receiver::Nats(Box::new(stream.get_consumer(group).await?))
            }
        })
    }
}

impl Sender {
    /// Sends one record; the future resolves at its acknowledgement.
    pub async fn start(&self, key: Bytes, value: Bytes) -> R<AckFuture> {
        match self {
            Sender::Fissionlog(p) => {
                let ack = p.send(Some(key), value).await;
                Ok(Box::pin(async move {
                    ack.await?;
                    Ok(())
                }))
            }
            Sender::Redis(conn, stream) => {
                let mut conn = conn.clone();
                let mut cmd = redis::cmd("XADD");
                cmd.arg(*stream)
                    .arg("*")
                    .arg("k")
                    .arg(key.as_ref())
                    .arg("v")
                    .arg(value.as_ref());
                Ok(Box::pin(async move {
                    let _id: String = cmd.query_async(&mut conn).await?;
                    Ok(())
                }))
            }
            Sender::Nats(js, prefix) => {
                // The key is the subject's last token (NATS has no record key).
                let subject = format!("{prefix}.{}", String::from_utf8_lossy(&key));
                let ack = js.publish(subject, value).await?;
                Ok(Box::pin(async move {
                    ack.await?;
                    Ok(())
                }))
            }
        }
    }
}

impl Receiver {
    /// Takes up to [`POLL_RECORDS`] records and acknowledges them; returns
    /// how many came (0: none was there within a short wait).
    pub async fn batch(&mut self) -> R<u64> {
        match self {
            Receiver::Fissionlog(c) => {
                let recs = c
                    .poll(POLL_RECORDS as u32, Duration::from_millis(50))
                    .await?;
                if !recs.is_empty() {
                    c.commit().await?;
                }
                Ok(recs.len() as u64)
            }
            Receiver::Redis { conn, group, name } => {
                let reply: Option<redis::streams::StreamReadReply> = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(group.as_str())
                    .arg(name.as_str())
                    .arg("COUNT")
                    .arg(POLL_RECORDS)
                    .arg("STREAMS")
                    .arg(CONSUME)
                    .arg(">")
                    .query_async(conn)
                    .await?;
                let ids: Vec<String> = reply
                    .into_iter()
                    .flat_map(|r| r.keys)
                    .flat_map(|k| k.ids)
                    .map(|i| i.id)
                    .collect();
                if !ids.is_empty() {
                    let _: u64 = redis::cmd("XACK")
                        .arg(CONSUME)
                        .arg(group.as_str())
                        .arg(&ids)
                        .query_async(conn)
                        .await?;
                }
                Ok(ids.len() as u64)
            }
            Receiver::Nats(consumer) => {
                let mut msgs = consumer
                    .fetch()
                    .max_messages(POLL_RECORDS)
                    .messages()
                    .await?;
                let mut n = 0;
                while let Some(m) = msgs.next().await {
                    m?.ack().await?;
                    n += 1;
                }
                Ok(n)
            }
        }
    }
}
