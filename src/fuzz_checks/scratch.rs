//! Scratch log directories and what the log-level checks share: options,
//! file listing and copying, generated values, reading a whole log back.

use super::*;

/// A unique scratch directory, removed on drop. Placed under
/// `FISSIONLOG_FUZZ_TMP`, else `/dev/shm` (tmpfs: fsync is free), else the
/// system temp directory.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates a fresh directory.
    pub fn new(tag: &str) -> ScratchDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = std::env::var_os("FISSIONLOG_FUZZ_TMP")
            .map(PathBuf::from)
            .or_else(|| Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()))
            .unwrap_or_else(std::env::temp_dir);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = root.join(format!(
            "fissionlog-fuzz-{tag}-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("creating a scratch directory");
        ScratchDir(dir)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn options(mode: RecoveryMode, create: bool) -> LogOptions {
    LogOptions {
        create,
        recovery: mode,
        use_io_uring: false,
        balancer: false,
        ..Default::default()
    }
}

/// Regular files under `dir`, relative, sorted (deterministic order).
pub(super) fn list_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.filter_map(|e| e.ok()) {
            let path = e.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if let Ok(rel) = path.strip_prefix(root) {
                out.push(rel.to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

pub(super) fn copy_dir(from: &Path, to: &Path) {
    for rel in list_files(from) {
        let dst = to.join(&rel);
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).expect("creating a directory in the copy");
        }
        std::fs::copy(from.join(&rel), &dst).expect("copying a log file");
    }
    // Empty partition directories matter too (recovery recreates segments).
    fn dirs(from: &Path, to: &Path) {
        let Ok(rd) = std::fs::read_dir(from) else {
            return;
        };
        for e in rd.filter_map(|e| e.ok()) {
            if e.path().is_dir() {
                let d = to.join(e.file_name());
                let _ = std::fs::create_dir_all(&d);
                dirs(&e.path(), &d);
            }
        }
    }
    dirs(from, to);
}

/// One record as written: (key, value, timestamp).
pub(super) type Written = (Option<Vec<u8>>, Vec<u8>, i64);

/// What was appended, per (topic name, partition id), by offset.
pub(super) type Model = BTreeMap<(String, u32), Vec<Written>>;

pub(super) fn value_for(seq: u64, len: usize) -> Vec<u8> {
    let tag = seq.to_le_bytes();
    (0..len.max(8))
        .map(|i| tag[i % 8] ^ (i / 8) as u8)
        .collect()
}

/// What reading a partition after open returned.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct PartitionRead {
    pub(super) start: u64,
    pub(super) end: u64,
    /// (offset, key, value, timestamp) in read order.
    pub(super) records: Vec<(u64, Written)>,
    /// Lost ranges reported by `Error::Hole`.
    pub(super) holes: Vec<(u64, u64)>,
    /// Offset where a checksum or corruption error stopped the read.
    pub(super) stopped_at: Option<u64>,
}

/// Reads every partition of every topic from start to end, skipping holes.
/// Errors other than holes, checksum mismatches and corruption are failures.
pub(super) fn read_everything(log: &Log) -> BTreeMap<(String, u32), PartitionRead> {
    let mut out = BTreeMap::new();
    for name in log.topics() {
        let topic = log.topic(&name).expect("a listed topic opens");
        for info in topic.partitions() {
            let mut r = PartitionRead {
                start: info.start_offset,
                end: info.end_offset,
                records: Vec::new(),
                holes: Vec::new(),
                stopped_at: None,
            };
            let mut at = info.start_offset;
            while at < info.end_offset {
                match topic.read(info.id, at, 64 * 1024) {
                    Ok(b) => {
                        let next = b.next_offset();
                        assert!(
                            next > at,
                            "read at {at} of partition {} made no progress",
                            info.id
                        );
                        for rec in b.iter() {
                            let w = (
                                rec.key.map(<[u8]>::to_vec),
                                rec.value.to_vec(),
                                rec.timestamp,
                            );
                            r.records.push((rec.offset, w));
                        }
                        at = next;
                    }
                    Err(Error::Hole { start, end, .. }) => {
                        assert!(
                            end > at,
                            "hole at {at} of partition {} makes no progress",
                            info.id
                        );
                        r.holes.push((start, end));
                        at = end;
                    }
                    Err(Error::ChecksumMismatch { .. } | Error::Corruption { .. }) => {
                        r.stopped_at = Some(at);
                        break;
                    }
                    Err(e) => panic!(
                        "reading partition {} at {at}: unexpected error {e}",
                        info.id
                    ),
                }
            }
            out.insert((name.clone(), info.id), r);
        }
    }
    out
}
