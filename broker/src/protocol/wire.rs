//! Primitive encodings: little-endian integers, length-prefixed byte
//! strings, counted lists. Pure functions over bytes.
//!
//! Decoding never trusts a length or a count before checking it against
//! the bytes that remain in the frame: a list of `n` elements allocates at
//! most what the remaining bytes could hold, so a hostile count cannot
//! make the decoder allocate more than the frame it already has.

use bytes::{BufMut, Bytes, BytesMut};

use super::ProtocolError;

/// Values at least this long travel as their own chunk (a `writev` slice
/// sharing the caller's buffer, on the server the mapped segment); shorter
/// ones are copied into the frame's header buffer, where a copy is cheaper
/// than one more I/O vector entry.
const SHARED_CHUNK_MIN: usize = 512;

/// The marker of an absent optional byte string.
const NONE_LEN: u32 = u32::MAX;

/// Builds one frame body as a list of chunks.
#[derive(Debug, Default)]
pub struct Encoder {
    buf: BytesMut,
    chunks: Vec<Bytes>,
    len: usize,
}

impl Encoder {
    /// An empty body.
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends one byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.put_u8(v);
        self.len += 1;
    }

    /// Appends a `u16`.
    pub fn u16(&mut self, v: u16) {
        self.buf.put_u16_le(v);
        self.len += 2;
    }

    /// Appends a `u32`.
    pub fn u32(&mut self, v: u32) {
        self.buf.put_u32_le(v);
        self.len += 4;
    }

    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) {
        self.buf.put_u64_le(v);
        self.len += 8;
    }

    /// Appends an `i64`.
    pub fn i64(&mut self, v: i64) {
        self.buf.put_i64_le(v);
        self.len += 8;
    }

    /// Appends a length-prefixed byte string, sharing `b` when it is long.
    pub fn bytes(&mut self, b: &Bytes) {
        let n = u32::try_from(b.len()).unwrap_or(NONE_LEN - 1);
        self.u32(n);
        if b.len() >= SHARED_CHUNK_MIN {
            self.flush();
            self.chunks.push(b.clone());
        } else {
            self.buf.extend_from_slice(b);
        }
        self.len += b.len();
    }

    /// Appends a length-prefixed byte string (copied).
    pub fn slice(&mut self, b: &[u8]) {
        let n = u32::try_from(b.len()).unwrap_or(NONE_LEN - 1);
        self.u32(n);
        self.buf.extend_from_slice(b);
        self.len += b.len();
    }

    /// Appends an optional byte string.
    pub fn opt_bytes(&mut self, b: Option<&Bytes>) {
        match b {
            Some(b) => self.bytes(b),
            None => self.u32(NONE_LEN),
        }
    }

    /// Appends a string.
    pub fn str(&mut self, s: &str) {
        self.slice(s.as_bytes());
    }

    /// Appends an optional string.
    pub fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.str(s),
            None => self.u32(NONE_LEN),
        }
    }

    fn flush(&mut self) {
        if !self.buf.is_empty() {
            self.chunks.push(self.buf.split().freeze());
        }
    }

    /// The body as chunks, in order.
    pub fn finish(mut self) -> (Vec<Bytes>, usize) {
        self.flush();
        (self.chunks, self.len)
    }
}

/// Reads one frame body. Every method fails with
/// [`ProtocolError::Truncated`] rather than reading past the end.
#[derive(Debug)]
pub struct Decoder {
    body: Bytes,
    pos: usize,
}

impl Decoder {
    /// Reads `body` from its start.
    pub fn new(body: Bytes) -> Decoder {
        Decoder { body, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.body.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], ProtocolError> {
        if self.remaining() < n {
            return Err(ProtocolError::Truncated { what });
        }
        let s = &self.body[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtocolError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    /// One byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, ProtocolError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// A `u16`.
    pub fn u16(&mut self, what: &'static str) -> Result<u16, ProtocolError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// A `u32`.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, ProtocolError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// A `u64`.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, ProtocolError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// An `i64`.
    pub fn i64(&mut self, what: &'static str) -> Result<i64, ProtocolError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    /// An optional byte string, sharing the frame's buffer.
    pub fn opt_bytes(&mut self, what: &'static str) -> Result<Option<Bytes>, ProtocolError> {
        let n = self.u32(what)?;
        if n == NONE_LEN {
            return Ok(None);
        }
        let n = n as usize;
        if self.remaining() < n {
            return Err(ProtocolError::Truncated { what });
        }
        let b = self.body.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(Some(b))
    }

    /// A byte string, sharing the frame's buffer.
    pub fn bytes(&mut self, what: &'static str) -> Result<Bytes, ProtocolError> {
        self.opt_bytes(what)?.ok_or(ProtocolError::Invalid {
            what,
            reason: "absent where required",
        })
    }

    /// An optional UTF-8 string of at most `max` bytes.
    pub fn opt_str(
        &mut self,
        what: &'static str,
        max: usize,
    ) -> Result<Option<String>, ProtocolError> {
        let Some(b) = self.opt_bytes(what)? else {
            return Ok(None);
        };
        if b.len() > max {
            return Err(ProtocolError::Invalid {
                what,
                reason: "too long",
            });
        }
        match std::str::from_utf8(&b) {
            Ok(s) => Ok(Some(s.to_string())),
            Err(_) => Err(ProtocolError::Invalid {
                what,
                reason: "not UTF-8",
            }),
        }
    }

    /// A UTF-8 string of at most `max` bytes.
    pub fn str(&mut self, what: &'static str, max: usize) -> Result<String, ProtocolError> {
        self.opt_str(what, max)?.ok_or(ProtocolError::Invalid {
            what,
            reason: "absent where required",
        })
    }

    /// A list count, checked against what the remaining bytes can hold
    /// when each element takes at least `min_element_bytes`.
    pub fn count(
        &mut self,
        what: &'static str,
        min_element_bytes: usize,
    ) -> Result<usize, ProtocolError> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_element_bytes.max(1)) > self.remaining() {
            return Err(ProtocolError::Invalid {
                what,
                reason: "count larger than the frame",
            });
        }
        Ok(n)
    }

    /// Fails unless every byte was read.
    pub fn finish(&self, what: &'static str) -> Result<(), ProtocolError> {
        if self.remaining() != 0 {
            return Err(ProtocolError::Invalid {
                what,
                reason: "trailing bytes",
            });
        }
        Ok(())
    }
}
