//! Pages ahead of the writer: a partition written faster than it is synced
//! gets the pages of each newly allocated chunk of its active segment
//! mapped writable at once (`MADV_POPULATE_WRITE`), so single-record
//! appends do not fault them in one at a time; a partition synced as it
//! is written (`SyncPolicy::Always`) gets none (a sync would write the
//! populated zeros out, and the stores would dirty them again). Checked
//! through the process's own page tables: `/proc/self/maps` for where the
//! segment file is mapped, `/proc/self/pagemap` for whether a page ahead
//! of the writer is present.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use fissionlog::{Log, LogOptions, NewRecord, SyncPolicy, TopicConfig};

const PAGE: u64 = 4096;

/// Start address and file offset of the writable shared mapping of the
/// segment file (`*.seg`) under `dir`.
fn segment_mapping(dir: &Path) -> (u64, u64) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let dir = dir.canonicalize().unwrap();
    let dir = dir.to_str().unwrap();
    let found: Vec<(u64, u64)> = maps
        .lines()
        .filter(|l| l.contains(dir) && l.contains("rw-s") && l.ends_with(".seg"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let start = u64::from_str_radix(f[0].split('-').next().unwrap(), 16).unwrap();
            let off = u64::from_str_radix(f[2], 16).unwrap();
            (start, off)
        })
        .collect();
    assert_eq!(found.len(), 1, "one writable segment mapping: {found:?}");
    found[0]
}

/// Whether the page holding byte `file_pos` of the mapping is present in
/// this process's page tables.
fn page_present((start, off): (u64, u64), file_pos: u64) -> bool {
    let addr = start + (file_pos - off);
    let mut pagemap = File::open("/proc/self/pagemap").unwrap();
    pagemap.seek(SeekFrom::Start(addr / PAGE * 8)).unwrap();
    let mut entry = [0u8; 8];
    pagemap.read_exact(&mut entry).unwrap();
    u64::from_le_bytes(entry) >> 63 == 1
}

/// Writes `total` bytes of `value_len`-byte records one append at a time
/// to a fresh topic with `sync`, and reports whether the page half an
/// allocation step (1 MiB at this size) past the data is present.
fn ahead_present(sync: SyncPolicy, value_len: usize, total: usize) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(
        dir.path(),
        LogOptions {
            balancer: false,
            ..LogOptions::default()
        },
    )
    .unwrap();
    let topic = log
        .topic_or_create(
            "t",
            TopicConfig {
                partitions: 1,
                segment_bytes: 64 << 20,
                sync,
                ..TopicConfig::default()
            },
        )
        .unwrap();
    let value = vec![5u8; value_len];
    let rec = [NewRecord {
        key: None,
        value: &value,
        timestamp: None,
    }];
    for _ in 0..total / value_len {
        topic.append_to(0, &rec).unwrap();
    }
    let map = segment_mapping(dir.path());
    // The writer is a little past `total` (record framing): 1 MiB beyond
    // it is far from any page it stored into, and inside the chunk the
    // last allocation took (it runs two steps, 2 MiB here, ahead).
    let present = page_present(map, total as u64 * 11 / 10 + (1 << 20));
    // The data itself reads back.
    let first = topic.read(0, 0, 1 << 16).unwrap();
    assert_eq!(first.iter().next().unwrap().value, &value[..]);
    drop(topic);
    log.close().unwrap();
    present
}

#[test]
fn pages_of_a_new_chunk_are_populated_when_syncs_lag_the_writer() {
    assert!(
        ahead_present(SyncPolicy::Never, 1024, 3 << 20),
        "no page populated ahead of an unsynced writer"
    );
}

#[test]
fn a_partition_synced_as_it_is_written_populates_nothing_ahead() {
    // 8 KiB records: stored through the mapping (batches under 16 KiB are),
    // 384 sync rounds.
    assert!(
        !ahead_present(SyncPolicy::Always, 8 << 10, 3 << 20),
        "pages populated ahead of a writer whose every append is synced"
    );
}
