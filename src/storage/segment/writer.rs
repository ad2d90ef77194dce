//! The one handle allowed to write into a segment.

use super::*;

/// Batches of this many bytes or more are written with one `pwrite`
/// instead of stores into the mapping (see "Append path choice" in
/// docs/ARCHITECTURE.md): for them a syscall costs less than the page
/// faults of the stores, and the file grows by the write, so the space it
/// lands in needs no allocation ahead of the writer (whose unwritten
/// extents every `fdatasync` would have to convert).
pub(crate) const PWRITE_MIN_BYTES: usize = 16 << 10;

/// The one handle allowed to write into a segment.
#[derive(Debug)]
pub struct SegmentWriter {
    segment: std::sync::Arc<Segment>,
    write_pos: u64,
    next_offset: u64,
    last_indexed_pos: Option<u64>,
    max_ts: i64,
    index_interval: u64,
    /// Encoding buffer of the `pwrite` path, kept between batches.
    buf: Vec<u8>,
    /// The mapping it stores into, held by the writer itself: a segment
    /// that takes appends is pinned in the budget anyway, and this makes
    /// the stores independent of what the budget does.
    map: Option<Arc<Mapping>>,
}

impl SegmentWriter {
    /// Takes the writing role for `segment` (its recovered end).
    pub fn new(segment: std::sync::Arc<Segment>, index_interval: u64) -> SegmentWriter {
        let last_indexed_pos = match &*segment.index.lock() {
            IndexState::Loaded(e) => e.last().map(|e| u64::from(e.position)),
            IndexState::NotLoaded => None,
        };
        // Only a segment that takes appends is pinned by its writer: the
        // writer a sealed partition keeps (for its index at close) must
        // not keep an evicted mapping alive.
        let map = if segment.takes_no_appends() {
            None
        } else {
            segment.res.map()
        };
        // The newest timestamp only matters to appends (each index entry
        // carries the newest before it): a segment that takes none, the
        // last one of a sealed partition, works it out when a time lookup
        // or retention asks, and an open need not map it for this.
        let max_ts = if segment.takes_no_appends() {
            i64::MIN
        } else {
            segment.max_timestamp()
        };
        SegmentWriter {
            map,
            write_pos: segment.committed_pos(),
            next_offset: segment.end_offset(),
            max_ts,
            segment,
            last_indexed_pos,
            index_interval,
            buf: Vec::new(),
        }
    }

    /// The segment being written.
    pub fn segment(&self) -> &std::sync::Arc<Segment> {
        &self.segment
    }

    /// Bytes still free.
    pub fn remaining(&self) -> u64 {
        self.segment.capacity - self.write_pos
    }

    /// Makes sure the next `len` bytes are allocated in the file before the
    /// writer stores there, growing the file ahead of the writer in steps
    /// that double with the data written, from `ALLOC_CHUNK_MIN_BYTES` to
    /// `ALLOC_CHUNK_MAX_BYTES`. The caller checked `len <= remaining()`.
    /// An error (`Error::NoSpace` on a full disk) changes nothing: the
    /// segment takes appends again once space frees.
    fn reserve(&mut self, len: u64) -> Result<()> {
        let capacity = self.segment.capacity;
        let need = self.write_pos + len;
        debug_assert!(
            need <= capacity,
            "caller rolls before a batch that does not fit"
        );
        let step = (self.write_pos - SEGMENT_HEADER_LEN as u64)
            .clamp(ALLOC_CHUNK_MIN_BYTES, ALLOC_CHUNK_MAX_BYTES);
        let allocated = self.segment.allocated();
        if allocated >= (need + step).min(capacity) {
            return Ok(());
        }
        let ahead = page_up(need + 2 * step).min(capacity);
        if let Err(e) = self.segment.grow(ahead) {
            if need > allocated {
                // Not enough room for two steps: take exactly what this batch needs.
                self.segment
                    .grow(page_up(need).min(capacity))
                    .map_err(|_| e)?;
            }
        }
        Ok(())
    }

    /// Offset the next record gets.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Encodes `records` at the end and publishes them. The caller checked
    /// that `len == batch_len(records) <= remaining()`. Batches of
    /// [`PWRITE_MIN_BYTES`] or more are written with `pwrite`, smaller ones
    /// stored into the mapping (in space allocated first). An error
    /// (`Error::NoSpace` on a full disk) publishes nothing: the segment
    /// takes appends again once space frees.
    pub fn append(&mut self, records: &[RecordIn<'_>], len: usize) -> Result<BatchHeader> {
        let next = self.next_offset;
        let count = records.len() as u64;
        self.append_encoded(len, count, |dst| batch::encode_batch(dst, next, records))
    }

    /// [`SegmentWriter::append`] of a batch that `encode` writes into its
    /// `len` bytes at the writer's next offset, taking `count` offsets (a
    /// format-2 batch; 0 for a control batch).
    pub fn append_encoded(
        &mut self,
        len: usize,
        count: u64,
        encode: impl FnOnce(&mut [u8]) -> BatchHeader,
    ) -> Result<BatchHeader> {
        let pos = self.write_pos;
        let header = if len >= PWRITE_MIN_BYTES {
            self.write_batch(encode, len)?
        } else {
            self.reserve(len as u64)?;
            let map = match &self.map {
                Some(m) => m.clone(),
                None => {
                    let m = self.segment.mapping()?;
                    self.map = Some(m.clone());
                    m
                }
            };
            self.store_batch(&map, encode, len)
        };
        if self
            .last_indexed_pos
            .is_none_or(|l| pos - l >= self.index_interval)
        {
            if let IndexState::Loaded(entries) = &mut *self.segment.index.lock() {
                entries.push(IndexEntry {
                    rel_offset: (self.next_offset - self.segment.base_offset) as u32,
                    position: pos as u32,
                    max_ts_before: self.max_ts,
                });
            }
            self.last_indexed_pos = Some(pos);
        }
        self.write_pos += len as u64;
        self.next_offset += count;
        self.max_ts = self.max_ts.max(header.max_ts.get());
        self.segment
            .max_timestamp
            .store(self.max_ts, Ordering::Release);
        self.segment
            .committed_pos
            .store(self.write_pos, Ordering::Release);
        self.segment
            .end_offset
            .store(self.next_offset, Ordering::Release);
        Ok(header)
    }

    /// Stores a batch into the mapping at the write position.
    fn store_batch(
        &mut self,
        map: &Mapping,
        encode: impl FnOnce(&mut [u8]) -> BatchHeader,
        len: usize,
    ) -> BatchHeader {
        assert!(
            self.write_pos + len as u64 <= self.segment.allocated().min(map.len()),
            "caller reserves space before a batch is stored"
        );
        let pos = self.write_pos;
        let base = map.as_mut_ptr();
        // [pos, pos+len) is inside the mapping, below EOF, in allocated
        // space (checked above), and above `committed_pos`: no reader forms
        // a slice over it, and `&mut self` makes this the only writer.
        // SAFETY: see the comment above and rule 3 of the module comment.
        let dst = unsafe { std::slice::from_raw_parts_mut(base.add(pos as usize), len) };
        let header = encode(dst);
        debug_assert!(
            batch::validate(dst, Some(self.next_offset)).is_ok(),
            "a batch just written validates"
        );
        header
    }

    /// Encodes a batch into the writer's buffer and writes it to the file
    /// at the write position with `pwrite`, which allocates what it writes
    /// past `allocated` (rule 3 of the module comment).
    fn write_batch(
        &mut self,
        encode: impl FnOnce(&mut [u8]) -> BatchHeader,
        len: usize,
    ) -> Result<BatchHeader> {
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        let dst = &mut self.buf[..len];
        let header = encode(dst);
        debug_assert!(
            batch::validate(dst, Some(self.next_offset)).is_ok(),
            "a batch just encoded validates"
        );
        let seg = &self.segment;
        let end = self.write_pos + len as u64;
        let file = seg.file()?;
        let written = file.write_all_at(dst, self.write_pos);
        if written.is_ok() {
            // Written, hence allocated, up to `end`; not published yet. (A
            // failed or short write leaves `allocated` as it was: what it
            // did write is not known to be allocated.)
            seg.file_len.fetch_max(end, Ordering::AcqRel);
            seg.allocated.fetch_max(end, Ordering::AcqRel);
        }
        if self.buf.len() > 4 * PWRITE_MIN_BYTES.max(len.min(1 << 20)) {
            // After an outsized batch: keep what usual batches need.
            self.buf.truncate(len.min(1 << 20));
            self.buf.shrink_to_fit();
        }
        written.map_err(|e| Error::io(&seg.path, e))?;
        Ok(header)
    }

    /// The partition was sealed (split or merge): the segment takes no
    /// more appends, and the writer lets go of its mapping, so the budget
    /// decides when it goes.
    pub(crate) fn freeze(&mut self) {
        self.map = None;
        self.segment.freeze();
    }

    /// Seals the segment: writes the seal into its header (it takes no
    /// more appends), then writes its index file and gives back the space
    /// past its data. Cannot fail: the index is a cache (a missing or stale
    /// one is rebuilt on first use) and a failed trim only keeps space.
    pub fn seal(&self) {
        self.segment.write_seal(self.next_offset, self.write_pos);
        let _ = self.segment.write_index_file(false);
        let _ = self.segment.trim();
    }
}
