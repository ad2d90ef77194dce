//! `fissionlog simulate` end to end: a short run must read back every
//! acknowledged record in per-key order and report the documented fields.

use std::process::Command;

use serde_json::Value;

fn simulate(extra: &[&str]) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fissionlog"))
        .args(["simulate", "--json", "--seed", "7"])
        .args(extra)
        .output()
        .expect("running fissionlog simulate");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let doc: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{stdout}\nstderr:\n{stderr}"));
    (out.status.code().unwrap_or(-1), doc, stderr)
}

#[test]
fn short_run_reads_back_everything_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    let (code, doc, stderr) = simulate(&[
        "--dir",
        log_dir.to_str().unwrap(),
        "--records",
        "20000",
        "--keys",
        "1000",
        "--partitions",
        "2",
        "--target-records-per-sec",
        "1000",
    ]);
    assert_eq!(code, 0, "seed 7; report: {doc:#}\nstderr: {stderr}");
    for field in [
        "records",
        "bytes",
        "seconds",
        "records_per_sec",
        "mb_per_sec",
        "partitions_initial",
        "partitions_active",
        "splits",
        "merges",
        "hot_keys",
        "hot_key_reports",
        "imbalance",
        "imbalance_static",
        "imbalance_static_same_count",
        "busiest_over_target",
        "converged_after_s",
        "first_split_after_secs",
        "order_violations",
        "missing_records",
        "duplicate_records",
        "partitions",
    ] {
        assert!(doc.get(field).is_some(), "field {field} missing: {doc:#}");
    }
    assert_eq!(doc["records"], 20000);
    assert_eq!(doc["records_read"], 20000);
    assert_eq!(doc["order_violations"], 0);
    assert_eq!(doc["missing_records"], 0);
    assert_eq!(doc["duplicate_records"], 0);
    assert_eq!(doc["partitions_initial"], 2);
    // The hot-key count agrees with the topology: one per isolated key.
    let flagged = doc["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["hot_key"] == true)
        .count();
    assert_eq!(doc["hot_keys"], doc["single_key_partitions"], "{doc:#}");
    assert_eq!(doc["hot_keys"].as_u64(), Some(flagged as u64), "{doc:#}");
    let parts = doc["partitions"].as_array().unwrap();
    assert_eq!(
        parts.len() as u64,
        doc["partitions_active"].as_u64().unwrap()
    );
    let held: u64 = parts.iter().map(|p| p["records"].as_u64().unwrap()).sum();
    assert!(held <= 20000 && !parts.is_empty());
    // A given directory is kept, and holds the log.
    assert!(log_dir.join("manifest.log").exists() || log_dir.join("manifest.snap").exists());
}

#[test]
fn bad_arguments_are_usage_errors() {
    let out = Command::new(env!("CARGO_BIN_EXE_fissionlog"))
        .args(["simulate", "--json", "--value-bytes", "8"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
}

#[test]
fn splits_during_a_timed_run_keep_per_key_order() {
    let (code, doc, stderr) = simulate(&[
        "--seconds",
        "2.5",
        "--keys",
        "1000",
        "--partitions",
        "2",
        "--max-partitions",
        "6",
        "--target-records-per-sec",
        "2000",
    ]);
    assert_eq!(code, 0, "seed 7; report: {doc:#}\nstderr: {stderr}");
    assert!(doc["splits"].as_u64().unwrap() >= 1, "no split: {doc:#}");
    assert!(doc["first_split_after_secs"].as_f64().is_some());
    assert!(doc["partitions_active"].as_u64().unwrap() > 2);
    assert_eq!(doc["order_violations"], 0);
    assert_eq!(doc["missing_records"], 0);
    assert_eq!(doc["duplicate_records"], 0);
    assert_eq!(doc["records_read"], doc["records"]);
}

/// `--hot-key-mode`: the hot key's records come back through the strict
/// key reader in per-key order, spread over one lane per partition, and the
/// consumer checks the order each mode promises (per window, none).
#[test]
fn hot_key_modes_report_lanes_and_keep_the_promised_order() {
    for (mode, lanes) in [("strict", 1), ("windowed", 4), ("spread", 4)] {
        let dir = tempfile::tempdir().unwrap();
        let log_dir = dir.path().join("log");
        let (code, doc, stderr) = simulate(&[
            "--dir",
            log_dir.to_str().unwrap(),
            "--records",
            "20000",
            "--rate",
            "40000",
            "--keys",
            "1000",
            "--partitions",
            "4",
            "--hot-key-share",
            "0.6",
            "--hot-key-mode",
            mode,
            "--hot-key-window-ms",
            "20",
            "--no-balance",
        ]);
        let ctx = format!("{mode}: report {doc:#}\nstderr: {stderr}");
        assert_eq!(code, 0, "{ctx}");
        assert_eq!(doc["order_violations"], 0, "{ctx}");
        assert_eq!(doc["hot_key_lanes"], lanes, "{ctx}");
        let loads: Vec<u64> = doc["hot_key_lane_loads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(loads.len(), lanes, "{ctx}");
        let hot: u64 = loads.iter().sum();
        assert!(hot > 10_000, "about 60% of 20000 on the hot key: {ctx}");
        assert!(
            doc["hot_key_mode"].as_str().unwrap().starts_with(mode),
            "{ctx}"
        );
        if mode == "spread" {
            assert!(doc["hot_key_read_order_violations"].is_null(), "{ctx}");
            assert!(loads.iter().all(|&l| l.abs_diff(hot / 4) <= 1), "{ctx}");
        } else {
            assert_eq!(doc["hot_key_read_order_violations"], 0, "{ctx}");
        }
        if mode == "windowed" {
            assert!(
                loads.iter().all(|&l| l > 0),
                "every lane took windows: {ctx}"
            );
        }
    }
}

#[test]
fn hot_key_mode_needs_a_hot_key() {
    let out = Command::new(env!("CARGO_BIN_EXE_fissionlog"))
        .args(["simulate", "--hot-key-mode", "windowed", "--records", "10"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "usage error without --hot-key-share"
    );
}

/// Every argument that sizes memory or a loop is bounded at parse time:
/// out of range, each is a one-line usage error (exit 2) naming the
/// argument, given before anything is allocated or created (`--keys
/// 4294967294` would otherwise size per-key tables of about 34 GB).
#[test]
fn arguments_that_size_memory_or_loops_are_bounded() {
    let cases: [(&[&str], &str); 9] = [
        (&["--keys", "4294967294"], "--keys"),
        (&["--keys", "4000000", "--producers", "256"], "--producers"),
        (&["--max-partitions", "4294967295"], "--max-partitions"),
        (
            &["--partitions", "100000", "--max-partitions", "100000"],
            "--max-partitions",
        ),
        (&["--records", "18446744073709551615"], "--records"),
        (&["--rate", "1e300"], "--rate"),
        (
            &["--target-bytes-per-sec", "1e300"],
            "--target-bytes-per-sec",
        ),
        (
            &["--consumers", "2", "--slow-consumer", "1e300"],
            "--slow-consumer",
        ),
        (&["--seconds", "1e9"], "--seconds"),
    ];
    for (args, name) in cases {
        let started = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_fissionlog"))
            .arg("simulate")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(name), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{args:?}: took {:?}",
            started.elapsed()
        );
    }
}
