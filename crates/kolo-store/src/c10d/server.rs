//! [`C10dStoreServer`]: a store server that speaks PyTorch's c10d `TCPStore` protocol.

use std::io::{self, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::request::{read_query, Query};
use super::{
    put_bytes, query, read_u32, read_u8, send, CHECK_NOT_READY, CHECK_READY, STOP_WAITING,
    VALIDATION_MAGIC, WAIT_CANCELED,
};
use crate::deadline::Deadline;
use crate::kv::{Kv, WaitOutcome};
use crate::{CompareSet, StoreError};

/// How often blocked threads look at the stop flag and waiting clients at their socket.
const TICK: Duration = Duration::from_millis(50);
/// Time allowed for the rest of a request once its first byte arrived.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Most connections served at once.
const MAX_CONNECTIONS: usize = 1024;

/// The key space and state of a c10d server (also kept by a [`crate::TcpStoreServer`] that
/// answers PyTorch's clients on its port).
#[derive(Debug, Default)]
pub(crate) struct Shared {
    kv: Kv,
    stop: AtomicBool,
    connections: AtomicUsize,
}

/// A key-value store server speaking PyTorch's c10d `TCPStore` protocol (see the [module
/// documentation](crate::c10d)), so that PyTorch's `TCPStore` clients and
/// [`C10dStore`](crate::C10dStore) can share it, as torchrun's agent store is shared. Thread per
/// connection; stops on [`C10dStoreServer::shutdown`] or drop.
#[derive(Debug)]
pub struct C10dStoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl C10dStoreServer {
    /// Binds `addr` (port 0 picks a free port) and starts serving.
    pub fn bind(addr: impl ToSocketAddrs + std::fmt::Debug) -> Result<C10dStoreServer, StoreError> {
        let shown = format!("{addr:?}");
        let bind_err = |source| StoreError::Bind {
            addr: shown.clone(),
            source,
        };
        let listener = TcpListener::bind(&addr).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("kolo-c10d-store".into())
            .spawn(move || accept_loop(&listener, &s))
            .map_err(|e| StoreError::io("starting the c10d store server thread", e))?;
        Ok(C10dStoreServer {
            addr: local,
            shared,
            accept: Mutex::new(Some(accept)),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, ends every connection and wakes every waiting client (they see the
    /// connection close).
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.kv.close();
        let handle = self
            .accept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for C10dStoreServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Shared {
    /// Stops serving: waiting clients wake and every connection ends at its next request.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.kv.close();
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                if shared.connections.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                    continue; // dropped: the client sees the connection close
                }
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let s = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("kolo-c10d-conn".into())
                    .spawn(move || {
                        let _ = serve(&s, stream);
                        s.connections.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    shared.connections.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(TICK / 5),
            Err(_) => std::thread::sleep(TICK),
        }
    }
}

fn invalid(reason: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason.into())
}

/// Waits for the first byte of the next request, looking at the stop flag every tick; `None`
/// when the client closed the connection or the server stops.
fn next_query(shared: &Shared, conn: &mut BufReader<TcpStream>) -> io::Result<Option<u8>> {
    conn.get_ref().set_read_timeout(Some(TICK))?;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(None);
        }
        match read_u8(conn) {
            Ok(b) => {
                conn.get_ref().set_read_timeout(Some(REQUEST_TIMEOUT))?;
                return Ok(Some(b));
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Serves one c10d client until it leaves or the server stops.
pub(crate) fn serve(shared: &Shared, stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut out = stream.try_clone()?;
    let mut conn = BufReader::new(stream);
    // The first request must be VALIDATE with the magic number.
    match next_query(shared, &mut conn)? {
        Some(query::VALIDATE) if read_u32(&mut conn)? == VALIDATION_MAGIC => {}
        _ => return Err(invalid("the client did not validate")),
    }
    let kv = &shared.kv;
    while let Some(kind) = next_query(shared, &mut conn)? {
        let mut reply = Vec::new();
        match read_query(kind, &mut conn)? {
            Query::Validate(magic) if magic == VALIDATION_MAGIC => {}
            Query::Validate(_) => return Err(invalid("bad validation number")),
            Query::Set { key, value } => kv.set(&key, &value),
            Query::CompareSet {
                key,
                expected,
                desired,
            } => {
                let exp = (!expected.is_empty()).then_some(expected.as_slice());
                let now = match kv.compare_set(&key, exp, &desired) {
                    CompareSet::Swapped => desired,
                    CompareSet::Mismatch { current: Some(v) } => v,
                    CompareSet::Mismatch { current: None } => expected,
                };
                put_bytes(&mut reply, &now);
            }
            Query::Get { key } => put_bytes(&mut reply, &kv.try_get(&key).unwrap_or_default()),
            Query::Add { key, delta } => {
                // As PyTorch's server, a non-counter value ends the connection.
                let new = kv.add(&key, delta).map_err(|e| invalid(e.to_string()))?;
                reply.extend_from_slice(&new.to_le_bytes());
            }
            Query::Check { keys } => {
                let ready = keys.iter().all(|k| kv.try_get(k).is_some());
                reply.push(if ready { CHECK_READY } else { CHECK_NOT_READY });
            }
            Query::Wait { keys } => match wait(shared, &mut conn, &keys)? {
                Some(b) => reply.push(b),
                None => return Ok(()),
            },
            Query::GetNumKeys => reply.extend_from_slice(&(kv.num_keys() as i64).to_le_bytes()),
            Query::DeleteKey { key } => {
                reply.extend_from_slice(&i64::from(kv.delete(&key)).to_le_bytes());
            }
            Query::Append { key, value } => kv.append(&key, &value),
            Query::MultiGet { keys } => {
                for key in keys {
                    put_bytes(&mut reply, &kv.try_get(&key).unwrap_or_default());
                }
            }
            Query::MultiSet { pairs } => {
                for (key, value) in pairs {
                    kv.set(&key, &value);
                }
            }
            // A cancel that crossed a finished wait.
            Query::CancelWait => reply.push(WAIT_CANCELED),
            Query::Ping(nonce) => reply.extend_from_slice(&nonce.to_le_bytes()),
        }
        if !reply.is_empty() {
            send(&mut out, &reply)?;
        }
    }
    Ok(())
}

/// Serves a `WAIT`: the reply byte once every key exists or the client cancels; `None` when
/// the server stops or the client goes away.
fn wait(
    shared: &Shared,
    conn: &mut BufReader<TcpStream>,
    keys: &[String],
) -> io::Result<Option<u8>> {
    loop {
        match shared.kv.wait(keys, &Deadline::after(TICK)) {
            WaitOutcome::Ready(()) => return Ok(Some(STOP_WAITING)),
            WaitOutcome::Closed => return Ok(None),
            WaitOutcome::TimedOut(_) => {}
        }
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(None);
        }
        // Has the client sent anything (a cancel) meanwhile?
        if !conn.buffer().is_empty() || peek_ready(conn.get_ref())? {
            return match read_u8(conn) {
                Ok(query::CANCEL_WAIT) => Ok(Some(WAIT_CANCELED)),
                Ok(other) => Err(invalid(format!("query {other} during a wait"))),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
                Err(e) => Err(e),
            };
        }
    }
}

/// Whether a byte (or the end of the stream) can be read without blocking.
fn peek_ready(stream: &TcpStream) -> io::Result<bool> {
    stream.set_nonblocking(true)?;
    let mut b = [0u8; 1];
    let r = stream.peek(&mut b);
    stream.set_nonblocking(false)?;
    match r {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e),
    }
}
