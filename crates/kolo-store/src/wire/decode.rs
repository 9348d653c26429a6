//! Decoding request and response frames. Every length is checked against its limit before
//! anything is allocated for it.

use std::borrow::Cow;
use std::io::{self, Read};

use crate::{MAX_KEY_LEN, MAX_VALUE_LEN, MAX_WAIT_KEYS};

use super::{
    invalid, RemoteError, Reply, Request, Response, WireError, E_COUNTER_OVERFLOW, E_INVALID_KEY,
    E_NOT_A_COUNTER, E_OTHER, E_SHUTTING_DOWN, E_TIMEOUT, E_TOO_LARGE, MAX_KEY_LIST_BYTES,
    MAX_MESSAGE_LEN, OP_ADD, OP_COMPARE_SET, OP_DELETE, OP_GET, OP_NUM_KEYS, OP_SET, OP_TRY_GET,
    OP_WAIT, READ_CHUNK, R_COUNT, R_COUNTER, R_DONE, R_EXISTED, R_MAYBE_VALUE, R_MISMATCH,
    R_SWAPPED, R_VALUE,
};

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
