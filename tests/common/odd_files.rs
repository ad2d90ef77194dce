//! Things that are not regular files (a directory, a symlink to
//! `/dev/zero`, a FIFO, a unix socket) put where a log keeps one of its
//! files, a watchdog that turns a hang into a test failure, and a small
//! log holding every kind of file fissionlog writes.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use fissionlog::{Log, LogOptions, SplitPlan, TailSplitOptions, TopicConfig};

/// What stands where a file should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Odd {
    /// An empty directory.
    Directory,
    /// A symbolic link to `/dev/zero` (reads never end).
    SymlinkToDevZero,
    /// A named pipe without a writer (a blocking open or read never returns).
    Fifo,
    /// A bound unix socket (open(2) fails with ENXIO).
    Socket,
}

/// Every kind.
pub const ODD: [Odd; 4] = [
    Odd::Directory,
    Odd::SymlinkToDevZero,
    Odd::Fifo,
    Odd::Socket,
];

/// The odd thing in place. Keep it alive while the socket must stay bound
/// (the socket file stays after it is dropped either way).
pub struct Placed {
    pub path: PathBuf,
    _socket: Option<UnixListener>,
}

/// Replaces the file at `path` (if any) with `odd`.
pub fn place(path: &Path, odd: Odd) -> Placed {
    if path.exists() {
        std::fs::remove_file(path).unwrap();
    }
    let mut socket = None;
    match odd {
        Odd::Directory => std::fs::create_dir(path).unwrap(),
        Odd::SymlinkToDevZero => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
        Odd::Fifo => {
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: `c` is a valid NUL-terminated path for the call.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
        }
        Odd::Socket => socket = Some(UnixListener::bind(path).unwrap()),
    }
    Placed {
        path: path.to_path_buf(),
        _socket: socket,
    }
}

/// Removes the odd thing and puts `bytes` back as the regular file.
pub fn restore(placed: Placed, bytes: &[u8]) {
    let path = placed.path.clone();
    drop(placed);
    let meta = std::fs::symlink_metadata(&path).unwrap();
    if meta.is_dir() {
        std::fs::remove_dir_all(&path).unwrap();
    } else {
        std::fs::remove_file(&path).unwrap();
    }
    std::fs::write(&path, bytes).unwrap();
}

/// Runs `f` in a thread and returns its result, or fails the test when it
/// has not returned within `limit` (the thread is left blocked: a hang is
/// the failure being tested for, and it must not hang the test run).
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(RecvTimeoutError::Timeout) => panic!("{what}: still blocked after {limit:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

/// Records the odd-files log holds: values `0..RECORDS` (see
/// [`crate::common::tail::append_big`]).
pub const RECORDS: u64 = 50;

/// Files of the log [`odd_files_log`] builds, one of each kind, relative
/// to its directory: (what, path).
pub fn odd_file_kinds(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let find = |sub: &str, pick: &dyn Fn(&str) -> bool, last: bool| -> PathBuf {
        let mut names: Vec<String> = std::fs::read_dir(dir.join(sub))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| pick(n))
            .collect();
        names.sort();
        let name = if last {
            names.pop()
        } else {
            names.into_iter().next()
        };
        Path::new(sub).join(name.unwrap_or_else(|| panic!("no such file in {sub}")))
    };
    vec![
        ("journal", PathBuf::from("manifest.log")),
        ("snapshot", PathBuf::from("manifest.snap")),
        ("checkpoint", PathBuf::from("checkpoint.0")),
        ("other checkpoint", PathBuf::from("checkpoint.1")),
        ("lock file", PathBuf::from("fissionlog.lock")),
        (
            "first segment",
            find("topics/t0/p0", &|n| n.ends_with(".seg"), false),
        ),
        (
            "active segment",
            find("topics/t0/p1", &|n| n.ends_with(".seg"), true),
        ),
        (
            "index",
            find("topics/t0/p0", &|n| n.ends_with(".idx"), false),
        ),
        (
            "tail index",
            find(
                "topics/t0",
                &|n| n.starts_with("tail-p") && n.ends_with(".tix"),
                false,
            ),
        ),
    ]
}

/// Options of the odd-files log: no background work, a snapshot after
/// every second manifest record.
pub fn odd_files_options() -> LogOptions {
    LogOptions {
        topic_hash_seed: Some(super::log::HASH_SEED),
        balancer: false,
        background_retention: false,
        manifest_compact_records: 2,
        ..LogOptions::default()
    }
}

/// A closed log holding every kind of file: manifest journal and snapshot,
/// both checkpoints, the lock file, rolled segments with their indexes, a
/// tail split's descendant index, and `RECORDS` records in topic `t`.
pub fn odd_files_log(dir: &Path) {
    let log = Log::open(dir, odd_files_options()).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 4096,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    crate::common::tail::append_big(&t, 0, 40, 4);
    log.sync().unwrap();
    t.split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(20))
        .unwrap();
    crate::common::tail::append_big(&t, 40, RECORDS - 40, 4);
    log.close().unwrap();
}

/// Opens the log strictly and checks every record is there once, each
/// key's in order.
pub fn assert_odd_files_log_intact(dir: &Path, ctx: &str) {
    let log = Log::open(dir, odd_files_options())
        .unwrap_or_else(|e| panic!("{ctx}: reopen after restoring: {e}"));
    let t = log.topic("t").unwrap();
    let seen = crate::common::tail::read_all(&t);
    crate::common::tail::check_exactly_once(&seen, 0..RECORDS, ctx);
    log.close().unwrap();
}
