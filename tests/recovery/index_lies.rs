//! Index files that lie. The sparse index is a cache: an entry that points
//! past the data, into the middle of a batch, or at the batch of another
//! offset never makes a read return the wrong record, skip one or fail
//! on intact data, in the active segment (whose index file a clean close
//! wrote) or in a rolled one, and `recover` rebuilds it so `verify` is
//! clean again.

use crate::common;
use common::log::{quiet, value};

use std::path::{Path, PathBuf};

use fissionlog::{Log, NewRecord, TopicConfig};

const BATCH: u64 = 157;
const HEADER: u64 = 64;
/// Records per segment file (whole, in 16 KiB).
const PER_SEG: u64 = (16 * 1024 - HEADER) / BATCH;
const N: u64 = PER_SEG + 60;

fn put(log: &Log, i: u64) {
    let at = log
        .topic("t")
        .unwrap()
        .append_batch(&[NewRecord {
            key: Some(b"k"),
            value: &value(i),
            timestamp: Some(i as i64),
        }])
        .unwrap();
    assert_eq!(at[0].offset, i);
}

fn idx(base: u64) -> PathBuf {
    PathBuf::from(format!("topics/t0/p0/{base:020}.idx"))
}

/// A closed log with a rolled segment of `PER_SEG` records and an active
/// one of 60.
fn closed_log(dir: &Path) {
    let log = Log::open(dir, quiet()).unwrap();
    log.create_topic(
        "t",
        TopicConfig {
            partitions: 1,
            segment_bytes: 16 * 1024,
            index_interval_bytes: 1024,
            ..TopicConfig::default()
        },
    )
    .unwrap();
    for i in 0..N {
        put(&log, i);
    }
    log.close().unwrap();
}

/// An index entry: relative offset, position, newest timestamp before.
type Entry = (u32, u32, i64);

/// An index file for the segment at `base` with `entries`, with a
/// checksum that matches: a lie that only checks at use can catch.
fn index_file(base: u64, entries: &[Entry]) -> Vec<u8> {
    let mut v = b"FSNLIDX\x02".to_vec();
    v.extend_from_slice(&base.to_le_bytes());
    for &(rel, pos, ts) in entries {
        v.extend_from_slice(&rel.to_le_bytes());
        v.extend_from_slice(&pos.to_le_bytes());
        v.extend_from_slice(&ts.to_le_bytes());
    }
    let crc = crc32fast::hash(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

/// Reads every offset on its own (each read starts at an index lookup) and
/// checks the record.
fn each_offset_reads_its_record(log: &Log, what: &str) {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(p.end_offset(), N, "{what}");
    for o in 0..N {
        let b = p
            .read(o, 1)
            .unwrap_or_else(|e| panic!("{what}: read {o}: {e}"));
        let r = b
            .iter()
            .next()
            .unwrap_or_else(|| panic!("{what}: read {o}: empty"));
        assert_eq!(r.offset, o, "{what}");
        assert_eq!(r.value, value(o).as_slice(), "{what}: record {o}");
    }
    for o in [0, 1, PER_SEG - 1, PER_SEG, N - 1] {
        assert_eq!(
            p.offset_for_time(o as i64).unwrap(),
            Some(o),
            "{what}: time lookup of {o}"
        );
    }
}

/// Lies about the segment at `base` (holding `count` records from
/// `base`): past the data, into a batch, at another offset's batch.
fn lies(base: u64, count: u64) -> Vec<(&'static str, Vec<Entry>)> {
    let pos = |rel: u64| (HEADER + rel * BATCH) as u32;
    let ts = |rel: u64| (base + rel) as i64 - 1;
    let (a, b) = (count / 3, 2 * count / 3);
    vec![
        (
            "an entry past the data",
            vec![(0, pos(0), i64::MIN), (a as u32, pos(count) + 500, ts(a))],
        ),
        (
            "an entry into the middle of a batch",
            vec![(0, pos(0), i64::MIN), (a as u32, pos(a) + 7, ts(a))],
        ),
        (
            "an entry at the batch of a later offset",
            vec![(0, pos(0), i64::MIN), (a as u32, pos(b), ts(a))],
        ),
        (
            "an entry at the batch of an earlier offset",
            vec![(0, pos(0), i64::MIN), (b as u32, pos(a), ts(b))],
        ),
        (
            "a last entry into a batch after a true one",
            vec![
                (0, pos(0), i64::MIN),
                (a as u32, pos(a), ts(a)),
                (b as u32, pos(b) + 1, ts(b)),
            ],
        ),
    ]
}

#[test]
fn lying_index_entries_never_change_what_a_read_returns() {
    for (seg_base, count) in [(0, PER_SEG), (PER_SEG, N - PER_SEG)] {
        for (what, entries) in lies(seg_base, count) {
            let what = format!("segment {seg_base}: {what}");
            let dir = tempfile::tempdir().unwrap();
            closed_log(dir.path());
            std::fs::write(
                dir.path().join(idx(seg_base)),
                index_file(seg_base, &entries),
            )
            .unwrap();
            let log =
                Log::open(dir.path(), quiet()).unwrap_or_else(|e| panic!("{what}: open: {e}"));
            each_offset_reads_its_record(&log, &what);
            // Appends after the lie continue the chain and read back.
            log.close().unwrap();
            let log = Log::open(dir.path(), quiet()).unwrap();
            each_offset_reads_its_record(&log, &format!("{what}, reopened"));
            log.close().unwrap();
            // A full scan (what `recover` runs) rewrites the stale cache:
            // `verify` finds nothing after it.
            let log = Log::open(
                dir.path(),
                fissionlog::LogOptions {
                    full_scan: true,
                    ..quiet()
                },
            )
            .unwrap_or_else(|e| panic!("{what}: full scan open: {e}"));
            each_offset_reads_its_record(&log, &format!("{what}, after a full scan"));
            log.close().unwrap();
            let (_, problems) =
                fissionlog::verify(dir.path()).unwrap_or_else(|e| panic!("{what}: verify: {e}"));
            assert!(
                problems.is_empty(),
                "{what}: verify after a full scan: {problems:#?}"
            );
        }
    }
}

/// A timestamp bound damaged in an index file a clean close wrote (here
/// lowered to the oldest, as a stuck bit or a stale write would leave it)
/// would make the time lookup start past the records it asks for, which
/// no check of a position against its batch can see: the file's checksum
/// refuses it and the lookup answers from the data.
#[test]
fn a_damaged_timestamp_bound_in_an_index_file_never_changes_a_time_lookup() {
    for seg_base in [0, PER_SEG] {
        let dir = tempfile::tempdir().unwrap();
        closed_log(dir.path());
        let path = dir.path().join(idx(seg_base));
        let mut bytes = std::fs::read(&path).unwrap();
        let entries = (bytes.len() - 16) / 16;
        assert!(entries >= 3, "segment {seg_base}: {entries} entries");
        // Every bound but the first's lowered to the segment's first
        // timestamp: the lookup of any later record would start at the
        // last entry.
        for k in 1..entries {
            let at = 16 + 16 * k + 8;
            bytes[at..at + 8].copy_from_slice(&(seg_base as i64).to_le_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        let log = Log::open(dir.path(), quiet()).unwrap();
        let what = format!("segment {seg_base}: lowered bounds");
        each_offset_reads_its_record(&log, &what);
        let p = log.topic("t").unwrap().partition(0).unwrap();
        let count = if seg_base == 0 { PER_SEG } else { N - PER_SEG };
        for o in seg_base..seg_base + count {
            assert_eq!(p.offset_for_time(o as i64).unwrap(), Some(o), "{what}: {o}");
        }
        drop(p);
        log.close().unwrap();
    }
}

/// A rolled segment whose data fits in one of its topic's index intervals
/// (64 KiB here) gets no index file at a clean close, and a read after the
/// reopen derives the same single entry at the topic's interval: it writes
/// no index file either, where rebuilding at another interval would make
/// several entries and write them.
#[test]
fn a_read_rebuilds_an_index_at_the_topics_interval() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                index_interval_bytes: 64 * 1024,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    for i in 0..150 {
        t.append_to(
            0,
            &[NewRecord {
                key: None,
                value: &value(i),
                timestamp: Some(i as i64),
            }],
        )
        .unwrap();
    }
    t.partition(0).unwrap().roll_now().unwrap();
    drop(t);
    log.close().unwrap();
    let first = dir.path().join(idx(0));
    std::fs::remove_file(&first).ok();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    for o in [0, 75, 149] {
        assert_eq!(p.offset_for_time(o as i64).unwrap(), Some(o));
        let b = p.read(o, 1).unwrap();
        assert_eq!(b.iter().next().unwrap().offset, o);
    }
    assert!(!first.exists(), "a read wrote {}", first.display());
    drop(p);
    log.close().unwrap();
}

/// Ways an index file can be damaged that its checksum catches: each
/// gives no entries, and the data answers instead.
fn damaged_files(bytes: &[u8], other: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let n = bytes.len();
    let mut stale_trailer = bytes[..n - 4 - 16].to_vec();
    stale_trailer.extend_from_slice(&bytes[n - 4..]);
    vec![
        ("a zero-length file", Vec::new()),
        ("a file without its trailer", bytes[..n - 4].to_vec()),
        ("a file cut mid-entry", bytes[..n - 9].to_vec()),
        (
            "a file short of an entry, with the old trailer",
            stale_trailer,
        ),
        ("the other segment's file (valid checksum)", other.to_vec()),
    ]
}

/// Every index file damage the checksum catches, in the rolled and the
/// active segment: every offset and time lookup answers from the data, the
/// close leaves index files `verify` finds clean (a read rewrote the
/// rolled one, the close the active one), and a second open reads them.
#[test]
fn a_damaged_index_file_is_rebuilt_and_verify_is_clean_after_the_close() {
    let bases = [0, PER_SEG];
    for (k, &seg_base) in bases.iter().enumerate() {
        let probe = tempfile::tempdir().unwrap();
        closed_log(probe.path());
        let bytes = std::fs::read(probe.path().join(idx(seg_base))).unwrap();
        let other = std::fs::read(probe.path().join(idx(bases[1 - k]))).unwrap();
        for (what, damaged) in damaged_files(&bytes, &other) {
            let what = format!("segment {seg_base}: {what}");
            let dir = tempfile::tempdir().unwrap();
            closed_log(dir.path());
            std::fs::write(dir.path().join(idx(seg_base)), &damaged).unwrap();
            let (_, problems) = fissionlog::verify(dir.path()).unwrap();
            assert_eq!(problems.len(), 1, "{what}: verify before: {problems:#?}");
            let log = Log::open(dir.path(), quiet()).unwrap_or_else(|e| panic!("{what}: {e}"));
            each_offset_reads_its_record(&log, &what);
            log.close().unwrap();
            let (_, problems) = fissionlog::verify(dir.path()).unwrap();
            assert!(problems.is_empty(), "{what}: verify after: {problems:#?}");
            let log = Log::open(dir.path(), quiet()).unwrap();
            each_offset_reads_its_record(&log, &format!("{what}, reopened"));
            log.close().unwrap();
            assert_eq!(
                std::fs::read(dir.path().join(idx(seg_base))).unwrap(),
                bytes,
                "{what}: the rebuilt file differs from the one the close wrote"
            );
        }
    }
}

/// An index file of the format's first version (its magic, no trailer)
/// is no damage: `verify` lists no problem and reports the file as one an
/// open rebuilds; the open reads every offset and the close leaves the
/// current format. The same file with its base offset changed is damage.
#[test]
fn verify_tells_a_first_version_index_file_from_a_damaged_one() {
    let probe = tempfile::tempdir().unwrap();
    closed_log(probe.path());
    let bytes = std::fs::read(probe.path().join(idx(0))).unwrap();
    let mut v1 = b"FSNLIDX\0".to_vec();
    v1.extend_from_slice(&bytes[8..bytes.len() - 4]);

    let dir = tempfile::tempdir().unwrap();
    closed_log(dir.path());
    std::fs::write(dir.path().join(idx(0)), &v1).unwrap();
    let (report, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "verify: {problems:#?}");
    let rebuilt: Vec<_> = report
        .files
        .iter()
        .filter(|f| matches!(f.action, fissionlog::FileAction::RebuiltIndex))
        .map(|f| f.file.clone())
        .collect();
    assert_eq!(rebuilt, vec![dir.path().join(idx(0))], "{report:#?}");
    let log = Log::open(dir.path(), quiet()).unwrap();
    each_offset_reads_its_record(&log, "a first-version index");
    log.close().unwrap();
    let (report, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "verify after: {problems:#?}");
    assert!(report.files.is_empty(), "verify after: {report:#?}");
    assert_eq!(std::fs::read(dir.path().join(idx(0))).unwrap(), bytes);

    let mut other_base = v1.clone();
    other_base[8..16].copy_from_slice(&PER_SEG.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    closed_log(dir.path());
    std::fs::write(dir.path().join(idx(0)), &other_base).unwrap();
    let (report, problems) = fissionlog::verify(dir.path()).unwrap();
    assert_eq!(problems.len(), 1, "verify: {problems:#?}");
    assert!(problems[0].what.contains("does not match"), "{problems:#?}");
    assert!(report.files.is_empty(), "{report:#?}");
}

/// Topics indexed at every batch (interval 1) and at no batch but the
/// first (the largest interval): after rolls, a clean close and a reopen,
/// every offset and time lookup answers, `verify` is clean before and
/// after the reads, the reads write no index file the close did not, and
/// a full-scan open (what `recover` runs) rewrites none the close wrote.
#[test]
fn unusual_index_intervals_read_and_verify_clean() {
    for interval in [1, u32::MAX] {
        let what = format!("interval {interval}");
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), quiet()).unwrap();
        log.create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 16 * 1024,
                index_interval_bytes: interval,
                ..TopicConfig::default()
            },
        )
        .unwrap();
        for i in 0..N {
            put(&log, i);
        }
        log.close().unwrap();
        let listing = |d: &Path| {
            let mut v: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(d.join("topics/t0/p0"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "idx"))
                .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
                .collect();
            v.sort();
            v
        };
        let closed = listing(dir.path());
        let (_, problems) = fissionlog::verify(dir.path()).unwrap();
        assert!(problems.is_empty(), "{what}: {problems:#?}");
        let log = Log::open(dir.path(), quiet()).unwrap();
        each_offset_reads_its_record(&log, &what);
        log.close().unwrap();
        assert_eq!(
            listing(dir.path()),
            closed,
            "{what}: reads changed index files"
        );
        let (_, problems) = fissionlog::verify(dir.path()).unwrap();
        assert!(problems.is_empty(), "{what}, after reads: {problems:#?}");
        let log = Log::open(
            dir.path(),
            fissionlog::LogOptions {
                full_scan: true,
                ..quiet()
            },
        )
        .unwrap();
        each_offset_reads_its_record(&log, &format!("{what}, full scan"));
        log.close().unwrap();
        // A full scan writes the one-entry index a clean close leaves
        // derivable (a cache: harmless), and changes no other.
        let scanned = listing(dir.path());
        for f in &closed {
            assert!(
                scanned.contains(f),
                "{what}: a full scan changed {}",
                f.0.display()
            );
        }
        let (_, problems) = fissionlog::verify(dir.path()).unwrap();
        assert!(
            problems.is_empty(),
            "{what}, after a full scan: {problems:#?}"
        );
    }
}

/// The first version had no checksum, so `verify` calls an index file of
/// that version harmless only when its shape is whole: a current file that
/// lost its version byte (it keeps its trailer), a first-version header on
/// garbage and a first-version file with an entry past the segment's data
/// are damage, in the rolled segment as in the active one. An open rebuilds
/// each of them, reads every record, and leaves `verify` clean.
#[test]
fn verify_calls_no_damaged_index_file_a_first_version_one() {
    let probe = tempfile::tempdir().unwrap();
    closed_log(probe.path());
    for base in [0, PER_SEG] {
        let bytes = std::fs::read(probe.path().join(idx(base))).unwrap();
        let mut v1 = b"FSNLIDX\0".to_vec();
        v1.extend_from_slice(&bytes[8..bytes.len() - 4]);

        let mut lost_version = bytes.clone();
        lost_version[7] = 0;
        let mut on_garbage = v1[..16].to_vec();
        on_garbage.extend((0..37u8).map(|i| i.wrapping_mul(151) ^ 0x5a));
        let mut past_data = v1.clone();
        let last = past_data.len() - 16;
        let mut entry = past_data[last..].to_vec();
        let rel_offset = u32::from_le_bytes(entry[0..4].try_into().unwrap()) + 1;
        entry[0..4].copy_from_slice(&rel_offset.to_le_bytes());
        entry[4..8].copy_from_slice(&(16 * 1024u32 * 4).to_le_bytes());
        past_data.extend_from_slice(&entry);

        for (what, file) in [
            ("a current file without its version byte", lost_version),
            ("a first-version header on garbage", on_garbage),
            ("a first-version entry past the data", past_data),
        ] {
            let what = format!("{what} (segment {base})");
            let dir = tempfile::tempdir().unwrap();
            closed_log(dir.path());
            std::fs::write(dir.path().join(idx(base)), &file).unwrap();
            let (report, problems) = fissionlog::verify(dir.path()).unwrap();
            assert_eq!(problems.len(), 1, "{what}: {problems:#?}");
            assert_eq!(problems[0].file, dir.path().join(idx(base)), "{what}");
            assert!(report.files.is_empty(), "{what}: {report:#?}");
            let log = Log::open(dir.path(), quiet()).unwrap();
            each_offset_reads_its_record(&log, &what);
            log.close().unwrap();
            let (report, problems) = fissionlog::verify(dir.path()).unwrap();
            assert!(problems.is_empty(), "{what}, after: {problems:#?}");
            assert!(report.files.is_empty(), "{what}, after: {report:#?}");
        }

        let dir = tempfile::tempdir().unwrap();
        closed_log(dir.path());
        std::fs::write(dir.path().join(idx(base)), &v1).unwrap();
        let (report, problems) = fissionlog::verify(dir.path()).unwrap();
        assert!(
            problems.is_empty(),
            "first version (segment {base}): {problems:#?}"
        );
        assert_eq!(
            report.files.len(),
            1,
            "first version (segment {base}): {report:#?}"
        );
    }
}
