//! Durable 64 x 1 KiB batches (the peers bench's W3) next to raw baselines, in one
//! process, interleaved run by run: the harness behind W3's figures in
//! docs/PERFORMANCE.md.
//!
//! ```text
//! cargo bench --bench durable_w3 -- [MODE] [BATCHES] [RUNS] [DIR]
//! ```
//!
//! MODE is `all` (default: every mode below, interleaved) or one of:
//! - `raw`: per batch, one write(2) of the 64 framed records at the end of
//!   a file that grows, then fdatasync (the peers bench's baseline);
//! - `raw-prealloc`: the same into a preallocated (fallocate) file;
//! - `mmap`: stores of the framed batch into a shared mapping of a
//!   preallocated file, then fdatasync (the engine's write path for
//!   batches under 16 KiB, without the engine);
//! - `mmap-populate`: the same with pages populated ahead with
//!   `MADV_POPULATE_READ`, as a thread running ahead of the writer would;
//! - `pwrite`: pwrite(2) of the framed batch into a preallocated file, then
//!   fdatasync;
//! - `raw-sparse`: pwrite(2) of the framed batch into a file set to 1 GiB
//!   first, sparse (the shape of the engine's active segment), then
//!   fdatasync;
//! - `pwrite-zeroed`: the same into a file filled with written zeros first
//!   (no unwritten extents left to convert at each sync);
//! - `uring1`: as `raw`, with the fdatasync submitted through io_uring (as
//!   the engine syncs);
//! - `uring2`: as `uring1`, plus a 512-byte pwrite to a second file and its
//!   fdatasync in the same submission (as a round that writes the
//!   checkpoint);
//! - `engine`: `Topic::append_to` of the 64 records with
//!   `SyncPolicy::Always` (default options: checkpoint every
//!   `checkpoint_interval`);
//! - `engine-ck-every-round`: the same with `checkpoint_interval` zero, i.e.
//!   a checkpoint written and synced in every sync round (the protocol
//!   before the interval existed).
//!
//! A single mode is what `strace -c -f` and `perf stat` should watch. Each
//! mode also reports the minor page faults its thread took per batch
//! (`getrusage(RUSAGE_THREAD)`), which survive a noisy machine.
//! `FISSIONLOG_SYSCALLS=1` makes the engine sync with plain syscalls
//! instead of io_uring; `FISSIONLOG_W3_FILE_BYTES` sets the size of the
//! preallocated raw files (default: just what the run writes; the engine's
//! W3 segments are 1 GiB).

mod args;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fissionlog::{Log, LogOptions, NewRecord, SyncPolicy, TopicConfig};

const PER_BATCH: usize = 64;
const VALUE_LEN: usize = 1024;
/// The raw baselines' per-record header: len u32, crc u32, offset u64.
const RAW_HEADER: usize = 16;
const MODES: [&str; 11] = [
    "raw",
    "engine",
    "engine-ck-every-round",
    "raw-prealloc",
    "mmap",
    "mmap-populate",
    "pwrite",
    "raw-sparse",
    "pwrite-zeroed",
    "uring1",
    "uring2",
];

struct Run {
    lat: Vec<Duration>,
    faults: u64,
    cpu: Duration,
}

fn values() -> Vec<Vec<u8>> {
    (0..PER_BATCH)
        .map(|i| (0..VALUE_LEN).map(|j| (i * 31 + j * 7) as u8).collect())
        .collect()
}

fn rusage(who: libc::c_int) -> libc::rusage {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage into the valid, owned struct;
    // `who` is RUSAGE_THREAD or RUSAGE_SELF.
    unsafe { libc::getrusage(who, &mut ru) };
    ru
}

/// Minor faults of the calling thread.
fn minor_faults() -> u64 {
    rusage(libc::RUSAGE_THREAD).ru_minflt as u64
}

/// User + system CPU time of the whole process (every thread: the engine's
/// io_uring workers included).
fn cpu_time() -> Duration {
    let ru = rusage(libc::RUSAGE_SELF);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Frames the batch (records `offset..offset + 64`) into `buf`.
fn frame_batch(buf: &mut [u8], offset: u64, vals: &[Vec<u8>]) -> usize {
    let mut used = 0;
    for (k, v) in vals.iter().enumerate() {
        let n = RAW_HEADER + v.len();
        let dst = &mut buf[used..used + n];
        dst[8..16].copy_from_slice(&(offset + k as u64).to_le_bytes());
        dst[16..].copy_from_slice(v);
        let crc = crc32fast::hash(&dst[8..]);
        dst[0..4].copy_from_slice(&(v.len() as u32).to_le_bytes());
        dst[4..8].copy_from_slice(&crc.to_le_bytes());
        used += n;
    }
    used
}

/// Size of a preallocated raw file for `batches` batches.
fn file_bytes(batches: usize) -> u64 {
    let need = (batches * batch_bytes()) as u64;
    std::env::var("FISSIONLOG_W3_FILE_BYTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(need, |b: u64| b.max(need))
}

fn create(path: &Path, prealloc: u64) -> File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("create baseline file");
    if prealloc > 0 {
        // SAFETY: plain syscall on an fd we own.
        let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, prealloc as libc::off_t) };
        assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    }
    f
}

fn batch_bytes() -> usize {
    PER_BATCH * (RAW_HEADER + VALUE_LEN)
}

fn raw(dir: &Path, batches: usize, prealloc: bool, positional: bool, zeroed: bool) -> Run {
    let path = dir.join("raw.dat");
    let size = if prealloc { file_bytes(batches) } else { 0 };
    let mut f = create(&path, size);
    if positional && !prealloc {
        f.set_len(1 << 30).expect("set_len");
    }
    if zeroed {
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < size {
            let n = (size - at).min(zeros.len() as u64) as usize;
            f.write_all_at(&zeros[..n], at).expect("zero fill");
            at += n as u64;
        }
        f.sync_all().expect("fsync");
    }
    let vals = values();
    let mut buf = vec![0u8; batch_bytes()];
    let mut lat = Vec::with_capacity(batches);
    let mut pos = 0u64;
    let faults = minor_faults();
    let cpu = cpu_time();
    for b in 0..batches {
        let t0 = Instant::now();
        let n = frame_batch(&mut buf, (b * PER_BATCH) as u64, &vals);
        if positional {
            f.write_all_at(&buf[..n], pos).expect("pwrite");
        } else {
            f.write_all(&buf[..n]).expect("write");
        }
        pos += n as u64;
        f.sync_data().expect("fdatasync");
        lat.push(t0.elapsed());
    }
    let faults = minor_faults() - faults;
    let cpu = cpu_time() - cpu;
    drop(f);
    let _ = std::fs::remove_file(&path);
    Run { lat, faults, cpu }
}

fn mmap(dir: &Path, batches: usize, populate: bool) -> Run {
    let path = dir.join("mmap.dat");
    let f = create(&path, file_bytes(batches));
    // SAFETY: the file is private to this run for the mapping's life.
    let mut map = unsafe { memmap2::MmapMut::map_mut(&f) }.expect("map");
    let vals = values();
    let mut lat = Vec::with_capacity(batches);
    let mut pos = 0usize;
    let mut populated = 0usize;
    const AHEAD: usize = 8 << 20;
    let faults = minor_faults();
    let cpu = cpu_time();
    for b in 0..batches {
        let t0 = Instant::now();
        if populate && pos + AHEAD > populated && populated < map.len() {
            // The engine does this on another thread, ahead of the writer;
            // here it is done inline (outside the fault count it would add
            // to the writer, since MADV_POPULATE_READ faults pages in clean).
            let len = (2 << 20).min(map.len() - populated);
            // SAFETY: the range lies inside the mapping; populating only
            // faults pages in and changes no bytes.
            unsafe {
                libc::madvise(
                    map.as_mut_ptr().add(populated).cast(),
                    len,
                    libc::MADV_POPULATE_READ,
                )
            };
            populated += len;
        }
        let n = frame_batch(&mut map[pos..], (b * PER_BATCH) as u64, &vals);
        pos += n;
        f.sync_data().expect("fdatasync");
        lat.push(t0.elapsed());
    }
    let faults = minor_faults() - faults;
    let cpu = cpu_time() - cpu;
    drop(map);
    drop(f);
    let _ = std::fs::remove_file(&path);
    Run { lat, faults, cpu }
}

fn uring(dir: &Path, batches: usize, second_file: bool) -> Run {
    use io_uring::{opcode, types, IoUring};
    let path = dir.join("uring.dat");
    let mut f = create(&path, 0);
    let side_path = dir.join("uring-side.dat");
    let side = create(&side_path, 0);
    let mut ring = IoUring::new(8).expect("io_uring");
    let vals = values();
    let mut buf = vec![0u8; batch_bytes()];
    let side_buf = vec![1u8; 512];
    let mut lat = Vec::with_capacity(batches);
    let faults = minor_faults();
    let cpu = cpu_time();
    for b in 0..batches {
        let t0 = Instant::now();
        let n = frame_batch(&mut buf, (b * PER_BATCH) as u64, &vals);
        f.write_all(&buf[..n]).expect("write");
        let mut fds = vec![f.as_raw_fd()];
        if second_file {
            side.write_all_at(&side_buf, 0).expect("pwrite");
            fds.push(side.as_raw_fd());
        }
        for (i, fd) in fds.iter().enumerate() {
            let sqe = opcode::Fsync::new(types::Fd(*fd))
                .flags(types::FsyncFlags::DATASYNC)
                .build()
                .user_data(i as u64);
            // SAFETY: the fds stay open until the completions are reaped below.
            unsafe { ring.submission().push(&sqe) }.expect("submission queue");
        }
        ring.submit_and_wait(fds.len()).expect("submit");
        let mut got = 0;
        while got < fds.len() {
            for cqe in ring.completion() {
                assert!(cqe.result() >= 0, "fsync failed");
                got += 1;
            }
            if got < fds.len() {
                ring.submit_and_wait(fds.len() - got).expect("wait");
            }
        }
        lat.push(t0.elapsed());
    }
    let faults = minor_faults() - faults;
    let cpu = cpu_time() - cpu;
    drop(f);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&side_path);
    Run { lat, faults, cpu }
}

fn engine(dir: &Path, batches: usize, checkpoint_interval: Option<Duration>) -> Run {
    let _ = std::fs::remove_dir_all(dir);
    let mut options = LogOptions {
        balancer: false,
        use_io_uring: std::env::var_os("FISSIONLOG_SYSCALLS").is_none(),
        ..LogOptions::default()
    };
    if let Some(d) = checkpoint_interval {
        options.checkpoint_interval = d;
    }
    let log = Log::open(dir, options).expect("open");
    let topic = log
        .create_topic(
            "w3",
            TopicConfig {
                segment_bytes: 1 << 30,
                sync: SyncPolicy::Always,
                ..TopicConfig::default()
            },
        )
        .expect("create topic");
    let vals = values();
    let recs: Vec<NewRecord<'_>> = vals
        .iter()
        .map(|v| NewRecord {
            key: None,
            value: v,
            timestamp: None,
        })
        .collect();
    let mut lat = Vec::with_capacity(batches);
    let faults = minor_faults();
    let cpu = cpu_time();
    for _ in 0..batches {
        let t0 = Instant::now();
        topic.append_to(0, &recs).expect("append_to");
        lat.push(t0.elapsed());
    }
    let faults = minor_faults() - faults;
    let cpu = cpu_time() - cpu;
    drop(topic);
    log.abandon();
    let _ = std::fs::remove_dir_all(dir);
    Run { lat, faults, cpu }
}

fn run_mode(mode: &str, dir: &Path, batches: usize) -> Run {
    std::fs::create_dir_all(dir).expect("bench dir");
    match mode {
        "raw" => raw(dir, batches, false, false, false),
        "raw-prealloc" => raw(dir, batches, true, false, false),
        "pwrite" => raw(dir, batches, true, true, false),
        "pwrite-zeroed" => raw(dir, batches, true, true, true),
        "raw-sparse" => raw(dir, batches, false, true, false),
        "mmap" => mmap(dir, batches, false),
        "mmap-populate" => mmap(dir, batches, true),
        "uring1" => uring(dir, batches, false),
        "uring2" => uring(dir, batches, true),
        "engine" => engine(&dir.join("log"), batches, None),
        "engine-ck-every-round" => engine(&dir.join("log"), batches, Some(Duration::ZERO)),
        other => panic!("unknown mode {other}; one of all, {}", MODES.join(", ")),
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn main() {
    let mut args = args::harness_args(&["all", "5", "1"]).into_iter();
    let mode = args.next().unwrap_or_else(|| "all".into());
    let batches: usize = args.next().map_or(2000, |s| s.parse().expect("BATCHES"));
    let runs: usize = args.next().map_or(3, |s| s.parse().expect("RUNS"));
    let dir: PathBuf = args.next().map_or_else(
        || std::env::temp_dir().join(format!("fissionlog-w3-{}", std::process::id())),
        Into::into,
    );
    let modes: Vec<&str> = if mode == "all" {
        MODES.to_vec()
    } else {
        vec![mode.as_str()]
    };
    let mut results: Vec<(Vec<Duration>, Vec<f64>, u64, Duration)> = modes
        .iter()
        .map(|_| (Vec::new(), Vec::new(), 0, Duration::ZERO))
        .collect();
    for _ in 0..runs {
        for (i, m) in modes.iter().enumerate() {
            let r = run_mode(m, &dir, batches);
            let total: Duration = r.lat.iter().sum();
            results[i]
                .1
                .push((batches * PER_BATCH) as f64 / total.as_secs_f64());
            results[i].0.extend(r.lat);
            results[i].2 += r.faults;
            results[i].3 += r.cpu;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // Per-run ratios to the raw run of the same round: the machine's noise
    // moves both sides of a round together more than it moves rounds.
    let raw_rates = modes
        .iter()
        .position(|m| *m == "raw")
        .map(|i| results[i].1.clone());
    let mut base_p99 = None;
    println!(
        "W3: {batches} durable batches of {PER_BATCH} x {VALUE_LEN} B, {runs} runs, interleaved"
    );
    println!(
        "{:<22} {:>12} {:>8} {:>10} {:>10} {:>9} {:>14} {:>14}",
        "mode", "records/s", "ratio*", "p50 ms", "p99 ms", "p99 x", "faults/batch", "cpu us/batch"
    );
    for (m, (lat, rates, faults, cpu)) in modes.iter().zip(results.iter_mut()) {
        lat.sort();
        let mut ratios: Vec<f64> = raw_rates.as_ref().map_or_else(Vec::new, |raw| {
            rates.iter().zip(raw).map(|(r, b)| r / b).collect()
        });
        let ratio = if ratios.is_empty() {
            f64::NAN
        } else {
            median(&mut ratios)
        };
        let rate = median(rates);
        let (p50, p99) = (pct(lat, 0.5), pct(lat, 0.99));
        if *m == "raw" {
            base_p99 = Some(p99);
        }
        let p99x = base_p99.map_or(f64::NAN, |b| p99.as_secs_f64() / b.as_secs_f64());
        println!(
            "{:<22} {:>12.0} {:>8.2} {:>10.3} {:>10.3} {:>9.2} {:>14.1} {:>14.1}",
            m,
            rate,
            ratio,
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            p99x,
            *faults as f64 / (batches * runs) as f64,
            cpu.as_secs_f64() * 1e6 / (batches * runs) as f64
        );
    }
    println!("ratio*: median over runs of records/s over the same run's raw records/s");
}
