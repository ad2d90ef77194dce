//! Opening the files of a log directory: every file fissionlog reads or
//! writes there is opened by [`open_file`] (or a helper built on it).
//!
//! A log directory holds only regular files that fissionlog wrote. Anything
//! else under one of its names is refused with [`Error::NotARegularFile`]
//! naming the path, never used:
//!
//! - a FIFO: a blocking `open(2)` waits for a writer forever, and reading
//!   it never ends;
//! - a character device (`/dev/zero`): reading it never ends, and mapping
//!   it maps zeros that recovery would take for data;
//! - a socket (`open(2)` fails with ENXIO), a directory (EISDIR, or reads
//!   fail), a block device.
//!
//! The check is made on the opened descriptor (`fstat`), not by a `stat`
//! of the name first, which the entry could change between the two calls.
//! The open itself must not block: it carries `O_NONBLOCK` (an open of a
//! FIFO for reading returns at once, for writing fails with ENXIO), which
//! is cleared again on a regular file (where it means nothing on Linux,
//! but the descriptor is used for ordinary blocking I/O afterwards).
//! `O_CLOEXEC` keeps descriptors out of processes the embedding program
//! spawns (std sets it on every open).
//!
//! Symbolic links are refused too (`O_NOFOLLOW`), also links to regular
//! files: a link could make two log directories share one segment file,
//! and the soundness argument of the mappings (`storage::lock`) rests on
//! the directory lock covering every file it maps; an fsync of the log's
//! directory would not make the link target's own directory entry durable;
//! and the tmp + rename writes replace the link with a file, so the data
//! would move out from under it. The log directory itself (and the path
//! leading to it) may be a symlink: only the last component of a file's
//! path is checked, and recovery refuses a symlinked `topics`, topic or
//! partition directory ([`refuse_symlinked_dir`]).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::error::{Error, IoContext, Result};

/// How a file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Read an existing file.
    Read,
    /// Read and write an existing file.
    ReadWrite,
    /// Read and write, creating the file when it is missing.
    OpenOrCreate,
    /// Read and write a file that must not exist yet.
    CreateNew,
}

/// Opens the file at `path` in the log directory: without blocking, not
/// through a symlink, and only if it is a regular file (see the module
/// comment). Anything else is [`Error::NotARegularFile`]; an OS error is
/// [`Error::Io`] (or [`Error::NoSpace`]).
pub(crate) fn open_file(path: &Path, access: Access) -> Result<File> {
    let mut o = OpenOptions::new();
    o.read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC);
    match access {
        Access::Read => {}
        Access::ReadWrite => {
            o.write(true);
        }
        Access::OpenOrCreate => {
            o.write(true).create(true).truncate(false);
        }
        Access::CreateNew => {
            o.write(true).create_new(true);
        }
    }
    let file = match o.open(path) {
        Ok(f) => f,
        Err(e) => return Err(describe_failed_open(path, e)),
    };
    let meta = file.metadata().at(path)?;
    if !meta.file_type().is_file() {
        return Err(Error::NotARegularFile {
            path: path.to_path_buf(),
            found: kind_name(meta.file_type()),
        });
    }
    clear_nonblock(&file).at(path)?;
    Ok(file)
}

/// [`open_file`] of a file that may be missing: `None` when it is.
pub(crate) fn open_optional(path: &Path, access: Access) -> Result<Option<File>> {
    match open_file(path, access) {
        Ok(f) => Ok(Some(f)),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the whole of an opened file, refusing one longer than
/// `max_bytes` (no file fissionlog writes there is longer: a larger one is
/// not ours, and reading it could exhaust memory) with
/// [`Error::Corruption`].
pub(crate) fn read_to_end(file: &File, path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    let len = file.metadata().at(path)?.len();
    if len > max_bytes {
        return Err(too_long(path, len, max_bytes));
    }
    let mut buf = Vec::with_capacity(len as usize);
    // One byte more than allowed, to notice a file that grew meanwhile.
    file.take(max_bytes + 1).read_to_end(&mut buf).at(path)?;
    if buf.len() as u64 > max_bytes {
        return Err(too_long(path, buf.len() as u64, max_bytes));
    }
    Ok(buf)
}

fn too_long(path: &Path, len: u64, max_bytes: u64) -> Error {
    Error::corruption(
        path,
        max_bytes,
        format!("file of {len} bytes is longer than any fissionlog writes there ({max_bytes})"),
    )
}

/// Reads the whole file at `path` if it exists (see [`open_file`] and
/// [`read_to_end`]).
pub(crate) fn read_optional(path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>> {
    match open_optional(path, Access::Read)? {
        Some(f) => read_to_end(&f, path, max_bytes).map(Some),
        None => Ok(None),
    }
}

/// Creates (or replaces) a scratch file such as `manifest.snap.tmp`,
/// written and then renamed over its final name. Whatever sits at the
/// scratch name is a leftover of an interrupted write and is removed
/// first (a symlink itself, never its target); a directory there is
/// refused.
pub(crate) fn create_scratch(path: &Path) -> Result<File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(describe_failed_open(path, e)),
    }
    open_file(path, Access::CreateNew)
}

/// Opens a directory of the log for an fsync: `O_DIRECTORY` refuses
/// anything else (ENOTDIR) and `O_NONBLOCK` keeps a FIFO put there from
/// blocking the open.
pub(crate) fn open_dir(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// A failed open: when the name turns out not to hold a regular file
/// (ELOOP from `O_NOFOLLOW` on a symlink, ENXIO on a socket or a FIFO
/// opened for writing, EISDIR, EEXIST), the typed error says so. The
/// `lstat` here only describes a failure; it decides nothing.
fn describe_failed_open(path: &Path, e: std::io::Error) -> Error {
    if e.kind() != std::io::ErrorKind::NotFound {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_file() {
                return Error::NotARegularFile {
                    path: path.to_path_buf(),
                    found: kind_name(meta.file_type()),
                };
            }
        }
    }
    Error::io(path, e)
}

/// Refuses a directory entry fissionlog owns by its name (a segment, an
/// index) that is not a regular file, from the type the listing reports
/// (`d_type`, which does not follow a symlink). Recovery lists every
/// partition directory before it opens anything, so a file it opens only
/// later (an index, read on first use) or never (a segment below the
/// retention floor, deleted) is refused at open too; every later open
/// still checks its own descriptor ([`open_file`]).
pub(crate) fn check_listed(entry: &std::fs::DirEntry) -> Result<()> {
    let t = entry.file_type().at(&entry.path())?;
    if t.is_file() {
        return Ok(());
    }
    Err(Error::NotARegularFile {
        path: entry.path(),
        found: kind_name(t),
    })
}

/// Refuses a directory of the log below the log directory (`topics`, a
/// topic's, a partition's) that is a symbolic link, with
/// [`Error::NotARegularFile`]: through it, another log's partition (or
/// any directory) would be this log's, its segments mapped outside this
/// log's lock, as a symlinked file would (see the module comment). A
/// missing directory is fine here (recovery decides what that means).
pub(crate) fn refuse_symlinked_dir(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(Error::NotARegularFile {
            path: path.to_path_buf(),
            found: kind_name(m.file_type()),
        }),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// What a file type is, for messages.
fn kind_name(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "directory"
    } else if t.is_symlink() {
        "symbolic link"
    } else if t.is_fifo() {
        "FIFO (named pipe)"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

/// Clears `O_NONBLOCK` on an opened descriptor.
fn clear_nonblock(file: &File) -> std::io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: plain fcntl calls on a descriptor `file` owns; no memory passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if flags & libc::O_NONBLOCK != 0 {
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_a_symlink_and_a_directory_are_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir");
        for (path, found) in [
            (&fifo, "FIFO (named pipe)"),
            (&link, "symbolic link"),
            (&sub, "directory"),
        ] {
            for access in [Access::Read, Access::ReadWrite, Access::OpenOrCreate] {
                match open_file(path, access) {
                    Err(Error::NotARegularFile { path: p, found: f }) => {
                        assert_eq!((&p, f), (path, found), "{access:?}")
                    }
                    other => panic!("{} {access:?}: {other:?}", path.display()),
                }
            }
        }
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"abc").expect("write");
        let f = open_file(&plain, Access::ReadWrite).expect("regular file");
        assert_eq!(read_to_end(&f, &plain, 3).expect("read"), b"abc");
        assert!(matches!(
            read_to_end(&f, &plain, 2),
            Err(Error::Corruption { .. })
        ));
        // SAFETY: plain fcntl on an owned descriptor.
        let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0, "O_NONBLOCK cleared");
        assert!(open_optional(&dir.path().join("missing"), Access::Read)
            .expect("missing is fine")
            .is_none());
        // A leftover FIFO at a scratch name is replaced, not opened.
        let f = create_scratch(&fifo).expect("scratch over a fifo");
        drop(f);
        assert!(std::fs::symlink_metadata(&fifo).expect("meta").is_file());
    }
}
