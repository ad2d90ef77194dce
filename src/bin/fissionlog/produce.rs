//! `produce`: appends stdin lines (`KEY<TAB>VALUE`) to a topic.

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;

use fissionlog::{Error, Log, LogOptions, NewRecord, RecoveryMode, SyncPolicy, Topic, TopicConfig};

use crate::common::{check_topic_name, open_options, put_bytes, CmdResult, Failure};

/// Records appended per batch at most (more when stdin delivers faster).
const BATCH_RECORDS_MAX: usize = 4096;
/// Bytes appended per batch at most.
const BATCH_BYTES_MAX: usize = 1 << 20;
/// Framing bytes of an encoded record beside its key and value (see
/// `TopicConfig::max_record_bytes`).
const RECORD_FRAMING_BYTES: u64 = 16;

/// When `produce` makes records durable.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncArg {
    /// Every batch is synced (fdatasync) before it is acknowledged.
    Always,
    /// No sync per batch; everything is synced once at the end (clean close).
    Never,
}

/// Arguments of `fissionlog produce`.
#[derive(clap::Args, Debug)]
pub struct ProduceArgs {
    /// Log directory.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Topic to append to.
    #[arg(long, value_name = "NAME")]
    pub topic: String,
    /// Create the log directory and the topic when missing (an existing topic is reused as is).
    #[arg(long)]
    pub create: bool,
    /// Partitions of a topic created by --create (ignored for an existing topic).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "create")]
    pub partitions: u32,
    /// Durability before acknowledging: `always` syncs each batch before its
    /// acks are printed; `never` leaves syncing to the clean close at end of
    /// input. Default: the topic's own policy (`never` for a new topic).
    #[arg(long, value_enum, value_name = "POLICY")]
    pub sync: Option<SyncArg>,
    /// Print one JSON line per record once it is acknowledged:
    /// {"key":"k","partition":0,"offset":17} (key null when absent,
    /// key_base64 when the key is not UTF-8).
    #[arg(long)]
    pub acks: bool,
}

/// One input line split into key and value.
fn parse_line(mut line: Vec<u8>) -> (Option<Vec<u8>>, Vec<u8>) {
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    match line.iter().position(|&b| b == b'\t') {
        Some(i) => {
            let value = line.split_off(i + 1);
            line.truncate(i);
            (Some(line), value)
        }
        None => (None, line),
    }
}

/// What the stdin reader hands the appender.
enum Input {
    /// One line, with its newline.
    Line(Vec<u8>),
    /// The next line is longer than `line_bytes_max`: reading stopped.
    TooLong,
    /// Reading stdin failed.
    Failed(std::io::Error),
}

/// Reads stdin on its own thread so the appender can take whatever lines
/// are already available as one batch. A line is read up to
/// `line_bytes_max` bytes (without its newline) and no further: a longer
/// one could not be a record of the topic, and an endless one would
/// exhaust memory.
fn spawn_reader(line_bytes_max: u64) -> mpsc::Receiver<Input> {
    let (tx, rx) = mpsc::sync_channel(BATCH_RECORDS_MAX * 2);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut input = stdin.lock();
        loop {
            let mut line = Vec::new();
            let read = (&mut input)
                .take(line_bytes_max + 1)
                .read_until(b'\n', &mut line);
            let msg = match read {
                Ok(0) => return,
                Ok(n) if n as u64 > line_bytes_max && line.last() != Some(&b'\n') => {
                    let _ = tx.send(Input::TooLong);
                    return;
                }
                Ok(_) => Input::Line(line),
                Err(e) => Input::Failed(e),
            };
            let last = matches!(msg, Input::Failed(_));
            if tx.send(msg).is_err() || last {
                return;
            }
        }
    });
    rx
}

/// Why a batch of lines ends input.
enum Stop {
    /// The next line was longer than any record of the topic.
    TooLong,
    /// Reading stdin failed.
    Failed(std::io::Error),
}

/// Waits for at least one line, then takes what is available (bounded).
/// The lines before a stop are returned with it, to be appended first.
fn next_batch(rx: &mpsc::Receiver<Input>) -> Option<(Vec<Vec<u8>>, Option<Stop>)> {
    let mut lines = Vec::new();
    let mut bytes = 0;
    let mut next = rx.recv().ok()?;
    loop {
        match next {
            Input::Line(l) => {
                bytes += l.len();
                lines.push(l);
            }
            Input::TooLong => return Some((lines, Some(Stop::TooLong))),
            Input::Failed(e) => return Some((lines, Some(Stop::Failed(e)))),
        }
        if lines.len() >= BATCH_RECORDS_MAX || bytes >= BATCH_BYTES_MAX {
            return Some((lines, None));
        }
        match rx.try_recv() {
            Ok(i) => next = i,
            Err(_) => return Some((lines, None)),
        }
    }
}

/// The one-sentence failure for line `line` (1-based), longer than the
/// topic's largest record; `appended` records went in before it.
fn too_long(line: u64, max: u64, topic: &str, appended: u64) -> Failure {
    Failure::problem(format!(
        "line {line} of stdin is longer than the largest record topic {topic:?} takes ({max} bytes of key and value with framing), so input stopped there; the {appended} record(s) before it were appended"
    ))
}

/// Runs `produce`.
pub fn run(args: &ProduceArgs) -> CmdResult {
    check_topic_name(&args.topic)?;
    let (log, topic) = open_topic(args)?;
    // An existing topic may have a weaker policy than asked for: then each
    // batch is synced explicitly before it is acknowledged.
    let sync_each_batch =
        args.sync == Some(SyncArg::Always) && topic.config().sync != SyncPolicy::Always;
    let record_bytes_max = topic.config().effective_max_record_bytes();
    // A line holds key, tab and value, and may end in CR LF: longer than
    // the largest record, it cannot be one.
    let rx = spawn_reader(record_bytes_max);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut total = 0u64;
    let mut lines_read = 0u64;
    while let Some((lines, mut stop)) = next_batch(&rx) {
        let parsed = parse_batch(lines, record_bytes_max, &mut stop);
        lines_read += parsed.len() as u64;
        let records: Vec<NewRecord<'_>> = parsed
            .iter()
            .map(|(k, v)| NewRecord {
                key: k.as_deref(),
                value: v,
                timestamp: None,
            })
            .collect();
        let appended = if records.is_empty() {
            Ok(Vec::new())
        } else {
            topic.append_batch(&records)
        };
        let (at, failed) = match appended {
            Ok(at) => (at.into_iter().map(Some).collect(), None),
            // Some partitions' records landed: acknowledge exactly those
            // (when synced), then fail, so a retry resends only the rest.
            Err(Error::PartialBatch { landed, source }) => (landed, Some(*source)),
            Err(e) => return Err(e.into()),
        };
        if sync_each_batch || failed.is_some() {
            log.sync()?;
        }
        total += at.iter().flatten().count() as u64;
        if args.acks {
            write_acks(&mut out, &parsed, &at)?;
        }
        if let Some(e) = failed {
            return Err(e.into());
        }
        match stop {
            None => {}
            Some(stop) => {
                // What was acknowledged stays so: the clean close syncs it.
                out.flush().map_err(Failure::output)?;
                log.close()?;
                return Err(match stop {
                    Stop::TooLong => {
                        too_long(lines_read + 1, record_bytes_max, &args.topic, total)
                    }
                    Stop::Failed(e) => Failure::problem(format!(
                        "cannot read stdin after line {lines_read}: {e}; the {total} record(s) before it were appended"
                    )),
                });
            }
        }
    }
    out.flush().map_err(Failure::output)?;
    log.close()?;
    if !args.acks {
        eprintln!("appended {total} records to topic {:?}", args.topic);
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens the log and the topic, creating both with `--create`.
fn open_topic(args: &ProduceArgs) -> Result<(Log, Topic), Failure> {
    let options = LogOptions {
        create: args.create,
        ..open_options(RecoveryMode::Strict)
    };
    let log = Log::open(&args.dir, options)?;
    let topic = if args.create {
        let config = TopicConfig {
            partitions: args.partitions,
            sync: match args.sync {
                Some(SyncArg::Always) => SyncPolicy::Always,
                _ => SyncPolicy::Never,
            },
            ..TopicConfig::default()
        };
        log.topic_or_create(&args.topic, config)?
    } else {
        log.topic(&args.topic)?
    };
    Ok((log, topic))
}

/// The key and value of each line of a batch, up to the first line whose
/// record would be over `record_bytes_max`: a line shorter than the cap can
/// still make a record over the limit (the framing), and it stops input
/// there too (`stop`), after the lines before it.
fn parse_batch(
    lines: Vec<Vec<u8>>,
    record_bytes_max: u64,
    stop: &mut Option<Stop>,
) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
    let mut parsed: Vec<(Option<Vec<u8>>, Vec<u8>)> = lines.into_iter().map(parse_line).collect();
    if let Some(i) = parsed.iter().position(|(k, v)| {
        RECORD_FRAMING_BYTES + k.as_ref().map_or(0, |k| k.len() as u64) + v.len() as u64
            > record_bytes_max
    }) {
        parsed.truncate(i);
        *stop = Some(Stop::TooLong);
    }
    parsed
}

/// One JSON line per record that landed: its key, partition and offset.
fn write_acks(
    out: &mut impl Write,
    parsed: &[(Option<Vec<u8>>, Vec<u8>)],
    at: &[Option<fissionlog::Appended>],
) -> Result<(), Failure> {
    for ((key, _), a) in parsed.iter().zip(at) {
        let Some(a) = a else { continue };
        let mut obj = serde_json::Map::new();
        put_bytes(&mut obj, "key", key.as_deref());
        obj.insert("partition".into(), a.partition.into());
        obj.insert("offset".into(), a.offset.into());
        crate::common::write_json(out, &obj)?;
    }
    out.flush().map_err(Failure::output)
}
