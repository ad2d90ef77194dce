//! Reading one key back in per-key order, streaming: era by era, and in a
//! windowed era window by window, merging the key's lanes (docs/HOT_KEYS.md).

use std::collections::{HashMap, VecDeque};

use crate::config::HotKeyMode;
use crate::error::{Error, Result};
use crate::format::manifest::HotKeyEra;
use crate::hot_keys::{lane_of_window, window_ms, window_of, KeyLink, KeyRecord};
use crate::topic::Topic;

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
    /// later is not read at all. `None`: no bound (the caller holds the
    /// key's lock, so no era can begin meanwhile).
    ends: Option<HashMap<u32, u64>>,
}

/// One lane of the era being read: its links, where it is, what it read.
#[derive(Debug)]
struct LaneCursor {
    lane: usize,
    links: VecDeque<KeyLink>,
    offset: u64,
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
    /// the reader does not know, and read as the older one's).
    pub fn key_reader(&self, key: &[u8]) -> KeyReader {
        // The ends first, then the eras. A mode change installs its era
        // before the key's first append in it (both under the key's lock),
        // so a record below an end taken here belongs to an era read below.
        let ends: HashMap<u32, u64> = self
            .all_partition_handles()
            .iter()
            .map(|p| (p.id(), p.visible_end(p.default_isolation())))
            .collect();
        KeyReader {
            topic: self.clone(),
            key: key.to_vec(),
            eras: self.all_eras(self.hash(key)),
            era: 0,
            lanes: None,
            ends: Some(ends),
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
                offset: 0,
                buf: VecDeque::new(),
            })
            .collect()
    }

    /// Fills `c`'s buffer with at least one record unless the lane is done.
    fn fill(&self, c: &mut LaneCursor) -> Result<()> {
        let era = &self.eras[self.era];
        while c.buf.is_empty() {
            let Some(link) = c.links.front().copied() else {
                return Ok(());
            };
            let part = self.topic.partition(link.partition)?;
            let bound = self
                .ends
                .as_ref()
                .map_or(u64::MAX, |e| e.get(&link.partition).copied().unwrap_or(0));
            let end = part
                .visible_end(part.default_isolation())
                .min(link.until_offset.unwrap_or(u64::MAX))
                .min(bound);
            let off = c.offset.max(link.from_offset).max(part.start_offset());
            if off >= end {
                c.links.pop_front();
                c.offset = 0;
                continue;
            }
            match part.read(off, READ_BYTES) {
                Ok(b) => {
                    for r in b.iter().take_while(|r| r.offset < end) {
                        if r.key != Some(&self.key[..]) {
                            continue;
                        }
                        let window = window_ms(era).map(|w| window_of(r.timestamp, w));
                        if window.is_some_and(|w| lane_of_window(era, w) != c.lane) {
                            continue; // another lane's window, read there
                        }
                        c.buf.push_back(KeyRecord {
                            partition: link.partition,
                            offset: r.offset,
                            timestamp: r.timestamp,
                            value: r.value.to_vec(),
                            era: self.era,
                            lane: c.lane,
                            window,
                        });
                    }
                    c.offset = b.next_offset();
                }
                Err(Error::Hole { end: next, .. }) | Err(Error::Retained { end: next, .. }) => {
                    c.offset = next
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn next_record(&mut self) -> Result<Option<KeyRecord>> {
        while self.era < self.eras.len() {
            let mut lanes = match self.lanes.take() {
                Some(l) => l,
                None => self.open_era(),
            };
            for c in lanes.iter_mut() {
                self.fill(c)?;
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
                None => {
                    self.era += 1;
                }
            }
        }
        Ok(None)
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
