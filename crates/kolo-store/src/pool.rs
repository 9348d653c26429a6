//! What the TCP clients of both protocols share: connecting with retries while the server comes
//! up, and a pool of idle connections reused across calls.

use std::io;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::deadline::{Backoff, Deadline};
use crate::StoreError;

/// Why one attempt to open a connection failed.
pub(crate) enum Attempt {
    /// Nothing (usable) answered yet: try again until the deadline.
    Retry(io::Error),
    /// The server answered, and will never do: give up now.
    Fatal(StoreError),
}

/// Opens a connection with `open`, retrying with backoff (10 ms growing to 200 ms) while it says
/// [`Attempt::Retry`], for up to `timeout`; then [`StoreError::Connect`] names `addr` and the last
/// error.
pub(crate) fn connect_retrying<C>(
    addr: &str,
    timeout: Duration,
    mut open: impl FnMut(&Deadline) -> Result<C, Attempt>,
) -> Result<C, StoreError> {
    let deadline = Deadline::after(timeout);
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
    loop {
        let last = match open(&deadline) {
            Ok(conn) => return Ok(conn),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry(e)) => e,
        };
        if deadline.expired() {
            return Err(StoreError::Connect {
                addr: addr.to_owned(),
                waited: deadline.elapsed(),
                source: last,
            });
        }
        backoff.sleep(&deadline);
    }
}

/// Idle connections of one client, at most `cap` kept.
#[derive(Debug)]
pub(crate) struct Pool<C> {
    idle: Mutex<Vec<C>>,
    cap: usize,
}

impl<C> Pool<C> {
    /// A pool holding `first` (if any).
    pub(crate) fn new(first: Option<C>, cap: usize) -> Self {
        Pool {
            idle: Mutex::new(first.into_iter().collect()),
            cap,
        }
    }

    /// Takes an idle connection, or opens one with a single attempt bounded by `io_timeout`.
    pub(crate) fn take(
        &self,
        addr: &str,
        io_timeout: Duration,
        open: impl FnOnce(&Deadline) -> Result<C, Attempt>,
    ) -> Result<C, StoreError> {
        // No code path panics while holding the lock; recover from poison.
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        if let Some(conn) = idle {
            return Ok(conn);
        }
        let deadline = Deadline::after(io_timeout);
        open(&deadline).map_err(|e| match e {
            Attempt::Fatal(e) => e,
            Attempt::Retry(source) => StoreError::Connect {
                addr: addr.to_owned(),
                waited: deadline.elapsed(),
                source,
            },
        })
    }

    /// Gives back a connection whose last exchange completed.
    pub(crate) fn put(&self, conn: C) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.cap {
            idle.push(conn);
        }
    }
}
