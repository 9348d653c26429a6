//! The TCP store's wire protocol: handshake, request and response frames.
//!
//! Everything is little-endian. A connection starts with a handshake (see
//! [`client_handshake`] / [`server_handshake`]), after which the client sends
//! one request frame and reads one response frame, repeatedly.
//!
//! Field encodings:
//!
//! * key / string: `[u32 len][len bytes of UTF-8]`, `len <= MAX_KEY_LEN`
//! * value: `[u64 len][len bytes]`, `len <= MAX_VALUE_LEN`
//! * optional value: `[u8 0]` (absent) or `[u8 1][value]`
//! * key list: `[u32 count][count keys]`, `count <= MAX_WAIT_KEYS`
//!
//! Request frame: `[u8 opcode]` followed by
//!
//! | opcode | request      | fields                                     |
//! |--------|--------------|--------------------------------------------|
//! | 1      | set          | key, value                                 |
//! | 2      | get          | key, `u64` timeout in ms                   |
//! | 3      | try_get      | key                                        |
//! | 4      | wait         | key list, `u64` timeout in ms              |
//! | 5      | add          | key, `i64` delta                           |
//! | 6      | compare_set  | key, optional expected value, desired value|
//! | 7      | delete       | key                                        |
//! | 8      | num_keys     | (none)                                     |
//!
//! Response frame: `[u8 tag]` followed by the tag's fields; tags below
//! `0x80` are successful replies, tags from `0x80` are errors (see
//! [`Reply`] and [`RemoteError`]).
//!
//! Every length is checked against its hard limit *before* anything is
//! allocated, and values are read incrementally, so a peer that announces
//! 64 MiB and sends nothing costs little memory.

use std::borrow::Cow;
use std::io;

use crate::MAX_VALUE_LEN;

mod decode;
mod encode;
mod handshake;
#[cfg(test)]
mod tests;

pub(crate) use decode::{read_request, read_response};
pub(crate) use encode::{encode_request, encode_response};
pub(crate) use handshake::{client_handshake, server_handshake};

/// First four bytes of every connection, in both directions: `"KOLS"` read
/// as a big-endian number, sent as a little-endian `u32`.
pub const MAGIC: u32 = 0x4B4F_4C53;
/// Version of the wire protocol spoken by this crate.
pub const PROTOCOL_VERSION: u16 = 2;

/// Longest free-text string (error message) in a response.
const MAX_MESSAGE_LEN: usize = 4 * 1024;
/// Most key bytes in one key list, so a `wait` frame stays bounded
/// (65536 keys of 4 KiB would otherwise be 256 MiB).
const MAX_KEY_LIST_BYTES: usize = MAX_VALUE_LEN;
/// Initial buffer for a value; it grows only as bytes actually arrive.
const READ_CHUNK: usize = 64 * 1024;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_TRY_GET: u8 = 3;
const OP_WAIT: u8 = 4;
const OP_ADD: u8 = 5;
const OP_COMPARE_SET: u8 = 6;
const OP_DELETE: u8 = 7;
const OP_NUM_KEYS: u8 = 8;

const R_DONE: u8 = 1;
const R_VALUE: u8 = 2;
const R_MAYBE_VALUE: u8 = 3;
const R_COUNTER: u8 = 4;
const R_SWAPPED: u8 = 5;
const R_MISMATCH: u8 = 6;
const R_EXISTED: u8 = 7;
const R_COUNT: u8 = 8;

const E_TIMEOUT: u8 = 0x81;
const E_NOT_A_COUNTER: u8 = 0x82;
const E_COUNTER_OVERFLOW: u8 = 0x83;
const E_INVALID_KEY: u8 = 0x84;
const E_TOO_LARGE: u8 = 0x85;
const E_SHUTTING_DOWN: u8 = 0x86;
const E_OTHER: u8 = 0x87;

/// A decoding or encoding failure.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The underlying stream failed (including `UnexpectedEof` mid-frame).
    Io(io::Error),
    /// The bytes do not follow the protocol.
    Invalid(String),
}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        WireError::Io(e)
    }
}

fn invalid(reason: impl Into<String>) -> WireError {
    WireError::Invalid(reason.into())
}

/// One client request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request<'a> {
    Set {
        key: Cow<'a, str>,
        value: Cow<'a, [u8]>,
    },
    Get {
        key: Cow<'a, str>,
        timeout_ms: u64,
    },
    TryGet {
        key: Cow<'a, str>,
    },
    Wait {
        keys: Vec<Cow<'a, str>>,
        timeout_ms: u64,
    },
    Add {
        key: Cow<'a, str>,
        delta: i64,
    },
    CompareSet {
        key: Cow<'a, str>,
        expected: Option<Cow<'a, [u8]>>,
        desired: Cow<'a, [u8]>,
    },
    Delete {
        key: Cow<'a, str>,
    },
    NumKeys,
}

/// A successful reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `set` / `wait` succeeded.
    Done,
    /// The value of a `get`.
    Value(Vec<u8>),
    /// The value of a `try_get`.
    MaybeValue(Option<Vec<u8>>),
    /// The new value of an `add`.
    Counter(i64),
    /// `compare_set` swapped.
    Swapped,
    /// `compare_set` did not swap; the current value.
    Mismatch(Option<Vec<u8>>),
    /// Whether a deleted key existed.
    Existed(bool),
    /// `num_keys`.
    Count(u64),
}

/// An error reported by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RemoteError {
    Timeout {
        keys: Vec<String>,
        waited_ms: u64,
    },
    NotACounter {
        key: String,
    },
    CounterOverflow {
        key: String,
        current: i64,
        delta: i64,
    },
    InvalidKey {
        key: String,
        reason: String,
    },
    TooLarge {
        what: String,
        len: u64,
        max: u64,
    },
    ShuttingDown,
    Other {
        message: String,
    },
}

/// One response frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Response {
    Ok(Reply),
    Err(RemoteError),
}
