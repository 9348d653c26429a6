//! The rendezvous key-value store of kolo.
//!
//! Ranks of a distributed job use a [`Store`] at start-up to exchange
//! addresses, hand out ids with atomic counters and synchronise with
//! barriers, like `torch.distributed`'s `Store`. Three implementations share
//! the same trait:
//!
//! * [`MemoryStore`]: in one process (threads, tests).
//! * [`FileStore`]: processes on one host, or on a shared file system, that
//!   share an append-only log file guarded by `flock`.
//! * [`TcpStoreServer`] + [`TcpStore`]: a small server (usually started by
//!   rank 0 or the launcher) and clients that talk a length-prefixed binary
//!   protocol over TCP.
//! * [`C10dStore`]: a client of PyTorch's c10d `TCPStore` (the store torchrun's
//!   agent hosts), and [`C10dStoreServer`], a server of that protocol.
//!
//! [`PrefixStore`] namespaces keys and [`StoreExt::barrier`] builds a barrier
//! out of `add` and `wait`.
//!
//! Every blocking call takes a timeout, and every failure is a typed
//! [`StoreError`].
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use kolo_store::{Store, StoreExt, TcpStore, TcpStoreServer};
//!
//! # fn main() -> Result<(), kolo_store::StoreError> {
//! // Rank 0 (or the launcher) runs the server; port 0 picks a free port.
//! let server = TcpStoreServer::bind("127.0.0.1:0")?;
//! let addr = server.local_addr().to_string();
//!
//! let world = 3;
//! let mut ranks = Vec::new();
//! for rank in 0..world {
//!     let addr = addr.clone();
//!     ranks.push(std::thread::spawn(move || -> Result<Vec<u8>, kolo_store::StoreError> {
//!         let timeout = Duration::from_secs(10);
//!         let store = TcpStore::connect(&addr, timeout)?;
//!         // Publish this rank's address, then read rank 0's.
//!         store.set(&format!("addr/{rank}"), format!("10.0.0.{rank}:2900").as_bytes())?;
//!         let first = store.get("addr/0", timeout)?;
//!         store.barrier("startup", rank, world, timeout)?;
//!         Ok(first)
//!     }));
//! }
//! for rank in ranks {
//!     let first = rank.join().expect("rank thread panicked")?;
//!     assert_eq!(first, b"10.0.0.0:2900");
//! }
//! server.shutdown();
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

#[cfg(not(unix))]
compile_error!("kolo-store needs a unix platform (it uses flock and poll)");

pub mod auth;
pub mod c10d;
mod deadline;
mod error;
mod ext;
mod file;
#[doc(hidden)]
pub mod fuzzing;
mod kv;
mod memory;
mod pool;
mod prefix;
mod sys;
mod tcp;
mod wire;

use std::sync::Arc;
use std::time::Duration;

pub use auth::JobSecret;
pub use c10d::{C10dStore, C10dStoreServer};
pub use error::StoreError;
pub use ext::StoreExt;
pub use file::FileStore;
pub use memory::MemoryStore;
pub use prefix::PrefixStore;
pub use tcp::{TcpStore, TcpStoreServer};
pub use wire::{MAGIC, PROTOCOL_VERSION};

/// Longest key accepted by every store, in bytes.
pub const MAX_KEY_LEN: usize = 4 * 1024;
/// Largest value accepted by every store, in bytes.
pub const MAX_VALUE_LEN: usize = 64 * 1024 * 1024;
/// Most keys one [`Store::wait`] call may wait for (their total size is
/// also limited, to [`MAX_VALUE_LEN`] bytes).
pub const MAX_WAIT_KEYS: usize = 65_536;

/// A key-value store shared by the ranks of a job.
///
/// All implementations are thread-safe; share one with `Arc<dyn Store>`.
/// Keys are non-empty UTF-8 strings of at most [`MAX_KEY_LEN`] bytes and
/// values are byte strings of at most [`MAX_VALUE_LEN`] bytes.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Sets key to value (overwrites).
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;

    /// Returns the value, waiting up to `timeout` for the key to appear
    /// (torch semantics). Gives [`StoreError::Timeout`] naming the key if it
    /// does not appear in time.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError>;

    /// Returns the value if the key exists now, without waiting.
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Waits until all keys exist; [`StoreError::Timeout`] names the keys
    /// still missing.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError>;

    /// Atomically adds `delta` to the `i64` counter at `key` (missing = 0)
    /// and returns the new value.
    ///
    /// Counters are stored as the decimal ASCII text of the `i64` (like
    /// torch), so `get` on a counter returns e.g. `b"3"`. A key holding a
    /// non-counter value is [`StoreError::NotACounter`]; an overflow is
    /// [`StoreError::CounterOverflow`].
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError>;

    /// Atomically: if the current value equals `expected` (`None` = key
    /// absent), sets it to `desired` and returns [`CompareSet::Swapped`];
    /// otherwise leaves the store unchanged and returns
    /// [`CompareSet::Mismatch`] with the current value (`None` if absent).
    fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError>;

    /// Deletes the key; returns whether it existed.
    fn delete(&self, key: &str) -> Result<bool, StoreError>;

    /// Number of keys stored.
    fn num_keys(&self) -> Result<usize, StoreError>;
}

/// Outcome of [`Store::compare_set`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareSet {
    /// The current value matched `expected` and was replaced by `desired`.
    Swapped,
    /// The current value did not match; the store is unchanged.
    Mismatch {
        /// The value stored now (`None` if the key is absent).
        current: Option<Vec<u8>>,
    },
}

impl<S: Store + ?Sized> Store for Arc<S> {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        (**self).set(key, value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        (**self).get(key, timeout)
    }
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).try_get(key)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        (**self).wait(keys, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        (**self).add(key, delta)
    }
    fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        (**self).compare_set(key, expected, desired)
    }
    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        (**self).delete(key)
    }
    fn num_keys(&self) -> Result<usize, StoreError> {
        (**self).num_keys()
    }
}

/// Checks that a key is non-empty and at most [`MAX_KEY_LEN`] bytes.
pub(crate) fn validate_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(StoreError::InvalidKey {
            key: String::new(),
            reason: "keys must not be empty",
        });
    }
    if key.len() > MAX_KEY_LEN {
        return Err(StoreError::InvalidKey {
            key: key.to_owned(),
            reason: "keys must be at most 4096 bytes",
        });
    }
    Ok(())
}

/// Checks that a value is at most [`MAX_VALUE_LEN`] bytes.
pub(crate) fn validate_value(value: &[u8]) -> Result<(), StoreError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(StoreError::TooLarge {
            what: "value",
            len: value.len() as u64,
            max: MAX_VALUE_LEN as u64,
        });
    }
    Ok(())
}

/// Checks the key list of a `wait` call.
pub(crate) fn validate_wait_keys<K: AsRef<str>>(keys: &[K]) -> Result<(), StoreError> {
    if keys.len() > MAX_WAIT_KEYS {
        return Err(StoreError::TooLarge {
            what: "number of keys in a wait",
            len: keys.len() as u64,
            max: MAX_WAIT_KEYS as u64,
        });
    }
    keys.iter().try_for_each(|k| validate_key(k.as_ref()))?;
    let total: usize = keys.iter().map(|k| k.as_ref().len()).sum();
    if total > MAX_VALUE_LEN {
        return Err(StoreError::TooLarge {
            what: "total size of the keys in a wait",
            len: total as u64,
            max: MAX_VALUE_LEN as u64,
        });
    }
    Ok(())
}

/// Parses a stored counter value.
pub(crate) fn parse_counter(key: &str, value: &[u8]) -> Result<i64, StoreError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse::<i64>().ok())
        .ok_or_else(|| StoreError::NotACounter {
            key: key.to_owned(),
        })
}

/// Computes the new counter value for `add` given the current stored value.
pub(crate) fn add_to_counter(
    key: &str,
    current: Option<&[u8]>,
    delta: i64,
) -> Result<i64, StoreError> {
    let current = match current {
        Some(value) => parse_counter(key, value)?,
        None => 0,
    };
    current
        .checked_add(delta)
        .ok_or_else(|| StoreError::CounterOverflow {
            key: key.to_owned(),
            current,
            delta,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_validation() {
        assert!(matches!(
            validate_key(""),
            Err(StoreError::InvalidKey { .. })
        ));
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        assert!(matches!(
            validate_key(&"k".repeat(MAX_KEY_LEN + 1)),
            Err(StoreError::InvalidKey { .. })
        ));
    }

    #[test]
    fn counters() {
        assert!(matches!(add_to_counter("k", None, 5), Ok(5)));
        assert!(matches!(add_to_counter("k", Some(b"-3"), 5), Ok(2)));
        assert!(matches!(
            add_to_counter("k", Some(b"abc"), 1),
            Err(StoreError::NotACounter { .. })
        ));
        assert!(matches!(
            add_to_counter("k", Some(b""), 1),
            Err(StoreError::NotACounter { .. })
        ));
        let max = i64::MAX.to_string();
        assert!(matches!(
            add_to_counter("k", Some(max.as_bytes()), 1),
            Err(StoreError::CounterOverflow { .. })
        ));
    }
}
