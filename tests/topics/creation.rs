//! What a topic creation makes durable, and what it costs: its fsyncs do
//! not grow with the partition count (the first segments become durable in
//! the sync round that first has records for them), and a power loss at
//! any step from the creation through its first sync round opens Strict,
//! loses nothing synced and leaves every partition usable.

use crate::common;

use common::crash::CrashOptions;
use common::lifecycle::{cfg, opts, partition_values};
use common::model_hook::{for_each_image, ModelHook, SYNC_OPS};
use fissionlog::{IoOp, Log, SyncPolicy};

const PARTITIONS: u32 = 8;

fn syncs(model: &ModelHook) -> u64 {
    SYNC_OPS.iter().map(|&op| model.synced_count(op)).sum()
}

/// A topic of 256 partitions is created with a fixed number of fsyncs
/// (its directory, `topics/`, the manifest), none per partition.
#[test]
fn a_topic_creation_costs_no_fsync_per_partition() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    let before = syncs(&model);
    let t = log.create_topic("t", cfg(256, SyncPolicy::Never)).unwrap();
    let spent = syncs(&model) - before;
    assert!(spent <= 8, "creating 256 partitions took {spent} fsyncs");
    // The partitions are there and take records.
    for p in 0..256 {
        t.append_to(p, &common::log::rec(b"x")).unwrap();
    }
    log.sync().unwrap();
    drop(t);
    log.close().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let t = log.topic("t").unwrap();
    for p in 0..256 {
        assert_eq!(
            partition_values(&t, p),
            vec![b"x".to_vec()],
            "partition {p}"
        );
    }
}

/// Appends `value` to every partition of `t`.
fn append_everywhere(t: &fissionlog::Topic, value: &[u8]) {
    for p in 0..PARTITIONS {
        t.append_to(p, &common::log::rec(value)).unwrap();
    }
}

/// C1/C6/C7: power-loss images at every I/O step from before a topic's
/// creation to after its first sync round (which has records for half of
/// its partitions) open Strict. The topic is absent or has all its
/// partitions; each holds nothing or its one record, and the record
/// whenever the sync completed. Then each recovered log takes a record in
/// every partition, syncs, and a second power loss keeps all of them.
#[test]
fn power_loss_from_a_topic_creation_to_its_first_sync_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelHook::new(dir.path(), None);
    let log = Log::open_with_hook(dir.path(), opts(), model.clone()).unwrap();
    model.record_steps(true);
    let t = log
        .create_topic("t", cfg(PARTITIONS, SyncPolicy::Never))
        .unwrap();
    for p in (0..PARTITIONS).step_by(2) {
        t.append_to(p, &common::log::rec(b"a")).unwrap();
    }
    log.sync().unwrap();
    model.record_steps(false);
    let mut points = model.take_steps();
    let synced = points.len();
    points.push(model.now(IoOp::SyncSegment));
    drop(t);
    log.abandon();
    let opened = for_each_image(&points, 3, |k, dir, ctx| check_image(dir, k >= synced, ctx));
    assert!(opened > 10, "only {opened} images");
}

/// Opens one power-loss image Strict and checks it, then writes to every
/// partition, syncs, and checks a power-loss image of that.
fn check_image(dir: &std::path::Path, after_sync: bool, ctx: &str) {
    let model = ModelHook::new(dir, None);
    let log = Log::open_with_hook(dir, opts(), model.clone())
        .unwrap_or_else(|e| panic!("{ctx}: Strict open fails: {e}"));
    let Ok(t) = log.topic("t") else {
        assert!(!after_sync, "{ctx}: the topic is gone after its sync");
        return;
    };
    let mut want = Vec::new();
    for p in 0..PARTITIONS {
        let vals = partition_values(&t, p);
        let wrote = p % 2 == 0;
        let ok = vals.is_empty() && !(wrote && after_sync) || wrote && vals == vec![b"a".to_vec()];
        assert!(ok, "{ctx}: partition {p} holds {vals:?}");
        want.push(vals);
    }
    assert!(
        t.partition(PARTITIONS).is_err(),
        "{ctx}: a partition too many"
    );
    append_everywhere(&t, b"z");
    log.sync()
        .unwrap_or_else(|e| panic!("{ctx}: sync after recovery: {e}"));
    let (image, _) = model.crash_image(7, &CrashOptions::default());
    drop(t);
    log.abandon();
    let again = tempfile::tempdir().unwrap();
    image.write_to(again.path()).unwrap();
    let log = Log::open(again.path(), opts())
        .unwrap_or_else(|e| panic!("{ctx}: second Strict open fails: {e}"));
    let t = log.topic("t").unwrap();
    for (p, mut vals) in want.into_iter().enumerate() {
        vals.push(b"z".to_vec());
        assert_eq!(
            partition_values(&t, p as u32),
            vals,
            "{ctx}: after a second power loss"
        );
    }
}
