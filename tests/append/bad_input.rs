//! C6: bad input is a typed error, never a panic, and loses nothing.

use crate::common;
use common::faults::Fail;
use common::log::no_balancer;
use common::log::serial;

use std::path::Path;
use std::sync::Arc;

use common::crash::{flip_byte, zero_range};
use fissionlog::FileAction;
use fissionlog::IoOp;
use fissionlog::{Error, Log, LogOptions, RecoveryMode, TopicConfig};

fn config() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 4096,
        ..TopicConfig::default()
    }
}

fn check_all(log: &Log, n: u64) {
    let t = log.topic("t").unwrap();
    let p = t.partition(0).unwrap();
    assert_eq!(p.end_offset(), n);
    for i in 0..n {
        let b = t.read(0, i, 1).unwrap();
        let r = b.iter().next().unwrap();
        assert_eq!((r.offset, r.value), (i, format!("v{i}").as_bytes()));
    }
}

fn fill(log: &Log, from: u64, to: u64) {
    let t = log.topic("t").unwrap();
    for i in from..to {
        assert_eq!(
            t.append(None, format!("v{i}").as_bytes()).unwrap().offset,
            i
        );
    }
}

#[test]
fn api_arguments() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let t = log.create_topic("t", config()).unwrap();
    fill(&log, 0, 3);
    let big = vec![0u8; 5000];
    assert!(matches!(
        t.append(None, &big),
        Err(Error::RecordTooLarge { .. })
    ));
    assert!(matches!(log.topic("nope"), Err(Error::UnknownTopic(_))));
    assert!(matches!(
        t.read(9, 0, 10),
        Err(Error::UnknownPartition { .. })
    ));
    assert!(matches!(
        t.read(0, 3, 10),
        Err(Error::OffsetOutOfRange {
            offset: 3,
            end: 3,
            ..
        })
    ));
    for name in ["../x", "a/b", "", &"x".repeat(250), "..", "."] {
        assert!(
            matches!(
                log.create_topic(name, config()),
                Err(Error::InvalidTopicName { .. })
            ),
            "{name:?}"
        );
        assert!(matches!(
            log.topic(name),
            Err(Error::InvalidTopicName { .. })
        ));
    }
    // Nothing outside the log directory, and only the one topic inside.
    assert!(!dir.path().parent().unwrap().join("x").exists());
    let topics: Vec<_> = std::fs::read_dir(dir.path().join("topics"))
        .unwrap()
        .collect();
    assert_eq!(topics.len(), 1);
    check_all(&log, 3);
    log.close().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    check_all(&log, 3);
}

#[test]
fn not_a_log_foreign_file_and_lock() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"hello").unwrap();
    assert!(matches!(
        Log::open(dir.path(), no_balancer()),
        Err(Error::NotALog { .. })
    ));
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    log.create_topic("t", config()).unwrap();
    fill(&log, 0, 2);
    assert!(matches!(
        Log::open(dir.path(), no_balancer()),
        Err(Error::Locked { .. })
    ));
    log.close().unwrap();
    let foreign = dir.path().join("topics/t0/p0/README");
    std::fs::write(&foreign, b"mine").unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    assert!(log
        .recovery_report()
        .files
        .iter()
        .any(|f| f.file == foreign && f.action == FileAction::ForeignFile));
    assert_eq!(std::fs::read(&foreign).unwrap(), b"mine");
    check_all(&log, 2);
}

/// A log with `n` records, closed cleanly; returns the directory.
fn closed_log(n: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    log.create_topic("t", config()).unwrap();
    fill(&log, 0, n);
    log.close().unwrap();
    dir
}

const SEG0: &str = "topics/t0/p0/00000000000000000000.seg";
const IDX0: &str = "topics/t0/p0/00000000000000000000.idx";

#[test]
fn corrupt_index_is_rebuilt() {
    let _serial = serial();
    let dir = closed_log(300);
    let idx = dir.path().join(IDX0);
    assert!(idx.exists());
    let len = std::fs::metadata(&idx).unwrap().len();
    for pos in [0, len / 2, len - 1] {
        flip_byte(dir.path(), Path::new(IDX0), pos);
    }
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    check_all(&log, 300);
    log.close().unwrap();
    std::fs::write(&idx, b"").unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    check_all(&log, 300);
}

#[test]
fn corrupt_segment_header_is_an_error_naming_the_file() {
    let _serial = serial();
    let dir = closed_log(300);
    flip_byte(dir.path(), Path::new(SEG0), 20);
    match Log::open(dir.path(), no_balancer()) {
        Err(Error::Corruption { file, .. }) => assert!(file.ends_with(SEG0)),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // Truncating a segment to nothing is also reported, never a panic.
    let dir = closed_log(300);
    std::fs::write(dir.path().join(SEG0), b"").unwrap();
    assert!(matches!(
        Log::open(dir.path(), no_balancer()),
        Err(Error::Corruption { .. })
    ));
    let o = LogOptions {
        recovery: RecoveryMode::Truncate,
        ..no_balancer()
    };
    let log = Log::open(dir.path(), o).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert!(p.start_offset() <= p.end_offset());
}

#[test]
fn checkpoint_files() {
    let _serial = serial();
    // One bad checkpoint: the other is used.
    let dir = closed_log(50);
    for name in ["checkpoint.0", "checkpoint.1"] {
        let path = dir.path().join(name);
        if std::fs::metadata(&path).unwrap().len() > 20 {
            flip_byte(dir.path(), Path::new(name), 20);
            break;
        }
    }
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    assert!(log
        .recovery_report()
        .files
        .iter()
        .any(|f| matches!(f.action, FileAction::InvalidCheckpoint { .. })));
    check_all(&log, 50);
    log.close().unwrap();
    // Both bad: a full scan still recovers everything.
    for name in ["checkpoint.0", "checkpoint.1"] {
        std::fs::write(dir.path().join(name), b"garbage garbage garbage garbage!!").unwrap();
    }
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    assert!(!log.recovery_report().checkpoint_found);
    check_all(&log, 50);
}

#[test]
fn manifest_torn_tail_vs_mid_journal_corruption() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    log.create_topic("t", config()).unwrap();
    log.create_topic("u", config()).unwrap();
    fill(&log, 0, 3);
    log.close().unwrap();
    let journal = dir.path().join("manifest.log");
    let bytes = std::fs::read(&journal).unwrap();
    // A torn tail: the last record half written. Cut and reported; the
    // first topic survives.
    let torn = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), torn.path());
    let len = bytes.len() as u64;
    zero_range(torn.path(), Path::new("manifest.log"), len - 10, 10);
    let log = Log::open(torn.path(), no_balancer()).unwrap();
    assert!(log.recovery_report().manifest.torn_tail.is_some());
    check_all(&log, 3);
    drop(log);
    // Damage in the first record with a valid one after it: corruption.
    let mid = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), mid.path());
    flip_byte(mid.path(), Path::new("manifest.log"), 40);
    assert!(matches!(
        Log::open(mid.path(), no_balancer()),
        Err(Error::Corruption { .. })
    ));
}

fn copy_dir(from: &Path, to: &Path) {
    let img = common::crash::DirImage::capture(from).unwrap();
    std::fs::remove_dir(to).unwrap();
    img.write_to(to).unwrap();
}

#[test]
fn enospc_on_roll_is_no_space_and_loses_nothing() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let hook = Arc::new(Fail::new(IoOp::CreateSegment, libc::ENOSPC).disarmed());
    let log = Log::open_with_hook(dir.path(), no_balancer(), hook.clone()).unwrap();
    let t = log.create_topic("t", config()).unwrap();
    hook.arm();
    let mut n = 0u64;
    let err = loop {
        match t.append(None, format!("v{n}").as_bytes()) {
            Ok(a) => {
                assert_eq!(a.offset, n);
                n += 1;
            }
            Err(e) => break e,
        }
        assert!(n < 10_000);
    };
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert!(matches!(
        t.partition(0).unwrap().roll_now(),
        Err(Error::NoSpace { .. })
    ));
    check_all(&log, n);
    log.sync().unwrap();
    hook.disarm();
    fill(&log, n, n + 5);
    log.close().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    check_all(&log, n + 5);
}

#[test]
fn fsync_failure_poisons_and_keeps_synced_data() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let hook = Arc::new(Fail::new(IoOp::SyncSegment, libc::EIO).disarmed());
    let log = Log::open_with_hook(dir.path(), no_balancer(), hook.clone()).unwrap();
    log.create_topic("t", config()).unwrap();
    fill(&log, 0, 5);
    log.sync().unwrap();
    fill(&log, 5, 7);
    hook.arm();
    assert!(log.sync().is_err());
    let t = log.topic("t").unwrap();
    assert!(matches!(t.append(None, b"x"), Err(Error::Poisoned { .. })));
    hook.disarm();
    assert!(matches!(t.append(None, b"x"), Err(Error::Poisoned { .. })));
    log.abandon();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert!(p.end_offset() >= 5);
    check_all(&log, p.end_offset());
}

#[test]
fn second_process_is_locked_out() {
    let _serial = serial();
    if std::env::var_os("FISSIONLOG_LOCK_CHILD").is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    let out = crate::common::log::rerun_command(module_path!(), "lock_child")
        .env("FISSIONLOG_LOCK_CHILD", dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("LOCKED"), "{stdout}");
    drop(log);
}

#[test]
#[ignore = "child process of second_process_is_locked_out"]
fn lock_child() {
    let Some(dir) = std::env::var_os("FISSIONLOG_LOCK_CHILD") else {
        return;
    };
    match Log::open(Path::new(&dir), no_balancer()) {
        Err(Error::Locked { .. }) => println!("LOCKED"),
        other => println!("UNEXPECTED {:?}", other.map(|_| ())),
    }
}

/// Runs `wait` on its own thread and returns what it returned, failing the
/// test if it has not returned within 10 s (a wait that never ends) or if
/// it panicked.
fn bounded<T: Send + 'static>(what: &str, wait: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(wait());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(10)) {
        Ok(v) => {
            waiter.join().unwrap();
            v
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            let panic = waiter.join().err().and_then(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            });
            panic!("{what} panicked: {panic:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not return within 10 s")
        }
    }
}

/// Appends one record to partition 0 of `topic` after 50 ms, from another
/// thread: what a wait without a deadline must wake for.
fn append_later(topic: &fissionlog::Topic) -> std::thread::JoinHandle<()> {
    let topic = topic.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        topic.append(None, b"later").unwrap();
    })
}

fn waiting_topic(dir: &Path, records: u64) -> (Log, fissionlog::Topic) {
    let log = Log::open(dir, no_balancer()).unwrap();
    let cfg = TopicConfig {
        partitions: 1,
        ..TopicConfig::default()
    };
    let t = log.create_topic("t", cfg).unwrap();
    for i in 0..records {
        t.append(None, format!("v{i}").as_bytes()).unwrap();
    }
    (log, t)
}

#[test]
fn waits_without_end_return_data_that_is_already_there() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (log, t) = waiting_topic(dir.path(), 3);
    let t2 = t.clone();
    let ready = bounded("Topic::wait_for(Duration::MAX)", move || {
        t2.wait_for(0, 0, std::time::Duration::MAX).unwrap()
    });
    assert!(ready);
    let mut reader = t.reader(fissionlog::StartAt::Earliest).unwrap();
    let got = bounded("Reader::poll_wait(Duration::MAX)", move || {
        reader.poll_wait(10, std::time::Duration::MAX).unwrap()
    });
    assert_eq!(got.len(), 3);
    let group = t.group("g", fissionlog::GroupOptions::default()).unwrap();
    let mut member = group.join(fissionlog::MemberOptions::default()).unwrap();
    let got = bounded("Member::poll_wait(Duration::MAX)", move || {
        member.poll_wait(10, std::time::Duration::MAX).unwrap()
    });
    assert_eq!(got.len(), 3);
    drop(group);
    log.close().unwrap();
}

#[test]
fn waits_without_end_wake_for_a_later_append() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (log, t) = waiting_topic(dir.path(), 0);

    let appender = append_later(&t);
    let t2 = t.clone();
    let ready = bounded("Topic::wait_for(Duration::MAX)", move || {
        t2.wait_for(0, 0, std::time::Duration::MAX).unwrap()
    });
    appender.join().unwrap();
    assert!(ready);

    let mut reader = t.reader(fissionlog::StartAt::Latest).unwrap();
    let appender = append_later(&t);
    let got = bounded("Reader::poll_wait(Duration::MAX)", move || {
        reader.poll_wait(10, std::time::Duration::MAX).unwrap()
    });
    appender.join().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].value[..], b"later");

    let group = t
        .group(
            "g",
            fissionlog::GroupOptions {
                start: fissionlog::GroupStart::Latest,
                ..fissionlog::GroupOptions::default()
            },
        )
        .unwrap();
    let mut member = group.join(fissionlog::MemberOptions::default()).unwrap();
    let appender = append_later(&t);
    let got = bounded("Member::poll_wait(Duration::MAX)", move || {
        member.poll_wait(10, std::time::Duration::MAX).unwrap()
    });
    appender.join().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].value[..], b"later");
    drop(group);
    log.close().unwrap();
}

/// A topic of 4 KiB segments holding 200 records stamped `timestamp`, all
/// but the active segment sealed, with the checkpoints past them.
fn aged_topic(log: &Log, name: &str, retention_age: std::time::Duration, timestamp: i64) {
    let cfg = TopicConfig {
        partitions: 1,
        segment_bytes: 4096,
        retention_age: Some(retention_age),
        ..TopicConfig::default()
    };
    let t = log.create_topic(name, cfg).unwrap();
    let value = [7u8; 100];
    for _ in 0..200 {
        t.append_to(
            0,
            &[fissionlog::NewRecord {
                key: None,
                value: &value,
                timestamp: Some(timestamp),
            }],
        )
        .unwrap();
    }
    assert!(t.partition(0).unwrap().segment_count() > 3);
}

#[test]
fn a_retention_age_past_i64_milliseconds_keeps_every_record() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    // Records from 1970: older than an hour, far younger than either age.
    aged_topic(&log, "forever", std::time::Duration::MAX, 1_000);
    aged_topic(
        &log,
        "ages",
        std::time::Duration::from_millis(u64::MAX),
        1_000,
    );
    aged_topic(&log, "hour", std::time::Duration::from_secs(3600), 1_000);
    for _ in 0..3 {
        log.sync().unwrap();
        log.enforce_retention().unwrap();
    }
    let start = |name: &str| {
        log.topic(name)
            .unwrap()
            .partition(0)
            .unwrap()
            .start_offset()
    };
    assert!(start("hour") > 0, "retention ran and could remove");
    assert_eq!(start("forever"), 0);
    assert_eq!(start("ages"), 0);
    log.close().unwrap();
}

#[test]
fn records_stamped_near_i64_min_expire_without_overflow() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), no_balancer()).unwrap();
    aged_topic(
        &log,
        "ancient",
        std::time::Duration::from_secs(3600),
        i64::MIN + 1,
    );
    for _ in 0..3 {
        log.sync().unwrap();
        log.enforce_retention().unwrap();
    }
    let p = log.topic("ancient").unwrap().partition(0).unwrap();
    assert!(p.start_offset() > 0);
    log.close().unwrap();
}
