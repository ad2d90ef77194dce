//! Helpers for driving a log in a test, written once: the process-wide
//! test lock, the name a test has in its binary (for re-running it in a
//! child process), quiet options, a small topic, values and appends that
//! can be checked back, reads of a whole partition, one-record batches and
//! a fast temporary directory.

use std::sync::{Mutex, MutexGuard};

/// Held by every test that needs the process to itself: one that forks
/// a child (the child holds copies of the parent's descriptors, a log's
/// lock among them, until it execs, so a test closing and reopening a log
/// in that window would find its own directory locked), changes an
/// `RLIMIT`, or installs a signal handler. One lock for the whole binary,
/// since a binary holds the tests of many files.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The name libtest gives the test `name` defined in `module` (pass
/// `module_path!()`), for `--exact` when a test re-runs itself in a child
/// process: the module path without the binary's crate name.
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}

/// The routing hash seed of the shared test options: where a key lands
/// is the same in every run (a topic's key is random otherwise, and a
/// test whose shape depends on which keys share a partition would pass
/// or fail by chance).
pub const HASH_SEED: u64 = 2;

/// Options for a log the test drives alone: no balancer and no
/// background retention, so nothing splits, merges or deletes behind the
/// test's back.
pub fn quiet() -> fissionlog::LogOptions {
    fissionlog::LogOptions {
        balancer: false,
        background_retention: false,
        topic_hash_seed: Some(HASH_SEED),
        ..fissionlog::LogOptions::default()
    }
}

/// [`quiet`] opening in recovery `mode`.
pub fn quiet_in(mode: fissionlog::RecoveryMode) -> fissionlog::LogOptions {
    fissionlog::LogOptions {
        recovery: mode,
        ..quiet()
    }
}

/// Options with the balancer off and background retention on.
pub fn no_balancer() -> fissionlog::LogOptions {
    fissionlog::LogOptions {
        balancer: false,
        topic_hash_seed: Some(HASH_SEED),
        ..fissionlog::LogOptions::default()
    }
}

/// [`no_balancer`] opening in recovery `mode`.
pub fn no_balancer_in(mode: fissionlog::RecoveryMode) -> fissionlog::LogOptions {
    fissionlog::LogOptions {
        recovery: mode,
        ..no_balancer()
    }
}

/// The 100-byte value of record `i`: every record's bytes differ, so a
/// record read at the wrong offset shows.
pub fn value(i: u64) -> Vec<u8> {
    sized_value(i, 100)
}

/// The `len`-byte value of record `i`, the same pattern as [`value`].
pub fn sized_value(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
}

/// One keyless record, timestamped at append.
pub fn rec(v: &[u8]) -> [fissionlog::NewRecord<'_>; 1] {
    [fissionlog::NewRecord {
        key: None,
        value: v,
        timestamp: None,
    }]
}

/// A fast filesystem when there is one (fsyncs are cheap there, so rounds
/// and rolls come often), the default temporary directory otherwise.
pub fn fast_tempdir() -> tempfile::TempDir {
    if std::path::Path::new("/dev/shm").is_dir() {
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// A command that runs the test `name` of `module` (its `module_path!()`)
/// again, alone, in a child process of this test binary (ignored tests
/// included, so a child-only test can be `#[ignore]`d); the caller adds
/// its environment and how it takes the output.
pub fn rerun_command(module: &str, name: &str) -> std::process::Command {
    let exe = std::env::current_exe().expect("the path of the running test binary");
    let mut command = std::process::Command::new(exe);
    command.args([
        "--exact",
        &test_name(module, name),
        "--nocapture",
        "--test-threads=1",
        "--include-ignored",
    ]);
    command
}

/// Runs `cmd` (a [`rerun_command`]) with `RLIMIT_NOFILE` set to `limit`
/// in the child, and asserts that the scenario it reruns ran and passed;
/// `context` heads the failure message.
pub fn assert_rerun_passes_under_nofile(mut cmd: std::process::Command, limit: u64, context: &str) {
    let rlimit = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setrlimit, which is async-signal-safe; `rlimit` is a plain
    // value copied into the closure.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("the test binary runs again");
    assert!(
        out.status.success(),
        "{context}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "the child ran the scenario: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}
