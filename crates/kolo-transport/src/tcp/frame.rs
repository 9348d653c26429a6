//! Wire framing of the TCP transport, kept free of sockets so it can be tested on byte buffers.
//!
//! After the handshake, a connection carries frames:
//!
//! ```text
//! kind: u8 | header: 33 bytes (kolo_core::Header) | len: u64 LE | payload: len bytes
//! ```
//!
//! `kind` is `DATA` (a message), `ABORT` (payload: the aborting rank's error, UTF-8) or `GOODBYE`
//! (clean close; header and payload unused). A length above the receiver's limit is a protocol error
//! before anything is allocated.
//!
//! The handshake, sent by the connecting (higher) rank and answered with one byte by the acceptor:
//!
//! ```text
//! magic "KOLO" u32 LE | version u16 LE | rank u32 LE | size u32 LE | world id u64 LE
//! ```

use std::io::{self, IoSlice, Read, Write};

use kolo_core::{Header, HEADER_LEN};

/// Connection magic, "KOLO".
pub const MAGIC: u32 = 0x4F4C_4F4B;
/// Protocol version.
pub const VERSION: u16 = 1;
/// Bytes in a hello.
pub const HELLO_LEN: usize = 22;
/// Longest abort reason accepted.
pub const MAX_REASON: usize = 64 * 1024;
/// Most memory reserved for a payload before its bytes arrive.
const INITIAL_ALLOCATION: usize = 16 << 20;
/// Bytes before a frame's payload.
pub const PREFIX_LEN: usize = 1 + HEADER_LEN + 8;

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A message.
    Data = 1,
    /// The sender aborted; payload is its reason.
    Abort = 2,
    /// The sender closed cleanly.
    Goodbye = 3,
    /// Nothing but a sign of life (sent every second while the link is idle).
    Heartbeat = 4,
}

/// The connecting side's introduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Connecting rank.
    pub rank: u32,
    /// World size it believes in.
    pub size: u32,
    /// Identity of the world (hash of the rendezvous prefix), so that connections from another job or
    /// an earlier incarnation are refused.
    pub world: u64,
}

impl Hello {
    /// Encodes.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..10].copy_from_slice(&self.rank.to_le_bytes());
        b[10..14].copy_from_slice(&self.size.to_le_bytes());
        b[14..22].copy_from_slice(&self.world.to_le_bytes());
        b
    }

    /// Decodes, checking magic and version.
    pub fn decode(b: &[u8; HELLO_LEN]) -> Result<Hello, &'static str> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if u32_at(0) != MAGIC {
            return Err("bad magic (not a kolo connection)");
        }
        if u16::from_le_bytes([b[4], b[5]]) != VERSION {
            return Err("unsupported protocol version");
        }
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[14..22]);
        Ok(Hello {
            rank: u32_at(6),
            size: u32_at(10),
            world: u64::from_le_bytes(w),
        })
    }
}

/// Encodes a frame prefix.
pub fn encode_prefix(kind: Kind, header: &Header, len: u64) -> [u8; PREFIX_LEN] {
    let mut b = [0u8; PREFIX_LEN];
    b[0] = kind as u8;
    b[1..1 + HEADER_LEN].copy_from_slice(&header.encode());
    b[1 + HEADER_LEN..].copy_from_slice(&len.to_le_bytes());
    b
}

/// Writes one frame: prefix and payload in one gathering write (`writev`), so that a frame costs one
/// system call and goes out without a packet of its own for the prefix, and nothing is copied.
pub fn write_frame(
    w: &mut impl Write,
    kind: Kind,
    header: &Header,
    payload: &[u8],
) -> io::Result<()> {
    let prefix = encode_prefix(kind, header, payload.len() as u64);
    let mut parts = [IoSlice::new(&prefix), IoSlice::new(payload)];
    let mut rest = &mut parts[..];
    while !rest.is_empty() {
        match w.write_vectored(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A decoded frame.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    /// Kind.
    pub kind: Kind,
    /// Header (meaningful for `Data`).
    pub header: Header,
    /// Payload.
    pub payload: Vec<u8>,
}

/// Why reading a frame failed.
#[derive(Debug)]
pub enum ReadError {
    /// Clean end of stream at a frame boundary.
    Eof,
    /// I/O error (including end of stream inside a frame).
    Io(io::Error),
    /// Bytes that are not a valid frame.
    Invalid(String),
}

/// A frame's kind, header and payload length, read before its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    /// Kind.
    pub kind: Kind,
    /// Header (meaningful for `Data`).
    pub header: Header,
    /// Payload bytes that follow.
    pub len: usize,
}

/// Reads a frame's prefix, refusing a payload longer than `max_len` (for data; control frames have
/// their own small limits) before anything is allocated for it.
pub fn read_prefix(r: &mut impl Read, max_len: u64) -> Result<Prefix, ReadError> {
    let mut prefix = [0u8; PREFIX_LEN];
    // Distinguish a clean EOF (no byte of the next frame) from a truncated frame.
    let mut got = 0;
    while got < PREFIX_LEN {
        match r.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Eof),
            Ok(0) => {
                return Err(ReadError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a frame header",
                )))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let kind = match prefix[0] {
        1 => Kind::Data,
        2 => Kind::Abort,
        3 => Kind::Goodbye,
        4 => Kind::Heartbeat,
        k => return Err(ReadError::Invalid(format!("unknown frame kind {k}"))),
    };
    let mut hb = [0u8; HEADER_LEN];
    hb.copy_from_slice(&prefix[1..1 + HEADER_LEN]);
    let header = Header::decode(&hb).map_err(|e| ReadError::Invalid(e.0.to_string()))?;
    let mut lb = [0u8; 8];
    lb.copy_from_slice(&prefix[1 + HEADER_LEN..]);
    let len = u64::from_le_bytes(lb);
    // Control frames are small: an abort carries a reason, the others nothing.
    let limit = match kind {
        Kind::Data => max_len,
        Kind::Abort => MAX_REASON as u64,
        Kind::Goodbye | Kind::Heartbeat => 0,
    };
    if len > limit {
        return Err(ReadError::Invalid(format!(
            "{kind:?} frame of {len} bytes exceeds the limit of {limit}"
        )));
    }
    let len = usize::try_from(len).map_err(|_| {
        ReadError::Invalid(format!(
            "{kind:?} frame of {len} bytes exceeds the address space"
        ))
    })?;
    Ok(Prefix { kind, header, len })
}

/// Reads a payload of `len` bytes into `payload` (emptied first; a buffer with room to spare is
/// reused without reallocating). Memory grows with the bytes that actually arrive, not with what the
/// header announced, so a peer cannot make the receiver reserve more than it sends (plus one step).
pub fn read_payload(r: &mut impl Read, len: usize, payload: &mut Vec<u8>) -> io::Result<()> {
    if payload.len() > len {
        payload.truncate(len);
    }
    let mut filled = 0;
    while filled < len {
        let end = len.min(filled + INITIAL_ALLOCATION);
        if payload.len() < end {
            payload.resize(end, 0);
        }
        if let Err(e) = r.read_exact(&mut payload[filled..end]) {
            return Err(if e.kind() == io::ErrorKind::UnexpectedEof {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("connection closed inside a payload of {len} bytes"),
                )
            } else {
                e
            });
        }
        filled = end;
    }
    Ok(())
}

/// Reads one frame, refusing payloads longer than `max_len` before allocating.
pub fn read_frame(r: &mut impl Read, max_len: u64) -> Result<Frame, ReadError> {
    let Prefix { kind, header, len } = read_prefix(r, max_len)?;
    let mut payload = Vec::new();
    read_payload(r, len, &mut payload).map_err(ReadError::Io)?;
    Ok(Frame {
        kind,
        header,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_core::{Algorithm, Call, DType, OpKind, ReduceOp, Tag, TagSpace};
    use proptest::prelude::*;

    fn header() -> Header {
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
        }
    }

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        let big = vec![7u8; 100_000];
        write_frame(&mut buf, Kind::Data, &header(), b"abcd").ok();
        write_frame(&mut buf, Kind::Data, &header(), &big).ok();
        write_frame(&mut buf, Kind::Goodbye, &header(), &[]).ok();
        let mut r = &buf[..];
        let f = read_frame(&mut r, 1 << 20);
        assert!(matches!(f, Ok(Frame { kind: Kind::Data, ref payload, .. }) if payload == b"abcd"));
        let f = read_frame(&mut r, 1 << 20);
        assert!(matches!(f, Ok(Frame { ref payload, .. }) if payload.len() == 100_000));
        assert!(matches!(
            read_frame(&mut r, 1 << 20),
            Ok(Frame {
                kind: Kind::Goodbye,
                ..
            })
        ));
        assert!(matches!(read_frame(&mut r, 1 << 20), Err(ReadError::Eof)));
    }

    #[test]
    fn oversized_and_truncated_frames_are_errors() {
        let mut buf = Vec::new();
        write_frame(&mut buf, Kind::Data, &header(), &[1u8; 100]).ok();
        assert!(matches!(
            read_frame(&mut &buf[..], 99),
            Err(ReadError::Invalid(_))
        ));
        assert!(matches!(
            read_frame(&mut &buf[..50], 1000),
            Err(ReadError::Io(_))
        ));
        assert!(matches!(
            read_frame(&mut &buf[..10], 1000),
            Err(ReadError::Io(_))
        ));
    }

    #[test]
    fn control_frames_are_bounded_and_announced_lengths_allocate_nothing() {
        // An abort announcing more than a reason may hold, a heartbeat with a payload.
        for (kind, len) in [(Kind::Abort, MAX_REASON as u64 + 1), (Kind::Heartbeat, 1)] {
            let mut b = encode_prefix(kind, &header(), len).to_vec();
            b.extend(std::iter::repeat_n(0u8, 8));
            assert!(matches!(
                read_frame(&mut &b[..], 1 << 40),
                Err(ReadError::Invalid(_))
            ));
        }
        // A data frame announcing 1 TiB but carrying 3 bytes: an error, without reserving a TiB.
        let mut b = encode_prefix(Kind::Data, &header(), 1 << 40).to_vec();
        b.extend([1, 2, 3]);
        assert!(matches!(
            read_frame(&mut &b[..], 1 << 40),
            Err(ReadError::Io(_))
        ));
    }

    #[test]
    fn hello_round_trip_and_bad_magic() {
        let h = Hello {
            rank: 3,
            size: 5,
            world: 77,
        };
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
        let mut b = h.encode();
        b[0] ^= 1;
        assert!(Hello::decode(&b).is_err());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut r = &bytes[..];
            for _ in 0..4 {
                if read_frame(&mut r, 1 << 16).is_err() { break; }
            }
        }
    }
}
