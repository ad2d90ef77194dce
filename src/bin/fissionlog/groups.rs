//! `groups`: the consumer groups of a log, with their committed positions
//! and lag; optionally deletes one.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use fissionlog::GroupOptions;
use serde_json::{json, Value};

use crate::common::{check_topic_name, open_existing, write_json, CmdResult, Failure};

/// Arguments of `fissionlog groups`.
#[derive(clap::Args, Debug)]
pub struct GroupsArgs {
    /// Log directory. Members live in the process that embeds the log, so
    /// this shows what the log keeps: committed positions, the partitions
    /// ready to be read, and lag.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Only this topic.
    #[arg(long, value_name = "NAME")]
    pub topic: Option<String>,
    /// Delete this group (with --topic) and its committed positions.
    #[arg(long, value_name = "GROUP", requires = "topic")]
    pub delete: Option<String>,
    /// Print exactly one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Runs `groups`.
pub fn run(args: &GroupsArgs) -> CmdResult {
    if let Some(t) = &args.topic {
        check_topic_name(t)?;
    }
    let log = open_existing(&args.dir)?;
    let topics = match &args.topic {
        Some(t) => vec![log.topic(t)?],
        None => log
            .topics()
            .iter()
            .map(|n| log.topic(n))
            .collect::<Result<Vec<_>, _>>()?,
    };
    if let (Some(g), Some(t)) = (&args.delete, topics.first()) {
        t.delete_group(g)?;
    }
    let mut groups: Vec<Value> = Vec::new();
    for t in &topics {
        for name in t.groups() {
            let d = t.group(&name, GroupOptions::default())?.describe();
            groups.push(json!({
                "topic": t.name(),
                "group": d.name,
                "lag_records": d.lag_records,
                "partitions": d.assignments.iter().map(|a| json!({
                    "partition": a.partition,
                    "committed": a.committed,
                    "lag_records": a.lag_records,
                })).collect::<Vec<_>>(),
            }));
        }
    }
    drop(topics);
    let lost: Vec<Value> = log
        .recovery_report()
        .group_positions_lost
        .iter()
        .map(|l| serde_json::to_value(l).expect("serializable"))
        .collect();
    log.close()?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        write_json(
            &mut out,
            &json!({"groups": groups, "deleted": args.delete, "positions_lost": lost}),
        )?;
    } else {
        print_text(&mut out, args, &groups, &lost)?;
    }
    out.flush().map_err(Failure::output)?;
    Ok(ExitCode::SUCCESS)
}

/// The human-readable listing: one line per group, one per partition, and
/// the group positions recovery moved back.
fn print_text(
    out: &mut impl Write,
    args: &GroupsArgs,
    groups: &[Value],
    lost: &[Value],
) -> Result<(), Failure> {
    if let Some(g) = &args.delete {
        writeln!(out, "deleted group {g:?}").map_err(Failure::output)?;
    }
    if groups.is_empty() {
        writeln!(out, "no consumer groups").map_err(Failure::output)?;
    }
    for g in groups {
        writeln!(
            out,
            "topic {} group {}: lag {} records",
            g["topic"], g["group"], g["lag_records"]
        )
        .map_err(Failure::output)?;
        for p in g["partitions"].as_array().into_iter().flatten() {
            writeln!(
                out,
                "  partition {:>5}  committed {:>12}  lag {:>10}",
                p["partition"], p["committed"], p["lag_records"]
            )
            .map_err(Failure::output)?;
        }
    }
    for l in lost {
        writeln!(
            out,
            "recovery moved group {} of topic {} in partition {} back from {} to {} (records it had consumed were lost with the unsynced tail)",
            l["group"], l["topic"], l["partition"], l["committed"], l["end"]
        )
        .map_err(Failure::output)?;
    }
    Ok(())
}
