//! Network partitions on a three-node cluster: every node-to-node link
//! runs through a TCP proxy (`common::proxy`, reached with the node's
//! `--peer-dial`) that a test switches between passing and dropping,
//! while idempotent producers append with `acks=quorum` and a committed
//! reader reads (clients reach the nodes directly, past the proxies). Each
//! run ends with the history check of `common::cluster` over everything
//! acknowledged and read against the committed log all three nodes
//! converge on once the network heals.
//!
//! Bounded: each test has a 60 s deadline, and every node and proxy goes
//! when the test's cluster drops.

mod common;

use std::time::{Duration, Instant};

use fissionlog_raft::client::{ClientCall, ClientReply, Role};
use fissionlog_raft::types::{CommandResponse, NodeId, ProducerStamp, RecordIn};

use common::cluster::{call, lock, run_within, Ack, Cluster, ACKS_PER_PHASE, GROUP, PRODUCERS};
use common::proxy::Mode;

const DEADLINE: Duration = Duration::from_secs(60);
/// How long a wait inside a test may take before it fails with a message
/// saying what did not happen (well inside the deadline).
const WAIT_LIMIT: Duration = Duration::from_secs(20);

/// `(leader it names, committed end)` by node `id`'s status, if it
/// answers.
async fn status(c: &mut Cluster, id: NodeId) -> Option<(Option<NodeId>, u64)> {
    let addr = c.node(id).addr.clone();
    match call(&addr, ClientCall::Status { group: GROUP }).await {
        Some(ClientReply::Status {
            leader,
            committed_end,
            ..
        }) => Some((leader, committed_end)),
        _ => None,
    }
}

/// `(role, term)` by node `id`'s status, if it answers.
async fn role(c: &mut Cluster, id: NodeId) -> Option<(Role, u64)> {
    let addr = c.node(id).addr.clone();
    match call(&addr, ClientCall::Status { group: GROUP }).await {
        Some(ClientReply::Status { role, term, .. }) => Some((role, term)),
        _ => None,
    }
}

/// Waits until every node of `ids` names the same leader, one of `ids`;
/// returns it.
async fn wait_leader_among(c: &mut Cluster, ids: &[NodeId]) -> NodeId {
    let started = Instant::now();
    loop {
        let mut named = Vec::new();
        for &id in ids {
            named.push(status(c, id).await.and_then(|(l, _)| l));
        }
        if let Some(Some(l)) = named.first().copied() {
            if ids.contains(&l) && named.iter().all(|n| *n == Some(l)) {
                return l;
            }
        }
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "nodes {ids:?} agreed on a leader among them (they name {named:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One past the highest offset acknowledged so far.
fn acked_end(c: &Cluster) -> u64 {
    lock(&c.acks)
        .iter()
        .map(|a| a.offset + 1)
        .max()
        .unwrap_or(0)
}

/// Panics unless `ack` is in `final_log` at its offset, with its value.
fn assert_in_final_log(ack: &Ack, final_log: &[fissionlog_raft::client::ReadRecord]) {
    let want = format!("{}:{}", ack.key, ack.seq);
    let found = final_log
        .get(ack.offset as usize)
        .map(|r| String::from_utf8_lossy(&r.value).into_owned());
    assert_eq!(
        found.as_deref(),
        Some(want.as_str()),
        "acknowledged by node {} at offset {}",
        ack.by,
        ack.offset
    );
}

#[test]
fn a_leader_cut_off_from_both_followers_is_replaced_and_acknowledges_nothing_the_final_log_lacks() {
    run_within(DEADLINE, async {
        let mut c = Cluster::start_with_proxies().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let old = c.leader().await;
        let followers: Vec<NodeId> = (1..=3).filter(|&n| n != old).collect();
        c.mesh().set_node(old, Mode::Drop);
        let cut_at = Instant::now();
        eprintln!("cut node {old}, the leader, off from {followers:?}");
        // The majority side elects one of its own.
        let new = wait_leader_among(&mut c, &followers).await;
        eprintln!(
            "nodes {followers:?} follow node {new} {:?} after the cut",
            cut_at.elapsed()
        );
        // The producers find it and it acknowledges without the old leader.
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, Some(old)).await;
        // The old leader, still reachable by clients, has no quorum: an
        // append sent straight to it is never acknowledged.
        let reply = c.probe(old, 0).await;
        eprintln!("an append to the cut-off leader: {reply:?}");
        assert!(
            !matches!(reply, Some(ClientReply::Applied(_))),
            "node {old}, cut off from both followers, acknowledged an append: {reply:?}"
        );
        c.mesh().heal();
        eprintln!("healed");
        // It learns of the newer term, names the new leader, refuses
        // appends; what it took in alone is truncated, not committed.
        c.wait_stepped_down(old, 1).await;
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        let (acks, final_log) = c.finish_and_check().await;
        let late: Vec<&Ack> = acks
            .iter()
            .filter(|a| a.by == old && a.at > cut_at)
            .collect();
        eprintln!(
            "node {old} answered {} appends as acknowledged after the cut",
            late.len()
        );
        for a in late {
            assert_in_final_log(a, &final_log);
        }
    });
}

/// The stamped append of producer `producer` at `seq` sent to node `id`
/// alone (no retry elsewhere).
async fn stamped(c: &mut Cluster, id: NodeId, producer: u64, seq: u64) -> Option<ClientReply> {
    let addr = c.node(id).addr.clone();
    call(
        &addr,
        ClientCall::Append {
            group: GROUP,
            producer: Some(ProducerStamp {
                producer_id: producer,
                epoch: 0,
                first_sequence: seq,
            }),
            records: vec![RecordIn {
                key: Some(b"stamped".to_vec()),
                value: format!("stamped:{seq}").into_bytes(),
                timestamp_ms: 0,
            }],
        },
    )
    .await
}

/// Sends producer `producer`'s batch `seq` to node `id` until it is
/// appended.
async fn stamped_until_appended(c: &mut Cluster, id: NodeId, producer: u64, seq: u64) {
    let started = Instant::now();
    loop {
        let reply = stamped(c, id, producer, seq).await;
        if let Some(ClientReply::Applied(CommandResponse::Appended { .. })) = reply {
            return;
        }
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "node {id} appended sequence {seq} (last answer {reply:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A leader cut off from both followers does not know it was replaced, and
/// its dedup table stops at what it applied before the cut. A producer
/// that went on at the new leader and comes back to it with its next
/// sequence must not be told that sequence is out of order (a refusal a
/// producer takes as final): the old leader cannot confirm it still leads,
/// so it gives no verdict, and the producer goes on elsewhere.
#[test]
fn a_cut_off_leader_does_not_refuse_a_producers_next_sequence_as_out_of_order() {
    run_within(DEADLINE, async {
        const PRODUCER: u64 = 1_000;
        let mut c = Cluster::start_with_proxies().await;
        c.wait_acks(0, ACKS_PER_PHASE / 4, None).await;
        let old = c.leader().await;
        stamped_until_appended(&mut c, old, PRODUCER, 0).await;
        let followers: Vec<NodeId> = (1..=3).filter(|&n| n != old).collect();
        c.mesh().set_node(old, Mode::Drop);
        let new = wait_leader_among(&mut c, &followers).await;
        stamped_until_appended(&mut c, new, PRODUCER, 1).await;
        let reply = stamped(&mut c, old, PRODUCER, 2).await;
        eprintln!("sequence 2 sent to the cut-off leader: {reply:?}");
        assert!(
            !matches!(
                reply,
                Some(ClientReply::Applied(
                    CommandResponse::OutOfOrderSequence { .. } | CommandResponse::Appended { .. }
                ))
            ),
            "node {old}, cut off, answered sequence 2 with {reply:?}"
        );
        c.mesh().heal();
        c.wait_stepped_down(old, 1).await;
        let leader = c.leader().await;
        stamped_until_appended(&mut c, leader, PRODUCER, 2).await;
        let (_, final_log) = c.finish_and_check().await;
        let mine: Vec<String> = final_log
            .iter()
            .filter(|r| r.key.as_deref() == Some(b"stamped".as_slice()))
            .map(|r| String::from_utf8_lossy(&r.value).into_owned())
            .collect();
        assert_eq!(
            mine,
            ["stamped:0", "stamped:1", "stamped:2"],
            "each batch once, in order"
        );
    });
}

#[test]
fn a_follower_cut_off_by_a_symmetric_partition_catches_up_to_the_same_committed_log_after_it_heals()
{
    run_within(DEADLINE, async {
        let mut c = Cluster::start_with_proxies().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let leader = c.leader().await;
        let cut = (1..=3).find(|&n| n != leader).unwrap_or(1);
        c.mesh().set_node(cut, Mode::Drop);
        eprintln!("cut node {cut}, a follower, off from both peers");
        // The other two are a quorum: acknowledgements go on.
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        // The partition held the cut-off node back (so the heal below has
        // something to catch up).
        let behind = status(&mut c, cut).await.map(|(_, end)| end);
        let acked = acked_end(&c);
        eprintln!("node {cut} committed end {behind:?}, acknowledged up to {acked}");
        assert!(
            behind.is_some_and(|end| end < acked),
            "node {cut}, cut off, stayed behind what was acknowledged ({behind:?} < {acked})"
        );
        c.mesh().heal();
        eprintln!("healed");
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        // All three, the cut-off one included, converge on one log.
        c.finish_and_check().await;
    });
}

/// The leader's calls to one follower are dropped while the follower's
/// calls to the leader still pass: the follower hears no heartbeat and
/// campaigns through links that work. Acknowledgements go on (the leader
/// and the other follower, or whichever pair wins, are a quorum), and
/// once the link heals all three converge on one committed log with
/// every acknowledged append in it once.
#[test]
fn a_link_dropped_one_way_from_the_leader_to_a_follower_loses_nothing_and_acknowledgements_go_on() {
    run_within(DEADLINE, async {
        let mut c = Cluster::start_with_proxies().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let leader = c.leader().await;
        let deaf = (1..=3).find(|&n| n != leader).unwrap_or(1);
        let (_, term) = role(&mut c, leader).await.expect("the leader answers");
        c.mesh().set_one_way(leader, deaf, Mode::Drop);
        eprintln!("dropped node {leader}'s calls to node {deaf}; node {deaf}'s calls still pass");
        let before = c.acked();
        c.wait_acks(before, ACKS_PER_PHASE, None).await;
        let mut named = Vec::new();
        for n in 1..=3 {
            named.push((n, status(&mut c, n).await.and_then(|(l, _)| l)));
        }
        eprintln!(
            "{} appends acknowledged over the one-way drop; leaders named: {named:?}",
            c.acked() - before
        );
        c.mesh().heal();
        eprintln!("healed");
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        let agreed = wait_leader_among(&mut c, &[1, 2, 3]).await;
        let after = role(&mut c, agreed).await;
        eprintln!("all three name node {agreed}: {after:?}, the leader was in term {term}");
        assert_eq!(
            agreed, leader,
            "the deaf follower's campaigns did not unseat the leader"
        );
        assert_eq!(
            after,
            Some((Role::Leader, term)),
            "node {leader} is still the leader, in the term it led before the drop"
        );
        c.finish_and_check().await;
    });
}

/// Times the leader's links flip between dropping and passing.
const FLAPS: usize = 16;
/// How long each state of a flapping link lasts.
const FLAP_EVERY: Duration = Duration::from_millis(300);

#[test]
fn the_leaders_links_flapping_every_300_ms_lose_and_duplicate_no_acknowledged_append() {
    run_within(DEADLINE, async {
        let c = Cluster::start_with_proxies().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let leader = c.leader().await;
        let before = c.acked();
        eprintln!("flapping node {leader}'s links to both followers");
        for flap in 0..FLAPS {
            let mode = if flap % 2 == 0 {
                Mode::Drop
            } else {
                Mode::Pass
            };
            c.mesh().set_node(leader, mode);
            tokio::time::sleep(FLAP_EVERY).await;
        }
        c.mesh().heal();
        let cut = c.mesh().cut_connections();
        eprintln!(
            "healed; {} appends acknowledged while flapping, {cut} node-to-node connections cut",
            c.acked() - before
        );
        // The drops closed connections the nodes had made: the links'
        // traffic did go through the proxies.
        assert!(cut > 0, "a drop closed a node-to-node connection");
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        // Every acknowledged append once, at its offset; every producer's
        // key holds each acknowledged sequence once, in order.
        c.finish_and_check().await;
    });
}

/// The one-way delay of a slow link in the tests below: a round trip
/// past the 60 ms heartbeat interval groups once had, which openraft 0.9
/// makes every append's timeout, and inside today's 100 ms.
const SLOW: Duration = Duration::from_millis(35);

#[test]
fn a_follower_behind_a_slow_link_lags_while_the_leader_acknowledges_at_the_other_followers_pace() {
    run_within(DEADLINE, async {
        let mut c = Cluster::start_with_proxies().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let leader = c.leader().await;
        let slow = (1..=3).find(|&n| n != leader).unwrap_or(2);
        c.mesh().set_between(leader, slow, Mode::Delay(SLOW));
        eprintln!("node {leader}, the leader, and node {slow}: {SLOW:?} each way");
        let before = c.acked();
        let started = Instant::now();
        c.wait_acks(before, ACKS_PER_PHASE, None).await;
        eprintln!(
            "{ACKS_PER_PHASE} appends acknowledged in {:?} over the slow link",
            started.elapsed()
        );
        // No election: a late heartbeat is still a heartbeat.
        assert_eq!(
            wait_leader_among(&mut c, &[1, 2, 3]).await,
            leader,
            "the leader stays"
        );
        // The slow follower's committed end trails what was acknowledged:
        // the link's delay is real, and the leader did not wait for it.
        let mut trailed = Vec::new();
        for _ in 0..20 {
            let acked = acked_end(&c);
            let (_, slow_end) = status(&mut c, slow)
                .await
                .expect("the slow follower answers");
            trailed.push((slow_end, acked));
            if slow_end < acked {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        eprintln!("node {slow}'s committed end and the acknowledged end: {trailed:?}");
        assert!(
            trailed.iter().any(|(end, acked)| end < acked),
            "node {slow} behind a {SLOW:?} link trails the acknowledgements: {trailed:?}"
        );
        // And it keeps up over the slow link: its committed end reaches
        // what was acknowledged, before the link heals.
        let target = acked_end(&c);
        let started = Instant::now();
        loop {
            let (_, end) = status(&mut c, slow)
                .await
                .expect("the slow follower answers");
            if end >= target {
                eprintln!(
                    "node {slow} reached {target} over the slow link in {:?}",
                    started.elapsed()
                );
                break;
            }
            assert!(
                started.elapsed() < WAIT_LIMIT,
                "node {slow} behind a {SLOW:?} link reached committed end {target} (it is at {end})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        c.mesh().heal();
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        c.finish_and_check().await;
    });
}

#[test]
fn every_link_slow_lengthens_each_acknowledgement_by_a_round_trip_and_elects_nobody_new() {
    run_within(DEADLINE, async {
        let mut c = Cluster::start_with_proxies().await;
        c.wait_acks(0, ACKS_PER_PHASE / 2, None).await;
        let leader = c.leader().await;
        for a in 1..=3 {
            for b in (a + 1)..=3 {
                c.mesh().set_between(a, b, Mode::Delay(SLOW));
            }
        }
        // Connections opened before the switch are closed by it; wait
        // for the first acknowledgement over the slow links before timing.
        c.wait_acks(c.acked(), 1, None).await;
        let before = c.acked();
        let started = Instant::now();
        c.wait_acks(before, ACKS_PER_PHASE / 2, None).await;
        let took = started.elapsed();
        // Each producer waits for its append's acknowledgement before the
        // next, and each needs the leader's round trip to a follower, at
        // least 2 × SLOW: the acknowledgements counted came in at least
        // (count / producers - 1) round trips.
        let per_producer = (ACKS_PER_PHASE / 2) as u32 / PRODUCERS as u32;
        let floor = 2 * SLOW * per_producer.saturating_sub(1);
        eprintln!(
            "{} appends acknowledged in {took:?} with every link {SLOW:?} each way (floor {floor:?})",
            ACKS_PER_PHASE / 2
        );
        assert!(
            took >= floor,
            "acknowledgements over {SLOW:?} links took a round trip each ({took:?} < {floor:?})"
        );
        assert_eq!(
            wait_leader_among(&mut c, &[1, 2, 3]).await,
            leader,
            "no election over slow links"
        );
        c.mesh().heal();
        c.wait_acks(c.acked(), ACKS_PER_PHASE / 2, None).await;
        c.finish_and_check().await;
    });
}
