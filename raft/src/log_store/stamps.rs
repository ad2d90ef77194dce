//! The producer stamps of a group's stamped appends, in a side file
//! `raft-stamps` beside the partition's segments, until a format-2 data
//! batch has a place for the stamp (docs/REPLICATION.md, "Status").
//!
//! One fixed-size record per stamped entry: its full log id (term, leader,
//! index), the stamp, a CRC. Keyed by the full log id, so a stamp left by
//! a truncated entry never attaches to the different entry that later
//! takes its index (Raft's log matching: one log id, one entry). Each
//! append's stamps are written and fdatasynced **before** its entries
//! reach the segment, so an entry that survives a crash always has its
//! stamp; a stamp whose entry did not survive is never looked up. A torn
//! record at the tail (a crash mid-write) is cut on open.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fissionlog::RaftLogId;

use crate::types::ProducerStamp;
use crate::vote::VoteIo;

/// The side file's name in the partition's directory.
pub const STAMPS_FILE: &str = "raft-stamps";

const RECORD_LEN: usize = 8 * 3 + 8 + 4 + 8 + 4;

fn encode(id: RaftLogId, s: &ProducerStamp) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[0..8].copy_from_slice(&id.term.to_le_bytes());
    b[8..16].copy_from_slice(&id.leader.to_le_bytes());
    b[16..24].copy_from_slice(&id.index.to_le_bytes());
    b[24..32].copy_from_slice(&s.producer_id.to_le_bytes());
    b[32..36].copy_from_slice(&s.epoch.to_le_bytes());
    b[36..44].copy_from_slice(&s.first_sequence.to_le_bytes());
    let crc = crc32fast::hash(&b[..44]);
    b[44..48].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn decode(b: &[u8]) -> Option<(RaftLogId, ProducerStamp)> {
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&b[44..48]);
    if crc32fast::hash(&b[..44]) != u32::from_le_bytes(crc) {
        return None;
    }
    let mut epoch = [0u8; 4];
    epoch.copy_from_slice(&b[32..36]);
    Some((
        RaftLogId {
            term: u64_at(b, 0),
            leader: u64_at(b, 8),
            index: u64_at(b, 16),
        },
        ProducerStamp {
            producer_id: u64_at(b, 24),
            epoch: u32::from_le_bytes(epoch),
            first_sequence: u64_at(b, 36),
        },
    ))
}

/// The stamps of one group's log.
#[derive(Debug)]
pub struct Stamps {
    dir: PathBuf,
    path: PathBuf,
    file: File,
    io: Arc<dyn VoteIo>,
    /// Whether the file's name is known durable: it held a stamp at open,
    /// and a file gets its first stamp only after its directory was
    /// fsynced ([`Stamps::save`]).
    name_durable: bool,
    /// Raft index → (the entry's full id, its stamp); the latest record
    /// for an index wins (a rewrite after a truncation).
    by_index: HashMap<u64, (RaftLogId, ProducerStamp)>,
}

impl Stamps {
    /// Opens (or creates) the side file in `dir`, cutting a torn tail;
    /// its fsyncs go through `fio`.
    pub fn open(dir: &Path, fio: Arc<dyn VoteIo>) -> crate::Result<Stamps> {
        let path = dir.join(STAMPS_FILE);
        let io = |op: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| crate::Error::Io { op, path, source }
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io("open", &path))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io("read", &path))?;
        let mut by_index = HashMap::new();
        let mut good = 0usize;
        for rec in bytes.chunks_exact(RECORD_LEN) {
            let Some((id, stamp)) = decode(rec) else {
                break;
            };
            by_index.insert(id.index, (id, stamp));
            good += RECORD_LEN;
        }
        if good < bytes.len() {
            // A torn record: its append never returned (its stamps are
            // synced before any of its entries is written).
            file.set_len(good as u64).map_err(io("truncate", &path))?;
            fio.sync_held(&file, &path)
                .map_err(io("fdatasync", &path))?;
        }
        Ok(Stamps {
            name_durable: good > 0,
            dir: dir.to_path_buf(),
            path,
            file,
            io: fio,
            by_index,
        })
    }

    /// Writes the stamps of entries about to be appended, durably.
    pub fn save(&mut self, stamps: &[(RaftLogId, ProducerStamp)]) -> std::io::Result<()> {
        if stamps.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(stamps.len() * RECORD_LEN);
        for (id, s) in stamps {
            buf.extend_from_slice(&encode(*id, s));
        }
        if !self.name_durable {
            // An fdatasync does not make a new file's name durable: without
            // this, a power loss could take the whole file while the
            // entries it stamps, written after it, survive in a segment
            // whose directory a later roll synced. Once per open, and only
            // until the file holds its first stamp.
            self.io.sync_dir(&self.dir)?;
            self.name_durable = true;
        }
        self.file.write_all(&buf)?;
        self.io.sync_held(&self.file, &self.path)?;
        for (id, s) in stamps {
            self.by_index.insert(id.index, (*id, *s));
        }
        Ok(())
    }

    /// The stamp of the entry with log id `id`, if it had one.
    pub fn get(&self, id: RaftLogId) -> Option<ProducerStamp> {
        self.by_index
            .get(&id.index)
            .filter(|(at, _)| *at == id)
            .map(|(_, s)| *s)
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vote::StdVoteIo;

    fn id(term: u64, index: u64) -> RaftLogId {
        RaftLogId {
            term,
            leader: 1,
            index,
        }
    }

    fn stamp(seq: u64) -> ProducerStamp {
        ProducerStamp {
            producer_id: 7,
            epoch: 2,
            first_sequence: seq,
        }
    }

    #[test]
    fn stamps_survive_a_reopen_and_attach_only_to_their_own_log_id() -> crate::Result<()> {
        let dir = tempfile::tempdir().map_err(|source| crate::Error::Io {
            op: "tempdir",
            path: PathBuf::new(),
            source,
        })?;
        let mut s = Stamps::open(dir.path(), Arc::new(StdVoteIo))?;
        s.save(&[(id(1, 3), stamp(0)), (id(1, 4), stamp(5))])
            .map_err(|source| crate::Error::Io {
                op: "save",
                path: PathBuf::new(),
                source,
            })?;
        drop(s);
        let s = Stamps::open(dir.path(), Arc::new(StdVoteIo))?;
        assert_eq!(s.get(id(1, 3)), Some(stamp(0)));
        assert_eq!(s.get(id(1, 4)), Some(stamp(5)));
        // Same index, another term: a different entry, no stamp.
        assert_eq!(s.get(id(2, 4)), None);
        Ok(())
    }

    #[test]
    fn a_torn_tail_record_is_cut_and_the_records_before_it_kept() -> crate::Result<()> {
        let dir = tempfile::tempdir().map_err(|source| crate::Error::Io {
            op: "tempdir",
            path: PathBuf::new(),
            source,
        })?;
        let mut s = Stamps::open(dir.path(), Arc::new(StdVoteIo))?;
        s.save(&[(id(1, 3), stamp(0)), (id(1, 4), stamp(5))])
            .map_err(|source| crate::Error::Io {
                op: "save",
                path: PathBuf::new(),
                source,
            })?;
        let path = s.path().to_path_buf();
        drop(s);
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert_eq!(len, 2 * RECORD_LEN as u64);
        let f = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|source| crate::Error::Io {
                op: "open",
                path: path.clone(),
                source,
            })?;
        f.set_len(len - 5).map_err(|source| crate::Error::Io {
            op: "truncate",
            path: path.clone(),
            source,
        })?;
        drop(f);
        let s = Stamps::open(dir.path(), Arc::new(StdVoteIo))?;
        assert_eq!(s.get(id(1, 3)), Some(stamp(0)));
        assert_eq!(s.get(id(1, 4)), None);
        assert_eq!(
            std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
            RECORD_LEN as u64
        );
        Ok(())
    }

    /// Records the order of the directory and file syncs; the real calls
    /// run underneath.
    #[derive(Debug, Default)]
    struct Recording(std::sync::Mutex<Vec<String>>);

    impl VoteIo for Recording {
        fn write_file(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
            StdVoteIo.write_file(path, bytes)
        }
        fn sync_file(&self, path: &Path) -> std::io::Result<()> {
            StdVoteIo.sync_file(path)
        }
        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            StdVoteIo.rename(from, to)
        }
        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            self.0.lock().unwrap().push("sync-dir".into());
            StdVoteIo.sync_dir(dir)
        }
        fn read_file(&self, path: &Path) -> std::io::Result<Option<Vec<u8>>> {
            StdVoteIo.read_file(path)
        }
        fn sync_held(&self, file: &File, path: &Path) -> std::io::Result<()> {
            let len = file.metadata()?.len();
            self.0.lock().unwrap().push(format!("sync-file {len}"));
            StdVoteIo.sync_held(file, path)
        }
    }

    #[test]
    fn a_new_files_name_is_made_durable_before_its_first_stamp_and_only_then() -> crate::Result<()>
    {
        let dir = tempfile::tempdir().map_err(|source| crate::Error::Io {
            op: "tempdir",
            path: PathBuf::new(),
            source,
        })?;
        let rec = Arc::new(Recording::default());
        let save = |s: &mut Stamps, at: u64| {
            s.save(&[(id(1, at), stamp(at))])
                .map_err(|source| crate::Error::Io {
                    op: "save",
                    path: PathBuf::new(),
                    source,
                })
        };
        let mut s = Stamps::open(dir.path(), rec.clone())?;
        save(&mut s, 1)?;
        save(&mut s, 2)?;
        drop(s);
        let one = RECORD_LEN;
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec![
                "sync-dir".to_string(),
                format!("sync-file {one}"),
                format!("sync-file {}", 2 * one)
            ],
            "the directory is fsynced before the first stamp is written, once"
        );
        // Reopened with stamps in it: the name is durable already.
        rec.0.lock().unwrap().clear();
        let mut s = Stamps::open(dir.path(), rec.clone())?;
        save(&mut s, 3)?;
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec![format!("sync-file {}", 3 * one)]
        );
        Ok(())
    }
}
