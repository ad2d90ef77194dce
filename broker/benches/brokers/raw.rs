//! The raw baselines, on the disk the servers write to: what the hardware
//! gives for durable 1 KiB appends with no broker in the way.
//!
//! - one writer: `write(2)` of one record, then `fdatasync`, in a loop;
//! - 16 writers: each `write(2)`s its record under a mutex and returns once
//!   an `fdatasync` that started after its write completed (leader/follower
//!   group commit: whoever finds no sync running syncs for everyone);
//! - consume: `pread` of 500 records from a file of stored records, then
//!   the next offset `pwrite`n to an offsets file and `fdatasync`ed (a
//!   durable commit per batch), by 1 or 4 readers each reading its share.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::stats::{Figure, Samples};
use crate::{R, RECORD_BYTES};

/// Records a raw consume batch reads before its durable commit.
pub const CONSUME_BATCH: usize = 500;

fn record() -> Vec<u8> {
    (0..RECORD_BYTES).map(|i| (i % 251) as u8).collect()
}

/// One writer, `write` + `fdatasync` per record, for `secs`.
pub fn single_writer(dir: &Path, secs: Duration) -> R<Figure> {
    let mut f = File::create(dir.join("raw-1.dat"))?;
    let rec = record();
    let mut s = Samples::default();
    let t0 = Instant::now();
    while t0.elapsed() < secs {
        let t = Instant::now();
        f.write_all(&rec)?;
        f.sync_data()?;
        s.record(t, 1);
    }
    Ok(s.figure(t0.elapsed()))
}

struct SyncState {
    written: u64,
    synced: u64,
    syncing: bool,
    failed: Option<String>,
}

/// Leader/follower fdatasync over one file.
struct GroupSync {
    file: Mutex<File>,
    sync_fd: File,
    state: Mutex<SyncState>,
    cv: Condvar,
}

fn poisoned<T>(_: T) -> String {
    "a raw writer panicked".to_string()
}

impl GroupSync {
    /// Appends `rec` and returns once an fdatasync covers it.
    fn write_durable(&self, rec: &[u8]) -> Result<(), String> {
        {
            let mut f = self.file.lock().map_err(poisoned)?;
            f.write_all(rec).map_err(|e| e.to_string())?;
        }
        let mut st = self.state.lock().map_err(poisoned)?;
        st.written += 1;
        let mine = st.written;
        while st.synced < mine {
            if let Some(e) = &st.failed {
                return Err(e.clone());
            }
            if st.syncing {
                st = self.cv.wait(st).map_err(poisoned)?;
                continue;
            }
            st.syncing = true;
            // Every write counted so far has completed: this sync covers it.
            let target = st.written;
            drop(st);
            let r = self.sync_fd.sync_data();
            st = self.state.lock().map_err(poisoned)?;
            st.syncing = false;
            match r {
                Ok(()) => st.synced = st.synced.max(target),
                Err(e) => st.failed = Some(format!("fdatasync: {e}")),
            }
            self.cv.notify_all();
        }
        Ok(())
    }
}

/// `writers` threads, each waiting for its own record's group commit, for `secs`.
pub fn group_commit(dir: &Path, writers: usize, secs: Duration) -> R<Figure> {
    let f = File::create(dir.join("raw-16.dat"))?;
    let g = Arc::new(GroupSync {
        sync_fd: f.try_clone()?,
        file: Mutex::new(f),
        state: Mutex::new(SyncState {
            written: 0,
            synced: 0,
            syncing: false,
            failed: None,
        }),
        cv: Condvar::new(),
    });
    let t0 = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|_| {
            let g = g.clone();
            std::thread::spawn(move || -> Result<Samples, String> {
                let rec = record();
                let mut s = Samples::default();
                while t0.elapsed() < secs {
                    let t = Instant::now();
                    g.write_durable(&rec)?;
                    s.record(t, 1);
                }
                Ok(s)
            })
        })
        .collect();
    let mut all = Samples::default();
    for t in threads {
        all.merge(t.join().map_err(|_| "a raw writer panicked")??);
    }
    Ok(all.figure(t0.elapsed()))
}

/// `readers` threads read `messages` stored records in batches, each
/// batch followed by a durable offset commit.
pub fn consume(dir: &Path, messages: u64, readers: usize) -> R<Figure> {
    let path = dir.join(format!("raw-c{readers}.dat"));
    {
        let mut f = File::create(&path)?;
        let rec = record();
        let mut chunk = Vec::with_capacity(CONSUME_BATCH * RECORD_BYTES);
        for _ in 0..CONSUME_BATCH {
            chunk.extend_from_slice(&rec);
        }
        let mut left = messages as usize;
        while left > 0 {
            let n = left.min(CONSUME_BATCH);
            f.write_all(&chunk[..n * RECORD_BYTES])?;
            left -= n;
        }
        f.sync_data()?;
    }
    let per_reader = messages.div_ceil(readers as u64);
    let t0 = Instant::now();
    let threads: Vec<_> = (0..readers)
        .map(|r| {
            let data = File::open(&path);
            let offsets = File::create(dir.join(format!("raw-c{readers}-{r}.offset")));
            std::thread::spawn(move || -> Result<Samples, String> {
                let data = data.map_err(|e| e.to_string())?;
                let offsets = offsets.map_err(|e| e.to_string())?;
                let first = r as u64 * per_reader;
                let end = (first + per_reader).min(messages);
                let mut buf = vec![0u8; CONSUME_BATCH * RECORD_BYTES];
                let mut s = Samples::default();
                let mut next = first;
                while next < end {
                    let t = Instant::now();
                    let n = (end - next).min(CONSUME_BATCH as u64);
                    let bytes = &mut buf[..n as usize * RECORD_BYTES];
                    data.read_exact_at(bytes, next * RECORD_BYTES as u64)
                        .map_err(|e| e.to_string())?;
                    next += n;
                    offsets
                        .write_all_at(&next.to_le_bytes(), 0)
                        .map_err(|e| e.to_string())?;
                    offsets.sync_data().map_err(|e| e.to_string())?;
                    s.record(t, n);
                }
                Ok(s)
            })
        })
        .collect();
    let mut all = Samples::default();
    for t in threads {
        all.merge(t.join().map_err(|_| "a raw reader panicked")??);
    }
    Ok(all.figure(t0.elapsed()))
}
