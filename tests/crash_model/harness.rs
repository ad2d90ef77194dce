#![allow(dead_code)]
//! The model-based crash harness of `tests/crash_model/model.rs`, shared with
//! `tests/crash_model/mutations.rs` (which runs it with one fsync call site removed).
//!
//! Random sequences of appends, syncs, rolls, retention, forward splits,
//! merges, deleting and re-creating the topic, clean reopens and
//! power-loss crashes run against the engine and
//! against a plain in-memory model. The log runs under a [`ModelHook`], so a
//! crash image keeps only what each file's and each directory's own fsyncs
//! made durable (`tests/common/durable.rs`). Recovery runs under a fresh
//! hook that records a crash point before each of its I/O steps; a power
//! loss at some of those points (all of them with
//! [`Settings::recovery_crash_points`] = `usize::MAX`) is recovered again.
//!
//! After every open:
//! - C1: every record covered by a completed sync (`Log::sync`, a clean
//!   close, the commit of a split or merge for the parents' records, or a
//!   finished recovery for what it kept) is present byte for byte at its
//!   offset, unless retention removed it;
//! - C2/C3: every record read is the one appended at that offset, in a
//!   contiguous run `[start, end)` no longer than what was appended;
//! - C5: the partitions are exactly those of the committed topology, and
//!   each sealed one is sealed at the offset its split or merge committed;
//! - C7 (after a crash recovery): a second open changes nothing;
//! - after the topic was deleted and created again under its name: nothing
//!   of the old topic shows (C2), from the re-creation on and after every
//!   later crash.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::crash::{CrashOptions, SplitMix64};
use crate::common::model_hook::{CrashPoint, ModelHook};
use fissionlog::FileAction;
use fissionlog::IoOp;
use fissionlog::Partition;
use fissionlog::{Error, Log, LogOptions, NewRecord, RecoveryReport, SplitPlan, TopicConfig};
use proptest::prelude::*;

pub const TOPIC: &str = "model";
const PARTITIONS: u32 = 2;
const KEYS: [&[u8]; 4] = [b"alpha", b"beta", b"gamma", b"delta"];

#[derive(Debug, Clone)]
pub enum Op {
    /// Records of one batch: (key index or none, value size).
    Append(Vec<(Option<usize>, Size)>),
    Sync,
    /// Roll the n-th active partition (modulo their number).
    Roll(u8),
    Retention,
    Reopen,
    Crash {
        seed: u64,
        torn_any_byte: bool,
    },
    /// Forward split of the n-th active partition.
    Split(u8),
    /// Merge of the n-th pair of adjacent active partitions.
    Merge(u8),
    /// `Log::delete_topic`, then `Log::create_topic` under the same name.
    Recreate,
}

#[derive(Debug, Clone, Copy)]
pub enum Size {
    Small(usize),
    /// This many bytes below the largest record a segment can hold.
    NearSegment(usize),
}

#[derive(Debug, Clone)]
pub struct Case {
    pub segment_bytes: u64,
    pub retention: bool,
    pub ops: Vec<Op>,
}

/// How a case runs.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The fsync call site whose success the model ignores (mutation).
    pub drop_op: Option<IoOp>,
    /// After each crash, how many of recovery's I/O steps get a power loss
    /// of their own (picked by the crash seed; all when this is larger than
    /// the number of steps).
    pub recovery_crash_points: usize,
    /// Engine gaps the model finds that are open today; while one is, the
    /// harness grants it (or works around it) so the rest stays checked.
    /// `tests/crash_model/named_cases.rs` shows each with its grant off.
    pub gaps: KnownGaps,
}

/// See [`Settings::gaps`].
#[derive(Debug, Clone, Copy)]
pub struct KnownGaps {
    /// A new segment's header is not synced until records follow it
    /// ([`ModelHook::grant_segment_headers`]).
    pub segment_headers: bool,
    /// Recovery's deletions are not synced ([`ModelHook::grant_deletions`]).
    pub recovery_deletions: bool,
    /// A split or merge commits without syncing its
    /// parents, so a power loss can cut a parent below its seal offset. The
    /// harness syncs the log before each split and merge.
    pub split_parent_unsynced: bool,
    /// A power loss at a roll can keep the old segment's seal (header page)
    /// but lose its last records; recovery keeps that segment active with
    /// the seal still in its header, and the next open sees the seal and
    /// starts a new segment (a second open is not a no-op, C7). Allowed:
    /// a second open whose only change is creating segments.
    pub torn_seal_reopen: bool,
}

impl KnownGaps {
    /// Every gap open today.
    pub const OPEN: KnownGaps = KnownGaps {
        segment_headers: false,
        recovery_deletions: false,
        split_parent_unsynced: false,
        torn_seal_reopen: false,
    };
    /// None granted: the engine must close every gap.
    pub const NONE: KnownGaps = KnownGaps {
        segment_headers: false,
        recovery_deletions: false,
        split_parent_unsynced: false,
        torn_seal_reopen: false,
    };
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            drop_op: None,
            recovery_crash_points: 1,
            gaps: KnownGaps::OPEN,
        }
    }
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        12 => (0usize..300).prop_map(Size::Small),
        1 => (0usize..64).prop_map(Size::NearSegment),
    ];
    let rec = (proptest::option::weighted(0.8, 0usize..KEYS.len()), size);
    prop_oneof![
        30 => proptest::collection::vec(rec, 1..4).prop_map(Op::Append),
        6 => Just(Op::Sync),
        2 => any::<u8>().prop_map(Op::Roll),
        2 => Just(Op::Retention),
        2 => Just(Op::Reopen),
        4 => (any::<u64>(), any::<bool>())
            .prop_map(|(seed, torn_any_byte)| Op::Crash { seed, torn_any_byte }),
        1 => any::<u8>().prop_map(Op::Split),
        1 => any::<u8>().prop_map(Op::Merge),
        1 => Just(Op::Recreate),
    ]
}

pub fn case_strategy() -> impl Strategy<Value = Case> {
    (
        prop_oneof![Just(4096u64), Just(8192), Just(16384)],
        any::<bool>(),
        proptest::collection::vec(op_strategy(), 1..48),
    )
        .prop_map(|(segment_bytes, retention, ops)| Case {
            segment_bytes,
            retention,
            ops,
        })
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    timestamp: i64,
}

/// What the engine must hold, per partition.
#[derive(Debug, Default, Clone)]
pub struct PartModel {
    /// Every record appended at offsets `0..len` (lost unsynced records are
    /// cut off when a crash loses them).
    records: Vec<Rec>,
    /// Records below this were covered by a completed sync.
    synced: u64,
    /// Records below this may have been removed by retention.
    retained_from: u64,
    /// Sealed at this offset by a committed split or merge.
    sealed_at: Option<u64>,
}

/// Per partition id.
pub type Model = BTreeMap<u32, PartModel>;

/// A record about to be appended: key, value, timestamp.
type Pending<'a> = (Option<&'a [u8]>, Vec<u8>, i64);

struct Harness {
    root: tempfile::TempDir,
    generation: u32,
    dir: PathBuf,
    hook: Arc<ModelHook>,
    log: Option<Log>,
    model: Model,
    counter: u64,
    config: TopicConfig,
    history: Vec<String>,
    settings: Settings,
}

fn new_hook(dir: &Path, settings: Settings) -> Arc<ModelHook> {
    let hook = ModelHook::new(dir, settings.drop_op);
    hook.grant_segment_headers(settings.gaps.segment_headers);
    hook
}

pub fn options() -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        // Compact often, so splits and merges exercise the snapshot path.
        manifest_compact_records: 3,
        ..LogOptions::default()
    }
}

/// Deterministic value bytes for record number `n`.
fn value_for(n: u64, size: usize) -> Vec<u8> {
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA5A5;
    (0..size)
        .map(|i| {
            if i < 8 {
                n.to_le_bytes()[i]
            } else {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }
        })
        .collect()
}

impl Harness {
    fn new(case: &Case, settings: Settings) -> Harness {
        let root = scratch_dir();
        let dir = root.path().join("g0");
        std::fs::create_dir(&dir).unwrap();
        let mut config = TopicConfig {
            partitions: PARTITIONS,
            segment_bytes: case.segment_bytes,
            index_interval_bytes: 512,
            retention_bytes: case.retention.then_some(case.segment_bytes * 2),
            ..TopicConfig::default()
        };
        config.balance.max_partitions = 6;
        config.balance.min_partitions = 1;
        let hook = new_hook(&dir, settings);
        let log = Log::open_with_hook(&dir, options(), hook.clone()).unwrap();
        log.create_topic(TOPIC, config.clone()).unwrap();
        Harness {
            root,
            generation: 0,
            dir,
            hook,
            log: Some(log),
            model: (0..PARTITIONS).map(|p| (p, PartModel::default())).collect(),
            counter: 0,
            config,
            history: Vec::new(),
            settings,
        }
    }

    fn log(&self) -> &Log {
        self.log.as_ref().expect("log is open")
    }

    /// Stops the log (a clean close, or a kill that keeps the page cache)
    /// and records each partition's retention start, read after the stop
    /// so nothing can move it later.
    fn stop(&mut self, clean: bool) {
        let log = self.log.take().expect("log is open");
        let t = log.topic(TOPIC).unwrap();
        let parts: Vec<(u32, Arc<Partition>)> = self
            .model
            .keys()
            .map(|&id| (id, t.partition(id).unwrap()))
            .collect();
        drop(t);
        if clean {
            log.close().unwrap();
        } else {
            log.abandon();
        }
        for (id, p) in parts {
            let m = self.model.get_mut(&id).expect("known partition");
            m.retained_from = m.retained_from.max(p.start_offset());
        }
    }

    fn max_value(&self, key_len: usize, records: usize) -> usize {
        let max = self.config.effective_max_record_bytes() as usize;
        // Record framing is 16 bytes; one record per batch header.
        (max - 16 - key_len) / records
    }

    fn append(&mut self, recs: &[(Option<usize>, Size)]) {
        let owned: Vec<Pending<'_>> = recs
            .iter()
            .map(|&(k, size)| {
                let key = k.map(|i| KEYS[i]);
                let size = match size {
                    Size::Small(s) => s,
                    Size::NearSegment(d) => {
                        self.max_value(key.map_or(0, <[u8]>::len), recs.len()) - d
                    }
                };
                self.counter += 1;
                (
                    key,
                    value_for(self.counter, size),
                    1_600_000_000_000 + self.counter as i64,
                )
            })
            .collect();
        // Routing by the topic's hash would depend on its random hash key:
        // the harness routes itself (by key index over the active
        // partitions, keyless records to the first), so a case replays the
        // same way from its seed. One batch per partition, in order.
        let active = self.active();
        let mut groups: Vec<(u32, Vec<usize>)> = Vec::new();
        for (i, &(k, _)) in recs.iter().enumerate() {
            let p = active[k.unwrap_or(0) % active.len()];
            match groups.iter_mut().find(|(q, _)| *q == p) {
                Some((_, v)) => v.push(i),
                None => groups.push((p, vec![i])),
            }
        }
        let t = self.log().topic(TOPIC).unwrap();
        for (p, idx) in groups {
            let batch: Vec<NewRecord<'_>> = idx
                .iter()
                .map(|&i| NewRecord {
                    key: owned[i].0,
                    value: &owned[i].1,
                    timestamp: Some(owned[i].2),
                })
                .collect();
            match t.append_to(p, &batch) {
                Ok(base) => {
                    let m = self
                        .model
                        .get_mut(&p)
                        .expect("appended to a known partition");
                    assert!(
                        m.sealed_at.is_none(),
                        "append landed in sealed partition {p}"
                    );
                    assert_eq!(
                        base,
                        m.records.len() as u64,
                        "append landed at an unexpected offset"
                    );
                    for &i in &idx {
                        let (k, v, ts) = &owned[i];
                        m.records.push(Rec {
                            key: k.map(<[u8]>::to_vec),
                            value: v.clone(),
                            timestamp: *ts,
                        });
                    }
                }
                // Several near-segment records in one batch do not fit a
                // segment: a typed refusal that appends nothing.
                Err(Error::RecordTooLarge { .. }) if idx.len() > 1 => {
                    self.history
                        .push(format!("  (batch for {p} too large, refused)"));
                }
                Err(e) => panic!("append to {p} failed: {e}"),
            }
        }
    }
}

impl Harness {
    fn sync(&mut self) {
        self.log().sync().unwrap();
        for m in self.model.values_mut() {
            m.synced = m.records.len() as u64;
        }
    }

    fn active(&self) -> Vec<u32> {
        let t = self.log().topic(TOPIC).unwrap();
        let mut infos: Vec<_> = t
            .partitions()
            .into_iter()
            .filter(|i| i.sealed_at.is_none())
            .collect();
        infos.sort_by_key(|i| i.start);
        infos.iter().map(|i| i.id).collect()
    }

    fn roll(&mut self, n: u8) {
        let active = self.active();
        let p = active[n as usize % active.len()];
        let t = self.log().topic(TOPIC).unwrap();
        t.partition(p).unwrap().roll_now().unwrap();
    }

    /// The commit of a split or merge seals its parents: their records up
    /// to the seal are durable from then on (C5).
    fn sealed(&mut self, parents: &[u32], children: &[u32]) {
        for p in parents {
            let m = self.model.get_mut(p).expect("known parent");
            m.sealed_at = Some(m.records.len() as u64);
            m.synced = m.records.len() as u64;
        }
        for c in children {
            assert!(
                self.model.insert(*c, PartModel::default()).is_none(),
                "partition id {c} reused"
            );
        }
    }

    fn split(&mut self, n: u8) {
        let active = self.active();
        let p = active[n as usize % active.len()];
        if self.settings.gaps.split_parent_unsynced {
            self.sync();
        }
        let t = self.log().topic(TOPIC).unwrap();
        match t.split(p, SplitPlan::Even) {
            Ok(kids) => {
                self.history.push(format!("  split {p} into {kids:?}"));
                self.sealed(&[p], &kids);
            }
            Err(Error::Refused(why)) => self.history.push(format!("  (split refused: {why})")),
            Err(e) => panic!("split of {p} failed: {e}"),
        }
    }

    fn merge(&mut self, n: u8) {
        let active = self.active();
        if active.len() < 2 {
            return;
        }
        let i = n as usize % (active.len() - 1);
        let (a, b) = (active[i], active[i + 1]);
        if self.settings.gaps.split_parent_unsynced {
            self.sync();
        }
        let t = self.log().topic(TOPIC).unwrap();
        match t.merge(a, b) {
            Ok(child) => {
                self.history
                    .push(format!("  merge {a} and {b} into {child}"));
                self.sealed(&[a, b], &[child]);
            }
            Err(Error::Refused(why)) => self.history.push(format!("  (merge refused: {why})")),
            Err(e) => panic!("merge of {a} and {b} failed: {e}"),
        }
    }

    /// Retention may remove sealed partitions it emptied (a durable
    /// `RemovePartition` record when it returns): they leave the model.
    /// An active partition never leaves.
    fn retention(&mut self) {
        self.log().enforce_retention().unwrap();
        let t = self.log().topic(TOPIC).unwrap();
        let ids: Vec<u32> = t.partitions().iter().map(|i| i.id).collect();
        let gone: Vec<u32> = self
            .model
            .keys()
            .filter(|id| !ids.contains(id))
            .copied()
            .collect();
        for id in gone {
            let m = self.model.remove(&id).expect("known partition");
            assert!(
                m.sealed_at.is_some(),
                "C5: active partition {id} left the topology"
            );
            self.history
                .push(format!("  partition {id} removed (retention emptied it)"));
        }
    }

    /// Deletes the topic and creates it again with the same configuration:
    /// both are durable manifest records when they return, so from here on
    /// (and after any later crash) the topic is the new, empty one.
    fn recreate(&mut self) {
        self.log().delete_topic(TOPIC).unwrap();
        self.log().create_topic(TOPIC, self.config.clone()).unwrap();
        self.model = (0..PARTITIONS).map(|p| (p, PartModel::default())).collect();
        let log = self.log.as_ref().expect("log is open");
        check_log(log, &mut self.model, "re-created", log.recovery_report());
    }

    fn next_dir(&mut self) -> PathBuf {
        self.generation += 1;
        self.root.path().join(format!("g{}", self.generation))
    }

    fn reopen(&mut self) {
        self.stop(true);
        let log = Log::open_with_hook(&self.dir, options(), self.hook.clone()).unwrap();
        let rep = log.recovery_report().clone();
        assert!(rep.clean_shutdown, "clean close then open: {rep:#?}");
        assert_eq!(rep.bytes_scanned, 0, "a clean open scans nothing: {rep:#?}");
        assert!(
            !rep.changed_anything(),
            "a clean open changes nothing: {rep:#?}"
        );
        self.log = Some(log);
        // A clean close makes everything durable.
        for m in self.model.values_mut() {
            m.synced = m.records.len() as u64;
        }
        check_log(
            self.log.as_ref().expect("log is open"),
            &mut self.model,
            "clean reopen",
            &rep,
        );
    }

    fn crash(&mut self, seed: u64, torn_any_byte: bool) {
        self.stop(false);
        let opts = CrashOptions {
            torn_any_byte,
            keep_all_new_probability: 0.1,
        };
        let (image, trace) = self.hook.crash_image(seed, &opts);
        let dir = self.next_dir();
        image.write_to(&dir).unwrap();
        self.history
            .push(format!("  crash image: {}", trace.join("; ")));
        // After the reboot, what is on disk is durable; recovery runs under
        // a hook that records a crash point before each of its I/O steps.
        let hook = new_hook(&dir, self.settings);
        hook.record_steps(true);
        let before = self.model.clone();
        let log = match Log::open_with_hook(&dir, options(), hook.clone()) {
            Ok(l) => l,
            Err(e) => panic!("open after crash failed: {e}"),
        };
        hook.record_steps(false);
        let steps = hook.take_steps();
        if self.settings.gaps.recovery_deletions {
            hook.grant_deletions();
        }
        let rep = log.recovery_report().clone();
        self.history
            .push(format!("  recovery: {}", report_summary(&rep)));
        self.dir = dir;
        self.hook = hook;
        self.log = Some(log);
        check_log(
            self.log.as_ref().expect("log is open"),
            &mut self.model,
            "crash recovery",
            &rep,
        );
        self.crash_during_recovery(&before, &steps, seed);
        // Whatever recovery kept is durable once open returns.
        for m in self.model.values_mut() {
            m.synced = m.records.len() as u64;
        }
        self.reopen_is_idempotent();
    }

    /// A power loss at some of recovery's I/O steps, then recovery again:
    /// the synced records of `before` (the model when the first crash hit)
    /// survive, nothing else appears.
    fn crash_during_recovery(&mut self, before: &Model, steps: &[CrashPoint], seed: u64) {
        if steps.is_empty() || self.settings.recovery_crash_points == 0 {
            return;
        }
        let picks: Vec<usize> = if self.settings.recovery_crash_points >= steps.len() {
            (0..steps.len()).collect()
        } else {
            let mut rng = SplitMix64::new(seed ^ 0x5EC0_7E57);
            (0..self.settings.recovery_crash_points)
                .map(|_| rng.below(steps.len() as u64) as usize)
                .collect()
        };
        for i in picks {
            let point = &steps[i];
            let s = seed.wrapping_add(1 + i as u64);
            let (image, trace) = point.image(s, &CrashOptions::default());
            let dir = self.next_dir();
            image.write_to(&dir).unwrap();
            let what = format!(
                "crash during recovery, before step {i} of {} ({:?} {}), image seed {s}",
                steps.len(),
                point.op,
                point
                    .path
                    .strip_prefix(&self.dir)
                    .unwrap_or(&point.path)
                    .display()
            );
            self.history.push(format!("  {what}: {}", trace.join("; ")));
            let log = Log::open(&dir, options())
                .unwrap_or_else(|e| panic!("open after a {what} failed: {e}"));
            let rep = log.recovery_report().clone();
            let mut m = before.clone();
            check_log(&log, &mut m, &what, &rep);
            log.abandon();
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// C7: a second open after recovery changes nothing.
    fn reopen_is_idempotent(&mut self) {
        let before = contents(&self.dir);
        self.stop(false);
        let log = Log::open_with_hook(&self.dir, options(), self.hook.clone()).unwrap();
        let rep = log.recovery_report().clone();
        let only_created = !rep.files.is_empty()
            && rep
                .files
                .iter()
                .all(|f| matches!(f.action, FileAction::CreatedSegment));
        if self.settings.gaps.torn_seal_reopen && only_created && rep.holes.is_empty() {
            self.history.push(format!(
                "  (known gap: second open created a segment after a torn seal: {})",
                report_summary(&rep)
            ));
        } else {
            assert!(
                !rep.changed_anything(),
                "C7: second open after recovery changed something: {rep:#?}"
            );
            assert!(rep.holes.is_empty(), "{rep:#?}");
            let after = contents(&self.dir);
            assert!(
                before == after,
                "C7: second open changed files:\n{}",
                before.diff_summary(&after)
            );
        }
        self.log = Some(log);
        check_log(
            self.log.as_ref().expect("log is open"),
            &mut self.model,
            "second open",
            &rep,
        );
    }
}

/// What recovery did, in one line.
fn report_summary(rep: &RecoveryReport) -> String {
    let files: Vec<String> = rep
        .files
        .iter()
        .map(|f| format!("{} {:?}", f.file.display(), f.action))
        .collect();
    format!(
        "clean {}, scanned {} bytes, files [{}], holes {:?}",
        rep.clean_shutdown,
        rep.bytes_scanned,
        files.join("; "),
        rep.holes
    )
}

/// C1, C2, C3 and C5 against the model. Cuts the model to what survived.
fn check_log(log: &Log, model: &mut Model, what: &str, rep: &RecoveryReport) {
    let t = log.topic(TOPIC).unwrap_or_else(|e| {
        panic!("C5: {what}: the committed topic is gone ({e}); report: {rep:#?}")
    });
    let mut infos = t.partitions();
    infos.sort_by_key(|i| i.id);
    let ids: Vec<u32> = infos.iter().map(|i| i.id).collect();
    let want: Vec<u32> = model.keys().copied().collect();
    assert_eq!(
        ids, want,
        "C5: {what}: partitions are not those of the committed topology; report: {rep:#?}"
    );
    for info in &infos {
        let pid = info.id;
        let m = model.get_mut(&pid).expect("known partition");
        assert_eq!(
            info.sealed_at, m.sealed_at,
            "C5: {what}: partition {pid} is not sealed where its split or merge committed"
        );
        let p = t.partition(pid).unwrap();
        if p.is_empty_sealed() {
            // Retention removed every segment of a sealed partition; what
            // reading it gives is `append::read_path`'s subject, not this
            // test's.
            continue;
        }
        let (start, end) = (p.start_offset(), p.end_offset());
        let ctx = |m: &PartModel| {
            format!("{what}: partition {pid} holds {start}..{end}; model: {} records, synced {}, retained from {}, sealed at {:?}; report: {rep:#?}", m.records.len(), m.synced, m.retained_from, m.sealed_at)
        };
        assert!(end >= m.synced, "C1: synced records lost. {}", ctx(m));
        assert!(
            end <= m.records.len() as u64,
            "C2: phantom records past the end. {}",
            ctx(m)
        );
        assert!(
            start <= m.retained_from,
            "C1: records below the retention point vanished. {}",
            ctx(m)
        );
        let mut next = start;
        while next < end {
            let b = t
                .read(pid, next, 64 * 1024)
                .unwrap_or_else(|e| panic!("read at {next} failed: {e}. {}", ctx(m)));
            let mut n = 0;
            for r in b.iter() {
                assert_eq!(r.offset, next, "C3: offsets not contiguous. {}", ctx(m));
                let want = &m.records[r.offset as usize];
                assert!(
                    r.key == want.key.as_deref()
                        && r.value == want.value.as_slice()
                        && r.timestamp == want.timestamp,
                    "C2: record {} differs from the one appended. {}",
                    r.offset,
                    ctx(m)
                );
                next += 1;
                n += 1;
            }
            assert!(n > 0, "empty read at {next}. {}", ctx(m));
        }
        m.records.truncate(end as usize);
        m.retained_from = start;
    }
}

/// A scratch directory, on tmpfs when there is one (fsync is the cost
/// here, and tmpfs never reuses an inode number, which the model's file
/// identities rely on less than on birth times).
pub fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// Segment and manifest bytes (checkpoints, indexes and the lock excluded).
fn contents(dir: &Path) -> crate::common::crash::DirImage {
    let mut img = crate::common::crash::DirImage::capture(dir).unwrap();
    img.files.retain(|p, _| {
        let name = p.file_name().unwrap().to_string_lossy();
        !(name.starts_with("checkpoint.") || name.ends_with(".idx") || name == "fissionlog.lock")
    });
    img
}

/// Runs one case; on a contract violation returns the panic message with
/// the history of the case (operations and every crash image's choices).
pub fn try_case(case: &Case, settings: Settings) -> Result<(), String> {
    let mut h = Harness::new(case, settings);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for op in &case.ops {
            h.history.push(format!("{op:?}"));
            match op {
                Op::Append(recs) => h.append(recs),
                Op::Sync => h.sync(),
                Op::Roll(n) => h.roll(*n),
                Op::Retention => h.retention(),
                Op::Reopen => h.reopen(),
                Op::Crash {
                    seed,
                    torn_any_byte,
                } => h.crash(*seed, *torn_any_byte),
                Op::Split(n) => h.split(*n),
                Op::Merge(n) => h.merge(*n),
                Op::Recreate => h.recreate(),
            }
        }
        // Final: crash with everything synced must keep everything.
        h.sync();
        h.crash(0x5EED, false);
        for m in h.model.values() {
            assert_eq!(m.records.len() as u64, m.synced);
        }
    }));
    if std::env::var_os("FISSIONLOG_MODEL_TRACE").is_some() {
        eprintln!("history:\n{}", h.history.join("\n"));
    }
    match result {
        Ok(()) => Ok(()),
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            let mut out = format!(
                "{msg}\nmodel case failed (segment_bytes {}, retention {}, {:?}); history:\n",
                case.segment_bytes, case.retention, settings
            );
            for line in &h.history {
                out.push_str(line);
                out.push('\n');
            }
            if std::env::var_os("FISSIONLOG_MODEL_KEEP").is_some() {
                if let Some(log) = h.log.take() {
                    log.abandon();
                }
                out.push_str(&format!(
                    "kept directories under {}\n",
                    h.root.keep().display()
                ));
            }
            Err(out)
        }
    }
}

fn keyed(k: usize, size: Size) -> (Option<usize>, Size) {
    (Some(k), size)
}

fn crash_op(seed: u64) -> Op {
    Op::Crash {
        seed,
        torn_any_byte: false,
    }
}

/// Power loss at every I/O step of recovery (run with
/// `recovery_crash_points: usize::MAX`), over rolled, sealed, split and
/// merged partitions, with and without retention.
pub fn recovery_steps_case(seed: u64) -> Case {
    Case {
        segment_bytes: 4096,
        retention: seed.is_multiple_of(2),
        ops: vec![
            Op::Append(vec![keyed(0, Size::Small(200)), keyed(1, Size::Small(300))]),
            Op::Append(vec![keyed(0, Size::NearSegment(seed as usize))]),
            Op::Sync,
            Op::Append(vec![
                keyed(1, Size::NearSegment(3)),
                keyed(0, Size::Small(90)),
            ]),
            crash_op(seed),
            Op::Split(0),
            Op::Append(vec![keyed(0, Size::Small(120)), keyed(1, Size::Small(40))]),
            Op::Roll(1),
            Op::Append(vec![keyed(2, Size::Small(77))]),
            Op::Retention,
            crash_op(seed + 100),
            Op::Merge(0),
            Op::Append(vec![keyed(3, Size::Small(10))]),
            Op::Sync,
            Op::Append(vec![keyed(0, Size::Small(250))]),
            crash_op(seed + 200),
        ],
    }
}

/// Retention removes several segments of a partition, then power is lost
/// before the next sync round fsyncs their directory: any subset of them
/// may come back.
pub fn retention_case(seed: u64) -> Case {
    let mut ops = vec![Op::Append(vec![keyed(0, Size::Small(10))])];
    for _ in 0..6 {
        ops.push(Op::Append(vec![keyed(0, Size::NearSegment(0))]));
    }
    // The checkpoint lags a round behind, and retention keeps what the last
    // two checkpoints still name. Rounds write a checkpoint only when one
    // is due, or while retention waits for one: the first retention pass
    // finds its segments held and asks for checkpoints, three rounds write
    // them, and the second pass retires the segments.
    ops.extend([
        Op::Sync,
        Op::Retention,
        Op::Sync,
        Op::Sync,
        Op::Sync,
        Op::Retention,
        Op::Append(vec![keyed(0, Size::Small(20))]),
        crash_op(seed),
    ]);
    Case {
        segment_bytes: 4096,
        retention: true,
        ops,
    }
}

/// Several rolls with no sync round between them, then a power loss: each
/// directory entry a roll created may survive or not, independently,
/// unless a directory fsync covered it. A segment whose name survives
/// while an earlier one's is lost would look like a missing segment
/// (lost data) to recovery; each roll makes the earlier names durable
/// before it creates the next segment, so that state never arises.
pub fn roll_chain_case(seed: u64) -> Case {
    let mut ops = vec![Op::Append(vec![keyed(0, Size::Small(10))])];
    for i in 0..5 {
        ops.push(Op::Append(vec![keyed(0, Size::NearSegment(i))]));
    }
    ops.push(crash_op(seed));
    Case {
        segment_bytes: 4096,
        retention: false,
        ops,
    }
}
