//! Hot-key modes at their edges: a key reader racing a mode
//! change, extreme record timestamps and window lengths, bad input on a key
//! that already has a mode, a power loss at every I/O step of a mode change
//! (also when it upgrades the manifest), appends of several keys racing
//! mode changes, and the command line on a directory with eras.

use crate::common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::crash::CrashOptions;
use common::model_hook::ModelHook;
use fissionlog::{Error, HotKeyMode, KeyRecord, Log, LogOptions, NewRecord, Topic, TopicConfig};

use common::hot::{config, fill_until, opts, Progress, HOT, T0, W100};

/// Values are the sequence number in decimal (text, so `dump` prints it).
fn seq_of(value: &[u8]) -> u64 {
    std::str::from_utf8(value).unwrap().parse().unwrap()
}

/// Appends one record of `key` with sequence number `seq` at `ts`.
fn put(topic: &Topic, key: &[u8], seq: u64, ts: i64) {
    let v = seq.to_string().into_bytes();
    topic
        .append_batch(&[NewRecord {
            key: Some(key),
            value: &v,
            timestamp: Some(ts),
        }])
        .unwrap();
}

fn seqs(records: &[KeyRecord]) -> Vec<u64> {
    records.iter().map(|r| seq_of(&r.value)).collect()
}

/// A reader made before a mode change reads the eras it was made with. The
/// key's records of the next era (appended after the change, into the same
/// partitions) must not come back as the older era's records: here they
/// did, tagged with the windowed era, and merged by window ahead of an
/// earlier record of another lane (per-key order broken).
///
/// Reproduction: one partition, `HOT` windowed over 2 lanes, records 0 (at
/// T0) and 1 (at T0 + 100 ms, the next window: the other lane); a
/// `key_reader` is made; the mode goes back to `Strict` and record 2 is
/// appended at T0; the reader returned 0, 2, 1.
#[test]
fn a_key_reader_made_before_a_mode_change_keeps_the_eras_it_was_made_with() {
    for read_first in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), opts()).unwrap();
        let topic = log.create_topic("t", config(1, true, true)).unwrap();
        topic.set_hot_key_mode_lanes(HOT, W100, 2).unwrap();
        put(&topic, HOT, 0, T0);
        put(&topic, HOT, 1, T0 + 100);
        let mut reader = topic.key_reader(HOT);
        let mut got: Vec<KeyRecord> = Vec::new();
        if read_first {
            got.push(reader.next().unwrap().unwrap());
        }
        topic.set_hot_key_mode(HOT, HotKeyMode::Strict).unwrap();
        put(&topic, HOT, 2, T0);
        got.extend(reader.map(|r| r.unwrap()));
        let case = format!("read first: {read_first}");
        let s = seqs(&got);
        assert!(
            s.windows(2).all(|p| p[0] < p[1]),
            "{case}: per-key order from the reader: {s:?}"
        );
        assert!(s.starts_with(&[0, 1]), "{case}: {s:?}");
        // Whatever it returned carries the era a fresh reader gives it.
        let now: BTreeMap<(u32, u64), usize> = topic
            .read_key(HOT)
            .unwrap()
            .iter()
            .map(|r| ((r.partition, r.offset), r.era))
            .collect();
        for r in &got {
            assert_eq!(
                Some(&r.era),
                now.get(&(r.partition, r.offset)),
                "{case}: record {} tagged with era {}",
                seq_of(&r.value),
                r.era
            );
        }
        assert_eq!(seqs(&topic.read_key(HOT).unwrap()), vec![0, 1, 2], "{case}");
    }
}

/// Caller timestamps at the ends of the `i64` range (the batch format
/// takes any): a windowed key with a 1 ms window must place and read them
/// back, not overflow computing the lane (an arithmetic overflow panicked
/// in the append and in the reader in builds with overflow checks).
///
/// Reproduction: `HOT` windowed (1 ms, 2 lanes); `append_batch` of one
/// record of `HOT` at timestamp `i64::MIN`.
#[test]
fn extreme_record_timestamps_place_and_read_back_in_a_windowed_key() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.create_topic("t", config(2, true, false)).unwrap();
    topic
        .set_hot_key_mode_lanes(HOT, HotKeyMode::Windowed(Duration::from_millis(1)), 2)
        .unwrap();
    put(&topic, HOT, 0, i64::MIN);
    put(&topic, HOT, 1, i64::MIN + 1);
    put(&topic, HOT, 2, -1);
    put(&topic, HOT, 3, i64::MAX);
    put(&topic, HOT, 4, 5);
    let records = topic.read_key(HOT).unwrap();
    assert_eq!(seqs(&records), vec![0, 1, 2, 3, 4]);
    // Windows never move back: the last one stays in the window of MAX.
    let windows: Vec<i64> = records.iter().map(|r| r.window.unwrap()).collect();
    assert!(windows.windows(2).all(|p| p[0] <= p[1]), "{windows:?}");
    let era = topic.key_lanes(HOT).eras.pop().unwrap();
    for r in &records {
        let w = era.window_of(r.timestamp);
        assert_eq!(w, r.window);
        assert_eq!(era.lane_of_window(w.unwrap()), Some(r.lane));
    }
}

/// `KeyEra::window_of` and `lane_of_window` (public) must agree with where
/// the records went and what the reader reports, for any window the topic
/// accepts. A window longer than `i64::MAX` ms was cut to its low 64 bits
/// by `window_of` (`as i64`), while routing saturates: the era reported a
/// window and lane other than the record's.
///
/// Reproduction: `HOT` set to `Windowed(Duration::from_secs(u64::MAX))`
/// over 2 lanes, one record at T0; `era.window_of(T0)` gave `T0` while the
/// record's window is 0.
#[test]
fn a_huge_window_is_reported_as_it_routes() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.create_topic("t", config(2, true, false)).unwrap();
    let huge = HotKeyMode::Windowed(Duration::from_secs(u64::MAX));
    match topic.set_hot_key_mode_lanes(HOT, huge, 2) {
        // Refusing it is a fine answer too, if nothing changed.
        Err(Error::HotKeyMode { .. }) => {
            assert_eq!(topic.hot_key_mode(HOT), HotKeyMode::Strict);
            return;
        }
        r => r.unwrap(),
    }
    put(&topic, HOT, 0, T0);
    put(&topic, HOT, 1, T0 + 86_400_000);
    let records = topic.read_key(HOT).unwrap();
    assert_eq!(seqs(&records), vec![0, 1]);
    let era = topic.key_lanes(HOT).eras.pop().unwrap();
    for r in &records {
        assert_eq!(era.window_of(r.timestamp), r.window, "window of {r:?}");
        assert_eq!(era.lane_of_window(r.window.unwrap()), Some(r.lane));
    }
    // And it survives a reopen (the manifest takes the duration).
    log.close().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.topic("t").unwrap();
    assert_eq!(topic.hot_key_mode(HOT), huge);
    assert_eq!(seqs(&topic.read_key(HOT).unwrap()), vec![0, 1]);
}

/// Bad input on a key that already has a mode: refused with the typed
/// error, and the mode in force, its lanes and its eras stay as they were
/// (in memory and after a reopen). `Strict` with 0 lanes or more than
/// `max_lanes` is refused as the API documents for every mode ("`k = 0`,
/// `k > max_lanes` ... refused"); it was accepted and switched the key to
/// `Strict`.
///
/// Reproduction: `HOT` windowed over 2 lanes, then
/// `set_hot_key_mode_lanes(HOT, Strict, 0)` returned `Ok` and the key was
/// strict.
#[test]
fn bad_input_on_a_key_with_a_mode_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.create_topic("t", config(2, true, false)).unwrap();
    topic.set_hot_key_mode_lanes(HOT, W100, 2).unwrap();
    put(&topic, HOT, 0, T0);
    let before = topic.key_lanes(HOT);
    let bad = [
        (W100, 0),
        (W100, 5),
        (HotKeyMode::Windowed(Duration::from_micros(999)), 2),
        (HotKeyMode::Windowed(Duration::ZERO), 2),
        (HotKeyMode::Spread, 2),
        (HotKeyMode::Strict, 0),
        (HotKeyMode::Strict, 5),
    ];
    for (mode, lanes) in bad {
        let r = topic.set_hot_key_mode_lanes(HOT, mode, lanes);
        assert!(
            matches!(r, Err(Error::HotKeyMode { .. })),
            "{mode:?} x{lanes}: {r:?}"
        );
        assert_eq!(topic.key_lanes(HOT), before, "{mode:?} x{lanes}");
    }
    // The same mode again is a no-op: no new era.
    topic.set_hot_key_mode_lanes(HOT, W100, 2).unwrap();
    assert_eq!(topic.key_lanes(HOT), before);
    put(&topic, HOT, 1, T0 + 100);
    log.close().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.topic("t").unwrap();
    assert_eq!(topic.key_lanes(HOT).eras, before.eras);
    assert_eq!(seqs(&topic.read_key(HOT).unwrap()), vec![0, 1]);
    // A closed log refuses, and a deleted topic's handle changes nothing.
    let other = log.create_topic("gone", config(2, true, false)).unwrap();
    log.delete_topic("gone").unwrap();
    assert!(other.set_hot_key_mode(HOT, W100).is_err());
    log.close().unwrap();
    assert!(matches!(
        topic.set_hot_key_mode(HOT, HotKeyMode::Strict),
        Err(Error::Closed)
    ));
}

/// Builds a log with `HOT` records 0..40 (synced) and 40..50 (not synced)
/// in 3 partitions, records every I/O step of one mode change
/// (strict → windowed over 3 lanes), and checks a power loss at each step
/// with two seeds: the mode is the old or the new one; every synced record
/// is there once, in order; if the new mode survived, so did every record
/// before it; and appends after recovery follow, in order, each window in
/// one lane.
fn power_loss_at_every_step_of_a_mode_change(version_2: bool) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    std::fs::create_dir_all(&dir).unwrap();
    if version_2 {
        let log = Log::open(&dir, opts()).unwrap();
        log.create_topic("t", config(3, true, true)).unwrap();
        log.close().unwrap();
        let journal = dir.join("manifest.log");
        let mut b = std::fs::read(&journal).unwrap();
        b[8..10].copy_from_slice(&2u16.to_le_bytes());
        std::fs::write(&journal, b).unwrap();
    }
    let hook = ModelHook::new(&dir, None);
    hook.grant_segment_headers(true);
    let steps = {
        let log = Log::open_with_hook(&dir, opts(), hook.clone()).unwrap();
        let topic = log.topic_or_create("t", config(3, true, true)).unwrap();
        for s in 0..40 {
            put(&topic, HOT, s, T0 + s as i64);
            put(&topic, format!("bg-{s}").as_bytes(), 10_000 + s, T0);
        }
        log.sync().unwrap();
        for s in 40..50 {
            put(&topic, HOT, s, T0 + s as i64);
        }
        hook.record_steps(true);
        topic.set_hot_key_mode_lanes(HOT, W100, 3).unwrap();
        hook.record_steps(false);
        let mut steps = hook.take_steps();
        steps.push(hook.now(fissionlog::IoOp::SyncSegment));
        log.abandon();
        steps
    };
    assert!(steps.len() > 2, "the change does I/O: {}", steps.len());
    for (i, step) in steps.iter().enumerate() {
        for seed in 0..2u64 {
            let (img, trace) = step.image(seed, &CrashOptions::default());
            let at = root.path().join(format!("img{i}-{seed}"));
            img.write_to(&at).unwrap();
            let ctx = format!(
                "step {i} ({:?} {}), seed {seed}:\n{}",
                step.op,
                step.path.display(),
                trace.join("\n")
            );
            let log = Log::open(&at, opts()).unwrap_or_else(|e| panic!("{e}\n{ctx}"));
            let topic = log.topic("t").unwrap();
            let mode = topic.hot_key_mode(HOT);
            assert!(
                mode == HotKeyMode::Strict || mode == W100,
                "{mode:?}\n{ctx}"
            );
            let kept = seqs(&topic.read_key(HOT).unwrap());
            assert!(
                kept.windows(2).all(|p| p[0] < p[1]),
                "order {kept:?}\n{ctx}"
            );
            assert!(kept.len() >= 40 && kept[..40] == (0..40).collect::<Vec<_>>()[..]);
            if mode == W100 {
                assert_eq!(kept, (0..50).collect::<Vec<_>>(), "{ctx}");
            }
            for s in 0..12u64 {
                put(&topic, HOT, 1000 + s, T0 + 100 * s as i64);
            }
            let records = topic.read_key(HOT).unwrap();
            let expect: Vec<u64> = kept.iter().copied().chain(1000..1012).collect();
            assert_eq!(seqs(&records), expect, "{ctx}");
            let mut lane_of: BTreeMap<(usize, i64), usize> = BTreeMap::new();
            for r in records.iter().filter(|r| r.window.is_some()) {
                let l = *lane_of.entry((r.era, r.window.unwrap())).or_insert(r.lane);
                assert_eq!(l, r.lane, "window in one lane\n{ctx}");
            }
            log.close().unwrap();
            let (report, problems) = fissionlog::verify(&at).unwrap();
            assert!(problems.is_empty(), "{problems:?} {report:?}\n{ctx}");
        }
    }
}

#[test]
fn a_power_loss_at_every_step_of_a_mode_change_keeps_records_and_eras() {
    power_loss_at_every_step_of_a_mode_change(false);
}

#[test]
fn a_power_loss_at_every_step_of_a_mode_change_that_upgrades_the_manifest() {
    power_loss_at_every_step_of_a_mode_change(true);
}

/// Two hot keys (locked in hash order by batches) and keyless records in
/// the same batches, from two threads, with the two keys in opposite orders
/// in each thread's batches, while a third thread cycles both keys through
/// strict → windowed → spread → strict. No deadlock; every acknowledged
/// record of each key comes back exactly once from its key reader, in each
/// writer's order outside spread eras.
#[test]
fn batches_of_two_hot_keys_and_keyless_records_race_mode_changes() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.create_topic("t", config(3, true, true)).unwrap();
    let keys: [&[u8]; 2] = [b"key-a", b"key-b"];
    let stop = AtomicBool::new(false);
    // Mode changes wait for appends between them (not for a timer).
    let progress = Progress::new(2);
    // Per writer: the sequence numbers acknowledged.
    let acked: Vec<u64> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (topic, stop, progress) = (&topic, &stop, &progress);
                s.spawn(move || {
                    let mut seq = 0u64;
                    let order = if w == 0 { [0, 1] } else { [1, 0] };
                    while !stop.load(Ordering::Relaxed) {
                        let vals: Vec<Vec<u8>> = (seq..seq + 3)
                            .map(|q| [w.to_le_bytes(), q.to_le_bytes()].concat())
                            .collect();
                        let mut recs: Vec<NewRecord<'_>> = Vec::new();
                        for v in &vals {
                            for &k in &order {
                                recs.push(NewRecord {
                                    key: Some(keys[k]),
                                    value: v,
                                    timestamp: None,
                                });
                            }
                            recs.push(NewRecord {
                                key: None,
                                value: v,
                                timestamp: None,
                            });
                        }
                        match topic.append_batch(&recs) {
                            Ok(_) => seq += 3,
                            // Refused mid-batch: retried whole below, so a
                            // record may land twice; such runs are skipped.
                            Err(Error::Refused(_)) | Err(Error::PartialBatch { .. }) => {
                                progress.stopped(w as usize);
                                return (seq, true);
                            }
                            Err(e) => panic!("{e}"),
                        }
                        progress.appended(w as usize, seq);
                    }
                    (seq, false)
                })
            })
            .collect();
        let modes = [
            HotKeyMode::Strict,
            HotKeyMode::Windowed(Duration::from_millis(1)),
            HotKeyMode::Spread,
            HotKeyMode::Strict,
            HotKeyMode::Windowed(Duration::from_millis(3)),
        ];
        for i in 0..10 {
            progress.wait_for_more(100, &stop);
            topic
                .set_hot_key_mode(keys[i % 2], modes[(i / 2) % modes.len()])
                .unwrap();
            topic
                .set_hot_key_mode(keys[(i + 1) % 2], modes[(i + 1) % modes.len()])
                .unwrap();
        }
        progress.wait_for_more(100, &stop);
        stop.store(true, Ordering::Relaxed);
        writers
            .into_iter()
            .map(|h| {
                let (seq, _stopped_early) = h.join().unwrap();
                seq
            })
            .collect()
    });
    for key in keys {
        let records = topic.read_key(key).unwrap();
        let lanes = topic.key_lanes(key);
        for (w, &n) in acked.iter().enumerate() {
            let mine: Vec<(usize, u64)> = records
                .iter()
                .filter(|r| r.value[..8] == (w as u64).to_le_bytes())
                .map(|r| {
                    (
                        r.era,
                        u64::from_le_bytes(r.value[8..16].try_into().unwrap()),
                    )
                })
                .collect();
            let mut all: Vec<u64> = mine.iter().map(|m| m.1).filter(|&q| q < n).collect();
            all.sort_unstable();
            assert_eq!(
                all,
                (0..n).collect::<Vec<_>>(),
                "writer {w}: each record once"
            );
            let ordered: Vec<u64> = mine
                .iter()
                .filter(|m| lanes.eras[m.0].mode != HotKeyMode::Spread)
                .map(|m| m.1)
                .collect();
            assert!(
                ordered.windows(2).all(|p| p[0] < p[1]),
                "writer {w}: per-key order outside spread eras: {ordered:?}"
            );
        }
    }
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fissionlog"))
}

/// `verify` and `dump` on a directory whose manifest holds eras: verify
/// finds nothing wrong; `dump --topic` prints every record once. Its help
/// says the topic dump prints "each key's records in append order"; for a
/// windowed key whose lanes are in different partitions that cannot hold
/// (the windows are in several partitions, printed partition by
/// partition), so the claim is checked only for strict keys here.
#[test]
fn verify_and_dump_read_a_directory_with_eras() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), opts()).unwrap();
        let topic = log.create_topic("t", config(4, true, true)).unwrap();
        topic.set_hot_key_mode_lanes(HOT, W100, 4).unwrap();
        for s in 0..16 {
            put(&topic, HOT, s, T0 + 100 * s as i64);
            put(&topic, b"plain", 100 + s, T0);
        }
        topic.set_hot_key_mode(HOT, HotKeyMode::Spread).unwrap();
        for s in 16..24 {
            put(&topic, HOT, s, T0);
        }
        topic.set_hot_key_mode(HOT, HotKeyMode::Strict).unwrap();
        for s in 24..30 {
            put(&topic, HOT, s, T0);
        }
        log.close().unwrap();
    }
    let (_, problems) = fissionlog::verify(dir.path()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let out = bin()
        .args(["verify", "--dir"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = bin()
        .args(["dump", "--json", "--topic", "t", "--dir"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut hot: Vec<u64> = Vec::new();
    let mut plain: Vec<u64> = Vec::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let val = v["value"].as_str().unwrap().as_bytes();
        match v["key"].as_str() {
            Some("the-hot-key") => hot.push(seq_of(val)),
            Some("plain") => plain.push(seq_of(val)),
            k => panic!("{k:?}"),
        }
    }
    assert_eq!(
        plain,
        (100..116).collect::<Vec<_>>(),
        "a strict key in order"
    );
    hot.sort_unstable();
    assert_eq!(hot, (0..30).collect::<Vec<_>>(), "every record once");
    // The reopened log reads the key back in order across the three eras.
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.topic("t").unwrap();
    let back = topic.read_key(HOT).unwrap();
    let mut s = seqs(&back);
    assert_eq!(s[..16], (0..16).collect::<Vec<_>>()[..]);
    assert_eq!(s[24..], (24..30).collect::<Vec<_>>()[..]);
    s.sort_unstable();
    assert_eq!(s, (0..30).collect::<Vec<_>>());
}

/// Runs `fissionlog dump --json` with `args` and returns the values of the
/// records printed with key `key`, as sequence numbers, in output order.
fn dump_seqs(dir: &std::path::Path, args: &[&str], key: &str) -> Vec<u64> {
    let out = bin()
        .arg("dump")
        .args(args)
        .args(["--json", "--topic", "t", "--dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["key"].as_str() == Some(key))
        .map(|v| seq_of(v["value"].as_str().unwrap().as_bytes()))
        .collect()
}

/// `dump --topic` said it prints "each key's records in append order"
/// (the lineage reader's promise); a windowed key's windows sit in several
/// partitions, and the topic dump printed them partition by partition, out
/// of the key's order, with nothing telling a user how to get that order.
/// `dump --key` prints one key in per-key order (the key reader).
///
/// Reproduction: 4 partitions, `HOT` windowed over 4 lanes, records 0..16
/// 100 ms apart; `fissionlog dump --topic t` printed them as 0, 4, 8, 12,
/// 1, 5, ... (one lane after the other).
#[test]
fn dump_of_one_key_prints_a_windowed_key_in_per_key_order() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(dir.path(), opts()).unwrap();
        let topic = log.create_topic("t", config(4, true, true)).unwrap();
        topic.set_hot_key_mode_lanes(HOT, W100, 4).unwrap();
        for s in 0..16 {
            put(&topic, HOT, s, T0 + 100 * s as i64);
            put(&topic, b"plain", 100 + s, T0);
        }
        topic.set_hot_key_mode(HOT, HotKeyMode::Strict).unwrap();
        for s in 16..20 {
            put(&topic, HOT, s, T0);
        }
        log.close().unwrap();
    }
    let whole = dump_seqs(dir.path(), &[], "the-hot-key");
    assert_ne!(
        whole,
        (0..20).collect::<Vec<_>>(),
        "the topic dump is in lineage order, not the windowed key's"
    );
    assert_eq!(
        dump_seqs(dir.path(), &["--key", "the-hot-key"], "the-hot-key"),
        (0..20).collect::<Vec<_>>()
    );
    assert_eq!(
        dump_seqs(dir.path(), &["--key", "plain"], "plain"),
        (100..116).collect::<Vec<_>>()
    );
    assert!(dump_seqs(dir.path(), &["--key", "plain"], "the-hot-key").is_empty());
}

/// A mode change whose manifest fdatasync fails has an unknown outcome: the
/// record may be on disk, and the next open then finds the new era. An
/// append of the key that was waiting for the key's lock during the change
/// went on afterwards under the old routing, into a partition above the
/// era's start, and was acknowledged; after the reopen the reader
/// attributed it to the new era and skipped it (its window belongs to a
/// lane in another partition): an acknowledged record lost. Appends of the
/// key must see the poisoned log once they hold the key's lock.
///
/// Reproduction: 2 partitions; `set_hot_key_mode_lanes(HOT, W100, 2)` with
/// the manifest fdatasync failing; while it waits in that fsync, an
/// `append_batch` of two `HOT` records in consecutive windows starts (it
/// waits for the key's lock); the change fails (`LogPoisoned`), the batch
/// returns `Ok`; reopen; `read_key` lacked one of the two.
#[test]
fn an_append_waiting_on_a_failed_mode_change_is_not_lost_after_reopen() {
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let hook = ModelHook::new(dir.path(), None);
    let log = Log::open_with_hook(dir.path(), opts(), hook.clone()).unwrap();
    let topic = log.create_topic("t", config(2, true, false)).unwrap();
    put(&topic, HOT, 0, T0);
    log.sync().unwrap();
    type Waiter = std::thread::JoinHandle<fissionlog::Result<Vec<fissionlog::Appended>>>;
    let waiter: Arc<Mutex<Option<Waiter>>> = Arc::default();
    let armed = Arc::new(AtomicBool::new(true));
    {
        let (topic, waiter, armed) = (topic.clone(), waiter.clone(), armed.clone());
        hook.set_fault(Some(Box::new(move |op, _| {
            if op != fissionlog::IoOp::SyncManifest || !armed.swap(false, Ordering::SeqCst) {
                return Ok(());
            }
            let t = topic.clone();
            *waiter.lock().unwrap() = Some(std::thread::spawn(move || {
                let (a, b) = (b"1".to_vec(), b"2".to_vec());
                let now = 4_000_000_000_000; // far ahead: two windows, two lanes
                t.append_batch(&[
                    NewRecord {
                        key: Some(HOT),
                        value: &a,
                        timestamp: Some(now),
                    },
                    NewRecord {
                        key: Some(HOT),
                        value: &b,
                        timestamp: Some(now + 100),
                    },
                ])
            }));
            // Let it reach the key's lock (held by the change).
            std::thread::sleep(Duration::from_millis(200));
            Err(std::io::Error::other("injected fdatasync failure"))
        })));
    }
    let r = topic.set_hot_key_mode_lanes(HOT, W100, 2);
    assert!(matches!(r, Err(Error::LogPoisoned { .. })), "{r:?}");
    let appended = waiter.lock().unwrap().take().unwrap().join().unwrap();
    hook.set_fault(None);
    drop(topic);
    log.abandon();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.topic("t").unwrap();
    let kept = seqs(&topic.read_key(HOT).unwrap());
    match appended {
        Ok(_) => assert_eq!(kept, vec![0, 1, 2], "acknowledged records lost"),
        Err(e) => {
            assert!(matches!(e, Error::LogPoisoned { .. }), "{e}");
            assert_eq!(kept, vec![0]);
        }
    }
}

/// Retention removes the sealed partitions that held a windowed era's first
/// records (and the key's strict records before it): the key reader skips
/// the eras whose bounding partitions are gone and returns exactly the
/// records still held, in order, each with its era, window and lane.
#[test]
fn retention_removing_a_windowed_keys_old_lane_partitions_leaves_the_rest_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                retention_age: Some(Duration::from_secs(3600)),
                ..config(2, true, false)
            },
        )
        .unwrap();
    // Old records (2023): strict, then windowed over the two partitions.
    for s in 0..5 {
        put(&topic, HOT, s, T0 + s as i64);
    }
    topic.set_hot_key_mode_lanes(HOT, W100, 2).unwrap();
    for s in 5..20 {
        put(&topic, HOT, s, T0 + 100 * s as i64);
    }
    // Both lane owners split: the old records stay in sealed parents.
    for p in topic.active_partitions() {
        topic.split(p, fissionlog::SplitPlan::Even).unwrap();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for s in 20..40 {
        put(&topic, HOT, s, now + 100 * s as i64);
    }
    topic.set_hot_key_mode(HOT, HotKeyMode::Strict).unwrap();
    for s in 40..45 {
        put(&topic, HOT, s, now);
    }
    assert_eq!(
        seqs(&topic.read_key(HOT).unwrap()),
        (0..45).collect::<Vec<_>>()
    );
    let removed = log.enforce_retention().unwrap();
    assert!(removed >= 2, "the sealed parents were removed: {removed}");
    let records = topic.read_key(HOT).unwrap();
    assert_eq!(seqs(&records), (20..45).collect::<Vec<_>>());
    let lanes = topic.key_lanes(HOT);
    for r in &records {
        let s = seq_of(&r.value);
        assert_eq!(r.era, if s < 40 { 1 } else { 2 }, "era of {s}");
        if let Some(w) = r.window {
            assert_eq!(lanes.eras[r.era].lane_of_window(w), Some(r.lane));
        }
    }
    let lanes_used: std::collections::BTreeSet<usize> = records
        .iter()
        .filter(|r| r.era == 1)
        .map(|r| r.lane)
        .collect();
    assert_eq!(lanes_used.len(), 2);
    // The same after a reopen.
    log.close().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.topic("t").unwrap();
    assert_eq!(
        seqs(&topic.read_key(HOT).unwrap()),
        (20..45).collect::<Vec<_>>()
    );
}

/// Windows straddling a merge of the two lane owners, then a split of the
/// merge child, in a windowed era and in a spread era: the merged
/// partition is on both lanes' chains; the windowed reader attributes each
/// record by its window (per-key order), the spread reader reads it once
/// (every record once).
#[test]
fn lanes_merged_into_one_partition_and_split_again_read_back_once() {
    for mode in [W100, HotKeyMode::Spread] {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), opts()).unwrap();
        let topic = log.create_topic("t", config(2, true, true)).unwrap();
        topic.set_hot_key_mode_lanes(HOT, mode, 2).unwrap();
        let ts = |s: u64| T0 + 100 * s as i64;
        for s in 0..10 {
            put(&topic, HOT, s, ts(s));
        }
        let [a, b] = topic.active_partitions()[..] else {
            panic!()
        };
        let m = topic.merge(a, b).unwrap();
        for s in 10..20 {
            put(&topic, HOT, s, ts(s));
        }
        topic.split(m, fissionlog::SplitPlan::Even).unwrap();
        for s in 20..30 {
            put(&topic, HOT, s, ts(s));
        }
        let check = |topic: &Topic, case: &str| {
            let records = topic.read_key(HOT).unwrap();
            let mut s = seqs(&records);
            if mode == W100 {
                assert_eq!(s, (0..30).collect::<Vec<_>>(), "{case}");
            }
            s.sort_unstable();
            assert_eq!(s, (0..30).collect::<Vec<_>>(), "{case}: once each");
            // Every link of the key's chain is a partition the key used.
            let chain = topic.key_chain(HOT);
            assert!(chain.iter().any(|l| l.partition == m), "{case}: {chain:?}");
        };
        check(&topic, &format!("{mode:?}"));
        log.close().unwrap();
        let log = Log::open(dir.path(), opts()).unwrap();
        check(&log.topic("t").unwrap(), &format!("{mode:?} reopened"));
    }
}

/// Mode changes past the manifest's compaction threshold: the snapshot
/// carries every era (with its starts and anchor), so a reopen reads the
/// key back exactly as before, and the key continues in the mode in force.
#[test]
fn eras_survive_manifest_compaction_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let o = LogOptions {
        manifest_compact_records: 4,
        ..opts()
    };
    let log = Log::open(dir.path(), o.clone()).unwrap();
    let topic = log.create_topic("t", config(3, true, true)).unwrap();
    let modes = [
        W100,
        HotKeyMode::Spread,
        HotKeyMode::Strict,
        HotKeyMode::Windowed(Duration::from_millis(7)),
    ];
    let mut s = 0u64;
    for i in 0..11 {
        topic
            .set_hot_key_mode_lanes(HOT, modes[i % modes.len()], 1 + (i as u32 % 4))
            .unwrap();
        for _ in 0..6 {
            put(&topic, HOT, s, T0 + 50 * s as i64);
            s += 1;
        }
    }
    let before_lanes = topic.key_lanes(HOT);
    let before = topic.read_key(HOT).unwrap();
    assert_eq!(before.len() as u64, s);
    log.close().unwrap();
    let log = Log::open(dir.path(), o).unwrap();
    let topic = log.topic("t").unwrap();
    assert_eq!(topic.key_lanes(HOT), before_lanes);
    assert_eq!(topic.read_key(HOT).unwrap(), before);
    for q in s..s + 6 {
        put(&topic, HOT, q, T0 + 50 * q as i64);
    }
    let after = topic.read_key(HOT).unwrap();
    assert_eq!(after[..before.len()], before[..]);
    assert_eq!(after.len() as u64, s + 6);
    assert!(after[before.len()..].iter().all(|r| r.era == 11));
}

/// The records a `key_chain` link names, read as its docs say: the
/// partition from `from_offset` to `until_offset` (else its seal, else its
/// end), the key's records, and in a windowed era only the windows of the
/// link's lane.
fn read_links(topic: &Topic) -> Vec<(u32, u64)> {
    let lanes = topic.key_lanes(HOT);
    let mut out = Vec::new();
    for l in topic.key_chain(HOT) {
        let part = topic.partition(l.partition).unwrap();
        let end = l
            .until_offset
            .or(l.sealed_at)
            .unwrap_or_else(|| part.end_offset());
        let mut off = l.from_offset.max(part.start_offset());
        while off < end {
            let b = topic.read(l.partition, off, 1 << 20).unwrap();
            for r in b.iter().take_while(|r| r.offset < end) {
                if r.key != Some(HOT) {
                    continue;
                }
                let era = &lanes.eras[l.era];
                if let Some(w) = era.window_of(r.timestamp) {
                    if era.lane_of_window(w) != Some(l.lane) {
                        continue;
                    }
                }
                out.push((l.partition, r.offset));
            }
            off = b.next_offset();
        }
    }
    out
}

/// `key_chain` reports where the key's records are: following its links
/// as documented names every record `read_key` returns, once. After the
/// two lane owners of a spread era merged, the merge child was listed under
/// both lanes, so a reader following the links read its records twice.
///
/// Reproduction: 2 partitions, `HOT` spread over 2 lanes, records, merge of
/// the two partitions, more records: `key_chain` held the merge child for
/// lane 0 and lane 1.
#[test]
fn key_chain_links_name_each_record_once() {
    for mode in [W100, HotKeyMode::Spread] {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), opts()).unwrap();
        let topic = log.create_topic("t", config(2, true, true)).unwrap();
        for s in 0..4 {
            put(&topic, HOT, s, T0 + 100 * s as i64);
        }
        topic.set_hot_key_mode_lanes(HOT, mode, 2).unwrap();
        for s in 4..10 {
            put(&topic, HOT, s, T0 + 100 * s as i64);
        }
        let [a, b] = topic.active_partitions()[..] else {
            panic!()
        };
        topic.merge(a, b).unwrap();
        for s in 10..16 {
            put(&topic, HOT, s, T0 + 100 * s as i64);
        }
        topic.set_hot_key_mode(HOT, HotKeyMode::Strict).unwrap();
        for s in 16..20 {
            put(&topic, HOT, s, T0);
        }
        let mut named = read_links(&topic);
        named.sort_unstable();
        let mut read: Vec<(u32, u64)> = topic
            .read_key(HOT)
            .unwrap()
            .iter()
            .map(|r| (r.partition, r.offset))
            .collect();
        read.sort_unstable();
        assert_eq!(read.len(), 20, "{mode:?}");
        assert_eq!(named, read, "{mode:?}: {:#?}", topic.key_chain(HOT));
    }
}

/// Two power losses in a row around mode changes: windowed records half
/// synced, a power loss, recovery; a change to spread and more records half
/// synced, a second power loss, recovery; then strict. The eras' starts
/// stay consistent with what each loss cut: every synced record is read
/// back once, windowed and strict ones in order, and records appended after
/// the last recovery follow them.
#[test]
fn two_power_losses_around_mode_changes_keep_eras_consistent() {
    let root = tempfile::tempdir().unwrap();
    for seed in 0..8u64 {
        let d1 = root.path().join(format!("a{seed}"));
        std::fs::create_dir_all(&d1).unwrap();
        let hook = ModelHook::new(&d1, None);
        hook.grant_segment_headers(true);
        {
            let log = Log::open_with_hook(&d1, opts(), hook.clone()).unwrap();
            let topic = log.create_topic("t", config(3, true, true)).unwrap();
            topic.set_hot_key_mode_lanes(HOT, W100, 3).unwrap();
            for s in 0..20 {
                put(&topic, HOT, s, T0 + 100 * s as i64);
            }
            log.sync().unwrap();
            for s in 20..40 {
                put(&topic, HOT, s, T0 + 100 * s as i64);
            }
            log.abandon();
        }
        let (img, _) = hook.crash_image(seed, &CrashOptions::default());
        let d2 = root.path().join(format!("b{seed}"));
        img.write_to(&d2).unwrap();
        let hook2 = ModelHook::new(&d2, None);
        hook2.grant_segment_headers(true);
        let first = {
            let log = Log::open_with_hook(&d2, opts(), hook2.clone()).unwrap();
            hook2.grant_deletions();
            let topic = log.topic("t").unwrap();
            let kept = seqs(&topic.read_key(HOT).unwrap());
            assert!(kept.starts_with(&(0..20).collect::<Vec<_>>()), "{kept:?}");
            assert!(kept.windows(2).all(|p| p[0] < p[1]), "{kept:?}");
            topic.set_hot_key_mode(HOT, HotKeyMode::Spread).unwrap();
            for s in 100..110 {
                put(&topic, HOT, s, T0);
            }
            log.sync().unwrap();
            for s in 110..120 {
                put(&topic, HOT, s, T0);
            }
            log.abandon();
            kept
        };
        let (img, trace) = hook2.crash_image(seed + 100, &CrashOptions::default());
        let d3 = root.path().join(format!("c{seed}"));
        img.write_to(&d3).unwrap();
        let log = Log::open(&d3, opts())
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", trace.join("\n")));
        let topic = log.topic("t").unwrap();
        topic.set_hot_key_mode(HOT, HotKeyMode::Strict).unwrap();
        for s in 200..205 {
            put(&topic, HOT, s, T0);
        }
        let records = topic.read_key(HOT).unwrap();
        let eras: Vec<usize> = records.iter().map(|r| r.era).collect();
        assert!(
            eras.windows(2).all(|p| p[0] <= p[1]),
            "seed {seed}: {eras:?}"
        );
        let by_era = |e: usize| -> Vec<u64> {
            records
                .iter()
                .filter(|r| r.era == e)
                .map(|r| seq_of(&r.value))
                .collect()
        };
        assert_eq!(
            by_era(1),
            first,
            "seed {seed}: the windowed era as recovered"
        );
        let mut spread = by_era(2);
        spread.sort_unstable();
        assert!(
            spread.starts_with(&(100..110).collect::<Vec<_>>())
                && spread.iter().all(|s| (100..120).contains(s)),
            "seed {seed}: {spread:?}"
        );
        assert_eq!(by_era(3), (200..205).collect::<Vec<_>>(), "seed {seed}");
    }
}

/// `append_batch` is atomic per partition, and a windowed key's batch spans
/// its lanes' partitions. When the later window's partition took its part
/// and the earlier window's failed (an I/O error), `PartialBatch` named the
/// later record as landed; appending the rest again, as the error says,
/// put the earlier record after it (its timestamp is raised to the key's
/// newest, so it joins the later window): the key reader returned the
/// batch's two records in the opposite order. A strict key cannot see this
/// (its records of a batch are in one partition, all or none). Now the
/// key's records are written lane after lane in input order and the writes
/// stop at the first error, so only a first part of the key's records can
/// have landed.
///
/// Reproduction: 2 partitions of 4 KiB segments, `HOT` windowed over 2
/// lanes (one per partition); the lane partition of window `wA` (the
/// higher id, whose group was written after the lower one's) filled so
/// that its next batch must roll, and its segment creation failing once;
/// `append_batch([HOT at wA, HOT at wA + 1])` landed only the second;
/// appending the first again; `read_key` gave second, first.
#[test]
fn a_partial_batch_of_a_windowed_key_retried_keeps_the_batch_order() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let hook = ModelHook::new(dir.path(), None);
    let log = Log::open_with_hook(dir.path(), opts(), hook.clone()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                segment_bytes: 4096,
                ..config(2, true, false)
            },
        )
        .unwrap();
    topic.set_hot_key_mode_lanes(HOT, W100, 2).unwrap();
    let era = topic.key_lanes(HOT).eras.pop().unwrap();
    let lane_part: Vec<u32> = era
        .lanes
        .iter()
        .map(|l| l.chain.last().unwrap().partition)
        .collect();
    assert_ne!(lane_part[0], lane_part[1], "one lane per partition");
    let first = era.first_window.unwrap();
    // Window A goes to the lane of the higher partition id (its group is
    // written after the lower one's).
    let high = *lane_part.iter().max().unwrap();
    let j = lane_part.iter().position(|&p| p == high).unwrap() as i64;
    let wa = first + 10 + j;
    let (ta, tb) = (wa * 100, wa * 100 + 100);
    // Fill the high partition so that one more record of this shape rolls.
    let part = topic.partition(high).unwrap();
    let filler = |ts: i64| NewRecord {
        key: Some(b"the-hot-kez"),
        value: b"x",
        timestamp: Some(ts),
    };
    let data = |p: &fissionlog::Partition| p.segment_infos().last().unwrap().data_bytes;
    let before = data(&part);
    topic.append_to(high, &[filler(ta)]).unwrap();
    let d = data(&part) - before;
    while 4096 - 64 - data(&part) >= d {
        topic.append_to(high, &[filler(ta)]).unwrap();
    }
    assert_eq!(part.segment_count(), 1);
    let failed = Arc::new(AtomicBool::new(false));
    {
        let failed = failed.clone();
        let p = format!("/p{high}/");
        hook.set_fault(Some(Box::new(move |op, path| {
            if op == fissionlog::IoOp::CreateSegment
                && path.to_string_lossy().contains(&p)
                && !failed.swap(true, Ordering::SeqCst)
            {
                return Err(std::io::Error::other("injected: no segment"));
            }
            Ok(())
        })));
    }
    let (a, b) = (b"1".to_vec(), b"2".to_vec());
    let batch = [
        NewRecord {
            key: Some(HOT),
            value: &a,
            timestamp: Some(ta),
        },
        NewRecord {
            key: Some(HOT),
            value: &b,
            timestamp: Some(tb),
        },
    ];
    let r = topic.append_batch(&batch);
    assert!(failed.load(Ordering::SeqCst), "the roll was attempted");
    hook.set_fault(None);
    // The first record's write failed: the second, after it in the key's
    // order, did not land either.
    let landed = retry_rest(&topic, &batch, r);
    assert_eq!(landed, vec![false, false]);
    assert_eq!(seqs(&topic.read_key(HOT).unwrap()), vec![1, 2]);
    assert_windowed_order(&topic, HOT, &[b"1", b"2"]);
}

/// Where each value of the topic is (partition, offset), read from the
/// earliest.
fn positions(topic: &Topic) -> BTreeMap<Vec<u8>, Vec<(u32, u64)>> {
    let mut r = topic.reader(fissionlog::StartAt::Earliest).unwrap();
    let mut out: BTreeMap<Vec<u8>, Vec<(u32, u64)>> = BTreeMap::new();
    loop {
        let got = r.poll(1000).unwrap();
        if got.is_empty() {
            return out;
        }
        for rec in got {
            out.entry(rec.value)
                .or_default()
                .push((rec.partition, rec.offset));
        }
    }
}

/// After `append_batch(recs)` returned `r` (an error: a fault was
/// injected), appends again, as one batch, the records the error does not
/// name as landed (all of them unless it is `PartialBatch`), after checking
/// that each named record is at the position named and no other is in the
/// topic (values are unique). Returns which records had landed.
fn retry_rest(
    topic: &Topic,
    recs: &[NewRecord<'_>],
    r: fissionlog::Result<Vec<fissionlog::Appended>>,
) -> Vec<bool> {
    let landed = match r {
        Err(Error::PartialBatch { landed, .. }) => landed,
        Err(_) => vec![None; recs.len()],
        Ok(a) => panic!("the injected fault failed no write: {a:?}"),
    };
    assert_eq!(landed.len(), recs.len());
    let at = positions(topic);
    for (rec, l) in recs.iter().zip(&landed) {
        let found = at.get(rec.value).cloned().unwrap_or_default();
        let named: Vec<(u32, u64)> = l.iter().map(|a| (a.partition, a.offset)).collect();
        assert_eq!(found, named, "{:?}", String::from_utf8_lossy(rec.value));
    }
    let rest: Vec<NewRecord<'_>> = recs
        .iter()
        .zip(&landed)
        .filter(|(_, l)| l.is_none())
        .map(|(r, _)| *r)
        .collect();
    if !rest.is_empty() {
        topic.append_batch(&rest).unwrap();
    }
    landed.iter().map(Option::is_some).collect()
}

/// `key` (windowed) reads back as `want`, each record in the lane of its
/// window and in a partition of that lane's chain, windows never going
/// back, and a window's records in one partition in offset order.
fn assert_windowed_order(topic: &Topic, key: &[u8], want: &[&[u8]]) {
    let recs = topic.read_key(key).unwrap();
    let got: Vec<&[u8]> = recs.iter().map(|r| &r.value[..]).collect();
    assert_eq!(got, want, "{}", String::from_utf8_lossy(key));
    let lanes = topic.key_lanes(key);
    for r in &recs {
        let era = &lanes.eras[r.era];
        let w = r.window.expect("a windowed record");
        assert_eq!(era.window_of(r.timestamp), Some(w));
        assert_eq!(era.lane_of_window(w), Some(r.lane));
        assert!(
            era.lanes[r.lane]
                .chain
                .iter()
                .any(|c| c.partition == r.partition),
            "{r:?}"
        );
    }
    for p in recs.windows(2) {
        assert!(p[0].window <= p[1].window, "{p:?}");
        if p[0].window == p[1].window && p[0].partition == p[1].partition {
            assert!(p[0].offset < p[1].offset, "{p:?}");
        }
    }
}

/// Fails the next creation of a segment of partition `id`, once; the flag
/// says whether it happened.
fn fail_next_roll(hook: &ModelHook, id: u32) -> std::sync::Arc<AtomicBool> {
    let failed = std::sync::Arc::new(AtomicBool::new(false));
    let f = failed.clone();
    let p = format!("/p{id}/");
    hook.set_fault(Some(Box::new(move |op, path| {
        if op == fissionlog::IoOp::CreateSegment
            && path.to_string_lossy().contains(&p)
            && !f.swap(true, Ordering::SeqCst)
        {
            return Err(std::io::Error::other("injected: no segment"));
        }
        Ok(())
    })));
    failed
}

/// Two windowed keys whose window orders over the same two partitions
/// conflict within one batch (`X`: partition `lo`, then `hi`; `Y`: `hi`,
/// then `lo`), with a strict key's records in between. No order of whole
/// per-partition groups satisfies both keys, so each key's records must be
/// written in its order and the writes stop at the first error. A write
/// failing in either partition, on the batch's first or second write there:
/// the error names exactly what landed, each windowed key's landed records
/// are its first ones, the strict key's are all or none (in one partition),
/// and after appending the rest again both keys read back in batch order,
/// each record in its window's lane.
///
/// Written as one group per partition (`lo`: X0 and Y1; `hi`: Y0 and X1),
/// a failure in `hi` landed Y1 and not Y0: the retry read back Y1, Y0.
#[test]
fn conflicting_window_orders_of_two_keys_in_one_batch_survive_a_failure_on_either_side() {
    const X: &[u8] = b"key-x";
    const Y: &[u8] = b"key-y";
    const S: &[u8] = b"key-s";
    let mut partial = 0;
    for (side, second) in [("lo", false), ("hi", false), ("lo", true), ("hi", true)] {
        let case = format!("fail {side}, second write: {second}");
        let dir = tempfile::tempdir().unwrap();
        let hook = ModelHook::new(dir.path(), None);
        let log = Log::open_with_hook(dir.path(), opts(), hook.clone()).unwrap();
        let topic = log
            .create_topic(
                "t",
                TopicConfig {
                    segment_bytes: 4096,
                    ..config(2, true, false)
                },
            )
            .unwrap();
        let mut ids = topic.active_partitions();
        ids.sort_unstable();
        let (lo, hi) = (ids[0], ids[1]);
        // The first window (≥ T0's) of `key` whose lane is in `first`.
        let window_in = |key: &[u8], first: u32| -> i64 {
            topic.set_hot_key_mode_lanes(key, W100, 2).unwrap();
            let era = topic.key_lanes(key).eras.pop().unwrap();
            let part: Vec<u32> = era
                .lanes
                .iter()
                .map(|l| l.chain.last().unwrap().partition)
                .collect();
            assert_ne!(part[0], part[1], "{case}: one lane per partition");
            let w0 = T0 / 100;
            (w0..w0 + 2)
                .find(|&w| part[era.lane_of_window(w).unwrap()] == first)
                .unwrap()
        };
        let wx = window_in(X, lo);
        let wy = window_in(Y, hi);
        let s_part = topic.route(S);
        let ts = |w: i64| Some(w * 100);
        let batch = [
            NewRecord {
                key: Some(X),
                value: b"x0",
                timestamp: ts(wx),
            },
            NewRecord {
                key: Some(S),
                value: b"s0",
                timestamp: None,
            },
            NewRecord {
                key: Some(Y),
                value: b"y0",
                timestamp: ts(wy),
            },
            NewRecord {
                key: Some(X),
                value: b"x1",
                timestamp: ts(wx + 1),
            },
            NewRecord {
                key: Some(S),
                value: b"s1",
                timestamp: None,
            },
            NewRecord {
                key: Some(Y),
                value: b"y1",
                timestamp: ts(wy + 1),
            },
        ];
        let target = if side == "lo" { lo } else { hi };
        // The batch's first write to `target`: the windowed key's record
        // whose first window is there, and the strict key's two if they
        // are there too.
        let first = if !second {
            0
        } else if s_part == target {
            3
        } else {
            1
        };
        fill_until(
            &topic,
            target,
            first,
            NewRecord {
                key: Some(b"fill!"),
                value: b"ff",
                timestamp: Some(T0),
            },
        );
        let failed = fail_next_roll(&hook, target);
        let r = topic.append_batch(&batch);
        assert!(
            failed.load(Ordering::SeqCst),
            "{case}: the roll was attempted"
        );
        hook.set_fault(None);
        let landed = retry_rest(&topic, &batch, r);
        if landed.iter().any(|&l| l) {
            partial += 1;
        }
        // Per windowed key, what landed is a first part of its records.
        for idx in [[0, 3], [2, 5]] {
            assert!(
                landed[idx[0]] || !landed[idx[1]],
                "{case}: a later record landed without an earlier one: {landed:?}"
            );
        }
        assert_eq!(landed[1], landed[4], "{case}: the strict key, all or none");
        if second {
            // The first write there took its part; the second failed.
            let (took, failed) = if target == lo { (0, 5) } else { (2, 3) };
            assert!(landed[took] && !landed[failed], "{case}: {landed:?}");
            assert!(landed[1], "{case}: {landed:?}");
        } else if s_part == target {
            assert!(!landed[1], "{case}: the strict key's partition failed");
        }
        assert_windowed_order(&topic, X, &[b"x0", b"x1"]);
        assert_windowed_order(&topic, Y, &[b"y0", b"y1"]);
        let s: Vec<Vec<u8>> = topic
            .read_key(S)
            .unwrap()
            .into_iter()
            .map(|r| r.value)
            .collect();
        assert_eq!(s, vec![b"s0".to_vec(), b"s1".to_vec()], "{case}");
        // The same after a reopen.
        log.close().unwrap();
        let log = Log::open(dir.path(), opts()).unwrap();
        let topic = log.topic("t").unwrap();
        assert_windowed_order(&topic, X, &[b"x0", b"x1"]);
        assert_windowed_order(&topic, Y, &[b"y0", b"y1"]);
    }
    assert!(
        partial >= 2,
        "some cases landed part of the batch: {partial}"
    );
}

/// A spread key promises no order, but `PartialBatch` still names exactly
/// what landed: its records round-robin over two lanes (one per partition)
/// with one partition's write failing, the error names the other
/// partition's records at their positions, nothing else of the batch is in
/// the topic, and appending the rest again leaves every record once.
#[test]
fn a_partial_batch_of_a_spread_key_names_exactly_what_landed() {
    for fail_hi in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let hook = ModelHook::new(dir.path(), None);
        let log = Log::open_with_hook(dir.path(), opts(), hook.clone()).unwrap();
        let topic = log
            .create_topic(
                "t",
                TopicConfig {
                    segment_bytes: 4096,
                    ..config(2, false, true)
                },
            )
            .unwrap();
        topic
            .set_hot_key_mode_lanes(HOT, HotKeyMode::Spread, 2)
            .unwrap();
        let mut ids = topic.active_partitions();
        ids.sort_unstable();
        let target = if fail_hi { ids[1] } else { ids[0] };
        fill_until(
            &topic,
            target,
            0,
            NewRecord {
                key: Some(b"the-hot-kez"),
                value: b"ff",
                timestamp: Some(T0),
            },
        );
        let vals: Vec<Vec<u8>> = (10..16).map(|i| i.to_string().into_bytes()).collect();
        let batch: Vec<NewRecord<'_>> = vals
            .iter()
            .map(|v| NewRecord {
                key: Some(HOT),
                value: v,
                timestamp: Some(T0),
            })
            .collect();
        let failed = fail_next_roll(&hook, target);
        let r = topic.append_batch(&batch);
        assert!(failed.load(Ordering::SeqCst), "the roll was attempted");
        hook.set_fault(None);
        let landed = retry_rest(&topic, &batch, r);
        // Round-robin over the two lanes: half the records went to the
        // failed partition.
        assert_eq!(
            landed.iter().filter(|&&l| l).count(),
            if fail_hi { 3 } else { 0 },
            "{landed:?}"
        );
        let mut got = seqs(&topic.read_key(HOT).unwrap());
        got.sort_unstable();
        assert_eq!(got, (10..16).collect::<Vec<_>>());
    }
}

/// Appenders of the key (single records and batches), mode changes and
/// splits and merges of the lane owners, all at once: no deadlock, every
/// acknowledged record comes back once, each appender's records in its
/// order outside spread eras, and the same after a reopen.
#[test]
fn appends_mode_changes_splits_and_merges_race() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.create_topic("t", config(2, true, true)).unwrap();
    let stop = AtomicBool::new(false);
    // Mode changes wait for appends between them (not for a timer).
    let progress = Progress::new(2);
    let counts: Vec<u64> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (topic, stop, progress) = (&topic, &stop, &progress);
                s.spawn(move || {
                    let mut seq = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let v = |q: u64| [w.to_le_bytes(), q.to_le_bytes()].concat();
                        if w == 0 {
                            topic.append(Some(HOT), &v(seq)).unwrap();
                            seq += 1;
                        } else {
                            let vals: Vec<Vec<u8>> = (seq..seq + 4).map(v).collect();
                            let recs: Vec<NewRecord<'_>> = vals
                                .iter()
                                .map(|x| NewRecord {
                                    key: Some(HOT),
                                    value: x,
                                    timestamp: None,
                                })
                                .collect();
                            match topic.append_batch(&recs) {
                                Ok(_) => seq += 4,
                                Err(Error::Refused(_)) => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                        progress.appended(w as usize, seq);
                    }
                    seq
                })
            })
            .collect();
        let topo = {
            let (topic, stop) = (&topic, &stop);
            s.spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let act = topic.active_partitions();
                    let p = act[i % act.len()];
                    if let Ok(kids) = topic.split(p, fissionlog::SplitPlan::Even) {
                        std::thread::sleep(Duration::from_millis(3));
                        let _ = topic.merge(kids[0], kids[1]);
                    }
                    i += 1;
                    std::thread::sleep(Duration::from_millis(3));
                }
            })
        };
        let modes = [
            HotKeyMode::Windowed(Duration::from_millis(1)),
            HotKeyMode::Spread,
            HotKeyMode::Windowed(Duration::from_millis(2)),
            HotKeyMode::Strict,
        ];
        for i in 0..12 {
            progress.wait_for_more(200, &stop);
            topic.set_hot_key_mode(HOT, modes[i % modes.len()]).unwrap();
        }
        progress.wait_for_more(200, &stop);
        stop.store(true, Ordering::Relaxed);
        topo.join().unwrap();
        writers.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let check = |topic: &Topic, case: &str| {
        let records = topic.read_key(HOT).unwrap();
        let lanes = topic.key_lanes(HOT);
        for (w, &n) in counts.iter().enumerate() {
            let mine: Vec<(usize, u64)> = records
                .iter()
                .filter(|r| r.value[..8] == (w as u64).to_le_bytes())
                .map(|r| {
                    (
                        r.era,
                        u64::from_le_bytes(r.value[8..16].try_into().unwrap()),
                    )
                })
                .collect();
            let mut all: Vec<u64> = mine.iter().map(|m| m.1).collect();
            all.sort_unstable();
            assert_eq!(all, (0..n).collect::<Vec<_>>(), "{case} writer {w}: once");
            let ordered: Vec<u64> = mine
                .iter()
                .filter(|m| lanes.eras[m.0].mode != HotKeyMode::Spread)
                .map(|m| m.1)
                .collect();
            assert!(
                ordered.windows(2).all(|p| p[0] < p[1]),
                "{case} writer {w}: order outside spread eras"
            );
        }
    };
    check(&topic, "live");
    log.close().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    check(&log.topic("t").unwrap(), "reopened");
}

/// A key of the form `{prefix}{n}` that `topic` routes to `partition`.
fn key_in(topic: &Topic, partition: u32, prefix: &str) -> Vec<u8> {
    (0..)
        .map(|n| format!("{prefix}{n}").into_bytes())
        .find(|k| topic.route(k) == partition)
        .unwrap()
}

/// A group refused as sealed (here: by the hot-key fence, which a mode
/// change of an unrelated key moved while the batch was being written)
/// holds back the batch's later rounds until it is re-routed and written:
/// had the windowed key's later window been written meanwhile, a failure
/// of the re-routed write would have left it landed without the earlier
/// one, and the retry the error asks for would read back out of order.
///
/// Two partitions `lo` < `hi`; `X` windowed over 2 lanes, window `wx` in
/// `hi`, `wx + 1` in `lo`; strict keys `Q` (in `hi`) and `Z` (in `lo`).
/// The batch `[X@wx, Q, Z, X@wx+1]` is written as `lo`{Z}, `hi`{X0, Q},
/// then `lo`{X1}. `lo`'s write rolls, and during the roll a mode change of
/// another key moves the fence: `hi`'s group (fenced, for `Q`) is refused
/// as sealed. Its re-routed write rolls `hi`, which fails.
#[test]
fn a_group_refused_as_sealed_holds_back_a_windowed_keys_later_window() {
    let dir = tempfile::tempdir().unwrap();
    let hook = std::sync::Arc::new(crate::common::faults::OnRoll::default());
    let log = Log::open_with_hook(dir.path(), opts(), hook.clone()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                segment_bytes: 4096,
                ..config(2, true, false)
            },
        )
        .unwrap();
    let mut ids = topic.active_partitions();
    ids.sort_unstable();
    let (lo, hi) = (ids[0], ids[1]);
    const X: &[u8] = b"key-x";
    topic.set_hot_key_mode_lanes(X, W100, 2).unwrap();
    let era = topic.key_lanes(X).eras.pop().unwrap();
    let part: Vec<u32> = era
        .lanes
        .iter()
        .map(|l| l.chain.last().unwrap().partition)
        .collect();
    let w0 = T0 / 100;
    let wx = (w0..w0 + 2)
        .find(|&w| part[era.lane_of_window(w).unwrap()] == hi)
        .unwrap();
    assert_eq!(part[era.lane_of_window(wx + 1).unwrap()], lo);
    let (q, z, m) = (
        key_in(&topic, hi, "q"),
        key_in(&topic, lo, "z"),
        key_in(&topic, hi, "m"),
    );
    let like = |key: &'static [u8]| NewRecord {
        key: Some(key),
        value: b"ff",
        timestamp: Some(T0),
    };
    fill_until(&topic, lo, 0, like(b"fill"));
    fill_until(&topic, hi, 0, like(b"fill"));
    // Nothing dirty: the mode change's sync round has no partition to
    // capture (`lo`'s writer is held by the roll it runs in). Twice: a
    // round leaves what it synced dirty for the next one's checkpoint.
    topic.sync().unwrap();
    topic.sync().unwrap();
    {
        let topic = topic.clone();
        hook.at(lo, move || {
            topic.set_hot_key_mode_lanes(&m, W100, 1).unwrap();
            Ok(())
        });
    }
    hook.at(hi, || Err(std::io::Error::other("injected: no segment")));
    let ts = |w: i64| Some(w * 100);
    let batch = [
        NewRecord {
            key: Some(X),
            value: b"x0",
            timestamp: ts(wx),
        },
        NewRecord {
            key: Some(&q),
            value: b"q0",
            timestamp: None,
        },
        NewRecord {
            key: Some(&z),
            value: b"z0",
            timestamp: None,
        },
        NewRecord {
            key: Some(X),
            value: b"x1",
            timestamp: ts(wx + 1),
        },
    ];
    let r = topic.append_batch(&batch);
    assert_eq!(hook.pending(), 0, "both rolls were attempted: {r:?}");
    let landed = retry_rest(&topic, &batch, r);
    assert_eq!(landed, vec![false, false, true, false]);
    assert_windowed_order(&topic, X, &[b"x0", b"x1"]);
}
