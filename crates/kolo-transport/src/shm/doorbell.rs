//! A rank's doorbell: the sleep/wake handshake of [`super::sync`] on the futex word and the count
//! of sleepers.
//!
//! Written against [`super::atomics`] only, so `tests/shm_model.rs` model-checks this file with
//! `loom` (a lost wake-up shows there as a deadlock).

use std::time::Duration;

use super::atomics::{fence, futex_wait, futex_wake, AtomicU32, Ordering};

/// A rank's doorbell: the futex word and the count of its threads asleep on it.
#[derive(Debug)]
pub struct Doorbell<'a> {
    /// Futex word.
    pub word: &'a AtomicU32,
    /// Threads of the owner asleep (or about to sleep) on `word`.
    pub sleepers: &'a AtomicU32,
}

impl Doorbell<'_> {
    /// Rings if anyone sleeps; call after publishing.
    #[inline]
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::Relaxed) > 0 {
            self.word.fetch_add(1, Ordering::SeqCst);
            futex_wake(self.word);
        }
    }

    /// Rings unconditionally (failure notices).
    pub fn ring_always(&self) {
        self.word.fetch_add(1, Ordering::SeqCst);
        futex_wake(self.word);
    }

    /// Sleeps up to `timeout` unless `ready()` holds once registered as a sleeper; returns whether it
    /// held.
    pub fn sleep_unless(&self, timeout: Duration, ready: &mut dyn FnMut() -> bool) -> bool {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let v = self.word.load(Ordering::SeqCst);
        let done = ready();
        if !done {
            futex_wait(self.word, v, timeout);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        done
    }
}
