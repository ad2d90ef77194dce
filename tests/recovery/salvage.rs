//! Salvage's repair of a rolled segment torn below
//! the seal in its header (the segments after it are kept, the torn part
//! becomes one hole up to the seal), and of readers reporting partitions
//! retention removed.

use crate::common;
use common::log::quiet_in;
use common::log::value;
use common::retention::fill;

use std::path::{Path, PathBuf};
use std::time::Duration;

use fissionlog::{
    Error, IoOp, Log, LogOptions, NewRecord, RecoveryMode, SplitPlan, SyncPolicy, Topic,
    TopicConfig,
};

fn config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: 4096,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    }
}

fn append(t: &Topic, p: u32, i: u64) -> u64 {
    let v = value(i);
    t.append_to(
        p,
        &[NewRecord {
            key: None,
            value: &v,
            timestamp: Some(i as i64),
        }],
    )
    .unwrap()
}

/// Segment files of a partition directory, sorted by name.
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// Byte positions where the batches of a segment file start, and its
/// sealed end (the seal position in the header), read from the file.
fn batch_starts(path: &Path) -> (Vec<u64>, u64) {
    let bytes = std::fs::read(path).unwrap();
    let seal_pos = u64::from_le_bytes(bytes[56..64].try_into().unwrap());
    let mut pos = 64u64;
    let mut starts = Vec::new();
    while pos + 4 <= seal_pos.min(bytes.len() as u64) {
        let len = u32::from_le_bytes(bytes[pos as usize..pos as usize + 4].try_into().unwrap());
        if len == 0 {
            break;
        }
        starts.push(pos);
        pos += u64::from(len);
    }
    (starts, seal_pos)
}

/// A one-partition topic of `records` records split once (partition 0
/// sealed at `records`, its segments synced by the split). With
/// `checkpoint`, the log is closed cleanly (a checkpoint past every rolled
/// segment); without, no checkpoint is written after the split.
fn sealed_log(dir: &Path, records: u64, checkpoint: bool) {
    let o = LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..quiet_in(RecoveryMode::Strict)
    };
    let log = Log::open(dir, o).unwrap();
    let t = log.create_topic("t", config(1)).unwrap();
    for i in 0..records {
        append(&t, 0, i);
    }
    t.split(0, SplitPlan::Even).unwrap();
    drop(t);
    if checkpoint {
        log.close().unwrap();
    } else {
        log.abandon();
    }
}

fn cut_file(path: &Path, len: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(len).unwrap();
}

/// Reads partition 0 of topic `t` from 0 to `end`: every record holds its
/// value, and the offsets that are not records are exactly the holes
/// returned (in order).
fn read_all(log: &Log, end: u64) -> Vec<(u64, u64)> {
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!(p.end_offset(), end);
    let mut holes = Vec::new();
    let mut offset = 0;
    while offset < end {
        match p.read(offset, 1 << 20) {
            Ok(batch) => {
                let mut n = 0;
                for r in batch.iter() {
                    assert_eq!(r.offset, offset);
                    assert_eq!(r.value, &value(offset)[..], "offset {offset}");
                    offset += 1;
                    n += 1;
                }
                assert!(n > 0, "an empty read at {offset}");
            }
            Err(Error::Hole { start, end: e, .. }) => {
                assert!(
                    start <= offset && e > offset,
                    "hole {start}..{e} at {offset}"
                );
                holes.push((offset, e));
                offset = e;
            }
            Err(e) => panic!("offset {offset}: {e}"),
        }
    }
    holes
}

/// Salvage of a sealed partition whose first rolled segment lost its last
/// batches whole (the file ends exactly at a batch boundary below its
/// seal): as for a tear inside a batch, only the lost batches become a
/// hole and the segments after it are kept.
#[test]
fn salvage_keeps_the_later_segments_when_the_tear_is_at_a_batch_boundary() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    sealed_log(&dir, 80, false);
    let segs = segments(&dir.join("topics/t0/p0"));
    assert!(segs.len() >= 3, "{segs:?}");
    let (starts, _) = batch_starts(&segs[0]);
    let cut_at = starts[starts.len() - 3];
    cut_file(&segs[0], cut_at);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
    let holes = read_all(&log, 80);
    assert_eq!(holes.len(), 1, "{holes:?}");
    let lost = holes[0].1 - holes[0].0;
    assert_eq!(lost, 3, "only the three cut batches are lost: {holes:?}");
    drop(log);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(read_all(&log, 80), holes);
}

/// The same tear inside a batch, after a clean close (a checkpoint past
/// every rolled segment of the partition: they are known synced).
#[test]
fn salvage_keeps_the_later_segments_after_a_checkpointed_torn_rolled_segment() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    sealed_log(&dir, 80, true);
    let segs = segments(&dir.join("topics/t0/p0"));
    assert!(segs.len() >= 3, "{segs:?}");
    let len = std::fs::metadata(&segs[0]).unwrap().len();
    cut_file(&segs[0], len - 60);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
    let holes = read_all(&log, 80);
    assert_eq!(holes.len(), 1, "{holes:?}");
    assert_eq!(holes[0].1 - holes[0].0, 1, "{holes:?}");
    drop(log);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(read_all(&log, 80), holes);
}

/// The checkpointed tear again, with the torn segment's seal rewritten to
/// a position far past any segment of the topic (a valid seal CRC over
/// impossible fields: bad input, C6). Salvage must not take the seal's
/// word for a hole of that size: it does not write the file out to 1 GiB
/// (nor allocate it). Without a usable seal it cuts the synced chain at
/// the tear, as for damage with nothing valid after it: the offsets past
/// the tear read as one reported hole, and the later segments' files are
/// set aside, never deleted.
#[test]
fn salvage_does_not_fill_a_torn_segment_to_an_impossible_seal() {
    use std::os::unix::fs::FileExt;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    sealed_log(&dir, 80, true);
    let segs = segments(&dir.join("topics/t0/p0"));
    assert!(segs.len() >= 3, "{segs:?}");
    let len = std::fs::metadata(&segs[0]).unwrap().len();
    cut_file(&segs[0], len - 60);
    // The seal: CRC-32 of (end offset, end position), at byte 44.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&segs[0])
        .unwrap();
    let mut seal = [0u8; 20];
    f.read_exact_at(&mut seal, 44).unwrap();
    let end_offset = u64::from_le_bytes(seal[4..12].try_into().unwrap());
    let far = 1u64 << 30;
    seal[12..20].copy_from_slice(&far.to_le_bytes());
    let crc = crc32fast::hash(&seal[4..20]);
    seal[..4].copy_from_slice(&crc.to_le_bytes());
    f.write_all_at(&seal, 44).unwrap();
    drop(f);
    let name: u64 = segs[1]
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(end_offset, name, "the seal names the next segment's base");
    let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
    let size = std::fs::metadata(&segs[0]).unwrap().len();
    assert!(size <= 4096, "the torn segment grew to {size} bytes");
    let holes = read_all(&log, 80);
    assert_eq!(holes.len(), 1, "{holes:?}");
    assert!(holes[0].0 < end_offset, "{holes:?}");
    for s in &segs[1..] {
        let name = s.file_name().unwrap().to_str().unwrap();
        let kept = std::fs::read_dir(s.parent().unwrap())
            .unwrap()
            .any(|e| e.unwrap().file_name().to_str().unwrap().starts_with(name));
        assert!(kept, "{} was deleted", s.display());
    }
    drop(log);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(read_all(&log, 80), holes);
}

/// The checkpointed tear again, under the crash model: the checkpoint
/// counts the segment synced up to its seal, so no sync round of the open
/// covers the hole batch Salvage writes. A power loss right after the
/// Salvage open returned must leave the repair it reported (C1, C7): a
/// Strict open of that image accepts it, with the same hole and records.
#[test]
fn a_power_loss_after_salvaging_a_checkpointed_torn_rolled_segment_keeps_the_repair() {
    use common::crash::CrashOptions;
    use common::model_hook::ModelHook;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    sealed_log(&dir, 80, true);
    let segs = segments(&dir.join("topics/t0/p0"));
    let len = std::fs::metadata(&segs[0]).unwrap().len();
    cut_file(&segs[0], len - 60);
    let hook = ModelHook::new(&dir, None);
    let log = Log::open_with_hook(&dir, quiet_in(RecoveryMode::Salvage), hook.clone()).unwrap();
    let holes = read_all(&log, 80);
    assert_eq!(holes.len(), 1, "{holes:?}");
    let point = hook.now(IoOp::SyncDir);
    log.abandon();
    for seed in 0..4 {
        let (image, trace) = point.image(seed, &CrashOptions::default());
        let d = tempfile::tempdir().unwrap();
        let r = d.path().join("log");
        image.write_to(&r).unwrap();
        let log = Log::open(&r, quiet_in(RecoveryMode::Strict)).unwrap_or_else(|e| {
            panic!(
                "seed {seed}: the reported repair did not survive: {e}; {}",
                trace.join("; ")
            )
        });
        assert_eq!(read_all(&log, 80), holes, "seed {seed}");
    }
}

/// The sealed partition of [`sealed_log`] without a checkpoint, its first
/// segment cut to `len(segment) - cut` bytes; returns the first offset of
/// the second segment (the first segment's seal).
fn torn_sealed_log(dir: &Path, cut: u64, boundary: bool) -> u64 {
    sealed_log(dir, 80, false);
    let segs = segments(&dir.join("topics/t0/p0"));
    assert!(segs.len() >= 3, "{segs:?}");
    let (starts, _) = batch_starts(&segs[0]);
    let len = std::fs::metadata(&segs[0]).unwrap().len();
    let to = if boundary {
        starts[starts.len() - 2]
    } else {
        len - cut
    };
    cut_file(&segs[0], to);
    let name = segs[1].file_stem().unwrap().to_str().unwrap().to_owned();
    name.parse().unwrap()
}

/// A power loss before every I/O step of the Salvage repair of a torn
/// rolled segment (hole batch, its sync, the remap, the index file, the
/// sync round of the open): a Salvage open of every image loses no record
/// after the torn part, and a Strict open after it accepts the result.
#[test]
fn power_loss_during_the_salvage_of_a_torn_rolled_segment_keeps_the_later_segments() {
    use common::crash::CrashOptions;
    use common::model_hook::ModelHook;
    for boundary in [false, true] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        let seal = torn_sealed_log(&dir, 60, boundary);
        let hook = ModelHook::new(&dir, None);
        hook.record_steps(true);
        let log = Log::open_with_hook(&dir, quiet_in(RecoveryMode::Salvage), hook.clone()).unwrap();
        let first = read_all(&log, 80);
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(first[0].1, seal, "{first:?}");
        hook.record_steps(false);
        let mut points = hook.take_steps();
        points.push(hook.now(IoOp::SyncDir));
        log.abandon();
        // The steps before the first write or sync only open files: their
        // images are the torn directory itself.
        points.retain(|p| !matches!(p.op, IoOp::OpenSegment | IoOp::MapSegment));
        assert!(points.len() > 3, "{} steps", points.len());
        let crash = CrashOptions {
            torn_any_byte: true,
            ..CrashOptions::default()
        };
        for (i, point) in points.iter().enumerate() {
            {
                let s = i as u64 + u64::from(boundary) * 1000;
                let (image, trace) = point.image(s, &crash);
                let d = tempfile::tempdir().unwrap();
                let r = d.path().join("log");
                image.write_to(&r).unwrap();
                let ctx = format!(
                    "boundary {boundary} step {i} ({:?}) seed {s}: {}",
                    point.op,
                    trace.join("; ")
                );
                let log = Log::open(&r, quiet_in(RecoveryMode::Salvage))
                    .unwrap_or_else(|e| panic!("{ctx}: salvage open: {e}"));
                let holes = read_all(&log, 80);
                assert_eq!(holes, first, "{ctx}");
                drop(log);
                let log = Log::open(&r, quiet_in(RecoveryMode::Strict))
                    .unwrap_or_else(|e| panic!("{ctx}: strict open after salvage: {e}"));
                assert_eq!(read_all(&log, 80), first, "{ctx}");
            }
        }
    }
}

/// Salvage, then appends to the split children, a second tear of the same
/// (already repaired) segment before the hole and a second Salvage: the
/// first hole grows to cover the newly lost records only, nothing after
/// the segment is lost, and a Strict reopen accepts it.
#[test]
fn a_segment_torn_again_after_its_salvage_loses_only_the_new_tear() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let seal = torn_sealed_log(&dir, 60, false);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
    let first = read_all(&log, 80);
    assert_eq!(first.len(), 1);
    let t = log.topic("t").unwrap();
    let kids = t.active_partitions();
    for (i, &k) in kids.iter().enumerate() {
        append(&t, k, 1000 + i as u64);
    }
    drop(t);
    log.close().unwrap();
    // Cut the repaired segment again, inside the batch before the hole.
    let segs = segments(&dir.join("topics/t0/p0"));
    let (starts, _) = batch_starts(&segs[0]);
    let hole_at = *starts.last().unwrap();
    let before = starts[starts.len() - 2];
    assert!(before < hole_at);
    cut_file(&segs[0], before + 30);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
    let holes = read_all(&log, 80);
    assert_eq!(holes.len(), 1, "{holes:?}");
    assert_eq!(holes[0], (first[0].0 - 1, seal), "{holes:?}");
    drop(log);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(read_all(&log, 80), holes);
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

/// Rewrites the seal of the segment header at `path` (end offset, end
/// position) with a valid CRC.
fn write_seal(path: &Path, end_offset: u64, end_pos: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[48..56].copy_from_slice(&end_offset.to_le_bytes());
    bytes[56..64].copy_from_slice(&end_pos.to_le_bytes());
    let crc = crc32(&bytes[48..64]);
    bytes[44..48].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

/// A torn rolled segment whose (valid) seal lies a few bytes past the
/// tear, too close for a hole batch's header: Salvage opens it (without
/// panicking on a hole batch shorter than its header) and reads it
/// consistently, records or holes up to the partition's seal.
#[test]
fn salvage_of_a_tear_just_below_a_seal_too_close_for_a_hole_batch_opens() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let next = torn_sealed_log(&dir, 60, false);
    let segs = segments(&dir.join("topics/t0/p0"));
    let (starts, _) = batch_starts(&segs[0]);
    // The scan stops at the start of the torn (last) batch.
    let torn_at = *starts.last().unwrap();
    write_seal(&segs[0], next, torn_at + 8);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
    let holes = read_all(&log, 80);
    assert!(!holes.is_empty(), "{holes:?}");
    drop(log);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(read_all(&log, 80), holes);
}

/// `verify` (read-only) of a torn rolled segment reports a problem and
/// changes no file; after the Salvage repair (a tear inside a batch, or at
/// a batch boundary), `verify` finds the directory consistent.
#[test]
fn verify_reports_a_torn_rolled_segment_and_accepts_its_salvage() {
    for boundary in [false, true] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        torn_sealed_log(&dir, 60, boundary);
        let before = common::crash::DirImage::capture(&dir).unwrap();
        let (_, problems) = fissionlog::verify(&dir).unwrap();
        assert!(!problems.is_empty(), "boundary {boundary}");
        let after = common::crash::DirImage::capture(&dir).unwrap();
        assert!(before == after, "{}", before.diff_summary(&after));
        let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
        let holes = read_all(&log, 80);
        log.close().unwrap();
        let (_, problems) = fissionlog::verify(&dir).unwrap();
        assert!(
            problems.is_empty(),
            "boundary {boundary}: {problems:?} after salvage ({holes:?})"
        );
    }
}

// ---- Readers over partitions retention removed ----

/// Polls until three polls in a row return nothing (a poll that moves
/// on to children may return nothing).
fn drain(r: &mut fissionlog::Reader) -> Vec<String> {
    let mut out = Vec::new();
    let mut empty = 0;
    loop {
        let got = r.poll(1000).unwrap();
        if got.is_empty() {
            empty += 1;
            if empty == 3 {
                return out;
            }
            continue;
        }
        empty = 0;
        out.extend(
            got.iter()
                .map(|r| String::from_utf8(r.value.clone()).unwrap()),
        );
    }
}

fn lost(r: &fissionlog::Reader) -> Vec<(u32, u64, u64)> {
    let mut v: Vec<_> = r
        .retained()
        .iter()
        .map(|g| (g.partition, g.start, g.end))
        .collect();
    v.sort_unstable();
    v
}

/// Partition 0 is split into a and b, which merge into m, which is split
/// into live partitions; 0, a, b and m hold only expired records and are
/// removed together (a whole lineage, m reached from both parents). A
/// reader from a cut inside 0 reports 0 from its position and a, b and m
/// whole, each once; a reader that had read 0, a and b to their ends
/// before the merge reports only m (nothing it read); a reader starting
/// after the removal reports nothing. The same after a reopen.
#[test]
fn a_removed_merge_below_a_removed_split_is_reported_once_and_nothing_read_is() {
    let root = tempfile::tempdir().unwrap();
    let log = Log::open(root.path(), quiet_in(RecoveryMode::Strict)).unwrap();
    let cfg = TopicConfig {
        partitions: 1,
        segment_bytes: 4096,
        retention_age: Some(Duration::from_secs(3600)),
        ..TopicConfig::default()
    };
    let topic = log.create_topic("t", cfg).unwrap();
    fill(&topic, 0, 40, true);
    let mut inside = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    assert_eq!(inside.poll(10).unwrap().len(), 10);
    let cut = inside.cut();
    let g1 = topic.split(0, SplitPlan::Even).unwrap();
    for &c in &g1 {
        fill(&topic, c, 10, true);
    }
    log.sync().unwrap();
    let mut read_all_before = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    assert_eq!(drain(&mut read_all_before).len(), 60);
    let m = topic.merge(g1[0], g1[1]).unwrap();
    fill(&topic, m, 10, true);
    let g3 = topic.split(m, SplitPlan::Even).unwrap();
    for &c in &g3 {
        fill(&topic, c, 5, false);
    }
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    for p in [0, g1[0], g1[1], m] {
        assert!(topic.partition(p).is_err(), "partition {p} was removed");
    }
    let mut want = vec![(0, 10, 40), (g1[0], 0, 10), (g1[1], 0, 10), (m, 0, 10)];
    want.sort_unstable();
    let check = |topic: &Topic| {
        let mut r = topic.reader(fissionlog::StartAt::Cut(cut.clone())).unwrap();
        assert_eq!(drain(&mut r).len(), 10, "the live children");
        assert_eq!(lost(&r), want, "from the cut");
        let mut fresh = topic.reader(fissionlog::StartAt::Earliest).unwrap();
        assert_eq!(drain(&mut fresh).len(), 10);
        assert!(fresh.retained().is_empty(), "{:?}", fresh.retained());
    };
    check(&topic);
    // The live reader may still hand out records of partition 0 it had
    // read before the removal; what it does not hand out, it reports.
    let got = drain(&mut inside);
    let of_0 = got.iter().filter(|v| v.starts_with("0:")).count();
    let want_inside: Vec<_> = if of_0 == 30 {
        want[1..].to_vec()
    } else {
        assert_eq!(of_0, 0, "{got:?}");
        want.clone()
    };
    assert_eq!(got.len() - of_0, 10, "{got:?}");
    assert_eq!(lost(&inside), want_inside, "the live reader");
    assert_eq!(drain(&mut read_all_before).len(), 10);
    assert_eq!(
        lost(&read_all_before),
        vec![(m, 0, 10)],
        "only what it never read"
    );
    // Polled again: nothing reported twice.
    assert!(drain(&mut inside).is_empty());
    assert_eq!(lost(&inside), want_inside, "reported once");
    drop(topic);
    drop(inside);
    drop(read_all_before);
    log.close().unwrap();
    let log = Log::open(root.path(), quiet_in(RecoveryMode::Strict)).unwrap();
    check(&log.topic("t").unwrap());
}

/// Splits `p` evenly and fills each child with `n` records (expired when
/// `old`); returns the children.
fn split_fill(topic: &Topic, p: u32, n: u32, old: bool) -> Vec<u32> {
    let kids = topic.split(p, SplitPlan::Even).unwrap();
    for &c in &kids {
        fill(topic, c, n, old);
    }
    kids
}

/// A group committed a position inside partition 0; retention then
/// removes 0 and a whole generation below it (partition 1 and both its
/// children, nothing left names 1). The group's committed positions are
/// a cut: a member resuming from them, and a reader started from
/// `Group::committed()`, report what they never got to (C8), as a reader
/// from the same cut does.
#[test]
fn a_group_resuming_above_a_removed_generation_reports_every_lost_partition() {
    use common::groups::{member_opts, open};
    use fissionlog::{GroupOptions, ManualClock};
    use std::sync::Arc;
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let cfg = TopicConfig {
        partitions: 1,
        segment_bytes: 4096,
        retention_age: Some(Duration::from_secs(3600)),
        ..TopicConfig::default()
    };
    let topic = log.create_topic("t", cfg).unwrap();
    fill(&topic, 0, 40, true);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    let got = a.poll(10).unwrap();
    assert_eq!(got.len(), 10);
    a.commit().unwrap();
    a.leave().unwrap();
    assert_eq!(group.committed().positions.get(&0), Some(&10));
    let cut = group.committed();
    let g1 = split_fill(&topic, 0, 10, true);
    let g2 = split_fill(&topic, g1[0], 10, true);
    split_fill(&topic, g2[0], 5, false);
    split_fill(&topic, g2[1], 5, false);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    for p in [0, g1[0], g2[0], g2[1]] {
        assert!(topic.partition(p).is_err(), "partition {p} was removed");
    }
    let mut want = vec![(0, 10, 40), (g1[0], 0, 10), (g2[0], 0, 10), (g2[1], 0, 10)];
    want.sort_unstable();
    // A plain reader from the committed cut taken before the removal.
    let mut r = topic.reader(fissionlog::StartAt::Cut(cut)).unwrap();
    drain(&mut r);
    assert_eq!(lost(&r), want, "a reader from the cut");
    // A reader from the group's committed positions now.
    let mut r = topic
        .reader(fissionlog::StartAt::Cut(group.committed()))
        .unwrap();
    drain(&mut r);
    assert_eq!(lost(&r), want, "a reader from Group::committed()");
    // A member resuming the group.
    let mut b = group.join(member_opts()).unwrap();
    common::groups::drain(&mut b);
    let mut got: Vec<_> = b
        .retained()
        .iter()
        .map(|g| (g.partition, g.start, g.end))
        .collect();
    got.sort_unstable();
    assert_eq!(got, want, "a member resuming the group");
}

/// The simplest case of the above: the group committed inside partition 0,
/// 0 is split into live children and retention removes it. A member
/// resuming the group reports the 30 records of 0 it never got (C8).
#[test]
fn a_group_resuming_inside_a_removed_parent_reports_its_unread_range() {
    use common::groups::{member_opts, open};
    use fissionlog::{GroupOptions, ManualClock};
    use std::sync::Arc;
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let log = open(root.path(), &clock);
    let cfg = TopicConfig {
        partitions: 1,
        segment_bytes: 4096,
        retention_age: Some(Duration::from_secs(3600)),
        ..TopicConfig::default()
    };
    let topic = log.create_topic("t", cfg).unwrap();
    fill(&topic, 0, 40, true);
    log.sync().unwrap();
    let group = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = group.join(member_opts()).unwrap();
    assert_eq!(a.poll(10).unwrap().len(), 10);
    a.commit().unwrap();
    a.leave().unwrap();
    split_fill(&topic, 0, 5, false);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    assert!(topic.partition(0).is_err());
    let mut b = group.join(member_opts()).unwrap();
    assert_eq!(common::groups::drain(&mut b).len(), 10);
    let got: Vec<_> = b
        .retained()
        .iter()
        .map(|g| (g.partition, g.start, g.end))
        .collect();
    assert_eq!(got, vec![(0, 10, 40)]);
}

/// An active partition (never split) appending across several segments
/// without syncs: a power loss before every I/O step leaves unsynced
/// records lost. That is a crash, not damage: Salvage, like Strict, opens
/// every image to a prefix of what was appended (C3), with no hole, and a
/// reopen in Strict accepts it.
#[test]
fn salvage_after_a_power_loss_in_an_active_partition_keeps_a_prefix() {
    use common::crash::CrashOptions;
    use common::model_hook::ModelHook;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir_all(&dir).unwrap();
    let o = LogOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..quiet_in(RecoveryMode::Strict)
    };
    {
        let log = Log::open(&dir, o.clone()).unwrap();
        log.create_topic("t", config(1)).unwrap();
        log.close().unwrap();
    }
    let hook = ModelHook::new(&dir, None);
    hook.grant_segment_headers(true);
    let log = Log::open_with_hook(&dir, o, hook.clone()).unwrap();
    let t = log.topic("t").unwrap();
    hook.record_steps(true);
    for i in 0..100 {
        append(&t, 0, i);
    }
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    drop(t);
    log.abandon();
    let crash = CrashOptions::default();
    let mut bad = Vec::new();
    for (i, point) in points.iter().enumerate() {
        let (image, trace) = point.image(i as u64, &crash);
        let d = tempfile::tempdir().unwrap();
        let r = d.path().join("log");
        image.write_to(&r).unwrap();
        let log = Log::open(&r, quiet_in(RecoveryMode::Salvage)).unwrap();
        let end = log.topic("t").unwrap().partition(0).unwrap().end_offset();
        let holes = read_all(&log, end);
        if !holes.is_empty() {
            bad.push(format!(
                "step {i} ({:?}): end {end}, holes {holes:?} [{}]",
                point.op,
                trace.join("; ")
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {}:\n{}",
        bad.len(),
        points.len(),
        bad.join("\n")
    );
}

/// The whole-generation removal of the merge probe above, with the
/// manifest compacted into a snapshot after every few records (before and
/// after the removals, and again by later splits of the live children): a
/// reader from the old cut reports the same losses, once each, after a
/// reopen, and a cut it takes then reports nothing more.
#[test]
fn removed_partitions_survive_manifest_compaction() {
    let root = tempfile::tempdir().unwrap();
    let o = LogOptions {
        manifest_compact_records: 2,
        ..quiet_in(RecoveryMode::Strict)
    };
    let log = Log::open(root.path(), o.clone()).unwrap();
    let cfg = TopicConfig {
        partitions: 1,
        segment_bytes: 4096,
        retention_age: Some(Duration::from_secs(3600)),
        ..TopicConfig::default()
    };
    let topic = log.create_topic("t", cfg).unwrap();
    fill(&topic, 0, 40, true);
    log.sync().unwrap();
    let mut inside = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    assert_eq!(inside.poll(10).unwrap().len(), 10);
    let cut = inside.cut();
    drop(inside);
    let g1 = split_fill(&topic, 0, 10, true);
    let m = topic.merge(g1[0], g1[1]).unwrap();
    fill(&topic, m, 10, true);
    let g3 = split_fill(&topic, m, 5, false);
    log.sync().unwrap();
    assert!(log.enforce_retention().unwrap() > 0);
    // More manifest records after the removals: compactions.
    let g4 = split_fill(&topic, g3[0], 2, false);
    topic.merge(g4[0], g4[1]).unwrap();
    log.sync().unwrap();
    let mut want = vec![(0, 10, 40), (g1[0], 0, 10), (g1[1], 0, 10), (m, 0, 10)];
    want.sort_unstable();
    drop(topic);
    log.close().unwrap();
    let log = Log::open(root.path(), o).unwrap();
    let topic = log.topic("t").unwrap();
    let mut r = topic.reader(fissionlog::StartAt::Cut(cut)).unwrap();
    assert_eq!(drain(&mut r).len(), 14);
    assert_eq!(lost(&r), want);
    let later = r.cut();
    let mut r2 = topic.reader(fissionlog::StartAt::Cut(later)).unwrap();
    assert!(drain(&mut r2).is_empty());
    assert!(r2.retained().is_empty(), "{:?}", r2.retained());
}

/// An active partition closed cleanly (its checkpoint past the rolled
/// segments) whose first segment is then cut inside its last batch:
/// Salvage fills it to its seal and keeps the later segments; appends go
/// on after the old end; a Strict reopen finds the same records and hole;
/// a lineage reader hands out every record but the lost one, once each.
#[test]
fn appends_after_salvaging_an_active_partition_survive_a_strict_reopen() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    {
        let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
        let t = log.create_topic("t", config(1)).unwrap();
        for i in 0..80 {
            append(&t, 0, i);
        }
        drop(t);
        log.close().unwrap();
    }
    let segs = segments(&dir.join("topics/t0/p0"));
    assert!(segs.len() >= 3, "{segs:?}");
    let len = std::fs::metadata(&segs[0]).unwrap().len();
    cut_file(&segs[0], len - 60);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
    let holes = read_all(&log, 80);
    assert_eq!(holes.len(), 1, "{holes:?}");
    assert_eq!(holes[0].1 - holes[0].0, 1, "{holes:?}");
    let t = log.topic("t").unwrap();
    for i in 80..100 {
        assert_eq!(append(&t, 0, i), i);
    }
    drop(t);
    log.close().unwrap();
    let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(read_all(&log, 100), holes);
    let t = log.topic("t").unwrap();
    let mut r = t.reader(fissionlog::StartAt::Earliest).unwrap();
    let mut seen = Vec::new();
    for _ in 0..20 {
        match r.poll(1000) {
            Ok(got) => seen.extend(got.iter().map(|x| x.offset)),
            Err(Error::Hole { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let want: Vec<u64> = (0..100)
        .filter(|o| !(holes[0].0..holes[0].1).contains(o))
        .collect();
    assert_eq!(seen, want);
}

/// A sealed partition (its segments synced by the split, no checkpoint
/// since) whose `torn`-th segment file is cut inside its header: the
/// header does not decode. That is damage, not a torn creation (the split
/// synced every segment): Salvage keeps the segments after it, so only
/// that segment's offsets are lost.
fn salvage_of_a_segment_torn_inside_its_header(torn: usize) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    sealed_log(&dir, 80, false);
    let segs = segments(&dir.join("topics/t0/p0"));
    assert!(segs.len() >= 4, "{segs:?}");
    let base = |p: &Path| -> u64 { p.file_stem().unwrap().to_str().unwrap().parse().unwrap() };
    let lost = (base(&segs[torn]), base(&segs[torn + 1]));
    cut_file(&segs[torn], 30);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
    // The later segments' files are still there (kept, or set aside).
    let names: Vec<String> = std::fs::read_dir(dir.join("topics/t0/p0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for s in &segs[torn + 1..] {
        let stem = s.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            names
                .iter()
                .any(|n| n.starts_with(&stem) && n.contains(".seg")),
            "synced segment {stem} was deleted: {names:?}"
        );
    }
    let holes = read_all(&log, 80);
    assert_eq!(holes, vec![lost], "only segment {torn} is lost");
    drop(log);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(read_all(&log, 80), vec![lost]);
}

#[test]
fn salvage_keeps_the_segments_after_a_first_segment_torn_inside_its_header() {
    salvage_of_a_segment_torn_inside_its_header(0);
}

#[test]
fn salvage_keeps_the_segments_after_a_middle_segment_torn_inside_its_header() {
    salvage_of_a_segment_torn_inside_its_header(1);
}

/// Truncate on the same state (a sealed partition's middle segment cut
/// inside its header): Truncate cuts there, but the later segments hold
/// synced records (the split synced them), so it must set them aside as
/// it does after other damage in synced data, never delete them.
#[test]
fn truncate_sets_aside_the_synced_segments_after_a_segment_torn_inside_its_header() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    sealed_log(&dir, 80, false);
    let segs = segments(&dir.join("topics/t0/p0"));
    assert!(segs.len() >= 4, "{segs:?}");
    cut_file(&segs[1], 30);
    let log = Log::open(&dir, quiet_in(RecoveryMode::Truncate)).unwrap();
    let names: Vec<String> = std::fs::read_dir(dir.join("topics/t0/p0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for s in &segs[2..] {
        let stem = s.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            names
                .iter()
                .any(|n| n.starts_with(&stem) && n.contains(".seg")),
            "synced segment {stem} was deleted: {names:?}"
        );
    }
    drop(log);
}

/// An active partition (never split) of three rolled segments and a clean
/// close: the checkpoint lies past the first segment, so its data was
/// synced. A cut inside it is damage in synced data, never a torn tail
/// (README: damage a checkpoint covers is never silently cut): Strict
/// refuses, naming the file, and changes no file; Salvage keeps every
/// record of the later segments.
#[test]
fn strict_refuses_a_checkpointed_rolled_segment_cut_short() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    {
        let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
        let t = log.create_topic("t", config(1)).unwrap();
        for i in 0..80 {
            append(&t, 0, i);
        }
        drop(t);
        log.close().unwrap();
    }
    let pdir = dir.join("topics/t0/p0");
    let segs = segments(&pdir);
    assert!(segs.len() >= 3, "{segs:?}");
    let len = std::fs::metadata(&segs[0]).unwrap().len();
    cut_file(&segs[0], len - 60);
    let before: Vec<_> = segs.iter().map(|s| std::fs::read(s).unwrap()).collect();
    match Log::open(&dir, quiet_in(RecoveryMode::Strict)) {
        Err(fissionlog::Error::Corruption { file, .. }) => {
            assert_eq!(file, segs[0], "names the cut segment");
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(log) => {
            let p = log.topic("t").unwrap().partition(0).unwrap();
            panic!(
                "Strict opened a partition cut inside checkpointed data (end {})",
                p.end_offset()
            );
        }
    }
    let after: Vec<_> = segs.iter().map(|s| std::fs::read(s).unwrap()).collect();
    assert!(before == after, "a refusing open changed a segment file");
    let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
    let holes = read_all(&log, 80);
    assert_eq!(holes.len(), 1, "{holes:?}");
    assert_eq!(holes[0].1 - holes[0].0, 1, "{holes:?}");
}

/// The checkpointed tear again, with the seal's position rewritten to
/// exactly the topic's segment size (a roll that filled the segment to
/// the byte), and one byte past it. At the segment size the seal is taken:
/// the hole batch Salvage writes runs to it, covers exactly the offsets
/// the tear lost, and a Strict reopen accepts it with the same holes. One
/// byte past it the seal is damage: the file does not grow past the
/// segment size and the log still reads with one hole, Strict agreeing.
#[test]
fn salvage_takes_a_seal_at_exactly_the_segment_size() {
    use std::os::unix::fs::FileExt;
    for at in [4096u64, 4097] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("log");
        sealed_log(&dir, 80, true);
        let segs = segments(&dir.join("topics/t0/p0"));
        assert!(segs.len() >= 3, "{segs:?}");
        let len = std::fs::metadata(&segs[0]).unwrap().len();
        cut_file(&segs[0], len - 60);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&segs[0])
            .unwrap();
        let mut seal = [0u8; 20];
        f.read_exact_at(&mut seal, 44).unwrap();
        let end_offset = u64::from_le_bytes(seal[4..12].try_into().unwrap());
        seal[12..20].copy_from_slice(&at.to_le_bytes());
        let crc = crc32fast::hash(&seal[4..20]);
        seal[..4].copy_from_slice(&crc.to_le_bytes());
        f.write_all_at(&seal, 44).unwrap();
        drop(f);
        let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
        let size = std::fs::metadata(&segs[0]).unwrap().len();
        assert!(size <= 4096, "{at}: the torn segment grew to {size} bytes");
        let holes = read_all(&log, 80);
        assert_eq!(holes.len(), 1, "{at}: {holes:?}");
        if at == 4096 {
            // The last batch (one record) was torn.
            assert_eq!(holes[0], (end_offset - 1, end_offset), "{at}");
        }
        drop(log);
        let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
        assert_eq!(read_all(&log, 80), holes, "{at}");
    }
}

/// The checkpointed tear of a rolled segment of 4 MiB, cut near its start:
/// the hole Salvage writes spans over 3 MiB (written in pieces, its header
/// computed without the payload in memory). It reads as one hole up to
/// the next segment, every other record reads back, and a Strict reopen
/// accepts the repaired file with the same hole.
#[test]
fn salvage_writes_a_hole_of_several_mebibytes_that_strict_accepts() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let records = 5_000u64;
    {
        let o = LogOptions {
            checkpoint_interval: Duration::from_secs(3600),
            ..quiet_in(RecoveryMode::Strict)
        };
        let log = Log::open(&dir, o).unwrap();
        let cfg = TopicConfig {
            segment_bytes: 4 << 20,
            ..config(1)
        };
        let t = log.create_topic("t", cfg).unwrap();
        let pad = vec![7u8; 800];
        for i in 0..records {
            let mut v = value(i);
            v.extend_from_slice(&pad);
            t.append_to(
                0,
                &[NewRecord {
                    key: None,
                    value: &v,
                    timestamp: Some(i as i64),
                }],
            )
            .unwrap();
        }
        t.split(0, SplitPlan::Even).unwrap();
        drop(t);
        log.close().unwrap();
    }
    let segs = segments(&dir.join("topics/t0/p0"));
    assert!(segs.len() >= 2, "{segs:?}");
    let (_, seal_pos) = batch_starts(&segs[0]);
    assert!(seal_pos > 3 << 20, "{seal_pos}");
    cut_file(&segs[0], 100_000);
    let next: u64 = segs[1]
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let check = |log: &Log| -> (u64, u64) {
        let p = log.topic("t").unwrap().partition(0).unwrap();
        assert_eq!(p.end_offset(), records);
        let mut hole = None;
        let mut offset = 0;
        while offset < records {
            match p.read(offset, 1 << 20) {
                Ok(batch) => {
                    for r in batch.iter() {
                        assert_eq!(r.offset, offset);
                        assert_eq!(&r.value[..100], &value(offset)[..], "offset {offset}");
                        offset += 1;
                    }
                }
                Err(Error::Hole { start, end, .. }) => {
                    assert!(hole.is_none(), "a second hole {start}..{end}");
                    assert!(start <= offset && end > offset);
                    hole = Some((offset, end));
                    offset = end;
                }
                Err(e) => panic!("offset {offset}: {e}"),
            }
        }
        hole.expect("one hole")
    };
    let log = Log::open(&dir, quiet_in(RecoveryMode::Salvage)).unwrap();
    let hole = check(&log);
    assert_eq!(hole.1, next, "the hole runs to the next segment");
    assert!(hole.0 < 200, "{hole:?}");
    drop(log);
    assert_eq!(
        std::fs::metadata(&segs[0]).unwrap().len().min(seal_pos),
        seal_pos,
        "the hole is written out to the seal"
    );
    let log = Log::open(&dir, quiet_in(RecoveryMode::Strict)).unwrap();
    assert_eq!(check(&log), hole);
}
