//! `recover`: runs recovery in a chosen mode and reports what it did.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use fissionlog::FileAction;
use fissionlog::{Error, Log, LogOptions, RecoveryMode};
use serde_json::json;

use crate::common::{
    open_options, show_progress, spinner, write_json, CmdResult, Failure, EXIT_PROBLEM,
};
use crate::verify::{check, print_problems};

/// Recovery mode on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeArg {
    /// Cut torn tails only; refuse (exit 1) on corruption in synced data.
    Strict,
    /// Cut each damaged partition at its first damaged batch (later records are lost).
    Truncate,
    /// Keep the valid batches after the damage; the lost offsets become a hole.
    Salvage,
}

impl ModeArg {
    fn mode(self) -> RecoveryMode {
        match self {
            ModeArg::Strict => RecoveryMode::Strict,
            ModeArg::Truncate => RecoveryMode::Truncate,
            ModeArg::Salvage => RecoveryMode::Salvage,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ModeArg::Strict => "strict",
            ModeArg::Truncate => "truncate",
            ModeArg::Salvage => "salvage",
        }
    }
}

/// Arguments of `fissionlog recover`.
#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    /// Log directory.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// What to do with corruption inside synced data.
    #[arg(long, value_enum, default_value_t = ModeArg::Strict, value_name = "MODE")]
    pub mode: ModeArg,
    /// Change nothing: analyse read-only (as `verify` does) and report what
    /// recovery would do.
    #[arg(long)]
    pub dry_run: bool,
    /// Print exactly one JSON document.
    #[arg(long)]
    pub json: bool,
}

fn describe(action: &FileAction) -> String {
    match action {
        FileAction::TruncatedTornTail {
            position, reason, ..
        } => {
            format!("torn tail cut at byte {position} ({reason})")
        }
        FileAction::TruncatedCorruption {
            position,
            reason,
            first_lost_offset,
        } => format!(
            "truncated at byte {position} ({reason}); offsets from {first_lost_offset} on are lost"
        ),
        FileAction::Salvaged {
            position,
            lost_offsets,
        } => format!(
            "salvaged around damage at byte {position}; offsets {}..{} lost",
            lost_offsets.start, lost_offsets.end
        ),
        FileAction::DeletedSegment { reason } => format!("deleted ({reason})"),
        FileAction::RebuiltIndex => "index rebuilt".into(),
        FileAction::RemovedOrphan => "removed (left by an uncommitted topology change)".into(),
        FileAction::SetAsideOrphan { moved_to } => format!(
            "no longer in the cut manifest; kept as {}",
            moved_to.display()
        ),
        FileAction::ForeignFile => "unknown file, left untouched".into(),
        FileAction::CreatedSegment => "missing active segment recreated empty".into(),
        FileAction::MissingData { lost_offsets: l } => format!(
            "missing: offsets {}..{} lost (they read as a hole)",
            l.start, l.end
        ),
        FileAction::InvalidCheckpoint { reason } => format!("invalid checkpoint ({reason})"),
        FileAction::DescendantIndexLost {
            parent,
            moved_offsets: (s, e),
            reason,
        } => format!(
            "descendant index of tail-split partition {parent} unusable ({reason}); positions inside its moved range {s}..{e} resume at the children's first moved records (records may be delivered again)"
        ),
        other => format!("{other:?}"),
    }
}

fn dry_run(args: &RecoverArgs) -> CmdResult {
    let (_report, problems) = check(&args.dir, args.json)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let doc = json!({
            "dry_run": true,
            "mode": args.mode.name(),
            "clean": problems.is_empty(),
            "problems": problems,
        });
        write_json(&mut out, &doc)?;
    } else if problems.is_empty() {
        writeln!(
            out,
            "dry run: the log is consistent; recovery would change nothing"
        )
        .map_err(Failure::output)?;
    } else {
        writeln!(
            out,
            "dry run: nothing changed; {} problem(s) found (with what recover would do):",
            problems.len()
        )
        .map_err(Failure::output)?;
        print_problems(&mut out, &problems).map_err(Failure::output)?;
    }
    out.flush().map_err(Failure::output)?;
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_PROBLEM)
    })
}

/// Runs `recover`.
pub fn run(args: &RecoverArgs) -> CmdResult {
    if args.dry_run {
        return dry_run(args);
    }
    let options = LogOptions {
        full_scan: true,
        ..open_options(args.mode.mode())
    };
    let pb = spinner(show_progress(args.json), "recovering");
    let opened = Log::open(&args.dir, options);
    pb.finish_and_clear();
    let log = match opened {
        Ok(log) => log,
        Err(e @ (Error::Corruption { .. } | Error::ChecksumMismatch { .. })) => {
            return Err(Failure::problem(format!(
                "{e}; {} mode refused to change synced data: rerun with --mode truncate (cut there, later records lost) or --mode salvage (keep the valid records after the damage)",
                args.mode.name()
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let report = log.recovery_report().clone();
    log.close()?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let doc = json!({
            "dry_run": false,
            "mode": args.mode.name(),
            "changed": report.changed_anything(),
            "report": report,
        });
        write_json(&mut out, &doc)?;
    } else {
        let w = |out: &mut std::io::BufWriter<_>| -> std::io::Result<()> {
            writeln!(
                out,
                "recovered in {} mode: {} segment(s), {} bytes, {} records scanned",
                args.mode.name(),
                report.segments_opened,
                report.bytes_scanned,
                report.records_scanned
            )?;
            let m = &report.manifest;
            writeln!(
                out,
                "manifest: {} record(s) replayed{}{}",
                m.records_replayed,
                match &m.torn_tail {
                    Some((p, r)) => format!(", torn tail cut at byte {p} ({r})"),
                    None => String::new(),
                },
                match &m.corruption_truncated {
                    Some((p, r)) => format!(", damaged records cut at byte {p} ({r})"),
                    None => String::new(),
                }
            )?;
            for f in &report.files {
                writeln!(out, "{}: {}", f.file.display(), describe(&f.action))?;
            }
            for h in &report.holes {
                let (topic, p, o) = (&h.topic, h.partition, h.offsets);
                writeln!(
                    out,
                    "hole: topic {topic:?} partition {p} offsets {}..{}",
                    o.start, o.end
                )?;
            }
            if !report.changed_anything() {
                writeln!(out, "nothing needed repair")?;
            }
            Ok(())
        };
        w(&mut out).map_err(Failure::output)?;
    }
    out.flush().map_err(Failure::output)?;
    Ok(ExitCode::SUCCESS)
}
