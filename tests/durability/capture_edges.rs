//! The edges of the lock-free capture of a sync round: the directory fsync
//! rule (`segment_roll`), `sync_done` and captures past the partition's
//! end, `delete_topic` marking its partitions removed, and the durable
//! ends of new partitions (C1).

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::crash::CrashOptions;
use common::faults::{install_pause_handler, pause_thread, self_thread, PAUSE_US};
use common::futures::poll_once;
use common::log::{fast_tempdir, rec};
use common::model_hook::ModelHook;
use fissionlog::{
    IoHook, IoOp, Log, LogOptions, ReadIsolation, RecoveryMode, SplitPlan, SyncPolicy, TopicConfig,
};

fn opts() -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        checkpoint_interval: Duration::from_secs(3600),
        ..LogOptions::default()
    }
}

fn small(sync: SyncPolicy) -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 4096,
        sync,
        ..TopicConfig::default()
    }
}

/// Opens power-loss images of `point` that drop the file `seg_name` and
/// reports each outcome that loses offsets below `durable` (or fails).
fn lost_after_power_loss(
    point: &common::model_hook::CrashPoint,
    seg_name: &str,
    topic: &str,
    partition: u32,
    durable: u64,
    mode: RecoveryMode,
) -> (usize, Vec<String>) {
    let mut tried = 0;
    let mut lost = Vec::new();
    for seed in 0..128u64 {
        let (image, _) = point.image(seed, &CrashOptions::default());
        if image
            .files
            .keys()
            .any(|k| k.file_name().is_some_and(|f| f == seg_name))
        {
            continue;
        }
        tried += 1;
        let out = tempfile::tempdir().unwrap();
        image.write_to(out.path()).unwrap();
        let o = LogOptions {
            recovery: mode,
            ..opts()
        };
        match Log::open(out.path(), o) {
            Ok(l) => {
                let p = l.topic(topic).unwrap().partition(partition).unwrap();
                let end = p.end_offset();
                let readable = (0..durable)
                    .filter(|&o| p.read_with(o, 1, ReadIsolation::Written).is_ok())
                    .count() as u64;
                if end < durable || readable < durable {
                    lost.push(format!(
                        "seed {seed}: opens ({mode:?}), partition ends at {end}, \
                         {readable} of offsets 0..{durable} readable (durable end was {durable})"
                    ));
                }
            }
            Err(e) => lost.push(format!("seed {seed}: open ({mode:?}) fails: {e}")),
        }
        if tried >= 4 {
            break;
        }
    }
    (tried, lost)
}

/// The segment recovery hands the writer (`WriterState::segment_roll` 0)
/// must have a durable name before the durable end enters it: after a process kill the page
/// cache still holds a segment a roll created just before (its name
/// never fsynced), recovery opens it without fsyncing the partition
/// directory (it does only after removing files), and with
/// `segment_roll == 0`, `dir_synced_rolls == 0` and no "directory
/// changed" flag, no sync round after the open fsyncs that directory
/// either, until the next roll. The open's own rounds put the segment in
/// the checkpoint; `Log::sync` then raises the durable end over records
/// appended to it. A power loss that drops the name (the per-file model,
/// the same hook kept across the kill) loses them: Strict refuses to open
/// ("the checkpoint calls durable"), Truncate opens without them.
#[test]
fn recovered_segment_name_is_made_durable_before_the_durable_end_enters_it() {
    recovered_segment_name_scenario(false);
}

/// The same when the checkpoint names the partition's older segment (a
/// clean close before the roll): the open fsyncs the directory of a
/// partition whose chain ends past the segment its checkpoint entry
/// names, and only of those.
#[test]
fn recovered_segment_past_the_checkpointed_one_is_made_durable_before_the_durable_end_enters_it() {
    recovered_segment_name_scenario(true);
}

/// With `checkpointed`, the log is closed and reopened before the roll, so
/// the checkpoint has an entry naming the first segment.
fn recovered_segment_name_scenario(checkpointed: bool) {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    // The known gap for new segments' headers is not what this probes.
    model.grant_segment_headers(true);
    let mut log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    let mut topic = log.create_topic("t", small(SyncPolicy::Never)).unwrap();
    let v = vec![7u8; 1200];
    topic.append_to(0, &rec(&v)).unwrap();
    log.sync().unwrap();
    if checkpointed {
        drop(topic);
        log.close().unwrap();
        log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
        topic = log.topic("t").unwrap();
    }
    let p = topic.partition(0).unwrap();
    // A roll, and no sync round after it: the new name is only in the
    // page cache.
    while p.segment_count() < 2 {
        topic.append_to(0, &rec(&v)).unwrap();
    }
    let newest = p.segment_infos().last().unwrap().clone();
    drop((p, topic));
    log.abandon(); // a kill: the page cache survives
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    let topic = log.topic("t").unwrap();
    let p = topic.partition(0).unwrap();
    assert_eq!(p.segment_count(), 2, "recovery kept the rolled-to segment");
    let last = topic.append_to(0, &rec(b"acked after reopen")).unwrap();
    log.sync().unwrap();
    let d = p.durable_end_offset();
    assert!(d > last, "sync covered {last}: durable end {d}");
    assert!(matches!(poll_once(topic.durable(0, last)), Some(Ok(()))));
    let point = model.now(IoOp::SyncSegment);
    drop((p, topic));
    log.abandon();
    let seg_name = newest
        .path
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let mut all = Vec::new();
    for mode in [RecoveryMode::Strict, RecoveryMode::Truncate] {
        // No image may drop the name once the open fsynced the directory
        // (then nothing is tried); any that does must lose nothing.
        let (_tried, lost) = lost_after_power_loss(&point, &seg_name, "t", 0, d, mode);
        all.extend(lost);
    }
    assert!(
        all.is_empty(),
        "Log::sync returned with durable end {d} (record {last} in segment {}, \
         recovered after a kill); the partition directory was never fsynced since the \
         roll that created it, and a power loss that drops its name loses them:\n{}",
        newest.base_offset,
        all.join("\n")
    );
}

/// The same gap seen by an `Always` append: the topic's appends before the
/// kill were all acknowledged, the kill hits a roll (the new segment is
/// there, its record's round never ran), and after the reopen every
/// `Always` append into that segment returns while its name is still not
/// durable.
#[test]
fn always_append_after_a_kill_mid_roll_survives_power_loss() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    model.grant_segment_headers(true);
    // Fails every fsync once the roll's new segment exists (a kill before
    // that append's round could fsync anything).
    let gate = Arc::new(KillAfterRoll {
        model: model.clone(),
        armed: AtomicBool::new(false),
        killed: AtomicBool::new(false),
    });
    let log = Log::open_with_hook(dir.path(), opts(), gate.clone()).unwrap();
    let topic = log.create_topic("t", small(SyncPolicy::Always)).unwrap();
    let v = vec![7u8; 1200];
    gate.armed.store(true, Ordering::Release);
    // Acknowledged appends until one rolls; that one's round fsyncs fail
    // (the "kill" came first): it is not acknowledged.
    let mut r = topic.append_to(0, &rec(&v));
    while !gate.killed.load(Ordering::Acquire) {
        r.unwrap();
        r = topic.append_to(0, &rec(&v));
    }
    assert!(
        r.is_err(),
        "the append whose round was killed returned {r:?}"
    );
    let p = topic.partition(0).unwrap();
    let newest = p.segment_infos().last().unwrap().clone();
    drop((p, topic));
    log.abandon();
    gate.armed.store(false, Ordering::Release);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    let topic = log.topic("t").unwrap();
    let acked = topic.append_to(0, &rec(b"acked")).unwrap();
    let p = topic.partition(0).unwrap();
    let d = p.durable_end_offset();
    assert!(d > acked);
    assert_eq!(
        p.segment_infos().last().unwrap().base_offset,
        newest.base_offset,
        "the acknowledged record went into the recovered segment"
    );
    let point = model.now(IoOp::SyncSegment);
    drop((p, topic));
    log.abandon();
    let seg_name = newest
        .path
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    // As above: no image may drop the name, and any that does loses nothing.
    let (_tried, lost) =
        lost_after_power_loss(&point, &seg_name, "t", 0, acked + 1, RecoveryMode::Truncate);
    assert!(
        lost.is_empty(),
        "the Always append of record {acked} returned Ok; a power loss then loses it:\n{}",
        lost.join("\n")
    );
}

/// Fails every fsync once armed and a roll created a new segment (a kill
/// right after that `Segment::create`, before any round fsynced anything).
/// (Its own hook: one op arms the failure of every later sync, which the kit
/// cannot.)
struct KillAfterRoll {
    model: Arc<ModelHook>,
    armed: AtomicBool,
    killed: AtomicBool,
}

impl std::fmt::Debug for KillAfterRoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KillAfterRoll")
    }
}

impl IoHook for KillAfterRoll {
    fn before(&self, op: IoOp, path: &Path) -> std::io::Result<()> {
        if self.armed.load(Ordering::Acquire) {
            if op == IoOp::AllocateSegment {
                self.killed.store(true, Ordering::Release);
            } else if self.killed.load(Ordering::Acquire) && common::model_hook::is_sync(op) {
                return Err(std::io::Error::other("killed"));
            }
        }
        self.model.before(op, path)
    }

    fn after(&self, op: IoOp, path: &Path, result: std::io::Result<()>) -> std::io::Result<()> {
        self.model.after(op, path, result)
    }
}

fn budget() -> Duration {
    Duration::from_millis(
        std::env::var("PROBE_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3000),
    )
}

/// `publish_written` stores the position cell, then `end_offset`. A
/// round whose capture reads the cell in between (the appender preempted
/// there, under its writer lock, in the middle of its next append) and
/// whose `sync_done` runs before the appender resumes sees
/// `cap.pos.end_offset > end_offset` and takes the capture for one from
/// before a reclaim: it moves neither the durable position nor
/// `durable_end`, although its fsyncs covered every record below the
/// capture, including ones whose `append_to` had returned before the
/// `Log::sync` call began. So `Log::sync` returns with the durable end
/// below records it covered: durable reads and `Topic::durable` futures
/// wait for another round (with `SyncPolicy::Never` and no other sync,
/// for ever). Signals preempt the appender at random points to widen the
/// window (a few instructions). Only records whose append returned before
/// the sync began count (an append in flight may legitimately be missed:
/// `end_offset` is published before `mark_dirty` lists the partition).
#[test]
#[ignore = "race, ~1 run in 2 fails within 3 s on 2 cores; PROBE_MS sets the budget"]
fn sync_returns_with_the_durable_end_covering_appends_returned_before_it() {
    let _serial = common::log::serial();
    PAUSE_US.store(400, Ordering::Relaxed);
    install_pause_handler(libc::SIGUSR2);
    let dir = fast_tempdir();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 8 << 20,
                sync: SyncPolicy::Never,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let p = topic.partition(0).unwrap();
    let stop = AtomicBool::new(false);
    let target = AtomicU64::new(0);
    // End of the records whose append returned.
    let returned = AtomicU64::new(0);
    let found = std::thread::scope(|s| {
        let appender = s.spawn(|| {
            target.store(self_thread(), Ordering::Release);
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) {
                let off = topic.append_to(0, &rec(b"0123456789")).unwrap();
                returned.store(off + 1, Ordering::SeqCst);
                n += 1;
            }
            n
        });
        while target.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        let t = target.load(Ordering::Acquire);
        let stop_ref = &stop;
        let pauser =
            s.spawn(move || pause_thread(t, libc::SIGUSR2, stop_ref, 0x5eed_0002, (100, 300)));
        let start = Instant::now();
        let mut rounds = 0u64;
        let mut found = None;
        while start.elapsed() < budget() {
            // Only rounds with a returned record to cover.
            while returned.load(Ordering::SeqCst) <= p.durable_end_offset()
                && start.elapsed() < budget()
            {
                std::hint::spin_loop();
            }
            let e = returned.load(Ordering::SeqCst);
            log.sync().unwrap();
            rounds += 1;
            let d = p.durable_end_offset();
            if d < e {
                let fut = poll_once(topic.durable(0, e - 1));
                found = Some((e, d, p.end_offset(), fut));
                break;
            }
        }
        stop.store(true, Ordering::Release);
        let sent = pauser.join().unwrap();
        let appends = appender.join().unwrap();
        eprintln!("{rounds} rounds, {appends} appends, {sent} pauses");
        found.map(|f| (rounds, f))
    });
    if let Some((rounds, (e, d, now, fut))) = found {
        panic!(
            "round {rounds}: the appends of offsets below {e} had returned before Log::sync \
             was called, yet it returned with durable end {d} (end now {now}): the round's \
             capture was ignored as past the partition's end; durable({}) polled then: {fut:?}",
            e - 1
        );
    }
}

/// The same with `SyncPolicy::Always`: three appenders on one partition (more
/// threads than the machine's two cores, so appenders are preempted at
/// random points, among them the few instructions between an appender's
/// cell store and its `end_offset` store, under the writer lock). After
/// each `append_to` returns, the partition's durable end must cover the
/// record (what `concurrent_writers` checks): it does not when the
/// round that served it captured the preempted appender's cell and was
/// ignored by `sync_done`.
#[test]
#[ignore = "race, ~1 run in 2 fails within 3 s on 2 cores; PROBE_MS sets the budget"]
fn always_append_returns_with_the_durable_end_covering_it_under_preemption() {
    let dir = fast_tempdir();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 8 << 20,
                sync: SyncPolicy::Always,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let p = topic.partition(0).unwrap();
    let stop = AtomicBool::new(false);
    let broken = std::sync::Mutex::new(None);
    let start = Instant::now();
    let counts: Vec<u64> = std::thread::scope(|s| {
        let run = || {
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) && start.elapsed() < budget() {
                let off = topic.append_to(0, &rec(b"0123456789")).unwrap();
                let d = p.durable_end_offset();
                n += 1;
                if d <= off {
                    let fut = poll_once(topic.durable(0, off));
                    *broken.lock().unwrap() = Some((off, d, fut));
                    stop.store(true, Ordering::Release);
                }
            }
            n
        };
        let hs: Vec<_> = (0..3).map(|_| s.spawn(run)).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eprintln!("appends per thread: {counts:?}");
    if let Some((off, d, fut)) = broken.into_inner().unwrap() {
        panic!(
            "the Always append of record {off} returned Ok with the durable end at {d}; \
             durable({off}) polled then: {fut:?}"
        );
    }
}

/// A topic deleted and re-created under the same name gets a new id,
/// new directories and new `Partition`s: the old ones being marked removed
/// touches none of the new topic's data. Rounds keep working while the
/// old handle still appends (its partitions are skipped), and everything
/// acknowledged in the new topic (rolls included) survives a power loss.
#[test]
fn recreated_topic_is_synced_while_the_old_handle_lives() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    model.grant_segment_headers(true);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    let old = log.create_topic("t", small(SyncPolicy::Always)).unwrap();
    let v = vec![3u8; 1200];
    for _ in 0..5 {
        old.append_to(0, &rec(&v)).unwrap();
    }
    log.delete_topic("t").unwrap();
    let new = log.create_topic("t", small(SyncPolicy::Always)).unwrap();
    assert_ne!(old.id(), new.id());
    let mut acked = 0;
    for i in 0..12 {
        acked = new.append_to(0, &rec(&v)).unwrap() + 1;
        // The old handle keeps appending (accepted or refused: either way
        // the rounds must go on).
        let _ = old.append_to(0, &rec(&v));
        if i % 4 == 3 {
            log.sync().unwrap();
        }
    }
    let p = new.partition(0).unwrap();
    assert!(p.segment_count() > 2, "rolls in the new topic");
    assert!(p.durable_end_offset() >= acked);
    let point = model.now(IoOp::SyncSegment);
    drop((p, new, old));
    log.abandon();
    for seed in 0..16u64 {
        let (image, _) = point.image(seed, &CrashOptions::default());
        let out = tempfile::tempdir().unwrap();
        image.write_to(out.path()).unwrap();
        let l = Log::open(out.path(), opts())
            .unwrap_or_else(|e| panic!("seed {seed}: open fails: {e}"));
        assert_eq!(l.topics(), vec!["t".to_string()]);
        let p = l.topic("t").unwrap().partition(0).unwrap();
        for o in 0..acked {
            p.read_with(o, 1, ReadIsolation::Written)
                .unwrap_or_else(|e| panic!("seed {seed}: acked offset {o} lost: {e}"));
        }
    }
}

/// An `Always` append through the handle of a deleted topic is not
/// acknowledged as durable: the partition is marked removed, so the round
/// it waits for skips it (no fsync at all, its directory is gone), and
/// nothing of it can survive (C1); `Topic::durable` for the same offset
/// says `UnknownTopic`.
#[test]
fn always_append_through_a_deleted_topic_handle_is_not_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let old = log.create_topic("t", small(SyncPolicy::Always)).unwrap();
    old.append_to(0, &rec(b"before")).unwrap();
    log.delete_topic("t").unwrap();
    let r = old.append_to(0, &rec(b"after the delete"));
    let fut = r
        .as_ref()
        .ok()
        .and_then(|&off| poll_once(old.durable(0, off)));
    assert!(
        r.is_err(),
        "the Always append through the deleted topic's handle returned {r:?}; \
         durable() of that offset: {fut:?}"
    );
}

/// New partitions (split, merge, tail split with children that roll
/// while the copy fills them, and the reclaim that sends the parent's
/// writer back to an older segment): after `Log::sync`, every record
/// below each partition's durable end survives every power-loss image of
/// the per-file model (Strict open, all readable).
#[test]
fn durable_ends_of_split_merge_and_tail_split_partitions_survive_power_loss() {
    use common::tail::append_big;
    use fissionlog::TailSplitOptions;
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    model.grant_segment_headers(true);
    let o = || LogOptions {
        topic_hash_seed: Some(7),
        ..opts()
    };
    let log = Log::open_with_hook(dir.path(), o(), model.clone()).unwrap();
    let cfg = TopicConfig {
        partitions: 1,
        segment_bytes: 8192,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    };
    let t = log.create_topic("t", cfg).unwrap();
    append_big(&t, 0, 40, 11);
    log.sync().unwrap();
    // Tail split from 10: children get ~30 KiB each way and roll.
    let out = t
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(10))
        .unwrap();
    append_big(&t, 40, 30, 11);
    log.sync().unwrap();
    let rec_out = t.reclaim_tail(0).unwrap();
    // A forward split of the first child, then merge its children back.
    let kids = t.split(out.children[0], SplitPlan::Even).unwrap();
    append_big(&t, 70, 30, 11);
    let merged = t.merge(kids[0], kids[1]).unwrap();
    append_big(&t, 100, 30, 11);
    log.sync().unwrap();
    let mut want = Vec::new();
    for info in t.partitions() {
        let p = t.partition(info.id).unwrap();
        let d = p.durable_end_offset().min(p.end_offset());
        want.push((info.id, p.start_offset(), d, p.segment_count()));
    }
    eprintln!("reclaim {rec_out:?}; merged {merged}; partitions {want:?}");
    let point = model.now(IoOp::SyncSegment);
    drop(t);
    log.abandon();
    for seed in 0..24u64 {
        let (image, _) = point.image(seed, &CrashOptions::default());
        let out = tempfile::tempdir().unwrap();
        image.write_to(out.path()).unwrap();
        let l =
            Log::open(out.path(), o()).unwrap_or_else(|e| panic!("seed {seed}: open fails: {e}"));
        let t = l.topic("t").unwrap();
        for &(id, start, d, _) in &want {
            let p = t.partition(id).unwrap();
            for off in start..d {
                p.read_with(off, 1, ReadIsolation::Written)
                    .unwrap_or_else(|e| {
                        panic!(
                            "seed {seed}: partition {id} offset {off} (durable end {d}) lost: {e}"
                        )
                    });
            }
        }
    }
}
