//! The edges of tail splits: group commits racing the split, offsets at
//! the edges of the partition, chained and merged children, time lookups,
//! power loss while the children roll segments, retention, verify.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use common::crash::{CrashOptions, DirImage};
use common::model_hook::ModelHook;
use fissionlog::{
    Error, GroupOptions, IoOp, Log, MemberOptions, NewRecord, OwnedRecord, SplitPlan, StartAt,
    TailSplitOptions, Topic, TopicConfig,
};

const KEYS: u64 = 11;

use common::tail::{append_big, check_exactly_once, config, drain, options, read_all, seq};

fn append(topic: &Topic, from: u64, n: u64) {
    common::tail::append(topic, from, n, KEYS);
}

fn member_opts() -> MemberOptions {
    MemberOptions {
        session_timeout: std::time::Duration::from_secs(60),
        processing_timeout: std::time::Duration::from_secs(60),
        instance_id: None,
        background_heartbeat: None,
    }
}

fn poll_n(m: &mut fissionlog::Member, n: usize) -> Vec<OwnedRecord> {
    let mut out = Vec::new();
    while out.len() < n {
        let got = m.poll(n - out.len()).unwrap();
        assert!(!got.is_empty(), "only {} of {n}", out.len());
        out.extend(got);
    }
    out
}

fn poll_all(m: &mut fissionlog::Member, out: &mut Vec<OwnedRecord>) {
    loop {
        let got = m.poll(64).unwrap();
        if got.is_empty() {
            return;
        }
        out.extend(got);
    }
}

fn segments(topic: &Topic, id: u32) -> usize {
    topic
        .partitions()
        .iter()
        .find(|p| p.id == id)
        .unwrap()
        .segments
}

fn verify_clean(dir: &Path, ctx: &str) {
    let (_report, problems) = fissionlog::verify(dir).unwrap();
    assert!(problems.is_empty(), "{ctx}: verify: {problems:?}");
}

// ---- groups ----------------------------------------------------------

/// A member that read past the split offset before the split commits
/// what it was handed afterwards (its positions still name the parent).
/// The group's committed cut and a member joining after it left must go
/// on with exactly the records not yet handed out.
#[test]
fn a_member_commit_of_parent_positions_after_the_split_is_translated() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 1000);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let mut seen = poll_n(&mut m, 700);
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(400))
        .unwrap();
    m.commit().unwrap();
    append(&topic, 1000, 200);
    // The committed cut, as a plain reader.
    let cut = g.committed();
    let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
    let mut via_cut = seen.clone();
    drain(&mut r, &mut via_cut);
    check_exactly_once(&via_cut, 0..1200, &format!("committed cut {cut:?}"));
    // A new member after the first left.
    m.leave().unwrap();
    let mut m2 = g.join(member_opts()).unwrap();
    poll_all(&mut m2, &mut seen);
    check_exactly_once(&seen, 0..1200, "member joining after the commit");
}

/// The same commit, and the group then read after a reopen.
#[test]
fn a_member_commit_of_parent_positions_after_the_split_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen;
    {
        let log = Log::open(dir.path(), options()).unwrap();
        let topic = log.create_topic("t", config()).unwrap();
        append(&topic, 0, 1000);
        let g = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = g.join(member_opts()).unwrap();
        seen = poll_n(&mut m, 700);
        topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(400))
            .unwrap();
        m.commit().unwrap();
        append(&topic, 1000, 200);
        drop((m, g, topic));
        log.close().unwrap();
    }
    verify_clean(dir.path(), "after the commit");
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic("t").unwrap();
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    poll_all(&mut m, &mut seen);
    check_exactly_once(&seen, 0..1200, "group after a reopen");
}

/// A member that read the parent to its end before the split keeps
/// reading: only what is appended after, each once.
#[test]
fn a_member_caught_up_at_the_seal_reads_only_new_records() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 500);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let mut seen = poll_n(&mut m, 500);
    m.commit().unwrap();
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(100))
        .unwrap();
    let cut = g.committed();
    assert!(!cut.positions.contains_key(&0), "{cut:?}");
    append(&topic, 500, 100);
    poll_all(&mut m, &mut seen);
    check_exactly_once(&seen, 0..600, "caught-up member");
}

// ---- offsets at the edges ----------------------------------------------

/// From the partition's end: nothing moves; from its start with several
/// segments: everything moves; past the end: refused with nothing changed.
/// Cuts saved at the end and at the start resume exactly once, also after
/// a reopen, and verify is clean.
#[test]
fn tail_split_from_the_end_from_the_start_and_past_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let small = TopicConfig {
        segment_bytes: 4096,
        ..config()
    };
    let mut cuts = Vec::new();
    {
        let log = Log::open(dir.path(), options()).unwrap();
        let topic = log.create_topic("t", small).unwrap();
        append(&topic, 0, 800);
        assert!(segments(&topic, 0) > 3);
        assert!(matches!(
            topic.split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(801)),
            Err(Error::OffsetOutOfRange { .. })
        ));
        assert_eq!(topic.active_partitions(), [0]);
        let mut r = topic.reader(StartAt::Earliest).unwrap();
        let all = r.poll(800).unwrap();
        cuts.push((all.clone(), r.cut()));
        let out = topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(800))
            .unwrap();
        assert_eq!((out.from, out.seal_offset), (800, 800));
        assert_eq!(out.moved, [0, 0]);
        append(&topic, 800, 300);
        check_exactly_once(&read_all(&topic), 0..1100, "after an empty move");
        // A child moved whole, from its start.
        let child = out.children[1];
        let p = topic.partition(child).unwrap();
        let held = p.start_offset();
        let mut r = topic.reader(StartAt::Earliest).unwrap();
        let some = r.poll(900).unwrap();
        cuts.push((some, r.cut()));
        let out2 = topic
            .split_tail(child, SplitPlan::Even, TailSplitOptions::from_offset(held))
            .unwrap();
        assert_eq!(out2.from, held);
        append(&topic, 1100, 100);
        check_exactly_once(&read_all(&topic), 0..1200, "after a whole move");
        for (i, (before, cut)) in cuts.iter().enumerate() {
            let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
            let mut s = before.clone();
            drain(&mut r, &mut s);
            check_exactly_once(&s, 0..1200, &format!("cut {i}"));
        }
        drop(topic);
        log.close().unwrap();
    }
    verify_clean(dir.path(), "after the splits");
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic("t").unwrap();
    check_exactly_once(&read_all(&topic), 0..1200, "reopened");
    for (i, (before, cut)) in cuts.iter().enumerate() {
        let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
        let mut s = before.clone();
        drain(&mut r, &mut s);
        check_exactly_once(&s, 0..1200, &format!("reopened cut {i}"));
    }
}

/// A sealed parent, and a parent already tail-split, are refused.
#[test]
fn a_sealed_or_already_tail_split_parent_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 100);
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(50))
        .unwrap();
    assert!(matches!(
        topic.split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(20)),
        Err(Error::Sealed { .. })
    ));
    let kids = topic.active_partitions();
    topic.split(kids[0], SplitPlan::Even).unwrap();
    assert!(matches!(
        topic.split_tail(kids[0], SplitPlan::Even, TailSplitOptions::from_offset(0)),
        Err(Error::Sealed { .. })
    ));
    check_exactly_once(&read_all(&topic), 0..100, "after the refusals");
}

/// A split offset inside a batch of many records appended at once: the
/// batch moves whole, and a reader that had read half of it before goes on
/// exactly once.
#[test]
fn an_offset_in_the_middle_of_a_large_batch() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 10);
    let keys: Vec<String> = (0..500u64).map(|i| format!("k{}", i % KEYS)).collect();
    let vals: Vec<String> = (10..510u64).map(|i| i.to_string()).collect();
    let recs: Vec<NewRecord<'_>> = (0..500)
        .map(|i| NewRecord {
            key: (i % 7 != 3).then_some(keys[i].as_bytes()),
            value: vals[i].as_bytes(),
            timestamp: None,
        })
        .collect();
    topic.append_batch(&recs).unwrap();
    append(&topic, 510, 10);
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    let mut seen = r.poll(260).unwrap();
    assert_eq!(seen.len(), 260);
    let cut = r.cut();
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(300))
        .unwrap();
    assert_eq!(out.from, 10, "the batch start");
    append(&topic, 520, 30);
    let mut r2 = topic.reader(StartAt::Cut(cut)).unwrap();
    let mut seen2 = seen.clone();
    drain(&mut r2, &mut seen2);
    check_exactly_once(&seen2, 0..550, "cut inside the batch");
    drain(&mut r, &mut seen);
    check_exactly_once(&seen, 0..550, "live reader inside the batch");
}

// ---- chains and merges -------------------------------------------------

/// A child tail-split again from inside its moved range, its children
/// merged, the rest forward-split: saved cuts from every stage resume
/// exactly once, in the same run and after a reopen; verify is clean.
#[test]
fn chained_tail_splits_and_a_merge_keep_cuts_exact() {
    let dir = tempfile::tempdir().unwrap();
    let mut cuts = Vec::new();
    let mut n = 0;
    let take = |topic: &Topic, k: usize, cuts: &mut Vec<_>| {
        let mut r = topic.reader(StartAt::Earliest).unwrap();
        let got = r.poll(k).unwrap();
        cuts.push((got, r.cut()));
    };
    {
        let log = Log::open(dir.path(), options()).unwrap();
        let topic = log.create_topic("t", config()).unwrap();
        append(&topic, 0, 600);
        n += 600;
        take(&topic, 450, &mut cuts);
        let out = topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(200))
            .unwrap();
        append(&topic, n, 100);
        n += 100;
        take(&topic, 500, &mut cuts);
        let c = out.children[0];
        let half = out.moved[0] / 2;
        let out2 = topic
            .split_tail(c, SplitPlan::Even, TailSplitOptions::from_offset(half))
            .unwrap();
        append(&topic, n, 100);
        n += 100;
        take(&topic, 600, &mut cuts);
        topic.merge(out2.children[0], out2.children[1]).unwrap();
        append(&topic, n, 100);
        n += 100;
        check_exactly_once(&read_all(&topic), 0..n, "after the merge");
        for (i, (before, cut)) in cuts.iter().enumerate() {
            let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
            let mut s = before.clone();
            drain(&mut r, &mut s);
            check_exactly_once(&s, 0..n, &format!("cut {i}"));
        }
        drop(topic);
        log.close().unwrap();
    }
    verify_clean(dir.path(), "chain");
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic("t").unwrap();
    check_exactly_once(&read_all(&topic), 0..n, "reopened");
    for (i, (before, cut)) in cuts.iter().enumerate() {
        let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
        let mut s = before.clone();
        drain(&mut r, &mut s);
        check_exactly_once(&s, 0..n, &format!("reopened cut {i}"));
    }
}

// ---- time lookups ----------------------------------------------------------

/// `offset_for_time` on a tail-split parent answers within what the
/// parent holds for readers: never an offset of its moved range.
#[test]
fn offset_for_time_on_a_tail_split_parent_stays_below_its_logical_end() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    for i in 0..100u64 {
        let v = i.to_string();
        topic
            .append_batch(&[NewRecord {
                key: Some(b"k"),
                value: v.as_bytes(),
                timestamp: Some(1_000 + i as i64),
            }])
            .unwrap();
    }
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(40))
        .unwrap();
    let got = topic.offset_for_time(0, 1_060).unwrap();
    assert!(
        got.is_none_or(|o| o < 40),
        "parent logically ends at 40, offset_for_time gave {got:?}"
    );
    if let Some(o) = got {
        topic.read(0, o, 1 << 16).unwrap();
    }
}

// ---- power loss while children roll segments ---------------------------

/// A power loss before every I/O step of a tail split whose copy rolls
/// the children's segments several times: the old layout or the new one,
/// every synced record exactly once; the new layout holds every record.
#[test]
fn power_loss_while_the_copy_rolls_child_segments() {
    let dir = tempfile::tempdir().unwrap();
    let hook = ModelHook::new(dir.path(), None);
    hook.grant_segment_headers(true);
    let log = Log::open_with_hook(dir.path(), options(), hook.clone()).unwrap();
    let small = TopicConfig {
        segment_bytes: 128 * 1024,
        ..config()
    };
    let topic = log.create_topic("t", small).unwrap();
    append_big(&topic, 0, 600, KEYS);
    log.sync().unwrap();
    append_big(&topic, 600, 40, KEYS);
    let (synced, written) = (600u64, 640u64);
    hook.record_steps(true);
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(30))
        .unwrap();
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    assert!(points.len() < 200, "{} steps", points.len());
    let kids = out.children.clone();
    for k in &kids {
        assert!(segments(&topic, *k) >= 2, "children rolled");
    }
    log.abandon();
    let opts = CrashOptions::default();
    for (i, point) in points.iter().enumerate() {
        for s in 0..1u64 {
            let (image, trace): (DirImage, _) = point.image(i as u64 * 7 + s, &opts);
            let ctx = format!(
                "step {i} (before {:?}) image {s}: {}",
                point.op,
                trace.join("; ")
            );
            let d = tempfile::tempdir().unwrap();
            let root = d.path().join("log");
            image.write_to(&root).unwrap();
            let log = Log::open(&root, options()).unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
            let topic = log.topic("t").unwrap();
            let is_new = topic.active_partitions() != [0];
            let seen = read_all(&topic);
            let n = seen.len() as u64;
            assert!(n >= synced && n <= written, "{ctx}: {n} records");
            check_exactly_once(&seen, 0..n, &ctx);
            if is_new {
                assert_eq!(n, written, "{ctx}: new layout lost records");
            }
            if i + 1 == points.len() {
                assert!(is_new, "{ctx}: after the call returned");
            }
        }
    }
}

// ---- retention -------------------------------------------------------------

/// Retention by size retires the parent's records below the split offset;
/// the parent then leaves the topology, and every record the children hold
/// is read once (same run and after a reopen); a cut saved in the moved
/// range still resumes exactly once.
#[test]
fn retention_retires_a_partly_moved_parent() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TopicConfig {
        segment_bytes: 4096,
        retention_bytes: Some(1 << 30),
        ..config()
    };
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", cfg).unwrap();
    append(&topic, 0, 600);
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    let before = r.poll(500).unwrap();
    let cut = r.cut();
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(300))
        .unwrap();
    assert_eq!(out.from, 300);
    append(&topic, 600, 50);
    log.enforce_retention().unwrap();
    let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
    let mut s = before.clone();
    drain(&mut r, &mut s);
    check_exactly_once(&s, 0..650, "cut after retention");
    drop((r, topic));
    log.close().unwrap();
    verify_clean(dir.path(), "after retention");
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic("t").unwrap();
    check_exactly_once(&read_all(&topic), 0..650, "reopened");
}

/// Records appended with `append_to` bypass routing: a keyed record whose
/// hash lies below the partition's range. A tail split of that partition
/// moves it like any other (into its first child), it does not panic.
#[test]
fn a_record_whose_key_hashes_below_the_partitions_range_moves() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 2,
                ..config()
            },
        )
        .unwrap();
    let high = topic.active_partitions()[1];
    let low_key = (0..1000)
        .map(|i| format!("k{i}"))
        .find(|k| topic.route(k.as_bytes()) != high)
        .unwrap();
    for i in 0..20u64 {
        let v = i.to_string();
        let key = if i % 3 == 0 {
            low_key.clone()
        } else {
            format!("h{i}")
        };
        topic
            .append_to(
                high,
                &[NewRecord {
                    key: Some(key.as_bytes()),
                    value: v.as_bytes(),
                    timestamp: None,
                }],
            )
            .unwrap();
    }
    let out = topic
        .split_tail(high, SplitPlan::Even, TailSplitOptions::from_offset(0))
        .unwrap();
    assert_eq!(out.moved.iter().sum::<u64>(), 20);
    let seen = read_all(&topic);
    check_exactly_once(&seen, 0..20, "misrouted keys moved");
}

/// Retention by size on a tail-split parent and its children: records
/// expire oldest first, none is read twice, per-key order holds, the
/// newest records stay, and the log reopens clean.
#[test]
fn size_retention_after_a_tail_split_never_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TopicConfig {
        segment_bytes: 4096,
        retention_bytes: Some(12 * 1024),
        ..config()
    };
    let n = 1500;
    {
        let log = Log::open(dir.path(), options()).unwrap();
        let topic = log.create_topic("t", cfg).unwrap();
        append(&topic, 0, 1200);
        topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(700))
            .unwrap();
        append(&topic, 1200, 300);
        log.enforce_retention().unwrap();
        let check = |seen: &[OwnedRecord], ctx: &str| {
            let mut all: Vec<u64> = seen.iter().map(seq).collect();
            let before = all.len();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), before, "{ctx}: duplicates");
            assert!(all.contains(&(n - 1)), "{ctx}: newest kept");
            let mut per_key: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
            for r in seen {
                if let Some(k) = &r.key {
                    if let Some(&last) = per_key.get(k) {
                        assert!(seq(r) > last, "{ctx}: key order");
                    }
                    per_key.insert(k.clone(), seq(r));
                }
            }
        };
        check(&read_all(&topic), "after retention");
        drop(topic);
        log.close().unwrap();
        verify_clean(dir.path(), "after retention");
        let log = Log::open(dir.path(), options()).unwrap();
        let topic = log.topic("t").unwrap();
        check(&read_all(&topic), "reopened");
    }
}

/// A member that read past the split offset without committing, then
/// reads on in the children and commits: the commit is accepted, and a
/// member joining after it left reads exactly the rest.
#[test]
fn a_member_reading_across_the_split_commits_child_positions() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 1000);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let mut seen = poll_n(&mut m, 700);
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(400))
        .unwrap();
    seen.extend(poll_n(&mut m, 100));
    m.commit().unwrap();
    append(&topic, 1000, 200);
    m.leave().unwrap();
    let mut m2 = g.join(member_opts()).unwrap();
    poll_all(&mut m2, &mut seen);
    check_exactly_once(&seen, 0..1200, "after a commit across the split");
}

/// A member commits its stale parent position after the split, then
/// reads on in the children and commits again.
#[test]
fn a_member_commits_again_after_a_stale_parent_commit() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 1000);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let mut seen = poll_n(&mut m, 700);
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(400))
        .unwrap();
    m.commit().unwrap();
    seen.extend(poll_n(&mut m, 100));
    m.commit().unwrap();
    append(&topic, 1000, 200);
    m.leave().unwrap();
    let mut m2 = g.join(member_opts()).unwrap();
    poll_all(&mut m2, &mut seen);
    check_exactly_once(&seen, 0..1200, "after two commits");
}

/// A reader started at the latest position before the split reads only
/// what is appended after it, once.
#[test]
fn a_latest_reader_from_before_the_split_reads_only_new_records() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 300);
    let mut r = topic.reader(StartAt::Latest).unwrap();
    let cut = r.cut();
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(100))
        .unwrap();
    append(&topic, 300, 50);
    let mut got = Vec::new();
    drain(&mut r, &mut got);
    let mut want: Vec<u64> = got.iter().map(seq).collect();
    want.sort_unstable();
    assert_eq!(want, (300..350).collect::<Vec<_>>(), "live latest reader");
    let mut r = topic.reader(StartAt::Cut(cut)).unwrap();
    let mut got = Vec::new();
    drain(&mut r, &mut got);
    let mut want: Vec<u64> = got.iter().map(seq).collect();
    want.sort_unstable();
    assert_eq!(want, (300..350).collect::<Vec<_>>(), "cut at the end");
}

/// A member reads across a tail split and a tail split of a child, then
/// commits; after a reopen the group goes on with exactly the rest.
#[test]
fn a_member_reading_across_chained_tail_splits_commits_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen;
    {
        let log = Log::open(dir.path(), options()).unwrap();
        let topic = log.create_topic("t", config()).unwrap();
        append(&topic, 0, 1000);
        let g = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = g.join(member_opts()).unwrap();
        seen = poll_n(&mut m, 900);
        let out = topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(300))
            .unwrap();
        let c = out.children[0];
        topic
            .split_tail(c, SplitPlan::Even, TailSplitOptions::from_offset(50))
            .unwrap();
        seen.extend(poll_n(&mut m, 50));
        m.commit().unwrap();
        append(&topic, 1000, 100);
        drop((m, g, topic));
        log.close().unwrap();
    }
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic("t").unwrap();
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    poll_all(&mut m, &mut seen);
    check_exactly_once(&seen, 0..1100, "group across chained tail splits");
}

/// A live reader polling in its own thread while an appender appends and
/// a throttled tail split copies: every record once, per-key order. (A
/// reader taking the lineage between the seal and the tail entry's
/// install read moved records twice: the window is narrow, thirty rounds
/// hit it in about one run of four.)
#[test]
fn a_reader_polling_through_a_throttled_split_beside_an_appender() {
    for _ in 0..30 {
        reader_through_split_round();
    }
}

fn reader_through_split_round() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 3000);
    let total = 5000;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let topic = topic.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut r = topic.reader(StartAt::Earliest).unwrap();
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                seen.extend(r.poll(37).unwrap());
            }
            drain(&mut r, &mut seen);
            seen
        })
    };
    let appender = {
        let topic = topic.clone();
        std::thread::spawn(move || append(&topic, 3000, total - 3000))
    };
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let mut group_seen = poll_n(&mut m, 1500);
    topic
        .split_tail(
            0,
            SplitPlan::Even,
            TailSplitOptions {
                from: fissionlog::TailFrom::Offset(1000),
                throttle_bytes_per_sec: 400 * 1024,
            },
        )
        .unwrap();
    appender.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Release);
    let seen = reader.join().unwrap();
    check_exactly_once(&seen, 0..total, "reader thread");
    check_exactly_once(&read_all(&topic), 0..total, "earliest");
    m.commit().unwrap();
    poll_all(&mut m, &mut group_seen);
    check_exactly_once(&group_seen, 0..total, "group member");
}

/// A member commits its pre-split parent position after a tail split
/// that moved the parent whole; retention then removes the parent. After
/// a reopen the group goes on with exactly the records not handed out.
#[test]
fn a_stale_parent_commit_survives_the_parents_removal_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TopicConfig {
        retention_bytes: Some(1 << 30),
        ..config()
    };
    let mut seen;
    {
        let log = Log::open(dir.path(), options()).unwrap();
        let topic = log.create_topic("t", cfg).unwrap();
        append(&topic, 0, 500);
        let g = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = g.join(member_opts()).unwrap();
        seen = poll_n(&mut m, 300);
        topic
            .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(0))
            .unwrap();
        m.commit().unwrap();
        log.enforce_retention().unwrap();
        assert!(
            topic.partitions().iter().all(|p| p.id != 0),
            "parent removed"
        );
        append(&topic, 500, 100);
        drop((m, g, topic));
        log.close().unwrap();
    }
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.topic("t").unwrap();
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    poll_all(&mut m, &mut seen);
    check_exactly_once(
        &seen,
        0..600,
        "group after the parent's removal and a reopen",
    );
}

/// `commit_positions` with the offsets of records handed out from the
/// parent before the split (past its logical end), after the member
/// polled the children: accepted, and a member joining after it left
/// reads exactly the rest.
#[test]
fn commit_positions_of_parent_records_handed_out_before_the_split() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 1000);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let seen = poll_n(&mut m, 700);
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(400))
        .unwrap();
    // Nothing new yet: the poll only takes the new topology.
    let more = m.poll(10).unwrap();
    assert!(more.iter().all(|r| r.partition != 0), "{:?}", more.first());
    let last = seen.last().unwrap();
    assert_eq!(last.partition, 0);
    m.commit_positions(&[(0, last.offset + 1)]).unwrap();
    m.leave().unwrap();
    let mut m2 = g.join(member_opts()).unwrap();
    let mut rest = Vec::new();
    poll_all(&mut m2, &mut rest);
    // The member's records read after the split were not committed: the
    // next member reads them.
    let mut all = seen.clone();
    all.extend(rest);
    check_exactly_once(&all, 0..1000, "after commit_positions of parent offsets");
}

/// A power loss before every I/O step of a tail split while a group's
/// committed position lies inside the moved range: after the reopen the
/// group reads exactly the records past its position (old layout: from
/// the parent; new: from the children at translated positions).
#[test]
fn power_loss_during_a_tail_split_keeps_a_groups_position() {
    let dir = tempfile::tempdir().unwrap();
    let hook = ModelHook::new(dir.path(), None);
    hook.grant_segment_headers(true);
    let log = Log::open_with_hook(dir.path(), options(), hook.clone()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 400);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let consumed = poll_n(&mut m, 250);
    m.commit().unwrap();
    log.sync().unwrap();
    hook.record_steps(true);
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(100))
        .unwrap();
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    drop((m, g));
    log.abandon();
    let opts = CrashOptions::default();
    for (i, point) in points.iter().enumerate() {
        for s in 0..2u64 {
            let (image, trace): (DirImage, _) = point.image(i as u64 * 13 + s, &opts);
            let ctx = format!(
                "step {i} (before {:?}) image {s}: {}",
                point.op,
                trace.join("; ")
            );
            let d = tempfile::tempdir().unwrap();
            let root = d.path().join("log");
            image.write_to(&root).unwrap();
            let log = Log::open(&root, options()).unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
            let topic = log.topic("t").unwrap();
            let g = topic.group("g", GroupOptions::default()).unwrap();
            let mut m = g.join(member_opts()).unwrap();
            let mut seen = consumed.clone();
            poll_all(&mut m, &mut seen);
            check_exactly_once(&seen, 0..400, &ctx);
        }
    }
}

/// Two members: one reads the parent past the split offset, the other
/// waits; after the split and a commit both read on. Together they see
/// every record exactly once, per key in order within each member.
#[test]
fn two_members_share_the_children_after_a_tail_split() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 1000);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut a = g.join(member_opts()).unwrap();
    let mut b = g.join(member_opts()).unwrap();
    let mut seen_b = b.poll(100).unwrap();
    let mut seen_a = a.poll(100).unwrap();
    while seen_a.len() + seen_b.len() < 600 {
        let ga = a.poll(50).unwrap();
        let gb = b.poll(50).unwrap();
        assert!(!(ga.is_empty() && gb.is_empty()));
        seen_a.extend(ga);
        seen_b.extend(gb);
    }
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(300))
        .unwrap();
    a.commit().unwrap();
    b.commit().unwrap();
    append(&topic, 1000, 200);
    for _ in 0..100 {
        let ga = a.poll(50).unwrap();
        a.commit().unwrap();
        let gb = b.poll(50).unwrap();
        b.commit().unwrap();
        if ga.is_empty() && gb.is_empty() {
            break;
        }
        seen_a.extend(ga);
        seen_b.extend(gb);
    }
    let mut all = seen_a.clone();
    all.extend(seen_b.iter().cloned());
    let mut s: Vec<u64> = all.iter().map(seq).collect();
    s.sort_unstable();
    assert_eq!(
        s,
        (0..1200).collect::<Vec<_>>(),
        "two members: exactly once"
    );
    for (name, seen) in [("a", &seen_a), ("b", &seen_b)] {
        let mut per_key: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for r in seen.iter() {
            if let Some(k) = &r.key {
                if let Some(&last) = per_key.get(k) {
                    assert!(seq(r) > last, "member {name}: key {k:?}");
                }
                per_key.insert(k.clone(), seq(r));
            }
        }
    }
}

/// Reads of the parent from below the split offset with a large byte
/// budget stop at its logical end: no moved record comes out of the
/// parent.
#[test]
fn a_large_read_of_the_parent_stops_at_its_logical_end() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), options()).unwrap();
    let topic = log.create_topic("t", config()).unwrap();
    append(&topic, 0, 1000);
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(400))
        .unwrap();
    let mut pos = 0;
    let mut n = 0;
    while pos < 400 {
        let b = topic.read(0, pos, 1 << 24).unwrap();
        for r in b.to_owned_records().unwrap() {
            assert!(
                r.offset < 400,
                "moved record {} read from the parent",
                r.offset
            );
            n += 1;
        }
        assert!(b.next_offset() <= 400, "next offset {}", b.next_offset());
        pos = b.next_offset();
    }
    assert_eq!(n, 400);
}
