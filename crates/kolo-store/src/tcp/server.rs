//! [`TcpStoreServer`]: the server of kolo's store protocol.

use std::collections::HashMap;
use std::io::{self, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::auth::{self, JobSecret};
use crate::c10d;
use crate::deadline::Deadline;
use crate::kv::{Kv, WaitOutcome};
use crate::sys::poll_readable;
use crate::wire::{
    self, encode_response, read_request, RemoteError, Reply, Request, Response, WireError,
};
use crate::{validate_key, validate_value, validate_wait_keys, CompareSet, StoreError};

use super::{duration_to_ms, is_disconnect, lock, log};

/// How often the accept loop checks for shutdown.
const ACCEPT_POLL: Duration = Duration::from_millis(50);
/// How long the server waits for a new connection's handshake.
const SERVER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the server waits for a client to accept a response's bytes.
const SERVER_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most simultaneous client connections a server accepts.
const MAX_CONNECTIONS: usize = 4096;

#[derive(Debug)]
struct ServerShared {
    kv: Kv,
    stopping: AtomicBool,
    /// Clones of every open client socket, so shutdown can close them.
    conns: Mutex<HashMap<u64, TcpStream>>,
    /// What clients must prove they know.
    secret: JobSecret,
    /// The key space of PyTorch's `TCPStore` clients, when they are served too.
    torch: Option<Arc<c10d::server::Shared>>,
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
        TcpStoreServer::start(addr, secret, false)
    }

    /// [`TcpStoreServer::bind_with_secret`], also answering PyTorch's `TCPStore` clients (the c10d
    /// protocol, told apart by the first byte a client sends) on the same port, as a launcher's
    /// store does for torch.distributed's `env://` rendezvous (`TORCHELASTIC_USE_AGENT_STORE`).
    /// They get a key space of their own: PyTorch's clients cannot prove the job secret, and so
    /// never see kolo's keys.
    pub fn bind_with_secret_and_torch(
        addr: impl ToSocketAddrs,
        secret: JobSecret,
    ) -> Result<TcpStoreServer, StoreError> {
        TcpStoreServer::start(addr, secret, true)
    }

    fn start(
        addr: impl ToSocketAddrs,
        secret: JobSecret,
        torch: bool,
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
            torch: torch.then(Default::default),
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

    /// Sets `key` to `value` in the server's own (kolo) key space, as a client's `set` would,
    /// without a connection: for the process that hosts the store (a launcher telling its
    /// workers that one of them exited).
    pub fn set(&self, key: &str, value: &[u8]) {
        self.shared.kv.set(key, value);
    }

    /// Stops the server: closes the listener and every client connection,
    /// wakes blocked waits and joins all server threads. Idempotent; also
    /// done on drop. Returns within about 50 ms plus the time threads take
    /// to notice their closed sockets.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.kv.close();
        if let Some(torch) = &self.shared.torch {
            torch.stop();
        }
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
    if let Some(torch) = &shared.torch {
        // A c10d client opens with VALIDATE (byte 0); kolo's handshake never does.
        let mut first = [0u8; 1];
        if stream.peek(&mut first)? == 1 && first[0] == c10d::query::VALIDATE {
            return c10d::server::serve(torch, stream).map_err(WireError::Io);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
