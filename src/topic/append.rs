//! The append paths: one record, a batch, a hot key's lanes, one partition.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::MutexGuard;

use crate::error::{Error, Result};
use crate::format::batch::RecordIn;
use crate::partition::{now_ms, Partition};
use crate::topic::hot_keys::{batch_round, HotKeyState, KeyRun};

use super::{Appended, NewRecord, Topic};

impl Topic {
    /// Appends one record; returns where it landed.
    pub fn append(&self, key: Option<&[u8]>, value: &[u8]) -> Result<Appended> {
        // A closed or poisoned log is refused below, after the hot-key
        // lookup (and in `append_hot` under the key's lock), before any write.
        let hash = key.map(|k| self.hash(k));
        let record = [RecordIn {
            key,
            value,
            timestamp: now_ms(),
        }];
        let hashes = [hash];
        // Route and take the partition under one read of the state; an
        // append that raced a split's seal (or a hot-key mode change) is
        // routed again (to the child, or by the key's new mode).
        for _ in 0..1000 {
            let fence = self.inner.hot.fence.load(Ordering::SeqCst);
            if let Some(st) = hash.and_then(|h| self.inner.hot.get(h)) {
                return self.append_hot(&st, record[0]);
            }
            // Again after the lookup: a mode change whose commit failed
            // poisons the log before it takes a new key back out of the
            // map, and its record may still be on disk (the next open then
            // finds the era). An append routed by the old mode after that
            // would land above the era's start and be read as the new
            // era's.
            self.inner.core.check_open()?;
            let (partition, part) = {
                let st = self.inner.state.read();
                let pid = hash.map_or_else(|| self.next_keyless(&st), |h| st.owner(h));
                (pid, st.nodes[&pid].part.clone())
            };
            match part.append_fenced(&record, &hashes, Some((&self.inner.hot.fence, fence))) {
                Ok(offset) => {
                    self.after_append(&[&part])?;
                    return Ok(Appended { partition, offset });
                }
                Err(Error::Sealed { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Refused(
            "the partition kept being sealed under this append".into(),
        ))
    }

    /// Appends one record of a key with a hot-key mode, holding the key's
    /// lock from routing to the write.
    pub(super) fn append_hot(
        &self,
        st: &crate::topic::hot_keys::HotKeyState,
        rec: RecordIn<'_>,
    ) -> Result<Appended> {
        let mut run = st.run.lock();
        // A mode change that failed under this lock poisoned the log
        // first; its era may be on disk even so (see `append`).
        self.inner.core.check_open()?;
        let (point, ts) = self.hot_route(&mut run, rec.key.unwrap_or_default(), rec.timestamp);
        let record = [RecordIn {
            timestamp: ts,
            ..rec
        }];
        let hashes = [Some(point)];
        for _ in 0..1000 {
            let (partition, part) = {
                let st = self.inner.state.read();
                let pid = st.owner(point);
                (pid, st.nodes[&pid].part.clone())
            };
            match part.append(&record, &hashes) {
                Ok(offset) => {
                    drop(run);
                    self.after_append(&[&part])?;
                    return Ok(Appended { partition, offset });
                }
                Err(Error::Sealed { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Refused(
            "the partition kept being sealed under this append".into(),
        ))
    }

    /// Appends records, routed by key (keyless ones round-robin), one batch
    /// per partition; returns each record's position in input order.
    ///
    /// Atomic per partition, not across partitions. Every record and every
    /// partition's batch is checked (sizes, limits) before anything is
    /// written, so a refused batch writes nothing. Each partition's records
    /// are then written as one batch, whole or not at all. An I/O error (or
    /// a closed or poisoned partition) met after some partitions' batches
    /// were written returns [`Error::PartialBatch`], which names exactly the
    /// records that landed: retry only the others. Under
    /// `SyncPolicy::Always` they are synced before the error returns, as a
    /// successful batch's records are. A batch whose every record was
    /// written but whose sync failed in some of its partitions (poisoned)
    /// and not in others returns `PartialBatch` too, naming every record
    /// (its source, [`Error::Poisoned`], names the partition whose records
    /// may not be durable): appended again, the records of the partitions
    /// that did sync would be there twice.
    ///
    /// A key in `Windowed` mode whose records of the batch go to several
    /// lanes' partitions has them written lane after lane in input order
    /// (a partition's records then take several batches when the key comes
    /// back to it), and the writes stop at the first error: the key's
    /// records that landed are always its first ones in the batch, so
    /// appending the others again keeps the key's order
    /// (docs/HOT_KEYS.md, "Batches of a windowed key").
    pub fn append_batch(&self, records: &[NewRecord<'_>]) -> Result<Vec<Appended>> {
        // A closed or poisoned log is refused below, after the hot-key
        // lookup and under the keys' locks, before any write.
        let (mut hashes, mut ins) = self.batch_inputs(records);
        // The fence is read first: a key that gets a mode after it is
        // refused below.
        let mut fence = self.inner.hot.fence.load(Ordering::SeqCst);
        let hot_states = self.hot_states_of(&hashes);
        let mut hot = HotBatch::lock(&hot_states);
        // After the lookup and under the keys' locks: a mode change that
        // failed under one of these locks, or took a new key back out of
        // the map, poisoned the log first (see `append`).
        self.inner.core.check_open()?;
        self.route_hot_records(&mut hot, &mut hashes, &mut ins);
        let mut progress = BatchProgress::new(records.len());
        let mut pending: Vec<usize> = (0..records.len()).collect();
        let mut attempts = 0;
        while !pending.is_empty() {
            let groups = self.group_pending(&pending, &hashes, &ins, &hot, &progress.origin);
            if attempts == 0 {
                // Nothing is written until every group passed its checks.
                if let Err(e) = check_groups(&groups) {
                    hot.undo_routing();
                    return Err(e);
                }
                progress.note_origins(&groups);
            }
            let written = self.write_groups(groups, &hashes, &hot, fence, attempts, &mut progress);
            let retry = match written {
                Ok(retry) => retry,
                Err(e) => return Err(self.fail_batch(progress, e)),
            };
            fence = self.inner.hot.fence.load(Ordering::SeqCst);
            if let Err(e) = self.check_retry(&retry, &hashes, &hot) {
                return Err(self.fail_batch(progress, e));
            }
            pending = retry;
            attempts += 1;
        }
        drop(hot);
        self.finish_batch(progress)
    }

    /// A batch's records as the partitions take them, with each record's
    /// routing hash (`None`: keyless).
    fn batch_inputs<'r>(&self, records: &[NewRecord<'r>]) -> (Vec<Option<u64>>, Vec<RecordIn<'r>>) {
        let now = now_ms();
        let hashes = records
            .iter()
            .map(|r| r.key.map(|k| self.hash(k)))
            .collect();
        let ins = records
            .iter()
            .map(|r| RecordIn {
                key: r.key,
                value: r.value,
                timestamp: r.timestamp.unwrap_or(now),
            })
            .collect();
        (hashes, ins)
    }

    /// The states of the batch's keys that have a hot-key mode, in hash
    /// order (the order their locks are taken in). Empty (no allocation)
    /// when no key of the topic has one.
    fn hot_states_of(&self, hashes: &[Option<u64>]) -> Vec<Arc<HotKeyState>> {
        if !self.inner.hot.any() {
            return Vec::new();
        }
        let mut hs: Vec<u64> = hashes.iter().flatten().copied().collect();
        hs.sort_unstable();
        hs.dedup();
        hs.into_iter()
            .filter_map(|h| self.inner.hot.get(h))
            .collect()
    }

    /// Routes the records of keys with a mode to their lane points, in
    /// input order, under the keys' locks: each such record's hash becomes
    /// its lane point, and a windowed key's records take the timestamps
    /// their windows were chosen by.
    fn route_hot_records(
        &self,
        hot: &mut HotBatch<'_>,
        hashes: &mut [Option<u64>],
        ins: &mut [RecordIn<'_>],
    ) {
        if hot.guards.is_empty() {
            return;
        }
        let n = hashes.len();
        for i in 0..n {
            let Some(run) = hashes[i].and_then(|h| hot.guards.get_mut(&h)) else {
                continue;
            };
            if run.windowed() {
                hot.windowed.resize(n, None);
                hot.windowed[i] = Some(run.hash);
            }
            let (point, ts) = self.hot_route(run, ins[i].key.unwrap_or_default(), ins[i].timestamp);
            hashes[i] = Some(point);
            ins[i].timestamp = ts;
            hot.routed.resize(n, false);
            hot.routed[i] = true;
        }
    }

    /// The pending records in groups, one per (round, partition, origin),
    /// routed against one snapshot of the routing table: routed one by
    /// one, a split landing mid-batch could send a key's first record to
    /// the parent and its second to a child, and the parent's group
    /// (refused as sealed, then retried) would land after the child's:
    /// per-key order broken. The round is 0 but for a windowed key's
    /// records that went elsewhere than its previous one (`batch_round`).
    fn group_pending<'r>(
        &self,
        pending: &[usize],
        hashes: &[Option<u64>],
        ins: &[RecordIn<'r>],
        hot: &HotBatch<'_>,
        origin: &[usize],
    ) -> Vec<BatchGroup<'r>> {
        // Keyed (round, partition, origin): the write order.
        type Key = (u32, u32, usize);
        let mut groups: BTreeMap<Key, (Arc<Partition>, Vec<usize>)> = BTreeMap::new();
        {
            let st = self.inner.state.read();
            let keyless = self.next_keyless(&st);
            let mut runs = Vec::new();
            for &i in pending {
                let pid = hashes[i].map_or(keyless, |h| st.owner(h));
                let round = match hot.windowed_key(i) {
                    Some(k) => batch_round(&mut runs, k, (pid, origin[i])),
                    None => 0,
                };
                groups
                    .entry((round, pid, origin[i]))
                    .or_insert_with(|| (st.nodes[&pid].part.clone(), Vec::new()))
                    .1
                    .push(i);
            }
        }
        groups
            .into_iter()
            .map(|((round, partition, _), (part, idxs))| BatchGroup {
                round,
                partition,
                records: idxs.iter().map(|&i| ins[i]).collect(),
                part,
                idxs,
            })
            .collect()
    }

    /// Writes one pass of groups, round by round; returns the records to
    /// route again (their partition was sealed meanwhile), in input order.
    /// The first round with a group refused as sealed holds back the later
    /// rounds for the next pass, so a windowed key's later records never
    /// land before its earlier ones (nor do they after an error: the pass
    /// stops at the first).
    fn write_groups(
        &self,
        groups: Vec<BatchGroup<'_>>,
        hashes: &[Option<u64>],
        hot: &HotBatch<'_>,
        fence: u64,
        attempts: usize,
        progress: &mut BatchProgress,
    ) -> Result<Vec<usize>> {
        let mut retry = Vec::new();
        let mut sealed_round: Option<u32> = None;
        for g in groups {
            if sealed_round.is_some_and(|r| g.round > r) {
                retry.extend(g.idxs);
                continue;
            }
            progress.touched.push(g.part.clone());
            let hs: Vec<Option<u64>> = g.idxs.iter().map(|&i| hashes[i]).collect();
            // Groups of keys routed by mode are under their keys' locks;
            // the others are fenced against a mode change.
            let fenced = (!g.idxs.iter().all(|&i| hot.is_routed(i)))
                .then_some((&self.inner.hot.fence, fence));
            match g.part.append_fenced(&g.records, &hs, fenced) {
                Ok(base) => progress.landed_at(g.partition, base, &g.idxs),
                // Sealed between routing and appending: route again.
                Err(Error::Sealed { .. }) if attempts < 1000 => {
                    retry.extend(g.idxs);
                    sealed_round.get_or_insert(g.round);
                }
                Err(e) => return Err(e),
            }
        }
        retry.sort_unstable();
        Ok(retry)
    }

    /// Before a pass routes `retry` again: a key given a mode since the
    /// batch began cannot be routed by it now (its lock is taken in hash
    /// order, at the start), so the caller appends it again; and the log
    /// must still be open (after that lookup, see `append`: a failed mode
    /// change took its key back out of the map only after poisoning it).
    fn check_retry(
        &self,
        retry: &[usize],
        hashes: &[Option<u64>],
        hot: &HotBatch<'_>,
    ) -> Result<()> {
        if retry.iter().any(|&i| {
            !hot.is_routed(i) && hashes[i].is_some_and(|h| self.inner.hot.get(h).is_some())
        }) {
            return Err(Error::Refused(
                "a key of the batch changed hot-key mode during the append; append the records not landed again".into(),
            ));
        }
        if !retry.is_empty() {
            self.inner.core.check_open()?;
        }
        Ok(())
    }

    /// The error of a batch stopped by `e`: [`Error::PartialBatch`] once
    /// something was written, `e` itself before.
    fn fail_batch(&self, progress: BatchProgress, e: Error) -> Error {
        if progress.wrote_any {
            self.partial_batch(progress.landed, e, true)
        } else {
            e
        }
    }

    /// Every record of the batch landed: waits for the sync `Always` asks
    /// for, and returns the positions in input order.
    fn finish_batch(&self, progress: BatchProgress) -> Result<Vec<Appended>> {
        let out: Vec<Appended> = progress
            .landed
            .iter()
            .map(|l| l.expect("every record landed when nothing is pending"))
            .collect();
        let touched: Vec<&Partition> = progress.touched.iter().map(|p| &**p).collect();
        if let Err(e) = self.after_append(&touched) {
            // Every record was written. When the failed sync poisoned only
            // some of the partitions, the others' records are durable:
            // appended again, they would be there twice. Otherwise the
            // error alone, as for a single append.
            let durable_somewhere = out.iter().any(|a| {
                self.partition(a.partition)
                    .is_ok_and(|p| p.check_not_poisoned().is_ok())
            });
            if !durable_somewhere || !matches!(e, Error::Poisoned { .. }) {
                return Err(e);
            }
            return Err(self.partial_batch(progress.landed, e, false));
        }
        Ok(out)
    }

    /// The error of a batch that wrote the records `landed` names (some)
    /// and then met `e`: [`Error::PartialBatch`], whose landed records the
    /// caller does not append again. Under `SyncPolicy::Always` they are
    /// synced first (unless `sync` is false: the batch's own sync round
    /// failed), as a successful batch's are; a sync that fails poisons its
    /// partition (every later sync reports it), whose records stay named:
    /// they were written, and the partition refuses appends until the log
    /// is reopened.
    pub(super) fn partial_batch(
        &self,
        landed: Vec<Option<Appended>>,
        e: Error,
        sync: bool,
    ) -> Error {
        if sync && self.inner.sync_always {
            let _ = self.inner.core.sync_covering(&[]);
        }
        Error::PartialBatch {
            landed,
            source: Box::new(e),
        }
    }

    /// Appends records to one partition, bypassing routing; returns the
    /// first record's offset.
    ///
    /// A keyed record appended here opts out of per-key order (DESIGN C4):
    /// it sits wherever the caller put it, not in the partition that owns
    /// its key's hash, so a lineage-aware reader returns it in that
    /// partition's order, not in the key's, and the key readers
    /// ([`Topic::key_reader`], [`Topic::read_key`], [`Topic::key_chain`])
    /// do not look for it there. Use [`Topic::append`] or
    /// [`Topic::append_batch`] for records whose key order matters.
    pub fn append_to(&self, partition: u32, records: &[NewRecord<'_>]) -> Result<u64> {
        self.inner.core.check_open()?;
        let now = now_ms();
        let recs: Vec<RecordIn<'_>> = records
            .iter()
            .map(|r| RecordIn {
                key: r.key,
                value: r.value,
                timestamp: r.timestamp.unwrap_or(now),
            })
            .collect();
        let hs: Vec<Option<u64>> = records
            .iter()
            .map(|r| r.key.map(|k| self.hash(k)))
            .collect();
        let part = self.partition(partition)?;
        let base = part.append(&recs, &hs)?;
        self.after_append(&[&part])?;
        Ok(base)
    }

    /// Under `SyncPolicy::Always`, waits for a sync round covering the
    /// partitions just appended to (a poisoned partition elsewhere does not
    /// fail this append).
    pub(super) fn after_append(&self, parts: &[&Partition]) -> Result<()> {
        if self.inner.sync_always {
            self.inner.core.sync_covering(parts)?;
        }
        // The topic was deleted under a handle that lived on: the record
        // went into a removed file, and no round syncs it.
        if parts.iter().any(|p| p.is_removed()) {
            return Err(Error::UnknownTopic(self.inner.name.to_string()));
        }
        Ok(())
    }
}

/// The keys of a batch that have a hot-key mode, locked (in hash order)
/// for the whole batch, and how the batch's records were routed by them.
struct HotBatch<'s> {
    guards: BTreeMap<u64, MutexGuard<'s, KeyRun>>,
    /// Whether each record was routed by its key's mode. Empty (no
    /// allocation) when no key of the batch has a mode.
    routed: Vec<bool>,
    /// The key of each record of a windowed key (its records are written
    /// round by round, see `batch_round`). Empty (no allocation) when the
    /// batch has none.
    windowed: Vec<Option<u64>>,
    /// What routing changes in the keys' runs, put back if the batch is
    /// refused before anything is written (bad input changes nothing).
    /// Empty (no allocation) when no key of the batch has a mode.
    routed_from: Vec<(Option<i64>, u64)>,
}

impl<'s> HotBatch<'s> {
    /// Locks the keys of `states` (given in hash order).
    fn lock(states: &'s [Arc<HotKeyState>]) -> HotBatch<'s> {
        let guards: BTreeMap<u64, MutexGuard<'s, KeyRun>> = states
            .iter()
            .map(|s| {
                let g = s.run.lock();
                (g.hash, g)
            })
            .collect();
        let routed_from = guards.values().map(|r| (r.high_ms, r.next_lane)).collect();
        HotBatch {
            guards,
            routed: Vec::new(),
            windowed: Vec::new(),
            routed_from,
        }
    }

    /// Whether record `i` was routed by its key's mode.
    fn is_routed(&self, i: usize) -> bool {
        self.routed.get(i).copied().unwrap_or(false)
    }

    /// The key of record `i` if it is a windowed key's.
    fn windowed_key(&self, i: usize) -> Option<u64> {
        self.windowed.get(i).copied().flatten()
    }

    /// Puts the keys' runs back as they were before routing.
    fn undo_routing(&mut self) {
        for (run, &(high, next)) in self.guards.values_mut().zip(&self.routed_from) {
            run.high_ms = high;
            run.next_lane = next;
        }
    }
}

/// The records of one batch bound for one partition in one write round.
struct BatchGroup<'r> {
    round: u32,
    partition: u32,
    part: Arc<Partition>,
    /// The records' indexes in the batch, in input order.
    idxs: Vec<usize>,
    records: Vec<RecordIn<'r>>,
}

/// Checks every group of a batch's first pass (sizes, limits) before
/// anything is written, so a refused batch writes nothing.
fn check_groups(groups: &[BatchGroup<'_>]) -> Result<()> {
    groups
        .iter()
        .try_for_each(|g| g.part.check_batch(&g.records).map(drop))
}

/// Where a batch's records stand while it is written.
struct BatchProgress {
    landed: Vec<Option<Appended>>,
    /// Which first-pass group each record belongs to. A record re-routed
    /// after a seal only joins records of its own first-pass group, so
    /// every batch written is a part of one that was checked up front.
    origin: Vec<usize>,
    /// The partitions written to (synced under `SyncPolicy::Always`).
    touched: Vec<Arc<Partition>>,
    wrote_any: bool,
}

impl BatchProgress {
    fn new(records: usize) -> BatchProgress {
        BatchProgress {
            landed: vec![None; records],
            origin: vec![0; records],
            touched: Vec::new(),
            wrote_any: false,
        }
    }

    /// Records the first pass's groups as the records' origins.
    fn note_origins(&mut self, groups: &[BatchGroup<'_>]) {
        for (n, g) in groups.iter().enumerate() {
            for &i in &g.idxs {
                self.origin[i] = n;
            }
        }
    }

    /// The records `idxs` landed in `partition` from offset `base` on.
    fn landed_at(&mut self, partition: u32, base: u64, idxs: &[usize]) {
        self.wrote_any = true;
        for (k, &i) in idxs.iter().enumerate() {
            self.landed[i] = Some(Appended {
                partition,
                offset: base + k as u64,
            });
        }
    }
}
