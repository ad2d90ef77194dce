//! `produce`: appends stdin lines (`KEY<TAB>VALUE`) to a topic.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;

use fissionlog::{Error, Log, LogOptions, NewRecord, RecoveryMode, SyncPolicy, TopicConfig};

use crate::common::{check_topic_name, open_options, put_bytes, CmdResult, Failure};

/// Records appended per batch at most (more when stdin delivers faster).
const BATCH_RECORDS_MAX: usize = 4096;
/// Bytes appended per batch at most.
const BATCH_BYTES_MAX: usize = 1 << 20;

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

/// Reads stdin on its own thread so the appender can take whatever lines
/// are already available as one batch.
fn spawn_reader() -> mpsc::Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::sync_channel(BATCH_RECORDS_MAX * 2);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut input = stdin.lock();
        loop {
            let mut line = Vec::new();
            match input.read_until(b'\n', &mut line) {
                Ok(0) => return,
                Ok(_) => {
                    if tx.send(Ok(line)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    });
    rx
}

/// Waits for at least one line, then takes what is available (bounded).
fn next_batch(
    rx: &mpsc::Receiver<std::io::Result<Vec<u8>>>,
) -> Result<Option<Vec<Vec<u8>>>, Failure> {
    let first = match rx.recv() {
        Ok(l) => l,
        Err(_) => return Ok(None),
    };
    let first = first.map_err(|e| Failure::problem(format!("cannot read stdin: {e}")))?;
    let mut bytes = first.len();
    let mut lines = vec![first];
    while lines.len() < BATCH_RECORDS_MAX && bytes < BATCH_BYTES_MAX {
        match rx.try_recv() {
            Ok(Ok(l)) => {
                bytes += l.len();
                lines.push(l);
            }
            Ok(Err(e)) => return Err(Failure::problem(format!("cannot read stdin: {e}"))),
            Err(_) => break,
        }
    }
    Ok(Some(lines))
}

/// Runs `produce`.
pub fn run(args: &ProduceArgs) -> CmdResult {
    check_topic_name(&args.topic)?;
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
    // An existing topic may have a weaker policy than asked for: then each
    // batch is synced explicitly before it is acknowledged.
    let sync_each_batch =
        args.sync == Some(SyncArg::Always) && topic.config().sync != SyncPolicy::Always;
    let rx = spawn_reader();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut total = 0u64;
    while let Some(lines) = next_batch(&rx)? {
        let parsed: Vec<(Option<Vec<u8>>, Vec<u8>)> = lines.into_iter().map(parse_line).collect();
        let records: Vec<NewRecord<'_>> = parsed
            .iter()
            .map(|(k, v)| NewRecord {
                key: k.as_deref(),
                value: v,
                timestamp: None,
            })
            .collect();
        let (at, failed) = match topic.append_batch(&records) {
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
            for ((key, _), a) in parsed.iter().zip(&at) {
                let Some(a) = a else { continue };
                let mut obj = serde_json::Map::new();
                put_bytes(&mut obj, "key", key.as_deref());
                obj.insert("partition".into(), a.partition.into());
                obj.insert("offset".into(), a.offset.into());
                crate::common::write_json(&mut out, &obj)?;
            }
            out.flush().map_err(Failure::output)?;
        }
        if let Some(e) = failed {
            return Err(e.into());
        }
    }
    out.flush().map_err(Failure::output)?;
    log.close()?;
    if !args.acks {
        eprintln!("appended {total} records to topic {:?}", args.topic);
    }
    Ok(ExitCode::SUCCESS)
}
