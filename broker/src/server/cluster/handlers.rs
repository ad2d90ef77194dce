//! What each request does in cluster mode.
//!
//! - `CreateTopic` becomes the controller's `CreateTopic`, proposed here
//!   or forwarded to the controller's leader; each partition gets three
//!   replicas (all nodes when there are fewer), its preferred leader
//!   rotating over the nodes. Answered once this broker's controller
//!   replica has the topic and every partition group it hosts has a
//!   leader.
//! - `ProduceTo` with `acks=quorum` is appended through the partition's
//!   Raft group when this broker leads it, answered after commit; the
//!   idempotent stamp goes with the entry, so a retry through another
//!   leader is answered with the first copy's offsets. Elsewhere it is
//!   answered `not_leader` with the leader's address. `acks=leader` and
//!   `acks=none` are refused: a replicated write is acknowledged once a
//!   quorum holds it, never earlier. An unrouted `Produce` is refused
//!   (it may span partitions led by different brokers).
//! - `Fetch` reads committed records (never past the high watermark this
//!   replica knows) from any replica hosting the partition; whatever the
//!   isolation asked, a cluster read is committed.
//! - `Topology`, `ListTopics`, `Describe` come from this broker's
//!   controller replica (which may lag the leader's by a heartbeat).
//! - `InitProducer` is the controller's: a new id from the cluster's one
//!   sequence (never handed out again, also after a controller leader
//!   change), or a known id's next epoch, which fences its older ones. A
//!   stamped `ProduceTo` of an id this broker's controller replica has
//!   not seen handed out is `invalid_request`, one of an epoch older than
//!   the id's latest is `producer_fenced`.
//! - Consumer groups, splits, merges, tail splits and hot-key modes are
//!   refused with `unsupported`.
//!
//! The routing key of a topic (what `Topology` gives clients) is 128
//! random bits the broker proposing its `CreateTopic` drew, kept in the
//! controller's `TopicMeta`: every broker routes with it, and a client
//! without it (without write access) cannot aim keys at one partition.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fissionlog_raft::client::{ClientCall, ClientReply, NodeClient, PartitionRoute};
use fissionlog_raft::controller::{
    ControllerAnswer, ControllerCommand, ReplicaPlacement, TopicMeta,
};
use fissionlog_raft::types::{CommandResponse, GroupId, NodeId, ProducerStamp, RecordIn};
use serde_json::json;
use tokio::sync::mpsc;

use super::Cluster;
use crate::protocol::{
    Acks, ErrorCode, FetchedRecord, ProduceRecord, RangeOwner, Request, Response, Stamp,
};
use crate::server::auth::Access;
use crate::server::conn::{Conn, InFlight};
use crate::server::handlers::{json_reply, refused, topic_config, RECORD_OVERHEAD};

/// Replicas per partition (fewer when the cluster has fewer nodes).
pub const REPLICAS: usize = 3;
/// How long a request waits for a partition (or the controller) to have
/// a leader before it is answered `not_leader` without one.
const LEADER_WAIT: Duration = Duration::from_secs(3);
/// How long a create waits for the topic's groups to have leaders.
const CREATE_WAIT: Duration = Duration::from_secs(10);
/// How long one node-to-node call may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a broker without a replica of a partition waits for a
/// replica's answer to who leads it.
const ASK_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a wait looks again.
const STEP: Duration = Duration::from_millis(20);
/// Largest number of records one fetch asks the replica for.
const FETCH_RECORDS: u32 = 10_000;

/// One produce request waiting for its turn on its connection.
pub(crate) type ProduceItem = (u32, Request, InFlight);

/// Carries out one request that is not a produce and queues its answer.
pub(crate) async fn dispatch(
    conn: Arc<Conn>,
    c: Arc<Cluster>,
    request_id: u32,
    req: Request,
    mut slot: InFlight,
) {
    let opcode = req.opcode();
    let r = route(&conn, &c, req)
        .await
        .unwrap_or_else(|e| error(opcode, e));
    slot.release();
    conn.respond(request_id, r).await;
}

/// A connection's produce requests, carried out one after another in the
/// order they were read: a producer's batches reach the partition's
/// leader in sequence order.
pub(crate) async fn produce_loop(
    conn: Arc<Conn>,
    c: Arc<Cluster>,
    mut rx: mpsc::Receiver<ProduceItem>,
) {
    while let Some((request_id, req, mut slot)) = rx.recv().await {
        let opcode = req.opcode();
        let r = produce(&conn, &c, req)
            .await
            .unwrap_or_else(|e| error(opcode, e));
        slot.release();
        conn.respond(request_id, r).await;
    }
}

/// A refusal, or a `not_leader` answer, as the response to send.
enum Refusal {
    Code(ErrorCode, String),
    NotLeader(String, Option<String>),
}

impl From<(ErrorCode, String)> for Refusal {
    fn from((code, message): (ErrorCode, String)) -> Refusal {
        Refusal::Code(code, message)
    }
}

fn error(opcode: u8, e: Refusal) -> Response {
    match e {
        Refusal::Code(code, message) => Response::Error {
            opcode,
            code,
            message,
        },
        Refusal::NotLeader(message, leader) => Response::NotLeader {
            opcode,
            message,
            leader,
        },
    }
}

type Answer = Result<Response, Refusal>;

fn allowed(conn: &Conn, access: Access<'_>) -> Result<(), Refusal> {
    if conn.shared.config.authorizer.allow(&conn.principal, access) {
        Ok(())
    } else {
        Err(refused(ErrorCode::Unauthorized, "not allowed").into())
    }
}

async fn route(conn: &Conn, c: &Cluster, req: Request) -> Answer {
    let opcode = req.opcode();
    match req {
        Request::CreateTopic {
            topic,
            partitions,
            sync,
            max_record_bytes,
            target_bytes_per_sec,
            ..
        } => {
            allowed(conn, Access::Admin(Some(&topic)))?;
            let mut cfg = topic_config(
                partitions,
                sync,
                max_record_bytes,
                target_bytes_per_sec,
                false,
            );
            cfg.replicated = true;
            create_topic(c, &topic, cfg).await?;
            Ok(json_reply(
                opcode,
                json!({"topic": topic, "partitions": (0..partitions).collect::<Vec<u32>>()}),
            )?)
        }
        Request::ListTopics => {
            allowed(conn, Access::Admin(None))?;
            let names: Vec<String> = c
                .node()
                .with_controller_state(|s| s.topics.keys().cloned().collect())
                .unwrap_or_default();
            Ok(json_reply(opcode, json!({ "topics": names }))?)
        }
        Request::Describe { topic } => {
            allowed(conn, Access::Admin(Some(&topic)))?;
            describe(c, opcode, &topic).await
        }
        Request::Topology { topic } => {
            allowed(conn, Access::Write(&topic))?;
            let meta = topic_meta(c, &topic)?;
            Ok(Response::Topology {
                epoch: meta.history.len() as u64,
                routing_key: meta.hash_key,
                partitions: owners(&meta),
            })
        }
        Request::InitProducer { producer_id } => init_producer(c, producer_id).await,
        Request::Fetch {
            topic,
            partition,
            offset,
            max_bytes,
            max_wait_ms,
            ..
        } => {
            allowed(conn, Access::Read(&topic))?;
            let wait =
                Duration::from_millis(u64::from(max_wait_ms)).min(conn.shared.config.max_wait);
            fetch(conn, c, &topic, partition, offset, max_bytes, wait).await
        }
        other => Err(refused(
            ErrorCode::Unsupported,
            format!(
                "{} is not available in cluster mode yet (docs/BROKER.md, \"Cluster mode\")",
                other.name()
            ),
        )
        .into()),
    }
}

/// A new topic's routing hash key: 128 bits from the OS's random source,
/// drawn once by the broker that proposes the create and carried in the
/// controller's command, so every broker routes with the same key.
fn new_hash_key() -> Result<[u64; 2], Refusal> {
    let mut key = [0u8; 16];
    getrandom::fill(&mut key).map_err(|e| {
        Refusal::from(refused(
            ErrorCode::Internal,
            format!("no random routing key: {e}"),
        ))
    })?;
    let (a, b) = key.split_at(8);
    let word = |w: &[u8]| {
        let mut x = [0u8; 8];
        x.copy_from_slice(w);
        u64::from_le_bytes(x)
    };
    Ok([word(a), word(b)])
}

/// `InitProducer` through the controller: a new id, or `producer_id`'s
/// next epoch.
async fn init_producer(c: &Cluster, producer_id: Option<u64>) -> Answer {
    match propose(c, ControllerCommand::InitProducer { producer_id }).await? {
        ControllerAnswer::ProducerInit { producer_id, epoch } => {
            Ok(Response::ProducerInit { producer_id, epoch })
        }
        ControllerAnswer::Refused { reason } if reason.contains("never handed out") => {
            Err(refused(ErrorCode::InvalidRequest, reason).into())
        }
        ControllerAnswer::Refused { reason } => Err(refused(ErrorCode::Refused, reason).into()),
        other => Err(refused(
            ErrorCode::Internal,
            format!("the controller answered {other:?}"),
        )
        .into()),
    }
}

/// A stamped produce's id must have been handed out, and its epoch must
/// not be older than the id's latest, as this broker's controller
/// replica knows them. The replica may lag the controller's leader by a
/// heartbeat, so an id it has not seen yet is waited for a little.
async fn check_producer(c: &Cluster, stamp: &Stamp) -> Result<(), Refusal> {
    let started = Instant::now();
    loop {
        let known = c
            .node()
            .with_controller_state(|s| {
                let p = &s.producers;
                p.handed_out(stamp.producer_id)
                    .then(|| p.epoch(stamp.producer_id))
            })
            .flatten();
        match known {
            Some(current) if stamp.epoch < current => {
                return Err(refused(
                    ErrorCode::ProducerFenced,
                    format!(
                        "producer {} epoch {} is fenced by epoch {current}",
                        stamp.producer_id, stamp.epoch
                    ),
                )
                .into())
            }
            Some(_) => return Ok(()),
            None if stamp.producer_id != 0 && started.elapsed() < LEADER_WAIT => {
                tokio::time::sleep(STEP).await
            }
            None => {
                return Err(refused(
                    ErrorCode::InvalidRequest,
                    format!(
                        "producer id {} was never handed out: ask InitProducer for one",
                        stamp.producer_id
                    ),
                )
                .into())
            }
        }
    }
}

fn owners(meta: &TopicMeta) -> Vec<RangeOwner> {
    let mut v: Vec<RangeOwner> = meta
        .partitions
        .iter()
        .filter(|(_, p)| p.active)
        .map(|(&id, p)| RangeOwner {
            partition: id,
            start: p.start,
            end: p.end,
        })
        .collect();
    v.sort_unstable_by_key(|o| o.start);
    v
}

fn topic_meta(c: &Cluster, name: &str) -> Result<TopicMeta, Refusal> {
    c.node()
        .with_controller_state(|s| s.topics.get(name).cloned())
        .flatten()
        .ok_or_else(|| refused(ErrorCode::UnknownTopic, format!("unknown topic {name}")).into())
}

/// Where partition `p` of a topic goes: `REPLICAS` nodes from the
/// `p`-th on, so preferred leaders rotate over the nodes.
fn placement(nodes: &[NodeId], partitions: u32) -> Vec<ReplicaPlacement> {
    let rf = REPLICAS.min(nodes.len());
    (0..partitions as usize)
        .map(|p| ReplicaPlacement {
            replicas: (0..rf).map(|i| nodes[(p + i) % nodes.len()]).collect(),
        })
        .collect()
}

/// Proposes `cmd` to the controller: here when this node leads it, else
/// forwarded to the leader it names.
async fn propose(c: &Cluster, cmd: ControllerCommand) -> Result<ControllerAnswer, Refusal> {
    let started = Instant::now();
    let mut at: Option<String> = None;
    loop {
        let call = ClientCall::Controller(Box::new(cmd.clone()));
        let reply =
            match &at {
                None => c.call(call).await,
                Some(addr) => match NodeClient::connect(addr, FORWARD_TIMEOUT).await {
                    Ok(mut nc) => nc.call(call, FORWARD_TIMEOUT).await.unwrap_or_else(|e| {
                        ClientReply::Failed {
                            reason: e.to_string(),
                        }
                    }),
                    Err(e) => ClientReply::Failed {
                        reason: e.to_string(),
                    },
                },
            };
        match reply {
            ClientReply::Applied(CommandResponse::Controller(r)) => return Ok(r.answer),
            ClientReply::NotLeader {
                leader_addr: Some(a),
                ..
            } => at = Some(a),
            ClientReply::NotLeader { .. } | ClientReply::Failed { .. } => at = None,
            other => {
                return Err(refused(
                    ErrorCode::Internal,
                    format!("the controller answered {other:?}"),
                )
                .into())
            }
        }
        if started.elapsed() > LEADER_WAIT {
            return Err(Refusal::NotLeader(
                "the controller has no reachable leader".into(),
                None,
            ));
        }
        tokio::time::sleep(STEP).await;
    }
}

async fn create_topic(
    c: &Cluster,
    name: &str,
    cfg: fissionlog::TopicConfig,
) -> Result<(), Refusal> {
    if cfg.partitions == 0 {
        return Err(refused(ErrorCode::InvalidRequest, "a topic needs a partition").into());
    }
    let nodes: Vec<NodeId> = c.peers().keys().copied().collect();
    let cmd = ControllerCommand::CreateTopic {
        name: name.to_string(),
        placement: placement(&nodes, cfg.partitions),
        config: cfg,
        hash_key: new_hash_key()?,
    };
    match propose(c, cmd).await? {
        ControllerAnswer::TopicCreated => {}
        ControllerAnswer::Refused { reason } if reason.contains("exists") => {
            return Err(refused(ErrorCode::TopicExists, reason).into())
        }
        ControllerAnswer::Refused { reason } => {
            return Err(refused(ErrorCode::InvalidRequest, reason).into())
        }
        other => {
            return Err(refused(
                ErrorCode::Internal,
                format!("the controller answered {other:?}"),
            )
            .into())
        }
    }
    // Answered once this replica has the topic and its groups here lead
    // or follow someone: a produce right after finds a leader.
    let started = Instant::now();
    while started.elapsed() < CREATE_WAIT {
        if let Ok(meta) = topic_meta(c, name) {
            let mut ready = true;
            for (&p, m) in &meta.partitions {
                if m.placement.replicas.contains(&c.node_id())
                    && leader_of(c, GroupId::partition(meta.id, p))
                        .await
                        .0
                        .is_none()
                {
                    ready = false;
                }
            }
            if ready {
                return Ok(());
            }
        }
        tokio::time::sleep(STEP).await;
    }
    Ok(())
}

/// The leader this node knows for `group` and its high watermark here;
/// `(None, None)` when the group is not hosted here.
async fn leader_of(c: &Cluster, group: GroupId) -> (Option<NodeId>, Option<u64>) {
    match c.call(ClientCall::Status { group }).await {
        ClientReply::Status {
            leader,
            committed_end,
            ..
        } => (leader, Some(committed_end)),
        _ => (None, None),
    }
}

async fn describe(c: &Cluster, opcode: u8, name: &str) -> Answer {
    let meta = topic_meta(c, name)?;
    let mut parts = Vec::new();
    for (&p, m) in &meta.partitions {
        let group = GroupId::partition(meta.id, p);
        let (leader, hw) = leader_of(c, group).await;
        let children: Vec<u32> = meta
            .partitions
            .iter()
            .filter(|(_, q)| q.parents.contains(&p))
            .map(|(&id, _)| id)
            .collect();
        parts.push(json!({
            "id": p,
            "key_start": format!("{:#018x}", m.start),
            "key_end": format!("{:#018x}", m.end),
            "state": if m.active { "active" } else { "sealed" },
            "parents": m.parents,
            "children": children,
            "replicas": m.placement.replicas,
            "leader": leader,
            "leader_addr": leader.and_then(|l| c.peers().get(&l).cloned()),
            // What this replica has committed: retention is not applied
            // to replicated partitions yet, so they start at 0.
            "start_offset": hw.map(|_| 0),
            "end_offset": hw,
            "high_watermark": hw,
        }));
    }
    let generation = meta.history.len();
    Ok(json_reply(
        opcode,
        json!({"topic": name, "id": meta.id, "generation": generation, "node": c.node_id(), "partitions": parts}),
    )?)
}

/// The route of `partition`, and the hint for a broker that does not
/// host it: its preferred leader.
fn partition_route(meta: &TopicMeta, partition: u32) -> Result<PartitionRoute, Refusal> {
    let m = meta.partitions.get(&partition).ok_or_else(|| {
        Refusal::from(refused(
            ErrorCode::UnknownPartition,
            format!("no partition {partition}"),
        ))
    })?;
    Ok(PartitionRoute {
        partition,
        group: GroupId::partition(meta.id, partition),
        replicas: m.placement.replicas.clone(),
        active: m.active,
    })
}

/// The refusal of a request for a partition this broker holds no replica
/// of, naming where to send it: see [`replica_to_ask`].
async fn not_hosted(c: &Cluster, route: &PartitionRoute) -> Refusal {
    Refusal::NotLeader(
        format!(
            "partition {} has no replica on node {} (its replicas are nodes {:?})",
            route.partition,
            c.node_id(),
            route.replicas
        ),
        replica_to_ask(c, route).await,
    )
}

/// Where a broker without a replica of `route` sends a client: it asks
/// every replica at once who leads the partition's group, and names the
/// leader when the leader itself answered, else the first replica in
/// placement order that answered (a replica serves fetches itself and
/// names the leader to a produce); `None` when no replica answered within
/// [`ASK_TIMEOUT`] (the client retries). Naming the preferred leader
/// without asking would send every client to a dead broker for as long as
/// the preferred leader is down.
async fn replica_to_ask(c: &Cluster, route: &PartitionRoute) -> Option<String> {
    let mut asks = tokio::task::JoinSet::new();
    for &r in &route.replicas {
        let Some(addr) = c.peers().get(&r).cloned() else {
            continue;
        };
        let group = route.group;
        asks.spawn(async move {
            let mut nc = NodeClient::connect(&addr, ASK_TIMEOUT).await.ok()?;
            match nc.call(ClientCall::Status { group }, ASK_TIMEOUT).await {
                Ok(ClientReply::Status { leader, .. }) => Some((r, leader)),
                _ => None,
            }
        });
    }
    let mut answered: BTreeMap<NodeId, Option<NodeId>> = BTreeMap::new();
    while let Some(done) = asks.join_next().await {
        if let Ok(Some((r, leader))) = done {
            answered.insert(r, leader);
        }
    }
    let leader = answered
        .values()
        .flatten()
        .find(|l| answered.contains_key(l))
        .copied();
    let first_alive = route
        .replicas
        .iter()
        .find(|r| answered.contains_key(r))
        .copied();
    leader
        .or(first_alive)
        .and_then(|n| c.peers().get(&n).cloned())
}

async fn produce(conn: &Conn, c: &Cluster, req: Request) -> Answer {
    let Request::ProduceTo {
        topic,
        partition,
        acks,
        stamp,
        records,
    } = req
    else {
        return Err(refused(
            ErrorCode::Unsupported,
            "cluster mode takes routed produces only (ProduceTo: the idempotent producer); \
             an unrouted produce may span partitions led by different brokers",
        )
        .into());
    };
    allowed(conn, Access::Write(&topic))?;
    if acks != Acks::Quorum {
        return Err(refused(
            ErrorCode::InvalidRequest,
            "cluster mode acknowledges a produce once a quorum of replicas holds it: use acks=quorum",
        )
        .into());
    }
    if records.is_empty() {
        return Err(refused(ErrorCode::InvalidRequest, "a produce needs a record").into());
    }
    let meta = topic_meta(c, &topic)?;
    let route = partition_route(&meta, partition)?;
    if !route.active {
        return Err(refused(
            ErrorCode::Refused,
            format!("partition {partition} is sealed"),
        )
        .into());
    }
    check_keys(&meta, partition, &records)?;
    if !route.replicas.contains(&c.node_id()) {
        return Err(not_hosted(c, &route).await);
    }
    if let Some(s) = &stamp {
        check_producer(c, s).await?;
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let count = records.len();
    let call = ClientCall::Append {
        group: route.group,
        producer: stamp.map(raft_stamp),
        records: records.into_iter().map(|r| record_in(r, now_ms)).collect(),
    };
    let started = Instant::now();
    loop {
        let reply = tokio::time::timeout(conn.shared.config.durable_timeout, c.call(call.clone()))
            .await
            .map_err(|_| {
                Refusal::from(refused(
                    ErrorCode::Storage,
                    "not committed within the durable timeout",
                ))
            })?;
        match reply {
            ClientReply::Applied(r) => return applied(partition, count, stamp, r),
            ClientReply::NotLeader {
                leader_addr: Some(a),
                ..
            } => {
                return Err(Refusal::NotLeader(
                    format!("node {} does not lead partition {partition}", c.node_id()),
                    Some(a),
                ))
            }
            // An election is going on: wait a little for its outcome
            // (this node may win it).
            ClientReply::NotLeader { .. } if started.elapsed() < LEADER_WAIT => {
                tokio::time::sleep(STEP * 5).await
            }
            ClientReply::NotLeader { .. } => {
                return Err(Refusal::NotLeader(
                    format!("partition {partition} has no leader yet: retry"),
                    None,
                ))
            }
            ClientReply::Failed { reason } if reason.contains("not hosted") => {
                // Placed here, but the group is not started yet.
                if started.elapsed() > LEADER_WAIT {
                    return Err(Refusal::NotLeader(reason, None));
                }
                tokio::time::sleep(STEP * 5).await
            }
            ClientReply::Failed { reason } => {
                return Err(refused(ErrorCode::Storage, reason).into())
            }
            other => {
                return Err(
                    refused(ErrorCode::Internal, format!("the node answered {other:?}")).into(),
                )
            }
        }
    }
}

fn raft_stamp(s: Stamp) -> ProducerStamp {
    ProducerStamp {
        producer_id: s.producer_id,
        epoch: s.epoch,
        first_sequence: s.first_sequence,
    }
}

fn record_in(r: ProduceRecord, now_ms: i64) -> RecordIn {
    RecordIn {
        key: r.key.map(|k| k.to_vec()),
        value: r.value.to_vec(),
        timestamp_ms: r.timestamp.unwrap_or(now_ms),
    }
}

/// Every keyed record must belong to `partition` under the topic's
/// routing: a key routed elsewhere would break its order.
fn check_keys(meta: &TopicMeta, partition: u32, records: &[ProduceRecord]) -> Result<(), Refusal> {
    let key = meta.hash_key;
    let Some(m) = meta.partitions.get(&partition) else {
        return Ok(());
    };
    for r in records {
        if let Some(k) = r.key.as_deref() {
            let h = fissionlog::key_hash(key, k);
            if h < m.start || h > m.end {
                return Err(refused(
                    ErrorCode::InvalidRequest,
                    format!("a key's hash is outside partition {partition}'s range"),
                )
                .into());
            }
        }
    }
    Ok(())
}

fn applied(partition: u32, count: usize, stamp: Option<Stamp>, r: CommandResponse) -> Answer {
    match r {
        CommandResponse::Appended { base_offset, .. }
        | CommandResponse::Duplicate { base_offset, .. } => Ok(Response::Produced {
            positions: (0..count as u64)
                .map(|i| (partition, base_offset + i))
                .collect(),
        }),
        CommandResponse::OutOfOrderSequence {
            producer_id,
            expected,
            received,
        } => Err(refused(
            ErrorCode::OutOfOrderSequence,
            format!(
                "producer {producer_id} partition {partition}: batch from sequence {received} but {expected} is next"
            ),
        )
        .into()),
        CommandResponse::ProducerFenced {
            producer_id,
            epoch,
            current_epoch,
        } => Err(refused(
            ErrorCode::ProducerFenced,
            format!("producer {producer_id} epoch {epoch} is fenced by epoch {current_epoch}"),
        )
        .into()),
        CommandResponse::Sealed { .. } => {
            Err(refused(ErrorCode::Refused, format!("partition {partition} is sealed")).into())
        }
        other => Err(refused(
            ErrorCode::Internal,
            format!("the partition group answered {other:?} (stamp {stamp:?})"),
        )
        .into()),
    }
}

async fn fetch(
    conn: &Conn,
    c: &Cluster,
    topic: &str,
    partition: u32,
    offset: u64,
    max_bytes: u32,
    wait: Duration,
) -> Answer {
    let meta = topic_meta(c, topic)?;
    let route = partition_route(&meta, partition)?;
    if !route.replicas.contains(&c.node_id()) {
        return Err(not_hosted(c, &route).await);
    }
    let started = Instant::now();
    let mut shutdown = conn.shared.shutdown.clone();
    loop {
        let reply = c
            .call(ClientCall::Read {
                group: route.group,
                from_offset: offset,
                max_records: FETCH_RECORDS,
            })
            .await;
        let (records, committed_end) = match reply {
            ClientReply::Records {
                records,
                committed_end,
            } => (records, committed_end),
            ClientReply::Failed { reason } if reason.contains("not hosted") => {
                // Placed here, not started yet: nothing committed here.
                (Vec::new(), 0)
            }
            ClientReply::Failed { reason } => {
                return Err(refused(ErrorCode::Storage, reason).into())
            }
            other => {
                return Err(
                    refused(ErrorCode::Internal, format!("the node answered {other:?}")).into(),
                )
            }
        };
        if !records.is_empty() || started.elapsed() >= wait || *shutdown.borrow_and_update() {
            return Ok(fetched(
                partition,
                offset,
                committed_end,
                records,
                max_bytes,
            ));
        }
        tokio::select! {
            _ = tokio::time::sleep(STEP) => {}
            _ = shutdown.changed() => {}
        }
    }
}

fn fetched(
    partition: u32,
    offset: u64,
    committed_end: u64,
    records: Vec<fissionlog_raft::client::ReadRecord>,
    max_bytes: u32,
) -> Response {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for r in records {
        // Never past the high watermark, whatever the replica's read
        // returned (it stops there too; this is the second check).
        if r.offset >= committed_end {
            break;
        }
        bytes += r.value.len() + r.key.as_ref().map_or(0, Vec::len) + RECORD_OVERHEAD;
        if bytes > max_bytes as usize && !out.is_empty() {
            break;
        }
        out.push(FetchedRecord {
            offset: r.offset,
            timestamp: r.timestamp_ms,
            key: r.key.map(Bytes::from),
            value: Bytes::from(r.value),
        });
    }
    let next_offset = out.last().map_or(offset, |r: &FetchedRecord| r.offset + 1);
    Response::Fetched {
        partition,
        next_offset,
        high_watermark: committed_end,
        records: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_rotates_preferred_leaders_and_keeps_three_replicas() {
        let p = placement(&[1, 2, 3, 4], 4);
        let leaders: Vec<NodeId> = p.iter().map(|r| r.replicas[0]).collect();
        assert_eq!(leaders, vec![1, 2, 3, 4]);
        assert!(p.iter().all(|r| r.replicas.len() == 3));
        assert_eq!(p[3].replicas, vec![4, 1, 2]);
        let small = placement(&[7], 2);
        assert_eq!(small[1].replicas, vec![7]);
    }

    #[test]
    fn a_fetch_answer_stops_before_the_high_watermark() {
        let recs = (0..5)
            .map(|o| fissionlog_raft::client::ReadRecord {
                offset: o,
                key: None,
                value: vec![1],
                timestamp_ms: 0,
            })
            .collect();
        let Response::Fetched {
            records,
            next_offset,
            high_watermark,
            ..
        } = fetched(0, 0, 3, recs, 1 << 20)
        else {
            panic!("a fetch answer");
        };
        assert_eq!(
            records.iter().map(|r| r.offset).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!((next_offset, high_watermark), (3, 3));
    }

    #[test]
    fn each_create_draws_its_own_routing_key() {
        let keys: std::collections::HashSet<[u64; 2]> = (0..64)
            .map(|_| new_hash_key().ok().expect("a key"))
            .collect();
        assert_eq!(keys.len(), 64, "64 draws of 128 bits never repeat");
    }
}
