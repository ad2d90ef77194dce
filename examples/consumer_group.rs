//! A consumer group as a broker would embed it: three members (threads)
//! share a topic while a producer appends and a partition splits; each
//! member polls, processes and commits; then one member is dropped without
//! leaving: the others take over its partitions (here as soon as its lag
//! grows, since it had committed everything), and it is declared dead once
//! its session times out. Prints what each member read and the group's
//! counters, and checks that every record was read and the dropped member
//! was declared dead.
//!
//! ```sh
//! cargo run --example consumer_group
//! ```

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fissionlog::{
    GroupOptions, Log, LogOptions, MemberOptions, SplitPlan, SyncPolicy, TopicConfig,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let log = Log::open(dir.path(), LogOptions::default())?;
    let topic = log.topic_or_create(
        "orders",
        TopicConfig {
            partitions: 4,
            sync: SyncPolicy::Never,
            ..TopicConfig::default()
        },
    )?;
    let group = topic.group("billing", GroupOptions::default())?;
    let member_options = MemberOptions {
        session_timeout: Duration::from_secs(2),
        ..MemberOptions::default()
    };
    let total = 50_000u64;
    let seen = Mutex::new(BTreeSet::new());
    let done = AtomicBool::new(false);
    std::thread::scope(|s| -> fissionlog::Result<()> {
        let mut handles = Vec::new();
        for i in 0..3 {
            let (group, seen, done, opts) = (&group, &seen, &done, member_options.clone());
            handles.push(s.spawn(move || -> fissionlog::Result<u64> {
                let mut member = group.join(opts)?;
                let mut read = 0;
                while !done.load(Ordering::Acquire) {
                    // Member 2 crashes after a while: no leave, no heartbeat.
                    if i == 2 && read > 1_000 {
                        return Ok(read);
                    }
                    let batch = member.poll_wait(500, Duration::from_millis(50))?;
                    let mut seen = seen.lock().expect("not poisoned");
                    for r in &batch {
                        seen.insert(r.value.clone());
                    }
                    read += batch.len() as u64;
                    drop(seen);
                    member.commit()?;
                }
                member.leave()?;
                Ok(read)
            }));
        }
        for i in 0..total {
            let key = format!("customer-{}", i % 997);
            topic.append(Some(key.as_bytes()), &i.to_le_bytes())?;
            if i == total / 2 {
                topic.split(topic.active_partitions()[0], SplitPlan::LoadMedian)?;
            }
            if i % 1_000 == 0 {
                // About 50 k records/s over a second: members keep up, and
                // member 2 crashes while records still arrive.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while (seen.lock().expect("not poisoned").len() as u64) < total {
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        done.store(true, Ordering::Release);
        for (i, h) in handles.into_iter().enumerate() {
            let read = h.join().expect("member thread")?;
            println!("member {i} read {read} records");
        }
        Ok(())
    })?;
    // Member 2 never left: once its session times out it is declared dead.
    std::thread::sleep(member_options.session_timeout + Duration::from_millis(200));
    let d = group.describe();
    println!(
        "{} distinct records read of {total}; {} rebalances, {} partitions moved, {} dead members detected, {} records delivered again by design",
        seen.lock().expect("not poisoned").len(),
        d.stats.rebalances,
        d.stats.moves,
        d.stats.dead_detected,
        d.stats.redelivered
    );
    assert_eq!(
        seen.lock().expect("not poisoned").len() as u64,
        total,
        "every record was read by some member"
    );
    assert!(
        d.stats.dead_detected >= 1,
        "the dropped member was declared dead"
    );
    drop(topic);
    log.close()?;
    Ok(())
}
