//! Power-loss simulation for directory trees (see DESIGN.md, "Testing strategy").
//!
//! This file holds the page rules ([`mix_file`]) and the whole-tree model
//! ([`power_loss_image`]: one durable snapshot for the whole tree). The crash
//! tests use the per-file model of `durable.rs`, which builds on the same
//! page rules but makes each file and directory durable only at its own
//! fsync; the whole-tree model stays for its self-tests and for tools that
//! only have two snapshots.
//!
//! The engine writes through the page cache (mmap). A power loss keeps all data
//! covered by a completed sync and an arbitrary subset of the 4 KiB pages written
//! after it, each page either new, old (zeros for fresh space) or torn (a prefix
//! new, the rest old); a file or directory created after the last sync may be
//! missing, and a file deleted after it may reappear.
//!
//! Usage: take `DirImage::capture(dir)` when each sync returns (`durable`), and
//! at the crash point capture again (`current`); then
//! `power_loss_image(&durable, &current, seed, &opts).write_to(fresh_dir)` and
//! open the log in `fresh_dir`. Every random choice derives from `seed` alone,
//! so a failing case is reproduced from the seed (and the two images).
//!
//! Std-only; the PRNG is an internal SplitMix64.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Size of a page of the simulated page cache.
pub const PAGE_SIZE: usize = 4096;
/// Size of a sector: default granularity of torn writes inside a page.
pub const SECTOR_SIZE: usize = 512;
/// Name of the lock file, whose content is never captured (it stays present, empty).
pub const LOCK_FILE_NAME: &str = "fissionlog.lock";

/// An in-memory copy of a directory tree. Paths are relative to the captured root;
/// the root itself is not in `dirs`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirImage {
    /// Relative path → full file content.
    pub files: BTreeMap<PathBuf, Vec<u8>>,
    /// Every (non-root) directory, relative. Always contains the ancestors of every file
    /// when built by `capture`, `insert_file` or `power_loss_image`.
    pub dirs: BTreeSet<PathBuf>,
}

fn is_not_found(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

impl DirImage {
    /// An empty image.
    pub fn new() -> DirImage {
        DirImage::default()
    }

    /// Reads the whole tree under `root` (which must exist). Files and directories
    /// that vanish during the walk are skipped. The content of any file named
    /// `fissionlog.lock` is not read (it is recorded as present and empty).
    /// Symlinks and special files are ignored.
    pub fn capture(root: &Path) -> io::Result<DirImage> {
        let mut image = DirImage::new();
        // Fail loudly if the root itself is unreadable.
        let entries = fs::read_dir(root)?;
        image.capture_entries(root, PathBuf::new(), entries)?;
        Ok(image)
    }

    fn capture_entries(
        &mut self,
        root: &Path,
        rel_dir: PathBuf,
        entries: fs::ReadDir,
    ) -> io::Result<()> {
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(e),
            };
            let file_type = match entry.file_type() {
                Ok(t) => t,
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(e),
            };
            let rel = rel_dir.join(entry.file_name());
            if file_type.is_dir() {
                let sub = match fs::read_dir(root.join(&rel)) {
                    Ok(s) => s,
                    Err(e) if is_not_found(&e) => continue,
                    Err(e) => return Err(e),
                };
                self.dirs.insert(rel.clone());
                self.capture_entries(root, rel, sub)?;
            } else if file_type.is_file() {
                if entry.file_name() == LOCK_FILE_NAME {
                    self.files.insert(rel, Vec::new());
                    continue;
                }
                match fs::read(root.join(&rel)) {
                    Ok(bytes) => {
                        self.files.insert(rel, bytes);
                    }
                    Err(e) if is_not_found(&e) => continue,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Materializes the image under `root`, which is created if missing and must
    /// otherwise be empty (error `AlreadyExists` if not).
    pub fn write_to(&self, root: &Path) -> io::Result<()> {
        fs::create_dir_all(root)?;
        if fs::read_dir(root)?.next().is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("DirImage::write_to: {} is not empty", root.display()),
            ));
        }
        for dir in &self.dirs {
            fs::create_dir_all(root.join(dir))?;
        }
        for (rel, bytes) in &self.files {
            let path = root.join(rel);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::write(&path, bytes)?;
        }
        Ok(())
    }

    /// Adds (or replaces) a file and records all its ancestor directories.
    pub fn insert_file(&mut self, rel: impl Into<PathBuf>, bytes: impl Into<Vec<u8>>) {
        let rel = rel.into();
        add_ancestors(&mut self.dirs, &rel);
        self.files.insert(rel, bytes.into());
    }

    /// Adds a directory and all its ancestors.
    pub fn insert_dir(&mut self, rel: impl Into<PathBuf>) {
        let rel = rel.into();
        add_ancestors(&mut self.dirs, &rel);
        self.dirs.insert(rel);
    }

    /// Content of a file, if present.
    pub fn file(&self, rel: impl AsRef<Path>) -> Option<&[u8]> {
        self.files.get(rel.as_ref()).map(|v| v.as_slice())
    }

    /// A short human-readable description of how `self` differs from `other`
    /// (for assertion messages).
    pub fn diff_summary(&self, other: &DirImage) -> String {
        let mut out = String::new();
        for (rel, a) in &self.files {
            match other.files.get(rel) {
                None => out.push_str(&format!(
                    "- file {} only in left ({} bytes)\n",
                    rel.display(),
                    a.len()
                )),
                Some(b) if a != b => {
                    let first = a.iter().zip(b.iter()).position(|(x, y)| x != y);
                    out.push_str(&format!(
                        "~ file {}: len {} vs {}, first differing byte {:?}\n",
                        rel.display(),
                        a.len(),
                        b.len(),
                        first
                    ));
                }
                Some(_) => {}
            }
        }
        for (rel, b) in &other.files {
            if !self.files.contains_key(rel) {
                out.push_str(&format!(
                    "+ file {} only in right ({} bytes)\n",
                    rel.display(),
                    b.len()
                ));
            }
        }
        for d in self.dirs.difference(&other.dirs) {
            out.push_str(&format!("- dir {} only in left\n", d.display()));
        }
        for d in other.dirs.difference(&self.dirs) {
            out.push_str(&format!("+ dir {} only in right\n", d.display()));
        }
        out
    }
}

fn add_ancestors(dirs: &mut BTreeSet<PathBuf>, rel: &Path) {
    let mut p = rel.parent();
    while let Some(d) = p {
        if d.as_os_str().is_empty() {
            break;
        }
        dirs.insert(d.to_path_buf());
        p = d.parent();
    }
}

/// Knobs of the power-loss model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CrashOptions {
    /// Torn pages may be cut at any byte (default: only at multiples of 512 bytes).
    pub torn_any_byte: bool,
    /// Probability of returning `current` unchanged (a process kill: the page
    /// cache survives). Default 0.0.
    pub keep_all_new_probability: f64,
}

/// Deterministic PRNG (SplitMix64).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        // Multiply-shift; the bias is negligible for the small n used here.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

/// A sub-generator for one named decision, independent of iteration order, so
/// adding or removing one file does not change the choices made for the others.
pub fn rng_for(seed: u64, salt: u64, rel: &Path) -> SplitMix64 {
    // FNV-1a over the path bytes, then mixed with the seed and a salt.
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for &b in rel.as_os_str().as_encoded_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    let mut m = SplitMix64::new(seed ^ salt.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let a = m.next_u64();
    SplitMix64::new(a ^ h)
}

pub const SALT_GLOBAL: u64 = 1;
pub const SALT_DIR: u64 = 2;
pub const SALT_FILE: u64 = 3;
/// Salt of the per-file model's directory-entry decisions (`durable.rs`).
pub const SALT_ENTRY: u64 = 4;

/// The state a power loss may leave. `durable` is the snapshot taken when the
/// last sync returned (everything in it survives, except files deleted since);
/// `current` is the tree as it is now (page cache). See the module docs and
/// `power_loss_image_traced` for the exact rules.
pub fn power_loss_image(
    durable: &DirImage,
    current: &DirImage,
    seed: u64,
    opts: &CrashOptions,
) -> DirImage {
    build(durable, current, seed, opts, None)
}

/// Same as `power_loss_image` (identical result for the same arguments), plus
/// a log of every random choice, for failure messages.
///
/// Rules:
/// - with probability `opts.keep_all_new_probability`, the result is `current`;
/// - a directory in `current` and `durable` is present; one only in `current`
///   is present with probability 1/2 if its parent is present (a missing
///   directory takes everything below it); one only in `durable` reappears with
///   probability 1/2, and whenever a file below it reappears;
/// - a file in both: its length is the durable or the current one (1/2 each);
///   each 4 KiB page of the result whose bytes differ between old (durable,
///   zero-extended) and new (current, zero-extended) is, 1/3 each, the new page,
///   the old page, or torn: new bytes before a cut (a multiple of 512 in
///   1..4096, or any byte in 1..4096 with `torn_any_byte`), old bytes after;
/// - a file only in `current`: missing with probability 1/2 (always if its
///   directory is missing), else as above against an empty old file (length 0
///   or the current length, pages new / zeros / torn);
/// - a file only in `durable`: reappears with its durable content with
///   probability 1/2.
pub fn power_loss_image_traced(
    durable: &DirImage,
    current: &DirImage,
    seed: u64,
    opts: &CrashOptions,
) -> (DirImage, Vec<String>) {
    let mut trace = Vec::new();
    let image = build(durable, current, seed, opts, Some(&mut trace));
    (image, trace)
}

fn build(
    durable: &DirImage,
    current: &DirImage,
    seed: u64,
    opts: &CrashOptions,
    mut trace: Option<&mut Vec<String>>,
) -> DirImage {
    let mut log = |s: String| {
        if let Some(t) = trace.as_mut() {
            t.push(s);
        }
    };

    let mut global = rng_for(seed, SALT_GLOBAL, Path::new(""));
    if global.unit_f64() < opts.keep_all_new_probability {
        log(format!("seed {seed}: keep all new (process kill)"));
        return current.clone();
    }

    let mut out = DirImage::new();

    // Directories; BTreeSet<PathBuf> order visits parents before children.
    let all_dirs: BTreeSet<&PathBuf> = durable.dirs.iter().chain(current.dirs.iter()).collect();
    for dir in all_dirs {
        let in_durable = durable.dirs.contains(dir);
        let in_current = current.dirs.contains(dir);
        let present = if in_durable && in_current {
            true
        } else if in_current {
            let parent_ok = match dir.parent() {
                Some(p) if !p.as_os_str().is_empty() => out.dirs.contains(p),
                _ => true,
            };
            let coin = rng_for(seed, SALT_DIR, dir).coin();
            let present = parent_ok && coin;
            log(format!(
                "dir {} (new since sync): {}",
                dir.display(),
                if present {
                    "present"
                } else if !parent_ok {
                    "missing (parent missing)"
                } else {
                    "missing"
                }
            ));
            present
        } else {
            let present = rng_for(seed, SALT_DIR, dir).coin();
            log(format!(
                "dir {} (deleted since sync): {}",
                dir.display(),
                if present {
                    "reappears"
                } else {
                    "stays deleted"
                }
            ));
            present
        };
        if present {
            out.dirs.insert(dir.clone());
        }
    }

    let parent_present = |dirs: &BTreeSet<PathBuf>, rel: &Path| match rel.parent() {
        Some(p) if !p.as_os_str().is_empty() => dirs.contains(p),
        _ => true,
    };

    // Files present now (in both, or only in current).
    for (rel, new) in &current.files {
        let mut rng = rng_for(seed, SALT_FILE, rel);
        let old: &[u8] = match durable.files.get(rel) {
            Some(old) => old,
            None => {
                let coin = rng.coin();
                if !parent_present(&out.dirs, rel) {
                    log(format!(
                        "file {} (new since sync): missing (directory missing)",
                        rel.display()
                    ));
                    continue;
                }
                if !coin {
                    log(format!("file {} (new since sync): missing", rel.display()));
                    continue;
                }
                log(format!("file {} (new since sync): present", rel.display()));
                &[]
            }
        };
        if !parent_present(&out.dirs, rel) {
            // Only possible with inconsistent images (file in both, directory not).
            add_ancestors(&mut out.dirs, rel);
        }
        let bytes = mix_file(rel, old, new, &mut rng, opts, &mut log);
        out.files.insert(rel.clone(), bytes);
    }

    // Files deleted since the last sync.
    for (rel, old) in &durable.files {
        if current.files.contains_key(rel) {
            continue;
        }
        let reappears = rng_for(seed, SALT_FILE, rel).coin();
        // Skip if the path is now occupied by a directory, or an ancestor by a file.
        let conflict =
            out.dirs.contains(rel) || rel.ancestors().skip(1).any(|a| out.files.contains_key(a));
        let reappears = reappears && !conflict;
        log(format!(
            "file {} (deleted since sync): {}",
            rel.display(),
            if reappears {
                "reappears"
            } else {
                "stays deleted"
            }
        ));
        if reappears {
            add_ancestors(&mut out.dirs, rel);
            out.files.insert(rel.clone(), old.clone());
        }
    }

    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PageChoice {
    New,
    Old,
    Torn(usize),
}

/// One file after a power loss: `old` (durable) plus an arbitrary subset of
/// the 4 KiB pages that differ in `new`, each new, old or torn; the length is
/// the old or the new one. Logs its choices.
pub fn mix_file(
    rel: &Path,
    old: &[u8],
    new: &[u8],
    rng: &mut SplitMix64,
    opts: &CrashOptions,
    log: &mut impl FnMut(String),
) -> Vec<u8> {
    if old == new {
        return old.to_vec();
    }
    let len = if rng.coin() { new.len() } else { old.len() };
    let byte = |v: &[u8], i: usize| v.get(i).copied().unwrap_or(0);
    let mut out = Vec::with_capacity(len);
    let mut choices = Vec::new();
    let mut page_start = 0;
    while page_start < len {
        let page_end = (page_start + PAGE_SIZE).min(len);
        let differs = (page_start..page_end).any(|i| byte(old, i) != byte(new, i));
        let choice = if !differs {
            PageChoice::Old
        } else {
            let c = match rng.below(3) {
                0 => PageChoice::New,
                1 => PageChoice::Old,
                _ => {
                    let cut = if opts.torn_any_byte {
                        1 + rng.below(PAGE_SIZE as u64 - 1) as usize
                    } else {
                        SECTOR_SIZE * (1 + rng.below((PAGE_SIZE / SECTOR_SIZE) as u64 - 1) as usize)
                    };
                    PageChoice::Torn(cut)
                }
            };
            choices.push((page_start / PAGE_SIZE, c));
            c
        };
        for i in page_start..page_end {
            let take_new = match choice {
                PageChoice::New => true,
                PageChoice::Old => false,
                PageChoice::Torn(cut) => i - page_start < cut,
            };
            out.push(if take_new { byte(new, i) } else { byte(old, i) });
        }
        page_start = page_end;
    }
    let pages: Vec<String> = choices
        .iter()
        .map(|(p, c)| match c {
            PageChoice::New => format!("{p}:new"),
            PageChoice::Old => format!("{p}:old"),
            PageChoice::Torn(cut) => format!("{p}:torn@{cut}"),
        })
        .collect();
    log(format!(
        "file {}: len {} (durable {}, current {}), differing pages [{}]",
        rel.display(),
        len,
        old.len(),
        new.len(),
        pages.join(" ")
    ));
    out
}

fn open_rw(root: &Path, rel: &Path) -> fs::File {
    let path = root.join(rel);
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Inverts all bits of the byte at `offset` of `root/rel`. Panics if the file
/// is missing or `offset` is past its end.
pub fn flip_byte(root: &Path, rel: &Path, offset: u64) {
    let mut f = open_rw(root, rel);
    let len = f.metadata().expect("metadata").len();
    assert!(
        offset < len,
        "flip_byte: offset {offset} past end of {} (len {len})",
        rel.display()
    );
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).expect("seek");
    f.read_exact(&mut b).expect("read");
    b[0] ^= 0xFF;
    f.seek(SeekFrom::Start(offset)).expect("seek");
    f.write_all(&b).expect("write");
}

/// Overwrites `len` bytes at `start` of `root/rel` with zeros. Panics if the
/// file is missing or the range extends past its end.
pub fn zero_range(root: &Path, rel: &Path, start: u64, len: u64) {
    let mut f = open_rw(root, rel);
    let file_len = f.metadata().expect("metadata").len();
    let end = start.checked_add(len).expect("zero_range: overflow");
    assert!(
        end <= file_len,
        "zero_range: {start}..{end} past end of {} (len {file_len})",
        rel.display()
    );
    f.seek(SeekFrom::Start(start)).expect("seek");
    let zeros = vec![0u8; 64 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        f.write_all(&zeros[..n]).expect("write");
        left -= n as u64;
    }
}
