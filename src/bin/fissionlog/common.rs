//! Shared plumbing of the subcommands: exit codes, error mapping, opening
//! the log, output helpers and the progress spinner.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use base64::Engine as _;
use fissionlog::{Error, Log, LogOptions, RecoveryMode};

/// Exit code: success, or the log is clean.
pub const EXIT_OK: u8 = 0;
/// Exit code: problems found, or the operation was refused.
pub const EXIT_PROBLEM: u8 = 1;
/// Exit code: usage error or unusable directory (missing, not a log, locked).
pub const EXIT_USAGE: u8 = 2;

/// A failed command: the exit code and one sentence for stderr.
#[derive(Debug)]
pub struct Failure {
    /// Process exit code.
    pub code: u8,
    /// What went wrong, one line.
    pub message: String,
}

impl Failure {
    /// A usage error (exit 2).
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }

    /// A refusal or a problem (exit 1).
    pub fn problem(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_PROBLEM,
            message: message.into(),
        }
    }

    /// Output could not be written (a closed pipe ends the command quietly).
    pub fn output(e: std::io::Error) -> Failure {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Failure {
                code: EXIT_OK,
                message: String::new(),
            }
        } else {
            Failure::problem(format!("cannot write output: {e}"))
        }
    }
}

/// Names an open or map failure for what it is (the environment, not
/// damage) with advice that loses nothing.
fn open_failed_message(path: &Path, source: &std::io::Error) -> String {
    let p = path.display();
    let (cause, advice) = match source.raw_os_error() {
        Some(libc::EMFILE) => (
            "too many open files",
            "raise the open-file limit (ulimit -n) and retry",
        ),
        Some(libc::ENFILE) => (
            "the system's open-file table is full",
            "close other programs or raise fs.file-max and retry",
        ),
        Some(libc::ENOMEM) => (
            "not enough memory or memory maps",
            "free memory or raise vm.max_map_count (sysctl) and retry",
        ),
        Some(libc::EACCES | libc::EPERM) => (
            "permission denied",
            "give this user read and write access to the log directory and retry",
        ),
        _ => ("I/O error", "fix the cause and retry"),
    };
    format!("{cause} while opening {p} ({source}); no segment was changed; {advice}")
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        if let Error::OpenFailed { path, source } = &e {
            // The directory is unusable in this environment (exit 2), and
            // nothing is damaged: never advise a repair mode here.
            return Failure::usage(open_failed_message(path, source));
        }
        let code = match &e {
            Error::NotFound { .. }
            | Error::NotALog { .. }
            | Error::Locked { .. }
            | Error::Io { .. }
            | Error::UnsupportedVersion { .. }
            | Error::NotARegularFile { .. }
            | Error::InvalidTopicName { .. }
            | Error::UnknownTopic(_)
            | Error::UnknownGroup(_)
            | Error::UnknownPartition { .. }
            | Error::OffsetOutOfRange { .. }
            | Error::InvalidConfig(_)
            | Error::InvalidDuration { .. }
            | Error::InvalidCut(_) => EXIT_USAGE,
            _ => EXIT_PROBLEM,
        };
        let hint = match &e {
            Error::Corruption { .. } | Error::ChecksumMismatch { .. } => {
                "; strict recovery refuses to change synced data: run `fissionlog verify` for details, then `fissionlog recover --mode truncate` (cut there) or `--mode salvage` (keep the records after the damage)"
            }
            Error::Locked { .. } => "; close the process that holds it and retry",
            Error::UnsupportedVersion { .. } => {
                "; it was written by a newer fissionlog: open it with that version (nothing was changed)"
            }
            Error::NotARegularFile { .. } => {
                "; put the file back and retry (no recovery mode reads or removes it)"
            }
            Error::NotALog { .. } => "; pass the directory of an existing log",
            Error::NotFound { .. } => "; pass an existing log directory (produce --create makes one)",
            _ => "",
        };
        Failure {
            code,
            message: format!("{e}{hint}"),
        }
    }
}

/// The result of a subcommand body.
pub type CmdResult = Result<ExitCode, Failure>;

/// Prints a failure as one line on stderr and turns it into the exit code.
pub fn finish(command: &str, result: CmdResult) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(f) => {
            if !f.message.is_empty() {
                let one_line = f.message.replace(['\n', '\r'], " ");
                eprintln!("fissionlog {command}: {one_line}");
            }
            ExitCode::from(f.code)
        }
    }
}

/// Options every command opens the log with: never create, no balancer.
pub fn open_options(recovery: RecoveryMode) -> LogOptions {
    LogOptions {
        create: false,
        recovery,
        balancer: false,
        ..LogOptions::default()
    }
}

/// Opens an existing log (strict recovery, no balancer).
pub fn open_existing(dir: &Path) -> Result<Log, Failure> {
    Ok(Log::open(dir, open_options(RecoveryMode::Strict))?)
}

/// Checks a topic name before anything touches the disk.
pub fn check_topic_name(name: &str) -> Result<(), Failure> {
    fissionlog::validate_topic_name(name)?;
    Ok(())
}

/// Bytes as a JSON field: `name: "text"` when UTF-8, else `name_base64`.
pub fn put_bytes(
    obj: &mut serde_json::Map<String, serde_json::Value>,
    name: &str,
    b: Option<&[u8]>,
) {
    match b {
        None => {
            obj.insert(name.into(), serde_json::Value::Null);
        }
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => {
                obj.insert(name.into(), serde_json::Value::String(s.into()));
            }
            Err(_) => {
                let enc = base64::engine::general_purpose::STANDARD.encode(b);
                obj.insert(format!("{name}_base64"), serde_json::Value::String(enc));
            }
        },
    }
}

/// Bytes for a tab-separated text line: UTF-8 kept, `\t \n \r \\` and
/// control characters escaped, bytes that are not UTF-8 as `\xNN`.
pub fn escape_text(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

/// A hash value as fixed-width hex.
pub fn hex(h: u64) -> String {
    format!("{h:#018x}")
}

/// Writes one JSON document followed by a newline.
pub fn write_json(out: &mut impl Write, v: &impl serde::Serialize) -> Result<(), Failure> {
    serde_json::to_writer(&mut *out, v).map_err(|e| Failure::output(std::io::Error::other(e)))?;
    writeln!(out).map_err(Failure::output)
}

/// Whether progress should be drawn: stdout is a terminal and not `--json`.
pub fn show_progress(json: bool) -> bool {
    !json && std::io::stdout().is_terminal()
}

/// A spinner for work without a known length (hidden unless `enabled`).
pub fn spinner(enabled: bool, message: &'static str) -> indicatif::ProgressBar {
    if !enabled {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_message(message);
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

/// A bar over `total` units (hidden unless `enabled`).
pub fn bar(enabled: bool, total: u64) -> indicatif::ProgressBar {
    if !enabled {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} records",
    ) {
        pb.set_style(style);
    }
    pb
}

/// Parses a hash value: decimal or `0x` hex.
pub fn parse_hash(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(&h.replace('_', ""), 16),
        None => s.replace('_', "").parse(),
    };
    r.map_err(|e| format!("not a 64-bit hash value (decimal or 0x hex): {e}"))
}
