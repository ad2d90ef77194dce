//! `Log::delete_topic` racing a topology change of the same topic (a
//! split creating its children's files): the delete waits for the change
//! or the change sees the topic gone before it writes anything, so no
//! deleted topic's directory comes back and nothing else is disturbed.

use crate::common;
use common::log::quiet;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::faults::Gate;

use fissionlog::{Error, IoOp, Log, SplitPlan, SyncPolicy, TopicConfig};

fn config() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 1 << 16,
        sync: SyncPolicy::Never,
        ..TopicConfig::default()
    }
}

/// A split that created its first child's files when the topic is deleted
/// must not create the next child's directory inside the deleted topic's
/// directory (recreating it on disk after `delete_topic` returned), and
/// the delete must succeed; the other topic's records and later syncs are
/// untouched, and a Strict reopen finds neither topic `a` nor its files.
#[test]
fn delete_during_a_split_leaves_no_directory_of_the_deleted_topic() {
    let dir = tempfile::tempdir().unwrap();
    // Holds a split of `topics/t0/p0` right after its first child's
    // directory is created and synced, before the next child's is.
    let gate = Arc::new(
        Gate::new(IoOp::SyncNewDir)
            .on_path("topics/t0/p1")
            .after_the_call(),
    );
    let log = Arc::new(Log::open_with_hook(dir.path(), quiet(), gate.clone()).unwrap());
    let a = log.create_topic("a", config()).unwrap();
    let b = log.create_topic("b", config()).unwrap();
    for i in 0..50u32 {
        a.append(Some(&i.to_le_bytes()), b"va").unwrap();
        b.append(Some(&i.to_le_bytes()), b"vb").unwrap();
    }
    log.sync().unwrap();

    let split = {
        let a = a.clone();
        std::thread::spawn(move || a.split(0, SplitPlan::Even))
    };
    assert!(
        gate.wait_reached(Duration::from_secs(10)),
        "the split never created its first child"
    );
    let (delete, _) = common::lifecycle::delete_in_thread(&log, "a");
    // Long enough for a delete that does not wait for the split to finish.
    std::thread::sleep(Duration::from_millis(300));
    gate.release();
    let split = split.join().unwrap();
    delete
        .join()
        .unwrap()
        .expect("delete_topic succeeds whether or not the split went first");
    if let Err(e) = &split {
        assert!(
            matches!(e, Error::UnknownTopic(_)),
            "a split that lost the race says the topic is gone: {e:?}"
        );
    }

    let tdir = dir.path().join("topics/t0");
    assert!(
        !tdir.exists(),
        "the deleted topic's directory is back: {:?}",
        std::fs::read_dir(&tdir)
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
            .ok()
    );
    assert!(matches!(
        a.append(None, b"late"),
        Err(Error::UnknownTopic(_))
    ));
    b.append(None, b"after").unwrap();
    log.sync().unwrap();
    drop((a, b));
    Arc::try_unwrap(log).ok().unwrap().close().unwrap();

    let log = Log::open(dir.path(), quiet()).unwrap();
    assert!(log.topic("a").is_err(), "topic a came back");
    let b = log.topic("b").unwrap();
    let got = b.read(0, 0, 1 << 20).unwrap();
    assert_eq!(got.iter().count(), 51, "topic b keeps every record");
}

/// Through a handle kept past `delete_topic`, every topology change is
/// refused with `UnknownTopic` and writes nothing: no directory of the
/// deleted topic appears, and the manifest takes no record (a reopen
/// finds the log as the delete left it).
#[test]
fn changes_through_a_deleted_topics_handle_are_refused_and_write_nothing() {
    use fissionlog::{HotKeyMode, TailSplitOptions};
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    let cfg = TopicConfig {
        partitions: 2,
        ..config()
    };
    let a = log.create_topic("a", cfg.clone()).unwrap();
    for i in 0..20u32 {
        a.append(Some(&i.to_le_bytes()), b"v").unwrap();
    }
    log.sync().unwrap();
    let manifest_len = |d: &Path| -> u64 {
        std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("MANIFEST"))
            .map(|e| e.metadata().unwrap().len())
            .sum()
    };
    log.delete_topic("a").unwrap();
    let before = manifest_len(dir.path());

    let gone = |what: &str, r: Result<(), Error>| {
        assert!(
            matches!(r, Err(Error::UnknownTopic(_))),
            "{what} through a deleted topic's handle: {r:?}"
        );
    };
    gone("split", a.split(0, SplitPlan::Even).map(drop));
    gone("merge", a.merge(0, 1).map(drop));
    gone(
        "tail split",
        a.split_tail(0, SplitPlan::Even, TailSplitOptions::from_offset(0))
            .map(drop),
    );
    gone("hot-key mode", a.set_hot_key_mode(b"k", HotKeyMode::Strict));
    assert!(
        !dir.path().join("topics/t0").exists(),
        "a refused change made the deleted topic's directory"
    );
    assert_eq!(
        manifest_len(dir.path()),
        before,
        "the manifest took a record"
    );
    assert_eq!(log.enforce_retention().unwrap(), 0);
    drop(a);
    log.close().unwrap();
    let log = Log::open(dir.path(), quiet()).unwrap();
    assert!(log.topic("a").is_err());
    let b = log.create_topic("a", cfg).unwrap();
    assert_eq!(
        b.read(0, 0, 1 << 20).map(|r| r.iter().count()).unwrap_or(0),
        0
    );
}
