//! What each request does on the embedded log.
//!
//! Blocking library calls (appends, joins, commits, splits, waits) run on
//! tokio's blocking pool; reads of mapped data run inline (they copy
//! nothing: the response shares the segment's mapping). Every long poll
//! also ends when the server shuts down.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fissionlog::{
    BalancePolicy, Error, HotKeyMode, NewRecord, ReadIsolation, SplitPlan, SyncPolicy, TailFrom,
    TailSplitOptions, Topic, TopicConfig,
};
use tokio::sync::mpsc;

use super::auth::Access;
use super::conn::{Conn, InFlight};
use super::handlers_group::{group_poll, join, leave, member_call};
use crate::protocol::{
    Acks, ErrorCode, FetchedRecord, HotKeyModeSpec, Isolation, ProduceRecord, Request, Response,
    SplitSpec, Stamp, SyncSpec, TailFromSpec,
};

/// Bytes of framing a record costs in a response beyond key and value.
pub(super) const RECORD_OVERHEAD: usize = 48;
/// Room kept in a response frame for its header and counts.
const RESPONSE_SLACK: usize = 4096;
/// How often a long poll looks again when it can't block a thread.
const POLL_STEP: Duration = Duration::from_millis(2);

pub(super) type Reply = Result<Response, (ErrorCode, String)>;

/// The error code a library error maps to.
pub(crate) fn code_of(e: &Error) -> ErrorCode {
    match e {
        Error::UnknownTopic(_) => ErrorCode::UnknownTopic,
        Error::TopicExists(_) => ErrorCode::TopicExists,
        Error::UnknownPartition { .. } => ErrorCode::UnknownPartition,
        Error::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
        Error::RecordTooLarge { .. } => ErrorCode::RecordTooLarge,
        Error::InvalidTopicName { .. }
        | Error::InvalidConfig(_)
        | Error::InvalidCut(_)
        | Error::CommitBeforeParent { .. } => ErrorCode::InvalidRequest,
        Error::Refused(_)
        | Error::Sealed { .. }
        | Error::HotKeyMode { .. }
        | Error::NotAssigned { .. } => ErrorCode::Refused,
        Error::Fenced { .. } => ErrorCode::Fenced,
        Error::UnknownGroup(_) => ErrorCode::UnknownGroup,
        Error::Closed => ErrorCode::ShuttingDown,
        Error::Retained { .. } | Error::Hole { .. } | Error::PositionLost { .. } => {
            ErrorCode::DataLost
        }
        Error::Io { .. }
        | Error::NoSpace { .. }
        | Error::Poisoned { .. }
        | Error::LogPoisoned { .. }
        | Error::Corruption { .. }
        | Error::ChecksumMismatch { .. } => ErrorCode::Storage,
        _ => ErrorCode::Internal,
    }
}

pub(crate) fn lib(e: Error) -> (ErrorCode, String) {
    (code_of(&e), e.to_string())
}

pub(crate) fn refused(code: ErrorCode, msg: impl Into<String>) -> (ErrorCode, String) {
    (code, msg.into())
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, (ErrorCode, String)> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| refused(ErrorCode::Internal, format!("a blocking task failed: {e}")))
}

/// One produce request on its way through the connection's append queue.
pub(crate) struct ProduceJob {
    pub(super) request_id: u32,
    pub(super) topic: Topic,
    pub(super) acks: Acks,
    pub(super) records: Vec<ProduceRecord>,
    /// A routed produce: the partition the client chose, and its stamp
    /// when idempotent. Never coalesced with others.
    pub(super) target: Option<(u32, Option<Stamp>)>,
    /// Released just before the answer is queued.
    pub(super) slot: InFlight,
    /// When the request was read: its latency runs from here to its answer.
    pub(super) started: Instant,
}

/// Carries out one request and queues its response.
pub(crate) async fn dispatch(conn: &Arc<Conn>, request_id: u32, req: Request, mut slot: InFlight) {
    use tracing::Instrument;
    let name = req.name();
    let started = Instant::now();
    let span = request_span(&req);
    let ok = async {
        let opcode = req.opcode();
        let reply = route(conn, req).await;
        let r = reply.unwrap_or_else(|(code, message)| Response::Error {
            opcode,
            code,
            message,
        });
        let ok = !matches!(r, Response::Error { .. });
        if let Response::Error { code, .. } = &r {
            tracing::debug!(%code, "refused");
        }
        slot.release();
        conn.respond(request_id, r).await;
        ok
    }
    .instrument(span)
    .await;
    super::metrics::request_done(name, started, ok);
}

/// The span a request runs in: its kind and what it names (topic,
/// partition, group, member). Never the token: a Hello has no span.
fn request_span(req: &Request) -> tracing::Span {
    use tracing::{debug_span, info_span};
    match req {
        Request::Fetch {
            topic,
            partition,
            offset,
            ..
        } => debug_span!("fetch", topic = %topic, partition, offset),
        Request::JoinGroup { topic, group, .. } => {
            debug_span!("group_join", topic = %topic, group = %group)
        }
        Request::GroupPoll { member, .. } => debug_span!("group_poll", member),
        Request::Commit { member } => debug_span!("group_commit", member),
        Request::Heartbeat { member } => debug_span!("group_heartbeat", member),
        Request::LeaveGroup { member } => debug_span!("group_leave", member),
        Request::Split {
            topic, partition, ..
        } => info_span!("split_request", topic = %topic, partition),
        Request::TailSplit {
            topic, partition, ..
        } => info_span!("tail_split_request", topic = %topic, partition),
        Request::Merge { topic, a, b } => info_span!("merge_request", topic = %topic, a, b),
        other => debug_span!("admin", op = other.name()),
    }
}

async fn route(conn: &Arc<Conn>, req: Request) -> Reply {
    let opcode = req.opcode();
    match req {
        Request::Fetch {
            topic,
            partition,
            offset,
            max_bytes,
            max_wait_ms,
            isolation,
        } => {
            fetch(
                conn,
                &topic,
                partition,
                offset,
                max_bytes,
                max_wait_ms,
                isolation,
            )
            .await
        }
        Request::JoinGroup {
            topic,
            group,
            session_timeout_ms,
            processing_timeout_ms,
            instance_id,
        } => {
            join(
                conn,
                &topic,
                &group,
                session_timeout_ms,
                processing_timeout_ms,
                instance_id,
            )
            .await
        }
        Request::Heartbeat { member } => member_call(conn, opcode, member, |m| m.heartbeat()).await,
        Request::Commit { member } => member_call(conn, opcode, member, |m| m.commit()).await,
        Request::LeaveGroup { member } => leave(conn, member).await,
        Request::GroupPoll {
            member,
            max_records,
            max_bytes,
            max_wait_ms,
        } => group_poll(conn, member, max_records, max_bytes, max_wait_ms).await,
        Request::InitProducer { producer_id } => {
            super::routed::init_producer(conn, producer_id).await
        }
        Request::Topology { topic } => super::routed::topology(conn, &topic),
        Request::Produce { .. } | Request::ProduceTo { .. } => Err(refused(
            ErrorCode::Internal,
            "produce requests go through the append queue",
        )),
        other => super::handlers_admin::admin(conn, other).await,
    }
}

pub(crate) fn topic_for(
    conn: &Conn,
    name: &str,
    access: Access<'_>,
) -> Result<Topic, (ErrorCode, String)> {
    if !conn.shared.config.authorizer.allow(&conn.principal, access) {
        return Err(refused(
            ErrorCode::Unauthorized,
            format!("not allowed on topic {name:?}"),
        ));
    }
    conn.shared.log.topic(name).map_err(lib)
}

/// Checks a produce request and puts it on the connection's append
/// queue. Called from the connection's reader, in the order requests were
/// read, so one client's batches are appended in the order it sent them.
/// The request's in-flight slot goes with it, released when it is
/// answered (an acks-none request: when its early answer is queued).
pub(crate) async fn enqueue_produce(
    conn: &Arc<Conn>,
    request_id: u32,
    topic: String,
    acks: Acks,
    records: Vec<ProduceRecord>,
    target: Option<(u32, Option<Stamp>)>,
    mut slot: InFlight,
) {
    let started = Instant::now();
    let opcode = if target.is_some() {
        crate::protocol::op::PRODUCE_TO
    } else {
        crate::protocol::op::PRODUCE
    };
    if records
        .iter()
        .any(|r| super::producers::is_stamp(r.key.as_deref()))
    {
        super::metrics::request_done("produce", started, false);
        slot.release();
        let r = Response::Error {
            opcode,
            code: ErrorCode::InvalidRequest,
            message: "a record's key is the broker's reserved stamp key".into(),
        };
        conn.respond(request_id, r).await;
        return;
    }
    let t = match topic_for(conn, &topic, Access::Write(&topic)) {
        Ok(t) => t,
        Err((code, message)) => {
            super::metrics::request_done("produce", started, false);
            slot.release();
            conn.respond(
                request_id,
                Response::Error {
                    opcode,
                    code,
                    message,
                },
            )
            .await;
            return;
        }
    };
    if conn.shared.shutting_down() {
        super::metrics::request_done("produce", started, false);
        let r = Response::Error {
            opcode,
            code: ErrorCode::ShuttingDown,
            message: "the server is shutting down".into(),
        };
        slot.release();
        conn.respond(request_id, r).await;
        return;
    }
    if acks == Acks::None {
        // Answered now; the bounded append queue holds the reader back.
        slot.release();
        conn.respond(
            request_id,
            Response::Produced {
                positions: Vec::new(),
            },
        )
        .await;
    }
    let job = ProduceJob {
        request_id,
        topic: t,
        acks,
        records,
        target,
        slot,
        started,
    };
    let Some(tx) = conn.produce_tx.lock().ok().and_then(|t| t.clone()) else {
        return;
    };
    let _ = tx.send(job).await;
}

/// At most this many queued produce requests go into one append.
const COALESCE_REQUESTS: usize = 256;
/// And at most about this many bytes of keys and values (a first request
/// over it goes alone).
const COALESCE_BYTES: usize = 4 << 20;

fn job_bytes(j: &ProduceJob) -> usize {
    j.records
        .iter()
        .map(|r| r.value.len() + r.key.as_ref().map_or(0, |k| k.len()) + RECORD_OVERHEAD)
        .sum()
}

/// Appends a connection's produce requests in the order they were read.
/// Requests for one topic with the same acks that are queued together
/// are appended as one batch with one durability wait (bounded by
/// `COALESCE_REQUESTS` and `COALESCE_BYTES`), and each is answered with
/// its own positions or its own error.
pub(crate) async fn produce_loop(conn: Arc<Conn>, mut rx: mpsc::Receiver<ProduceJob>) {
    let mut next: Option<ProduceJob> = None;
    loop {
        let mut first = match next.take() {
            Some(j) => j,
            None => match rx.recv().await {
                Some(j) => j,
                None => return,
            },
        };
        if first.target.is_some() {
            let Ok(permit) = conn.shared.appends.acquire().await else {
                return;
            };
            let (reply, positions) = super::routed::append_routed(&conn, &mut first).await;
            drop(permit);
            finish_routed(&conn, first, reply, positions).await;
            continue;
        }
        let mut bytes = job_bytes(&first);
        let mut group = vec![first];
        while group.len() < COALESCE_REQUESTS && bytes < COALESCE_BYTES {
            let Ok(j) = rx.try_recv() else { break };
            let b = job_bytes(&j);
            if j.topic.name() == group[0].topic.name()
                && j.acks == group[0].acks
                && j.target.is_none()
                && group[0].target.is_none()
                && bytes + b <= COALESCE_BYTES
            {
                bytes += b;
                group.push(j);
            } else {
                next = Some(j);
                break;
            }
        }
        let Ok(permit) = conn.shared.appends.acquire().await else {
            return;
        };
        let results = append_group(&mut group).await;
        drop(permit);
        let acks = group[0].acks;
        let mut done: Vec<Answered> = Vec::with_capacity(group.len());
        for (job, r) in group.into_iter().zip(results) {
            match r {
                Ok((n, positions)) => {
                    conn.shared
                        .stats
                        .records_produced
                        .fetch_add(n, Ordering::Relaxed);
                    let resp = Ok(Response::Produced {
                        positions: positions.clone(),
                    });
                    done.push((job, resp, positions));
                }
                Err(e) => done.push((job, Err(e), Vec::new())),
            }
        }
        match acks {
            Acks::None | Acks::Leader => {
                for (job, r, _) in done {
                    finish_job(&conn, job, r).await;
                }
            }
            Acks::Quorum => {
                // One durability wait for the group; groups' waits
                // overlap, appends stay in order.
                let conn = conn.clone();
                tokio::spawn(async move {
                    let all: Vec<(u32, u64)> =
                        done.iter().flat_map(|d| d.2.iter().copied()).collect();
                    let topic = done[0].0.topic.clone();
                    let durable = if all.is_empty() {
                        Ok(())
                    } else {
                        wait_durable(&conn, &topic, &all).await
                    };
                    for (job, r, _) in done {
                        let r = match (&durable, r) {
                            (Err(e), Ok(_)) => Err(e.clone()),
                            (_, r) => r,
                        };
                        finish_job(&conn, job, r).await;
                    }
                });
            }
        }
    }
}

/// Answers a routed produce: at once, or under `acks quorum` once a sync
/// round covers its records (the wait runs beside the next appends).
async fn finish_routed(
    conn: &Arc<Conn>,
    job: ProduceJob,
    reply: Reply,
    positions: Vec<(u32, u64)>,
) {
    if job.acks != Acks::Quorum || positions.is_empty() || reply.is_err() {
        finish_job(conn, job, reply).await;
        return;
    }
    let conn = conn.clone();
    tokio::spawn(async move {
        let topic = job.topic.clone();
        let reply = match wait_durable(&conn, &topic, &positions).await {
            Ok(()) => reply,
            Err(e) => Err(e),
        };
        finish_job(&conn, job, reply).await;
    });
}

/// A request of a group, its answer, and the positions its durability
/// wait covers.
type Answered = (ProduceJob, Reply, Vec<(u32, u64)>);

/// Per request of a group: its record count and positions, or its error.
pub(super) type Appended = Result<(u64, Vec<(u32, u64)>), (ErrorCode, String)>;

/// Appends a group of one topic's requests as one batch. A batch refused
/// before anything was written (a record too large, an unknown
/// partition...) is appended again request by request, so only the
/// request at fault fails; a batch that failed part way
/// (`Error::PartialBatch`) answers each request by what of it landed.
async fn append_group(group: &mut [ProduceJob]) -> Vec<Appended> {
    let topic = group[0].topic.clone();
    let requests: Vec<Vec<ProduceRecord>> = group
        .iter_mut()
        .map(|j| std::mem::take(&mut j.records))
        .collect();
    let n: usize = requests.iter().map(Vec::len).sum();
    let span = tracing::debug_span!(
        "produce",
        topic = %topic.name(),
        records = n,
        requests = requests.len(),
        acks = ?group[0].acks,
        partitions = tracing::field::Empty
    );
    let in_span = span.clone();
    let count = group.len();
    let appended = blocking(move || {
        let _entered = in_span.enter();
        fn new(r: &ProduceRecord) -> NewRecord<'_> {
            NewRecord {
                key: r.key.as_deref(),
                value: &r.value,
                timestamp: r.timestamp,
            }
        }
        let pos = |a: &[fissionlog::Appended]| -> Vec<(u32, u64)> {
            a.iter().map(|a| (a.partition, a.offset)).collect()
        };
        let batch: Vec<NewRecord<'_>> = requests.iter().flatten().map(new).collect();
        match topic.append_batch(&batch) {
            Ok(a) => {
                let mut out = Vec::with_capacity(requests.len());
                let mut at = 0;
                for r in &requests {
                    out.push(Ok((r.len() as u64, pos(&a[at..at + r.len()]))));
                    at += r.len();
                }
                out
            }
            Err(Error::PartialBatch { landed, source }) => {
                let code = code_of(&source);
                let mut out = Vec::with_capacity(requests.len());
                let mut at = 0;
                for r in &requests {
                    let part = &landed[at..at + r.len()];
                    at += r.len();
                    let got: Vec<(u32, u64)> = part
                        .iter()
                        .flatten()
                        .map(|a| (a.partition, a.offset))
                        .collect();
                    if got.len() == part.len() {
                        out.push(Ok((r.len() as u64, got)));
                    } else {
                        out.push(Err((
                            code,
                            format!(
                                "{} of {} records of the request were appended before it failed: {source}",
                                got.len(),
                                part.len()
                            ),
                        )));
                    }
                }
                out
            }
            // Storage errors may come after a write: never appended again.
            Err(e) if requests.len() == 1 || code_of(&e) == ErrorCode::Storage => {
                let e = lib(e);
                requests.iter().map(|_| Err(e.clone())).collect()
            }
            Err(_) => requests
                .iter()
                .map(|r| {
                    let b: Vec<NewRecord<'_>> = r.iter().map(new).collect();
                    topic
                        .append_batch(&b)
                        .map(|a| (r.len() as u64, pos(&a)))
                        .map_err(lib)
                })
                .collect(),
        }
    })
    .await;
    let out = match appended {
        Ok(v) => v,
        Err(e) => (0..count).map(|_| Err(e.clone())).collect(),
    };
    if !span.is_disabled() {
        let mut touched: Vec<u32> = out
            .iter()
            .flatten()
            .flat_map(|(_, p)| p.iter().map(|p| p.0))
            .collect();
        touched.sort_unstable();
        touched.dedup();
        span.record("partitions", tracing::field::debug(&touched));
        span.in_scope(|| tracing::debug!("appended"));
    }
    out
}

async fn finish_job(conn: &Conn, mut job: ProduceJob, r: Reply) {
    let opcode = if job.target.is_some() {
        crate::protocol::op::PRODUCE_TO
    } else {
        crate::protocol::op::PRODUCE
    };
    super::metrics::request_done("produce", job.started, r.is_ok());
    let r = r.unwrap_or_else(|(code, message)| Response::Error {
        opcode,
        code,
        message,
    });
    job.slot.release();
    if job.acks != Acks::None {
        conn.respond(job.request_id, r).await;
    } else if let Response::Error { message, .. } = &r {
        tracing::warn!(%message, "an acks-none produce failed");
    }
}

/// Waits until a sync round covers the highest offset of each partition
/// the request touched (on a single node, the only replica: that is the
/// quorum).
async fn wait_durable(
    conn: &Conn,
    topic: &Topic,
    positions: &[(u32, u64)],
) -> Result<(), (ErrorCode, String)> {
    if topic.config().sync == SyncPolicy::Always {
        return Ok(()); // the append returned once durable
    }
    let mut highest: std::collections::BTreeMap<u32, u64> = Default::default();
    for &(p, o) in positions {
        let e = highest.entry(p).or_insert(o);
        *e = (*e).max(o);
    }
    conn.shared.syncer.request();
    let timeout = conn.shared.config.durable_timeout;
    for (p, o) in highest {
        match tokio::time::timeout(timeout, topic.durable(p, o)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(lib(e)),
            Err(_) => {
                return Err(refused(
                    ErrorCode::Storage,
                    format!("no sync round covered partition {p} offset {o} within {timeout:?}"),
                ))
            }
        }
    }
    Ok(())
}

fn isolation_of(p: &fissionlog::Partition, i: Isolation) -> ReadIsolation {
    match i {
        Isolation::Default => p.default_isolation(),
        Isolation::Durable => ReadIsolation::Durable,
        Isolation::Written => ReadIsolation::Written,
    }
}

pub(super) fn response_budget(conn: &Conn, asked: u32) -> usize {
    let cap = (conn.shared.config.max_frame_bytes as usize)
        .saturating_sub(RESPONSE_SLACK)
        .max(1);
    (asked as usize).clamp(1, cap)
}

pub(super) fn wait_cap(conn: &Conn, ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms)).min(conn.shared.config.max_wait)
}

async fn fetch(
    conn: &Conn,
    topic: &str,
    partition: u32,
    offset: u64,
    max_bytes: u32,
    max_wait_ms: u32,
    isolation: Isolation,
) -> Reply {
    let t = topic_for(conn, topic, Access::Read(topic))?;
    let p = t.partition(partition).map_err(lib)?;
    let iso = isolation_of(&p, isolation);
    let deadline = Instant::now() + wait_cap(conn, max_wait_ms);
    let budget = response_budget(conn, max_bytes);
    loop {
        let end = p.visible_end(iso);
        if offset < end || offset < p.start_offset() {
            break;
        }
        if offset > p.end_offset() {
            break; // past anything written: the read reports the range
        }
        let now = Instant::now();
        if now >= deadline || conn.shared.shutting_down() {
            return Ok(Response::Fetched {
                partition,
                next_offset: offset,
                high_watermark: end,
                records: Vec::new(),
            });
        }
        if p.is_sealed() {
            return Ok(Response::Fetched {
                partition,
                next_offset: offset,
                high_watermark: end,
                records: Vec::new(),
            });
        }
        tokio::time::sleep(POLL_STEP.min(deadline - now)).await;
    }
    let batch = p.read_with(offset, budget, iso).map_err(lib)?;
    let mut records = Vec::new();
    let mut size = 0usize;
    let mut next = offset;
    for r in batch.try_iter() {
        let r = r.map_err(lib)?;
        if super::producers::is_stamp(r.key) {
            next = r.offset + 1;
            continue;
        }
        let cost = r.value.len() + r.key.map_or(0, <[u8]>::len) + RECORD_OVERHEAD;
        if !records.is_empty() && size + cost > budget {
            break;
        }
        size += cost;
        next = r.offset + 1;
        records.push(FetchedRecord {
            offset: r.offset,
            timestamp: r.timestamp,
            key: batch.key_bytes(&r),
            value: batch.value_bytes(&r),
        });
    }
    if records.is_empty() {
        next = batch.next_offset().max(offset);
    }
    conn.shared
        .stats
        .records_sent
        .fetch_add(records.len() as u64, Ordering::Relaxed);
    Ok(Response::Fetched {
        partition,
        next_offset: next,
        high_watermark: p.visible_end(iso),
        records,
    })
}

pub(crate) fn sync_policy(s: SyncSpec) -> SyncPolicy {
    match s {
        SyncSpec::Never => SyncPolicy::Never,
        SyncSpec::IntervalMs(ms) => SyncPolicy::Interval(Duration::from_millis(ms.max(1))),
        SyncSpec::Always => SyncPolicy::Always,
    }
}

pub(crate) fn topic_config(
    partitions: u32,
    sync: SyncSpec,
    max_record_bytes: u32,
    target_bytes_per_sec: u64,
    auto_balance: bool,
) -> TopicConfig {
    let mut c = TopicConfig {
        partitions,
        sync: sync_policy(sync),
        ..Default::default()
    };
    if max_record_bytes > 0 {
        c.max_record_bytes = max_record_bytes;
    }
    c.balance = BalancePolicy {
        enabled: auto_balance,
        target_bytes_per_sec: (target_bytes_per_sec > 0).then_some(target_bytes_per_sec as f64),
        ..Default::default()
    };
    c
}

pub(crate) fn split_plan(t: &Topic, plan: &SplitSpec) -> SplitPlan {
    match plan {
        SplitSpec::LoadMedian => SplitPlan::LoadMedian,
        SplitSpec::Even => SplitPlan::Even,
        SplitSpec::At(h) => SplitPlan::At(*h),
        SplitSpec::HotKey(k) => SplitPlan::IsolateHash(t.hash(k)),
    }
}

pub(crate) fn tail_options(from: TailFromSpec) -> TailSplitOptions {
    match from {
        TailFromSpec::Offset(o) => TailSplitOptions::from_offset(o),
        TailFromSpec::SlowestGroup => TailSplitOptions {
            from: TailFrom::SlowestGroup,
            throttle_bytes_per_sec: 0,
        },
    }
}

pub(crate) fn hot_key_mode(m: HotKeyModeSpec) -> HotKeyMode {
    match m {
        HotKeyModeSpec::Strict => HotKeyMode::Strict,
        HotKeyModeSpec::WindowedMs(ms) => HotKeyMode::Windowed(Duration::from_millis(ms.max(1))),
        HotKeyModeSpec::Spread => HotKeyMode::Spread,
    }
}

pub(crate) fn json_reply(opcode: u8, v: serde_json::Value) -> Reply {
    Ok(Response::Json {
        opcode,
        json: v.to_string(),
    })
}
