//! The budget of mappings and descriptors held to the data contracts
//! under a budget of two, so that segments are evicted and mapped again
//! all the time: a sync round over more partitions than the budget holds
//! keeps every synced record through a power loss; retention of evicted
//! segments loses and duplicates nothing and leaves files that verify;
//! `verify` of a log with more partitions than descriptors; a read batch
//! keeps its bytes while its segment is evicted, deleted by retention or
//! cut by a Raft truncation; a sync round racing the removal of retired
//! partitions.

use crate::common;
use common::crash::CrashOptions;
use common::faults::Gate;
use common::log::{quiet, serial, sized_value};
use common::model_hook::ModelHook;
use common::tmpfs::{assert_child_ok, child_dir, run_child, Tmpfs};

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fissionlog::{
    EntryBody, Error, IoOp, Log, LogOptions, NewRecord, RaftLogId, ReadIsolation, RecordIn,
    TopicConfig,
};

/// One record of 3000 bytes fills a 4 KiB segment: every append rolls.
const LEN: usize = 3000;

/// A budget of two mappings and two descriptors.
fn tiny() -> LogOptions {
    LogOptions {
        max_mapped_segments: 2,
        max_open_files: 2,
        ..quiet()
    }
}

fn small_segments(partitions: u32) -> TopicConfig {
    let mut cfg = TopicConfig {
        partitions,
        segment_bytes: 4096,
        ..TopicConfig::default()
    };
    cfg.balance.enabled = false;
    cfg
}

/// The value of record `i` of partition `p`.
fn value(p: u32, i: u64) -> Vec<u8> {
    sized_value(u64::from(p) * 1_000_000 + i, LEN)
}

fn append(log: &Log, p: u32, i: u64, ts: i64) {
    let v = value(p, i);
    let at = log
        .topic("t")
        .unwrap()
        .append_to(
            p,
            &[NewRecord {
                key: None,
                value: &v,
                timestamp: Some(ts),
            }],
        )
        .unwrap();
    assert_eq!(at, i, "partition {p}");
}

/// Every record partition `p` holds, as (offset, value), start to end.
fn records(log: &Log, p: u32) -> Vec<(u64, Vec<u8>)> {
    let part = log.topic("t").unwrap().partition(p).unwrap();
    let mut out = Vec::new();
    let mut next = part.start_offset();
    while next < part.end_offset() {
        let b = part
            .read_with(next, 1 << 20, ReadIsolation::Written)
            .unwrap_or_else(|e| panic!("partition {p} offset {next}: {e}"));
        for r in b.iter() {
            assert_eq!(r.offset, next, "partition {p}: offsets are dense");
            out.push((r.offset, r.value.to_vec()));
            next += 1;
        }
    }
    out
}

/// Asserts that partition `p` holds exactly records `[start, end)` of
/// what was appended to it.
fn assert_holds(log: &Log, p: u32, start: u64, end: u64, when: &str) {
    let got = records(log, p);
    let want: Vec<_> = (start..end).map(|i| (i, value(p, i))).collect();
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        want.iter().map(|r| r.0).collect::<Vec<_>>(),
        "{when}: partition {p} offsets"
    );
    assert!(got == want, "{when}: partition {p} bytes differ");
}

fn assert_verifies(dir: &Path, when: &str) {
    let (_, problems) = fissionlog::verify(dir).unwrap();
    assert!(problems.is_empty(), "{when}: {problems:#?}");
}

/// A sync round whose dirty partitions are four times the descriptor
/// budget (each with several unsynced rolled segments, so the round opens
/// every file again): after a power loss at any point past it, every
/// record it covered is there byte for byte, and each partition holds a
/// prefix of what was appended.
#[test]
fn a_sync_round_over_more_partitions_than_descriptors_keeps_every_synced_record_through_a_power_loss(
) {
    // Reopens its log: no child may hold a copy of its lock meanwhile.
    let _serial = serial();
    const PARTS: u32 = 8;
    const SYNCED: u64 = 5;
    const MORE: u64 = 3;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir_all(&dir).unwrap();
    let hook = ModelHook::new(&dir, None);
    // A new segment's header is durable through its directory's fsync
    // (the gap `tests/crash_model/named_cases.rs` shows).
    hook.grant_segment_headers(true);
    let log = Log::open_with_hook(&dir, tiny(), hook.clone()).unwrap();
    log.create_topic("t", small_segments(PARTS)).unwrap();
    for i in 0..SYNCED {
        for p in 0..PARTS {
            append(&log, p, i, i as i64);
        }
    }
    assert!(log.resource_stats().files_evicted > 0);
    log.sync().unwrap();
    let stats = log.resource_stats();
    assert!(stats.open_segment_files <= 2, "{stats:?}");
    for i in SYNCED..SYNCED + MORE {
        for p in 0..PARTS {
            append(&log, p, i, i as i64);
        }
    }
    log.abandon();
    for seed in 0..6u64 {
        let (image, trace) = hook.crash_image(seed, &CrashOptions::default());
        let d = root.path().join(format!("image{seed}"));
        image.write_to(&d).unwrap();
        let log = Log::open(&d, tiny())
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", trace.join("\n")));
        for p in 0..PARTS {
            let got = records(&log, p);
            assert!(
                got.len() as u64 >= SYNCED,
                "seed {seed}: partition {p} lost synced records: {} left\n{}",
                got.len(),
                trace.join("\n")
            );
            for (off, v) in &got {
                assert!(
                    *v == value(p, *off),
                    "seed {seed}: partition {p} record {off}"
                );
            }
        }
        log.close().unwrap();
        // A power loss keeps index files of segments the open did not
        // scan: stale caches, rebuilt on first use, are all verify may
        // report.
        let (_, problems) = fissionlog::verify(&d).unwrap();
        let bad: Vec<_> = problems
            .iter()
            .filter(|p| p.what != "index does not match its segment")
            .collect();
        assert!(bad.is_empty(), "seed {seed}: {bad:#?}");
    }
}

/// Retention by size and by age of segments whose mappings and
/// descriptors the budget gave back (read once, then evicted by reads of
/// other partitions): exactly the records past the new start remain,
/// none twice, after a reopen too, and the files verify.
#[test]
fn retention_of_evicted_segments_loses_and_duplicates_nothing() {
    // Reopens its log: no child may hold a copy of its lock meanwhile.
    let _serial = serial();
    const PARTS: u32 = 4;
    const N: u64 = 24;
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), tiny()).unwrap();
    let mut cfg = small_segments(PARTS);
    // Each segment holds one record of about 3 KiB: 16 segments' worth,
    // and an hour.
    cfg.retention_bytes = Some(16 * 3100);
    cfg.retention_age = Some(Duration::from_secs(3600));
    log.create_topic("t", cfg).unwrap();
    let now = fissionlog_now_ms();
    for i in 0..N {
        for p in 0..PARTS {
            // Partition 0's first half is a day old; the rest is new.
            let ts = if p == 0 && i < N / 2 {
                now - 86_400_000
            } else {
                now
            };
            append(&log, p, i, ts);
        }
    }
    log.sync().unwrap();
    for p in 0..PARTS {
        assert_holds(&log, p, 0, N, "before retention");
    }
    assert!(log.resource_stats().mappings_evicted > 0);
    let mut starts = vec![0; PARTS as usize];
    for _ in 0..4 {
        log.enforce_retention().unwrap();
        log.sync().unwrap();
    }
    let t = log.topic("t").unwrap();
    for p in 0..PARTS {
        let part = t.partition(p).unwrap();
        starts[p as usize] = part.start_offset();
        assert!(
            starts[p as usize] > 0,
            "partition {p}: retention took nothing"
        );
        assert_holds(&log, p, starts[p as usize], N, "after retention");
        let err = part.read(0, 1 << 20).unwrap_err();
        assert!(matches!(err, Error::Retained { .. }), "{err:?}");
    }
    assert!(
        starts[0] >= N / 2,
        "partition 0's day-old half goes by age: start {}",
        starts[0]
    );
    drop(t);
    log.close().unwrap();
    assert_verifies(dir.path(), "after retention");
    let log = Log::open(dir.path(), tiny()).unwrap();
    for p in 0..PARTS {
        assert_holds(&log, p, starts[p as usize], N, "after reopen");
    }
    log.close().unwrap();
}

fn fissionlog_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A read batch and `Bytes` made from it keep the bytes they were read
/// with while their segment's mapping is evicted (reads of other
/// segments), and while retention deletes its file; a read of the deleted
/// offsets afterwards is `Error::Retained`.
#[test]
fn a_held_batch_keeps_its_bytes_while_its_segment_is_evicted_and_deleted() {
    // Reopens its log: no child may hold a copy of its lock meanwhile.
    let _serial = serial();
    const N: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), tiny()).unwrap();
    let mut cfg = small_segments(1);
    cfg.retention_bytes = Some(4 * 3100);
    log.create_topic("t", cfg).unwrap();
    for i in 0..N {
        append(&log, 0, i, i as i64);
    }
    log.sync().unwrap();
    let part = log.topic("t").unwrap().partition(0).unwrap();
    let first_file = part.segment_infos()[0].path.clone();
    let held = part.read(0, 1 << 20).unwrap();
    let bytes = held.to_bytes();
    let first = held.iter().next().unwrap();
    let value_bytes = held.value_bytes(&first);
    assert_eq!(first.offset, 0);
    let copy = held.as_bytes().to_vec();
    let evicted = log.resource_stats().mappings_evicted;
    for i in 1..N {
        let b = part.read(i, 1 << 20).unwrap();
        assert_eq!(b.iter().next().unwrap().value, value(0, i).as_slice());
    }
    assert!(
        log.resource_stats().mappings_evicted >= evicted + 2,
        "{:?}",
        log.resource_stats()
    );
    assert_eq!(held.as_bytes(), copy.as_slice(), "after eviction");
    for _ in 0..4 {
        log.enforce_retention().unwrap();
        log.sync().unwrap();
    }
    assert!(part.start_offset() > 0, "retention deleted segment 0");
    assert!(!first_file.exists(), "{} is deleted", first_file.display());
    // Read other segments again: the deleted one's mapping is not cached.
    for i in part.start_offset()..N {
        part.read(i, 1 << 20).unwrap();
    }
    assert_eq!(held.as_bytes(), copy.as_slice(), "after deletion");
    assert_eq!(&bytes[..], copy.as_slice());
    assert_eq!(&value_bytes[..], value(0, 0).as_slice());
    let again: Vec<_> = held.try_iter().map(|r| r.unwrap().offset).collect();
    assert_eq!(again, vec![0]);
    let err = part.read(0, 1 << 20).unwrap_err();
    assert!(matches!(err, Error::Retained { .. }), "{err:?}");
    drop((held, bytes, value_bytes, part));
    log.close().unwrap();
    assert_verifies(dir.path(), "after retention");
}

/// Sets the soft limit on open descriptors (the hard one stays).
fn soft_limit_open_files(n: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass and nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(rc, 0, "getrlimit: {}", std::io::Error::last_os_error());
    let old = lim.rlim_cur;
    lim.rlim_cur = n.min(lim.rlim_max);
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
    old
}

const VERIFY_PARTS: u32 = 200;
const VERIFY_RECORDS: u64 = 3;

fn verify_scenario(dir: &Path) {
    let log = Log::open(dir, tiny()).unwrap();
    log.create_topic("t", small_segments(VERIFY_PARTS)).unwrap();
    for i in 0..VERIFY_RECORDS {
        for p in 0..VERIFY_PARTS {
            append(&log, p, i, i as i64);
        }
    }
    log.close().unwrap();
    let base = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    // Far fewer descriptors than partitions (600 segments).
    soft_limit_open_files(base + 48);
    let (_, problems) = fissionlog::verify(dir).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
    let log = Log::open(dir, tiny()).unwrap();
    for p in (0..VERIFY_PARTS).step_by(7) {
        assert_holds(&log, p, 0, VERIFY_RECORDS, "open after verify");
    }
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}

/// `verify` (the read-only open) of a log with more partitions and
/// segments than descriptors allowed: it holds a partition's files at a
/// time, finds nothing wrong, and a budgeted open reads everything after
/// it. The limit is lowered in a child process.
#[test]
fn verify_of_more_partitions_than_descriptors_allowed_passes() {
    let _serial = serial();
    const NAME: &str = "verify_of_more_partitions_than_descriptors_allowed_passes";
    if let Some(dir) = child_dir(NAME) {
        verify_scenario(&dir);
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(1 << 30);
    let base = fs.as_ref().map_or(root.path(), |f| f.path.as_path());
    let out = run_child(module_path!(), NAME, &base.join("log"));
    assert_child_ok(NAME, &out);
}

/// Sync rounds racing retention that removes fully retired sealed
/// partitions (split parents whose records all expired) under a budget of
/// two: nothing fails, every active partition's records survive, and the
/// directory verifies and reopens with them.
#[test]
fn sync_rounds_racing_the_removal_of_retired_partitions_lose_nothing() {
    // Reopens its log: no child may hold a copy of its lock meanwhile.
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(dir.path(), tiny()).unwrap());
    let mut cfg = small_segments(1);
    cfg.retention_age = Some(Duration::from_secs(3600));
    log.create_topic("t", cfg).unwrap();
    let old = fissionlog_now_ms() - 86_400_000;
    let t = log.topic("t").unwrap();
    // A chain of splits: each parent holds two day-old records and is
    // sealed; the newest children stay active.
    let mut active = vec![0u32];
    let mut sealed = Vec::new();
    for _ in 0..5 {
        let p = active.remove(0);
        for i in 0..2 {
            append(&log, p, i, old);
        }
        let children = t.split(p, fissionlog::SplitPlan::Even).unwrap();
        sealed.push(p);
        active.extend(children);
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syncer = {
        let (log, stop) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Acquire) || rounds < 20 {
                log.sync().unwrap();
                rounds += 1;
            }
            rounds
        })
    };
    let now = fissionlog_now_ms();
    let mut written = std::collections::BTreeMap::new();
    for round in 0..10u64 {
        for &p in &active {
            let n = written.entry(p).or_insert(0u64);
            append(&log, p, *n, now);
            *n += 1;
        }
        if round % 2 == 0 {
            log.enforce_retention().unwrap();
        }
    }
    for _ in 0..4 {
        log.enforce_retention().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    assert!(syncer.join().unwrap() >= 20);
    let remaining: Vec<u32> = t.partitions().iter().map(|p| p.id).collect();
    for p in &sealed {
        assert!(
            !remaining.contains(p),
            "retired partition {p} left the topology: {remaining:?}"
        );
    }
    for (&p, &n) in &written {
        assert_holds(&log, p, 0, n, "after the race");
    }
    drop(t);
    let log = Arc::into_inner(log).unwrap();
    log.close().unwrap();
    assert_verifies(dir.path(), "after the race");
    let log = Log::open(dir.path(), tiny()).unwrap();
    for (&p, &n) in &written {
        assert_holds(&log, p, 0, n, "after reopen");
    }
    log.close().unwrap();
}

fn raft_id(index: u64) -> RaftLogId {
    RaftLogId {
        term: 1,
        leader: 1,
        index,
    }
}

/// Raft index of the first entry a truncation cuts, of 60.
const RAFT_CUT: u64 = 40;
const RAFT_LAST: u64 = 60;
/// The offset of entry `RAFT_CUT` (entry `i` holds offset `i - 1`): the
/// partition's end once it is cut.
const RAFT_CUT_OFFSET: u64 = RAFT_CUT - 1;

/// A replicated partition of one large segment holding entries
/// `1..=RAFT_LAST` (one record each, offset `index - 1`), synced, opened
/// with `gate`; returns the log.
fn raft_log(dir: &Path, gate: Arc<Gate>) -> Log {
    let opts = LogOptions {
        // Only rounds that are asked to (the truncation's) write the
        // recovery checkpoint: the others need no writer lock.
        checkpoint_interval: Duration::from_secs(3600),
        ..tiny()
    };
    let log = Log::open_with_hook(dir, opts, gate).unwrap();
    let mut cfg = TopicConfig {
        segment_bytes: 1 << 20,
        index_interval_bytes: 256,
        replicated: true,
        ..TopicConfig::default()
    };
    cfg.balance.enabled = false;
    let t = log.create_topic("t", cfg).unwrap();
    let p = t.partition(0).unwrap();
    for i in 1..=RAFT_LAST {
        let v = format!("entry-{i:0100}");
        p.append_entry(
            raft_id(i),
            EntryBody::Records(&[RecordIn {
                key: None,
                value: v.as_bytes(),
                timestamp: i as i64,
            }]),
        )
        .unwrap();
    }
    log.sync().unwrap();
    log
}

/// A gate on the first I/O step of a Raft truncation's cut of the
/// segment holding index `RAFT_CUT` (entries `1..=RAFT_LAST` synced), and
/// the truncation running into it in its own thread.
struct HeldCut {
    log: Arc<Log>,
    gate: Arc<Gate>,
    truncation: std::thread::JoinHandle<fissionlog::Result<()>>,
}

fn hold_a_cut(dir: &Path) -> HeldCut {
    let gate = Arc::new(
        Gate::new(IoOp::TrimSegment)
            .on_path("00000000000000000000.seg")
            .disarmed()
            .at_most(Duration::from_secs(20)),
    );
    let log = Arc::new(raft_log(dir, gate.clone()));
    gate.arm();
    let truncation = {
        let log = log.clone();
        std::thread::spawn(move || log.topic("t").unwrap().truncate_from_index(0, RAFT_CUT, 0))
    };
    assert!(gate.wait_reached(Duration::from_secs(10)), "the cut began");
    HeldCut {
        log,
        gate,
        truncation,
    }
}

impl HeldCut {
    /// Lets the cut go on; returns the log once the truncation returned.
    fn finish(self) -> Arc<Log> {
        self.gate.release();
        self.truncation.join().unwrap().unwrap();
        self.log
    }
}

/// Entries `1..=last` read back whole from partition 0.
fn assert_entries(log: &Log, last: u64, when: &str) {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(p.last_log_id().map(|id| id.index), Some(last), "{when}");
    let mut next = 1;
    while next <= last {
        let b = p.read_entries(next, 1 << 20).unwrap();
        for e in b.entries() {
            let e = e.unwrap();
            assert_eq!(e.id.index, next, "{when}");
            next += 1;
        }
    }
    let err = p.read_entries(last + 1, 1 << 20).unwrap_err();
    assert!(
        matches!(err, Error::RaftIndexOutOfRange { .. }),
        "{when}: {err:?}"
    );
}

/// While a Raft truncation cuts its files (its first I/O step on the
/// segment it cuts held by a gate), the partition's end is already the
/// cut: a written read from the cut is out of range, and one from below
/// it stops at the cut. A reader of entries that comes meanwhile either
/// waits for the cut or keeps every byte it was given: its batch never
/// changes under it.
#[test]
fn a_raft_truncation_in_progress_shows_no_reader_anything_past_its_cut() {
    // Reopens its log: no child may hold a copy of its lock meanwhile.
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let held = hold_a_cut(dir.path());
    let p = held.log.topic("t").unwrap().partition(0).unwrap();
    let cut_offset = RAFT_CUT_OFFSET;
    assert_eq!(p.end_offset(), cut_offset, "the end during the cut");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let p = p.clone();
        std::thread::spawn(move || {
            let written = p.read_with(cut_offset, 1 << 20, ReadIsolation::Written);
            let got = p.read_entries(RAFT_CUT - 2, 1 << 20);
            let copy = got.as_ref().ok().map(|b| b.as_bytes().to_vec());
            let _ = tx.send(());
            (written.map(|b| b.next_offset()), got, copy)
        })
    };
    // Until the reader has read, or long enough to show it waits.
    let _ = rx.recv_timeout(Duration::from_millis(500));
    let log = held.finish();
    let (written, got, copy) = reader.join().unwrap();
    let log = Arc::into_inner(log).unwrap();
    match written {
        Err(Error::OffsetOutOfRange { .. }) => {}
        Ok(next) => panic!("a read during the cut sees the truncated records {cut_offset}..{next}"),
        Err(e) => panic!("{e:?}"),
    }
    if let Ok(batch) = &got {
        assert!(
            batch.as_bytes() == copy.unwrap().as_slice(),
            "a batch read during the cut changed under its reader ({} entries from {})",
            batch.len(),
            batch.first_index()
        );
        for e in batch.entries() {
            e.unwrap();
        }
    }
    let r = p.read_with(0, 1 << 20, ReadIsolation::Written).unwrap();
    assert_eq!(r.next_offset(), cut_offset);
    drop((got, p, r));
    assert_entries(&log, RAFT_CUT - 1, "after the truncation");
    log.close().unwrap();
    assert_verifies(dir.path(), "after the truncation");
}

/// A sync round that runs while a Raft truncation cuts its files never
/// makes the truncated entries durable again: after the truncation
/// returned, a crash (the process killed, nothing synced since) reopens
/// to exactly the entries before the cut, and the files verify.
#[test]
fn a_sync_round_during_a_raft_truncation_never_checkpoints_past_the_cut() {
    // Reopens its log: no child may hold a copy of its lock meanwhile.
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let held = hold_a_cut(dir.path());
    let round = {
        let log = held.log.clone();
        std::thread::spawn(move || log.sync())
    };
    // Let the round capture and sync while the cut is held.
    std::thread::sleep(Duration::from_millis(300));
    let p = held.log.topic("t").unwrap().partition(0).unwrap();
    assert!(
        p.durable_end_offset() <= RAFT_CUT_OFFSET,
        "durable end {} during the cut",
        p.durable_end_offset()
    );
    drop(p);
    let log = held.finish();
    round.join().unwrap().unwrap();
    let log = Arc::into_inner(log).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert!(p.durable_end_offset() <= RAFT_CUT_OFFSET);
    drop(p);
    log.abandon();
    let log = Log::open(dir.path(), tiny()).unwrap();
    assert_entries(&log, RAFT_CUT - 1, "after a crash");
    log.close().unwrap();
    assert_verifies(dir.path(), "after a crash");
}

/// A tail split and its reclaim under a budget of two, with 4 KiB
/// segments (the moved range spans many, each evicted and mapped again):
/// `Bytes` of a batch taken before the split, covering moved records,
/// keep their bytes (the cut of their segment waits for them); once they
/// are dropped the reclaim completes, every record reads exactly once,
/// after a reopen too, and the files verify.
#[test]
fn a_tail_split_reclaim_of_evicted_segments_keeps_held_bytes_and_every_record_once() {
    use common::tail::{append_big, check_exactly_once, read_all};
    use fissionlog::{SplitPlan, TailSplitOptions};
    // Reopens its log: no child may hold a copy of its lock meanwhile.
    let _serial = serial();
    const N: u64 = 90;
    const FROM: u64 = 31;
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), tiny()).unwrap();
    let mut cfg = common::tail::config();
    cfg.segment_bytes = 4096;
    let topic = log.create_topic("t", cfg).unwrap();
    append_big(&topic, 0, N, 7);
    log.sync().unwrap();
    let p = topic.partition(0).unwrap();
    assert!(p.segment_count() > 20, "{} segments", p.segment_count());
    drop(p);
    // The batch holding FROM covers records past it (a segment holds 3).
    let batch = topic.read(0, FROM - 1, 1 << 20).unwrap();
    assert!(batch.next_offset() > FROM, "the batch covers moved records");
    let held = batch.to_bytes();
    let copy = held.to_vec();
    drop(batch);
    check_exactly_once(&read_all(&topic), 0..N, "before the split");
    assert!(log.resource_stats().mappings_evicted > 0);
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    let out = topic.reclaim_tail(0).unwrap();
    assert!(out.recorded && !out.complete, "{out:?}");
    check_exactly_once(&read_all(&topic), 0..N, "after the partial reclaim");
    assert!(held == copy, "held bytes changed under the reclaim");
    drop(held);
    let again = topic.reclaim_tail(0).unwrap();
    assert!(again.complete, "{again:?}");
    check_exactly_once(&read_all(&topic), 0..N, "after the reclaim");
    drop(topic);
    log.close().unwrap();
    assert_verifies(dir.path(), "after the reclaim");
    let log = Log::open(dir.path(), tiny()).unwrap();
    check_exactly_once(&read_all(&log.topic("t").unwrap()), 0..N, "reopened");
    log.close().unwrap();
}

/// A Raft truncation inside a rolled segment the budget evicted (4 KiB
/// segments, a budget of two, the other segments read after it), then
/// appends of a newer term: the log holds the entries before the cut and
/// the new ones, byte for byte, after a reopen too, and the files verify.
#[test]
fn a_raft_truncation_inside_an_evicted_rolled_segment_keeps_the_prefix_and_the_new_term() {
    // Reopens its log: no child may hold a copy of its lock meanwhile.
    let _serial = serial();
    const LAST: u64 = 80;
    const CUT: u64 = 23;
    const NEW_LAST: u64 = 50;
    let body = |term: u64, i: u64| format!("t{term}-{i:0300}").into_bytes();
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), tiny()).unwrap();
    let mut cfg = TopicConfig {
        segment_bytes: 4096,
        index_interval_bytes: 256,
        replicated: true,
        ..TopicConfig::default()
    };
    cfg.balance.enabled = false;
    let t = log.create_topic("t", cfg).unwrap();
    let p = t.partition(0).unwrap();
    let put = |term: u64, i: u64| {
        let v = body(term, i);
        p.append_entry(
            RaftLogId {
                term,
                leader: 1,
                index: i,
            },
            EntryBody::Records(&[RecordIn {
                key: None,
                value: &v,
                timestamp: i as i64,
            }]),
        )
        .unwrap();
    };
    for i in 1..=LAST {
        put(1, i);
    }
    log.sync().unwrap();
    let infos = p.segment_infos();
    assert!(infos.len() > 5, "{} segments", infos.len());
    // The cut falls inside a rolled segment, not at its first entry.
    let holder = infos
        .iter()
        .find(|s| s.base_offset < CUT - 1 && s.end_offset > CUT - 1)
        .unwrap();
    assert!(holder.sealed && holder.base_offset < CUT - 2, "{holder:?}");
    // Read everything, the segment holding the cut first: it is evicted.
    let check = |term_of: &dyn Fn(u64) -> u64, last: u64, when: &str| {
        let mut next = 1;
        while next <= last {
            let b = p.read_entries(next, 1 << 20).unwrap();
            for e in b.entries() {
                let e = e.unwrap();
                assert_eq!(e.id.index, next, "{when}");
                let fissionlog::RaftEntryBody::Records(r) = e.body else {
                    panic!("{when}: entry {next} is not a record");
                };
                assert_eq!(r[0].value, body(term_of(next), next).as_slice(), "{when}");
                next += 1;
            }
        }
        assert_eq!(p.last_log_id().map(|id| id.index), Some(last), "{when}");
    };
    check(&|_| 1, LAST, "before");
    let evicted = log.resource_stats().mappings_evicted;
    assert!(evicted > 0);
    t.truncate_from_index(0, CUT, 0).unwrap();
    for i in CUT..=NEW_LAST {
        put(2, i);
    }
    log.sync().unwrap();
    let term_of = |i: u64| if i < CUT { 1 } else { 2 };
    check(&term_of, NEW_LAST, "after the truncation");
    drop((p, t));
    log.close().unwrap();
    assert_verifies(dir.path(), "after the truncation");
    let log = Log::open(dir.path(), tiny()).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let mut next = 1;
    while next <= NEW_LAST {
        let b = p.read_entries(next, 1 << 20).unwrap();
        for e in b.entries() {
            let e = e.unwrap();
            let fissionlog::RaftEntryBody::Records(r) = e.body else {
                panic!("reopened: entry {next} is not a record");
            };
            assert_eq!(r[0].value, body(term_of(next), next).as_slice(), "reopened");
            next += 1;
        }
    }
    assert_eq!(p.last_log_id().map(|id| id.index), Some(NEW_LAST));
    drop(p);
    log.close().unwrap();
}

/// Readers on four threads reading segments at random under a budget of
/// two, while a writer keeps rolling: every record reads back byte for
/// byte (batches and `Bytes` checked after many evictions), and the budget
/// holds at most its limits once they stop.
#[test]
fn concurrent_readers_of_constantly_evicted_segments_read_every_record_byte_for_byte() {
    const N: u64 = 64;
    const MORE: u64 = 64;
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(dir.path(), tiny()).unwrap());
    log.create_topic("t", small_segments(1)).unwrap();
    for i in 0..N {
        append(&log, 0, i, i as i64);
    }
    log.sync().unwrap();
    let readers: Vec<_> = (0..4u64)
        .map(|seed| {
            let log = log.clone();
            std::thread::spawn(move || {
                let p = log.topic("t").unwrap().partition(0).unwrap();
                let mut rng = common::crash::SplitMix64::new(seed);
                let mut held = Vec::new();
                for round in 0..400 {
                    let i = rng.below(N);
                    let b = p.read(i, 1 << 20).unwrap();
                    let r = b.iter().next().unwrap();
                    assert_eq!(r.offset, i);
                    assert_eq!(r.value, value(0, i).as_slice(), "record {i}");
                    if round % 40 == 0 {
                        held.push((i, b.value_bytes(&r)));
                    }
                }
                for (i, bytes) in held {
                    assert_eq!(&bytes[..], value(0, i).as_slice(), "held record {i}");
                }
            })
        })
        .collect();
    for i in N..N + MORE {
        append(&log, 0, i, i as i64);
    }
    for r in readers {
        r.join().unwrap();
    }
    let stats = log.resource_stats();
    assert!(stats.mappings_evicted > 100, "{stats:?}");
    assert!(
        stats.mapped_segments <= 2 && stats.open_segment_files <= 2,
        "{stats:?}"
    );
    let log = Arc::into_inner(log).unwrap();
    assert_holds(&log, 0, 0, N + MORE, "after the readers");
    log.close().unwrap();
}
