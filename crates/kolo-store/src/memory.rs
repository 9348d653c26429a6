//! [`MemoryStore`]: a store inside one process.

use std::time::Duration;

use crate::deadline::Deadline;
use crate::kv::{Kv, WaitOutcome};
use crate::{validate_key, validate_value, validate_wait_keys, CompareSet, Store, StoreError};

/// A store held in this process's memory: a `Mutex<HashMap>` plus a
/// `Condvar` that wakes blocked `get`/`wait` calls on every write.
///
/// Share it between threads with `Arc<MemoryStore>` (or `Arc<dyn Store>`).
///
/// ```
/// use std::time::Duration;
/// use kolo_store::{MemoryStore, Store};
///
/// let store = MemoryStore::new();
/// store.set("hello", b"world")?;
/// assert_eq!(store.get("hello", Duration::from_secs(1))?, b"world");
/// assert_eq!(store.add("counter", 2)?, 2);
/// # Ok::<(), kolo_store::StoreError>(())
/// ```
#[derive(Debug, Default)]
pub struct MemoryStore {
    kv: Kv,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Turns a core wait outcome into the `Store` result.
pub(crate) fn finish_wait<T>(
    outcome: WaitOutcome<T>,
    deadline: &Deadline,
) -> Result<T, StoreError> {
    match outcome {
        WaitOutcome::Ready(value) => Ok(value),
        WaitOutcome::TimedOut(keys) => Err(StoreError::Timeout {
            keys,
            waited: deadline.elapsed(),
        }),
        // A MemoryStore is never closed; keep a typed error rather than a panic.
        WaitOutcome::Closed => Err(StoreError::Disconnected {
            addr: "in-memory store (closed)".to_owned(),
        }),
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        validate_key(key)?;
        validate_value(value)?;
        self.kv.set(key, value);
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        validate_key(key)?;
        let deadline = Deadline::after(timeout);
        finish_wait(self.kv.get(key, &deadline), &deadline)
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        validate_key(key)?;
        Ok(self.kv.try_get(key))
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        validate_wait_keys(keys)?;
        let deadline = Deadline::after(timeout);
        finish_wait(self.kv.wait(keys, &deadline), &deadline)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        validate_key(key)?;
        self.kv.add(key, delta)
    }

    fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        validate_key(key)?;
        validate_value(desired)?;
        Ok(self.kv.compare_set(key, expected, desired))
    }

    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        validate_key(key)?;
        Ok(self.kv.delete(key))
    }

    fn num_keys(&self) -> Result<usize, StoreError> {
        Ok(self.kv.num_keys())
    }
}
