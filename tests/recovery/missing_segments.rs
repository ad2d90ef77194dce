//! Missing files are missing data, never an empty partition. A partition the checkpoint or the manifest knows, whose
//! first, middle, last or every segment (or whose directory) is gone:
//! Strict refuses and names what is missing; Truncate and Salvage say in
//! the report what they lose, and offsets are never handed out again.

use crate::common;
use common::log::value;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::crash::DirImage;
use fissionlog::FileAction;
use fissionlog::{Error, Log, LogOptions, NewRecord, RecoveryMode, TopicConfig};

/// 25 records of 157 bytes fit a 4 KiB segment: segments 0, 25, ... 175.
const RECORDS: u64 = 200;
const PER_SEGMENT: u64 = 25;

/// A checkpoint in every sync round (`checkpoint_interval` zero): these
/// scenarios put synced data below the checkpoint by syncing, and check
/// that what the checkpoint calls durable is never silently lost. With the
/// default interval a sync writes no checkpoint until one is due, and
/// without a checkpoint entry nothing durable says which offsets existed
/// (tests/durability/checkpoint_interval.rs covers that cadence).
fn opts(mode: RecoveryMode) -> LogOptions {
    LogOptions {
        balancer: false,
        recovery: mode,
        checkpoint_interval: std::time::Duration::ZERO,
        ..LogOptions::default()
    }
}

fn append(log: &Log, i: u64) -> u64 {
    let t = log.topic("t").unwrap();
    t.append_batch(&[NewRecord {
        key: Some(b"k"),
        value: &value(i),
        timestamp: Some(i as i64),
    }])
    .unwrap()[0]
        .offset
}

/// How the log of a case ends.
#[derive(Debug, Clone, Copy)]
enum Made {
    /// Closed cleanly: the checkpoint names the last segment.
    Clean,
    /// The process dies after two syncs: the checkpoint names the segment
    /// of the first.
    Crash,
    /// Checkpoints only when due (hourly): the first sync writes one after
    /// two segments, the last sync covers the six rolled after it, then
    /// the process dies. The checkpoint names none of those six.
    PastCheckpoint,
}

/// A log with `RECORDS` synced records in one partition, ended as `made`
/// says.
fn make_log(dir: &Path, made: Made) {
    let slow = LogOptions {
        checkpoint_interval: std::time::Duration::from_secs(3600),
        ..opts(RecoveryMode::Strict)
    };
    let log = match made {
        Made::PastCheckpoint => Log::open(dir, slow).unwrap(),
        _ => Log::open(dir, opts(RecoveryMode::Strict)).unwrap(),
    };
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: 4096,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    match made {
        Made::Clean => {
            for i in 0..RECORDS {
                assert_eq!(append(&log, i), i);
            }
            log.close().unwrap();
        }
        Made::Crash => {
            for i in 0..RECORDS {
                assert_eq!(append(&log, i), i);
            }
            log.sync().unwrap();
            log.sync().unwrap();
            log.abandon();
        }
        Made::PastCheckpoint => {
            for i in 0..2 * PER_SEGMENT {
                assert_eq!(append(&log, i), i);
            }
            log.sync().unwrap();
            for i in 2 * PER_SEGMENT..RECORDS {
                assert_eq!(append(&log, i), i);
            }
            log.sync().unwrap();
            log.abandon();
        }
    }
}

fn pdir() -> PathBuf {
    PathBuf::from("topics/t0/p0")
}

fn seg(base: u64) -> PathBuf {
    pdir().join(format!("{base:020}.seg"))
}

#[derive(Debug, Clone, Copy)]
enum Missing {
    First,
    Middle,
    Last,
    All,
    Directory,
    /// The last segment file is cut short, below the checkpointed position.
    Shortened,
}

/// Removes what `m` names from the image; returns the offsets it held and
/// a text the Strict error must contain.
fn remove(img: &mut DirImage, m: Missing) -> ((u64, u64), String) {
    let segs: Vec<u64> = (0..RECORDS / PER_SEGMENT)
        .map(|i| i * PER_SEGMENT)
        .collect();
    let drop_seg = |img: &mut DirImage, base: u64| {
        assert!(img.files.remove(&seg(base)).is_some(), "no segment {base}");
        img.files.remove(&seg(base).with_extension("idx"));
    };
    match m {
        Missing::First => {
            drop_seg(img, 0);
            ((0, 25), format!("{:020}.seg", 0))
        }
        Missing::Middle => {
            drop_seg(img, 100);
            ((100, 125), format!("{:020}.seg", 100))
        }
        Missing::Last => {
            drop_seg(img, 175);
            ((175, RECORDS), format!("{:020}.seg", 175))
        }
        Missing::All => {
            for b in segs {
                drop_seg(img, b);
            }
            ((0, RECORDS), "0..200".into())
        }
        Missing::Shortened => {
            let kept = 5;
            let bytes = img.files.get_mut(&seg(175)).unwrap();
            bytes.truncate((64 + kept * 157) as usize);
            (
                (175 + kept, RECORDS),
                format!("{}..{}", 175 + kept, RECORDS),
            )
        }
        Missing::Directory => {
            img.files.retain(|p, _| !p.starts_with(pdir()));
            img.dirs.remove(&pdir());
            ((0, RECORDS), "topics/t0/p0".into())
        }
    }
}

/// Every offset below the old end reads as its own record, a hole or out
/// of range: never as another record.
fn check_reads(log: &Log, lost: (u64, u64), what: &str) {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert!(p.end_offset() >= RECORDS, "{what}: end {}", p.end_offset());
    for i in 0..RECORDS {
        match p.read(i, 1) {
            Ok(b) => {
                let r = b.iter().next().unwrap();
                assert_eq!(r.offset, i, "{what}");
                assert_eq!(r.value, value(i).as_slice(), "{what}: record {i}");
            }
            Err(Error::Hole { start, end, .. }) => {
                assert!(start <= i && i < end, "{what}: hole {start}..{end} at {i}")
            }
            Err(Error::OffsetOutOfRange { .. }) => {}
            Err(e) => panic!("{what}: read {i}: {e}"),
        }
    }
    // What was not lost is still there.
    for i in (0..lost.0).chain(lost.1..RECORDS) {
        if let Ok(b) = p.read(i, 1) {
            assert_eq!(b.iter().next().unwrap().offset, i, "{what}");
        }
    }
}

fn run_case(root: &Path, made: Made, m: Missing) {
    let pristine = root.join(format!("pristine-{made:?}"));
    if !pristine.exists() {
        make_log(&pristine, made);
    }
    let mut img = DirImage::capture(&pristine).unwrap();
    let (lost, named) = remove(&mut img, m);
    let what = format!("{m:?} missing (log made: {made:?})");

    // Strict refuses, names what is missing and changes nothing.
    let dir = root.join(format!("{m:?}-{made:?}-strict"));
    img.write_to(&dir).unwrap();
    let before = DirImage::capture(&dir).unwrap();
    match Log::open(&dir, opts(RecoveryMode::Strict)) {
        Err(e @ Error::Corruption { .. }) => {
            assert!(e.to_string().contains(&named), "{what}: {e}")
        }
        Err(e) => panic!("{what}: Strict: {e}"),
        Ok(log) => panic!(
            "{what}: Strict accepted, holding {}..{}",
            log.topic("t").unwrap().partition(0).unwrap().start_offset(),
            log.topic("t").unwrap().partition(0).unwrap().end_offset()
        ),
    }
    let after = DirImage::capture(&dir).unwrap();
    assert!(before == after, "{what}: {}", before.diff_summary(&after));
    // verify reports it too.
    let (_, problems) = fissionlog::verify(&dir).unwrap();
    assert!(!problems.is_empty(), "{what}: verify found nothing");

    for mode in [RecoveryMode::Truncate, RecoveryMode::Salvage] {
        let what = format!("{what} in {mode:?}");
        let dir = root.join(format!("{m:?}-{made:?}-{mode:?}"));
        img.write_to(&dir).unwrap();
        let log = Log::open(&dir, opts(mode)).unwrap_or_else(|e| panic!("{what}: {e}"));
        // The report says what was lost.
        let reported: Vec<(u64, u64)> = log
            .recovery_report()
            .files
            .iter()
            .filter_map(|f| match f.action {
                FileAction::MissingData { lost_offsets: l } => Some((l.start, l.end)),
                _ => None,
            })
            .collect();
        assert!(
            reported
                .iter()
                .any(|&(s, e)| s <= lost.0 && lost.1 <= e.max(lost.1) && s < e),
            "{what}: report {:?}",
            log.recovery_report().files
        );
        check_reads(&log, lost, &what);
        // Offsets are never reused.
        let next = append(&log, 1000);
        assert!(next >= RECORDS, "{what}: append got offset {next}");
        log.close().unwrap();
        // The repair is durable and complete: Strict opens it, unchanged.
        let log = Log::open(&dir, opts(RecoveryMode::Strict))
            .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
        check_reads(&log, lost, &what);
        assert_eq!(
            log.topic("t").unwrap().partition(0).unwrap().end_offset(),
            next + 1,
            "{what}"
        );
        log.close().unwrap();
    }
}

macro_rules! missing_tests {
    ($($name:ident: $m:expr, $made:expr;)*) => {$(
        #[test]
        fn $name() {
            let root = tempfile::tempdir().unwrap();
            run_case(root.path(), $made, $m);
        }
    )*};
}

missing_tests! {
    first_segment_missing_is_refused_or_reported: Missing::First, Made::Clean;
    middle_segment_missing_is_refused_or_reported: Missing::Middle, Made::Clean;
    last_segment_missing_is_refused_or_reported: Missing::Last, Made::Clean;
    every_segment_missing_is_refused_or_reported: Missing::All, Made::Clean;
    partition_directory_missing_is_refused_or_reported: Missing::Directory, Made::Clean;
    first_segment_missing_after_a_crash_is_refused_or_reported: Missing::First, Made::Crash;
    every_segment_missing_after_a_crash_is_refused_or_reported: Missing::All, Made::Crash;
    partition_directory_missing_after_a_crash_is_refused_or_reported: Missing::Directory, Made::Crash;
    segment_shorter_than_the_checkpoint_is_refused_or_reported: Missing::Shortened, Made::Clean;
    segment_shorter_than_the_checkpoint_after_a_crash_is_refused_or_reported: Missing::Shortened, Made::Crash;
    // A roll makes the names of the segments before it durable before it
    // creates the next one: a segment missing before one that is there is
    // lost data even where the checkpoint names neither.
    middle_segment_missing_past_the_checkpoint_is_refused_or_reported: Missing::Middle, Made::PastCheckpoint;
}

/// Retention legitimately removes the oldest segments (its floor is in a
/// durable checkpoint first): Strict opens such a log without complaint.
#[test]
fn retention_removed_segments_are_not_missing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = Log::open(&dir, opts(RecoveryMode::Strict)).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: 4096,
            retention_bytes: Some(3 * 4096),
            ..TopicConfig::default()
        },
    )
    .unwrap();
    for i in 0..RECORDS {
        append(&log, i);
    }
    // Retention keeps the segments the last two checkpoints name.
    for _ in 0..3 {
        log.sync().unwrap();
    }
    assert!(log.enforce_retention().unwrap() > 0);
    let start = log.topic("t").unwrap().partition(0).unwrap().start_offset();
    assert!(start > 0);
    log.abandon();
    let log = Log::open(&dir, opts(RecoveryMode::Strict)).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!((p.start_offset(), p.end_offset()), (start, RECORDS));
    assert!(!log
        .recovery_report()
        .files
        .iter()
        .any(|f| matches!(f.action, FileAction::MissingData { .. })));
}

/// A sealed partition that retention emptied has no segment, and children
/// created by a split after the last checkpoint have no checkpoint entry:
/// neither is missing data. Strict reopens both, after a crash and after a
/// clean close. (Retention removes an emptied partition from the topology
/// right after emptying it: the crash here comes before its
/// `RemovePartition` record is written, and background retention is off
/// so that the reopened log keeps it.)
#[test]
fn emptied_sealed_partition_and_new_children_are_not_missing() {
    for clean in [false, true] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        let o = LogOptions {
            background_retention: false,
            ..opts(RecoveryMode::Strict)
        };
        let hook = Arc::new(common::faults::failing_manifest_writes());
        let log = Log::open_with_hook(&dir, o.clone(), hook.clone()).unwrap();
        let t = log
            .create_topic(
                "t",
                TopicConfig {
                    partitions: 1,
                    segment_bytes: 4096,
                    retention_bytes: Some(1),
                    ..TopicConfig::default()
                },
            )
            .unwrap();
        for i in 0..60 {
            append(&log, i);
        }
        let children = t.split(0, fissionlog::SplitPlan::Even).unwrap();
        for _ in 0..3 {
            log.sync().unwrap();
        }
        hook.arm();
        assert!(matches!(
            log.enforce_retention(),
            Err(Error::LogPoisoned { .. })
        ));
        assert!(t.partition(0).unwrap().is_empty_sealed());
        drop(t);
        log.abandon();
        let log = Log::open(&dir, o.clone()).unwrap();
        let t = log.topic("t").unwrap();
        let p = t.partition(0).unwrap();
        assert_eq!(p.start_offset(), p.end_offset(), "emptied, still there");
        drop(p);
        // A second split: its children have no checkpoint entry yet.
        let grandchildren = t.split(children[0], fissionlog::SplitPlan::Even).unwrap();
        for i in 0..20 {
            append(&log, 100 + i);
        }
        if clean {
            log.close().unwrap();
        } else {
            log.abandon();
        }
        let log = Log::open(&dir, o).unwrap_or_else(|e| panic!("clean {clean}: {e}"));
        let report = log.recovery_report();
        assert!(
            !report
                .files
                .iter()
                .any(|f| matches!(f.action, FileAction::MissingData { .. })),
            "clean {clean}: {:?}",
            report.files
        );
        let t = log.topic("t").unwrap();
        t.partition(0).unwrap();
        for id in grandchildren {
            t.partition(id).unwrap();
        }
        log.close().unwrap();
    }
}

/// Without any valid checkpoint (both files damaged), nothing says where
/// synced data ends: invalid bytes after the data may be damage in synced
/// data, not a torn tail. Strict refuses instead of cutting them and
/// changes nothing; Truncate cuts them and reports it; no record is lost.
#[test]
fn without_a_checkpoint_strict_never_cuts() {
    let root = tempfile::tempdir().unwrap();
    let pristine = root.path().join("pristine");
    make_log(&pristine, Made::Clean);
    let mut img = DirImage::capture(&pristine).unwrap();
    for name in ["checkpoint.0", "checkpoint.1"] {
        img.insert_file(name, b"garbage garbage garbage garbage!!".to_vec());
    }
    // Junk right after the last record of the active segment.
    let last = img.files.get_mut(&seg(175)).unwrap();
    let end = (64 + 25 * 157) as usize;
    last[end..end + 40].fill(0xA5);
    let dir = root.path().join("strict");
    img.write_to(&dir).unwrap();
    let before = DirImage::capture(&dir).unwrap();
    match Log::open(&dir, opts(RecoveryMode::Strict)) {
        Err(e @ Error::Corruption { .. }) => {
            assert!(
                e.to_string().contains("no valid recovery checkpoint"),
                "{e}"
            )
        }
        Err(e) => panic!("{e}"),
        Ok(log) => panic!("Strict accepted, report {:?}", log.recovery_report().files),
    }
    let after = DirImage::capture(&dir).unwrap();
    assert!(before == after, "{}", before.diff_summary(&after));
    let (_, problems) = fissionlog::verify(&dir).unwrap();
    assert!(!problems.is_empty());
    let dir = root.path().join("truncate");
    img.write_to(&dir).unwrap();
    let log = Log::open(&dir, opts(RecoveryMode::Truncate)).unwrap();
    assert!(log
        .recovery_report()
        .files
        .iter()
        .any(|f| matches!(f.action, FileAction::TruncatedTornTail { .. })));
    check_reads(&log, (RECORDS, RECORDS), "truncate without checkpoint");
    assert_eq!(
        log.topic("t").unwrap().partition(0).unwrap().end_offset(),
        RECORDS
    );
}

/// Truncate cuts damaged manifest records; the topics those records created
/// then look uncommitted. Their directories hold synced data: they are set
/// aside (renamed, reported), never deleted.
#[test]
fn truncated_manifest_sets_topic_directories_aside() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    make_log(&dir, Made::Clean);
    let log = Log::open(&dir, opts(RecoveryMode::Strict)).unwrap();
    log.create_topic("u", TopicConfig::default()).unwrap();
    log.close().unwrap();
    let before = DirImage::capture(&dir).unwrap();
    let segments: Vec<Vec<u8>> = before
        .files
        .iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "seg") && p.starts_with(pdir()))
        .map(|(_, b)| b.clone())
        .collect();
    assert_eq!(segments.len(), 8);
    // Damage the first journal record (topic t), with a valid one after it.
    common::crash::flip_byte(&dir, Path::new("manifest.log"), 40);
    assert!(matches!(
        Log::open(&dir, opts(RecoveryMode::Strict)),
        Err(Error::Corruption { .. })
    ));
    let log = Log::open(&dir, opts(RecoveryMode::Truncate)).unwrap();
    assert!(log.topics().is_empty(), "{:?}", log.topics());
    let report = log.recovery_report().clone();
    log.close().unwrap();
    assert!(
        report
            .files
            .iter()
            .any(|f| matches!(f.action, FileAction::SetAsideOrphan { .. })),
        "{:?}",
        report.files
    );
    // Every segment of topic t is still on disk, byte for byte.
    let after = DirImage::capture(&dir).unwrap();
    for s in &segments {
        assert!(
            after.files.values().any(|b| b == s),
            "a segment of the cut topic was deleted: {:?}",
            after.files.keys().collect::<Vec<_>>()
        );
    }
}

/// Appends records 0..10 to partition 0 of a new topic "t" (4 KiB
/// segments), splits it, and abandons the log, with no checkpoint after
/// the one the open writes (p0 never gets an entry). Returns the children.
fn split_without_checkpoint(dir: &Path) -> Vec<u32> {
    let no_checkpoint = LogOptions {
        checkpoint_interval: std::time::Duration::from_secs(3600),
        ..opts(RecoveryMode::Strict)
    };
    let log = Log::open(dir, no_checkpoint).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 4096,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    for i in 0..10 {
        assert_eq!(append(&log, i), i);
    }
    let children = t.split(0, fissionlog::SplitPlan::Even).unwrap();
    drop(t);
    log.abandon();
    children
}

/// A sealed partition the checkpoint does not name yet (split after the
/// last checkpoint) whose files are all gone: the manifest's seal says
/// which offsets it held. Truncate and Salvage report them lost and fill
/// them with a hole; the repair is stable, so a Strict open accepts it
/// unchanged (C7). Earlier the report said `0..0`, recovery left an empty
/// placeholder segment at the seal with nothing durable explaining the gap
/// below it, and the Strict reopen refused its own repair ("segment file
/// … holding offsets 0..10 is missing").
#[test]
fn sealed_partition_missing_every_file_is_repaired_once() {
    let root = tempfile::tempdir().unwrap();
    let pristine = root.path().join("pristine");
    let children = split_without_checkpoint(&pristine);
    let mut img = DirImage::capture(&pristine).unwrap();
    img.files.retain(|p, _| !p.starts_with(pdir()));
    for mode in [RecoveryMode::Truncate, RecoveryMode::Salvage] {
        let dir = root.path().join(format!("{mode:?}"));
        img.write_to(&dir).unwrap();
        let log = Log::open(&dir, opts(mode)).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        let reported: Vec<(u64, u64)> = log
            .recovery_report()
            .files
            .iter()
            .filter_map(|f| match f.action {
                FileAction::MissingData { lost_offsets: l } => Some((l.start, l.end)),
                _ => None,
            })
            .collect();
        assert_eq!(reported, vec![(0, 10)], "{mode:?}");
        let read = |log: &Log| -> Vec<String> {
            let p = log.topic("t").unwrap().partition(0).unwrap();
            let mut out = vec![format!("{}..{}", p.start_offset(), p.end_offset())];
            for i in 0..10 {
                out.push(match p.read(i, 1) {
                    Ok(b) => format!("record {}", b.iter().next().unwrap().offset),
                    Err(Error::Hole { start, end, .. }) if start <= i => format!("hole to {end}"),
                    Err(e) => format!("{e}"),
                });
            }
            out
        };
        let first = read(&log);
        assert_eq!(first[0], "0..10", "{mode:?}");
        assert!(
            first[1..].iter().all(|r| r == "hole to 10"),
            "{mode:?}: {first:?}"
        );
        log.close().unwrap();
        let log = Log::open(&dir, opts(RecoveryMode::Strict))
            .unwrap_or_else(|e| panic!("Strict reopen after {mode:?}: {e}"));
        assert_eq!(read(&log), first, "{mode:?}: reopen reads differently");
        let t = log.topic("t").unwrap();
        for &c in &children {
            t.partition(c).unwrap();
        }
        drop(t);
        log.close().unwrap();
    }
}

/// A sealed partition the checkpoint does not name, whose only segment's
/// header is unreadable. The split that sealed it synced its records (and
/// their names) before its record committed, so this is lost data, not a
/// segment torn at its creation: Strict refuses and names the offsets,
/// changing nothing; Truncate fills them with a hole, and the next Strict
/// open reads the same and repairs nothing (C7). Earlier every mode took it
/// for a torn creation and Strict opened the partition silently empty (and
/// Truncate deleted every later segment, synced as they were).
#[test]
fn sealed_partition_with_an_unreadable_only_segment_is_missing_data() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    split_without_checkpoint(&dir);
    // Tear the segment header.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(seg(0)))
        .unwrap();
    f.set_len(38).unwrap();
    drop(f);
    let before = DirImage::capture(&dir).unwrap();
    let err = Log::open(&dir, opts(RecoveryMode::Strict)).unwrap_err();
    assert!(err.to_string().contains("0..10"), "{err}");
    let after = DirImage::capture(&dir).unwrap();
    assert!(before == after, "{}", before.diff_summary(&after));
    let read = |log: &Log| {
        let p = log.topic("t").unwrap().partition(0).unwrap();
        (
            p.start_offset(),
            p.end_offset(),
            p.read(0, 10).err().map(|e| e.to_string()),
        )
    };
    let log = Log::open(&dir, opts(RecoveryMode::Truncate)).unwrap();
    assert!(log.recovery_report().changed_anything());
    let first = read(&log);
    assert_eq!(first.1, 10, "offsets up to the seal stay handed out");
    assert!(
        first.2.is_some(),
        "the lost records read as an error, not as data"
    );
    log.close().unwrap();
    let log = Log::open(&dir, opts(RecoveryMode::Strict))
        .unwrap_or_else(|e| panic!("Strict reopen after a Truncate open: {e}"));
    assert_eq!(read(&log), first);
    // The damaged segment stays set aside (`.seg.damaged`, listed as a
    // foreign file on every open); nothing is repaired again.
    assert!(
        !log.recovery_report().changed_anything(),
        "the second open repairs again: {:?}",
        log.recovery_report().files
    );
    log.close().unwrap();
}
