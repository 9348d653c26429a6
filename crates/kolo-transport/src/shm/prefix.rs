//! The prefix of a message in a shared-memory ring: `len: u64 LE | header: HEADER_LEN bytes`.
//!
//! The peer writes it into memory this process reads, so decoding trusts nothing in it.

use kolo_core::{Header, HEADER_LEN};

/// Bytes before a message's payload.
pub(crate) const PREFIX: usize = 8 + HEADER_LEN;

/// Encodes the prefix of a `len`-byte message.
#[inline]
pub(crate) fn encode_prefix(header: &Header, len: usize) -> [u8; PREFIX] {
    let mut prefix = [0u8; PREFIX];
    prefix[..8].copy_from_slice(&(len as u64).to_le_bytes());
    prefix[8..].copy_from_slice(&header.encode());
    prefix
}

/// Decodes a prefix, refusing a message longer than `max_message` bytes (before anything is
/// allocated for it) or one that would not fit in this process's address space. The error is the
/// reason, for the protocol failure naming the peer.
#[inline]
pub(crate) fn decode_prefix(p: &[u8; PREFIX], max_message: u64) -> Result<(Header, usize), String> {
    // Read in place: copying the prefix's parts into arrays of their own made loads that
    // straddle the copy's stores, which the CPU cannot forward (a stall on every message).
    let (l, h) = p.split_at(8);
    let len = u64::from_le_bytes([l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7]]);
    let h: &[u8; HEADER_LEN] = h.try_into().map_err(|_| "short prefix".to_string())?;
    let header = Header::decode(h).map_err(|e| format!("bad message header: {}", e.0))?;
    if len > max_message {
        return Err(format!(
            "message of {len} bytes exceeds the limit of {max_message}"
        ));
    }
    let len = usize::try_from(len)
        .map_err(|_| format!("message of {len} bytes does not fit in this process's memory"))?;
    Ok((header, len))
}
