//! The in-memory key-value core shared by [`MemoryStore`](crate::MemoryStore)
//! and the TCP server.
//!
//! Inputs are assumed validated by the caller.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use crate::deadline::Deadline;
use crate::{add_to_counter, CompareSet, StoreError};

/// Result of a blocking wait on the core.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WaitOutcome<T> {
    /// Every key is present.
    Ready(T),
    /// The deadline passed; these keys were still missing.
    TimedOut(Vec<String>),
    /// [`Kv::close`] was called while waiting.
    Closed,
}

#[derive(Debug, Default)]
struct State {
    map: HashMap<String, Vec<u8>>,
    closed: bool,
}

/// A map guarded by a mutex, with a condvar woken on every write.
#[derive(Debug, Default)]
pub(crate) struct Kv {
    state: Mutex<State>,
    changed: Condvar,
}

impl Kv {
    /// Locks the state. No code path panics while holding the lock, and every
    /// mutation is a single map operation, so a poisoned lock still guards a
    /// consistent map: recover it instead of panicking.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets `key` and wakes waiters.
    pub(crate) fn set(&self, key: &str, value: &[u8]) {
        let mut state = self.lock();
        state.map.insert(key.to_owned(), value.to_vec());
        drop(state);
        self.changed.notify_all();
    }

    /// The value of `key`, if present.
    pub(crate) fn try_get(&self, key: &str) -> Option<Vec<u8>> {
        self.lock().map.get(key).cloned()
    }

    /// Waits until `key` exists and returns its value.
    pub(crate) fn get(&self, key: &str, deadline: &Deadline) -> WaitOutcome<Vec<u8>> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return WaitOutcome::Closed;
            }
            if let Some(value) = state.map.get(key) {
                return WaitOutcome::Ready(value.clone());
            }
            if deadline.expired() {
                return WaitOutcome::TimedOut(vec![key.to_owned()]);
            }
            state = self
                .changed
                .wait_timeout(state, deadline.remaining())
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Waits until every key exists.
    pub(crate) fn wait<K: AsRef<str>>(&self, keys: &[K], deadline: &Deadline) -> WaitOutcome<()> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return WaitOutcome::Closed;
            }
            let missing: Vec<String> = keys
                .iter()
                .map(AsRef::as_ref)
                .filter(|k| !state.map.contains_key(*k))
                .map(str::to_owned)
                .collect();
            if missing.is_empty() {
                return WaitOutcome::Ready(());
            }
            if deadline.expired() {
                return WaitOutcome::TimedOut(missing);
            }
            state = self
                .changed
                .wait_timeout(state, deadline.remaining())
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Atomically adds to a counter.
    pub(crate) fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let mut state = self.lock();
        let new = add_to_counter(key, state.map.get(key).map(Vec::as_slice), delta)?;
        state
            .map
            .insert(key.to_owned(), new.to_string().into_bytes());
        drop(state);
        self.changed.notify_all();
        Ok(new)
    }

    /// Atomic compare-and-set.
    pub(crate) fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> CompareSet {
        let mut state = self.lock();
        let current = state.map.get(key).map(Vec::as_slice);
        if current != expected {
            return CompareSet::Mismatch {
                current: current.map(<[u8]>::to_vec),
            };
        }
        state.map.insert(key.to_owned(), desired.to_vec());
        drop(state);
        self.changed.notify_all();
        CompareSet::Swapped
    }

    /// Appends to a key's value (creating it); wakes waiters.
    pub(crate) fn append(&self, key: &str, value: &[u8]) {
        let mut state = self.lock();
        state
            .map
            .entry(key.to_owned())
            .or_default()
            .extend_from_slice(value);
        drop(state);
        self.changed.notify_all();
    }

    /// Removes a key; returns whether it existed.
    pub(crate) fn delete(&self, key: &str) -> bool {
        self.lock().map.remove(key).is_some()
    }

    /// Number of keys.
    pub(crate) fn num_keys(&self) -> usize {
        self.lock().map.len()
    }

    /// Makes every current and future blocking wait return
    /// [`WaitOutcome::Closed`] (used when the TCP server shuts down).
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn close_wakes_waiters() {
        let kv = Arc::new(Kv::default());
        let waiter = {
            let kv = Arc::clone(&kv);
            std::thread::spawn(move || kv.get("never", &Deadline::after(Duration::from_secs(30))))
        };
        std::thread::sleep(Duration::from_millis(20));
        kv.close();
        let outcome = waiter.join();
        assert!(matches!(outcome, Ok(WaitOutcome::Closed)));
    }

    #[test]
    fn wait_reports_only_missing_keys() {
        let kv = Kv::default();
        kv.set("a", b"1");
        let outcome = kv.wait(&["a", "b"], &Deadline::after(Duration::from_millis(10)));
        assert_eq!(outcome, WaitOutcome::TimedOut(vec!["b".to_owned()]));
    }
}
