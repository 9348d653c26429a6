//! Connection set-up: listening, connecting to lower ranks, accepting higher ones, the job-secret
//! exchange and the hello (see the module documentation of [`super`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::io_err;
use kolo_core::Error;
use kolo_store::auth::AuthError;
use kolo_store::{JobSecret, Store};

use super::frame::{Hello, HELLO_LEN};
use super::SETUP_OP;

/// How long a connecting peer gets to finish the secret exchange and its hello.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The accepting side's checks on one connection: the job secret, then the hello. Runs on a thread of
/// its own, so a connection that stalls cannot hold up the others.
pub(super) fn greet(mut s: TcpStream, secret: &JobSecret) -> Result<(Hello, TcpStream), String> {
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    kolo_store::auth::server(&mut s, secret).map_err(|e| match e {
        AuthError::Io(e) => format!("did not complete the job-secret exchange ({e})"),
        other => other.to_string(),
    })?;
    let mut b = [0u8; HELLO_LEN];
    s.read_exact(&mut b).map_err(|e| e.to_string())?;
    let hello = Hello::decode(&b).map_err(str::to_string)?;
    Ok((hello, s))
}

pub(super) fn accept_higher(
    listener: TcpListener,
    rank: usize,
    size: usize,
    world: u64,
    expect: usize,
    deadline: Instant,
    secret: JobSecret,
) -> Result<Vec<(usize, TcpStream)>, Error> {
    let mut got: Vec<(usize, TcpStream)> = Vec::with_capacity(expect);
    listener
        .set_nonblocking(true)
        .map_err(io_err(format!("rank {rank}: listener")))?;
    let secret = Arc::new(secret);
    let (tx, rx) = std::sync::mpsc::channel();
    while got.len() < expect {
        let mut idle = true;
        match listener.accept() {
            Ok((s, from)) => {
                idle = false;
                let (tx, secret) = (tx.clone(), secret.clone());
                let spawned = thread::Builder::new()
                    .name(format!("kolo-greet-{rank}"))
                    .spawn(move || {
                        let _ = tx.send((from, greet(s, &secret)));
                    });
                if let Err(e) = spawned {
                    eprintln!("kolo: rank {rank}: refused connection from {from}: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(io_err(format!("rank {rank}: accept"))(e)),
        }
        while let Ok((from, greeted)) = rx.try_recv() {
            idle = false;
            let verdict = match greeted {
                Err(e) => Err(e),
                Ok((h, _)) if h.world != world || h.size as usize != size => {
                    Err("belongs to another job or world".to_string())
                }
                Ok((h, _)) if (h.rank as usize) <= rank || h.rank as usize >= size => {
                    Err(format!("claims rank {}, not a higher rank", h.rank))
                }
                Ok((h, _)) if got.iter().any(|(p, _)| *p == h.rank as usize) => {
                    Err(format!("duplicate connection from rank {}", h.rank))
                }
                Ok((h, s)) => Ok((h.rank as usize, s)),
            };
            match verdict {
                Ok((peer, mut s)) => {
                    s.write_all(&[1u8])
                        .map_err(io_err(format!("rank {rank}: handshake with rank {peer}")))?;
                    let _ = s.set_read_timeout(None);
                    let _ = s.set_write_timeout(None);
                    got.push((peer, s));
                }
                Err(why) => {
                    eprintln!("kolo: rank {rank}: refused connection from {from}: {why}");
                }
            }
        }
        if idle {
            if Instant::now() >= deadline {
                let missing: Vec<usize> = (rank + 1..size)
                    .filter(|p| !got.iter().any(|(g, _)| g == p))
                    .collect();
                return Err(Error::Timeout {
                    op: SETUP_OP,
                    rank,
                    peer: missing.first().copied().unwrap_or(rank),
                    waited: Duration::ZERO.max(deadline.elapsed()),
                });
            }
            thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(got)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn connect_lower(
    store: &dyn Store,
    prefix: &str,
    rank: usize,
    size: usize,
    world: u64,
    peer: usize,
    deadline: Instant,
    secret: &JobSecret,
) -> Result<TcpStream, Error> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    let raw = store.get(&format!("{prefix}/tcp/{peer}"), remaining)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let addr: SocketAddr = text.parse().map_err(|_| Error::Config {
        var: format!("{prefix}/tcp/{peer}"),
        value: text.clone(),
        reason: "not a socket address".into(),
    })?;
    let mut backoff = Duration::from_millis(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(10)))
            .map_err(AuthError::Io)
            .and_then(|mut s| {
                s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
                kolo_store::auth::client(&mut s, secret)?;
                s.write_all(
                    &Hello {
                        rank: rank as u32,
                        size: size as u32,
                        world,
                    }
                    .encode(),
                )?;
                let mut ack = [0u8; 1];
                s.read_exact(&mut ack)?;
                s.set_read_timeout(None)?;
                Ok(s)
            });
        match attempt {
            Ok(s) => return Ok(s),
            Err(e @ (AuthError::Unproven | AuthError::Rejected)) => {
                return Err(Error::PeerLost {
                    op: SETUP_OP,
                    rank,
                    peer,
                    reason: format!("connecting to {addr}: {e}"),
                })
            }
            Err(AuthError::Io(_)) if Instant::now() + backoff < deadline => {
                thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(Error::PeerLost {
                    op: SETUP_OP,
                    rank,
                    peer,
                    reason: format!("could not connect to {addr}: {e}"),
                })
            }
        }
    }
}
