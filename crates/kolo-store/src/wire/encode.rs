//! Encoding request and response frames.

use crate::{MAX_KEY_LEN, MAX_VALUE_LEN, MAX_WAIT_KEYS};

use super::{
    invalid, RemoteError, Reply, Request, Response, WireError, E_COUNTER_OVERFLOW, E_INVALID_KEY,
    E_NOT_A_COUNTER, E_OTHER, E_SHUTTING_DOWN, E_TIMEOUT, E_TOO_LARGE, MAX_KEY_LIST_BYTES,
    MAX_MESSAGE_LEN, OP_ADD, OP_COMPARE_SET, OP_DELETE, OP_GET, OP_NUM_KEYS, OP_SET, OP_TRY_GET,
    OP_WAIT, R_COUNT, R_COUNTER, R_DONE, R_EXISTED, R_MAYBE_VALUE, R_MISMATCH, R_SWAPPED, R_VALUE,
};

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
