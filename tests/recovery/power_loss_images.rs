//! Power-loss images around the storage, recovery and sync paths: a cut
//! past a lost tail, a salvage hole, the retention floor and a failed
//! checkpoint write. Each test states the contract it checks.

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::crash::{CrashOptions, DirImage};
use common::durable::crash_image;
use common::faults::Gate;
use common::model_hook::ModelHook;
use fissionlog::{
    Error, Log, LogOptions, NewRecord, RecoveryMode, StartAt, SyncPolicy, TopicConfig,
};
use fissionlog::{IoHook, IoOp};

fn opts(recovery: RecoveryMode) -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        recovery,
        ..LogOptions::default()
    }
}

fn put(log: &Log, topic: &str, partition: u32, tag: u8, from: u64, n: u64) {
    let t = log.topic(topic).unwrap();
    for i in from..from + n {
        let value = vec![tag; 40 + (i % 50) as usize];
        let at = t
            .append_to(
                partition,
                &[NewRecord {
                    key: Some(b"k"),
                    value: &value,
                    timestamp: Some(i as i64),
                }],
            )
            .unwrap();
        assert_eq!(at, i, "offsets are dense");
    }
}

/// A power loss that keeps exactly what the model calls durable: every
/// file as of its own last fsync, every directory as of its last fsync.
fn power_loss_image(hook: &ModelHook) -> DirImage {
    let cp = hook.now(IoOp::SyncSegment);
    crash_image(&cp.durable, &cp.durable.nodes, 0, &CrashOptions::default())
}

fn write_image(image: &DirImage, to: &Path) {
    image.write_to(to).unwrap();
}

/// C8: a Cut taken by a reader that started at `StartAt::Latest` names the
/// written end, which may lie past what is durable. A power loss cuts that
/// tail and later appends reuse the offsets: resuming from the cut must
/// not silently skip the new records below its position (a typed error, or
/// the records delivered). Today the cut carries no fingerprint for such a
/// position, so `check_position` only checks `pos <= end` and the reader
/// resumes past records it never saw. Fixed: a `Latest` position carries
/// the fingerprint of the record before it.
#[test]
fn latest_cut_past_a_lost_tail_is_not_silently_resumed() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir(&dir).unwrap();
    let hook = ModelHook::new(&dir, None);
    let log = Log::open_with_hook(&dir, opts(RecoveryMode::Strict), hook.clone()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    put(&log, "t", 0, 1, 0, 10);
    log.sync().unwrap();
    // Written, not synced.
    put(&log, "t", 0, 2, 10, 5);
    let cut = log
        .topic("t")
        .unwrap()
        .reader(StartAt::Latest)
        .unwrap()
        .cut();
    assert_eq!(cut.positions.get(&0), Some(&15));
    let image = power_loss_image(&hook);
    log.abandon();
    let after = root.path().join("after");
    write_image(&image, &after);
    let log = Log::open(&after, opts(RecoveryMode::Strict)).unwrap();
    let t = log.topic("t").unwrap();
    assert_eq!(
        t.partition(0).unwrap().end_offset(),
        10,
        "the unsynced tail is gone"
    );
    // New records reuse offsets 10..20.
    put(&log, "t", 0, 3, 10, 10);
    match t.reader(StartAt::Cut(cut)) {
        Err(Error::PositionLost { .. }) => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(mut r) => {
            let got = r.poll(100).unwrap();
            let first = got.first().map(|r| r.offset);
            assert_eq!(
                first,
                Some(10),
                "resumed from the cut at {first:?}: records 10..15 appended after the \
                 crash were skipped without an error"
            );
        }
    }
}

/// C7: a Salvage open (with a full scan, as `fissionlog recover --mode
/// salvage` runs it) replaces damaged batches in synced data with a hole
/// batch, and reports the log repaired. The hole is written with `pwrite`
/// and never fsynced, while the segment counts as synced up to its end
/// (`set_recovered_end(.., synced = end_pos, ..)` for a segment below the
/// checkpoint's), so no sync round ever covers it. A power loss after the
/// open brings the damaged bytes back: a strict full-scan open (and
/// `verify`) refuses the log again, and reads of the range return a
/// checksum error instead of the hole. Fixed: recovery fdatasyncs a
/// segment it wrote holes into.
#[test]
fn salvage_hole_survives_a_power_loss_after_the_repair() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    {
        let log = Log::open(&dir, opts(RecoveryMode::Strict)).unwrap();
        log.create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 8192,
                ..TopicConfig::default()
            },
        )
        .unwrap();
        put(&log, "t", 0, 1, 0, 300);
        log.close().unwrap();
    }
    // Damage a batch in the middle of the first (sealed, synced) segment.
    let pdir = dir.join("topics/t0/p0");
    let seg0 = pdir.join("00000000000000000000.seg");
    let len = std::fs::metadata(&seg0).unwrap().len();
    assert!(len > 2048, "first segment holds several batches");
    common::crash::flip_byte(&dir, seg0.strip_prefix(&dir).unwrap(), len / 2);
    let salvage = LogOptions {
        full_scan: true,
        ..opts(RecoveryMode::Salvage)
    };
    let hook = ModelHook::new(&dir, None);
    let log = Log::open_with_hook(&dir, salvage, hook.clone()).unwrap();
    assert!(
        !log.recovery_report().holes.is_empty(),
        "salvage recorded a hole"
    );
    log.sync().unwrap();
    let image = power_loss_image(&hook);
    log.close().unwrap();
    let after = root.path().join("after");
    write_image(&image, &after);
    let strict_full = LogOptions {
        full_scan: true,
        ..opts(RecoveryMode::Strict)
    };
    if let Err(e) = Log::open(&after, strict_full) {
        panic!("the salvaged log no longer opens after a power loss: {e}");
    }
}

/// C7 (and the retention contract "the new floors reach the checkpoint,
/// durably, before any file goes"): `enforce_retention` raises a
/// partition's floor, calls `request_checkpoint` and then `sync`. A sync
/// round that was already running (here: an unrelated `Log::sync` whose
/// capture waited for another partition's writer lock during a roll) takes
/// the request in `checkpoint_due` and writes a checkpoint from entries it
/// cached *before* the floor moved (the retained partition was not in that
/// round's dirty set, and with more than 64 partitions the round-robin
/// refresh does not reach it). The round `sync` then waits for has no
/// request left and the interval is not due, so it writes no checkpoint;
/// the files are unlinked anyway. After a process kill, the newest
/// checkpoint still has the old floor and the first segments are gone:
/// a strict open refuses the log as "missing data". Fixed: a round takes
/// the request before its dirty list (`Core::take_checkpoint_request`).
#[test]
fn retention_floor_is_durable_before_files_go_with_a_concurrent_sync() {
    let root = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let dir = root.path().join("log");
    {
        let log = Log::open(&dir, opts(RecoveryMode::Strict)).unwrap();
        // Topic id 0: the retained partition, first in the checkpoint cache.
        log.create_topic(
            "ret",
            TopicConfig {
                partitions: 1,
                segment_bytes: 4096,
                retention_bytes: Some(1),
                sync: SyncPolicy::Never,
                ..TopicConfig::default()
            },
        )
        .unwrap();
        put(&log, "ret", 0, 1, 0, 200);
        // More partitions than one round refreshes (64).
        log.create_topic(
            "busy",
            TopicConfig {
                partitions: 200,
                segment_bytes: 4096,
                sync: SyncPolicy::Never,
                ..TopicConfig::default()
            },
        )
        .unwrap();
        log.close().unwrap();
    }
    // Blocks the first `CreateSegment` of busy/p5 once armed, until
    // released: the appender rolling that partition then holds its writer
    // lock.
    let gate = Arc::new(
        Gate::new(IoOp::CreateSegment)
            .in_path("/t1/p5")
            .disarmed()
            .at_most(Duration::from_secs(60)),
    );
    let slow = LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..opts(RecoveryMode::Strict)
    };
    let log = Log::open_with_hook(&dir, slow, gate.clone()).unwrap();
    let ret = log.topic("ret").unwrap().partition(0).unwrap();
    let first_kept = ret.segment_infos().last().unwrap().base_offset;
    assert!(first_kept > 0, "the retained partition has rolled segments");
    drop(ret);
    let busy = log.topic("busy").unwrap();
    let big = vec![7u8; 2500];
    busy.append_to(
        5,
        &[NewRecord {
            key: None,
            value: &big,
            timestamp: None,
        }],
    )
    .unwrap();
    gate.arm();
    let (sync_started, retention_started) = (AtomicBool::new(false), AtomicBool::new(false));
    let retired = std::thread::scope(|s| {
        // Rolls busy/p5 and blocks in the new segment's creation, holding
        // the partition's writer lock.
        let roller = s.spawn(|| {
            busy.append_to(
                5,
                &[NewRecord {
                    key: None,
                    value: &big,
                    timestamp: None,
                }],
            )
            .unwrap();
        });
        assert!(
            gate.wait_reached(Duration::from_secs(60)),
            "the roll never reached the gate"
        );
        // A sync round that took busy/p5 from the dirty list and waits for
        // its writer lock to capture it.
        // Each thread gets 300 ms from when it runs, not from its spawn (a
        // loaded machine may start it late).
        let entered = |flag: &AtomicBool| {
            assert!(
                common::faults::wait_flag(flag, Duration::from_secs(10)),
                "the thread never ran"
            );
            std::thread::sleep(Duration::from_millis(300));
        };
        let syncer = s.spawn(|| {
            sync_started.store(true, Ordering::Release);
            log.sync().unwrap()
        });
        entered(&sync_started);
        let retention = s.spawn(|| {
            retention_started.store(true, Ordering::Release);
            log.enforce_retention().unwrap()
        });
        entered(&retention_started);
        gate.release();
        roller.join().unwrap();
        syncer.join().unwrap();
        retention.join().unwrap()
    });
    assert!(retired > 0, "retention deleted segments");
    // Later rounds sync the deletions (no checkpoint is due).
    log.sync().unwrap();
    drop(busy);
    log.abandon();
    let log = match Log::open(&dir, opts(RecoveryMode::Strict)) {
        Ok(log) => log,
        Err(e) => panic!("strict open after retention and a kill: {e}"),
    };
    let p = log.topic("ret").unwrap().partition(0).unwrap();
    assert_eq!(p.start_offset(), first_kept);
    assert_eq!(p.end_offset(), 200);
}

/// Emulates a checkpoint write that fails part way (ENOSPC while the file
/// grows: the first bytes are overwritten, then the write fails), and
/// captures a power-loss image while the next checkpoint is being synced.
/// (Its own hook: it writes part of the file before failing and captures an
/// image, which the kit cannot.)
#[derive(Debug)]
struct CheckpointFault {
    root: std::path::PathBuf,
    fail_next_write: std::sync::atomic::AtomicBool,
    capture_next_sync: std::sync::atomic::AtomicBool,
    /// Each checkpoint file's content before the write in progress (what
    /// its last fsync made durable: every earlier round synced it).
    before_write: Mutex<std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>>,
    image: Mutex<Option<DirImage>>,
}

impl IoHook for CheckpointFault {
    fn before(&self, op: IoOp, path: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        use std::sync::atomic::Ordering;
        match op {
            IoOp::WriteCheckpoint => {
                let old = std::fs::read(path).unwrap_or_default();
                self.before_write
                    .lock()
                    .unwrap()
                    .insert(path.to_path_buf(), old);
                if self.fail_next_write.swap(false, Ordering::SeqCst) {
                    let f = std::fs::OpenOptions::new().write(true).open(path)?;
                    f.write_all_at(&[0xA5; 512], 0)?;
                    return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
                }
            }
            IoOp::SyncCheckpoint if self.capture_next_sync.swap(false, Ordering::SeqCst) => {
                // Power loss during this fsync: the file being synced is
                // torn (its first sector new, the rest as durable), every
                // other file as the page cache holds it.
                let mut img = DirImage::capture(&self.root)?;
                let rel = path.strip_prefix(&self.root).unwrap().to_path_buf();
                let new = img.files[&rel].clone();
                let mut torn = self.before_write.lock().unwrap()[path].clone();
                torn.resize(torn.len().max(new.len()), 0);
                torn[..512.min(new.len())].copy_from_slice(&new[..512.min(new.len())]);
                torn.truncate(new.len());
                img.files.insert(rel, torn);
                *self.image.lock().unwrap() = Some(img);
            }
            _ => {}
        }
        Ok(())
    }
}

/// The two checkpoint files alternate so that a power loss while one is
/// written leaves the other valid. `CheckpointFiles::write` advances its
/// sequence number (and so the slot) before writing: after a write that
/// failed part way, the next round writes the *other* file, the only one
/// still valid, and a power loss during that write leaves no valid
/// checkpoint at all. A log whose manifest knows partitions then opens as
/// "checkpoint lost" (strict refuses any torn tail, retention floors are
/// forgotten). Expected: the retry goes to the damaged slot (fixed:
/// `CheckpointFiles::write` advances the sequence only on success).
#[test]
fn failed_checkpoint_write_never_leaves_both_files_invalid() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir(&dir).unwrap();
    let hook = Arc::new(CheckpointFault {
        root: dir.clone(),
        fail_next_write: Default::default(),
        capture_next_sync: Default::default(),
        before_write: Mutex::default(),
        image: Mutex::default(),
    });
    let every_round = LogOptions {
        checkpoint_interval: Duration::ZERO,
        ..opts(RecoveryMode::Strict)
    };
    let log = Log::open_with_hook(&dir, every_round, hook.clone()).unwrap();
    // Enough partitions for a checkpoint of several sectors.
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 16,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    // The last entry of the checkpoint (past its first sector) changes.
    put(&log, "t", 15, 1, 0, 10);
    log.sync().unwrap();
    log.sync().unwrap();
    use std::sync::atomic::Ordering;
    hook.fail_next_write.store(true, Ordering::SeqCst);
    put(&log, "t", 15, 2, 10, 5);
    assert!(
        log.sync().is_err(),
        "the failed checkpoint write is reported"
    );
    hook.capture_next_sync.store(true, Ordering::SeqCst);
    log.sync().unwrap();
    let image = hook
        .image
        .lock()
        .unwrap()
        .take()
        .expect("a checkpoint sync ran");
    log.abandon();
    let after = root.path().join("after");
    write_image(&image, &after);
    let log = Log::open(&after, opts(RecoveryMode::Strict)).unwrap();
    assert!(
        log.recovery_report().checkpoint_found,
        "no valid checkpoint survived a power loss during one checkpoint write"
    );
}
