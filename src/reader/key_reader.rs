//! Reading one key back in per-key order, streaming: era by era, and in a
//! windowed era window by window, merging the key's lanes (docs/HOT_KEYS.md).
//!
//! A reader follows the topology as it changes under it: when the topology
//! generation moves, the bounds it took at creation and each lane's
//! position are carried through the tail splits made since (the
//! translation [`crate::Reader`] uses), and the lanes' links are resolved
//! again, so records a tail split moved into the children are read there.

use std::collections::{BTreeMap, VecDeque};

use super::translate_tails;
use crate::config::HotKeyMode;
use crate::error::{Error, Result};
use crate::format::manifest::HotKeyEra;
use crate::partition::Partition;
use crate::read::ReadBatch;
use crate::topic::hot_keys::{lane_of_window, window_ms, window_of, KeyLink, KeyRecord};
use crate::topic::Topic;
use crate::topology::lineage::Lineage;

/// Bytes read from a partition at a time by one lane.
const READ_BYTES: usize = 256 << 10;

/// An iterator over the records of one key in per-key order (see
/// [`Topic::key_reader`]). Holds one read buffer per lane of the era being
/// read, never the key's whole history.
#[derive(Debug)]
pub struct KeyReader {
    topic: Topic,
    key: Vec<u8>,
    eras: Vec<HotKeyEra>,
    era: usize,
    lanes: Option<Vec<LaneCursor>>,
    /// Each partition's visible end when the reader was made (taken before
    /// the eras): nothing at or above it is read, and a partition made
    /// later is not read at all, except the children of a tail split made
    /// since, which hold the parent's records past its new end: their
    /// bounds are the parent's, translated. `None`: no bound (the caller
    /// holds the key's lock, so no era can begin meanwhile).
    ends: Option<BTreeMap<u32, u64>>,
    /// The topology generation `ends` and the lanes' links are resolved
    /// at. A link is left behind only at this generation: a read that stops
    /// at a partition's end may have met a tail split's cut, which moves
    /// the generation (see [`KeyReader::fill`]).
    generation: u64,
}

/// One lane of the era being read: its links, where it is, what it read.
#[derive(Debug)]
struct LaneCursor {
    lane: usize,
    links: VecDeque<KeyLink>,
    /// The partition the lane read last (the front link's, or once the
    /// links ran out the last one's) and the next offset to read there.
    /// `None` before the first read.
    at: Option<(u32, u64)>,
    buf: VecDeque<KeyRecord>,
}

impl Topic {
    /// Reads every record of `key` still held, in per-key order: era by
    /// era, and in a windowed era window by window, each window from its
    /// one lane (the lanes are merged by window: a lane's windows only
    /// increase along its chain). A spread era's records come lane by lane
    /// (that mode promises no order). It reads the records visible when it
    /// is made, with the eras of that moment; records appended afterwards
    /// are not returned (after a mode change they would belong to an era
    /// the reader does not know, and read as the older one's). Splits,
    /// merges and tail splits made while it reads change none of this: the
    /// records a tail split moves are read in the children, once.
    pub fn key_reader(&self, key: &[u8]) -> KeyReader {
        // The ends first, then the eras. A mode change installs its era
        // before the key's first append in it (both under the key's lock),
        // so a record below an end taken here belongs to an era read below.
        // The ends and the generation under one read of the state: a tail
        // split committed meanwhile is either in both (the parent cut at
        // its new end, the children listed) or in neither (the parent's
        // end counts the moved records, translated once the reader sees
        // the generation move).
        let (generation, ends) = self.inner.visible_ends();
        KeyReader {
            topic: self.clone(),
            key: key.to_vec(),
            eras: self.all_eras(self.hash(key)),
            era: 0,
            lanes: None,
            ends: Some(ends),
            generation,
        }
    }

    /// A reader of `key` over `eras` (as [`Topic::all_eras`] gives them),
    /// from era `from` on. Takes no key lock.
    pub(crate) fn key_reader_of(&self, key: &[u8], eras: Vec<HotKeyEra>, from: usize) -> KeyReader {
        KeyReader {
            topic: self.clone(),
            key: key.to_vec(),
            eras,
            era: from,
            lanes: None,
            ends: None,
            generation: self.topology_generation(),
        }
    }

    /// Every record of `key` still held, in per-key order: the
    /// [`Topic::key_reader`] collected.
    pub fn read_key(&self, key: &[u8]) -> Result<Vec<KeyRecord>> {
        self.key_reader(key).collect()
    }
}

impl KeyReader {
    /// The lane cursors of the current era. A spread era reads a partition
    /// shared by several lanes once, for the first of them (its links list
    /// it once).
    fn open_era(&self) -> Vec<LaneCursor> {
        let era = &self.eras[self.era];
        let links = self.topic.era_links(&self.eras, self.era);
        (0..era.lanes.len())
            .map(|j| LaneCursor {
                lane: j,
                links: links.iter().filter(|l| l.lane == j).copied().collect(),
                at: None,
                buf: VecDeque::new(),
            })
            .collect()
    }

    /// Brings the bounds and the current era's lanes to the topology
    /// generation in force: through every tail split committed since, the
    /// bounds of its parent are carried to its children and the lanes'
    /// positions past its new end move to the child on their chain; the
    /// links are those of the topology now. Positions and bounds name
    /// records, not a generation, so going over them again is harmless:
    /// repeated until the generation holds still across the pass.
    fn refresh(&mut self) {
        while self.topic.topology_generation() != self.generation {
            let lineage = self.topic.lineage();
            if let Some(ends) = self.ends.as_mut() {
                let mut moved = ends.clone();
                let left = translate_tails(&lineage, &mut moved, &mut BTreeMap::new());
                // A parent keeps its own bound (its reads stop at its new
                // end); a child known at creation keeps its own too.
                for (id, end) in moved {
                    ends.entry(id).or_insert(end);
                }
                // A child tail-split in turn past its translated bound
                // held all it holds below its new end at creation.
                for id in left {
                    if let Some(t) = lineage.tails.get(&id) {
                        ends.entry(id).or_insert(t.index.from);
                    }
                }
            }
            if let Some(lanes) = self.lanes.as_mut() {
                let links = self.topic.era_links(&self.eras, self.era);
                for c in lanes.iter_mut() {
                    c.resolve(&lineage, &links);
                }
            }
            self.generation = lineage.generation;
        }
    }

    /// Fills `c`'s buffer with at least one record unless the lane is done.
    /// Returns `false`, leaving the lane where it is, when the topology
    /// moved under it ([`KeyReader::refresh`] first, then again).
    fn fill(&self, c: &mut LaneCursor) -> Result<bool> {
        let moved = || self.topic.topology_generation() != self.generation;
        while c.buf.is_empty() {
            let Some(link) = c.links.front().copied() else {
                return Ok(true);
            };
            let part = match self.topic.partition(link.partition) {
                Ok(p) => p,
                // Retention removed it since the links were resolved (a
                // removal moves the generation): go on after it.
                Err(Error::UnknownPartition { .. }) if moved() => return Ok(false),
                Err(e) => return Err(e),
            };
            let end = self.link_end(&link, &part);
            let held = c.at.filter(|a| a.0 == link.partition).map_or(0, |a| a.1);
            let off = held.max(link.from_offset).max(part.start_offset());
            if off >= end {
                // The end may be a tail split's new end, loaded after the
                // split moved the generation (`set_logical_end`): the moved
                // records are then read in the children, which the links
                // and bounds of this generation do not know yet.
                if moved() {
                    return Ok(false);
                }
                c.links.pop_front();
                c.at = Some((link.partition, off));
                continue;
            }
            match part.read(off, READ_BYTES) {
                Ok(b) => {
                    self.buffer_lane_records(c, link.partition, &b, end);
                    // Not past `end`: records read beyond it are not the
                    // lane's here (another era's, appended after the
                    // reader was made or after `end` was loaded), and a
                    // tail split from an era boundary must not carry the
                    // position into children the era does not reach.
                    c.at = Some((link.partition, b.next_offset().min(end)));
                }
                Err(Error::Hole { end: next, .. }) | Err(Error::Retained { end: next, .. }) => {
                    c.at = Some((link.partition, next))
                }
                // Cut by a tail split since the end was loaded.
                Err(Error::OffsetOutOfRange { .. }) if moved() => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Where lane reading of `link` in `part` stops: the visible end, the
    /// link's own end and the reader's bound for the partition, whichever
    /// comes first.
    fn link_end(&self, link: &KeyLink, part: &Partition) -> u64 {
        let bound = self
            .ends
            .as_ref()
            .map_or(u64::MAX, |e| e.get(&link.partition).copied().unwrap_or(0));
        part.visible_end(part.default_isolation())
            .min(link.until_offset.unwrap_or(u64::MAX))
            .min(bound)
    }

    /// Buffers in `c` the records of `b` below `end` that are the reader's
    /// key in `c`'s lane.
    fn buffer_lane_records(&self, c: &mut LaneCursor, partition: u32, b: &ReadBatch, end: u64) {
        let era = &self.eras[self.era];
        for r in b.iter().take_while(|r| r.offset < end) {
            if r.key != Some(&self.key[..]) {
                continue;
            }
            let window = window_ms(era).map(|w| window_of(r.timestamp, w));
            if window.is_some_and(|w| lane_of_window(era, w) != c.lane) {
                continue; // another lane's window, read there
            }
            c.buf.push_back(KeyRecord {
                partition,
                offset: r.offset,
                timestamp: r.timestamp,
                value: r.value.to_vec(),
                era: self.era,
                lane: c.lane,
                window,
            });
        }
    }

    fn next_record(&mut self) -> Result<Option<KeyRecord>> {
        loop {
            self.refresh();
            if self.era >= self.eras.len() {
                return Ok(None);
            }
            let mut lanes = match self.lanes.take() {
                Some(l) => l,
                None => self.open_era(),
            };
            let mut current = self.topic.topology_generation() == self.generation;
            for c in lanes.iter_mut() {
                if !current {
                    break;
                }
                current = self.fill(c)?;
            }
            if !current {
                self.lanes = Some(lanes);
                continue;
            }
            // Strict and spread: lane order. Windowed: the lowest window
            // (one window lives in one lane, so there is no tie).
            let pick = lanes
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.buf.front().map(|r| (r.window.unwrap_or(0), i)))
                .min()
                .map(|(_, i)| i);
            let pick = match self.eras[self.era].mode {
                HotKeyMode::Windowed(_) => pick,
                _ => lanes.iter().position(|c| !c.buf.is_empty()),
            };
            match pick {
                Some(i) => {
                    let r = lanes[i].buf.pop_front();
                    self.lanes = Some(lanes);
                    return Ok(r);
                }
                None => self.era += 1,
            }
        }
    }
}

impl LaneCursor {
    /// Takes the lane's links of the topology now (`links`: the era's, of
    /// every lane) from where the lane is on: its partition, or, when a
    /// tail split in `lineage` moved the records at its position on, the
    /// child holding the lane's from there, at the translated offset.
    fn resolve(&mut self, lineage: &Lineage, links: &[KeyLink]) {
        let mine: Vec<KeyLink> = links
            .iter()
            .filter(|l| l.lane == self.lane)
            .copied()
            .collect();
        let Some((id, offset)) = self.at else {
            self.links = mine.into();
            return;
        };
        let mut at = BTreeMap::from([(id, offset)]);
        translate_tails(lineage, &mut at, &mut BTreeMap::new());
        // One child of each split covers the lane's hash point: the one on
        // its chain. (The lane's records went there: a tail split moves
        // records by key hash, and refuses partitions holding lane points
        // other than a key's own hash.)
        match mine.iter().position(|l| at.contains_key(&l.partition)) {
            Some(i) => {
                let p = mine[i].partition;
                self.at = Some((p, at[&p]));
                self.links = mine[i..].iter().copied().collect();
            }
            // Retention removed the partition (and every one before it on
            // the chain): what is left of the lane comes after it.
            None if !lineage.contains(id) => {
                self.at = None;
                self.links = mine.into();
            }
            // Still there but off the lane's links: the lane is done.
            None => self.links.clear(),
        }
    }
}

impl Iterator for KeyReader {
    type Item = Result<KeyRecord>;

    fn next(&mut self) -> Option<Result<KeyRecord>> {
        match self.next_record() {
            Ok(r) => r.map(Ok),
            Err(e) => {
                self.era = self.eras.len(); // fused after an error
                Some(Err(e))
            }
        }
    }
}
