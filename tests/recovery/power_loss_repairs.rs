//! Recovery, the checkpoint cadence and segment
//! creation (contracts C1-C3, C5, C7, C8). Each test builds the exact
//! power-loss image it needs from the per-file crash model
//! (`common::model_hook`): every file as of its own last fsync, plus the
//! pages the test names as written back.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::crash::{DirImage, PAGE_SIZE};
use common::durable::NodeId;
use common::faults::{Both, Gate};
use common::model_hook::{CrashPoint, ModelHook};
use fissionlog::IoOp;
use fissionlog::{Log, LogOptions, NewRecord, RecoveryMode, SyncPolicy, TopicConfig};

/// Bytes a one-record batch adds beyond its value (batch header, record
/// header, the one-byte key): docs/FORMAT.md.
const ONE_RECORD_OVERHEAD: u64 = 40 + 16 + 1;
/// Length of a segment header.
const SEGMENT_HEADER: u64 = 64;

fn opts(recovery: RecoveryMode) -> LogOptions {
    LogOptions {
        balancer: false,
        background_retention: false,
        recovery,
        // Every sync round writes the checkpoint (of the previous round's
        // durable positions), so two syncs put it at the synced end.
        checkpoint_interval: Duration::ZERO,
        ..LogOptions::default()
    }
}

fn topic(segment_bytes: u64) -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    }
}

/// Appends one record of `len` value bytes filled with `tag` to partition
/// 0 of topic "t"; returns its offset.
fn put_one(log: &Log, tag: u8, len: u64) -> u64 {
    let value = vec![tag; len as usize];
    log.topic("t")
        .unwrap()
        .append_to(
            0,
            &[NewRecord {
                key: Some(b"k"),
                value: &value,
                timestamp: Some(i64::from(tag)),
            }],
        )
        .unwrap()
}

/// File position where the next batch of partition 0 of "t" goes (its
/// last segment's committed end).
fn write_pos(log: &Log) -> u64 {
    let infos = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .segment_infos();
    SEGMENT_HEADER + infos.last().unwrap().data_bytes
}

/// A log directory `root/name` with a model hook watching it.
fn fresh(root: &Path, name: &str) -> (PathBuf, std::sync::Arc<ModelHook>) {
    let dir = root.join(name);
    std::fs::create_dir(&dir).unwrap();
    let hook = ModelHook::new(&dir, None);
    (dir, hook)
}

/// A power-loss image: the live tree (every page written back), except
/// that the pages of `rel` for which `old_page(page_index)` holds keep the
/// file's durable content (what its last fsync covered; zeros past it).
fn image_with_old_pages(
    dir: &Path,
    point: &CrashPoint,
    rel: &Path,
    old_page: impl Fn(usize) -> bool,
) -> DirImage {
    let mut img = DirImage::capture(dir).unwrap();
    let id = NodeId::of(&std::fs::metadata(dir.join(rel)).unwrap());
    let durable: &[u8] = point.durable.nodes.files.get(&id).map_or(&[], |v| v);
    let bytes = img.files.get_mut(rel).expect("file in the live tree");
    for (i, page) in bytes.chunks_mut(PAGE_SIZE).enumerate() {
        if old_page(i) {
            for (j, b) in page.iter_mut().enumerate() {
                *b = durable.get(i * PAGE_SIZE + j).copied().unwrap_or(0);
            }
        }
    }
    img
}

/// C2/C3: a power loss loses the first page of an unsynced tail but keeps
/// the later ones. Recovery cuts the torn tail at the checkpoint's
/// position and zeroes what follows (`clear_tail`), but nothing makes the
/// zeroing durable: the segment counts as synced up to the checkpointed
/// position, which is its recovered end, so no sync round covers the file
/// until a later sync of new records. New records appended after the open
/// (unsynced) then refill the lost page; a second power loss keeps that
/// page and takes the zeroed pages back to their durable content, the
/// stale batches from before the first crash. They sit at the positions
/// and offsets the new records lead up to, validate, and continue the
/// chain: records recovery already cut come back after records appended
/// later (no prefix of what was appended).
#[test]
fn torn_tail_cut_by_recovery_stays_cut() {
    let root = tempfile::tempdir().unwrap();
    let (dir, hook) = fresh(root.path(), "log");
    let log = Log::open_with_hook(&dir, opts(RecoveryMode::Strict), hook.clone()).unwrap();
    log.create_topic("t", topic(1 << 20)).unwrap();
    for _ in 0..3 {
        put_one(&log, 1, 100);
    }
    log.sync().unwrap();
    log.sync().unwrap();
    // Unsynced: record 3 fills the rest of the page holding the synced
    // end, records 4.. start on the next page.
    let synced_end = write_pos(&log);
    let page_end = synced_end.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64;
    let mut boundary = page_end;
    if boundary - synced_end < ONE_RECORD_OVERHEAD + 8 {
        boundary += PAGE_SIZE as u64;
    }
    let filler = boundary - synced_end - ONE_RECORD_OVERHEAD;
    assert_eq!(put_one(&log, 2, filler), 3);
    assert_eq!(
        write_pos(&log),
        boundary,
        "record 3 ends on a page boundary"
    );
    for _ in 0..6 {
        put_one(&log, 3, 300);
    }
    let seg: PathBuf = "topics/t0/p0/00000000000000000000.seg".into();
    assert!(dir.join(&seg).exists());
    let first_lost = (synced_end / PAGE_SIZE as u64) as usize;
    let keep_from = (boundary / PAGE_SIZE as u64) as usize;
    // Power loss 1: the pages of record 3 are lost, records 4..10 kept.
    let point = hook.now(IoOp::SyncSegment);
    let img = image_with_old_pages(&dir, &point, &seg, |p| (first_lost..keep_from).contains(&p));
    log.abandon();
    let (one, _) = fresh(root.path(), "one");
    std::fs::remove_dir(&one).unwrap();
    img.write_to(&one).unwrap();
    let hook = ModelHook::new(&one, None);
    let log = Log::open_with_hook(&one, opts(RecoveryMode::Strict), hook.clone()).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(p.end_offset(), 3, "the torn tail is cut at record 3");
    drop(p);
    // A new record 3 of the same size, not synced.
    assert_eq!(put_one(&log, 4, filler), 3);
    assert_eq!(write_pos(&log), boundary);
    // Power loss 2: the new record's pages are written back; the pages
    // after them hold whatever their last fsync made durable.
    let point = hook.now(IoOp::SyncSegment);
    let img = image_with_old_pages(&one, &point, &seg, |p| p >= keep_from);
    log.abandon();
    let two = root.path().join("two");
    img.write_to(&two).unwrap();
    let log = Log::open(&two, opts(RecoveryMode::Strict)).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let end = p.end_offset();
    let mut tags = Vec::new();
    let mut next = 0;
    while next < end {
        for r in p.read(next, 1 << 20).unwrap().iter() {
            tags.push((r.offset, r.value[0]));
            next = r.offset + 1;
        }
    }
    assert!(
        end <= 4,
        "records cut by the first recovery came back after a record appended later \
         (offset, tag): {tags:?}"
    );
}

/// C8 ("the offsets are never handed out again"): `RecoveryMode::Truncate`
/// cuts a partition at corruption in synced data and sets the segments
/// after the cut aside, raising the partition's next offset to what they
/// held, so appends never reuse an offset a reader may have seen. For a
/// set-aside segment without a seal (the active one) only its base offset
/// and the checkpoint's end count; with the checkpoint written only when
/// due, records synced after it (here 5 of them, acknowledged by `sync`)
/// lie past both, and the next appends get their offsets again.
#[test]
fn truncate_never_reuses_offsets_of_a_set_aside_active_segment() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = Log::open(&dir, opts(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", topic(4096)).unwrap();
    for _ in 0..40 {
        put_one(&log, 1, 200);
    }
    log.sync().unwrap();
    log.sync().unwrap();
    let segs = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .segment_infos();
    assert!(segs.len() >= 3, "several segments: {segs:?}");
    let active = segs.last().unwrap().clone();
    // Synced past the checkpoint: this round writes the checkpoint of the
    // previous round's positions.
    for _ in 0..5 {
        put_one(&log, 2, 200);
    }
    log.sync().unwrap();
    let segs = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .segment_infos();
    assert_eq!(segs.last().unwrap().base_offset, active.base_offset);
    let synced_end = 45;
    log.abandon();
    // Corruption in the middle of the first (sealed, synced) segment.
    let first = &segs[0];
    let rel = first.path.strip_prefix(&dir).unwrap().to_path_buf();
    common::crash::flip_byte(&dir, &rel, SEGMENT_HEADER + first.data_bytes / 2);
    // As `fissionlog recover --mode truncate` opens it: a full scan (an
    // open trusts sealed segments below the checkpoint without one).
    let truncate = LogOptions {
        full_scan: true,
        ..opts(RecoveryMode::Truncate)
    };
    let log = Log::open(&dir, truncate).unwrap();
    let next = put_one(&log, 3, 10);
    assert!(
        next >= synced_end,
        "offset {next} handed out again: offsets up to {synced_end} were synced before the \
         truncation (report: {:?})",
        log.recovery_report().files
    );
}

/// Appends `n` records of 200 bytes to partition 0 of "t".
fn put_n(log: &Log, tag: u8, n: u64) {
    for _ in 0..n {
        put_one(log, tag, 200);
    }
}

/// C3 (missing data is refused in Strict, reported in Truncate and
/// Salvage) and C8: a split seals its parent at its end after syncing it,
/// so every offset below the manifest's seal was handed out and is
/// durable. Here the parent rolled after the last checkpoint, and its last
/// segment file is then lost. The checkpoint names an earlier segment,
/// which ends cleanly at its own seal, so recovery sees a complete chain
/// that ends below the partition's seal and reports nothing: a Strict
/// open succeeds with the parent's last records gone and its end below
/// the offset at which its children continue.
#[test]
fn sealed_partition_missing_its_last_segment_is_not_silently_shorter() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    // The checkpoint open writes is the last one.
    let slow = LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..opts(RecoveryMode::Strict)
    };
    let log = Log::open(&dir, slow.clone()).unwrap();
    log.create_topic("t", topic(4096)).unwrap();
    put_n(&log, 1, 20);
    log.sync().unwrap();
    log.close().unwrap();
    // A clean close: the checkpoint names the partition's last segment.
    let log = Log::open(&dir, slow).unwrap();
    let named = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .segment_infos();
    put_n(&log, 2, 20);
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let segs = p.segment_infos();
    assert!(
        segs.len() > named.len(),
        "the parent rolled after the checkpoint"
    );
    let seal = p.end_offset();
    drop(p);
    log.topic("t")
        .unwrap()
        .split(0, fissionlog::SplitPlan::Even)
        .unwrap();
    log.abandon();
    let last = segs.last().unwrap();
    std::fs::remove_file(&last.path).unwrap();
    let lost = (last.base_offset, seal);
    match Log::open(&dir, opts(RecoveryMode::Strict)) {
        Err(e) => assert!(
            e.to_string().contains("missing") && e.to_string().contains("sealed at"),
            "{e}"
        ),
        Ok(log) => {
            let p = log.topic("t").unwrap().partition(0).unwrap();
            panic!(
                "Strict open accepted the sealed partition without offsets {lost:?}: it ends at \
                 {} (sealed at {seal}), report {:?}",
                p.end_offset(),
                log.recovery_report().files
            );
        }
    }
    let log = Log::open(&dir, opts(RecoveryMode::Salvage)).unwrap();
    let reported: Vec<(u64, u64)> = log
        .recovery_report()
        .files
        .iter()
        .filter_map(|f| match f.action {
            fissionlog::FileAction::MissingData { lost_offsets: l } => Some((l.start, l.end)),
            _ => None,
        })
        .collect();
    assert_eq!(reported, vec![lost]);
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(p.end_offset(), seal);
    match p.read(lost.0, 1 << 16) {
        Err(fissionlog::Error::Hole { start, end, .. }) => assert_eq!((start, end), lost),
        other => panic!("offset {} reads as {other:?}", lost.0),
    }
}

/// Every file under `dir` but the lock file, with its bytes.
fn files_of(dir: &Path) -> DirImage {
    let mut img = DirImage::capture(dir).unwrap();
    img.files
        .retain(|p, _| p.file_name().is_some_and(|n| n != "fissionlog.lock"));
    img
}

/// C1/C3: segments rolled after the last checkpoint, all synced (`sync`
/// returned), and then one of them in the middle of the chain is lost.
/// The segment before the gap ends cleanly at its own seal. Recovery took
/// the first segment after the gap for one written after a torn tail and
/// deleted it and every later one, synced records and all, in every mode.
///
/// A roll now makes the names of the segments before it durable before it
/// creates the next one, so a segment missing before one that is there is
/// lost data, never a power loss before a directory fsync: Strict refuses
/// and names it, changing nothing on disk; Salvage keeps every record
/// after the gap.
#[test]
fn missing_segment_past_the_checkpoint_is_not_taken_for_a_torn_tail() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let slow = LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..opts(RecoveryMode::Strict)
    };
    let log = Log::open(&dir, slow.clone()).unwrap();
    log.create_topic("t", topic(4096)).unwrap();
    put_n(&log, 1, 10);
    log.close().unwrap();
    let log = Log::open(&dir, slow).unwrap();
    let named = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .segment_infos();
    put_n(&log, 2, 60);
    log.sync().unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let segs = p.segment_infos();
    let end = p.end_offset();
    drop(p);
    log.abandon();
    assert!(
        segs.len() >= named.len() + 3,
        "several segments rolled after the checkpoint: {segs:?}"
    );
    let gone = &segs[named.len()];
    std::fs::remove_file(&gone.path).unwrap();
    let kept_after = segs[named.len() + 1..]
        .iter()
        .filter(|s| s.path.exists())
        .count();
    let before = files_of(&dir);
    match Log::open(&dir, opts(RecoveryMode::Strict)) {
        Err(e) => {
            assert!(e.to_string().contains("missing"), "{e}");
            let missing = format!("offsets {}..{}", gone.base_offset, gone.end_offset);
            assert!(e.to_string().contains(&missing), "{e}");
            assert!(before == files_of(&dir), "a refused open changed files");
        }
        Ok(log) => {
            let p = log.topic("t").unwrap().partition(0).unwrap();
            panic!(
                "Strict open accepted a log missing offsets {}..{}: the partition ends at {} \
                 (synced to {end}); {} of {kept_after} segments after the gap are left; \
                 report {:?}",
                gone.base_offset,
                gone.end_offset,
                p.end_offset(),
                segs[named.len() + 1..]
                    .iter()
                    .filter(|s| s.path.exists())
                    .count(),
                log.recovery_report().files
            );
        }
    }
    // Salvage keeps every record after the gap.
    let log = Log::open(&dir, opts(RecoveryMode::Salvage)).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(p.end_offset(), end);
    let after = gone.end_offset;
    let got = p.read(after, 1 << 16).unwrap();
    assert_eq!(got.iter().next().unwrap().offset, after);
}

/// C1/C3 at every step of a repair: a segment created after the last
/// checkpointed sync whose header is torn is cut with every segment after
/// it (their records were never synced). Its own removal is made durable
/// only after theirs: a power loss at any step of that repair never leaves
/// a later segment without the torn one before it, which the next open
/// would take for a missing segment (lost data) and a Strict open would
/// refuse.
#[test]
fn torn_creation_is_removed_after_the_segments_that_follow_it() {
    let root = tempfile::tempdir().unwrap();
    let pristine = root.path().join("pristine");
    let slow = LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..opts(RecoveryMode::Strict)
    };
    let log = Log::open(&pristine, slow.clone()).unwrap();
    log.create_topic("t", topic(4096)).unwrap();
    put_n(&log, 1, 10);
    log.close().unwrap();
    let log = Log::open(&pristine, slow).unwrap();
    let named = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .segment_count();
    put_n(&log, 2, 60);
    let segs = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .segment_infos();
    log.abandon();
    assert!(segs.len() >= named + 3, "segments rolled: {segs:?}");
    let torn = &segs[named + 1];
    let mut bytes = std::fs::read(&torn.path).unwrap();
    bytes[..SEGMENT_HEADER as usize].fill(0);
    std::fs::write(&torn.path, bytes).unwrap();

    let repair = root.path().join("repair");
    DirImage::capture(&pristine)
        .unwrap()
        .write_to(&repair)
        .unwrap();
    let hook = ModelHook::new(&repair, None);
    hook.record_steps(true);
    let log = Log::open_with_hook(&repair, opts(RecoveryMode::Strict), hook.clone()).unwrap();
    let repaired = read_all(&log);
    log.abandon();
    assert_eq!(
        repaired.len() as u64,
        torn.base_offset,
        "cut at the torn segment"
    );
    let steps = hook.take_steps();
    let mut failures = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        for seed in 0..8 {
            let (img, trace) = step.image(seed, &common::crash::CrashOptions::default());
            let dir = root.path().join(format!("s{i}-{seed}"));
            img.write_to(&dir).unwrap();
            let ctx = format!(
                "power loss before step {i} ({:?} {}), seed {seed} ({})",
                step.op,
                step.path.display(),
                trace.join("; ")
            );
            match Log::open(&dir, opts(RecoveryMode::Strict)) {
                Ok(log) => {
                    let reads = read_all(&log);
                    if reads != repaired {
                        failures.push(format!("{ctx}: reads {reads:?}"));
                    }
                }
                Err(e) => failures.push(format!("{ctx}: open failed: {e}")),
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// C3 across two power losses: a power loss at a roll can keep the old
/// segment's header page, seal and all, but lose records below the seal
/// and the new segment's name. Recovery keeps that segment active and
/// clears the seal from its header; the cleared header must be durable
/// when the open returns (the open's sync round fdatasyncs the segment:
/// its recovered end lies past what the checkpoint calls synced, and its
/// cleared tail counts as unsynced). Brought back by a later power loss, after
/// appends carried the segment past the old seal and a roll created the
/// next segment further on, the stale seal (at a batch boundary whenever
/// records are of one size) would make the segment look complete and the
/// next one look like it follows a missing segment: lost data, which a
/// Strict open refuses.
#[test]
fn stale_seal_cleared_by_recovery_is_durable() {
    /// Where the seal sits in a segment header (docs/FORMAT.md).
    const SEAL: std::ops::Range<usize> = 44..64;
    let root = tempfile::tempdir().unwrap();
    let pristine = root.path().join("pristine");
    let log = Log::open(&pristine, opts(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", topic(16384)).unwrap();
    put_n(&log, 1, 70);
    let segs = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .segment_infos();
    log.abandon();
    assert!(segs.len() >= 2, "rolled: {segs:?}");
    let mut img = DirImage::capture(&pristine).unwrap();
    let rel = |p: &Path| p.strip_prefix(&pristine).unwrap().to_path_buf();
    for s in &segs[1..] {
        img.files.remove(&rel(&s.path));
        img.files.remove(&rel(&s.path.with_extension("idx")));
    }
    let first = img.files.get_mut(&rel(&segs[0].path)).unwrap();
    assert!(
        first[SEAL].iter().any(|&b| b != 0),
        "the rolled segment is sealed"
    );
    first[2 * PAGE_SIZE..].fill(0);
    let dir = root.path().join("log");
    img.write_to(&dir).unwrap();
    let hook = ModelHook::new(&dir, None);
    let log = Log::open_with_hook(&dir, opts(RecoveryMode::Strict), hook.clone()).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert!(
        p.end_offset() < segs[0].end_offset,
        "records below the seal were lost"
    );
    assert_eq!(p.segment_count(), 1);
    drop(p);
    let path = dir.join(rel(&segs[0].path));
    assert!(
        std::fs::read(&path).unwrap()[SEAL].iter().all(|&b| b == 0),
        "recovery cleared the seal"
    );
    let point = hook.now(IoOp::SyncDir);
    let id = NodeId::of(&std::fs::metadata(&path).unwrap());
    let durable = &point.durable.nodes.files[&id];
    assert!(
        durable[SEAL].iter().all(|&b| b == 0),
        "the stale seal comes back after a power loss"
    );
    log.abandon();
}

/// C5/C1: a split syncs its parent before the commit record, so that a
/// power loss can never keep the split and lose parent records below the
/// seal. That sync covers the partition directory only when the parent's
/// "directory changed" flag is still set; a sync round already in flight
/// (here one blocked in its directory fsync) has taken the flag. The split
/// then commits while the name of the segment the parent rolled to is not
/// durable, and a power loss loses that file: the parent's records after
/// the roll are gone although the split committed above them.
#[test]
fn split_commit_makes_the_parents_rolled_segment_names_durable() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir(&dir).unwrap();
    // Once armed, the first directory fsync of `topics/t0/p0` (a sync
    // round's) waits until released, ahead of the model.
    let gate = std::sync::Arc::new(
        Gate::new(IoOp::SyncDir)
            .on_path("topics/t0/p0")
            .disarmed()
            .at_most(Duration::from_secs(60)),
    );
    let model = ModelHook::new(&dir, None);
    let both = std::sync::Arc::new(Both::new(gate.clone(), model.clone()));
    let log = Log::open_with_hook(&dir, opts(RecoveryMode::Strict), both).unwrap();
    log.create_topic("t", topic(4096)).unwrap();
    put_n(&log, 1, 5);
    log.sync().unwrap();
    // Roll: a new segment file in p0.
    put_n(&log, 2, 20);
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let segs = p.segment_infos();
    assert!(segs.len() >= 2, "the parent rolled");
    let seal = p.end_offset();
    drop(p);
    gate.arm();
    let point = std::thread::scope(|s| {
        let round = s.spawn(|| log.sync());
        assert!(
            gate.wait_reached(Duration::from_secs(60)),
            "the round never reached its directory fsync"
        );
        let children = log
            .topic("t")
            .unwrap()
            .split(0, fissionlog::SplitPlan::Even)
            .unwrap();
        assert_eq!(children.len(), 2);
        // Power loss now, while the round's directory fsync has not run.
        let point = model.now(IoOp::SyncDir);
        let live = DirImage::capture(&dir).unwrap();
        gate.release();
        round.join().unwrap().unwrap();
        (point, live)
    });
    let (point, mut img) = point;
    log.abandon();
    // The image: every file as now, but p0 holds only the names its last
    // directory fsync made durable.
    let pdir = dir.join("topics/t0/p0");
    let pid = NodeId::of(&std::fs::metadata(&pdir).unwrap());
    let durable_names: Vec<String> = point
        .durable
        .nodes
        .dirs
        .get(&pid)
        .map(|e| e.keys().map(|n| n.to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    img.files.retain(|rel, _| {
        !rel.starts_with("topics/t0/p0")
            || durable_names.contains(&rel.file_name().unwrap().to_string_lossy().into_owned())
    });
    let after = root.path().join("after");
    img.write_to(&after).unwrap();
    let log = match Log::open(&after, opts(RecoveryMode::Strict)) {
        Ok(log) => log,
        Err(e) => panic!(
            "the split committed but the parent's segments are not all durable \
             (durable names in p0: {durable_names:?}): {e}"
        ),
    };
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert!(p.is_sealed());
    assert_eq!(
        p.end_offset(),
        seal,
        "the parent holds every record below its seal"
    );
}

/// The live tree of a crash point as an image (every page written back).
pub(super) fn live_image(point: &CrashPoint) -> DirImage {
    fn walk(point: &CrashPoint, dir: NodeId, rel: &Path, img: &mut DirImage) {
        for (name, e) in point.live.dirs.get(&dir).into_iter().flatten() {
            let path = rel.join(name);
            match *e {
                common::durable::Entry::Dir(id) => {
                    img.insert_dir(path.clone());
                    walk(point, id, &path, img);
                }
                common::durable::Entry::File(id) => {
                    img.insert_file(path, point.live.files.get(&id).cloned().unwrap_or_default());
                }
            }
        }
    }
    let mut img = DirImage::new();
    walk(point, point.durable.root, Path::new(""), &mut img);
    img
}

/// C3/C7: Salvage repairs a sealed partition that lost its last segment
/// by writing a hole segment up to the seal. A power loss while it does,
/// had the hole file been created under its own name (the name kept, its
/// bytes not yet synced), would leave a file with no valid header after
/// the partition's last rolled segment (the hole is now written under a
/// scratch name and renamed once synced; the image here puts an empty
/// file at the name to keep the check). The next open took it for a
/// segment torn at creation, deleted it, and a Strict open accepted the
/// partition ending below its seal.
#[test]
fn interrupted_hole_repair_of_a_sealed_partition_is_not_taken_for_a_torn_creation() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let slow = LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..opts(RecoveryMode::Strict)
    };
    let log = Log::open(&dir, slow.clone()).unwrap();
    log.create_topic("t", topic(4096)).unwrap();
    put_n(&log, 1, 20);
    log.close().unwrap();
    let log = Log::open(&dir, slow).unwrap();
    put_n(&log, 2, 20);
    let p = log.topic("t").unwrap().partition(0).unwrap();
    let last = p.segment_infos().last().unwrap().clone();
    let seal = p.end_offset();
    drop(p);
    log.topic("t")
        .unwrap()
        .split(0, fissionlog::SplitPlan::Even)
        .unwrap();
    log.abandon();
    std::fs::remove_file(&last.path).unwrap();
    // Salvage writes a hole segment named like the lost one; a power loss
    // comes just before its first fdatasync.
    let hook = ModelHook::new(&dir, None);
    hook.record_steps(true);
    let log = Log::open_with_hook(&dir, opts(RecoveryMode::Salvage), hook.clone()).unwrap();
    log.close().unwrap();
    let point = hook
        .take_steps()
        .into_iter()
        .find(|s| s.op == IoOp::SyncNewSegment && s.path == last.path.with_extension("seg.tmp"))
        .expect("salvage synced a hole segment in place of the lost one");
    let mut img = live_image(&point);
    let rel = last.path.strip_prefix(&dir).unwrap().to_path_buf();
    // The name is not there before the synced scratch file is renamed to
    // it; an empty file there stands for a hole created in place whose
    // bytes were never synced.
    assert!(!img.files.contains_key(&rel));
    assert!(img.files.contains_key(&rel.with_extension("seg.tmp")));
    img.insert_file(rel, Vec::new());
    let after = root.path().join("after");
    img.write_to(&after).unwrap();
    match Log::open(&after, opts(RecoveryMode::Strict)) {
        Err(e) => assert!(e.to_string().contains("missing"), "{e}"),
        Ok(log) => {
            let p = log.topic("t").unwrap().partition(0).unwrap();
            assert_eq!(
                p.end_offset(),
                seal,
                "Strict open accepted the sealed partition ending below its seal; report {:?}",
                log.recovery_report().files
            );
        }
    }
}

/// A power-loss image of `dir` now: every file as the page cache holds
/// it, but the directory `rel_dir` holds only the names its last fsync
/// made durable.
fn image_with_durable_names(dir: &Path, point: &CrashPoint, rel_dir: &Path) -> DirImage {
    let id = NodeId::of(&std::fs::metadata(dir.join(rel_dir)).unwrap());
    let names: Vec<std::ffi::OsString> = point
        .durable
        .nodes
        .dirs
        .get(&id)
        .map(|e| e.keys().cloned().collect())
        .unwrap_or_default();
    let mut img = DirImage::capture(dir).unwrap();
    img.files.retain(|rel, _| {
        rel.parent() != Some(rel_dir)
            || names.iter().any(|n| Some(n.as_os_str()) == rel.file_name())
    });
    img
}

/// C7 (no false corruption): retention empties a sealed partition; each
/// open then gives it an empty placeholder segment so its lineage stays
/// readable (until retention removes it from the topology; here the
/// removal's record failed). The placeholder's file is created and fdatasynced (it is new,
/// so the open's sync round covers it) but its directory is never
/// fsynced, while the checkpoint that round writes names it as the
/// partition's durable segment. A power loss keeps the checkpoint and
/// loses the name: the next Strict open refuses the log, reporting the
/// placeholder as a missing segment holding data.
#[test]
fn placeholder_of_an_emptied_sealed_partition_is_durable_before_a_checkpoint_names_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = Log::open(&dir, opts(RecoveryMode::Strict)).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            retention_bytes: Some(1),
            ..topic(4096)
        },
    )
    .unwrap();
    put_n(&log, 1, 20);
    let seal = log.topic("t").unwrap().partition(0).unwrap().end_offset();
    log.topic("t")
        .unwrap()
        .split(0, fissionlog::SplitPlan::Even)
        .unwrap();
    log.sync().unwrap();
    log.close().unwrap();
    // Retention empties the parent; the record that would remove it from
    // the topology fails, so the log (poisoned) keeps it as an emptied
    // sealed partition, as it stands between the two steps of a removal.
    let fail = Arc::new(common::faults::failing_manifest_writes());
    let log = Log::open_with_hook(&dir, opts(RecoveryMode::Strict), fail.clone()).unwrap();
    fail.arm();
    assert!(
        log.enforce_retention().is_err(),
        "the removal's record fails"
    );
    assert!(
        log.topic("t")
            .unwrap()
            .partition(0)
            .unwrap()
            .is_empty_sealed(),
        "retention emptied the sealed parent"
    );
    log.abandon();
    // This open gives the emptied partition its placeholder segment.
    let hook = ModelHook::new(&dir, None);
    let log = Log::open_with_hook(&dir, opts(RecoveryMode::Strict), hook.clone()).unwrap();
    let point = hook.now(IoOp::SyncDir);
    let img = image_with_durable_names(&dir, &point, Path::new("topics/t0/p0"));
    log.abandon();
    let after = root.path().join("after");
    img.write_to(&after).unwrap();
    let log = match Log::open(&after, opts(RecoveryMode::Strict)) {
        Ok(log) => log,
        Err(e) => panic!("a power loss after a clean reopen made Strict refuse the log: {e}"),
    };
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!((p.start_offset(), p.end_offset()), (seal, seal));
}

/// What partition 0 of "t" reads as, offset by offset: the tag of the
/// record there, `H` for a reported hole, or the error.
fn read_all(log: &Log) -> Vec<String> {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    (p.start_offset()..p.end_offset())
        .map(|i| match p.read(i, 1) {
            Ok(b) => match b.iter().next() {
                Some(r) if r.offset == i => format!("{}", r.value[0]),
                Some(r) => format!("offset {} at {i}", r.offset),
                None => "nothing".into(),
            },
            Err(fissionlog::Error::Hole { .. }) => "H".into(),
            Err(e) => format!("{e}"),
        })
        .collect()
}

/// C3/C7/C8 for an interrupted repair: `RecoveryMode::Truncate` (as
/// `fissionlog recover --mode truncate` runs it) cuts a partition at
/// corruption in synced data, sets the later segments aside and fills the
/// offsets they held with a hole. A power loss at any step of that repair,
/// followed by another Truncate open, must still give a partition that
/// reads each offset as its record or as a reported hole (never as
/// corruption the open accepted), and appends that never reuse an offset
/// handed out before the damage.
#[test]
fn power_loss_during_a_truncate_repair() {
    let root = tempfile::tempdir().unwrap();
    let pristine = root.path().join("pristine");
    let log = Log::open(&pristine, opts(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", topic(4096)).unwrap();
    put_n(&log, 1, 40);
    log.sync().unwrap();
    log.sync().unwrap();
    put_n(&log, 2, 5);
    log.sync().unwrap();
    let segs = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .segment_infos();
    log.abandon();
    let synced_end = 45;
    let first = &segs[0];
    let rel = first.path.strip_prefix(&pristine).unwrap().to_path_buf();
    common::crash::flip_byte(&pristine, &rel, SEGMENT_HEADER + first.data_bytes / 2);
    let truncate = LogOptions {
        full_scan: true,
        ..opts(RecoveryMode::Truncate)
    };
    let repair = root.path().join("repair");
    DirImage::capture(&pristine)
        .unwrap()
        .write_to(&repair)
        .unwrap();
    let hook = ModelHook::new(&repair, None);
    hook.record_steps(true);
    let log = Log::open_with_hook(&repair, truncate.clone(), hook.clone()).unwrap();
    let repaired = read_all(&log);
    log.abandon();
    let steps = hook.take_steps();
    assert!(steps.len() > 3, "the repair did I/O");
    let mut failures = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let mut images = vec![("live".to_string(), live_image(step))];
        for seed in 0..3 {
            let opts = common::crash::CrashOptions::default();
            images.push((format!("seed {seed}"), step.image(seed, &opts).0));
        }
        for (what, img) in images {
            let dir = root.path().join(format!("s{i}-{}", what.replace(' ', "")));
            img.write_to(&dir).unwrap();
            let ctx = format!(
                "power loss before step {i} ({:?} {}), {what}",
                step.op,
                step.path.display()
            );
            let log = match Log::open(&dir, truncate.clone()) {
                Ok(log) => log,
                Err(e) => {
                    failures.push(format!("{ctx}: open failed: {e}"));
                    continue;
                }
            };
            let reads = read_all(&log);
            let bad: Vec<(usize, &String)> = reads
                .iter()
                .enumerate()
                .filter(|(_, r)| !matches!(r.as_str(), "1" | "2" | "H"))
                .collect();
            if !bad.is_empty() {
                failures.push(format!("{ctx}: reads {:?}", &bad[..bad.len().min(3)]));
            }
            let next = put_one(&log, 9, 10);
            if next < synced_end {
                failures.push(format!(
                    "{ctx}: offset {next} handed out again; reads {reads:?} report {:?}",
                    log.recovery_report().files
                ));
            }
            drop(log);
        }
    }
    assert!(
        failures.is_empty(),
        "after the uninterrupted repair: {repaired:?}\n{}",
        failures.join("\n")
    );
}

/// C7: after a Truncate repair that set segments aside and filled their
/// offsets with a hole, a second open (Strict) changes nothing and reads
/// the same.
#[test]
fn second_open_after_a_truncate_repair_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = Log::open(&dir, opts(RecoveryMode::Strict)).unwrap();
    log.create_topic("t", topic(4096)).unwrap();
    put_n(&log, 1, 40);
    log.sync().unwrap();
    log.sync().unwrap();
    put_n(&log, 2, 5);
    log.sync().unwrap();
    let segs = log
        .topic("t")
        .unwrap()
        .partition(0)
        .unwrap()
        .segment_infos();
    log.abandon();
    let first = &segs[0];
    let rel = first.path.strip_prefix(&dir).unwrap().to_path_buf();
    common::crash::flip_byte(&dir, &rel, SEGMENT_HEADER + first.data_bytes / 2);
    let truncate = LogOptions {
        full_scan: true,
        ..opts(RecoveryMode::Truncate)
    };
    let log = Log::open(&dir, truncate).unwrap();
    let repaired = read_all(&log);
    log.close().unwrap();
    for mode in [RecoveryMode::Strict, RecoveryMode::Truncate] {
        let log = Log::open(&dir, opts(mode)).unwrap();
        assert!(
            !log.recovery_report().changed_anything(),
            "{mode:?}: {:?}",
            log.recovery_report().files
        );
        assert_eq!(read_all(&log), repaired, "{mode:?}");
        log.close().unwrap();
    }
}
