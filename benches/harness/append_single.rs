//! Appends single records (100-byte values by default) as fast as it can
//! and prints the rate: a target for profilers (`perf record`, `valgrind
//! --tool=callgrind`) of the single-record append path (the peers bench's W1
//! and, with 1024-byte values, W2).
//!
//! `cargo bench --bench append_single -- [records] [dir] [value_bytes] [mode]`
//! (`--no-run` prints the binary's path, for a profiler).
//!
//! `mode` is `engine` (default, `Topic::append`) or a raw baseline with the
//! same record count and a 16-byte frame per record (len, CRC-32, offset):
//! `raw-write` (a 1 MiB buffer written with write(2) to a file that grows,
//! the peers bench's baseline) or `raw-mmap` (stores into a shared mapping of a
//! 1 GiB fallocated file, as the engine's segments are).
//!
//! With `FISSIONLOG_APPEND_SYNC=1` the timed part ends with a sync, as
//! the peers bench's W1/W2 do: `Log::sync` for the engine, `fdatasync`
//! for `raw-write`.

mod args;

use std::time::Instant;

use fissionlog::{Log, LogOptions, TopicConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = args::harness_args(&["1000"]).into_iter();
    let n: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2_000_000);
    let dir = args.next().map_or_else(
        || std::env::temp_dir().join(format!("fissionlog-append-{}", std::process::id())),
        Into::into,
    );
    let value_bytes: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(100);
    let mode = args.next().unwrap_or_else(|| "engine".into());
    if mode != "engine" {
        return raw(&mode, n, &dir, value_bytes);
    }
    let log = Log::open(
        &dir,
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )?;
    let config = TopicConfig {
        segment_bytes: 1 << 30,
        ..TopicConfig::default()
    };
    let topic = log.create_topic("bench", config)?;
    let value = vec![7u8; value_bytes];
    let faults = thread_minor_faults();
    let started = Instant::now();
    for _ in 0..n {
        topic.append(None, &value)?;
    }
    if sync_at_end() {
        log.sync()?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{n} records in {secs:.3} s: {:.2} M records/s, {:.0} ns/record, {} minor faults in the appending thread",
        n as f64 / secs / 1e6,
        secs * 1e9 / n as f64,
        thread_minor_faults() - faults
    );
    log.abandon();
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// Whether the timed part ends with a sync (`FISSIONLOG_APPEND_SYNC=1`).
fn sync_at_end() -> bool {
    std::env::var("FISSIONLOG_APPEND_SYNC").is_ok_and(|v| v == "1")
}

/// Minor page faults taken by the calling thread so far.
fn thread_minor_faults() -> u64 {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage into the valid, owned struct.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    ru.ru_minflt as u64
}

/// The raw baselines: frame `n` records of `value_bytes` into a buffered
/// file or a mapping; nothing is synced (as the engine run).
fn raw(
    mode: &str,
    n: u64,
    dir: &std::path::Path,
    value_bytes: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write;
    use std::os::unix::io::AsRawFd;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("raw.dat");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    let value = vec![7u8; value_bytes];
    let rec = 16 + value_bytes;
    let frame = |dst: &mut [u8], offset: u64| {
        dst[8..16].copy_from_slice(&offset.to_le_bytes());
        dst[16..rec].copy_from_slice(&value);
        let crc = crc32fast::hash(&dst[8..rec]);
        dst[0..4].copy_from_slice(&(value_bytes as u32).to_le_bytes());
        dst[4..8].copy_from_slice(&crc.to_le_bytes());
    };
    let faults = thread_minor_faults();
    let started = Instant::now();
    match mode {
        "raw-write" => {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, &file);
            let mut buf = vec![0u8; rec];
            for i in 0..n {
                frame(&mut buf, i);
                w.write_all(&buf)?;
            }
            w.flush()?;
            drop(w);
            if sync_at_end() {
                file.sync_data()?;
            }
        }
        "raw-mmap" => {
            let len = 1u64 << 30;
            // SAFETY: plain syscall on an fd we own.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
            if rc != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            // SAFETY: the file is private to this run for the mapping's life.
            let mut map = unsafe { memmap2::MmapMut::map_mut(&file) }?;
            let mut pos = 0;
            for i in 0..n {
                frame(&mut map[pos..pos + rec], i);
                pos += rec;
            }
        }
        other => return Err(format!("unknown mode {other}").into()),
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{mode}: {n} records in {secs:.3} s: {:.2} M records/s, {:.0} ns/record, {} minor faults",
        n as f64 / secs / 1e6,
        secs * 1e9 / n as f64,
        thread_minor_faults() - faults
    );
    std::fs::remove_dir_all(dir)?;
    Ok(())
}
