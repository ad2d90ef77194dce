use bytes::Bytes;

use super::*;

fn roundtrip_request(r: Request) {
    let frame = Bytes::from(concat(&r.encode(7)));
    let (f, used) = split_frame(&frame, DEFAULT_MAX_FRAME_BYTES)
        .unwrap()
        .unwrap();
    assert_eq!(used, frame.len());
    assert_eq!(f.request_id, 7);
    assert_eq!(Request::decode(f.opcode, f.body).unwrap(), r);
}

fn roundtrip_response(r: Response) {
    let frame = Bytes::from(concat(&r.encode(9)));
    let (f, _) = split_frame(&frame, DEFAULT_MAX_FRAME_BYTES)
        .unwrap()
        .unwrap();
    assert_eq!(f.request_id, 9);
    assert_eq!(Response::decode(f.opcode, f.body).unwrap(), r);
}

#[test]
fn every_request_kind_decodes_to_what_was_encoded() {
    let big = Bytes::from(vec![7u8; 5000]);
    for r in [
        Request::Hello {
            min_version: 1,
            max_version: 3,
            client: "c".into(),
            token: Some(Token(Bytes::from_static(b"t"))),
        },
        Request::Produce {
            topic: "t".into(),
            acks: Acks::Quorum,
            records: vec![
                ProduceRecord {
                    key: None,
                    value: big.clone(),
                    timestamp: Some(-5),
                },
                ProduceRecord {
                    key: Some(Bytes::from_static(b"k")),
                    value: Bytes::new(),
                    timestamp: None,
                },
            ],
        },
        Request::Fetch {
            topic: "t".into(),
            partition: 3,
            offset: 9,
            max_bytes: 100,
            max_wait_ms: 5,
            isolation: Isolation::Written,
        },
        Request::JoinGroup {
            topic: "t".into(),
            group: "g".into(),
            session_timeout_ms: 1,
            processing_timeout_ms: 2,
            instance_id: Some("i".into()),
        },
        Request::Heartbeat { member: 1 },
        Request::GroupPoll {
            member: 1,
            max_records: 2,
            max_bytes: 3,
            max_wait_ms: 4,
        },
        Request::Commit { member: 5 },
        Request::LeaveGroup { member: 6 },
        Request::CreateTopic {
            topic: "t".into(),
            partitions: 4,
            sync: SyncSpec::IntervalMs(10),
            max_record_bytes: 0,
            target_bytes_per_sec: 1,
            auto_balance: true,
        },
        Request::ListTopics,
        Request::Describe { topic: "t".into() },
        Request::Split {
            topic: "t".into(),
            partition: 0,
            plan: SplitSpec::HotKey(Bytes::from_static(b"hot")),
        },
        Request::Split {
            topic: "t".into(),
            partition: 0,
            plan: SplitSpec::At(77),
        },
        Request::Merge {
            topic: "t".into(),
            a: 1,
            b: 2,
        },
        Request::TailSplit {
            topic: "t".into(),
            partition: 0,
            plan: SplitSpec::Even,
            from: TailFromSpec::Offset(3),
        },
        Request::SetHotKeyMode {
            topic: "t".into(),
            key: Bytes::from_static(b"k"),
            mode: HotKeyModeSpec::WindowedMs(5),
            lanes: 2,
        },
        Request::ListGroups { topic: None },
        Request::Stats,
        Request::ProduceTo {
            topic: "t".into(),
            partition: 4,
            acks: Acks::Leader,
            stamp: Some(Stamp {
                producer_id: 9,
                epoch: 2,
                first_sequence: 1 << 33,
            }),
            records: vec![ProduceRecord {
                key: Some(Bytes::from_static(b"k")),
                value: big.clone(),
                timestamp: None,
            }],
        },
        Request::ProduceTo {
            topic: "t".into(),
            partition: 0,
            acks: Acks::None,
            stamp: None,
            records: Vec::new(),
        },
        Request::InitProducer { producer_id: None },
        Request::InitProducer {
            producer_id: Some(77),
        },
        Request::Topology { topic: "t".into() },
    ] {
        roundtrip_request(r);
    }
}

#[test]
fn every_response_kind_decodes_to_what_was_encoded() {
    for r in [
        Response::HelloOk {
            version: 1,
            max_frame_bytes: 10,
            max_in_flight: 2,
            server: "s".into(),
        },
        Response::Produced {
            positions: vec![(1, 2), (3, 4)],
        },
        Response::Fetched {
            partition: 1,
            next_offset: 3,
            high_watermark: 4,
            records: vec![FetchedRecord {
                offset: 2,
                timestamp: 1,
                key: None,
                value: Bytes::from(vec![1u8; 900]),
            }],
        },
        Response::Joined {
            member: 1,
            generation: 2,
        },
        Response::Done {
            opcode: 0x13,
            generation: 3,
        },
        Response::Polled {
            generation: 4,
            records: vec![PolledRecord {
                partition: 1,
                offset: 2,
                timestamp: 3,
                key: Some(Bytes::from_static(b"k")),
                value: Bytes::new(),
            }],
        },
        Response::Json {
            opcode: 0x22,
            json: "{}".into(),
        },
        Response::Error {
            opcode: 0x02,
            code: ErrorCode::Fenced,
            message: "m".into(),
        },
        Response::ProducerInit {
            producer_id: 3,
            epoch: 1,
        },
        Response::Topology {
            epoch: 5,
            routing_key: [1, u64::MAX],
            partitions: vec![
                RangeOwner {
                    partition: 1,
                    start: 0,
                    end: 9,
                },
                RangeOwner {
                    partition: 2,
                    start: 10,
                    end: u64::MAX,
                },
            ],
        },
        Response::Moved {
            message: "sealed".into(),
            epoch: 6,
            partitions: vec![RangeOwner {
                partition: 3,
                start: 0,
                end: u64::MAX,
            }],
        },
        Response::Error {
            opcode: 0x04,
            code: ErrorCode::OutOfOrderSequence,
            message: "gap".into(),
        },
        Response::NotLeader {
            opcode: 0x04,
            message: "not the leader".into(),
            leader: Some("127.0.0.1:9093".into()),
        },
        Response::NotLeader {
            opcode: 0x03,
            message: "no leader known".into(),
            leader: None,
        },
        Response::Error {
            opcode: 0x10,
            code: ErrorCode::Unsupported,
            message: "no groups in cluster mode".into(),
        },
    ] {
        roundtrip_response(r);
    }
}

#[test]
fn a_hello_never_shows_its_token_in_debug_output() {
    let r = Request::Hello {
        min_version: 1,
        max_version: 1,
        client: "c".into(),
        token: Some(Token(Bytes::from_static(b"hunter2-secret"))),
    };
    assert!(!format!("{r:?}").contains("hunter2"));
}

#[test]
fn a_length_over_the_limit_is_refused_from_its_four_bytes_alone() {
    let b = Bytes::from_static(&[0xff, 0xff, 0xff, 0x7f]);
    assert!(matches!(
        split_frame(&b, 1024),
        Err(ProtocolError::FrameTooLarge { .. })
    ));
}

#[test]
fn an_incomplete_frame_waits_for_more_bytes() {
    let full = Bytes::from(concat(&Request::Stats.encode(1)));
    for cut in 0..full.len() {
        assert_eq!(
            split_frame(&full.slice(..cut), 1024).unwrap(),
            None,
            "cut at {cut}"
        );
    }
}

#[test]
fn a_frame_shorter_than_its_header_is_an_error() {
    let b = Bytes::from_static(&[2, 0, 0, 0, 1, 2]);
    assert!(matches!(
        split_frame(&b, 1024),
        Err(ProtocolError::ShortFrame { .. })
    ));
}

#[test]
fn a_record_count_larger_than_the_frame_is_refused_before_allocating() {
    let mut e = Encoder::new();
    e.str("t");
    e.u8(1);
    e.u32(u32::MAX); // records
    let body = Bytes::from(concat(&e.finish().0));
    let err = Request::decode(0x02, body).unwrap_err();
    assert!(
        matches!(
            err,
            ProtocolError::Invalid {
                what: "record count",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unknown_opcodes_bad_utf8_and_trailing_bytes_are_errors() {
    assert_eq!(
        Request::decode(0x7f, Bytes::new()),
        Err(ProtocolError::UnknownOpcode(0x7f))
    );
    let mut e = Encoder::new();
    e.slice(&[0xff, 0xfe]);
    let body = Bytes::from(concat(&e.finish().0));
    assert!(Request::decode(0x22, body).is_err());
    let mut body =
        concat(&Request::Heartbeat { member: 1 }.encode(1))[LEN_PREFIX + REQUEST_HEADER..].to_vec();
    body.push(0);
    assert!(Request::decode(0x11, Bytes::from(body)).is_err());
}

#[test]
fn a_string_length_past_the_frame_end_is_truncated_not_read() {
    let mut e = Encoder::new();
    e.u32(1000);
    let body = Bytes::from(concat(&e.finish().0));
    assert!(matches!(
        Request::decode(0x22, body),
        Err(ProtocolError::Truncated { .. })
    ));
}

#[test]
fn random_bytes_never_panic_the_decoder() {
    let seed = 0x5eed_u64;
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let valid = concat(
        &Request::Fetch {
            topic: "t".into(),
            partition: 1,
            offset: 2,
            max_bytes: 3,
            max_wait_ms: 4,
            isolation: Isolation::Default,
        }
        .encode(1),
    );
    for i in 0..5000 {
        let mut v = valid.clone();
        // Mutate a few bytes of a valid frame, or make noise.
        if i % 2 == 0 {
            for _ in 0..(next() % 4 + 1) {
                let at = (next() as usize) % v.len();
                v[at] = next() as u8;
            }
        } else {
            v = (0..(next() % 64)).map(|_| next() as u8).collect();
        }
        let r = std::panic::catch_unwind(|| check_decode(&v));
        assert!(r.is_ok(), "seed {seed:#x}, case {i}: {v:?}");
    }
}

#[test]
fn a_cluster_broker_takes_only_clients_that_read_its_codes() {
    // A single node: versions 2 and 3.
    assert_eq!(negotiate_version(2, 2, false), Some(2));
    assert_eq!(negotiate_version(2, 3, false), Some(3));
    assert_eq!(negotiate_version(1, 1, false), None);
    assert_eq!(negotiate_version(4, 9, false), None);
    // Cluster mode sends not_leader and unsupported: version 3 only.
    assert_eq!(negotiate_version(2, 2, true), None);
    assert_eq!(negotiate_version(2, 3, true), Some(3));
    assert_eq!(negotiate_version(2, u16::MAX, true), Some(PROTOCOL_VERSION));
    assert_eq!(negotiate_version(3, 2, false), None);
    for code in [ErrorCode::NotLeader, ErrorCode::Unsupported] {
        assert!(
            code as u16 > ErrorCode::ProducerFenced as u16,
            "{code:?} is one of the codes version 3 added"
        );
    }
}
