//! An error while opening or mapping a file is never taken for damage:
//! recovery fails the open with a typed error and changes nothing on disk.
//! So is a name that holds something other than a regular file (a
//! directory, a symlink, a FIFO, a socket). Faults are injected through the I/O hook
//! ([`IoOp::OpenSegment`], [`IoOp::MapSegment`]) and, for the binary, with
//! a real descriptor shortage (a low `RLIMIT_NOFILE`).

use crate::common;
use common::faults::Fail;
use common::log::no_balancer_in;
use common::log::serial;
use common::log::value;

use std::io;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::crash::DirImage;
use fissionlog::{Error, Log, LogOptions, NewRecord, RecoveryMode, TopicConfig};

use fissionlog::IoOp;

const RECORDS: u64 = 300;

/// A log of one partition holding `RECORDS` synced records in about a dozen
/// 4 KiB segments. The process then "dies": the checkpoint lags one sync
/// round, so the newest segments lie after the checkpointed position.
fn synced_log(dir: &Path) {
    let log = Log::open(dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    let t = log
        .create_topic(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 4096,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    for i in 0..RECORDS {
        let at = t
            .append_batch(&[NewRecord {
                key: Some(b"k"),
                value: &value(i),
                timestamp: Some(i as i64),
            }])
            .unwrap();
        assert_eq!(at[0].offset, i);
        if i == RECORDS / 2 {
            log.sync().unwrap();
        }
    }
    log.sync().unwrap();
    log.abandon();
}

/// Checks that every synced record is there, byte for byte.
fn assert_all_records(dir: &Path) {
    let log = Log::open(dir, no_balancer_in(RecoveryMode::Strict)).unwrap();
    let p = log.topic("t").unwrap().partition(0).unwrap();
    assert_eq!((p.start_offset(), p.end_offset()), (0, RECORDS));
    let mut next = 0;
    while next < RECORDS {
        let b = p.read(next, 1 << 20).unwrap();
        for r in b.iter() {
            assert_eq!(r.offset, next);
            assert_eq!(r.value, value(next).as_slice(), "record {next}");
            next += 1;
        }
    }
}

fn segment_count(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("topics/t0/p0"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "seg")
        })
        .count()
}

fn errno_of(e: &Error) -> Option<i32> {
    match e {
        Error::OpenFailed { source, .. } => source.raw_os_error(),
        _ => None,
    }
}

/// EMFILE, ENFILE, ENOMEM and EACCES while opening or mapping any segment,
/// in every recovery mode: the open fails with the OS error, no byte of the
/// directory changes, and a later open keeps every synced record.
#[test]
fn transient_open_error_deletes_nothing() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let pristine = root.path().join("pristine");
    synced_log(&pristine);
    let n = segment_count(&pristine);
    assert!(n >= 10, "{n} segments");
    let cases = [
        (IoOp::OpenSegment, libc::EMFILE),
        (IoOp::OpenSegment, libc::ENFILE),
        (IoOp::OpenSegment, libc::EACCES),
        (IoOp::MapSegment, libc::ENOMEM),
    ];
    let mut case = 0;
    for (op, errno) in cases {
        for mode in [
            RecoveryMode::Strict,
            RecoveryMode::Truncate,
            RecoveryMode::Salvage,
        ] {
            for nth in [n - 1, n / 2, 1, 0] {
                case += 1;
                let dir = root.path().join(format!("case{case}"));
                DirImage::capture(&pristine)
                    .unwrap()
                    .write_to(&dir)
                    .unwrap();
                let before = DirImage::capture(&dir).unwrap();
                // The `nth` (0-based) call of `op` and every later one fail.
                let hook = Arc::new(Fail::new(op, errno).failing_from(nth));
                let what = format!("{op:?} errno {errno} at segment {nth} in {mode:?}");
                let outcome = Log::open_with_hook(&dir, no_balancer_in(mode), hook).map(|log| {
                    let report = log.recovery_report().clone();
                    log.abandon();
                    report
                });
                let after = DirImage::capture(&dir).unwrap();
                assert!(
                    before == after,
                    "{what}: the open ({outcome:?}) changed the directory:\n{}",
                    before.diff_summary(&after)
                );
                let err = outcome.expect_err(&what);
                assert_eq!(errno_of(&err), Some(errno), "{what}: {err}");
                assert_all_records(&dir);
            }
        }
    }
}

/// Runs `fissionlog` with the open-file limit set to `nofile`.
fn run_limited(args: &[&str], dir: &Path, nofile: u64) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fissionlog"));
    cmd.args(args)
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let limit = libc::rlimit {
        rlim_cur: nofile,
        rlim_max: nofile,
    };
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setrlimit, which is async-signal-safe; `limit` is a plain value
    // copied into the closure.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().unwrap()
}

/// A real descriptor shortage: `dump` and `recover --mode truncate` under
/// a low `RLIMIT_NOFILE` exit 2 naming the cause with advice that loses
/// nothing, change no byte, and a later normal open keeps every record.
#[test]
fn descriptor_shortage_in_the_cli_is_named_and_changes_nothing() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    synced_log(&dir);
    assert!(segment_count(&dir) >= 10);
    let before = DirImage::capture(&dir).unwrap();
    for args in [
        &["dump", "--topic", "t"][..],
        &["inspect"][..],
        &["recover", "--mode", "truncate"][..],
        &["recover", "--mode", "salvage"][..],
    ] {
        // Low enough that the open runs out in its first phase: recovery
        // closes each segment's descriptor once opened, so with a few
        // more the open itself succeeds and a later step is refused.
        let o = run_limited(args, &dir, 8);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("too many open files"), "{args:?}: {err}");
        assert!(err.contains("no segment was changed"), "{args:?}: {err}");
        assert!(err.contains("ulimit -n"), "{args:?}: {err}");
        assert!(!err.contains("corruption"), "{args:?}: {err}");
        assert!(!err.contains("--mode truncate"), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        let after = DirImage::capture(&dir).unwrap();
        assert!(
            before == after,
            "{args:?} changed the directory:\n{}",
            before.diff_summary(&after)
        );
    }
    assert_all_records(&dir);
}

/// A segment, manifest journal or checkpoint written by a newer format
/// version is refused with `Error::UnsupportedVersion` in every recovery
/// mode and by `verify`, and nothing is changed: a newer format is not
/// damage, so it is never cut, set aside or overwritten.
#[test]
fn newer_format_version_is_refused_and_changes_nothing() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let pristine = root.path().join("pristine");
    synced_log(&pristine);
    let targets = [
        "topics/t0/p0/00000000000000000000.seg",
        "topics/t0/p0/00000000000000000275.seg",
        "manifest.log",
        "checkpoint.0",
        "checkpoint.1",
    ];
    let mut case = 0;
    for target in targets {
        for mode in [
            RecoveryMode::Strict,
            RecoveryMode::Truncate,
            RecoveryMode::Salvage,
        ] {
            case += 1;
            let dir = root.path().join(format!("v{case}"));
            let mut img = DirImage::capture(&pristine).unwrap();
            let names: Vec<_> = img.files.keys().cloned().collect();
            let bytes = img
                .files
                .get_mut(Path::new(target))
                .unwrap_or_else(|| panic!("{target} missing: {names:?}"));
            bytes[8..10].copy_from_slice(&7u16.to_le_bytes());
            img.write_to(&dir).unwrap();
            let before = DirImage::capture(&dir).unwrap();
            let what = format!("{target} in {mode:?}");
            let outcome = Log::open(&dir, no_balancer_in(mode)).map(|log| log.abandon());
            let after = DirImage::capture(&dir).unwrap();
            assert!(
                before == after,
                "{what}: the open ({outcome:?}) changed the directory:\n{}",
                before.diff_summary(&after)
            );
            match outcome {
                Err(Error::UnsupportedVersion { file, found: 7, .. }) => {
                    assert!(file.ends_with(target), "{what}: {}", file.display())
                }
                other => panic!("{what}: {other:?}"),
            }
            match fissionlog::verify(&dir) {
                Err(Error::UnsupportedVersion { found: 7, .. }) => {}
                other => panic!("verify {what}: {other:?}"),
            }
        }
    }
}

/// Whether `e` says that `target` is not a regular file.
fn names_odd_file(e: &Error, target: &Path, odd: common::odd_files::Odd) -> bool {
    use common::odd_files::Odd;
    let want = match odd {
        Odd::Directory => "directory",
        Odd::SymlinkToDevZero => "symbolic link",
        Odd::Fifo => "FIFO (named pipe)",
        Odd::Socket => "socket",
    };
    matches!(e, Error::NotARegularFile { path, found } if path.ends_with(target) && *found == want)
}

/// A directory, a symlink to `/dev/zero`, a FIFO or a unix socket where
/// the log keeps its journal, snapshot, a checkpoint, the lock file, a
/// segment, an index or a tail split's descendant index: every recovery
/// mode refuses the open with an error naming the file, and `verify`
/// reports it as a problem, each within a bounded time (a blocking open
/// or an endless read would hang here); nothing is changed, and once the
/// file is back every record is there.
#[test]
fn a_file_that_is_not_a_regular_file_is_refused_by_open_and_verify() {
    use common::odd_files::*;
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let pristine = root.path().join("pristine");
    odd_files_log(&pristine);
    let limit = std::time::Duration::from_secs(10);
    let mut case = 0;
    for (kind, rel) in odd_file_kinds(&pristine) {
        for odd in ODD {
            case += 1;
            let dir = root.path().join(format!("odd{case}"));
            DirImage::capture(&pristine)
                .unwrap()
                .write_to(&dir)
                .unwrap();
            let bytes = std::fs::read(dir.join(&rel)).unwrap();
            let placed = place(&dir.join(&rel), odd);
            let before = DirImage::capture(&dir).unwrap();
            let what = format!("{kind} ({}) as {odd:?}", rel.display());
            for mode in [
                RecoveryMode::Strict,
                RecoveryMode::Truncate,
                RecoveryMode::Salvage,
            ] {
                let ctx = format!("{what}, open in {mode:?}");
                let d = dir.clone();
                let outcome = within(limit, &ctx, move || {
                    Log::open(
                        &d,
                        LogOptions {
                            recovery: mode,
                            ..odd_files_options()
                        },
                    )
                    .map(|log| log.abandon())
                });
                match outcome {
                    Err(e) if names_odd_file(&e, &rel, odd) => {}
                    other => panic!("{ctx}: {other:?}"),
                }
                let after = DirImage::capture(&dir).unwrap();
                assert!(
                    before == after,
                    "{ctx}: changed the directory:\n{}",
                    before.diff_summary(&after)
                );
            }
            let ctx = format!("{what}, verify");
            let d = dir.clone();
            match within(limit, &ctx, move || fissionlog::verify(&d)) {
                Ok((_, problems)) => assert!(
                    problems
                        .iter()
                        .any(|p| p.file.ends_with(&rel) && p.what.contains("not a regular file")),
                    "{ctx}: {problems:?}"
                ),
                Err(e) => panic!("{ctx}: {e}"),
            }
            restore(placed, &bytes);
            assert_odd_files_log_intact(&dir, &what);
        }
    }
}

/// Whatever sits at a scratch name (`manifest.snap.tmp`, an index's
/// `.idx.tmp`) is a leftover: a FIFO there does not block the manifest
/// compaction or a roll, and a symlink there is replaced, never written
/// through (the file it points to keeps its bytes). Afterwards the
/// snapshot and the index are regular files and the log reopens with
/// every record.
#[test]
fn a_fifo_or_symlink_at_a_scratch_name_is_replaced_not_written_through() {
    use common::odd_files::{place, within, Odd};
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let victim = root.path().join("victim");
    for odd in ["FIFO", "symlink"] {
        let dir = root.path().join(odd);
        std::fs::write(&victim, b"not fissionlog's").unwrap();
        let options = LogOptions {
            manifest_compact_records: 1,
            ..no_balancer_in(RecoveryMode::Strict)
        };
        let log = Log::open(&dir, options.clone()).unwrap();
        let pdir = dir.join("topics/t0/p0");
        let scratch = [
            dir.join("manifest.snap.tmp"),
            pdir.join("00000000000000000000.idx.tmp"),
        ];
        let mut placed = Vec::new();
        std::fs::create_dir_all(&pdir).unwrap();
        for path in &scratch {
            if odd == "FIFO" {
                placed.push(place(path, Odd::Fifo));
            } else {
                std::os::unix::fs::symlink(&victim, path).unwrap();
            }
        }
        within(
            std::time::Duration::from_secs(10),
            &format!("{odd}: create a topic (compaction) and roll"),
            move || {
                let t = log
                    .create_topic(
                        "t",
                        TopicConfig {
                            partitions: 1,
                            segment_bytes: 4096,
                            ..TopicConfig::default()
                        },
                    )
                    .unwrap();
                for i in 0..RECORDS / 10 {
                    t.append_batch(&[NewRecord {
                        key: Some(b"k"),
                        value: &value(i),
                        timestamp: Some(i as i64),
                    }])
                    .unwrap();
                }
                log.close().unwrap();
            },
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"not fissionlog's");
        for f in [
            dir.join("manifest.snap"),
            pdir.join("00000000000000000000.idx"),
        ] {
            let meta = std::fs::symlink_metadata(&f).unwrap();
            assert!(meta.is_file(), "{odd}: {} is {meta:?}", f.display());
        }
        drop(placed);
        let log = Log::open(&dir, options).unwrap();
        let p = log.topic("t").unwrap().partition(0).unwrap();
        assert_eq!(p.end_offset(), RECORDS / 10, "{odd}");
        log.close().unwrap();
    }
}

/// The log directory may be reached through a symlink, or through a
/// symlinked parent, and by a relative path: every file is written,
/// synced and recovered as through the real path (rolls, a tail split,
/// manifest compactions, checkpoints, an abandoned process), `verify`
/// through the link finds nothing wrong and changes nothing, and the
/// records are all there through the link and through the real path.
#[test]
fn a_log_reached_through_a_symlink_or_a_symlinked_parent_works_as_its_target() {
    use common::odd_files::*;
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let real = root.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let parent = root.path().join("parent");
    std::fs::create_dir(&parent).unwrap();
    let plink = root.path().join("plink");
    std::os::unix::fs::symlink("parent", &plink).unwrap();
    for (ctx, through, target) in [
        ("symlinked log directory", link.clone(), real.clone()),
        ("symlinked parent", plink.join("log"), parent.join("log")),
    ] {
        odd_files_log(&through);
        let before = DirImage::capture(&target).unwrap();
        let (_, problems) = fissionlog::verify(&through).unwrap();
        assert!(problems.is_empty(), "{ctx}: {problems:?}");
        let after = DirImage::capture(&target).unwrap();
        assert!(
            before == after,
            "{ctx}: verify changed {}",
            before.diff_summary(&after)
        );
        // An abandoned process, through the link: what was synced is there.
        let log = Log::open(&through, odd_files_options()).unwrap();
        let t = log.topic("t").unwrap();
        common::tail::append_big(&t, RECORDS, 10, 4);
        log.sync().unwrap();
        log.abandon();
        let log = Log::open(&target, odd_files_options()).unwrap();
        let seen = common::tail::read_all(&log.topic("t").unwrap());
        common::tail::check_exactly_once(&seen, 0..RECORDS + 10, ctx);
        log.close().unwrap();
        let log = Log::open(&through, odd_files_options()).unwrap();
        let seen = common::tail::read_all(&log.topic("t").unwrap());
        common::tail::check_exactly_once(&seen, 0..RECORDS + 10, ctx);
        log.close().unwrap();
    }
}

/// A log created at a relative path (`Log::open("log")`) makes its new
/// directory's entry durable like one created at an absolute path: the
/// directory it was created in (the working directory) is fsynced.
#[test]
fn a_log_created_at_a_relative_path_fsyncs_the_directory_it_was_created_in() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let cwd = std::env::current_dir().unwrap();
    std::env::set_current_dir(root.path()).unwrap();
    let hook = Arc::new(common::faults::Record::default());
    let opened = Log::open_with_hook("log", no_balancer_in(RecoveryMode::Strict), hook.clone())
        .and_then(|log| log.close());
    // Resolved in the working directory the log was created in.
    // Directories fsynced as `SyncNewDir`, in order.
    let synced = hook.paths(IoOp::SyncNewDir);
    let first = synced.first().and_then(|p| std::fs::canonicalize(p).ok());
    std::env::set_current_dir(&cwd).unwrap();
    opened.unwrap();
    assert!(
        first == std::fs::canonicalize(root.path()).ok(),
        "the directory holding the new log is not the first synced: {synced:?}"
    );
}

/// A topic or partition directory of the log that is a symlink (here to
/// the same partition of another log, which then shares its segment
/// files, outside this log's lock) is refused like a symlinked file: the
/// open fails with `NotARegularFile` naming it, and nothing is changed in
/// either log.
#[test]
fn a_symlinked_partition_or_topic_directory_is_refused_not_shared_with_another_log() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let a = root.path().join("a");
    synced_log(&a);
    for rel in ["topics/t0/p0", "topics/t0", "topics"] {
        let b = root.path().join(format!("b-{}", rel.replace('/', "-")));
        DirImage::capture(&a).unwrap().write_to(&b).unwrap();
        std::fs::remove_dir_all(b.join(rel)).unwrap();
        std::os::unix::fs::symlink(a.join(rel), b.join(rel)).unwrap();
        let log_a = Log::open(&a, no_balancer_in(RecoveryMode::Strict)).unwrap();
        let before = DirImage::capture(&a.join("topics")).unwrap();
        match Log::open(&b, no_balancer_in(RecoveryMode::Truncate)) {
            Err(Error::NotARegularFile { path, found }) => {
                assert_eq!((path, found), (b.join(rel), "symbolic link"), "{rel}")
            }
            Err(e) => panic!("{rel}: {e}"),
            Ok(log_b) => {
                log_b.abandon();
                panic!("{rel}: a second log opened sharing the first's files");
            }
        }
        let (_, problems) = fissionlog::verify(&b).unwrap();
        assert!(
            problems
                .iter()
                .any(|p| p.file == b.join(rel) && p.what.contains("symbolic link")),
            "{rel}: verify: {problems:?}"
        );
        assert!(
            before == DirImage::capture(&a.join("topics")).unwrap(),
            "{rel}: changed the first log's segments"
        );
        log_a.close().unwrap();
    }
    assert_all_records(&a);
}

/// A sparse index file of gigabytes (damage: no index is longer than a
/// fraction of its segment) is not read whole: `verify` and `dump` with a
/// 1 GiB address-space limit finish as they do without it, instead of
/// aborting on the allocation, and the next open rebuilds the index.
#[test]
fn a_sparse_index_of_gigabytes_is_not_read_whole() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    synced_log(&dir);
    let run = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fissionlog"));
        cmd.args(args)
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let limit = libc::rlimit {
            rlim_cur: 1 << 30,
            rlim_max: 1 << 30,
        };
        // SAFETY: the closure runs in the forked child before exec and
        // only calls setrlimit, which is async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.output().unwrap()
    };
    let args: [&[&str]; 2] = [&["verify"], &["dump", "--topic", "t"]];
    for a in args {
        let o = run(a);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{a:?} under the limit, healthy log: {o:?}"
        );
    }
    let idx = dir.join("topics/t0/p0/00000000000000000000.idx");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&idx)
        .unwrap();
    f.set_len(2 << 30).unwrap();
    drop(f);
    for a in args {
        let o = run(a);
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "{a:?} with a 2 GiB sparse index: {o:?}"
        );
    }
    assert_all_records(&dir);
    let len = std::fs::metadata(&idx).map(|m| m.len()).unwrap_or(0);
    assert!(len < 1 << 20, "the index was not rebuilt: {len} bytes");
}

/// A log without topics whose `topics` directory was made a symlink (to
/// another log's) while it was closed: the open refuses the link, as it
/// does for a log with topics, so no topic created later writes its files
/// into the other log, outside this log's lock.
#[test]
fn a_symlinked_topics_directory_of_a_log_without_topics_is_not_written_through() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let a = root.path().join("a");
    let b = root.path().join("b");
    Log::open(&a, no_balancer_in(RecoveryMode::Strict))
        .unwrap()
        .close()
        .unwrap();
    Log::open(&b, no_balancer_in(RecoveryMode::Strict))
        .unwrap()
        .close()
        .unwrap();
    let topics = a.join("topics");
    if topics.exists() {
        std::fs::remove_dir_all(&topics).unwrap();
    }
    std::fs::create_dir_all(b.join("topics")).unwrap();
    std::os::unix::fs::symlink(b.join("topics"), &topics).unwrap();
    let created = Log::open(&a, no_balancer_in(RecoveryMode::Strict)).and_then(|log| {
        let made = log
            .create_topic("t", fissionlog::TopicConfig::default())
            .map(drop);
        log.close().and(made)
    });
    let through = std::fs::read_dir(b.join("topics")).unwrap().count();
    match created {
        Err(Error::NotARegularFile { path, .. }) => assert_eq!(path, topics),
        Err(e) => panic!("{e}"),
        Ok(()) => panic!("the log opened and created a topic through a symlinked `topics`"),
    }
    assert_eq!(through, 0, "files went through the link into the other log");
}
