//! A producer and a tailing consumer, as a broker's append and fetch paths
//! would use the log: one thread appends keyed records to a 4-partition
//! topic while a reader that started at `StartAt::Latest` follows it with
//! `poll_wait`. The reader sees none of the records appended before it
//! started, every record appended after, and each key's records in append
//! order. The example checks all three and fails loudly if one breaks.
//!
//! ```sh
//! cargo run --example produce_and_tail
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fissionlog::{Log, LogOptions, StartAt, SyncPolicy, TopicConfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Keys the producer cycles through.
const KEYS: u64 = 16;
/// Records the producer appends once the reader is tailing.
const RECORDS: u64 = 20_000;

/// A record's value: which key it belongs to and its sequence number
/// within that key, so the reader can check per-key order.
fn encode(key: u64, seq: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&key.to_le_bytes());
    v[8..].copy_from_slice(&seq.to_le_bytes());
    v
}

fn decode(value: &[u8]) -> Result<(u64, u64), BoxError> {
    let key = <[u8; 8]>::try_from(value.get(..8).ok_or("value too short")?)?;
    let seq = <[u8; 8]>::try_from(value.get(8..16).ok_or("value too short")?)?;
    Ok((u64::from_le_bytes(key), u64::from_le_bytes(seq)))
}

fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let log = Log::open(dir.path(), LogOptions::default())?;
    let topic = log.create_topic(
        "events",
        TopicConfig {
            partitions: 4,
            // A background thread makes appends durable every 50 ms; readers
            // of a topic that is not `SyncPolicy::Always` see records as soon
            // as they are written.
            sync: SyncPolicy::Interval(Duration::from_millis(50)),
            ..TopicConfig::default()
        },
    )?;

    // History the tailing reader must not see.
    for i in 0..1_000u64 {
        topic.append(Some(b"history"), &encode(u64::MAX, i))?;
    }

    let mut reader = topic.reader(StartAt::Latest)?;
    let started = Instant::now();
    let (read, per_key) = std::thread::scope(|s| -> Result<_, BoxError> {
        let producer = s.spawn(|| -> fissionlog::Result<()> {
            for i in 0..RECORDS {
                let key = i % KEYS;
                let name = format!("sensor-{key}");
                topic.append(Some(name.as_bytes()), &encode(key, i / KEYS))?;
            }
            Ok(())
        });

        // Per key, the sequence number the next record must carry.
        let mut next: BTreeMap<u64, u64> = BTreeMap::new();
        let mut read = 0u64;
        let deadline = started + Duration::from_secs(60);
        while read < RECORDS {
            if Instant::now() > deadline {
                return Err(format!("only {read} of {RECORDS} records arrived in 60 s").into());
            }
            for record in reader.poll_wait(1_000, Duration::from_millis(100))? {
                let (key, seq) = decode(&record.value)?;
                assert_ne!(key, u64::MAX, "a Latest reader returned older history");
                let expected = next.entry(key).or_insert(0);
                assert_eq!(
                    seq, *expected,
                    "key {key}: record {seq} arrived where {expected} was due (partition {}, offset {})",
                    record.partition, record.offset
                );
                *expected += 1;
                read += 1;
            }
        }
        producer
            .join()
            .map_err(|_| "the producer thread panicked")??;
        Ok((read, next))
    })?;

    // Nothing after the last record: the reader is caught up.
    assert!(
        reader.poll(1)?.is_empty(),
        "records beyond what was appended"
    );
    assert_eq!(per_key.len() as u64, KEYS);
    assert!(per_key.values().all(|&n| n == RECORDS / KEYS));
    println!(
        "tailed {read} records of {KEYS} keys in {:.2?}, per-key order kept; \
         the 1,000 records appended before the reader started were not returned",
        started.elapsed()
    );
    drop(topic);
    log.close()?;
    Ok(())
}
