//! `Topic::append_batch` writing windowed keys' records in rounds
//! (docs/HOT_KEYS.md, "Batches of a windowed key"): generated batches mixing
//! windowed keys (conflicting lane orders, a key coming back to a lane),
//! strict, spread and keyless records, with a segment creation failing in
//! one partition, a hot-key mode change (the fence), a split or a merge landing
//! during another partition's roll, under `SyncPolicy::Never` and `Always`.
//! Each case checks that the error names exactly what landed, that a
//! windowed key's landed records are its first ones and a strict key's are
//! all or none, and that after appending the rest again every record is
//! there once, in per-key (strict) and per-window (windowed) order, also
//! after a reopen and after a power loss.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::crash::{CrashOptions, SplitMix64};
use common::faults::{Both, OnRoll};
use common::hot::{config, fill_until, opts, T0, W100};
use common::model_hook::ModelHook;
use fissionlog::{
    Appended, Error, HotKeyMode, IoOp, Log, NewRecord, SplitPlan, SyncPolicy, Topic, TopicConfig,
};

/// Keys of the batches (all of one length, so records are of one size).
const X: &[u8] = b"key-x"; // windowed, 2 lanes
const Y: &[u8] = b"key-y"; // windowed, 2 lanes
const Z: &[u8] = b"key-z"; // windowed, 3 lanes
const S: &[u8] = b"key-s"; // strict
const T: &[u8] = b"key-t"; // strict
const P: &[u8] = b"key-p"; // spread, 2 lanes
const WINDOWED: [&[u8]; 3] = [X, Y, Z];
const STRICT: [&[u8]; 2] = [S, T];

/// Where each value of the topic is, as its readers see it.
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

/// A key of the form `{prefix}{n}` that `topic` routes to `partition`.
fn key_in(topic: &Topic, partition: u32, prefix: &str) -> Vec<u8> {
    (0..)
        .map(|n| format!("{prefix}{n}").into_bytes())
        .find(|k| topic.route(k) == partition)
        .unwrap()
}

/// What disturbs the batch.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// The first segment creation of this partition fails; it is filled
    /// so that a batch of this many records still fits.
    Fail(u32, u64),
    /// During the first roll of `.0`, `.1` happens; then, optionally, the
    /// first segment creation of another partition fails (filled as in
    /// `Fail`).
    During(u32, Disturb, Option<(u32, u64)>),
}

#[derive(Clone, Copy, Debug)]
enum Disturb {
    /// A mode change of an unrelated key (moves the hot-key fence).
    Fence,
    /// A split of this partition.
    Split(u32),
    /// A merge of these two partitions.
    Merge(u32, u32),
    /// A strict key of the batch gets a mode over one lane (windowed, or
    /// spread): its records not yet written are refused (`Refused`, or
    /// `PartialBatch`), and appended again under the new mode.
    ModeOf(&'static [u8], bool),
}

/// The generated batch: per record (key, value, timestamp).
type Generated = (Option<&'static [u8]>, Vec<u8>, Option<i64>);

fn gen_batch(rng: &mut SplitMix64, n: usize) -> Vec<Generated> {
    let mut window: BTreeMap<&[u8], i64> = WINDOWED
        .iter()
        .map(|&k| (k, T0 / 100 + rng.below(3) as i64))
        .collect();
    (0..n)
        .map(|i| {
            let v = format!("{i:04}").into_bytes();
            let pick = rng.below(20);
            if pick < 10 {
                let k = WINDOWED[(pick % 3) as usize];
                let w = window.get_mut(k).unwrap();
                *w += [0, 0, 1, 1, 2][rng.below(5) as usize];
                (Some(k), v, Some(*w * 100 + rng.below(100) as i64))
            } else if pick < 15 {
                (Some(STRICT[(pick % 2) as usize]), v, Some(T0))
            } else if pick < 17 {
                (Some(P), v, Some(T0))
            } else {
                (None, v, Some(T0))
            }
        })
        .collect()
}

/// `key` (windowed) reads back as a subsequence of `order` (all of it when
/// `all`), each record in the lane of its window and in a partition of
/// that lane's chain, windows never going back.
fn check_windowed(topic: &Topic, key: &[u8], order: &[Vec<u8>], all: bool, case: &str) {
    let recs = topic.read_key(key).unwrap();
    let got: Vec<Vec<u8>> = recs.iter().map(|r| r.value.clone()).collect();
    check_in_order(&got, order, all, &format!("{case}: {}", show(key)));
    let lanes = topic.key_lanes(key);
    for r in &recs {
        let era = &lanes.eras[r.era];
        let w = r.window.expect("a windowed record");
        assert_eq!(era.window_of(r.timestamp), Some(w), "{case}");
        assert_eq!(era.lane_of_window(w), Some(r.lane), "{case}");
        assert!(
            era.lanes[r.lane]
                .chain
                .iter()
                .any(|c| c.partition == r.partition),
            "{case}: {r:?}"
        );
    }
    for p in recs.windows(2) {
        assert!(p[0].window <= p[1].window, "{case}: {p:?}");
    }
}

/// `got` is `order` (`all`) or a subsequence of it.
fn check_in_order(got: &[Vec<u8>], order: &[Vec<u8>], all: bool, what: &str) {
    if all {
        assert_eq!(got, order, "{what}");
        return;
    }
    let mut it = order.iter();
    for g in got {
        assert!(
            it.any(|o| o == g),
            "{what}: {:?} not in order {:?}",
            got.iter().map(|v| show(v)).collect::<Vec<_>>(),
            order.iter().map(|v| show(v)).collect::<Vec<_>>()
        );
    }
}

fn show(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// Every key's records of the batch read back in order (all of them when
/// `all`; else a subsequence, once each), and (when `all`) every value of
/// the batch is in the topic exactly once.
fn check_topic(topic: &Topic, batch: &[NewRecord<'_>], all: bool, case: &str) {
    let of = |k: &[u8]| -> Vec<Vec<u8>> {
        batch
            .iter()
            .filter(|r| r.key == Some(k))
            .map(|r| r.value.to_vec())
            .collect()
    };
    for k in WINDOWED {
        check_windowed(topic, k, &of(k), all, case);
    }
    for k in STRICT {
        let got: Vec<Vec<u8>> = topic
            .read_key(k)
            .unwrap()
            .into_iter()
            .map(|r| r.value)
            .collect();
        check_in_order(&got, &of(k), all, &format!("{case}: {}", show(k)));
        if !all {
            // One partition: what survives is a first part.
            assert_eq!(got[..], of(k)[..got.len()], "{case}: {}", show(k));
        }
    }
    let mut spread: Vec<Vec<u8>> = topic
        .read_key(P)
        .unwrap()
        .into_iter()
        .map(|r| r.value)
        .collect();
    spread.sort();
    let n = spread.len();
    spread.dedup();
    assert_eq!(spread.len(), n, "{case}: a spread record twice");
    let want: BTreeSet<Vec<u8>> = of(P).into_iter().collect();
    assert!(spread.iter().all(|v| want.contains(v)), "{case}");
    if all {
        assert_eq!(spread.len(), want.len(), "{case}");
    }
    let at = positions(topic);
    for r in batch {
        let n = at.get(r.value).map_or(0, Vec::len);
        if all {
            assert_eq!(n, 1, "{case}: {}", show(r.value));
        } else {
            assert!(n <= 1, "{case}: {} twice", show(r.value));
        }
    }
}

/// What one generated case saw.
struct Seen {
    /// Records of the batch that landed before the retry.
    landed: usize,
    /// The batch failed.
    failed: bool,
    /// It was refused for a mode change.
    refused: bool,
    /// Some of it landed in a partition made during the batch.
    rerouted: bool,
    /// I/O steps of the batch a power loss was checked at.
    points: usize,
}

/// One generated case; with `steps`, under `Always`, also a power loss at
/// every I/O step of the batch.
fn run_case(seed: u64, steps: bool) -> Seen {
    let mut rng = SplitMix64::new(seed);
    let always = rng.below(3) == 0 || steps;
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    // The crash model, plus one action per partition run (outside the
    // model's lock, so the I/O it causes goes through the model) at its
    // next roll.
    let hook = Arc::new(OnRoll::default());
    let both = Arc::new(Both::new(hook.clone(), model.clone()));
    // With steps, a checkpoint every sync round: the batch's I/O steps do
    // not depend on how long the case took.
    let options = fissionlog::LogOptions {
        checkpoint_interval: if steps {
            std::time::Duration::ZERO
        } else {
            opts().checkpoint_interval
        },
        ..opts()
    };
    let log = Log::open_with_hook(dir.path(), options, both).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                segment_bytes: 4096,
                sync: if always {
                    SyncPolicy::Always
                } else {
                    SyncPolicy::Never
                },
                ..config(3, true, true)
            },
        )
        .unwrap();
    topic.set_hot_key_mode_lanes(X, W100, 2).unwrap();
    topic.set_hot_key_mode_lanes(Y, W100, 2).unwrap();
    topic.set_hot_key_mode_lanes(Z, W100, 3).unwrap();
    topic
        .set_hot_key_mode_lanes(P, HotKeyMode::Spread, 2)
        .unwrap();
    let mut ids = topic.active_partitions();
    ids.sort_unstable();
    let n = 8 + rng.below(10) as usize;
    let owned = gen_batch(&mut rng, n);
    let batch: Vec<NewRecord<'_>> = owned
        .iter()
        .map(|(k, v, ts)| NewRecord {
            key: *k,
            value: v,
            timestamp: *ts,
        })
        .collect();
    let like = NewRecord {
        key: Some(b"fill!"),
        value: b"ffff",
        timestamp: Some(T0),
    };
    let pick = |rng: &mut SplitMix64| ids[rng.below(3) as usize];
    let plan = match rng.below(5) {
        0 | 1 => Plan::Fail(pick(&mut rng), rng.below(5)),
        k => {
            let (a, d) = if k == 4 {
                let key = STRICT[rng.below(2) as usize];
                let home = topic.route(key);
                let not_home: Vec<u32> = ids.iter().copied().filter(|&p| p != home).collect();
                let a = not_home[rng.below(2) as usize];
                (a, Disturb::ModeOf(key, rng.coin()))
            } else {
                let a = pick(&mut rng);
                let others: Vec<u32> = ids.iter().copied().filter(|&p| p != a).collect();
                let b = others[rng.below(2) as usize];
                let d = if k == 2 {
                    Disturb::Fence
                } else if a != ids[1] && rng.coin() {
                    // The other two are adjacent.
                    Disturb::Merge(others[0], others[1])
                } else {
                    Disturb::Split(b)
                };
                (a, d)
            };
            let others: Vec<u32> = ids.iter().copied().filter(|&p| p != a).collect();
            let fail = rng.coin().then(|| {
                let c = others[rng.below(2) as usize];
                (c, rng.below(4))
            });
            Plan::During(a, d, fail)
        }
    };
    let case = format!("seed {seed}, always {always}, plan {plan:?}, batch {owned:?}");
    let failed = Arc::new(AtomicBool::new(false));
    let fail_at = |c: u32, first: u64| {
        fill_until(&topic, c, first, like);
        let f = failed.clone();
        hook.at(c, move || {
            f.store(true, Ordering::SeqCst);
            Err(io::Error::other("injected: no segment"))
        });
    };
    match plan {
        Plan::Fail(c, first) => fail_at(c, first),
        Plan::During(a, d, fail) => {
            if let Some((c, first)) = fail {
                fail_at(c, first);
            }
            fill_until(&topic, a, 0, like);
            // Nothing dirty: the disturbance's sync round must not wait
            // for `a`, whose writer the roll holds.
            topic.sync().unwrap();
            topic.sync().unwrap();
            let t = topic.clone();
            match d {
                Disturb::Fence => {
                    let m = key_in(&topic, ids.iter().copied().find(|&p| p != a).unwrap(), "m");
                    hook.at(a, move || {
                        t.set_hot_key_mode_lanes(&m, W100, 1).unwrap();
                        Ok(())
                    });
                }
                Disturb::Split(b) => {
                    hook.at(a, move || {
                        t.split(b, SplitPlan::Even).unwrap();
                        Ok(())
                    });
                }
                Disturb::Merge(b, c) => {
                    hook.at(a, move || {
                        t.merge(b, c).unwrap();
                        Ok(())
                    });
                }
                Disturb::ModeOf(key, windowed) => {
                    let mode = if windowed { W100 } else { HotKeyMode::Spread };
                    hook.at(a, move || {
                        t.set_hot_key_mode_lanes(key, mode, 1).unwrap();
                        Ok(())
                    });
                }
            }
        }
    }
    model.grant_segment_headers(steps);
    model.record_steps(steps);
    let r = topic.append_batch(&batch);
    model.record_steps(false);
    hook.clear();
    let mut refused = false;
    let landed: Vec<Option<Appended>> = match r {
        Ok(a) => a.into_iter().map(Some).collect(),
        Err(Error::PartialBatch { landed, source }) => {
            refused = matches!(*source, Error::Refused(_));
            landed
        }
        Err(e) => {
            refused = matches!(e, Error::Refused(_));
            assert!(
                failed.load(Ordering::SeqCst) || refused,
                "{case}: an error with no fault: {e:?}"
            );
            vec![None; batch.len()]
        }
    };
    if refused {
        assert!(
            matches!(plan, Plan::During(_, Disturb::ModeOf(..), _)),
            "{case}: refused"
        );
    }
    let batch_failed = landed.iter().any(Option::is_none);
    // Re-routed to a partition made during the batch (a split's or a
    // merge's child).
    let rerouted = landed.iter().flatten().any(|a| !ids.contains(&a.partition));
    assert_eq!(landed.len(), batch.len(), "{case}");
    // Exactly what is named landed is in the topic, where named; under
    // `Always` also after a power loss right now.
    let named = |l: &Option<Appended>| -> Vec<(u32, u64)> {
        l.iter().map(|a| (a.partition, a.offset)).collect()
    };
    let at = positions(&topic);
    for (rec, l) in batch.iter().zip(&landed) {
        let found = at.get(rec.value).cloned().unwrap_or_default();
        assert_eq!(found, named(l), "{case}: {}", show(rec.value));
    }
    if always && batch_failed {
        let (img, _) = model.crash_image(seed, &CrashOptions::default());
        let lost = tempfile::tempdir().unwrap();
        img.write_to(lost.path()).unwrap();
        let log = Log::open(lost.path(), opts()).unwrap();
        let at = positions(&log.topic("t").unwrap());
        for (rec, l) in batch.iter().zip(&landed) {
            let found = at.get(rec.value).cloned().unwrap_or_default();
            assert_eq!(found, named(l), "{case}, power loss: {}", show(rec.value));
        }
    }
    let mut n_points = 0;
    if steps {
        let mut points = model.take_steps();
        n_points = points.len();
        points.push(model.now(IoOp::SyncSegment));
        let last = points.len() - 1;
        for (i, point) in points.iter().enumerate() {
            let (img, _) = point.image(seed + i as u64, &CrashOptions::default());
            let lost = tempfile::tempdir().unwrap();
            img.write_to(lost.path()).unwrap();
            let ctx = format!("{case}, power loss at step {i} ({:?})", point.op);
            let log = Log::open(lost.path(), opts()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let topic = log.topic("t").unwrap();
            check_topic(&topic, &batch, false, &ctx);
            if i == last {
                // Returned under `Always`: what it names is durable.
                let at = positions(&topic);
                for (rec, l) in batch.iter().zip(&landed) {
                    let found = at.get(rec.value).cloned().unwrap_or_default();
                    assert_eq!(found, named(l), "{ctx}: {}", show(rec.value));
                }
            }
        }
    }
    // A windowed key's landed records are its first ones; a strict key's
    // are all or none.
    for k in WINDOWED {
        let l: Vec<bool> = batch
            .iter()
            .zip(&landed)
            .filter(|(r, _)| r.key == Some(k))
            .map(|(_, l)| l.is_some())
            .collect();
        assert!(
            l.windows(2).all(|p| p[0] || !p[1]),
            "{case}: {}: {l:?}",
            show(k)
        );
    }
    for k in STRICT {
        let l: BTreeSet<bool> = batch
            .iter()
            .zip(&landed)
            .filter(|(r, _)| r.key == Some(k))
            .map(|(_, l)| l.is_some())
            .collect();
        assert!(l.len() <= 1, "{case}: {}", show(k));
    }
    let n_landed = landed.iter().filter(|l| l.is_some()).count();
    let rest: Vec<NewRecord<'_>> = batch
        .iter()
        .zip(&landed)
        .filter(|(_, l)| l.is_none())
        .map(|(r, _)| *r)
        .collect();
    if !rest.is_empty() {
        topic
            .append_batch(&rest)
            .unwrap_or_else(|e| panic!("{case}: retry: {e:?}"));
    }
    check_topic(&topic, &batch, true, &case);
    // A power loss now: under `Always` the retry's sync covered everything
    // (the batch's landed records too); otherwise each partition keeps a
    // prefix, and each key a part of its records in order.
    let (img, _) = model.crash_image(seed, &CrashOptions::default());
    let lost = tempfile::tempdir().unwrap();
    img.write_to(lost.path()).unwrap();
    {
        let log = Log::open(lost.path(), opts()).unwrap();
        let topic = log.topic("t").unwrap();
        check_topic(&topic, &batch, always, &format!("{case}, power loss"));
    }
    log.close().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.topic("t").unwrap();
    check_topic(&topic, &batch, true, &format!("{case}, reopened"));
    Seen {
        landed: n_landed,
        failed: batch_failed,
        refused,
        rerouted,
        points: n_points,
    }
}

/// Generated batches against every kind of disturbance: see the module
/// docs. Some cases must land part of the batch, so the probe can fail.
#[test]
fn generated_batches_with_failures_splits_and_fence_moves_keep_every_key_in_order() {
    let (mut partial, mut failed, mut refused, mut rerouted) = (0, 0, 0, 0);
    for seed in 0..48 {
        let seen = run_case(seed, false);
        refused += usize::from(seen.refused);
        rerouted += usize::from(seen.rerouted);
        if seen.failed {
            failed += 1;
            if seen.landed > 0 {
                partial += 1;
            }
        }
    }
    assert!(
        failed >= 10 && partial >= 5 && refused >= 1 && rerouted >= 3,
        "{failed} failed, {partial} partial, {refused} refused, {rerouted} re-routed"
    );
}

/// Generated cases under `SyncPolicy::Always` with a power loss at every
/// I/O step of the disturbed batch (its rolls, the split's, merge's or
/// mode change's syncs and commit, the batch's sync): each key's records
/// that survive are in order (a strict key's a first part), none twice,
/// and once the batch returned, every record it names is there.
#[test]
fn a_power_loss_at_every_step_of_a_disturbed_batch_keeps_each_key_in_order() {
    let points: usize = (100..106).map(|seed| run_case(seed, true).points).sum();
    // About 40 to 70 (group commit merges some rounds): enough that the
    // probe checked the batch's steps at all.
    assert!(points >= 12, "{points} steps");
}

/// Two partitions `lo` < `hi` of 4 KiB segments under `sync`, `hi` full
/// (its next batch rolls) and its segment creation failing once; a batch
/// of a strict key of each (values `va`, `vb`): `lo`'s group lands, `hi`'s
/// fails. Returns the log (open), its crash model and what the error names.
fn half_landed_batch(
    sync: SyncPolicy,
) -> (
    tempfile::TempDir,
    Log,
    Topic,
    Arc<ModelHook>,
    Vec<Option<Appended>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    let hook = Arc::new(OnRoll::default());
    let both = Arc::new(Both::new(hook.clone(), model.clone()));
    let log = Log::open_with_hook(dir.path(), opts(), both).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                segment_bytes: 4096,
                sync,
                ..config(2, false, false)
            },
        )
        .unwrap();
    let mut ids = topic.active_partitions();
    ids.sort_unstable();
    let (lo, hi) = (ids[0], ids[1]);
    let like = NewRecord {
        key: Some(b"fill!"),
        value: b"ffff",
        timestamp: Some(T0),
    };
    fill_until(&topic, hi, 0, like);
    topic.sync().unwrap();
    hook.at(hi, || Err(io::Error::other("injected: no segment")));
    let (a, b) = (key_in(&topic, lo, "a"), key_in(&topic, hi, "b"));
    let r = topic.append_batch(&[
        NewRecord {
            key: Some(&a),
            value: b"va",
            timestamp: None,
        },
        NewRecord {
            key: Some(&b),
            value: b"vb",
            timestamp: None,
        },
    ]);
    let landed = match r {
        Err(Error::PartialBatch { landed, .. }) => landed,
        other => panic!("{other:?}"),
    };
    assert!(landed[0].is_some() && landed[1].is_none(), "{landed:?}");
    (dir, log, topic, model, landed)
}

/// Under `SyncPolicy::Always` a batch returns only once its records are
/// durable (and the topic's readers, `ReadIsolation::Durable` by default,
/// see only durable records). A batch that fails part-way returns
/// `PartialBatch` naming the records that landed, which the caller does
/// not append again: those must be durable too, as a successful batch's
/// would be. They were not synced: the topic's readers did not see them,
/// and a power loss right after the error took them away.
///
/// Reproduction: `half_landed_batch(Always)`; a reader from the earliest
/// found nothing of the batch; a power-loss image taken right after the
/// error lost the record named as landed.
#[test]
fn a_partial_batch_under_sync_always_names_records_it_did_not_sync() {
    let (_dir, _log, topic, model, landed) = half_landed_batch(SyncPolicy::Always);
    let at = positions(&topic);
    let a = landed[0].unwrap();
    assert_eq!(
        at.get(&b"va"[..]).cloned().unwrap_or_default(),
        vec![(a.partition, a.offset)],
        "the record named as landed is visible to the topic's readers"
    );
    let (img, _) = model.crash_image(7, &CrashOptions::default());
    let lost = tempfile::tempdir().unwrap();
    img.write_to(lost.path()).unwrap();
    let log = Log::open(lost.path(), opts()).unwrap();
    let at = positions(&log.topic("t").unwrap());
    assert_eq!(
        at.get(&b"va"[..]).cloned().unwrap_or_default(),
        vec![(a.partition, a.offset)],
        "the record named as landed survives a power loss"
    );
}

/// Under `SyncPolicy::Always`, a batch whose groups were all written but
/// whose sync failed for one partition (poisoned) returned that partition's
/// error alone, as if nothing had landed, though the other partition's
/// records were durable: the caller, appending the batch again as the
/// error says, wrote them twice. The error must name what was written,
/// with the sync's error saying which partition's records may not be
/// durable.
///
/// Reproduction: two partitions `lo` < `hi` under `Always`, strict keys
/// `a` (in `lo`) and `b` (in `hi`); `hi`'s segment fdatasync failing;
/// `append_batch([a, b])` returned `Poisoned` (`hi`), with `a` durable in
/// `lo`.
#[test]
fn a_batch_whose_sync_fails_in_one_partition_names_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    let topic = log
        .create_topic(
            "t",
            TopicConfig {
                sync: SyncPolicy::Always,
                ..config(2, false, false)
            },
        )
        .unwrap();
    let mut ids = topic.active_partitions();
    ids.sort_unstable();
    let (lo, hi) = (ids[0], ids[1]);
    let (a, b) = (key_in(&topic, lo, "a"), key_in(&topic, hi, "b"));
    let p = format!("/p{hi}/");
    model.set_fault(Some(Box::new(move |op, path| {
        if op == IoOp::SyncSegment && path.to_string_lossy().contains(&p) {
            return Err(io::Error::other("injected: EIO"));
        }
        Ok(())
    })));
    let batch = [
        NewRecord {
            key: Some(&a),
            value: b"va",
            timestamp: None,
        },
        NewRecord {
            key: Some(&b),
            value: b"vb",
            timestamp: None,
        },
    ];
    let r = topic.append_batch(&batch);
    model.set_fault(None);
    let (landed, source) = match r {
        Err(Error::PartialBatch { landed, source }) => (landed, source),
        other => panic!("the error names nothing as landed: {other:?}"),
    };
    // Both were written; the error says whose sync failed.
    let at = landed[0].expect("the record synced in `lo` is named");
    assert_eq!(at.partition, lo);
    assert_eq!(landed[1].map(|a| a.partition), Some(hi));
    assert!(
        matches!(*source, Error::Poisoned { partition, .. } if partition == hi),
        "{source:?}"
    );
    // Named as landed: durable.
    let (img, _) = model.crash_image(3, &CrashOptions::default());
    let lost = tempfile::tempdir().unwrap();
    img.write_to(lost.path()).unwrap();
    let log = Log::open(lost.path(), opts()).unwrap();
    let found = positions(&log.topic("t").unwrap());
    assert_eq!(
        found.get(&b"va"[..]),
        Some(&vec![(at.partition, at.offset)])
    );
    // A batch all in one partition whose sync fails has nothing durable:
    // the sync's error alone, as for a single append.
    let p = format!("/p{lo}/");
    model.set_fault(Some(Box::new(move |op, path| {
        if op == IoOp::SyncSegment && path.to_string_lossy().contains(&p) {
            return Err(io::Error::other("injected: EIO"));
        }
        Ok(())
    })));
    let r = topic.append_batch(&batch[..1]);
    model.set_fault(None);
    assert!(
        matches!(r, Err(Error::Poisoned { partition, .. }) if partition == lo),
        "{r:?}"
    );
}

/// A batch refused as bad input writes nothing and changes nothing
/// (docs/ARCHITECTURE.md, "Appending a batch across partitions"). Routing
/// a windowed key's records raised the key's newest timestamp before the
/// checks, so a refused batch holding a far-future timestamp moved every
/// later record of the key to that time: the next record, appended at
/// `T0`, was stored (and windowed) at the refused record's timestamp.
///
/// Reproduction: `HOT` windowed over 2 lanes; `append_batch([HOT at
/// T0 + 1 day, a record over max_record_bytes])` is refused
/// (`RecordTooLarge`); `append_batch([HOT at T0])` stored it at T0 + 1 day.
/// A spread key's record in the refused batch likewise moved its next
/// record to its second lane.
#[test]
fn a_refused_batch_leaves_a_windowed_keys_timestamps_alone() {
    const HOT: &[u8] = b"the-hot-key";
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.create_topic("t", config(2, true, true)).unwrap();
    topic.set_hot_key_mode_lanes(HOT, W100, 2).unwrap();
    topic
        .set_hot_key_mode_lanes(P, HotKeyMode::Spread, 2)
        .unwrap();
    let big = vec![0u8; topic.config().max_record_bytes as usize + 1];
    let day = 86_400_000;
    let r = topic.append_batch(&[
        NewRecord {
            key: Some(HOT),
            value: b"far",
            timestamp: Some(T0 + day),
        },
        NewRecord {
            key: Some(P),
            value: b"p0",
            timestamp: None,
        },
        NewRecord {
            key: None,
            value: &big,
            timestamp: None,
        },
    ]);
    assert!(matches!(r, Err(Error::RecordTooLarge { .. })), "{r:?}");
    assert!(positions(&topic).is_empty(), "nothing written");
    topic
        .append_batch(&[NewRecord {
            key: Some(HOT),
            value: b"near",
            timestamp: Some(T0),
        }])
        .unwrap();
    let got = topic.read_key(HOT).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].timestamp, T0, "{:?}", got[0]);
    assert_eq!(got[0].window, Some(T0 / 100));
    // Nor does it move a spread key's round-robin: its first record goes
    // to its first lane.
    topic
        .append_batch(&[NewRecord {
            key: Some(P),
            value: b"p1",
            timestamp: None,
        }])
        .unwrap();
    let got = topic.read_key(P).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].lane, 0, "{:?}", got[0]);
}

/// A closed log, and a log poisoned by a failed mode change, refuse a
/// batch of windowed, strict and keyless records before writing any of it
/// (no `PartialBatch`), and the refusal moves no key's newest timestamp.
#[test]
fn a_closed_or_poisoned_log_refuses_a_windowed_batch_before_writing() {
    for poisoned in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let model = ModelHook::new(dir.path(), None);
        let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
        let topic = log.create_topic("t", config(3, true, true)).unwrap();
        topic.set_hot_key_mode_lanes(X, W100, 2).unwrap();
        topic.set_hot_key_mode_lanes(Z, W100, 3).unwrap();
        let ts = |w: i64| Some((T0 / 100 + w) * 100);
        let batch = [
            NewRecord {
                key: Some(X),
                value: b"x0",
                timestamp: ts(0),
            },
            NewRecord {
                key: Some(S),
                value: b"s0",
                timestamp: None,
            },
            NewRecord {
                key: Some(Z),
                value: b"z0",
                timestamp: ts(1),
            },
            NewRecord {
                key: None,
                value: b"n0",
                timestamp: None,
            },
            NewRecord {
                key: Some(X),
                value: b"x1",
                timestamp: ts(1000),
            },
            NewRecord {
                key: Some(Z),
                value: b"z1",
                timestamp: ts(2),
            },
        ];
        let r = if poisoned {
            model.set_fault(Some(Box::new(|op, _| {
                if op == IoOp::SyncManifest {
                    return Err(io::Error::other("injected: EIO"));
                }
                Ok(())
            })));
            assert!(topic.set_hot_key_mode_lanes(Y, W100, 2).is_err());
            model.set_fault(None);
            let r = topic.append_batch(&batch);
            assert!(matches!(r, Err(Error::LogPoisoned { .. })), "{r:?}");
            r
        } else {
            let t = topic.clone();
            log.close().unwrap();
            let r = t.append_batch(&batch);
            assert!(matches!(r, Err(Error::Closed)), "{r:?}");
            return_check(dir.path());
            continue;
        };
        drop(r);
        assert!(positions(&topic).is_empty(), "nothing written");
        drop(topic);
        drop(log);
        return_check(dir.path());
    }

    /// Reopened: nothing of the batch, and X's next record keeps its own
    /// timestamp (the refusal moved no window).
    fn return_check(dir: &Path) {
        let log = Log::open(dir, opts()).unwrap();
        let topic = log.topic("t").unwrap();
        assert!(positions(&topic).is_empty(), "nothing written");
        let ts = (T0 / 100 + 1) * 100;
        topic
            .append_batch(&[NewRecord {
                key: Some(X),
                value: b"x",
                timestamp: Some(ts),
            }])
            .unwrap();
        assert_eq!(topic.read_key(X).unwrap()[0].timestamp, ts);
    }
}

fn rec<'a>(key: Option<&'a [u8]>, value: &'a [u8], timestamp: Option<i64>) -> NewRecord<'a> {
    NewRecord {
        key,
        value,
        timestamp,
    }
}

/// How many on-disk batches hold the records at `[from, to)` of
/// `partition` (a read of one byte returns one whole batch).
fn batches_in(topic: &Topic, partition: u32, from: u64, to: u64) -> usize {
    let mut n = 0;
    let mut off = from;
    while off < to {
        off = topic.read(partition, off, 1).unwrap().next_offset();
        n += 1;
    }
    n
}

/// A batch with no windowed key is written as before the rounds: one
/// on-disk batch per partition, whatever its mix of strict, spread and
/// keyless records; so is a windowed key's batch that stays in one window.
/// A windowed key's batch that comes back to a lane's partition after
/// another lane takes one batch there per visit (rounds 0 and 2), and its
/// records read back in order.
#[test]
fn rounds_split_a_partitions_records_only_for_a_windowed_key_that_moves() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let topic = log.create_topic("t", config(2, true, true)).unwrap();
    let mut ids = topic.active_partitions();
    ids.sort_unstable();
    let (lo, hi) = (ids[0], ids[1]);
    topic
        .set_hot_key_mode_lanes(P, HotKeyMode::Spread, 2)
        .unwrap();
    topic.set_hot_key_mode_lanes(X, W100, 2).unwrap();
    let era = topic.key_lanes(X).eras.pop().unwrap();
    let lane_part: Vec<u32> = era
        .lanes
        .iter()
        .map(|l| l.chain.last().unwrap().partition)
        .collect();
    assert_ne!(lane_part[0], lane_part[1], "one lane per partition");
    let w0 = T0 / 100;
    let part_of = |w: i64| lane_part[era.lane_of_window(w).unwrap()];
    let (a, b) = (key_in(&topic, lo, "a"), key_in(&topic, hi, "b"));
    let ends = |t: &Topic| -> Vec<u64> {
        [lo, hi]
            .iter()
            .map(|&p| t.partition(p).unwrap().end_offset())
            .collect()
    };
    let (a, b): (&[u8], &[u8]) = (&a, &b);
    // No windowed key; then X within one window: one batch per partition.
    let one_window = Some(w0 * 100 + 5);
    for batch in [
        vec![
            rec(Some(a), b"a0", None),
            rec(Some(P), b"p0", None),
            rec(Some(b), b"b0", None),
            rec(None, b"n0", None),
            rec(Some(a), b"a1", None),
            rec(Some(P), b"p1", None),
            rec(Some(b), b"b1", None),
        ],
        vec![
            rec(Some(X), b"x0", one_window),
            rec(Some(a), b"a2", None),
            rec(Some(b), b"b2", None),
            rec(Some(X), b"x1", one_window),
            rec(Some(P), b"p2", None),
            rec(Some(X), b"x2", one_window),
        ],
    ] {
        let before = ends(&topic);
        topic.append_batch(&batch).unwrap();
        let after = ends(&topic);
        for (i, &p) in [lo, hi].iter().enumerate() {
            assert_eq!(batches_in(&topic, p, before[i], after[i]), 1, "{p}");
        }
    }
    // X in windows w, w + 1, w + 2: lanes p, q, p; with a strict key in p.
    let w = w0 + 1;
    let (p, q) = (part_of(w), part_of(w + 1));
    assert_eq!(part_of(w + 2), p);
    let s: &[u8] = if p == lo { a } else { b };
    let before = ends(&topic);
    topic
        .append_batch(&[
            rec(Some(X), b"x3", Some(w * 100)),
            rec(Some(s), b"s3", None),
            rec(Some(X), b"x4", Some((w + 1) * 100)),
            rec(Some(X), b"x5", Some((w + 2) * 100)),
            rec(Some(s), b"s4", None),
        ])
        .unwrap();
    let after = ends(&topic);
    let at = |id: u32| [lo, hi].iter().position(|&x| x == id).unwrap();
    assert_eq!(batches_in(&topic, p, before[at(p)], after[at(p)]), 2);
    assert_eq!(batches_in(&topic, q, before[at(q)], after[at(q)]), 1);
    let xs: Vec<Vec<u8>> = topic
        .read_key(X)
        .unwrap()
        .into_iter()
        .map(|r| r.value)
        .collect();
    let want: Vec<Vec<u8>> = ["x0", "x1", "x2", "x3", "x4", "x5"]
        .iter()
        .map(|v| v.as_bytes().to_vec())
        .collect();
    assert_eq!(xs, want);
}
