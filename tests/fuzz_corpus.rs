//! Replays the committed fuzz corpora (`fuzz/corpus/<target>/`) through the
//! check functions the fuzz targets call, plus seeded pseudo-random
//! variations of them, so a stable `cargo test` exercises every target.
//!
//! `FUZZ_CORPUS_CASES=N` changes the number of random inputs per target;
//! `cargo test --test fuzz_corpus -- --ignored generate_seed_corpus`
//! rewrites the seed files.

use std::path::{Path, PathBuf};

use fissionlog::internals::format::encode_header;
use fissionlog::internals::format::{batch_len, encode_batch, encode_hole, RecordIn};
use fissionlog::internals::format::{encode_batch_v2, ControlKind, EntryBody, RaftLogId};
use fissionlog::internals::format::{
    encode_checkpoint, Checkpoint, PartitionCheckpoint, WindowState,
};
use fissionlog::internals::fuzz_checks as fc;

type Check = fn(&[u8]);

const TARGETS: [(&str, Check, usize); 8] = [
    ("segment_scan", fc::check_segment_scan, 200),
    ("manifest_replay", fc::check_manifest_replay, 200),
    ("batch_decode", fc::check_batch_decode, 200),
    ("batch_v2", fc::check_batch_v2, 200),
    ("checkpoint_decode", fc::check_checkpoint_decode, 200),
    ("log_recovery", fc::check_log_recovery, 60),
    ("ops_model", fc::check_ops_model, 40),
    ("chain_repair", fc::check_chain_repair, 500),
];

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir(target))
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
        .into_iter()
        .filter(|p| p.is_file())
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect()
}

/// xorshift64*: deterministic, seeded.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A seed mutated the way libFuzzer would: byte flips, inserted and erased
/// ranges, truncation, or plain random bytes.
fn variant(rng: &mut Rng, seeds: &[(PathBuf, Vec<u8>)]) -> Vec<u8> {
    if seeds.is_empty() || rng.below(5) == 0 {
        let n = rng.below(512);
        return (0..n).map(|_| rng.next() as u8).collect();
    }
    let mut v = seeds[rng.below(seeds.len())].1.clone();
    for _ in 0..1 + rng.below(4) {
        match rng.below(5) {
            0 | 1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            2 => {
                let i = rng.below(v.len() + 1);
                let junk: Vec<u8> = (0..rng.below(48)).map(|_| rng.next() as u8).collect();
                v.splice(i..i, junk);
            }
            3 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = rng.below(v.len() - i + 1);
                v.drain(i..i + n);
            }
            _ => v.truncate(rng.below(v.len() + 1)),
        }
    }
    v
}

fn cases(default: usize) -> usize {
    std::env::var("FUZZ_CORPUS_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn run_target(name: &str) {
    let (_, check, n) = TARGETS.iter().find(|t| t.0 == name).unwrap();
    let seeds = corpus(name);
    assert!(
        !seeds.is_empty(),
        "no corpus for {name}: run generate_seed_corpus"
    );
    for (path, bytes) in &seeds {
        eprintln!("replaying {}", path.display());
        check(bytes);
    }
    let seed = 0x5EED_0000 ^ (name.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut rng = Rng(seed);
    for case in 0..cases(*n) {
        let input = variant(&mut rng, &seeds);
        let shown: String = input.iter().map(|b| format!("{b:02x}")).collect();
        let result = std::panic::catch_unwind(|| check(&input));
        if let Err(e) = result {
            eprintln!("{name}: seed {seed:#x}, case {case} failed; input hex: {shown}");
            std::panic::resume_unwind(e);
        }
    }
}

#[test]
fn segment_scan_corpus() {
    run_target("segment_scan");
}

#[test]
fn manifest_replay_corpus() {
    run_target("manifest_replay");
}

#[test]
fn batch_decode_corpus() {
    run_target("batch_decode");
}

#[test]
fn batch_v2_corpus() {
    run_target("batch_v2");
}

#[test]
fn checkpoint_decode_corpus() {
    run_target("checkpoint_decode");
}

#[test]
fn log_recovery_corpus() {
    run_target("log_recovery");
}

#[test]
fn ops_model_corpus() {
    run_target("ops_model");
}

#[test]
fn chain_repair_corpus() {
    run_target("chain_repair");
}

// ------------------------------------------------------------ seed corpus

fn batch(base: u64, n: usize, key: bool, value_len: usize) -> Vec<u8> {
    let values: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8 + 1; value_len]).collect();
    let recs: Vec<RecordIn<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| RecordIn {
            key: key.then_some(&b"key"[..]),
            value: v,
            timestamp: 1_000 + i as i64,
        })
        .collect();
    let mut b = vec![0; batch_len(&recs)];
    encode_batch(&mut b, base, &recs);
    b
}

fn hole(base: u64, lost: u32, len: usize) -> Vec<u8> {
    let mut b = vec![0; len];
    encode_hole(&mut b, base, lost);
    b
}

/// Segment data after the header: batches from `base`.
fn batches(base: u64, count: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut off = base;
    for i in 0..count {
        let n = 1 + i % 3;
        out.extend(batch(off, n, i % 2 == 0, 10 + i * 7));
        off += n as u64;
    }
    out
}

fn segment_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    // Header prepended by the target (selector bit 0), base 0 and 100.
    let mut s = vec![1u8];
    s.extend(batches(0, 6));
    s.extend([0; 64]);
    seeds.push(s.clone());
    let mut s2 = vec![3u8];
    s2.extend(batches(100, 4));
    seeds.push(s2);
    // A damaged batch in the middle (salvage territory).
    let mut s3 = s.clone();
    s3[1 + 120] ^= 0x55;
    seeds.push(s3);
    // A hole batch left by an earlier salvage, then more data.
    let mut s4 = vec![1u8];
    s4.extend(batch(0, 2, true, 20));
    s4.extend(hole(2, 3, 64));
    s4.extend(batch(5, 1, false, 5));
    seeds.push(s4);
    // A whole file, header included, with a sparse index interval (bit 3).
    let mut s5 = vec![8u8];
    s5.extend(encode_header(1, 0, 0, 0));
    s5.extend(batches(0, 8));
    seeds.push(s5);
    seeds
}

fn batch_seeds() -> Vec<Vec<u8>> {
    vec![
        batch(0, 1, true, 10),
        batch(7, 3, false, 1),
        batch(1 << 40, 2, true, 0),
        hole(9, 4, 80),
    ]
}

fn batch_v2(base: u64, id: (u64, u64), body: EntryBody<'_>) -> Vec<u8> {
    let mut buf = vec![0; body.batch_len()];
    let id = RaftLogId {
        term: id.0,
        leader: 2,
        index: id.1,
    };
    encode_batch_v2(&mut buf, base, id, body, 1_764_547_200_000);
    buf
}

fn batch_v2_seeds() -> Vec<Vec<u8>> {
    let recs = [
        RecordIn {
            key: Some(b"key"),
            value: b"value",
            timestamp: 3,
        },
        RecordIn {
            key: None,
            value: &[7; 40],
            timestamp: 1,
        },
    ];
    vec![
        batch_v2(0, (1, 1), EntryBody::Records(&recs[..1])),
        batch_v2(9, (4, 17), EntryBody::Records(&recs)),
        batch_v2(9, (4, 18), EntryBody::Control(ControlKind::Blank, b"")),
        batch_v2(
            11,
            (5, 19),
            EntryBody::Control(ControlKind::Membership, b"{\"voters\":[1,2,3]}"),
        ),
        batch_v2(
            11,
            (5, 20),
            EntryBody::Control(ControlKind::Seal, &7u64.to_le_bytes()),
        ),
    ]
}

fn checkpoint_seeds() -> Vec<Vec<u8>> {
    let p = |t, id, rates: usize| PartitionCheckpoint {
        topic_id: t,
        partition_id: id,
        segment_base: 10,
        position: 4096,
        end_offset: 99,
        start_offset: 0,
        rates: (0..rates)
            .map(|i| WindowState {
                window_ms: 1000 * (i as u32 + 1),
                bytes_per_sec: 1.5 * i as f64,
                records_per_sec: 0.25,
            })
            .collect(),
    };
    vec![
        encode_checkpoint(&Checkpoint::default()),
        encode_checkpoint(&Checkpoint {
            seq: 7,
            clean: true,
            saved_at_ms: 1_764_547_200_000,
            partitions: vec![p(0, 0, 3), p(0, 1, 0), p(2, 5, 1)],
        }),
    ]
}

/// Manifest journals and a snapshot written by a real log.
fn manifest_seeds() -> Vec<Vec<u8>> {
    use fissionlog::{Log, LogOptions, SplitPlan, TopicConfig};
    let dir = fc::ScratchDir::new("seed-manifest");
    let opts = |compact| LogOptions {
        balancer: false,
        use_io_uring: false,
        manifest_compact_records: compact,
        ..Default::default()
    };
    let log = Log::open(dir.path(), opts(1000)).unwrap();
    let cfg = TopicConfig {
        partitions: 2,
        segment_bytes: 4096,
        ..Default::default()
    };
    let a = log.create_topic("orders", cfg.clone()).unwrap();
    log.create_topic("audit", cfg).unwrap();
    let kids = a.split(0, SplitPlan::Even).unwrap();
    // Consumer groups: commits across a split and a merge, a deletion.
    for i in 0..20u32 {
        a.append(Some(&i.to_le_bytes()), b"v").unwrap();
    }
    let g = a.group("readers", Default::default()).unwrap();
    let mut m = g
        .join(fissionlog::MemberOptions {
            background_heartbeat: None,
            ..Default::default()
        })
        .unwrap();
    m.poll(7).unwrap();
    m.commit().unwrap();
    a.merge(kids[1], 1).unwrap();
    while !m.poll(100).unwrap().is_empty() {
        m.commit().unwrap();
    }
    m.commit().unwrap();
    drop(m);
    a.group("gone", Default::default()).unwrap();
    a.delete_group("gone").unwrap();
    log.delete_topic("audit").unwrap();
    log.close().unwrap();
    let journal = std::fs::read(dir.path().join("manifest.log")).unwrap();
    let mut seeds = Vec::new();
    let mut s = vec![0u8];
    s.extend(&journal);
    seeds.push(s);
    let mut s = vec![1u8];
    s.extend(&journal[16..]);
    seeds.push(s);
    // Compaction leaves a snapshot.
    let log = Log::open(dir.path(), opts(1)).unwrap();
    log.topic("orders")
        .unwrap()
        .split(2, SplitPlan::Even)
        .unwrap();
    log.close().unwrap();
    let snap = std::fs::read(dir.path().join("manifest.snap")).unwrap();
    let mut s = vec![2u8];
    s.extend(&snap);
    seeds.push(s);
    seeds.extend(manifest_group_seeds());
    seeds
}

/// A journal and a snapshot holding consumer group records: commits of
/// positions, of a parent read to its seal (drained, children listed,
/// pruned), and a deleted group.
fn manifest_group_seeds() -> Vec<Vec<u8>> {
    use fissionlog::{GroupOptions, Log, LogOptions, MemberOptions, SplitPlan, TopicConfig};
    let dir = fc::ScratchDir::new("seed-manifest-groups");
    let opts = |compact| LogOptions {
        balancer: false,
        use_io_uring: false,
        manifest_compact_records: compact,
        ..Default::default()
    };
    let member = MemberOptions {
        background_heartbeat: None,
        ..MemberOptions::default()
    };
    let log = Log::open(dir.path(), opts(1000)).unwrap();
    let cfg = TopicConfig {
        partitions: 2,
        segment_bytes: 4096,
        ..Default::default()
    };
    let t = log.create_topic("orders", cfg).unwrap();
    for i in 0..20u32 {
        t.append(None, &i.to_le_bytes()).unwrap();
    }
    let g = t.group("billing", GroupOptions::default()).unwrap();
    t.group("audit", GroupOptions::default()).unwrap();
    let mut m = g.join(member.clone()).unwrap();
    m.poll(5).unwrap();
    m.commit().unwrap();
    t.split(0, SplitPlan::Even).unwrap();
    for i in 20..30u32 {
        t.append(None, &i.to_le_bytes()).unwrap();
    }
    while !m.poll(100).unwrap().is_empty() {}
    m.commit().unwrap();
    t.delete_group("audit").unwrap();
    drop(m);
    log.close().unwrap();
    let journal = std::fs::read(dir.path().join("manifest.log")).unwrap();
    let mut seeds = Vec::new();
    let mut s = vec![0u8];
    s.extend(&journal);
    seeds.push(s);
    let log = Log::open(dir.path(), opts(1)).unwrap();
    let t = log.topic("orders").unwrap();
    let g = t.group("billing", GroupOptions::default()).unwrap();
    let mut m = g.join(member).unwrap();
    m.poll(3).unwrap();
    m.commit().unwrap();
    drop(m);
    log.close().unwrap();
    let snap = std::fs::read(dir.path().join("manifest.snap")).unwrap();
    let mut s = vec![2u8];
    s.extend(&snap);
    seeds.push(s);
    seeds
}

fn log_recovery_seeds() -> Vec<Vec<u8>> {
    vec![
        // 1 topic, clean close: appends, sync, roll, appends; no mutation.
        vec![0x00, 6, 0x10, 40, 0x20, 90, 4, 0, 6, 0, 0x30, 200, 1, 77, 0],
        // Abandoned (bit 3), 2 topics, 2 partitions: appends, a split, a
        // sync; then flip bytes in two files.
        vec![
            0x19, 8, 0x10, 40, 0x90, 33, 7, 0, 0x20, 90, 4, 0, 0x31, 201, 0x82, 120, 1, 5, 2, 9, 0,
            0x44, 0, 7, 0, 0x80, 0x11,
        ],
        // Clean close, then truncate a segment and delete a file.
        vec![
            0x02, 5, 0x30, 250, 0x30, 251, 6, 0, 0x30, 252, 4, 0, 2, 5, 6, 0x10, 0, 0, 7, 3, 0, 0,
            0,
        ],
        // Many appends with syncs between them, a flip late in the data.
        vec![
            0x08, 10, 0x30, 230, 4, 0, 0x30, 231, 4, 0, 0x30, 232, 0x30, 233, 4, 0, 0x30, 234,
            0x30, 235, 6, 0, 0x30, 236, 1, 0, 3, 0xE0, 0x01, 0x20,
        ],
    ]
}

fn ops_seeds() -> Vec<Vec<u8>> {
    vec![
        // Appends, split, appends, kill+reopen, merge, appends, reopen.
        vec![
            0x01, 0x10, 1, 0x20, 2, 0x30, 3, 6, 0, 0x10, 1, 0x11, 5, 9, 0, 7, 0, 0x12, 6, 8, 0,
        ],
        // Sync policy Always, small segments: many rolls.
        vec![
            0x0C, 0x70, 255, 0x71, 255, 0x72, 255, 5, 0, 0x73, 255, 9, 0, 0x70, 17, 6, 1, 6, 2,
            0x40, 9, 9, 0, 7, 1, 8, 0,
        ],
        // Three partitions, splits and merges interleaved with appends.
        vec![
            0x02, 0x10, 0, 0x10, 1, 0x10, 2, 6, 0, 6, 1, 0x10, 3, 7, 0, 7, 1, 0x10, 4, 4, 0, 9, 0,
            0x10, 5, 8, 0,
        ],
    ]
}

/// Chains for `check_chain_repair`: a mode byte (bit 0 write, bit 1 full
/// scan, bits 2.. the recovery mode, bit 6 checkpoint lost, bit 7 a
/// checkpoint follows: segment base, position (2 bytes), end offset,
/// floor), a seal byte (bit 0: sealed at bits 1..6; bit 7: one of the
/// partitions the topic was created with), then per file: the gap to its
/// base, its kind (0 retired, 1 damaged, else opened; bit 2 sealed, bits 3..
/// how its scan stops), its records, a damage byte. A damaged file is empty,
/// shorter than a header or has a bad header CRC, by its base modulo 3;
/// an opened one holds batches of 100 bytes.
fn chain_seeds() -> Vec<Vec<u8>> {
    vec![
        // Salvage, repairing, the checkpoint in the third segment: two
        // sealed rolled segments, then one with a torn tail.
        vec![
            0x81, 8, 64, 0, 8, 0, 0, 0, 6, 4, 0, 3, 6, 4, 0, 3, 0x0A, 4, 0,
        ],
        // Truncate, repairing, no checkpoint: an offset missing before the
        // second segment, then a torn creation.
        vec![0x05, 0, 0, 6, 3, 0, 3, 2, 3, 0, 0, 1],
        // Strict analysis of a sealed partition: a retired file brought
        // back, a corrupt segment, a header naming another partition.
        vec![
            0x84, 9, 100, 0, 7, 1, 21, 0, 0, 0, 6, 4, 0, 3, 0x12, 3, 0, 2, 2, 2, 0xFF,
        ],
        // Salvage with the checkpoint lost: a header naming another base.
        vec![0x45, 0, 0, 3, 2, 0xFE, 0, 6, 2, 0],
        // A new topic's partition, Strict, repairing, no checkpoint entry,
        // no segment file: no loss, the open creates its first segment.
        vec![0x01, 0x80],
        // The same with its first segment an empty file (torn creation)
        // and an unsynced segment after it.
        vec![0x01, 0x80, 0, 1, 3, 2, 2, 0],
        // Strict, repairing, an entry that calls nothing durable: the
        // first segment holds only its header.
        vec![0x85, 0, 0, 0, 0, 0, 0x80, 0, 2, 0, 0],
        // The same with the retention floor at 2 and a first segment whose
        // header CRC does not match.
        vec![0x85, 0, 0, 0, 0, 2, 0x80, 2, 1],
        // Strict analysis (verify): no checkpoint, a first segment with
        // half a batch after its header.
        vec![0x00, 0x80, 0, 0x0A, 0, 0],
        // Truncate, repairing, not a new topic's partition and no segment
        // file: the loss of its durable first segment is reported.
        vec![0x05, 0x00],
        // Strict, repairing, a new topic's partition with the checkpoint
        // lost and its first segment empty: it may be synced data, refused.
        vec![0x49, 0x80, 0, 1],
        // Strict, repairing, a new topic's partition whose entry calls 3
        // records durable (position 364): a first segment of 5 records and
        // a torn batch.
        vec![0x85, 0, 0x6C, 0x01, 3, 0, 0x80, 0, 0x0A, 5, 0],
        // Salvage of the same partition whose synced first segment is an
        // empty file: offsets 0..3 read as a hole.
        vec![0x81, 0, 0x6C, 0x01, 3, 0, 0x80, 0, 1],
        // Truncate, repairing: the checkpoint calls 3 records of the first
        // segment durable and it holds only its header.
        vec![0x89, 0, 0x6C, 0x01, 3, 0, 0, 0, 2, 0, 0],
    ]
}

/// Writes the seed corpora. Run after a format change.
#[test]
#[ignore]
fn generate_seed_corpus() {
    let all: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("segment_scan", segment_seeds()),
        ("manifest_replay", manifest_seeds()),
        ("batch_decode", batch_seeds()),
        ("batch_v2", batch_v2_seeds()),
        ("checkpoint_decode", checkpoint_seeds()),
        ("log_recovery", log_recovery_seeds()),
        ("ops_model", ops_seeds()),
        ("chain_repair", chain_seeds()),
    ];
    for (target, seeds) in all {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), s).unwrap();
        }
    }
}

// ------------------------------------------------- regressions (findings)

fn small_log(dir: &Path, rolls: usize) -> fissionlog::Log {
    use fissionlog::{Log, LogOptions, TopicConfig};
    let log = Log::open(
        dir,
        LogOptions {
            balancer: false,
            ..Default::default()
        },
    )
    .unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                segment_bytes: 4096,
                ..Default::default()
            },
        )
        .unwrap();
    for r in 0..=rolls {
        for i in 0..4u8 {
            t.append(Some(b"k"), &[r as u8 * 10 + i; 100]).unwrap();
        }
        if r < rolls {
            t.partition(0).unwrap().roll_now().unwrap();
        }
    }
    log
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let p = dir.join("topics/t0/p0");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&p)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// Salvage met junk between two intact batches (no offset lost) and tried
/// to write a hole batch of zero offsets, which panicked (C6).
#[test]
fn salvage_of_junk_between_intact_batches_does_not_panic() {
    use fissionlog::{Log, LogOptions, RecoveryMode};
    let dir = fc::ScratchDir::new("regress-junk");
    small_log(dir.path(), 0).close().unwrap();
    let seg = segments(dir.path())[0].clone();
    let mut bytes = std::fs::read(&seg).unwrap();
    let len = bytes.len();
    // Batches of one 100-byte record (key "k"): 40 + 16 + 1 + 100 bytes.
    let second = 64 + 157;
    bytes.splice(second..second, [0xA5u8; 48]);
    bytes.truncate(len);
    std::fs::write(&seg, &bytes).unwrap();
    for mode in [RecoveryMode::Truncate, RecoveryMode::Salvage] {
        let copy = fc::ScratchDir::new("regress-junk-copy");
        std::fs::create_dir_all(copy.path().join("topics/t0/p0")).unwrap();
        for f in ["manifest.log", "checkpoint.0", "checkpoint.1"] {
            let _ = std::fs::copy(dir.path().join(f), copy.path().join(f));
        }
        std::fs::copy(
            &seg,
            copy.path()
                .join("topics/t0/p0")
                .join(seg.file_name().unwrap()),
        )
        .unwrap();
        let log = Log::open(
            copy.path(),
            LogOptions {
                recovery: mode,
                full_scan: true,
                balancer: false,
                create: false,
                ..Default::default()
            },
        )
        .unwrap();
        let t = log.topic("t").unwrap();
        // The first record survives; nothing is invented.
        let b = t.read(0, 0, 1 << 20).unwrap();
        assert_eq!(b.iter().next().unwrap().value, &[0u8; 100][..], "{mode:?}");
    }
}

/// Truncate and salvage skipped a segment with a damaged header but left
/// the file in place, so the next strict open failed on it again (C7).
#[test]
fn repair_sets_damaged_segments_aside() {
    use fissionlog::{Log, LogOptions, RecoveryMode};
    for mode in [RecoveryMode::Truncate, RecoveryMode::Salvage] {
        let dir = fc::ScratchDir::new("regress-aside");
        small_log(dir.path(), 2).close().unwrap();
        let segs = segments(dir.path());
        assert_eq!(segs.len(), 3);
        let mut bytes = std::fs::read(&segs[1]).unwrap();
        bytes[0] ^= 0xFF;
        std::fs::write(&segs[1], &bytes).unwrap();
        let opts = |recovery| LogOptions {
            recovery,
            balancer: false,
            create: false,
            full_scan: true,
            ..Default::default()
        };
        assert!(Log::open(dir.path(), opts(RecoveryMode::Strict)).is_err());
        Log::open(dir.path(), opts(mode)).unwrap().close().unwrap();
        let listing: Vec<_> = std::fs::read_dir(segs[1].parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            segs[1].with_extension("seg.damaged").exists(),
            "{mode:?}: {listing:?}"
        );
        let again = if mode == RecoveryMode::Truncate {
            RecoveryMode::Strict
        } else {
            mode
        };
        let log = Log::open(dir.path(), opts(again))
            .unwrap_or_else(|e| panic!("reopen after {mode:?}: {e}"));
        assert!(
            !log.recovery_report().changed_anything(),
            "{mode:?}: {:#?}",
            log.recovery_report().files
        );
    }
}

/// Files of `dir` this process holds open (mappings keep their fd here).
fn open_files_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

/// A refused open leaked every segment it had opened (topics and the core
/// held each other), found by LeakSanitizer on the `log_recovery` seeds.
#[test]
fn refused_open_releases_its_files() {
    use fissionlog::{Log, LogOptions};
    let dir = fc::ScratchDir::new("regress-leak");
    let log = small_log(dir.path(), 2);
    // A second topic created after the first, so recovery loads `t` first,
    // with a record, so its first segment is synced data (an empty one
    // of a never-written partition would read as a torn creation).
    let u = log.create_topic("u", Default::default()).unwrap();
    u.append(None, b"u").unwrap();
    drop(u);
    log.close().unwrap();
    let u = dir.path().join("topics/t1/p0/00000000000000000000.seg");
    let mut bytes = std::fs::read(&u).unwrap();
    bytes[0] ^= 0xFF;
    std::fs::write(&u, &bytes).unwrap();
    let opts = || LogOptions {
        balancer: false,
        create: false,
        ..Default::default()
    };
    for _ in 0..3 {
        assert!(Log::open(dir.path(), opts()).is_err());
        assert_eq!(
            open_files_under(dir.path()),
            0,
            "a refused open left files open"
        );
    }
}

/// Truncate and Salvage failed to open ("File exists") when a segment the
/// checkpoint calls durable came back holding only its header: the hole
/// for its lost offsets was created under the name of that same empty
/// segment, which the chain had kept.
#[test]
fn repair_of_a_synced_segment_left_with_only_its_header_fills_the_hole() {
    use fissionlog::{Log, LogOptions, RecoveryMode};
    for mode in [RecoveryMode::Truncate, RecoveryMode::Salvage] {
        let dir = fc::ScratchDir::new("regress-header-only");
        small_log(dir.path(), 0).close().unwrap();
        let seg = segments(dir.path())[0].clone();
        let file = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
        file.set_len(64).unwrap();
        drop(file);
        let opts = |recovery| LogOptions {
            recovery,
            balancer: false,
            create: false,
            ..Default::default()
        };
        assert!(Log::open(dir.path(), opts(RecoveryMode::Strict)).is_err());
        let log = Log::open(dir.path(), opts(mode))
            .unwrap_or_else(|e| panic!("{mode:?} refused to repair: {e}"));
        let holes: Vec<_> = log
            .recovery_report()
            .holes
            .iter()
            .map(|h| (h.offsets.start, h.offsets.end))
            .collect();
        assert_eq!(holes, [(0, 4)], "{mode:?}");
        let t = log.topic("t").unwrap();
        let next = t.append(Some(b"k"), b"after").unwrap();
        assert_eq!(next.offset, 4, "{mode:?}: lost offsets handed out again");
        log.close().unwrap();
        // The repaired chain opens Strict.
        Log::open(dir.path(), opts(RecoveryMode::Strict))
            .unwrap_or_else(|e| panic!("Strict reopen after {mode:?}: {e}"))
            .close()
            .unwrap();
    }
}

/// The state a crash leaves between the two steps of that repair (the
/// header-only segment unlinked, the hole not yet created): the segment the
/// checkpoint names is missing, and the next open makes the same repair,
/// with the same hole and no offset handed out again.
#[test]
fn a_crash_between_unlinking_a_header_only_segment_and_creating_its_hole_repairs_the_same() {
    use fissionlog::{Log, LogOptions, RecoveryMode};
    for mode in [RecoveryMode::Truncate, RecoveryMode::Salvage] {
        let dir = fc::ScratchDir::new("regress-header-only-unlinked");
        small_log(dir.path(), 0).close().unwrap();
        let seg = segments(dir.path())[0].clone();
        std::fs::remove_file(&seg).unwrap();
        let opts = |recovery| LogOptions {
            recovery,
            balancer: false,
            create: false,
            ..Default::default()
        };
        assert!(Log::open(dir.path(), opts(RecoveryMode::Strict)).is_err());
        let log = Log::open(dir.path(), opts(mode))
            .unwrap_or_else(|e| panic!("{mode:?} refused to repair: {e}"));
        let holes: Vec<_> = log
            .recovery_report()
            .holes
            .iter()
            .map(|h| (h.offsets.start, h.offsets.end))
            .collect();
        assert_eq!(holes, [(0, 4)], "{mode:?}");
        let t = log.topic("t").unwrap();
        let next = t.append(Some(b"k"), b"after").unwrap();
        assert_eq!(next.offset, 4, "{mode:?}: lost offsets handed out again");
        log.close().unwrap();
        Log::open(dir.path(), opts(RecoveryMode::Strict))
            .unwrap_or_else(|e| panic!("Strict reopen after {mode:?}: {e}"))
            .close()
            .unwrap();
    }
}
