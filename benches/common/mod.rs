//! Shared pieces of the benchmarks: data directories on the real disk, raw
//! baselines that do the minimum work a log must do, and median/percentile
//! reporting of engine-vs-baseline ratios.
//!
//! The raw baselines frame each record with a 16-byte header
//! (`len u32, crc u32, offset u64`, CRC-32 over `offset ++ value`), which is
//! the least a checksummed log can write per record.
#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memmap2::{Advice, Mmap, MmapMut};

/// Size of the raw baselines' per-record header.
pub const RAW_HEADER: usize = 16;

/// Whether the binary runs as a real benchmark (`cargo bench`) rather than
/// as a smoke test (`cargo test --benches` runs it without `--bench`).
pub fn is_bench_run() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// A fresh, empty directory for bench data on the real disk
/// (`target/bench-data`, or `FISSIONLOG_BENCH_DIR`).
pub fn bench_dir(name: &str) -> PathBuf {
    let root = std::env::var_os("FISSIONLOG_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-data"));
    let dir = root.join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create bench dir");
    dir
}

/// Removes a bench directory (best effort).
pub fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

/// `n` values of `len` bytes with varying content.
pub fn values(n: usize, len: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| (0..len).map(|j| (i * 31 + j * 7) as u8).collect())
        .collect()
}

/// Frames one record at the start of `dst`; returns the bytes used.
#[inline]
pub fn frame(dst: &mut [u8], offset: u64, value: &[u8]) -> usize {
    let n = RAW_HEADER + value.len();
    let dst = &mut dst[..n];
    dst[8..16].copy_from_slice(&offset.to_le_bytes());
    dst[16..].copy_from_slice(value);
    let crc = crc32fast::hash(&dst[8..]);
    dst[0..4].copy_from_slice(&(value.len() as u32).to_le_bytes());
    dst[4..8].copy_from_slice(&crc.to_le_bytes());
    n
}

/// Creates `path` preallocated (fallocate) to `len` bytes.
pub fn prealloc_file(path: &Path, len: u64) -> File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("create baseline file");
    // SAFETY: plain syscall on an fd we own.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    f
}

/// fdatasync of a file.
pub fn fdatasync(f: &File) {
    f.sync_data().expect("fdatasync");
}

/// How the mapping baseline advises the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapAdvice {
    /// No madvise.
    Normal,
    /// MADV_RANDOM, as the engine's segments use.
    Random,
}

/// Timings of one run of the mapping baseline.
#[derive(Debug, Clone, Copy)]
pub struct RawTimes {
    /// Framing, CRC and copying.
    pub write: Duration,
    /// The final msync / fdatasync.
    pub sync: Duration,
}

impl RawTimes {
    /// Both phases.
    pub fn total(&self) -> Duration {
        self.write + self.sync
    }
}

/// Baseline (a): frame each record into a preallocated shared mapping
/// (stores + CRC), then msync.
pub fn raw_mmap(dir: &Path, vals: &[Vec<u8>], advice: MapAdvice) -> RawTimes {
    let need: usize = vals.iter().map(|v| RAW_HEADER + v.len()).sum();
    let path = dir.join("raw-mmap.dat");
    let f = prealloc_file(&path, need as u64);
    // SAFETY: the file is private to this benchmark for the mapping's life.
    let mut map = unsafe { MmapMut::map_mut(&f) }.expect("map");
    if advice == MapAdvice::Random {
        map.advise(Advice::Random).expect("madvise");
    }
    let t0 = Instant::now();
    let mut pos = 0;
    for (i, v) in vals.iter().enumerate() {
        pos += frame(&mut map[pos..], i as u64, v);
    }
    let t1 = Instant::now();
    map.flush().expect("msync");
    let t2 = Instant::now();
    drop(map);
    let _ = std::fs::remove_file(&path);
    RawTimes {
        write: t1 - t0,
        sync: t2 - t1,
    }
}

/// Baseline (b): frame each record into a 1 MiB buffer, write(2) it when
/// full (into a preallocated file), then fdatasync.
pub fn raw_write(dir: &Path, vals: &[Vec<u8>]) -> RawTimes {
    let need: usize = vals.iter().map(|v| RAW_HEADER + v.len()).sum();
    let path = dir.join("raw-write.dat");
    let mut f = prealloc_file(&path, need as u64);
    let mut buf = vec![0u8; 1 << 20];
    let t0 = Instant::now();
    let mut used = 0;
    for (i, v) in vals.iter().enumerate() {
        if used + RAW_HEADER + v.len() > buf.len() {
            f.write_all(&buf[..used]).expect("write");
            used = 0;
        }
        used += frame(&mut buf[used..], i as u64, v);
    }
    f.write_all(&buf[..used]).expect("write");
    let t1 = Instant::now();
    fdatasync(&f);
    let t2 = Instant::now();
    let _ = std::fs::remove_file(&path);
    RawTimes {
        write: t1 - t0,
        sync: t2 - t1,
    }
}

/// The append-path alternative to stores into a mapping: frame each group
/// of `per_call` records into a small buffer and pwrite(2) it at the end
/// of a preallocated file (one syscall per append call, as an engine
/// without a mapping would do). No sync.
pub fn raw_pwrite(dir: &Path, vals: &[Vec<u8>], per_call: usize) -> Duration {
    let need: usize = vals.iter().map(|v| RAW_HEADER + v.len()).sum();
    let path = dir.join("raw-pwrite.dat");
    let f = prealloc_file(&path, need as u64);
    let mut buf = vec![0u8; per_call * (RAW_HEADER + vals[0].len()) + 4096];
    let t0 = Instant::now();
    let mut file_pos = 0u64;
    for (c, chunk) in vals.chunks(per_call).enumerate() {
        let mut used = 0;
        for (k, v) in chunk.iter().enumerate() {
            used += frame(&mut buf[used..], (c * per_call + k) as u64, v);
        }
        f.write_all_at(&buf[..used], file_pos).expect("pwrite");
        file_pos += used as u64;
    }
    let t = t0.elapsed();
    let _ = std::fs::remove_file(&path);
    t
}

/// Baseline (c): per batch, one write(2) of the framed batch into a
/// preallocated file, then fdatasync. Returns each batch's latency.
pub fn raw_durable_batches(
    dir: &Path,
    batches: usize,
    per_batch: usize,
    value_len: usize,
) -> Vec<Duration> {
    let rec = RAW_HEADER + value_len;
    let path = dir.join("raw-durable.dat");
    let mut f = prealloc_file(&path, (batches * per_batch * rec) as u64);
    let vals = values(per_batch, value_len);
    let mut buf = vec![0u8; per_batch * rec];
    let mut lat = Vec::with_capacity(batches);
    let mut offset = 0u64;
    for _ in 0..batches {
        let t0 = Instant::now();
        let mut used = 0;
        for v in &vals {
            used += frame(&mut buf[used..], offset, v);
            offset += 1;
        }
        f.write_all(&buf[..used]).expect("write");
        fdatasync(&f);
        lat.push(t0.elapsed());
    }
    let _ = std::fs::remove_file(&path);
    lat
}

/// A file of `n` framed records of `value_len` bytes, for the read baseline.
pub fn raw_file_for_read(dir: &Path, n: usize, value_len: usize) -> PathBuf {
    let path = dir.join("raw-read.dat");
    let vals = values(1024, value_len);
    let mut f = prealloc_file(&path, (n * (RAW_HEADER + value_len)) as u64);
    let mut buf = vec![0u8; 1 << 20];
    let mut used = 0;
    for i in 0..n {
        if used + RAW_HEADER + value_len > buf.len() {
            f.write_all(&buf[..used]).expect("write");
            used = 0;
        }
        used += frame(&mut buf[used..], i as u64, &vals[i % vals.len()]);
    }
    f.write_all(&buf[..used]).expect("write");
    path
}

/// Read baseline: walk a mapped raw file, check every record's CRC and
/// touch its value. Returns (records, checksum of touched bytes).
pub fn raw_read(map: &Mmap) -> (u64, u64) {
    let mut pos = 0;
    let mut records = 0u64;
    let mut touch = 0u64;
    while pos + RAW_HEADER <= map.len() {
        let len = u32::from_le_bytes(map[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(map[pos + 4..pos + 8].try_into().expect("4 bytes"));
        let body = &map[pos + 8..pos + RAW_HEADER + len];
        assert_eq!(crc32fast::hash(body), crc, "raw record at {pos} damaged");
        touch = touch.wrapping_add(touch_value(&body[8..]));
        records += 1;
        pos += RAW_HEADER + len;
    }
    (records, touch)
}

/// Maps a file read-only.
pub fn map_read(path: &Path) -> Mmap {
    let f = File::open(path).expect("open");
    // SAFETY: the file is private to this benchmark and not modified.
    unsafe { Mmap::map(&f) }.expect("map")
}

/// What "touching" a value means in the read benchmarks: its length and
/// its first and last bytes.
#[inline]
pub fn touch_value(v: &[u8]) -> u64 {
    v.len() as u64
        + u64::from(v.first().copied().unwrap_or(0))
        + u64::from(v.last().copied().unwrap_or(0))
}

/// Median of durations, in seconds.
pub fn median_secs(v: &[Duration]) -> f64 {
    let mut s: Vec<f64> = v.iter().map(Duration::as_secs_f64).collect();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// The `p`-th percentile (0..=100, nearest rank) of durations.
pub fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    if s.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// Prints the header of a summary table.
pub fn table_header(title: &str) {
    println!();
    println!("== {title} ==");
    println!(
        "| {:<44} | {:>14} | {:>14} | {:>7} |",
        "workload (median of runs)", "engine", "baseline", "ratio"
    );
}

/// Prints one row comparing throughputs: `work` units per run, median
/// durations of engine and baseline; ratio = engine rate / baseline rate.
pub fn row_rate(label: &str, unit: &str, work: f64, engine: &[Duration], base: &[Duration]) -> f64 {
    let e = work / median_secs(engine);
    let b = work / median_secs(base);
    let ratio = e / b;
    println!(
        "| {:<44} | {:>14} | {:>14} | {:>7.3} |",
        label,
        fmt_rate(e, unit),
        fmt_rate(b, unit),
        ratio
    );
    ratio
}

/// Prints one row with a single figure (no baseline).
pub fn row_value(label: &str, value: String) {
    println!("| {:<44} | {:>14} | {:>14} | {:>7} |", label, value, "", "");
}

/// Human units for a rate.
pub fn fmt_rate(r: f64, unit: &str) -> String {
    if unit == "B" {
        if r >= 1e9 {
            format!("{:.2} GB/s", r / 1e9)
        } else {
            format!("{:.1} MB/s", r / 1e6)
        }
    } else if r >= 1e6 {
        format!("{:.2} M{unit}/s", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1} k{unit}/s", r / 1e3)
    } else {
        format!("{r:.1} {unit}/s")
    }
}

/// Microseconds, two decimals.
pub fn us(d: Duration) -> String {
    format!("{:.1} us", d.as_secs_f64() * 1e6)
}

/// Number of repeated runs for the summary tables (`FISSIONLOG_BENCH_RUNS`).
pub fn runs() -> usize {
    std::env::var("FISSIONLOG_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
}
