//! Issue 7, finding 16: a sync round costs O(dirty partitions), not
//! O(every partition ever created).
//!
//! `sync_round_cost_with_many_partitions` creates `FISSIONLOG_SCALE_PARTITIONS`
//! partitions (default 2,000; 10,000 for the figures in
//! docs/ARCHITECTURE.md) on tmpfs when there is one, and prints the time
//! of a round with one dirty partition, with every partition dirty, and
//! with none. The assertions are structural (which files a round fsyncs),
//! not timings: a round with one dirty partition syncs that partition's
//! segment (and the checkpoint), and once both checkpoint files are
//! current an idle round syncs nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fissionlog::{IoHook, IoOp};
use fissionlog::{Log, LogOptions, NewRecord, SyncPolicy, TopicConfig};
use parking_lot::Mutex;

#[derive(Debug, Default)]
struct Count(Mutex<Vec<(IoOp, PathBuf)>>);

impl IoHook for Count {
    fn before(&self, op: IoOp, path: &Path) -> std::io::Result<()> {
        if matches!(op, IoOp::SyncSegment | IoOp::SyncDir | IoOp::SyncCheckpoint) {
            self.0.lock().push((op, path.to_path_buf()));
        }
        Ok(())
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
fn sync_round_cost_with_many_partitions() {
    let n: u32 = std::env::var("FISSIONLOG_SCALE_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let shm = Path::new("/dev/shm");
    let root = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let hook = Arc::new(Count::default());
    let options = LogOptions {
        balancer: false,
        background_retention: false,
        ..LogOptions::default()
    };
    let log = Log::open_with_hook(root.path().join("log"), options, hook.clone()).unwrap();
    let mut cfg = TopicConfig {
        partitions: n,
        segment_bytes: 4096,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    };
    cfg.balance.max_partitions = n;
    let t0 = Instant::now();
    let t = log.create_topic("t", cfg).unwrap();
    let created = t0.elapsed();
    log.sync().unwrap();
    log.sync().unwrap();
    log.sync().unwrap();
    let rec = |i: u64| NewRecord {
        key: None,
        value: &[7u8; 32],
        timestamp: Some(i as i64),
    };
    let mut one = Vec::new();
    let mut none = Vec::new();
    let mut fsyncs_one = Vec::new();
    for i in 0..20u64 {
        t.append_to((i % u64::from(n)) as u32, &[rec(i)]).unwrap();
        hook.0.lock().clear();
        let s = Instant::now();
        log.sync().unwrap();
        one.push(s.elapsed());
        fsyncs_one = hook.0.lock().clone();
        let s = Instant::now();
        log.sync().unwrap();
        none.push(s.elapsed());
    }
    let mut all = Vec::new();
    for i in 0..3u64 {
        for p in 0..n {
            t.append_to(p, &[rec(i)]).unwrap();
        }
        let s = Instant::now();
        log.sync().unwrap();
        all.push(s.elapsed());
    }
    eprintln!(
        "{n} partitions (created in {created:?}): sync round with 1 dirty {:?}, 0 dirty {:?}, all dirty {:?} (medians)",
        median(one),
        median(none),
        median(all)
    );
    let segs = fsyncs_one
        .iter()
        .filter(|(op, _)| *op == IoOp::SyncSegment)
        .count();
    assert_eq!(segs, 1, "a round with one dirty partition: {fsyncs_one:?}");
    // Once both checkpoint files hold the current positions, a round with
    // nothing dirty writes and syncs nothing.
    for _ in 0..3 {
        log.sync().unwrap();
    }
    hook.0.lock().clear();
    let s = Instant::now();
    log.sync().unwrap();
    let idle_time = s.elapsed();
    let idle = hook.0.lock().clone();
    assert!(idle.is_empty(), "an idle round synced {idle:?}");
    let ck_bytes = std::fs::metadata(root.path().join("log/checkpoint.0"))
        .unwrap()
        .len();
    eprintln!("idle round (checkpoint files current) {idle_time:?}; checkpoint {ck_bytes} bytes");
    log.close().unwrap();
}
