//! The error type shared by every store implementation.

use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// How many missing keys a [`StoreError::Timeout`] message lists before it
/// summarises the rest as "and N more".
const MAX_KEYS_IN_MESSAGE: usize = 8;

/// Everything that can go wrong when talking to a [`Store`](crate::Store).
///
/// Every variant carries enough structured context to say what failed and why
/// without looking at logs; the `Display` message names the cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A blocking call (`get`, `wait`, a barrier) gave up before every key it
    /// was waiting for appeared.
    #[error("timed out after {waited:?} waiting for {}", describe_keys(keys))]
    Timeout {
        /// The keys that were still missing at the deadline.
        keys: Vec<String>,
        /// How long the call waited.
        waited: Duration,
    },

    /// [`TcpStore::connect`](crate::TcpStore::connect) (or opening an extra
    /// pooled connection) could not reach the server in time.
    #[error("could not connect to the store server at {addr} within {waited:?}: {source}")]
    Connect {
        /// The address as given by the caller.
        addr: String,
        /// How long connecting was retried.
        waited: Duration,
        /// The last error seen while connecting.
        #[source]
        source: io::Error,
    },

    /// [`TcpStoreServer::bind`](crate::TcpStoreServer::bind) could not bind
    /// its listening socket (for example because the port is in use).
    #[error("could not bind the store server to {addr}: {source}")]
    Bind {
        /// The address(es) the server tried to bind.
        addr: String,
        /// Why binding failed.
        #[source]
        source: io::Error,
    },

    /// The store server closed the connection (it shut down or crashed) in
    /// the middle of a call.
    #[error("the store server at {addr} closed the connection")]
    Disconnected {
        /// The server's address.
        addr: String,
    },

    /// An operating-system level I/O error.
    #[error("{context}: {source}")]
    Io {
        /// What the store was doing when the error happened.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The peer broke the wire protocol (bad handshake, malformed frame,
    /// a length over the hard limits, a non-UTF-8 key, ...).
    #[error("protocol error with {peer}: {reason}")]
    Protocol {
        /// The remote address (or a description of the peer).
        peer: String,
        /// What was wrong.
        reason: String,
    },

    /// A [`FileStore`](crate::FileStore) log file is damaged.
    #[error("store file {} is corrupt at byte offset {offset}: {reason}", path.display())]
    Corrupt {
        /// The store file.
        path: PathBuf,
        /// The byte offset of the first damaged record.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },

    /// [`Store::add`](crate::Store::add) was called on a key whose value is
    /// not the decimal text of an `i64`.
    #[error("key {key:?} does not hold a counter (its value is not a decimal i64)")]
    NotACounter {
        /// The key.
        key: String,
    },

    /// [`Store::add`](crate::Store::add) would overflow the `i64` counter.
    #[error("adding {delta} to counter {key:?} (currently {current}) overflows i64")]
    CounterOverflow {
        /// The key.
        key: String,
        /// The counter's current value.
        current: i64,
        /// The delta that was to be added.
        delta: i64,
    },

    /// A key is not acceptable (empty or longer than
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes).
    #[error("invalid key {}: {reason}", shorten(key))]
    InvalidKey {
        /// The offending key (as given).
        key: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A value, key list or other input exceeds a hard limit.
    #[error("{what} is too large: {len} > {max}")]
    TooLarge {
        /// What was too large ("value", "number of keys", ...).
        what: &'static str,
        /// Its size.
        len: u64,
        /// The limit.
        max: u64,
    },

    /// An argument is out of range (for example a barrier rank that is not
    /// below the world size).
    #[error("invalid argument: {reason}")]
    InvalidArgument {
        /// What is wrong with the argument.
        reason: String,
    },
}

impl StoreError {
    /// Builds a [`StoreError::Io`] from a context message and an error.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        StoreError::Io {
            context: context.into(),
            source,
        }
    }

    /// Whether this error is a [`StoreError::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, StoreError::Timeout { .. })
    }
}

/// "key \"a\"" / "keys \"a\", \"b\" and 3 more".
fn describe_keys(keys: &[String]) -> String {
    let mut out = String::new();
    out.push_str(if keys.len() == 1 { "key " } else { "keys " });
    for (i, key) in keys.iter().take(MAX_KEYS_IN_MESSAGE).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{}", shorten(key));
    }
    if keys.len() > MAX_KEYS_IN_MESSAGE {
        let _ = write!(out, " and {} more", keys.len() - MAX_KEYS_IN_MESSAGE);
    }
    if keys.is_empty() {
        out.push_str("(none)");
    }
    out
}

/// Debug-quotes a key, cutting very long ones so messages stay readable.
fn shorten(key: &str) -> String {
    const MAX: usize = 120;
    if key.len() <= MAX {
        return format!("{key:?}");
    }
    let mut cut = MAX;
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{:?}... ({} bytes)", &key[..cut], key.len())
}

/// A store failure seen by the communication layer is a [`kolo_core::Error::Store`].
impl From<StoreError> for kolo_core::Error {
    fn from(e: StoreError) -> kolo_core::Error {
        kolo_core::Error::store(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_message_names_missing_keys() {
        let e = StoreError::Timeout {
            keys: vec!["rank/3".into(), "rank/7".into()],
            waited: Duration::from_millis(200),
        };
        let msg = e.to_string();
        assert!(msg.contains("\"rank/3\""), "{msg}");
        assert!(msg.contains("\"rank/7\""), "{msg}");
        assert!(msg.contains("200ms"), "{msg}");
        assert!(e.is_timeout());
    }

    #[test]
    fn timeout_message_summarises_many_keys() {
        let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        let msg = StoreError::Timeout {
            keys,
            waited: Duration::from_secs(1),
        }
        .to_string();
        assert!(msg.contains("and 12 more"), "{msg}");
    }

    #[test]
    fn long_keys_are_shortened() {
        let key = "é".repeat(200);
        let msg = StoreError::InvalidKey {
            key,
            reason: "too long",
        }
        .to_string();
        assert!(msg.contains("(400 bytes)"), "{msg}");
    }
}
