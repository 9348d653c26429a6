//! [`TcpStore`]: the client of kolo's store protocol.

use std::io::{self, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::auth::{self, JobSecret};
use crate::deadline::Deadline;
use crate::pool::{connect_retrying, open_first, Attempt, Pool};
use crate::wire::{
    self, encode_request, read_response, RemoteError, Reply, Request, Response, WireError,
};
use crate::{validate_key, validate_value, validate_wait_keys, CompareSet, Store, StoreError};

use super::{duration_to_ms, is_disconnect, socket_timeout};

/// Default [`TcpStore::io_timeout`].
const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Most idle connections a client keeps for reuse.
const MAX_IDLE_CONNECTIONS: usize = 16;

/// A client of a [`TcpStoreServer`](crate::TcpStoreServer); implements [`Store`].
///
/// Calls are request/response on a connection taken from a small pool, so
/// threads sharing one `TcpStore` do not block each other (a thread blocked
/// in `get` does not stop another thread's `set`). The first connection is
/// made by [`TcpStore::connect`]; more are opened on demand (one attempt
/// each, bounded by [`TcpStore::io_timeout`]).
///
/// Blocking `get`/`wait` calls are served by the server blocking up to the
/// timeout sent with the request; the client gives up reading after that
/// timeout plus [`TcpStore::io_timeout`], so a dead server is an error, not
/// a hang. A connection that saw an I/O or protocol error is discarded.
#[derive(Debug)]
pub struct TcpStore {
    secret: JobSecret,
    addr: String,
    io_timeout: Duration,
    pool: Pool<BufReader<TcpStream>>,
}

impl TcpStore {
    /// Connects to the server at `addr` (`"host:port"`), retrying with
    /// backoff (10 ms growing to 200 ms) while the server is not up yet,
    /// for up to `timeout`. Then fails with [`StoreError::Connect`] carrying
    /// the last error. A peer that is not a compatible store server is
    /// [`StoreError::Protocol`] at once.
    ///
    /// Proves the job secret in `KOLO_JOB_SECRET` (none when unset) to the server, and checks the
    /// server's proof; a mismatch is [`StoreError::Protocol`] at once.
    pub fn connect(addr: &str, timeout: Duration) -> Result<TcpStore, StoreError> {
        TcpStore::connect_with_secret(addr, timeout, JobSecret::from_env())
    }

    /// [`TcpStore::connect`] with an explicit job secret.
    pub fn connect_with_secret(
        addr: &str,
        timeout: Duration,
        secret: JobSecret,
    ) -> Result<TcpStore, StoreError> {
        let conn = connect_retrying(addr, timeout, |deadline| {
            open_connection(addr, deadline, DEFAULT_IO_TIMEOUT, &secret)
        })?;
        Ok(TcpStore {
            secret,
            addr: addr.to_owned(),
            io_timeout: DEFAULT_IO_TIMEOUT,
            pool: Pool::new(Some(conn), MAX_IDLE_CONNECTIONS),
        })
    }

    /// Sets the time allowed for one non-blocking request (and the margin
    /// added to a blocking request's own timeout) before the server is
    /// considered dead. Default 30 s; values below 1 ms become 1 ms.
    pub fn with_io_timeout(mut self, io_timeout: Duration) -> Self {
        self.io_timeout = io_timeout.max(Duration::from_millis(1));
        self
    }

    /// See [`TcpStore::with_io_timeout`].
    pub fn io_timeout(&self) -> Duration {
        self.io_timeout
    }

    /// The server address this client was given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Takes an idle connection or opens a new one.
    fn checkout(&self) -> Result<BufReader<TcpStream>, StoreError> {
        self.pool.take(&self.addr, self.io_timeout, |deadline| {
            open_connection(&self.addr, deadline, self.io_timeout, &self.secret)
        })
    }

    fn checkin(&self, conn: BufReader<TcpStream>) {
        self.pool.put(conn);
    }

    fn wire_error(&self, err: WireError, waited: Duration) -> StoreError {
        match err {
            WireError::Io(e) if is_disconnect(&e) => StoreError::Disconnected {
                addr: self.addr.clone(),
            },
            WireError::Io(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                StoreError::io(
                    format!(
                        "no response from the store server at {} within {waited:?}",
                        self.addr
                    ),
                    e,
                )
            }
            WireError::Io(e) => {
                StoreError::io(format!("talking to the store server at {}", self.addr), e)
            }
            WireError::Invalid(reason) => StoreError::Protocol {
                peer: self.addr.clone(),
                reason,
            },
        }
    }

    fn remote_error(&self, err: RemoteError) -> StoreError {
        match err {
            RemoteError::Timeout { keys, waited_ms } => StoreError::Timeout {
                keys,
                waited: Duration::from_millis(waited_ms),
            },
            RemoteError::NotACounter { key } => StoreError::NotACounter { key },
            RemoteError::CounterOverflow {
                key,
                current,
                delta,
            } => StoreError::CounterOverflow {
                key,
                current,
                delta,
            },
            RemoteError::InvalidKey { key, reason } => StoreError::InvalidKey {
                key,
                reason: match reason.as_str() {
                    "keys must not be empty" => "keys must not be empty",
                    "keys must be at most 4096 bytes" => "keys must be at most 4096 bytes",
                    _ => "rejected by the store server",
                },
            },
            RemoteError::TooLarge { what, len, max } => StoreError::TooLarge {
                what: match what.as_str() {
                    "value" => "value",
                    "number of keys in a wait" => "number of keys in a wait",
                    "total size of the keys in a wait" => "total size of the keys in a wait",
                    _ => "request field",
                },
                len,
                max,
            },
            RemoteError::ShuttingDown => StoreError::Disconnected {
                addr: self.addr.clone(),
            },
            RemoteError::Other { message } => StoreError::Protocol {
                peer: self.addr.clone(),
                reason: format!("server error: {message}"),
            },
        }
    }

    /// Sends one request and reads its reply. `blocking` is the timeout of
    /// a blocking request (the server may legitimately take that long).
    fn call(&self, request: &Request<'_>, blocking: Option<Duration>) -> Result<Reply, StoreError> {
        let mut frame = Vec::new();
        encode_request(request, &mut frame).map_err(|e| self.wire_error(e, Duration::ZERO))?;
        let wait = blocking
            .unwrap_or(Duration::ZERO)
            .saturating_add(self.io_timeout);
        let mut conn = self.checkout()?;
        let exchange = (|| -> Result<Response, WireError> {
            conn.get_ref().set_read_timeout(socket_timeout(wait))?;
            conn.get_mut().write_all(&frame)?;
            read_response(&mut conn)
        })();
        match exchange {
            Ok(Response::Ok(reply)) => {
                self.checkin(conn);
                Ok(reply)
            }
            Ok(Response::Err(RemoteError::ShuttingDown)) => Err(StoreError::Disconnected {
                addr: self.addr.clone(),
            }),
            Ok(Response::Err(remote)) => {
                self.checkin(conn);
                Err(self.remote_error(remote))
            }
            Err(e) => Err(self.wire_error(e, wait)),
        }
    }

    fn unexpected(&self, reply: &Reply, op: &str) -> StoreError {
        StoreError::Protocol {
            peer: self.addr.clone(),
            reason: format!("unexpected reply {reply:?} to {op}"),
        }
    }
}

/// One attempt to connect to `addr` and shake hands, bounded by `deadline`
/// (at least a short minimum, so a zero timeout still tries once).
fn open_connection(
    addr: &str,
    deadline: &Deadline,
    io_timeout: Duration,
    secret: &JobSecret,
) -> Result<BufReader<TcpStream>, Attempt> {
    open_first(addr, deadline, io_timeout, |mut stream, target| {
        let shaken = wire::client_handshake(&mut stream).and_then(|()| {
            auth::client(&mut stream, secret).map_err(|e| match e {
                auth::AuthError::Io(e) => WireError::Io(e),
                other => WireError::Invalid(other.to_string()),
            })
        });
        match shaken {
            Ok(()) => Ok(BufReader::new(stream)),
            Err(WireError::Io(e)) => Err(Attempt::Retry(e)),
            Err(WireError::Invalid(reason)) => Err(Attempt::Fatal(StoreError::Protocol {
                peer: format!("{addr} ({target})"),
                reason,
            })),
        }
    })
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        validate_key(key)?;
        validate_value(value)?;
        let request = Request::Set {
            key: key.into(),
            value: value.into(),
        };
        match self.call(&request, None)? {
            Reply::Done => Ok(()),
            other => Err(self.unexpected(&other, "set")),
        }
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        validate_key(key)?;
        let request = Request::Get {
            key: key.into(),
            timeout_ms: duration_to_ms(timeout),
        };
        match self.call(&request, Some(timeout))? {
            Reply::Value(value) => Ok(value),
            other => Err(self.unexpected(&other, "get")),
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        validate_key(key)?;
        match self.call(&Request::TryGet { key: key.into() }, None)? {
            Reply::MaybeValue(value) => Ok(value),
            other => Err(self.unexpected(&other, "try_get")),
        }
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        validate_wait_keys(keys)?;
        let request = Request::Wait {
            keys: keys.iter().map(|&k| k.into()).collect(),
            timeout_ms: duration_to_ms(timeout),
        };
        match self.call(&request, Some(timeout))? {
            Reply::Done => Ok(()),
            other => Err(self.unexpected(&other, "wait")),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        validate_key(key)?;
        let request = Request::Add {
            key: key.into(),
            delta,
        };
        match self.call(&request, None)? {
            Reply::Counter(n) => Ok(n),
            other => Err(self.unexpected(&other, "add")),
        }
    }

    fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        validate_key(key)?;
        validate_value(desired)?;
        if let Some(expected) = expected {
            validate_value(expected)?;
        }
        let request = Request::CompareSet {
            key: key.into(),
            expected: expected.map(Into::into),
            desired: desired.into(),
        };
        match self.call(&request, None)? {
            Reply::Swapped => Ok(CompareSet::Swapped),
            Reply::Mismatch(current) => Ok(CompareSet::Mismatch { current }),
            other => Err(self.unexpected(&other, "compare_set")),
        }
    }

    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        validate_key(key)?;
        match self.call(&Request::Delete { key: key.into() }, None)? {
            Reply::Existed(existed) => Ok(existed),
            other => Err(self.unexpected(&other, "delete")),
        }
    }

    fn num_keys(&self) -> Result<usize, StoreError> {
        match self.call(&Request::NumKeys, None)? {
            Reply::Count(n) => usize::try_from(n).map_err(|_| StoreError::Protocol {
                peer: self.addr.clone(),
                reason: format!("server reported {n} keys, more than this platform can count"),
            }),
            other => Err(self.unexpected(&other, "num_keys")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_errors_map_to_typed_errors() {
        let store = TcpStore {
            secret: JobSecret::default(),
            addr: "x:1".into(),
            io_timeout: DEFAULT_IO_TIMEOUT,
            pool: Pool::new(None, 1),
        };
        assert!(matches!(
            store.remote_error(RemoteError::TooLarge {
                what: "value".into(),
                len: 5,
                max: 4
            }),
            StoreError::TooLarge { what: "value", .. }
        ));
        assert!(matches!(
            store.remote_error(RemoteError::ShuttingDown),
            StoreError::Disconnected { .. }
        ));
        assert!(matches!(
            store.remote_error(RemoteError::Timeout {
                keys: vec!["a".into()],
                waited_ms: 3
            }),
            StoreError::Timeout { .. }
        ));
    }
}
