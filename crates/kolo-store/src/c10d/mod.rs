//! PyTorch's c10d `TCPStore` wire protocol: a client ([`C10dStore`]) that lets kolo's rendezvous run
//! on the store torchrun's agent already hosts, and a small server ([`C10dStoreServer`]) that speaks
//! the same protocol (for tests, and for hosting a store PyTorch processes can use).
//!
//! The protocol, as PyTorch's `TCPStore.cpp` and its libuv server implement it: a client opens a
//! TCP connection and sends `VALIDATE` with a magic number; then each request is one query-type
//! byte followed by its arguments. Integers are in the host's byte order (little-endian on every
//! platform kolo supports); strings and byte vectors are a `u64` length followed by the bytes.
//!
//! | query | arguments | reply |
//! |---|---|---|
//! | `VALIDATE` (0) | `u32` magic `0x3C85F7CE` | none |
//! | `SET` (1) | key, value | none |
//! | `COMPARE_SET` (2) | key, expected, desired | the value after the call |
//! | `GET` (3) | key | value (the key must exist: clients `WAIT` first) |
//! | `ADD` (4) | key, `i64` delta | `i64` new value (stored as decimal text) |
//! | `CHECK` (5) | `u64` n, n keys | `u8`: 0 ready, 1 not ready |
//! | `WAIT` (6) | `u64` n, n keys | `u8` 0 (stop waiting) once every key exists |
//! | `GETNUMKEYS` (7) | | `i64` |
//! | `DELETE_KEY` (8) | key | `i64` number deleted |
//! | `CANCEL_WAIT` (12) | | `u8` 1 (wait canceled) |
//! | `PING` (13) | `u32` nonce | the nonce |
//!
//! A wait that times out sends `CANCEL_WAIT`; the server answers `WAIT_CANCELED`, possibly after a
//! `STOP_WAITING` that crossed the cancel on the wire.
//!
//! The protocol has no authentication: anyone who can reach the port can read and write the store
//! (as with torchrun itself). kolo's TCP data connections still authenticate with the job secret
//! when one is set.

mod client;
mod request;
pub(crate) mod server;

use std::io::{self, Read, Write};

pub use client::C10dStore;
pub use server::C10dStoreServer;

pub(crate) use request::{decode_all as decode_requests, seed as request_seed};

/// The number a client sends with `VALIDATE`.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// Query types (the first byte of every request).
pub(crate) mod query {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const COMPARE_SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const CHECK: u8 = 5;
    pub const WAIT: u8 = 6;
    pub const GETNUMKEYS: u8 = 7;
    pub const DELETE_KEY: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const MULTI_GET: u8 = 10;
    pub const MULTI_SET: u8 = 11;
    pub const CANCEL_WAIT: u8 = 12;
    pub const PING: u8 = 13;
}

/// `CHECK` replies.
pub(crate) const CHECK_READY: u8 = 0;
pub(crate) const CHECK_NOT_READY: u8 = 1;
/// `WAIT` replies.
pub(crate) const STOP_WAITING: u8 = 0;
pub(crate) const WAIT_CANCELED: u8 = 1;

/// Longest key either side accepts (PyTorch's libuv server accepts 128 KiB).
pub(crate) const MAX_KEY: u64 = 128 * 1024;
/// Largest value either side accepts.
pub(crate) const MAX_VALUE: u64 = crate::MAX_VALUE_LEN as u64;
/// Most keys in one `CHECK`/`WAIT`/`MULTI_*`.
pub(crate) const MAX_KEYS: u64 = crate::MAX_WAIT_KEYS as u64;

/// Appends a length-prefixed byte string.
pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

pub(crate) fn read_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

pub(crate) fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

pub(crate) fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

pub(crate) fn read_i64(r: &mut impl Read) -> io::Result<i64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(i64::from_le_bytes(b))
}

/// Reads a length-prefixed byte string of at most `max` bytes. The buffer grows with the bytes
/// that arrive, so an announced length alone reserves no memory.
pub(crate) fn read_bytes(r: &mut impl Read, max: u64, what: &str) -> io::Result<Vec<u8>> {
    let len = read_u64(r)?;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} of {len} bytes is over the limit of {max}"),
        ));
    }
    let mut out = Vec::new();
    let got = r.take(len).read_to_end(&mut out)?;
    if (got as u64) < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(out)
}

/// Reads a length-prefixed UTF-8 key.
pub(crate) fn read_key(r: &mut impl Read) -> io::Result<String> {
    let bytes = read_bytes(r, MAX_KEY, "key")?;
    String::from_utf8(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a key is not UTF-8"))
}

/// Reads a key count, bounded.
pub(crate) fn read_count(r: &mut impl Read) -> io::Result<u64> {
    let n = read_u64(r)?;
    if n > MAX_KEYS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{n} keys in one request is over the limit of {MAX_KEYS}"),
        ));
    }
    Ok(n)
}

/// Writes all of `bytes`.
pub(crate) fn send(w: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    w.write_all(bytes)?;
    w.flush()
}
