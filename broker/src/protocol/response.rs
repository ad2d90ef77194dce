//! Encoding and decoding responses.

use bytes::Bytes;

use super::messages::{op, FetchedRecord, PolledRecord, RangeOwner, Response};
use super::wire::{Decoder, Encoder};
use super::{frame_chunks, ErrorCode, ProtocolError, MAX_NAME_BYTES, RESPONSE_BIT};

/// Longest error message or JSON document a response carries.
const MAX_TEXT_BYTES: usize = 16 << 20;

fn encode_owners(e: &mut Encoder, owners: &[RangeOwner]) {
    e.u32(owners.len() as u32);
    for o in owners {
        e.u32(o.partition);
        e.u64(o.start);
        e.u64(o.end);
    }
}

fn decode_owners(d: &mut Decoder) -> Result<Vec<RangeOwner>, ProtocolError> {
    let n = d.count("partition count", 20)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(RangeOwner {
            partition: d.u32("partition")?,
            start: d.u64("range start")?,
            end: d.u64("range end")?,
        });
    }
    Ok(out)
}

impl Response {
    /// The opcode this response answers (with [`RESPONSE_BIT`]).
    pub fn opcode(&self) -> u8 {
        RESPONSE_BIT
            | match self {
                Response::HelloOk { .. } => op::HELLO,
                Response::Produced { .. } => op::PRODUCE,
                Response::Fetched { .. } => op::FETCH,
                Response::Joined { .. } => op::JOIN_GROUP,
                Response::Polled { .. } => op::GROUP_POLL,
                Response::ProducerInit { .. } => op::INIT_PRODUCER,
                Response::Topology { .. } => op::TOPOLOGY,
                Response::Moved { .. } => op::PRODUCE_TO,
                Response::Done { opcode, .. }
                | Response::NotLeader { opcode, .. }
                | Response::Json { opcode, .. }
                | Response::Error { opcode, .. } => *opcode & !RESPONSE_BIT,
            }
    }

    /// The whole frame as chunks to write; record values are shared
    /// (on the server: the mapped segment bytes), not copied.
    pub fn encode(&self, request_id: u32) -> Vec<Bytes> {
        let mut e = Encoder::new();
        let mut opcode = self.opcode();
        let mut code = 0u16;
        match self {
            Response::HelloOk {
                version,
                max_frame_bytes,
                max_in_flight,
                server,
            } => {
                e.u16(*version);
                e.u32(*max_frame_bytes);
                e.u32(*max_in_flight);
                e.str(server);
            }
            Response::Produced { positions } => {
                e.u32(positions.len() as u32);
                for (p, o) in positions {
                    e.u32(*p);
                    e.u64(*o);
                }
            }
            Response::Fetched {
                partition,
                next_offset,
                high_watermark,
                records,
            } => {
                e.u32(*partition);
                e.u64(*next_offset);
                e.u64(*high_watermark);
                e.u32(records.len() as u32);
                for r in records {
                    e.u64(r.offset);
                    e.i64(r.timestamp);
                    e.opt_bytes(r.key.as_ref());
                    e.bytes(&r.value);
                }
            }
            Response::Joined { member, generation } => {
                e.u64(*member);
                e.u64(*generation);
            }
            Response::Done { generation, .. } => e.u64(*generation),
            Response::Polled {
                generation,
                records,
            } => {
                e.u64(*generation);
                e.u32(records.len() as u32);
                for r in records {
                    e.u32(r.partition);
                    e.u64(r.offset);
                    e.i64(r.timestamp);
                    e.opt_bytes(r.key.as_ref());
                    e.bytes(&r.value);
                }
            }
            Response::Json { json, .. } => e.str(json),
            Response::ProducerInit { producer_id, epoch } => {
                e.u64(*producer_id);
                e.u32(*epoch);
            }
            Response::Topology {
                epoch,
                routing_key,
                partitions,
            } => {
                e.u64(*epoch);
                e.u64(routing_key[0]);
                e.u64(routing_key[1]);
                encode_owners(&mut e, partitions);
            }
            Response::Moved {
                message,
                epoch,
                partitions,
            } => {
                code = ErrorCode::Moved as u16;
                e.str(message);
                e.u64(*epoch);
                encode_owners(&mut e, partitions);
            }
            Response::NotLeader {
                message, leader, ..
            } => {
                code = ErrorCode::NotLeader as u16;
                e.str(message);
                e.opt_str(leader.as_deref());
            }
            Response::Error {
                opcode: o,
                code: c,
                message,
            } => {
                opcode = RESPONSE_BIT | *o;
                code = *c as u16;
                e.str(message);
            }
        }
        frame_chunks(request_id, opcode, Some(code), e)
    }

    /// Decodes a response body (the code first). `Done` answers a
    /// heartbeat, a commit and a leave alike.
    pub fn decode(opcode: u8, body: Bytes) -> Result<Response, ProtocolError> {
        if opcode & RESPONSE_BIT == 0 {
            return Err(ProtocolError::Invalid {
                what: "opcode",
                reason: "a request's opcode in a response",
            });
        }
        let req_op = opcode & !RESPONSE_BIT;
        let mut d = Decoder::new(body);
        let code = d.u16("error code")?;
        if code != 0 {
            let code = ErrorCode::from_u16(code).ok_or(ProtocolError::UnknownCode(code))?;
            let message = d.str("error message", MAX_TEXT_BYTES)?;
            if code == ErrorCode::Moved && req_op == op::PRODUCE_TO {
                let epoch = d.u64("topology epoch")?;
                let partitions = decode_owners(&mut d)?;
                d.finish("response")?;
                return Ok(Response::Moved {
                    message,
                    epoch,
                    partitions,
                });
            }
            if code == ErrorCode::NotLeader {
                let leader = d.opt_str("leader address", MAX_NAME_BYTES)?;
                d.finish("response")?;
                return Ok(Response::NotLeader {
                    opcode: req_op,
                    message,
                    leader,
                });
            }
            d.finish("response")?;
            return Ok(Response::Error {
                opcode: req_op,
                code,
                message,
            });
        }
        let r = match req_op {
            op::HELLO => Response::HelloOk {
                version: d.u16("version")?,
                max_frame_bytes: d.u32("max frame")?,
                max_in_flight: d.u32("max in flight")?,
                server: d.str("server name", MAX_NAME_BYTES)?,
            },
            op::PRODUCE => {
                let n = d.count("position count", 12)?;
                let mut positions = Vec::with_capacity(n);
                for _ in 0..n {
                    positions.push((d.u32("partition")?, d.u64("offset")?));
                }
                Response::Produced { positions }
            }
            op::FETCH => {
                let partition = d.u32("partition")?;
                let next_offset = d.u64("next offset")?;
                let high_watermark = d.u64("high watermark")?;
                let n = d.count("record count", 24)?;
                let mut records = Vec::with_capacity(n);
                for _ in 0..n {
                    records.push(FetchedRecord {
                        offset: d.u64("offset")?,
                        timestamp: d.i64("timestamp")?,
                        key: d.opt_bytes("key")?,
                        value: d.bytes("value")?,
                    });
                }
                Response::Fetched {
                    partition,
                    next_offset,
                    high_watermark,
                    records,
                }
            }
            op::JOIN_GROUP => Response::Joined {
                member: d.u64("member")?,
                generation: d.u64("generation")?,
            },
            op::HEARTBEAT | op::COMMIT | op::LEAVE_GROUP => Response::Done {
                opcode: req_op,
                generation: d.u64("generation")?,
            },
            op::GROUP_POLL => {
                let generation = d.u64("generation")?;
                let n = d.count("record count", 28)?;
                let mut records = Vec::with_capacity(n);
                for _ in 0..n {
                    records.push(PolledRecord {
                        partition: d.u32("partition")?,
                        offset: d.u64("offset")?,
                        timestamp: d.i64("timestamp")?,
                        key: d.opt_bytes("key")?,
                        value: d.bytes("value")?,
                    });
                }
                Response::Polled {
                    generation,
                    records,
                }
            }
            op::INIT_PRODUCER => Response::ProducerInit {
                producer_id: d.u64("producer id")?,
                epoch: d.u32("producer epoch")?,
            },
            op::TOPOLOGY => Response::Topology {
                epoch: d.u64("topology epoch")?,
                routing_key: [d.u64("routing key")?, d.u64("routing key")?],
                partitions: decode_owners(&mut d)?,
            },
            op::PRODUCE_TO => {
                let n = d.count("position count", 12)?;
                let mut positions = Vec::with_capacity(n);
                for _ in 0..n {
                    positions.push((d.u32("partition")?, d.u64("offset")?));
                }
                Response::Produced { positions }
            }
            o if op::JSON.contains(&o) => Response::Json {
                opcode: o,
                json: d.str("json", MAX_TEXT_BYTES)?,
            },
            other => return Err(ProtocolError::UnknownOpcode(other)),
        };
        d.finish("response")?;
        Ok(r)
    }
}
