//! The client commands against a running broker process: line shapes and
//! exit codes as the `fissionlog` tool's (0 ok, 1 refused, 2 usage or
//! unreachable).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fissionlog-broker");

struct Broker {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn broker() -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--dir",
            dir.path().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .expect("the address line")
        .to_string();
    Broker {
        child,
        addr,
        _dir: dir,
    }
}

fn run(args: &[&str], stdin: &str) -> Output {
    let mut c = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "{args:?} did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
    c.wait_with_output().unwrap()
}

fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[test]
fn produce_describe_split_groups_and_consume_print_the_documented_shapes() {
    let b = broker();
    let s = b.addr.as_str();
    let o = run(
        &[
            "produce",
            "--server",
            s,
            "--topic",
            "t",
            "--create",
            "--partitions",
            "2",
            "--ack-level",
            "quorum",
            "--acks",
        ],
        "a\tone\nb\ttwo\nno key\n",
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let acks = json_lines(&o);
    assert_eq!(acks.len(), 3);
    assert_eq!(acks[0]["key"], "a");
    assert_eq!(acks[2]["key"], serde_json::Value::Null);
    assert!(acks
        .iter()
        .all(|a| a["partition"].is_u64() && a["offset"].is_u64()));

    let o = run(&["describe", "--server", s, "--topic", "t", "--json"], "");
    assert_eq!(o.status.code(), Some(0));
    let d = &json_lines(&o)[0];
    assert_eq!(d["partitions"].as_array().unwrap().len(), 2);

    let o = run(
        &[
            "split",
            "--server",
            s,
            "--topic",
            "t",
            "--partition",
            "0",
            "--even",
            "--json",
        ],
        "",
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let sp = &json_lines(&o)[0];
    assert_eq!(sp["parent"], 0);
    assert_eq!(sp["children"].as_array().unwrap().len(), 2);
    assert!(sp["children"][0]["key_start"]
        .as_str()
        .unwrap()
        .starts_with("0x"));

    let o = run(
        &[
            "consume",
            "--server",
            s,
            "--topic",
            "t",
            "--group",
            "g",
            "--json",
            "--max-records",
            "3",
            "--idle-ms",
            "3000",
        ],
        "",
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let recs = json_lines(&o);
    let mut values: Vec<&str> = recs.iter().map(|r| r["value"].as_str().unwrap()).collect();
    values.sort();
    assert_eq!(values, ["no key", "one", "two"]);
    assert!(recs
        .iter()
        .all(|r| r["partition"].is_u64() && r["offset"].is_u64() && r["timestamp"].is_i64()));

    let o = run(&["groups", "--server", s, "--topic", "t", "--json"], "");
    assert_eq!(o.status.code(), Some(0));
    let g = &json_lines(&o)[0];
    assert_eq!(g["groups"][0]["group"], "g");
    assert_eq!(g["groups"][0]["lag_records"], 0);
}

#[test]
fn unknown_topics_and_unreachable_servers_exit_2_and_refused_splits_exit_1() {
    let b = broker();
    let s = b.addr.as_str();
    let o = run(&["describe", "--server", s, "--topic", "missing"], "");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("fissionlog-broker describe: "));
    let o = run(
        &["produce", "--server", s, "--topic", "t", "--create"],
        "x\n",
    );
    assert_eq!(o.status.code(), Some(0));
    let o = run(
        &[
            "split",
            "--server",
            s,
            "--topic",
            "t",
            "--partition",
            "0",
            "--at",
            "0xffffffffffffffff",
        ],
        "",
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A port nobody listens on (this broker's, after it is gone).
    let addr = b.addr.clone();
    drop(b);
    let o = run(&["groups", "--server", &addr], "");
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["split", "--server", &addr, "--topic", "t"], "");
    assert_eq!(
        o.status.code(),
        Some(2),
        "a missing --partition is a usage error"
    );
}
