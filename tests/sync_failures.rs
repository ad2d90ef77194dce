//! Issue 7: what a failed fsync or manifest write leaves behind (findings 6,
//! 7 and 9), and the appender/waiter wakeup protocol (finding 11).
//!
//! Faults go through `IoHook`: `before` fails a call before it runs,
//! `after` turns a successful fsync into EIO (the write reached the page
//! cache, then the fsync failed: the kernel may have dropped those pages).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fissionlog::storage::fault::{IoHook, IoOp};
use fissionlog::{Error, Log, LogOptions, NewRecord, SyncPolicy, Topic, TopicConfig};
use parking_lot::Mutex;

fn options() -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    }
}

fn config(sync: SyncPolicy) -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 64 * 1024,
        sync,
        ..TopicConfig::default()
    }
}

fn value(i: u64) -> Vec<u8> {
    (0..120).map(|j| (i * 31 + j) as u8).collect()
}

fn key(i: u64) -> Vec<u8> {
    format!("key-{}", i % 7).into_bytes()
}

/// Appends records `from..to` to partition `p`, checking their offsets.
fn put(t: &Topic, p: u32, from: u64, to: u64) {
    for i in from..to {
        let k = key(i);
        let at = t
            .append_to(
                p,
                &[NewRecord {
                    key: Some(&k),
                    value: &value(i),
                    timestamp: Some(i as i64),
                }],
            )
            .unwrap();
        assert_eq!(at, i);
    }
}

/// Checks that partition `p` holds exactly records `0..end`, byte for byte.
fn check(t: &Topic, p: u32, end: u64) {
    let part = t.partition(p).unwrap();
    assert_eq!(part.end_offset(), end, "end of partition {p}");
    let mut next = 0;
    while next < end {
        let b = t.read(p, next, 1 << 20).unwrap();
        for r in b.iter() {
            assert_eq!(r.offset, next);
            assert_eq!(r.value, value(next).as_slice(), "record {next}");
            assert_eq!(r.key, Some(key(next).as_slice()), "key of record {next}");
            next += 1;
        }
    }
}

fn partition_dir(dir: &Path, topic: u32, p: u32) -> PathBuf {
    dir.join(format!("topics/t{topic}/p{p}"))
}

fn segment_files(pdir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(pdir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// One injected failure: the `skip`-th later call of `op` on a path
/// containing `path_part` fails, before the call or after it ran.
#[derive(Debug, Clone)]
struct Fault {
    op: IoOp,
    path_part: String,
    skip: u32,
    after: bool,
}

#[derive(Debug, Default)]
struct HookState {
    fault: Option<Fault>,
    /// Every fsync that succeeded, in order.
    synced: Vec<(IoOp, PathBuf)>,
    /// `synced` as it was when the first manifest commit sync ran.
    synced_at_commit: Option<Vec<(IoOp, PathBuf)>>,
    /// The journal's bytes when a failed-after manifest sync ran (what a
    /// power loss keeps if that fsync did reach the disk).
    journal_at_failure: Option<Vec<u8>>,
    /// Fsyncs seen after the fault fired.
    after_fault: Vec<(IoOp, PathBuf)>,
    fired: bool,
}

#[derive(Debug, Default)]
struct Hook(Mutex<HookState>);

impl Hook {
    fn arm(&self, op: IoOp, path_part: &str, skip: u32, after: bool) {
        let mut s = self.0.lock();
        s.fault = Some(Fault {
            op,
            path_part: path_part.into(),
            skip,
            after,
        });
        s.fired = false;
    }

    /// Whether the armed fault matches this call (and counts it down).
    fn hit(s: &mut HookState, op: IoOp, path: &Path, after: bool) -> bool {
        let Some(f) = &mut s.fault else { return false };
        if f.op != op || f.after != after || !path.to_string_lossy().contains(&f.path_part) {
            return false;
        }
        if f.skip > 0 {
            f.skip -= 1;
            return false;
        }
        s.fault = None;
        s.fired = true;
        true
    }
}

impl IoHook for Hook {
    fn before(&self, op: IoOp, path: &Path) -> std::io::Result<()> {
        let mut s = self.0.lock();
        if op == IoOp::SyncManifest && s.synced_at_commit.is_none() {
            s.synced_at_commit = Some(s.synced.clone());
        }
        if Hook::hit(&mut s, op, path, false) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    fn after(&self, op: IoOp, path: &Path, result: std::io::Result<()>) -> std::io::Result<()> {
        let mut s = self.0.lock();
        if s.fired {
            s.after_fault.push((op, path.to_path_buf()));
        }
        if result.is_ok() && Hook::hit(&mut s, op, path, true) {
            if op == IoOp::SyncManifest {
                s.journal_at_failure = Some(std::fs::read(path)?);
            }
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        if result.is_ok() {
            s.synced.push((op, path.to_path_buf()));
        }
        result
    }
}

/// Issue 7, finding 6: an fdatasync that failed after the write reached the
/// page cache (EIO; the kernel may have dropped those pages, and the next
/// fdatasync returns 0 without writing them) is never reported durable.
/// The partition stays out of later sync rounds, every later sync reports
/// it, appends to it are refused, other partitions keep working, and a
/// reopen keeps exactly what was durable before the failure.
#[test]
fn f6_fsync_eio_is_never_reported_durable_and_not_retried() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let hook = Arc::new(Hook::default());
    let log = Log::open_with_hook(&dir, options(), hook.clone()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    let u = log.create_topic("u", config(SyncPolicy::Always)).unwrap();
    put(&t, 0, 0, 5);
    log.sync().unwrap();
    log.sync().unwrap();
    let pdir = partition_dir(&dir, 0, 0);
    let seg = segment_files(&pdir).pop().unwrap();
    // What the disk holds for the segment: everything synced so far.
    let durable_image = std::fs::read(&seg).unwrap();

    put(&t, 0, 5, 8);
    hook.arm(IoOp::SyncSegment, "t0/p0", 0, true);
    assert!(log.sync().is_err(), "the failed round reports the failure");
    for _ in 0..3 {
        match log.sync() {
            Err(Error::Poisoned { partition: 0, .. }) => {}
            other => panic!("a later sync must keep reporting the failure, got {other:?}"),
        }
        assert!(matches!(t.sync(), Err(Error::Poisoned { .. })));
    }
    assert!(matches!(
        t.append(Some(b"k"), b"x"),
        Err(Error::Poisoned { .. })
    ));
    // Another topic's `Always` appends are still synced and acknowledged.
    for i in 0..3 {
        let k = key(i);
        let at = u.append(Some(&k), &value(i)).unwrap();
        assert_eq!(at.offset, i);
    }
    let retried: Vec<_> = hook
        .0
        .lock()
        .after_fault
        .iter()
        .filter(|(_, p)| p.starts_with(&pdir))
        .cloned()
        .collect();
    assert!(
        retried.is_empty(),
        "the poisoned partition was synced again: {retried:?}"
    );
    log.abandon();

    // Power loss after the failed fsync dropped the pages: the segment
    // holds what was durable. A checkpoint that claimed more makes a strict
    // open fail (synced data missing below it).
    std::fs::write(&seg, &durable_image).unwrap();
    let log = Log::open(&dir, options()).unwrap();
    let t = log.topic("t").unwrap();
    check(&t, 0, 5);
    let u = log.topic("u").unwrap();
    assert_eq!(u.partition(0).unwrap().end_offset(), 3);
    put(&t, 0, 5, 9);
    log.sync().unwrap();
    check(&t, 0, 9);
    log.close().unwrap();
}
