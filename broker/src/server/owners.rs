//! Who owns each producer id, kept on disk so that a restart does not
//! hand an id to the first principal that uses it again.
//!
//! `broker-producer-owners` in the log directory: a magic line, then one
//! line per claim, `ID HEX(principal)`, appended and fdatasynced before the
//! claim is answered. The last line for an id wins. A torn last line (a
//! crash during its write: no newline) is dropped at open, and the file is
//! rewritten without it before anything is appended; any other line that
//! does not parse is corruption, and the server does not start. Once the
//! file holds more than [`COMPACT_LINES`] lines it is rewritten with the
//! owners kept in memory (a temporary file, fsync, rename, fsync of the
//! directory), so it stays bounded.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file in the log directory.
pub const OWNERS_FILE: &str = "broker-producer-owners";
const MAGIC: &str = "fissionlog-broker producer owners v1";
/// Lines past which the file is rewritten with the owners in memory.
const COMPACT_LINES: usize = 2 * super::producers::MAX_OWNERS;

fn io_err(path: &Path, e: std::io::Error) -> fissionlog::Error {
    fissionlog::Error::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

fn corrupt(path: &Path, line: usize, reason: String) -> fissionlog::Error {
    fissionlog::Error::Corruption {
        file: path.to_path_buf(),
        position: line as u64,
        reason,
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// The append handle of the owners file.
pub struct OwnersFile {
    dir: PathBuf,
    file: File,
    lines: usize,
}

impl OwnersFile {
    /// Opens (or creates) the file in `dir` and returns it with the owners
    /// it names, at most `limit` of them (the highest ids).
    pub fn open(
        dir: &Path,
        limit: usize,
    ) -> fissionlog::Result<(OwnersFile, BTreeMap<u64, String>)> {
        let path = dir.join(OWNERS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&path, e)),
        };
        let mut owners = BTreeMap::new();
        let mut clean = text.is_some();
        if let Some(text) = &text {
            let (whole, torn) = match text.rfind('\n') {
                Some(i) => (&text[..=i], &text[i + 1..]),
                None => ("", text.as_str()),
            };
            clean = torn.is_empty() && !whole.is_empty();
            let mut lines = whole.lines();
            match lines.next() {
                Some(MAGIC) => {}
                // Torn inside the magic line: nothing was claimed yet.
                None if MAGIC.starts_with(torn) => {}
                _ => {
                    return Err(corrupt(
                        &path,
                        0,
                        format!("not a producer owners file (expected {MAGIC:?})"),
                    ))
                }
            }
            for (n, line) in lines.enumerate() {
                let parsed = line
                    .split_once(' ')
                    .and_then(|(id, p)| Some((id.parse::<u64>().ok()?, unhex(p)?)));
                let Some((id, principal)) = parsed else {
                    return Err(corrupt(&path, n + 1, format!("bad line {line:?}")));
                };
                owners.insert(id, principal);
                if owners.len() > limit {
                    owners.pop_first();
                }
            }
        }
        let mut f = OwnersFile {
            dir: dir.to_path_buf(),
            file: File::open(dir).map_err(|e| io_err(dir, e))?,
            lines: 0,
        };
        if clean {
            f.file = OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(|e| io_err(&path, e))?;
            f.lines = text.map_or(0, |t| t.lines().count());
        } else {
            // No file, or one with a torn last line: written whole first.
            f.rewrite(&owners)?;
        }
        Ok((f, owners))
    }

    /// Records durably that `id` belongs to `principal`; `owners` is the
    /// table in memory, already holding the claim (what a compaction
    /// writes).
    pub fn append(
        &mut self,
        id: u64,
        principal: &str,
        owners: &BTreeMap<u64, String>,
    ) -> fissionlog::Result<()> {
        if self.lines >= COMPACT_LINES {
            return self.rewrite(owners);
        }
        let path = self.dir.join(OWNERS_FILE);
        self.file
            .write_all(format!("{id} {}\n", hex(principal)).as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(|e| io_err(&path, e))?;
        self.lines += 1;
        Ok(())
    }

    /// Writes the file anew with `owners`: a temporary file, fsync,
    /// rename, fsync of the directory.
    fn rewrite(&mut self, owners: &BTreeMap<u64, String>) -> fissionlog::Result<()> {
        let path = self.dir.join(OWNERS_FILE);
        let tmp = self.dir.join(format!("{OWNERS_FILE}.tmp"));
        let mut text = format!("{MAGIC}\n");
        for (id, p) in owners {
            text.push_str(&format!("{id} {}\n", hex(p)));
        }
        let mut f = File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| io_err(&tmp, e))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(|e| io_err(&path, e))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(&self.dir, e))?;
        self.file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        self.lines = owners.len() + 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_round_trip_through_hex() {
        for p in ["", "alice", "a b\nc", "ünï"] {
            assert_eq!(unhex(&hex(p)).as_deref(), Some(p));
        }
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("abc"), None);
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_the_file_rewritten_whole() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let empty = BTreeMap::new();
        let (mut f, owners) = OwnersFile::open(dir.path(), 10).expect("a new file");
        assert!(owners.is_empty());
        f.append(1, "alice", &empty).expect("appended");
        f.append(2, "bob", &empty).expect("appended");
        drop(f);
        let path = dir.path().join(OWNERS_FILE);
        let mut text = std::fs::read_to_string(&path).expect("the file");
        text.push_str("3 6361");
        std::fs::write(&path, &text).expect("a torn line");
        let (mut f, owners) = OwnersFile::open(dir.path(), 10).expect("opens past a torn line");
        assert_eq!(owners.get(&1).map(String::as_str), Some("alice"));
        assert_eq!(owners.get(&2).map(String::as_str), Some("bob"));
        assert_eq!(owners.get(&3), None);
        f.append(3, "carol", &owners).expect("appended");
        drop(f);
        let (_, owners) = OwnersFile::open(dir.path(), 10).expect("reopens");
        assert_eq!(owners.get(&3).map(String::as_str), Some("carol"));
    }

    #[test]
    fn a_bad_line_in_the_middle_is_corruption() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join(OWNERS_FILE);
        std::fs::write(&path, format!("{MAGIC}\n1 616c\nnot a line\n2 62\n")).expect("write");
        assert!(matches!(
            OwnersFile::open(dir.path(), 10),
            Err(fissionlog::Error::Corruption { .. })
        ));
        std::fs::write(&path, "something else\n").expect("write");
        assert!(matches!(
            OwnersFile::open(dir.path(), 10),
            Err(fissionlog::Error::Corruption { .. })
        ));
    }

    #[test]
    fn the_file_is_compacted_to_the_owners_kept() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (mut f, mut owners) = OwnersFile::open(dir.path(), 4).expect("a new file");
        for id in 1..=10 {
            owners.insert(id, format!("p{id}"));
            if owners.len() > 4 {
                owners.pop_first();
            }
            // As if the file had grown to the bound: this append compacts.
            f.lines = COMPACT_LINES;
            f.append(id, &format!("p{id}"), &owners).expect("appended");
        }
        let lines = std::fs::read_to_string(dir.path().join(OWNERS_FILE))
            .expect("the file")
            .lines()
            .count();
        assert_eq!(lines, 4 + 1, "the magic line and the 4 owners kept");
        let (_, back) = OwnersFile::open(dir.path(), 4).expect("reopens");
        assert_eq!(back, owners);
    }
}
