//! Power loss on one node of a running three-node cluster.
//!
//! The three nodes run in this process, each with its own log, transport
//! and server on 127.0.0.1, so each can run on the per-file crash model of
//! the library's crash tests (`tests/common/durable.rs`): its log through a
//! `ModelHook`, its group's own files (vote, `raft-meta`, `raft-stamps`)
//! through a [`VoteIo`] that reports their fsyncs to the same model.
//! Idempotent producers append with `acks=quorum` while a follower loses
//! power: from that instant every one of its I/O calls fails, and the
//! power-loss images of its directory are what the model says a disk could
//! hold.
//!
//! Every image must hold what the node had promised:
//! - every entry up to the log id the leader counted as matched on it (a
//!   follower answers an append only once its entries are durable), with
//!   its producer stamp;
//! - a vote at least as new as the one it held.
//!
//! The node is then restarted on one image at its old address (once the
//! survivors elected a new leader, when it was the leader). It rejoins,
//! and the history check runs over the log all three converge on.
//!
//! The same run with the model ignoring the follower's segment fdatasyncs,
//! its vote file's fsync or its stamps file's fdatasync must fail the
//! image check. That is the proof the check sees a missing fsync.
//!
//! Bounded: each case has a 90 s deadline; every node stops when its case
//! ends.

mod common;

// The library's crash model, shared with its own crash tests.
#[allow(dead_code)]
#[path = "../../tests/common/crash.rs"]
mod crash;
#[allow(dead_code)]
#[path = "../../tests/common/durable.rs"]
mod durable;
#[allow(dead_code)]
#[path = "../../tests/common/model_hook.rs"]
mod model_hook;
#[allow(dead_code)]
#[path = "common/power.rs"]
mod power;

use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fissionlog::IoOp;
use fissionlog_raft::log_store::stamps::STAMPS_FILE;
use fissionlog_raft::vote::VOTE_TMP_FILE;
use openraft::ServerState;
use tokio::net::TcpListener;

use common::cluster::{check_history, converge, lock, run_within, Load};
use crash::CrashOptions;
use power::{
    check_images, leader_and_follower, start_three, wait_acks, Member, Promised, WAIT_LIMIT,
};

const DEADLINE: Duration = Duration::from_secs(90);
/// Power-loss images checked per case.
const SEEDS: u64 = 6;
/// Acknowledgements before the power goes, and after the node is back.
const ACKS_BEFORE: usize = 150;
const ACKS_AFTER: usize = 60;

/// Which node loses power.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A follower the leader counts as matched: what it promised is what
    /// the leader counted.
    Follower,
    /// The leader: the leader's own entry in its replication metrics is
    /// what its flushed log reached.
    Leader,
    /// The leader, its segment fdatasyncs slowed to 100 ms each before
    /// the power goes: the case where followers could hold committed
    /// entries its own disk does not, were it to replicate them first.
    SlowLeader,
}

/// Which fsync the model ignores on the node that loses power.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutation {
    None,
    /// Its segments' fdatasyncs in sync rounds.
    SegmentSync,
    /// The fsync of `vote.tmp` before it is renamed over `vote`.
    VoteSync,
    /// The fdatasync of `raft-stamps` before a stamped entry is written.
    StampsSync,
}

/// How long the stalled leader is watched before its power goes.
const STALL_WATCH: Duration = Duration::from_millis(1500);

/// Watches the stalled `leader` for [`STALL_WATCH`]: no follower is ever
/// counted matched past the leader's own flushed log (openraft 0.9 awaits
/// the leader's append callback before it replicates the entries), while
/// the leader's log still moves on. This is what makes openraft 0.9's
/// restore of a restarted leader in its old term safe after a power loss:
/// nothing committed is beyond what the leader had made durable. A
/// version that replicates ahead of the leader's own fsync fails here.
async fn watch_followers_never_ahead(leader: &Member) {
    let started = Instant::now();
    let mut first_own = None;
    let mut last_own = None;
    while started.elapsed() < STALL_WATCH {
        let metrics = leader.raft().metrics().borrow().clone();
        if let Some(r) = metrics.replication.as_ref() {
            let own = r.get(&leader.id).copied().flatten();
            let others = r
                .iter()
                .filter(|(id, _)| **id != leader.id)
                .filter_map(|(_, m)| *m)
                .max();
            assert!(
                others <= own,
                "a follower is matched at {others:?}, past the leader's own flushed log {own:?}"
            );
            first_own = first_own.or(Some(own));
            last_own = Some(own);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        last_own > first_own,
        "the stalled leader's log moved on while it was watched ({first_own:?} to {last_own:?})"
    );
}

/// Runs one case; returns the outcome of each image's check. With no
/// mutation it also restarts the node on the first image and checks the
/// history over what the cluster converges on.
async fn power_loss(victim_role: Role, mutation: Mutation) -> Vec<Result<(), String>> {
    let root = tempfile::tempdir().unwrap();
    // Every node runs with the mutation: which one loses power is known
    // only later.
    let ignore = match mutation {
        Mutation::VoteSync => Some(VOTE_TMP_FILE),
        Mutation::StampsSync => Some(STAMPS_FILE),
        _ => None,
    };
    let drop_op = match mutation {
        Mutation::SegmentSync => Some(IoOp::SyncSegment),
        _ => None,
    };
    let (mut members, peers) = start_three(root.path(), (drop_op, ignore)).await;
    let Load {
        routing,
        acks,
        observed,
        stop,
        tasks: producers,
        reader,
    } = Load::start(&peers.clone().into_iter().collect::<Vec<_>>()).await;
    wait_acks(&acks, ACKS_BEFORE).await;

    // What the victim promised, then the power goes at once: no I/O of
    // its succeeds from here, and the model's state is taken.
    let (l, f) = leader_and_follower(&members, ACKS_BEFORE as u64 / 2).await;
    let v = match victim_role {
        Role::Follower => f,
        Role::Leader | Role::SlowLeader => l,
    };
    if victim_role == Role::SlowLeader {
        let (hook, _) = members[l].model.as_ref().unwrap();
        hook.set_fault(Some(Box::new(|op, _| {
            if op == IoOp::SyncSegment {
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(())
        })));
        watch_followers_never_ahead(&members[l]).await;
    }
    let promised = {
        let leader = members[l].raft().metrics().borrow().clone();
        let victim = members[v].raft().metrics().borrow().clone();
        Promised {
            matched: leader
                .replication
                .as_ref()
                .and_then(|r| r.get(&members[v].id).copied().flatten()),
            vote: victim.vote,
        }
    };
    let leader_id = members[l].id;
    assert!(
        promised.matched.is_some(),
        "the leader counts node {} as matched",
        members[v].id
    );
    let victim = members.remove(v);
    let point = {
        let (hook, files) = victim.model.as_ref().unwrap();
        files.off.store(true, Ordering::SeqCst);
        hook.set_fault(Some(Box::new(|_, _| Err(io::Error::other("power lost")))));
        hook.now(IoOp::SyncSegment)
    };
    let (victim_id, victim_addr) = (victim.id, victim.addr.clone());
    lock(&routing).alive.remove(&victim_id);
    victim.stop().await;
    eprintln!(
        "node {victim_id} lost power; the leader, node {leader_id}, had it matched at {:?}",
        promised.matched
    );

    let images = root.path().join("images");
    let outcomes = {
        let images = images.clone();
        tokio::task::spawn_blocking(move || {
            check_images(&point, promised, &images, SEEDS, &CrashOptions::default())
        })
        .await
        .unwrap()
    };
    if mutation == Mutation::None {
        for (seed, o) in outcomes.iter().enumerate() {
            if let Err(e) = o {
                panic!("power-loss image {seed} of node {victim_id}: {e}");
            }
        }
        if victim_role != Role::Follower {
            // The survivors elect a leader of a newer term and acknowledge
            // appends without the old one.
            let started = Instant::now();
            while !members
                .iter()
                .any(|m| m.raft().metrics().borrow().state == ServerState::Leader)
            {
                assert!(
                    started.elapsed() < WAIT_LIMIT,
                    "a survivor became the leader"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let acked = lock(&acks).len();
            wait_acks(&acks, acked + ACKS_AFTER / 2).await;
        }
        // Back on image 0, at its old address: it rejoins and catches up.
        let before = lock(&acks).len();
        let listener = TcpListener::bind(&victim_addr).await.unwrap();
        let back = Member::start(
            victim_id,
            &images.join("image-0"),
            listener,
            peers.clone(),
            None,
        )
        .await;
        lock(&routing).alive.insert(victim_id, victim_addr.clone());
        members.push(back);
        wait_acks(&acks, before + ACKS_AFTER).await;
        stop.store(true, Ordering::SeqCst);
        for p in producers {
            p.await.expect("a producer panicked");
        }
        reader.abort();
        let acked = lock(&acks).clone();
        let addrs: Vec<String> = members.iter().map(|m| m.addr.clone()).collect();
        let final_log = converge(&addrs, &acked).await;
        check_history(&acked, &lock(&observed), &final_log);
        eprintln!(
            "{} appends acknowledged; the three nodes hold the same {} committed records",
            acked.len(),
            final_log.len()
        );
    } else {
        stop.store(true, Ordering::SeqCst);
        for p in producers {
            p.abort();
        }
        reader.abort();
    }
    for m in members {
        m.stop().await;
    }
    outcomes
}

#[test]
fn a_follower_that_loses_power_keeps_what_it_acknowledged_rejoins_and_loses_nothing() {
    run_within(DEADLINE, async {
        let outcomes = power_loss(Role::Follower, Mutation::None).await;
        assert_eq!(outcomes.len() as u64, SEEDS);
    });
}

#[test]
fn a_leader_that_loses_power_keeps_what_it_flushed_a_new_leader_takes_over_and_nothing_is_lost() {
    run_within(DEADLINE, async {
        let outcomes = power_loss(Role::Leader, Mutation::None).await;
        assert_eq!(outcomes.len() as u64, SEEDS);
    });
}

#[test]
fn a_leader_with_a_slow_disk_replicates_only_what_it_flushed_loses_power_and_nothing_is_lost() {
    run_within(DEADLINE, async {
        let outcomes = power_loss(Role::SlowLeader, Mutation::None).await;
        assert_eq!(outcomes.len() as u64, SEEDS);
    });
}

#[test]
fn the_image_check_catches_a_follower_whose_segment_fdatasyncs_are_missing() {
    run_within(DEADLINE, async {
        let outcomes = power_loss(Role::Follower, Mutation::SegmentSync).await;
        let failed: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        eprintln!("{} of {SEEDS} images failed: {failed:?}", failed.len());
        assert!(
            failed.iter().any(|e| e.contains("lost what the leader counted")),
            "without the segment fdatasync some image loses an entry the leader counted as durable: {outcomes:?}"
        );
    });
}

#[test]
fn the_image_check_catches_a_follower_whose_vote_fsync_is_missing() {
    run_within(DEADLINE, async {
        let outcomes = power_loss(Role::Follower, Mutation::VoteSync).await;
        let failed: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        eprintln!("{} of {SEEDS} images failed: {failed:?}", failed.len());
        assert!(
            failed.iter().any(|e| e.contains("vote")),
            "without the vote file's fsync some image loses the vote: {outcomes:?}"
        );
    });
}

#[test]
fn the_image_check_catches_a_follower_whose_stamps_fdatasync_is_missing() {
    run_within(DEADLINE, async {
        let outcomes = power_loss(Role::Follower, Mutation::StampsSync).await;
        let failed: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        eprintln!("{} of {SEEDS} images failed: {failed:?}", failed.len());
        assert!(
            failed.iter().any(|e| e.contains("lost its producer stamp")),
            "without the stamps file's fdatasync some image holds a stamped entry without its stamp: {outcomes:?}"
        );
    });
}
