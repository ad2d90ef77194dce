//! Salvage across a missing segment persists the hole: the next open, in
//! any mode, finds a continuous chain and reads of the lost range keep
//! returning `Error::Hole`.

use fissionlog::{Error, Log, LogOptions, RecoveryMode, TopicConfig};

fn segment_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let pdir = dir.join("topics/t0/p0");
    let mut v: Vec<_> = std::fs::read_dir(pdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

#[test]
fn salvaged_gap_survives_a_strict_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let opts = |mode| LogOptions {
        recovery: mode,
        balancer: false,
        ..LogOptions::default()
    };
    {
        let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
        let t = log
            .create_topic(
                "g",
                TopicConfig {
                    segment_bytes: 4096,
                    ..TopicConfig::default()
                },
            )
            .unwrap();
        for i in 0..200u32 {
            t.append_to(
                0,
                &[fissionlog::NewRecord {
                    key: None,
                    value: &i.to_le_bytes(),
                    timestamp: None,
                }],
            )
            .unwrap();
        }
        log.close().unwrap();
    }
    let segs = segment_files(dir.path());
    assert!(segs.len() >= 3, "{segs:?}");
    let victim = segs[1].clone();
    let lost_start: u64 = victim
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let lost_end: u64 = segs[2]
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    std::fs::remove_file(&victim).unwrap();

    assert!(matches!(
        Log::open(dir.path(), opts(RecoveryMode::Strict)),
        Err(Error::Corruption { .. })
    ));
    {
        let log = Log::open(dir.path(), opts(RecoveryMode::Salvage)).unwrap();
        assert!(log
            .recovery_report()
            .holes
            .iter()
            .any(|h| h.offsets.start == lost_start && h.offsets.end == lost_end));
        log.close().unwrap();
    }
    // The hole is on disk now: a strict open accepts the chain.
    let log = Log::open(dir.path(), opts(RecoveryMode::Strict)).unwrap();
    let t = log.topic("g").unwrap();
    for off in 0..200u64 {
        match t.read(0, off, 1) {
            Ok(b) => {
                assert!(
                    !(lost_start..lost_end).contains(&off),
                    "offset {off} was lost"
                );
                let r = b.iter().next().unwrap();
                assert_eq!(r.value, (off as u32).to_le_bytes());
            }
            Err(Error::Hole { start, end, .. }) => {
                assert!(
                    (lost_start..lost_end).contains(&off),
                    "offset {off} is not in the hole"
                );
                assert_eq!(
                    (start.max(lost_start), end),
                    (off.max(lost_start), lost_end)
                );
            }
            Err(e) => panic!("offset {off}: {e}"),
        }
    }
    let (_, problems) = {
        drop(t);
        log.close().unwrap();
        fissionlog::verify(dir.path()).unwrap()
    };
    assert!(problems.is_empty(), "{problems:?}");
}
