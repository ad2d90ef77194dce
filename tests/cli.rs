//! End-to-end tests of the `fissionlog` binary: exit codes, output formats,
//! corruption handling and acknowledged writes under SIGKILL.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use fissionlog::{Log, LogOptions, SyncPolicy, TopicConfig};

mod common;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fissionlog"))
}

fn run_once(args: &[&str], dir: &Path) -> Output {
    bin()
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Runs the binary; retried for up to 10 s while it reports the directory
/// locked. Tests here open logs in this process while other tests spawn
/// the binary: a child shares this process's open files between its fork
/// and its exec, so a log just closed here can stay locked (an `flock` on
/// a file description the child still holds) for as long as a loaded
/// machine delays that exec. `run_once` is for tests that expect the lock.
fn run(args: &[&str], dir: &Path) -> Output {
    let mut tries = 0;
    loop {
        let o = run_once(args, dir);
        tries += 1;
        let locked = o.status.code() == Some(2)
            && String::from_utf8_lossy(&o.stderr).contains("is locked by another process");
        if !locked || tries == 500 {
            return o;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn run_stdin(args: &[&str], dir: &Path, input: &[u8]) -> Output {
    let mut child = bin()
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The command may exit before reading its input (a refused open).
    let _ = child.stdin.take().unwrap().write_all(input);
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit code, with the output in the message when it is not the expected one.
fn expect_code(o: &Output, code: i32, what: &str) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "{what}: stdout={:?} stderr={:?}",
        stdout(o),
        stderr(o)
    );
}

/// A failure message: one line, no panic.
fn assert_one_line_error(o: &Output, what: &str) {
    let e = stderr(o);
    assert!(!e.contains("panicked"), "{what}: {e}");
    assert!(!e.contains("internal error"), "{what}: {e}");
    assert_eq!(
        e.trim_end().lines().count(),
        1,
        "{what}: not one line: {e:?}"
    );
}

fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every file under `dir` with its contents, for before/after comparisons.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let t = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &t);
        } else {
            std::fs::copy(&p, &t).unwrap();
        }
    }
}

fn find_segments(dir: &Path) -> Vec<PathBuf> {
    snapshot(dir)
        .into_keys()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect()
}

fn small_topic() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 1 << 20,
        sync: SyncPolicy::Always,
        ..TopicConfig::default()
    }
}

#[test]
fn produce_then_dump_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let input = b"k1\tv1\nk2\tv2\nno key here\nk1\tv3 with spaces\n";
    let o = run_stdin(
        &[
            "produce",
            "--topic",
            "t",
            "--create",
            "--partitions",
            "2",
            "--acks",
        ],
        &dir,
        input,
    );
    expect_code(&o, 0, "produce");
    let acks = json_lines(&o);
    assert_eq!(acks.len(), 4);
    assert_eq!(acks[0]["key"], "k1");
    assert!(acks[2]["key"].is_null());
    // Same key, same partition, increasing offsets.
    assert_eq!(acks[0]["partition"], acks[3]["partition"]);
    assert!(acks[3]["offset"].as_u64() > acks[0]["offset"].as_u64());

    let o = run(&["dump", "--topic", "t", "--json"], &dir);
    expect_code(&o, 0, "dump --json");
    let recs = json_lines(&o);
    assert_eq!(recs.len(), 4);
    for ack in &acks {
        let r = recs
            .iter()
            .find(|r| r["partition"] == ack["partition"] && r["offset"] == ack["offset"])
            .expect("acked record dumped");
        assert_eq!(r["key"], ack["key"]);
        assert!(r["timestamp"].as_i64().unwrap() > 0);
    }
    let k1: Vec<&str> = recs
        .iter()
        .filter(|r| r["key"] == "k1")
        .map(|r| r["value"].as_str().unwrap())
        .collect();
    assert_eq!(k1, ["v1", "v3 with spaces"], "per-key order");
    assert!(recs
        .iter()
        .any(|r| r["key"].is_null() && r["value"] == "no key here"));

    let o = run(&["dump", "--topic", "t"], &dir);
    expect_code(&o, 0, "dump text");
    let text = stdout(&o);
    let p = acks[0]["partition"].as_u64().unwrap();
    let off = acks[0]["offset"].as_u64().unwrap();
    assert!(text.contains(&format!("{p}\t{off}\tk1\tv1\n")), "{text}");
    assert!(text.contains("\t\tno key here\n"), "{text}");

    // --partition with --from skips earlier offsets.
    let o = run(
        &[
            "dump",
            "--topic",
            "t",
            "--partition",
            &p.to_string(),
            "--from",
            "1",
            "--json",
        ],
        &dir,
    );
    expect_code(&o, 0, "dump --partition --from");
    let part = json_lines(&o);
    assert!(part
        .iter()
        .all(|r| r["offset"].as_u64().unwrap() >= 1 && r["partition"] == p));

    // Reopening with --create appends to the existing topic.
    let o = run_stdin(
        &["produce", "--topic", "t", "--create", "--acks"],
        &dir,
        b"k1\tv4\n",
    );
    expect_code(&o, 0, "produce again");
    let o = run(&["dump", "--topic", "t", "--json"], &dir);
    assert_eq!(json_lines(&o).len(), 5);
}

#[test]
fn dump_json_base64_for_non_utf8() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    {
        let log = Log::open(&dir, LogOptions::default()).unwrap();
        let t = log.create_topic("bin", small_topic()).unwrap();
        t.append(Some(&[0xff, 0x00]), &[0xc3, 0x28, 0x01]).unwrap();
        t.append(Some(b"text"), b"plain").unwrap();
        log.close().unwrap();
    }
    let o = run(&["dump", "--topic", "bin", "--json"], &dir);
    expect_code(&o, 0, "dump");
    let recs = json_lines(&o);
    assert_eq!(recs[0]["key_base64"], "/wA=");
    assert_eq!(recs[0]["value_base64"], "wygB");
    assert!(recs[0].get("value").is_none());
    assert_eq!(recs[1]["key"], "text");
    assert_eq!(recs[1]["value"], "plain");
    let o = run(&["dump", "--topic", "bin"], &dir);
    assert!(
        stdout(&o).contains("\\xff\\x00\t\\xc3(\\x01"),
        "{}",
        stdout(&o)
    );
}

/// A cleanly closed log of ten one-record batches with byte 3 of
/// `value-003` flipped.
fn corrupted_log(dir: &Path) -> PathBuf {
    let log = Log::open(dir, LogOptions::default()).unwrap();
    let t = log.create_topic("c", small_topic()).unwrap();
    for i in 0..10 {
        t.append(
            Some(format!("k{i}").as_bytes()),
            format!("value-{i:03}").as_bytes(),
        )
        .unwrap();
    }
    log.close().unwrap();
    let segs = find_segments(dir);
    assert_eq!(segs.len(), 1);
    let mut bytes = std::fs::read(&segs[0]).unwrap();
    let at = bytes
        .windows(9)
        .position(|w| w == b"value-003")
        .expect("record in the segment");
    bytes[at + 3] ^= 0xff;
    std::fs::write(&segs[0], &bytes).unwrap();
    segs[0].clone()
}

fn dumped_offsets(dir: &Path) -> Vec<(u64, String)> {
    let o = run(&["dump", "--topic", "c", "--json"], dir);
    expect_code(&o, 0, "dump after recover");
    json_lines(&o)
        .iter()
        .map(|r| {
            (
                r["offset"].as_u64().unwrap(),
                r["value"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn corruption_verify_strict_truncate_salvage() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let seg = corrupted_log(&dir);
    let seg_name = seg.file_name().unwrap().to_str().unwrap().to_string();

    let o = run(&["verify"], &dir);
    expect_code(&o, 1, "verify");
    assert!(stdout(&o).contains(&seg_name), "{}", stdout(&o));
    let o = run(&["verify", "--json"], &dir);
    expect_code(&o, 1, "verify --json");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["clean"], false);
    let problem = &doc["problems"][0];
    assert!(problem["file"].as_str().unwrap().ends_with(&seg_name));
    assert!(problem["position"].as_u64().unwrap() > 0);
    assert!(!problem["repair"].as_str().unwrap().is_empty());

    // Strict open refuses with one clear line.
    let o = run(&["dump", "--topic", "c"], &dir);
    assert!(matches!(o.status.code(), Some(1 | 2)), "{}", stderr(&o));
    assert_one_line_error(&o, "strict dump");
    assert!(stderr(&o).contains(&seg_name), "{}", stderr(&o));
    let o = run(&["recover"], &dir);
    expect_code(&o, 1, "recover strict");
    assert_one_line_error(&o, "recover strict");
    assert!(stderr(&o).contains("--mode salvage"), "{}", stderr(&o));

    // A dry run changes no byte.
    let before = snapshot(&dir);
    for mode in ["strict", "truncate", "salvage"] {
        let o = run(&["recover", "--dry-run", "--mode", mode, "--json"], &dir);
        expect_code(&o, 1, "dry run");
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(doc["dry_run"], true);
    }
    assert!(
        before == snapshot(&dir),
        "recover --dry-run changed the directory"
    );

    let salvage = tmp.path().join("salvage");
    copy_dir(&dir, &salvage);

    let o = run(&["recover", "--mode", "truncate", "--json"], &dir);
    expect_code(&o, 0, "recover truncate");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["changed"], true);
    let got = dumped_offsets(&dir);
    let offsets: Vec<u64> = got.iter().map(|r| r.0).collect();
    assert_eq!(offsets, [0, 1, 2], "truncate keeps the prefix");
    expect_code(&run(&["verify"], &dir), 0, "verify after truncate");

    let o = run(&["recover", "--mode", "salvage"], &salvage);
    expect_code(&o, 0, "recover salvage");
    assert!(stdout(&o).contains("3..4"), "{}", stdout(&o));
    let got = dumped_offsets(&salvage);
    let offsets: Vec<u64> = got.iter().map(|r| r.0).collect();
    assert_eq!(
        offsets,
        [0, 1, 2, 4, 5, 6, 7, 8, 9],
        "salvage keeps what follows"
    );
    assert!(got.iter().all(|(o, v)| *v == format!("value-{o:03}")));
    expect_code(&run(&["verify"], &salvage), 0, "verify after salvage");
    // Recovery is idempotent: a second run finds nothing to do.
    let o = run(&["recover", "--mode", "salvage", "--json"], &salvage);
    expect_code(&o, 0, "second salvage");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["changed"], false);
}

const COMMANDS: &[&[&str]] = &[
    &["inspect"],
    &["inspect", "--json"],
    &["verify"],
    &["verify", "--json"],
    &["recover"],
    &["recover", "--mode", "salvage"],
    &["recover", "--dry-run"],
    &["dump", "--topic", "t"],
    &["dump", "--topic", "t", "--json"],
    &["split", "--topic", "t", "--partition", "0"],
    &["merge", "--topic", "t", "--partitions", "0,1"],
    &["produce", "--topic", "t"],
    &["produce", "--topic", "t", "--create"],
];

#[test]
fn garbage_and_missing_directories_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let garbage = tmp.path().join("garbage");
    std::fs::create_dir_all(garbage.join("topics/t0/p0")).unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    std::fs::write(garbage.join("data.bin"), noise(4096)).unwrap();
    std::fs::write(garbage.join("checkpoint.0"), noise(100)).unwrap();
    std::fs::write(
        garbage.join("topics/t0/p0/00000000000000000000.seg"),
        noise(8192),
    )
    .unwrap();
    let before = snapshot(&garbage);
    let missing = tmp.path().join("missing");
    for args in COMMANDS {
        for dir in [&garbage, &missing] {
            let o = run_stdin(args, dir, b"k\tv\n");
            let what = format!("{args:?} on {}", dir.display());
            let creates = args.contains(&"--create") && dir == &missing;
            if creates {
                expect_code(&o, 0, &what);
                continue;
            }
            expect_code(&o, 2, &what);
            assert_one_line_error(&o, &what);
        }
    }
    assert!(
        before == snapshot(&garbage),
        "a command changed a foreign directory"
    );
}

#[test]
fn garbage_manifest_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    {
        let log = Log::open(&dir, LogOptions::default()).unwrap();
        log.create_topic("t", small_topic()).unwrap();
        log.close().unwrap();
    }
    let manifest = dir.join("manifest.log");
    let mut b = std::fs::read(&manifest).unwrap();
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = (i as u8).wrapping_mul(31) ^ 0x5a;
    }
    std::fs::write(&manifest, &b).unwrap();
    for args in COMMANDS {
        let o = run_stdin(args, &dir, b"k\tv\n");
        let what = format!("{args:?}");
        assert!(
            matches!(o.status.code(), Some(1 | 2)),
            "{what}: {}",
            stderr(&o)
        );
        if o.status.code() == Some(1) && !o.stdout.is_empty() {
            // verify and recover --dry-run list the problem on stdout.
            assert!(
                stdout(&o).contains("manifest.log"),
                "{what}: {}",
                stdout(&o)
            );
        } else {
            assert_one_line_error(&o, &what);
        }
    }
}

#[test]
fn bad_topic_name_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("new");
    let o = run_stdin(&["produce", "--topic", "../x", "--create"], &dir, b"v\n");
    assert!(matches!(o.status.code(), Some(1 | 2)));
    assert_one_line_error(&o, "bad topic");
    assert!(!dir.exists(), "the log directory was created");
    assert!(!tmp.path().join("x").exists());
    let o = run(&["dump", "--topic", "../x"], &dir);
    expect_code(&o, 2, "dump bad topic");
    assert_one_line_error(&o, "dump bad topic");
}

#[test]
fn split_and_merge_refusals_exit_1() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let o = run_stdin(
        &["produce", "--topic", "t", "--create", "--partitions", "3"],
        &dir,
        b"a\t1\nb\t2\n",
    );
    expect_code(&o, 0, "produce");
    let o = run(
        &[
            "split",
            "--topic",
            "t",
            "--partition",
            "0",
            "--even",
            "--json",
        ],
        &dir,
    );
    expect_code(&o, 0, "split");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let children: Vec<u64> = doc["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    assert_eq!(children.len(), 2);

    let o = run(&["split", "--topic", "t", "--partition", "0"], &dir);
    expect_code(&o, 1, "split sealed");
    assert_one_line_error(&o, "split sealed");
    assert!(stderr(&o).contains("sealed"));

    // Partition 1 lies between partition 2 and the children of 0.
    let o = run(
        &[
            "merge",
            "--topic",
            "t",
            "--partitions",
            &format!("{},2", children[0]),
        ],
        &dir,
    );
    expect_code(&o, 1, "merge not adjacent");
    assert!(stderr(&o).contains("adjacent"), "{}", stderr(&o));
    let o = run(&["merge", "--topic", "t", "--partitions", "0,1"], &dir);
    expect_code(&o, 1, "merge sealed");

    // The routing hash is keyed per topic: find a key that lands in partition 1.
    let hot = {
        let log = Log::open(&dir, LogOptions::default()).unwrap();
        let t = log.topic("t").unwrap();
        let key = (0..1000)
            .map(|i| format!("key-{i}"))
            .find(|k| t.route(k.as_bytes()) == 1)
            .unwrap();
        drop(t);
        log.close().unwrap();
        key
    };
    let o = run(
        &[
            "split",
            "--topic",
            "t",
            "--partition",
            "1",
            "--hot-key",
            &hot,
            "--json",
        ],
        &dir,
    );
    expect_code(&o, 0, "split hot key");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let isolated = doc["children"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["key_start"] == c["key_end"])
        .count();
    assert_eq!(isolated, 1, "{doc}");
    let o = run(
        &[
            "merge",
            "--topic",
            "t",
            "--partitions",
            &format!("{},{}", children[0], children[1]),
            "--json",
        ],
        &dir,
    );
    expect_code(&o, 0, "merge");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(doc["child"]["id"].as_u64().is_some());
    let o = run(&["split", "--topic", "t", "--partition", "99"], &dir);
    expect_code(&o, 2, "unknown partition");
}

#[test]
fn inspect_json_is_one_document() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let o = run_stdin(
        &[
            "produce",
            "--topic",
            "orders",
            "--create",
            "--partitions",
            "2",
        ],
        &dir,
        b"a\t1\nb\t2\nc\t3\n",
    );
    expect_code(&o, 0, "produce");
    let o = run(
        &["split", "--topic", "orders", "--partition", "1", "--even"],
        &dir,
    );
    expect_code(&o, 0, "split");
    let o = run(&["inspect", "--json"], &dir);
    expect_code(&o, 0, "inspect");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(matches!(
        doc["sync_backend"].as_str(),
        Some("io_uring" | "syscalls")
    ));
    let topic = &doc["topics"][0];
    assert_eq!(topic["name"], "orders");
    let parts = topic["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 4);
    let total: u64 = parts
        .iter()
        .map(|p| p["end_offset"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 3);
    let p1 = parts.iter().find(|p| p["id"] == 1).unwrap();
    assert_eq!(p1["state"], "sealed");
    assert_eq!(p1["children"].as_array().unwrap().len(), 2);
    assert_eq!(p1["key_start"], "0x8000000000000000");
    let o = run(&["inspect"], &dir);
    expect_code(&o, 0, "inspect text");
    let text = stdout(&o);
    // Children are indented under their parent.
    let parent_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("p1 "))
        .unwrap();
    let child_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("p2 "))
        .unwrap();
    let indent = |l: &str| l.len() - l.trim_start().len();
    assert!(indent(child_line) > indent(parent_line), "{text}");
}

/// A parent retention emptied and removed: `inspect` shows the children
/// as roots naming the removed parent, `dump` prints every live record
/// and `verify` finds nothing wrong (its directory is gone with it).
#[test]
fn inspect_dump_verify_after_a_partition_was_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let log = Log::open(
        &dir,
        LogOptions {
            balancer: false,
            background_retention: false,
            ..LogOptions::default()
        },
    )
    .unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                retention_age: Some(std::time::Duration::from_secs(3600)),
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let old = fissionlog::NewRecord {
        key: Some(b"k"),
        value: b"old",
        timestamp: Some(1),
    };
    t.append_batch(&[old; 5]).unwrap();
    let kids = t.split(0, fissionlog::SplitPlan::Even).unwrap();
    for (i, &c) in kids.iter().enumerate() {
        let v = format!("live{i}");
        let rec = fissionlog::NewRecord {
            key: None,
            value: v.as_bytes(),
            timestamp: None,
        };
        t.append_to(c, &[rec]).unwrap();
    }
    log.sync().unwrap();
    log.enforce_retention().unwrap();
    assert_eq!(t.partitions().len(), 2);
    drop(t);
    log.close().unwrap();

    let o = run(&["inspect", "--json"], &dir);
    expect_code(&o, 0, "inspect");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let parts = doc["topics"][0]["partitions"].as_array().unwrap().clone();
    let ids: Vec<u64> = parts.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![1, 2]);
    for p in &parts {
        assert_eq!(p["parents"], serde_json::json!([0]));
        assert_eq!(
            p["removed_parents"],
            serde_json::json!([{"id": 0, "sealed_at": 5}])
        );
    }
    let o = run(&["inspect"], &dir);
    expect_code(&o, 0, "inspect text");
    let text = stdout(&o);
    for id in [1, 2] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("p{id} ")))
            .unwrap_or_else(|| panic!("p{id} in {text}"));
        assert!(line.ends_with("(removed parent p0 sealed at 5)"), "{line}");
    }
    let o = run(&["dump", "--topic", "t"], &dir);
    expect_code(&o, 0, "dump");
    let mut values: Vec<String> = stdout(&o)
        .lines()
        .map(|l| l.rsplit('\t').next().unwrap().to_string())
        .collect();
    values.sort();
    assert_eq!(values, ["live0", "live1"]);
    let o = run(&["verify"], &dir);
    expect_code(&o, 0, "verify");
}

#[test]
fn verify_refuses_while_a_writer_holds_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let log = Log::open(&dir, LogOptions::default()).unwrap();
    log.create_topic("t", small_topic()).unwrap();
    let o = run_once(&["verify"], &dir);
    expect_code(&o, 2, "verify locked");
    assert_one_line_error(&o, "verify locked");
    assert!(stderr(&o).contains("locked"));
    log.close().unwrap();
    expect_code(&run(&["verify"], &dir), 0, "verify after close");
}

#[test]
fn every_command_has_help() {
    for cmd in [
        "produce", "dump", "inspect", "verify", "recover", "split", "merge", "simulate",
    ] {
        let o = bin().args([cmd, "--help"]).output().unwrap();
        expect_code(&o, 0, cmd);
        assert!(stdout(&o).contains("--dir") || cmd == "simulate", "{cmd}");
    }
    let o = bin().args(["dump", "--bogus"]).output().unwrap();
    expect_code(&o, 2, "unknown flag");
}

/// Acknowledged records survive SIGKILL of the producer (the page cache
/// survives a process kill), byte for byte at their offsets.
#[test]
fn acked_records_survive_sigkill() {
    let seed: u64 = std::env::var("FISSIONLOG_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let mut child = bin()
        .args([
            "produce",
            "--topic",
            "t",
            "--create",
            "--partitions",
            "3",
            "--sync",
            "always",
            "--acks",
            "--dir",
        ])
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..200_000u64 {
            let key = format!("key-{}", (i ^ seed) % 17);
            let line = format!("{key}\tvalue-{i}-{seed}\n");
            if stdin.write_all(line.as_bytes()).is_err() {
                return;
            }
        }
    });
    let mut acks = Vec::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while acks.len() < 300 {
        let line = lines.next().expect("producer ended early").unwrap();
        acks.push(serde_json::from_str::<serde_json::Value>(&line).unwrap());
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Acks already printed but not yet read also count.
    for line in lines.map_while(Result::ok) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
            acks.push(v);
        }
    }
    writer.join().unwrap();

    let o = run(&["dump", "--topic", "t", "--json"], &dir);
    expect_code(&o, 0, "dump after kill");
    let recs: HashMap<(u64, u64), serde_json::Value> = json_lines(&o)
        .into_iter()
        .map(|r| {
            (
                (
                    r["partition"].as_u64().unwrap(),
                    r["offset"].as_u64().unwrap(),
                ),
                r,
            )
        })
        .collect();
    // Acks come in input order, so the i-th ack is line i.
    for (i, ack) in acks.iter().enumerate() {
        let at = (
            ack["partition"].as_u64().unwrap(),
            ack["offset"].as_u64().unwrap(),
        );
        let r = recs
            .get(&at)
            .unwrap_or_else(|| panic!("seed {seed}: acked record {i} at {at:?} is missing"));
        let key = format!("key-{}", (i as u64 ^ seed) % 17);
        assert_eq!(r["key"], key.as_str(), "seed {seed}: record {i}");
        assert_eq!(
            r["value"],
            format!("value-{i}-{seed}").as_str(),
            "seed {seed}: record {i}"
        );
    }
    expect_code(&run(&["verify"], &dir), 0, "verify after kill and reopen");
}

#[test]
fn groups_shows_committed_positions_and_lag_and_deletes_a_group() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    {
        let log = Log::open(&dir, LogOptions::default()).unwrap();
        let t = log
            .topic_or_create(
                "t",
                TopicConfig {
                    partitions: 2,
                    ..small_topic()
                },
            )
            .unwrap();
        for i in 0..100u32 {
            t.append(Some(format!("k{i}").as_bytes()), b"v").unwrap();
        }
        let g = t
            .group("readers", fissionlog::GroupOptions::default())
            .unwrap();
        let mut m = g
            .join(fissionlog::MemberOptions {
                background_heartbeat: None,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(m.poll(30).unwrap().len(), 30);
        m.commit().unwrap();
        drop(m);
        log.close().unwrap();
    }
    let o = run(&["groups", "--json"], &dir);
    expect_code(&o, 0, "groups");
    let v = &json_lines(&o)[0];
    let g = &v["groups"][0];
    assert_eq!(g["group"], "readers");
    assert_eq!(g["topic"], "t");
    assert_eq!(g["lag_records"], 70);
    let committed: u64 = g["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["committed"].as_u64().unwrap())
        .sum();
    assert_eq!(committed, 30);
    let o = run(&["groups"], &dir);
    expect_code(&o, 0, "groups text");
    assert!(
        stdout(&o).contains("group \"readers\": lag 70 records"),
        "{}",
        stdout(&o)
    );
    // Deleting needs the topic; an unknown group is a clear error.
    let o = run(&["groups", "--delete", "readers"], &dir);
    expect_code(&o, 2, "delete without topic");
    let o = run(&["groups", "--topic", "t", "--delete", "nope"], &dir);
    expect_code(&o, 2, "unknown group");
    assert_one_line_error(&o, "unknown group");
    let o = run(
        &["groups", "--topic", "t", "--delete", "readers", "--json"],
        &dir,
    );
    expect_code(&o, 0, "delete");
    let o = run(&["groups", "--json"], &dir);
    assert_eq!(json_lines(&o)[0]["groups"].as_array().unwrap().len(), 0);
}

#[test]
fn simulate_with_a_consumer_group_reports_rebalances_latency_and_a_clean_check() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sim");
    let o = bin()
        .args([
            "simulate",
            "--records",
            "60000",
            "--consumers",
            "3",
            "--target-records-per-sec",
            "2000",
            "--seed",
            "7",
            "--json",
            "--dir",
        ])
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    expect_code(&o, 0, "simulate --consumers");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["consumers"], 3);
    assert_eq!(v["order_violations"], 0);
    assert_eq!(v["missing_records"], 0);
    assert_eq!(v["duplicate_records"], 0);
    let per_member: u64 = v["records_per_member"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .sum();
    assert_eq!(per_member, 60000);
    for k in [
        "rebalances",
        "rebalance_pause_ms",
        "e2e_latency_ms",
        "e2e_latency_during_rebalance_ms",
        "dead_consumers_detected",
        "slow_consumers_detected",
        "lag_max_records",
    ] {
        assert!(v.get(k).is_some(), "{k} missing");
    }
    assert!(v["e2e_latency_ms"]["p50"].as_f64().is_some());
    // Bad combinations are usage errors that touch nothing.
    for args in [
        &["--consumers", "1", "--kill-consumer-at", "1"][..],
        &["--consumers", "2", "--slow-consumer", "0.5"][..],
        &["--consumers", "0"][..],
        &["--slow-consumer", "2"][..],
        &["--rate", "0"][..],
    ] {
        let o = bin()
            .arg("simulate")
            .args(args)
            .arg("--dir")
            .arg(tmp.path().join("bad"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        expect_code(&o, 2, &format!("simulate {args:?}"));
        assert!(
            !tmp.path().join("bad").exists(),
            "{args:?} created the directory"
        );
    }
}

/// `split --tail-from`: the parent's records from the offset on move into
/// the children; `inspect` shows the moved range, `dump` prints every
/// record exactly once in per-key order; an offset past the end is a
/// usage error (exit 2, as for `dump --from`) and changes nothing.
#[test]
fn tail_split_moves_the_backlog_and_dump_prints_every_record_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    // Two runs: a batch boundary at offset 10 (a tail split moves whole
    // batches).
    for range in [0..10, 10..40] {
        let input: String = range.map(|i| format!("k{}\t{i}\n", i % 5)).collect();
        let o = run_stdin(
            &["produce", "--topic", "t", "--create", "--partitions", "1"],
            &dir,
            input.as_bytes(),
        );
        expect_code(&o, 0, "produce");
    }
    // What a refused split must leave alone: the manifest and the set of
    // files (an open rewrites the checkpoint whatever it does).
    let layout = |dir: &Path| {
        let snap = snapshot(dir);
        let files: Vec<PathBuf> = snap.keys().cloned().collect();
        let manifest = snap
            .iter()
            .find(|(p, _)| p.ends_with("manifest.log"))
            .map(|(_, b)| b.clone());
        (files, manifest)
    };
    let before = layout(&dir);
    let o = run(
        &[
            "split",
            "--topic",
            "t",
            "--partition",
            "0",
            "--even",
            "--tail-from",
            "41",
        ],
        &dir,
    );
    expect_code(&o, 2, "tail split past the end");
    assert_one_line_error(&o, "tail split past the end");
    assert!(
        layout(&dir) == before,
        "a refused tail split changes nothing"
    );
    let o = run(
        &[
            "split",
            "--topic",
            "t",
            "--partition",
            "0",
            "--even",
            "--tail-from",
            "10",
            "--json",
        ],
        &dir,
    );
    expect_code(&o, 0, "tail split");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["moved"]["from"], 10);
    assert_eq!(doc["moved"]["to"], 40);
    let moved: u64 = doc["moved"]["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(moved, 30);

    let o = run(&["inspect", "--json"], &dir);
    expect_code(&o, 0, "inspect");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let parts = doc["topics"][0]["partitions"].as_array().unwrap();
    let p0 = parts.iter().find(|p| p["id"] == 0).unwrap();
    assert_eq!(p0["sealed_at"], 10);
    assert_eq!(p0["moved"]["from"], 10);
    assert_eq!(p0["moved"]["to"], 40);
    let o = run(&["inspect"], &dir);
    expect_code(&o, 0, "inspect text");
    assert!(stdout(&o).contains("moved 10..40"), "{}", stdout(&o));

    let o = run(&["dump", "--topic", "t", "--json"], &dir);
    expect_code(&o, 0, "dump");
    let recs = json_lines(&o);
    let mut values: Vec<u64> = recs
        .iter()
        .map(|r| r["value"].as_str().unwrap().parse().unwrap())
        .collect();
    for k in 0..5u64 {
        let per_key: Vec<u64> = values.iter().copied().filter(|v| v % 5 == k).collect();
        let want: Vec<u64> = (0..40).filter(|v| v % 5 == k).collect();
        assert_eq!(per_key, want, "key k{k}: every record once, in order");
    }
    values.sort_unstable();
    assert_eq!(values, (0..40).collect::<Vec<u64>>());
    // The parent alone: its records below the split offset, and a note
    // on stderr saying where the rest went (not a silent end).
    let o = run(
        &["dump", "--topic", "t", "--partition", "0", "--json"],
        &dir,
    );
    expect_code(&o, 0, "dump of the parent");
    let offsets: Vec<u64> = json_lines(&o)
        .iter()
        .map(|r| r["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, (0..10).collect::<Vec<u64>>());
    let note = stderr(&o);
    assert!(
        note.contains("offsets 10..40") && note.contains("tail split"),
        "{note}"
    );
    let o = run(
        &["dump", "--topic", "t", "--partition", "0", "--from", "20"],
        &dir,
    );
    expect_code(&o, 0, "dump of the parent inside the moved range");
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    assert!(stderr(&o).contains("offsets 10..40"), "{}", stderr(&o));
    // The descendant index is no foreign file, the moved range no damage.
    let o = run(&["verify"], &dir);
    expect_code(&o, 0, "verify after a tail split");
}

/// Runs the binary with a time limit: a command still running after it is
/// killed and the test fails (a blocking open would hang it forever).
fn run_bounded(args: &[&str], dir: &Path, limit: std::time::Duration) -> Output {
    let mut child = bin()
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "{args:?} on {}: still running after {limit:?} (stderr {:?})",
                dir.display(),
                stderr(&o)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// A FIFO or a symlink to `/dev/zero` in place of any file of the log:
/// `verify` and `recover --dry-run` list it as a problem naming the file
/// (exit 1), `inspect` and `dump` refuse with one sentence naming it
/// (exit 2), each within seconds, and none of them changes a byte.
#[test]
fn a_fifo_or_dev_zero_in_the_log_is_named_by_verify_inspect_and_recover_dry_run() {
    use common::odd_files::{odd_file_kinds, odd_files_log, place, restore, Odd};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    odd_files_log(&dir);
    let before = snapshot(&dir);
    let limit = std::time::Duration::from_secs(20);
    for (kind, rel) in odd_file_kinds(&dir) {
        for odd in [Odd::Fifo, Odd::SymlinkToDevZero] {
            let bytes = std::fs::read(dir.join(&rel)).unwrap();
            let placed = place(&dir.join(&rel), odd);
            let name = rel.to_string_lossy().into_owned();
            for args in [&["verify"][..], &["recover", "--dry-run"][..]] {
                let what = format!("{args:?} with the {kind} ({name}) as {odd:?}");
                let o = run_bounded(args, &dir, limit);
                expect_code(&o, 1, &what);
                let out = stdout(&o);
                assert!(
                    out.lines()
                        .any(|l| l.contains(&name) && l.contains("not a regular file")),
                    "{what}: {out}"
                );
            }
            for args in [&["inspect"][..], &["dump", "--topic", "t"][..]] {
                let what = format!("{args:?} with the {kind} ({name}) as {odd:?}");
                let o = run_bounded(args, &dir, limit);
                expect_code(&o, 2, &what);
                assert_one_line_error(&o, &what);
                let e = stderr(&o);
                assert!(
                    e.contains(&name) && e.contains("not a regular file"),
                    "{what}: {e}"
                );
            }
            restore(placed, &bytes);
            assert!(
                before == snapshot(&dir),
                "{kind} as {odd:?}: changed the log"
            );
        }
    }
    let o = run_bounded(&["verify"], &dir, limit);
    expect_code(&o, 0, "verify after restoring every file");
}

/// A stdin line longer than the topic's largest record stops `produce`
/// with one sentence naming the line (exit 1), without reading the line
/// into memory (it is fed through a pipe, 64 MiB of it against a 1 MiB
/// limit, and never ends in a newline); every line before it was
/// acknowledged and stays in the log. A line just over the limit once
/// framed is refused the same way, after the lines before it in the
/// same batch.
#[test]
fn produce_stops_at_a_line_longer_than_the_largest_record() {
    let tmp = tempfile::tempdir().unwrap();
    let max = TopicConfig::default().effective_max_record_bytes() as usize;
    let over_once_framed = {
        let mut l = b"k\t".to_vec();
        l.extend(std::iter::repeat_n(b'v', max - 4));
        l.push(b'\n');
        l
    };
    /// Writes a case's input into the producer's stdin.
    type Feed = Box<dyn Fn(&mut dyn Write) + Send>;
    let cases: [(&str, Feed, u64); 2] = [
        (
            "endless line",
            Box::new(|w: &mut dyn Write| {
                let _ = w.write_all(b"k1\ta\nk2\tb\nk3\tc\n");
                let chunk = vec![b'x'; 64 * 1024];
                for _ in 0..1024 {
                    if w.write_all(&chunk).is_err() {
                        return;
                    }
                }
            }),
            4,
        ),
        (
            "line over the limit once framed",
            Box::new(move |w: &mut dyn Write| {
                let _ = w.write_all(b"k1\ta\nk2\tb\n");
                let _ = w.write_all(&over_once_framed);
                let _ = w.write_all(b"k4\td\n");
            }),
            3,
        ),
    ];
    for (i, (what, feed, bad_line)) in cases.into_iter().enumerate() {
        let dir = tmp.path().join(format!("log{i}"));
        let mut child = bin()
            .args(["produce", "--topic", "t", "--create", "--acks"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        // The producer stops reading at the bad line: the rest of the
        // input meets a closed pipe.
        let feeder = std::thread::spawn(move || feed(&mut stdin));
        let o = child.wait_with_output().unwrap();
        feeder.join().unwrap();
        expect_code(&o, 1, what);
        assert_one_line_error(&o, what);
        let e = stderr(&o);
        assert!(e.contains(&format!("line {bad_line} ")), "{what}: {e}");
        let acked = json_lines(&o);
        assert_eq!(acked.len() as u64, bad_line - 1, "{what}: {}", stdout(&o));
        let dumped = run(&["dump", "--topic", "t", "--json"], &dir);
        expect_code(&dumped, 0, what);
        let values: Vec<String> = json_lines(&dumped)
            .iter()
            .map(|r| r["value"].as_str().unwrap().to_string())
            .collect();
        let want: Vec<String> = ["a", "b", "c"][..(bad_line - 1) as usize]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(values, want, "{what}");
    }
}

/// A log whose partition lost the records of its last two segments (each
/// left with only its header, the writer segment one of them): `verify`
/// names them, a dry run changes nothing, Truncate and Salvage repair it
/// (the lost offsets read as a hole, dump prints what survived, a second
/// recover changes nothing, verify is clean), and the next append does not
/// reuse a lost offset.
#[test]
fn header_only_segments_verify_recover_dump() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let log = Log::open(&dir, LogOptions::default()).unwrap();
    let t = log.create_topic("c", small_topic()).unwrap();
    for i in 0..12u64 {
        t.append(Some(b"k"), format!("value-{i:03}").as_bytes())
            .unwrap();
        if i % 4 == 3 && i < 11 {
            t.partition(0).unwrap().roll_now().unwrap();
        }
    }
    drop(t);
    log.close().unwrap();
    let segs = find_segments(&dir);
    assert_eq!(segs.len(), 3, "{segs:?}");
    for seg in &segs[1..] {
        let f = std::fs::OpenOptions::new().write(true).open(seg).unwrap();
        f.set_len(64).unwrap();
    }
    let short = segs[1].to_str().unwrap().to_string();
    let o = run(&["verify", "--json"], &dir);
    expect_code(&o, 1, "verify");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["clean"], false);
    let problems = doc["problems"].as_array().unwrap();
    // The first damaged file is named, and no problem calls a file that is
    // there missing.
    assert!(
        problems.iter().any(|p| p["file"] == short.as_str()),
        "{doc}"
    );
    let claimed_missing = |p: &serde_json::Value| {
        let what = p["what"].as_str().unwrap();
        what.contains("there is no segment file") && what.ends_with(&short)
    };
    assert!(!problems.iter().any(claimed_missing), "{doc}");
    let before = snapshot(&dir);
    for mode in ["strict", "truncate", "salvage"] {
        let o = run(&["recover", "--dry-run", "--mode", mode, "--json"], &dir);
        expect_code(&o, 1, "dry run");
    }
    assert!(before == snapshot(&dir), "a dry run changed the directory");
    let o = run(&["recover"], &dir);
    expect_code(&o, 1, "recover strict");
    let after = snapshot(&dir);
    let changed: Vec<_> = after
        .iter()
        .filter(|(p, b)| before.get(*p) != Some(*b))
        .map(|(p, b)| (p.clone(), b.len(), before.get(p).map(|v| v.len())))
        .collect();
    assert!(
        before == after,
        "Strict changed the directory: {changed:?} {:?}",
        before
            .keys()
            .filter(|k| !after.contains_key(*k))
            .collect::<Vec<_>>()
    );
    for mode in ["truncate", "salvage"] {
        let copy = tmp.path().join(mode);
        copy_dir(&dir, &copy);
        let o = run(&["recover", "--mode", mode, "--json"], &copy);
        expect_code(&o, 0, mode);
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(doc["changed"], true, "{mode}");
        let o = run(&["dump", "--topic", "c", "--json"], &copy);
        expect_code(&o, 0, "dump after recover");
        let got: Vec<(u64, String)> = json_lines(&o)
            .iter()
            .map(|r| {
                (
                    r["offset"].as_u64().unwrap(),
                    r["value"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let want: Vec<(u64, String)> = (0..4).map(|i| (i, format!("value-{i:03}"))).collect();
        assert_eq!(got, want, "{mode}: dump");
        expect_code(&run(&["verify"], &copy), 0, "verify after recover");
        let o = run(&["recover", "--mode", mode, "--json"], &copy);
        expect_code(&o, 0, "second recover");
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(doc["changed"], false, "{mode}: second recover: {doc}");
        let log = Log::open(&copy, LogOptions::default()).unwrap();
        let next = log
            .topic("c")
            .unwrap()
            .append(Some(b"k"), b"after")
            .unwrap();
        assert_eq!(
            next.offset, 12,
            "{mode}: a lost offset was handed out again"
        );
        log.close().unwrap();
    }
}

/// Runs the binary under an open-file limit of `nofile`.
fn run_limited(nofile: u32, args: &[&str], dir: &Path) -> Output {
    Command::new("prlimit")
        .arg(format!("--nofile={nofile}"))
        .arg(env!("CARGO_BIN_EXE_fissionlog"))
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `verify`, `dump` and `inspect` of a log with far more sealed segments
/// (1,200 in the partitions of two splits) than the open-file limit they
/// run under (64, below the log's own budget of 128 descriptors): each
/// succeeds and sees every segment and record.
#[test]
fn verify_dump_and_inspect_of_many_segments_run_under_a_low_descriptor_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let log = Log::open(&dir, LogOptions::default()).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 4096,
                sync: SyncPolicy::Never,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    // A record of 3000 bytes fills a 4 KiB segment: every append rolls.
    let value = vec![b'v'; 3000];
    let mut records = 0u64;
    let mut append = |t: &fissionlog::Topic, n: u64| {
        for _ in 0..n {
            let key = format!("k{records}");
            t.append(Some(key.as_bytes()), &value).unwrap();
            records += 1;
        }
    };
    append(&t, 600);
    t.split(0, fissionlog::SplitPlan::Even).unwrap();
    append(&t, 400);
    t.split(1, fissionlog::SplitPlan::Even).unwrap();
    append(&t, 200);
    let segments: usize = t
        .partitions()
        .iter()
        .map(|p| t.partition(p.id).unwrap().segment_count())
        .sum();
    assert!(segments >= 1200, "{segments} segments");
    drop(t);
    log.close().unwrap();
    let o = run_limited(64, &["verify", "--json"], &dir);
    expect_code(&o, 0, "verify");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["segments"].as_u64(), Some(segments as u64), "{doc}");
    assert_eq!(doc["records_scanned"].as_u64(), Some(records));
    let o = run_limited(64, &["dump", "--topic", "t", "--json"], &dir);
    expect_code(&o, 0, "dump");
    let mut keys: Vec<String> = json_lines(&o)
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_string())
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len() as u64, records, "dump prints every record once");
    let o = run_limited(64, &["inspect", "--json"], &dir);
    expect_code(&o, 0, "inspect");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let parts = doc["topics"][0]["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 5);
    let shown: u64 = parts.iter().map(|p| p["segments"].as_u64().unwrap()).sum();
    assert_eq!(shown, segments as u64, "{doc}");
}
