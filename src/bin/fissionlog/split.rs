//! `split`: splits an active partition into children.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use fissionlog::{Applied, PartitionInfo, SplitPlan, TailFrom, TailSplitOptions, Topic};
use serde_json::{json, Value};

use crate::common::{
    check_topic_name, hex, open_existing, parse_hash, write_json, CmdResult, Failure,
};

/// Arguments of `fissionlog split`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("plan").args(["at", "even", "hot_key"])))]
pub struct SplitArgs {
    /// Log directory.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Topic of the partition.
    #[arg(long, value_name = "NAME")]
    pub topic: String,
    /// Active partition to split.
    #[arg(long, value_name = "ID")]
    pub partition: u32,
    /// Split after this hash value (decimal or 0x hex): children
    /// [start, HASH] and [HASH+1, end].
    #[arg(long, value_name = "HASH", value_parser = parse_hash)]
    pub at: Option<u64>,
    /// Split at the middle of the partition's hash range.
    #[arg(long)]
    pub even: bool,
    /// Isolate this key's hash value in a one-value partition [h, h], with
    /// the rest of the range on each side. Default plan without --at,
    /// --even or --hot-key: the load-weighted median of recent appends
    /// (the middle when no load was recorded since the log was opened).
    #[arg(long, value_name = "KEY")]
    pub hot_key: Option<String>,
    /// Tail split: also move the partition's records from this offset on
    /// into the children (rounded down to the start of its batch), so the
    /// backlog is spread over them. `slowest-group` moves from the slowest
    /// committed position of the topic's consumer groups.
    #[arg(long, value_name = "OFFSET|slowest-group")]
    pub tail_from: Option<String>,
    /// Copy budget of a tail split while appends go on, in bytes per
    /// second (0: unlimited).
    #[arg(
        long,
        value_name = "BYTES",
        default_value_t = 0,
        requires = "tail_from"
    )]
    pub throttle: u64,
    /// Print exactly one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// The id and key range of some partitions, as JSON and as text.
pub fn describe_children(topic: &Topic, ids: &[u32]) -> (Vec<Value>, Vec<String>) {
    let infos: Vec<PartitionInfo> = topic.partitions();
    let mut json_out = Vec::new();
    let mut text = Vec::new();
    for id in ids {
        if let Some(p) = infos.iter().find(|p| p.id == *id) {
            json_out.push(json!({"id": p.id, "key_start": hex(p.start), "key_end": hex(p.end), "parents": p.parents}));
            text.push(format!("p{} [{}..={}]", p.id, hex(p.start), hex(p.end)));
        }
    }
    (json_out, text)
}

/// A command applied as another kind of change than it is: a bug, said as
/// one sentence rather than a panic.
pub(crate) fn unexpected(applied: &Applied) -> Failure {
    Failure::problem(format!(
        "the topology change was applied as {applied:?}, not as the command asked"
    ))
}

/// Runs `split`.
pub fn run(args: &SplitArgs) -> CmdResult {
    check_topic_name(&args.topic)?;
    let log = open_existing(&args.dir)?;
    let topic = log.topic(&args.topic)?;
    let plan = match (&args.at, args.even, &args.hot_key) {
        (Some(h), _, _) => SplitPlan::At(*h),
        (_, true, _) => SplitPlan::Even,
        (_, _, Some(k)) => SplitPlan::IsolateHash(topic.hash(k.as_bytes())),
        _ => SplitPlan::LoadMedian,
    };
    let (children, tail) = match &args.tail_from {
        // The plan is resolved into a command (the children's ranges) and
        // applied through the topic's one path for topology changes.
        None => match topic.apply(topic.split_command(args.partition, plan)?)? {
            Applied::Split { children } => (children, None),
            other => return Err(unexpected(&other)),
        },
        Some(from) => {
            let from = if from == "slowest-group" {
                TailFrom::SlowestGroup
            } else {
                TailFrom::Offset(from.parse().map_err(|_| {
                    Failure::usage(format!(
                        "--tail-from takes an offset or slowest-group, not {from:?}"
                    ))
                })?)
            };
            let options = TailSplitOptions {
                from,
                throttle_bytes_per_sec: args.throttle,
            };
            let cmd = topic.split_tail_command(args.partition, plan, options)?;
            match topic.apply(cmd)? {
                Applied::SplitTail(out) => (out.children.clone(), Some(out)),
                other => return Err(unexpected(&other)),
            }
        }
    };
    let (cj, ct) = describe_children(&topic, &children);
    drop(topic);
    log.close()?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let mut doc = json!({"topic": args.topic, "parent": args.partition, "children": cj});
        if let Some(t) = &tail {
            doc["moved"] = json!({
                "from": t.from,
                "to": t.seal_offset,
                "records": t.moved,
                "copied_bytes": t.copied_bytes,
            });
        }
        write_json(&mut out, &doc)?;
    } else {
        writeln!(
            out,
            "split partition {} of topic {:?} into {}",
            args.partition,
            args.topic,
            ct.join(", ")
        )
        .map_err(Failure::output)?;
        if let Some(t) = &tail {
            writeln!(
                out,
                "moved offsets {}..{} of the parent into the children ({:?} records each)",
                t.from, t.seal_offset, t.moved
            )
            .map_err(Failure::output)?;
        }
    }
    out.flush().map_err(Failure::output)?;
    Ok(ExitCode::SUCCESS)
}
