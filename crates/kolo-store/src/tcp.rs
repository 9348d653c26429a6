//! [`TcpStoreServer`] and [`TcpStore`]: the store over TCP.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::auth::{self, JobSecret};
use crate::deadline::{Backoff, Deadline};
use crate::kv::{Kv, WaitOutcome};
use crate::sys::poll_readable;
use crate::wire::{
    self, encode_request, encode_response, read_request, read_response, RemoteError, Reply,
    Request, Response, WireError,
};
use crate::{validate_key, validate_value, validate_wait_keys, CompareSet, Store, StoreError};

/// How often the accept loop checks for shutdown.
const ACCEPT_POLL: Duration = Duration::from_millis(50);
/// How long the server waits for a new connection's handshake.
const SERVER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the server waits for a client to accept a response's bytes.
const SERVER_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most simultaneous client connections a server accepts.
const MAX_CONNECTIONS: usize = 4096;
/// Default [`TcpStore::io_timeout`].
const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Most idle connections a client keeps for reuse.
const MAX_IDLE_CONNECTIONS: usize = 16;
/// Socket timeouts longer than this are treated as "no timeout" (a year).
const MAX_SOCKET_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code path panics while holding these locks; recover from poison.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Writes one line to stderr, ignoring failures (never panics, unlike `eprintln!`).
fn log(args: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "kolo-store: {args}");
}

/// Whether an I/O error means the peer went away.
fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected
    )
}

/// Milliseconds for the wire, rounded up so a short non-zero timeout is not 0.
fn duration_to_ms(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 != 0);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// A socket timeout, or `None` (no timeout) for absurdly long ones.
fn socket_timeout(d: Duration) -> Option<Duration> {
    (d <= MAX_SOCKET_TIMEOUT).then_some(d.max(Duration::from_millis(1)))
}

// ---------------------------------------------------------------------------
// Server

#[derive(Debug)]
struct ServerShared {
    kv: Kv,
    stopping: AtomicBool,
    /// Clones of every open client socket, so shutdown can close them.
    conns: Mutex<HashMap<u64, TcpStream>>,
    /// What clients must prove they know.
    secret: JobSecret,
}

/// A TCP store server running on background threads.
///
/// One thread accepts connections and one thread serves each client
/// (worlds are small). The keys live in memory. [`TcpStoreServer::shutdown`]
/// or dropping the server closes the listener and every client connection
/// and joins all threads; clients blocked in `get`/`wait` see
/// [`StoreError::Disconnected`].
///
/// A connection that fails the handshake or breaks the protocol is dropped
/// with one line on stderr; other clients are not affected.
///
/// ```
/// use std::time::Duration;
/// use kolo_store::{Store, TcpStore, TcpStoreServer};
///
/// let server = TcpStoreServer::bind("127.0.0.1:0")?;
/// let store = TcpStore::connect(&server.local_addr().to_string(), Duration::from_secs(5))?;
/// store.set("k", b"v")?;
/// assert_eq!(store.try_get("k")?, Some(b"v".to_vec()));
/// # Ok::<(), kolo_store::StoreError>(())
/// ```
#[derive(Debug)]
pub struct TcpStoreServer {
    local_addr: SocketAddr,
    shared: Arc<ServerShared>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
}

impl TcpStoreServer {
    /// Binds a listening socket to `addr` and starts serving on a background
    /// thread. Port 0 picks a free port; see [`TcpStoreServer::local_addr`].
    ///
    /// A port already in use (or any other bind failure) is
    /// [`StoreError::Bind`].
    ///
    /// Clients must prove they know the job secret in `KOLO_JOB_SECRET` (none when unset; see
    /// [`crate::auth`]); [`TcpStoreServer::bind_with_secret`] takes it explicitly.
    pub fn bind(addr: impl ToSocketAddrs) -> Result<TcpStoreServer, StoreError> {
        TcpStoreServer::bind_with_secret(addr, JobSecret::from_env())
    }

    /// [`TcpStoreServer::bind`] with an explicit job secret. A connection that fails the secret
    /// exchange is dropped and logged; it never reaches the data.
    pub fn bind_with_secret(
        addr: impl ToSocketAddrs,
        secret: JobSecret,
    ) -> Result<TcpStoreServer, StoreError> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|source| StoreError::Bind {
                addr: "(unresolvable address)".to_owned(),
                source,
            })?
            .collect();
        let shown = addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        if addrs.is_empty() {
            return Err(StoreError::Bind {
                addr: "(no address)".to_owned(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "address resolved to nothing"),
            });
        }
        let listener = TcpListener::bind(&addrs[..]).map_err(|source| StoreError::Bind {
            addr: shown.clone(),
            source,
        })?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| StoreError::io(format!("reading the bound address of {shown}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| StoreError::io("making the store listener non-blocking", e))?;
        let shared = Arc::new(ServerShared {
            kv: Kv::default(),
            stopping: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            secret,
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("kolo-store-accept-{}", local_addr.port()))
                .spawn(move || accept_loop(&listener, &shared))
                .map_err(|e| StoreError::io("spawning the store server thread", e))?
        };
        Ok(TcpStoreServer {
            local_addr,
            shared,
            acceptor: Mutex::new(Some(acceptor)),
        })
    }

    /// The address the server is listening on (with the actual port when
    /// bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops the server: closes the listener and every client connection,
    /// wakes blocked waits and joins all server threads. Idempotent; also
    /// done on drop. Returns within about 50 ms plus the time threads take
    /// to notice their closed sockets.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.kv.close();
        let handle = lock(&self.acceptor).take();
        if let Some(handle) = handle {
            if handle.join().is_err() {
                log(format_args!(
                    "the accept thread of {} panicked",
                    self.local_addr
                ));
            }
        }
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<ServerShared>) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id: u64 = 0;
    while !shared.stopping.load(Ordering::SeqCst) {
        match poll_readable(listener, ACCEPT_POLL) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                log(format_args!("polling the listener failed: {e}"));
                thread::sleep(ACCEPT_POLL);
                continue;
            }
        }
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                log(format_args!("accepting a connection failed: {e}"));
                thread::sleep(ACCEPT_POLL);
                continue;
            }
        };
        workers.retain(|w| !w.is_finished());
        let id = next_id;
        next_id += 1;
        {
            let mut conns = lock(&shared.conns);
            if conns.len() >= MAX_CONNECTIONS {
                log(format_args!(
                    "dropping connection from {peer}: already {MAX_CONNECTIONS} connections"
                ));
                continue;
            }
            match stream.try_clone() {
                Ok(clone) => {
                    conns.insert(id, clone);
                }
                Err(e) => {
                    log(format_args!("dropping connection from {peer}: {e}"));
                    continue;
                }
            }
        }
        let worker_shared = Arc::clone(shared);
        let spawned = thread::Builder::new()
            .name(format!("kolo-store-conn-{id}"))
            .spawn(move || serve_connection(&worker_shared, id, stream, peer));
        match spawned {
            Ok(handle) => workers.push(handle),
            Err(e) => {
                log(format_args!(
                    "dropping connection from {peer}: cannot spawn a thread: {e}"
                ));
                if let Some(stream) = lock(&shared.conns).remove(&id) {
                    let _ = stream.shutdown(Shutdown::Both);
                }
            }
        }
    }
    // Stopping: no new connection can be registered any more (only this
    // thread registers), so closing the registered ones reaches them all.
    let open: Vec<TcpStream> = lock(&shared.conns).drain().map(|(_, s)| s).collect();
    for stream in open {
        let _ = stream.shutdown(Shutdown::Both);
    }
    for worker in workers {
        let _ = worker.join();
    }
}

fn serve_connection(shared: &ServerShared, id: u64, stream: TcpStream, peer: SocketAddr) {
    let outcome = serve(shared, stream);
    lock(&shared.conns).remove(&id);
    if let Err(err) = outcome {
        let quiet = shared.stopping.load(Ordering::SeqCst)
            || matches!(&err, WireError::Io(e) if is_disconnect(e));
        if !quiet {
            let err = match err {
                WireError::Io(e) => StoreError::io(format!("serving {peer}"), e),
                WireError::Invalid(reason) => StoreError::Protocol {
                    peer: peer.to_string(),
                    reason,
                },
            };
            log(format_args!("dropping a client connection: {err}"));
        }
    }
}

fn serve(shared: &ServerShared, mut stream: TcpStream) -> Result<(), WireError> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(SERVER_WRITE_TIMEOUT))?;
    stream.set_read_timeout(Some(SERVER_HANDSHAKE_TIMEOUT))?;
    wire::server_handshake(&mut stream)?;
    auth::server(&mut stream, &shared.secret).map_err(|e| match e {
        auth::AuthError::Io(e) => WireError::Invalid(format!(
            "the client did not complete the job-secret exchange ({e})"
        )),
        other => WireError::Invalid(other.to_string()),
    })?;
    // Between requests a client may stay idle for the whole job.
    stream.set_read_timeout(None)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = Vec::new();
    while let Some(request) = read_request(&mut reader)? {
        let response = handle(&shared.kv, request);
        out.clear();
        encode_response(&response, &mut out)?;
        stream.write_all(&out)?;
        if response == Response::Err(RemoteError::ShuttingDown) {
            break;
        }
    }
    Ok(())
}

fn to_remote(err: StoreError) -> RemoteError {
    match err {
        StoreError::NotACounter { key } => RemoteError::NotACounter { key },
        StoreError::CounterOverflow {
            key,
            current,
            delta,
        } => RemoteError::CounterOverflow {
            key,
            current,
            delta,
        },
        StoreError::InvalidKey { key, reason } => RemoteError::InvalidKey {
            key,
            reason: reason.to_owned(),
        },
        StoreError::TooLarge { what, len, max } => RemoteError::TooLarge {
            what: what.to_owned(),
            len,
            max,
        },
        other => RemoteError::Other {
            message: other.to_string(),
        },
    }
}

fn finish<T>(
    outcome: WaitOutcome<T>,
    deadline: &Deadline,
    ok: impl FnOnce(T) -> Reply,
) -> Response {
    match outcome {
        WaitOutcome::Ready(v) => Response::Ok(ok(v)),
        WaitOutcome::TimedOut(keys) => Response::Err(RemoteError::Timeout {
            keys,
            waited_ms: duration_to_ms(deadline.elapsed()),
        }),
        WaitOutcome::Closed => Response::Err(RemoteError::ShuttingDown),
    }
}

fn handle(kv: &Kv, request: Request<'_>) -> Response {
    let result = match request {
        Request::Set { key, value } => validate_key(&key)
            .and_then(|()| validate_value(&value))
            .map(|()| {
                kv.set(&key, &value);
                Reply::Done
            }),
        Request::Get { key, timeout_ms } => match validate_key(&key) {
            Ok(()) => {
                let deadline = Deadline::after(Duration::from_millis(timeout_ms));
                return finish(kv.get(&key, &deadline), &deadline, Reply::Value);
            }
            Err(e) => Err(e),
        },
        Request::TryGet { key } => validate_key(&key).map(|()| Reply::MaybeValue(kv.try_get(&key))),
        Request::Wait { keys, timeout_ms } => match validate_wait_keys(&keys) {
            Ok(()) => {
                let deadline = Deadline::after(Duration::from_millis(timeout_ms));
                return finish(kv.wait(&keys, &deadline), &deadline, |()| Reply::Done);
            }
            Err(e) => Err(e),
        },
        Request::Add { key, delta } => {
            validate_key(&key).and_then(|()| kv.add(&key, delta).map(Reply::Counter))
        }
        Request::CompareSet {
            key,
            expected,
            desired,
        } => validate_key(&key)
            .and_then(|()| validate_value(&desired))
            .map(
                |()| match kv.compare_set(&key, expected.as_deref(), &desired) {
                    CompareSet::Swapped => Reply::Swapped,
                    CompareSet::Mismatch { current } => Reply::Mismatch(current),
                },
            ),
        Request::Delete { key } => validate_key(&key).map(|()| Reply::Existed(kv.delete(&key))),
        Request::NumKeys => Ok(Reply::Count(kv.num_keys() as u64)),
    };
    match result {
        Ok(reply) => Response::Ok(reply),
        Err(e) => Response::Err(to_remote(e)),
    }
}

// ---------------------------------------------------------------------------
// Client

/// Why one connection attempt failed.
enum AttemptError {
    /// Worth retrying (nobody listening yet, reset during handshake, ...).
    Retry(io::Error),
    /// The peer answered but is not a compatible store server.
    Fatal(StoreError),
}

/// A client of a [`TcpStoreServer`]; implements [`Store`].
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
    idle: Mutex<Vec<BufReader<TcpStream>>>,
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
        let deadline = Deadline::after(timeout);
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
        loop {
            let last = match open_connection(addr, &deadline, DEFAULT_IO_TIMEOUT, &secret) {
                Ok(conn) => {
                    return Ok(TcpStore {
                        secret,
                        addr: addr.to_owned(),
                        io_timeout: DEFAULT_IO_TIMEOUT,
                        idle: Mutex::new(vec![conn]),
                    })
                }
                Err(AttemptError::Fatal(e)) => return Err(e),
                Err(AttemptError::Retry(e)) => e,
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
        if let Some(conn) = lock(&self.idle).pop() {
            return Ok(conn);
        }
        let deadline = Deadline::after(self.io_timeout);
        open_connection(&self.addr, &deadline, self.io_timeout, &self.secret).map_err(|e| match e {
            AttemptError::Fatal(e) => e,
            AttemptError::Retry(source) => StoreError::Connect {
                addr: self.addr.clone(),
                waited: deadline.elapsed(),
                source,
            },
        })
    }

    fn checkin(&self, conn: BufReader<TcpStream>) {
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(conn);
        }
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
) -> Result<BufReader<TcpStream>, AttemptError> {
    let min = Duration::from_millis(50);
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(AttemptError::Retry)?
        .collect();
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{addr} resolved to no address"),
    );
    for target in targets {
        let mut stream = match TcpStream::connect_timeout(&target, deadline.remaining().max(min)) {
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
        let shaken = wire::client_handshake(&mut stream).and_then(|()| {
            auth::client(&mut stream, secret).map_err(|e| match e {
                auth::AuthError::Io(e) => WireError::Io(e),
                other => WireError::Invalid(other.to_string()),
            })
        });
        match shaken {
            Ok(()) => return Ok(BufReader::new(stream)),
            Err(WireError::Io(e)) => last = e,
            Err(WireError::Invalid(reason)) => {
                return Err(AttemptError::Fatal(StoreError::Protocol {
                    peer: format!("{addr} ({target})"),
                    reason,
                }))
            }
        }
    }
    Err(AttemptError::Retry(last))
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
    fn ms_rounding() {
        assert_eq!(duration_to_ms(Duration::ZERO), 0);
        assert_eq!(duration_to_ms(Duration::from_micros(1)), 1);
        assert_eq!(duration_to_ms(Duration::from_millis(200)), 200);
        assert_eq!(duration_to_ms(Duration::MAX), u64::MAX);
    }

    #[test]
    fn socket_timeouts() {
        assert_eq!(socket_timeout(Duration::MAX), None);
        assert_eq!(
            socket_timeout(Duration::ZERO),
            Some(Duration::from_millis(1))
        );
    }

    #[test]
    fn remote_errors_map_to_typed_errors() {
        let store = TcpStore {
            secret: JobSecret::default(),
            addr: "x:1".into(),
            io_timeout: DEFAULT_IO_TIMEOUT,
            idle: Mutex::new(Vec::new()),
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

    #[test]
    fn handle_validates_keys() {
        let kv = Kv::default();
        let response = handle(&kv, Request::TryGet { key: "".into() });
        assert!(matches!(
            response,
            Response::Err(RemoteError::InvalidKey { .. })
        ));
    }
}
