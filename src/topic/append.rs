//! The append paths: one record, a batch, a hot key's lanes, one partition.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::batch::RecordIn;
use crate::partition::{now_ms, Partition};

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
        let now = now_ms();
        let mut hashes: Vec<Option<u64>> = records
            .iter()
            .map(|r| r.key.map(|k| self.hash(k)))
            .collect();
        let mut ins: Vec<RecordIn<'_>> = records
            .iter()
            .map(|r| RecordIn {
                key: r.key,
                value: r.value,
                timestamp: r.timestamp.unwrap_or(now),
            })
            .collect();
        // Keys with a hot-key mode: locked (in hash order) for the whole
        // batch, routed to their lane points in input order. The fence is
        // read first: a key that gets a mode after it is refused below.
        let mut fence = self.inner.hot.fence.load(Ordering::SeqCst);
        let hot_states: Vec<Arc<crate::topic::hot_keys::HotKeyState>> = if self.inner.hot.any() {
            let mut hs: Vec<u64> = hashes.iter().flatten().copied().collect();
            hs.sort_unstable();
            hs.dedup();
            hs.into_iter()
                .filter_map(|h| self.inner.hot.get(h))
                .collect()
        } else {
            Vec::new()
        };
        let mut hot_guards: BTreeMap<
            u64,
            parking_lot::MutexGuard<'_, crate::topic::hot_keys::KeyRun>,
        > = hot_states
            .iter()
            .map(|s| {
                let g = s.run.lock();
                (g.hash, g)
            })
            .collect();
        // After the lookup and under the keys' locks: a mode change that
        // failed under one of these locks, or took a new key back out of
        // the map, poisoned the log first (see `append`).
        self.inner.core.check_open()?;
        // Empty (no allocation) when no key of the batch has a mode.
        let mut hot_routed: Vec<bool> = Vec::new();
        // The key of each record of a windowed key (its records are
        // written round by round, see `batch_round`); empty (no
        // allocation) when the batch has none.
        let mut windowed: Vec<Option<u64>> = Vec::new();
        let n_hot_scan = if hot_guards.is_empty() {
            0
        } else {
            records.len()
        };
        // What routing changes in the keys' runs, put back if the batch is
        // refused before anything is written (bad input changes nothing).
        // Empty (no allocation) when no key of the batch has a mode.
        let routed_from: Vec<(Option<i64>, u64)> = hot_guards
            .values()
            .map(|r| (r.high_ms, r.next_lane))
            .collect();
        for i in 0..n_hot_scan {
            if let Some(run) = hashes[i].and_then(|h| hot_guards.get_mut(&h)) {
                if run.windowed() {
                    windowed.resize(records.len(), None);
                    windowed[i] = Some(run.hash);
                }
                let (point, ts) =
                    self.hot_route(run, ins[i].key.unwrap_or_default(), ins[i].timestamp);
                hashes[i] = Some(point);
                ins[i].timestamp = ts;
                hot_routed.resize(records.len(), false);
                hot_routed[i] = true;
            }
        }
        let mut landed: Vec<Option<Appended>> = vec![None; records.len()];
        // Which first-round group each record belongs to. A record re-routed
        // after a seal only joins records of its own first-round group, so
        // every batch written is a part of one that was checked up front.
        let mut origin: Vec<usize> = vec![0; records.len()];
        let mut pending: Vec<usize> = (0..records.len()).collect();
        let mut attempts = 0;
        let mut touched: Vec<Arc<Partition>> = Vec::new();
        let mut wrote_any = false;
        let partial = |landed: Vec<Option<Appended>>, wrote_any: bool, e: Error| {
            if wrote_any {
                self.partial_batch(landed, e, true)
            } else {
                e
            }
        };
        while !pending.is_empty() {
            // Route every pending record against one snapshot of the routing
            // table: routed one by one, a split landing mid-batch could send
            // a key's first record to the parent and its second to a child,
            // and the parent's group (refused as sealed, then retried) would
            // land after the child's: per-key order broken.
            // Groups are keyed (round, partition, origin): round 0 but for a
            // windowed key's records that went elsewhere than its previous
            // one (`batch_round`).
            type Group = (Arc<Partition>, Vec<usize>);
            type GroupKey = (u32, u32, usize);
            let mut groups: BTreeMap<GroupKey, Group> = BTreeMap::new();
            {
                let st = self.inner.state.read();
                let keyless = self.next_keyless(&st);
                let mut runs = Vec::new();
                for &i in &pending {
                    let pid = hashes[i].map_or(keyless, |h| st.owner(h));
                    let round = match windowed.get(i).copied().flatten() {
                        Some(k) => {
                            crate::topic::hot_keys::batch_round(&mut runs, k, (pid, origin[i]))
                        }
                        None => 0,
                    };
                    groups
                        .entry((round, pid, origin[i]))
                        .or_insert_with(|| (st.nodes[&pid].part.clone(), Vec::new()))
                        .1
                        .push(i);
                }
            }
            let batches: Vec<(GroupKey, Group, Vec<RecordIn<'_>>)> = groups
                .into_iter()
                .map(|(k, g)| {
                    let recs = g.1.iter().map(|&i| ins[i]).collect();
                    (k, g, recs)
                })
                .collect();
            if attempts == 0 {
                // Nothing is written until every group passed its checks.
                for (_, (part, _), recs) in &batches {
                    if let Err(e) = part.check_batch(recs) {
                        for (run, &(high, next)) in hot_guards.values_mut().zip(&routed_from) {
                            run.high_ms = high;
                            run.next_lane = next;
                        }
                        return Err(e);
                    }
                }
                for (n, (_, (_, idxs), _)) in batches.iter().enumerate() {
                    for &i in idxs {
                        origin[i] = n;
                    }
                }
            }
            let mut retry = Vec::new();
            // The first round with a group refused as sealed: later rounds
            // wait for the next pass, so a windowed key's later records
            // never land before its earlier ones (nor do they after an
            // error: the loop stops at the first).
            let mut sealed_round: Option<u32> = None;
            for ((round, pid, _), (part, idxs), recs) in batches {
                if sealed_round.is_some_and(|r| round > r) {
                    retry.extend(idxs);
                    continue;
                }
                touched.push(part.clone());
                let hs: Vec<Option<u64>> = idxs.iter().map(|&i| hashes[i]).collect();
                // Groups of keys routed by mode are under their keys' locks;
                // the others are fenced against a mode change.
                let is_hot = |i: usize| hot_routed.get(i).copied().unwrap_or(false);
                let fenced =
                    (!idxs.iter().all(|&i| is_hot(i))).then_some((&self.inner.hot.fence, fence));
                match part.append_fenced(&recs, &hs, fenced) {
                    Ok(base) => {
                        wrote_any = true;
                        for (k, &i) in idxs.iter().enumerate() {
                            landed[i] = Some(Appended {
                                partition: pid,
                                offset: base + k as u64,
                            });
                        }
                    }
                    // Sealed between routing and appending: route again.
                    Err(Error::Sealed { .. }) if attempts < 1000 => {
                        retry.extend(idxs);
                        sealed_round.get_or_insert(round);
                    }
                    Err(e) => return Err(partial(landed, wrote_any, e)),
                }
            }
            retry.sort_unstable();
            fence = self.inner.hot.fence.load(Ordering::SeqCst);
            // A key given a mode since the batch began cannot be routed by
            // it now (its lock is taken in hash order, at the start): the
            // caller appends it again.
            if retry.iter().any(|&i| {
                !hot_routed.get(i).copied().unwrap_or(false)
                    && hashes[i].is_some_and(|h| self.inner.hot.get(h).is_some())
            }) {
                let e = Error::Refused(
                    "a key of the batch changed hot-key mode during the append; append the records not landed again".into(),
                );
                return Err(partial(landed, wrote_any, e));
            }
            // After that lookup (see `append`): a failed mode change took
            // its key back out of the map only after poisoning the log.
            if !retry.is_empty() {
                if let Err(e) = self.inner.core.check_open() {
                    return Err(partial(landed, wrote_any, e));
                }
            }
            pending = retry;
            attempts += 1;
        }
        drop(hot_guards);
        let out: Vec<Appended> = landed
            .iter()
            .map(|l| l.expect("every record landed when nothing is pending"))
            .collect();
        let touched: Vec<&Partition> = touched.iter().map(|p| &**p).collect();
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
            return Err(self.partial_batch(landed, e, false));
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
