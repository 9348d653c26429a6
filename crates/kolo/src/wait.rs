//! Waiting primitives of a communicator: [`Sleepers`] (threads waiting for an atomic condition),
//! [`Pending`] (queued asynchronous collectives) and [`Turn`] (whose turn it is to use the arena).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use kolo_core::Result;

/// Threads waiting for an atomic condition. The condition's owner changes it with atomics and then
/// calls [`Sleepers::notify`], which touches the lock and the condvar only when someone waits (a
/// `Condvar` notify is a system call), so the common case costs a few atomic operations.
#[derive(Default)]
pub(crate) struct Sleepers {
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Sleepers {
    /// Wakes the waiters, if any; call after changing the condition.
    pub fn notify(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this notify after a waiter's check-then-wait.
            drop(self.lock.lock().unwrap_or_else(|p| p.into_inner()));
            self.cv.notify_all();
        }
    }

    /// Waits until `ready()` returns `Ok(true)` (or an error), checking it at least every `tick`.
    pub fn wait(&self, tick: Duration, mut ready: impl FnMut() -> Result<bool>) -> Result<()> {
        if ready()? {
            return Ok(());
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let r = loop {
            match ready() {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(e) => break Err(e),
            }
            g = self
                .cv
                .wait_timeout(g, tick)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        drop(g);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

/// Queued async collectives not yet finished; a blocking call with nothing queued takes no lock.
#[derive(Default)]
pub(crate) struct Pending {
    count: AtomicUsize,
    sleepers: Sleepers,
}

impl Pending {
    pub fn add(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    pub fn done(&self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
        self.sleepers.notify();
    }

    pub fn wait_zero(&self) {
        let _ = self.sleepers.wait(Duration::from_secs(1), || {
            Ok(self.count.load(Ordering::SeqCst) == 0)
        });
    }
}

/// The arena turn: the sequence number allowed to use the arena next.
#[derive(Default)]
pub(crate) struct Turn {
    pub next: AtomicU64,
    pub sleepers: Sleepers,
}

/// Passes the arena turn to the next sequence number when a collective ends (however it ends).
pub(crate) struct TurnGuard<'a> {
    pub turn: &'a Turn,
    pub seq: u64,
}

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        self.turn.next.fetch_max(self.seq + 1, Ordering::SeqCst);
        self.turn.sleepers.notify();
    }
}
