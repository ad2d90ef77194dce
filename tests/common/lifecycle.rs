//! Scaffolding of the topic-lifecycle tests (`tests/topics/`): options, a small-segment topic
//! configuration, directory listings, reading a partition whole, an I/O
//! gate, and a `delete_topic` run on another thread.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fissionlog::{
    HotKeyPolicy, IoHook, IoOp, Log, LogOptions, ReadIsolation, SyncPolicy, Topic, TopicConfig,
};

/// No balancer, no background retention, checkpoints only when asked.
pub fn opts() -> LogOptions {
    LogOptions {
        topic_hash_seed: Some(super::log::HASH_SEED),
        balancer: false,
        background_retention: false,
        checkpoint_interval: Duration::from_secs(3600),
        ..LogOptions::default()
    }
}

/// 4 KiB segments (rolls come often), every hot-key mode allowed.
pub fn cfg(partitions: u32, sync: SyncPolicy) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: 4096,
        sync,
        hot_keys: HotKeyPolicy {
            allow_windowed: true,
            allow_spread: true,
            max_lanes: 4,
            auto_window: None,
        },
        ..TopicConfig::default()
    }
}

/// Every file and directory under `root`, relative, sorted.
pub fn tree(root: &Path) -> BTreeSet<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            out.insert(p.strip_prefix(root).unwrap().to_path_buf());
            if p.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

/// Names under `topics/`.
pub fn topic_dirs(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root.join("topics"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Every value partition `p` holds, written or not, in offset order.
pub fn partition_values(t: &Topic, p: u32) -> Vec<Vec<u8>> {
    let part = t.partition(p).unwrap();
    let mut out = Vec::new();
    let mut off = part.start_offset();
    while off < part.end_offset() {
        let b = part
            .read_with(off, 1 << 20, ReadIsolation::Written)
            .unwrap();
        for r in b.iter() {
            out.push(r.value.to_vec());
            off = r.offset + 1;
        }
    }
    out
}

/// Parks the first armed call of `op` on a path containing `needle` (in
/// `after`, once the OS call ran) until released; then returns EIO when
/// armed with `fail`.
/// (Its own hook, not `faults::Gate`: it is re-armed for each step and can fail
/// the held call.)
#[derive(Debug, Default)]
pub struct Gate {
    pub armed: Mutex<Option<(IoOp, String, bool)>>,
    pub reached: AtomicBool,
    pub release: AtomicBool,
}

impl Gate {
    pub fn arm(&self, op: IoOp, needle: &str, fail: bool) {
        self.reached.store(false, Ordering::Release);
        self.release.store(false, Ordering::Release);
        *self.armed.lock().unwrap() = Some((op, needle.to_string(), fail));
    }

    /// Waits (5 s at most) for the armed call.
    pub fn wait_reached(&self) -> bool {
        super::faults::wait_flag(&self.reached, Duration::from_secs(5))
    }

    pub fn open(&self) {
        self.release.store(true, Ordering::Release);
    }
}

impl IoHook for Gate {
    fn before(&self, _: IoOp, _: &Path) -> std::io::Result<()> {
        Ok(())
    }

    fn after(&self, op: IoOp, path: &Path, result: std::io::Result<()>) -> std::io::Result<()> {
        let hit = {
            let mut g = self.armed.lock().unwrap();
            match &*g {
                Some((o, needle, fail))
                    if *o == op && path.to_string_lossy().contains(needle.as_str()) =>
                {
                    let fail = *fail;
                    *g = None;
                    Some(fail)
                }
                _ => None,
            }
        };
        if let Some(fail) = hit {
            self.reached.store(true, Ordering::Release);
            let t = Instant::now();
            while !self.release.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            if fail {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
        }
        result
    }
}

/// `log.delete_topic(name)` on another thread; the flag is set once it
/// returned. Returns once the thread is about to call `delete_topic` (at
/// most 10 s), so a caller that sleeps next and then checks what the
/// delete did gives the delete that time, not the thread's start-up on a
/// loaded machine.
pub fn delete_in_thread(
    log: &Arc<Log>,
    name: &str,
) -> (
    std::thread::JoinHandle<fissionlog::Result<()>>,
    Arc<AtomicBool>,
) {
    let done = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let (log, flag, name) = (log.clone(), done.clone(), name.to_string());
    let entered = started.clone();
    let h = std::thread::spawn(move || {
        entered.store(true, Ordering::Release);
        let r = log.delete_topic(&name);
        flag.store(true, Ordering::Release);
        r
    });
    let t = std::time::Instant::now();
    while !started.load(Ordering::Acquire) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the delete thread never ran"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
    (h, done)
}
