//! The crash model that sees missing fsyncs: durability per file and per
//! directory (ALICE's model, TigerBeetle's storage simulator), not a snapshot
//! of the whole tree when `sync()` returns.
//!
//! - A file's durable content is what it held at its own last successful
//!   fsync/fdatasync ([`Durable::apply`] of a [`Synced::File`]).
//! - A directory's entries (which names exist, which file or directory each
//!   names) are durable as of that directory's last successful fsync
//!   ([`Synced::Dir`]). fdatasync of a new file does not make its name
//!   durable.
//!
//! Files and directories are tracked by identity ([`NodeId`]: inode number
//! and birth time), so a rename carries a file's durable content to its new
//! name, and a file synced under a temporary name keeps that content after
//! the rename.
//!
//! A power loss ([`crash_image`]) leaves, from the root down:
//! - per directory: its durable entries plus an arbitrary subset of the
//!   changes made since its last fsync: a created name may be missing, a
//!   deleted one may be back (naming its file's durable content), a replaced
//!   name may still name the old file. The changed names of one directory
//!   that share a file (a rename inside the directory) change together, since
//!   rename(2) is atomic; a rename across directories is not grouped (the
//!   engine does none). A missing directory takes everything below it.
//! - per file: its durable content (empty if it was never synced) plus an
//!   arbitrary subset of the 4 KiB pages that differ from its content now,
//!   each new, old or torn, the length old or new ([`mix_file`], the same
//!   page rules as [`super::crash::power_loss_image`]).
//!
//! Every choice derives from the seed and the path, so a failing image is
//! reproduced from its seed and the two states.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::crash::{
    mix_file, rng_for, CrashOptions, DirImage, LOCK_FILE_NAME, SALT_ENTRY, SALT_FILE, SALT_GLOBAL,
};

/// Identity of a file or directory: inode number and birth time, so an
/// inode number reused after a delete names a different file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId {
    pub ino: u64,
    pub birth_ns: u128,
}

impl NodeId {
    pub fn of(meta: &fs::Metadata) -> NodeId {
        let birth_ns = meta
            .created()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        NodeId {
            ino: meta.ino(),
            birth_ns,
        }
    }

    /// A synthetic identity (self-tests build states by hand).
    pub fn synthetic(n: u64) -> NodeId {
        NodeId {
            ino: n,
            birth_ns: 0,
        }
    }
}

/// What a directory entry names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    File(NodeId),
    Dir(NodeId),
}

impl Entry {
    pub fn id(self) -> NodeId {
        match self {
            Entry::File(id) | Entry::Dir(id) => id,
        }
    }
}

/// The entries of one directory, by name.
pub type Entries = BTreeMap<OsString, Entry>;

/// Files and directories by identity: the tree as it is now (the page
/// cache), or what is durable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Nodes {
    pub dirs: BTreeMap<NodeId, Entries>,
    pub files: BTreeMap<NodeId, Vec<u8>>,
}

fn is_not_found(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

/// The entries of the directory at `path` (vanishing entries skipped;
/// symlinks and special files ignored).
pub fn read_entries(path: &Path) -> io::Result<Entries> {
    let mut out = Entries::new();
    for entry in fs::read_dir(path)? {
        let entry = match entry {
            Ok(e) => e,
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e),
        };
        let meta = match fs::symlink_metadata(entry.path()) {
            Ok(m) => m,
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e),
        };
        let id = NodeId::of(&meta);
        if meta.is_dir() {
            out.insert(entry.file_name(), Entry::Dir(id));
        } else if meta.is_file() {
            out.insert(entry.file_name(), Entry::File(id));
        }
    }
    Ok(out)
}

fn read_file(path: &Path) -> io::Result<Vec<u8>> {
    if path.file_name().is_some_and(|n| n == LOCK_FILE_NAME) {
        return Ok(Vec::new());
    }
    fs::read(path)
}

impl Nodes {
    /// Reads the whole tree under `root`. Returns the root's identity.
    pub fn capture(root: &Path) -> io::Result<(NodeId, Nodes)> {
        let root_id = NodeId::of(&fs::metadata(root)?);
        let mut nodes = Nodes::default();
        nodes.capture_dir(root, root_id)?;
        Ok((root_id, nodes))
    }

    fn capture_dir(&mut self, path: &Path, id: NodeId) -> io::Result<()> {
        let entries = read_entries(path)?;
        for (name, e) in &entries {
            let p = path.join(name);
            match *e {
                Entry::Dir(child) => match self.capture_dir(&p, child) {
                    Err(e) if is_not_found(&e) => {}
                    r => r?,
                },
                Entry::File(f) => match read_file(&p) {
                    Ok(bytes) => {
                        self.files.insert(f, bytes);
                    }
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e),
                },
            }
        }
        self.dirs.insert(id, entries);
        Ok(())
    }
}

/// The state of one file or directory taken when an fsync of it starts; it
/// becomes durable when the fsync succeeds.
#[derive(Clone, Debug)]
pub enum Synced {
    File(NodeId, Vec<u8>),
    Dir(NodeId, Entries),
    /// Content that becomes durable only if the file has none yet (never
    /// overrides what a real fsync of the file made durable).
    FileIfNone(NodeId, Vec<u8>),
}

impl Synced {
    /// Reads what an fsync of `path` starting now covers.
    pub fn take(path: &Path) -> io::Result<Synced> {
        let meta = fs::metadata(path)?;
        let id = NodeId::of(&meta);
        if meta.is_dir() {
            Ok(Synced::Dir(id, read_entries(path)?))
        } else {
            Ok(Synced::File(id, read_file(path)?))
        }
    }
}

/// What is durable: the root's identity and, per file and directory, its
/// content or entries at its last successful fsync.
#[derive(Clone, Debug)]
pub struct Durable {
    pub root: NodeId,
    pub nodes: Nodes,
}

impl Durable {
    /// Everything under `root` is durable now (a fresh directory, or a crash
    /// image just written: after the reboot, what is on disk is durable).
    pub fn all_of(root: &Path) -> io::Result<Durable> {
        let (root, nodes) = Nodes::capture(root)?;
        Ok(Durable { root, nodes })
    }

    /// An fsync covering `synced` succeeded.
    pub fn apply(&mut self, synced: Synced) {
        match synced {
            Synced::File(id, bytes) => {
                self.nodes.files.insert(id, bytes);
            }
            Synced::Dir(id, entries) => {
                self.nodes.dirs.insert(id, entries);
            }
            Synced::FileIfNone(id, bytes) => {
                self.nodes.files.entry(id).or_insert(bytes);
            }
        }
    }
}

/// A power-loss image of the tree `live` (rooted at `durable.root`). See the
/// module docs for the rules.
pub fn crash_image(durable: &Durable, live: &Nodes, seed: u64, opts: &CrashOptions) -> DirImage {
    build(durable, live, seed, opts, None)
}

/// [`crash_image`] (the same result) plus a log of every random choice.
pub fn crash_image_traced(
    durable: &Durable,
    live: &Nodes,
    seed: u64,
    opts: &CrashOptions,
) -> (DirImage, Vec<String>) {
    let mut trace = Vec::new();
    let image = build(durable, live, seed, opts, Some(&mut trace));
    (image, trace)
}

struct Builder<'a> {
    durable: &'a Durable,
    live: &'a Nodes,
    seed: u64,
    opts: &'a CrashOptions,
    out: DirImage,
    trace: Option<&'a mut Vec<String>>,
    visited: BTreeSet<NodeId>,
}

fn build(
    durable: &Durable,
    live: &Nodes,
    seed: u64,
    opts: &CrashOptions,
    trace: Option<&mut Vec<String>>,
) -> DirImage {
    let mut b = Builder {
        durable,
        live,
        seed,
        opts,
        out: DirImage::new(),
        trace,
        visited: BTreeSet::new(),
    };
    let keep_all =
        rng_for(seed, SALT_GLOBAL, Path::new("")).unit_f64() < opts.keep_all_new_probability;
    if keep_all {
        b.log(format!("seed {seed}: keep all new (process kill)"));
        b.copy_live(durable.root, PathBuf::new());
    } else {
        b.visit(durable.root, PathBuf::new());
    }
    b.out
}

impl Builder<'_> {
    fn log(&mut self, s: String) {
        if let Some(t) = self.trace.as_mut() {
            t.push(s);
        }
    }

    /// The tree as it is now (a process kill keeps the page cache).
    fn copy_live(&mut self, dir: NodeId, rel: PathBuf) {
        let Some(entries) = self.live.dirs.get(&dir) else {
            return;
        };
        for (name, e) in entries {
            let path = rel.join(name);
            match *e {
                Entry::Dir(id) => {
                    self.out.insert_dir(path.clone());
                    self.copy_live(id, path);
                }
                Entry::File(id) => {
                    let bytes = self.live.files.get(&id).cloned().unwrap_or_default();
                    self.out.insert_file(path, bytes);
                }
            }
        }
    }

    fn visit(&mut self, dir: NodeId, rel: PathBuf) {
        if !self.visited.insert(dir) {
            return;
        }
        let empty = Entries::new();
        let (durable, live) = (self.durable, self.live);
        let durable = durable.nodes.dirs.get(&dir).unwrap_or(&empty);
        // A directory deleted since is not in `live`: all its names are gone.
        let live = live.dirs.get(&dir).unwrap_or(&empty);
        let entries = self.choose_entries(&rel, durable, live);
        for (name, e) in entries {
            let path = rel.join(&name);
            match e {
                Entry::Dir(id) => {
                    self.out.insert_dir(path.clone());
                    self.visit(id, path);
                }
                Entry::File(id) => {
                    let (durable, live) = (self.durable, self.live);
                    let old: &[u8] = durable.nodes.files.get(&id).map_or(&[], |v| v);
                    // A file deleted since keeps only its durable content.
                    let new: &[u8] = live.files.get(&id).map_or(old, |v| v);
                    let mut rng = rng_for(self.seed, SALT_FILE, &path);
                    let opts = self.opts;
                    let mut lines = Vec::new();
                    let bytes = mix_file(&path, old, new, &mut rng, opts, &mut |s| lines.push(s));
                    for l in lines {
                        self.log(l);
                    }
                    self.out.insert_file(path, bytes);
                }
            }
        }
    }

    /// The durable entries plus a seeded subset of the changes since.
    fn choose_entries(&mut self, rel: &Path, durable: &Entries, live: &Entries) -> Entries {
        let mut out = Entries::new();
        let mut changed: Vec<&OsString> = Vec::new();
        for (name, e) in durable {
            if live.get(name) == Some(e) {
                out.insert(name.clone(), *e);
            } else {
                changed.push(name);
            }
        }
        changed.extend(live.keys().filter(|n| !durable.contains_key(*n)));
        changed.sort();
        // Group the changed names that share a file (one rename): union-find
        // over names, keyed by the identities on either side.
        let mut group: Vec<usize> = (0..changed.len()).collect();
        fn find(g: &mut [usize], i: usize) -> usize {
            let mut r = i;
            while g[r] != r {
                r = g[r];
            }
            g[i] = r;
            r
        }
        let mut by_id: BTreeMap<NodeId, usize> = BTreeMap::new();
        for (i, name) in changed.iter().enumerate() {
            for e in [durable.get(*name), live.get(*name)].into_iter().flatten() {
                match by_id.get(&e.id()) {
                    Some(&j) => {
                        let (a, b) = (find(&mut group, i), find(&mut group, j));
                        group[a.max(b)] = a.min(b);
                    }
                    None => {
                        by_id.insert(e.id(), i);
                    }
                }
            }
        }
        let mut take_new: BTreeMap<usize, bool> = BTreeMap::new();
        for i in 0..changed.len() {
            let root = find(&mut group, i);
            let new = *take_new
                .entry(root)
                .or_insert_with(|| rng_for(self.seed, SALT_ENTRY, &rel.join(changed[root])).coin());
            let name = changed[i];
            let (d, l) = (durable.get(name), live.get(name));
            let what = match (d, l) {
                (None, Some(_)) => "created",
                (Some(_), None) => "deleted",
                _ => "replaced",
            };
            let kept = if new { l } else { d };
            self.log(format!(
                "entry {} ({what} since its directory's fsync{}): {}",
                rel.join(name).display(),
                if root != i {
                    format!(", with {}", rel.join(changed[root]).display())
                } else {
                    String::new()
                },
                if new { "as now" } else { "as durable" }
            ));
            if let Some(e) = kept {
                out.insert(name.clone(), *e);
            }
        }
        out
    }
}
