//! Multi-process runs over loopback: a broker process, consumer-group
//! processes of which one is SIGKILLed, and the demo's check line.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fissionlog_broker::client::{Admin, Connection, Producer, ProducerConfig};
use fissionlog_broker::protocol::{Acks, SyncSpec};

const BIN: &str = env!("CARGO_BIN_EXE_fissionlog-broker");

struct Kill(Vec<Child>);
impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn collect(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let out = child.stdout.take().expect("piped stdout");
    let l2 = lines.clone();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            l2.lock().unwrap().push(l);
        }
    });
    lines
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `(key, seq)` of each JSON record line.
fn records(lines: &[String]) -> Vec<(String, u64)> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            let val = v["value"].as_str().expect("UTF-8 values").to_string();
            let (k, s) = val.split_once(' ').expect("value is KEY SEQ");
            (k.to_string(), s.parse().expect("a sequence number"))
        })
        .collect()
}

fn assert_key_order(who: &str, recs: &[(String, u64)]) {
    let mut last: std::collections::HashMap<&str, u64> = Default::default();
    for (k, s) in recs {
        if let Some(&l) = last.get(k.as_str()) {
            assert!(*s > l, "{who}: key {k} went from {l} to {s}");
        }
        last.insert(k, *s);
    }
}

#[test]
fn every_acknowledged_record_is_consumed_in_key_order_after_a_consumer_process_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let mut kids = Kill(Vec::new());
    let mut broker = Command::new(BIN)
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
    let broker_out = collect(&mut broker);
    kids.0.push(broker);
    wait_for("the broker", Duration::from_secs(10), || {
        !broker_out.lock().unwrap().is_empty()
    });
    let addr = broker_out.lock().unwrap()[0]
        .strip_prefix("listening on ")
        .expect("the address line")
        .to_string();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let conn = rt
        .block_on(Connection::connect(addr.as_str(), None))
        .unwrap();
    rt.block_on(Admin::new(conn.clone()).create_topic("t", 4, SyncSpec::Never, 0, false))
        .unwrap();
    let produce = |from: u64, to: u64| {
        rt.block_on(async {
            let p = Producer::new(
                conn.clone(),
                ProducerConfig {
                    acks: Acks::Quorum,
                    ..ProducerConfig::new("t")
                },
            );
            let mut futs = Vec::new();
            for i in from..to {
                let key = format!("k{}", i % 10);
                futs.push(
                    p.send(
                        Some(Bytes::from(key.clone())),
                        Bytes::from(format!("{key} {i}")),
                    )
                    .await,
                );
            }
            for f in futs {
                f.await.expect("acknowledged");
            }
        })
    };
    produce(0, 3000);
    let consumer = || {
        Command::new(BIN)
            .args([
                "consume",
                "--server",
                &addr,
                "--topic",
                "t",
                "--group",
                "g",
                "--json",
                "--session-timeout-ms",
                "800",
                "--idle-ms",
                "3000",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut a = consumer();
    let a_out = collect(&mut a);
    let mut b = consumer();
    let b_out = collect(&mut b);
    kids.0.push(a);
    kids.0.push(b);
    // Two consumer processes start, join and rebalance before the first
    // records arrive; on a loaded two-core machine that alone can take
    // several seconds, so the bound is generous (it only ends a hung run).
    wait_for(
        "the first consumer's records",
        Duration::from_secs(30),
        || a_out.lock().unwrap().len() >= 100,
    );
    kids.0[1].kill().unwrap(); // SIGKILL
    kids.0[1].wait().unwrap();
    produce(3000, 4000);
    // The survivor takes the dead member's partitions after its session
    // timeout, reads to the end, and exits once idle.
    let status = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = kids.0[2].try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "the surviving consumer did not finish"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert!(status.success(), "the surviving consumer failed: {status}");
    let a_recs = records(&a_out.lock().unwrap());
    let b_recs = records(&b_out.lock().unwrap());
    assert_key_order("killed consumer", &a_recs);
    assert_key_order("surviving consumer", &b_recs);
    let got: std::collections::HashSet<u64> =
        a_recs.iter().chain(&b_recs).map(|(_, s)| *s).collect();
    let missing: Vec<u64> = (0..4000).filter(|i| !got.contains(i)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged records never consumed, first {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    // SIGTERM: the broker closes the log cleanly and exits 0.
    // SAFETY: kill(2) on our own unreaped child's pid.
    unsafe {
        libc::kill(kids.0[0].id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = kids.0[0].try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the broker did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "broker exit: {status}");
    let log = fissionlog::Log::open(dir.path(), fissionlog::LogOptions::default())
        .expect("the log reopens");
    assert!(
        log.recovery_report().clean_shutdown,
        "the broker's shutdown was not clean"
    );
}

#[test]
fn the_demo_prints_one_json_check_line_with_nothing_missing_or_out_of_order() {
    let out = Command::new(BIN)
        .args(["demo", "--json", "--records", "1500", "--rate", "1500"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line: {text}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    for f in [
        "produced",
        "consumed",
        "missing_records",
        "duplicate_records",
        "unexplained_duplicates",
        "order_violations",
        "rebalance_pauses",
        "e2e_latency_ms_p50",
        "e2e_latency_ms_p99",
    ] {
        assert!(v.get(f).is_some(), "field {f} missing: {v}");
    }
    assert_eq!(v["missing_records"], 0, "{v}");
    assert_eq!(v["order_violations"], 0, "{v}");
    assert_eq!(v["unexplained_duplicates"], 0, "{v}");
    assert_eq!(v["ok"], true, "{v}");
    assert!(out.status.success());
    assert!(v["splits"].as_u64().unwrap() >= 1, "{v}");
}

/// Starts `fissionlog-broker serve` on `dir`; returns it and its address.
fn start_broker(dir: &std::path::Path) -> (Child, String) {
    start_broker_at(dir, "127.0.0.1:0")
}

/// Starts `fissionlog-broker serve` on `dir` listening on `listen`, again
/// and again for up to 10 s while the port is still held by the previous
/// broker's sockets; returns it and its address.
fn start_broker_at(dir: &std::path::Path, listen: &str) -> (Child, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut broker = Command::new(BIN)
            .args([
                "serve",
                "--dir",
                dir.to_str().expect("a UTF-8 path"),
                "--listen",
                listen,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the broker starts");
        let out = collect(&mut broker);
        let started = loop {
            if !out.lock().unwrap().is_empty() {
                break true;
            }
            if broker.try_wait().expect("the broker's status").is_some() {
                break false;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the broker"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        if started {
            let addr = out.lock().unwrap()[0]
                .strip_prefix("listening on ")
                .expect("the address line")
                .to_string();
            return (broker, addr);
        }
        assert!(
            Instant::now() < deadline,
            "the broker could not listen on {listen}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_retry_after_the_broker_was_killed_between_append_and_ack_is_not_appended_again() {
    use fissionlog_broker::protocol::{Isolation, ProduceRecord, Request, Response, Stamp};
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let fetch = |conn: &Connection| {
        let r = rt.block_on(conn.call(Request::Fetch {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            max_bytes: 1 << 20,
            max_wait_ms: 0,
            isolation: Isolation::Written,
        }));
        match r.expect("a fetch") {
            Response::Fetched { records, .. } => {
                records.iter().map(|r| r.offset).collect::<Vec<u64>>()
            }
            other => panic!("{other:?}"),
        }
    };
    let (broker, addr) = start_broker(dir.path());
    let mut kids = Kill(vec![broker]);
    let conn = rt
        .block_on(Connection::connect(addr.as_str(), None))
        .unwrap();
    rt.block_on(Admin::new(conn.clone()).create_topic("t", 1, SyncSpec::Never, 0, false))
        .unwrap();
    let Response::ProducerInit { producer_id, epoch } = rt
        .block_on(conn.call(Request::InitProducer { producer_id: None }))
        .unwrap()
    else {
        panic!("a producer id")
    };
    let batch = Request::ProduceTo {
        topic: "t".into(),
        partition: 0,
        acks: Acks::Leader,
        stamp: Some(Stamp {
            producer_id,
            epoch,
            first_sequence: 0,
        }),
        records: ["a", "b", "c"]
            .iter()
            .map(|k| ProduceRecord {
                key: Some(Bytes::from_static(k.as_bytes())),
                value: Bytes::from(format!("value of {k}")),
                timestamp: None,
            })
            .collect(),
    };
    // Sent, its answer never read: once another connection sees the
    // records, the broker is killed.
    let _unanswered = rt.block_on(conn.start(batch.clone())).unwrap();
    let watcher = rt
        .block_on(Connection::connect(addr.as_str(), None))
        .unwrap();
    wait_for("the batch to be appended", Duration::from_secs(10), || {
        fetch(&watcher).len() == 3
    });
    for k in &mut kids.0 {
        k.kill().expect("SIGKILL");
        k.wait().expect("the broker is reaped");
    }
    kids.0.clear();

    let (broker, addr) = start_broker(dir.path());
    kids.0.push(broker);
    let conn = rt
        .block_on(Connection::connect(addr.as_str(), None))
        .unwrap();
    let retried = rt
        .block_on(conn.call(batch))
        .expect("the retry is answered");
    let held = fetch(&conn);
    assert_eq!(held.len(), 3, "the retry appended nothing");
    assert_eq!(
        retried,
        Response::Produced {
            positions: held.iter().map(|&o| (0, o)).collect()
        },
        "the retry is answered with the first copy's offsets"
    );
    let Response::ProducerInit {
        producer_id: next, ..
    } = rt
        .block_on(conn.call(Request::InitProducer { producer_id: None }))
        .unwrap()
    else {
        panic!("a producer id")
    };
    assert!(
        next > producer_id,
        "id {next} handed out again after {producer_id}"
    );
}

#[test]
fn four_idempotent_producers_lose_and_double_nothing_while_the_broker_is_killed_and_restarted() {
    use fissionlog_broker::client::{Endpoint, Reconnect};
    use fissionlog_broker::protocol::{Isolation, Request, Response};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};

    const PRODUCERS: u64 = 4;
    const PER_PRODUCER: u64 = 1500;
    const PARTITIONS: u32 = 4;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (broker, addr) = start_broker(dir.path());
    let mut kids = Kill(vec![broker]);
    let conn = rt
        .block_on(Connection::connect(addr.as_str(), None))
        .unwrap();
    rt.block_on(Admin::new(conn.clone()).create_topic("t", PARTITIONS, SyncSpec::Never, 0, false))
        .unwrap();
    drop(conn);

    // Each producer sends its keys' records in sequence; every ack is
    // kept as (value, partition, offset).
    let sent = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (addr, sent) = (addr.clone(), sent.clone());
            rt.spawn(async move {
                let config = ProducerConfig {
                    idempotent: true,
                    acks: Acks::Leader,
                    batch_records: 40,
                    max_in_flight: 8,
                    reconnect: Reconnect {
                        backoff_min: Duration::from_millis(20),
                        backoff_max: Duration::from_millis(200),
                        deadline: Duration::from_secs(30),
                    },
                    ..ProducerConfig::new("t")
                };
                let producer = Producer::connect(Endpoint::new(addr), config)
                    .await
                    .expect("the producer connects");
                let mut futs = Vec::new();
                for i in 0..PER_PRODUCER {
                    let key = format!("p{p}-k{}", i % 8);
                    let value = format!("{key} {i}");
                    futs.push((
                        value.clone(),
                        producer.send(Some(key.into()), value.into()).await,
                    ));
                    sent.fetch_add(1, Ordering::Relaxed);
                    if i % 20 == 0 {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
                let mut acked = Vec::new();
                for (value, f) in futs {
                    match f.await {
                        Ok(Some(at)) => acked.push((value, at)),
                        other => return Err(format!("{value}: {other:?}")),
                    }
                }
                Ok(acked)
            })
        })
        .collect();

    // Killed twice mid-stream, started again on the same port and directory.
    let total = PRODUCERS * PER_PRODUCER;
    for share in [3, 2] {
        let at = total / share;
        wait_for("records to be sent", Duration::from_secs(60), || {
            sent.load(Ordering::Relaxed) >= at
        });
        for k in &mut kids.0 {
            k.kill().expect("SIGKILL");
            k.wait().expect("the broker is reaped");
        }
        kids.0.clear();
        std::thread::sleep(Duration::from_millis(100));
        let (broker, again) = start_broker_at(dir.path(), &addr);
        assert_eq!(again, addr);
        kids.0.push(broker);
    }
    let mut acked: HashMap<String, (u32, u64)> = HashMap::new();
    for p in producers {
        let got = rt
            .block_on(p)
            .expect("the producer task")
            .unwrap_or_else(|e| panic!("a record was not acknowledged: {e}"));
        for (value, at) in got {
            assert!(
                acked.insert(value.clone(), at).is_none(),
                "{value} acked twice"
            );
        }
    }
    assert_eq!(acked.len() as u64, total);

    // Read back every partition: each record once, at its acked position,
    // each key's sequence rising.
    let conn = rt
        .block_on(Connection::connect(addr.as_str(), None))
        .unwrap();
    let mut seen: HashMap<String, (u32, u64)> = HashMap::new();
    for partition in 0..PARTITIONS {
        let mut offset = 0;
        let mut last: HashMap<String, u64> = HashMap::new();
        loop {
            let r = rt.block_on(conn.call(Request::Fetch {
                topic: "t".into(),
                partition,
                offset,
                max_bytes: 1 << 20,
                max_wait_ms: 0,
                isolation: Isolation::Written,
            }));
            let Response::Fetched {
                records,
                next_offset,
                high_watermark,
                ..
            } = r.expect("a fetch")
            else {
                panic!("not a fetch answer")
            };
            for r in &records {
                let value = String::from_utf8(r.value.to_vec()).expect("UTF-8 values");
                let (key, seq) = value.split_once(' ').expect("value is KEY SEQ");
                let seq: u64 = seq.parse().expect("a sequence number");
                if let Some(&l) = last.get(key) {
                    assert!(
                        seq > l,
                        "key {key} went from {l} to {seq} in partition {partition}"
                    );
                }
                last.insert(key.to_string(), seq);
                assert!(
                    seen.insert(value.clone(), (partition, r.offset)).is_none(),
                    "{value} is in the log twice"
                );
            }
            offset = next_offset;
            if records.is_empty() || next_offset >= high_watermark {
                break;
            }
        }
    }
    assert_eq!(
        seen, acked,
        "the log holds exactly the acknowledged records, where acked"
    );
}
