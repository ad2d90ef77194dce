//! Requests and responses: one variant per opcode, each with its encoder
//! and decoder (layouts in docs/PROTOCOL.md).

use bytes::Bytes;

use super::wire::{Decoder, Encoder};
use super::{frame_chunks, ErrorCode, ProtocolError, MAX_NAME_BYTES, RESPONSE_BIT};

/// Longest error message or JSON document a response carries.
const MAX_TEXT_BYTES: usize = 16 << 20;
/// Longest credential in a `Hello`.
const MAX_TOKEN_BYTES: usize = 4096;

/// How much a producer waits for (see docs/PROTOCOL.md, "acks").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// The response comes once the request was read and queued; it carries
    /// no positions, and a failure to append is only logged.
    None,
    /// Appended on the leader (the only node): survives a process kill,
    /// readable by `Written` fetches.
    Leader,
    /// On every replica of the quorum; on a single node that is the only
    /// replica, and "on" means fsynced (a completed sync round covers it).
    Quorum,
}

/// Read isolation asked by a fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// The topic's default (durable for `SyncPolicy::Always` topics).
    Default,
    /// Only records a completed sync covers.
    Durable,
    /// Everything appended.
    Written,
}

/// A topic's sync policy, as `CreateTopic` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncSpec {
    /// `SyncPolicy::Never`.
    Never,
    /// `SyncPolicy::Interval` of this many milliseconds.
    IntervalMs(u64),
    /// `SyncPolicy::Always`.
    Always,
}

/// How to split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitSpec {
    /// At the load-weighted median.
    LoadMedian,
    /// In the middle of the range.
    Even,
    /// Children `[start, at]`, `[at + 1, end]`.
    At(u64),
    /// Isolate the hash of this key.
    HotKey(Bytes),
}

/// Where a tail split starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailFromSpec {
    /// From this offset.
    Offset(u64),
    /// From the slowest group's committed position.
    SlowestGroup,
}

/// A key's hot-key mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HotKeyModeSpec {
    /// One lane.
    Strict,
    /// Windows of this many milliseconds rotating over lanes.
    WindowedMs(u64),
    /// No order.
    Spread,
}

/// One record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceRecord {
    /// Routing key.
    pub key: Option<Bytes>,
    /// Payload.
    pub value: Bytes,
    /// Milliseconds since the epoch; the server's clock when absent.
    pub timestamp: Option<i64>,
}

/// One record of a fetch response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedRecord {
    /// Offset.
    pub offset: u64,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
    /// Key.
    pub key: Option<Bytes>,
    /// Value.
    pub value: Bytes,
}

/// One record of a group poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolledRecord {
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
    /// Key.
    pub key: Option<Bytes>,
    /// Value.
    pub value: Bytes,
}

/// A credential. Its `Debug` output never shows the bytes, so a request
/// that is logged doesn't leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub Bytes);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(<{} bytes, redacted>)", self.0.len())
    }
}

/// A request, client to server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // the fields are documented in docs/PROTOCOL.md
pub enum Request {
    /// The handshake, first on every connection.
    Hello {
        min_version: u16,
        max_version: u16,
        client: String,
        token: Option<Token>,
    },
    /// Append records.
    Produce {
        topic: String,
        acks: Acks,
        records: Vec<ProduceRecord>,
    },
    /// Read one partition from an offset, waiting up to `max_wait_ms`.
    Fetch {
        topic: String,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait_ms: u32,
        isolation: Isolation,
    },
    /// Join a consumer group.
    JoinGroup {
        topic: String,
        group: String,
        session_timeout_ms: u32,
        processing_timeout_ms: u32,
        instance_id: Option<String>,
    },
    /// A member is alive.
    Heartbeat { member: u64 },
    /// A member's next records, waiting up to `max_wait_ms`.
    GroupPoll {
        member: u64,
        max_records: u32,
        max_bytes: u32,
        max_wait_ms: u32,
    },
    /// Commit everything the member received.
    Commit { member: u64 },
    /// Leave the group.
    LeaveGroup { member: u64 },
    /// Create a topic.
    CreateTopic {
        topic: String,
        partitions: u32,
        sync: SyncSpec,
        max_record_bytes: u32,
        target_bytes_per_sec: u64,
        auto_balance: bool,
    },
    /// Topic names.
    ListTopics,
    /// One topic's partitions.
    Describe { topic: String },
    /// Split a partition forward.
    Split {
        topic: String,
        partition: u32,
        plan: SplitSpec,
    },
    /// Merge two adjacent active partitions.
    Merge { topic: String, a: u32, b: u32 },
    /// Split a partition and move its tail into the children.
    TailSplit {
        topic: String,
        partition: u32,
        plan: SplitSpec,
        from: TailFromSpec,
    },
    /// Set a key's hot-key mode.
    SetHotKeyMode {
        topic: String,
        key: Bytes,
        mode: HotKeyModeSpec,
        lanes: u32,
    },
    /// The groups of a topic (or all).
    ListGroups { topic: Option<String> },
    /// The server's counters.
    Stats,
}

/// A response, server to client.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Response {
    /// The handshake's answer.
    HelloOk {
        version: u16,
        max_frame_bytes: u32,
        max_in_flight: u32,
        server: String,
    },
    /// Positions of the produced records, in request order (empty for
    /// acks none).
    Produced { positions: Vec<(u32, u64)> },
    /// Records of one partition.
    Fetched {
        partition: u32,
        next_offset: u64,
        high_watermark: u64,
        records: Vec<FetchedRecord>,
    },
    /// The new member.
    Joined { member: u64, generation: u64 },
    /// A heartbeat's, commit's or leave's answer: the member's generation.
    Done { opcode: u8, generation: u64 },
    /// A member's records.
    Polled {
        generation: u64,
        records: Vec<PolledRecord>,
    },
    /// An admin answer: one JSON document (docs/PROTOCOL.md lists its
    /// shape per request).
    Json { opcode: u8, json: String },
    /// The request failed.
    Error {
        opcode: u8,
        code: ErrorCode,
        message: String,
    },
}

/// Opcodes (stable on the wire).
pub(crate) mod op {
    pub const HELLO: u8 = 0x01;
    pub const PRODUCE: u8 = 0x02;
    pub const FETCH: u8 = 0x03;
    pub const JOIN_GROUP: u8 = 0x10;
    pub const HEARTBEAT: u8 = 0x11;
    pub const GROUP_POLL: u8 = 0x12;
    pub const COMMIT: u8 = 0x13;
    pub const LEAVE_GROUP: u8 = 0x14;
    pub const CREATE_TOPIC: u8 = 0x20;
    pub const LIST_TOPICS: u8 = 0x21;
    pub const DESCRIBE: u8 = 0x22;
    pub const SPLIT: u8 = 0x23;
    pub const MERGE: u8 = 0x24;
    pub const TAIL_SPLIT: u8 = 0x25;
    pub const SET_HOT_KEY_MODE: u8 = 0x26;
    pub const LIST_GROUPS: u8 = 0x27;
    pub const STATS: u8 = 0x28;
    /// Opcodes whose success response is a JSON document.
    pub const JSON: [u8; 9] = [
        CREATE_TOPIC,
        LIST_TOPICS,
        DESCRIBE,
        SPLIT,
        MERGE,
        TAIL_SPLIT,
        SET_HOT_KEY_MODE,
        LIST_GROUPS,
        STATS,
    ];
}

fn name(d: &mut Decoder, what: &'static str) -> Result<String, ProtocolError> {
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

impl Request {
    /// The opcode of this request.
    pub fn opcode(&self) -> u8 {
        match self {
            Request::Hello { .. } => op::HELLO,
            Request::Produce { .. } => op::PRODUCE,
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
                e.u8(match acks {
                    Acks::None => 0,
                    Acks::Leader => 1,
                    Acks::Quorum => 2,
                });
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
                let acks = match d.u8("acks")? {
                    0 => Acks::None,
                    1 => Acks::Leader,
                    2 => Acks::Quorum,
                    _ => {
                        return Err(ProtocolError::Invalid {
                            what: "acks",
                            reason: "unknown level",
                        })
                    }
                };
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
                Request::Produce {
                    topic,
                    acks,
                    records,
                }
            }
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
                Response::Done { opcode, .. }
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
