//! Features working together: consumer groups and key readers
//! over a windowed hot key whose lane partitions split forward, tail split
//! and merge; many-way cut splits followed by a tail split of one child;
//! retention removing a tail-split generation under a live member and a
//! reader resumed from an old cut; power loss at every I/O step of a tail
//! split on a topic with groups and a key that has eras; the command line
//! on a directory using all of it.

use crate::common;
use common::log::quiet;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::crash::{CrashOptions, DirImage};
use common::model_hook::ModelHook;
use fissionlog::{
    CutPoints, GroupOptions, HotKeyMode, HotKeyPolicy, IoOp, Log, MemberOptions, NewRecord,
    OwnedRecord, SplitPlan, StartAt, SyncPolicy, TailSplitOptions, Topic, TopicConfig,
};

const HOT: &[u8] = b"the-hot-key";
const KEYS: u64 = 7;
/// A fixed base time (ms since the epoch).
const T0: i64 = 1_700_000_000_000;

fn config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: 64 * 1024,
        sync: SyncPolicy::Never,
        hot_keys: HotKeyPolicy {
            allow_windowed: true,
            allow_spread: true,
            max_lanes: 4,
            auto_window: None,
        },
        ..TopicConfig::default()
    }
}

fn member_opts() -> MemberOptions {
    MemberOptions {
        session_timeout: Duration::from_secs(600),
        processing_timeout: Duration::from_secs(600),
        instance_id: None,
        background_heartbeat: None,
    }
}

/// Appends records `from..from + n`: every third is `HOT` (timestamp
/// `T0 + 40 i` ms, so its windows of 100 ms rotate over the lanes), the
/// others keys `k{i % KEYS}`, every tenth keyless. Value: `i`.
fn append(topic: &Topic, from: u64, n: u64) {
    append_at(topic, from, n, None);
}

/// As [`append`], the keys other than `HOT` at timestamp `ts` (now when
/// `None`).
fn append_at(topic: &Topic, from: u64, n: u64, ts: Option<i64>) {
    for i in from..from + n {
        let v = i.to_string();
        if i % 3 == 0 {
            topic
                .append_batch(&[NewRecord {
                    key: Some(HOT),
                    value: v.as_bytes(),
                    timestamp: Some(T0 + 40 * i as i64),
                }])
                .unwrap();
        } else {
            let key = format!("k{}", i % KEYS);
            let key = (i % 10 != 1).then_some(key.as_bytes());
            topic
                .append_batch(&[NewRecord {
                    key,
                    value: v.as_bytes(),
                    timestamp: ts,
                }])
                .unwrap();
        }
    }
}

fn seq(r: &OwnedRecord) -> u64 {
    std::str::from_utf8(&r.value).unwrap().parse().unwrap()
}

/// Every record `0..n` exactly once; per-key order for every key but the
/// windowed one (whose lanes a group or reader reads independently).
fn check_exactly_once(seen: &[OwnedRecord], n: u64, ctx: &str) {
    let mut per_key: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for r in seen {
        if let Some(k) = &r.key {
            if k.as_slice() == HOT {
                continue;
            }
            let s = seq(r);
            if let Some(&last) = per_key.get(k) {
                assert!(s > last, "{ctx}: key {k:?}: {s} after {last}");
            }
            per_key.insert(k.clone(), s);
        }
    }
    let mut all: Vec<u64> = seen.iter().map(seq).collect();
    all.sort_unstable();
    let dups: Vec<u64> = all
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    assert!(
        dups.is_empty(),
        "{ctx}: duplicates {:?}",
        &dups[..dups.len().min(10)]
    );
    let missing: Vec<u64> = (0..n).filter(|i| all.binary_search(i).is_err()).collect();
    assert!(
        missing.is_empty(),
        "{ctx}: missing {:?} (of {n})",
        &missing[..missing.len().min(10)]
    );
    assert_eq!(all.len() as u64, n, "{ctx}: count");
}

/// The windowed key in append order, once each.
fn check_hot_key(topic: &Topic, n: u64, ctx: &str) {
    let got: Vec<u64> = topic
        .read_key(HOT)
        .unwrap()
        .iter()
        .map(|r| std::str::from_utf8(&r.value).unwrap().parse().unwrap())
        .collect();
    let want: Vec<u64> = (0..n).filter(|i| i % 3 == 0).collect();
    assert_eq!(got, want, "{ctx}: read_key");
    let streamed: Vec<u64> = topic
        .key_reader(HOT)
        .map(|r| {
            std::str::from_utf8(&r.unwrap().value)
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(streamed, want, "{ctx}: key_reader");
}

fn drain(r: &mut fissionlog::Reader, out: &mut Vec<OwnedRecord>) {
    loop {
        let got = r.poll(61).unwrap();
        if got.is_empty() {
            return;
        }
        out.extend(got);
    }
}

fn read_all(topic: &Topic) -> Vec<OwnedRecord> {
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    let mut out = Vec::new();
    drain(&mut r, &mut out);
    out
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

/// Polls until nothing is left, committing whenever a poll comes back
/// empty (a merge child opens only after the group committed its parents
/// drained).
fn poll_all(m: &mut fissionlog::Member, out: &mut Vec<OwnedRecord>) {
    let mut empty = 0;
    while empty < 2 {
        let got = m.poll(64).unwrap();
        if got.is_empty() {
            m.commit().unwrap();
            empty += 1;
        } else {
            empty = 0;
            out.extend(got);
        }
    }
}

/// Verifies `dir`, retried for up to 10 s while it reads as locked: the
/// command-line probe spawns the binary from this process, and a child
/// holds this process's open files (a just-closed log's lock among them)
/// between its fork and its exec.
/// Opens the log at `dir`, retried while locked (see [`verify_clean`]).
fn open_log(dir: &Path) -> fissionlog::Result<Log> {
    let mut tries = 0;
    loop {
        match Log::open(dir, quiet()) {
            Err(fissionlog::Error::Locked { .. }) if tries < 500 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

fn verify_clean(dir: &Path, ctx: &str) {
    let mut tries = 0;
    let (_report, problems) = loop {
        match fissionlog::verify(dir) {
            Err(fissionlog::Error::Locked { .. }) if tries < 500 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            r => break r.unwrap(),
        }
    };
    assert!(problems.is_empty(), "{ctx}: verify: {problems:?}");
}

fn active(topic: &Topic) -> Vec<fissionlog::PartitionInfo> {
    topic
        .partitions()
        .into_iter()
        .filter(|p| p.sealed_at.is_none())
        .collect()
}

/// The active partition owning hash `h`.
fn owner(topic: &Topic, h: u64) -> u32 {
    active(topic)
        .iter()
        .find(|p| p.start <= h && h <= p.end)
        .unwrap()
        .id
}

/// Lane points of the windowed key's current era.
fn lane_points(topic: &Topic) -> Vec<u64> {
    let lanes = topic.key_lanes(HOT);
    lanes
        .eras
        .iter()
        .flat_map(|e| e.lanes.iter().map(|l| l.hash))
        .collect()
}

/// A group reads a topic with a windowed key over 2 lanes while a lane
/// partition splits forward, a child without a lane point splits its
/// tail, and the tail children merge back. The group hands out every
/// record once (also to a member joining after a reopen), per-key order
/// holds for strict keys, and `read_key` gives the windowed key in append
/// order throughout.
#[test]
fn a_group_and_a_key_reader_across_forward_and_tail_splits_and_a_merge_of_lane_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen;
    let total;
    {
        let log = open_log(dir.path()).unwrap();
        let topic = log.create_topic("t", config(2)).unwrap();
        topic
            .set_hot_key_mode_lanes(HOT, HotKeyMode::Windowed(Duration::from_millis(100)), 2)
            .unwrap();
        append(&topic, 0, 300);
        let g = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = g.join(member_opts()).unwrap();
        seen = poll_n(&mut m, 120);
        m.commit().unwrap();
        let lane0 = owner(&topic, topic.key_lanes(HOT).hash);
        let kids = topic.split(lane0, SplitPlan::Even).unwrap();
        append(&topic, 300, 300);
        check_hot_key(&topic, 600, "after the forward split");
        // A tail split of a child holding a lane point is refused; one of
        // the two children holds none.
        let points = lane_points(&topic);
        let info = topic.partitions();
        let free = kids
            .iter()
            .copied()
            .find(|k| {
                let p = info.iter().find(|p| p.id == *k).unwrap();
                !points.iter().any(|h| p.start <= *h && *h <= p.end)
            })
            .expect("a child without a lane point");
        let tail = topic
            .split_tail(free, SplitPlan::Even, TailSplitOptions::from_offset(0))
            .unwrap();
        seen.extend(poll_n(&mut m, 100));
        append(&topic, 600, 300);
        topic.merge(tail.children[0], tail.children[1]).unwrap();
        append(&topic, 900, 150);
        m.commit().unwrap();
        seen.extend(poll_n(&mut m, 200));
        m.commit().unwrap();
        total = 1050;
        check_hot_key(&topic, total, "after the merge");
        check_exactly_once(&read_all(&topic), total, "reader after the merge");
        drop((m, g, topic));
        log.close().unwrap();
    }
    verify_clean(dir.path(), "closed");
    let log = open_log(dir.path()).unwrap();
    let topic = log.topic("t").unwrap();
    check_hot_key(&topic, total, "reopened");
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    poll_all(&mut m, &mut seen);
    check_exactly_once(&seen, total, "group after the reopen");
}

/// `SplitPlan::Cuts` into 8 children, then a tail split of one child into
/// 4 more by cuts, and a cut saved before each: readers from the oldest
/// data and from both cuts read every record once in per-key order,
/// before and after a reopen.
#[test]
fn a_tail_split_of_one_child_of_a_many_way_cut_split() {
    let dir = tempfile::tempdir().unwrap();
    let step = u64::MAX / 8;
    let pts: Vec<u64> = (1..8).map(|i| i * step).collect();
    let cuts_before;
    let cuts_mid;
    let seen_before: Vec<OwnedRecord>;
    let seen_mid: Vec<OwnedRecord>;
    {
        let log = open_log(dir.path()).unwrap();
        let topic = log.create_topic("t", config(1)).unwrap();
        append(&topic, 0, 200);
        let mut r = topic.reader(StartAt::Earliest).unwrap();
        let mut got = r.poll(70).unwrap();
        seen_before = got.clone();
        cuts_before = r.cut();
        let kids = topic
            .split(0, SplitPlan::Cuts(CutPoints::new(&pts).unwrap()))
            .unwrap();
        assert_eq!(kids.len(), 8);
        append(&topic, 200, 800);
        drain(&mut r, &mut got);
        let mut r2 = topic.reader(StartAt::Cut(r.cut())).unwrap();
        // The busiest child: split its tail from its first offset.
        let info = topic.partitions();
        let big = kids
            .iter()
            .copied()
            .max_by_key(|k| info.iter().find(|p| p.id == *k).unwrap().end_offset)
            .unwrap();
        let p = info.iter().find(|p| p.id == big).unwrap();
        let span = (p.end - p.start) / 4;
        let sub: Vec<u64> = (1..4).map(|i| p.start + i * span).collect();
        let mut mid = topic.reader(StartAt::Earliest).unwrap();
        let mut m = mid.poll(500).unwrap();
        seen_mid = m.clone();
        cuts_mid = mid.cut();
        let half = p.end_offset / 2;
        let out = topic
            .split_tail(
                big,
                SplitPlan::Cuts(CutPoints::new(&sub).unwrap()),
                TailSplitOptions::from_offset(half),
            )
            .unwrap();
        assert_eq!(out.children.len(), 4);
        append(&topic, 1000, 400);
        drain(&mut r, &mut got);
        check_exactly_once(&got, 1400, "live reader across both splits");
        drain(&mut mid, &mut m);
        check_exactly_once(&m, 1400, "live reader mid-way");
        let mut after = Vec::new();
        drain(&mut r2, &mut after);
        assert!(
            after.iter().all(|r| seq(r) >= 200),
            "cut after the first split"
        );
        check_exactly_once(&read_all(&topic), 1400, "earliest");
        drop(topic);
        log.close().unwrap();
    }
    verify_clean(dir.path(), "closed");
    let log = open_log(dir.path()).unwrap();
    let topic = log.topic("t").unwrap();
    check_exactly_once(&read_all(&topic), 1400, "earliest reopened");
    check_hot_key(&topic, 1400, "reopened");
    for (cut, seen, name) in [
        (cuts_before, seen_before, "before"),
        (cuts_mid, seen_mid, "mid"),
    ] {
        let mut r = topic.reader(StartAt::Cut(cut)).unwrap();
        let mut all = seen;
        drain(&mut r, &mut all);
        check_exactly_once(&all, 1400, &format!("cut {name} reopened"));
    }
}

/// A member mid-way through a tail-split parent (it read past the split
/// offset before the split, nothing committed since) while retention
/// removes the parent moved whole: it reads on with exactly the records
/// not handed out, and commits; a member joining later reads the rest.
#[test]
fn retention_removes_a_tail_split_parent_while_a_member_is_mid_poll() {
    let dir = tempfile::tempdir().unwrap();
    let log = open_log(dir.path()).unwrap();
    let cfg = TopicConfig {
        retention_bytes: Some(1 << 30),
        ..config(1)
    };
    let topic = log.create_topic("t", cfg).unwrap();
    append(&topic, 0, 600);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let mut seen = poll_n(&mut m, 100);
    m.commit().unwrap();
    seen.extend(poll_n(&mut m, 150));
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(0))
        .unwrap();
    log.enforce_retention().unwrap();
    assert!(
        topic.partitions().iter().all(|p| p.id != 0),
        "parent removed"
    );
    append(&topic, 600, 100);
    seen.extend(poll_n(&mut m, 200));
    m.commit().unwrap();
    m.leave().unwrap();
    let mut m2 = g.join(member_opts()).unwrap();
    poll_all(&mut m2, &mut seen);
    check_exactly_once(&seen, 700, "members across the parent's removal");
    check_hot_key(&topic, 700, "after the removal");
}

/// Saves a cut after reading `at` records of partition 0 (400 records,
/// old timestamps), tail-splits it from offset 100, appends 100 more old
/// records (to the children), seals the children by forward splits,
/// appends 100 fresh ones and lets retention remove the whole expired
/// generation (parent and tail children). A reader from the cut, live and
/// after a reopen, must read each fresh record once, no expired one, and
/// report as retained exactly the `500 - at` records it had not read.
fn cut_across_an_expired_tail_split_generation(at: u64) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TopicConfig {
        retention_age: Some(Duration::from_secs(60)),
        ..config(1)
    };
    let log = open_log(dir.path()).unwrap();
    let topic = log.create_topic("t", cfg).unwrap();
    append_at(&topic, 0, 400, Some(T0));
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    let mut read = Vec::new();
    while (read.len() as u64) < at {
        read.extend(r.poll((at as usize) - read.len()).unwrap());
    }
    let cut = r.cut();
    let out = topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(100))
        .unwrap();
    append_at(&topic, 400, 100, Some(T0));
    for c in &out.children {
        topic.split(*c, SplitPlan::Even).unwrap();
    }
    append(&topic, 500, 100);
    log.enforce_retention().unwrap();
    let left: Vec<u32> = topic.partitions().iter().map(|p| p.id).collect();
    assert!(
        !left.contains(&0) && out.children.iter().all(|c| !left.contains(c)),
        "generation removed: {left:?}"
    );
    let check = |topic: &Topic, ctx: &str| {
        let mut r = topic.reader(StartAt::Cut(cut.clone())).unwrap();
        let mut got = Vec::new();
        drain(&mut r, &mut got);
        let s: Vec<u64> = got.iter().map(seq).collect();
        let mut sorted = s.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (500..600).collect::<Vec<_>>(), "{ctx}: read");
        let lost = r.retained();
        assert!(
            lost.iter().all(|l| l.end != u64::MAX),
            "{ctx}: seals still recorded: {lost:?}"
        );
        let n: u64 = lost.iter().map(|l| l.end - l.start).sum();
        assert_eq!(n, 500 - at, "{ctx}: records reported lost: {lost:?}");
    };
    check(&topic, "live");
    drop(topic);
    log.close().unwrap();
    let log = open_log(dir.path()).unwrap();
    check(&log.topic("t").unwrap(), "reopened");
}

/// A cut below the split offset: the parent's rest and both children are
/// reported, nothing twice.
#[test]
fn a_cut_below_a_tail_split_whose_generation_expires_reports_each_loss_once() {
    cut_across_an_expired_tail_split_generation(50);
}

/// A cut inside the moved range (parent position 300, split from 100):
/// right after retention and after a reopen the reader reports exactly
/// the 200 unread records. The position's translation needs the
/// descendant index, which lives in the topic's directory while the
/// removed list names the parent (it used to go with the first child's
/// directory, and the reopened reader reported the children from offset
/// 0: 400 lost instead of 200).
///
/// Reproduction: 400 records with old timestamps in one partition
/// (`retention_age` 60 s), a reader polls 300 and saves its cut,
/// `split_tail(0, Even, from 100)`, 100 more old records, both children
/// split forward, 100 fresh records, `enforce_retention`: a reader from the
/// cut, after a reopen, reports `RetainedRange`s of children 1 and 2 from
/// offset 0.
#[test]
fn a_cut_inside_a_tail_splits_moved_range_whose_generation_expires_reports_only_unread_losses() {
    cut_across_an_expired_tail_split_generation(300);
}

/// A power loss before every I/O step of a tail split on a topic with a
/// consumer group and a key with eras (windowed, then strict again):
/// after the reopen the group reads exactly the records past its
/// position, and `read_key` gives the key in append order.
#[test]
fn power_loss_during_a_tail_split_with_groups_and_hot_key_eras() {
    let dir = tempfile::tempdir().unwrap();
    let hook = ModelHook::new(dir.path(), None);
    hook.grant_segment_headers(true);
    let log = Log::open_with_hook(dir.path(), quiet(), hook.clone()).unwrap();
    let topic = log.create_topic("t", config(2)).unwrap();
    topic
        .set_hot_key_mode_lanes(HOT, HotKeyMode::Windowed(Duration::from_millis(100)), 2)
        .unwrap();
    append(&topic, 0, 150);
    topic.set_hot_key_mode(HOT, HotKeyMode::Strict).unwrap();
    append(&topic, 150, 150);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let consumed = poll_n(&mut m, 220);
    m.commit().unwrap();
    log.sync().unwrap();
    // The owner of the key's hash, from the strict era's start there.
    let own = owner(&topic, topic.key_lanes(HOT).hash);
    let from = topic
        .key_chain(HOT)
        .iter()
        .filter(|l| l.partition == own)
        .map(|l| l.from_offset)
        .max()
        .unwrap();
    hook.record_steps(true);
    topic
        .split_tail(own, SplitPlan::Even, TailSplitOptions::from_offset(from))
        .unwrap();
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    assert!(points.len() > 5, "steps: {}", points.len());
    drop((m, g, topic));
    log.abandon();
    let opts = CrashOptions::default();
    for (i, point) in points.iter().enumerate() {
        let (image, trace): (DirImage, _) = point.image(i as u64 * 7 + 1, &opts);
        let ctx = format!("step {i} (before {:?}): {}", point.op, trace.join("; "));
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("log");
        image.write_to(&root).unwrap();
        let log = open_log(&root).unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
        let topic = log.topic("t").unwrap();
        check_hot_key(&topic, 300, &ctx);
        let g = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = g.join(member_opts()).unwrap();
        let mut seen = consumed.clone();
        poll_all(&mut m, &mut seen);
        check_exactly_once(&seen, 300, &ctx);
        drop((m, g, topic));
        log.close().unwrap();
        verify_clean(&root, &ctx);
    }
}

/// Runs the binary, retried for up to 10 s while it reports the directory
/// locked (see [`verify_clean`]).
fn cli(args: &[&str], dir: &Path) -> std::process::Output {
    let mut tries = 0;
    loop {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_fissionlog"))
            .args(args)
            .arg("--dir")
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        tries += 1;
        let locked = o.status.code() == Some(2)
            && String::from_utf8_lossy(&o.stderr).contains("is locked by another process");
        if !locked || tries == 500 {
            return o;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `verify`, `inspect --json`, `dump` and `dump --key` on a directory with
/// a windowed key and a later strict era, a forward split, a tail split
/// whose parent retention removed, a many-way cut split of a tail child,
/// and a consumer group: verify is clean, inspect lists every partition
/// of the topology (the removed parent among `removed_parents`), the dump
/// prints every live record once, and the key dump gives the key in order.
#[test]
fn the_command_line_on_a_directory_with_every_feature() {
    let dir = tempfile::tempdir().unwrap();
    let (live, ids, removed, moved_child) = {
        let log = open_log(dir.path()).unwrap();
        let cfg = TopicConfig {
            retention_bytes: Some(1 << 30),
            ..config(4)
        };
        let topic = log.create_topic("t", cfg).unwrap();
        topic
            .set_hot_key_mode_lanes(HOT, HotKeyMode::Windowed(Duration::from_millis(100)), 2)
            .unwrap();
        append(&topic, 0, 300);
        let g = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = g.join(member_opts()).unwrap();
        poll_n(&mut m, 100);
        m.commit().unwrap();
        let own = owner(&topic, topic.key_lanes(HOT).hash);
        let kids = topic.split(own, SplitPlan::Even).unwrap();
        append(&topic, 300, 200);
        let points = lane_points(&topic);
        // A root holding no lane point (4 roots, 2 lanes).
        let free = active(&topic)
            .iter()
            .find(|p| {
                p.parents.is_empty()
                    && !kids.contains(&p.id)
                    && !points.iter().any(|h| p.start <= *h && *h <= p.end)
            })
            .unwrap()
            .id;
        let tail = topic
            .split_tail(free, SplitPlan::Even, TailSplitOptions::from_offset(0))
            .unwrap();
        let c = tail.children[0];
        let p = topic.partitions().into_iter().find(|p| p.id == c).unwrap();
        let q = (p.end - p.start) / 4;
        let pts: Vec<u64> = (1..4).map(|i| p.start + i * q).collect();
        topic
            .split(c, SplitPlan::Cuts(CutPoints::new(&pts).unwrap()))
            .unwrap();
        topic.set_hot_key_mode(HOT, HotKeyMode::Strict).unwrap();
        append(&topic, 500, 200);
        poll_n(&mut m, 100);
        m.commit().unwrap();
        log.enforce_retention().unwrap();
        let ids: Vec<u32> = topic.partitions().iter().map(|p| p.id).collect();
        assert!(!ids.contains(&free), "moved-whole parent removed: {ids:?}");
        let live: Vec<u64> = read_all(&topic).iter().map(seq).collect();
        drop((m, g, topic));
        log.close().unwrap();
        (live, ids, free, c)
    };
    let mut sorted = live.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..700).collect::<Vec<_>>(), "every record live");

    let o = cli(&["verify"], dir.path());
    assert_eq!(o.status.code(), Some(0), "verify: {o:?}");

    let o = cli(&["inspect", "--json"], dir.path());
    assert_eq!(o.status.code(), Some(0), "inspect: {o:?}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let parts = doc["topics"][0]["partitions"].as_array().unwrap();
    let mut listed: Vec<u32> = parts
        .iter()
        .map(|p| p["id"].as_u64().unwrap() as u32)
        .collect();
    listed.sort_unstable();
    let mut want = ids.clone();
    want.sort_unstable();
    assert_eq!(listed, want, "inspect lists the topology");
    // A tail child left empty (all moved records hashed to the other) is
    // removed with its parent; the one holding records stays.
    assert!(
        parts.iter().any(|p| p["removed_parents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"].as_u64() == Some(u64::from(removed)))),
        "removed parent listed by a child: {parts:?}"
    );
    let _ = moved_child;

    let o = cli(&["dump", "--topic", "t"], dir.path());
    assert_eq!(o.status.code(), Some(0), "dump: {o:?}");
    let text = String::from_utf8(o.stdout).unwrap();
    let mut dumped: Vec<u64> = text
        .lines()
        .map(|l| l.rsplit('\t').next().unwrap().parse().unwrap())
        .collect();
    dumped.sort_unstable();
    assert_eq!(
        dumped,
        (0..700).collect::<Vec<_>>(),
        "dump: every record once"
    );

    let o = cli(
        &["dump", "--topic", "t", "--key", "the-hot-key"],
        dir.path(),
    );
    assert_eq!(o.status.code(), Some(0), "dump --key: {o:?}");
    let text = String::from_utf8(o.stdout).unwrap();
    let got: Vec<u64> = text
        .lines()
        .map(|l| l.rsplit('\t').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        got,
        (0..700).filter(|i| i % 3 == 0).collect::<Vec<_>>(),
        "dump --key"
    );
}

/// `TailFrom::SlowestGroup` on a child of an 8-way cut split, with one
/// group reading the children (a member mid-poll) and one that committed
/// only in the parent: the split starts at the child's first offset (the second group
/// has no position there), and both groups then read every record once,
/// also after a reopen.
#[test]
fn slowest_group_tail_split_of_a_cut_child_with_a_group_still_in_the_parent() {
    let dir = tempfile::tempdir().unwrap();
    let step = u64::MAX / 8;
    let pts: Vec<u64> = (1..8).map(|i| i * step).collect();
    let (mut seen_a, mut seen_b) = {
        let log = open_log(dir.path()).unwrap();
        let topic = log.create_topic("t", config(1)).unwrap();
        append(&topic, 0, 200);
        let ga = topic.group("a", GroupOptions::default()).unwrap();
        let gb = topic.group("b", GroupOptions::default()).unwrap();
        let mut a = ga.join(member_opts()).unwrap();
        let mut b = gb.join(member_opts()).unwrap();
        let mut seen_b = poll_n(&mut b, 50);
        b.commit().unwrap();
        let kids = topic
            .split(0, SplitPlan::Cuts(CutPoints::new(&pts).unwrap()))
            .unwrap();
        append(&topic, 200, 800);
        let mut seen_a = poll_n(&mut a, 600);
        a.commit().unwrap();
        let busiest = kids
            .iter()
            .copied()
            .max_by_key(|k| {
                topic
                    .partitions()
                    .iter()
                    .find(|p| p.id == *k)
                    .unwrap()
                    .end_offset
            })
            .unwrap();
        let out = topic
            .split_tail(
                busiest,
                SplitPlan::Even,
                TailSplitOptions {
                    from: fissionlog::TailFrom::SlowestGroup,
                    throttle_bytes_per_sec: 0,
                },
            )
            .unwrap();
        assert_eq!(out.from, 0, "group b has no position in the child");
        append(&topic, 1000, 100);
        poll_all(&mut a, &mut seen_a);
        check_exactly_once(&seen_a, 1100, "group a");
        seen_b.extend(poll_n(&mut b, 300));
        b.commit().unwrap();
        drop((a, b, ga, gb, topic));
        log.close().unwrap();
        (seen_a, seen_b)
    };
    verify_clean(dir.path(), "closed");
    let log = open_log(dir.path()).unwrap();
    let topic = log.topic("t").unwrap();
    append(&topic, 1100, 50);
    for (name, seen) in [("a", &mut seen_a), ("b", &mut seen_b)] {
        let g = topic.group(name, GroupOptions::default()).unwrap();
        let mut m = g.join(member_opts()).unwrap();
        poll_all(&mut m, seen);
        check_exactly_once(seen, 1150, &format!("group {name} reopened"));
    }
    check_hot_key(&topic, 1150, "reopened");
}

/// A windowed key over 2 lanes whose lane owners merge (one partition on
/// both lanes' chains), then a spread era over the merged partition split
/// forward again: `read_key` gives the windowed era in append order and
/// every spread record once, a group reads every record once, and a tail
/// split of a partition holding a lane is refused with nothing changed.
#[test]
fn merged_lane_owners_then_a_spread_era_and_a_refused_tail_split() {
    let dir = tempfile::tempdir().unwrap();
    let log = open_log(dir.path()).unwrap();
    let topic = log.create_topic("t", config(2)).unwrap();
    topic
        .set_hot_key_mode_lanes(HOT, HotKeyMode::Windowed(Duration::from_millis(100)), 2)
        .unwrap();
    append(&topic, 0, 200);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let mut seen = poll_n(&mut m, 150);
    m.commit().unwrap();
    let merged = topic.merge(0, 1).unwrap();
    append(&topic, 200, 200);
    check_hot_key(&topic, 400, "windowed over a merged owner");
    topic.set_hot_key_mode(HOT, HotKeyMode::Spread).unwrap();
    append(&topic, 400, 200);
    let kids = topic.split(merged, SplitPlan::Even).unwrap();
    append(&topic, 600, 100);
    let before = topic.partitions().len();
    for k in &kids {
        let r = topic.split_tail(*k, SplitPlan::Even, TailSplitOptions::from_offset(0));
        assert!(
            matches!(r, Err(fissionlog::Error::Refused(_))),
            "tail split of a lane owner: {r:?}"
        );
    }
    assert_eq!(topic.partitions().len(), before, "nothing changed");
    let got: Vec<u64> = topic
        .read_key(HOT)
        .unwrap()
        .iter()
        .map(|r| std::str::from_utf8(&r.value).unwrap().parse().unwrap())
        .collect();
    let windowed: Vec<u64> = (0..400).filter(|i| i % 3 == 0).collect();
    assert_eq!(
        &got[..windowed.len()],
        &windowed[..],
        "windowed eras in order"
    );
    let mut spread = got[windowed.len()..].to_vec();
    spread.sort_unstable();
    assert_eq!(
        spread,
        (400..700).filter(|i| i % 3 == 0).collect::<Vec<_>>(),
        "spread era once each"
    );
    poll_all(&mut m, &mut seen);
    check_exactly_once(&seen, 700, "group");
    drop((m, g, topic));
    log.close().unwrap();
    verify_clean(dir.path(), "closed");
}

/// Every record not read before `prefix` was taken is either read after
/// it (once, and not also in `prefix`) or lies in a reported retained
/// range at the place `locs` gives it.
fn check_cover(
    locs: &BTreeMap<u64, (u32, u64)>,
    prefix: &[OwnedRecord],
    got: &[OwnedRecord],
    retained: &[fissionlog::RetainedRange],
    ctx: &str,
) {
    let mut read: BTreeMap<u64, usize> = BTreeMap::new();
    for r in prefix.iter().chain(got) {
        *read.entry(seq(r)).or_default() += 1;
    }
    let twice: Vec<u64> = read
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|(&s, _)| s)
        .collect();
    assert!(twice.is_empty(), "{ctx}: read twice: {twice:?}");
    let lost = |p: u32, o: u64| {
        retained
            .iter()
            .any(|r| r.partition == p && r.start <= o && o < r.end)
    };
    let unaccounted: Vec<(u64, (u32, u64))> = locs
        .iter()
        .filter(|(s, &(p, o))| !read.contains_key(s) && !lost(p, o))
        .map(|(&s, &l)| (s, l))
        .collect();
    assert!(
        unaccounted.is_empty(),
        "{ctx}: neither read nor reported: {} records, first {:?}, last {:?}; retained {retained:?}",
        unaccounted.len(),
        unaccounted.first(),
        unaccounted.last()
    );
}

/// Size retention retires a partly moved tail-split parent (and old
/// segments of its children) while a reader from a cut and a group
/// member are positioned in the parent below the split offset: each reads
/// every surviving record once and reports every removed one it had not
/// read, live and after a reopen.
#[test]
fn size_retention_under_a_reader_and_a_member_below_a_tail_split_offset() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TopicConfig {
        segment_bytes: 4096,
        retention_bytes: Some(6 * 1024),
        ..config(1)
    };
    let log = open_log(dir.path()).unwrap();
    let topic = log.create_topic("t", cfg).unwrap();
    append(&topic, 0, 600);
    let mut r = topic.reader(StartAt::Earliest).unwrap();
    let prefix = r.poll(100).unwrap();
    let cut = r.cut();
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let mprefix = poll_n(&mut m, 100);
    m.commit().unwrap();
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(300))
        .unwrap();
    append(&topic, 600, 300);
    let locs: BTreeMap<u64, (u32, u64)> = read_all(&topic)
        .iter()
        .map(|r| (seq(r), (r.partition, r.offset)))
        .collect();
    assert_eq!(locs.len(), 900);
    log.enforce_retention().unwrap();
    log.enforce_retention().unwrap();
    let mut got = Vec::new();
    drain(&mut r, &mut got);
    check_cover(&locs, &prefix, &got, r.retained(), "live reader");
    assert!(!r.retained().is_empty(), "retention removed records");
    let mut mgot = Vec::new();
    poll_all(&mut m, &mut mgot);
    check_cover(&locs, &mprefix, &mgot, m.retained(), "live member");
    m.leave().unwrap();
    drop((r, g, topic));
    log.close().unwrap();
    verify_clean(dir.path(), "closed");
    let log = open_log(dir.path()).unwrap();
    let topic = log.topic("t").unwrap();
    let mut r = topic.reader(StartAt::Cut(cut)).unwrap();
    let mut got = Vec::new();
    drain(&mut r, &mut got);
    check_cover(&locs, &prefix, &got, r.retained(), "reader reopened");
}

/// A member positioned in a split parent that retention empties and
/// removes reports the records it had not handed out (as a reader does)
/// instead of dropping its position silently: here it had committed 100
/// records of the parent and then read on in the children, with records
/// 100.. of the parent never handed out and nothing in `retained()`.
#[test]
fn a_member_reports_the_unread_rest_of_a_parent_retention_removed() {
    for tail in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = TopicConfig {
            segment_bytes: 4096,
            retention_bytes: Some(1),
            ..config(1)
        };
        let log = open_log(dir.path()).unwrap();
        let topic = log.create_topic("t", cfg).unwrap();
        append(&topic, 0, 400);
        let g = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = g.join(member_opts()).unwrap();
        let prefix = poll_n(&mut m, 100);
        m.commit().unwrap();
        if tail {
            topic
                .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(300))
                .unwrap();
        } else {
            topic.split(0, SplitPlan::Even).unwrap();
        }
        append(&topic, 400, 100);
        let locs: BTreeMap<u64, (u32, u64)> = read_all(&topic)
            .iter()
            .map(|r| (seq(r), (r.partition, r.offset)))
            .collect();
        log.enforce_retention().unwrap();
        assert!(
            topic.partitions().iter().all(|p| p.id != 0),
            "tail {tail}: parent removed"
        );
        let mut got = Vec::new();
        poll_all(&mut m, &mut got);
        let ctx = format!("tail split {tail}");
        check_cover(&locs, &prefix, &got, m.retained(), &ctx);
        assert!(
            m.retained()
                .iter()
                .any(|r| r.partition == 0 && r.start == 100),
            "{ctx}: {:?}",
            m.retained()
        );
    }
}

/// Records read before, records read after, ranges reported lost, and
/// where each record was before retention.
type Outcome = (
    Vec<OwnedRecord>,
    Vec<OwnedRecord>,
    Vec<fissionlog::RetainedRange>,
    BTreeMap<u64, (u32, u64)>,
);

/// Scenario of the next two probes: a group commits 100 records of a
/// parent, its member leaves (or the log reopens), the parent's tail is
/// split and retention empties and removes it; a member
/// joining afterwards reads the children. Returns what it read, what it
/// reported and where each record was before retention.
/// (A forward split instead of the tail split fails the same way.)
fn member_after_a_committed_parent_was_removed(reopen: bool) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TopicConfig {
        segment_bytes: 4096,
        retention_bytes: Some(1),
        ..config(1)
    };
    let log = open_log(dir.path()).unwrap();
    let topic = log.create_topic("t", cfg).unwrap();
    append(&topic, 0, 400);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let prefix = poll_n(&mut m, 100);
    m.commit().unwrap();
    m.leave().unwrap();
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(300))
        .unwrap();
    append(&topic, 400, 100);
    let locs: BTreeMap<u64, (u32, u64)> = read_all(&topic)
        .iter()
        .map(|r| (seq(r), (r.partition, r.offset)))
        .collect();
    let (log, topic, g) = if reopen {
        drop((g, topic));
        log.close().unwrap();
        let log = open_log(dir.path()).unwrap();
        let topic = log.topic("t").unwrap();
        let g = topic.group("g", GroupOptions::default()).unwrap();
        (log, topic, g)
    } else {
        (log, topic, g)
    };
    log.enforce_retention().unwrap();
    assert!(
        topic.partitions().iter().all(|p| p.id != 0),
        "parent removed"
    );
    let mut m = g.join(member_opts()).unwrap();
    let mut got = Vec::new();
    poll_all(&mut m, &mut got);
    let retained = m.retained().to_vec();
    (prefix, got, retained, locs)
}

/// Nobody reports the parent's records 100..300 that the group never
/// read: the group's committed position in the parent is forgotten when
/// retention removes it (`Committed::forget_removed`), and the member
/// that takes the children starts them at 0 with an empty `retained()`.
/// The group would need to keep the loss until a member takes the
/// children (a reader keeps it in its own state).
///
/// Reproduction: 400 records in one partition (4 KiB segments,
/// `retention_bytes` 1), a member commits 100 and leaves,
/// `split_tail(0, Even, from 300)`, 100 more records, `enforce_retention`
/// (the parent is removed), a new member drains: 300 records read, none
/// of 100..300 reported.
#[test]
fn a_group_reports_the_unread_rest_of_a_committed_parent_retention_removed() {
    let (prefix, got, retained, locs) = member_after_a_committed_parent_was_removed(false);
    check_cover(&locs, &prefix, &got, &retained, "live");
}

/// As above, with the log reopened between the split and retention.
#[test]
fn a_group_reports_the_unread_rest_of_a_committed_parent_removed_after_a_reopen() {
    let (prefix, got, retained, locs) = member_after_a_committed_parent_was_removed(true);
    check_cover(&locs, &prefix, &got, &retained, "reopened");
}

/// A power loss before every I/O step of a mode change (strict to
/// windowed over 2 lanes) of a key whose hash lies in a tail split's
/// child, with a group's committed position in the moved range: after the
/// reopen `read_key` gives the key in append order (old or new mode), the
/// group reads every record once, and records appended then land in the
/// mode that survived.
#[test]
fn power_loss_during_a_mode_change_after_a_tail_split_with_a_group() {
    let dir = tempfile::tempdir().unwrap();
    let hook = ModelHook::new(dir.path(), None);
    hook.grant_segment_headers(true);
    let log = Log::open_with_hook(dir.path(), quiet(), hook.clone()).unwrap();
    let topic = log.create_topic("t", config(1)).unwrap();
    append(&topic, 0, 300);
    let g = topic.group("g", GroupOptions::default()).unwrap();
    let mut m = g.join(member_opts()).unwrap();
    let consumed = poll_n(&mut m, 200);
    m.commit().unwrap();
    topic
        .split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(100))
        .unwrap();
    append(&topic, 300, 60);
    log.sync().unwrap();
    hook.record_steps(true);
    topic
        .set_hot_key_mode_lanes(HOT, HotKeyMode::Windowed(Duration::from_millis(100)), 2)
        .unwrap();
    hook.record_steps(false);
    let mut points = hook.take_steps();
    points.push(hook.now(IoOp::SyncDir));
    assert!(points.len() > 2, "steps: {}", points.len());
    drop((m, g, topic));
    log.abandon();
    let opts = CrashOptions::default();
    for (i, point) in points.iter().enumerate() {
        let (image, trace): (DirImage, _) = point.image(i as u64 * 5 + 3, &opts);
        let ctx = format!("step {i} (before {:?}): {}", point.op, trace.join("; "));
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("log");
        image.write_to(&root).unwrap();
        let log = open_log(&root).unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
        let topic = log.topic("t").unwrap();
        check_hot_key(&topic, 360, &ctx);
        append(&topic, 360, 60);
        check_hot_key(&topic, 420, &ctx);
        let g = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = g.join(member_opts()).unwrap();
        let mut seen = consumed.clone();
        poll_all(&mut m, &mut seen);
        check_exactly_once(&seen, 420, &ctx);
        drop((m, g, topic));
        log.close().unwrap();
        verify_clean(&root, &ctx);
    }
}

/// Retention removes the split lane owners of a windowed key (and old
/// segments of their children) and a tail split's parent: `read_key`
/// and `key_reader` return exactly the key's records that a reader of the
/// topic still finds, in append order, also after a reopen.
#[test]
fn read_key_after_retention_removed_lane_owners_matches_what_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TopicConfig {
        segment_bytes: 4096,
        retention_bytes: Some(6 * 1024),
        ..config(4)
    };
    let log = open_log(dir.path()).unwrap();
    let topic = log.create_topic("t", cfg).unwrap();
    topic
        .set_hot_key_mode_lanes(HOT, HotKeyMode::Windowed(Duration::from_millis(100)), 2)
        .unwrap();
    append(&topic, 0, 600);
    let points = lane_points(&topic);
    for p in active(&topic) {
        if points.iter().any(|h| p.start <= *h && *h <= p.end) {
            topic.split(p.id, SplitPlan::Even).unwrap();
        } else {
            topic
                .split_tail(p.id, SplitPlan::Even, TailSplitOptions::from_offset(0))
                .unwrap();
        }
    }
    append(&topic, 600, 600);
    log.enforce_retention().unwrap();
    log.enforce_retention().unwrap();
    let check = |topic: &Topic, ctx: &str| {
        let want: Vec<u64> = {
            let mut v: Vec<u64> = read_all(topic)
                .iter()
                .filter(|r| r.key.as_deref() == Some(HOT))
                .map(seq)
                .collect();
            v.sort_unstable();
            v
        };
        assert!(want.contains(&1197), "{ctx}: newest kept");
        assert!(!want.contains(&0), "{ctx}: retention removed the oldest");
        let got: Vec<u64> = topic
            .read_key(HOT)
            .unwrap()
            .iter()
            .map(|r| std::str::from_utf8(&r.value).unwrap().parse().unwrap())
            .collect();
        assert_eq!(got, want, "{ctx}: read_key");
        let streamed: Vec<u64> = topic
            .key_reader(HOT)
            .map(|r| {
                std::str::from_utf8(&r.unwrap().value)
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert_eq!(streamed, want, "{ctx}: key_reader");
    };
    check(&topic, "live");
    drop(topic);
    log.close().unwrap();
    verify_clean(dir.path(), "closed");
    let log = open_log(dir.path()).unwrap();
    check(&log.topic("t").unwrap(), "reopened");
}

/// A tail split isolating a strict key's hash (`IsolateHash`, three
/// children) under a group member mid-poll past the split offset and a
/// windowed key whose lanes lie elsewhere, then a merge of the isolated
/// child back with a neighbour: the member and a reader read every record
/// once in per-key order, the windowed key stays in order, also after a
/// reopen.
#[test]
fn a_tail_split_isolating_a_key_under_a_member_then_merged_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen;
    {
        let log = open_log(dir.path()).unwrap();
        let topic = log.create_topic("t", config(8)).unwrap();
        topic
            .set_hot_key_mode_lanes(HOT, HotKeyMode::Windowed(Duration::from_millis(100)), 2)
            .unwrap();
        append(&topic, 0, 600);
        let g = topic.group("g", GroupOptions::default()).unwrap();
        let mut m = g.join(member_opts()).unwrap();
        seen = poll_n(&mut m, 100);
        m.commit().unwrap();
        seen.extend(poll_n(&mut m, 250));
        let points = lane_points(&topic);
        // A strict key whose partition holds no lane point.
        let (key_hash, part) = (0..KEYS)
            .map(|k| topic.key_lanes(format!("k{k}").as_bytes()).hash)
            .find_map(|h| {
                let p = active(&topic)
                    .into_iter()
                    .find(|p| p.start <= h && h <= p.end)?;
                (!points.iter().any(|x| p.start <= *x && *x <= p.end)).then_some((h, p))
            })
            .expect("a key outside the lanes' partitions");
        let out = topic
            .split_tail(
                part.id,
                SplitPlan::IsolateHash(key_hash),
                TailSplitOptions::from_offset(part.end_offset / 3),
            )
            .unwrap();
        append(&topic, 600, 200);
        seen.extend(poll_n(&mut m, 100));
        m.commit().unwrap();
        let kids = &out.children;
        let info = topic.partitions();
        let iso = kids
            .iter()
            .copied()
            .find(|k| {
                let p = info.iter().find(|p| p.id == *k).unwrap();
                p.start == key_hash && p.end == key_hash
            })
            .expect("the isolated child");
        let other = *kids.iter().find(|k| **k != iso).unwrap();
        let merged = topic.merge(iso.min(other), iso.max(other));
        if let Err(e) = &merged {
            // Only adjacent ranges merge: take the neighbour on the other side.
            let third = *kids.iter().rev().find(|k| **k != iso).unwrap();
            topic
                .merge(iso.min(third), iso.max(third))
                .unwrap_or_else(|e2| panic!("merge: {e}; {e2}"));
        }
        append(&topic, 800, 100);
        poll_all(&mut m, &mut seen);
        check_exactly_once(&seen, 900, "member");
        check_exactly_once(&read_all(&topic), 900, "reader");
        check_hot_key(&topic, 900, "live");
        drop((m, g, topic));
        log.close().unwrap();
    }
    verify_clean(dir.path(), "closed");
    let log = open_log(dir.path()).unwrap();
    let topic = log.topic("t").unwrap();
    check_exactly_once(&read_all(&topic), 900, "reader reopened");
    check_hot_key(&topic, 900, "reopened");
}
