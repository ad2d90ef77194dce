//! Reclaim of a tail-split parent's moved range (`Topic::reclaim_tail`,
//! also run by `Log::enforce_retention`): the bytes are released, every
//! record still reads exactly once (from the start and from cuts saved
//! inside the moved range), a read batch taken before the split keeps
//! valid bytes, and a power loss before every I/O step of the reclaim
//! leaves a log that opens in Strict mode and verifies clean.

use crate::common;

use std::path::Path;

use common::crash::{CrashOptions, DirImage};
use common::model_hook::ModelHook;
use common::tail::{append_big, check_exactly_once, config, drain, options, seq};
use fissionlog::{
    Cut, GroupOptions, IoOp, Log, LogOptions, MemberOptions, NewRecord, OwnedRecord, RecoveryMode,
    SplitPlan, StartAt, TailSplitOptions, Topic, TopicConfig,
};

const KEYS: u64 = 11;
/// Records appended; the split moves `FROM..N`.
const N: u64 = 600;
const FROM: u64 = 100;

fn strict() -> LogOptions {
    LogOptions {
        recovery: RecoveryMode::Strict,
        ..options()
    }
}

/// 64 KiB segments and values of about 1 KiB: the moved range spans
/// several segments, and starts inside one.
fn small() -> TopicConfig {
    config()
}

/// A cut after reading `at` records from the earliest.
fn cut_at(topic: &Topic, at: usize) -> Cut {
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    let mut n = 0;
    while n < at {
        n += r.poll(at - n).unwrap().len();
    }
    r.cut()
}

fn read_from(topic: &Topic, start: StartAt) -> Vec<OwnedRecord> {
    let mut r = topic.reader(start).unwrap();
    let mut out = Vec::new();
    drain(&mut r, &mut out);
    out
}

/// Every record once from the start, and from each cut what follows it.
fn check_reads(topic: &Topic, cuts: &[(u64, Cut)], ctx: &str) {
    check_exactly_once(&read_from(topic, StartAt::Earliest), 0..N, ctx);
    for (at, cut) in cuts {
        let got = read_from(topic, StartAt::Cut(cut.clone()));
        check_exactly_once(&got, *at..N, &format!("{ctx}: from the cut at {at}"));
    }
}

/// Verify reports nothing but stale index caches (a power loss keeps
/// index files of segments the open did not scan; they are rebuilt on
/// first use).
fn verify_clean(dir: &Path, ctx: &str) {
    let (_report, problems) = fissionlog::verify(dir).unwrap();
    let bad: Vec<_> = problems
        .iter()
        .filter(|p| p.what != "index does not match its segment")
        .collect();
    assert!(bad.is_empty(), "{ctx}: verify: {bad:?}");
}

/// Bytes allocated to the files of a partition directory.
fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap())
        .filter(|m| m.is_file())
        .map(|m| m.blocks() * 512)
        .sum()
}

fn p0(root: &Path) -> std::path::PathBuf {
    root.join("topics/t0/p0")
}

fn member_opts() -> MemberOptions {
    MemberOptions {
        session_timeout: std::time::Duration::from_secs(600),
        processing_timeout: std::time::Duration::from_secs(600),
        instance_id: None,
        background_heartbeat: None,
    }
}

/// Where group "g" commits before the split (inside the moved range).
const GROUP_AT: u64 = 350;

/// A member of group "g" reads everything left: exactly `GROUP_AT..N`.
fn check_group(topic: &Topic, ctx: &str) {
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let mut seen = Vec::new();
    let mut empty = 0;
    while empty < 2 {
        let got = m.poll(64).unwrap();
        if got.is_empty() {
            m.commit().unwrap();
            empty += 1;
        } else {
            empty = 0;
            seen.extend(got);
        }
    }
    m.leave().unwrap();
    check_exactly_once(&seen, GROUP_AT..N, &format!("{ctx}: group"));
}

/// Appends `N` records, saves cuts below and inside the moved range, has
/// group "g" commit at `GROUP_AT` and tail-splits partition 0 from `FROM`.
fn split_log(log: &Log) -> (Topic, Vec<(u64, Cut)>) {
    let topic = log.create_topic("t", small()).unwrap();
    append_big(&topic, 0, N, KEYS);
    {
        let g = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = g.join(member_opts()).unwrap();
        let mut n = 0;
        while n < GROUP_AT as usize {
            n += m.poll(GROUP_AT as usize - n).unwrap().len();
        }
        m.commit().unwrap();
        m.leave().unwrap();
    }
    log.sync().unwrap();
    let cuts: Vec<(u64, Cut)> = [50u64, 101, 599]
        .iter()
        .map(|&at| (at, cut_at(&topic, at as usize)))
        .collect();
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    assert_eq!((out.from, out.seal_offset), (FROM, N));
    (topic, cuts)
}

/// The parent keeps its records below the split offset and gives back
/// the rest: the moved range's segments are unlinked and the segment
/// holding the split offset is punched past it (measured as allocated
/// blocks). Every record reads once, from the start and from cuts saved
/// below and inside the moved range, before and after a Strict reopen;
/// verify is clean and the range shows as moved and reclaimed.
#[test]
fn reclaim_releases_the_moved_range_and_every_record_still_reads_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), strict()).unwrap();
    let (topic, cuts) = split_log(&log);
    let segs_before = topic.partition(0).unwrap().segment_count();
    let before = du(&p0(dir.path()));
    let out = topic.reclaim_tail(0).unwrap();
    let after = du(&p0(dir.path()));
    assert!(out.recorded && out.complete, "{out:?}");
    assert_eq!((out.from, out.to), (FROM, N));
    assert_eq!(out.released_bytes, before - after);
    // 500 of 600 records of about 1 KiB moved: at least 400 KiB released,
    // about 100 KiB (and at most one page of the moved range) kept.
    assert!(
        before - after >= 400 * 1024 && after <= 130 * 1024,
        "allocated before {before}, after {after}"
    );
    assert!(topic.partition(0).unwrap().segment_count() < segs_before);
    let moved = topic.partitions()[0].moved.clone().unwrap();
    assert!(moved.reclaimed, "{moved:?}");
    check_reads(&topic, &cuts, "after the reclaim");
    // Nothing more to do: no record, no bytes.
    let again = topic.reclaim_tail(0).unwrap();
    assert!(!again.recorded && again.complete && again.released_bytes == 0);
    drop(topic);
    log.close().unwrap();
    verify_clean(dir.path(), "closed");
    let log = Log::open(dir.path(), strict()).unwrap();
    let topic = log.topic("t").unwrap();
    assert!(topic.partitions()[0].moved.as_ref().unwrap().reclaimed);
    check_reads(&topic, &cuts, "reopened");
    check_group(&topic, "reopened");
    assert_eq!(du(&p0(dir.path())), after, "the open released nothing more");
}

/// A read batch taken before the split covers moved bytes of the
/// segment holding the split offset: the reclaim unlinks the later
/// segments but leaves that one whole while the batch lives, and the
/// batch reads valid records; once it is dropped, retention's pass
/// finishes the reclaim.
#[test]
fn a_read_batch_from_before_the_split_defers_the_cut_of_its_segment() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), strict()).unwrap();
    let topic = log.create_topic("t", small()).unwrap();
    append_big(&topic, 0, N, KEYS);
    log.sync().unwrap();
    let batch = topic.read(0, FROM - 5, 32 * 1024).unwrap();
    assert!(
        batch.next_offset() > FROM + 5,
        "the batch covers moved records"
    );
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    let out = topic.reclaim_tail(0).unwrap();
    assert!(out.recorded && !out.complete, "{out:?}");
    let offsets: Vec<u64> = batch
        .try_iter()
        .map(|r| r.unwrap().offset)
        .collect::<Vec<_>>();
    assert_eq!(offsets, (FROM - 5..batch.next_offset()).collect::<Vec<_>>());
    drop(batch);
    let before = du(&p0(dir.path()));
    log.enforce_retention().unwrap();
    assert!(du(&p0(dir.path())) < before, "the segment was cut");
    let again = topic.reclaim_tail(0).unwrap();
    assert!(!again.recorded && again.complete && again.released_bytes == 0);
    check_reads(&topic, &[], "after the deferred cut");
    drop(topic);
    log.close().unwrap();
    verify_clean(dir.path(), "closed");
}

/// A power loss before every I/O step of a reclaim (under the per-file
/// crash model): the log opens in Strict mode and reports nothing about
/// the parent, every record reads once from the start and from cuts saved
/// below and inside the moved range, a group committed inside it reads
/// exactly the rest,
/// the open finishes an interrupted reclaim (the parent's files end at the
/// split offset once the record is durable), and verify is clean. Salvage
/// and Truncate open the same images without a hole.
#[test]
fn power_loss_before_every_step_of_a_reclaim() {
    let dir = tempfile::tempdir().unwrap();
    let hook = ModelHook::new(dir.path(), None);
    hook.grant_segment_headers(true);
    let log = Log::open_with_hook(dir.path(), strict(), hook.clone()).unwrap();
    let (topic, cuts) = split_log(&log);
    log.sync().unwrap();
    let full = du(&p0(dir.path()));
    hook.record_steps(true);
    let out = topic.reclaim_tail(0).unwrap();
    hook.record_steps(false);
    assert!(out.complete, "{out:?}");
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    assert!(points.len() >= 4, "steps: {}", points.len());
    drop(topic);
    log.abandon();
    let opts = CrashOptions::default();
    let mut reclaimed_images = 0;
    // Several images per step: each keeps a different choice of the
    // unsynced pages.
    for (i, point, seed) in points
        .iter()
        .enumerate()
        .flat_map(|(i, p)| (0..2u64).map(move |s| (i, p, s)))
    {
        let (image, trace): (DirImage, _) = point.image(i as u64 * 7 + seed, &opts);
        let ctx = format!(
            "step {i} (before {:?}) image {seed}: {}",
            point.op,
            trace.join("; ")
        );
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("log");
        image.write_to(&root).unwrap();
        verify_clean(&root, &format!("{ctx}: before the open"));
        // The other recovery modes take the image the same way: no hole,
        // nothing reported about the parent (the first image of each step).
        let modes = if seed == 0 {
            &[RecoveryMode::Salvage, RecoveryMode::Truncate][..]
        } else {
            &[]
        };
        for &mode in modes {
            let d = tempfile::tempdir().unwrap();
            let root = d.path().join("log");
            image.write_to(&root).unwrap();
            let opts = LogOptions {
                recovery: mode,
                ..options()
            };
            let log = Log::open(&root, opts).unwrap();
            let report = log.recovery_report();
            let p0_reports: Vec<_> = report
                .files
                .iter()
                .filter(|f| f.file.starts_with(p0(&root)))
                .collect();
            assert!(
                report.holes.is_empty() && p0_reports.is_empty(),
                "{ctx}: {mode:?}: {:?} {p0_reports:?}",
                report.holes
            );
            check_reads(&log.topic("t").unwrap(), &cuts, &format!("{ctx}: {mode:?}"));
        }
        let log = Log::open(&root, strict()).unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
        let p0_reports: Vec<_> = log
            .recovery_report()
            .files
            .iter()
            .filter(|f| f.file.starts_with(p0(&root)))
            .collect();
        assert!(p0_reports.is_empty(), "{ctx}: {p0_reports:?}");
        let topic = log.topic("t").unwrap();
        check_reads(&topic, &cuts, &ctx);
        check_group(&topic, &ctx);
        let moved = topic.partitions()[0].moved.clone().unwrap();
        if moved.reclaimed {
            reclaimed_images += 1;
            assert!(
                du(&p0(&root)) < full / 2,
                "{ctx}: the open finished the reclaim"
            );
        }
        let again = topic.reclaim_tail(0).unwrap();
        assert!(again.complete, "{ctx}: {again:?}");
        check_reads(&topic, &cuts, &format!("{ctx}: reclaimed after the open"));
        drop(topic);
        log.close().unwrap();
        verify_clean(&root, &ctx);
    }
    assert!(reclaimed_images > 0, "some image has the record");
}

/// Split offsets at the edges: the partition's first offset (the parent
/// moved whole keeps an empty segment), a segment boundary (the segment
/// starting there is emptied, the one before it untouched) and the last
/// record. Each: every record once, from the start and from a cut inside
/// the moved range, after the reclaim and after a Strict reopen; verify
/// clean.
#[test]
fn reclaim_at_the_edges_of_segments() {
    let probe = tempfile::tempdir().unwrap();
    let boundary = {
        let log = Log::open(probe.path(), strict()).unwrap();
        let topic = log.create_topic("t", small()).unwrap();
        append_big(&topic, 0, N, KEYS);
        topic.partition(0).unwrap().segment_infos()[3].base_offset
    };
    for from in [0, boundary, N - 1] {
        let ctx = format!("from {from}");
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), strict()).unwrap();
        let topic = log.create_topic("t", small()).unwrap();
        append_big(&topic, 0, N, KEYS);
        log.sync().unwrap();
        let at = (from + N) / 2;
        let cuts = vec![(at, cut_at(&topic, at as usize))];
        topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(from))
            .unwrap();
        let before = du(&p0(dir.path()));
        let out = topic.reclaim_tail(0).unwrap();
        assert!(out.recorded && out.complete, "{ctx}: {out:?}");
        // One moved record of about 1 KiB may share its page with the
        // last kept one: nothing to release then.
        assert!(out.released_bytes > 0 || from == N - 1, "{ctx}: {out:?}");
        assert_eq!(du(&p0(dir.path())), before - out.released_bytes, "{ctx}");
        check_reads(&topic, &cuts, &ctx);
        drop(topic);
        log.close().unwrap();
        verify_clean(dir.path(), &ctx);
        let log = Log::open(dir.path(), strict()).unwrap();
        let topic = log.topic("t").unwrap();
        check_reads(&topic, &cuts, &format!("{ctx}: reopened"));
        let p = &topic.partitions()[0];
        assert_eq!(p.end_offset, from, "{ctx}: {p:?}");
        drop(topic);
        log.close().unwrap();
        verify_clean(dir.path(), &format!("{ctx}: reopened"));
    }
}

/// Appends records `from..from + n` as [`append_big`] does, stamped long
/// ago (retention by age takes them at once).
fn append_old(topic: &Topic, from: u64, n: u64) {
    let pad = "x".repeat(1000);
    for i in from..from + n {
        let key = format!("k{}", i % KEYS);
        let value = format!("{i}:{pad}");
        topic
            .append_batch(&[NewRecord {
                key: (i % 5 != 4).then_some(key.as_bytes()),
                value: value.as_bytes(),
                timestamp: Some(1_700_000_000_000),
            }])
            .unwrap();
    }
}

/// A cut saved past the split offset, once retention removed the parent
/// and the split's first child (which held the descendant index before
/// it moved to the topic's directory) while the second child lives on:
/// the position is still translated, live and after a Strict reopen. The
/// reader reads no record it had read, and what it reads plus what it is
/// told was retained is exactly what followed the cut (it used to read as
/// drained after a reopen, and the second child was reported from its
/// first offset).
#[test]
fn a_cut_past_the_split_offset_is_translated_after_the_first_child_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TopicConfig {
        retention_age: Some(std::time::Duration::from_secs(60)),
        ..small()
    };
    let log = Log::open(dir.path(), strict()).unwrap();
    let topic = log.create_topic("t", cfg).unwrap();
    append_old(&topic, 0, 400);
    let at = 300u64;
    let cut = cut_at(&topic, at as usize);
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    topic.split(out.children[0], SplitPlan::Even).unwrap();
    append_big(&topic, 400, 50, KEYS);
    log.enforce_retention().unwrap();
    let left: Vec<u32> = topic.partitions().iter().map(|p| p.id).collect();
    assert!(
        !left.contains(&0) && !left.contains(&out.children[0]) && left.contains(&out.children[1]),
        "parent and first child removed, second child kept: {left:?}"
    );
    check_cut_after_removal(&topic, &cut, at, "live");
    drop(topic);
    log.close().unwrap();
    let log = Log::open(dir.path(), strict()).unwrap();
    check_cut_after_removal(&log.topic("t").unwrap(), &cut, at, "reopened");
}

/// A reader from `cut` (saved after reading `at` of records `0..400`,
/// then 50 fresh ones appended) after retention removed old partitions:
/// no record it had read, each fresh one, none twice, and what it reads
/// plus what it is told was retained is exactly what followed the cut.
fn check_cut_after_removal(topic: &Topic, cut: &Cut, at: u64, ctx: &str) {
    let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
    let mut got = Vec::new();
    drain(&mut r, &mut got);
    let mut s: Vec<u64> = got.iter().map(seq).collect();
    s.sort_unstable();
    s.dedup();
    assert_eq!(s.len(), got.len(), "{ctx}: a record twice");
    assert!(s.iter().all(|&x| x >= at), "{ctx}: read again: {s:?}");
    assert!((400..450).all(|x| s.contains(&x)), "{ctx}: fresh records");
    let lost: u64 = r.retained().iter().map(|l| l.end - l.start).sum();
    assert_eq!(
        got.len() as u64 + lost,
        450 - at,
        "{ctx}: read {} and lost {:?}",
        got.len(),
        r.retained()
    );
}

/// Rewrites a closed log as a build before `index_in_topic_dir` wrote it:
/// the flag dropped from every manifest record (frames re-encoded:
/// length, CRC-32 of sequence and payload, sequence, payload), and the
/// descendant index of partition 0 moved into its first child's
/// directory.
fn to_old_layout(root: &Path, first_child: u32) {
    let tdir = root.join("topics/t0");
    std::fs::rename(
        tdir.join("tail-p0.tix"),
        tdir.join(format!("p{first_child}/tail-p0.tix")),
    )
    .unwrap();
    let path = root.join("manifest.log");
    let buf = std::fs::read(&path).unwrap();
    let mut out = buf[..16].to_vec();
    let mut pos = 16;
    let mut changed = 0;
    while pos + 16 <= buf.len() {
        let len = u32::from_le_bytes(buf[pos..pos + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        let seq = &buf[pos + 8..pos + 16];
        let payload = std::str::from_utf8(&buf[pos + 16..pos + 16 + len]).unwrap();
        let old = payload.replace(r#","index_in_topic_dir":true"#, "");
        changed += usize::from(old.len() != payload.len());
        let mut h = crc32fast::Hasher::new();
        h.update(seq);
        h.update(old.as_bytes());
        out.extend_from_slice(&(old.len() as u32).to_le_bytes());
        out.extend_from_slice(&h.finalize().to_le_bytes());
        out.extend_from_slice(seq);
        out.extend_from_slice(old.as_bytes());
        pos += 16 + len;
    }
    assert_eq!(changed, 1, "one TailSplit record");
    std::fs::write(&path, out).unwrap();
}

/// A log written before the descendant index moved to the topic's
/// directory (index in the first child's, records without the flag)
/// still opens in Strict mode and translates a cut inside the moved
/// range. Its reclaim first copies the index into the topic's directory
/// (the record then moves the entry to the new rule), so once retention
/// removed the parent and the first child, the cut still reads exactly
/// what followed it, live and after a reopen.
#[test]
fn a_reclaim_moves_an_older_splits_index_into_the_topic_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TopicConfig {
        retention_age: Some(std::time::Duration::from_secs(60)),
        ..small()
    };
    let log = Log::open(dir.path(), strict()).unwrap();
    let topic = log.create_topic("t", cfg).unwrap();
    append_old(&topic, 0, 400);
    let at = 300u64;
    let cut = cut_at(&topic, at as usize);
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(FROM))
        .unwrap();
    drop(topic);
    log.close().unwrap();
    to_old_layout(dir.path(), out.children[0]);

    let log = Log::open(dir.path(), strict()).unwrap();
    let topic = log.topic("t").unwrap();
    let got = read_from(&topic, StartAt::Cut(cut.clone()));
    check_exactly_once(&got, at..400, "older layout");
    let index = dir.path().join("topics/t0/tail-p0.tix");
    assert!(!index.exists());
    let r = topic.reclaim_tail(0).unwrap();
    assert!(r.recorded && r.complete, "{r:?}");
    assert!(
        index.exists(),
        "the index was copied into the topic directory"
    );
    topic.split(out.children[0], SplitPlan::Even).unwrap();
    append_big(&topic, 400, 50, KEYS);
    log.enforce_retention().unwrap();
    let left: Vec<u32> = topic.partitions().iter().map(|p| p.id).collect();
    assert!(
        !left.contains(&0) && !left.contains(&out.children[0]),
        "parent and first child removed: {left:?}"
    );
    check_cut_after_removal(&topic, &cut, at, "live");
    drop(topic);
    log.close().unwrap();
    verify_clean(dir.path(), "closed");
    let log = Log::open(dir.path(), strict()).unwrap();
    check_cut_after_removal(&log.topic("t").unwrap(), &cut, at, "reopened");
    assert!(
        index.exists(),
        "kept while the removed list names the parent"
    );
}

/// A reclaim interrupted right after its record (the first unlink's
/// directory sync fails), then a power loss before every I/O step of the
/// open that finishes it: each image opens in Strict mode with nothing
/// reported about the parent, every record reads once (from the start,
/// the cuts, the group), and the files end at the split offset.
#[test]
fn power_loss_while_the_open_finishes_an_interrupted_reclaim() {
    let dir = tempfile::tempdir().unwrap();
    let hook = ModelHook::new(dir.path(), None);
    hook.grant_segment_headers(true);
    let log = Log::open_with_hook(dir.path(), strict(), hook.clone()).unwrap();
    let (topic, cuts) = split_log(&log);
    log.sync().unwrap();
    let full = du(&p0(dir.path()));
    hook.set_fault(Some(Box::new(|op, _| match op {
        IoOp::SyncDir => Err(std::io::Error::from_raw_os_error(libc::EIO)),
        _ => Ok(()),
    })));
    assert!(
        topic.reclaim_tail(0).is_err(),
        "the first unlink's sync fails"
    );
    hook.set_fault(None);
    drop(topic);
    log.abandon();

    let hook = ModelHook::new(dir.path(), None);
    hook.grant_segment_headers(true);
    hook.record_steps(true);
    let log = Log::open_with_hook(dir.path(), strict(), hook.clone()).unwrap();
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    assert!(
        du(&p0(dir.path())) < full / 2,
        "the open finished the reclaim"
    );
    log.abandon();
    let opts = CrashOptions::default();
    for (i, point) in points.iter().enumerate() {
        let (image, trace): (DirImage, _) = point.image(i as u64 * 5 + 3, &opts);
        let ctx = format!(
            "open step {i} (before {:?}): {}",
            point.op,
            trace.join("; ")
        );
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("log");
        image.write_to(&root).unwrap();
        let log = Log::open(&root, strict()).unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
        let p0_reports: Vec<_> = log
            .recovery_report()
            .files
            .iter()
            .filter(|f| f.file.starts_with(p0(&root)))
            .collect();
        assert!(p0_reports.is_empty(), "{ctx}: {p0_reports:?}");
        let topic = log.topic("t").unwrap();
        assert!(topic.partitions()[0].moved.as_ref().unwrap().reclaimed);
        check_reads(&topic, &cuts, &ctx);
        check_group(&topic, &ctx);
        assert!(du(&p0(&root)) < full / 2, "{ctx}: reclaimed");
        drop(topic);
        log.close().unwrap();
        verify_clean(&root, &ctx);
    }
}

/// A parent moved whole keeps one empty segment once reclaimed; after a
/// reopen retention by age still removes it, and a cut inside the moved
/// range then reads what is left exactly once.
#[test]
fn a_reclaimed_parent_moved_whole_is_removed_by_retention_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TopicConfig {
        retention_age: Some(std::time::Duration::from_secs(60)),
        ..small()
    };
    let log = Log::open(dir.path(), strict()).unwrap();
    let topic = log.create_topic("t", cfg).unwrap();
    append_old(&topic, 0, 200);
    let cut = cut_at(&topic, 120);
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(0))
        .unwrap();
    let out = topic.reclaim_tail(0).unwrap();
    assert!(out.complete && out.released_bytes > 0, "{out:?}");
    append_big(&topic, 200, 20, KEYS);
    drop(topic);
    log.close().unwrap();
    let log = Log::open(dir.path(), strict()).unwrap();
    let topic = log.topic("t").unwrap();
    log.enforce_retention().unwrap();
    let left: Vec<u32> = topic.partitions().iter().map(|p| p.id).collect();
    assert!(!left.contains(&0), "parent removed: {left:?}");
    let mut r = topic.reader(StartAt::Cut(cut)).unwrap();
    let mut got = Vec::new();
    drain(&mut r, &mut got);
    let mut s: Vec<u64> = got.iter().map(seq).collect();
    s.sort_unstable();
    s.dedup();
    assert_eq!(s.len(), got.len(), "a record twice");
    assert!(s.iter().all(|&x| x >= 120), "read again: {s:?}");
    assert!((200..220).all(|x| s.contains(&x)), "fresh records: {s:?}");
    drop(topic);
    log.close().unwrap();
    verify_clean(dir.path(), "after the removal");
}
