//! The manifest on disk: journal + snapshot, replay and compaction.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::RecoveryMode;
use crate::error::{Error, IoContext, Result};
use crate::format::manifest::{self as fmt, JournalTail, ManifestRecord, ManifestState};
use crate::storage::fault::{IoHook, IoOp};
use crate::storage::file::{
    create_scratch, open_file, open_optional, read_optional, read_to_end, Access,
};
use crate::storage::{sync_dir, sync_file};
use crate::topology::model;

pub(crate) use crate::layout::{JOURNAL_FILE, SNAPSHOT_FILE};

/// The longest journal or snapshot read: the journal is compacted every
/// `manifest_compact_records` records, and a snapshot holds one topology.
/// A longer file is not one fissionlog wrote, and reading it whole could
/// exhaust memory.
pub(crate) const MANIFEST_FILE_MAX_BYTES: u64 = 1 << 30;

/// What replaying the manifest found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ManifestReport {
    /// Records replayed from the journal.
    pub records_replayed: u64,
    /// Torn tail cut off the journal (position, reason).
    pub torn_tail: Option<(u64, String)>,
    /// Corruption cut off the journal under truncate/salvage (position, reason).
    pub corruption_truncated: Option<(u64, String)>,
    /// Whether a snapshot was loaded.
    pub snapshot_loaded: bool,
}

/// A state with at most this many entries (partitions, removed ones, tail
/// moves, group positions: [`state_entries`]) is compacted inline by the
/// commit that makes the journal long enough: its snapshot is tens of
/// kilobytes, written in well under the fsyncs every compaction costs
/// anyway, and tests see a compaction at the record that triggers it. A
/// larger one is compacted by the log's background thread
/// ([`Manifest::begin_compaction`]), so no change waits for megabytes of
/// snapshot to be serialized and synced.
pub(crate) const INLINE_COMPACTION_MAX_ENTRIES: usize = 1024;

/// A journal this many times longer than the compaction interval is
/// compacted inline whatever the state's size: the background thread is
/// not keeping up (or not running), and the journal must stay bounded.
pub(crate) const BACKGROUND_COMPACTION_SLACK: u32 = 4;

/// The entries a snapshot of `state` holds, a measure of its size that
/// costs no serialization.
pub(crate) fn state_entries(state: &ManifestState) -> usize {
    state
        .topics
        .iter()
        .map(|t| {
            t.partitions.len()
                + t.removed.len()
                + t.tail_moves.len()
                + t.groups.iter().map(|g| g.positions.len()).sum::<usize>()
        })
        .sum()
}

/// The open manifest.
#[derive(Debug)]
pub struct Manifest {
    dir: PathBuf,
    journal: File,
    seq: u64,
    since_snapshot: u32,
    /// Format version of the journal file's header.
    version: u16,
    hook: Arc<dyn IoHook>,
    /// The snapshot writer's lock, holding the number of journal
    /// replacements so far. Whoever writes `manifest.snap` holds it, so a
    /// background compaction can never rename an older snapshot over the
    /// one an inline compaction wrote meanwhile; a background compaction
    /// finishes only if the count did not move since it began.
    snapshots: Arc<parking_lot::Mutex<u64>>,
    /// A background compaction has begun and not finished.
    compacting: bool,
}

/// A compaction begun under the topology lock ([`Manifest::begin_compaction`]):
/// a copy of the state at journal record `seq`, written as the snapshot
/// without the lock ([`CompactionJob::write_snapshot`]), then finished
/// under it ([`Manifest::finish_compaction`]) by replacing the journal
/// with the records committed meanwhile.
///
/// Crash safety, as for [`Manifest::compact`]: the snapshot is made durable
/// (tmp, fsync, rename, fsync of the directory) before the journal is
/// touched, and records up to `seq` in the old journal replay over it as
/// already applied; the new journal, holding exactly the old one's bytes
/// past `seq`, is made durable the same way before it replaces the old
/// one. A crash at any point leaves the old snapshot with the old journal,
/// the new snapshot with the old journal, or both new: all three replay to
/// the same state.
#[derive(Debug)]
pub(crate) struct CompactionJob {
    dir: PathBuf,
    hook: Arc<dyn IoHook>,
    snapshots: Arc<parking_lot::Mutex<u64>>,
    /// The journal replacements counted when the job began.
    epoch: u64,
    seq: u64,
    /// Where record `seq` ends in the journal.
    journal_end: u64,
    state: ManifestState,
}

impl CompactionJob {
    /// Writes the snapshot of the job's state, durably, unless an inline
    /// compaction replaced the journal since the job began (then `false`:
    /// its snapshot is newer). Takes no topology lock.
    pub(crate) fn write_snapshot(&self) -> Result<bool> {
        let epoch = self.snapshots.lock();
        if *epoch != self.epoch {
            return Ok(false);
        }
        write_snapshot(&self.dir, &*self.hook, self.seq, &self.state)?;
        Ok(true)
    }
}

/// Writes `state` at `seq` as the snapshot: tmp, fsync, rename, fsync of
/// the directory. The caller holds the snapshot writer's lock.
fn write_snapshot(dir: &Path, hook: &dyn IoHook, seq: u64, state: &ManifestState) -> Result<()> {
    let snap = dir.join(SNAPSHOT_FILE);
    let tmp = dir.join("manifest.snap.tmp");
    let payload = serde_json::to_vec(state).map_err(|e| Error::InvalidConfig(e.to_string()))?;
    let mut bytes = fmt::encode_file_header(fmt::SNAPSHOT_MAGIC).to_vec();
    bytes.extend(fmt::encode_frame(seq, &payload));
    write_durable(hook, &tmp, &bytes)?;
    std::fs::rename(&tmp, &snap).at(&snap)?;
    sync_dir(hook, IoOp::SyncManifestDir, dir)
}

fn load_snapshot(path: &Path) -> Result<Option<(u64, ManifestState)>> {
    let Some(buf) = read_optional(path, MANIFEST_FILE_MAX_BYTES)? else {
        return Ok(None);
    };
    refuse_newer(&buf, fmt::SNAPSHOT_MAGIC, path)?;
    fmt::check_file_header(&buf, fmt::SNAPSHOT_MAGIC).map_err(|e| Error::corruption(path, 0, e))?;
    let frame = fmt::decode_frame(&buf[fmt::MANIFEST_HEADER_LEN..])
        .map_err(|e| Error::corruption(path, fmt::MANIFEST_HEADER_LEN as u64, e))?;
    let state: ManifestState = serde_json::from_slice(frame.payload).map_err(|e| {
        Error::corruption(
            path,
            fmt::MANIFEST_HEADER_LEN as u64,
            format!("snapshot payload: {e}"),
        )
    })?;
    model::check_state(&state)
        .map_err(|e| Error::corruption(path, fmt::MANIFEST_HEADER_LEN as u64, e))?;
    Ok(Some((frame.seq, state)))
}

/// A manifest file written by a newer format is refused, never repaired.
fn refuse_newer(buf: &[u8], magic: [u8; 8], path: &Path) -> Result<()> {
    match fmt::newer_version(buf, magic) {
        Some(found) => Err(Error::UnsupportedVersion {
            file: path.to_path_buf(),
            found,
            supported: fmt::MANIFEST_VERSION,
        }),
        None => Ok(()),
    }
}

/// Replays snapshot + journal bytes into a state (pure; used by open and the fuzzer).
pub fn replay(
    snapshot: Option<(u64, ManifestState)>,
    journal: &[u8],
    journal_path: &Path,
    mode: RecoveryMode,
) -> Result<(ManifestState, u64, u64, ManifestReport)> {
    let mut report = ManifestReport {
        snapshot_loaded: snapshot.is_some(),
        ..Default::default()
    };
    let (snap_seq, mut state) = snapshot.unwrap_or_default();
    let decoded =
        fmt::decode_journal(journal).map_err(|e| Error::corruption(journal_path, 0, e))?;
    let mut seq = snap_seq;
    let mut valid_end = decoded.valid_end;
    for (pos, frame) in &decoded.frames {
        if frame.seq <= snap_seq {
            continue;
        }
        let rec: ManifestRecord = serde_json::from_slice(frame.payload)
            .map_err(|e| Error::corruption(journal_path, *pos, format!("manifest record: {e}")))?;
        if let Err(e) = model::apply(&mut state, &rec) {
            // A CRC-valid record that does not apply is damage, not a torn write.
            if mode == RecoveryMode::Strict {
                return Err(Error::corruption(
                    journal_path,
                    *pos,
                    format!("manifest record does not apply: {e}"),
                ));
            }
            report.corruption_truncated = Some((*pos, e));
            valid_end = *pos;
            break;
        }
        seq = frame.seq;
        report.records_replayed += 1;
    }
    match decoded.tail {
        JournalTail::Clean => {}
        JournalTail::Torn { position, reason } => {
            report.torn_tail = Some((position, reason.to_string()))
        }
        JournalTail::Corrupt {
            position, reason, ..
        } => {
            if mode == RecoveryMode::Strict {
                return Err(Error::corruption(
                    journal_path,
                    position,
                    format!("{reason}, and valid records follow"),
                ));
            }
            if report.corruption_truncated.is_none() {
                report.corruption_truncated = Some((position, reason.to_string()));
            }
        }
    }
    Ok((state, seq, valid_end, report))
}

impl Manifest {
    /// Whether `dir` holds a manifest.
    pub fn exists(dir: &Path) -> bool {
        dir.join(JOURNAL_FILE).exists() || dir.join(SNAPSHOT_FILE).exists()
    }

    /// Creates an empty manifest (new log).
    pub fn create(dir: &Path, hook: Arc<dyn IoHook>) -> Result<Manifest> {
        let path = dir.join(JOURNAL_FILE);
        let mut f = open_file(&path, Access::CreateNew)?;
        f.write_all(&fmt::encode_file_header(fmt::JOURNAL_MAGIC))
            .at(&path)?;
        sync_file(&*hook, IoOp::SyncManifestFile, &f, &path, false)?;
        sync_dir(&*hook, IoOp::SyncManifestDir, dir)?;
        Ok(Manifest {
            dir: dir.to_path_buf(),
            journal: f,
            seq: 0,
            since_snapshot: 0,
            version: fmt::MANIFEST_VERSION,
            hook,
            snapshots: Arc::default(),
            compacting: false,
        })
    }

    /// Opens and replays. `read_only` leaves a torn tail in place.
    pub fn open(
        dir: &Path,
        mode: RecoveryMode,
        read_only: bool,
        hook: Arc<dyn IoHook>,
    ) -> Result<(Manifest, ManifestState, ManifestReport)> {
        let path = dir.join(JOURNAL_FILE);
        let snapshot = load_snapshot(&dir.join(SNAPSHOT_FILE))?;
        // Read from the descriptor that is kept: the bytes replayed are
        // those of the file appended to.
        let access = if read_only {
            Access::Read
        } else {
            Access::ReadWrite
        };
        let journal = open_optional(&path, access)?;
        let buf = match &journal {
            Some(f) => read_to_end(f, &path, MANIFEST_FILE_MAX_BYTES)?,
            None if snapshot.is_some() => fmt::encode_file_header(fmt::JOURNAL_MAGIC).to_vec(),
            None => {
                return Err(Error::NotALog {
                    path: dir.to_path_buf(),
                })
            }
        };
        refuse_newer(&buf, fmt::JOURNAL_MAGIC, &path)?;
        let (state, seq, valid_end, report) = replay(snapshot, &buf, &path, mode)?;
        let f = match journal {
            Some(f) => f,
            // Only a snapshot: the journal is created empty (a read-only
            // open finds it missing, as before).
            None if read_only => open_file(&path, Access::Read)?,
            None => open_file(&path, Access::OpenOrCreate)?,
        };
        if !read_only && (valid_end as usize) < buf.len() {
            // Cut the torn tail (and zero nothing: the file shrinks; the
            // journal is never mapped).
            f.set_len(valid_end).at(&path)?;
            sync_file(&*hook, IoOp::SyncManifestFile, &f, &path, false)?;
        }
        if !read_only && buf.len() < fmt::MANIFEST_HEADER_LEN {
            (&f).write_all(&fmt::encode_file_header(fmt::JOURNAL_MAGIC))
                .at(&path)?;
            sync_file(&*hook, IoOp::SyncManifestFile, &f, &path, false)?;
        }
        let since = report.records_replayed as u32;
        let version = match fmt::file_version(&buf) {
            Some(v) if buf.len() >= fmt::MANIFEST_HEADER_LEN => v,
            // Rewritten above with this build's header.
            _ => fmt::MANIFEST_VERSION,
        };
        Ok((
            Manifest {
                dir: dir.to_path_buf(),
                journal: f,
                seq,
                since_snapshot: since,
                version,
                hook,
                snapshots: Arc::default(),
                compacting: false,
            },
            state,
            report,
        ))
    }

    /// Appends one record and makes it durable: the change is committed
    /// exactly when this returns Ok.
    pub fn commit(&mut self, rec: &ManifestRecord) -> Result<()> {
        let hook = &*self.hook;
        let path = self.dir.join(JOURNAL_FILE);
        let payload = serde_json::to_vec(rec).map_err(|e| Error::InvalidConfig(e.to_string()))?;
        let frame = fmt::encode_frame(self.seq + 1, &payload);
        hook.before(IoOp::WriteManifest, &path).at(&path)?;
        let len = self.journal.metadata().at(&path)?.len();
        use std::os::unix::fs::FileExt;
        let written = self.journal.write_all_at(&frame, len).and_then(|()| {
            hook.before(IoOp::SyncManifest, &path)?;
            let r = self.journal.sync_data();
            hook.after(IoOp::SyncManifest, &path, r)
        });
        if let Err(e) = written {
            // The outcome is unknown: the record (or part of it) may be on
            // disk, and a failed fdatasync may have written it or not. Taking
            // it back out with an unsynced truncation could not be trusted
            // either, so nothing is undone here: the caller poisons the log,
            // and the next open replays whatever reached the disk (a torn
            // record is cut there).
            return Err(Error::io(&path, e));
        }
        self.seq += 1;
        self.since_snapshot += 1;
        Ok(())
    }

    /// Format version of the journal on disk. A record newer than it is
    /// committed only after a compaction rewrote both files at this
    /// build's version ([`Manifest::compact`]).
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Whether the journal is long enough to compact.
    pub fn wants_compaction(&self, every: u32) -> bool {
        self.since_snapshot >= every
    }

    /// Whether the commit that made the journal long enough compacts it
    /// now ([`Manifest::compact`]) rather than leave it to the background
    /// thread: a small state, or a journal the background is not keeping
    /// up with.
    pub(crate) fn compacts_inline(&self, every: u32, state: &ManifestState) -> bool {
        self.since_snapshot >= every.saturating_mul(BACKGROUND_COMPACTION_SLACK)
            || state_entries(state) <= INLINE_COMPACTION_MAX_ENTRIES
    }

    /// Begins a background compaction of `state` (the topology lock is
    /// held: it is the state at the last committed record) if the journal
    /// is long enough and none is under way. Costs one copy of the state.
    pub(crate) fn begin_compaction(
        &mut self,
        every: u32,
        state: &ManifestState,
    ) -> Result<Option<CompactionJob>> {
        if self.compacting || !self.wants_compaction(every) {
            return Ok(None);
        }
        let path = self.dir.join(JOURNAL_FILE);
        let journal_end = self.journal.metadata().at(&path)?.len();
        let epoch = *self.snapshots.lock();
        self.compacting = true;
        Ok(Some(CompactionJob {
            dir: self.dir.clone(),
            hook: self.hook.clone(),
            snapshots: self.snapshots.clone(),
            epoch,
            seq: self.seq,
            journal_end,
            state: state.clone(),
        }))
    }

    /// Finishes `job` under the topology lock: if its snapshot was written
    /// (`written`) and no inline compaction ran since it began, replaces
    /// the journal with one holding only the records committed after the
    /// snapshot's. A failure here or in `written` is returned for the
    /// caller to poison the log (as an inline compaction's is).
    pub(crate) fn finish_compaction(
        &mut self,
        job: CompactionJob,
        written: Result<bool>,
    ) -> Result<()> {
        self.compacting = false;
        if !written? {
            return Ok(());
        }
        let snapshots = self.snapshots.clone();
        let mut epoch = snapshots.lock();
        if *epoch != job.epoch {
            return Ok(());
        }
        let jpath = self.dir.join(JOURNAL_FILE);
        let len = self.journal.metadata().at(&jpath)?.len();
        let mut bytes = fmt::encode_file_header(fmt::JOURNAL_MAGIC).to_vec();
        let since = len.saturating_sub(job.journal_end);
        let start = bytes.len();
        bytes.resize(start + since as usize, 0);
        use std::os::unix::fs::FileExt;
        self.journal
            .read_exact_at(&mut bytes[start..], job.journal_end)
            .at(&jpath)?;
        self.replace_journal(&bytes)?;
        self.since_snapshot = (self.seq - job.seq) as u32;
        *epoch += 1;
        drop(epoch);
        sync_dir(&*self.hook, IoOp::SyncManifestDir, &self.dir)
    }

    /// Writes `bytes` as the new journal (durably) and renames it over the
    /// old one, switching the handle to it. The caller fsyncs the
    /// directory next.
    fn replace_journal(&mut self, bytes: &[u8]) -> Result<()> {
        let jtmp = self.dir.join("manifest.log.tmp");
        write_durable(&*self.hook, &jtmp, bytes)?;
        let jpath = self.dir.join(JOURNAL_FILE);
        std::fs::rename(&jtmp, &jpath).at(&jpath)?;
        // From the rename on, the old handle names an unlinked file: switch
        // before anything else can fail. If the directory fsync then fails,
        // the caller poisons the log (a power loss may bring either journal
        // back; both replay to the same state, but no later commit may
        // depend on which).
        self.journal = open_file(&jpath, Access::ReadWrite)?;
        self.version = fmt::MANIFEST_VERSION;
        Ok(())
    }

    /// Writes a snapshot of `state` and empties the journal, inline (the
    /// caller holds the topology lock). A background compaction under way
    /// is then stale and finishes without touching either file.
    pub fn compact(&mut self, state: &ManifestState) -> Result<()> {
        let snapshots = self.snapshots.clone();
        let mut epoch = snapshots.lock();
        write_snapshot(&self.dir, &*self.hook, self.seq, state)?;
        // Records up to `seq` are in the snapshot; a crash before the journal
        // is replaced replays them as already applied (their seq is <= seq).
        *epoch += 1;
        self.replace_journal(&fmt::encode_file_header(fmt::JOURNAL_MAGIC))?;
        drop(epoch);
        self.since_snapshot = 0;
        sync_dir(&*self.hook, IoOp::SyncManifestDir, &self.dir)
    }
}

fn write_durable(hook: &dyn IoHook, path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = create_scratch(path)?;
    f.write_all(bytes).at(path)?;
    sync_file(hook, IoOp::SyncManifestFile, &f, path, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fault::NoFaults;
    use crate::topology::model::tests::{part, whole_range_topic};
    use parking_lot::Mutex;

    /// The manifest's files in one directory image, by name.
    type Image = Vec<(&'static str, Vec<u8>)>;

    /// Copies the manifest's files before every I/O step it takes while
    /// `on`: the directories a crash at that step could leave.
    #[derive(Debug, Default)]
    struct Images {
        dir: Mutex<Option<PathBuf>>,
        taken: Mutex<Vec<Image>>,
    }

    impl Images {
        fn take(&self) {
            let Some(dir) = self.dir.lock().clone() else {
                return;
            };
            let files = [JOURNAL_FILE, SNAPSHOT_FILE]
                .into_iter()
                .filter_map(|f| Some((f, std::fs::read(dir.join(f)).ok()?)))
                .collect();
            self.taken.lock().push(files);
        }
    }

    impl IoHook for Images {
        fn before(&self, _op: IoOp, _path: &Path) -> std::io::Result<()> {
            self.take();
            Ok(())
        }
    }

    /// The records of a topic whose partition `0..` splits in halves:
    /// record `i` splits partition `i - 1`'s left child.
    fn records(n: u32) -> Vec<ManifestRecord> {
        let topic = whole_range_topic();
        let mut out = vec![ManifestRecord::CreateTopic(topic)];
        let (mut parent, mut end) = (0u32, u64::MAX);
        for i in 0..n {
            let mid = end / 2;
            let (l, r) = (2 * i + 1, 2 * i + 2);
            out.push(ManifestRecord::Split {
                topic_id: 0,
                parent,
                seal_offset: u64::from(i),
                children: vec![
                    part(l, (0, mid), vec![parent]),
                    part(r, (mid + 1, end), vec![parent]),
                ],
            });
            (parent, end) = (l, mid);
        }
        out
    }

    fn replay_image(files: &[(&str, Vec<u8>)]) -> ManifestState {
        let root = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            std::fs::write(root.path().join(name), bytes).unwrap();
        }
        let (_, state, _) =
            Manifest::open(root.path(), RecoveryMode::Strict, true, Arc::new(NoFaults)).unwrap();
        state
    }

    /// A background compaction with records committed while its snapshot
    /// is written: a crash before any of its I/O steps leaves files that
    /// replay to every record committed by then, and once it finished the
    /// journal holds only the records after the snapshot's.
    #[test]
    fn a_crash_at_any_step_of_a_background_compaction_replays_to_the_same_state() {
        let root = tempfile::tempdir().unwrap();
        let images = Arc::new(Images::default());
        let mut m = Manifest::create(root.path(), images.clone()).unwrap();
        let recs = records(12);
        let mut state = ManifestState::default();
        let commit = |m: &mut Manifest, state: &mut ManifestState, rec: &ManifestRecord| {
            model::apply(state, rec).unwrap();
            m.commit(rec).unwrap();
        };
        for rec in &recs[..8] {
            commit(&mut m, &mut state, rec);
        }
        let job = m
            .begin_compaction(4, &state)
            .unwrap()
            .expect("journal long enough");
        assert!(
            m.begin_compaction(4, &state).unwrap().is_none(),
            "one at a time"
        );
        // Committed after the copy: in neither the snapshot nor lost.
        commit(&mut m, &mut state, &recs[8]);
        commit(&mut m, &mut state, &recs[9]);
        let at_snapshot = state.clone();
        *images.dir.lock() = Some(root.path().to_path_buf());
        assert!(job.write_snapshot().unwrap());
        images.take();
        *images.dir.lock() = None;
        commit(&mut m, &mut state, &recs[10]);
        let at_finish = state.clone();
        *images.dir.lock() = Some(root.path().to_path_buf());
        m.finish_compaction(job, Ok(true)).unwrap();
        images.take();
        *images.dir.lock() = None;
        let taken = images.taken.lock().clone();
        assert!(taken.len() >= 6, "every step imaged: {}", taken.len());
        let snapshot_steps = taken.len() - 4;
        for (i, files) in taken.iter().enumerate() {
            let expected = if i <= snapshot_steps {
                &at_snapshot
            } else {
                &at_finish
            };
            assert_eq!(&replay_image(files), expected, "crash before step {i}");
        }
        // The journal now holds records 9 to 11 (the snapshot has 1 to 8),
        // and more commit on top of it.
        assert_eq!(m.since_snapshot, 3);
        commit(&mut m, &mut state, &recs[11]);
        let (_, again, report) =
            Manifest::open(root.path(), RecoveryMode::Strict, true, Arc::new(NoFaults)).unwrap();
        assert_eq!(again, state);
        assert!(report.snapshot_loaded);
        assert_eq!(report.records_replayed, 4);
    }

    /// An inline compaction while a background one is under way makes the
    /// background one stale: it writes no snapshot (an older one would
    /// replace the newer) and leaves the journal alone.
    #[test]
    fn an_inline_compaction_makes_a_background_one_under_way_stale() {
        let root = tempfile::tempdir().unwrap();
        let mut m = Manifest::create(root.path(), Arc::new(NoFaults)).unwrap();
        let recs = records(6);
        let mut state = ManifestState::default();
        for rec in &recs[..5] {
            model::apply(&mut state, rec).unwrap();
            m.commit(rec).unwrap();
        }
        let job = m
            .begin_compaction(2, &state)
            .unwrap()
            .expect("journal long enough");
        model::apply(&mut state, &recs[5]).unwrap();
        m.commit(&recs[5]).unwrap();
        m.compact(&state).unwrap();
        assert!(!job.write_snapshot().unwrap(), "stale");
        m.finish_compaction(job, Ok(false)).unwrap();
        let (_, again, report) =
            Manifest::open(root.path(), RecoveryMode::Strict, true, Arc::new(NoFaults)).unwrap();
        assert_eq!(again, state);
        assert_eq!(report.records_replayed, 0);
    }
}
