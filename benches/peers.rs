//! Peers in the same run: fissionlog beside raw OS baselines and two peer
//! crates, `okaywal` 0.3 and `commitlog` 0.2, on the same workloads, in one
//! process. Within every run the systems take turns workload by workload
//! (which goes first rotates from run to run); in W3 they take turns batch
//! by batch, so that the shared disk's latency swings land on all alike.
//!
//! Every workload uses one topic with one partition, 1 GiB segments and the
//! balancer off; values come from a deterministic generator whose first 8
//! bytes are the record's sequence number; no key. Opening and closing are
//! not timed; the final sync is.
//!
//! - W1: 1,000,000 x 100 B, one append call per record, one sync at the end.
//! - W1-batch: the same, 100 records per append call.
//! - W2: 300,000 x 1 KiB, one append call per record, one sync at the end.
//! - W3: 2,000 batches of 64 x 1 KiB, each durable before the next
//!   (p50/p99 batch latency).
//! - W4: W2's data read back, checking every record's offset (where the
//!   system has offsets) and sequence number.
//! - W5: 8 threads share W3's 2,000 batches, each batch durable before its
//!   writer goes on (p50/p99 batch latency).
//!
//! Raw baselines frame each record with `common::frame` (16-byte header,
//! CRC-32): W1/W2 through a 1 MiB `BufWriter` on a file that grows by
//! write(2), then fdatasync; W3 one write(2) of the framed batch then
//! fdatasync; W4 a walk over a mapping of W2's file checking each CRC; W5
//! write(2) under a mutex plus leader/follower fdatasync (one sync covers
//! every batch written before it).
//!
//! Peers, and what their sync means:
//! - okaywal: `EntryWriter::commit` writes the entry and fdatasyncs the
//!   file (group-committed across threads) before returning; there is no
//!   commit without it. W1/W2: one entry, one chunk per record, one commit
//!   at the end (one entry per record would be one fdatasync per record).
//!   W1-batch: not run (no multi-record call). W3/W5: one entry of 64
//!   chunks per batch, committed. W4: `read_at` of each chunk's position
//!   (it opens the segment file per call).
//! - commitlog: `flush()` msyncs its index but does not sync the segment
//!   file, so the bench fdatasyncs the segment file itself after `flush()`
//!   wherever a workload asks for durability. W5: not run (`append` takes
//!   `&mut self`: one writer).
//!
//! `cargo bench --bench peers`; knobs `PEERS_RUNS` (default 3),
//! `PEERS_SCALE` (record and batch counts are multiplied by it, default 1)
//! and `PEERS_ONLY` (a comma-separated list of workloads to run, e.g.
//! `W3,W5`; W4 reads W2's data, so either runs both).
//! Without `--bench` (as `cargo test --benches` runs it) the defaults are
//! one run at scale 0.002.

mod common;

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use commitlog::message::{MessageBuf, MessageSet};
use commitlog::{CommitLog, ReadLimit};
use fissionlog::BalancePolicy;
use fissionlog::{Log, LogOptions, NewRecord, SyncPolicy, Topic, TopicConfig};
use okaywal::{LogPosition, LogVoid, WriteAheadLog};

use common::{
    bench_dir, fmt_rate, frame, is_bench_run, map_read, percentile, remove_dir, RAW_HEADER,
};

const SEGMENT_BYTES: u64 = 1 << 30;
const READ_MAX: usize = 1 << 20;
const W1_RECORDS: f64 = 1_000_000.0;
const W1_LEN: usize = 100;
const W1_BATCH: usize = 100;
const W2_RECORDS: f64 = 300_000.0;
const W2_LEN: usize = 1024;
const W3_BATCHES: f64 = 2_000.0;
const W3_PER_BATCH: usize = 64;
const W3_LEN: usize = 1024;
const W5_THREADS: usize = 8;

// ---------------------------------------------------------------- values

/// `n` values of `len` bytes in one buffer: the first 8 bytes of value `i`
/// are `i` (little endian), the rest a deterministic xorshift stream.
struct Values {
    data: Vec<u8>,
    len: usize,
}

impl Values {
    fn new(n: usize, len: usize) -> Values {
        assert!(len >= 8, "values carry an 8-byte sequence number");
        let mut data = vec![0u8; n * len];
        for (i, v) in data.chunks_exact_mut(len).enumerate() {
            fill(v, i as u64);
        }
        Values { data, len }
    }

    fn count(&self) -> usize {
        self.data.len() / self.len
    }

    fn iter(&self) -> std::slice::ChunksExact<'_, u8> {
        self.data.chunks_exact(self.len)
    }

    /// Value `i`.
    fn get(&self, i: usize) -> &[u8] {
        &self.data[i * self.len..(i + 1) * self.len]
    }

    /// The values as keyless records (built outside the timed parts).
    fn records(&self) -> Vec<NewRecord<'_>> {
        self.iter()
            .map(|v| NewRecord {
                key: None,
                value: v,
                timestamp: None,
            })
            .collect()
    }
}

fn fill(v: &mut [u8], seq: u64) {
    v[..8].copy_from_slice(&seq.to_le_bytes());
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D;
    for c in v[8..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

fn seq_of(v: &[u8]) -> u64 {
    u64::from_le_bytes(v[..8].try_into().expect("8-byte sequence number"))
}

// ---------------------------------------------------------------- results

/// One system's result for one run of one workload.
struct Run {
    records: usize,
    secs: f64,
    /// Per-batch latencies (latency workloads only).
    lat: Vec<Duration>,
}

impl Run {
    fn timed(records: usize, t0: Instant) -> Run {
        Run {
            records,
            secs: t0.elapsed().as_secs_f64(),
            lat: Vec::new(),
        }
    }
}

/// One system's results for one workload over all runs.
#[derive(Default)]
struct Cell {
    rates: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
}

impl Cell {
    fn add(&mut self, r: Run) {
        self.rates.push(r.records as f64 / r.secs);
        if !r.lat.is_empty() {
            self.p50.push(percentile(&r.lat, 50.0).as_secs_f64());
            self.p99.push(percentile(&r.lat, 99.0).as_secs_f64());
        }
    }
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sys {
    Fission = 0,
    Raw = 1,
    OkayWal = 2,
    CommitLog = 3,
}

const SYSTEMS: [Sys; 4] = [Sys::Fission, Sys::Raw, Sys::OkayWal, Sys::CommitLog];

impl Sys {
    fn name(self) -> &'static str {
        match self {
            Sys::Fission => "fissionlog",
            Sys::Raw => "raw",
            Sys::OkayWal => "okaywal",
            Sys::CommitLog => "commitlog",
        }
    }

    /// A fresh bench directory for this system.
    fn dir(self, workload: &str) -> PathBuf {
        bench_dir(&format!("peers-{workload}-{}", self.name()))
    }
}

struct Row {
    label: String,
    latency: bool,
    cells: [Cell; 4],
}

impl Row {
    fn new(label: String, latency: bool) -> Row {
        Row {
            label,
            latency,
            cells: Default::default(),
        }
    }

    fn add(&mut self, sys: Sys, r: Run) {
        self.cells[sys as usize].add(r);
    }
}

// ---------------------------------------------------------------- fissionlog

fn fl_open(dir: &Path, sync: SyncPolicy) -> (Log, Topic) {
    let log = Log::open(
        dir,
        LogOptions {
            balancer: false,
            ..Default::default()
        },
    )
    .expect("open log");
    let topic = log
        .create_topic(
            "peers",
            TopicConfig {
                partitions: 1,
                segment_bytes: SEGMENT_BYTES,
                sync,
                balance: BalancePolicy {
                    enabled: false,
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .expect("create topic");
    (log, topic)
}

fn fl_close(log: Log, topic: Topic, dir: &Path) {
    drop(topic);
    log.close().expect("close log");
    remove_dir(dir);
}

/// W1, W1-batch, W2: `per_call` records per append call, then `Log::sync`.
fn fl_stream(dir: &Path, vals: &Values, per_call: usize) -> (Log, Topic, Run) {
    let (log, topic) = fl_open(dir, SyncPolicy::Never);
    let n = vals.count();
    let recs = if per_call > 1 {
        vals.records()
    } else {
        Vec::new()
    };
    let t0 = Instant::now();
    let last = if per_call == 1 {
        let mut last = None;
        for v in vals.iter() {
            last = Some(topic.append(None, v).expect("append").offset);
        }
        last.map(|o| o + 1)
    } else {
        let mut last = None;
        for c in recs.chunks(per_call) {
            last = Some(topic.append_to(0, c).expect("append_to") + c.len() as u64);
        }
        last
    };
    log.sync().expect("sync");
    let run = Run::timed(n, t0);
    assert_eq!(last, Some(n as u64), "fissionlog: offsets after appends");
    (log, topic, run)
}

/// W4: reads partition 0 back in 1 MiB reads, checking offsets and values.
fn fl_read(topic: &Topic, n: usize) -> Run {
    let t0 = Instant::now();
    let (mut off, mut next) = (0u64, 0u64);
    while off < n as u64 {
        let rb = topic.read(0, off, READ_MAX).expect("read");
        for r in rb.iter() {
            assert!(
                r.offset == next && seq_of(r.value) == next,
                "fissionlog: record {next} wrong on read-back"
            );
            next += 1;
        }
        off = rb.next_offset();
    }
    let run = Run::timed(n, t0);
    assert_eq!(next, n as u64, "fissionlog: records read back");
    run
}

/// W5: 8 threads `append_to` the same partition with `SyncPolicy::Always`.
fn fl_concurrent(dir: &Path, vals: &Values) -> Run {
    let (log, topic) = fl_open(dir, SyncPolicy::Always);
    let recs = vals.records();
    let batches: Vec<&[NewRecord<'_>]> = recs.chunks(W3_PER_BATCH).collect();
    let run = concurrent(recs.len(), batches.len(), |b, _| {
        topic.append_to(0, batches[b]).expect("append_to");
    });
    fl_close(log, topic, dir);
    run
}

// ---------------------------------------------------------------- raw

/// Frames values `first..first + chunk.len() / len` of `chunk` into `buf`.
fn frame_chunk(buf: &mut [u8], first: usize, chunk: &[u8], len: usize) -> usize {
    let mut used = 0;
    for (k, v) in chunk.chunks_exact(len).enumerate() {
        used += frame(&mut buf[used..], (first + k) as u64, v);
    }
    used
}

/// W1, W1-batch, W2: frame `per_call` records at a time into a 1 MiB
/// `BufWriter` on a file that grows by write(2); then fdatasync.
fn raw_stream(dir: &Path, vals: &Values, per_call: usize) -> (PathBuf, Run) {
    let path = dir.join("raw.dat");
    let f = File::create(&path).expect("create raw file");
    let mut buf = vec![0u8; per_call * (RAW_HEADER + vals.len)];
    let t0 = Instant::now();
    let mut w = BufWriter::with_capacity(1 << 20, f);
    for (c, chunk) in vals.data.chunks(per_call * vals.len).enumerate() {
        let used = frame_chunk(&mut buf, c * per_call, chunk, vals.len);
        w.write_all(&buf[..used]).expect("write");
    }
    let f = w.into_inner().expect("flush");
    f.sync_data().expect("fdatasync");
    (path, Run::timed(vals.count(), t0))
}

/// W4: walk a mapping of the raw file, checking CRC, offset and value.
fn raw_read(path: &Path, n: usize) -> Run {
    let t0 = Instant::now();
    let map = map_read(path);
    let mut pos = 0;
    for i in 0..n as u64 {
        let len = u32::from_le_bytes(map[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(map[pos + 4..pos + 8].try_into().expect("4 bytes"));
        let body = &map[pos + 8..pos + RAW_HEADER + len];
        assert!(
            crc32fast::hash(body) == crc
                && u64::from_le_bytes(body[..8].try_into().expect("8 bytes")) == i
                && seq_of(&body[8..]) == i,
            "raw: record {i} wrong on read-back"
        );
        pos += RAW_HEADER + len;
    }
    let run = Run::timed(n, t0);
    assert_eq!(pos, map.len(), "raw: file length");
    run
}

/// Leader/follower fdatasync: whoever finds no sync running syncs
/// everything written so far; the others wait for a sync that started
/// after their write.
struct GroupSync {
    file: Mutex<File>,
    sync_fd: File,
    written: AtomicU64,
    state: Mutex<SyncState>,
    cv: Condvar,
}

struct SyncState {
    synced: u64,
    syncing: bool,
}

impl GroupSync {
    /// Appends `bytes` under the write lock and returns once they are durable.
    fn write_durable(&self, bytes: &[u8]) {
        let end = {
            let mut f = self.file.lock().expect("write lock");
            f.write_all(bytes).expect("write");
            self.written.fetch_add(bytes.len() as u64, Ordering::AcqRel) + bytes.len() as u64
        };
        let mut st = self.state.lock().expect("sync state");
        while st.synced < end {
            if st.syncing {
                st = self.cv.wait(st).expect("sync state");
                continue;
            }
            st.syncing = true;
            drop(st);
            // Every write counted here has completed: this sync covers it.
            let target = self.written.load(Ordering::Acquire);
            self.sync_fd.sync_data().expect("fdatasync");
            st = self.state.lock().expect("sync state");
            st.syncing = false;
            st.synced = st.synced.max(target);
            self.cv.notify_all();
        }
    }
}

/// W5: 8 threads, write(2) under a mutex, leader/follower fdatasync.
/// Records are framed (with their sequence number as offset) outside the
/// lock.
fn raw_concurrent(dir: &Path, vals: &Values) -> Run {
    let f = File::create(dir.join("raw-group.dat")).expect("create raw file");
    let g = GroupSync {
        sync_fd: f.try_clone().expect("dup"),
        file: Mutex::new(f),
        written: AtomicU64::new(0),
        state: Mutex::new(SyncState {
            synced: 0,
            syncing: false,
        }),
        cv: Condvar::new(),
    };
    let batch_bytes = W3_PER_BATCH * vals.len;
    let batches = vals.data.len().div_ceil(batch_bytes);
    concurrent(vals.count(), batches, |b, buf| {
        let chunk = &vals.data[b * batch_bytes..((b + 1) * batch_bytes).min(vals.data.len())];
        buf.resize(W3_PER_BATCH * (RAW_HEADER + vals.len), 0);
        let used = frame_chunk(buf, b * W3_PER_BATCH, chunk, vals.len);
        g.write_durable(&buf[..used]);
    })
}

// ---------------------------------------------------------------- okaywal

/// okaywal with 1 MiB of preallocation (its default; the file grows past
/// it by write(2)), a checkpoint only after 1 GiB (none inside a run) and a
/// 1 MiB write buffer.
fn okw_open(dir: &Path) -> WriteAheadLog {
    okaywal::Configuration::default_for(dir)
        .checkpoint_after_bytes(SEGMENT_BYTES)
        .buffer_bytes(1 << 20)
        .open(LogVoid)
        .expect("open okaywal")
}

/// W1, W2: one entry, one chunk per record, one commit (fdatasync).
fn okw_stream(dir: &Path, vals: &Values) -> (WriteAheadLog, Vec<LogPosition>, Run) {
    let wal = okw_open(dir);
    let mut pos = Vec::with_capacity(vals.count());
    let t0 = Instant::now();
    let mut entry = wal.begin_entry().expect("begin_entry");
    for v in vals.iter() {
        pos.push(entry.write_chunk(v).expect("write_chunk").position);
    }
    entry.commit().expect("commit");
    let run = Run::timed(vals.count(), t0);
    (wal, pos, run)
}

/// W4: `read_at` each chunk's position, checking its CRC and value.
fn okw_read(wal: &WriteAheadLog, pos: &[LogPosition], len: usize) -> Run {
    let mut buf = vec![0u8; len];
    let t0 = Instant::now();
    for (i, p) in pos.iter().enumerate() {
        let mut r = wal.read_at(*p).expect("read_at");
        assert_eq!(r.chunk_length() as usize, len, "okaywal: chunk length");
        r.read_exact(&mut buf).expect("read chunk");
        assert!(
            r.crc_is_valid().expect("crc") && seq_of(&buf) == i as u64,
            "okaywal: record {i} wrong on read-back"
        );
    }
    Run::timed(pos.len(), t0)
}

fn okw_close(wal: WriteAheadLog, dir: &Path) {
    wal.shutdown().expect("okaywal shutdown");
    remove_dir(dir);
}

/// One entry of a batch's chunks, committed.
fn okw_batch(wal: &WriteAheadLog, vals: &Values, b: usize) {
    let mut entry = wal.begin_entry().expect("begin_entry");
    let end = ((b + 1) * W3_PER_BATCH).min(vals.count());
    for i in b * W3_PER_BATCH..end {
        entry.write_chunk(vals.get(i)).expect("write_chunk");
    }
    entry.commit().expect("commit");
}

/// W5: the same from 8 threads (okaywal group-commits their fdatasyncs).
fn okw_concurrent(dir: &Path, vals: &Values) -> Run {
    let wal = okw_open(dir);
    let batches = vals.count().div_ceil(W3_PER_BATCH);
    let run = concurrent(vals.count(), batches, |b, _| okw_batch(&wal, vals, b));
    okw_close(wal, dir);
    run
}

// ---------------------------------------------------------------- commitlog

/// commitlog with 1 GiB segments, and a handle on its (only) segment file
/// for the fdatasync its `flush()` does not do.
fn cl_open(dir: &Path) -> (CommitLog, File) {
    let mut opts = commitlog::LogOptions::new(dir);
    opts.segment_max_bytes(SEGMENT_BYTES as usize);
    let log = CommitLog::new(opts).expect("open commitlog");
    let seg = OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join(format!("{:020}.log", 0)))
        .expect("open commitlog segment");
    (log, seg)
}

/// `flush()` (msyncs the index) plus fdatasync of the segment file.
fn cl_sync(log: &mut CommitLog, seg: &File) {
    log.flush().expect("flush");
    seg.sync_data().expect("fdatasync");
}

/// The segment synced by `cl_sync` must be the only one.
fn cl_check_one_segment(dir: &Path) {
    let segs = std::fs::read_dir(dir)
        .expect("read dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "log"))
        })
        .count();
    assert_eq!(segs, 1, "commitlog rolled a segment: the sync missed some");
}

/// W1, W1-batch, W2: `append_msg` per record, or one `MessageBuf` of
/// `per_call` records per `append`; then flush + fdatasync.
fn cl_stream(dir: &Path, vals: &Values, per_call: usize) -> (CommitLog, Run) {
    let (mut log, seg) = cl_open(dir);
    let t0 = Instant::now();
    if per_call == 1 {
        for v in vals.iter() {
            log.append_msg(v).expect("append_msg");
        }
    } else {
        for chunk in vals.data.chunks(per_call * vals.len) {
            let mut buf = MessageBuf::default();
            for v in chunk.chunks_exact(vals.len) {
                buf.push(v).expect("push");
            }
            log.append(&mut buf).expect("append");
        }
    }
    cl_sync(&mut log, &seg);
    let run = Run::timed(vals.count(), t0);
    assert_eq!(log.next_offset(), vals.count() as u64, "commitlog: offsets");
    cl_check_one_segment(dir);
    (log, run)
}

/// W4: `read` in 1 MiB slices (it checks each message's CRC-32C),
/// checking offsets and values.
fn cl_read(log: &CommitLog, n: usize) -> Run {
    let t0 = Instant::now();
    let mut next = 0u64;
    while next < n as u64 {
        let mb = log
            .read(next, ReadLimit::max_bytes(READ_MAX))
            .expect("read");
        assert!(!mb.is_empty(), "commitlog: empty read at {next}");
        for m in mb.iter() {
            assert!(
                m.offset() == next && seq_of(m.payload()) == next,
                "commitlog: record {next} wrong on read-back"
            );
            next += 1;
        }
    }
    Run::timed(n, t0)
}

// ---------------------------------------------------------------- W3

/// One system's open log for W3.
enum Durable<'v> {
    /// `append_to` with `SyncPolicy::Always`.
    Fission(Log, Topic, Vec<NewRecord<'v>>),
    /// One write(2) of the framed batch, then fdatasync.
    Raw(File, Vec<u8>),
    /// One entry of 64 chunks, committed.
    OkayWal(WriteAheadLog),
    /// One `MessageBuf` of 64, `append`, `flush()` + fdatasync.
    CommitLog(CommitLog, File),
}

impl<'v> Durable<'v> {
    fn open(sys: Sys, dir: &Path, vals: &'v Values) -> Durable<'v> {
        match sys {
            Sys::Fission => {
                let (log, topic) = fl_open(dir, SyncPolicy::Always);
                Durable::Fission(log, topic, vals.records())
            }
            Sys::Raw => Durable::Raw(
                File::create(dir.join("raw-durable.dat")).expect("create raw file"),
                vec![0u8; W3_PER_BATCH * (RAW_HEADER + vals.len)],
            ),
            Sys::OkayWal => Durable::OkayWal(okw_open(dir)),
            Sys::CommitLog => {
                let (log, seg) = cl_open(dir);
                Durable::CommitLog(log, seg)
            }
        }
    }

    /// Writes batch `b`; returns once it is durable.
    fn batch(&mut self, vals: &Values, b: usize) {
        let first = b * W3_PER_BATCH;
        let end = (first + W3_PER_BATCH).min(vals.count());
        match self {
            Durable::Fission(_, topic, recs) => {
                let base = topic.append_to(0, &recs[first..end]).expect("append_to");
                assert_eq!(base, first as u64, "fissionlog: batch offset");
            }
            Durable::Raw(f, buf) => {
                let chunk = &vals.data[first * vals.len..end * vals.len];
                let used = frame_chunk(buf, first, chunk, vals.len);
                f.write_all(&buf[..used]).expect("write");
                f.sync_data().expect("fdatasync");
            }
            Durable::OkayWal(wal) => okw_batch(wal, vals, b),
            Durable::CommitLog(log, seg) => {
                let mut buf = MessageBuf::default();
                for i in first..end {
                    buf.push(vals.get(i)).expect("push");
                }
                log.append(&mut buf).expect("append");
                cl_sync(log, seg);
            }
        }
    }

    fn close(self, dir: &Path) {
        match self {
            Durable::Fission(log, topic, _) => fl_close(log, topic, dir),
            Durable::Raw(..) => remove_dir(dir),
            Durable::OkayWal(wal) => okw_close(wal, dir),
            Durable::CommitLog(log, seg) => {
                drop((log, seg));
                cl_check_one_segment(dir);
                remove_dir(dir);
            }
        }
    }
}

/// W3: the four systems' batches interleaved one by one (which system goes
/// first rotates every batch), so disk contention from elsewhere on the
/// machine lands on all of them alike. Throughput is records over the sum
/// of a system's batch latencies.
fn w3_interleaved(vals: &Values) -> Vec<Run> {
    let dirs: Vec<PathBuf> = SYSTEMS.iter().map(|s| s.dir("w3")).collect();
    let mut logs: Vec<Durable<'_>> = SYSTEMS
        .iter()
        .zip(&dirs)
        .map(|(&sys, dir)| Durable::open(sys, dir, vals))
        .collect();
    let batches = vals.count().div_ceil(W3_PER_BATCH);
    let mut lat = vec![Vec::with_capacity(batches); SYSTEMS.len()];
    for b in 0..batches {
        for k in 0..SYSTEMS.len() {
            let s = (b + k) % SYSTEMS.len();
            let t = Instant::now();
            logs[s].batch(vals, b);
            lat[s].push(t.elapsed());
        }
    }
    for (log, dir) in logs.into_iter().zip(&dirs) {
        log.close(dir);
    }
    lat.into_iter()
        .map(|lat| Run {
            records: vals.count(),
            secs: lat.iter().sum::<Duration>().as_secs_f64(),
            lat,
        })
        .collect()
}

// ---------------------------------------------------------------- shared

/// `threads` writers take batch indexes `0..batches` from a shared counter
/// and call `f(batch, scratch)`; returns the wall time and every batch's
/// latency.
fn concurrent(records: usize, batches: usize, f: impl Fn(usize, &mut Vec<u8>) + Sync) -> Run {
    let next = AtomicUsize::new(0);
    let t0 = Instant::now();
    let lat: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..W5_THREADS)
            .map(|_| {
                s.spawn(|| {
                    let mut scratch = Vec::new();
                    let mut lat = Vec::new();
                    loop {
                        let b = next.fetch_add(1, Ordering::Relaxed);
                        if b >= batches {
                            break lat;
                        }
                        let t = Instant::now();
                        f(b, &mut scratch);
                        lat.push(t.elapsed());
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("writer thread"))
            .collect()
    });
    let mut run = Run::timed(records, t0);
    run.lat = lat;
    run
}

fn env_f64(name: &str) -> Option<f64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

fn scaled(base: f64, scale: f64) -> usize {
    ((base * scale).round() as usize).max(1)
}

fn fmt_ms(s: f64) -> String {
    if s >= 0.1 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{:.2} ms", s * 1e3)
    }
}

fn print_table(rows: &[Row], runs: usize, scale: f64) {
    println!();
    println!("== Peers in the same run: medians of {runs} run(s), scale {scale} ==");
    println!(
        "| {:<46} | {:>14} | {:>14} | {:>14} | {:>14} | {:>8} |",
        "workload (records/s; latency p50 / p99)",
        "fissionlog",
        "raw",
        "okaywal",
        "commitlog",
        "fl / raw"
    );
    println!(
        "|{:-<48}|{:->16}|{:->16}|{:->16}|{:->16}|{:->10}|",
        "", "", "", "", "", ""
    );
    for row in rows {
        let rate = |c: &Cell| median(&c.rates);
        let cells: Vec<String> = row
            .cells
            .iter()
            .map(|c| rate(c).map_or_else(|| "n/a".to_string(), |r| fmt_rate(r, "rec")))
            .collect();
        let ratio = match (rate(&row.cells[0]), rate(&row.cells[1])) {
            (Some(f), Some(r)) => format!("{:.2}", f / r),
            _ => String::new(),
        };
        println!(
            "| {:<46} | {:>14} | {:>14} | {:>14} | {:>14} | {:>8} |",
            row.label, cells[0], cells[1], cells[2], cells[3], ratio
        );
        if row.latency {
            let lats: Vec<String> = row
                .cells
                .iter()
                .map(|c| match (median(&c.p50), median(&c.p99)) {
                    (Some(a), Some(b)) => format!("{} / {}", fmt_ms(a), fmt_ms(b)),
                    _ => "n/a".to_string(),
                })
                .collect();
            let ratio = match (median(&row.cells[0].p99), median(&row.cells[1].p99)) {
                (Some(f), Some(r)) => format!("p99 {:.2}", f / r),
                _ => String::new(),
            };
            println!(
                "| {:<46} | {:>14} | {:>14} | {:>14} | {:>14} | {:>8} |",
                "  batch latency p50 / p99", lats[0], lats[1], lats[2], lats[3], ratio
            );
        }
    }
    println!();
    println!("Per run (records/s):");
    for row in rows {
        for (sys, cell) in SYSTEMS.iter().zip(&row.cells) {
            if cell.rates.is_empty() {
                continue;
            }
            let rates: Vec<String> = cell.rates.iter().map(|&r| fmt_rate(r, "rec")).collect();
            let label = row.label.split_whitespace().next().unwrap_or("");
            println!("  {label:<8} {:<10} {}", sys.name(), rates.join(", "));
        }
    }
    println!();
    println!("Sync at the end of W1/W1-batch/W2 and per batch in W3/W5:");
    println!("  fissionlog: Log::sync() (W1/W2); SyncPolicy::Always append_to (W3/W5).");
    println!("  raw:        fdatasync (W5: leader/follower, one sync covers earlier writes).");
    println!("  okaywal:    EntryWriter::commit (writes and fdatasyncs). W1/W2: one entry,");
    println!("              one chunk per record, one commit; W3/W5: one entry of 64 chunks");
    println!("              per batch. W1-batch: n/a (no multi-record call).");
    println!("  commitlog:  flush() does not sync the segment file; the bench adds");
    println!("              fdatasync of it after every flush(). W5: n/a (one writer: &mut).");
    println!("W4 reads: fissionlog Topic::read 1 MiB; raw mapping walk + CRC-32;");
    println!("  okaywal read_at per record (opens the file per call); commitlog read 1 MiB.");
}

fn main() {
    let bench = is_bench_run();
    let scale = env_f64("PEERS_SCALE").unwrap_or(if bench { 1.0 } else { 0.002 });
    let runs = env_f64("PEERS_RUNS").map_or(if bench { 3 } else { 1 }, |r| (r as usize).max(1));
    let n1 = scaled(W1_RECORDS, scale);
    let n2 = scaled(W2_RECORDS, scale);
    let b3 = scaled(W3_BATCHES, scale);

    let v1 = Values::new(n1, W1_LEN);
    let v2 = Values::new(n2, W2_LEN);
    let v3 = Values::new(b3 * W3_PER_BATCH, W3_LEN);
    let only = std::env::var("PEERS_ONLY").ok();
    let want = |names: &[&str]| {
        only.as_deref().is_none_or(|list| {
            list.split(',')
                .any(|w| names.iter().any(|n| w.trim().eq_ignore_ascii_case(n)))
        })
    };

    let mut rows = [
        Row::new(format!("W1 {n1} x {W1_LEN} B, 1 per call, sync"), false),
        Row::new(
            format!("W1-batch {n1} x {W1_LEN} B, {W1_BATCH} per call, sync"),
            false,
        ),
        Row::new(format!("W2 {n2} x 1 KiB, 1 per call, sync"), false),
        Row::new(format!("W3 {b3} durable batches of 64 x 1 KiB"), true),
        Row::new(format!("W4 read back W2 ({n2} x 1 KiB)"), false),
        Row::new(
            format!("W5 {b3} durable batches, {W5_THREADS} threads"),
            true,
        ),
    ];

    for run in 0..runs {
        let started = Instant::now();
        // Rotate which system goes first so none always runs right after
        // another's large write-back.
        let mut order = SYSTEMS;
        order.rotate_left(run % SYSTEMS.len());
        for &sys in order.iter().filter(|_| want(&["W1"])) {
            let dir = sys.dir("w1");
            let r = match sys {
                Sys::Fission => {
                    let (log, topic, r) = fl_stream(&dir, &v1, 1);
                    fl_close(log, topic, &dir);
                    r
                }
                Sys::Raw => raw_stream(&dir, &v1, 1).1,
                Sys::OkayWal => {
                    let (wal, _, r) = okw_stream(&dir, &v1);
                    okw_close(wal, &dir);
                    r
                }
                Sys::CommitLog => cl_stream(&dir, &v1, 1).1,
            };
            remove_dir(&dir);
            rows[0].add(sys, r);
        }
        let w1b = want(&["W1-batch"]);
        for &sys in order.iter().filter(|&&s| w1b && s != Sys::OkayWal) {
            let dir = sys.dir("w1b");
            let r = match sys {
                Sys::Fission => {
                    let (log, topic, r) = fl_stream(&dir, &v1, W1_BATCH);
                    fl_close(log, topic, &dir);
                    r
                }
                Sys::Raw => raw_stream(&dir, &v1, W1_BATCH).1,
                Sys::OkayWal => unreachable!("okaywal has no multi-record call"),
                Sys::CommitLog => cl_stream(&dir, &v1, W1_BATCH).1,
            };
            remove_dir(&dir);
            rows[1].add(sys, r);
        }
        for &sys in order.iter().filter(|_| want(&["W2", "W4"])) {
            let dir = sys.dir("w2");
            let (w, r) = match sys {
                Sys::Fission => {
                    let (log, topic, w) = fl_stream(&dir, &v2, 1);
                    let r = fl_read(&topic, n2);
                    fl_close(log, topic, &dir);
                    (w, r)
                }
                Sys::Raw => {
                    let (path, w) = raw_stream(&dir, &v2, 1);
                    (w, raw_read(&path, n2))
                }
                Sys::OkayWal => {
                    let (wal, pos, w) = okw_stream(&dir, &v2);
                    let r = okw_read(&wal, &pos, W2_LEN);
                    okw_close(wal, &dir);
                    (w, r)
                }
                Sys::CommitLog => {
                    let (log, w) = cl_stream(&dir, &v2, 1);
                    (w, cl_read(&log, n2))
                }
            };
            remove_dir(&dir);
            rows[2].add(sys, w);
            rows[4].add(sys, r);
        }
        if want(&["W3"]) {
            for (&sys, r) in SYSTEMS.iter().zip(w3_interleaved(&v3)) {
                rows[3].add(sys, r);
            }
        }
        let w5 = want(&["W5"]);
        for &sys in order.iter().filter(|&&s| w5 && s != Sys::CommitLog) {
            let dir = sys.dir("w5");
            let r = match sys {
                Sys::Fission => fl_concurrent(&dir, &v3),
                Sys::Raw => raw_concurrent(&dir, &v3),
                Sys::OkayWal => okw_concurrent(&dir, &v3),
                Sys::CommitLog => unreachable!("commitlog takes one writer"),
            };
            remove_dir(&dir);
            rows[5].add(sys, r);
        }
        eprintln!(
            "peers: run {}/{runs} done in {:.1} s",
            run + 1,
            started.elapsed().as_secs_f64()
        );
    }
    print_table(&rows, runs, scale);
}
