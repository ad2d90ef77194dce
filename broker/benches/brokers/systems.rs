//! The three systems behind one small client surface: a [`Sender`] that
//! starts a produce and hands back the future of its acknowledgement, and
//! a [`Receiver`] that takes one batch from a consumer group and
//! acknowledges (commits) it.
//!
//! - fissionlog-broker: [`Producer`] over a [`Connection`], [`Consumer`]
//!   (poll, then commit: durable when it returns);
//! - fissionlog-broker in cluster mode (which takes only routed
//!   produces, `ProduceTo`): one record a request as on one node, routed
//!   here with the topic's routing key and sent unstamped to the leader
//!   of its partition, one connection per leading broker ([`Routed`]);
//!   the batching shape through the idempotent [`Producer`] given all
//!   three brokers ([`Endpoint::with_bootstrap`]), which follows
//!   `not_leader` to each partition's leader. No consumer groups
//!   (cluster mode does not serve them);
//! - Redis Streams: `XADD` on a multiplexed connection (concurrent calls
//!   are pipelined), `XREADGROUP` then one `XACK` of the batch;
//! - NATS JetStream: publish and await the `PubAck`, a durable pull
//!   consumer with explicit acks (`fetch`, then `ack` each message); in
//!   the 3-node cluster the client is given every server and connects to
//!   one, which forwards to the stream's leader, as any NATS client does.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use fissionlog_broker::client::{
    Admin, Connection, Consumer, ConsumerConfig, Endpoint, Producer, ProducerConfig,
};
use fissionlog_broker::protocol::{Acks, ProduceRecord, RangeOwner, Request, Response, SyncSpec};
use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::R;

/// Topic (stream) the produce workloads write to.
const PRODUCE: &str = "p";
/// Topic (stream) the consume workloads read, filled beforehand.
const CONSUME: &str = "c";
/// Partitions of a fissionlog topic: one per consumer of the 4-member group.
const PARTITIONS: u32 = 4;
/// Records one consume call asks for at most.
pub const POLL_RECORDS: usize = 500;
/// Longest a cluster may take to elect the leaders a workload needs.
const ELECTION_LIMIT: Duration = Duration::from_secs(60);

/// Which system, and for fissionlog how durable an acknowledgement is.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Fissionlog {
        sync: SyncSpec,
        acks: Acks,
    },
    /// Three brokers in cluster mode: every partition a Raft group of
    /// three, a produce acknowledged once two replicas fsynced it.
    FissionlogCluster,
    Redis,
    /// `replicas` servers, the streams with as many replicas.
    Nats {
        replicas: usize,
    },
}

/// A running system's client side.
pub struct Target {
    pub kind: Kind,
    /// Every server's client port (one unless a cluster).
    pub ports: Vec<u16>,
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
    Routed(Box<Routed>),
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

async fn nats_context(ports: &[u16]) -> R<jetstream::Context> {
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let client = async_nats::connect(addrs).await?;
    Ok(jetstream::new(client))
}

fn addr(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

impl Target {
    fn port(&self) -> u16 {
        self.ports[0]
    }

    async fn fl_conn(&self) -> R<Connection> {
        Ok(Connection::connect(addr(self.port()), None).await?)
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
            Kind::FissionlogCluster => self.setup_fissionlog_cluster().await?,
            Kind::Redis => {
                let mut c = redis_conn(self.port()).await?;
                let _: () = redis::cmd("PING").query_async(&mut c).await?;
            }
            Kind::Nats { replicas } => self.setup_nats(replicas).await?,
        }
        Ok(())
    }

    /// Creates the produce topic through the first broker (retried while
    /// the controller elects its first leader), then waits until every
    /// broker names a leader for each of its partitions.
    async fn setup_fissionlog_cluster(&self) -> R<()> {
        let started = Instant::now();
        loop {
            // The Raft log store syncs every entry whatever the topic's
            // policy; Always is what the topic would say on one node.
            let made = async {
                Admin::new(self.fl_conn().await?)
                    .create_topic(PRODUCE, PARTITIONS, SyncSpec::Always, 0, false)
                    .await?;
                R::Ok(())
            }
            .await;
            match made {
                Ok(()) => break,
                Err(e) if started.elapsed() > ELECTION_LIMIT => {
                    return Err(format!(
                        "the cluster did not create topic {PRODUCE} within {ELECTION_LIMIT:?}: {e}"
                    )
                    .into())
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        for &port in &self.ports {
            self.wait_fissionlog_leaders(port, started).await?;
        }
        Ok(())
    }

    async fn wait_fissionlog_leaders(&self, port: u16, started: Instant) -> R<()> {
        loop {
            let last = match Connection::connect(addr(port), None).await {
                Ok(c) => match Admin::new(c).describe(PRODUCE).await {
                    Ok(v) => {
                        let parts = v["partitions"].as_array().cloned().unwrap_or_default();
                        let led = parts.iter().filter(|p| p["leader"].is_u64()).count();
                        if parts.len() == PARTITIONS as usize && led == parts.len() {
                            return Ok(());
                        }
                        v.to_string()
                    }
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            if started.elapsed() > ELECTION_LIMIT {
                return Err(format!(
                    "broker on port {port} named no leader for every partition of {PRODUCE} \
                     within {ELECTION_LIMIT:?} (it says {last})"
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates streams P and C with `replicas` replicas on file storage;
    /// with more than one, retried while JetStream elects its meta leader,
    /// then waits until each stream has a leader and every replica is
    /// current.
    async fn setup_nats(&self, replicas: usize) -> R<()> {
        let js = nats_context(&self.ports).await?;
        let started = Instant::now();
        for (name, subjects) in [("P", "p.>"), ("C", "c.>")] {
            let config = jetstream::stream::Config {
                name: name.into(),
                subjects: vec![subjects.into()],
                storage: jetstream::stream::StorageType::File,
                num_replicas: replicas,
                ..Default::default()
            };
            loop {
                match js.create_stream(config.clone()).await {
                    Ok(_) => break,
                    Err(e) if replicas == 1 || started.elapsed() > ELECTION_LIMIT => {
                        return Err(format!("cannot create stream {name}: {e}").into())
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
        if replicas == 1 {
            return Ok(());
        }
        for name in ["P", "C"] {
            loop {
                let last = match js.get_stream(name).await {
                    Ok(s) => match s.get_info().await {
                        Ok(info) => {
                            let ready = info.cluster.as_ref().is_some_and(|c| {
                                c.leader.is_some()
                                    && c.replicas.len() + 1 == replicas
                                    && c.replicas.iter().all(|r| r.current && !r.offline)
                            });
                            if ready {
                                break;
                            }
                            format!("{:?}", info.cluster)
                        }
                        Err(e) => e.to_string(),
                    },
                    Err(e) => e.to_string(),
                };
                if started.elapsed() > ELECTION_LIMIT {
                    return Err(format!(
                        "stream {name} has no leader with {} current replicas within \
                         {ELECTION_LIMIT:?} (cluster: {last})",
                        replicas - 1
                    )
                    .into());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
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
                let cfg = shaped(base, shape);
                Sender::Fissionlog(Producer::new(self.fl_conn().await?, cfg))
            }
            Kind::FissionlogCluster if shape != Shape::Batching => {
                Sender::Routed(Box::new(Routed::connect(self, topic).await?))
            }
            Kind::FissionlogCluster => {
                let base = ProducerConfig {
                    acks: Acks::Quorum,
                    idempotent: true,
                    ..ProducerConfig::new(topic)
                };
                let endpoint = Endpoint::with_bootstrap(self.ports.iter().map(|&p| addr(p)));
                Sender::Fissionlog(Producer::connect(endpoint, shaped(base, shape)).await?)
            }
            Kind::Redis => Sender::Redis(redis_conn(self.port()).await?, topic),
            Kind::Nats { .. } => Sender::Nats(nats_context(&self.ports).await?, topic),
        })
    }

    /// Makes `group` exist on the consume topic, reading from its start.
    pub async fn create_group(&self, group: &str) -> R<()> {
        match self.kind {
            // A fissionlog group starts at the earliest record on first join.
            Kind::Fissionlog { .. } => {}
            Kind::FissionlogCluster => return Err(NO_CLUSTER_GROUPS.into()),
            Kind::Redis => {
                let mut c = redis_conn(self.port()).await?;
                let _: () = redis::cmd("XGROUP")
                    .arg("CREATE")
                    .arg(CONSUME)
                    .arg(group)
                    .arg("0")
                    .arg("MKSTREAM")
                    .query_async(&mut c)
                    .await?;
            }
            Kind::Nats { .. } => {
                let js = nats_context(&self.ports).await?;
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
            Kind::FissionlogCluster => return Err(NO_CLUSTER_GROUPS.into()),
            Kind::Redis => Receiver::Redis {
                conn: redis_conn(self.port()).await?,
                group: group.into(),
                name: format!("c{idx}"),
            },
            Kind::Nats { .. } => {
                let js = nats_context(&self.ports).await?;
                let stream = js.get_stream("C").await?;
                Receiver::Nats(Box::new(stream.get_consumer(group).await?))
            }
        })
    }
}

/// A cluster-mode sender of one record per request: each record's
/// partition from the topic's routing key and ranges, the request sent
/// to that partition's leader (no stamp: one attempt, as the plain
/// producer makes on one node).
pub struct Routed {
    topic: &'static str,
    routing_key: [u64; 2],
    /// Active partitions, by range start.
    owners: Vec<RangeOwner>,
    /// The connection to each partition's leader.
    leaders: HashMap<u32, Connection>,
}

impl Routed {
    async fn connect(target: &Target, topic: &'static str) -> R<Routed> {
        let conn = target.fl_conn().await?;
        let Response::Topology {
            routing_key,
            partitions: mut owners,
            ..
        } = conn
            .call(Request::Topology {
                topic: topic.into(),
            })
            .await?
        else {
            return Err(format!("no topology for {topic}").into());
        };
        owners.sort_unstable_by_key(|o| o.start);
        let described = Admin::new(conn).describe(topic).await?;
        let mut by_broker: HashMap<u64, Connection> = HashMap::new();
        let mut leaders = HashMap::new();
        for p in described["partitions"].as_array().into_iter().flatten() {
            let (Some(id), Some(node)) = (p["id"].as_u64(), p["leader"].as_u64()) else {
                return Err(format!("{topic} has a partition without a leader: {p}").into());
            };
            let port = usize::try_from(node)
                .ok()
                .and_then(|n| target.ports.get(n.wrapping_sub(1)))
                .ok_or_else(|| format!("partition {id} is led by unknown node {node}"))?;
            let c = match by_broker.get(&node) {
                Some(c) => c.clone(),
                None => {
                    let c = Connection::connect(addr(*port), None).await?;
                    by_broker.insert(node, c.clone());
                    c
                }
            };
            leaders.insert(id as u32, c);
        }
        Ok(Routed {
            topic,
            routing_key,
            owners,
            leaders,
        })
    }

    async fn start(&self, key: Bytes, value: Bytes) -> R<AckFuture> {
        let h = fissionlog::key_hash(self.routing_key, &key);
        let partition = self
            .owners
            .get(self.owners.partition_point(|o| o.end < h))
            .map(|o| o.partition)
            .ok_or("the topic has no active partition")?;
        let conn = self
            .leaders
            .get(&partition)
            .ok_or_else(|| format!("no leader known for partition {partition}"))?;
        let pending = conn
            .start(Request::ProduceTo {
                topic: self.topic.into(),
                partition,
                acks: Acks::Quorum,
                stamp: None,
                records: vec![ProduceRecord {
                    key: Some(key),
                    value,
                    timestamp: None,
                }],
            })
            .await?;
        Ok(Box::pin(async move {
            match pending.wait().await? {
                Response::Produced { .. } => Ok(()),
                other => Err(format!("partition {partition} answered {other:?}").into()),
            }
        }))
    }
}

const NO_CLUSTER_GROUPS: &str = "cluster mode serves no consumer groups";

/// `base` with the request shape of `shape`.
fn shaped(base: ProducerConfig, shape: Shape) -> ProducerConfig {
    match shape {
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
            Sender::Routed(r) => r.start(key, value).await,
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
