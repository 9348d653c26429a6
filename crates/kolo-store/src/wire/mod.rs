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
use std::io::{self, Read, Write};

use crate::{MAX_KEY_LEN, MAX_VALUE_LEN, MAX_WAIT_KEYS};

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

// ---------------------------------------------------------------------------
// Handshake

/// Client side of the handshake: sends `MAGIC` and `PROTOCOL_VERSION`,
/// expects the same back.
///
/// The job-secret exchange ([`crate::auth`]) follows it.
pub(crate) fn client_handshake<S: Read + Write>(stream: &mut S) -> Result<(), WireError> {
    stream.write_all(&hello())?;
    stream.flush()?;
    let (magic, version) = read_hello(stream)?;
    if magic != MAGIC {
        return Err(invalid(format!(
            "peer answered the handshake with magic {magic:#010x} instead of {MAGIC:#010x}: \
             it is not a kolo store server"
        )));
    }
    if version != PROTOCOL_VERSION {
        return Err(invalid(format!(
            "server speaks store protocol version {version}, this client speaks {PROTOCOL_VERSION}"
        )));
    }
    Ok(())
}

/// Server side of the handshake: expects `MAGIC` and `PROTOCOL_VERSION`
/// and answers with its own. On a version mismatch it still answers (so
/// the client can report the versions) and then fails.
/// The job-secret exchange ([`crate::auth`]) follows it.
pub(crate) fn server_handshake<S: Read + Write>(stream: &mut S) -> Result<(), WireError> {
    let (magic, version) = read_hello(stream)?;
    if magic != MAGIC {
        return Err(invalid(format!(
            "bad handshake magic {magic:#010x} (expected {MAGIC:#010x}): not a kolo store client"
        )));
    }
    stream.write_all(&hello())?;
    stream.flush()?;
    if version != PROTOCOL_VERSION {
        return Err(invalid(format!(
            "client speaks store protocol version {version}, this server speaks {PROTOCOL_VERSION}"
        )));
    }
    Ok(())
}

fn hello() -> [u8; 6] {
    let mut out = [0u8; 6];
    out[..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out
}

fn read_hello<R: Read>(r: &mut R) -> Result<(u32, u16), WireError> {
    let mut buf = [0u8; 6];
    r.read_exact(&mut buf)?;
    let magic = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let version = u16::from_le_bytes([buf[4], buf[5]]);
    Ok((magic, version))
}

// ---------------------------------------------------------------------------
// Encoding

fn put_str(out: &mut Vec<u8>, s: &str, max: usize, what: &str) -> Result<(), WireError> {
    if s.len() > max {
        return Err(invalid(format!(
            "{what} of {} bytes exceeds {max}",
            s.len()
        )));
    }
    // `s.len() <= max <= u32::MAX`, checked above.
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_value(out: &mut Vec<u8>, v: &[u8]) -> Result<(), WireError> {
    if v.len() > MAX_VALUE_LEN {
        return Err(invalid(format!(
            "value of {} bytes exceeds {MAX_VALUE_LEN}",
            v.len()
        )));
    }
    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
    out.extend_from_slice(v);
    Ok(())
}

fn put_opt_value(out: &mut Vec<u8>, v: Option<&[u8]>) -> Result<(), WireError> {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            put_value(out, v)?;
        }
    }
    Ok(())
}

fn put_keys<K: AsRef<str>>(out: &mut Vec<u8>, keys: &[K]) -> Result<(), WireError> {
    if keys.len() > MAX_WAIT_KEYS {
        return Err(invalid(format!(
            "{} keys exceed the limit of {MAX_WAIT_KEYS}",
            keys.len()
        )));
    }
    let total: usize = keys.iter().map(|k| k.as_ref().len()).sum();
    if total > MAX_KEY_LIST_BYTES {
        return Err(invalid(format!(
            "key list of {total} bytes exceeds the limit of {MAX_KEY_LIST_BYTES}"
        )));
    }
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for key in keys {
        put_str(out, key.as_ref(), MAX_KEY_LEN, "key")?;
    }
    Ok(())
}

/// Puts a free-text message, cut to `MAX_MESSAGE_LEN` bytes.
fn put_message(out: &mut Vec<u8>, s: &str) {
    let mut cut = s.len().min(MAX_MESSAGE_LEN);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    out.extend_from_slice(&(cut as u32).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..cut]);
}

/// Appends the frame for `req` to `out`. Fails (without sending anything
/// the decoder would reject) if a length exceeds its limit.
pub(crate) fn encode_request(req: &Request<'_>, out: &mut Vec<u8>) -> Result<(), WireError> {
    match req {
        Request::Set { key, value } => {
            out.push(OP_SET);
            put_str(out, key, MAX_KEY_LEN, "key")?;
            put_value(out, value)?;
        }
        Request::Get { key, timeout_ms } => {
            out.push(OP_GET);
            put_str(out, key, MAX_KEY_LEN, "key")?;
            out.extend_from_slice(&timeout_ms.to_le_bytes());
        }
        Request::TryGet { key } => {
            out.push(OP_TRY_GET);
            put_str(out, key, MAX_KEY_LEN, "key")?;
        }
        Request::Wait { keys, timeout_ms } => {
            out.push(OP_WAIT);
            put_keys(out, keys)?;
            out.extend_from_slice(&timeout_ms.to_le_bytes());
        }
        Request::Add { key, delta } => {
            out.push(OP_ADD);
            put_str(out, key, MAX_KEY_LEN, "key")?;
            out.extend_from_slice(&delta.to_le_bytes());
        }
        Request::CompareSet {
            key,
            expected,
            desired,
        } => {
            out.push(OP_COMPARE_SET);
            put_str(out, key, MAX_KEY_LEN, "key")?;
            put_opt_value(out, expected.as_deref())?;
            put_value(out, desired)?;
        }
        Request::Delete { key } => {
            out.push(OP_DELETE);
            put_str(out, key, MAX_KEY_LEN, "key")?;
        }
        Request::NumKeys => out.push(OP_NUM_KEYS),
    }
    Ok(())
}

/// Appends the frame for `resp` to `out`. Fails if a length exceeds its
/// limit; free-text messages are cut instead.
pub(crate) fn encode_response(resp: &Response, out: &mut Vec<u8>) -> Result<(), WireError> {
    match resp {
        Response::Ok(reply) => match reply {
            Reply::Done => out.push(R_DONE),
            Reply::Value(v) => {
                out.push(R_VALUE);
                put_value(out, v)?;
            }
            Reply::MaybeValue(v) => {
                out.push(R_MAYBE_VALUE);
                put_opt_value(out, v.as_deref())?;
            }
            Reply::Counter(n) => {
                out.push(R_COUNTER);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Reply::Swapped => out.push(R_SWAPPED),
            Reply::Mismatch(v) => {
                out.push(R_MISMATCH);
                put_opt_value(out, v.as_deref())?;
            }
            Reply::Existed(b) => {
                out.push(R_EXISTED);
                out.push(u8::from(*b));
            }
            Reply::Count(n) => {
                out.push(R_COUNT);
                out.extend_from_slice(&n.to_le_bytes());
            }
        },
        Response::Err(err) => match err {
            RemoteError::Timeout { keys, waited_ms } => {
                out.push(E_TIMEOUT);
                put_keys(out, keys)?;
                out.extend_from_slice(&waited_ms.to_le_bytes());
            }
            RemoteError::NotACounter { key } => {
                out.push(E_NOT_A_COUNTER);
                put_str(out, key, MAX_KEY_LEN, "key")?;
            }
            RemoteError::CounterOverflow {
                key,
                current,
                delta,
            } => {
                out.push(E_COUNTER_OVERFLOW);
                put_str(out, key, MAX_KEY_LEN, "key")?;
                out.extend_from_slice(&current.to_le_bytes());
                out.extend_from_slice(&delta.to_le_bytes());
            }
            RemoteError::InvalidKey { key, reason } => {
                out.push(E_INVALID_KEY);
                put_message(out, key);
                put_message(out, reason);
            }
            RemoteError::TooLarge { what, len, max } => {
                out.push(E_TOO_LARGE);
                put_message(out, what);
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&max.to_le_bytes());
            }
            RemoteError::ShuttingDown => out.push(E_SHUTTING_DOWN),
            RemoteError::Other { message } => {
                out.push(E_OTHER);
                put_message(out, message);
            }
        },
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Decoding

fn get_u8<R: Read>(r: &mut R) -> Result<u8, WireError> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

fn get_u32<R: Read>(r: &mut R) -> Result<u32, WireError> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn get_u64<R: Read>(r: &mut R) -> Result<u64, WireError> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn get_i64<R: Read>(r: &mut R) -> Result<i64, WireError> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(i64::from_le_bytes(b))
}

fn get_bool<R: Read>(r: &mut R, what: &str) -> Result<bool, WireError> {
    match get_u8(r)? {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(invalid(format!("{what} flag is {b}, expected 0 or 1"))),
    }
}

/// Reads exactly `len` bytes, growing the buffer only as data arrives.
/// `len` must already be validated against its limit.
fn get_exact(r: &mut impl Read, len: u64) -> Result<Vec<u8>, WireError> {
    let cap = usize::try_from(len).unwrap_or(usize::MAX).min(READ_CHUNK);
    let mut buf = Vec::with_capacity(cap);
    r.take(len).read_to_end(&mut buf)?;
    if (buf.len() as u64) < len {
        return Err(WireError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("stream ended after {} of {len} bytes", buf.len()),
        )));
    }
    Ok(buf)
}

fn get_str<R: Read>(r: &mut R, max: usize, what: &str) -> Result<String, WireError> {
    let len = get_u32(r)?;
    if len as usize > max {
        return Err(invalid(format!(
            "{what} length {len} exceeds the limit of {max}"
        )));
    }
    let bytes = get_exact(r, u64::from(len))?;
    String::from_utf8(bytes).map_err(|_| invalid(format!("{what} is not valid UTF-8")))
}

fn get_key<R: Read>(r: &mut R) -> Result<String, WireError> {
    get_str(r, MAX_KEY_LEN, "key")
}

fn get_value<R: Read>(r: &mut R) -> Result<Vec<u8>, WireError> {
    let len = get_u64(r)?;
    if len > MAX_VALUE_LEN as u64 {
        return Err(invalid(format!(
            "value length {len} exceeds the limit of {MAX_VALUE_LEN}"
        )));
    }
    get_exact(r, len)
}

fn get_opt_value<R: Read>(r: &mut R) -> Result<Option<Vec<u8>>, WireError> {
    if get_bool(r, "optional value")? {
        Ok(Some(get_value(r)?))
    } else {
        Ok(None)
    }
}

fn get_keys<R: Read>(r: &mut R) -> Result<Vec<String>, WireError> {
    let count = get_u32(r)? as usize;
    if count > MAX_WAIT_KEYS {
        return Err(invalid(format!(
            "key count {count} exceeds the limit of {MAX_WAIT_KEYS}"
        )));
    }
    // Each key takes at least 4 bytes on the wire, so don't trust `count`
    // for the allocation: grow as keys arrive.
    let mut keys = Vec::with_capacity(count.min(1024));
    let mut total = 0usize;
    for _ in 0..count {
        let key = get_key(r)?;
        total += key.len();
        if total > MAX_KEY_LIST_BYTES {
            return Err(invalid(format!(
                "key list exceeds the limit of {MAX_KEY_LIST_BYTES} bytes"
            )));
        }
        keys.push(key);
    }
    Ok(keys)
}

/// Reads the first byte of a frame; `Ok(None)` on a clean end of stream.
fn first_byte<R: Read>(r: &mut R) -> Result<Option<u8>, WireError> {
    let mut b = [0u8; 1];
    loop {
        match r.read(&mut b) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(b[0])),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads one request frame. `Ok(None)` means the peer closed the
/// connection cleanly between frames.
pub(crate) fn read_request<R: Read>(r: &mut R) -> Result<Option<Request<'static>>, WireError> {
    let Some(op) = first_byte(r)? else {
        return Ok(None);
    };
    let req = match op {
        OP_SET => Request::Set {
            key: get_key(r)?.into(),
            value: get_value(r)?.into(),
        },
        OP_GET => Request::Get {
            key: get_key(r)?.into(),
            timeout_ms: get_u64(r)?,
        },
        OP_TRY_GET => Request::TryGet {
            key: get_key(r)?.into(),
        },
        OP_WAIT => Request::Wait {
            keys: get_keys(r)?.into_iter().map(Cow::Owned).collect(),
            timeout_ms: get_u64(r)?,
        },
        OP_ADD => Request::Add {
            key: get_key(r)?.into(),
            delta: get_i64(r)?,
        },
        OP_COMPARE_SET => Request::CompareSet {
            key: get_key(r)?.into(),
            expected: get_opt_value(r)?.map(Cow::Owned),
            desired: get_value(r)?.into(),
        },
        OP_DELETE => Request::Delete {
            key: get_key(r)?.into(),
        },
        OP_NUM_KEYS => Request::NumKeys,
        other => return Err(invalid(format!("unknown request opcode {other:#04x}"))),
    };
    Ok(Some(req))
}

/// Reads one response frame. End of stream is an `UnexpectedEof` I/O error.
pub(crate) fn read_response<R: Read>(r: &mut R) -> Result<Response, WireError> {
    let Some(tag) = first_byte(r)? else {
        return Err(WireError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a response",
        )));
    };
    let resp = match tag {
        R_DONE => Response::Ok(Reply::Done),
        R_VALUE => Response::Ok(Reply::Value(get_value(r)?)),
        R_MAYBE_VALUE => Response::Ok(Reply::MaybeValue(get_opt_value(r)?)),
        R_COUNTER => Response::Ok(Reply::Counter(get_i64(r)?)),
        R_SWAPPED => Response::Ok(Reply::Swapped),
        R_MISMATCH => Response::Ok(Reply::Mismatch(get_opt_value(r)?)),
        R_EXISTED => Response::Ok(Reply::Existed(get_bool(r, "existed")?)),
        R_COUNT => Response::Ok(Reply::Count(get_u64(r)?)),
        E_TIMEOUT => Response::Err(RemoteError::Timeout {
            keys: get_keys(r)?,
            waited_ms: get_u64(r)?,
        }),
        E_NOT_A_COUNTER => Response::Err(RemoteError::NotACounter { key: get_key(r)? }),
        E_COUNTER_OVERFLOW => Response::Err(RemoteError::CounterOverflow {
            key: get_key(r)?,
            current: get_i64(r)?,
            delta: get_i64(r)?,
        }),
        E_INVALID_KEY => Response::Err(RemoteError::InvalidKey {
            key: get_str(r, MAX_MESSAGE_LEN, "key")?,
            reason: get_str(r, MAX_MESSAGE_LEN, "reason")?,
        }),
        E_TOO_LARGE => Response::Err(RemoteError::TooLarge {
            what: get_str(r, MAX_MESSAGE_LEN, "what")?,
            len: get_u64(r)?,
            max: get_u64(r)?,
        }),
        E_SHUTTING_DOWN => Response::Err(RemoteError::ShuttingDown),
        E_OTHER => Response::Err(RemoteError::Other {
            message: get_str(r, MAX_MESSAGE_LEN, "message")?,
        }),
        other => return Err(invalid(format!("unknown response tag {other:#04x}"))),
    };
    Ok(resp)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
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
            (arb_key(), arb_key())
                .prop_map(|(key, reason)| RemoteError::InvalidKey { key, reason }),
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
}
