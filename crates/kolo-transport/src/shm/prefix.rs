//! The prefix of a message in a shared-memory ring: `len: u64 LE | header: HEADER_LEN bytes`.
//!
//! The length's top bit ([`IN_PLACE`]) marks a message sent in place: what follows the prefix in the
//! ring is not the payload but its address in the sender's memory (see `single_copy`). The next
//! bit ([`REWIND`]) marks a message after which the stream goes on at the ring's start (see
//! `ring`).
//!
//! The peer writes it into memory this process reads, so decoding trusts nothing in it.

use kolo_core::{Header, HEADER_LEN};

/// Bytes before a message's payload.
pub(crate) const PREFIX: usize = 8 + HEADER_LEN;

/// The bit of the length word that marks a message sent in place.
pub(crate) const IN_PLACE: u64 = 1 << 63;

/// The bit of the length word that marks a message after which the stream goes on at the start of
/// the ring's next lap.
pub(crate) const REWIND: u64 = 1 << 62;

/// Bytes after the prefix of a message sent in place: the payload's address in the sender.
pub(crate) const IN_PLACE_BYTES: usize = 8;

/// Encodes the prefix of a `len`-byte message.
#[inline]
pub(crate) fn encode_prefix(header: &Header, len: usize) -> [u8; PREFIX] {
    encode_prefix_as(header, len as u64)
}

/// Encodes the prefix of a `len`-byte message after which the stream goes on at the ring's start.
#[inline]
pub(crate) fn encode_rewind_prefix(header: &Header, len: usize) -> [u8; PREFIX] {
    encode_prefix_as(header, len as u64 | REWIND)
}

/// Encodes the prefix of a `len`-byte message sent in place.
#[inline]
pub(crate) fn encode_in_place_prefix(header: &Header, len: usize) -> [u8; PREFIX] {
    encode_prefix_as(header, len as u64 | IN_PLACE)
}

#[inline]
fn encode_prefix_as(header: &Header, word: u64) -> [u8; PREFIX] {
    let mut prefix = [0u8; PREFIX];
    prefix[..8].copy_from_slice(&word.to_le_bytes());
    prefix[8..].copy_from_slice(&header.encode());
    prefix
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
}

/// Decodes a prefix, refusing a message longer than `max_message` bytes (before anything is
/// allocated for it) or one that would not fit in this process's address space. The error is the
/// reason, for the protocol failure naming the peer.
#[inline]
pub(crate) fn decode_prefix(p: &[u8; PREFIX], max_message: u64) -> Result<Prefix, String> {
    // Read in place: copying the prefix's parts into arrays of their own made loads that
    // straddle the copy's stores, which the CPU cannot forward (a stall on every message).
    let (l, h) = p.split_at(8);
    let word = u64::from_le_bytes([l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7]]);
    let (len, in_place, rewind) = (
        word & !(IN_PLACE | REWIND),
        word & IN_PLACE != 0,
        word & REWIND != 0,
    );
    if in_place && rewind {
        return Err("a message sent in place marked to rewind the ring".into());
    }
    let h: &[u8; HEADER_LEN] = h.try_into().map_err(|_| "short prefix".to_string())?;
    let header = Header::decode(h).map_err(|e| format!("bad message header: {}", e.0))?;
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
    })
}
