//! An [`IoHook`] that drives the per-file crash model of `durable.rs`: it
//! sees every fsync the engine issues (with the call site's [`IoOp`]) and
//! makes the synced file's content, or the synced directory's entries,
//! durable when the OS reports success.
//!
//! - The state is read in `before` (when the fsync starts) and made durable
//!   in `after` if the result is `Ok`: a write that races the fsync is not
//!   counted as covered by it.
//! - Mutation switch ([`ModelHook::drop_op`]): the success of one op is
//!   ignored, so the model acts as if that call site did not exist. The
//!   mutation tests use it to prove the crash tests notice each missing fsync.
//! - Crash points ([`ModelHook::record_steps`]): before every I/O step the
//!   hook records the live tree and what is durable, so a test can build a
//!   power-loss image at each step of a split, a merge or recovery itself.
//! - Faults ([`ModelHook::set_fault`]): a closure may fail any op before it runs.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use fissionlog::{IoHook, IoOp};

use super::crash::{CrashOptions, DirImage};
use super::durable::{crash_image_traced, Durable, Nodes, Synced};

/// Every fsync call site of the engine, in the order of `IoOp`.
pub const SYNC_OPS: [IoOp; 10] = [
    IoOp::SyncSegment,
    IoOp::SyncDir,
    IoOp::SyncRollDir,
    IoOp::SyncCheckpoint,
    IoOp::SyncManifest,
    IoOp::SyncManifestFile,
    IoOp::SyncManifestDir,
    IoOp::SyncNewSegment,
    IoOp::SyncNewDir,
    IoOp::SyncRecoveryDir,
];

/// Whether `op` is an fsync/fdatasync.
pub fn is_sync(op: IoOp) -> bool {
    SYNC_OPS.contains(&op)
}

/// Fails an op before it runs (`Err`) or lets it run (`Ok`).
pub type Fault = Box<dyn FnMut(IoOp, &Path) -> io::Result<()> + Send>;

/// The live tree and what was durable just before one I/O step.
#[derive(Clone, Debug)]
pub struct CrashPoint {
    pub op: IoOp,
    pub path: PathBuf,
    pub durable: Durable,
    pub live: Nodes,
}

impl CrashPoint {
    /// A power-loss image at this point, with the trace of its choices.
    pub fn image(&self, seed: u64, opts: &CrashOptions) -> (DirImage, Vec<String>) {
        crash_image_traced(&self.durable, &self.live, seed, opts)
    }
}

/// Writes `seeds` power-loss images (default options) of every point to a
/// fresh directory each and hands it to `check` with the point's index and
/// a context naming the step, its op and path, and the seed. Returns how
/// many images were checked.
pub fn for_each_image(
    points: &[CrashPoint],
    seeds: u64,
    mut check: impl FnMut(usize, &Path, &str),
) -> usize {
    let mut checked = 0;
    for (k, point) in points.iter().enumerate() {
        for seed in 0..seeds {
            let ctx = format!(
                "step {k} ({:?} {}), seed {seed}",
                point.op,
                point.path.display()
            );
            let (image, _) = point.image(seed, &CrashOptions::default());
            let out = tempfile::tempdir().unwrap();
            image.write_to(out.path()).unwrap();
            check(k, out.path(), &ctx);
            checked += 1;
        }
    }
    checked
}

struct State {
    durable: Durable,
    pending: Vec<(IoOp, PathBuf, Vec<Synced>)>,
    grant_segment_headers: bool,
    drop_op: Option<IoOp>,
    record_steps: bool,
    steps: Vec<CrashPoint>,
    fault: Option<Fault>,
    /// Successful fsyncs seen per op (the mutation tests check that the
    /// dropped op actually ran).
    synced: BTreeMap<String, u64>,
}

/// See the module docs.
pub struct ModelHook {
    root: PathBuf,
    state: Mutex<State>,
}

impl std::fmt::Debug for ModelHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelHook({})", self.root.display())
    }
}

impl ModelHook {
    /// A hook for the log directory `root` (which must exist); everything
    /// in it now is durable.
    pub fn new(root: &Path, drop_op: Option<IoOp>) -> Arc<ModelHook> {
        let durable =
            Durable::all_of(root).unwrap_or_else(|e| panic!("capture {}: {e}", root.display()));
        Arc::new(ModelHook {
            root: root.to_path_buf(),
            state: Mutex::new(State {
                durable,
                pending: Vec::new(),
                drop_op,
                grant_segment_headers: false,
                record_steps: false,
                steps: Vec::new(),
                fault: None,
                synced: BTreeMap::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide the model from the report.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The op whose success is ignored (mutation), if any.
    pub fn drop_op(&self) -> Option<IoOp> {
        self.lock().drop_op
    }

    /// Known engine gap, granted while it is open: a new segment's header
    /// and preallocated length are not fdatasynced until records follow
    /// them, yet the directory sync names the file and the checkpoint
    /// points into it. With this on, a directory fsync also makes durable
    /// the header (and zero-filled length) of each `.seg` file it names
    /// that was never synced itself, as if the engine had synced it at
    /// creation. `tests/crash_model/named_cases.rs` shows the gap with it off.
    pub fn grant_segment_headers(&self, on: bool) {
        self.lock().grant_segment_headers = on;
    }

    /// Known engine gap, granted while it is open: recovery deletes the
    /// segments that follow a torn tail without fsyncing their directory,
    /// so a second power loss can bring them back, and their stale records
    /// continue the chain after new appends reused those offsets (phantoms).
    /// Called when recovery returns, this makes every deletion so far
    /// durable, as if recovery had synced the directories it changed.
    pub fn grant_deletions(&self) {
        let (_, live) = Nodes::capture(&self.root)
            .unwrap_or_else(|e| panic!("capture {}: {e}", self.root.display()));
        let mut s = self.lock();
        for (id, entries) in s.durable.nodes.dirs.iter_mut() {
            if let Some(now) = live.dirs.get(id) {
                entries.retain(|name, _| now.contains_key(name));
            }
        }
    }

    /// Starts or stops recording a crash point before every I/O step.
    pub fn record_steps(&self, on: bool) {
        self.lock().record_steps = on;
    }

    /// The crash points recorded so far (and forgets them).
    pub fn take_steps(&self) -> Vec<CrashPoint> {
        std::mem::take(&mut self.lock().steps)
    }

    /// Installs (or removes) a fault injector.
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.lock().fault = fault;
    }

    /// The crash point "now" (between two I/O steps).
    pub fn now(&self, op: IoOp) -> CrashPoint {
        let s = self.lock();
        let (_, live) = Nodes::capture(&self.root)
            .unwrap_or_else(|e| panic!("capture {}: {e}", self.root.display()));
        CrashPoint {
            op,
            path: self.root.clone(),
            durable: s.durable.clone(),
            live,
        }
    }

    /// A power-loss image of the log directory as it is now.
    pub fn crash_image(&self, seed: u64, opts: &CrashOptions) -> (DirImage, Vec<String>) {
        self.now(IoOp::SyncSegment).image(seed, opts)
    }

    /// An fsync of a file or directory under the root that the engine's
    /// hook does not see (a file the embedding crate writes itself):
    /// `path`'s state is read before `sync` runs and becomes durable if it
    /// succeeds, unless `ignore` (the mutation of that call site).
    pub fn sync_outside(
        &self,
        path: &Path,
        ignore: bool,
        sync: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let synced = Synced::take(path)?;
        sync()?;
        if !ignore {
            self.lock().durable.apply(synced);
        }
        Ok(())
    }

    /// Successful fsyncs counted for `op`.
    pub fn synced_count(&self, op: IoOp) -> u64 {
        self.lock()
            .synced
            .get(&format!("{op:?}"))
            .copied()
            .unwrap_or(0)
    }
}

impl IoHook for ModelHook {
    fn before(&self, op: IoOp, path: &Path) -> io::Result<()> {
        if std::env::var_os("FISSIONLOG_HOOK_TRACE").is_some() {
            eprintln!("before {op:?} {}", path.display());
        }
        let mut s = self.lock();
        if s.record_steps {
            let (_, live) = Nodes::capture(&self.root)?;
            let durable = s.durable.clone();
            s.steps.push(CrashPoint {
                op,
                path: path.to_path_buf(),
                durable,
                live,
            });
        }
        if let Some(f) = s.fault.as_mut() {
            f(op, path)?;
        }
        // The parent of the log directory (synced when the log is created)
        // is outside the model: the root is always there.
        if is_sync(op) && path.starts_with(&self.root) {
            let mut synced = vec![Synced::take(path)?];
            // Only the directory syncs that follow a roll or recovery's new
            // segment: the other segment creations sync the file themselves.
            if s.grant_segment_headers
                && matches!(
                    op,
                    IoOp::SyncDir | IoOp::SyncRollDir | IoOp::SyncRecoveryDir
                )
            {
                if let Synced::Dir(_, entries) = &synced[0] {
                    let granted = unsynced_segment_headers(&s.durable, path, entries)?;
                    synced.extend(granted);
                }
            }
            s.pending.push((op, path.to_path_buf(), synced));
        }
        Ok(())
    }

    fn after(&self, op: IoOp, path: &Path, result: io::Result<()>) -> io::Result<()> {
        let mut s = self.lock();
        let i = s.pending.iter().position(|(o, p, _)| *o == op && p == path);
        let synced = i.map(|i| s.pending.remove(i).2);
        if result.is_ok() {
            *s.synced.entry(format!("{op:?}")).or_default() += 1;
            if s.drop_op != Some(op) {
                for synced in synced.into_iter().flatten() {
                    s.durable.apply(synced);
                }
            }
        }
        result
    }
}

/// Length of a segment header (docs/FORMAT.md).
const SEGMENT_HEADER_LEN: usize = 64;

/// For [`ModelHook::grant_segment_headers`]: the header and zero-filled
/// length of every never-synced `.seg` file named in `entries`.
fn unsynced_segment_headers(
    durable: &Durable,
    dir: &Path,
    entries: &super::durable::Entries,
) -> io::Result<Vec<Synced>> {
    let mut out = Vec::new();
    for (name, e) in entries {
        let super::durable::Entry::File(id) = *e else {
            continue;
        };
        if !name.to_string_lossy().ends_with(".seg") || durable.nodes.files.contains_key(&id) {
            continue;
        }
        let mut bytes = match std::fs::read(dir.join(name)) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let len = bytes.len();
        bytes.truncate(SEGMENT_HEADER_LEN);
        bytes.resize(len, 0);
        out.push(Synced::FileIfNone(id, bytes));
    }
    Ok(out)
}
