//! Requests and responses: one variant per opcode (layouts in
//! docs/PROTOCOL.md); their encoders and decoders are in `request.rs` and
//! `response.rs`.

use bytes::Bytes;

use super::ErrorCode;

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

/// An idempotent producer's stamp on a batch: who sent it and where its
/// records sit in the producer's sequence for the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The id `InitProducer` handed out.
    pub producer_id: u64,
    /// The producer's epoch: a batch of an older one is fenced.
    pub epoch: u32,
    /// The sequence number of the batch's first record in this partition.
    pub first_sequence: u64,
}

/// An active partition and the hash range it owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeOwner {
    /// Partition id.
    pub partition: u32,
    /// First hash owned.
    pub start: u64,
    /// Last hash owned (inclusive).
    pub end: u64,
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
    /// Append records to one partition the client routed them to (each
    /// key's hash inside its range), stamped when idempotent.
    ProduceTo {
        topic: String,
        partition: u32,
        acks: Acks,
        stamp: Option<Stamp>,
        records: Vec<ProduceRecord>,
    },
    /// A producer id (a new one), or the next epoch of a known one.
    InitProducer { producer_id: Option<u64> },
    /// A topic's active partitions, their ranges and the routing key.
    Topology { topic: String },
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
    /// The producer id and epoch to stamp batches with.
    ProducerInit { producer_id: u64, epoch: u32 },
    /// A topic's routing: its topology epoch, the key of its routing hash
    /// (`fissionlog::key_hash`) and its active partitions.
    Topology {
        epoch: u64,
        routing_key: [u64; 2],
        partitions: Vec<RangeOwner>,
    },
    /// A `ProduceTo` reached a sealed partition (split, merged or tail
    /// split): nothing of it was appended. The active partitions that own
    /// its range now, at topology epoch `epoch`.
    Moved {
        message: String,
        epoch: u64,
        partitions: Vec<RangeOwner>,
    },
    /// Cluster mode: this broker does not lead what the request needs
    /// (a partition's Raft group, the controller); nothing was carried
    /// out. `leader` is the leader broker's client address when known:
    /// the request goes there.
    NotLeader {
        opcode: u8,
        message: String,
        leader: Option<String>,
    },
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
    pub const PRODUCE_TO: u8 = 0x04;
    pub const INIT_PRODUCER: u8 = 0x05;
    pub const TOPOLOGY: u8 = 0x06;
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
