//! The prefix of a message in a shared-memory ring, in one of two forms told apart by the first
//! word's [`COMPACT`] bit:
//!
//! - **compact**, [`PREFIX_COMPACT`] bytes, for nearly every message (a length, tag value and
//!   count under 2³², a root under 1023): `word | group: u64 LE | tag value: u32 LE | count:
//!   u32 LE`, the word holding the length (bits 0–31), the tag space (32–33), the ack bit (34),
//!   the operation (35–39), element type (40–42), reduce operator (43–45), algorithm (46–50) and
//!   root (51–60, all ones for none). A message starts on a cache line, so the compact form leaves
//!   40 bytes of the line to the payload (the full form 23): the size of a small message that
//!   crosses between cores in one line, about Open MPI's (its headers take 24 bytes too);
//! - **full**, [`PREFIX_MAX`] bytes: `len: u64 LE | header: HEADER_LEN bytes` (kolo_core's
//!   encoding), for everything else.
//!
//! The length word's top bit ([`IN_PLACE`]) marks a message sent in place: what follows the
//! prefix in the ring is not the payload but its address in the sender's memory (see
//! `single_copy`). The next bit ([`REWIND`]) marks a message after which the stream goes on at the
//! ring's start (see `ring`).
//!
//! The peer writes it into memory this process reads, so decoding trusts nothing in it.

use kolo_core::{Algorithm, Call, DType, Header, OpKind, ReduceOp, Tag, TagSpace, HEADER_LEN};

/// Bytes of the full form of a prefix, the longest.
pub(crate) const PREFIX_MAX: usize = 8 + HEADER_LEN;

/// Bytes of the compact form, the shortest: a prefix has arrived whole once this much has and
/// its first word says it is compact.
pub(crate) const PREFIX_COMPACT: usize = 24;

/// The bit of the length word that marks a message sent in place.
pub(crate) const IN_PLACE: u64 = 1 << 63;

/// The bit of the length word that marks a message after which the stream goes on at the start of
/// the ring's next lap.
pub(crate) const REWIND: u64 = 1 << 62;

/// The bit of the length word that marks the compact form.
pub(crate) const COMPACT: u64 = 1 << 61;

/// The bits of the full form's length word that are the length.
const FULL_LEN: u64 = COMPACT - 1;

/// Bytes after the prefix of a message sent in place: the payload's address in the sender.
pub(crate) const IN_PLACE_BYTES: usize = 8;

/// The compact word's root field (10 bits) when there is no root.
const NO_ROOT: u64 = 0x3ff;

/// An encoded prefix, in either form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoded {
    /// The compact form's three words (written into the ring with a store each).
    Compact([u64; 3]),
    /// The full form's bytes.
    Full([u8; PREFIX_MAX]),
}

impl Encoded {
    /// The prefix's bytes: the first [`Self::len`] of the array.
    #[inline]
    pub(crate) fn bytes(&self) -> [u8; PREFIX_MAX] {
        match self {
            Encoded::Compact(words) => {
                let mut b = [0u8; PREFIX_MAX];
                for (chunk, w) in b.chunks_exact_mut(8).zip(words) {
                    chunk.copy_from_slice(&w.to_le_bytes());
                }
                b
            }
            Encoded::Full(b) => *b,
        }
    }

    /// The prefix's bytes, in a vector of their own.
    pub(crate) fn to_vec(self) -> Vec<u8> {
        self.bytes()[..self.len()].to_vec()
    }

    /// The same prefix marked to [`REWIND`] the ring after its message.
    #[inline]
    pub(crate) fn rewinding(self) -> Encoded {
        match self {
            Encoded::Compact([word, group, low]) => Encoded::Compact([word | REWIND, group, low]),
            Encoded::Full(mut b) => {
                let word = u64::from_le_bytes(std::array::from_fn(|i| b[i])) | REWIND;
                b[..8].copy_from_slice(&word.to_le_bytes());
                Encoded::Full(b)
            }
        }
    }

    /// How many bytes it takes.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        match self {
            Encoded::Compact(_) => PREFIX_COMPACT,
            Encoded::Full(_) => PREFIX_MAX,
        }
    }
}

/// Encodes the prefix of a `len`-byte message.
#[inline]
pub(crate) fn encode_prefix(header: &Header, len: usize) -> Encoded {
    encode_prefix_as(header, len as u64, 0)
}

/// Encodes the prefix of a `len`-byte message after which the stream goes on at the ring's start.
#[inline]
pub(crate) fn encode_rewind_prefix(header: &Header, len: usize) -> Encoded {
    encode_prefix(header, len).rewinding()
}

/// Encodes the prefix of a `len`-byte message sent in place.
#[inline]
pub(crate) fn encode_in_place_prefix(header: &Header, len: usize) -> Encoded {
    encode_prefix_as(header, len as u64, IN_PLACE)
}

#[inline]
fn encode_prefix_as(header: &Header, len: u64, flags: u64) -> Encoded {
    if let Some(word) = compact_word(header, len) {
        let (h, c) = (&header.tag, &header.call);
        // Both fit in 32 bits (`compact_word` checked).
        let low = h.value | c.count << 32;
        return Encoded::Compact([word | flags | COMPACT, h.group, low]);
    }
    let mut b = [0u8; PREFIX_MAX];
    b[..8].copy_from_slice(&(len | flags).to_le_bytes());
    b[8..].copy_from_slice(&header.encode());
    Encoded::Full(b)
}

/// The compact form's word (without flags) for `header` and `len`, if everything fits in it.
#[inline]
fn compact_word(header: &Header, len: u64) -> Option<u64> {
    let (t, c) = (&header.tag, &header.call);
    let fits = |v: u64, bits: u32| v < 1 << bits;
    let op = c.op as u64;
    let dtype = c.dtype.map_or(0, |d| d as u64);
    let reduce = c.reduce.map_or(0, |r| r as u64);
    let algo = c.algo as u64;
    let root = c.root.map_or(NO_ROOT, u64::from);
    let ok = fits(len, 32)
        && fits(t.value, 32)
        && fits(c.count, 32)
        && fits(op, 5)
        && fits(dtype, 3)
        && fits(reduce, 3)
        && fits(algo, 5)
        && (c.root.is_none() || root < NO_ROOT);
    ok.then(|| {
        len | (t.space as u64) << 32
            | u64::from(header.ack) << 34
            | op << 35
            | dtype << 40
            | reduce << 43
            | algo << 46
            | root << 51
    })
}

/// How many bytes the prefix whose first 8 bytes are `word` takes.
#[inline]
pub(crate) fn prefix_len(word: [u8; 8]) -> usize {
    if u64::from_le_bytes(word) & COMPACT != 0 {
        PREFIX_COMPACT
    } else {
        PREFIX_MAX
    }
}

/// A decoded prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Prefix {
    pub(crate) header: Header,
    /// The payload's length.
    pub(crate) len: usize,
    /// Sent in place: the ring holds the payload's address, not the payload.
    pub(crate) in_place: bool,
    /// The next message starts at the ring's next lap.
    pub(crate) rewind: bool,
    /// The prefix's own length (which form it is in).
    pub(crate) bytes: usize,
}

/// Decodes a prefix from the start of `p`, refusing a message longer than `max_message` bytes
/// (before anything is allocated for it) or one that would not fit in this process's address
/// space. `None` while `p` is shorter than the prefix (it has not arrived whole); the error is the
/// reason, for the protocol failure naming the peer.
#[inline]
pub(crate) fn decode_prefix(p: &[u8], max_message: u64) -> Option<Result<Prefix, String>> {
    let u64_at = |i: usize| -> Option<u64> {
        let b = p.get(i..i + 8)?;
        Some(u64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ]))
    };
    // Read in place: copying the prefix's parts into arrays of their own made loads that
    // straddle the copy's stores, which the CPU cannot forward (a stall on every message).
    let word = u64_at(0)?;
    let (in_place, rewind) = (word & IN_PLACE != 0, word & REWIND != 0);
    if word & COMPACT != 0 {
        return Some(decode_words([word, u64_at(8)?, u64_at(16)?], max_message));
    }
    let (header, len, bytes) = {
        let h: &[u8; HEADER_LEN] = p.get(8..PREFIX_MAX)?.try_into().ok()?;
        match Header::decode(h) {
            Ok(header) => (header, word & FULL_LEN, PREFIX_MAX),
            Err(e) => return Some(Err(format!("bad message header: {}", e.0))),
        }
    };
    Some(check(header, len, in_place, rewind, bytes, max_message))
}

/// Decodes a compact prefix from its three words (the first with [`COMPACT`] set), as
/// [`decode_prefix`] does.
#[inline]
pub(crate) fn decode_words(w: [u64; 3], max_message: u64) -> Result<Prefix, String> {
    let [word, group, low] = w;
    let header =
        decode_compact(word, group, low).map_err(|e| format!("bad message header: {e}"))?;
    let (in_place, rewind) = (word & IN_PLACE != 0, word & REWIND != 0);
    check(
        header,
        word & 0xffff_ffff,
        in_place,
        rewind,
        PREFIX_COMPACT,
        max_message,
    )
}

#[inline]
fn check(
    header: Header,
    len: u64,
    in_place: bool,
    rewind: bool,
    bytes: usize,
    max_message: u64,
) -> Result<Prefix, String> {
    if in_place && rewind {
        return Err("a message sent in place marked to rewind the ring".into());
    }
    if len > max_message {
        return Err(format!(
            "message of {len} bytes exceeds the limit of {max_message}"
        ));
    }
    let len = usize::try_from(len)
        .map_err(|_| format!("message of {len} bytes does not fit in this process's memory"))?;
    Ok(Prefix {
        header,
        len,
        in_place,
        rewind,
        bytes,
    })
}

/// The header of a compact prefix, rejecting unknown codes as [`Header::decode`] does.
#[inline]
fn decode_compact(word: u64, group: u64, low: u64) -> Result<Header, &'static str> {
    let field = |at: u32, bits: u32| ((word >> at) & ((1 << bits) - 1)) as u8;
    let space = match field(32, 2) {
        1 => TagSpace::Collective,
        2 => TagSpace::P2p,
        3 => TagSpace::Ack,
        _ => return Err("unknown tag space"),
    };
    let op = OpKind::from_code(field(35, 5)).ok_or("unknown operation code")?;
    let dtype = match field(40, 3) {
        0 => None,
        c => Some(DType::from_code(c).ok_or("unknown element type code")?),
    };
    let reduce = match field(43, 3) {
        0 => None,
        c => Some(ReduceOp::from_code(c).ok_or("unknown reduce operator code")?),
    };
    let algo = Algorithm::from_code(field(46, 5)).ok_or("unknown algorithm code")?;
    let root = match (word >> 51) & NO_ROOT {
        NO_ROOT => None,
        r => Some(r as u32),
    };
    Ok(Header {
        tag: Tag {
            group,
            space,
            value: low & 0xffff_ffff,
        },
        call: Call {
            op,
            dtype,
            reduce,
            count: low >> 32,
            root,
            algo,
        },
        ack: word >> 34 & 1 != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> Header {
        Header {
            ack: true,
            tag: Tag {
                group: 0x0123_4567_89ab_cdef,
                space: TagSpace::Collective,
                value: 7,
            },
            call: Call {
                op: OpKind::AllReduceAdasum,
                dtype: Some(DType::U8),
                reduce: Some(ReduceOp::Avg),
                count: 1000,
                root: Some(3),
                algo: Algorithm::Engine,
            },
        }
    }

    fn round_trip(h: &Header, len: usize) -> Prefix {
        let e = encode_prefix(h, len);
        assert_eq!(
            prefix_len(e.bytes()[..8].try_into().expect("8 bytes")),
            e.len()
        );
        // Not whole until every byte of it has arrived.
        assert_eq!(decode_prefix(&e.bytes()[..e.len() - 1], u64::MAX), None);
        let p = decode_prefix(&e.to_vec(), u64::MAX)
            .expect("whole")
            .expect("decodes");
        assert_eq!((p.header, p.len, p.bytes), (*h, len, e.len()));
        assert!(!p.in_place && !p.rewind);
        p
    }

    #[test]
    fn every_field_at_the_edge_of_the_compact_form() {
        let h = header();
        assert_eq!(round_trip(&h, 40).bytes, PREFIX_COMPACT);
        // Each field at the largest the compact form holds, then one more (the full form).
        type Edit = fn(&mut Header, bool);
        let edits: [(&str, Edit); 4] = [
            ("tag value", |h, over| {
                h.tag.value = u32::MAX as u64 + u64::from(over)
            }),
            ("count", |h, over| {
                h.call.count = u32::MAX as u64 + u64::from(over)
            }),
            ("root", |h, over| h.call.root = Some(1022 + u32::from(over))),
            ("no root", |h, over| {
                h.call.root = if over { Some(u32::MAX - 1) } else { None }
            }),
        ];
        for (what, edit) in edits {
            for over in [false, true] {
                let mut e = header();
                edit(&mut e, over);
                let want = if over { PREFIX_MAX } else { PREFIX_COMPACT };
                assert_eq!(round_trip(&e, 5).bytes, want, "{what}, over: {over}");
            }
        }
        assert_eq!(round_trip(&h, u32::MAX as usize).bytes, PREFIX_COMPACT);
        assert_eq!(round_trip(&h, 1 << 32).bytes, PREFIX_MAX);
    }

    #[test]
    fn the_flags_survive_both_forms() {
        let mut full = header();
        full.call.count = 1 << 40;
        for h in [header(), full] {
            let e = encode_in_place_prefix(&h, 9);
            let p = decode_prefix(&e.to_vec(), 100)
                .expect("whole")
                .expect("decodes");
            assert!(p.in_place && !p.rewind && p.header == h && p.len == 9);
            let e = encode_rewind_prefix(&h, 9);
            let p = decode_prefix(&e.to_vec(), 100)
                .expect("whole")
                .expect("decodes");
            assert!(!p.in_place && p.rewind && p.header == h && p.len == 9);
            let e = encode_prefix(&h, 101);
            let err = decode_prefix(&e.to_vec(), 100)
                .expect("whole")
                .expect_err("too long");
            assert!(err.contains("101 bytes exceeds the limit of 100"), "{err}");
        }
    }

    #[test]
    fn unknown_codes_in_a_compact_word_are_refused() {
        // (Every value of the element type's 3 bits is a type or none.)
        let e = encode_prefix(&header(), 4);
        let word = u64::from_le_bytes(e.bytes()[..8].try_into().expect("8 bytes"));
        for (at, bits, what) in [
            (32, 2, "tag space"),
            (35, 5, "operation"),
            (43, 3, "reduce operator"),
            (46, 5, "algorithm"),
        ] {
            let mask = ((1u64 << bits) - 1) << at;
            // All ones (or, for the tag space, zero): a code no variant has.
            let bad = if at == 32 { word & !mask } else { word | mask };
            let mut b = e.to_vec();
            b[..8].copy_from_slice(&bad.to_le_bytes());
            let err = decode_prefix(&b, u64::MAX).expect("whole").expect_err(what);
            assert!(err.contains(what), "{what}: {err}");
        }
    }

    fn any_header() -> impl Strategy<Value = Header> {
        (
            any::<u64>(),
            1u8..=3,
            any::<bool>(),
            prop_oneof![0u64..8, any::<u64>()],
            (0u8..32).prop_filter_map("an operation", OpKind::from_code),
            0usize..=DType::ALL.len(),
            0usize..=ReduceOp::ALL.len(),
            (0u8..32).prop_filter_map("an algorithm", Algorithm::from_code),
            prop_oneof![
                Just(None),
                (0u32..2000).prop_map(Some),
                any::<u32>().prop_map(Some)
            ],
            prop_oneof![0u64..100, any::<u64>()],
        )
            .prop_map(
                |(group, space, ack, value, op, dtype, reduce, algo, root, count)| Header {
                    ack,
                    tag: Tag {
                        group,
                        space: match space {
                            1 => TagSpace::Collective,
                            2 => TagSpace::P2p,
                            _ => TagSpace::Ack,
                        },
                        value,
                    },
                    call: Call {
                        op,
                        dtype: dtype.checked_sub(1).map(|i| DType::ALL[i]),
                        reduce: reduce.checked_sub(1).map(|i| ReduceOp::ALL[i]),
                        count,
                        root,
                        algo,
                    },
                },
            )
    }

    proptest! {
        #[test]
        fn every_header_round_trips_in_the_shortest_form_that_holds_it(
            h in any_header(),
            len in prop_oneof![0usize..100, 0usize..(1 << 40)],
        ) {
            let p = round_trip(&h, len);
            let fits = len < 1 << 32
                && h.tag.value < 1 << 32
                && h.call.count < 1 << 32
                && h.call.root.is_none_or(|r| r < 1023);
            prop_assert_eq!(p.bytes == PREFIX_COMPACT, fits);
        }

        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..=PREFIX_MAX)) {
            if let Some(Ok(p)) = decode_prefix(&bytes, u64::MAX) {
                prop_assert!(p.bytes <= bytes.len());
            }
        }
    }
}
