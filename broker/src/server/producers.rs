//! The idempotent producer: producer ids that a restart never hands out
//! again, per (producer, partition) sequence state, and that state rebuilt
//! from the log at start (docs/PROTOCOL.md, "Idempotent produce").
//!
//! Each idempotent batch is written as one library batch whose first
//! record is a *stamp*: key [`STAMP_KEY`], value the producer id, epoch,
//! first sequence, record count and the partition it was addressed to.
//! The library writes one partition's batch whole or not at all, so a
//! batch is on disk exactly when its stamp is, and the stamps of a
//! partition's last records are all a restart needs to recognise a retry.
//! Fetches and group polls never hand a stamp out.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use fissionlog::{Log, ReadIsolation};

use super::owners::OwnersFile;
use crate::protocol::Stamp;

/// The key of a stamp record. A client record with this key is refused.
pub const STAMP_KEY: &[u8] = b"\0fissionlog-broker/stamp";
/// The stamp value's layout version.
const STAMP_VERSION: u8 = 1;
/// version u8, producer id u64, epoch u32, first sequence u64, count u32,
/// partition u32 (little-endian).
const STAMP_LEN: usize = 1 + 8 + 4 + 8 + 4 + 4;
/// Batches remembered per (producer, partition): a retry of one of them
/// is answered with its first copy's offsets.
pub const RECENT_BATCHES: usize = 5;
/// The file in the log directory that holds the next producer id.
pub const ID_FILE: &str = "broker-producer-ids";
/// Ids reserved by one write of [`ID_FILE`].
const ID_BLOCK: u64 = 1024;
/// (producer, partition) states kept at most; the least recently used go
/// first (a retry of theirs is then accepted as new).
const MAX_STATES: usize = 100_000;
/// Producer ids whose owner is kept at most, in memory and in
/// [`super::owners::OWNERS_FILE`]; the lowest ids go first.
pub(crate) const MAX_OWNERS: usize = 100_000;

/// Is this the key of a stamp record?
pub fn is_stamp(key: Option<&[u8]>) -> bool {
    key == Some(STAMP_KEY)
}

/// A stamp record's value.
pub fn encode_stamp(s: &Stamp, count: u32, partition: u32) -> [u8; STAMP_LEN] {
    let mut v = [0u8; STAMP_LEN];
    v[0] = STAMP_VERSION;
    v[1..9].copy_from_slice(&s.producer_id.to_le_bytes());
    v[9..13].copy_from_slice(&s.epoch.to_le_bytes());
    v[13..21].copy_from_slice(&s.first_sequence.to_le_bytes());
    v[21..25].copy_from_slice(&count.to_le_bytes());
    v[25..29].copy_from_slice(&partition.to_le_bytes());
    v
}

/// A stamp record's value read back: the stamp, the batch's record count
/// and the partition it was addressed to; `None` for anything else.
pub fn decode_stamp(v: &[u8]) -> Option<(Stamp, u32, u32)> {
    if v.len() != STAMP_LEN || v[0] != STAMP_VERSION {
        return None;
    }
    let u64_at = |i: usize| u64::from_le_bytes(v[i..i + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |i: usize| u32::from_le_bytes(v[i..i + 4].try_into().unwrap_or([0; 4]));
    Some((
        Stamp {
            producer_id: u64_at(1),
            epoch: u32_at(9),
            first_sequence: u64_at(13),
        },
        u32_at(21),
        u32_at(25),
    ))
}

/// One batch a (producer, partition) wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSeen {
    /// Its first sequence number.
    pub first_sequence: u64,
    /// Its records.
    pub count: u32,
    /// The offset of its first record (after the stamp).
    pub first_offset: u64,
}

/// What to do with an idempotent batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Append it: the next batch in sequence.
    Append,
    /// A retry of a batch already written: answer with its offsets.
    Duplicate(BatchSeen),
    /// Its first sequence is not the next one.
    OutOfOrder {
        /// The sequence expected.
        expected: u64,
    },
    /// An older epoch than the producer's.
    Fenced {
        /// The producer's epoch.
        current: u32,
    },
}

/// The sequence state of one (producer, partition).
#[derive(Debug, Default, Clone)]
pub struct SeqState {
    /// `false` until a batch is seen: any first sequence is then taken
    /// (a new partition starts at 0; a producer whose batches fell out of
    /// the scanned tail at restart goes on where it was).
    known: bool,
    epoch: u32,
    next_sequence: u64,
    recent: VecDeque<BatchSeen>,
    /// When it was last used, for eviction.
    used: u64,
}

impl SeqState {
    /// Judges a batch of `count` records stamped `epoch`, `first_sequence`.
    pub fn check(&self, epoch: u32, first_sequence: u64, count: u32) -> Verdict {
        if !self.known {
            return Verdict::Append;
        }
        if epoch < self.epoch {
            return Verdict::Fenced {
                current: self.epoch,
            };
        }
        if epoch > self.epoch {
            return if first_sequence == 0 {
                Verdict::Append
            } else {
                Verdict::OutOfOrder { expected: 0 }
            };
        }
        if let Some(b) = self
            .recent
            .iter()
            .find(|b| b.first_sequence == first_sequence && b.count == count)
        {
            return Verdict::Duplicate(*b);
        }
        if first_sequence == self.next_sequence {
            Verdict::Append
        } else {
            Verdict::OutOfOrder {
                expected: self.next_sequence,
            }
        }
    }

    /// Notes a batch written at `first_offset`.
    pub fn record(&mut self, epoch: u32, first_sequence: u64, count: u32, first_offset: u64) {
        if !self.known || epoch > self.epoch {
            self.recent.clear();
        }
        self.known = true;
        self.epoch = epoch;
        self.next_sequence = first_sequence + u64::from(count);
        self.recent.push_back(BatchSeen {
            first_sequence,
            count,
            first_offset,
        });
        while self.recent.len() > RECENT_BATCHES {
            self.recent.pop_front();
        }
    }
}

/// Whose sequence: topic, partition, producer.
type StateKey = (String, u32, u64);

/// The server's producer table.
pub struct Producers {
    dir: PathBuf,
    ids: Mutex<Ids>,
    states: Mutex<States>,
}

struct Ids {
    /// The next id to hand out.
    next: u64,
    /// Ids below this are reserved by the file: handed out without a write.
    reserved: u64,
    /// The principal each id belongs to: the one it was handed to, or
    /// (for an id evicted from this table) the first to use it since.
    /// Only its owner takes its next epoch or writes under it, so one
    /// tenant can't fence another's producer. At most [`MAX_OWNERS`], the
    /// lowest ids go first; every claim is durable in `file` before it
    /// is answered, so a restart keeps them.
    owners: BTreeMap<u64, String>,
    file: OwnersFile,
}

impl Ids {
    /// Whether `principal` may use `id`; an id with no owner becomes its,
    /// durably.
    fn claim(&mut self, id: u64, principal: &str) -> fissionlog::Result<bool> {
        if let Some(owner) = self.owners.get(&id) {
            return Ok(owner == principal);
        }
        self.owners.insert(id, principal.to_string());
        if self.owners.len() > MAX_OWNERS {
            self.owners.pop_first();
        }
        if let Err(e) = self.file.append(id, principal, &self.owners) {
            // Not durable: not claimed.
            self.owners.remove(&id);
            return Err(e);
        }
        Ok(true)
    }
}

struct States {
    map: HashMap<StateKey, Arc<Mutex<SeqState>>>,
    /// The latest epoch of each producer that has one above 0: at most
    /// `limit`, the lowest ids go first.
    epochs: BTreeMap<u64, u32>,
    /// The highest epoch of a producer whose entry was evicted from
    /// `epochs`: the next epoch of a producer without an entry is above
    /// it, so a forgotten producer's next epoch still fences its older
    /// ones.
    epoch_floor: u32,
    /// The most entries of `map` and of `epochs`.
    limit: usize,
    clock: u64,
}

impl States {
    fn new(limit: usize) -> States {
        States {
            map: HashMap::new(),
            epochs: BTreeMap::new(),
            epoch_floor: 0,
            limit: limit.max(1),
            clock: 0,
        }
    }

    /// Raises `producer`'s latest epoch to `epoch`, evicting the lowest
    /// id when the table is full.
    fn note_epoch(&mut self, producer: u64, epoch: u32) {
        if let Some(e) = self.epochs.get_mut(&producer) {
            *e = (*e).max(epoch);
            return;
        }
        if self.epochs.len() >= self.limit {
            if let Some((_, evicted)) = self.epochs.pop_first() {
                self.epoch_floor = self.epoch_floor.max(evicted);
            }
        }
        self.epochs.insert(producer, epoch);
    }

    /// The epoch a new `InitProducer` of `producer` takes.
    fn next_epoch(&self, producer: u64) -> Option<u32> {
        self.epochs
            .get(&producer)
            .copied()
            .unwrap_or(self.epoch_floor)
            .checked_add(1)
    }
}

impl std::fmt::Debug for Producers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producers")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn io_err(path: &Path, e: std::io::Error) -> fissionlog::Error {
    fissionlog::Error::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

impl Producers {
    /// Loads the next producer id from the log directory and rebuilds the
    /// sequence state from the last `scan_records` records of every
    /// partition.
    pub fn open(log: &Log, scan_records: u64) -> fissionlog::Result<Producers> {
        let p = Producers::load(log.dir(), MAX_STATES)?;
        let highest = p.rebuild(log, scan_records)?;
        if let Ok(mut ids) = p.ids.lock() {
            // A file lost with a crash between its write and the directory's
            // sync: the stamps still name the ids in use.
            if highest >= ids.next {
                ids.next = highest + 1;
                ids.reserved = ids.next;
            }
        }
        Ok(p)
    }

    /// The id and owner files of `dir`, with sequence and epoch tables of
    /// at most `limit` entries (empty: [`Producers::rebuild`] fills them).
    fn load(dir: &Path, limit: usize) -> fissionlog::Result<Producers> {
        let next = read_next_id(dir)?;
        let (file, owners) = OwnersFile::open(dir, MAX_OWNERS)?;
        Ok(Producers {
            dir: dir.to_path_buf(),
            ids: Mutex::new(Ids {
                next,
                reserved: next,
                owners,
                file,
            }),
            states: Mutex::new(States::new(limit)),
        })
    }

    /// Reads the stamps of each partition's tail; returns the highest
    /// producer id seen (0 for none).
    fn rebuild(&self, log: &Log, scan_records: u64) -> fissionlog::Result<u64> {
        let mut highest = 0;
        for name in log.topics() {
            let topic = log.topic(&name)?;
            for info in topic.partitions() {
                let from = info
                    .end_offset
                    .saturating_sub(scan_records)
                    .max(info.start_offset);
                let mut at = from;
                while at < info.end_offset {
                    let batch = match topic.read_with(info.id, at, 1 << 20, ReadIsolation::Written)
                    {
                        Ok(b) => b,
                        Err(e) => {
                            tracing::warn!(topic = %name, partition = info.id, offset = at, error = %e,
                                "producer state: the rest of this partition is not scanned");
                            break;
                        }
                    };
                    for r in batch.try_iter() {
                        let r = r?;
                        if !is_stamp(r.key) {
                            continue;
                        }
                        let Some((s, count, addressed)) = decode_stamp(r.value) else {
                            continue;
                        };
                        highest = highest.max(s.producer_id);
                        // A stamp a tail split copied into a child names the
                        // parent: its records are not after it here.
                        if addressed != info.id {
                            continue;
                        }
                        let st = self.state(&name, info.id, s.producer_id);
                        if let Ok(mut st) = st.lock() {
                            st.record(s.epoch, s.first_sequence, count, r.offset + 1);
                        }
                        if let Ok(mut states) = self.states.lock() {
                            states.note_epoch(s.producer_id, s.epoch);
                        }
                    }
                    if batch.next_offset() <= at {
                        break;
                    }
                    at = batch.next_offset();
                }
            }
        }
        Ok(highest)
    }

    /// The state of (topic, partition, producer), made when missing.
    pub fn state(&self, topic: &str, partition: u32, producer: u64) -> Arc<Mutex<SeqState>> {
        let Ok(mut states) = self.states.lock() else {
            return Arc::new(Mutex::new(SeqState::default()));
        };
        states.clock += 1;
        let now = states.clock;
        let key = (topic.to_string(), partition, producer);
        if !states.map.contains_key(&key) && states.map.len() >= states.limit {
            let limit = states.limit;
            evict(&mut states.map, limit);
        }
        let st = states.map.entry(key).or_default().clone();
        if let Ok(mut s) = st.lock() {
            s.used = now;
        }
        st
    }

    /// The producer's latest epoch (0 when it never took another).
    pub fn epoch(&self, producer: u64) -> u32 {
        self.states
            .lock()
            .ok()
            .and_then(|s| s.epochs.get(&producer).copied())
            .unwrap_or(0)
    }

    /// A new producer id (epoch 0), or for `Some(id)` the id's next epoch,
    /// which fences its older one. Blocking: may write [`ID_FILE`].
    pub fn init(&self, producer: Option<u64>, principal: &str) -> Result<(u64, u32), InitError> {
        let mut ids = self.ids.lock().map_err(|_| InitError::Poisoned)?;
        match producer {
            Some(id) => {
                if id == 0 || id >= ids.next {
                    return Err(InitError::UnknownProducer(id));
                }
                if !ids.claim(id, principal).map_err(InitError::Storage)? {
                    return Err(InitError::NotOwner(id));
                }
                let mut states = self.states.lock().map_err(|_| InitError::Poisoned)?;
                let epoch = states.next_epoch(id).ok_or(InitError::EpochExhausted(id))?;
                states.note_epoch(id, epoch);
                Ok((id, epoch))
            }
            None => {
                if ids.next >= ids.reserved {
                    let reserved = ids.next + ID_BLOCK;
                    write_next_id(&self.dir, reserved).map_err(InitError::Storage)?;
                    ids.reserved = reserved;
                }
                let id = ids.next;
                ids.next += 1;
                ids.claim(id, principal).map_err(InitError::Storage)?;
                Ok((id, 0))
            }
        }
    }
}

impl Producers {
    /// Whether `principal` may write batches stamped with `producer`'s id
    /// (see [`Producers::init`]); an id with no owner becomes its. An id
    /// never handed out is [`Use::Unknown`]: a batch made up with it must
    /// not leave sequence state behind, or the id's later owner would see
    /// its first batches answered as duplicates of it. Fails when a new
    /// claim can't be made durable.
    pub fn may_use(&self, producer: u64, principal: &str) -> fissionlog::Result<Use> {
        let Ok(mut ids) = self.ids.lock() else {
            return Ok(Use::NotOwner);
        };
        if producer == 0 || producer >= ids.next {
            return Ok(Use::Unknown);
        }
        Ok(if ids.claim(producer, principal)? {
            Use::Owner
        } else {
            Use::NotOwner
        })
    }
}

/// What [`Producers::may_use`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// The id is the principal's (now, if it had no owner).
    Owner,
    /// The id belongs to another principal.
    NotOwner,
    /// The id was never handed out.
    Unknown,
}

/// Why `InitProducer` failed.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The id was never handed out.
    #[error("producer id {0} was never handed out")]
    UnknownProducer(u64),
    /// The id belongs to another principal.
    #[error("producer id {0} belongs to another principal")]
    NotOwner(u64),
    /// The id used every epoch.
    #[error("producer id {0} has no epoch left")]
    EpochExhausted(u64),
    /// The id file could not be written.
    #[error("cannot reserve producer ids: {0}")]
    Storage(fissionlog::Error),
    /// A lock was poisoned by a panic elsewhere.
    #[error("the producer table is poisoned")]
    Poisoned,
}

fn evict(map: &mut HashMap<StateKey, Arc<Mutex<SeqState>>>, limit: usize) {
    let mut used: Vec<(u64, StateKey)> = map
        .iter()
        .map(|(k, v)| (v.lock().map_or(0, |s| s.used), k.clone()))
        .collect();
    used.sort_unstable_by_key(|(u, _)| *u);
    for (_, k) in used.into_iter().take((limit / 8).max(1)) {
        map.remove(&k);
    }
}

const ID_MAGIC: &str = "fissionlog-broker producer ids v1";

/// The next id the file allows (1 when there is no file).
fn read_next_id(dir: &Path) -> fissionlog::Result<u64> {
    let path = dir.join(ID_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(1),
        Err(e) => return Err(io_err(&path, e)),
    };
    let mut lines = text.lines();
    let next = (lines.next() == Some(ID_MAGIC))
        .then(|| lines.next())
        .flatten()
        .and_then(|l| l.strip_prefix("next "))
        .and_then(|n| n.parse::<u64>().ok());
    next.ok_or_else(|| fissionlog::Error::Corruption {
        file: path.clone(),
        position: 0,
        reason: format!("not a producer id file (expected {ID_MAGIC:?}, then \"next N\")"),
    })
}

/// Writes the next id durably: a temporary file, fsync, rename, fsync of
/// the directory (a restart then never hands out an id below it again).
fn write_next_id(dir: &Path, next: u64) -> fissionlog::Result<()> {
    let tmp = dir.join(format!("{ID_FILE}.tmp"));
    let path = dir.join(ID_FILE);
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
    f.write_all(format!("{ID_MAGIC}\nnext {next}\n").as_bytes())
        .map_err(|e| io_err(&tmp, e))?;
    f.sync_all().map_err(|e| io_err(&tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(|e| io_err(&path, e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(batches: &[(u32, u64, u32, u64)]) -> SeqState {
        let mut s = SeqState::default();
        for &(e, seq, n, off) in batches {
            s.record(e, seq, n, off);
        }
        s
    }

    #[test]
    fn a_retry_of_a_recent_batch_is_a_duplicate_with_the_first_copys_offsets() {
        let s = written(&[(0, 0, 10, 1), (0, 10, 5, 12)]);
        assert_eq!(
            s.check(0, 0, 10),
            Verdict::Duplicate(BatchSeen {
                first_sequence: 0,
                count: 10,
                first_offset: 1
            })
        );
        assert_eq!(s.check(0, 15, 3), Verdict::Append);
    }

    #[test]
    fn a_gap_in_the_sequence_is_out_of_order() {
        let s = written(&[(0, 0, 10, 1)]);
        assert_eq!(s.check(0, 11, 1), Verdict::OutOfOrder { expected: 10 });
    }

    #[test]
    fn a_batch_older_than_the_remembered_ones_is_out_of_order_not_appended() {
        let mut s = SeqState::default();
        for i in 0..(RECENT_BATCHES as u64 + 2) {
            s.record(0, i, 1, i * 2 + 1);
        }
        assert_eq!(
            s.check(0, 0, 1),
            Verdict::OutOfOrder {
                expected: RECENT_BATCHES as u64 + 2
            }
        );
    }

    #[test]
    fn an_older_epoch_is_fenced_and_a_new_one_starts_at_zero() {
        let s = written(&[(3, 0, 4, 1)]);
        assert_eq!(s.check(2, 4, 1), Verdict::Fenced { current: 3 });
        assert_eq!(s.check(4, 0, 1), Verdict::Append);
        assert_eq!(s.check(4, 7, 1), Verdict::OutOfOrder { expected: 0 });
    }

    #[test]
    fn a_stamp_reads_back_as_written_and_other_bytes_do_not_read_as_one() {
        let s = Stamp {
            producer_id: 7,
            epoch: 2,
            first_sequence: 1 << 40,
        };
        assert_eq!(decode_stamp(&encode_stamp(&s, 9, 3)), Some((s, 9, 3)));
        assert_eq!(decode_stamp(b"hello"), None);
        let mut v = encode_stamp(&s, 9, 3);
        v[0] = 9;
        assert_eq!(decode_stamp(&v), None);
    }

    fn table(dir: &Path, limit: usize) -> Producers {
        Producers::load(dir, limit).expect("the id and owner files read")
    }

    #[test]
    fn an_id_keeps_its_owner_across_a_restart() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let a = table(dir.path(), MAX_STATES);
        let (alice, _) = a.init(None, "alice").expect("an id");
        let (bob, _) = a.init(None, "bob").expect("an id");
        drop(a);
        let b = table(dir.path(), MAX_STATES);
        assert!(matches!(
            b.init(Some(alice), "bob"),
            Err(InitError::NotOwner(id)) if id == alice
        ));
        assert_eq!(
            b.may_use(alice, "bob").expect("no storage error"),
            Use::NotOwner
        );
        assert_eq!(
            b.may_use(alice, "alice").expect("no storage error"),
            Use::Owner
        );
        assert_eq!(b.init(Some(bob), "bob").expect("bob's own id").1, 1);
        // An id claimed by its first user after a restart stays claimed.
        drop(b);
        let c = table(dir.path(), MAX_STATES);
        assert_eq!(
            c.may_use(bob, "alice").expect("no storage error"),
            Use::NotOwner
        );
        // Past the last id handed out, an id is nobody's and not claimed.
        let (carol, _) = c.init(None, "carol").expect("an id");
        assert_eq!(
            c.may_use(carol + 1, "alice").expect("no storage error"),
            Use::Unknown
        );
        assert_eq!(
            c.may_use(0, "alice").expect("no storage error"),
            Use::Unknown
        );
    }

    #[test]
    fn the_epoch_table_stays_bounded_and_a_forgotten_producer_still_fences_its_old_epochs() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let p = table(dir.path(), 4);
        let ids: Vec<u64> = (0..40)
            .map(|_| p.init(None, "p").expect("an id").0)
            .collect();
        let first = ids[0];
        assert_eq!(p.init(Some(first), "p").expect("an epoch").1, 1);
        assert_eq!(p.init(Some(first), "p").expect("an epoch").1, 2);
        for &id in &ids[1..] {
            assert!(p.init(Some(id), "p").expect("an epoch").1 >= 1);
            let len = p.states.lock().expect("not poisoned").epochs.len();
            assert!(len <= 4, "{len} epochs kept under a limit of 4");
        }
        assert_eq!(p.epoch(first), 0, "the lowest id was evicted");
        let again = p.init(Some(first), "p").expect("an epoch").1;
        assert!(
            again > 2,
            "an evicted producer re-initialised at epoch {again}, not above its old 2"
        );
        assert_eq!(p.epoch(first), again);
        for _ in 0..100 {
            let (id, _) = p.init(None, "p").expect("an id");
            p.state("t", 0, id);
        }
        let len = p.states.lock().expect("not poisoned").map.len();
        assert!(len <= 4, "{len} sequence states kept under a limit of 4");
    }

    #[test]
    fn producer_ids_are_never_handed_out_twice_across_a_reopen_of_the_id_file() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let open = || table(dir.path(), MAX_STATES);
        let a = open();
        let first: Vec<u64> = (0..3)
            .map(|_| a.init(None, "p").expect("an id").0)
            .collect();
        drop(a);
        let b = open();
        let again = b.init(None, "p").expect("an id").0;
        assert!(first.iter().all(|&id| id < again), "{first:?} then {again}");
        assert!(matches!(
            b.init(Some(again + 5), "p"),
            Err(InitError::UnknownProducer(_))
        ));
        assert_eq!(b.init(Some(first[0]), "p").expect("an epoch").1, 1);
    }
}
