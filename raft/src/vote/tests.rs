use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::Vote;

use super::*;

fn vote(term: u64, node: u64) -> Vote<NodeId> {
    Vote::new(term, node)
}

fn committed(term: u64, node: u64) -> Vote<NodeId> {
    Vote::new_committed(term, node)
}

// ---------------------------------------------------------------------
// A disk that keeps what a power loss keeps: a file's content is durable
// at its own last fsync, a directory entry at its directory's last fsync
// (files here live in one directory).

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Write(PathBuf),
    SyncFile(PathBuf),
    Rename(PathBuf, PathBuf),
    SyncDir(PathBuf),
}

#[derive(Debug, Clone, Default)]
struct Inode {
    now: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Debug, Clone, Default)]
struct DiskState {
    inodes: Vec<Inode>,
    entries_now: BTreeMap<PathBuf, usize>,
    entries_durable: BTreeMap<PathBuf, usize>,
    steps: Vec<Step>,
    /// Steps still allowed before the "power" goes: each later call fails,
    /// so nothing after it reaches the disk.
    steps_left: Option<usize>,
    skip_file_sync: bool,
    skip_dir_sync: bool,
}

#[derive(Debug, Clone, Default)]
struct SimDisk(Arc<Mutex<DiskState>>);

impl SimDisk {
    fn state(&self) -> std::sync::MutexGuard<'_, DiskState> {
        // A test helper: a poisoned lock means another assertion already failed.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_step(&self, step: Step) -> io::Result<std::sync::MutexGuard<'_, DiskState>> {
        let mut s = self.state();
        if let Some(left) = s.steps_left.as_mut() {
            if *left == 0 {
                return Err(io::Error::other("power lost"));
            }
            *left -= 1;
        }
        s.steps.push(step);
        Ok(s)
    }

    /// Every disk a power loss now could leave: each name whose entry is
    /// not durable either kept its old entry or got the new one; each
    /// unsynced file holds its durable content, its new content or a torn
    /// prefix of the new content.
    fn crash_images(&self) -> Vec<SimDisk> {
        let s = self.state();
        let mut names: Vec<PathBuf> = s.entries_now.keys().cloned().collect();
        for n in s.entries_durable.keys() {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        let mut entry_choices: Vec<BTreeMap<PathBuf, usize>> = vec![BTreeMap::new()];
        for name in &names {
            let options: Vec<Option<usize>> = {
                let a = s.entries_durable.get(name).copied();
                let b = s.entries_now.get(name).copied();
                if a == b {
                    vec![a]
                } else {
                    vec![a, b]
                }
            };
            let mut next = Vec::new();
            for base in &entry_choices {
                for opt in &options {
                    let mut m = base.clone();
                    if let Some(i) = opt {
                        m.insert(name.clone(), *i);
                    }
                    next.push(m);
                }
            }
            entry_choices = next;
        }
        let mut content_choices: Vec<Vec<Vec<u8>>> = vec![Vec::new()];
        for inode in &s.inodes {
            let mut options = vec![inode.durable.clone()];
            if inode.now != inode.durable {
                options.push(inode.now.clone());
                options.push(inode.now[..inode.now.len() / 2].to_vec());
            }
            let mut next = Vec::new();
            for base in &content_choices {
                for o in &options {
                    let mut v = base.clone();
                    v.push(o.clone());
                    next.push(v);
                }
            }
            content_choices = next;
        }
        let mut images = Vec::new();
        for entries in &entry_choices {
            for contents in &content_choices {
                let inodes = contents
                    .iter()
                    .map(|c| Inode {
                        now: c.clone(),
                        durable: c.clone(),
                    })
                    .collect();
                images.push(SimDisk(Arc::new(Mutex::new(DiskState {
                    inodes,
                    entries_now: entries.clone(),
                    entries_durable: entries.clone(),
                    ..DiskState::default()
                }))));
            }
        }
        images
    }
}

impl VoteIo for SimDisk {
    fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut s = self.take_step(Step::Write(path.to_path_buf()))?;
        match s.entries_now.get(path).copied() {
            Some(i) => s.inodes[i].now = bytes.to_vec(),
            None => {
                s.inodes.push(Inode {
                    now: bytes.to_vec(),
                    durable: Vec::new(),
                });
                let i = s.inodes.len() - 1;
                s.entries_now.insert(path.to_path_buf(), i);
            }
        }
        Ok(())
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        let mut s = self.take_step(Step::SyncFile(path.to_path_buf()))?;
        if s.skip_file_sync {
            return Ok(());
        }
        let i = *s.entries_now.get(path).ok_or(io::ErrorKind::NotFound)?;
        s.inodes[i].durable = s.inodes[i].now.clone();
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.take_step(Step::Rename(from.to_path_buf(), to.to_path_buf()))?;
        let i = s.entries_now.remove(from).ok_or(io::ErrorKind::NotFound)?;
        s.entries_now.insert(to.to_path_buf(), i);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.take_step(Step::SyncDir(dir.to_path_buf()))?;
        if !s.skip_dir_sync {
            s.entries_durable = s.entries_now.clone();
        }
        Ok(())
    }

    fn read_file(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        let s = self.state();
        Ok(s.entries_now.get(path).map(|&i| s.inodes[i].now.clone()))
    }
}

fn dir() -> PathBuf {
    PathBuf::from("/group")
}

/// A disk holding `old` durably, the way a completed save leaves it.
fn disk_with(old: Option<Vote<NodeId>>) -> SimDisk {
    let disk = SimDisk::default();
    if let Some(v) = old {
        let mut f = VoteFile::with_io(dir(), Arc::new(disk.clone()));
        f.save(&v)
            .unwrap_or_else(|e| panic!("saving the first vote: {e}"));
    }
    disk.state().steps.clear();
    disk
}

fn read_on(disk: &SimDisk) -> Result<Option<Vote<NodeId>>> {
    VoteFile::with_io(dir(), Arc::new(disk.clone())).read()
}

/// For every crash image of `disk`, the vote read back (or the error).
fn outcomes(disk: &SimDisk) -> Vec<Result<Option<Vote<NodeId>>>> {
    disk.crash_images().iter().map(read_on).collect()
}

// ---------------------------------------------------------------------

#[test]
fn a_saved_vote_reads_back_equal_after_reopening_the_file() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let mut f = VoteFile::new(tmp.path());
    assert_eq!(f.read().ok(), Some(None), "no vote before the first save");
    for v in [
        vote(1, 2),
        committed(1, 2),
        vote(7, u64::MAX),
        committed(u64::MAX, 0),
    ] {
        f.save(&v).unwrap_or_else(|e| panic!("save {v}: {e}"));
        let again = VoteFile::new(tmp.path());
        assert_eq!(again.read().ok(), Some(Some(v)));
    }
    assert!(
        !tmp.path().join(VOTE_TMP_FILE).exists(),
        "a completed save leaves no scratch file"
    );
}

#[test]
fn a_save_writes_then_fsyncs_the_tmp_then_renames_then_fsyncs_the_directory() {
    let disk = disk_with(None);
    let mut f = VoteFile::with_io(dir(), Arc::new(disk.clone()));
    f.save(&vote(3, 1)).unwrap_or_else(|e| panic!("save: {e}"));
    let (tmp, file) = (dir().join(VOTE_TMP_FILE), dir().join(VOTE_FILE));
    assert_eq!(
        disk.state().steps,
        vec![
            Step::Write(tmp.clone()),
            Step::SyncFile(tmp.clone()),
            Step::Rename(tmp, file),
            Step::SyncDir(dir()),
        ]
    );
}

#[test]
fn a_crash_between_any_two_steps_of_a_save_keeps_the_old_or_the_new_vote() {
    let (old, new) = (vote(4, 1), committed(5, 2));
    for first_vote in [None, Some(old)] {
        for steps_done in 0..=4 {
            let disk = disk_with(first_vote);
            disk.state().steps_left = Some(steps_done);
            let mut f = VoteFile::with_io(dir(), Arc::new(disk.clone()));
            let saved = f.save(&new);
            assert_eq!(saved.is_ok(), steps_done == 4, "after {steps_done} steps");
            for got in outcomes(&disk) {
                match got {
                    Ok(v) if v == first_vote || v == Some(new) => {}
                    other => panic!(
                        "crash after {steps_done} steps of a save over {first_vote:?} \
                         read {other:?}, not the old or the new vote"
                    ),
                }
            }
            if saved.is_ok() {
                for got in outcomes(&disk) {
                    assert_eq!(got.ok(), Some(Some(new)), "a returned save is durable");
                }
            }
        }
    }
}

#[test]
fn the_crash_model_catches_a_save_without_the_file_fsync_or_the_directory_fsync() {
    // The proof that the test above could fail: drop either fsync and a
    // crash after the save returned loses or tears the new vote.
    for (skip_file, skip_dir) in [(true, false), (false, true)] {
        let disk = disk_with(Some(vote(4, 1)));
        {
            let mut s = disk.state();
            s.skip_file_sync = skip_file;
            s.skip_dir_sync = skip_dir;
        }
        let mut f = VoteFile::with_io(dir(), Arc::new(disk.clone()));
        f.save(&committed(5, 2))
            .unwrap_or_else(|e| panic!("save: {e}"));
        let lost = outcomes(&disk)
            .into_iter()
            .any(|got| got.ok() != Some(Some(committed(5, 2))));
        assert!(
            lost,
            "without the {} fsync some crash image must lose the vote",
            if skip_file { "file" } else { "directory" }
        );
    }
}

#[test]
fn a_leftover_or_torn_tmp_file_is_never_read_and_the_next_save_replaces_it() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let mut f = VoteFile::new(tmp.path());
    f.save(&vote(2, 9)).unwrap_or_else(|e| panic!("save: {e}"));
    let full = encode_vote(&vote(3, 1));
    for leftover in [&full[..], &full[..10], &[0xFFu8; 3][..]] {
        std::fs::write(tmp.path().join(VOTE_TMP_FILE), leftover)
            .unwrap_or_else(|e| panic!("write tmp: {e}"));
        assert_eq!(
            VoteFile::new(tmp.path()).read().ok(),
            Some(Some(vote(2, 9)))
        );
    }
    f.save(&vote(4, 4))
        .unwrap_or_else(|e| panic!("save over a leftover: {e}"));
    assert_eq!(
        VoteFile::new(tmp.path()).read().ok(),
        Some(Some(vote(4, 4)))
    );
}

#[test]
fn every_truncation_of_a_vote_file_is_refused_as_corrupt() {
    let bytes = encode_vote(&committed(8, 3));
    for len in 0..bytes.len() {
        match decode_vote(Path::new("vote"), &bytes[..len]) {
            Err(Error::CorruptVote { .. }) => {}
            other => panic!("{len} of {} bytes gave {other:?}", bytes.len()),
        }
    }
    let mut longer = bytes.to_vec();
    longer.push(0);
    assert!(matches!(
        decode_vote(Path::new("vote"), &longer),
        Err(Error::CorruptVote { .. })
    ));
}

#[test]
fn every_flipped_bit_of_a_vote_file_is_refused_never_read_as_another_vote() {
    let bytes = encode_vote(&committed(8, 3));
    for i in 0..bytes.len() * 8 {
        let mut b = bytes;
        b[i / 8] ^= 1 << (i % 8);
        match decode_vote(Path::new("vote"), &b) {
            Err(Error::CorruptVote { .. }) | Err(Error::UnsupportedVoteVersion { .. }) => {}
            other => panic!("bit {i} flipped gave {other:?}"),
        }
    }
}

#[test]
fn a_vote_file_of_a_newer_version_is_refused_with_its_version() {
    let mut b = encode_vote(&vote(1, 1));
    b[8] = 2;
    let crc = crc32fast::hash(&b[0..32]);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    match decode_vote(Path::new("vote"), &b) {
        Err(Error::UnsupportedVoteVersion {
            version: 2,
            supported: 1,
            ..
        }) => {}
        other => panic!("gave {other:?}"),
    }
}

#[test]
fn a_corrupt_vote_file_on_disk_is_a_typed_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let path = tmp.path().join(VOTE_FILE);
    let mut b = encode_vote(&vote(6, 2));
    b[20] ^= 0x40;
    std::fs::write(&path, b).unwrap_or_else(|e| panic!("write: {e}"));
    match VoteFile::new(tmp.path()).read() {
        Err(Error::CorruptVote { path: p, reason }) => {
            assert_eq!(p, path);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("gave {other:?}"),
    }
}

#[test]
fn a_failed_fsync_refuses_every_later_save_until_the_file_is_reopened() {
    let disk = disk_with(Some(vote(1, 1)));
    disk.state().steps_left = Some(1); // the write succeeds, the fsync fails
    let mut f = VoteFile::with_io(dir(), Arc::new(disk.clone()));
    match f.save(&vote(2, 1)) {
        Err(Error::Io { op: "fsync", .. }) => {}
        other => panic!("gave {other:?}"),
    }
    disk.state().steps_left = None;
    match f.save(&vote(2, 1)) {
        Err(Error::VoteFilePoisoned { reason, .. }) => assert!(reason.contains("fsync")),
        other => panic!("gave {other:?}"),
    }
    assert_eq!(disk.state().steps.len(), 1, "a poisoned file does no I/O");
    let mut reopened = VoteFile::with_io(dir(), Arc::new(disk.clone()));
    assert_eq!(reopened.read().ok(), Some(Some(vote(1, 1))));
    reopened
        .save(&vote(2, 1))
        .unwrap_or_else(|e| panic!("save after reopening: {e}"));
}

#[test]
fn a_vote_path_that_is_a_symlink_or_a_directory_is_refused_not_followed() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::write(&elsewhere, encode_vote(&vote(3, 3))).unwrap_or_else(|e| panic!("{e}"));
    let group = tmp.path().join("group");
    std::fs::create_dir(&group).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(&elsewhere, group.join(VOTE_FILE))
        .unwrap_or_else(|e| panic!("symlink: {e}"));
    match VoteFile::new(&group).read() {
        Err(Error::Io { op: "read", .. }) => {}
        other => panic!("a symlinked vote gave {other:?}"),
    }
    std::fs::remove_file(group.join(VOTE_FILE)).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir(group.join(VOTE_FILE)).unwrap_or_else(|e| panic!("{e}"));
    match VoteFile::new(&group).read() {
        Err(Error::Io { op: "read", .. }) => {}
        other => panic!("a directory named vote gave {other:?}"),
    }
}

#[test]
fn a_leftover_tmp_that_is_a_symlink_is_replaced_not_written_through() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, b"someone else's bytes").unwrap_or_else(|e| panic!("{e}"));
    let group = tmp.path().join("group");
    std::fs::create_dir(&group).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(&victim, group.join(VOTE_TMP_FILE))
        .unwrap_or_else(|e| panic!("symlink: {e}"));
    let mut file = VoteFile::new(&group);
    file.save(&vote(4, 2))
        .unwrap_or_else(|e| panic!("save over a symlinked tmp: {e}"));
    assert_eq!(
        std::fs::read(&victim).unwrap_or_else(|e| panic!("{e}")),
        b"someone else's bytes"
    );
    assert_eq!(VoteFile::new(&group).read().ok(), Some(Some(vote(4, 2))));
}

#[test]
fn a_huge_sparse_vote_file_is_refused_as_corrupt_without_reading_it_whole() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let f = std::fs::File::create(tmp.path().join(VOTE_FILE)).unwrap_or_else(|e| panic!("{e}"));
    let mut head = encode_vote(&vote(1, 1)).to_vec();
    head.truncate(VOTE_FILE_LEN);
    std::io::Write::write_all(&mut &f, &head).unwrap_or_else(|e| panic!("{e}"));
    // A terabyte, sparse: reading it whole would ask for a terabyte of memory.
    f.set_len(1 << 40)
        .unwrap_or_else(|e| panic!("set_len: {e}"));
    match VoteFile::new(tmp.path()).read() {
        Err(Error::CorruptVote { .. }) => {}
        other => panic!("a terabyte vote file gave {other:?}"),
    }
}

#[test]
fn a_second_handle_on_one_directory_cannot_save_while_the_first_holds_it() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let mut first = VoteFile::new(tmp.path());
    let mut second = VoteFile::new(tmp.path());
    first
        .save(&vote(5, 1))
        .unwrap_or_else(|e| panic!("first save: {e}"));
    // Two writers would interleave their tmp files: one could acknowledge a
    // vote the file no longer holds, or overwrite a newer vote with an older.
    assert!(
        second.save(&vote(3, 2)).is_err(),
        "a second writer overwrote the vote"
    );
    assert_eq!(first.read().ok(), Some(Some(vote(5, 1))));
    drop(first);
    let mut third = VoteFile::new(tmp.path());
    third
        .save(&vote(6, 1))
        .unwrap_or_else(|e| panic!("save once the first handle is gone: {e}"));
}
