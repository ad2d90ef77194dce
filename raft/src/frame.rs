//! Node-to-node frames: a length prefix, a version byte, a postcard payload.
//!
//! ```text
//! len      u32 LE   bytes after this field (version + payload), <= max
//! version  u8 = 1
//! payload  postcard encoding of one message
//! ```
//!
//! The length is checked against the configured maximum before a byte of
//! the body is buffered, so a peer cannot make a node allocate more than
//! one maximum frame per connection. A payload must decode to exactly one
//! message: bytes left over are an error, not ignored.
//!
//! One connection per pair of nodes carries the frames of every group on
//! that pair; [`PeerMessage`] names the group and a call id that matches a
//! response to its request.

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{Error, Result};
use crate::types::{GroupId, NodeId, TypeConfig};

/// The frame format version this build speaks.
pub const FRAME_VERSION: u8 = 1;
/// Bytes of the length prefix.
pub const LEN_PREFIX_BYTES: usize = 4;
/// Default maximum of the bytes after the length prefix: 16 MiB, room for
/// an AppendEntries of many 1 MiB batches or a snapshot chunk.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 16 << 20;

/// A Raft RPC, sent by a group's leader or candidate.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRequest {
    /// Replicate entries, or a heartbeat when it carries none.
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// Ask for a vote.
    Vote(VoteRequest<NodeId>),
    /// One chunk of a snapshot.
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
}

/// The answer to a [`RaftRequest`].
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftResponse {
    /// Answer to `AppendEntries`.
    AppendEntries(AppendEntriesResponse<NodeId>),
    /// Answer to `Vote`.
    Vote(VoteResponse<NodeId>),
    /// Answer to `InstallSnapshot`.
    InstallSnapshot(InstallSnapshotResponse<NodeId>),
    /// The receiving node could not hand the request to the group (it
    /// does not host it, or the group has shut down).
    Unavailable {
        /// Why, for the sender's log.
        reason: String,
    },
}

/// One message on a node-to-node connection.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerMessage {
    /// A request to one group on the receiving node.
    Request {
        /// Chosen by the sender, echoed in the response.
        call_id: u64,
        /// The group addressed.
        group: GroupId,
        /// The RPC.
        body: RaftRequest,
    },
    /// The response to the request with the same `call_id`.
    Response {
        /// The request's call id.
        call_id: u64,
        /// The group that answered.
        group: GroupId,
        /// The answer.
        body: RaftResponse,
    },
}

/// Encodes and decodes frames under one maximum frame size.
#[derive(Debug, Clone, Copy)]
pub struct FrameCodec {
    max_frame_bytes: u32,
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec::new(DEFAULT_MAX_FRAME_BYTES)
    }
}

impl FrameCodec {
    /// A codec refusing frames whose body (version + payload) exceeds
    /// `max_frame_bytes`.
    pub fn new(max_frame_bytes: u32) -> FrameCodec {
        FrameCodec { max_frame_bytes }
    }

    /// The maximum body size.
    pub fn max_frame_bytes(&self) -> u32 {
        self.max_frame_bytes
    }

    /// Appends the frame of `msg` to `out`. A message too large for the
    /// maximum is refused and `out` is left as it was.
    pub fn encode<T: Serialize>(&self, msg: &T, out: &mut Vec<u8>) -> Result<()> {
        let start = out.len();
        out.extend_from_slice(&[0; LEN_PREFIX_BYTES]);
        out.push(FRAME_VERSION);
        let encoded = postcard::to_io(msg, &mut *out).map(drop);
        let body_len = (out.len() - start - LEN_PREFIX_BYTES) as u64;
        if let Err(e) = encoded {
            out.truncate(start);
            return Err(Error::MalformedFrame {
                reason: format!("cannot encode: {e}"),
            });
        }
        if body_len > u64::from(self.max_frame_bytes) {
            out.truncate(start);
            return Err(Error::FrameTooLarge {
                len: body_len,
                max: self.max_frame_bytes,
            });
        }
        // Fits in u32: body_len <= max_frame_bytes, a u32.
        let len = (body_len as u32).to_le_bytes();
        out[start..start + LEN_PREFIX_BYTES].copy_from_slice(&len);
        Ok(())
    }

    /// Decodes the first frame of `buf`: `Ok(None)` when `buf` does not
    /// hold a whole frame yet (read more), else the message and the number
    /// of bytes of `buf` it used. An oversized length is refused as soon as
    /// the prefix is there.
    pub fn decode<T: DeserializeOwned>(&self, buf: &[u8]) -> Result<Option<(T, usize)>> {
        let Some(body_len) = self.body_len(buf)? else {
            return Ok(None);
        };
        let total = LEN_PREFIX_BYTES + body_len;
        if buf.len() < total {
            return Ok(None);
        }
        let msg = self.decode_body(&buf[LEN_PREFIX_BYTES..total])?;
        Ok(Some((msg, total)))
    }

    /// Reads one frame from `reader`: `Ok(None)` on a clean end of stream
    /// before a frame starts, [`Error::TruncatedFrame`] on one inside it.
    pub async fn read_frame<T, R>(&self, reader: &mut R) -> Result<Option<T>>
    where
        T: DeserializeOwned,
        R: AsyncRead + Unpin,
    {
        let mut prefix = [0u8; LEN_PREFIX_BYTES];
        let got = read_full(reader, &mut prefix).await?;
        if got == 0 {
            return Ok(None);
        }
        if got < LEN_PREFIX_BYTES {
            return Err(Error::TruncatedFrame {
                have: got,
                need: LEN_PREFIX_BYTES,
            });
        }
        let body_len = self.checked_len(u32::from_le_bytes(prefix))?;
        let mut body = vec![0u8; body_len];
        let got = read_full(reader, &mut body).await?;
        if got < body_len {
            return Err(Error::TruncatedFrame {
                have: LEN_PREFIX_BYTES + got,
                need: LEN_PREFIX_BYTES + body_len,
            });
        }
        self.decode_body(&body).map(Some)
    }

    /// Encodes `msg` and writes its frame to `writer`.
    pub async fn write_frame<T, W>(&self, writer: &mut W, msg: &T) -> Result<()>
    where
        T: Serialize,
        W: AsyncWrite + Unpin,
    {
        let mut buf = Vec::new();
        self.encode(msg, &mut buf)?;
        writer.write_all(&buf).await.map_err(stream_error)
    }

    fn body_len(&self, buf: &[u8]) -> Result<Option<usize>> {
        let Some(prefix) = buf.get(..LEN_PREFIX_BYTES) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        self.checked_len(len).map(Some)
    }

    fn checked_len(&self, len: u32) -> Result<usize> {
        if len > self.max_frame_bytes {
            return Err(Error::FrameTooLarge {
                len: u64::from(len),
                max: self.max_frame_bytes,
            });
        }
        if len == 0 {
            return Err(Error::MalformedFrame {
                reason: "empty frame: no version byte".to_string(),
            });
        }
        Ok(len as usize)
    }

    fn decode_body<T: DeserializeOwned>(&self, body: &[u8]) -> Result<T> {
        let Some((&version, payload)) = body.split_first() else {
            return Err(Error::MalformedFrame {
                reason: "empty frame: no version byte".to_string(),
            });
        };
        if version != FRAME_VERSION {
            return Err(Error::UnsupportedFrameVersion {
                version,
                supported: FRAME_VERSION,
            });
        }
        let (msg, rest) =
            postcard::take_from_bytes(payload).map_err(|e| Error::MalformedFrame {
                reason: e.to_string(),
            })?;
        if !rest.is_empty() {
            return Err(Error::TrailingFrameBytes { unused: rest.len() });
        }
        Ok(msg)
    }
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
async fn read_full<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) -> Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = reader.read(&mut buf[got..]).await.map_err(stream_error)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

fn stream_error(source: std::io::Error) -> Error {
    Error::Io {
        op: "stream",
        path: std::path::PathBuf::from("<peer connection>"),
        source,
    }
}

#[cfg(test)]
mod tests;
