//! A new topic's first segments become durable in the first sync round
//! that has something of them, not at the creation: power loss at every
//! I/O step of what may follow a creation (durable appends, rolls before
//! any sync, splits, merges and tail splits of never-written partitions,
//! a clean close without writes, a process kill and the reopen after it)
//! opens Strict, loses and duplicates no acknowledged record, reports no
//! loss, and leaves a log that `verify` finds healthy once closed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::common;

use common::crash::CrashOptions;
use common::lifecycle::{cfg, opts, partition_values};
use common::model_hook::{for_each_image, CrashPoint, ModelHook};
use fissionlog::{
    FileAction, IoOp, Log, SplitPlan, SyncPolicy, TailSplitOptions, Topic, TopicConfig,
};

/// One scenario's record of what it wrote and when it was acknowledged.
pub(super) struct Script {
    pub(super) model: Arc<ModelHook>,
    /// The crash points before every I/O step so far.
    pub(super) points: Vec<CrashPoint>,
    /// Per partition, every value appended, in order.
    pub(super) written: BTreeMap<u32, Vec<Vec<u8>>>,
    /// Per partition: from crash point `.0` on, at least `.1` values.
    pub(super) durable: BTreeMap<u32, Vec<(usize, usize)>>,
    /// From this crash point on the topic must be there.
    pub(super) created: usize,
}

impl Script {
    pub(super) fn new(model: Arc<ModelHook>) -> Script {
        model.record_steps(true);
        Script {
            model,
            points: Vec::new(),
            written: BTreeMap::new(),
            durable: BTreeMap::new(),
            created: usize::MAX,
        }
    }

    /// The number of I/O steps run so far.
    pub(super) fn mark(&mut self) -> usize {
        self.points.extend(self.model.take_steps());
        self.points.len()
    }

    pub(super) fn create(&mut self, log: &Log, config: TopicConfig) -> Topic {
        let t = log.create_topic("t", config).unwrap();
        self.created = self.mark();
        t
    }

    /// Appends `value` to `p`; acknowledged durable when `durable`.
    pub(super) fn append(&mut self, t: &Topic, p: u32, value: &[u8], durable: bool) {
        t.append_to(p, &common::log::rec(value)).unwrap();
        self.written.entry(p).or_default().push(value.to_vec());
        if durable {
            self.acked(p);
        }
    }

    pub(super) fn acked(&mut self, p: u32) {
        let at = self.mark();
        let n = self.written.get(&p).map_or(0, Vec::len);
        self.durable.entry(p).or_default().push((at, n));
    }

    /// A sync round returned: everything written so far is durable.
    pub(super) fn synced(&mut self, log: &Log) {
        log.sync().unwrap();
        let ps: Vec<u32> = self.written.keys().copied().collect();
        for p in ps {
            self.acked(p);
        }
    }

    /// Values `p` must hold at crash point `k`.
    pub(super) fn must_hold(&self, p: u32, k: usize) -> usize {
        self.durable.get(&p).map_or(0, |v| {
            v.iter()
                .filter(|(at, _)| *at <= k)
                .map(|&(_, n)| n)
                .max()
                .unwrap_or(0)
        })
    }

    /// Stops recording and checks a power-loss image at every crash point
    /// (and after the last step) with three seeds each.
    pub(super) fn check_all(mut self) {
        self.mark();
        self.model.record_steps(false);
        let mut points = std::mem::take(&mut self.points);
        points.push(self.model.now(IoOp::SyncSegment));
        assert!(points.len() > 5, "only {} crash points", points.len());
        for (k, point) in points.iter().enumerate() {
            for seed in 0..seeds() {
                let ctx = format!(
                    "step {k}/{} ({:?} {}), seed {seed}",
                    points.len(),
                    point.op,
                    point.path.display()
                );
                // Odd seeds tear pages at any byte, and keep some of what
                // the page cache held (a mix of a kill and a power loss).
                let options = CrashOptions {
                    torn_any_byte: seed % 2 == 1,
                    keep_all_new_probability: if seed % 2 == 1 { 0.3 } else { 0.0 },
                };
                let (image, _) = point.image(seed, &options);
                let out = tempfile::tempdir().unwrap();
                image.write_to(out.path()).unwrap();
                self.check_image(out.path(), k, &ctx);
            }
        }
    }

    /// Opens one image Strict and checks it, writes to every active
    /// partition, syncs, opens a power-loss image of that and checks it
    /// again, then closes it and runs `verify`.
    pub(super) fn check_image(&self, dir: &Path, k: usize, ctx: &str) {
        let model = ModelHook::new(dir, None);
        let log = Log::open_with_hook(dir, opts(), model.clone())
            .unwrap_or_else(|e| panic!("{ctx}: Strict open fails: {e}"));
        check_report(&log, ctx);
        let Ok(t) = log.topic("t") else {
            assert!(k < self.created, "{ctx}: the topic is gone");
            return;
        };
        let mut held = BTreeMap::new();
        for (&p, written) in &self.written {
            let want = self.must_hold(p, k);
            let vals = match t.partition(p) {
                Ok(_) => partition_values(&t, p),
                Err(e) => {
                    assert_eq!(want, 0, "{ctx}: partition {p} is gone: {e}");
                    continue;
                }
            };
            assert!(
                vals.len() >= want && written.starts_with(&vals),
                "{ctx}: partition {p} holds {} values, at least {want} of {} acked: {vals:?}",
                vals.len(),
                written.len()
            );
            held.insert(p, vals);
        }
        let active = t.active_partitions();
        for &p in &active {
            held.entry(p).or_insert_with(|| partition_values(&t, p));
            t.append_to(p, &common::log::rec(b"z")).unwrap();
        }
        log.sync()
            .unwrap_or_else(|e| panic!("{ctx}: sync after recovery: {e}"));
        let (image, _) = model.crash_image(7, &CrashOptions::default());
        drop(t);
        log.abandon();
        let again = tempfile::tempdir().unwrap();
        image.write_to(again.path()).unwrap();
        let log = Log::open(again.path(), opts())
            .unwrap_or_else(|e| panic!("{ctx}: second Strict open fails: {e}"));
        check_report(&log, &format!("{ctx}, second open"));
        let t = log.topic("t").unwrap();
        for (p, mut vals) in held {
            if active.contains(&p) {
                vals.push(b"z".to_vec());
            }
            assert_eq!(
                partition_values(&t, p),
                vals,
                "{ctx}: partition {p} after a second power loss"
            );
        }
        drop(t);
        log.close().unwrap();
        assert_healthy(again.path(), ctx);
    }
}

/// Recovery reported no loss: no hole, nothing cut as corruption, no
/// data called missing.
pub(super) fn check_report(log: &Log, ctx: &str) {
    let r = log.recovery_report();
    assert!(r.holes.is_empty(), "{ctx}: holes {:?}", r.holes);
    for f in &r.files {
        assert!(
            !matches!(
                f.action,
                FileAction::TruncatedCorruption { .. }
                    | FileAction::Salvaged { .. }
                    | FileAction::MissingData { .. }
            ),
            "{ctx}: {} {:?}",
            f.file.display(),
            f.action
        );
    }
}

/// `verify` finds no problem in the closed log at `dir`.
pub(super) fn assert_healthy(dir: &Path, ctx: &str) {
    let (report, problems) =
        fissionlog::verify(dir).unwrap_or_else(|e| panic!("{ctx}: verify fails: {e}"));
    assert!(problems.is_empty(), "{ctx}: verify finds {problems:?}");
    assert!(
        report.holes.is_empty(),
        "{ctx}: verify holes {:?}",
        report.holes
    );
}

/// A fresh log with a model hook, and the script recording from now on.
pub(super) fn start(dir: &Path) -> (Log, Script) {
    let model = ModelHook::new(dir, None);
    let log = Log::open_with_hook(dir, opts(), model.clone()).unwrap();
    (log, Script::new(model))
}

pub(super) fn big(tag: u8) -> Vec<u8> {
    vec![tag; 1500]
}

/// C1: every append to a `SyncPolicy::Always` topic is durable when it
/// returns, the first ones to its never-synced first segments included.
#[test]
fn power_loss_after_a_new_topics_durable_appends_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(4, SyncPolicy::Always));
    s.append(&t, 0, b"a", true);
    s.append(&t, 1, b"b", true);
    s.append(&t, 0, b"c", true);
    s.append(&t, 3, b"d", true);
    drop(t);
    log.abandon();
    s.check_all();
}

/// C1: records appended without a sync, then one durable append to the
/// same partition: all of them are durable when it returns.
#[test]
fn a_durable_append_after_unsynced_ones_keeps_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(2, SyncPolicy::Never));
    s.append(&t, 0, b"a", false);
    s.append(&t, 1, b"b", false);
    s.synced(&log);
    s.append(&t, 0, b"c", false);
    s.synced(&log);
    drop(t);
    log.abandon();
    s.check_all();
}

/// A first segment that fills and rolls before any sync round: the roll
/// names it durably before the next segment is created.
#[test]
fn power_loss_around_rolls_before_the_first_sync_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(2, SyncPolicy::Never));
    for i in 0..6u8 {
        s.append(&t, 0, &big(i), false);
    }
    s.append(&t, 1, b"x", false);
    s.synced(&log);
    s.append(&t, 0, &big(9), false);
    s.synced(&log);
    drop(t);
    log.abandon();
    s.check_all();
}

/// Rolls of a `SyncPolicy::Always` topic's first segment: each big
/// record is durable when its append returns.
#[test]
fn durable_appends_that_roll_a_new_first_segment_keep_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(2, SyncPolicy::Always));
    for i in 0..5u8 {
        s.append(&t, 1, &big(i), true);
    }
    drop(t);
    log.abandon();
    s.check_all();
}

/// Splitting a partition no sync round ever reached, then writing to its
/// children.
#[test]
fn power_loss_around_a_split_of_a_never_written_partition() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(2, SyncPolicy::Never));
    s.append(&t, 1, b"a", false);
    let children = t.split(0, SplitPlan::Even).unwrap();
    s.mark();
    for &c in &children {
        s.append(&t, c, b"c", false);
    }
    s.synced(&log);
    drop(t);
    log.abandon();
    s.check_all();
}

/// Merging two partitions no sync round ever reached.
#[test]
fn power_loss_around_a_merge_of_never_written_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(3, SyncPolicy::Never));
    let child = t.merge(0, 1).unwrap();
    s.mark();
    s.append(&t, child, b"m", false);
    s.append(&t, 2, b"q", false);
    s.synced(&log);
    drop(t);
    log.abandon();
    s.check_all();
}

/// A tail split of a never-written partition from its start.
#[test]
fn power_loss_around_a_tail_split_of_a_never_written_partition() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(2, SyncPolicy::Never));
    let out = t
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(0))
        .unwrap();
    s.mark();
    let _ = out;
    for c in t.active_partitions() {
        s.append(&t, c, b"c", false);
    }
    s.synced(&log);
    drop(t);
    log.abandon();
    s.check_all();
}

/// A clean close of a topic never written: the live log verifies, and a
/// power loss at every step of the creation and the close opens Strict.
#[test]
fn power_loss_around_a_clean_close_without_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(3, SyncPolicy::Never));
    drop(t);
    log.close().unwrap();
    assert_healthy(dir.path(), "the live log after a clean close");
    s.check_all();
}

/// A clean close without writes, then power loss: `verify` of the image
/// (a healthy log) agrees with the Strict open.
#[test]
fn verify_accepts_a_power_loss_image_of_a_clean_close_without_writes() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    drop(log.create_topic("t", cfg(3, SyncPolicy::Never)).unwrap());
    log.close().unwrap();
    for seed in 0..32u64 {
        let options = CrashOptions {
            torn_any_byte: seed % 2 == 1,
            keep_all_new_probability: 0.0,
        };
        let (image, _) = model.crash_image(seed, &options);
        let out = tempfile::tempdir().unwrap();
        image.write_to(out.path()).unwrap();
        let ctx = format!("seed {seed}");
        assert_healthy(out.path(), &ctx);
        Log::open(out.path(), opts())
            .unwrap_or_else(|e| panic!("{ctx}: Strict open fails: {e}"))
            .close()
            .unwrap();
    }
}

/// A process kill after unsynced appends (the page cache survives), the
/// reopen of the live directory, and power loss at every step of that
/// reopen and a sync after it: the reopen must not call the page cache's
/// first segments durable before it syncs them.
#[test]
fn power_loss_during_the_reopen_after_a_kill_loses_nothing_acked() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(3, SyncPolicy::Never));
    s.append(&t, 0, b"a", false);
    s.append(&t, 2, &big(1), false);
    s.append(&t, 2, &big(2), false);
    s.append(&t, 2, &big(3), false);
    drop(t);
    log.abandon();
    s.mark();
    // The same model: what was durable before the kill still is, and
    // nothing more.
    let log = Log::open_with_hook(dir.path(), opts(), s.model.clone()).unwrap();
    s.mark();
    // The reopen's first round made what it kept durable.
    let ps: Vec<u32> = s.written.keys().copied().collect();
    for p in ps {
        s.acked(p);
    }
    let t = log.topic("t").unwrap();
    s.append(&t, 1, b"b", false);
    s.synced(&log);
    drop(t);
    log.abandon();
    s.check_all();
}

/// A clean close without writes, a reopen, appends and a sync: power
/// loss at every step from the reopen on.
#[test]
fn power_loss_after_a_reopen_of_a_never_written_topic() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(3, SyncPolicy::Never));
    drop(t);
    log.close().unwrap();
    s.mark();
    let log = Log::open_with_hook(dir.path(), opts(), s.model.clone()).unwrap();
    let t = log.topic("t").unwrap();
    s.append(&t, 0, b"a", false);
    s.append(&t, 1, &big(1), false);
    s.append(&t, 1, &big(2), false);
    s.append(&t, 1, &big(3), false);
    s.synced(&log);
    drop(t);
    log.close().unwrap();
    assert_healthy(dir.path(), "the live log after the second close");
    s.check_all();
}

/// Splitting a partition whose records no sync round has reached: the
/// split makes them durable before it commits the seal.
#[test]
fn power_loss_around_a_split_of_an_unsynced_new_partition() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(2, SyncPolicy::Never));
    s.append(&t, 0, b"a", false);
    s.append(&t, 0, &big(1), false);
    let children = t.split(0, SplitPlan::Even).unwrap();
    s.acked(0);
    for &c in &children {
        s.append(&t, c, b"c", false);
    }
    s.synced(&log);
    drop(t);
    log.abandon();
    s.check_all();
}

/// Merging two partitions whose records no sync round has reached.
#[test]
fn power_loss_around_a_merge_of_unsynced_new_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(3, SyncPolicy::Never));
    s.append(&t, 0, b"a", false);
    s.append(&t, 1, &big(1), false);
    let child = t.merge(0, 1).unwrap();
    s.acked(0);
    s.acked(1);
    s.append(&t, child, b"m", false);
    s.synced(&log);
    drop(t);
    log.abandon();
    s.check_all();
}

/// A tail split that moves every record of a partition no sync round has
/// reached.
#[test]
fn power_loss_around_a_tail_split_of_an_unsynced_new_partition() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(2, SyncPolicy::Never));
    s.append(&t, 0, b"a", false);
    s.append(&t, 0, b"b", false);
    t.split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(1))
        .unwrap();
    // The parent now ends at the cut, below its written records: it
    // holds `a` from here on, and a prefix of `a b` before.
    let at = s.mark();
    let parent = s.written.remove(&0).unwrap();
    s.synced(&log);
    for c in t.active_partitions() {
        // The children hold the moved records first.
        if c >= 2 {
            s.written.insert(c, partition_values(&t, c));
        }
        s.append(&t, c, b"c", false);
    }
    s.synced(&log);
    s.written.insert(0, parent);
    s.durable.insert(0, vec![(at, 1)]);
    drop(t);
    log.abandon();
    s.check_all();
}

/// A forced roll of a new partition's first segment before any sync
/// round, twice.
#[test]
fn power_loss_around_forced_rolls_before_the_first_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = s.create(&log, cfg(2, SyncPolicy::Never));
    s.append(&t, 0, b"a", false);
    t.partition(0).unwrap().roll_now().unwrap();
    s.append(&t, 0, b"b", false);
    t.partition(0).unwrap().roll_now().unwrap();
    s.mark();
    s.synced(&log);
    drop(t);
    log.abandon();
    s.check_all();
}

/// A topic deleted and created again under its name before any sync
/// round reached the first one.
#[test]
fn power_loss_around_a_delete_and_a_creation_under_the_same_name() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut s) = start(dir.path());
    let t = log.create_topic("t", cfg(2, SyncPolicy::Never)).unwrap();
    t.append_to(0, &common::log::rec(b"old")).unwrap();
    drop(t);
    log.delete_topic("t").unwrap();
    let t = s.create(&log, cfg(2, SyncPolicy::Never));
    s.append(&t, 1, b"new", false);
    s.synced(&log);
    drop(t);
    log.abandon();
    s.check_all();
}

/// The probes above can fail: with the success of the segment fdatasync
/// or the directory fsync of a sync round ignored by the model, the
/// durable appends of a new topic are lost. (Ignoring a roll's directory
/// fsync alone loses nothing here: the round's own directory fsync names
/// the new segment too.)
#[test]
fn the_durable_append_probe_notices_a_missing_fsync() {
    for op in [IoOp::SyncSegment, IoOp::SyncDir] {
        let caught = std::panic::catch_unwind(|| {
            let dir = tempfile::tempdir().unwrap();
            let model = ModelHook::new(dir.path(), Some(op));
            let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
            let mut s = Script::new(model);
            let t = s.create(&log, cfg(2, SyncPolicy::Always));
            s.append(&t, 0, b"a", true);
            s.append(&t, 1, &big(1), true);
            s.append(&t, 1, &big(2), true);
            s.append(&t, 1, &big(3), true);
            drop(t);
            log.abandon();
            s.check_all();
        });
        assert!(caught.is_err(), "ignoring {op:?} goes unnoticed");
    }
}

/// Entry `index` of term `term` of a replicated partition: one record.
fn raft_append(t: &Topic, p: u32, term: u64, index: u64) {
    let value = format!("t{term}-i{index:0300}");
    t.partition(p)
        .unwrap()
        .append_entry(
            fissionlog::RaftLogId {
                term,
                leader: 1,
                index,
            },
            fissionlog::EntryBody::Records(&[fissionlog::RecordIn {
                key: None,
                value: value.as_bytes(),
                timestamp: index as i64,
            }]),
        )
        .unwrap_or_else(|e| panic!("append {p} {term}/{index}: {e}"));
}

/// The (term, index) of every entry of replicated partition `p`.
fn raft_ids(t: &Topic, p: u32) -> Vec<(u64, u64)> {
    let part = t.partition(p).unwrap();
    let mut out = Vec::new();
    let Some(first) = part.first_log_id() else {
        return out;
    };
    let mut next = first.index;
    loop {
        let batch = match part.read_entries(next, 1 << 20) {
            Ok(b) => b,
            Err(fissionlog::Error::RaftIndexOutOfRange { .. }) => break,
            Err(e) => panic!("read_entries({next}): {e}"),
        };
        for e in batch.entries() {
            let e = e.unwrap();
            out.push((e.id.term, e.id.index));
        }
        next = batch.next_index();
    }
    out
}

/// A replicated topic's new partitions: entries appended before the
/// first sync round (some rolling the 4 KiB first segment), a sync, more
/// entries and a sync. Every image opens Strict with a dense prefix of
/// each partition's entries, all of the synced ones, and takes entries
/// again.
#[test]
fn power_loss_around_the_first_entries_of_a_new_replicated_topic() {
    replicated_power_loss(false);
}

/// The recovered replicated logs of
/// [`power_loss_around_the_first_entries_of_a_new_replicated_topic`],
/// once closed cleanly, are logs `verify` finds healthy (exit 0): an index
/// a power loss left empty next to its rolled segment is rebuilt or
/// ignored, not reported after the open accepted the log.
#[test]
fn verify_accepts_a_recovered_replicated_log_after_a_clean_close() {
    replicated_power_loss(true);
}

/// See [`power_loss_around_the_first_entries_of_a_new_replicated_topic`];
/// `verify` runs on each recovered log once closed when `verify_closed`.
fn replicated_power_loss(verify_closed: bool) {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    model.record_steps(true);
    let mut config = TopicConfig {
        replicated: true,
        ..cfg(2, SyncPolicy::Never)
    };
    config.balance.enabled = false;
    let t = log.create_topic("t", config).unwrap();
    let mut points = model.take_steps();
    let created = points.len();
    for i in 1..=14 {
        raft_append(&t, 0, 1, i);
    }
    raft_append(&t, 1, 1, 1);
    log.sync().unwrap();
    points.extend(model.take_steps());
    let first_sync = points.len();
    raft_append(&t, 1, 1, 2);
    log.sync().unwrap();
    points.extend(model.take_steps());
    let second_sync = points.len();
    model.record_steps(false);
    points.push(model.now(IoOp::SyncSegment));
    drop(t);
    log.abandon();
    for (k, point) in points.iter().enumerate() {
        for seed in 0..3u64 {
            let ctx = format!(
                "step {k} ({:?} {}), seed {seed}",
                point.op,
                point.path.display()
            );
            let (image, trace) = point.image(seed, &CrashOptions::default());
            let ctx = format!("{ctx}, image {trace:?}");
            let out = tempfile::tempdir().unwrap();
            image.write_to(out.path()).unwrap();
            let log = Log::open(out.path(), opts())
                .unwrap_or_else(|e| panic!("{ctx}: Strict open fails: {e}"));
            check_report(&log, &ctx);
            let Ok(t) = log.topic("t") else {
                assert!(k < created, "{ctx}: the topic is gone");
                continue;
            };
            let want = [
                if k >= first_sync { 14 } else { 0 },
                if k >= second_sync {
                    2
                } else if k >= first_sync {
                    1
                } else {
                    0
                },
            ];
            for p in 0..2u32 {
                let ids = raft_ids(&t, p);
                let dense: Vec<(u64, u64)> = (1..=ids.len() as u64).map(|i| (1, i)).collect();
                assert_eq!(ids, dense, "{ctx}: partition {p}");
                assert!(
                    ids.len() >= want[p as usize],
                    "{ctx}: partition {p} holds {} entries, {} synced",
                    ids.len(),
                    want[p as usize]
                );
                raft_append(&t, p, 1, ids.len() as u64 + 1);
            }
            log.sync()
                .unwrap_or_else(|e| panic!("{ctx}: sync after recovery: {e}"));
            drop(t);
            log.close().unwrap();
            if verify_closed {
                assert_healthy(out.path(), &ctx);
            }
        }
    }
}

/// A topic closed, reopened and closed again without a write: its first
/// segments were never synced (only their names, by the reopen), so a
/// power loss may tear or empty them. Every image opens Strict, reports
/// no loss and takes records.
#[test]
fn power_loss_after_clean_reopens_of_a_never_written_topic() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    drop(log.create_topic("t", cfg(3, SyncPolicy::Never)).unwrap());
    log.close().unwrap();
    for round in 0..2 {
        let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
        log.close().unwrap();
        for seed in 0..24u64 {
            let ctx = format!("round {round}, seed {seed}");
            let options = CrashOptions {
                torn_any_byte: seed % 2 == 1,
                keep_all_new_probability: 0.0,
            };
            let (image, _) = model.crash_image(seed, &options);
            let out = tempfile::tempdir().unwrap();
            image.write_to(out.path()).unwrap();
            assert_healthy(out.path(), &ctx);
            let log = Log::open(out.path(), opts())
                .unwrap_or_else(|e| panic!("{ctx}: Strict open fails: {e}"));
            check_report(&log, &ctx);
            let t = log.topic("t").unwrap();
            for p in 0..3 {
                assert!(partition_values(&t, p).is_empty(), "{ctx}: partition {p}");
                t.append_to(p, &common::log::rec(b"z")).unwrap();
            }
            log.sync().unwrap();
            drop(t);
            log.close().unwrap();
            assert_healthy(out.path(), &ctx);
        }
    }
}

fn sync_counts(model: &ModelHook) -> Vec<(IoOp, u64)> {
    common::model_hook::SYNC_OPS
        .iter()
        .map(|&op| (op, model.synced_count(op)))
        .filter(|&(_, n)| n > 0)
        .collect()
}

/// Where the fsyncs a creation no longer makes go when no record comes:
/// nowhere. The clean close syncs no never-written partition, and neither
/// do the clean opens after it (each still finds the partitions empty and
/// keeps them as a new topic's).
#[test]
fn a_clean_close_of_never_written_partitions_syncs_none_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    drop(log.create_topic("t", cfg(64, SyncPolicy::Never)).unwrap());
    let created = sync_counts(&model);
    assert!(
        created
            .iter()
            .all(|&(op, _)| op != IoOp::SyncSegment && op != IoOp::SyncDir),
        "the creation synced a segment: {created:?}"
    );
    log.close().unwrap();
    assert_eq!(model.synced_count(IoOp::SyncSegment), 0);
    assert_eq!(model.synced_count(IoOp::SyncDir), 0);
    for k in 0..3 {
        let model = ModelHook::new(dir.path(), None);
        let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
        log.close().unwrap();
        assert_eq!(
            sync_counts(&model),
            vec![(IoOp::SyncCheckpoint, 3)],
            "clean open {k}"
        );
    }
}

/// Retention that retires a new partition's first segments, run before
/// or after an explicit sync (retention's own rounds are then the first): every image opens Strict with a
/// contiguous run of the partition's records that ends at or past what
/// was synced, and reports no loss.
#[test]
fn power_loss_around_retention_of_a_new_partitions_first_segments() {
    retention_power_loss(false);
}

/// The recovered logs of
/// [`power_loss_around_retention_of_a_new_partitions_first_segments`],
/// once read, written, synced and closed cleanly, are logs `verify` finds
/// healthy: an index a power loss left short or empty is rebuilt, not
/// reported after the open accepted the log.
#[test]
fn verify_accepts_a_recovered_log_after_reads_and_a_clean_close() {
    retention_power_loss(true);
}

/// See [`power_loss_around_retention_of_a_new_partitions_first_segments`];
/// `verify` runs on each recovered log once closed when `verify_closed`.
fn retention_power_loss(verify_closed: bool) {
    for sync_first in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let model = ModelHook::new(dir.path(), None);
        let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
        model.record_steps(true);
        let config = TopicConfig {
            retention_bytes: Some(4096),
            ..cfg(2, SyncPolicy::Never)
        };
        let t = log.create_topic("t", config).unwrap();
        let mut points = model.take_steps();
        let created = points.len();
        let written: Vec<Vec<u8>> = (0..10u8).map(big).collect();
        for v in &written[..8] {
            t.append_to(0, &common::log::rec(v)).unwrap();
        }
        let mut acked = Vec::new();
        if sync_first {
            log.sync().unwrap();
            points.extend(model.take_steps());
            acked.push((points.len(), 8));
        }
        // Retention keeps the segments the last two checkpoints name: it
        // runs (with its own sync rounds) until it retires one.
        let mut retired = 0;
        for _ in 0..4 {
            retired += log.enforce_retention().unwrap();
            if retired > 0 {
                break;
            }
            log.sync().unwrap();
        }
        assert!(retired > 0, "retention retired nothing");
        log.sync().unwrap();
        points.extend(model.take_steps());
        acked.push((points.len(), 8));
        for v in &written[8..] {
            t.append_to(0, &common::log::rec(v)).unwrap();
        }
        log.sync().unwrap();
        points.extend(model.take_steps());
        acked.push((points.len(), 10));
        model.record_steps(false);
        points.push(model.now(IoOp::SyncSegment));
        drop(t);
        log.abandon();
        for_each_image(&points, 3, |k, dir, ctx| {
            let ctx = format!("sync first {sync_first}, {ctx}");
            let log =
                Log::open(dir, opts()).unwrap_or_else(|e| panic!("{ctx}: Strict open fails: {e}"));
            check_report(&log, &ctx);
            let Ok(t) = log.topic("t") else {
                assert!(k < created, "{ctx}: the topic is gone");
                return;
            };
            let start = t.partition(0).unwrap().start_offset() as usize;
            let vals = partition_values(&t, 0);
            let want = acked
                .iter()
                .filter(|(at, _)| *at <= k)
                .map(|&(_, n)| n)
                .max()
                .unwrap_or(0);
            assert!(
                start + vals.len() >= want
                    && start + vals.len() <= written.len()
                    && written[start..start + vals.len()] == vals[..],
                "{ctx}: partition 0 holds {} values from {start}, {want} synced",
                vals.len()
            );
            t.append_to(0, &common::log::rec(b"z")).unwrap();
            log.sync().unwrap();
            drop(t);
            log.close().unwrap();
            if verify_closed {
                assert_healthy(dir, &ctx);
            }
        });
    }
}

/// Seeds per crash point (`PROBE_SEEDS` raises it for a longer run).
pub(super) fn seeds() -> u64 {
    std::env::var("PROBE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
}

/// The first fdatasync (or directory fsync) of a new partition's first
/// segment fails, in the first sync round that has records of it: that
/// append and every later one to the partition are refused, the other
/// partitions' acknowledged appends stay, and every image of the log
/// opens Strict.
#[test]
fn a_failed_first_sync_of_a_new_segment_acks_nothing_and_opens_strict() {
    for failing in [IoOp::SyncSegment, IoOp::SyncDir] {
        let dir = tempfile::tempdir().unwrap();
        let (log, mut s) = start(dir.path());
        let t = s.create(&log, cfg(2, SyncPolicy::Always));
        let mut armed = true;
        s.model.set_fault(Some(Box::new(move |op, path| {
            if armed && op == failing && path.to_string_lossy().contains("/p0") {
                armed = false;
                return Err(std::io::Error::other("injected EIO"));
            }
            Ok(())
        })));
        // Nothing of p0 is synced by this append's round: p0 is empty.
        if t.append_to(1, &common::log::rec(b"a")).is_ok() {
            s.written.entry(1).or_default().push(b"a".to_vec());
            s.acked(1);
        }
        // The first round with a record of p0 syncs its first segment and
        // its name, and fails.
        let failed = t.append_to(0, &common::log::rec(b"w"));
        assert!(
            failed.is_err(),
            "{failing:?}: the append whose sync failed was acknowledged"
        );
        s.model.set_fault(None);
        let refused = t.append_to(0, &common::log::rec(b"x"));
        assert!(
            refused.is_err(),
            "{failing:?}: an append to p0 was acknowledged"
        );
        s.mark();
        s.append(&t, 1, b"b", true);
        drop(t);
        log.abandon();
        // `w` and `x` may or may not be there (never acknowledged): only
        // p1 is checked.
        s.check_all();
    }
}

/// Where a creation's per-partition fsyncs went: the sync round that
/// first has records of a new partition makes its first segment and its
/// name durable, and a partition with nothing appended costs nothing. So
/// the first durable append to one partition of a 64-partition topic
/// waits for one fdatasync and one directory fsync, the second for the
/// fdatasync only.
#[test]
fn the_first_sync_round_after_a_creation_syncs_only_the_written_partition() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    let t = log.create_topic("t", cfg(64, SyncPolicy::Always)).unwrap();
    let before = (
        model.synced_count(IoOp::SyncSegment),
        model.synced_count(IoOp::SyncDir),
    );
    assert_eq!(before, (0, 0));
    t.append_to(5, &common::log::rec(b"a")).unwrap();
    let first = (
        model.synced_count(IoOp::SyncSegment),
        model.synced_count(IoOp::SyncDir),
    );
    assert_eq!(first, (1, 1), "the first durable append");
    t.append_to(5, &common::log::rec(b"b")).unwrap();
    let second = (
        model.synced_count(IoOp::SyncSegment) - first.0,
        model.synced_count(IoOp::SyncDir) - first.1,
    );
    assert_eq!(second, (1, 0), "the second durable append");
}
