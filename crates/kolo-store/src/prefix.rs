//! [`PrefixStore`]: a namespaced view of another store.

use std::sync::Arc;
use std::time::Duration;

use crate::{validate_key, validate_wait_keys, CompareSet, Store, StoreError};

/// A view of another store in which every key `k` is stored as
/// `"{prefix}/{k}"` (torch's `PrefixStore`), so that independent groups or
/// phases of a job can use the same key names without clashing.
///
/// [`Store::num_keys`] reports the number of keys of the *inner* store, as
/// torch does (counting only the prefixed keys is not possible without
/// listing keys, which the store API does not offer).
///
/// ```
/// use std::sync::Arc;
/// use kolo_store::{MemoryStore, PrefixStore, Store};
///
/// let inner: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let group = PrefixStore::new(Arc::clone(&inner), "group1");
/// group.set("leader", b"3")?;
/// assert_eq!(inner.try_get("group1/leader")?, Some(b"3".to_vec()));
/// # Ok::<(), kolo_store::StoreError>(())
/// ```
#[derive(Debug, Clone)]
pub struct PrefixStore {
    inner: Arc<dyn Store>,
    prefix: String,
}

impl PrefixStore {
    /// A view of `inner` that prefixes every key with `"{prefix}/"`.
    pub fn new(inner: Arc<dyn Store>, prefix: impl Into<String>) -> Self {
        PrefixStore {
            inner,
            prefix: prefix.into(),
        }
    }

    /// The prefix (without the trailing `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// The key as stored in the inner store.
    fn full_key(&self, key: &str) -> Result<String, StoreError> {
        validate_key(key)?;
        Ok(format!("{}/{}", self.prefix, key))
    }

    /// Maps inner keys in a timeout error back to this view's keys.
    fn strip(&self, err: StoreError) -> StoreError {
        match err {
            StoreError::Timeout { keys, waited } => {
                let head = format!("{}/", self.prefix);
                let keys = keys
                    .into_iter()
                    .map(|k| match k.strip_prefix(&head) {
                        Some(rest) => rest.to_owned(),
                        None => k,
                    })
                    .collect();
                StoreError::Timeout { keys, waited }
            }
            other => other,
        }
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.set(&self.full_key(key)?, value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.inner
            .get(&self.full_key(key)?, timeout)
            .map_err(|e| self.strip(e))
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.try_get(&self.full_key(key)?)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        validate_wait_keys(keys)?;
        let full: Vec<String> = keys
            .iter()
            .map(|k| self.full_key(k))
            .collect::<Result<_, _>>()?;
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        self.inner.wait(&refs, timeout).map_err(|e| self.strip(e))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.inner.add(&self.full_key(key)?, delta)
    }

    fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        self.inner
            .compare_set(&self.full_key(key)?, expected, desired)
    }

    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.inner.delete(&self.full_key(key)?)
    }

    fn num_keys(&self) -> Result<usize, StoreError> {
        self.inner.num_keys()
    }
}
