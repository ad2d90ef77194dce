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

    /// Writes a snapshot of `state` and empties the journal.
    pub fn compact(&mut self, state: &ManifestState) -> Result<()> {
        let snap = self.dir.join(SNAPSHOT_FILE);
        let tmp = self.dir.join("manifest.snap.tmp");
        let payload = serde_json::to_vec(state).map_err(|e| Error::InvalidConfig(e.to_string()))?;
        let mut bytes = fmt::encode_file_header(fmt::SNAPSHOT_MAGIC).to_vec();
        bytes.extend(fmt::encode_frame(self.seq, &payload));
        write_durable(&*self.hook, &tmp, &bytes)?;
        std::fs::rename(&tmp, &snap).at(&snap)?;
        sync_dir(&*self.hook, IoOp::SyncManifestDir, &self.dir)?;
        // Records up to `seq` are in the snapshot; a crash before the journal
        // is replaced replays them as already applied (their seq is <= seq).
        let jtmp = self.dir.join("manifest.log.tmp");
        write_durable(
            &*self.hook,
            &jtmp,
            &fmt::encode_file_header(fmt::JOURNAL_MAGIC),
        )?;
        let jpath = self.dir.join(JOURNAL_FILE);
        std::fs::rename(&jtmp, &jpath).at(&jpath)?;
        // From the rename on, the old handle names an unlinked file: switch
        // before anything else can fail. If the directory fsync then fails,
        // the caller poisons the log (a power loss may bring either journal
        // back; both replay to the same state, but no later commit may
        // depend on which).
        self.journal = open_file(&jpath, Access::ReadWrite)?;
        self.since_snapshot = 0;
        self.version = fmt::MANIFEST_VERSION;
        sync_dir(&*self.hook, IoOp::SyncManifestDir, &self.dir)
    }
}

fn write_durable(hook: &dyn IoHook, path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = create_scratch(path)?;
    f.write_all(bytes).at(path)?;
    sync_file(hook, IoOp::SyncManifestFile, &f, path, false)
}
