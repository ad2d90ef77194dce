//! Growing, trimming and readying a segment's file, and the syscalls
//! behind allocation and mapping (see "Allocation" in the module doc of
//! [`super`]).

use super::*;

impl Segment {
    /// Grows the file to `target` bytes, all allocated (writer only).
    pub(super) fn grow(&self, target: u64) -> Result<()> {
        let from = self.allocated();
        debug_assert!(target <= self.capacity);
        if target <= from {
            return Ok(());
        }
        self.hook()
            .before(IoOp::AllocateSegment, &self.path)
            .at(&self.path)?;
        allocate_range(&*self.file()?, from, target - from).at(&self.path)?;
        // Past the end of a file recovery cut short, the allocation
        // extended it.
        self.file_len.fetch_max(target, Ordering::AcqRel);
        self.allocated.store(target, Ordering::Release);
        Ok(())
    }

    /// Truncates the file to its data once the segment takes no more
    /// appends (rolled, or its partition sealed): a sealed segment keeps no
    /// preallocated space. See rule 4 of the module comment for why this is
    /// sound while readers hold the mapping.
    pub(crate) fn trim(&self) -> Result<()> {
        let end = self.committed_pos();
        if !self.writable || self.file_len.load(Ordering::Acquire) <= end {
            return Ok(());
        }
        self.hook()
            .before(IoOp::TrimSegment, &self.path)
            .at(&self.path)?;
        self.file()?.set_len(end).at(&self.path)?;
        self.allocated.fetch_min(end, Ordering::AcqRel);
        self.file_len.store(end, Ordering::Release);
        Ok(())
    }

    /// Readies a recovered segment that will take appends: maps it at the
    /// full `segment_bytes` and sets its file to that length (sparse past
    /// the data). Nothing past the data (rounded up to a page) counts as
    /// allocated: the file's length says nothing about allocation (an
    /// older version punched holes there, a crash can keep a length whose
    /// blocks were never allocated), so the writer allocates before it
    /// stores there.
    pub(crate) fn prepare_for_appends(&mut self, segment_bytes: u64) -> Result<()> {
        if !self.writable {
            return Ok(());
        }
        let file_len = self.file_len.load(Ordering::Acquire);
        let capacity = segment_bytes
            .max(file_len)
            .min(crate::config::MAX_SEGMENT_BYTES);
        if capacity > self.capacity {
            let raw = map_file(&*self.file()?, capacity, true).at(&self.path)?;
            self.res.replace_map(Arc::new(Mapping::new(raw)));
            self.capacity = capacity;
        }
        let from = page_up(self.committed_pos()).min(self.allocated());
        self.allocated.store(from, Ordering::Release);
        // Only speed is at stake: with a shorter file the writer's
        // allocations extend it, as they would without a sparse length.
        if file_len < capacity && self.file().is_ok_and(|f| f.set_len(capacity).is_ok()) {
            self.file_len.store(capacity, Ordering::Release);
        }
        Ok(())
    }
}

/// End of the last range of `file` (of length `len`) that holds data, so
/// a trailing hole (the sparse tail of an active segment) is left out;
/// `len` where the filesystem cannot tell (`SEEK_DATA` unsupported).
/// Holes inside the data are kept: they read as zeros, as before.
pub(super) fn data_end(file: &File, len: u64) -> u64 {
    let fd = file.as_raw_fd();
    let mut end = 0u64;
    let mut pos = 0u64;
    while pos < len {
        // SAFETY: plain syscalls on an fd we own; no memory is passed.
        let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            return match std::io::Error::last_os_error().raw_os_error() {
                // No data at or after `pos`: the rest is a hole.
                Some(libc::ENXIO) => end,
                _ => len,
            };
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return len;
        }
        end = (hole as u64).min(len);
        if end <= pos {
            return len;
        }
        pos = end;
    }
    end.min(len)
}

pub(super) fn read_prefix(file: &File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

pub(super) fn page_up(pos: u64) -> u64 {
    pos.div_ceil(4096) * 4096
}

pub(super) fn map_file(file: &File, len: u64, writable: bool) -> std::io::Result<memmap2::MmapRaw> {
    let mut opts = memmap2::MmapOptions::new();
    opts.len(len as usize);
    if writable {
        opts.map_raw(file)
    } else {
        opts.map_raw_read_only(file)
    }
}

/// Allocates `[from, from + len)` of `file`, extending it when that lies
/// past its end. Filesystems without `fallocate` get zeros written, which
/// allocates the blocks just the same.
pub(super) fn allocate_range(file: &File, from: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: plain syscall on an fd we own; no memory is passed.
    let rc =
        unsafe { libc::fallocate(file.as_raw_fd(), 0, from as libc::off_t, len as libc::off_t) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
        return write_zeros(file, from, len);
    }
    Err(err)
}

pub(super) fn write_zeros(file: &File, from: u64, len: u64) -> std::io::Result<()> {
    let zeros = vec![0u8; len.min(1 << 20) as usize];
    let mut pos = from;
    while pos < from + len {
        let n = (from + len - pos).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}
