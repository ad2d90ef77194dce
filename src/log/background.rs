//! The log's background thread: interval syncs, retention every second,
//! the balancer at each topic's check interval, and the compaction of a
//! large manifest.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Weak;

use super::TopicMap;
use std::time::{Duration, Instant};

use crate::config::SyncPolicy;
use crate::core::Core;
use crate::error::{Error, Result};

/// Name of the background thread.
const THREAD_NAME: &str = "fissionlog-bg";

/// Starts the background thread. It holds the core and the topic map
/// weakly and stops when the log closes or is dropped. A failed spawn (the OS refused a thread:
/// a thread or memory limit) is [`Error::ThreadSpawn`].
pub(super) fn spawn(
    core: Weak<Core>,
    topics: Weak<TopicMap>,
    balancer: bool,
    retention: bool,
) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(THREAD_NAME.into())
        .spawn(move || run(core, topics, balancer, retention))
        .map_err(|source| Error::ThreadSpawn {
            thread: THREAD_NAME.into(),
            source,
        })
}

fn run(core: Weak<Core>, topic_map: Weak<TopicMap>, balancer: bool, retention: bool) {
    let mut last_sync = Instant::now();
    let mut last_retention = Instant::now();
    let mut last_balance: HashMap<u32, Instant> = HashMap::new();
    loop {
        // Parked rather than asleep: shutdown unparks it at once.
        std::thread::park_timeout(Duration::from_millis(20));
        let (Some(core), Some(topic_map)) = (core.upgrade(), topic_map.upgrade()) else {
            return;
        };
        if core.closed.load(Ordering::Acquire) {
            return;
        }
        compact_manifest(&core);
        let topics = topic_map.all();
        let interval = topics
            .iter()
            .filter_map(|t| match t.config().sync {
                SyncPolicy::Interval(d) => Some(d),
                _ => None,
            })
            .min();
        if interval.is_some_and(|d| last_sync.elapsed() >= d) {
            // Nobody waits for this sync. A failure is not lost: the
            // round poisons the partition whose fsync failed (or records
            // the log-wide failure), and every later `sync`, `Always`
            // append and `close` returns it. It is never retried as if
            // nothing happened.
            let _ = core.sync();
            last_sync = Instant::now();
        }
        if retention && last_retention.elapsed() >= Duration::from_secs(1) {
            // Retention deletes only what the checkpoint no longer names,
            // after a sync that made the new floors durable; a failed pass
            // changes nothing it did not finish, and the next one retries.
            // A sync failure inside it is kept as above.
            let _ = super::retention::enforce_retention(&core, &topic_map);
            last_retention = Instant::now();
        }
        if balancer {
            for t in &topics {
                let cfg = t.config().balance;
                let due = last_balance
                    .get(&t.id())
                    .is_none_or(|l| l.elapsed() >= cfg.check_interval);
                if cfg.enabled && due {
                    // A split or merge commits with one manifest record or
                    // not at all (C5); a failed manifest write poisons the
                    // log for every later change. The next pass decides
                    // again.
                    let _ = t.balance_step();
                    last_balance.insert(t.id(), Instant::now());
                }
            }
        }
    }
}

/// Compacts the manifest when its journal is long enough and its state too
/// large for the committing change to compact inline (`Core::commit`):
/// the copy of the state is taken and the journal replaced under the
/// topology lock, the snapshot (the bulk: serializing and syncing it) is
/// written without it, so a change waits at most for the copy or for the
/// journal's few records since. A failure poisons the log, as an inline
/// compaction's does.
fn compact_manifest(core: &Core) {
    let job = {
        let mut guard = core.topology.lock();
        let topo = &mut *guard;
        if core.check_open().is_err() {
            return;
        }
        match topo
            .manifest
            .begin_compaction(core.compact_every, &topo.state)
        {
            Ok(Some(job)) => job,
            Ok(None) => return,
            Err(e) => return core.poison_manifest(&e),
        }
    };
    let written = job.write_snapshot();
    let mut topo = core.topology.lock();
    // A poisoned log's journal may end in a record whose outcome is
    // unknown: it is left for the reopen to judge, not copied.
    let written = match core.check_open() {
        Ok(()) => written,
        Err(_) => Ok(false),
    };
    if let Err(e) = topo.manifest.finish_compaction(job, written) {
        core.poison_manifest(&e);
    }
}
