//! `inspect`: topics, partitions, the partition tree, manifest state and
//! the sync backend of a log.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fissionlog::{PartitionInfo, Topic};
use serde_json::{json, Value};

use crate::common::{hex, open_existing, write_json, CmdResult, Failure};

/// Arguments of `fissionlog inspect`.
#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// Log directory. Inspect opens the log like any writer would: it takes
    /// the exclusive lock and runs recovery (cuts torn tails; refuses
    /// corruption in strict mode). Use `verify` for a strictly read-only check.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Print exactly one JSON document.
    #[arg(long)]
    pub json: bool,
}

fn partition_json(p: &PartitionInfo) -> Value {
    let rates: Vec<Value> = p
        .rates
        .iter()
        .map(|r| {
            json!({
                "window_secs": r.window.as_secs_f64(),
                "bytes_per_sec": r.bytes_per_sec,
                "records_per_sec": r.records_per_sec,
            })
        })
        .collect();
    json!({
        "id": p.id,
        "state": if p.sealed_at.is_some() { "sealed" } else { "active" },
        "sealed_at": p.sealed_at,
        "key_start": hex(p.start),
        "key_end": hex(p.end),
        "parents": p.parents,
        "removed_parents": p
            .removed_parents
            .iter()
            .map(|r| json!({"id": r.partition, "sealed_at": r.end_offset}))
            .collect::<Vec<_>>(),
        "children": p.children,
        "start_offset": p.start_offset,
        "end_offset": p.end_offset,
        "bytes": p.bytes,
        "segments": p.segments,
        "hot_key": p.hot_key,
        "rates": rates,
        "moved": p.moved.as_ref().map(|m| json!({
            "from": m.from,
            "to": m.to,
            "children": m
                .children
                .iter()
                .map(|c| json!({"id": c.partition, "records": c.records}))
                .collect::<Vec<_>>(),
            "reclaimed": m.reclaimed,
        })),
    })
}

fn topic_json(t: &Topic) -> Value {
    let parts = t.partitions();
    let partitions: Vec<Value> = parts.iter().map(partition_json).collect();
    let cfg = t.config();
    json!({
        "name": t.name(),
        "id": t.id(),
        "sync": format!("{:?}", cfg.sync),
        "segment_bytes": cfg.segment_bytes,
        "active_partitions": t.active_partitions(),
        "partitions": partitions,
    })
}

fn file_len(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// One line describing a partition, for the tree.
fn partition_line(p: &PartitionInfo) -> String {
    let state = match p.sealed_at {
        Some(at) => format!("sealed at {at}"),
        None => "active".to_string(),
    };
    let rate = p
        .rates
        .first()
        .map(|r| {
            format!(
                ", {:.0} B/s {:.0} rec/s",
                r.bytes_per_sec, r.records_per_sec
            )
        })
        .unwrap_or_default();
    let hot = if p.hot_key { ", hot key" } else { "" };
    let moved = p.moved.as_ref().map_or(String::new(), |m| {
        let to: Vec<String> = m
            .children
            .iter()
            .map(|c| format!("{} to p{}", c.records, c.partition))
            .collect();
        format!(
            ", moved {}..{} ({}){}",
            m.from,
            m.to,
            to.join(", "),
            if m.reclaimed { ", reclaimed" } else { "" }
        )
    });
    format!(
        "p{} [{}..={}] {state}, offsets {}..{}, {} bytes in {} segment(s){rate}{hot}{moved}",
        p.id,
        hex(p.start),
        hex(p.end),
        p.start_offset,
        p.end_offset,
        p.bytes,
        p.segments
    )
}

fn print_tree(
    out: &mut impl Write,
    by_id: &BTreeMap<u32, &PartitionInfo>,
    id: u32,
    depth: usize,
    seen: &mut BTreeSet<u32>,
) -> std::io::Result<()> {
    let indent = "  ".repeat(depth + 2);
    let Some(p) = by_id.get(&id) else {
        return Ok(());
    };
    if !seen.insert(id) {
        return writeln!(out, "{indent}p{id} (merge child, listed above)");
    }
    // Parents retention emptied and removed are gone from the topology.
    let removed: Vec<String> = p
        .removed_parents
        .iter()
        .map(|r| format!("p{} sealed at {}", r.partition, r.end_offset))
        .collect();
    let after = if removed.is_empty() {
        String::new()
    } else {
        format!(" (removed parent {})", removed.join(", "))
    };
    writeln!(out, "{indent}{}{after}", partition_line(p))?;
    for &c in &p.children {
        print_tree(out, by_id, c, depth + 1, seen)?;
    }
    Ok(())
}

fn print_topic_text(out: &mut impl Write, t: &Topic) -> std::io::Result<()> {
    let parts = t.partitions();
    let cfg = t.config();
    writeln!(
        out,
        "  topic {:?} (id {}): {} partition(s), {} active, sync {:?}",
        t.name(),
        t.id(),
        parts.len(),
        t.active_partitions().len(),
        cfg.sync
    )?;
    let by_id: BTreeMap<u32, &PartitionInfo> = parts.iter().map(|p| (p.id, p)).collect();
    let mut seen = BTreeSet::new();
    for p in &parts {
        if p.parents.iter().all(|q| !by_id.contains_key(q)) {
            print_tree(out, &by_id, p.id, 0, &mut seen)?;
        }
    }
    Ok(())
}

/// Runs `inspect`.
pub fn run(args: &InspectArgs) -> CmdResult {
    let log = open_existing(&args.dir)?;
    let report = log.recovery_report().clone();
    let backend = log.sync_backend().to_string();
    let mut topics = Vec::new();
    for name in log.topics() {
        topics.push(log.topic(&name)?);
    }
    let journal = file_len(&args.dir.join(fissionlog::layout::JOURNAL_FILE));
    let snapshot = file_len(&args.dir.join(fissionlog::layout::SNAPSHOT_FILE));
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let doc = json!({
            "dir": args.dir,
            "sync_backend": backend,
            "clean_shutdown": report.clean_shutdown,
            "manifest": {
                "journal_bytes": journal,
                "snapshot_bytes": snapshot,
                "snapshot_loaded": report.manifest.snapshot_loaded,
                "records_replayed": report.manifest.records_replayed,
                "torn_tail": report.manifest.torn_tail,
            },
            "recovery": report,
            "topics": topics.iter().map(topic_json).collect::<Vec<_>>(),
        });
        write_json(&mut out, &doc)?;
    } else {
        let w = |out: &mut std::io::BufWriter<_>| -> std::io::Result<()> {
            writeln!(out, "log {}", args.dir.display())?;
            writeln!(out, "  sync backend: {backend}")?;
            writeln!(
                out,
                "  last shutdown: {}",
                if report.clean_shutdown {
                    "clean"
                } else {
                    "unclean (recovered at this open)"
                }
            )?;
            writeln!(
                out,
                "  manifest: journal {} bytes, snapshot {}, {} journal record(s) replayed{}",
                journal.unwrap_or(0),
                match snapshot {
                    Some(n) if report.manifest.snapshot_loaded => format!("{n} bytes (loaded)"),
                    Some(n) => format!("{n} bytes"),
                    None => "none".to_string(),
                },
                report.manifest.records_replayed,
                match &report.manifest.torn_tail {
                    Some((pos, why)) => format!(", torn tail cut at byte {pos} ({why})"),
                    None => String::new(),
                }
            )?;
            if !report.files.is_empty() {
                writeln!(
                    out,
                    "  recovery at this open changed {} file(s)",
                    report.files.len()
                )?;
            }
            if topics.is_empty() {
                writeln!(out, "  no topics")?;
            }
            for t in &topics {
                print_topic_text(out, t)?;
            }
            Ok(())
        };
        w(&mut out).map_err(Failure::output)?;
    }
    out.flush().map_err(Failure::output)?;
    drop(topics);
    log.close()?;
    Ok(ExitCode::SUCCESS)
}
