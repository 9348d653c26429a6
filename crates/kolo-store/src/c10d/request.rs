//! The requests a c10d store server reads, decoded from the bytes after the query-type byte.

use std::io::{self, Read};

use super::{put_bytes, query, read_bytes, read_count, read_i64, read_key, read_u32, MAX_VALUE};

/// One decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Query {
    Validate(u32),
    Set {
        key: String,
        value: Vec<u8>,
    },
    CompareSet {
        key: String,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Get {
        key: String,
    },
    Add {
        key: String,
        delta: i64,
    },
    Check {
        keys: Vec<String>,
    },
    Wait {
        keys: Vec<String>,
    },
    GetNumKeys,
    DeleteKey {
        key: String,
    },
    Append {
        key: String,
        value: Vec<u8>,
    },
    MultiGet {
        keys: Vec<String>,
    },
    MultiSet {
        pairs: Vec<(String, Vec<u8>)>,
    },
    CancelWait,
    Ping(u32),
}

fn invalid(reason: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason)
}

fn read_keys(r: &mut impl Read) -> io::Result<Vec<String>> {
    let n = read_count(r)?;
    (0..n).map(|_| read_key(r)).collect()
}

fn read_value(r: &mut impl Read) -> io::Result<Vec<u8>> {
    read_bytes(r, MAX_VALUE, "value")
}

/// Reads the arguments of a request of type `kind` (its first byte, already read). Lengths and
/// counts are bounded and memory grows only with bytes that arrive; an unknown type is
/// `InvalidData`.
pub(crate) fn read_query(kind: u8, r: &mut impl Read) -> io::Result<Query> {
    Ok(match kind {
        query::VALIDATE => Query::Validate(read_u32(r)?),
        query::SET => Query::Set {
            key: read_key(r)?,
            value: read_value(r)?,
        },
        query::COMPARE_SET => Query::CompareSet {
            key: read_key(r)?,
            expected: read_value(r)?,
            desired: read_value(r)?,
        },
        query::GET => Query::Get { key: read_key(r)? },
        query::ADD => Query::Add {
            key: read_key(r)?,
            delta: read_i64(r)?,
        },
        query::CHECK => Query::Check {
            keys: read_keys(r)?,
        },
        query::WAIT => Query::Wait {
            keys: read_keys(r)?,
        },
        query::GETNUMKEYS => Query::GetNumKeys,
        query::DELETE_KEY => Query::DeleteKey { key: read_key(r)? },
        query::APPEND => Query::Append {
            key: read_key(r)?,
            value: read_value(r)?,
        },
        query::MULTI_GET => Query::MultiGet {
            keys: read_keys(r)?,
        },
        query::MULTI_SET => {
            let n = read_count(r)?;
            let pairs = (0..n)
                .map(|_| Ok((read_key(r)?, read_value(r)?)))
                .collect::<io::Result<_>>()?;
            Query::MultiSet { pairs }
        }
        query::CANCEL_WAIT => Query::CancelWait,
        query::PING => Query::Ping(read_u32(r)?),
        other => return Err(invalid(format!("unknown query type {other}"))),
    })
}

fn put_keys(out: &mut Vec<u8>, keys: &[String]) {
    out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for k in keys {
        put_bytes(out, k.as_bytes());
    }
}

/// Appends the bytes of `q` (its type byte, then its arguments), as a client sends it.
pub(crate) fn encode_query(q: &Query, out: &mut Vec<u8>) {
    match q {
        Query::Validate(magic) => {
            out.push(query::VALIDATE);
            out.extend_from_slice(&magic.to_le_bytes());
        }
        Query::Set { key, value } => {
            out.push(query::SET);
            put_bytes(out, key.as_bytes());
            put_bytes(out, value);
        }
        Query::CompareSet {
            key,
            expected,
            desired,
        } => {
            out.push(query::COMPARE_SET);
            put_bytes(out, key.as_bytes());
            put_bytes(out, expected);
            put_bytes(out, desired);
        }
        Query::Get { key } => {
            out.push(query::GET);
            put_bytes(out, key.as_bytes());
        }
        Query::Add { key, delta } => {
            out.push(query::ADD);
            put_bytes(out, key.as_bytes());
            out.extend_from_slice(&delta.to_le_bytes());
        }
        Query::Check { keys } => {
            out.push(query::CHECK);
            put_keys(out, keys);
        }
        Query::Wait { keys } => {
            out.push(query::WAIT);
            put_keys(out, keys);
        }
        Query::GetNumKeys => out.push(query::GETNUMKEYS),
        Query::DeleteKey { key } => {
            out.push(query::DELETE_KEY);
            put_bytes(out, key.as_bytes());
        }
        Query::Append { key, value } => {
            out.push(query::APPEND);
            put_bytes(out, key.as_bytes());
            put_bytes(out, value);
        }
        Query::MultiGet { keys } => {
            out.push(query::MULTI_GET);
            put_keys(out, keys);
        }
        Query::MultiSet { pairs } => {
            out.push(query::MULTI_SET);
            out.extend_from_slice(&(pairs.len() as u64).to_le_bytes());
            for (k, v) in pairs {
                put_bytes(out, k.as_bytes());
                put_bytes(out, v);
            }
        }
        Query::CancelWait => out.push(query::CANCEL_WAIT),
        Query::Ping(nonce) => {
            out.push(query::PING);
            out.extend_from_slice(&nonce.to_le_bytes());
        }
    }
}

/// The bytes of `q`.
pub(crate) fn encode(q: &Query) -> Vec<u8> {
    let mut out = Vec::new();
    encode_query(q, &mut out);
    out
}

/// Decodes a stream of requests (type byte, then arguments) until the first error or the end;
/// returns how many were decoded. For the fuzz targets.
pub(crate) fn decode_all(mut data: &[u8]) -> usize {
    let mut n = 0;
    while let Some((&kind, rest)) = data.split_first() {
        data = rest;
        let Ok(q) = read_query(kind, &mut data) else {
            break;
        };
        // What decodes must encode back to the same request.
        let again = encode(&q);
        let back = again
            .split_first()
            .and_then(|(&k, mut r)| read_query(k, &mut r).ok());
        assert_eq!(back.as_ref(), Some(&q), "request changed in a round trip");
        n += 1;
    }
    n
}

/// One of every request, encoded, for the fuzz targets' seeds.
pub(crate) fn seed() -> Vec<u8> {
    let key = |k: &str| k.to_string();
    let all = [
        Query::Validate(super::VALIDATION_MAGIC),
        Query::Set {
            key: key("k"),
            value: b"v".to_vec(),
        },
        Query::CompareSet {
            key: key("k"),
            expected: b"v".to_vec(),
            desired: b"w".to_vec(),
        },
        Query::Get { key: key("k") },
        Query::Add {
            key: key("n"),
            delta: -3,
        },
        Query::Check {
            keys: vec![key("k"), key("n")],
        },
        Query::Wait {
            keys: vec![key("k")],
        },
        Query::GetNumKeys,
        Query::DeleteKey { key: key("k") },
        Query::Append {
            key: key("a"),
            value: b"!".to_vec(),
        },
        Query::MultiGet {
            keys: vec![key("a"), key("n")],
        },
        Query::MultiSet {
            pairs: vec![(key("m"), b"x".to_vec())],
        },
        Query::CancelWait,
        Query::Ping(7),
    ];
    let mut out = Vec::new();
    for q in &all {
        encode_query(q, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_lengths_are_refused_without_allocating() {
        // SET with a key announced at 2^63 bytes.
        let mut req = (1u64 << 63).to_le_bytes().to_vec();
        req.extend_from_slice(b"k");
        assert!(read_query(query::SET, &mut req.as_slice()).is_err());
        // CHECK announcing 2^40 keys.
        let req = (1u64 << 40).to_le_bytes();
        assert!(read_query(query::CHECK, &mut req.as_slice()).is_err());
        // A value announced at 1 GiB with 3 bytes behind it.
        let mut req = vec![1, 0, 0, 0, 0, 0, 0, 0, b'k'];
        req.extend_from_slice(&(1u64 << 30).to_le_bytes());
        req.extend_from_slice(b"abc");
        assert!(read_query(query::SET, &mut req.as_slice()).is_err());
        assert!(read_query(200, &mut [].as_slice()).is_err());
    }

    #[test]
    fn every_request_round_trips() {
        assert_eq!(decode_all(&seed()), 14);
    }

    #[test]
    fn a_stream_decodes_query_by_query() {
        let mut s = vec![query::GETNUMKEYS, query::PING];
        s.extend_from_slice(&7u32.to_le_bytes());
        s.push(query::GET);
        s.extend_from_slice(&1u64.to_le_bytes());
        s.push(0xFF); // not UTF-8
        assert_eq!(decode_all(&s), 2);
    }
}
