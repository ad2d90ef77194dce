//! A sync round captures each partition's end without the writer lock:
//! the capture never reports something durable that a power loss could
//! still take back (C1).

use crate::common;
use common::log::quiet;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::crash::CrashOptions;
use common::faults::{install_pause_handler, pause_thread, self_thread, wait_flag};
use common::futures::poll_once;
use common::log::fast_tempdir;
use common::model_hook::ModelHook;
use fissionlog::{IoHook, IoOp, Log, LogOptions, NewRecord, RecoveryMode, SyncPolicy, TopicConfig};

/// Sees when each segment file was created and when each directory fsync
/// started and completed, on one global sequence: a file's name is durable
/// once a directory fsync that started after the file existed completed.
/// (Its own hook: it orders creations and directory fsyncs on one sequence,
/// which the kit cannot.)
#[derive(Debug, Default)]
struct NameHook {
    seq: AtomicU64,
    /// Segment path -> sequence number when its file existed (the first
    /// `AllocateSegment`, which `Segment::create` issues after the create).
    created: Mutex<HashMap<PathBuf, u64>>,
    /// Segments in creation order: (base offset, path).
    order: Mutex<Vec<(u64, PathBuf)>>,
    /// (thread, dir) -> start of the directory fsync in flight.
    pending: Mutex<HashMap<(std::thread::ThreadId, PathBuf), u64>>,
    /// Dir -> latest start of a directory fsync that completed.
    dir_done: Mutex<HashMap<PathBuf, u64>>,
}

fn is_dir_sync(op: IoOp) -> bool {
    matches!(
        op,
        IoOp::SyncDir | IoOp::SyncRollDir | IoOp::SyncNewDir | IoOp::SyncRecoveryDir
    )
}

impl IoHook for NameHook {
    fn before(&self, op: IoOp, path: &Path) -> std::io::Result<()> {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        if op == IoOp::AllocateSegment {
            let mut c = self.created.lock().unwrap();
            if !c.contains_key(path) {
                c.insert(path.to_path_buf(), n);
                let base = path
                    .file_name()
                    .and_then(|f| f.to_str())
                    .and_then(|f| f.strip_suffix(".seg"))
                    .and_then(|f| f.parse().ok());
                if let Some(base) = base {
                    self.order.lock().unwrap().push((base, path.to_path_buf()));
                }
            }
        } else if is_dir_sync(op) {
            if op == IoOp::SyncRollDir {
                // Slow: a roll's directory fsync (which covers the names of
                // the segments before it) must not complete between a
                // round and the check that follows it, or it would hide a
                // round that raised the durable end without one.
                std::thread::sleep(Duration::from_millis(5));
            }
            self.pending
                .lock()
                .unwrap()
                .insert((std::thread::current().id(), path.to_path_buf()), n);
        }
        Ok(())
    }

    fn after(&self, op: IoOp, path: &Path, result: std::io::Result<()>) -> std::io::Result<()> {
        if is_dir_sync(op) && result.is_ok() {
            let start = self
                .pending
                .lock()
                .unwrap()
                .remove(&(std::thread::current().id(), path.to_path_buf()));
            if let Some(s) = start {
                let mut d = self.dir_done.lock().unwrap();
                let e = d.entry(path.to_path_buf()).or_insert(0);
                *e = (*e).max(s);
            }
        }
        result
    }
}

impl NameHook {
    /// The `n` segments created last: (base offset, path).
    fn newest(&self, n: usize) -> Vec<(u64, PathBuf)> {
        let o = self.order.lock().unwrap();
        o[o.len().saturating_sub(n)..].to_vec()
    }

    /// Whether the name of segment `path` is durable now.
    fn name_durable(&self, path: &Path) -> bool {
        let Some(c) = self.created.lock().unwrap().get(path).copied() else {
            // Not created through the hook (none in these tests).
            return true;
        };
        let dir = path.parent().unwrap();
        self.dir_done
            .lock()
            .unwrap()
            .get(dir)
            .is_some_and(|&s| s > c)
    }
}

/// Forwards every op to a [`NameHook`] and, when there is one, to a
/// [`ModelHook`] (the per-file power-loss model).
/// (Its own hook, not `faults::Both`: the model is optional and the names see
/// the model's result.)
#[derive(Debug)]
struct Both {
    names: Arc<NameHook>,
    model: Option<Arc<ModelHook>>,
}

impl IoHook for Both {
    fn before(&self, op: IoOp, path: &Path) -> std::io::Result<()> {
        self.names.before(op, path)?;
        match &self.model {
            Some(m) => m.before(op, path),
            None => Ok(()),
        }
    }

    fn after(&self, op: IoOp, path: &Path, result: std::io::Result<()>) -> std::io::Result<()> {
        let result = match &self.model {
            Some(m) => m.after(op, path, result),
            None => result,
        };
        self.names.after(op, path, result)
    }
}

/// What [`race_rolls_with_rounds`] saw: the first round after which the
/// durable end covered a segment whose name was not durable, if any.
struct Race {
    rounds: u64,
    /// (durable end, base of the segment whose name was not durable).
    broken: Option<(u64, u64)>,
}

/// One appender rolls every three appends (4 KiB segments, 1200-byte
/// records, `SyncPolicy::Never`) while this thread runs a `Log::sync` round
/// after each append it notices; after each round, every segment holding
/// records below the durable end must have a durable name. Stops at the
/// first round that breaks that, or after the time budget (`PROBE_MS`,
/// default 3000). On a break, `at_break` runs at once (the appender still
/// going, but its next directory fsync still sleeping in the hook).
fn race_rolls_with_rounds(
    log: &Log,
    topic: &fissionlog::Topic,
    names: &NameHook,
    at_break: impl FnOnce(u64),
) -> Race {
    // The pause handler and its length are the process's.
    let _serial = common::log::serial();
    let stop = AtomicBool::new(false);
    let appended = AtomicU64::new(0);
    let budget = Duration::from_millis(
        std::env::var("PROBE_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3000),
    );
    // Under a debugger (see the first race test's doc) the pauses come
    // from the debugger.
    let pauses = std::env::var_os("PROBE_NO_PAUSES").is_none();
    let pause_stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let pauser = pauses.then(|| {
            install_pause_handler(libc::SIGUSR1);
            let target = self_thread();
            let stop = &pause_stop;
            s.spawn(move || pause_thread(target, libc::SIGUSR1, stop, 0x5eed_0001, (300, 200)))
        });
        let appender = s.spawn(|| {
            let v = vec![7u8; 1200];
            let rec = [NewRecord {
                key: None,
                value: &v,
                timestamp: None,
            }];
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) {
                topic.append_to(0, &rec).unwrap();
                n += 1;
                appended.store(n, Ordering::Release);
            }
            n
        });
        let p = topic.partition(0).unwrap();
        let start = Instant::now();
        let mut rounds = 0u64;
        let mut broken = None;
        let mut seen = 0;
        let mut at_break = Some(at_break);
        while start.elapsed() < budget && broken.is_none() {
            // Only rounds with something to capture.
            while appended.load(Ordering::Acquire) == seen && start.elapsed() < budget {
                std::hint::spin_loop();
            }
            seen = appended.load(Ordering::Acquire);
            log.sync().unwrap();
            rounds += 1;
            let d = p.durable_end_offset();
            // The newest few: older ones were checked after earlier rounds.
            for (base, path) in names.newest(6) {
                if base < d && !names.name_durable(&path) {
                    broken = Some((d, base));
                    (at_break.take().unwrap())(d);
                    break;
                }
            }
        }
        stop.store(true, Ordering::Release);
        pause_stop.store(true, Ordering::Release);
        let signals = pauser.map_or(0, |h| h.join().unwrap());
        let appends = appender.join().unwrap();
        eprintln!(
            "{rounds} rounds, {appends} appends, {} segments, {signals} pauses",
            p.segment_count()
        );
        Race { rounds, broken }
    })
}

fn rolling_topic(log: &Log) -> fissionlog::Topic {
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: 4096,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        },
    )
    .unwrap()
}

/// A round's capture must not swap the `dir_dirty` flag before it loads
/// the published position (`capture_unsynced`). A roll in
/// between (its flag stored after the swap, its position published before
/// the load) would give a capture whose position lies in the new segment
/// but whose `sync_dir` is false: the round would fdatasync the new
/// segment, raise the durable end into it, and not fsync the directory
/// that names it. The capture reads the roll count after the position and
/// fsyncs the directory unless a completed directory fsync covers that
/// count.
///
/// The window is a few instructions, so without help this passes almost
/// always (signals pause the round at random points to widen the odds a
/// little): it is opt-in. A debugger stopping the round right after the
/// swap (while the appender goes on) makes the race certain; set
/// `PROBE_NO_PAUSES=1` then, so the pauses come from the debugger alone.
#[test]
#[ignore = "narrow race, ~3 s: made certain under a debugger (see the comment)"]
fn durable_end_never_covers_a_segment_whose_name_is_not_synced() {
    let dir = fast_tempdir();
    let names = Arc::new(NameHook::default());
    let hook = Arc::new(Both {
        names: names.clone(),
        model: None,
    });
    let log = Log::open_with_hook(dir.path(), quiet(), hook).unwrap();
    let topic = rolling_topic(&log);
    let race = race_rolls_with_rounds(&log, &topic, &names, |_| {});
    assert!(race.rounds > 0);
    if let Some((d, base)) = race.broken {
        panic!(
            "round {}: durable end {d} covers segment {base} (records {base}..{d}) \
             whose name no completed directory fsync covers",
            race.rounds
        );
    }
}

/// The same race, end to end: once it happened, a `Topic::durable` future
/// for the last record resolves `Ok` (C1 promises that record survives a
/// power loss), yet a power-loss image from the per-file model that drops
/// the new segment's name (its directory was never fsynced since) opens
/// without it. Passes unless the race happened (see the test above on
/// making it certain).
#[test]
#[ignore = "narrow race, ~3 s: reproduced under a debugger (see the first race test)"]
fn durable_future_record_survives_power_loss_after_racing_roll() {
    let dir = fast_tempdir();
    let names = Arc::new(NameHook::default());
    let model = ModelHook::new(dir.path(), None);
    // The known gap for new segments' headers is not what this probes.
    model.grant_segment_headers(true);
    let hook = Arc::new(Both {
        names: names.clone(),
        model: Some(model.clone()),
    });
    let log = Log::open_with_hook(dir.path(), quiet(), hook).unwrap();
    let topic = rolling_topic(&log);
    let point = Mutex::new(None);
    let race = race_rolls_with_rounds(&log, &topic, &names, |d| {
        // At once: the appender's next directory fsync sleeps in the hook.
        let fut = topic.durable(0, d - 1);
        let resolved = poll_once(fut);
        *point.lock().unwrap() = Some((model.now(IoOp::SyncSegment), resolved));
    });
    let Some((d, base)) = race.broken else {
        return;
    };
    let (point, resolved) = point.into_inner().unwrap().unwrap();
    assert!(
        matches!(resolved, Some(Ok(()))),
        "the durable future of record {} did not resolve Ok: {resolved:?}",
        d - 1
    );
    drop(topic);
    drop(log);
    let seg_name = format!("{base:020}.seg");
    let mut lost = Vec::new();
    for seed in 0..64u64 {
        let (image, trace) = point.image(seed, &CrashOptions::default());
        let dropped = !image
            .files
            .keys()
            .any(|k| k.file_name().is_some_and(|f| f == seg_name.as_str()));
        if !dropped {
            continue;
        }
        let out = tempfile::tempdir().unwrap();
        image.write_to(out.path()).unwrap();
        let o = LogOptions {
            recovery: RecoveryMode::Truncate,
            ..quiet()
        };
        let end = match Log::open(out.path(), o) {
            Ok(l) => l.topic("t").unwrap().partition(0).unwrap().end_offset(),
            Err(e) => {
                lost.push(format!("seed {seed}: open failed: {e}"));
                continue;
            }
        };
        if end < d {
            lost.push(format!(
                "seed {seed}: partition ends at {end} after the power loss; \
                 durable end was {d} (segment {base}'s name dropped; trace: {})",
                trace
                    .iter()
                    .filter(|t| t.contains(&seg_name))
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        if lost.len() >= 2 {
            break;
        }
    }
    assert!(
        lost.is_empty(),
        "records reported durable were lost:\n{}",
        lost.join("\n")
    );
}

/// A [`NameHook`] that can also hold the first directory fsync of
/// `topics/t0/p0` (the one a split's `sync_locked` issues) until released.
/// (Its own hook: the gate sits between the names and the model, on one armed
/// flag.)
#[derive(Debug, Default)]
struct SealGate {
    names: NameHook,
    model: Option<Arc<ModelHook>>,
    armed: AtomicBool,
    blocked: AtomicBool,
    release: AtomicBool,
}

impl IoHook for SealGate {
    fn before(&self, op: IoOp, path: &Path) -> std::io::Result<()> {
        self.names.before(op, path)?;
        if let Some(m) = &self.model {
            m.before(op, path)?;
        }
        if op == IoOp::SyncDir
            && path.ends_with("topics/t0/p0")
            && self.armed.load(Ordering::Acquire)
            && !self.blocked.swap(true, Ordering::AcqRel)
        {
            wait_flag(&self.release, Duration::from_secs(10));
        }
        Ok(())
    }

    fn after(&self, op: IoOp, path: &Path, result: std::io::Result<()>) -> std::io::Result<()> {
        let result = match &self.model {
            Some(m) => m.after(op, path, result),
            None => result,
        };
        self.names.after(op, path, result)
    }
}

/// Seals for a split or merge, the same hole with a wide window and
/// deterministic: a split seals the parent under its writer lock and
/// `sync_locked` fsyncs its segments and directory (it takes the
/// "directory changed" flag for that). A round used to wait for the lock;
/// now it captures meanwhile, finds the flag taken (`sync_dir` false),
/// fdatasyncs the segment the parent rolled to, and raises the durable end
/// into it while the directory fsync that names that segment is still in
/// flight (held here by the hook). A `Topic::durable` future then resolves
/// for records a power loss at that moment can take with the file's name:
/// the per-file crash model's images that drop the name open (Strict)
/// with the partition ending before them, silently.
#[test]
fn round_during_a_split_seal_does_not_call_an_unnamed_segment_durable() {
    use fissionlog::SplitPlan;
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    // The known gap for new segments' headers is not what this probes.
    model.grant_segment_headers(true);
    let gate = Arc::new(SealGate {
        model: Some(model.clone()),
        ..SealGate::default()
    });
    let o = LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..quiet()
    };
    let log = Log::open_with_hook(dir.path(), o, gate.clone()).unwrap();
    let topic = rolling_topic(&log);
    let v = vec![9u8; 1200];
    let rec = [NewRecord {
        key: Some(b"k"),
        value: &v,
        timestamp: None,
    }];
    for _ in 0..7 {
        topic.append_to(0, &rec).unwrap();
    }
    log.sync().unwrap();
    let p = topic.partition(0).unwrap();
    let before = p.segment_count();
    // A roll (the new segment's name not synced yet) and records in it.
    while p.segment_count() == before {
        topic.append_to(0, &rec).unwrap();
    }
    topic.append_to(0, &rec).unwrap();
    let newest = p.segment_infos().last().unwrap().clone();
    gate.armed.store(true, Ordering::Release);
    let done = AtomicBool::new(false);
    let (seen, split) = std::thread::scope(|s| {
        let split = s.spawn(|| topic.split(0, SplitPlan::Even));
        assert!(
            wait_flag(&gate.blocked, Duration::from_secs(10)),
            "the split's directory fsync never came"
        );
        let (done, log) = (&done, &log);
        let sync = s.spawn(move || {
            let r = log.sync();
            done.store(true, Ordering::Release);
            r
        });
        let finished = wait_flag(done, Duration::from_secs(2));
        let seen = finished.then(|| {
            let d = p.durable_end_offset();
            let named = gate.names.name_durable(&newest.path);
            let fut = poll_once(topic.durable(0, d.saturating_sub(1)));
            (d, named, fut, model.now(IoOp::SyncDir))
        });
        gate.release.store(true, Ordering::Release);
        sync.join().unwrap().unwrap();
        (seen, split.join().unwrap())
    });
    split.unwrap();
    drop((p, topic));
    drop(log);
    let Some((d, named, fut, point)) = seen else {
        return;
    };
    if d <= newest.base_offset || named {
        return;
    }
    // What a power loss at that moment leaves.
    let seg_name = newest.path.file_name().unwrap().to_owned();
    let mut outcomes = Vec::new();
    for seed in 0..64u64 {
        let (image, _) = point.image(seed, &CrashOptions::default());
        if image.files.keys().any(|k| k.file_name() == Some(&seg_name)) {
            continue;
        }
        let out = tempfile::tempdir().unwrap();
        image.write_to(out.path()).unwrap();
        outcomes.push(match Log::open(out.path(), quiet()) {
            Ok(l) => {
                let end = l.topic("t").unwrap().partition(0).unwrap().end_offset();
                format!("seed {seed}: opens, partition 0 ends at {end}")
            }
            Err(e) => format!("seed {seed}: open fails: {e}"),
        });
        if outcomes.len() >= 2 {
            break;
        }
    }
    panic!(
        "during the split's seal a round raised the durable end to {d}, into segment \
         {} (records {}..{d}), whose name no completed directory fsync covers; \
         durable({}) polled: {fut:?}; power loss then: {outcomes:?}",
        newest.base_offset,
        newest.base_offset,
        d - 1
    );
}

/// Gates for [`always_append_during_a_split_seal_returns_covered`]: a
/// round (R0) held in its fsync of topic "o" (`topics/t1/`), and the
/// split's directory fsync of `topics/t0/p0` held, each until released.
/// (Its own hook: two gates armed apart, in order with the names.)
#[derive(Debug, Default)]
struct AlwaysGate {
    names: NameHook,
    hold_round: AtomicBool,
    round_held: AtomicBool,
    release_round: AtomicBool,
    hold_dir: AtomicBool,
    dir_held: AtomicBool,
    release_dir: AtomicBool,
}

impl IoHook for AlwaysGate {
    fn before(&self, op: IoOp, path: &Path) -> std::io::Result<()> {
        self.names.before(op, path)?;
        if op == IoOp::SyncSegment
            && path.to_string_lossy().contains("topics/t1/")
            && self.hold_round.load(Ordering::Acquire)
            && !self.round_held.swap(true, Ordering::AcqRel)
        {
            wait_flag(&self.release_round, Duration::from_secs(10));
        }
        if op == IoOp::SyncDir
            && path.ends_with("topics/t0/p0")
            && self.hold_dir.load(Ordering::Acquire)
            && !self.dir_held.swap(true, Ordering::AcqRel)
        {
            wait_flag(&self.release_dir, Duration::from_secs(10));
        }
        Ok(())
    }

    fn after(&self, op: IoOp, path: &Path, result: std::io::Result<()>) -> std::io::Result<()> {
        self.names.after(op, path, result)
    }
}

/// Deterministic: a `SyncPolicy::Always` append that rolled returns
/// before the new segment's name is durable. The append (A) rolls to a new
/// segment and waits for a round that starts after it (a round R0 on
/// another topic is in flight, so A waits for the next one). A split seals
/// the partition meanwhile: its `sync_locked` takes the "directory
/// changed" flag and its directory fsync is in flight (held here). The
/// next round (R1, led by A's group commit) captures the partition without
/// the writer lock, finds the flag taken, fsyncs A's segment only and
/// completes: A returns `Ok` while no completed directory fsync names the
/// segment holding its record. A must return only after the split's
/// directory fsync.
#[test]
fn always_append_during_a_split_seal_returns_covered() {
    use fissionlog::SplitPlan;
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(AlwaysGate::default());
    let o = LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..quiet()
    };
    let log = Log::open_with_hook(dir.path(), o, gate.clone()).unwrap();
    let cfg = TopicConfig {
        partitions: 1,
        segment_bytes: 4096,
        sync: SyncPolicy::Always,
        ..TopicConfig::default()
    };
    let topic = log.create_topic("t", cfg.clone()).unwrap();
    let other = log.create_topic("o", cfg).unwrap();
    let v = vec![9u8; 1200];
    let rec = [NewRecord {
        key: Some(b"k"),
        value: &v,
        timestamp: None,
    }];
    let p = topic.partition(0).unwrap();
    // Up to the last record that fits: the next append rolls.
    while p.segment_infos().last().unwrap().data_bytes + 2 * 1300 < 4096 - 64 {
        topic.append_to(0, &rec).unwrap();
    }
    topic.append_to(0, &rec).unwrap();
    let segs = p.segment_count();
    let small = [NewRecord {
        key: None,
        value: b"o",
        timestamp: None,
    }];
    let a_done = AtomicBool::new(false);
    let outcome = std::thread::scope(|s| {
        // R0: in flight, held in its fsync of topic "o".
        gate.hold_round.store(true, Ordering::Release);
        let r0 = s.spawn(|| other.append_to(0, &small));
        assert!(
            wait_flag(&gate.round_held, Duration::from_secs(10)),
            "no R0"
        );
        // A: rolls, appends, waits for the round after R0.
        let a = s.spawn(|| {
            let r = topic.append_to(0, &rec);
            a_done.store(true, Ordering::Release);
            r
        });
        while p.segment_count() == segs
            || p.end_offset() <= p.segment_infos().last().unwrap().base_offset
        {
            std::thread::sleep(Duration::from_micros(200));
        }
        let newest = p.segment_infos().last().unwrap().clone();
        // The split: its seal's directory fsync is held.
        gate.hold_dir.store(true, Ordering::Release);
        let split = s.spawn(|| topic.split(0, SplitPlan::Even));
        assert!(
            wait_flag(&gate.dir_held, Duration::from_secs(10)),
            "the split's directory fsync never came"
        );
        // R0 completes; A's group commit leads R1.
        gate.release_round.store(true, Ordering::Release);
        let returned = wait_flag(&a_done, Duration::from_secs(2));
        let named = gate.names.name_durable(&newest.path);
        gate.release_dir.store(true, Ordering::Release);
        let a = a.join().unwrap();
        r0.join().unwrap().unwrap();
        split.join().unwrap().unwrap();
        (returned, named, a, newest.base_offset)
    });
    let (returned, named, a, base) = outcome;
    let a = a.unwrap();
    assert!(
        !returned || named,
        "the Always append of record {a} (in segment {base}) returned Ok while the split's \
         directory fsync was still in flight: no completed directory fsync names its segment"
    );
}

/// The newest valid checkpoint file of the log in `dir`.
fn newest_checkpoint(dir: &Path) -> fissionlog::internals::format::Checkpoint {
    ["checkpoint.0", "checkpoint.1"]
        .iter()
        .filter_map(|f| std::fs::read(dir.join(f)).ok())
        .filter_map(|b| fissionlog::internals::format::decode_checkpoint(&b).ok())
        .max_by_key(|c| c.seq)
        .expect("a valid checkpoint")
}

/// Gates for [`reclaim_racing_a_round_keeps_the_reclaimed_durable_end`]:
/// the reclaim stops in its cut (`TrimSegment` of the parent) for a while
/// (or until a round is inside its fsyncs), so that a round starts during
/// the cut.
/// (Its own hook: one gate waits for the other to be reached, which the kit
/// cannot.)
#[derive(Debug, Default)]
struct ReclaimGate {
    armed: AtomicBool,
    in_trim: AtomicBool,
    round_blocked: AtomicBool,
    release: AtomicBool,
    /// The reclaim's cut waited in vain for a round (one that could not
    /// capture while the reclaim held the writer lock).
    trim_timed_out: AtomicBool,
}

impl IoHook for ReclaimGate {
    fn before(&self, op: IoOp, path: &Path) -> std::io::Result<()> {
        if !self.armed.load(Ordering::Acquire) {
            return Ok(());
        }
        let in_dir = |d: &str| path.to_string_lossy().contains(d);
        if op == IoOp::TrimSegment && in_dir("topics/t0/p0/") {
            self.in_trim.store(true, Ordering::Release);
            // The round reads the published position, then waits for the
            // segment list (which the reclaim holds): it never gets to its
            // fsyncs before the reclaim ends, so this waits a fixed time.
            if !wait_flag(&self.round_blocked, Duration::from_millis(300)) {
                self.trim_timed_out.store(true, Ordering::Release);
            }
        } else if op == IoOp::SyncSegment
            && in_dir("topics/t1/")
            && self.in_trim.load(Ordering::Acquire)
            && !self.round_blocked.load(Ordering::Acquire)
        {
            self.round_blocked.store(true, Ordering::Release);
            wait_flag(&self.release, Duration::from_secs(10));
        }
        Ok(())
    }
}

/// Tail splits (`reclaim_past`): the reclaim cuts the parent's segment
/// holding `from` under the writer lock, then publishes (keep, cut, from)
/// and lowers the durable position to it. A round used to capture either
/// before the reclaim or after it. Now it captures without the lock, so it
/// can read the position published before the cut (the keep segment's old
/// end) while the reclaim is cutting; its `sync_done` then lands after the
/// reclaim and, being "monotonic" on (segment, position), puts the durable
/// position back to the old end and raises `durable_end` past `from`
/// again. The partition then says offsets up to its old end are durable
/// while its files (and `end_offset`) end at `from`, and every later
/// checkpoint names that old end. Deterministic here: the round reads the
/// position lock-free, then waits for the segment list the reclaim holds
/// (write-locked for the whole `reclaim_past`), and finishes after it.
/// Recovery repairs such an entry (`reclaimed_checkpoints`), so the cost
/// is the broken invariant (`durable_end <= end_offset`) and checkpoints
/// naming bytes that were punched out.
#[test]
fn reclaim_racing_a_round_keeps_the_reclaimed_durable_end() {
    use common::tail::{append_big, config};
    use fissionlog::{SplitPlan, TailSplitOptions};
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(ReclaimGate::default());
    let o = || LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        recovery: RecoveryMode::Strict,
        ..quiet()
    };
    let log = Log::open_with_hook(dir.path(), o(), gate.clone()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    let other = log.create_topic("o", config()).unwrap();
    append_big(&topic, 0, 600, 11);
    log.sync().unwrap();
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(100))
        .unwrap();
    assert_eq!((out.from, out.seal_offset), (100, 600));
    log.sync().unwrap();
    log.sync().unwrap();
    let parent = topic.partition(0).unwrap();
    let rec = [NewRecord {
        key: None,
        value: b"x",
        timestamp: None,
    }];
    gate.armed.store(true, Ordering::Release);
    let (reclaimed, synced) = std::thread::scope(|s| {
        let r = s.spawn(|| topic.reclaim_tail(0));
        assert!(wait_flag(&gate.in_trim, Duration::from_secs(10)), "no cut");
        // Something for the round to fsync (where it waits).
        other.append_to(0, &rec).unwrap();
        let sy = s.spawn(|| log.sync());
        let reclaimed = r.join().unwrap();
        gate.release.store(true, Ordering::Release);
        (reclaimed, sy.join().unwrap())
    });
    gate.armed.store(false, Ordering::Release);
    let reclaimed = reclaimed.unwrap();
    synced.unwrap();
    assert!(reclaimed.complete, "{reclaimed:?}");
    // More rounds: the durable position never comes back down by itself.
    for _ in 0..3 {
        other.append_to(0, &rec).unwrap();
        log.sync().unwrap();
    }
    let (durable, end) = (parent.durable_end_offset(), parent.end_offset());
    drop((parent, topic, other));
    log.close().unwrap();
    let ck = newest_checkpoint(dir.path());
    let entry = ck
        .partitions
        .iter()
        .find(|c| c.topic_id == 0 && c.partition_id == 0)
        .cloned();
    // Reopen (Strict) must still work and hold exactly 0..100 in the parent.
    let log = Log::open(dir.path(), o()).unwrap();
    let reopened_end = log.topic("t").unwrap().partition(0).unwrap().end_offset();
    drop(log);
    assert!(
        durable <= end && entry.as_ref().is_none_or(|e| e.end_offset <= 100),
        "after a reclaim to 100 raced by a round: durable end {durable} > end {end}; \
         the clean checkpoint names {:?}; reopened end {reopened_end}",
        entry.map(|e| (e.segment_base, e.position, e.end_offset))
    );
}

/// A partition retention removed is named by no checkpoint written
/// after its removal (a checkpoint in every round here, not only the clean
/// one at close), and an abandoned log reopens without it.
#[test]
fn removed_partition_stays_out_of_every_later_checkpoint() {
    use fissionlog::SplitPlan;
    let dir = tempfile::tempdir().unwrap();
    let o = || LogOptions {
        checkpoint_interval: Duration::ZERO,
        recovery: RecoveryMode::Strict,
        ..quiet()
    };
    let log = Log::open(dir.path(), o()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 4096,
                retention_age: Some(Duration::from_secs(3600)),
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let v = vec![1u8; 300];
    let append = |n: u32, ts: Option<i64>| {
        for i in 0..n {
            let k = format!("k{}", i % 8);
            topic
                .append_batch(&[NewRecord {
                    key: Some(k.as_bytes()),
                    value: &v,
                    timestamp: ts,
                }])
                .unwrap();
        }
    };
    append(300, Some(1_000));
    assert_eq!(topic.split(0, SplitPlan::Even).unwrap(), vec![1, 2]);
    append(300, None);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err(), "the emptied parent left");
    for _ in 0..3 {
        append(20, None);
        log.sync().unwrap();
        let ck = newest_checkpoint(dir.path());
        let ids: Vec<u32> = ck.partitions.iter().map(|c| c.partition_id).collect();
        assert!(
            !ids.contains(&0),
            "checkpoint {} names the removed 0: {ids:?}",
            ck.seq
        );
    }
    drop(topic);
    log.abandon();
    let log = Log::open(dir.path(), o()).unwrap();
    let ids: Vec<u32> = log
        .topic("t")
        .unwrap()
        .partitions()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(ids, vec![1, 2]);
}

/// A deleted topic's partitions are named by no later checkpoint, even
/// while a handle to the topic lives: an append through such a handle must
/// not mark its partition dirty and put it back into the checkpoint cache.
/// (Recovery would ignore such an entry, since ids are never reused.)
#[test]
fn deleted_topic_stays_out_of_every_later_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let o = || LogOptions {
        checkpoint_interval: Duration::ZERO,
        ..quiet()
    };
    let log = Log::open(dir.path(), o()).unwrap();
    let gone = log.create_topic("gone", TopicConfig::default()).unwrap();
    let kept = log.create_topic("kept", TopicConfig::default()).unwrap();
    let rec = [NewRecord {
        key: None,
        value: b"v",
        timestamp: None,
    }];
    gone.append_to(0, &rec).unwrap();
    kept.append_to(0, &rec).unwrap();
    log.sync().unwrap();
    gone.append_to(0, &rec).unwrap();
    log.delete_topic("gone").unwrap();
    let after_delete = gone.append_to(0, &rec);
    let mut named = Vec::new();
    for i in 0..3 {
        kept.append_to(0, &rec).unwrap();
        let r = log.sync();
        let ck = newest_checkpoint(dir.path());
        if ck.partitions.iter().any(|c| c.topic_id == 0) {
            named.push(format!("round {i} ({r:?}): checkpoint {}", ck.seq));
        }
    }
    drop((gone, kept));
    log.abandon();
    let log = Log::open(dir.path(), o()).unwrap();
    assert_eq!(log.topics(), vec!["kept".to_string()]);
    assert!(
        named.is_empty(),
        "append through the deleted topic's handle: {after_delete:?}; \
         checkpoints naming the deleted topic: {named:?}"
    );
}

/// A topic deleted while its
/// partition's "directory changed" flag is set (a roll since the last
/// round) must not fail the next sync round of the whole log: the round
/// skips directories of removed partitions, but topic deletion does not
/// mark its partitions removed.
#[test]
fn deleting_a_topic_right_after_a_roll_does_not_fail_the_next_round() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let small = TopicConfig {
        segment_bytes: 4096,
        ..TopicConfig::default()
    };
    let gone = log.create_topic("gone", small.clone()).unwrap();
    let kept = log.create_topic("kept", small).unwrap();
    let v = vec![5u8; 1500];
    let rec = [NewRecord {
        key: None,
        value: &v,
        timestamp: None,
    }];
    log.sync().unwrap();
    for _ in 0..4 {
        gone.append_to(0, &rec).unwrap();
    }
    assert!(gone.partition(0).unwrap().segment_count() > 1, "no roll");
    log.delete_topic("gone").unwrap();
    kept.append_to(0, &rec).unwrap();
    let rounds: Vec<_> = (0..3).map(|_| log.sync()).collect();
    assert!(
        rounds.iter().all(|r| r.is_ok()),
        "the rounds after the delete: {rounds:?}"
    );
}

/// The rates a checkpoint carries are those of the moment it is
/// written (entries marked stale by rounds that wrote none are recomputed
/// then), and survive an abandoned (crash-like) reopen.
#[test]
fn rates_in_an_interval_checkpoint_are_current_and_survive_a_crash() {
    use fissionlog::ManualClock;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000_000));
    let o = || LogOptions {
        checkpoint_interval: Duration::from_millis(300),
        clock: clock.clone(),
        ..quiet()
    };
    let log = Log::open(dir.path(), o()).unwrap();
    let topic = log.create_topic("t", TopicConfig::default()).unwrap();
    let v = vec![3u8; 100];
    let rec = [NewRecord {
        key: None,
        value: &v,
        timestamp: None,
    }];
    // A first checkpoint (due at once), then rounds that write none while
    // the rate builds up: 1000 records per simulated second for 20 s.
    log.sync().unwrap();
    let first = newest_checkpoint(dir.path()).seq;
    for i in 0..20_000u32 {
        topic.append_to(0, &rec).unwrap();
        clock.advance(Duration::from_millis(1));
        if i % 1000 == 999 {
            log.sync().unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(350));
    log.sync().unwrap();
    let ck = newest_checkpoint(dir.path());
    assert!(ck.seq > first, "no interval checkpoint was written");
    let e = ck
        .partitions
        .iter()
        .find(|c| c.topic_id == 0 && c.partition_id == 0)
        .unwrap();
    let fastest = e
        .rates
        .iter()
        .map(|w| w.records_per_sec)
        .fold(0.0f64, f64::max);
    assert!(
        fastest > 500.0,
        "checkpoint {} carries rates {:?}",
        ck.seq,
        e.rates
    );
    drop(topic);
    log.abandon();
    let log = Log::open(dir.path(), o()).unwrap();
    let info = &log.topic("t").unwrap().partitions()[0];
    assert!(
        info.rates.iter().any(|w| w.records_per_sec > 500.0),
        "rates after the reopen: {:?}",
        info.rates
    );
}
