//! `merge`: merges two active partitions with adjacent ranges.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use fissionlog::{Applied, TopologyCommand};
use serde_json::json;

use crate::common::{check_topic_name, open_existing, write_json, CmdResult, Failure};
use crate::split::describe_children;

/// Arguments of `fissionlog merge`.
#[derive(clap::Args, Debug)]
pub struct MergeArgs {
    /// Log directory.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Topic of the partitions.
    #[arg(long, value_name = "NAME")]
    pub topic: String,
    /// The two active partitions to merge, comma-separated (their key
    /// ranges must be adjacent).
    #[arg(long, value_name = "A,B", value_delimiter = ',', required = true)]
    pub partitions: Vec<u32>,
    /// Print exactly one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Runs `merge`.
pub fn run(args: &MergeArgs) -> CmdResult {
    check_topic_name(&args.topic)?;
    let [a, b] = args.partitions[..] else {
        return Err(Failure::usage("--partitions takes exactly two ids, as A,B"));
    };
    let log = open_existing(&args.dir)?;
    let topic = log.topic(&args.topic)?;
    let child = match topic.apply(TopologyCommand::Merge { a, b })? {
        Applied::Merge { child } => child,
        other => return Err(crate::split::unexpected(&other)),
    };
    let (cj, ct) = describe_children(&topic, &[child]);
    drop(topic);
    log.close()?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        write_json(
            &mut out,
            &json!({"topic": args.topic, "parents": [a, b], "child": cj.first()}),
        )?;
    } else {
        writeln!(
            out,
            "merged partitions {a} and {b} of topic {:?} into {}",
            args.topic,
            ct.join(", ")
        )
        .map_err(Failure::output)?;
    }
    out.flush().map_err(Failure::output)?;
    Ok(ExitCode::SUCCESS)
}
