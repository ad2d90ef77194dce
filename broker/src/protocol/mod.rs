//! The broker's binary protocol (docs/PROTOCOL.md): length-prefixed
//! frames, a version handshake, request ids, typed error codes.
//!
//! Everything here is pure: functions over bytes, no I/O and no runtime,
//! so the decoder is unit-tested and fuzzed on its own
//! ([`check_decode`]).

mod messages;
mod request;
mod response;
mod wire;

pub(crate) use messages::op;
pub use messages::{
    Acks, FetchedRecord, HotKeyModeSpec, Isolation, PolledRecord, ProduceRecord, RangeOwner,
    Request, Response, SplitSpec, Stamp, SyncSpec, TailFromSpec, Token,
};
pub use wire::{Decoder, Encoder};

use bytes::Bytes;

/// The first four bytes of a client's `Hello`.
pub const MAGIC: [u8; 4] = *b"FLBK";
/// The newest protocol version this build speaks. Version 2 added routed
/// and idempotent produces (`ProduceTo`, `InitProducer`, `Topology`) and
/// the `moved` answer; version 3 added the codes `not_leader` (25) and
/// `unsupported` (26) of cluster mode. Version 1 clients are refused at
/// the handshake.
pub const PROTOCOL_VERSION: u16 = 3;
/// The oldest version a single-node broker speaks: it never sends a code
/// version 3 added, so a version 2 client reads every answer it gets.
pub const MIN_PROTOCOL_VERSION: u16 = 2;
/// The oldest version a cluster-mode broker speaks: its answers carry
/// `not_leader` and `unsupported`, which a version 2 client can't read.
pub const MIN_CLUSTER_PROTOCOL_VERSION: u16 = 3;

/// The version a server answers a `Hello` asking for
/// `[min_version, max_version]` with: the newest both sides speak, or
/// `None` when there is none. A cluster-mode broker (`cluster`) speaks
/// from [`MIN_CLUSTER_PROTOCOL_VERSION`], a single node from
/// [`MIN_PROTOCOL_VERSION`], both up to [`PROTOCOL_VERSION`].
pub fn negotiate_version(min_version: u16, max_version: u16, cluster: bool) -> Option<u16> {
    let lowest = if cluster {
        MIN_CLUSTER_PROTOCOL_VERSION
    } else {
        MIN_PROTOCOL_VERSION
    };
    let version = max_version.min(PROTOCOL_VERSION);
    (version >= lowest && version >= min_version).then_some(version)
}
/// Bytes of the length prefix.
pub const LEN_PREFIX: usize = 4;
/// Bytes of a request header after the length: request id and opcode.
pub const REQUEST_HEADER: usize = 5;
/// Bytes of a response header after the length: request id, opcode, code.
pub const RESPONSE_HEADER: usize = 7;
/// Default largest frame (length prefix excluded) either side accepts.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 16 << 20;
/// The bit an opcode carries in a response.
pub const RESPONSE_BIT: u8 = 0x80;
/// Longest topic, group or instance name accepted on the wire (the
/// library checks topic names again).
pub const MAX_NAME_BYTES: usize = 255;

/// Malformed input. The connection that sent it gets an error frame
/// ([`ErrorCode::Malformed`]) and is closed: after a bad frame the byte
/// stream can't be trusted to be in step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The length prefix names more than the limit.
    #[error("frame of {len} bytes is over the limit of {max}")]
    FrameTooLarge {
        /// Announced length.
        len: u64,
        /// Limit.
        max: u64,
    },
    /// A frame shorter than its header.
    #[error("frame of {len} bytes is shorter than its {need}-byte header")]
    ShortFrame {
        /// Length.
        len: usize,
        /// Header bytes needed.
        need: usize,
    },
    /// A field runs past the end of the frame.
    #[error("frame ends inside {what}")]
    Truncated {
        /// The field.
        what: &'static str,
    },
    /// A field holds a value the protocol doesn't allow.
    #[error("{what}: {reason}")]
    Invalid {
        /// The field.
        what: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// An opcode nobody defined.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// An error code nobody defined (in a response).
    #[error("unknown error code {0}")]
    UnknownCode(u16),
}

/// Typed error codes of a response (0 is success). Stable on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(u16)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Bytes that don't parse; the connection is closed after it.
    Malformed = 1,
    /// The handshake named no version this server speaks; closed after it.
    UnsupportedVersion = 2,
    /// A frame over the limit; closed after it.
    FrameTooLarge = 3,
    /// More requests outstanding on this connection than the limit.
    TooManyInFlight = 4,
    /// The server is at its connection limit; closed after it.
    TooManyConnections = 5,
    /// A request before the handshake, or a second handshake.
    HandshakeRequired = 6,
    /// No such topic.
    UnknownTopic = 7,
    /// No such partition.
    UnknownPartition = 8,
    /// Offset outside what the partition holds.
    OffsetOutOfRange = 9,
    /// A record over the topic's limit.
    RecordTooLarge = 10,
    /// An argument the server or the log refuses (bad name, bad config).
    InvalidRequest = 11,
    /// An operation the log refused in this state (a split of a sealed
    /// partition, limits, an exists check).
    Refused = 12,
    /// The topic exists already.
    TopicExists = 13,
    /// The group member was fenced (declared dead or replaced).
    Fenced = 14,
    /// The member id is not a member joined on this connection.
    UnknownMember = 15,
    /// No such group.
    UnknownGroup = 16,
    /// The credential does not allow this.
    Unauthorized = 17,
    /// The server is shutting down; the request was not carried out.
    ShuttingDown = 18,
    /// Storage failed (I/O error, a poisoned partition, no space).
    Storage = 19,
    /// Records were removed by retention or lost to a recovery cut.
    DataLost = 20,
    /// A bug on the server.
    Internal = 21,
    /// A routed produce reached a sealed partition; the answer names the
    /// partitions that own its range now (`Response::Moved`).
    Moved = 22,
    /// An idempotent batch whose first sequence is not the next one
    /// expected (a gap), or older than the batches the server remembers.
    OutOfOrderSequence = 23,
    /// An idempotent batch of an older producer epoch: another producer
    /// took the id over.
    ProducerFenced = 24,
    /// Cluster mode: this broker does not lead the partition (or the
    /// controller); nothing was carried out. The answer names the
    /// leader's client address when this broker knows it
    /// (`Response::NotLeader`): send the request there.
    NotLeader = 25,
    /// Not available in the mode this broker runs in (consumer groups,
    /// splits and hot-key modes in cluster mode, for now).
    Unsupported = 26,
}

impl ErrorCode {
    /// Every code, for tables and tests.
    pub const ALL: [ErrorCode; 26] = [
        ErrorCode::Malformed,
        ErrorCode::UnsupportedVersion,
        ErrorCode::FrameTooLarge,
        ErrorCode::TooManyInFlight,
        ErrorCode::TooManyConnections,
        ErrorCode::HandshakeRequired,
        ErrorCode::UnknownTopic,
        ErrorCode::UnknownPartition,
        ErrorCode::OffsetOutOfRange,
        ErrorCode::RecordTooLarge,
        ErrorCode::InvalidRequest,
        ErrorCode::Refused,
        ErrorCode::TopicExists,
        ErrorCode::Fenced,
        ErrorCode::UnknownMember,
        ErrorCode::UnknownGroup,
        ErrorCode::Unauthorized,
        ErrorCode::ShuttingDown,
        ErrorCode::Storage,
        ErrorCode::DataLost,
        ErrorCode::Internal,
        ErrorCode::Moved,
        ErrorCode::OutOfOrderSequence,
        ErrorCode::ProducerFenced,
        ErrorCode::NotLeader,
        ErrorCode::Unsupported,
    ];

    /// The code of a wire value (0 is success, not a code).
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| *c as u16 == v)
    }

    /// A short name (`unknown_topic`), for messages and JSON.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "malformed",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::TooManyInFlight => "too_many_in_flight",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::HandshakeRequired => "handshake_required",
            ErrorCode::UnknownTopic => "unknown_topic",
            ErrorCode::UnknownPartition => "unknown_partition",
            ErrorCode::OffsetOutOfRange => "offset_out_of_range",
            ErrorCode::RecordTooLarge => "record_too_large",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Refused => "refused",
            ErrorCode::TopicExists => "topic_exists",
            ErrorCode::Fenced => "fenced",
            ErrorCode::UnknownMember => "unknown_member",
            ErrorCode::UnknownGroup => "unknown_group",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Storage => "storage",
            ErrorCode::DataLost => "data_lost",
            ErrorCode::Internal => "internal",
            ErrorCode::Moved => "moved",
            ErrorCode::OutOfOrderSequence => "out_of_order_sequence",
            ErrorCode::ProducerFenced => "producer_fenced",
            ErrorCode::NotLeader => "not_leader",
            ErrorCode::Unsupported => "unsupported",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One whole frame cut out of a byte stream (length prefix removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// Request id (echoed by the response).
    pub request_id: u32,
    /// Opcode (with [`RESPONSE_BIT`] in a response).
    pub opcode: u8,
    /// The rest: for a response, the code then the body.
    pub body: Bytes,
}

/// Cuts the first frame out of `buf`: `Ok(None)` while its bytes are not
/// all there yet, `Ok(Some((frame, consumed)))` once they are. The length
/// is checked against `max_frame_bytes` as soon as its four bytes are
/// there, before anything is allocated for the frame.
pub fn split_frame(
    buf: &Bytes,
    max_frame_bytes: u32,
) -> Result<Option<(RawFrame, usize)>, ProtocolError> {
    let Some(len) = frame_len(buf, max_frame_bytes)? else {
        return Ok(None);
    };
    if buf.len() < LEN_PREFIX + len {
        return Ok(None);
    }
    if len < REQUEST_HEADER {
        return Err(ProtocolError::ShortFrame {
            len,
            need: REQUEST_HEADER,
        });
    }
    let f = &buf[LEN_PREFIX..];
    let request_id = u32::from_le_bytes([f[0], f[1], f[2], f[3]]);
    let opcode = f[4];
    let body = buf.slice(LEN_PREFIX + REQUEST_HEADER..LEN_PREFIX + len);
    Ok(Some((
        RawFrame {
            request_id,
            opcode,
            body,
        },
        LEN_PREFIX + len,
    )))
}

/// The length a frame's prefix announces, checked against the limit;
/// `None` while fewer than four bytes are there.
pub fn frame_len(buf: &[u8], max_frame_bytes: u32) -> Result<Option<usize>, ProtocolError> {
    if buf.len() < LEN_PREFIX {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len > max_frame_bytes {
        return Err(ProtocolError::FrameTooLarge {
            len: u64::from(len),
            max: u64::from(max_frame_bytes),
        });
    }
    Ok(Some(len as usize))
}

/// Prefixes a frame body with its length and header: the chunks to write.
pub fn frame_chunks(request_id: u32, opcode: u8, code: Option<u16>, body: Encoder) -> Vec<Bytes> {
    let (mut chunks, body_len) = body.finish();
    let header_len = if code.is_some() {
        RESPONSE_HEADER
    } else {
        REQUEST_HEADER
    };
    let mut head = Encoder::new();
    head.u32((header_len + body_len) as u32);
    head.u32(request_id);
    head.u8(opcode);
    if let Some(c) = code {
        head.u16(c);
    }
    let (mut out, _) = head.finish();
    out.append(&mut chunks);
    out
}

/// Joins chunks into one buffer (tests and the corpus).
pub fn concat(chunks: &[Bytes]) -> Vec<u8> {
    let mut v = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in chunks {
        v.extend_from_slice(c);
    }
    v
}

/// The fuzz check of the frame decoder: cuts frames out of `data` as a
/// server does and decodes each as a request and as a response. Any input
/// must give frames or a [`ProtocolError`], never a panic, and a decoded
/// message must encode back to a frame that decodes to the same message.
pub fn check_decode(data: &[u8]) {
    let mut buf = Bytes::copy_from_slice(data);
    for _ in 0..1024 {
        match split_frame(&buf, DEFAULT_MAX_FRAME_BYTES) {
            Ok(Some((frame, used))) => {
                if let Ok(req) = Request::decode(frame.opcode, frame.body.clone()) {
                    let again = concat(&req.encode(frame.request_id));
                    let b = Bytes::from(again);
                    let (f2, _) = split_frame(&b, u32::MAX)
                        .expect("an encoded request splits")
                        .expect("an encoded request is whole");
                    let back =
                        Request::decode(f2.opcode, f2.body).expect("an encoded request decodes");
                    assert_eq!(back, req, "request round trip");
                }
                let _ = Response::decode(frame.opcode, frame.body);
                buf = buf.slice(used..);
            }
            Ok(None) | Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests;
