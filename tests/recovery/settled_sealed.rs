//! A sealed partition's last segment after a clean close: the next clean
//! open leaves it unmapped when it ends where the checkpoint says, and
//! reads, time lookups and retention map it on demand. Whatever happened
//! to the file between the close and the open (bytes flipped, the file
//! cut or extended, its seal rewritten), the open or the first read says
//! so: records never come back wrong, missing or twice without an error
//! (C3, C6, C7, C8).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::faults::Fail;
use common::log::{quiet, sized_value};

use fissionlog::{Error, IoOp, Log, LogOptions, NewRecord, SplitPlan, TopicConfig};

/// Timestamp of the parent's record `i`.
fn ts(i: u64) -> i64 {
    1_000_000 + i as i64 * 10
}

/// A topic whose partition 0 holds `n` records of `len` bytes (record
/// `i` at timestamp [`ts`]`(i)`), then split: 0 is sealed, its children
/// hold a record each. Closed cleanly. Returns the parent's last segment.
fn sealed_parent(dir: &Path, n: u64, len: usize, segment_bytes: u64) -> PathBuf {
    sealed_parent_with(dir, (n, len, segment_bytes), (None, None))
}

/// [`sealed_parent`], the topic keeping records `retention_age`.
fn sealed_parent_kept(
    dir: &Path,
    shape: (u64, usize, u64),
    retention_age: Option<Duration>,
) -> PathBuf {
    sealed_parent_with(dir, shape, (retention_age, None))
}

/// [`sealed_parent`], the topic keeping records `retention_age` and
/// `retention_bytes`.
fn sealed_parent_with(
    dir: &Path,
    (n, len, segment_bytes): (u64, usize, u64),
    (retention_age, retention_bytes): (Option<Duration>, Option<u64>),
) -> PathBuf {
    let log = Log::open(dir, quiet()).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes,
                retention_age,
                retention_bytes,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    for i in 0..n {
        let v = sized_value(i, len);
        t.append_to(
            0,
            &[NewRecord {
                key: None,
                value: &v,
                timestamp: Some(ts(i)),
            }],
        )
        .unwrap();
    }
    let children = t.split(0, SplitPlan::Even).unwrap();
    for &c in &children {
        let v = sized_value(u64::from(c), len);
        t.append_to(
            c,
            &[NewRecord {
                key: None,
                value: &v,
                timestamp: Some(ts(n + 1_000)),
            }],
        )
        .unwrap();
    }
    let parent = t.partition(0).unwrap().dir().to_path_buf();
    drop(t);
    log.close().unwrap();
    last_segment(&parent)
}

fn last_segment(part: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(part)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs.pop().expect("a segment")
}

/// Every record of partition `p`: (offset, timestamp, value).
fn read_partition(log: &Log, p: u32) -> fissionlog::Result<Vec<(u64, i64, Vec<u8>)>> {
    let part = log.topic("t")?.partition(p)?;
    let mut out = Vec::new();
    let mut at = part.start_offset();
    while at < part.end_offset() {
        let b = part.read(at, 1 << 20)?;
        assert!(b.next_offset() > at, "a read at {at} made no progress");
        out.extend(b.iter().map(|r| (r.offset, r.timestamp, r.value.to_vec())));
        at = b.next_offset();
    }
    Ok(out)
}

fn written(n: u64, len: usize) -> Vec<(u64, i64, Vec<u8>)> {
    (0..n).map(|i| (i, ts(i), sized_value(i, len))).collect()
}

/// Opens cleanly and reads the parent back: an error of the open or of
/// the read, or what it read.
fn open_and_read(dir: &Path, opts: LogOptions) -> fissionlog::Result<Vec<(u64, i64, Vec<u8>)>> {
    let log = Log::open(dir, opts)?;
    let got = read_partition(&log, 0);
    log.close()?;
    got
}

/// The parent changed after the close reads back exactly as written, or
/// the open or the read fails; when they fail, `verify` names a problem.
fn damage_is_reported(dir: &Path, n: u64, len: usize, ctx: &str) {
    match open_and_read(dir, quiet()) {
        Ok(got) => assert!(got == written(n, len), "{ctx}: records read back wrong"),
        Err(e) => {
            let (_, problems) = fissionlog::verify(dir).unwrap();
            assert!(!problems.is_empty(), "{ctx}: {e}, and verify finds nothing");
        }
    }
}

/// Short (one pread from the first batch) and long (from the index
/// file's last entry) parents.
const SHAPES: [(u64, usize, u64); 2] = [(20, 100, 1 << 20), (400, 300, 1 << 20)];

#[test]
fn a_clean_open_reads_an_unmapped_sealed_segment_back_whole() {
    for (n, len, seg) in SHAPES {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        sealed_parent(&dir, n, len, seg);
        let log = Log::open(&dir, quiet()).unwrap();
        assert_eq!(log.recovery_report().bytes_scanned, 0, "{n} records");
        assert_eq!(read_partition(&log, 0).unwrap(), written(n, len));
        log.close().unwrap();
        let (_, problems) = fissionlog::verify(&dir).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
    }
}

/// A byte of a record flipped below the checkpoint (the batch headers
/// still lead to it): the read that meets it fails, and `verify` names it.
#[test]
fn a_record_byte_flipped_in_an_unmapped_sealed_segment_fails_its_read() {
    for (n, len, seg) in SHAPES {
        for at_end in [false, true] {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().join("log");
            let file = sealed_parent(&dir, n, len, seg);
            let flen = std::fs::metadata(&file).unwrap().len();
            // The last value byte, or one inside the first batch's value.
            let pos = if at_end { flen - 1 } else { 64 + 80 };
            common::crash::flip_byte(Path::new("/"), &file, pos);
            let ctx = format!("{n} records, byte {pos} of {flen}");
            let got = open_and_read(&dir, quiet());
            assert!(
                matches!(
                    got,
                    Err(Error::Corruption { .. } | Error::ChecksumMismatch { .. })
                ),
                "{ctx}: {:?}",
                got.map(|r| r.len())
            );
            let (_, problems) = fissionlog::verify(&dir).unwrap();
            assert!(!problems.is_empty(), "{ctx}: verify finds nothing");
        }
    }
}

/// A batch header's record count or length changed below the checkpoint:
/// the headers no longer lead to it, the segment is scanned, and the open
/// or the read reports the damage.
#[test]
fn a_batch_header_changed_in_a_sealed_segment_is_reported() {
    for (n, len, seg) in SHAPES {
        for field in [0u64, 12] {
            for batch in [0usize, 1] {
                let root = tempfile::tempdir().unwrap();
                let dir = root.path().join("log");
                let file = sealed_parent(&dir, n, len, seg);
                let bytes = std::fs::read(&file).unwrap();
                let mut starts = vec![64u64];
                while starts.len() <= batch {
                    let s = *starts.last().unwrap() as usize;
                    let blen = u32::from_le_bytes(bytes[s..s + 4].try_into().unwrap());
                    starts.push(s as u64 + u64::from(blen));
                }
                let pos = starts[batch] + field;
                common::crash::flip_byte(Path::new("/"), &file, pos);
                damage_is_reported(&dir, n, len, &format!("{n} records, byte {pos}"));
            }
        }
    }
}

/// The file cut or extended after the close: the open or the read
/// reports it, or the records read back as written (the extension is
/// stale bytes past the end).
#[test]
fn a_sealed_segment_cut_or_extended_after_a_clean_close_is_reported() {
    for (n, len, seg) in SHAPES {
        for change in ["cut 1", "cut batch", "zeros", "copy of last batch", "junk"] {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().join("log");
            let file = sealed_parent(&dir, n, len, seg);
            let mut bytes = std::fs::read(&file).unwrap();
            let last_batch = {
                let mut s = 64usize;
                loop {
                    let blen = u32::from_le_bytes(bytes[s..s + 4].try_into().unwrap()) as usize;
                    if s + blen >= bytes.len() {
                        break s;
                    }
                    s += blen;
                }
            };
            match change {
                "cut 1" => bytes.truncate(bytes.len() - 1),
                "cut batch" => bytes.truncate(last_batch),
                "zeros" => bytes.extend(std::iter::repeat_n(0u8, 4096)),
                "copy of last batch" => {
                    let copy = bytes[last_batch..].to_vec();
                    bytes.extend(copy);
                }
                _ => bytes.extend((0..300u32).map(|i| (i * 7 + 1) as u8)),
            }
            std::fs::write(&file, &bytes).unwrap();
            let ctx = format!("{n} records, {change}");
            damage_is_reported(&dir, n, len, &ctx);
            if change.starts_with("cut") {
                assert!(
                    open_and_read(&dir, quiet()).is_err(),
                    "{ctx}: a sealed partition lost durable records without an error"
                );
            }
        }
    }
}

/// CRC-32 (IEEE), as the segment header's seal CRC uses.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn write_seal(path: &Path, end_offset: u64, end_pos: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[48..56].copy_from_slice(&end_offset.to_le_bytes());
    bytes[56..64].copy_from_slice(&end_pos.to_le_bytes());
    let crc = crc32(&bytes[48..64]);
    bytes[44..48].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

/// A seal written into the last segment's header after the close: one
/// that says what the checkpoint says changes nothing; any other is
/// reported or ignored, never believed over the data.
#[test]
fn a_seal_written_into_a_sealed_segment_after_a_clean_close_is_not_believed() {
    for (n, len, seg) in SHAPES {
        let flen = {
            let root = tempfile::tempdir().unwrap();
            let f = sealed_parent(&root.path().join("log"), n, len, seg);
            std::fs::metadata(f).unwrap().len()
        };
        for (end_offset, end_pos) in [
            (n, flen),
            (n + 1, flen),
            (n - 1, flen),
            (n, flen - 1),
            (n - 1, flen - 100),
        ] {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().join("log");
            let file = sealed_parent(&dir, n, len, seg);
            write_seal(&file, end_offset, end_pos);
            let ctx = format!("{n} records, seal ({end_offset}, {end_pos}) of ({n}, {flen})");
            damage_is_reported(&dir, n, len, &ctx);
            if (end_offset, end_pos) == (n, flen) {
                assert_eq!(
                    open_and_read(&dir, quiet()).unwrap(),
                    written(n, len),
                    "{ctx}"
                );
                let (_, problems) = fissionlog::verify(&dir).unwrap();
                assert!(problems.is_empty(), "{ctx}: {problems:?}");
            }
        }
    }
}

/// Time lookups on the unmapped segment: each record's timestamp finds
/// it, a timestamp between two finds the later, one past the newest
/// finds nothing.
#[test]
fn time_lookups_find_every_record_of_an_unmapped_sealed_segment() {
    for (n, len, seg) in SHAPES {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        sealed_parent(&dir, n, len, seg);
        let log = Log::open(&dir, quiet()).unwrap();
        let part = log.topic("t").unwrap().partition(0).unwrap();
        // The newest first: the lookup that works out the newest timestamp.
        assert_eq!(part.offset_for_time(ts(n - 1) + 1).unwrap(), None);
        assert_eq!(part.offset_for_time(ts(n - 1)).unwrap(), Some(n - 1));
        for i in (0..n).step_by(7) {
            assert_eq!(part.offset_for_time(ts(i)).unwrap(), Some(i), "{n}: {i}");
            assert_eq!(
                part.offset_for_time(ts(i) - 5).unwrap(),
                Some(i),
                "{n}: {i}"
            );
        }
        assert_eq!(part.offset_for_time(i64::MIN).unwrap(), Some(0));
        drop(part);
        log.close().unwrap();
    }
}

/// A time lookup whose segment cannot be mapped (out of descriptors) is
/// an error, never an answer from the segments it could see.
#[test]
fn a_time_lookup_that_cannot_map_a_sealed_segment_fails() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let (n, len, seg) = SHAPES[0];
    let file = sealed_parent(&dir, n, len, seg);
    let part_dir = file.parent().unwrap().to_string_lossy().into_owned();
    let fail = Arc::new(
        Fail::new(IoOp::MapSegment, libc::EMFILE)
            .in_path(&part_dir)
            .disarmed(),
    );
    let log = Log::open_with_hook(&dir, quiet(), fail.clone()).unwrap();
    let part = log.topic("t").unwrap().partition(0).unwrap();
    fail.arm();
    let got = part.offset_for_time(ts(3));
    fail.disarm();
    assert!(fail.fired(), "the lookup mapped nothing");
    assert!(
        matches!(got, Err(Error::ResourceExhausted { .. })),
        "a lookup that could not map its segment: {got:?}"
    );
    // Once the descriptors are back, the same lookup finds the record.
    assert_eq!(part.offset_for_time(ts(3)).unwrap(), Some(3));
    drop(part);
    log.close().unwrap();
}

/// Time retention after a clean open: a sealed parent whose records are
/// all older than the retention age goes (its children stay and read
/// back); one whose records are newer stays.
#[test]
fn time_retention_after_a_clean_open_weighs_the_unmapped_segment_by_its_records() {
    for old in [true, false] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        let (n, len, seg) = SHAPES[0];
        // The records are at about 1,000 s after the epoch; the age
        // counts from now.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let age = if old {
            Duration::from_secs(3600)
        } else {
            Duration::from_millis(now_ms + 3_600_000)
        };
        sealed_parent_kept(&dir, (n, len, seg), Some(age));
        let log = Log::open(&dir, quiet()).unwrap();
        let t = log.topic("t").unwrap();
        log.enforce_retention().unwrap();
        let gone = t.partition(0).map_or(true, |p| p.is_empty_sealed());
        assert_eq!(gone, old, "old records: {old}");
        for c in [1, 2] {
            assert_eq!(read_partition(&log, c).unwrap().len(), 1, "child {c}");
        }
        if !old {
            assert_eq!(read_partition(&log, 0).unwrap(), written(n, len));
        }
        drop(t);
        log.close().unwrap();
        let (_, problems) = fissionlog::verify(&dir).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
    }
}

/// Every partition of a split and merge history reads back what it was
/// given.
fn check_history(log: &Log, want: &super::open_costs::Written, ctx: &str) {
    for (p, values) in want {
        let got: Vec<Vec<u8>> = read_partition(log, *p)
            .unwrap()
            .into_iter()
            .map(|(_, _, v)| v)
            .collect();
        assert_eq!(&got, values, "{ctx}: partition {p}");
    }
}

/// Reads of many unmapped sealed partitions after a clean open, under a
/// budget of two mappings and three descriptors: each maps its segment,
/// the budget evicts the least recently read, and it never holds more
/// than its limits nor leaks what it gave back.
#[test]
fn reads_after_a_clean_open_keep_to_a_small_budget() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let (sealed, want) = super::open_costs::closed_history(&dir, 30);
    let opts = LogOptions {
        max_mapped_segments: 2,
        max_open_files: 3,
        ..quiet()
    };
    let log = Log::open(&dir, opts.clone()).unwrap();
    let s = log.resource_stats();
    assert_eq!((s.mapped_segments, s.mappings_evicted), (0, 0), "{s:?}");
    for round in 0..2 {
        check_history(&log, &want, &format!("round {round}"));
        let s = log.resource_stats();
        assert!(s.mapped_segments <= 2, "{s:?}");
        assert!(s.open_segment_files <= 3, "{s:?}");
    }
    let s = log.resource_stats();
    assert!(
        s.mappings_evicted >= 2 * sealed.len() as u64 - 4,
        "{} sealed partitions read twice: {s:?}",
        sealed.len()
    );
    log.close().unwrap();
    // The close left them as the previous one did: the next open maps
    // nothing of them either, and reads them back.
    let log = Log::open(&dir, opts).unwrap();
    assert_eq!(log.recovery_report().bytes_scanned, 0);
    assert_eq!(log.resource_stats().mapped_segments, 0);
    check_history(&log, &want, "after a second clean close");
    log.close().unwrap();
}

/// `verify`, a full-scan open and a crash after reads leave the history
/// as it was: each later clean open reads it back, scanning nothing.
#[test]
fn verify_full_scan_and_a_crash_after_a_clean_open_keep_sealed_partitions() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let (_, mut want) = super::open_costs::closed_history(&dir, 12);
    let (_, problems) = fissionlog::verify(&dir).unwrap();
    assert!(problems.is_empty(), "{problems:?}");

    let full = LogOptions {
        full_scan: true,
        ..quiet()
    };
    let log = Log::open(&dir, full).unwrap();
    assert!(log.recovery_report().bytes_scanned > 0);
    check_history(&log, &want, "full scan");
    log.close().unwrap();

    // A clean open that reads every sealed partition, appends to the
    // active one, and is killed.
    let log = Log::open(&dir, quiet()).unwrap();
    assert_eq!(log.recovery_report().bytes_scanned, 0);
    check_history(&log, &want, "clean open");
    let t = log.topic("t").unwrap();
    let active: Vec<u32> = t
        .partitions()
        .iter()
        .filter(|p| p.sealed_at.is_none())
        .map(|p| p.id)
        .collect();
    for &p in &active {
        let v = sized_value(u64::from(p) + 7_000, 100);
        t.append_to(
            p,
            &[NewRecord {
                key: None,
                value: &v,
                timestamp: None,
            }],
        )
        .unwrap();
        match want.iter_mut().find(|(q, _)| *q == p) {
            Some((_, values)) => values.push(v),
            None => want.push((p, vec![v])),
        }
    }
    t.sync().unwrap();
    drop(t);
    log.abandon();

    let log = Log::open(&dir, quiet()).unwrap();
    assert!(!log.recovery_report().clean_shutdown);
    check_history(&log, &want, "after the crash");
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(&dir).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let log = Log::open(&dir, quiet()).unwrap();
    assert_eq!(log.recovery_report().bytes_scanned, 0);
    check_history(&log, &want, "clean open after the crash");
    log.close().unwrap();
}

/// A tail-split parent, sealed, closed cleanly with its moved range
/// reclaimed or not: the next clean opens read every record once (the
/// parent below its split offset, the children the rest), time lookups
/// on the parent stop at its logical end, and a reclaim after the open
/// leaves a log that opens and verifies clean.
#[test]
fn a_tail_split_parent_reads_and_reclaims_after_a_clean_open() {
    use common::tail::{append_big, check_exactly_once, config, options, read_all};
    const N: u64 = 300;
    const FROM: u64 = 100;
    for reclaim_first in [false, true] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        let ctx = format!("reclaimed before the close: {reclaim_first}");
        let log = Log::open(&dir, options()).unwrap();
        let t = log.create_topic("t", config()).unwrap();
        append_big(&t, 0, N, 11);
        let out = t
            .split_tail(
                0,
                SplitPlan::Even,
                fissionlog::TailSplitOptions::from_offset(FROM),
            )
            .unwrap();
        assert_eq!((out.from, out.seal_offset), (FROM, N), "{ctx}");
        if reclaim_first {
            assert!(t.reclaim_tail(0).unwrap().complete, "{ctx}");
        }
        drop(t);
        log.close().unwrap();

        for round in 0..2 {
            let log = Log::open(&dir, options()).unwrap();
            let ctx = format!("{ctx}, open {round}");
            assert_eq!(log.recovery_report().bytes_scanned, 0, "{ctx}");
            let t = log.topic("t").unwrap();
            check_exactly_once(&read_all(&t), 0..N, &ctx);
            let part = t.partition(0).unwrap();
            assert_eq!(part.offset_for_time(i64::MIN).unwrap(), Some(0), "{ctx}");
            assert_eq!(part.offset_for_time(i64::MAX).unwrap(), None, "{ctx}");
            drop(part);
            t.reclaim_tail(0).unwrap();
            check_exactly_once(&read_all(&t), 0..N, &format!("{ctx}, reclaimed"));
            drop(t);
            log.close().unwrap();
            let (_, problems) = fissionlog::verify(&dir).unwrap();
            let bad: Vec<_> = problems
                .iter()
                .filter(|p| p.what != "index does not match its segment")
                .collect();
            assert!(bad.is_empty(), "{ctx}: verify: {bad:?}");
        }
    }
}

/// Two sealed siblings' last segments, of the same base and length,
/// swapped after the close: each file names its own partition, so the
/// open or the read refuses them, never serving one sibling's records as
/// the other's.
#[test]
fn sealed_siblings_swapped_segments_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let (_, want) = super::open_costs::closed_history(&dir, 3);
    let seg_of = |p: u32| {
        let d = dir.join(format!("topics/t0/p{p}"));
        assert!(d.is_dir(), "{}", d.display());
        last_segment(&d)
    };
    let (a, b) = (seg_of(1), seg_of(2));
    assert_eq!(a.file_name(), b.file_name(), "siblings start at one offset");
    let (ba, bb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_eq!(ba.len(), bb.len());
    std::fs::write(&a, &bb).unwrap();
    std::fs::write(&b, &ba).unwrap();
    let got = Log::open(&dir, quiet()).and_then(|log| {
        let r = (1..=2)
            .map(|p| read_partition(&log, p).map(|rs| rs.into_iter().map(|r| r.2).collect()))
            .collect::<fissionlog::Result<Vec<Vec<Vec<u8>>>>>();
        log.close()?;
        r
    });
    match got {
        Err(_) => {}
        Ok(got) => {
            let mine: Vec<&Vec<Vec<u8>>> = want
                .iter()
                .filter(|(p, _)| *p == 1 || *p == 2)
                .map(|(_, v)| v)
                .collect();
            assert_eq!(
                got.iter().collect::<Vec<_>>(),
                mine,
                "swapped files read back"
            );
        }
    }
}

/// Where the child of the descriptor-limit test finds its log.
const NOFILE_CHILD_ENV: &str = "FISSIONLOG_SETTLED_SEALED_NOFILE_DIR";

/// A clean open of a history with more sealed partitions than the
/// process may hold descriptors, its reads and time lookups of every
/// partition, a crash after them and the open that follows, all under
/// `RLIMIT_NOFILE` 24: nothing of a sealed partition holds a descriptor
/// once read.
#[test]
fn reads_of_every_sealed_partition_after_a_clean_open_fit_a_low_descriptor_limit() {
    const NAME: &str =
        "reads_of_every_sealed_partition_after_a_clean_open_fit_a_low_descriptor_limit";
    let opts = || LogOptions {
        max_open_files: 8,
        ..quiet()
    };
    if let Ok(dir) = std::env::var(NOFILE_CHILD_ENV) {
        let dir = Path::new(&dir);
        let want: super::open_costs::Written = read_want(dir);
        for crash in [false, true] {
            let log = Log::open(dir.join("log"), opts()).unwrap();
            check_history(&log, &want, &format!("crash {crash}"));
            let t = log.topic("t").unwrap();
            for p in t.partitions() {
                let part = t.partition(p.id).unwrap();
                let first = part.offset_for_time(i64::MIN).unwrap();
                assert_eq!(first.is_some(), part.end_offset() > part.start_offset());
            }
            drop(t);
            if crash {
                log.abandon();
            } else {
                log.close().unwrap();
            }
        }
        let log = Log::open(dir.join("log"), opts()).unwrap();
        check_history(&log, &want, "after the crash");
        log.close().unwrap();
        return;
    }
    let _serial = common::log::serial();
    let root = tempfile::tempdir().unwrap();
    let (sealed, want) = super::open_costs::closed_history(&root.path().join("log"), 40);
    assert!(sealed.len() > 50, "{} sealed partitions", sealed.len());
    write_want(root.path(), &want);
    let mut cmd = common::log::rerun_command(module_path!(), NAME);
    cmd.env(NOFILE_CHILD_ENV, root.path());
    common::log::assert_rerun_passes_under_nofile(
        cmd,
        24,
        &format!("{} sealed partitions under RLIMIT_NOFILE=24", sealed.len()),
    );
}

/// What each partition holds, written for the child: a line per
/// partition, its id then its values in hex.
fn write_want(dir: &Path, want: &super::open_costs::Written) {
    let text: String = want
        .iter()
        .map(|(p, vs)| {
            let vs: Vec<String> = vs
                .iter()
                .map(|v| v.iter().map(|b| format!("{b:02x}")).collect())
                .collect();
            format!("{p} {}\n", vs.join(" "))
        })
        .collect();
    std::fs::write(dir.join("want"), text).unwrap();
}

fn read_want(dir: &Path) -> super::open_costs::Written {
    std::fs::read_to_string(dir.join("want"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut words = l.split(' ');
            let p = words.next().unwrap().parse().unwrap();
            let vs = words
                .filter(|w| !w.is_empty())
                .map(|w| {
                    (0..w.len())
                        .step_by(2)
                        .map(|i| u8::from_str_radix(&w[i..i + 2], 16).unwrap())
                        .collect()
                })
                .collect();
            (p, vs)
        })
        .collect()
}

/// Time retention that cannot map an unmapped sealed segment to learn
/// its newest timestamp (out of descriptors) keeps it: the partition is
/// neither removed nor cut, and reads back whole once mapping works.
#[test]
fn time_retention_that_cannot_map_a_sealed_segment_keeps_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let (n, len, seg) = SHAPES[1];
    // The records are at about 1,000 s after the epoch: an hour's age
    // expires them, once their timestamps are known.
    let file = sealed_parent_kept(&dir, (n, len, seg), Some(Duration::from_secs(3600)));
    let part_dir = file.parent().unwrap().to_string_lossy().into_owned();
    let fail = Arc::new(
        Fail::new(IoOp::MapSegment, libc::EMFILE)
            .in_path(&part_dir)
            .disarmed(),
    );
    let log = Log::open_with_hook(&dir, quiet(), fail.clone()).unwrap();
    fail.arm();
    let _ = log.enforce_retention();
    fail.disarm();
    assert!(fail.fired(), "retention mapped nothing");
    assert_eq!(read_partition(&log, 0).unwrap(), written(n, len));
    // With the timestamps known, the same retention retires them.
    log.enforce_retention().unwrap();
    let t = log.topic("t").unwrap();
    assert!(t.partition(0).map_or(true, |p| p.is_empty_sealed()));
    drop(t);
    log.close().unwrap();
}

/// A replicated partition, split (sealed) and closed cleanly: the next
/// clean open leaves its last segment unmapped, and its Raft entries
/// read back, ids and bodies, then verify clean.
#[test]
fn a_sealed_replicated_partition_reads_its_entries_after_a_clean_open() {
    use fissionlog::{EntryBody, RaftEntryBody, RaftLogId, RecordIn};
    const LAST: u64 = 30;
    let body = |i: u64| format!("e{i:0200}").into_bytes();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let log = Log::open(&dir, quiet()).unwrap();
    let mut cfg = TopicConfig {
        segment_bytes: 1 << 20,
        replicated: true,
        ..TopicConfig::default()
    };
    cfg.balance.enabled = false;
    let t = log.create_topic("t", cfg).unwrap();
    let p = t.partition(0).unwrap();
    for i in 1..=LAST {
        let v = body(i);
        p.append_entry(
            RaftLogId {
                term: 1,
                leader: 1,
                index: i,
            },
            EntryBody::Records(&[RecordIn {
                key: None,
                value: &v,
                timestamp: ts(i),
            }]),
        )
        .unwrap();
    }
    p.set_committed_end(p.end_offset());
    drop(p);
    t.split(0, SplitPlan::Even).unwrap();
    drop(t);
    log.close().unwrap();
    let log = Log::open(&dir, quiet()).unwrap();
    assert_eq!(log.recovery_report().bytes_scanned, 0);
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert!(p.is_sealed());
    let mut next = 1;
    while next <= LAST {
        let b = p.read_entries(next, 1 << 20).unwrap();
        for e in b.entries() {
            let e = e.unwrap();
            assert_eq!(e.id.index, next);
            let RaftEntryBody::Records(r) = e.body else {
                panic!("entry {next} is not a record");
            };
            assert_eq!(r[0].value, body(next).as_slice());
            next += 1;
        }
    }
    assert_eq!(p.offset_for_time(ts(LAST)).unwrap(), Some(LAST - 1));
    drop(p);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(&dir).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// A clean open that reads nothing, killed: the next open (after a
/// crash) scans nothing (the sealed partitions' checkpointed end is their
/// files' end, and nothing was appended) and reads every partition back.
#[test]
fn a_crash_after_a_clean_open_that_read_nothing_scans_nothing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let (_, want) = super::open_costs::closed_history(&dir, 12);
    let log = Log::open(&dir, quiet()).unwrap();
    assert_eq!(log.recovery_report().bytes_scanned, 0);
    log.abandon();
    let log = Log::open(&dir, quiet()).unwrap();
    assert!(!log.recovery_report().clean_shutdown);
    assert_eq!(log.recovery_report().bytes_scanned, 0);
    check_history(&log, &want, "after the crash");
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(&dir).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// Byte retention after a clean open: the sealed parent, over the limit,
/// goes whole; its children keep
/// their active segments and read back; the log verifies and opens clean.
#[test]
fn byte_retention_after_a_clean_open_removes_an_unmapped_sealed_parent() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let (n, len, seg) = SHAPES[1];
    let file = sealed_parent_with(&dir, (n, len, seg), (None, Some(1)));
    let log = Log::open(&dir, quiet()).unwrap();
    log.enforce_retention().unwrap();
    let t = log.topic("t").unwrap();
    assert!(t.partition(0).map_or(true, |p| p.is_empty_sealed()));
    assert!(!file.exists(), "{} is still there", file.display());
    for c in [1, 2] {
        assert_eq!(read_partition(&log, c).unwrap().len(), 1, "child {c}");
    }
    drop(t);
    log.close().unwrap();
    let (_, problems) = fissionlog::verify(&dir).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let log = Log::open(&dir, quiet()).unwrap();
    assert_eq!(log.recovery_report().bytes_scanned, 0);
    for c in [1, 2] {
        assert_eq!(read_partition(&log, c).unwrap().len(), 1, "child {c}");
    }
    log.close().unwrap();
}

/// Sealed partitions whose last segment holds no record (split before
/// any append, or right after a roll): the clean open keeps them at the
/// checkpoint, they read as what they hold, and the log verifies clean
/// right after each close (while other tests of this binary fork
/// children that share the lock until they exec).
#[test]
fn sealed_partitions_ending_in_an_empty_segment_open_cleanly() {
    for rolled in [false, true] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        let log = Log::open(&dir, quiet()).unwrap();
        let t = log
            .create_topic(
                "t",
                TopicConfig {
                    partitions: 1,
                    ..TopicConfig::default()
                },
            )
            .unwrap();
        let n = if rolled { 3 } else { 0 };
        for i in 0..n {
            let v = sized_value(i, 100);
            t.append_to(
                0,
                &[NewRecord {
                    key: None,
                    value: &v,
                    timestamp: Some(ts(i)),
                }],
            )
            .unwrap();
        }
        if rolled {
            t.partition(0).unwrap().roll_now().unwrap();
        }
        t.split(0, SplitPlan::Even).unwrap();
        let part_dir = t.partition(0).unwrap().dir().to_path_buf();
        drop(t);
        log.close().unwrap();
        let last = last_segment(&part_dir);
        assert_eq!(std::fs::metadata(&last).unwrap().len(), 64, "{rolled}");
        for round in 0..2 {
            let log = Log::open(&dir, quiet()).unwrap();
            assert_eq!(log.recovery_report().bytes_scanned, 0);
            assert_eq!(read_partition(&log, 0).unwrap(), written(n, 100));
            let part = log.topic("t").unwrap().partition(0).unwrap();
            assert_eq!(
                part.offset_for_time(i64::MIN).unwrap(),
                (n > 0).then_some(0),
                "rolled {rolled}, open {round}"
            );
            drop(part);
            log.close().unwrap();
            let (_, problems) = fissionlog::verify(&dir).unwrap();
            assert!(problems.is_empty(), "{problems:?}");
        }
    }
}
