//! Routed produces (`ProduceTo`), their `moved` answer, the idempotent
//! stamp check, and the `InitProducer` and `Topology` requests.
//!
//! A routed produce names the partition its client routed every record
//! to. The server appends it there as one batch (the library writes it
//! whole or not at all) after checking that the partition is active and
//! owns every key; a sealed partition is answered with `moved` and the
//! partitions that own its range now, and nothing is appended. An
//! idempotent batch is checked against the (producer, partition)
//! sequence state first, under that state's lock, held until the append
//! is noted: a retry of a batch already written is answered with its
//! first copy's offsets, also when its partition was sealed since.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fissionlog::{Error, HotKeyMode, NewRecord, Topic};

use super::auth::Access;
use super::conn::Conn;
use super::handlers::{blocking, code_of, lib, refused, topic_for, ProduceJob, Reply};
use super::producers::{encode_stamp, InitError, Use, Verdict};
use crate::protocol::{ErrorCode, ProduceRecord, RangeOwner, Response, Stamp};

/// Appends one routed produce; returns its answer and the positions a
/// quorum wait must cover.
pub(super) async fn append_routed(
    conn: &Arc<Conn>,
    job: &mut ProduceJob,
) -> (Reply, Vec<(u32, u64)>) {
    let Some((partition, stamp)) = job.target else {
        return (
            Err(refused(ErrorCode::Internal, "not a routed produce")),
            Vec::new(),
        );
    };
    let records = std::mem::take(&mut job.records);
    let topic = job.topic.clone();
    let conn2 = conn.clone();
    let span = tracing::debug_span!("produce_to", topic = %topic.name(), partition,
        records = records.len(), producer = stamp.map(|s| s.producer_id));
    let r = blocking(move || {
        let _entered = span.enter();
        append_blocking(&conn2, &topic, partition, stamp, &records)
    })
    .await;
    match r {
        Ok(Ok((reply, positions))) => {
            conn.shared
                .stats
                .records_produced
                .fetch_add(positions.len() as u64, Ordering::Relaxed);
            (Ok(reply), positions)
        }
        Ok(Err(e)) | Err(e) => (Err(e), Vec::new()),
    }
}

type Routed = Result<(Response, Vec<(u32, u64)>), (ErrorCode, String)>;

fn produced(positions: Vec<(u32, u64)>) -> Routed {
    Ok((
        Response::Produced {
            positions: positions.clone(),
        },
        positions,
    ))
}

fn append_blocking(
    conn: &Conn,
    topic: &Topic,
    partition: u32,
    stamp: Option<Stamp>,
    records: &[ProduceRecord],
) -> Routed {
    let Some(stamp) = stamp else {
        return append_checked(topic, partition, None, records);
    };
    let count = u32::try_from(records.len())
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            refused(
                ErrorCode::InvalidRequest,
                "an idempotent batch holds 1 to 2^32-1 records",
            )
        })?;
    let producers = &conn.shared.producers;
    let owner = producers
        .may_use(stamp.producer_id, &conn.principal.name)
        .map_err(|e| refused(ErrorCode::Storage, format!("producer owners: {e}")))?;
    match owner {
        Use::Owner => {}
        Use::NotOwner => {
            return Err(refused(
                ErrorCode::Unauthorized,
                format!(
                    "producer id {} belongs to another principal",
                    stamp.producer_id
                ),
            ))
        }
        Use::Unknown => {
            return Err(refused(
                ErrorCode::InvalidRequest,
                format!(
                    "producer id {} was never handed out: ask InitProducer for one",
                    stamp.producer_id
                ),
            ))
        }
    }
    let current = producers.epoch(stamp.producer_id);
    if stamp.epoch < current {
        return Err(fenced(stamp, current));
    }
    let state = producers.state(topic.name(), partition, stamp.producer_id);
    let mut st = state
        .lock()
        .map_err(|_| refused(ErrorCode::Internal, "a producer state is poisoned"))?;
    match st.check(stamp.epoch, stamp.first_sequence, count) {
        Verdict::Duplicate(b) => {
            tracing::debug!(
                first_sequence = b.first_sequence,
                "a retried batch: answered with its first copy"
            );
            produced(
                (0..u64::from(b.count))
                    .map(|i| (partition, b.first_offset + i))
                    .collect(),
            )
        }
        // Behind a batch that was moved, every later batch to the sealed
        // partition has a gap: it is moved too.
        Verdict::OutOfOrder { .. } if topic.partition(partition).is_ok_and(|p| p.is_sealed()) => {
            Ok((moved(topic, partition), Vec::new()))
        }
        Verdict::OutOfOrder { expected } => Err(refused(
            ErrorCode::OutOfOrderSequence,
            format!(
                "producer {} partition {partition}: batch from sequence {} but {expected} is next",
                stamp.producer_id, stamp.first_sequence
            ),
        )),
        Verdict::Fenced { current } => Err(fenced(stamp, current)),
        Verdict::Append => {
            let r = append_checked(topic, partition, Some((stamp, count)), records)?;
            if let Some(&(_, first)) = r.1.first() {
                st.record(stamp.epoch, stamp.first_sequence, count, first);
            }
            Ok(r)
        }
    }
}

fn fenced(stamp: Stamp, current: u32) -> (ErrorCode, String) {
    refused(
        ErrorCode::ProducerFenced,
        format!(
            "producer {} epoch {} is fenced by epoch {current}",
            stamp.producer_id, stamp.epoch
        ),
    )
}

/// Appends to `partition` once it is active and owns every key.
fn append_checked(
    topic: &Topic,
    partition: u32,
    stamp: Option<(Stamp, u32)>,
    records: &[ProduceRecord],
) -> Routed {
    let part = topic.partition(partition).map_err(lib)?;
    if part.is_sealed() {
        return Ok((moved(topic, partition), Vec::new()));
    }
    for r in records {
        let Some(k) = r.key.as_deref() else { continue };
        if topic.hot_key_mode(k) != HotKeyMode::Strict {
            return Err(refused(
                ErrorCode::Refused,
                "a key with a windowed or spread hot-key mode can't be routed by the client: produce it unrouted",
            ));
        }
        if topic.route(k) != partition {
            // The partition's range is fixed for its life: a key outside
            // it was routed wrong, unless the partition was sealed since.
            if part.is_sealed() {
                return Ok((moved(topic, partition), Vec::new()));
            }
            return Err(refused(
                ErrorCode::InvalidRequest,
                format!("a key's hash is outside partition {partition}'s range"),
            ));
        }
    }
    let stamp_value = stamp.map(|(s, n)| encode_stamp(&s, n, partition));
    let mut batch: Vec<NewRecord<'_>> = Vec::with_capacity(records.len() + 1);
    if let Some(v) = &stamp_value {
        batch.push(NewRecord {
            key: Some(super::producers::STAMP_KEY),
            value: v,
            timestamp: None,
        });
    }
    batch.extend(records.iter().map(|r| NewRecord {
        key: r.key.as_deref(),
        value: &r.value,
        timestamp: r.timestamp,
    }));
    match topic.append_to(partition, &batch) {
        Ok(base) => {
            let first = base + u64::from(stamp_value.is_some());
            produced(
                (0..records.len() as u64)
                    .map(|i| (partition, first + i))
                    .collect(),
            )
        }
        Err(Error::Sealed { .. }) => Ok((moved(topic, partition), Vec::new())),
        Err(e) => Err((code_of(&e), e.to_string())),
    }
}

/// The `moved` answer for a sealed `partition`: the active partitions that
/// own its range now.
fn moved(topic: &Topic, partition: u32) -> Response {
    let infos = topic.partitions();
    let range = infos
        .iter()
        .find(|p| p.id == partition)
        .map_or((0, u64::MAX), |p| (p.start, p.end));
    let partitions = active_owners(&infos)
        .into_iter()
        .filter(|o| o.start <= range.1 && o.end >= range.0)
        .collect();
    Response::Moved {
        message: format!("partition {partition} is sealed: route to its successors"),
        epoch: topic.topology_generation(),
        partitions,
    }
}

fn active_owners(infos: &[fissionlog::PartitionInfo]) -> Vec<RangeOwner> {
    let mut v: Vec<RangeOwner> = infos
        .iter()
        .filter(|p| p.sealed_at.is_none())
        .map(|p| RangeOwner {
            partition: p.id,
            start: p.start,
            end: p.end,
        })
        .collect();
    v.sort_unstable_by_key(|o| o.start);
    v
}

/// `Topology`: the routing a client needs. It discloses the topic's
/// routing key, so it asks for write access (docs/PROTOCOL.md).
pub(super) fn topology(conn: &Conn, topic: &str) -> Reply {
    let t = topic_for(conn, topic, Access::Write(topic))?;
    // The generation first: a change after it shows as a newer epoch.
    let epoch = t.topology_generation();
    Ok(Response::Topology {
        epoch,
        routing_key: t.routing_key(),
        partitions: active_owners(&t.partitions()),
    })
}

/// `InitProducer`: a new id, or the next epoch of a known one.
pub(super) async fn init_producer(conn: &Arc<Conn>, producer_id: Option<u64>) -> Reply {
    let c = conn.clone();
    let r = blocking(move || c.shared.producers.init(producer_id, &c.principal.name)).await?;
    match r {
        Ok((producer_id, epoch)) => Ok(Response::ProducerInit { producer_id, epoch }),
        Err(e @ InitError::NotOwner(_)) => Err(refused(ErrorCode::Unauthorized, e.to_string())),
        Err(e @ InitError::UnknownProducer(_)) | Err(e @ InitError::EpochExhausted(_)) => {
            Err(refused(ErrorCode::InvalidRequest, e.to_string()))
        }
        Err(e) => Err(refused(ErrorCode::Storage, e.to_string())),
    }
}
