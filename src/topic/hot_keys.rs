//! Hot-key modes: a key hotter than one partition spread over several lanes
//! (`Windowed`: by time window, in order within each window; `Spread`:
//! round-robin, unordered), with the eras that make the spreading durable
//! and a reader that gives back full per-key order. Design and reasoning:
//! docs/HOT_KEYS.md.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use serde::Serialize;

use crate::config::HotKeyMode;
use crate::error::Result;
use crate::format::manifest::{HotKeyEra, HotKeyRecord, ManifestRecord};
use crate::partition::{now_ms, Partition};
use crate::topic::{ChainLink, Topic};
use crate::topology::command::TopologyCommand;
use crate::topology::hot_keys::{duration_ms, lane_after};
pub(crate) use crate::topology::hot_keys::{lane_of_window, lane_points, window_ms, window_of};

/// The hot keys of one topic, in memory.
#[derive(Debug, Default)]
pub(crate) struct HotKeys {
    /// Moves with every mode change; appends routed as non-hot check it
    /// under the partition's writer lock (`Partition::append_fenced`).
    pub(crate) fence: AtomicU64,
    /// Whether any key has a mode: appends skip the map lookup otherwise.
    any: AtomicBool,
    map: RwLock<HashMap<u64, Arc<HotKeyState>>>,
}

/// One key with a mode. Its appends (and mode changes) hold `run`, so they
/// are routed and written one at a time: a window's records land in their
/// lane in the order their timestamps were given out.
#[derive(Debug)]
pub(crate) struct HotKeyState {
    pub(crate) run: Mutex<KeyRun>,
}

#[derive(Debug)]
pub(crate) struct KeyRun {
    pub(crate) hash: u64,
    /// Every era, oldest first (the last is in force).
    pub(crate) eras: Vec<HotKeyEra>,
    /// Windowed: the newest timestamp given to a record of the key. `None`
    /// after an open until the first append recomputes it from the data.
    pub(crate) high_ms: Option<i64>,
    /// Spread: the next lane.
    pub(crate) next_lane: u64,
}

impl KeyRun {
    /// Whether the era in force is windowed.
    pub(crate) fn windowed(&self) -> bool {
        self.eras
            .last()
            .is_some_and(|e| matches!(e.mode, HotKeyMode::Windowed(_)))
    }
}

/// The write round of a windowed key's record in one routing pass of
/// `Topic::append_batch`, given where it goes (`at`: partition and group
/// origin) and, in `runs`, each windowed key seen so far in the pass with
/// where its previous record went and that record's round. Records are
/// passed in input order. A key's records stay in their predecessor's
/// round while they go to the same place, and move to the next round when
/// they go elsewhere, so each key has at most one group per round and
/// writing the groups round by round writes every windowed key's records
/// in input order (docs/HOT_KEYS.md, "Batches of a windowed key").
/// `runs` is empty unless the batch holds a windowed key.
pub(crate) fn batch_round(
    runs: &mut Vec<(u64, (u32, usize), u32)>,
    key: u64,
    at: (u32, usize),
) -> u32 {
    match runs.iter_mut().find(|r| r.0 == key) {
        Some(r) => {
            if r.1 != at {
                r.1 = at;
                r.2 += 1;
            }
            r.2
        }
        None => {
            runs.push((key, at, 0));
            0
        }
    }
}

impl HotKeys {
    /// The hot keys named by a topic's manifest record.
    pub(crate) fn from_records(records: &[HotKeyRecord]) -> HotKeys {
        let map: HashMap<u64, Arc<HotKeyState>> = records
            .iter()
            .map(|r| {
                let st = HotKeyState {
                    run: Mutex::new(KeyRun {
                        hash: r.hash,
                        eras: r.eras.clone(),
                        high_ms: None,
                        next_lane: 0,
                    }),
                };
                (r.hash, Arc::new(st))
            })
            .collect();
        HotKeys {
            fence: AtomicU64::new(0),
            any: AtomicBool::new(!map.is_empty()),
            map: RwLock::new(map),
        }
    }

    /// The state of `hash` if it has a mode. One atomic load when no key
    /// of the topic has one.
    pub(crate) fn get(&self, hash: u64) -> Option<Arc<HotKeyState>> {
        if !self.any.load(Ordering::SeqCst) {
            return None;
        }
        self.map.read().get(&hash).cloned()
    }

    /// Whether any key of the topic has a mode.
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::SeqCst)
    }

    /// Whether a tail split of `partition` (owning hashes `start..=end`)
    /// from offset `from` would move records some key's eras place by lane
    /// point (a lane point other than the key's own hash in the range) or
    /// bound by an offset of the partition past `from`. Called under the
    /// topic's change lock, which mode changes take too.
    pub(crate) fn blocks_tail_split(
        &self,
        partition: u32,
        (start, end): (u64, u64),
        from: u64,
    ) -> bool {
        self.map.read().values().any(|s| {
            s.run.lock().eras.iter().any(|e| {
                e.lanes.iter().skip(1).any(|&p| (start..=end).contains(&p))
                    || e.starts
                        .iter()
                        .any(|&(q, off)| q == partition && off > from)
            })
        })
    }
}

/// A key (by routing hash) given a hot-key mode, as [`Topic::hot_keys`]
/// reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HotKey {
    /// The key's routing hash.
    pub hash: u64,
    /// The mode in force.
    pub mode: HotKeyMode,
    /// Its number of lanes.
    pub lanes: usize,
}

/// One era of a key as [`Topic::key_lanes`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyEra {
    /// The mode of the era (the first era of every key is `Strict`).
    pub mode: HotKeyMode,
    /// Windowed: the first window (timestamp / window length in ms); window
    /// `w` went to lane `(w - first_window) mod lanes`.
    pub first_window: Option<i64>,
    /// Where the era began, per partition that owned one of its lane
    /// points (or the previous era's) then: offsets below belong to earlier
    /// eras. Empty for the first era.
    pub starts: Vec<(u32, u64)>,
    /// The lanes, in lane order.
    pub lanes: Vec<KeyLane>,
}

impl KeyEra {
    /// Windowed eras: the window of a record timestamp.
    pub fn window_of(&self, timestamp: i64) -> Option<i64> {
        match self.mode {
            // The conversion routing uses (a cast would cut a window
            // longer than `i64::MAX` ms to its low bits).
            HotKeyMode::Windowed(d) => Some(timestamp.div_euclid(duration_ms(d))),
            _ => None,
        }
    }

    /// Windowed eras: the lane of window `w`.
    pub fn lane_of_window(&self, w: i64) -> Option<usize> {
        let first = self.first_window?;
        Some(lane_after(w, first, self.lanes.len()))
    }
}

/// One lane of a key's era.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyLane {
    /// The lane's hash point (lane 0 is the key's own hash).
    pub hash: u64,
    /// The partitions that held the lane point, oldest first
    /// ([`Topic::hash_chain`] of `hash`); read them in this order.
    pub chain: Vec<ChainLink>,
}

/// A key's routing: its mode now and every era it went through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyLanes {
    /// The key's routing hash.
    pub hash: u64,
    /// The mode in force.
    pub mode: HotKeyMode,
    /// Eras, oldest first: the key's records of one era all precede those
    /// of the next.
    pub eras: Vec<KeyEra>,
}

/// One link of a key's chain ([`Topic::key_chain`]): a partition that
/// held, or holds, the key's records of one era and lane, with the offsets
/// bounding that era in it. A key never given a mode has one era (0,
/// `Strict`, one lane) whose links are its hash's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KeyLink {
    /// Partition id.
    pub partition: u32,
    /// End offset when sealed; None for the active partition at the end.
    pub sealed_at: Option<u64>,
    /// The era (index in [`KeyLanes::eras`]; 0 is before any mode).
    pub era: usize,
    /// The era's mode.
    pub mode: HotKeyMode,
    /// The lane this link belongs to. In a spread era a partition on
    /// several lanes' chains (after a merge of lane owners) is listed once,
    /// for the first of them: its records are read once.
    pub lane: usize,
    /// The era's number of lanes.
    pub lanes: usize,
    /// Windowed: the era's first window; window `w` is in lane
    /// `(w - first_window) mod lanes`, so a link of lane `j` holds only
    /// those windows (the partition may hold other lanes' too).
    pub first_window: Option<i64>,
    /// The era's records start at this offset here (0: from the start).
    pub from_offset: u64,
    /// The next era starts at this offset here (None: the era runs to the
    /// seal, or on for the active partition).
    pub until_offset: Option<u64>,
}

/// A record of one key, as [`Topic::read_key`] returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyRecord {
    /// Partition holding it.
    pub partition: u32,
    /// Its offset there.
    pub offset: u64,
    /// Timestamp (for windowed eras, the one the window was chosen by).
    pub timestamp: i64,
    /// Payload.
    pub value: Vec<u8>,
    /// Index of its era in [`KeyLanes::eras`].
    pub era: usize,
    /// Its lane in the era. Exact for strict and windowed eras; a spread
    /// record in a partition several lanes share (after a merge) carries
    /// the first of them (spread records do not name their lane).
    pub lane: usize,
    /// Its window, in a windowed era.
    pub window: Option<i64>,
}

impl Topic {
    /// The hot-key mode of `key` (`Strict` unless set).
    pub fn hot_key_mode(&self, key: &[u8]) -> HotKeyMode {
        self.hash_mode(self.hash(key))
    }

    fn hash_mode(&self, hash: u64) -> HotKeyMode {
        self.inner.hot.get(hash).map_or(HotKeyMode::Strict, |s| {
            s.run
                .lock()
                .eras
                .last()
                .map_or(HotKeyMode::Strict, |e| e.mode)
        })
    }

    /// The keys (by routing hash) given a mode, with the mode in force and
    /// its number of lanes.
    pub fn hot_keys(&self) -> Vec<HotKey> {
        let states: Vec<Arc<HotKeyState>> = self.inner.hot.map.read().values().cloned().collect();
        let mut out: Vec<HotKey> = states
            .iter()
            .filter_map(|s| {
                let run = s.run.lock();
                run.eras.last().map(|e| HotKey {
                    hash: run.hash,
                    mode: e.mode,
                    lanes: e.lanes.len(),
                })
            })
            .collect();
        out.sort_unstable_by_key(|k| k.hash);
        out
    }

    /// Whether `hash` is a lane point of some key's era in force.
    pub(crate) fn is_lane_point(&self, hash: u64) -> bool {
        let states: Vec<Arc<HotKeyState>> = self.inner.hot.map.read().values().cloned().collect();
        states.iter().any(|s| {
            s.run
                .lock()
                .eras
                .last()
                .is_some_and(|e| e.lanes.contains(&hash))
        })
    }

    /// Sets the hot-key mode of `key` over the topic's `max_lanes` lanes
    /// (`Strict` takes one). See [`Topic::set_hot_key_mode_lanes`].
    pub fn set_hot_key_mode(&self, key: &[u8], mode: HotKeyMode) -> Result<()> {
        let lanes = self.config().hot_keys.max_lanes;
        self.set_hash_mode(self.hash(key), mode, lanes)
    }

    /// Sets the hot-key mode of `key` over `lanes` lanes. The change is one
    /// durable manifest record; from its commit on, the key's appends
    /// follow the new mode, and every earlier record stays readable in
    /// order before them ([`Topic::read_key`]). Setting the mode in force
    /// again (same lanes) changes nothing.
    ///
    /// Refused with [`Error::HotKeyMode`], changing nothing, when the
    /// topic's [`crate::HotKeyPolicy`] does not allow the mode, `lanes` is 0
    /// or above `max_lanes`, or a window is shorter than 1 ms.
    pub fn set_hot_key_mode_lanes(&self, key: &[u8], mode: HotKeyMode, lanes: u32) -> Result<()> {
        self.set_hash_mode(self.hash(key), mode, lanes)
    }

    /// [`Topic::set_hot_key_mode_lanes`] by routing hash.
    pub(crate) fn set_hash_mode(&self, hash: u64, mode: HotKeyMode, lanes: u32) -> Result<()> {
        self.apply(TopologyCommand::SetHotKeyMode { hash, mode, lanes })
            .map(|_| ())
    }

    /// Commits a validated hot-key mode over `lanes` lanes (checked against
    /// the policy). Under the change lock: no split or merge meanwhile, so
    /// the lane owners read below stay the owners until the record commits.
    pub(super) fn set_hash_mode_locked(
        &self,
        hash: u64,
        mode: HotKeyMode,
        lanes: u32,
    ) -> Result<()> {
        let points = lane_points(hash, lanes);
        let Some((state, fresh)) = self.key_state_for_mode(hash, mode) else {
            return Ok(()); // never set: strict already
        };
        let mut run = state.run.lock();
        let prev: Vec<u64> = run.eras.last().map_or(vec![hash], |e| e.lanes.clone());
        if run
            .eras
            .last()
            .is_some_and(|e| e.mode == mode && e.lanes == points)
        {
            return Ok(());
        }
        let hot = &self.inner.hot;
        if fresh {
            hot.map.write().insert(hash, state.clone());
            hot.any.store(true, Ordering::SeqCst);
        }
        // Published (map, then fence): an append that loads the new fence
        // finds the key in the map and waits for `run`; one routed under
        // the old fence is refused below the barrier, or landed before it.
        hot.fence.fetch_add(1, Ordering::SeqCst);
        let owners = self.lane_owners(&prev, &points);
        let starts = era_starts(&owners);
        // The record names these offsets, so they must be durable before
        // it: a power loss that cut a lane owner below its start would
        // hand offsets the record gives to the earlier era to records of
        // this one. (The key's appends wait on `run`: nothing of it moves.)
        let parts: Vec<&Partition> = owners.iter().map(|(_, p)| &**p).collect();
        if let Err(e) = self.inner.core.sync_covering(&parts) {
            if fresh {
                self.forget_hot_key(hash);
            }
            return Err(e);
        }
        let era = HotKeyEra {
            mode,
            lanes: points,
            // The rotation's anchor only: records keep their own timestamps.
            from_ms: now_ms(),
            starts,
        };
        match self.commit_era(hash, &era) {
            Ok(()) => {
                run.eras.push(era);
                run.high_ms = Some(i64::MIN); // no record in the new era yet
                run.next_lane = 0;
                Ok(())
            }
            Err(e) => {
                if fresh {
                    self.forget_hot_key(hash);
                }
                Err(e)
            }
        }
    }

    /// The state of `hash` to give `mode`, and whether it is new (not in
    /// the map yet); `None` for `Strict` on a key never given a mode.
    fn key_state_for_mode(&self, hash: u64, mode: HotKeyMode) -> Option<(Arc<HotKeyState>, bool)> {
        if let Some(s) = self.inner.hot.get(hash) {
            return Some((s, false));
        }
        if mode == HotKeyMode::Strict {
            return None;
        }
        let s = Arc::new(HotKeyState {
            run: Mutex::new(KeyRun {
                hash,
                eras: Vec::new(),
                high_ms: None,
                next_lane: 0,
            }),
        });
        Some((s, true))
    }

    /// The partitions owning the lane points of the era in force (`prev`)
    /// and of the new one, each once, by id.
    fn lane_owners(&self, prev: &[u64], points: &[u64]) -> Vec<(u32, Arc<Partition>)> {
        let st = self.inner.state.read();
        let mut ids: Vec<u32> = prev.iter().chain(points).map(|&x| st.owner_of(x)).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| (id, st.nodes[&id].part.clone()))
            .collect()
    }

    /// Takes a key given a mode by a change that failed back out of the
    /// map.
    fn forget_hot_key(&self, hash: u64) {
        let hot = &self.inner.hot;
        hot.map.write().remove(&hash);
        hot.any.store(!hot.map.read().is_empty(), Ordering::SeqCst);
    }

    /// Commits the key's new era: one durable manifest record.
    fn commit_era(&self, hash: u64, era: &HotKeyEra) -> Result<()> {
        let core = &self.inner.core;
        let mut topo = core.topology.lock();
        core.commit(
            &mut topo,
            ManifestRecord::HotKeyMode {
                topic_id: self.inner.id,
                hash,
                era: era.clone(),
            },
        )
    }

    /// Routes one record of a key with a mode: the hash point whose owner
    /// takes it, and the timestamp it is written with (windowed: raised to
    /// the key's newest, so windows only move forward whatever the clock
    /// or the caller's timestamps do).
    pub(crate) fn hot_route(&self, run: &mut KeyRun, key: &[u8], ts: i64) -> (u64, i64) {
        let Some(era) = run.eras.last() else {
            return (run.hash, ts);
        };
        match era.mode {
            HotKeyMode::Strict => (era.lanes[0], ts),
            HotKeyMode::Spread => {
                let j = (run.next_lane % era.lanes.len() as u64) as usize;
                run.next_lane = run.next_lane.wrapping_add(1);
                (era.lanes[j], ts)
            }
            HotKeyMode::Windowed(_) => {
                let high = match run.high_ms {
                    Some(h) => h,
                    None => self.recovered_high_ms(key, &run.eras),
                };
                let ts = ts.max(high);
                run.high_ms = Some(ts);
                let wm = window_ms(era).expect("windowed");
                let lane = lane_of_window(era, window_of(ts, wm));
                (era.lanes[lane], ts)
            }
        }
    }

    /// After an open, the newest timestamp the key's records of its era in
    /// force carry (`i64::MIN` if none): read back from its lanes once, so
    /// windows stay monotone even if the clock went back across the
    /// restart. `era` counts the recorded eras (the implicit strict one
    /// comes first in [`Topic::read_key`]'s numbering).
    fn recovered_high_ms(&self, key: &[u8], recorded: &[HotKeyEra]) -> i64 {
        let eras = with_first_era(self.hash(key), recorded);
        let last = eras.len() - 1;
        // Best effort: a read error here leaves the bound at what was
        // read; the append itself reports I/O trouble.
        self.key_reader_of(key, eras, last)
            .map_while(|r| r.ok())
            .map(|r| r.timestamp)
            .max()
            .unwrap_or(i64::MIN)
    }

    /// The lanes and windows of `key`: its mode, and per era the lanes with
    /// the partitions each went through. What a reader needs to read the
    /// key's records in order (as [`Topic::read_key`] does). A key never
    /// given a mode has one strict era whose one lane is
    /// [`Topic::key_chain`].
    pub fn key_lanes(&self, key: &[u8]) -> KeyLanes {
        let hash = self.hash(key);
        let eras = self.all_eras(hash);
        KeyLanes {
            hash,
            mode: eras.last().map_or(HotKeyMode::Strict, |e| e.mode),
            eras: eras
                .iter()
                .map(|e| KeyEra {
                    mode: e.mode,
                    first_window: window_ms(e).map(|w| window_of(e.from_ms, w)),
                    starts: e.starts.clone(),
                    lanes: e
                        .lanes
                        .iter()
                        .map(|&x| KeyLane {
                            hash: x,
                            chain: self.hash_chain(x),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// Every era of `hash`, the implicit strict one first.
    pub(crate) fn all_eras(&self, hash: u64) -> Vec<HotKeyEra> {
        match self.inner.hot.get(hash) {
            Some(s) => with_first_era(hash, &s.run.lock().eras),
            None => with_first_era(hash, &[]),
        }
    }

    /// The links of era `e` of `eras`: per lane, the partitions of the lane
    /// point's chain that hold the era, with the offsets bounding it.
    pub(crate) fn era_links(&self, eras: &[HotKeyEra], e: usize) -> Vec<KeyLink> {
        let era = &eras[e];
        let next = eras.get(e + 1);
        let mut out: Vec<KeyLink> = Vec::new();
        for (j, &x) in era.lanes.iter().enumerate() {
            let chain = self.hash_chain(x);
            let at = |starts: &[(u32, u64)]| {
                chain
                    .iter()
                    .position(|c| starts.iter().any(|s| s.0 == c.partition))
            };
            // Partitions before the era's start partition hold earlier
            // eras only; one not found was removed by retention.
            let first = if e == 0 {
                0
            } else {
                at(&era.starts).unwrap_or(0)
            };
            let (end_idx, bounded) = match next {
                None => (chain.len(), false),
                Some(n) => match at(&n.starts) {
                    Some(i) => (i + 1, true),
                    // Removed by retention, with all before it: what
                    // is left came after the next era began.
                    None => continue,
                },
            };
            for (ci, link) in chain.iter().enumerate().take(end_idx).skip(first) {
                // A spread record names no lane: a partition on several
                // lanes' chains (a merge of two lane owners) is listed
                // once, for the first of them, or its records would be
                // read once per lane.
                if era.mode == HotKeyMode::Spread
                    && out.iter().any(|l| l.partition == link.partition)
                {
                    continue;
                }
                let from_offset = if ci == first && e > 0 {
                    lookup(&era.starts, link.partition).unwrap_or(0)
                } else {
                    0
                };
                let until_offset = match next {
                    Some(n) if bounded && ci + 1 == end_idx => lookup(&n.starts, link.partition),
                    _ => None,
                };
                out.push(KeyLink {
                    partition: link.partition,
                    sealed_at: link.sealed_at,
                    era: e,
                    mode: era.mode,
                    lane: j,
                    lanes: era.lanes.len(),
                    first_window: window_ms(era).map(|w| window_of(era.from_ms, w)),
                    from_offset,
                    until_offset,
                });
            }
        }
        out
    }

    /// [`Topic::key_chain`]: every era's links, in era order.
    pub(crate) fn key_links(&self, key: &[u8]) -> Vec<KeyLink> {
        let eras = self.all_eras(self.hash(key));
        (0..eras.len())
            .flat_map(|e| self.era_links(&eras, e))
            .collect()
    }
}

/// The eras of a key with the implicit strict one (before any mode) first.
fn with_first_era(hash: u64, recorded: &[HotKeyEra]) -> Vec<HotKeyEra> {
    let mut eras = vec![HotKeyEra {
        mode: HotKeyMode::Strict,
        lanes: vec![hash],
        from_ms: i64::MIN,
        starts: Vec::new(),
    }];
    eras.extend(recorded.iter().cloned());
    eras
}

fn lookup(starts: &[(u32, u64)], partition: u32) -> Option<u64> {
    starts.iter().find(|s| s.0 == partition).map(|s| s.1)
}

/// Where the new era starts in each lane owner: its end, read under its
/// writer lock. That is the barrier: under each writer lock, no append
/// routed under the old fence is in flight any more.
fn era_starts(owners: &[(u32, Arc<Partition>)]) -> Vec<(u32, u64)> {
    owners
        .iter()
        .map(|(id, p)| (*id, p.with_writer(|_| p.end_offset())))
        .collect()
}
