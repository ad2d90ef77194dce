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

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::producer::{Ack, Item, ProducerConfig};
use super::{ClientError, Connection};
use crate::protocol::{ErrorCode, ProduceRecord, RangeOwner, Request, Response, Stamp};

/// Rounds of `moved` one batch may follow before its records fail.
const MAX_MOVES: u32 = 64;

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
    /// When it was first sent: moved batches go again in this order.
    order: u64,
    moves: u32,
    records: Vec<ProduceRecord>,
    acks: Vec<oneshot::Sender<Ack>>,
}

type Answer = (Batch, Result<Response, ClientError>);

struct Sender {
    conn: Connection,
    config: ProducerConfig,
    producer_id: u64,
    epoch: u32,
    sequences: HashMap<u32, u64>,
    route: Route,
    in_flight: Arc<Semaphore>,
    outstanding: usize,
    done_tx: mpsc::UnboundedSender<Answer>,
    next_order: u64,
}

fn fail(acks: Vec<oneshot::Sender<Ack>>, e: &ClientError) {
    for a in acks {
        let err = match e.code() {
            Some(code) => ClientError::Server {
                code,
                message: e.to_string(),
            },
            None => ClientError::Disconnected(e.to_string()),
        };
        let _ = a.send(Err(err));
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

    async fn send(&mut self, partition: u32, b: Batch) {
        let seq = self.sequences.entry(partition).or_insert(0);
        let first_sequence = *seq;
        *seq += b.records.len() as u64;
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
            // The records stay with the batch for a move; `Bytes` clones
            // share their buffers.
            records: b.records.clone(),
        };
        match self.conn.start(req).await {
            Ok(pending) => {
                self.outstanding += 1;
                let tx = self.done_tx.clone();
                tokio::spawn(async move {
                    let r = pending.wait().await;
                    drop(permit);
                    let _ = tx.send((b, r));
                });
            }
            Err(e) => fail(b.acks, &e),
        }
    }
}

/// Acks a batch's records, or keeps a moved one for sending again;
/// `true` when the batch failed (its sequence numbers are then a gap the
/// server refuses every later batch of the partition for).
fn settle(answer: Answer, moved: &mut Vec<Batch>) -> bool {
    let (b, r) = answer;
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
                return true;
            } else {
                moved.push(b);
            }
        }
        Ok(other) => {
            fail(b.acks, &ClientError::Unexpected(format!("{other:?}")));
            return true;
        }
        Err(e) => {
            fail(b.acks, &e);
            return true;
        }
    }
    false
}

/// The producer's task (see the module's comment).
pub(super) async fn run(conn: Connection, config: ProducerConfig, mut rx: mpsc::Receiver<Item>) {
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
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut s = Sender {
        in_flight: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
        conn,
        config,
        producer_id,
        epoch,
        sequences: HashMap::new(),
        route,
        outstanding: 0,
        done_tx,
        next_order: 0,
    };
    let mut moved: Vec<Batch> = Vec::new();
    let mut failed = false;
    let mut open = true;
    loop {
        while let Ok(a) = done_rx.try_recv() {
            s.outstanding -= 1;
            failed |= settle(a, &mut moved);
        }
        if !moved.is_empty() || failed || !open {
            // Settle everything in flight before routing anew.
            while s.outstanding > 0 {
                let Some(a) = done_rx.recv().await else { break };
                s.outstanding -= 1;
                failed |= settle(a, &mut moved);
            }
            if failed {
                // A failed batch left a gap in its partition's sequence:
                // the next epoch starts every partition at 0 again.
                failed = false;
                match s
                    .conn
                    .call(Request::InitProducer {
                        producer_id: Some(s.producer_id),
                    })
                    .await
                {
                    Ok(Response::ProducerInit { epoch, .. }) => {
                        s.epoch = epoch;
                        s.sequences.clear();
                    }
                    Ok(other) => {
                        let e = ClientError::Unexpected(format!("{other:?}"));
                        for b in moved.drain(..) {
                            fail(b.acks, &e);
                        }
                    }
                    Err(e) => {
                        for b in moved.drain(..) {
                            fail(b.acks, &e);
                        }
                    }
                }
            }
            if !moved.is_empty() {
                let again = match self::route(&s.conn, &s.config.topic).await {
                    Ok(r) => r,
                    Err(e) => {
                        for b in moved.drain(..) {
                            fail(b.acks, &e);
                        }
                        continue;
                    }
                };
                s.route = again;
                moved.sort_by_key(|b| b.order);
                for b in std::mem::take(&mut moved) {
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
            Some(a) = done_rx.recv(), if s.outstanding > 0 => {
                s.outstanding -= 1;
                failed |= settle(a, &mut moved);
                continue;
            }
        };
        let (batch, still_open) = super::producer::gather(first, &mut rx, &s.config).await;
        open = still_open;
        let (records, acks): (Vec<ProduceRecord>, Vec<oneshot::Sender<Ack>>) =
            batch.into_iter().map(|i| (i.record, i.ack)).unzip();
        s.send_all(records, acks, None).await;
    }
}
