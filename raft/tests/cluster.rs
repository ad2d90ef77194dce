//! Three node processes on 127.0.0.1, each on its own directory: a group
//! initialised over them, idempotent producers appending with
//! `acks=quorum`, a concurrent committed reader, SIGKILLs part-way (the
//! leader; a follower, restarted; all three, restarted; the leader,
//! restarted), and a history check over everything acknowledged and read
//! against the committed log every live node converges on.
//!
//! Bounded: every node is killed when the harness drops (and exits by
//! itself when its stdin closes, should the harness die), and the whole
//! run has a hard deadline. The fixtures live in `common::cluster`.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use fissionlog_raft::client::{ClientCall, ClientReply, Role};
use fissionlog_raft::types::NodeId;

use common::cluster::{call, run, run_within, Cluster, NodeProc, ACKS_PER_PHASE, GROUP};

#[test]
fn a_killed_leader_is_replaced_and_every_acknowledged_append_is_read_back_at_its_offset() {
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE, None).await;
        let leader = c.leader().await;
        let killed_at = Instant::now();
        c.kill(leader);
        let before = c.acked();
        c.wait_acks(before, 1, Some(leader)).await;
        eprintln!(
            "a new leader acknowledged an append {:?} after the kill",
            killed_at.elapsed()
        );
        c.wait_acks(before, ACKS_PER_PHASE, Some(leader)).await;
        c.finish_and_check().await;
    });
}

/// Leader kills in the failover campaign.
const FAILOVER_KILLS: usize = 20;
/// The campaign's hard deadline: each kill, restart and catch-up takes a
/// few seconds.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(600);

/// Waits until restarted node `id` names another node as leader and its
/// committed end reaches the leader's as it was when the wait began.
async fn wait_rejoined(c: &mut Cluster, id: NodeId) {
    let started = Instant::now();
    let target = loop {
        let leader = c.leader().await;
        let addr = c.node(leader).addr.clone();
        if let Some(ClientReply::Status {
            leader: Some(l),
            committed_end,
            ..
        }) = call(&addr, ClientCall::Status { group: GROUP }).await
        {
            if l == leader && l != id {
                break committed_end;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let addr = c.node(id).addr.clone();
    loop {
        // It rejoins as a follower of the new leader and catches up.
        if let Some(ClientReply::Status {
            leader: Some(l),
            committed_end,
            role: Role::Follower,
            ..
        }) = call(&addr, ClientCall::Status { group: GROUP }).await
        {
            if l != id && committed_end >= target {
                return;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "node {id} rejoined and caught up to {target}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The failover figure: under the producers' load, SIGKILL the leader,
/// time the first append acknowledged by another node, restart the
/// killed node on its directory and wait until it has caught up; twenty
/// times, then the history check over the whole campaign. Prints the
/// median, p90 and maximum with every sample.
#[test]
#[ignore = "opt-in campaign of 20 leader kills, a few minutes"]
fn failover_over_twenty_leader_kills() {
    run_within(FAILOVER_DEADLINE, async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE, None).await;
        let mut samples = Vec::with_capacity(FAILOVER_KILLS);
        for kill in 1..=FAILOVER_KILLS {
            let leader = c.leader().await;
            c.wait_acks(c.acked(), ACKS_PER_PHASE / 4, None).await;
            let before = c.acked();
            let killed_at = Instant::now();
            c.kill(leader);
            c.wait_acks(before, 1, Some(leader)).await;
            let failover = killed_at.elapsed();
            eprintln!("kill {kill}: node {leader}, failover {failover:?}");
            samples.push(failover);
            c.restart(leader);
            wait_rejoined(&mut c, leader).await;
        }
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 4, None).await;
        c.finish_and_check().await;
        samples.sort();
        let at = |q: usize| samples[(samples.len() * q / 100).min(samples.len() - 1)];
        println!(
            "failover over {} leader kills: median {:?}, p90 {:?}, max {:?}; samples (sorted) {:?}",
            samples.len(),
            at(50),
            at(90),
            samples[samples.len() - 1],
            samples
        );
    });
}

#[test]
fn a_follower_killed_under_load_and_restarted_on_its_directory_catches_up_to_the_same_committed_log(
) {
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let leader = c.leader().await;
        let follower = (1..=3).find(|&n| n != leader).unwrap_or(1);
        c.kill(follower);
        // The other two are a quorum: acknowledgements go on without it.
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        c.restart(follower);
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        // All three nodes, the restarted one included, converge.
        c.finish_and_check().await;
    });
}

#[test]
fn every_acknowledged_append_survives_a_sigkill_of_all_three_nodes_once_and_in_order() {
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE, None).await;
        // Producers keep sending while every node dies: some appends are
        // in flight, written on some nodes and acknowledged to no one.
        for id in 1..=3 {
            c.kill(id);
        }
        let acked_before_kill = c.acked();
        for id in 1..=3 {
            c.restart(id);
        }
        // The restarted nodes elect a leader from their own logs and
        // votes, and the producers' retries find their first copies.
        c.wait_acks(acked_before_kill, ACKS_PER_PHASE / 2, None)
            .await;
        c.finish_and_check().await;
    });
}

#[test]
fn a_killed_leader_restarted_on_its_directory_rejoins_as_a_follower_and_converges() {
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE, None).await;
        let old = c.leader().await;
        c.kill(old);
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, Some(old)).await;
        c.restart(old);
        // The restarted node learns of the new leader instead of
        // standing for election with its old term's log.
        let addr = c.node(old).addr.clone();
        let started = Instant::now();
        loop {
            if let Some(ClientReply::Status {
                leader: Some(l), ..
            }) = call(&addr, ClientCall::Status { group: GROUP }).await
            {
                if l != old {
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "node {old} learned of a leader after its restart"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, Some(old)).await;
        c.finish_and_check().await;
    });
}

#[test]
fn a_leader_paused_past_the_election_timeout_steps_down_on_resume_and_loses_no_acknowledged_append()
{
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let old = c.leader().await;
        c.signal(old, "STOP");
        let paused_at = Instant::now();
        let before = c.acked();
        // The producers fail over: the other two elect a leader and
        // acknowledge without the paused one.
        c.wait_acks(before, ACKS_PER_PHASE / 2, Some(old)).await;
        eprintln!(
            "acknowledgements resumed without node {old} {:?} after its pause",
            paused_at.elapsed()
        );
        let new = c.leader().await;
        assert_ne!(new, old, "another node leads while node {old} is paused");
        c.signal(old, "CONT");
        // Whatever the old leader took in while paused it cannot commit
        // at its old term: it names the new leader and refuses appends,
        // and an acknowledgement it gave is checked like any other.
        c.wait_stepped_down(old, 0).await;
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, Some(old)).await;
        c.finish_and_check().await;
    });
}

#[test]
fn a_leader_with_both_followers_paused_acknowledges_nothing_until_they_resume() {
    run(async {
        let mut c = Cluster::start().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let leader = c.leader().await;
        let followers: Vec<NodeId> = (1..=3).filter(|&n| n != leader).collect();
        for &f in &followers {
            c.signal(f, "STOP");
        }
        // Appends in flight when the followers stopped may already be
        // committed; let their answers land.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let acked_when_paused = c.acked();
        for seq in 0..2 {
            let reply = c.probe(leader, seq).await;
            eprintln!("an append to the leader without a quorum: {reply:?}");
            assert!(
                !matches!(reply, Some(ClientReply::Applied(_))),
                "the leader without a quorum acknowledged an append: {reply:?}"
            );
        }
        assert_eq!(
            c.acked(),
            acked_when_paused,
            "nothing was acknowledged while only the leader ran"
        );
        for &f in &followers {
            c.signal(f, "CONT");
        }
        // The cluster serves again; the probes that timed out may be
        // committed now, once each, and the history check holds them to
        // that.
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        c.finish_and_check().await;
    });
}

#[test]
fn a_node_stops_cleanly_on_sigterm() {
    let mut node = NodeProc::start(1);
    let sent = Command::new("kill")
        .args(["-TERM", &node.child.id().to_string()])
        .status()
        .expect("run kill(1)");
    assert!(sent.success());
    let started = Instant::now();
    let status = loop {
        if let Some(s) = node.child.try_wait().expect("wait for the node") {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the node did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn a_node_without_its_required_options_exits_with_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_fissionlog-raft"))
        .args(["--node-id", "x"])
        .output()
        .expect("run the node binary");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--node-id \"x\" is not a number"),
        "{stderr}"
    );
    assert!(stderr.contains("usage:"), "{stderr}");
}

#[test]
fn the_nodes_help_lists_its_options_and_exits_with_success() {
    let out = Command::new(env!("CARGO_BIN_EXE_fissionlog-raft"))
        .arg("--help")
        .output()
        .expect("run the node binary");
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for option in ["--dir", "--node-id", "--listen", "--peers", "--peer-dial"] {
        assert!(stdout.contains(option), "{option} in {stdout}");
    }
}
