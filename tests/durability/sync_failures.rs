//! What a failed fsync or manifest write leaves behind, and the
//! appender/waiter wakeup protocol.
//!
//! Faults go through `IoHook`: `before` fails a call before it runs,
//! `after` turns a successful fsync into EIO (the write reached the page
//! cache, then the fsync failed: the kernel may have dropped those pages).

use crate::common::log::quiet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fissionlog::{Error, Log, LogOptions, NewRecord, SplitPlan, SyncPolicy, Topic, TopicConfig};
use fissionlog::{IoHook, IoOp};
use parking_lot::Mutex;

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

/// (Its own hook: it keeps what was synced before and after the fault, which
/// the kit cannot.)
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

/// An fdatasync that failed after the write reached the
/// page cache (EIO; the kernel may have dropped those pages, and the next
/// fdatasync returns 0 without writing them) is never reported durable.
/// The partition stays out of later sync rounds, every later sync reports
/// it, appends to it are refused, other partitions keep working, and a
/// reopen keeps exactly what was durable before the failure.
#[test]
fn fsync_eio_is_never_reported_durable_and_not_retried() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let hook = Arc::new(Hook::default());
    let log = Log::open_with_hook(&dir, quiet(), hook.clone()).unwrap();
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
    let log = Log::open(&dir, quiet()).unwrap();
    let t = log.topic("t").unwrap();
    check(&t, 0, 5);
    let u = log.topic("u").unwrap();
    assert_eq!(u.partition(0).unwrap().end_offset(), 3);
    put(&t, 0, 5, 9);
    log.sync().unwrap();
    check(&t, 0, 9);
    log.close().unwrap();
}

/// A roll fsyncs the partition directory before it creates the next
/// segment when no directory fsync ran since the previous roll (so a
/// segment's name is never durable before an earlier one's). When that
/// fsync fails, the roll creates nothing, the append that needed it fails,
/// and the partition is poisoned as by a failed fsync in a sync round:
/// appends to it are refused and every later log-wide sync reports it.
/// What it held is kept (no power loss here): a reopen reads it all.
#[test]
fn failed_directory_sync_at_a_roll_poisons_the_partition() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let hook = Arc::new(Hook::default());
    let log = Log::open_with_hook(&dir, quiet(), hook.clone()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    put(&t, 0, 0, 5);
    log.sync().unwrap();
    let pdir = partition_dir(&dir, 0, 0);
    hook.arm(IoOp::SyncRollDir, "t0/p0", 0, false);
    let mut end = 5;
    // The files before the append that fails (a roll right after the sync
    // round that named the segments needs no directory fsync).
    let mut before;
    let err = loop {
        before = segment_files(&pdir);
        let k = key(end);
        match t.append_to(
            0,
            &[NewRecord {
                key: Some(&k),
                value: &value(end),
                timestamp: Some(end as i64),
            }],
        ) {
            Ok(at) => assert_eq!(at, end),
            Err(e) => break e,
        }
        end += 1;
        assert!(end < 10_000, "no roll");
    };
    assert!(hook.0.lock().fired, "the roll fsynced the directory: {err}");
    assert_eq!(
        segment_files(&pdir),
        before,
        "the failed roll created nothing"
    );
    assert!(matches!(
        t.append(Some(b"k"), b"x"),
        Err(Error::Poisoned { partition: 0, .. })
    ));
    for _ in 0..2 {
        assert!(
            matches!(log.sync(), Err(Error::Poisoned { partition: 0, .. })),
            "a log-wide sync reports the poisoned partition"
        );
    }
    log.abandon();
    let log = Log::open(&dir, quiet()).unwrap();
    let t = log.topic("t").unwrap();
    check(&t, 0, end);
    put(&t, 0, end, end + 600);
    log.sync().unwrap();
    check(&t, 0, end + 600);
    log.close().unwrap();
}

fn split_options(compact_every: u32) -> LogOptions {
    LogOptions {
        manifest_compact_records: compact_every,
        ..quiet()
    }
}

/// Every later call that changes the log is refused with `LogPoisoned`.
fn assert_log_poisoned(log: &Log, t: &Topic) {
    let active = t.active_partitions();
    assert!(
        matches!(
            t.split(active[0], SplitPlan::Even),
            Err(Error::LogPoisoned { .. })
        ),
        "split after a manifest failure"
    );
    assert!(matches!(
        log.create_topic("other", config(SyncPolicy::Never)),
        Err(Error::LogPoisoned { .. })
    ));
    assert!(matches!(
        t.append(Some(b"k"), b"x"),
        Err(Error::LogPoisoned { .. } | Error::Poisoned { .. })
    ));
    assert!(matches!(log.sync(), Err(Error::LogPoisoned { .. })));
}

/// A split whose commit failed (the journal write,
/// its fdatasync before it ran, or its fdatasync after the record reached
/// the page cache) poisons the log and deletes nothing a replay could
/// reference. If the record did reach the disk, reopening finds the split
/// done with every file of its children; if not, the split is not done.
#[test]
fn failed_split_commit_poisons_and_keeps_files_replay_may_need() {
    for (op, after) in [
        (IoOp::WriteManifest, false),
        (IoOp::SyncManifest, false),
        (IoOp::SyncManifest, true),
    ] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        let hook = Arc::new(Hook::default());
        let log = Log::open_with_hook(&dir, split_options(1000), hook.clone()).unwrap();
        let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
        put(&t, 0, 0, 20);
        log.sync().unwrap();
        hook.arm(op, "manifest.log", 0, after);
        assert!(t.split(0, SplitPlan::Even).is_err(), "{op:?} after={after}");
        for child in [1, 2] {
            let cdir = partition_dir(&dir, 0, child);
            assert!(
                !segment_files(&cdir).is_empty(),
                "{op:?} after={after}: child {child}'s files were deleted"
            );
        }
        assert_log_poisoned(&log, &t);
        check(&t, 0, 20);
        log.abandon();

        let journal = hook.0.lock().journal_at_failure.clone();
        if let Some(bytes) = &journal {
            // The record did reach the disk (the truncation, if any, did not).
            std::fs::write(dir.join("manifest.log"), bytes).unwrap();
        }
        let log = Log::open(&dir, quiet()).unwrap();
        let t = log.topic("t").unwrap();
        check(&t, 0, 20);
        // Without a power loss the outcome is what the journal file holds:
        // a record written before its fsync failed may replay. Either
        // outcome is whole (C5); a record that reached the disk must replay.
        let done = t.active_partitions() == vec![1, 2];
        assert!(
            done || journal.is_none(),
            "{op:?}: the durable record was not replayed"
        );
        if op == IoOp::WriteManifest {
            assert!(!done, "nothing was written, yet the split replayed");
        }
        if done {
            assert!(t.partition(0).unwrap().is_sealed());
            for child in [1, 2] {
                assert_eq!(t.partition(child).unwrap().end_offset(), 0);
            }
            assert!(
                log.recovery_report().holes.is_empty(),
                "{:?}",
                log.recovery_report()
            );
            put(&t, 1, 0, 3);
        } else {
            assert_eq!(t.active_partitions(), vec![0], "{op:?}: split not done");
            assert!(!partition_dir(&dir, 0, 1).exists(), "orphan removed");
            put(&t, 0, 20, 25);
        }
        log.close().unwrap();
    }
}

/// A manifest compaction that fails (the snapshot's
/// fsync, or the directory fsync after it is renamed) poisons the log. The
/// change that triggered it was committed (its journal record is durable),
/// so it is reported done and survives a reopen.
#[test]
fn failed_manifest_compaction_poisons_the_log() {
    for op in [IoOp::SyncManifestFile, IoOp::SyncManifestDir] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        let hook = Arc::new(Hook::default());
        // CreateTopic is record 1; the split (record 2) triggers compaction.
        let log = Log::open_with_hook(&dir, split_options(2), hook.clone()).unwrap();
        let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
        put(&t, 0, 0, 20);
        log.sync().unwrap();
        hook.arm(op, "", 0, true);
        let children = t.split(0, SplitPlan::Even).unwrap();
        assert!(hook.0.lock().fired, "{op:?}: compaction ran");
        assert_log_poisoned(&log, &t);
        log.abandon();
        let log = Log::open(&dir, quiet()).unwrap();
        let t = log.topic("t").unwrap();
        assert_eq!(t.active_partitions(), children, "{op:?}");
        check(&t, 0, 20);
        log.close().unwrap();
    }
}

/// If the directory fsync after the new journal's
/// rename fails, the log does not keep committing into the old, unlinked
/// journal (those commits would vanish on reopen): it is poisoned.
#[test]
fn failed_dir_sync_after_journal_rename_poisons_the_log() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let hook = Arc::new(Hook::default());
    let log = Log::open_with_hook(&dir, split_options(2), hook.clone()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    put(&t, 0, 0, 20);
    log.sync().unwrap();
    // The second directory fsync of the compaction follows the journal rename.
    hook.arm(IoOp::SyncManifestDir, "", 1, true);
    let children = t.split(0, SplitPlan::Even).unwrap();
    assert!(hook.0.lock().fired, "compaction ran");
    assert_log_poisoned(&log, &t);
    log.abandon();
    let log = Log::open(&dir, quiet()).unwrap();
    let t = log.topic("t").unwrap();
    assert_eq!(t.active_partitions(), children);
    check(&t, 0, 20);
    log.close().unwrap();
}

/// A split commits only after the parent's data up to
/// the seal is durable, so a power loss can never keep a key's later
/// records (in a child) while losing its earlier ones (in the parent).
/// The hook sees which files were fsynced before the commit record's
/// fdatasync: the parent's segments written since the last sync (including
/// the one sealed by a roll) and its directory must be among them.
#[test]
fn split_syncs_the_parent_before_its_commit_record() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let hook = Arc::new(Hook::default());
    let log = Log::open_with_hook(&dir, quiet(), hook.clone()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    put(&t, 0, 0, 10);
    log.sync().unwrap();
    put(&t, 0, 10, 20);
    t.partition(0).unwrap().roll_now().unwrap();
    put(&t, 0, 20, 30);
    let pdir = partition_dir(&dir, 0, 0);
    let segs = segment_files(&pdir);
    assert_eq!(segs.len(), 2);
    {
        let mut s = hook.0.lock();
        s.synced.clear();
        s.synced_at_commit = None;
    }
    t.split(0, SplitPlan::Even).unwrap();
    let before_commit = hook.0.lock().synced_at_commit.clone().unwrap();
    for seg in &segs {
        assert!(
            before_commit
                .iter()
                .any(|(op, p)| p == seg && *op == IoOp::SyncSegment),
            "{} not synced before the split's commit: {before_commit:?}",
            seg.display()
        );
    }
    assert!(
        before_commit.iter().any(|(_, p)| p == &pdir),
        "the parent's directory (new segment) not synced before the commit: {before_commit:?}"
    );
    log.close().unwrap();
}

/// If the parent's sync before the commit fails, the
/// split is not committed, the parent is poisoned (EIO: never retried) and
/// the children's files are gone.
#[test]
fn failed_parent_sync_refuses_the_split() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let hook = Arc::new(Hook::default());
    let log = Log::open_with_hook(&dir, quiet(), hook.clone()).unwrap();
    let t = log.create_topic("t", config(SyncPolicy::Never)).unwrap();
    put(&t, 0, 0, 10);
    log.sync().unwrap();
    put(&t, 0, 10, 20);
    hook.arm(IoOp::SyncSegment, "t0/p0", 0, true);
    assert!(t.split(0, SplitPlan::Even).is_err());
    assert_eq!(t.active_partitions(), vec![0]);
    assert!(segment_files(&partition_dir(&dir, 0, 1)).is_empty());
    assert!(matches!(
        t.append(Some(b"k"), b"x"),
        Err(Error::Poisoned { .. })
    ));
    assert!(matches!(log.sync(), Err(Error::Poisoned { .. })));
    log.abandon();
    let log = Log::open(&dir, quiet()).unwrap();
    let t = log.topic("t").unwrap();
    assert_eq!(t.active_partitions(), vec![0]);
    check(&t, 0, 20);
    log.close().unwrap();
}

/// For merges: both parents are synced before the
/// merge record.
#[test]
fn merge_syncs_both_parents_before_its_commit_record() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let hook = Arc::new(Hook::default());
    let log = Log::open_with_hook(&dir, quiet(), hook.clone()).unwrap();
    let mut cfg = config(SyncPolicy::Never);
    cfg.partitions = 2;
    cfg.balance.min_partitions = 1;
    let t = log.create_topic("t", cfg).unwrap();
    put(&t, 0, 0, 10);
    put(&t, 1, 0, 10);
    {
        let mut s = hook.0.lock();
        s.synced.clear();
        s.synced_at_commit = None;
    }
    t.merge(0, 1).unwrap();
    let before_commit = hook.0.lock().synced_at_commit.clone().unwrap();
    for p in [0, 1] {
        let seg = segment_files(&partition_dir(&dir, 0, p)).pop().unwrap();
        assert!(
            before_commit
                .iter()
                .any(|(op, q)| *q == seg && *op == IoOp::SyncSegment),
            "parent {p} not synced before the merge's commit: {before_commit:?}"
        );
    }
    log.close().unwrap();
}

/// An appender and a waiter racing on one record.
/// Each round the waiter asks for the next offset at the moment the
/// appender (spinning on a shared counter, so both sides are running)
/// writes it; a lost wakeup leaves the waiter asleep until its timeout,
/// since no later append comes to wake it. Bounded by time
/// (`FISSIONLOG_WAKEUP_MS`, default 1.5 s), not rounds. Passing does not
/// prove the protocol correct (the race window is a few instructions
/// wide); failing proves a lost wakeup.
#[test]
fn waiter_racing_an_append_is_always_woken() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path().join("log"), quiet()).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                segment_bytes: 8 << 20,
                ..config(SyncPolicy::Never)
            },
        )
        .unwrap();
    let part = t.partition(0).unwrap();
    let budget = Duration::from_millis(
        std::env::var("FISSIONLOG_WAKEUP_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1500),
    );
    // Records the appender may write; u64::MAX: stop.
    let allowed = Arc::new(AtomicU64::new(0));
    let appender = {
        let (t, allowed) = (t.clone(), allowed.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            let mut spins = 0u32;
            loop {
                let a = allowed.load(Ordering::Acquire);
                if a == u64::MAX {
                    return n;
                }
                if a > n {
                    let at = t.append_to(0, &[NewRecord::default()]).unwrap();
                    assert_eq!(at, n);
                    n += 1;
                    spins = 0;
                } else {
                    spins += 1;
                    if spins.is_multiple_of(1024) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        })
    };
    // The first record is not timed: it waits for the appender thread to
    // run at all, which a loaded machine may delay past any timeout.
    allowed.store(1, Ordering::Release);
    assert!(
        part.wait_for(0, Duration::from_secs(60)),
        "the appender never ran"
    );
    let started = Instant::now();
    let timeout = Duration::from_secs(4);
    let mut rounds = 1u64;
    let mut slow = None;
    while started.elapsed() < budget && slow.is_none() {
        allowed.store(rounds + 1, Ordering::Release);
        let t0 = Instant::now();
        let ready = part.wait_for(rounds, timeout);
        let waited = t0.elapsed();
        if !ready || waited >= timeout / 2 {
            slow = Some((rounds, ready, waited));
        }
        rounds += 1;
    }
    allowed.store(u64::MAX, Ordering::Release);
    let appended = appender.join().unwrap();
    eprintln!("{rounds} append/wait races in {:?}", started.elapsed());
    assert_eq!(slow, None, "(round, ready, waited): a lost wakeup");
    assert_eq!(appended, rounds);
    log.close().unwrap();
}
