//! What the TCP clients of both protocols share: connecting with retries while the server comes
//! up, and a pool of idle connections reused across calls.

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::deadline::{Backoff, Deadline};
use crate::StoreError;

/// Socket timeouts longer than this are treated as "no timeout" (a year).
const MAX_SOCKET_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A socket timeout, or `None` (no timeout) for absurdly long ones.
pub(crate) fn socket_timeout(d: Duration) -> Option<Duration> {
    (d <= MAX_SOCKET_TIMEOUT).then_some(d.max(Duration::from_millis(1)))
}

/// One attempt to open a connection to `addr`: connects to each address it resolves to in turn
/// (bounded by `deadline`, at least 50 ms so that a zero timeout still tries once), sets no-delay
/// and the timeouts, and hands the stream to `shake`. The first stream `shake` accepts wins; its
/// [`Attempt::Retry`] moves on to the next address, its [`Attempt::Fatal`] ends the attempt.
pub(crate) fn open_first<C>(
    addr: &str,
    deadline: &Deadline,
    io_timeout: Duration,
    mut shake: impl FnMut(TcpStream, SocketAddr) -> Result<C, Attempt>,
) -> Result<C, Attempt> {
    let min = Duration::from_millis(50);
    let targets: Vec<SocketAddr> = addr.to_socket_addrs().map_err(Attempt::Retry)?.collect();
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{addr} resolved to no address"),
    );
    for target in targets {
        let stream = match TcpStream::connect_timeout(&target, deadline.remaining().max(min)) {
            Ok(stream) => stream,
            Err(e) => {
                last = e;
                continue;
            }
        };
        let setup = (|| -> io::Result<()> {
            stream.set_nodelay(true)?;
            stream.set_write_timeout(socket_timeout(io_timeout))?;
            stream.set_read_timeout(socket_timeout(
                deadline.remaining().max(min).min(io_timeout),
            ))
        })();
        if let Err(e) = setup {
            last = e;
            continue;
        }
        match shake(stream, target) {
            Ok(conn) => return Ok(conn),
            Err(Attempt::Retry(e)) => last = e,
            Err(fatal) => return Err(fatal),
        }
    }
    Err(Attempt::Retry(last))
}

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
