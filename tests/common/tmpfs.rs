//! Size-limited filesystems for full-disk tests: a tmpfs mounted for the
//! test (the suite runs as root in CI; elsewhere such tests are skipped
//! with a notice), a child process to run a scenario that could die with
//! SIGBUS, and a filler that takes every free byte.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Names the test a child process of the test binary runs.
pub const CHILD_ENV: &str = "FISSIONLOG_TEST_CHILD";
/// The directory that child works in.
pub const CHILD_DIR_ENV: &str = "FISSIONLOG_TEST_CHILD_DIR";

/// A tmpfs of a fixed size, unmounted on drop.
pub struct Tmpfs {
    pub path: PathBuf,
    _root: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` bytes; `None` (with a notice) when this
    /// process may not mount (not root): CI runs the suite as root.
    pub fn mount(bytes: u64) -> Option<Tmpfs> {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("mnt");
        std::fs::create_dir(&path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("run mount");
        if !out.status.success() {
            // SAFETY: geteuid has no preconditions.
            let root_user = unsafe { libc::geteuid() } == 0;
            assert!(
                !root_user,
                "mounting a tmpfs failed as root: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!("skipped: mounting a size-limited tmpfs needs root");
            return None;
        }
        Some(Tmpfs { path, _root: root })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Runs the test `name` of `module` (its `module_path!()`) again in a
/// child process with `dir` and returns its exit status (a SIGBUS kills
/// only the child). The child finds itself with [`child_dir`]`(name)`.
pub fn run_child(module: &str, name: &str, dir: &Path) -> std::process::Output {
    super::log::rerun_command(module, name)
        .env(CHILD_ENV, name)
        .env(CHILD_DIR_ENV, dir)
        .output()
        .expect("spawn the test binary")
}

pub fn child_dir(name: &str) -> Option<PathBuf> {
    (std::env::var(CHILD_ENV).ok().as_deref() == Some(name))
        .then(|| PathBuf::from(std::env::var(CHILD_DIR_ENV).expect("dir for the child")))
}

pub fn assert_child_ok(name: &str, out: &std::process::Output) {
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{name} child failed ({:?}, signal {:?}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.status.signal(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes a file that takes all the space left on the filesystem.
pub fn fill_disk(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0xa5u8; 64 << 10];
    loop {
        match f.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling the disk: {e}"),
        }
    }
    // Smaller pieces take what 64 KiB writes could not.
    let small = [0x5au8; 512];
    while f.write_all(&small).is_ok() {}
}
