//! The `fissionlog` command-line tool: produce, dump, inspect, verify,
//! recover, split, merge, groups and simulate on a log directory.
//!
//! Exit codes: 0 success or clean, 1 problems found or refused, 2 usage
//! error or unusable directory. Errors are one sentence on stderr.

mod common;
mod dump;
mod groups;
mod inspect;
mod merge;
mod produce;
mod recover;
mod simulate;
mod split;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Inspect, check, repair and drive a fissionlog log directory.
#[derive(Parser, Debug)]
#[command(
    name = "fissionlog",
    version,
    about,
    after_help = "Exit codes: 0 success or clean, 1 problems found or refused, 2 usage error or unusable directory (missing, not a log, locked)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Append stdin lines (KEY<TAB>VALUE, or VALUE alone for no key) to a topic.
    Produce(produce::ProduceArgs),
    /// Print the records of a topic (lineage order) or of one partition.
    Dump(dump::DumpArgs),
    /// Show topics, partitions, the partition tree, manifest state and sync backend.
    Inspect(inspect::InspectArgs),
    /// Check every header, CRC, index and manifest record without changing anything.
    Verify(verify::VerifyArgs),
    /// Run recovery in a chosen mode and report what it did (or would do).
    Recover(recover::RecoverArgs),
    /// Split an active partition into children.
    Split(split::SplitArgs),
    /// Merge two active partitions with adjacent key ranges into one.
    Merge(merge::MergeArgs),
    /// Simulate a workload and show how partitions split and merge.
    Simulate(simulate::SimulateArgs),
    /// Show consumer groups: committed positions and lag (or delete one).
    Groups(groups::GroupsArgs),
}

/// Prints panics as one line (a bug in fissionlog), never a backtrace.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown cause".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("fissionlog: internal error (a bug, please report it): {what}{at}");
    }));
}

fn main() -> ExitCode {
    install_panic_hook();
    let cli = Cli::parse();
    let ran = std::panic::catch_unwind(|| match &cli.command {
        Command::Produce(a) => common::finish("produce", produce::run(a)),
        Command::Dump(a) => common::finish("dump", dump::run(a)),
        Command::Inspect(a) => common::finish("inspect", inspect::run(a)),
        Command::Verify(a) => common::finish("verify", verify::run(a)),
        Command::Recover(a) => common::finish("recover", recover::run(a)),
        Command::Split(a) => common::finish("split", split::run(a)),
        Command::Merge(a) => common::finish("merge", merge::run(a)),
        Command::Simulate(a) => simulate::run(a),
        Command::Groups(a) => common::finish("groups", groups::run(a)),
    });
    ran.unwrap_or(ExitCode::from(common::EXIT_PROBLEM))
}
