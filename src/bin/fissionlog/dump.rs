//! `dump`: prints the records of a topic or of one partition.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use fissionlog::{Error, OwnedRecord, StartAt, Topic};

use crate::common::{
    bar, check_topic_name, escape_text, open_existing, put_bytes, show_progress, write_json,
    CmdResult, Failure,
};

/// Records fetched per read.
const POLL_RECORDS: usize = 1024;
/// Bytes fetched per read of one partition.
const READ_BYTES: usize = 1 << 20;

/// Arguments of `fissionlog dump`.
#[derive(clap::Args, Debug)]
pub struct DumpArgs {
    /// Log directory.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Topic to print.
    #[arg(long, value_name = "NAME")]
    pub topic: String,
    /// Print only this partition, in offset order. Without it the whole
    /// topic is printed in lineage order (parents before children), so each
    /// key's records appear in append order, except those of a key with a
    /// hot-key mode (windowed or spread: its lanes are in several
    /// partitions; see --key).
    #[arg(long, value_name = "ID", conflicts_with = "key")]
    pub partition: Option<u32>,
    /// Print only the records of this key (UTF-8), in per-key order: era
    /// by era and, for a windowed key, window by window across its lanes
    /// (the key reader). A spread era's records come lane by lane.
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// First offset to print (needs --partition); offsets below the
    /// partition's first held offset start at that offset.
    #[arg(long, value_name = "OFFSET", requires = "partition")]
    pub from: Option<u64>,
    /// One JSON object per line: partition, offset, timestamp, key, value
    /// (key/value that are not UTF-8 go base64 as key_base64/value_base64).
    #[arg(long)]
    pub json: bool,
}

fn print_record(out: &mut impl Write, r: &OwnedRecord, json: bool) -> Result<(), Failure> {
    if json {
        let mut obj = serde_json::Map::new();
        obj.insert("partition".into(), r.partition.into());
        obj.insert("offset".into(), r.offset.into());
        obj.insert("timestamp".into(), r.timestamp.into());
        put_bytes(&mut obj, "key", r.key.as_deref());
        put_bytes(&mut obj, "value", Some(&r.value));
        write_json(out, &obj)
    } else {
        let key = r.key.as_deref().map(escape_text).unwrap_or_default();
        writeln!(
            out,
            "{}\t{}\t{}\t{}",
            r.partition,
            r.offset,
            key,
            escape_text(&r.value)
        )
        .map_err(Failure::output)
    }
}

fn dump_partition(
    topic: &Topic,
    id: u32,
    from: u64,
    out: &mut impl Write,
    args: &DumpArgs,
) -> Result<(), Failure> {
    let part = topic.partition(id)?;
    let end = part.end_offset();
    let mut pos = from.max(part.start_offset());
    let pb = bar(show_progress(args.json), end.saturating_sub(pos));
    while pos < end {
        match topic.read(id, pos, READ_BYTES) {
            Ok(batch) => {
                for r in batch.to_owned_records()? {
                    print_record(out, &r, args.json)?;
                }
                pb.inc(batch.next_offset() - pos);
                pos = batch.next_offset();
            }
            Err(Error::Hole { start, end, .. }) => {
                eprintln!(
                    "partition {id}: offsets {start}..{end} were lost to corruption (salvage hole)"
                );
                pb.inc(end.saturating_sub(pos));
                pos = end;
            }
            Err(Error::Retained { start, end, .. }) => {
                eprintln!("partition {id}: offsets {start}..{end} were removed by retention");
                pb.inc(end.saturating_sub(pos));
                pos = end;
            }
            Err(e) => return Err(e.into()),
        }
    }
    pb.finish_and_clear();
    // A tail split's moved range is past the parent's end now: say where
    // it went rather than end as if the offsets had never been written.
    if let Some(m) = topic
        .partitions()
        .into_iter()
        .find(|p| p.id == id)
        .and_then(|p| p.moved)
        .filter(|m| from < m.to)
    {
        let children: Vec<String> = m.children.iter().map(|c| c.partition.to_string()).collect();
        eprintln!(
            "partition {id}: offsets {}..{} were moved by a tail split to partitions {} \
             (dump the topic, or those partitions)",
            m.from,
            m.to,
            children.join(", ")
        );
    }
    Ok(())
}

fn dump_lineage(topic: &Topic, out: &mut impl Write, args: &DumpArgs) -> Result<(), Failure> {
    let total: u64 = topic
        .partitions()
        .iter()
        .map(|p| p.end_offset - p.start_offset)
        .sum();
    let pb = bar(show_progress(args.json), total);
    let mut reader = topic.reader(StartAt::Earliest)?;
    loop {
        let recs = reader.poll(POLL_RECORDS)?;
        if recs.is_empty() {
            break;
        }
        for r in &recs {
            print_record(out, r, args.json)?;
        }
        pb.inc(recs.len() as u64);
    }
    pb.finish_and_clear();
    Ok(())
}

fn dump_key(
    topic: &Topic,
    key: &[u8],
    out: &mut impl Write,
    args: &DumpArgs,
) -> Result<(), Failure> {
    for r in topic.key_reader(key) {
        let r = r?;
        let rec = OwnedRecord {
            partition: r.partition,
            offset: r.offset,
            timestamp: r.timestamp,
            key: Some(key.to_vec()),
            value: r.value,
        };
        print_record(out, &rec, args.json)?;
    }
    Ok(())
}

/// Runs `dump`.
pub fn run(args: &DumpArgs) -> CmdResult {
    check_topic_name(&args.topic)?;
    let log = open_existing(&args.dir)?;
    let topic = log.topic(&args.topic)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match (&args.key, args.partition) {
        (Some(key), _) => dump_key(&topic, key.as_bytes(), &mut out, args)?,
        (None, Some(id)) => dump_partition(&topic, id, args.from.unwrap_or(0), &mut out, args)?,
        (None, None) => dump_lineage(&topic, &mut out, args)?,
    }
    out.flush().map_err(Failure::output)?;
    drop(topic);
    log.close()?;
    Ok(ExitCode::SUCCESS)
}
