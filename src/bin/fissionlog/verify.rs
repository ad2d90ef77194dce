//! `verify`: a strictly read-only check of a log directory.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use fissionlog::{Error, Problem, RecoveryReport};
use serde_json::json;

use crate::common::{show_progress, spinner, write_json, CmdResult, Failure, EXIT_PROBLEM};

/// Arguments of `fissionlog verify`.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Log directory. Nothing in it is changed; a shared lock is taken, so
    /// verify refuses (exit 2) while a writer has the log open.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Print exactly one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Runs the library's read-only check, mapping a held lock to a clear refusal.
pub fn check(dir: &std::path::Path, json: bool) -> Result<(RecoveryReport, Vec<Problem>), Failure> {
    let pb = spinner(
        show_progress(json),
        "checking every segment, index and manifest record",
    );
    let result = fissionlog::verify(dir);
    pb.finish_and_clear();
    match result {
        Ok(x) => Ok(x),
        Err(Error::Locked { path }) => Err(Failure::usage(format!(
            "{} is open in a writer (locked); verify reads only a closed log, so stop the writer and retry",
            path.display()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Prints problems as text lines.
pub fn print_problems(out: &mut impl Write, problems: &[Problem]) -> std::io::Result<()> {
    for p in problems {
        writeln!(
            out,
            "{}: byte {}: {} (recover: {})",
            p.file.display(),
            p.position,
            p.what,
            p.repair
        )?;
    }
    Ok(())
}

/// Runs `verify`.
pub fn run(args: &VerifyArgs) -> CmdResult {
    let (report, problems) = check(&args.dir, args.json)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let doc = json!({
            "clean": problems.is_empty(),
            "problems": problems,
            "segments": report.segments_opened,
            "bytes_scanned": report.bytes_scanned,
            "records_scanned": report.records_scanned,
            "report": report,
        });
        write_json(&mut out, &doc)?;
    } else if problems.is_empty() {
        writeln!(
            out,
            "clean: {} segment(s), {} bytes, {} records checked",
            report.segments_opened, report.bytes_scanned, report.records_scanned
        )
        .map_err(Failure::output)?;
    } else {
        writeln!(out, "{} problem(s) found:", problems.len()).map_err(Failure::output)?;
        print_problems(&mut out, &problems).map_err(Failure::output)?;
    }
    out.flush().map_err(Failure::output)?;
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_PROBLEM)
    })
}
