//! fissionlog-broker beside NATS JetStream and Redis Streams, on loopback,
//! at equal durability: the same client workloads (see `workloads.rs`)
//! through each system, 1 KiB records under 16-byte keys, next to raw
//! `write` + `fdatasync` baselines measured in the same run on the same
//! disk. Replicated too: three fissionlog-broker processes in cluster
//! mode beside three clustered nats-servers with R3 streams, each member
//! with its own data directory on that disk.
//!
//! ```text
//! broker/benches/setup.sh        # nats-server and redis-server from Debian
//! cargo bench -p fissionlog-broker --bench brokers
//! ```
//!
//! Environment: `BENCH_RUNS` (3) runs, medians reported; `BENCH_MESSAGES`
//! (200000) records consumed by C1 and C4; `BENCH_SECS` (5) seconds per
//! produce workload; `BENCH_ONLY` runs only the systems whose label
//! contains it, or one of its `|`-separated parts (labels have commas,
//! never bars); `BENCH_DIR` is where data goes (the target directory's
//! scratch space). A system whose server binary is missing is skipped
//! with a message. Prints a table and writes `target/brokers.json`.

mod procs;
mod raw;
mod stats;
mod systems;
mod workloads;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fissionlog_broker::protocol::{Acks, SyncSpec};
use serde::Serialize;

use stats::{median, Figure};
use systems::{Kind, Shape, Target};
use workloads::Records;

/// What every fallible step of the benchmark returns.
pub type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Bytes of a record's value.
pub const RECORD_BYTES: usize = 1024;
/// Bytes of a record's key.
pub const KEY_BYTES: usize = 16;

const FSYNC: &str = "fsync before the ack";
const PAGE_CACHE: &str = "page cache before the ack";
/// The leader and one follower of three fsynced the record.
const QUORUM_FSYNC: &str = "fsync on 2 of 3 nodes";
/// The leader and one follower of three hold the record, unsynced.
const QUORUM_PAGE_CACHE: &str = "page cache on 2 of 3 nodes";

/// The workloads, in the order they run and print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    P1,
    P16,
    PB,
    /// PB through fissionlog's batching producer (many records a request).
    PBBatched,
    C1,
    C4,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::P1 => "P1",
            Workload::P16 => "P16",
            Workload::PB => "PB",
            Workload::PBBatched => "PB-batched",
            Workload::C1 => "C1",
            Workload::C4 => "C4",
        }
    }

    /// The raw baseline its figures are divided by.
    fn baseline(self) -> Baseline {
        match self {
            Workload::P1 => Baseline::Raw1,
            Workload::P16 | Workload::PB | Workload::PBBatched => Baseline::Raw16,
            Workload::C1 => Baseline::RawC1,
            Workload::C4 => Baseline::RawC4,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Baseline {
    Raw1,
    Raw16,
    RawC1,
    RawC4,
}

impl Baseline {
    fn label(self) -> &'static str {
        match self {
            Baseline::Raw1 => "raw-1",
            Baseline::Raw16 => "raw-16",
            Baseline::RawC1 => "raw-C1",
            Baseline::RawC4 => "raw-C4",
        }
    }

    fn system(self) -> &'static str {
        match self {
            Baseline::Raw1 => "raw: 1 writer, write + fdatasync per record",
            Baseline::Raw16 => "raw: 16 writers, group commit",
            Baseline::RawC1 => "raw: 1 reader, pread 500 + fdatasync'd offset",
            Baseline::RawC4 => "raw: 4 readers, pread 500 + fdatasync'd offset",
        }
    }
}

struct Config {
    runs: usize,
    messages: u64,
    secs: Duration,
    only: Option<String>,
}

fn env_num(name: &str, default: u64) -> R<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|e| format!("{name}={v:?} is not a number: {e}").into()),
        Err(_) => Ok(default),
    }
}

impl Config {
    fn from_env() -> R<Config> {
        Ok(Config {
            runs: env_num("BENCH_RUNS", 3)?.max(1) as usize,
            messages: env_num("BENCH_MESSAGES", 200_000)?.max(1),
            secs: Duration::from_secs(env_num("BENCH_SECS", 5)?.max(1)),
            only: std::env::var("BENCH_ONLY").ok().filter(|s| !s.is_empty()),
        })
    }
}

/// One system as measured.
struct Spec {
    class: &'static str,
    label: &'static str,
    kind: Kind,
    /// The server binary (`None`: this package's broker).
    binary: Option<&'static str>,
}

impl Spec {
    /// Starts its server (servers, for a cluster) and says how to reach
    /// them; `None` (and a note) when the binary is missing. Spawned on
    /// the caller's thread, which must be the main one (see `procs::command`).
    fn start(&self, out: &mut Results) -> R<Option<(Vec<procs::Server>, Target)>> {
        let servers = match (self.kind, self.binary) {
            (Kind::FissionlogCluster, _) => procs::start_fissionlog_cluster()?,
            (_, None) => vec![procs::start_fissionlog()?],
            (kind, Some(name)) => {
                let Some(bin) = procs::find_on_path(name) else {
                    out.note(format!(
                        "skipped {}: {name} not found (broker/benches/setup.sh installs it)",
                        self.label
                    ));
                    return Ok(None);
                };
                match kind {
                    Kind::Redis => vec![procs::start_redis(&bin)?],
                    Kind::Nats { replicas: 1 } => vec![procs::start_nats(&bin)?],
                    _ => procs::start_nats_cluster(&bin)?,
                }
            }
        };
        let target = Target {
            kind: self.kind,
            ports: servers.iter().map(|s| s.port).collect(),
        };
        Ok(Some((servers, target)))
    }
}

fn specs() -> Vec<Spec> {
    vec![
        Spec {
            class: FSYNC,
            label: "fissionlog-broker, acks quorum (group fsync)",
            kind: Kind::Fissionlog {
                sync: SyncSpec::Never,
                acks: Acks::Quorum,
            },
            binary: None,
        },
        Spec {
            class: FSYNC,
            label: "fissionlog-broker, sync always",
            kind: Kind::Fissionlog {
                sync: SyncSpec::Always,
                acks: Acks::Leader,
            },
            binary: None,
        },
        Spec {
            class: FSYNC,
            label: "Redis Streams, appendfsync always",
            kind: Kind::Redis,
            binary: Some("redis-server"),
        },
        Spec {
            class: PAGE_CACHE,
            label: "NATS JetStream, file storage",
            kind: Kind::Nats { replicas: 1 },
            binary: Some("nats-server"),
        },
        Spec {
            class: PAGE_CACHE,
            label: "fissionlog-broker, sync never, acks leader",
            kind: Kind::Fissionlog {
                sync: SyncSpec::Never,
                acks: Acks::Leader,
            },
            binary: None,
        },
        Spec {
            class: QUORUM_FSYNC,
            label: "fissionlog-broker cluster, 3 nodes, acks quorum",
            kind: Kind::FissionlogCluster,
            binary: None,
        },
        Spec {
            class: QUORUM_PAGE_CACHE,
            label: "NATS JetStream cluster, 3 nodes, R3 file",
            kind: Kind::Nats { replicas: 3 },
            binary: Some("nats-server"),
        },
    ]
}

fn workloads_of(kind: Kind) -> Vec<Workload> {
    let mut w = vec![Workload::P1, Workload::P16, Workload::PB];
    if matches!(kind, Kind::Fissionlog { .. } | Kind::FissionlogCluster) {
        w.push(Workload::PBBatched);
    }
    w.extend([Workload::C1, Workload::C4]);
    w
}

/// Why `kind` has no figure for `w` (the row prints "—").
fn unmeasured(kind: Kind, w: Workload) -> Option<&'static str> {
    let consume = matches!(w, Workload::C1 | Workload::C4);
    (consume && matches!(kind, Kind::FissionlogCluster))
        .then_some("cluster mode serves no consumer groups")
}

/// Every run's figure of one (system, workload).
struct Series {
    class: &'static str,
    system: &'static str,
    workload: Option<Workload>,
    baseline: Option<Baseline>,
    /// Empty: not measured (see the notes).
    runs: Vec<Figure>,
}

#[derive(Default)]
struct Results {
    series: Vec<Series>,
    notes: Vec<String>,
}

impl Results {
    fn push(
        &mut self,
        class: &'static str,
        system: &'static str,
        workload: Option<Workload>,
        baseline: Option<Baseline>,
        f: Figure,
    ) {
        let found = self
            .series
            .iter_mut()
            .find(|s| s.system == system && s.workload == workload && s.baseline == baseline);
        match found {
            Some(s) => s.runs.push(f),
            None => self.series.push(Series {
                class,
                system,
                workload,
                baseline,
                runs: vec![f],
            }),
        }
    }

    /// A row for a workload the system does not serve.
    fn unmeasured(&mut self, class: &'static str, system: &'static str, workload: Workload) {
        let known = self
            .series
            .iter()
            .any(|s| s.system == system && s.workload == Some(workload));
        if !known {
            self.series.push(Series {
                class,
                system,
                workload: Some(workload),
                baseline: None,
                runs: Vec::new(),
            });
        }
    }

    fn note(&mut self, n: String) {
        eprintln!("{n}");
        if !self.notes.contains(&n) {
            self.notes.push(n);
        }
    }

    fn baseline(&self, b: Baseline) -> Option<Figure> {
        self.series
            .iter()
            .find(|s| s.workload.is_none() && s.baseline == Some(b))
            .and_then(|s| median(&s.runs))
    }
}

fn run_raw(cfg: &Config, out: &mut Results) -> R<()> {
    let dir = procs::scratch_dir("raw")?;
    let figures = [
        (Baseline::Raw1, raw::single_writer(dir.path(), cfg.secs)?),
        (
            Baseline::Raw16,
            raw::group_commit(dir.path(), 16, cfg.secs)?,
        ),
        (Baseline::RawC1, raw::consume(dir.path(), cfg.messages, 1)?),
        (Baseline::RawC4, raw::consume(dir.path(), cfg.messages, 4)?),
    ];
    for (b, f) in figures {
        eprintln!("  {:<8} {:>10.0} msg/s", b.label(), f.msgs_per_sec);
        out.push(FSYNC, b.system(), None, Some(b), f);
    }
    Ok(())
}

async fn run_system(
    spec: &Spec,
    target: &Target,
    cfg: &Config,
    recs: &Arc<Records>,
    out: &mut Results,
) -> R<()> {
    // Elections included: nothing is timed before the leaders are known.
    tokio::time::timeout(Duration::from_secs(120), target.setup())
        .await
        .map_err(|_| "setting up took longer than 120 s")??;
    let preload_shape = match spec.kind {
        Kind::Fissionlog { .. } => Shape::Batching,
        _ => Shape::Window,
    };
    for w in workloads_of(spec.kind) {
        if let Some(why) = unmeasured(spec.kind, w) {
            out.note(format!("{} {}: not measured, {why}", spec.label, w.name()));
            out.unmeasured(spec.class, spec.label, w);
            continue;
        }
        let limit = cfg.secs + Duration::from_secs(360);
        let fut = async {
            match w {
                Workload::P1 => workloads::serial(target, recs, 1, cfg.secs).await,
                Workload::P16 => workloads::serial(target, recs, 16, cfg.secs).await,
                Workload::PB => workloads::pipelined(target, recs, Shape::Window, cfg.secs).await,
                Workload::PBBatched => {
                    workloads::pipelined(target, recs, Shape::Batching, cfg.secs).await
                }
                Workload::C1 => {
                    workloads::preload(target, recs, preload_shape, cfg.messages).await?;
                    workloads::consume(target, "g1", 1, cfg.messages).await
                }
                Workload::C4 => workloads::consume(target, "g4", 4, cfg.messages).await,
            }
        };
        let f = tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| format!("{} took longer than {limit:?}", w.name()))??;
        eprintln!(
            "  {:<10} {:>10.0} msg/s  p50 {} µs  p99 {} µs",
            w.name(),
            f.msgs_per_sec,
            f.p50_us,
            f.p99_us
        );
        out.push(spec.class, spec.label, Some(w), None, f);
    }
    Ok(())
}

fn ratio(f: &Figure, base: Option<Figure>) -> Option<f64> {
    base.filter(|b| b.msgs_per_sec > 0.0)
        .map(|b| f.msgs_per_sec / b.msgs_per_sec)
}

#[derive(Serialize)]
struct JsonRow<'a> {
    class: &'a str,
    system: &'a str,
    workload: Option<&'static str>,
    baseline: Option<&'static str>,
    ratio_to_baseline: Option<f64>,
    /// `None`: not measured.
    median: Option<Figure>,
    runs: &'a [Figure],
}

fn report(cfg: &Config, out: &Results) -> R<()> {
    println!();
    println!(
        "brokers: 1 KiB records, 16-byte keys, 127.0.0.1; medians of {} run(s); \
         produce workloads {} s each; C1/C4 consume {} stored records",
        cfg.runs,
        cfg.secs.as_secs(),
        cfg.messages
    );
    println!(
        "ratio: msg/s divided by the raw baseline named (P1: raw-1; P16, PB: raw-16; C1, C4: raw-C1, raw-C4); \
         C latencies are per batch of up to {} records, poll to acknowledgement; — not measured",
        systems::POLL_RECORDS
    );
    println!();
    println!(
        "{:<26} {:<48} {:<10} {:>10} {:>15} {:>9} {:>9}",
        "class", "system", "workload", "msg/s", "ratio", "p50 µs", "p99 µs"
    );
    let mut rows = Vec::new();
    let mut class = "";
    for s in &out.series {
        let (workload, base) = match s.workload {
            Some(w) => (w.name(), Some(w.baseline())),
            None => (s.baseline.map_or("", Baseline::label), None),
        };
        let Some(m) = median(&s.runs) else {
            if s.class != class {
                println!();
                class = s.class;
            }
            println!(
                "{:<26} {:<48} {:<10} {:>10} {:>15} {:>9} {:>9}",
                s.class, s.system, workload, "—", "", "—", "—"
            );
            rows.push(JsonRow {
                class: s.class,
                system: s.system,
                workload: s.workload.map(Workload::name),
                baseline: base.map(Baseline::label),
                ratio_to_baseline: None,
                median: None,
                runs: &s.runs,
            });
            continue;
        };
        let r = base.and_then(|b| ratio(&m, out.baseline(b)));
        let ratio_text = match (r, base) {
            (Some(r), Some(b)) => format!("×{r:.2} {}", b.label()),
            _ => String::new(),
        };
        if s.class != class {
            println!();
            class = s.class;
        }
        println!(
            "{:<26} {:<48} {:<10} {:>10.0} {:>15} {:>9} {:>9}",
            s.class, s.system, workload, m.msgs_per_sec, ratio_text, m.p50_us, m.p99_us
        );
        rows.push(JsonRow {
            class: s.class,
            system: s.system,
            workload: s.workload.map(Workload::name),
            baseline: base.map(Baseline::label),
            ratio_to_baseline: r,
            median: Some(m),
            runs: &s.runs,
        });
    }
    for n in &out.notes {
        println!("note: {n}");
    }
    let json = serde_json::json!({
        "record_bytes": RECORD_BYTES,
        "key_bytes": KEY_BYTES,
        "runs": cfg.runs,
        "produce_secs": cfg.secs.as_secs(),
        "consume_messages": cfg.messages,
        "window": workloads::WINDOW,
        "poll_records": systems::POLL_RECORDS,
        "results": rows,
        "notes": out.notes,
    });
    let path = json_path();
    std::fs::write(&path, serde_json::to_vec_pretty(&json)?)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("\nwrote {}", path.display());
    Ok(())
}

/// `target/brokers.json`: the scratch directory's parent is the target directory.
fn json_path() -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(&tmp).join("brokers.json")
}

fn main() {
    // `cargo test --benches` runs this binary too, without `--bench`:
    // starting servers (three per cluster) and minutes of load is for
    // `cargo bench` only.
    if !std::env::args().any(|a| a == "--bench") {
        println!("brokers: runs under `cargo bench` only (it starts servers); nothing to do");
        return;
    }
    if let Err(e) = bench() {
        eprintln!("brokers: {e}");
        std::process::exit(1);
    }
}

fn bench() -> R<()> {
    let cfg = Config::from_env()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let recs = Arc::new(Records::new());
    let mut out = Results::default();
    let specs: Vec<Spec> = specs()
        .into_iter()
        .filter(|s| {
            cfg.only
                .as_deref()
                .is_none_or(|o| o.split('|').any(|part| s.label.contains(part)))
        })
        .collect();
    for run in 1..=cfg.runs {
        eprintln!("run {run}/{}: raw baselines", cfg.runs);
        run_raw(&cfg, &mut out)?;
        for spec in &specs {
            eprintln!("run {run}/{}: {}", cfg.runs, spec.label);
            // Spawned here, on the main thread; killed when `servers`
            // drops at the end of this iteration, whatever happened.
            let (servers, target) = match spec.start(&mut out) {
                Ok(Some(started)) => started,
                Ok(None) => continue,
                Err(e) => {
                    out.note(format!("{} failed to start in run {run}: {e}", spec.label));
                    continue;
                }
            };
            if let Err(e) = rt.block_on(run_system(spec, &target, &cfg, &recs, &mut out)) {
                out.note(format!("{} failed in run {run}: {e}", spec.label));
            }
            drop(servers);
        }
    }
    report(&cfg, &out)
}
