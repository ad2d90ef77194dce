use std::collections::BTreeSet;

use openraft::{CommittedLeaderId, EntryPayload, LogId, Membership, Vote};

use super::*;
use crate::types::{Command, Entry, ProducerStamp, RecordIn};

fn log_id(term: u64, node: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, node), index)
}

fn append_entries() -> PeerMessage {
    let voters: BTreeSet<NodeId> = [1, 2, 3].into_iter().collect();
    let entries: Vec<Entry> = vec![
        Entry {
            log_id: log_id(2, 1, 10),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: log_id(2, 1, 11),
            payload: EntryPayload::Membership(Membership::new(vec![voters], ())),
        },
        Entry {
            log_id: log_id(2, 1, 12),
            payload: EntryPayload::Normal(Command::Append {
                producer: Some(ProducerStamp {
                    producer_id: 77,
                    epoch: 1,
                    first_sequence: 40,
                }),
                records: vec![
                    RecordIn {
                        key: Some(b"k".to_vec()),
                        value: vec![0xAB; 1024],
                        timestamp_ms: 1_700_000_000_000,
                    },
                    RecordIn {
                        key: None,
                        value: Vec::new(),
                        timestamp_ms: -1,
                    },
                ],
            }),
        },
        Entry {
            log_id: log_id(2, 1, 13),
            payload: EntryPayload::Normal(Command::Seal { topology_epoch: 9 }),
        },
    ];
    PeerMessage::Request {
        call_id: 5,
        group: GroupId::partition(3, 4),
        body: RaftRequest::AppendEntries(AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(log_id(1, 2, 9)),
            entries,
            leader_commit: Some(log_id(1, 2, 9)),
        }),
    }
}

fn vote_request() -> PeerMessage {
    PeerMessage::Request {
        call_id: u64::MAX,
        group: GroupId::CONTROLLER,
        body: RaftRequest::Vote(VoteRequest {
            vote: Vote::new(3, 2),
            last_log_id: None,
        }),
    }
}

fn frame_of(msg: &PeerMessage) -> Vec<u8> {
    let mut out = Vec::new();
    FrameCodec::default()
        .encode(msg, &mut out)
        .unwrap_or_else(|e| panic!("encode: {e}"));
    out
}

/// A frame with the given body (version byte included) and a correct
/// length prefix.
fn framed(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

#[test]
fn raft_messages_with_blank_membership_and_record_entries_round_trip() {
    for msg in [append_entries(), vote_request()] {
        let bytes = frame_of(&msg);
        let decoded = FrameCodec::default().decode::<PeerMessage>(&bytes);
        match decoded {
            Ok(Some((back, used))) => {
                assert_eq!(used, bytes.len());
                assert_eq!(format!("{back:?}"), format!("{msg:?}"));
            }
            other => panic!("decode gave {other:?}"),
        }
    }
}

#[test]
fn every_prefix_of_a_frame_asks_for_more_bytes_and_frames_decode_back_to_back() {
    let mut bytes = frame_of(&append_entries());
    let first = bytes.len();
    for len in 0..first {
        match FrameCodec::default().decode::<PeerMessage>(&bytes[..len]) {
            Ok(None) => {}
            other => panic!("{len} of {first} bytes gave {other:?}"),
        }
    }
    bytes.extend_from_slice(&frame_of(&vote_request()));
    let codec = FrameCodec::default();
    let Ok(Some((_, used))) = codec.decode::<PeerMessage>(&bytes) else {
        panic!("first frame did not decode");
    };
    assert_eq!(used, first);
    match codec.decode::<PeerMessage>(&bytes[used..]) {
        Ok(Some((PeerMessage::Request { call_id, .. }, n))) => {
            assert_eq!(call_id, u64::MAX);
            assert_eq!(used + n, bytes.len());
        }
        other => panic!("second frame gave {other:?}"),
    }
}

#[test]
fn an_oversized_length_prefix_is_refused_before_any_body_arrives() {
    let codec = FrameCodec::new(1024);
    let prefix = 1025u32.to_le_bytes();
    match codec.decode::<PeerMessage>(&prefix) {
        Err(Error::FrameTooLarge {
            len: 1025,
            max: 1024,
        }) => {}
        other => panic!("gave {other:?}"),
    }
    match codec.decode::<PeerMessage>(&u32::MAX.to_le_bytes()) {
        Err(Error::FrameTooLarge { .. }) => {}
        other => panic!("gave {other:?}"),
    }
}

#[test]
fn a_message_larger_than_the_maximum_is_not_encoded_and_leaves_the_buffer_as_it_was() {
    let codec = FrameCodec::new(512);
    let mut out = b"earlier".to_vec();
    match codec.encode(&append_entries(), &mut out) {
        Err(Error::FrameTooLarge { max: 512, len }) => assert!(len > 512),
        other => panic!("gave {other:?}"),
    }
    assert_eq!(out, b"earlier");
}

#[test]
fn a_frame_of_an_unknown_version_is_refused_with_that_version() {
    let mut bytes = frame_of(&vote_request());
    bytes[LEN_PREFIX_BYTES] = 9;
    match FrameCodec::default().decode::<PeerMessage>(&bytes) {
        Err(Error::UnsupportedFrameVersion {
            version: 9,
            supported: 1,
        }) => {}
        other => panic!("gave {other:?}"),
    }
}

#[test]
fn bytes_after_the_message_inside_a_frame_are_refused() {
    let bytes = frame_of(&vote_request());
    let mut body = bytes[LEN_PREFIX_BYTES..].to_vec();
    body.extend_from_slice(&[0, 0, 0]);
    match FrameCodec::default().decode::<PeerMessage>(&framed(&body)) {
        Err(Error::TrailingFrameBytes { unused: 3 }) => {}
        other => panic!("gave {other:?}"),
    }
}

#[test]
fn an_empty_frame_is_refused() {
    match FrameCodec::default().decode::<PeerMessage>(&0u32.to_le_bytes()) {
        Err(Error::MalformedFrame { .. }) => {}
        other => panic!("gave {other:?}"),
    }
}

#[test]
fn every_truncated_payload_with_a_matching_length_is_malformed_never_a_panic() {
    let bytes = frame_of(&append_entries());
    let body = &bytes[LEN_PREFIX_BYTES..];
    for len in 1..body.len() {
        match FrameCodec::default().decode::<PeerMessage>(&framed(&body[..len])) {
            Err(Error::MalformedFrame { .. }) => {}
            other => panic!("{len} of {} body bytes gave {other:?}", body.len()),
        }
    }
}

#[test]
fn random_frame_bodies_decode_to_an_error_or_a_message_never_a_panic() {
    // Deterministic: a fixed-seed xorshift, the seed printed on failure.
    let seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let codec = FrameCodec::new(4096);
    for case in 0..20_000 {
        let len = 1 + (next() % 200) as usize;
        let mut body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        body[0] = FRAME_VERSION;
        let result = std::panic::catch_unwind(|| codec.decode::<PeerMessage>(&framed(&body)));
        assert!(
            result.is_ok(),
            "seed {seed:#x}, case {case}: decode panicked"
        );
    }
}

#[tokio::test]
async fn frames_cross_a_stream_and_a_clean_end_of_stream_is_told_from_a_cut_frame() {
    let codec = FrameCodec::default();
    let (mut a, mut b) = tokio::io::duplex(64);
    let writer = tokio::spawn(async move {
        let codec = FrameCodec::default();
        for msg in [append_entries(), vote_request()] {
            codec.write_frame(&mut a, &msg).await?;
        }
        Ok::<_, Error>(())
    });
    for expected in [append_entries(), vote_request()] {
        match codec.read_frame::<PeerMessage, _>(&mut b).await {
            Ok(Some(m)) => assert_eq!(format!("{m:?}"), format!("{expected:?}")),
            other => panic!("gave {other:?}"),
        }
    }
    match writer.await {
        Ok(Ok(())) => {}
        other => panic!("writer: {other:?}"),
    }
    match codec.read_frame::<PeerMessage, _>(&mut b).await {
        Ok(None) => {}
        other => panic!("after the last frame: {other:?}"),
    }

    let bytes = frame_of(&vote_request());
    for cut in 1..bytes.len() {
        let mut stream = &bytes[..cut];
        match codec.read_frame::<PeerMessage, _>(&mut stream).await {
            Err(Error::TruncatedFrame { have, .. }) => assert_eq!(have, cut),
            other => panic!("cut at {cut}: {other:?}"),
        }
    }
}

#[test]
fn a_vector_that_declares_more_elements_than_its_frame_holds_is_malformed_without_allocating_them()
{
    // A postcard varint of u32::MAX elements and nothing after it: a decoder
    // that trusted the length would ask for 32 GiB before reading one.
    let mut body = vec![FRAME_VERSION];
    body.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0x0F]);
    match FrameCodec::default().decode::<Vec<u64>>(&framed(&body)) {
        Err(Error::MalformedFrame { .. }) => {}
        other => panic!("a vector of u32::MAX declared elements gave {other:?}"),
    }
    // The same declared length at the place of the entries of an AppendEntries.
    let codec = FrameCodec::default();
    let frame = frame_of(&append_entries());
    for cut in LEN_PREFIX_BYTES + 1..frame.len() {
        let mut body = frame[LEN_PREFIX_BYTES..cut].to_vec();
        body.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0x0F]);
        let result = std::panic::catch_unwind(|| codec.decode::<PeerMessage>(&framed(&body)));
        assert!(result.is_ok(), "a huge length after {cut} bytes panicked");
    }
}

#[test]
fn a_length_prefix_at_u32_max_is_refused_even_by_a_codec_whose_maximum_is_u32_max_minus_one() {
    let codec = FrameCodec::new(u32::MAX - 1);
    let mut buf = u32::MAX.to_le_bytes().to_vec();
    buf.push(FRAME_VERSION);
    match codec.decode::<PeerMessage>(&buf) {
        Err(Error::FrameTooLarge { len, .. }) => assert_eq!(len, u64::from(u32::MAX)),
        other => panic!("a u32::MAX prefix gave {other:?}"),
    }
    // At the maximum itself, a partial body only asks for more bytes.
    let codec = FrameCodec::new(u32::MAX);
    assert!(matches!(codec.decode::<PeerMessage>(&buf), Ok(None)));
}
