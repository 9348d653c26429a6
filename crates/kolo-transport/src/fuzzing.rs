//! Entry points for kolo's fuzz targets (the `kolo-fuzz` crate): the transports' real decoders of
//! what a peer sends (TCP hello and frames, the shared-memory message prefix), and seed inputs made
//! by their real encoders. Not a stable API.
//!
//! Each entry point returns what it accepted and panics only on a broken invariant (a decoded frame
//! or header that does not survive re-encoding), which the fuzzer reports as a crash.

use kolo_core::{Algorithm, Call, DType, Header, OpKind, ReduceOp, Tag, TagSpace};

use crate::shm::prefix::{
    decode_prefix, encode_in_place_prefix, encode_prefix, encode_rewind_prefix, prefix_len,
    PREFIX_MAX,
};
use crate::tcp::frame::{self, Hello, Kind, HELLO_LEN};

/// Largest data payload the frame target accepts (small, so that the fuzzer's time goes to parsing).
const MAX_DATA: u64 = 1 << 16;

fn check_header(header: &Header) {
    let again = Header::decode(&header.encode());
    assert_eq!(again, Ok(*header), "header changed in a round trip");
}

/// Decodes a TCP hello from the first [`HELLO_LEN`] bytes; a decoded hello must encode to the same
/// bytes.
pub fn tcp_hello(data: &[u8]) -> Option<Hello> {
    let b: &[u8; HELLO_LEN] = data.get(..HELLO_LEN)?.try_into().ok()?;
    let hello = Hello::decode(b).ok()?;
    assert_eq!(&hello.encode(), b, "hello changed in a round trip");
    Some(hello)
}

/// Reads TCP frames until the first error or the end of `data`; every decoded frame must write and
/// read back to itself. Returns how many frames were decoded.
pub fn tcp_frames(mut data: &[u8]) -> usize {
    let mut n = 0;
    while let Ok(f) = frame::read_frame(&mut data, MAX_DATA) {
        check_header(&f.header);
        let mut out = Vec::new();
        if let Err(e) = frame::write_frame(&mut out, f.kind, &f.header, &f.payload) {
            panic!("frame {f:?} does not encode: {e}");
        }
        match frame::read_frame(&mut out.as_slice(), MAX_DATA) {
            Ok(again) => assert_eq!(again, f, "frame changed in a round trip"),
            Err(e) => panic!("re-encoded frame {f:?} does not decode: {e:?}"),
        }
        n += 1;
    }
    n
}

/// Decodes a shared-memory message prefix (either form) from the first bytes of `data`, with the
/// limit on a message's length taken from the 8 bytes after it. Returns the header and length when
/// accepted.
pub fn shm_prefix(data: &[u8]) -> Option<(Header, usize)> {
    let word: [u8; 8] = data.get(..8)?.try_into().ok()?;
    let n = prefix_len(word);
    let max = data
        .get(n..n + 8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(u64::MAX, u64::from_le_bytes);
    let p = &data[..data.len().min(PREFIX_MAX)];
    let d = decode_prefix(p, max)?.ok()?;
    assert_eq!(d.bytes, n, "a prefix decoded with the other form's length");
    let (header, len) = (d.header, d.len);
    check_header(&header);
    assert!(
        len as u64 <= max,
        "length {len} above the limit {max} was accepted"
    );
    let again = match (d.in_place, d.rewind) {
        (true, _) => encode_in_place_prefix(&header, len),
        (false, true) => encode_rewind_prefix(&header, len),
        (false, false) => encode_prefix(&header, len),
    };
    // A full prefix of what fits the compact form comes back compact; either form, the same.
    let again = again.to_vec();
    if again.len() == n {
        assert_eq!(&again[..], &p[..n], "prefix changed in a round trip");
    }
    match decode_prefix(&again, max) {
        Some(Ok(back)) => assert_eq!(
            (back.header, back.len, back.in_place, back.rewind),
            (header, len, d.in_place, d.rewind),
            "prefix changed in a round trip"
        ),
        other => panic!("a re-encoded prefix does not decode: {other:?}"),
    }
    Some((header, len))
}

fn headers() -> [Header; 2] {
    [
        Header {
            ack: false,
            tag: Tag {
                group: 9,
                space: TagSpace::Collective,
                value: 3,
            },
            call: Call {
                op: OpKind::AllReduce,
                dtype: Some(DType::F32),
                reduce: Some(ReduceOp::Sum),
                count: 4,
                root: None,
                algo: Algorithm::Ring,
            },
        },
        Header {
            ack: true,
            tag: Tag {
                group: 0,
                space: TagSpace::P2p,
                value: 77,
            },
            call: Call {
                op: OpKind::Send,
                dtype: Some(DType::U8),
                reduce: None,
                count: 5,
                root: Some(1),
                algo: Algorithm::Linear,
            },
        },
    ]
}

/// Valid inputs from the real encoders, by name: a hello, frames of every kind, shared-memory
/// prefixes (each followed by a limit).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let [h0, h1] = headers();
    let hello = Hello {
        rank: 1,
        size: 4,
        world: 0x1234_5678_9abc_def0,
    }
    .encode()
    .to_vec();
    let mut frames = Vec::new();
    let writes = [
        (Kind::Data, &h0, &b"\x01\x02\x03\x04"[..]),
        (Kind::Data, &h1, &b"hello"[..]),
        (Kind::Heartbeat, &h0, &[][..]),
        (Kind::Abort, &h0, &b"rank 2 failed"[..]),
        (Kind::Goodbye, &h0, &[][..]),
    ];
    for (kind, header, payload) in writes {
        // Writing into a Vec cannot fail.
        let _ = frame::write_frame(&mut frames, kind, header, payload);
    }
    let mut shm = encode_prefix(&h0, 16).to_vec();
    shm.extend_from_slice(&(1u64 << 20).to_le_bytes());
    let mut shm_ack = encode_prefix(&h1, 5).to_vec();
    shm_ack.extend_from_slice(&4u64.to_le_bytes());
    let mut shm_rewind = encode_rewind_prefix(&h0, 4).to_vec();
    shm_rewind.extend_from_slice(&(1u64 << 20).to_le_bytes());
    // A count over 2^32 takes the full form.
    let mut big = h0;
    big.call.count = 1 << 40;
    let mut shm_full = encode_prefix(&big, 16).to_vec();
    shm_full.extend_from_slice(&(1u64 << 20).to_le_bytes());
    vec![
        ("hello", hello),
        ("frames", frames),
        ("shm", shm),
        ("shm-over-limit", shm_ack),
        ("shm-rewind", shm_rewind),
        ("shm-full", shm_full),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_accepted_and_limits_hold() {
        let seeds: std::collections::HashMap<_, _> = seeds().into_iter().collect();
        assert!(tcp_hello(&seeds["hello"]).is_some());
        assert_eq!(tcp_frames(&seeds["frames"]), 5);
        assert_eq!(shm_prefix(&seeds["shm"]).map(|(_, len)| len), Some(16));
        assert_eq!(shm_prefix(&seeds["shm-over-limit"]), None);
        assert_eq!(
            shm_prefix(&seeds["shm-rewind"]).map(|(_, len)| len),
            Some(4)
        );
        let full = &seeds["shm-full"];
        assert_eq!(full.len(), PREFIX_MAX + 8, "a full-form seed");
        assert_eq!(
            shm_prefix(full).map(|(h, len)| (h.call.count, len)),
            Some((1 << 40, 16))
        );
        assert_eq!(seeds["shm"].len(), crate::shm::prefix::PREFIX_COMPACT + 8);
        assert!(tcp_hello(&[0; HELLO_LEN]).is_none());
    }
}
