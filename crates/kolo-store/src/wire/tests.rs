//! Tests of the wire protocol: handshakes, limits, malformed frames, and round trips.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};

use super::handshake::hello;
use super::*;
use crate::{MAX_KEY_LEN, MAX_WAIT_KEYS};
use proptest::prelude::*;

fn encode_req(req: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(req, &mut out).unwrap();
    out
}

/// A duplex stream for handshake tests: reads from `input`, writes to `output`.
struct Duplex {
    input: io::Cursor<Vec<u8>>,
    output: Vec<u8>,
}
impl Read for Duplex {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}
impl Write for Duplex {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
fn duplex(input: Vec<u8>) -> Duplex {
    Duplex {
        input: io::Cursor::new(input),
        output: Vec::new(),
    }
}

#[test]
fn magic_spells_kols() {
    assert_eq!(&MAGIC.to_be_bytes(), b"KOLS");
}

#[test]
fn handshake_accepts_matching_peer() {
    let mut server = duplex(hello().to_vec());
    server_handshake(&mut server).unwrap();
    assert_eq!(server.output, hello());

    let mut client = duplex(hello().to_vec());
    client_handshake(&mut client).unwrap();
    assert_eq!(client.output, hello());
}

#[test]
fn handshake_rejects_bad_magic_without_answering() {
    let mut server = duplex(b"GET / HTTP/1.1\r\n".to_vec());
    assert!(matches!(
        server_handshake(&mut server),
        Err(WireError::Invalid(_))
    ));
    assert!(server.output.is_empty());
}

#[test]
fn handshake_reports_version_mismatch() {
    let mut other = MAGIC.to_le_bytes().to_vec();
    other.extend_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
    let mut server = duplex(other.clone());
    match server_handshake(&mut server) {
        Err(WireError::Invalid(reason)) => assert!(reason.contains("version"), "{reason}"),
        other => panic!("unexpected {other:?}"),
    }
    // The server still answered, so the client can tell what happened.
    assert_eq!(server.output, hello());

    let mut client = duplex(other);
    assert!(matches!(
        client_handshake(&mut client),
        Err(WireError::Invalid(_))
    ));
}

#[test]
fn short_handshake_is_eof() {
    let mut server = duplex(vec![0x53, 0x4C]);
    match server_handshake(&mut server) {
        Err(WireError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn clean_eof_between_frames() {
    assert!(matches!(read_request(&mut &[][..]), Ok(None)));
}

#[test]
fn oversized_key_rejected_before_allocation() {
    let mut frame = vec![OP_GET];
    frame.extend_from_slice(&u32::MAX.to_le_bytes());
    match read_request(&mut &frame[..]) {
        Err(WireError::Invalid(reason)) => assert!(reason.contains("key length"), "{reason}"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn oversized_value_rejected_before_allocation() {
    let mut frame = vec![OP_SET];
    frame.extend_from_slice(&1u32.to_le_bytes());
    frame.push(b'k');
    frame.extend_from_slice(&(MAX_VALUE_LEN as u64 + 1).to_le_bytes());
    match read_request(&mut &frame[..]) {
        Err(WireError::Invalid(reason)) => assert!(reason.contains("value length"), "{reason}"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn announced_but_missing_value_is_eof() {
    let mut frame = vec![OP_SET];
    frame.extend_from_slice(&1u32.to_le_bytes());
    frame.push(b'k');
    frame.extend_from_slice(&(MAX_VALUE_LEN as u64).to_le_bytes());
    frame.extend_from_slice(b"only a few bytes");
    match read_request(&mut &frame[..]) {
        Err(WireError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn too_many_wait_keys_rejected() {
    let mut frame = vec![OP_WAIT];
    frame.extend_from_slice(&(MAX_WAIT_KEYS as u32 + 1).to_le_bytes());
    assert!(matches!(
        read_request(&mut &frame[..]),
        Err(WireError::Invalid(_))
    ));
}

#[test]
fn non_utf8_key_rejected() {
    let mut frame = vec![OP_TRY_GET];
    frame.extend_from_slice(&2u32.to_le_bytes());
    frame.extend_from_slice(&[0xff, 0xfe]);
    match read_request(&mut &frame[..]) {
        Err(WireError::Invalid(reason)) => assert!(reason.contains("UTF-8"), "{reason}"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn oversized_key_list_rejected() {
    let key = "k".repeat(MAX_KEY_LEN);
    let count = MAX_KEY_LIST_BYTES / MAX_KEY_LEN + 1;
    let keys = vec![Cow::Borrowed(key.as_str()); count];
    let mut out = Vec::new();
    assert!(encode_request(
        &Request::Wait {
            keys,
            timeout_ms: 0
        },
        &mut out
    )
    .is_err());
    // Hand-build the frame the encoder refuses to make.
    let mut frame = vec![OP_WAIT];
    frame.extend_from_slice(&(count as u32).to_le_bytes());
    for _ in 0..count {
        frame.extend_from_slice(&(MAX_KEY_LEN as u32).to_le_bytes());
        frame.extend_from_slice(key.as_bytes());
    }
    frame.extend_from_slice(&0u64.to_le_bytes());
    match read_request(&mut &frame[..]) {
        Err(WireError::Invalid(reason)) => assert!(reason.contains("key list"), "{reason}"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn unknown_opcode_and_tag_rejected() {
    assert!(matches!(
        read_request(&mut &[0x42u8][..]),
        Err(WireError::Invalid(_))
    ));
    assert!(matches!(
        read_response(&mut &[0x42u8][..]),
        Err(WireError::Invalid(_))
    ));
}

#[test]
fn bad_bool_rejected() {
    assert!(matches!(
        read_response(&mut &[R_EXISTED, 2][..]),
        Err(WireError::Invalid(_))
    ));
}

#[test]
fn encoder_refuses_oversized_fields() {
    let long = "k".repeat(MAX_KEY_LEN + 1);
    let mut out = Vec::new();
    assert!(encode_request(&Request::TryGet { key: long.into() }, &mut out).is_err());
    let keys = vec![Cow::Borrowed("k"); MAX_WAIT_KEYS + 1];
    assert!(encode_request(
        &Request::Wait {
            keys,
            timeout_ms: 0
        },
        &mut out
    )
    .is_err());
}

#[test]
fn long_messages_are_cut_on_a_char_boundary() {
    let message = "é".repeat(MAX_MESSAGE_LEN);
    let mut out = Vec::new();
    encode_response(&Response::Err(RemoteError::Other { message }), &mut out).unwrap();
    match read_response(&mut &out[..]).unwrap() {
        Response::Err(RemoteError::Other { message }) => {
            assert_eq!(message.len(), MAX_MESSAGE_LEN);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn several_frames_in_one_stream() {
    let mut bytes = encode_req(&Request::NumKeys);
    bytes.extend(encode_req(&Request::Delete { key: "a".into() }));
    let mut r = &bytes[..];
    assert_eq!(read_request(&mut r).unwrap(), Some(Request::NumKeys));
    assert_eq!(
        read_request(&mut r).unwrap(),
        Some(Request::Delete { key: "a".into() })
    );
    assert_eq!(read_request(&mut r).unwrap(), None);
}

fn arb_key() -> impl Strategy<Value = String> {
    ".{0,12}"
}

fn arb_value() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..48)
}

fn arb_request() -> impl Strategy<Value = Request<'static>> {
    prop_oneof![
        (arb_key(), arb_value()).prop_map(|(k, v)| Request::Set {
            key: k.into(),
            value: v.into()
        }),
        (arb_key(), any::<u64>()).prop_map(|(k, t)| Request::Get {
            key: k.into(),
            timeout_ms: t
        }),
        arb_key().prop_map(|k| Request::TryGet { key: k.into() }),
        (proptest::collection::vec(arb_key(), 0..6), any::<u64>()).prop_map(|(ks, t)| {
            Request::Wait {
                keys: ks.into_iter().map(Cow::Owned).collect(),
                timeout_ms: t,
            }
        }),
        (arb_key(), any::<i64>()).prop_map(|(k, d)| Request::Add {
            key: k.into(),
            delta: d
        }),
        (arb_key(), proptest::option::of(arb_value()), arb_value()).prop_map(|(k, e, d)| {
            Request::CompareSet {
                key: k.into(),
                expected: e.map(Cow::Owned),
                desired: d.into(),
            }
        }),
        arb_key().prop_map(|k| Request::Delete { key: k.into() }),
        Just(Request::NumKeys),
    ]
}

fn arb_response() -> impl Strategy<Value = Response> {
    let reply = prop_oneof![
        Just(Reply::Done),
        arb_value().prop_map(Reply::Value),
        proptest::option::of(arb_value()).prop_map(Reply::MaybeValue),
        any::<i64>().prop_map(Reply::Counter),
        Just(Reply::Swapped),
        proptest::option::of(arb_value()).prop_map(Reply::Mismatch),
        any::<bool>().prop_map(Reply::Existed),
        any::<u64>().prop_map(Reply::Count),
    ];
    let error = prop_oneof![
        (proptest::collection::vec(arb_key(), 0..6), any::<u64>())
            .prop_map(|(keys, waited_ms)| RemoteError::Timeout { keys, waited_ms }),
        arb_key().prop_map(|key| RemoteError::NotACounter { key }),
        (arb_key(), any::<i64>(), any::<i64>()).prop_map(|(key, current, delta)| {
            RemoteError::CounterOverflow {
                key,
                current,
                delta,
            }
        }),
        (arb_key(), arb_key()).prop_map(|(key, reason)| RemoteError::InvalidKey { key, reason }),
        (arb_key(), any::<u64>(), any::<u64>())
            .prop_map(|(what, len, max)| RemoteError::TooLarge { what, len, max }),
        Just(RemoteError::ShuttingDown),
        arb_key().prop_map(|message| RemoteError::Other { message }),
    ];
    prop_oneof![reply.prop_map(Response::Ok), error.prop_map(Response::Err)]
}

proptest! {
    #[test]
    fn request_round_trip(req in arb_request()) {
        let bytes = encode_req(&req);
        let mut r = &bytes[..];
        prop_assert_eq!(read_request(&mut r).unwrap(), Some(req));
        prop_assert!(r.is_empty(), "decoder left {} bytes", r.len());
    }

    #[test]
    fn response_round_trip(resp in arb_response()) {
        let mut bytes = Vec::new();
        encode_response(&resp, &mut bytes).unwrap();
        let mut r = &bytes[..];
        prop_assert_eq!(read_response(&mut r).unwrap(), resp);
        prop_assert!(r.is_empty(), "decoder left {} bytes", r.len());
    }

    #[test]
    fn truncated_request_is_an_error(req in arb_request(), cut in any::<prop::sample::Index>()) {
        let bytes = encode_req(&req);
        let cut = cut.index(bytes.len());
        // Any strict, non-empty prefix is incomplete and must fail (never panic).
        if cut > 0 {
            prop_assert!(read_request(&mut &bytes[..cut]).is_err());
        }
    }

    #[test]
    fn random_bytes_never_panic_request_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut r = &bytes[..];
        // Decode frames until the input is exhausted or invalid.
        for _ in 0..bytes.len() + 1 {
            match read_request(&mut r) {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => break,
            }
        }
    }

    #[test]
    fn random_bytes_never_panic_response_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = read_response(&mut &bytes[..]);
    }

    #[test]
    fn random_frame_after_valid_opcode_never_panics(
        op in 1u8..=8,
        tail in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        let mut bytes = vec![op];
        bytes.extend(tail);
        let _ = read_request(&mut &bytes[..]);
    }

    #[test]
    fn random_handshake_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
        let _ = server_handshake(&mut duplex(bytes.clone()));
        let _ = client_handshake(&mut duplex(bytes));
    }
}
