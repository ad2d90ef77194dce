//! Building a small log, damaging its files, and opening it in every
//! recovery mode.

use super::*;

/// Builds a small log from the input's first bytes (topics, appends, syncs,
/// rolls, a split; then a clean close or an abandon). Returns the model.
pub(super) fn build_log(dir: &Path, inp: &mut Input<'_>) -> Model {
    let flags = inp.u8();
    let topics = 1 + usize::from(flags & 1);
    let segment_bytes = [4096u64, 8192, 16384, 4096][usize::from((flags >> 1) & 3)];
    let clean = flags & 8 == 0;
    let log = Log::open(dir, options(RecoveryMode::Strict, true)).expect("creating a log");
    let handles: Vec<Topic> = (0..topics)
        .map(|t| {
            let cfg = TopicConfig {
                partitions: 1 + u32::from((flags >> 4) & 1),
                segment_bytes,
                index_interval_bytes: 256,
                ..Default::default()
            };
            log.create_topic(&format!("t{t}"), cfg)
                .expect("creating a topic")
        })
        .collect();
    let mut model = Model::new();
    let n_ops = inp.u8() % 24;
    let mut seq = 0u64;
    for _ in 0..n_ops {
        let op = inp.u8();
        let arg = inp.u8();
        let topic = &handles[usize::from(op >> 7) % topics];
        let active = topic.active_partitions();
        let pid = active[usize::from(arg) % active.len()];
        match op % 8 {
            0..=3 => {
                let count = 1 + usize::from(op >> 4 & 3);
                append_batch(topic, pid, count, arg, seq, &mut model);
                seq += count as u64;
            }
            4 | 5 => log.sync().expect("sync"),
            6 => topic
                .partition(pid)
                .and_then(|p| p.roll_now())
                .expect("roll"),
            _ => {
                // A forward split: no data moves, the parent keeps its records.
                match topic.split(pid, SplitPlan::Even) {
                    Ok(_) | Err(Error::Refused(_)) => {}
                    Err(e) => panic!("split failed: {e}"),
                }
            }
        }
    }
    if clean {
        log.close().expect("clean close");
    } else {
        log.abandon();
    }
    model
}

/// Appends `count` keyed records (sequence numbers from `seq`, key and
/// size from `arg`) to partition `pid` as one batch, and to the model.
fn append_batch(topic: &Topic, pid: u32, count: usize, arg: u8, seq: u64, model: &mut Model) {
    let values: Vec<Vec<u8>> = (0..count)
        .map(|i| value_for(seq + i as u64, usize::from(arg) * 3 % 700))
        .collect();
    let keys: Vec<Vec<u8>> = (0..count)
        .map(|i| vec![b'k', (arg >> 4) + i as u8])
        .collect();
    let recs: Vec<NewRecord<'_>> = (0..count)
        .map(|i| NewRecord {
            key: Some(&keys[i]),
            value: &values[i],
            timestamp: Some(1_000 + (seq + i as u64) as i64),
        })
        .collect();
    let base = topic
        .append_to(pid, &recs)
        .expect("appending to a fresh log");
    let m = model.entry((topic.name().to_string(), pid)).or_default();
    assert_eq!(
        base,
        m.len() as u64,
        "append landed at an unexpected offset"
    );
    for i in 0..count {
        m.push((
            Some(keys[i].clone()),
            values[i].clone(),
            1_000 + (seq + i as u64) as i64,
        ));
    }
}

/// Applies the input's mutations to the files of `dir`: byte flips,
/// truncations and deletions.
pub(super) fn mutate(dir: &Path, inp: &mut Input<'_>) {
    let n = inp.u8() % 8;
    for _ in 0..n {
        let files = list_files(dir);
        if files.is_empty() {
            return;
        }
        let kind = inp.u8();
        let file = dir.join(&files[usize::from(inp.u8()) % files.len()]);
        let at = u64::from(inp.u16());
        let byte = inp.u8();
        let Ok(mut bytes) = std::fs::read(&file) else {
            continue;
        };
        match kind % 8 {
            0..=4 => {
                // Flip bits where the data is (headers and the first batches).
                if !bytes.is_empty() {
                    let i = at as usize % bytes.len().min(2048);
                    bytes[i] ^= byte.max(1);
                    let _ = std::fs::write(&file, &bytes);
                }
            }
            5 | 6 => {
                let len = if bytes.is_empty() {
                    0
                } else {
                    at % (bytes.len() as u64)
                };
                if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&file) {
                    let _ = f.set_len(len);
                }
            }
            _ => {
                let _ = std::fs::remove_file(&file);
            }
        }
    }
}

/// Open a mutated copy of a small log in every recovery mode: no panic, no
/// phantom record (C2), a prefix in strict/truncate mode (C3), agreement
/// between modes, with `verify`, and on a second open (C7).
pub fn check_log_recovery(data: &[u8]) {
    let mut inp = Input::new(data);
    let original = ScratchDir::new("recovery");
    let model = build_log(original.path(), &mut inp);
    mutate(original.path(), &mut inp);
    let verified = crate::log::verify(original.path());
    let mut strict: Option<BTreeMap<(String, u32), PartitionRead>> = None;
    for mode in MODES {
        let copy = ScratchDir::new("recovery-copy");
        copy_dir(original.path(), copy.path());
        let log = match Log::open(copy.path(), options(mode, false)) {
            Ok(log) => log,
            Err(e) => {
                assert!(
                    strict.is_none(),
                    "{mode:?} open fails where strict open succeeded: {e}"
                );
                if mode == RecoveryMode::Strict {
                    if let Ok((_, problems)) = &verified {
                        assert!(
                            !problems.is_empty(),
                            "verify reports no problem but strict open fails: {e}"
                        );
                    }
                }
                continue;
            }
        };
        if std::env::var_os("FISSIONLOG_FUZZ_DEBUG").is_some() {
            eprintln!("{mode:?} open: {:#?}", log.recovery_report().files);
        }
        let read = read_everything(&log);
        check_against_model(&model, &read, mode);
        log.close()
            .unwrap_or_else(|e| panic!("{mode:?}: close after recovery: {e}"));
        if let Some(s) = &strict {
            check_agrees_with_strict(s, &read, mode);
        }
        check_second_open(copy.path(), &read, mode);
        if mode == RecoveryMode::Strict {
            strict = Some(read);
        }
    }
}

/// What a truncate or salvage open read, against a strict open that
/// succeeded: truncate reads the same, salvage at least as much.
fn check_agrees_with_strict(
    strict: &BTreeMap<(String, u32), PartitionRead>,
    read: &BTreeMap<(String, u32), PartitionRead>,
    mode: RecoveryMode,
) {
    if mode == RecoveryMode::Truncate {
        assert_eq!(
            strict, read,
            "truncate open returns other data than strict open"
        );
        return;
    }
    // Salvage keeps at least what strict keeps (it may keep segments that
    // strict drops as resurrected by a crash).
    for (k, sr) in strict {
        let have = read.get(k).map_or(&[][..], |r| &r.records[..]);
        for rec in &sr.records {
            assert!(
                have.contains(rec),
                "salvage drops {k:?} offset {} that strict keeps",
                rec.0
            );
        }
    }
}

/// Opening again changes nothing (C7). After truncation it needs no repair
/// mode; salvage leaves gaps between segments that only a salvage open
/// accepts (docs/TESTING.md, open findings).
fn check_second_open(
    dir: &Path,
    read: &BTreeMap<(String, u32), PartitionRead>,
    mode: RecoveryMode,
) {
    let again_mode = if mode == RecoveryMode::Salvage {
        mode
    } else {
        RecoveryMode::Strict
    };
    let again = Log::open(dir, options(again_mode, false))
        .unwrap_or_else(|e| panic!("{again_mode:?} reopen after a {mode:?} open fails: {e}"));
    let read_again = read_everything(&again);
    assert_eq!(
        read, &read_again,
        "second open after {mode:?} recovery returns other data"
    );
}

pub(super) fn check_against_model(
    model: &Model,
    read: &BTreeMap<(String, u32), PartitionRead>,
    mode: RecoveryMode,
) {
    for ((topic, pid), r) in read {
        let written = model
            .get(&(topic.clone(), *pid))
            .map_or(&[][..], Vec::as_slice);
        for (offset, rec) in &r.records {
            let w = usize::try_from(*offset).ok().and_then(|o| written.get(o));
            assert_eq!(
                w,
                Some(rec),
                "{mode:?}: {topic}/{pid} offset {offset} returns a record never written there (C2)"
            );
        }
        if mode != RecoveryMode::Salvage {
            // Truncate cuts at the damage; offsets the checkpoint knew were
            // handed out beyond the cut read as one trailing hole (they are
            // never handed out again). Strict has no holes.
            let cut = r.holes.first().map(|h| h.0);
            if cut.is_some() {
                assert_eq!(mode, RecoveryMode::Truncate, "holes in {mode:?} mode");
                for w in r.holes.windows(2) {
                    assert_eq!(w[0].1, w[1].0, "{mode:?}: holes are not one trailing range");
                }
                assert!(
                    r.holes.last().is_some_and(|h| h.1 == r.end),
                    "{mode:?}: {topic}/{pid} records follow the truncation hole {:?}",
                    r.holes
                );
            }
            let stop = r.stopped_at.or(cut).unwrap_or(r.end);
            let offsets: Vec<u64> = r.records.iter().map(|(o, _)| *o).collect();
            let expect: Vec<u64> = (r.start..stop).collect();
            assert_eq!(
                offsets, expect,
                "{mode:?}: {topic}/{pid} records are not a contiguous run (C3)"
            );
        }
    }
}
