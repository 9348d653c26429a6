//! [`C10dStore`]: a [`Store`] client of PyTorch's c10d `TCPStore` (torchrun's agent store).

use std::io::{self, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::{
    put_bytes, query, read_bytes, read_i64, read_u8, send, CHECK_NOT_READY, CHECK_READY, MAX_VALUE,
    STOP_WAITING, VALIDATION_MAGIC, WAIT_CANCELED,
};
use crate::deadline::Deadline;
use crate::pool::{connect_retrying, open_first, socket_timeout, Attempt, Pool};
use crate::{add_to_counter, validate_key, validate_value, CompareSet, Store, StoreError};

/// Time allowed for one non-blocking request before the server counts as dead.
const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle connections kept for reuse.
const MAX_IDLE: usize = 4;

type Conn = BufReader<TcpStream>;

/// A client of a PyTorch c10d `TCPStore` server — the store torchrun's agent hosts at
/// `MASTER_ADDR:MASTER_PORT` (`TORCHELASTIC_USE_AGENT_STORE=True`), or one a PyTorch program
/// created with `torch.distributed.TCPStore(..., is_master=True)`.
///
/// Every [`Store`] call maps onto the protocol's own requests (see the [module
/// documentation](crate::c10d)); blocking calls wait on the server (`WAIT`) and cancel the wait
/// at their deadline, as PyTorch's client does. Values written by `add` are decimal text, as in
/// kolo's own stores, so the two agree on counters.
///
/// The protocol cannot tell an absent key from an empty value: `compare_set` with `expected =
/// None` also swaps a key that holds an empty value, and a mismatch whose current value equals
/// `desired` is reported as [`CompareSet::Swapped`] (the store holds `desired` either way).
#[derive(Debug)]
pub struct C10dStore {
    addr: String,
    io_timeout: Duration,
    pool: Pool<Conn>,
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// The request bytes for `CHECK`/`WAIT` on `keys`.
fn keys_request(kind: u8, keys: &[&str]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for k in keys {
        put_bytes(&mut out, k.as_bytes());
    }
    out
}

impl C10dStore {
    /// Connects to the c10d store at `addr` (`"host:port"`), retrying with backoff while nothing
    /// listens yet, for up to `timeout`; then [`StoreError::Connect`] names the address and the
    /// last error. A server that does not answer like a c10d store is [`StoreError::Protocol`].
    pub fn connect(addr: &str, timeout: Duration) -> Result<C10dStore, StoreError> {
        let conn = connect_retrying(addr, timeout, |d| open(addr, d, DEFAULT_IO_TIMEOUT))?;
        Ok(C10dStore {
            addr: addr.to_owned(),
            io_timeout: DEFAULT_IO_TIMEOUT,
            pool: Pool::new(Some(conn), MAX_IDLE),
        })
    }

    /// Sets the time allowed for one non-blocking request (and for the server's answer to a
    /// canceled wait) before the server counts as dead. Default 30 s; at least 1 ms.
    pub fn with_io_timeout(mut self, io_timeout: Duration) -> Self {
        self.io_timeout = io_timeout.max(Duration::from_millis(1));
        self
    }

    /// The server address this client was given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn checkout(&self) -> Result<Conn, StoreError> {
        self.pool.take(&self.addr, self.io_timeout, |d| {
            open(&self.addr, d, self.io_timeout)
        })
    }

    fn checkin(&self, conn: Conn) {
        self.pool.put(conn);
    }

    fn io_error(&self, e: io::Error, waited: Duration) -> StoreError {
        if is_disconnect(&e) {
            StoreError::Disconnected {
                addr: self.addr.clone(),
            }
        } else if is_timeout(&e) {
            StoreError::io(
                format!(
                    "no response from the c10d store at {} within {waited:?}",
                    self.addr
                ),
                e,
            )
        } else if e.kind() == io::ErrorKind::InvalidData {
            StoreError::Protocol {
                peer: self.addr.clone(),
                reason: e.to_string(),
            }
        } else {
            StoreError::io(format!("talking to the c10d store at {}", self.addr), e)
        }
    }

    fn bad_reply(&self, what: &str, byte: u8) -> StoreError {
        StoreError::Protocol {
            peer: self.addr.clone(),
            reason: format!("unexpected reply {byte} to {what}"),
        }
    }

    /// Runs one exchange on a pooled connection; the connection goes back to the pool only when
    /// the exchange completed (a failed one may have left bytes in flight).
    fn exchange<T>(
        &self,
        f: impl FnOnce(&mut Conn) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.checkout()?;
        conn.get_ref()
            .set_read_timeout(socket_timeout(self.io_timeout))
            .map_err(|e| self.io_error(e, Duration::ZERO))?;
        let out = f(&mut conn)?;
        self.checkin(conn);
        Ok(out)
    }

    fn send(&self, conn: &mut Conn, bytes: &[u8]) -> Result<(), StoreError> {
        send(conn.get_mut(), bytes).map_err(|e| self.io_error(e, self.io_timeout))
    }

    fn get_now(&self, conn: &mut Conn, key: &str) -> Result<Vec<u8>, StoreError> {
        let mut req = vec![query::GET];
        put_bytes(&mut req, key.as_bytes());
        self.send(conn, &req)?;
        read_bytes(conn, MAX_VALUE, "value").map_err(|e| self.io_error(e, self.io_timeout))
    }

    fn check(&self, conn: &mut Conn, keys: &[&str]) -> Result<bool, StoreError> {
        self.send(conn, &keys_request(query::CHECK, keys))?;
        match read_u8(conn).map_err(|e| self.io_error(e, self.io_timeout))? {
            CHECK_READY => Ok(true),
            CHECK_NOT_READY => Ok(false),
            b => Err(self.bad_reply("CHECK", b)),
        }
    }

    /// Waits on the server until every key exists; at the deadline cancels the wait and
    /// returns the keys still missing.
    fn wait_on(
        &self,
        conn: &mut Conn,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<Result<(), StoreError>, StoreError> {
        let deadline = Deadline::after(timeout);
        self.send(conn, &keys_request(query::WAIT, keys))?;
        let set_timeout = |conn: &mut Conn, d: Duration| {
            conn.get_ref()
                .set_read_timeout(socket_timeout(d))
                .map_err(|e| self.io_error(e, Duration::ZERO))
        };
        set_timeout(conn, deadline.remaining())?;
        let first = read_u8(conn);
        set_timeout(conn, self.io_timeout)?;
        match first {
            Ok(STOP_WAITING) => return Ok(Ok(())),
            Ok(b) => return Err(self.bad_reply("WAIT", b)),
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(self.io_error(e, deadline.elapsed())),
        }
        // Cancel; the keys may have appeared just as the deadline passed.
        self.send(conn, &[query::CANCEL_WAIT])?;
        let read = |conn: &mut Conn| read_u8(conn).map_err(|e| self.io_error(e, self.io_timeout));
        match read(conn)? {
            WAIT_CANCELED => {}
            STOP_WAITING => match read(conn)? {
                WAIT_CANCELED => return Ok(Ok(())),
                b => return Err(self.bad_reply("CANCEL_WAIT", b)),
            },
            b => return Err(self.bad_reply("CANCEL_WAIT", b)),
        }
        let mut missing = Vec::new();
        for k in keys {
            if !self.check(conn, &[k])? {
                missing.push((*k).to_owned());
            }
        }
        if missing.is_empty() {
            return Ok(Ok(()));
        }
        Ok(Err(StoreError::Timeout {
            keys: missing,
            waited: deadline.elapsed(),
        }))
    }
}

/// One attempt to connect to `addr`, validate, and check that the server answers like a c10d
/// store (a `CHECK` of no keys is ready on every version of the server).
fn open(addr: &str, deadline: &Deadline, io_timeout: Duration) -> Result<Conn, Attempt> {
    let mut hello = vec![query::VALIDATE];
    hello.extend_from_slice(&VALIDATION_MAGIC.to_le_bytes());
    hello.extend_from_slice(&keys_request(query::CHECK, &[]));
    open_first(addr, deadline, io_timeout, |mut stream, target| {
        let answer = stream.write_all(&hello).and_then(|()| read_u8(&mut stream));
        match answer {
            Ok(CHECK_READY) => Ok(BufReader::new(stream)),
            Ok(b) => Err(Attempt::Fatal(StoreError::Protocol {
                peer: format!("{addr} ({target})"),
                reason: format!(
                    "answered the c10d handshake with byte {b}: not a PyTorch TCPStore"
                ),
            })),
            // Not (yet) a c10d store: a store that is starting, or another server.
            Err(e) if is_disconnect(&e) || is_timeout(&e) => Err(Attempt::Retry(io::Error::new(
                e.kind(),
                format!(
                    "{target} did not answer the c10d TCPStore handshake ({e}); is it \
                     torchrun's store?"
                ),
            ))),
            Err(e) => Err(Attempt::Retry(e)),
        }
    })
}

impl Store for C10dStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        validate_key(key)?;
        validate_value(value)?;
        let mut req = vec![query::SET];
        put_bytes(&mut req, key.as_bytes());
        put_bytes(&mut req, value);
        self.exchange(|c| self.send(c, &req))
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        validate_key(key)?;
        self.exchange(|c| {
            self.wait_on(c, &[key], timeout)??;
            self.get_now(c, key)
        })
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        validate_key(key)?;
        self.exchange(|c| {
            if self.check(c, &[key])? {
                self.get_now(c, key).map(Some)
            } else {
                Ok(None)
            }
        })
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        for k in keys {
            validate_key(k)?;
        }
        if keys.len() > crate::MAX_WAIT_KEYS {
            return Err(StoreError::TooLarge {
                what: "number of keys in a wait",
                len: keys.len() as u64,
                max: crate::MAX_WAIT_KEYS as u64,
            });
        }
        self.exchange(|c| self.wait_on(c, keys, timeout))?
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        validate_key(key)?;
        let mut req = vec![query::ADD];
        put_bytes(&mut req, key.as_bytes());
        req.extend_from_slice(&delta.to_le_bytes());
        self.exchange(|c| {
            // PyTorch's server parses the stored text with `stoll` and does not survive a value
            // that is not a number, nor checks for overflow: check first (the counters kolo adds
            // to are its own, so the check and the add do not race with other writers).
            if self.check(c, &[key])? {
                add_to_counter(key, Some(&self.get_now(c, key)?), delta)?;
            }
            self.send(c, &req)?;
            read_i64(c).map_err(|e| self.io_error(e, self.io_timeout))
        })
    }

    fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        validate_key(key)?;
        validate_value(desired)?;
        let mut req = vec![query::COMPARE_SET];
        put_bytes(&mut req, key.as_bytes());
        put_bytes(&mut req, expected.unwrap_or_default());
        put_bytes(&mut req, desired);
        let now = self.exchange(|c| {
            self.send(c, &req)?;
            read_bytes(c, MAX_VALUE, "value").map_err(|e| self.io_error(e, self.io_timeout))
        })?;
        // The server returns the value after the call; for an absent key and a non-empty
        // `expected` it echoes `expected`.
        Ok(if now == desired {
            CompareSet::Swapped
        } else if expected == Some(now.as_slice()) {
            CompareSet::Mismatch { current: None }
        } else {
            CompareSet::Mismatch { current: Some(now) }
        })
    }

    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        validate_key(key)?;
        let mut req = vec![query::DELETE_KEY];
        put_bytes(&mut req, key.as_bytes());
        self.exchange(|c| {
            self.send(c, &req)?;
            read_i64(c).map_err(|e| self.io_error(e, self.io_timeout))
        })
        .map(|n| n > 0)
    }

    fn num_keys(&self) -> Result<usize, StoreError> {
        let n = self.exchange(|c| {
            self.send(c, &[query::GETNUMKEYS])?;
            read_i64(c).map_err(|e| self.io_error(e, self.io_timeout))
        })?;
        usize::try_from(n).map_err(|_| StoreError::Protocol {
            peer: self.addr.clone(),
            reason: format!("GETNUMKEYS answered {n}"),
        })
    }
}
