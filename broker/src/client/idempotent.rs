//! The idempotent, routing producer's task: it routes each record to the
//! active partition owning its key (the topic's `Topology`), stamps each
//! partition's batch with the producer id, epoch and the partition's next
//! sequence number, and follows `moved` answers.
//!
//! Per-key order through a split: when a batch comes back `moved`, the
//! task sends nothing more until every batch in flight is answered (the
//! batches behind it to the sealed partition are all `moved` too: a
//! sealed partition takes nothing), then fetches the new topology and
//! sends the moved batches again, in the order they were first sent, to
//! the partitions that own their keys now. The server appends one
//! connection's requests in the order it read them, so no record of a key
//! is acknowledged ahead of an earlier one of the same key.
//!
//! Through a lost connection (the broker restarted, or was killed and
//! started again on its directory): the task lets every batch in flight
//! fail, connects again with backoff, and sends the unanswered batches
//! again in the order they were first sent, each to the partition and
//! with the producer id, epoch and first sequence it had. The server
//! answers those it had appended with their first positions (its dedup
//! state is rebuilt from the log at start) and appends the others, so
//! nothing is lost or doubled and a key's records keep their order. At
//! most [`RECENT_BATCHES`] batches of one partition are in flight, the
//! number of batches the server remembers per partition: an older retry
//! would not be recognised.
//!
//! Through a leader change (a broker in cluster mode answers
//! `not_leader`, naming the partition's leader when it knows it): the
//! batch is kept with its partition and sequence like a lost one; once
//! every batch in flight is answered, the partition's batches go to the
//! named broker (over a connection of its own, made with the endpoint's
//! TLS and token) in the order they were first sent. A broker that
//! names no leader, or a leader's connection that is lost, sends the
//! partition's batches back to the endpoint's broker after a short
//! backoff, which names the new leader once it is elected. When the
//! endpoint's broker itself is lost, a leader this producer is connected
//! to takes its place (its address becomes the endpoint's). The stamp
//! is kept across every one of these, so the new leader answers a batch
//! its predecessor had committed with the first copy's offsets. At most
//! [`MAX_REDIRECTS`] redirects per batch.
//!
//! A batch unanswered within the connection's request timeout is treated
//! the same way (at most [`MAX_TIMEOUT_RESENDS`] times): the connection
//! is replaced and the batch goes again with its sequence, so a response
//! lost or late on a stalled connection neither fails the record nor
//! appends it twice.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use super::producer::{Ack, Item, ProducerConfig};
use super::reconnect::{copy_error, is_lost, redial, Endpoint};
use super::{ClientError, Connection};
use crate::protocol::{ErrorCode, ProduceRecord, RangeOwner, Request, Response, Stamp};
use crate::server::producers::RECENT_BATCHES;

/// Rounds of `moved` one batch may follow before its records fail.
const MAX_MOVES: u32 = 64;
/// Times one batch follows `not_leader` (or loses its leader's
/// connection) before its records fail.
pub(super) const MAX_REDIRECTS: u32 = 64;
/// The wait before batches whose leader is unknown go out again.
const REDIRECT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);
/// Times one batch is sent again after going unanswered within the
/// request timeout before its records fail with [`ClientError::Timeout`].
const MAX_TIMEOUT_RESENDS: u32 = 3;

/// A topic's routing as the server last described it.
struct Route {
    routing_key: [u64; 2],
    /// Active partitions, by range start.
    owners: Vec<RangeOwner>,
    next_keyless: usize,
}

impl Route {
    fn owner(&mut self, key: Option<&[u8]>) -> Option<u32> {
        if self.owners.is_empty() {
            return None;
        }
        let i = match key {
            Some(k) => {
                let h = fissionlog::key_hash(self.routing_key, k);
                self.owners.partition_point(|o| o.end < h)
            }
            None => {
                self.next_keyless = self.next_keyless.wrapping_add(1);
                self.next_keyless % self.owners.len()
            }
        };
        self.owners.get(i).map(|o| o.partition)
    }
}

async fn route(conn: &Connection, topic: &str) -> Result<Route, ClientError> {
    match conn
        .call(Request::Topology {
            topic: topic.into(),
        })
        .await?
    {
        Response::Topology {
            routing_key,
            mut partitions,
            ..
        } => {
            partitions.sort_unstable_by_key(|o| o.start);
            Ok(Route {
                routing_key,
                owners: partitions,
                next_keyless: 0,
            })
        }
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

/// A new producer id and its epoch.
pub(super) async fn init(conn: &Connection) -> Result<(u64, u32), ClientError> {
    match conn
        .call(Request::InitProducer { producer_id: None })
        .await?
    {
        Response::ProducerInit { producer_id, epoch } => Ok((producer_id, epoch)),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

/// Records bound for one partition, in send order.
struct Batch {
    /// When it was first sent: moved and lost batches go again in this order.
    order: u64,
    moves: u32,
    /// The partition and first sequence it went out with.
    sent_as: Option<(u32, u64)>,
    /// Times it went unanswered within the request timeout.
    timeouts: u32,
    /// Times it followed `not_leader` or lost its leader's connection.
    redirects: u32,
    /// The leader's address it went to, `None`: the endpoint's connection.
    via: Option<String>,
    records: Vec<ProduceRecord>,
    acks: Vec<oneshot::Sender<Ack>>,
}

type Answer = (Batch, Result<Response, ClientError>);

struct Sender {
    conn: Connection,
    /// Where to connect again; `None`: a lost connection fails the batches.
    endpoint: Option<Endpoint>,
    config: ProducerConfig,
    producer_id: u64,
    epoch: u32,
    sequences: HashMap<u32, u64>,
    route: Route,
    in_flight: Arc<Semaphore>,
    outstanding: usize,
    /// Batches in flight per partition.
    per_partition: HashMap<u32, usize>,
    done_tx: mpsc::UnboundedSender<Answer>,
    done_rx: mpsc::UnboundedReceiver<Answer>,
    next_order: u64,
    /// Batches answered `moved`, to route again.
    moved: Vec<Batch>,
    /// Batches whose connection was lost before their answer.
    lost: Vec<Batch>,
    /// A batch failed: its partition's sequence has a gap.
    failed: bool,
    /// The endpoint's connection was lost: connect again before resending.
    default_lost: bool,
    /// Connections to partition leaders other than the endpoint's broker.
    leader_conns: HashMap<String, Connection>,
    /// Where each partition's batches go (absent: the endpoint's broker).
    leaders: HashMap<u32, String>,
    /// Leader changes heard since the last resend, applied at the next
    /// one (so a partition's batches in flight all went to one broker).
    staged: Vec<(u32, Option<String>)>,
    /// Leaders whose connection was lost since the last resend.
    dead: Vec<String>,
    /// The connection is gone and the last reconnect gave up: the next
    /// batch connects first and takes a new epoch (the failed batches
    /// left gaps).
    broken: bool,
}

fn fail(acks: Vec<oneshot::Sender<Ack>>, e: &ClientError) {
    for a in acks {
        let _ = a.send(Err(copy_error(e)));
    }
}

impl Sender {
    /// Splits records by the partition that owns each key now and sends
    /// one stamped batch per partition.
    async fn send_all(
        &mut self,
        records: Vec<ProduceRecord>,
        acks: Vec<oneshot::Sender<Ack>>,
        order: Option<(u64, u32)>,
    ) {
        let mut by: Vec<(u32, Batch)> = Vec::new();
        let (order, moves) = order.unwrap_or_else(|| {
            self.next_order += 1;
            (self.next_order, 0)
        });
        for (r, a) in records.into_iter().zip(acks) {
            let Some(p) = self.route.owner(r.key.as_deref()) else {
                let _ = a.send(Err(ClientError::Unexpected(
                    "the topic has no active partition".into(),
                )));
                continue;
            };
            let i = match by.iter().position(|(q, _)| *q == p) {
                Some(i) => i,
                None => {
                    by.push((
                        p,
                        Batch {
                            order,
                            moves,
                            sent_as: None,
                            timeouts: 0,
                            redirects: 0,
                            via: None,
                            records: Vec::new(),
                            acks: Vec::new(),
                        },
                    ));
                    by.len() - 1
                }
            };
            by[i].1.records.push(r);
            by[i].1.acks.push(a);
        }
        for (p, b) in by {
            self.send(p, b).await;
        }
    }

    /// Sends `b` to `partition`: with its old first sequence when it went
    /// out before (a retry over a new connection), else the partition's next.
    async fn send(&mut self, partition: u32, mut b: Batch) {
        while self.per_partition.get(&partition).copied().unwrap_or(0) >= RECENT_BATCHES {
            let Some(a) = self.done_rx.recv().await else {
                break;
            };
            self.settle(a);
        }
        let first_sequence = match b.sent_as {
            Some((_, seq)) => seq,
            None => {
                let seq = self.sequences.entry(partition).or_insert(0);
                let first = *seq;
                *seq += b.records.len() as u64;
                b.sent_as = Some((partition, first));
                first
            }
        };
        let via = self.leaders.get(&partition).cloned();
        let conn = match &via {
            None => self.conn.clone(),
            Some(addr) => match self.leader_conn(addr).await {
                Ok(c) => c,
                Err(e) => {
                    // The named leader is unreachable (a stale hint):
                    // back to the endpoint's broker, which names the new one.
                    self.leaders.remove(&partition);
                    self.dead.push(addr.clone());
                    self.redirected(b, &e);
                    return;
                }
            },
        };
        b.via = via;
        let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
            fail(
                b.acks,
                &ClientError::Disconnected("the producer stopped".into()),
            );
            return;
        };
        let req = Request::ProduceTo {
            topic: self.config.topic.clone(),
            partition,
            acks: self.config.acks,
            stamp: Some(Stamp {
                producer_id: self.producer_id,
                epoch: self.epoch,
                first_sequence,
            }),
            // The records stay with the batch for a move or a retry;
            // `Bytes` clones share their buffers.
            records: b.records.clone(),
        };
        match conn.start(req).await {
            Ok(pending) => {
                self.outstanding += 1;
                *self.per_partition.entry(partition).or_insert(0) += 1;
                let tx = self.done_tx.clone();
                tokio::spawn(async move {
                    let r = pending.wait().await;
                    drop(permit);
                    let _ = tx.send((b, r));
                });
            }
            Err(e) if is_lost(&e) && b.via.is_some() => {
                if let Some(a) = b.via.clone() {
                    self.dead.push(a);
                }
                self.redirected(b, &e);
            }
            Err(e) if is_lost(&e) && self.endpoint.is_some() => {
                self.default_lost = true;
                self.lost.push(b);
            }
            Err(e) => {
                fail(b.acks, &e);
                self.failed = true;
            }
        }
    }

    /// The connection to the leader at `addr`, made with the endpoint's
    /// TLS, token and request timeout.
    async fn leader_conn(&mut self, addr: &str) -> Result<Connection, ClientError> {
        if let Some(c) = self.leader_conns.get(addr) {
            return Ok(c.clone());
        }
        let mut ep = self.endpoint.clone().unwrap_or_else(|| Endpoint::new(addr));
        ep.addr = addr.to_string();
        // This leader or none: another broker reached in its place would
        // be taken for it.
        ep.bootstrap.clear();
        let c = ep.connect().await?;
        self.leader_conns.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    /// Keeps `b` to go again to its partition's leader, or fails it after
    /// [`MAX_REDIRECTS`].
    fn redirected(&mut self, mut b: Batch, e: &ClientError) {
        if b.redirects >= MAX_REDIRECTS {
            fail(b.acks, e);
            self.failed = true;
            return;
        }
        b.redirects += 1;
        self.lost.push(b);
    }

    /// Acks a batch's records, or keeps a moved or lost one for sending
    /// again; a batch that failed leaves a gap in its partition's
    /// sequence, which the server refuses every later batch of the
    /// partition for, so `failed` is set.
    fn settle(&mut self, answer: Answer) {
        let (b, r) = answer;
        self.outstanding -= 1;
        if let Some((p, _)) = b.sent_as {
            if let Some(n) = self.per_partition.get_mut(&p) {
                *n = n.saturating_sub(1);
            }
        }
        match r {
            Ok(Response::Produced { positions }) => {
                for (i, a) in b.acks.into_iter().enumerate() {
                    let _ = a.send(Ok(positions.get(i).copied()));
                }
            }
            Ok(Response::Moved { message, .. }) => {
                if b.moves >= MAX_MOVES {
                    fail(
                        b.acks,
                        &ClientError::Server {
                            code: ErrorCode::Moved,
                            message,
                        },
                    );
                    self.failed = true;
                } else {
                    self.moved.push(b);
                }
            }
            Ok(other) => {
                fail(b.acks, &ClientError::Unexpected(format!("{other:?}")));
                self.failed = true;
            }
            Err(ClientError::NotLeader { message, leader }) => {
                if let Some((p, _)) = b.sent_as {
                    self.staged.push((p, leader.clone()));
                }
                self.redirected(b, &ClientError::NotLeader { message, leader });
            }
            Err(e) if is_lost(&e) && b.via.is_some() => {
                if let Some(a) = b.via.clone() {
                    self.dead.push(a);
                }
                self.redirected(b, &e);
            }
            Err(e) if is_lost(&e) && self.endpoint.is_some() => {
                self.default_lost = true;
                self.lost.push(b);
            }
            // Unanswered: it may or may not have been appended. It goes
            // again, with its sequence, over a new connection, as a lost
            // one does: the server answers a copy it holds with the first
            // one's positions, so nothing is doubled.
            Err(ClientError::Timeout { .. })
                if self.endpoint.is_some() && b.timeouts < MAX_TIMEOUT_RESENDS =>
            {
                let mut b = b;
                b.timeouts += 1;
                match b.via.clone() {
                    Some(a) => self.dead.push(a),
                    None => self.default_lost = true,
                }
                self.lost.push(b);
            }
            Err(e) => {
                fail(b.acks, &e);
                self.failed = true;
            }
        }
    }

    /// Waits for every batch in flight to be answered.
    async fn settle_all(&mut self) {
        while self.outstanding > 0 {
            let Some(a) = self.done_rx.recv().await else {
                break;
            };
            self.settle(a);
        }
    }

    /// A new connection to the endpoint, with the topic's routing fetched
    /// over it, within the reconnect deadline counted from `since`.
    async fn reconnect(&mut self, since: Instant) -> Result<(), ClientError> {
        let Some(endpoint) = self.endpoint.clone() else {
            return Err(ClientError::Disconnected("the connection closed".into()));
        };
        let topic = self.config.topic.clone();
        let (conn, r) = redial(&endpoint, &self.config.reconnect, since, |c| {
            let topic = topic.clone();
            async move { route(&c, &topic).await }
        })
        .await?;
        self.conn = conn;
        self.route = r;
        Ok(())
    }

    /// The lost batches go again over a new connection, in the order they
    /// were first sent, each with the partition and sequence it had. If
    /// no connection can be made in time they fail, and so do the moved
    /// ones and the records queued meanwhile.
    async fn resend_lost(&mut self, rx: &mut mpsc::Receiver<Item>) {
        let reconnected = if self.default_lost {
            // In a cluster, another broker this producer already talks
            // to takes the lost one's place at once.
            self.follow_leaders().await;
            if self.adopt_leader().await {
                Ok(())
            } else {
                self.reconnect(Instant::now()).await
            }
        } else {
            Ok(())
        };
        match reconnected {
            Ok(()) => {
                self.default_lost = false;
                self.follow_leaders().await;
                let mut lost = std::mem::take(&mut self.lost);
                lost.sort_by_key(|b| b.order);
                for b in lost {
                    match b.sent_as {
                        Some((p, _)) => self.send(p, b).await,
                        None => {
                            self.send_all(b.records, b.acks, Some((b.order, b.moves)))
                                .await
                        }
                    }
                }
            }
            Err(e) => {
                for b in self.lost.drain(..).chain(self.moved.drain(..)) {
                    fail(b.acks, &e);
                }
                while let Ok(item) = rx.try_recv() {
                    fail(vec![item.ack], &e);
                }
                self.broken = true;
            }
        }
    }

    /// Makes the connection to a partition leader (another broker of the
    /// cluster) the endpoint's, once the topic's routing is fetched over
    /// it; false when there is none that answers (always on one node).
    async fn adopt_leader(&mut self) -> bool {
        let known: Vec<(String, Connection)> = self
            .leader_conns
            .iter()
            .map(|(a, c)| (a.clone(), c.clone()))
            .collect();
        for (addr, conn) in known {
            if let Ok(r) = route(&conn, &self.config.topic).await {
                self.conn = conn;
                self.route = r;
                if let Some(ep) = &mut self.endpoint {
                    ep.addr = addr;
                }
                return true;
            }
            self.leader_conns.remove(&addr);
            self.leaders.retain(|_, l| *l != addr);
        }
        false
    }

    /// Applies the leader changes heard since the last resend: dead
    /// leaders' connections go, named leaders take their partitions, and
    /// a partition whose leader is unknown goes back to the endpoint's
    /// broker after a backoff (an election takes a moment).
    async fn follow_leaders(&mut self) {
        let mut unknown = !self.dead.is_empty();
        for (p, leader) in std::mem::take(&mut self.staged) {
            match leader {
                Some(a) => {
                    self.leaders.insert(p, a);
                }
                None => {
                    unknown = true;
                    self.leaders.remove(&p);
                }
            }
        }
        // After the hints: a hint naming a leader whose connection was
        // just lost is stale (the hinting broker has not seen the
        // election yet).
        for a in std::mem::take(&mut self.dead) {
            self.leader_conns.remove(&a);
            self.leaders.retain(|_, l| *l != a);
        }
        if unknown {
            tokio::time::sleep(REDIRECT_BACKOFF).await;
        }
    }

    /// After a reconnect that gave up: connects again and takes the next
    /// epoch, which starts every partition's sequence at 0.
    async fn revive(&mut self) -> Result<(), ClientError> {
        self.reconnect(Instant::now()).await?;
        self.next_epoch().await?;
        self.broken = false;
        Ok(())
    }

    async fn next_epoch(&mut self) -> Result<(), ClientError> {
        match self
            .conn
            .call(Request::InitProducer {
                producer_id: Some(self.producer_id),
            })
            .await?
        {
            // A broker in cluster mode hands out a new id instead of the
            // next epoch of this one.
            Response::ProducerInit { producer_id, epoch } => {
                self.producer_id = producer_id;
                self.epoch = epoch;
                self.sequences.clear();
                Ok(())
            }
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}

/// The producer's task (see the module's comment).
pub(super) async fn run(
    conn: Connection,
    endpoint: Option<Endpoint>,
    config: ProducerConfig,
    mut rx: mpsc::Receiver<Item>,
) {
    let started = async {
        let (producer_id, epoch) = init(&conn).await?;
        let route = route(&conn, &config.topic).await?;
        Ok::<_, ClientError>((producer_id, epoch, route))
    }
    .await;
    let (producer_id, epoch, route) = match started {
        Ok(x) => x,
        Err(e) => {
            while let Some(item) = rx.recv().await {
                fail(vec![item.ack], &e);
            }
            return;
        }
    };
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let mut s = Sender {
        in_flight: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
        conn,
        endpoint,
        config,
        producer_id,
        epoch,
        sequences: HashMap::new(),
        route,
        outstanding: 0,
        per_partition: HashMap::new(),
        done_tx,
        done_rx,
        next_order: 0,
        moved: Vec::new(),
        lost: Vec::new(),
        failed: false,
        broken: false,
        default_lost: false,
        leader_conns: HashMap::new(),
        leaders: HashMap::new(),
        staged: Vec::new(),
        dead: Vec::new(),
    };
    let mut open = true;
    loop {
        while let Ok(a) = s.done_rx.try_recv() {
            s.settle(a);
        }
        if !s.moved.is_empty() || !s.lost.is_empty() || s.failed || !open {
            // Settle everything in flight before routing anew.
            s.settle_all().await;
            if !s.lost.is_empty() {
                s.resend_lost(&mut rx).await;
                continue;
            }
            if s.failed {
                // A failed batch left a gap in its partition's sequence:
                // the next epoch starts every partition at 0 again.
                s.failed = false;
                if let Err(e) = s.next_epoch().await {
                    for b in s.moved.drain(..) {
                        fail(b.acks, &e);
                    }
                }
            }
            if !s.moved.is_empty() {
                let again = match self::route(&s.conn, &s.config.topic).await {
                    Ok(r) => r,
                    Err(e) => {
                        for b in s.moved.drain(..) {
                            fail(b.acks, &e);
                        }
                        continue;
                    }
                };
                s.route = again;
                let mut moved = std::mem::take(&mut s.moved);
                moved.sort_by_key(|b| b.order);
                for b in moved {
                    let order = Some((b.order, b.moves + 1));
                    s.send_all(b.records, b.acks, order).await;
                }
                continue;
            }
            if !open {
                return;
            }
        }
        let first = tokio::select! {
            item = rx.recv() => match item {
                Some(i) => i,
                None => { open = false; continue; }
            },
            Some(a) = s.done_rx.recv(), if s.outstanding > 0 => {
                s.settle(a);
                continue;
            }
        };
        let (batch, still_open) = super::producer::gather(first, &mut rx, &s.config).await;
        open = still_open;
        let (records, acks): (Vec<ProduceRecord>, Vec<oneshot::Sender<Ack>>) =
            batch.into_iter().map(|i| (i.record, i.ack)).unzip();
        if s.broken {
            if let Err(e) = s.revive().await {
                fail(acks, &e);
                continue;
            }
        }
        s.send_all(records, acks, None).await;
    }
}
