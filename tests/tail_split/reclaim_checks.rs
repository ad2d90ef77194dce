//! The tail-split reclaim: checks of a reclaimed log (verify,
//! Salvage, a damaged or missing descendant index), and readers holding
//! positions or batches in the parent while the reclaim runs.

use crate::common;

use std::path::{Path, PathBuf};

use common::tail::{config, drain, options, seq};
use fissionlog::{
    Log, LogOptions, OwnedRecord, RecoveryMode, SplitPlan, StartAt, TailSplitOptions, Topic,
};

/// Records appended; the split moves `FROM..N`.
const N: u64 = 400;
const FROM: u64 = 100;

fn opts(recovery: RecoveryMode) -> LogOptions {
    LogOptions {
        recovery,
        ..options()
    }
}

/// Values of about 1 KiB, keys `k{i % 7}`: 64 KiB segments hold about 60.
fn append_big(topic: &Topic, from: u64, n: u64) {
    let pad = "x".repeat(1000);
    for i in from..from + n {
        let key = format!("k{}", i % 7);
        topic
            .append(Some(key.as_bytes()), format!("{i}:{pad}").as_bytes())
            .unwrap();
    }
}

fn read_from(topic: &Topic, start: StartAt) -> Vec<OwnedRecord> {
    let mut r = topic.reader(start).unwrap();
    let mut out = Vec::new();
    drain(&mut r, &mut out);
    out
}

fn sorted(seen: &[OwnedRecord]) -> Vec<u64> {
    let mut s: Vec<u64> = seen.iter().map(seq).collect();
    s.sort_unstable();
    s
}

/// Creates topic "t", appends `N` records, tail-splits partition 0 from
/// `FROM`, reclaims it (complete) and closes the log.
fn reclaimed_log(dir: &Path) {
    let log = Log::open(dir, opts(RecoveryMode::Strict)).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append_big(&topic, 0, N);
    log.sync().unwrap();
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    let out = topic.reclaim_tail(0).unwrap();
    assert!(out.recorded && out.complete, "{out:?}");
    drop(topic);
    log.close().unwrap();
}

fn p0(root: &Path) -> PathBuf {
    root.join("topics/t0/p0")
}

fn index_file(root: &Path) -> PathBuf {
    root.join("topics/t0/tail-p0.tix")
}

/// The parent's segment files, by base offset.
fn segments(pdir: &Path) -> Vec<(u64, PathBuf)> {
    let mut v: Vec<(u64, PathBuf)> = std::fs::read_dir(pdir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let base = name.strip_suffix(".seg")?.parse().ok()?;
            Some((base, e.path()))
        })
        .collect();
    v.sort();
    v
}

/// File position of the batch starting at `offset` in a segment file
/// (64-byte segment header, then 40-byte batch headers: length at 0,
/// record count at 12, base offset at 16, little-endian).
fn batch_position(data: &[u8], offset: u64) -> usize {
    let mut pos = 64;
    loop {
        let len = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap()) as usize;
        let base = u64::from_le_bytes(data[pos + 16..pos + 24].try_into().unwrap());
        assert!(len > 0, "no batch starts at {offset}");
        if base == offset {
            return pos;
        }
        pos += len;
    }
}

/// `verify` on a reclaimed log whose descendant index is missing or
/// damaged: the index is the only record of which child holds which
/// moved offset once the parent's bytes are gone, and the open refuses
/// the log without it, so verify must not call the log clean.
#[test]
fn verify_reports_a_missing_or_damaged_descendant_index_of_a_reclaimed_parent() {
    for damage in ["missing", "flipped"] {
        let dir = tempfile::tempdir().unwrap();
        reclaimed_log(dir.path());
        let (_, problems) = fissionlog::verify(dir.path()).unwrap();
        assert!(problems.is_empty(), "clean before: {problems:?}");
        let path = index_file(dir.path());
        if damage == "missing" {
            std::fs::remove_file(&path).unwrap();
        } else {
            let mut bytes = std::fs::read(&path).unwrap();
            let last = bytes.len() - 1;
            bytes[last] ^= 0x5a;
            std::fs::write(&path, bytes).unwrap();
        }
        let err = Log::open(dir.path(), opts(RecoveryMode::Strict))
            .err()
            .unwrap_or_else(|| panic!("{damage}: the open must refuse"));
        assert!(
            err.to_string().contains("tail-p0.tix"),
            "{damage}: the error names the index: {err}"
        );
        let (_, problems) = fissionlog::verify(dir.path()).unwrap();
        assert!(
            problems
                .iter()
                .any(|p| p.file.ends_with("tail-p0.tix") || p.what.contains("tail-p0.tix")),
            "{damage}: verify names the index: {problems:?}"
        );
    }
}

/// The same damage to the index, opened by Truncate and Salvage: the log
/// opens (one file must not make every topic unreadable), the report
/// names the index, and translation is conservative. A cut saved inside
/// the moved range before the split resumes the children at their first
/// moved record: every record after the cut is read, and the only ones
/// read again are moved records the cut had passed. A reader from the
/// earliest reads every record exactly once. Strict still refuses.
#[test]
fn truncate_and_salvage_open_a_log_whose_descendant_index_is_lost() {
    use fissionlog::{Cut, FileAction};
    for damage in ["missing", "flipped"] {
        for mode in [RecoveryMode::Truncate, RecoveryMode::Salvage] {
            let dir = tempfile::tempdir().unwrap();
            let at = 250u64;
            let cut: Cut = {
                let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
                let topic = log.create_topic("t", config()).unwrap();
                append_big(&topic, 0, N);
                log.sync().unwrap();
                let mut r = topic.reader(StartAt::Earliest).unwrap();
                let mut n = 0;
                while n < at as usize {
                    n += r.poll(at as usize - n).unwrap().len();
                }
                let cut = r.cut();
                topic
                    .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
                    .unwrap();
                assert!(topic.reclaim_tail(0).unwrap().complete);
                drop((r, topic));
                log.close().unwrap();
                cut
            };
            let path = index_file(dir.path());
            if damage == "missing" {
                std::fs::remove_file(&path).unwrap();
            } else {
                let mut bytes = std::fs::read(&path).unwrap();
                bytes[40] ^= 0x5a;
                std::fs::write(&path, bytes).unwrap();
            }
            let ctx = format!("{damage}, {mode:?}");
            let log = Log::open(dir.path(), opts(mode)).unwrap();
            let named = log.recovery_report().files.iter().any(|f| {
                f.file == path
                    && matches!(
                        f.action,
                        FileAction::DescendantIndexLost {
                            parent: 0,
                            moved_offsets: (FROM, N),
                            ..
                        }
                    )
            });
            assert!(named, "{ctx}: {:?}", log.recovery_report().files);
            let topic = log.topic("t").unwrap();
            assert_eq!(
                sorted(&read_from(&topic, StartAt::Earliest)),
                (0..N).collect::<Vec<_>>(),
                "{ctx}: earliest"
            );
            let got = sorted(&read_from(&topic, StartAt::Cut(cut.clone())));
            // Records at..N after the cut, and FROM..at (read before the
            // cut) once more.
            assert_eq!(
                got,
                (FROM..N).collect::<Vec<_>>(),
                "{ctx}: from the cut, the passed moved records again"
            );
            drop(topic);
            log.close().unwrap();
            assert!(
                Log::open(dir.path(), opts(RecoveryMode::Strict)).is_err(),
                "{ctx}: Strict still refuses"
            );
        }
    }
}

/// A damaged batch header below the split offset, in the segment that
/// holds it, after a complete reclaim and a clean close: a full scan
/// finds it (verify, Strict refuses) and Salvage keeps every valid record
/// around it (a hole of the damaged batch only, as for the same damage in
/// any sealed segment). The clean close's checkpoint named the segment's
/// old end offset at the cut's position (the writer kept its pre-cut
/// end), and the open took the walk that stops at the damage for the
/// reclaim's cut: offsets 90..100 became one hole, nine valid records lost.
#[test]
fn salvage_after_a_reclaim_keeps_the_records_after_damage_below_the_split_offset() {
    let dir = tempfile::tempdir().unwrap();
    reclaimed_log(dir.path());
    let segs = segments(&p0(dir.path()));
    let (base, path) = segs.iter().rfind(|(b, _)| *b <= FROM).cloned().unwrap();
    let damaged = FROM - 10;
    assert!(base < damaged, "the damage lies in the segment holding X");
    let mut data = std::fs::read(&path).unwrap();
    let pos = batch_position(&data, damaged);
    data[pos + 8] ^= 0xff; // the magic
    std::fs::write(&path, &data).unwrap();
    let (_, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(
        problems.iter().any(|p| p.file == path),
        "verify reports the damage: {problems:?}"
    );
    let scan = |recovery| LogOptions {
        full_scan: true,
        ..opts(recovery)
    };
    assert!(
        Log::open(dir.path(), scan(RecoveryMode::Strict)).is_err(),
        "Strict refuses damage below X"
    );
    let log = Log::open(dir.path(), scan(RecoveryMode::Salvage)).unwrap();
    let holes: Vec<_> = log
        .recovery_report()
        .holes
        .iter()
        .map(|h| (h.topic.clone(), h.partition, h.offsets.start, h.offsets.end))
        .collect();
    assert_eq!(holes, vec![("t".to_string(), 0, damaged, damaged + 1)]);
    let topic = log.topic("t").unwrap();
    let got = sorted(&read_from(&topic, StartAt::Earliest));
    let want: Vec<u64> = (0..N).filter(|&i| i != damaged).collect();
    assert_eq!(got, want, "every valid record");
    drop(topic);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "clean after the salvage: {problems:?}");
}

/// A cut after reading `at` records from the earliest.
fn cut_at(topic: &Topic, at: usize) -> fissionlog::Cut {
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    let mut n = 0;
    while n < at {
        n += r.poll(at - n).unwrap().len();
    }
    r.cut()
}

/// Readers that hold positions in the parent while the reclaim runs: one
/// below the split offset with records pending in its last batch, one
/// polling in another thread throughout. Each reads every record once,
/// and the deferred cut happens once the pending batch is gone.
#[test]
fn readers_holding_the_parent_while_the_reclaim_runs_read_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append_big(&topic, 0, N);
    log.sync().unwrap();
    let mut held = topic.reader(StartAt::Earliest).unwrap();
    let mut seen = Vec::new();
    while seen.len() < (FROM - 3) as usize {
        seen.extend(held.poll((FROM - 3) as usize - seen.len()).unwrap());
    }
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let poller = s.spawn(|| {
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::Acquire) || rounds < 3 {
                let got = sorted(&read_from(&topic, StartAt::Earliest));
                assert_eq!(got, (0..N).collect::<Vec<_>>(), "poller round {rounds}");
                rounds += 1;
            }
        });
        let out = topic.reclaim_tail(0).unwrap();
        assert!(out.recorded, "{out:?}");
        stop.store(true, std::sync::atomic::Ordering::Release);
        poller.join().unwrap();
    });
    drain(&mut held, &mut seen);
    assert_eq!(sorted(&seen), (0..N).collect::<Vec<_>>(), "the held reader");
    drop(held);
    let again = topic.reclaim_tail(0).unwrap();
    assert!(again.complete, "{again:?}");
    let end = topic.reclaim_tail(0).unwrap();
    assert!(!end.recorded && end.complete && end.released_bytes == 0);
    assert_eq!(
        sorted(&read_from(&topic, StartAt::Earliest)),
        (0..N).collect::<Vec<_>>()
    );
    drop(topic);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// After a reclaim the children merge back and more records follow: reads
/// from the start and from cuts below, inside and past the moved range
/// return exactly what follows, before and after a Strict reopen, and the
/// log verifies clean.
#[test]
fn a_merge_of_the_children_after_a_reclaim_keeps_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append_big(&topic, 0, N);
    log.sync().unwrap();
    let cuts: Vec<(u64, fissionlog::Cut)> = [50u64, 150, 399]
        .iter()
        .map(|&at| (at, cut_at(&topic, at as usize)))
        .collect();
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    let r = topic.reclaim_tail(0).unwrap();
    assert!(r.complete, "{r:?}");
    topic.merge(out.children[0], out.children[1]).unwrap();
    append_big(&topic, N, 50);
    let total = N + 50;
    let check = |topic: &Topic, ctx: &str| {
        assert_eq!(
            sorted(&read_from(topic, StartAt::Earliest)),
            (0..total).collect::<Vec<_>>(),
            "{ctx}: from the start"
        );
        for (at, cut) in &cuts {
            assert_eq!(
                sorted(&read_from(topic, StartAt::Cut(cut.clone()))),
                (*at..total).collect::<Vec<_>>(),
                "{ctx}: from the cut at {at}"
            );
        }
    };
    check(&topic, "live");
    drop(topic);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    assert!(
        log.recovery_report().files.is_empty(),
        "{:?}",
        log.recovery_report().files
    );
    check(&log.topic("t").unwrap(), "reopened");
}

/// Records `from..from + n` as [`append_big`] does, stamped long ago
/// (retention by age takes them at once).
fn append_old(topic: &Topic, from: u64, n: u64) {
    let pad = "x".repeat(1000);
    for i in from..from + n {
        let key = format!("k{}", i % 7);
        let value = format!("{i}:{pad}");
        topic
            .append_batch(&[fissionlog::NewRecord {
                key: Some(key.as_bytes()),
                value: value.as_bytes(),
                timestamp: Some(1_700_000_000_000),
            }])
            .unwrap();
    }
}

/// Reclaim, then retention takes the parent's records below the split
/// offset (old) and the parent, then a Strict reopen: the open reports
/// nothing, reads from the start and from a cut inside the moved range
/// return exactly the moved and later records, the index file stays while
/// the removed list names the parent, and verify is clean.
#[test]
fn reclaim_then_retention_removes_the_parent_and_a_reopen_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fissionlog::TopicConfig {
        retention_age: Some(std::time::Duration::from_secs(60)),
        ..config()
    };
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    let topic = log.create_topic("t", cfg).unwrap();
    append_old(&topic, 0, FROM);
    append_big(&topic, FROM, N - FROM);
    log.sync().unwrap();
    let cut = cut_at(&topic, 250);
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    log.enforce_retention().unwrap();
    log.sync().unwrap();
    drop(topic);
    log.close().unwrap();
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    assert!(
        log.recovery_report().files.is_empty(),
        "{:?}",
        log.recovery_report().files
    );
    log.enforce_retention().unwrap();
    let topic = log.topic("t").unwrap();
    let ids: Vec<u32> = topic.partitions().iter().map(|p| p.id).collect();
    assert!(!ids.contains(&0), "parent removed: {ids:?}");
    assert!(index_file(dir.path()).exists(), "the index stays");
    let check = |topic: &Topic, ctx: &str| {
        assert_eq!(
            sorted(&read_from(topic, StartAt::Earliest)),
            (FROM..N).collect::<Vec<_>>(),
            "{ctx}: from the start"
        );
        assert_eq!(
            sorted(&read_from(topic, StartAt::Cut(cut.clone()))),
            (250..N).collect::<Vec<_>>(),
            "{ctx}: from the cut"
        );
    };
    check(&topic, "live");
    drop(topic);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    assert!(
        log.recovery_report().files.is_empty(),
        "{:?}",
        log.recovery_report().files
    );
    check(&log.topic("t").unwrap(), "reopened");
}

/// Truncate after a reclaim, with a damaged batch header below the split
/// offset: the records from the damage to the split offset go, and the
/// open says so (the reclaim's own cut is not reported; this one is).
#[test]
fn truncate_after_a_reclaim_reports_damage_below_the_split_offset() {
    let dir = tempfile::tempdir().unwrap();
    reclaimed_log(dir.path());
    let (_, path) = segments(&p0(dir.path()))
        .into_iter()
        .rfind(|(b, _)| *b <= FROM)
        .unwrap();
    let damaged = FROM - 10;
    let mut data = std::fs::read(&path).unwrap();
    let pos = batch_position(&data, damaged);
    data[pos + 8] ^= 0xff;
    std::fs::write(&path, &data).unwrap();
    let log = Log::open(
        dir.path(),
        LogOptions {
            full_scan: true,
            ..opts(RecoveryMode::Truncate)
        },
    )
    .unwrap();
    let files = log.recovery_report().files.clone();
    assert!(
        files.iter().any(|f| f.file.starts_with(p0(dir.path()))),
        "the cut is reported: {files:?}"
    );
    let topic = log.topic("t").unwrap();
    let got = sorted(&read_from(&topic, StartAt::Earliest));
    let want: Vec<u64> = (0..damaged).chain(FROM..N).collect();
    assert_eq!(got, want);
    drop(topic);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// A tail split of a tail split's child, both reclaimed: cuts saved in
/// the first parent's moved range (landing, translated, inside the
/// child's moved range too) read exactly what follows them, live and
/// after a Strict reopen; verify is clean.
#[test]
fn nested_tail_splits_both_reclaimed_translate_cuts_twice() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append_big(&topic, 0, N);
    log.sync().unwrap();
    let cuts: Vec<(u64, fissionlog::Cut)> = [50u64, 120, 300, 399]
        .iter()
        .map(|&at| (at, cut_at(&topic, at as usize)))
        .collect();
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    let child = out.children[0];
    let moved = out.moved[0];
    assert!(moved > 20, "{out:?}");
    let inner = topic
        .split_tail(child, SplitPlan::Even, TailSplitOptions::from_offset(10))
        .unwrap();
    assert!(inner.from <= 10 && inner.seal_offset == moved, "{inner:?}");
    log.enforce_retention().unwrap();
    for p in [0, child] {
        let again = topic.reclaim_tail(p).unwrap();
        assert!(!again.recorded && again.complete, "{p}: {again:?}");
    }
    let check = |topic: &Topic, ctx: &str| {
        assert_eq!(
            sorted(&read_from(topic, StartAt::Earliest)),
            (0..N).collect::<Vec<_>>(),
            "{ctx}: from the start"
        );
        for (at, cut) in &cuts {
            assert_eq!(
                sorted(&read_from(topic, StartAt::Cut(cut.clone()))),
                (*at..N).collect::<Vec<_>>(),
                "{ctx}: from the cut at {at}"
            );
        }
    };
    check(&topic, "live");
    drop(topic);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    assert!(
        log.recovery_report().files.is_empty(),
        "{:?}",
        log.recovery_report().files
    );
    check(&log.topic("t").unwrap(), "reopened");
}

/// The value's sequence number (values are `i:...`).
fn value_seq(value: &[u8]) -> u64 {
    let v = std::str::from_utf8(value).unwrap();
    v.split(':').next().unwrap().parse().unwrap()
}

/// Direct reads of a reclaimed parent and per-key reads, with the cut
/// done and while it is deferred: a read batch from below the split
/// offset stops there, one from past it holds no record (never the
/// zeros of the released range read as records), and `read_key` returns
/// each record of a key once, in order, live and after a reopen.
#[test]
fn direct_and_per_key_reads_of_a_reclaimed_parent_stop_at_the_split_offset() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append_big(&topic, 0, N);
    log.sync().unwrap();
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    let check = |topic: &Topic, ctx: &str| {
        let b = topic.read(0, FROM - 5, 1 << 20).unwrap();
        let offs: Vec<u64> = b.try_iter().map(|r| r.unwrap().offset).collect();
        assert_eq!(offs, (FROM - 5..FROM).collect::<Vec<_>>(), "{ctx}: below X");
        for at in [FROM, FROM + 1, N - 1] {
            if let Ok(b) = topic.read(0, at, 1 << 20) {
                let n = b.try_iter().count();
                assert_eq!(n, 0, "{ctx}: a read of the parent at {at}");
            }
        }
        for k in 0..7u64 {
            let key = format!("k{k}");
            let got: Vec<u64> = topic
                .read_key(key.as_bytes())
                .unwrap()
                .iter()
                .map(|r| value_seq(&r.value))
                .collect();
            let want: Vec<u64> = (0..N).filter(|i| i % 7 == k).collect();
            assert_eq!(got, want, "{ctx}: key {key}");
        }
    };
    check(&topic, "before the reclaim");
    {
        // A batch from before the reclaim (below X) defers the cut.
        let held = topic.read(0, FROM - 2, 1 << 20).unwrap();
        let out = topic.reclaim_tail(0).unwrap();
        assert!(out.recorded, "{out:?}");
        check(&topic, "deferred");
        let offs: Vec<u64> = held.try_iter().map(|r| r.unwrap().offset).collect();
        assert_eq!(offs, vec![FROM - 2, FROM - 1]);
    }
    let out = topic.reclaim_tail(0).unwrap();
    assert!(out.complete, "{out:?}");
    check(&topic, "reclaimed");
    drop(topic);
    log.close().unwrap();
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    check(&log.topic("t").unwrap(), "reopened");
}

/// A reclaim deferred by a read batch (the later segments unlinked, the
/// segment holding the split offset whole), a sync round, then the
/// deferred cut and another sync round, with a power loss before every
/// I/O step of the cut and the round after it: every image opens in
/// Strict and Salvage mode with nothing reported about the parent and no
/// hole, every record reads once from the start, and verify is clean.
#[test]
fn power_loss_around_a_deferred_cut_and_the_sync_after_it() {
    use common::crash::{CrashOptions, DirImage};
    use common::model_hook::ModelHook;
    use fissionlog::IoOp;
    let dir = tempfile::tempdir().unwrap();
    let hook = ModelHook::new(dir.path(), None);
    hook.grant_segment_headers(true);
    let log = Log::open_with_hook(dir.path(), opts(RecoveryMode::Strict), hook.clone()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append_big(&topic, 0, N);
    log.sync().unwrap();
    let held = topic.read(0, FROM - 5, 32 * 1024).unwrap();
    assert!(held.next_offset() > FROM, "the batch covers moved records");
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    let out = topic.reclaim_tail(0).unwrap();
    assert!(out.recorded && !out.complete, "{out:?}");
    log.sync().unwrap();
    drop(held);
    hook.record_steps(true);
    let out = topic.reclaim_tail(0).unwrap();
    assert!(out.complete, "{out:?}");
    log.sync().unwrap();
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    assert!(points.len() >= 3, "steps: {}", points.len());
    drop(topic);
    log.abandon();
    for (i, point) in points.iter().enumerate() {
        let (image, trace): (DirImage, _) = point.image(i as u64, &CrashOptions::default());
        let ctx = format!("step {i} (before {:?}): {}", point.op, trace.join("; "));
        for mode in [RecoveryMode::Strict, RecoveryMode::Salvage] {
            let d = tempfile::tempdir().unwrap();
            let root = d.path().join("log");
            image.write_to(&root).unwrap();
            let log = Log::open(&root, opts(mode)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let report = log.recovery_report();
            let about_p0: Vec<_> = report
                .files
                .iter()
                .filter(|f| f.file.starts_with(p0(&root)))
                .collect();
            assert!(
                report.holes.is_empty() && about_p0.is_empty(),
                "{ctx}: {mode:?}: {:?} {about_p0:?}",
                report.holes
            );
            let topic = log.topic("t").unwrap();
            assert_eq!(
                sorted(&read_from(&topic, StartAt::Earliest)),
                (0..N).collect::<Vec<_>>(),
                "{ctx}: {mode:?}"
            );
            drop(topic);
            log.close().unwrap();
            let (_, problems) = fissionlog::verify(&root).unwrap();
            let bad: Vec<_> = problems
                .iter()
                .filter(|p| p.what != "index does not match its segment")
                .collect();
            assert!(bad.is_empty(), "{ctx}: {mode:?}: {bad:?}");
        }
    }
}

/// A hot-key era that starts after a reclaim (windowed, over the tail
/// split's children) and more records of the key: `read_key` returns
/// every record of the key once and in order (the parent below the split
/// offset, the moved range from the children, then the windows), live
/// and after a Strict reopen.
#[test]
fn a_hot_key_era_after_a_reclaim_reads_the_key_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    let cfg = fissionlog::TopicConfig {
        hot_keys: fissionlog::HotKeyPolicy {
            allow_windowed: true,
            allow_spread: false,
            max_lanes: 4,
            auto_window: None,
        },
        ..config()
    };
    let topic = log.create_topic("t", cfg).unwrap();
    append_big(&topic, 0, N);
    log.sync().unwrap();
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    assert!(topic.reclaim_tail(0).unwrap().complete);
    topic
        .set_hot_key_mode(
            b"k3",
            fissionlog::HotKeyMode::Windowed(std::time::Duration::from_millis(1)),
        )
        .unwrap();
    let pad = "x".repeat(100);
    for i in N..N + 40 {
        topic
            .append(Some(b"k3"), format!("{i}:{pad}").as_bytes())
            .unwrap();
        if i % 10 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    let want: Vec<u64> = (0..N).filter(|i| i % 7 == 3).chain(N..N + 40).collect();
    let check = |topic: &Topic, ctx: &str| {
        let got: Vec<u64> = topic
            .read_key(b"k3")
            .unwrap()
            .iter()
            .map(|r| value_seq(&r.value))
            .collect();
        assert_eq!(got, want, "{ctx}");
    };
    check(&topic, "live");
    drop(topic);
    log.close().unwrap();
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    check(&log.topic("t").unwrap(), "reopened");
}
