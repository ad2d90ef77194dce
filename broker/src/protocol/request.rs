//! Encoding and decoding requests.

use bytes::Bytes;

use super::messages::{
    op, Acks, HotKeyModeSpec, Isolation, ProduceRecord, Request, SplitSpec, Stamp, SyncSpec,
    TailFromSpec, Token,
};
use super::wire::{Decoder, Encoder};
use super::{frame_chunks, ProtocolError, MAX_NAME_BYTES};

/// Longest credential in a `Hello`.
const MAX_TOKEN_BYTES: usize = 4096;

pub(super) fn name(d: &mut Decoder, what: &'static str) -> Result<String, ProtocolError> {
    d.str(what, MAX_NAME_BYTES)
}

fn encode_split(e: &mut Encoder, plan: &SplitSpec) {
    match plan {
        SplitSpec::LoadMedian => e.u8(0),
        SplitSpec::Even => e.u8(1),
        SplitSpec::At(h) => {
            e.u8(2);
            e.u64(*h);
        }
        SplitSpec::HotKey(k) => {
            e.u8(3);
            e.bytes(k);
        }
    }
}

fn decode_split(d: &mut Decoder) -> Result<SplitSpec, ProtocolError> {
    Ok(match d.u8("split plan")? {
        0 => SplitSpec::LoadMedian,
        1 => SplitSpec::Even,
        2 => SplitSpec::At(d.u64("split point")?),
        3 => SplitSpec::HotKey(d.bytes("hot key")?),
        _ => {
            return Err(ProtocolError::Invalid {
                what: "split plan",
                reason: "unknown kind",
            })
        }
    })
}

fn encode_acks(e: &mut Encoder, acks: Acks) {
    e.u8(match acks {
        Acks::None => 0,
        Acks::Leader => 1,
        Acks::Quorum => 2,
    });
}

fn decode_acks(d: &mut Decoder) -> Result<Acks, ProtocolError> {
    Ok(match d.u8("acks")? {
        0 => Acks::None,
        1 => Acks::Leader,
        2 => Acks::Quorum,
        _ => {
            return Err(ProtocolError::Invalid {
                what: "acks",
                reason: "unknown level",
            })
        }
    })
}

fn encode_records(e: &mut Encoder, records: &[ProduceRecord]) {
    e.u32(records.len() as u32);
    for r in records {
        e.opt_bytes(r.key.as_ref());
        e.bytes(&r.value);
        match r.timestamp {
            Some(t) => {
                e.u8(1);
                e.i64(t);
            }
            None => e.u8(0),
        }
    }
}

fn decode_records(d: &mut Decoder) -> Result<Vec<ProduceRecord>, ProtocolError> {
    // A record takes at least 9 bytes: key marker, value length, timestamp flag.
    let n = d.count("record count", 9)?;
    let mut records = Vec::with_capacity(n);
    for _ in 0..n {
        let key = d.opt_bytes("key")?;
        let value = d.bytes("value")?;
        let timestamp = match d.u8("timestamp flag")? {
            0 => None,
            1 => Some(d.i64("timestamp")?),
            _ => {
                return Err(ProtocolError::Invalid {
                    what: "timestamp flag",
                    reason: "not 0 or 1",
                })
            }
        };
        records.push(ProduceRecord {
            key,
            value,
            timestamp,
        });
    }
    Ok(records)
}

impl Request {
    /// The opcode of this request.
    pub fn opcode(&self) -> u8 {
        match self {
            Request::Hello { .. } => op::HELLO,
            Request::Produce { .. } => op::PRODUCE,
            Request::ProduceTo { .. } => op::PRODUCE_TO,
            Request::InitProducer { .. } => op::INIT_PRODUCER,
            Request::Topology { .. } => op::TOPOLOGY,
            Request::Fetch { .. } => op::FETCH,
            Request::JoinGroup { .. } => op::JOIN_GROUP,
            Request::Heartbeat { .. } => op::HEARTBEAT,
            Request::GroupPoll { .. } => op::GROUP_POLL,
            Request::Commit { .. } => op::COMMIT,
            Request::LeaveGroup { .. } => op::LEAVE_GROUP,
            Request::CreateTopic { .. } => op::CREATE_TOPIC,
            Request::ListTopics => op::LIST_TOPICS,
            Request::Describe { .. } => op::DESCRIBE,
            Request::Split { .. } => op::SPLIT,
            Request::Merge { .. } => op::MERGE,
            Request::TailSplit { .. } => op::TAIL_SPLIT,
            Request::SetHotKeyMode { .. } => op::SET_HOT_KEY_MODE,
            Request::ListGroups { .. } => op::LIST_GROUPS,
            Request::Stats => op::STATS,
        }
    }

    /// A short name (`produce`, `group_poll`), for metrics labels and spans.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "hello",
            Request::Produce { .. } => "produce",
            Request::ProduceTo { .. } => "produce_to",
            Request::InitProducer { .. } => "init_producer",
            Request::Topology { .. } => "topology",
            Request::Fetch { .. } => "fetch",
            Request::JoinGroup { .. } => "group_join",
            Request::Heartbeat { .. } => "group_heartbeat",
            Request::GroupPoll { .. } => "group_poll",
            Request::Commit { .. } => "group_commit",
            Request::LeaveGroup { .. } => "group_leave",
            Request::CreateTopic { .. } => "create_topic",
            Request::ListTopics => "list_topics",
            Request::Describe { .. } => "describe",
            Request::Split { .. } => "split",
            Request::Merge { .. } => "merge",
            Request::TailSplit { .. } => "tail_split",
            Request::SetHotKeyMode { .. } => "set_hot_key_mode",
            Request::ListGroups { .. } => "list_groups",
            Request::Stats => "stats",
        }
    }

    /// The whole frame, length prefix included, as chunks to write (long
    /// values are shared, not copied).
    pub fn encode(&self, request_id: u32) -> Vec<Bytes> {
        let mut e = Encoder::new();
        match self {
            Request::Hello {
                min_version,
                max_version,
                client,
                token,
            } => {
                e.u32(u32::from_le_bytes(super::MAGIC));
                e.u16(*min_version);
                e.u16(*max_version);
                e.str(client);
                e.opt_bytes(token.as_ref().map(|t| &t.0));
            }
            Request::Produce {
                topic,
                acks,
                records,
            } => {
                e.str(topic);
                encode_acks(&mut e, *acks);
                encode_records(&mut e, records);
            }
            Request::ProduceTo {
                topic,
                partition,
                acks,
                stamp,
                records,
            } => {
                e.str(topic);
                e.u32(*partition);
                encode_acks(&mut e, *acks);
                match stamp {
                    Some(s) => {
                        e.u8(1);
                        e.u64(s.producer_id);
                        e.u32(s.epoch);
                        e.u64(s.first_sequence);
                    }
                    None => e.u8(0),
                }
                encode_records(&mut e, records);
            }
            Request::InitProducer { producer_id } => match producer_id {
                Some(id) => {
                    e.u8(1);
                    e.u64(*id);
                }
                None => e.u8(0),
            },
            Request::Topology { topic } => e.str(topic),
            Request::Fetch {
                topic,
                partition,
                offset,
                max_bytes,
                max_wait_ms,
                isolation,
            } => {
                e.str(topic);
                e.u32(*partition);
                e.u64(*offset);
                e.u32(*max_bytes);
                e.u32(*max_wait_ms);
                e.u8(match isolation {
                    Isolation::Default => 0,
                    Isolation::Durable => 1,
                    Isolation::Written => 2,
                });
            }
            Request::JoinGroup {
                topic,
                group,
                session_timeout_ms,
                processing_timeout_ms,
                instance_id,
            } => {
                e.str(topic);
                e.str(group);
                e.u32(*session_timeout_ms);
                e.u32(*processing_timeout_ms);
                e.opt_str(instance_id.as_deref());
            }
            Request::Heartbeat { member }
            | Request::Commit { member }
            | Request::LeaveGroup { member } => e.u64(*member),
            Request::GroupPoll {
                member,
                max_records,
                max_bytes,
                max_wait_ms,
            } => {
                e.u64(*member);
                e.u32(*max_records);
                e.u32(*max_bytes);
                e.u32(*max_wait_ms);
            }
            Request::CreateTopic {
                topic,
                partitions,
                sync,
                max_record_bytes,
                target_bytes_per_sec,
                auto_balance,
            } => {
                e.str(topic);
                e.u32(*partitions);
                match sync {
                    SyncSpec::Never => {
                        e.u8(0);
                        e.u64(0);
                    }
                    SyncSpec::IntervalMs(ms) => {
                        e.u8(1);
                        e.u64(*ms);
                    }
                    SyncSpec::Always => {
                        e.u8(2);
                        e.u64(0);
                    }
                }
                e.u32(*max_record_bytes);
                e.u64(*target_bytes_per_sec);
                e.u8(u8::from(*auto_balance));
            }
            Request::ListTopics | Request::Stats => {}
            Request::Describe { topic } => e.str(topic),
            Request::Split {
                topic,
                partition,
                plan,
            } => {
                e.str(topic);
                e.u32(*partition);
                encode_split(&mut e, plan);
            }
            Request::Merge { topic, a, b } => {
                e.str(topic);
                e.u32(*a);
                e.u32(*b);
            }
            Request::TailSplit {
                topic,
                partition,
                plan,
                from,
            } => {
                e.str(topic);
                e.u32(*partition);
                encode_split(&mut e, plan);
                match from {
                    TailFromSpec::Offset(o) => {
                        e.u8(0);
                        e.u64(*o);
                    }
                    TailFromSpec::SlowestGroup => {
                        e.u8(1);
                        e.u64(0);
                    }
                }
            }
            Request::SetHotKeyMode {
                topic,
                key,
                mode,
                lanes,
            } => {
                e.str(topic);
                e.bytes(key);
                match mode {
                    HotKeyModeSpec::Strict => {
                        e.u8(0);
                        e.u64(0);
                    }
                    HotKeyModeSpec::WindowedMs(ms) => {
                        e.u8(1);
                        e.u64(*ms);
                    }
                    HotKeyModeSpec::Spread => {
                        e.u8(2);
                        e.u64(0);
                    }
                }
                e.u32(*lanes);
            }
            Request::ListGroups { topic } => e.opt_str(topic.as_deref()),
        }
        frame_chunks(request_id, self.opcode(), None, e)
    }

    /// Decodes a request body. Every byte must be used.
    pub fn decode(opcode: u8, body: Bytes) -> Result<Request, ProtocolError> {
        let mut d = Decoder::new(body);
        let r = match opcode {
            op::HELLO => {
                let magic = d.u32("magic")?;
                if magic != u32::from_le_bytes(super::MAGIC) {
                    return Err(ProtocolError::Invalid {
                        what: "magic",
                        reason: "not a fissionlog-broker client",
                    });
                }
                let min_version = d.u16("min version")?;
                let max_version = d.u16("max version")?;
                let client = d.str("client name", MAX_NAME_BYTES)?;
                let token = d.opt_bytes("token")?.map(Token);
                if token.as_ref().is_some_and(|t| t.0.len() > MAX_TOKEN_BYTES) {
                    return Err(ProtocolError::Invalid {
                        what: "token",
                        reason: "too long",
                    });
                }
                Request::Hello {
                    min_version,
                    max_version,
                    client,
                    token,
                }
            }
            op::PRODUCE => {
                let topic = name(&mut d, "topic")?;
                let acks = decode_acks(&mut d)?;
                let records = decode_records(&mut d)?;
                Request::Produce {
                    topic,
                    acks,
                    records,
                }
            }
            op::PRODUCE_TO => {
                let topic = name(&mut d, "topic")?;
                let partition = d.u32("partition")?;
                let acks = decode_acks(&mut d)?;
                let stamp = match d.u8("stamp flag")? {
                    0 => None,
                    1 => Some(Stamp {
                        producer_id: d.u64("producer id")?,
                        epoch: d.u32("producer epoch")?,
                        first_sequence: d.u64("first sequence")?,
                    }),
                    _ => {
                        return Err(ProtocolError::Invalid {
                            what: "stamp flag",
                            reason: "not 0 or 1",
                        })
                    }
                };
                let records = decode_records(&mut d)?;
                Request::ProduceTo {
                    topic,
                    partition,
                    acks,
                    stamp,
                    records,
                }
            }
            op::INIT_PRODUCER => Request::InitProducer {
                producer_id: match d.u8("producer id flag")? {
                    0 => None,
                    1 => Some(d.u64("producer id")?),
                    _ => {
                        return Err(ProtocolError::Invalid {
                            what: "producer id flag",
                            reason: "not 0 or 1",
                        })
                    }
                },
            },
            op::TOPOLOGY => Request::Topology {
                topic: name(&mut d, "topic")?,
            },
            op::FETCH => Request::Fetch {
                topic: name(&mut d, "topic")?,
                partition: d.u32("partition")?,
                offset: d.u64("offset")?,
                max_bytes: d.u32("max bytes")?,
                max_wait_ms: d.u32("max wait")?,
                isolation: match d.u8("isolation")? {
                    0 => Isolation::Default,
                    1 => Isolation::Durable,
                    2 => Isolation::Written,
                    _ => {
                        return Err(ProtocolError::Invalid {
                            what: "isolation",
                            reason: "unknown level",
                        })
                    }
                },
            },
            op::JOIN_GROUP => Request::JoinGroup {
                topic: name(&mut d, "topic")?,
                group: name(&mut d, "group")?,
                session_timeout_ms: d.u32("session timeout")?,
                processing_timeout_ms: d.u32("processing timeout")?,
                instance_id: d.opt_str("instance id", MAX_NAME_BYTES)?,
            },
            op::HEARTBEAT => Request::Heartbeat {
                member: d.u64("member")?,
            },
            op::COMMIT => Request::Commit {
                member: d.u64("member")?,
            },
            op::LEAVE_GROUP => Request::LeaveGroup {
                member: d.u64("member")?,
            },
            op::GROUP_POLL => Request::GroupPoll {
                member: d.u64("member")?,
                max_records: d.u32("max records")?,
                max_bytes: d.u32("max bytes")?,
                max_wait_ms: d.u32("max wait")?,
            },
            op::CREATE_TOPIC => {
                let topic = name(&mut d, "topic")?;
                let partitions = d.u32("partitions")?;
                let kind = d.u8("sync policy")?;
                let ms = d.u64("sync interval")?;
                let sync = match kind {
                    0 => SyncSpec::Never,
                    1 => SyncSpec::IntervalMs(ms),
                    2 => SyncSpec::Always,
                    _ => {
                        return Err(ProtocolError::Invalid {
                            what: "sync policy",
                            reason: "unknown kind",
                        })
                    }
                };
                let max_record_bytes = d.u32("max record bytes")?;
                let target_bytes_per_sec = d.u64("target bytes per second")?;
                let auto_balance = match d.u8("auto balance")? {
                    0 => false,
                    1 => true,
                    _ => {
                        return Err(ProtocolError::Invalid {
                            what: "auto balance",
                            reason: "not 0 or 1",
                        })
                    }
                };
                Request::CreateTopic {
                    topic,
                    partitions,
                    sync,
                    max_record_bytes,
                    target_bytes_per_sec,
                    auto_balance,
                }
            }
            op::LIST_TOPICS => Request::ListTopics,
            op::STATS => Request::Stats,
            op::DESCRIBE => Request::Describe {
                topic: name(&mut d, "topic")?,
            },
            op::SPLIT => Request::Split {
                topic: name(&mut d, "topic")?,
                partition: d.u32("partition")?,
                plan: decode_split(&mut d)?,
            },
            op::MERGE => Request::Merge {
                topic: name(&mut d, "topic")?,
                a: d.u32("partition a")?,
                b: d.u32("partition b")?,
            },
            op::TAIL_SPLIT => {
                let topic = name(&mut d, "topic")?;
                let partition = d.u32("partition")?;
                let plan = decode_split(&mut d)?;
                let kind = d.u8("tail from")?;
                let offset = d.u64("tail offset")?;
                let from = match kind {
                    0 => TailFromSpec::Offset(offset),
                    1 => TailFromSpec::SlowestGroup,
                    _ => {
                        return Err(ProtocolError::Invalid {
                            what: "tail from",
                            reason: "unknown kind",
                        })
                    }
                };
                Request::TailSplit {
                    topic,
                    partition,
                    plan,
                    from,
                }
            }
            op::SET_HOT_KEY_MODE => {
                let topic = name(&mut d, "topic")?;
                let key = d.bytes("key")?;
                let kind = d.u8("hot-key mode")?;
                let ms = d.u64("window")?;
                let mode = match kind {
                    0 => HotKeyModeSpec::Strict,
                    1 => HotKeyModeSpec::WindowedMs(ms),
                    2 => HotKeyModeSpec::Spread,
                    _ => {
                        return Err(ProtocolError::Invalid {
                            what: "hot-key mode",
                            reason: "unknown kind",
                        })
                    }
                };
                Request::SetHotKeyMode {
                    topic,
                    key,
                    mode,
                    lanes: d.u32("lanes")?,
                }
            }
            op::LIST_GROUPS => Request::ListGroups {
                topic: d.opt_str("topic", MAX_NAME_BYTES)?,
            },
            other => return Err(ProtocolError::UnknownOpcode(other)),
        };
        d.finish("request")?;
        Ok(r)
    }
}
