use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::RPCError;
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{VoteRequest, VoteResponse};
use openraft::{BasicNode, Vote};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};

use super::link::{gather, Outgoing};
use super::*;
use crate::error::Error;

/// Answers a vote request by granting it, echoing the term; a request of
/// term 1 waits until one of term 2 has been answered, and term 99 never
/// gets an answer.
struct Echo {
    term_two_answered: Arc<Notify>,
}

impl GroupDispatch for Echo {
    fn dispatch(&self, _group: GroupId, request: RaftRequest) -> BoxFuture<RaftResponse> {
        let gate = self.term_two_answered.clone();
        Box::pin(async move {
            let RaftRequest::Vote(v) = request else {
                return RaftResponse::Unavailable {
                    reason: "only votes here".to_string(),
                };
            };
            match v.vote.leader_id.term {
                1 => gate.notified().await,
                2 => gate.notify_one(),
                99 => std::future::pending::<()>().await,
                _ => {}
            }
            RaftResponse::Vote(VoteResponse::new(v.vote, None, true))
        })
    }
}

async fn echo_server(listener: TcpListener) -> Server {
    let echo = Echo {
        term_two_answered: Arc::new(Notify::new()),
    };
    Server::start(listener, NetworkConfig::default(), Arc::new(echo), None)
        .expect("a bound listener has an address")
}

async fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port")
}

fn vote(term: u64) -> VoteRequest<NodeId> {
    VoteRequest::new(Vote::new(term, 1), None)
}

async fn client(net: &Network, addr: &str) -> GroupClient {
    net.factory(GroupId::partition(1, 0))
        .new_client(2, &BasicNode::new(addr))
        .await
}

fn ttl(ms: u64) -> RPCOption {
    RPCOption::new(Duration::from_millis(ms))
}

#[tokio::test]
async fn a_vote_goes_to_the_peer_and_its_answer_comes_back() {
    let server = echo_server(listener().await).await;
    let net = Network::new(1, NetworkConfig::default());
    let mut c = client(&net, &server.local_addr().to_string()).await;
    let resp = c.vote(vote(7), ttl(5_000)).await.expect("answered");
    assert!(resp.vote_granted);
    assert_eq!(resp.vote.leader_id.term, 7);
}

#[tokio::test]
async fn a_dial_override_sends_to_its_address_not_the_membership_one() {
    let server = echo_server(listener().await).await;
    // Nothing listens where the membership says node 2 is.
    let nowhere = listener().await;
    let membership_addr = nowhere.local_addr().expect("bound").to_string();
    drop(nowhere);
    let net = Network::new(1, NetworkConfig::default())
        .with_dial_overrides([(2, server.local_addr().to_string())].into());
    let mut c = client(&net, &membership_addr).await;
    let resp = c.vote(vote(7), ttl(5_000)).await.expect("answered");
    assert!(resp.vote_granted);
}

#[tokio::test]
async fn answers_come_back_out_of_order_on_one_shared_connection() {
    let server = echo_server(listener().await).await;
    let addr = server.local_addr().to_string();
    let net = Network::new(1, NetworkConfig::default());
    let mut first = client(&net, &addr).await;
    let mut second = net
        .factory(GroupId::partition(1, 1))
        .new_client(2, &BasicNode::new(addr.clone()))
        .await;
    // Term 1 is answered only after term 2: with in-order answers the
    // first call would wait forever and time out.
    let (a, b) = tokio::join!(first.vote(vote(1), ttl(5_000)), async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        second.vote(vote(2), ttl(5_000)).await
    });
    assert_eq!(a.expect("term 1 answered").vote.leader_id.term, 1);
    assert_eq!(b.expect("term 2 answered").vote.leader_id.term, 2);
    assert_eq!(
        net.link(2, &addr).stats().connects.load(Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn a_call_without_an_answer_within_its_ttl_is_unreachable() {
    let server = echo_server(listener().await).await;
    let net = Network::new(1, NetworkConfig::default());
    let mut c = client(&net, &server.local_addr().to_string()).await;
    let err = c
        .vote(vote(99), ttl(100))
        .await
        .expect_err("never answered");
    assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
    // The connection is still good for the next call.
    assert!(c.vote(vote(3), ttl(5_000)).await.is_ok());
}

#[tokio::test]
async fn a_peer_that_is_down_is_unreachable_and_served_again_once_it_is_back() {
    let l = listener().await;
    let addr = l.local_addr().expect("bound").to_string();
    let server = echo_server(l).await;
    let net = Network::new(1, NetworkConfig::default());
    let mut c = client(&net, &addr).await;
    assert!(c.vote(vote(3), ttl(5_000)).await.is_ok());

    server.shutdown();
    let mut down = None;
    for _ in 0..50 {
        match c.vote(vote(3), ttl(200)).await {
            Err(e) => {
                down = Some(e);
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert!(matches!(down, Some(RPCError::Unreachable(_))), "{down:?}");

    let again = TcpListener::bind(&addr)
        .await
        .expect("rebind the same port");
    let _server = echo_server(again).await;
    let mut answered = false;
    for _ in 0..100 {
        if c.vote(vote(4), ttl(500)).await.is_ok() {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answered, "the link reconnected to the restarted peer");
    assert!(net.link(2, &addr).stats().connects.load(Ordering::Relaxed) >= 2);
}

#[tokio::test]
async fn a_group_the_peer_does_not_host_is_unreachable() {
    let server = Server::start(
        listener().await,
        NetworkConfig::default(),
        Arc::new(RaftRegistry::default()),
        None,
    )
    .expect("bound");
    let net = Network::new(1, NetworkConfig::default());
    let mut c = client(&net, &server.local_addr().to_string()).await;
    let err = c.vote(vote(1), ttl(5_000)).await.expect_err("not hosted");
    assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
}

/// Sends `bytes` on a fresh connection and reads until the server closes
/// it; returns what the server sent.
async fn send_raw(addr: std::net::SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .expect("the server closes a hostile connection")
        .expect("read");
    got
}

#[tokio::test]
async fn a_hostile_peer_gets_its_connection_closed_with_a_typed_error_and_others_are_served() {
    let server = echo_server(listener().await).await;
    let addr = server.local_addr();
    let codec = FrameCodec::default();

    // A length prefix far past the maximum, before any hello.
    let got = send_raw(addr, &[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).await;
    assert!(got.is_empty());

    // A good hello, then a frame whose payload is no message.
    let mut bytes = Vec::new();
    codec
        .encode(&Hello::Peer { from: 9 }, &mut bytes)
        .expect("encode");
    bytes.extend_from_slice(&[5, 0, 0, 0, 1, 0xfe, 0xfe, 0xfe, 0xfe]);
    let got = send_raw(addr, &bytes).await;
    assert!(got.is_empty());

    // A client hello on a server that takes no clients.
    let mut bytes = Vec::new();
    codec.encode(&Hello::Client, &mut bytes).expect("encode");
    send_raw(addr, &bytes).await;

    let mut kinds = Vec::new();
    for _ in 0..100 {
        kinds = server.errors().with(|errs| {
            errs.iter()
                .map(|e| match e {
                    Error::FrameTooLarge { .. } => "too large",
                    Error::MalformedFrame { .. } => "malformed",
                    _ => "other",
                })
                .collect::<Vec<_>>()
        });
        if kinds.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(kinds, vec!["too large", "malformed", "malformed"]);

    let net = Network::new(1, NetworkConfig::default());
    let mut c = client(&net, &addr.to_string()).await;
    assert!(c.vote(vote(5), ttl(5_000)).await.is_ok());
}

#[tokio::test]
async fn frames_queued_behind_the_first_go_out_in_one_write() {
    let (tx, mut rx) = mpsc::channel(16);
    for call_id in 1..=4u64 {
        tx.try_send(Outgoing {
            call_id,
            frame: vec![call_id as u8; 3],
        })
        .expect("room in the queue");
    }
    let first = Outgoing {
        call_id: 0,
        frame: vec![0; 3],
    };
    let mut buf = Vec::new();
    let frames = gather(first, &mut rx, &mut buf, Duration::ZERO).await;
    assert_eq!(frames, 5);
    assert_eq!(buf, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]);

    // With a window, a frame queued within it joins too (the queue then
    // closes, so the window does not have to run out).
    let late = tx;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let _ = late
            .send(Outgoing {
                call_id: 9,
                frame: vec![9],
            })
            .await;
    });
    buf.clear();
    let first = Outgoing {
        call_id: 8,
        frame: vec![8],
    };
    let frames = gather(first, &mut rx, &mut buf, Duration::from_secs(5)).await;
    assert_eq!((frames, buf), (2, vec![8, 9]));
}
