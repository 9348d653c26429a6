//! TCP transport: one connection per pair of ranks, usable across hosts.
//!
//! Set-up (gloo's full mesh): every rank listens on an ephemeral port and publishes `ip:port` in the
//! store under `{prefix}/tcp/{rank}`; each rank connects to every lower rank and accepts a connection from
//! every higher one. Both sides first prove they know the job secret ([`kolo_store::auth`], on a thread
//! per incoming connection, so a stalled one holds nothing up); then the connecting side introduces
//! itself with a [`frame::Hello`] naming its rank, the world size and the world id (a hash of the
//! prefix); the acceptor refuses anything else, logs it and keeps waiting, so a stray, stale or
//! hostile connection cannot take a rank's place.
//!
//! Data path: `send` writes a frame on the peer's connection under a per-connection lock; a reader
//! thread per connection drains incoming frames into the rank's [`Mailbox`]. Because readers always
//! drain, sends never wait for the peer to post a receive. An unexpected end of stream (the peer died)
//! fails the mailbox, so every pending and later receive reports the lost rank at once; a `GOODBYE` frame
//! marks a clean close; an `ABORT` frame carries another rank's error.

pub mod frame;

use std::io::{BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::{check_rank, io_err};
use kolo_core::{
    call::fnv1a, Algorithm, Call, Error, Header, LinkFailure, Mailbox, Message, OpKind, RecvError,
    Tag, TagSpace, Transport,
};
use kolo_store::auth::AuthError;
use kolo_store::{JobSecret, Store};

use frame::{Frame, Hello, Kind, ReadError, HELLO_LEN};

/// Options of the TCP transport.
#[derive(Clone, Debug)]
pub struct TcpOptions {
    /// Address to listen on (`127.0.0.1` for single-host jobs, `0.0.0.0` or an interface's address
    /// otherwise).
    pub listen: IpAddr,
    /// Address peers should connect to.
    pub advertise: IpAddr,
    /// How long set-up may take (waiting for peers to publish and connect).
    pub connect_timeout: Duration,
    /// Largest payload accepted from a peer, in bytes.
    pub max_message: u64,
    /// The job secret every connection must prove (see `kolo_store::auth`).
    pub secret: JobSecret,
    /// A peer from which nothing (data or heartbeat, sent every second) arrives for this long is
    /// lost: its process is stopped or hung, or its host unreachable. `None` turns heartbeats off.
    pub heartbeat_timeout: Option<Duration>,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            listen: IpAddr::V4(Ipv4Addr::LOCALHOST),
            advertise: IpAddr::V4(Ipv4Addr::LOCALHOST),
            connect_timeout: Duration::from_secs(300),
            max_message: 1 << 40,
            secret: JobSecret::default(),
            heartbeat_timeout: Some(Duration::from_secs(6)),
        }
    }
}

#[derive(Debug)]
struct Link {
    writer: Mutex<TcpStream>,
    /// A handle to shut the connection down without the writer's lock.
    ctl: TcpStream,
}

/// When each peer was last heard from, shared by the reader threads and the heartbeat threads.
#[derive(Debug)]
struct Liveness {
    epoch: Instant,
    /// Milliseconds since `epoch` when bytes last came from each peer.
    last_seen: Vec<AtomicU64>,
    /// Peers that closed cleanly (or were declared lost): no heartbeat expected.
    quiet: Vec<AtomicBool>,
    stop: AtomicBool,
}

impl Liveness {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
    fn touch(&self, peer: usize) {
        self.last_seen[peer].store(self.now_ms(), Ordering::Relaxed);
    }
}

/// A reader that notes every arrival of bytes (so a long frame keeps its sender alive, too).
struct Touch {
    inner: TcpStream,
    live: Arc<Liveness>,
    peer: usize,
}

impl Read for Touch {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 {
            self.live.touch(self.peer);
        }
        Ok(n)
    }
}

/// How often an idle link carries a heartbeat frame.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// One rank's endpoint of a TCP world. Build it with [`TcpTransport::connect`].
#[derive(Debug)]
pub struct TcpTransport {
    rank: usize,
    size: usize,
    mailbox: Arc<Mailbox>,
    links: Arc<Vec<Option<Link>>>,
    aborted: AtomicBool,
    live: Arc<Liveness>,
}

const SETUP_OP: &str = "tcp connect";

impl TcpTransport {
    /// Connects rank `rank` of `size` to all others, meeting them through `store` under `prefix`.
    pub fn connect(
        store: &dyn Store,
        prefix: &str,
        rank: usize,
        size: usize,
        opts: &TcpOptions,
    ) -> Result<TcpTransport, Error> {
        check_rank(SETUP_OP, rank, size)?;
        let deadline = Instant::now() + opts.connect_timeout;
        let world = fnv1a(&[prefix.as_bytes(), &(size as u64).to_le_bytes()]);
        let listener = TcpListener::bind((opts.listen, 0))
            .map_err(io_err(format!("rank {rank}: listen on {}", opts.listen)))?;
        let port = listener
            .local_addr()
            .map_err(io_err(format!("rank {rank}: local address")))?
            .port();
        let me = SocketAddr::new(opts.advertise, port);
        store.set(&format!("{prefix}/tcp/{rank}"), me.to_string().as_bytes())?;

        // Accept from higher ranks on a helper thread while connecting to lower ranks here.
        let expect_higher = size - rank - 1;
        let acceptor = thread::Builder::new()
            .name(format!("kolo-accept-{rank}"))
            .spawn({
                let secret = opts.secret.clone();
                move || accept_higher(listener, rank, size, world, expect_higher, deadline, secret)
            })
            .map_err(io_err(format!("rank {rank}: spawn accept thread")))?;

        let mut streams: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
        let mut first_err = None;
        for (peer, slot) in streams.iter_mut().enumerate().take(rank) {
            match connect_lower(
                store,
                prefix,
                rank,
                size,
                world,
                peer,
                deadline,
                &opts.secret,
            ) {
                Ok(s) => *slot = Some(s),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        let accepted = acceptor.join().unwrap_or_else(|_| {
            Err(Error::Io {
                context: format!("rank {rank}: accept thread panicked"),
                source: std::io::Error::other("panic"),
            })
        });
        if let Some(e) = first_err {
            return Err(e);
        }
        for (peer, s) in accepted? {
            streams[peer] = Some(s);
        }

        let mailbox = Arc::new(Mailbox::new(size));
        let live = Arc::new(Liveness {
            epoch: Instant::now(),
            last_seen: (0..size).map(|_| AtomicU64::new(0)).collect(),
            quiet: (0..size).map(|p| AtomicBool::new(p == rank)).collect(),
            stop: AtomicBool::new(false),
        });
        let mut links = Vec::with_capacity(size);
        for (peer, s) in streams.into_iter().enumerate() {
            let Some(s) = s else {
                links.push(None);
                continue;
            };
            s.set_nodelay(true)
                .map_err(io_err(format!("rank {rank}: TCP_NODELAY to rank {peer}")))?;
            let reader = s
                .try_clone()
                .map_err(io_err(format!("rank {rank}: clone socket to rank {peer}")))?;
            let ctl = s
                .try_clone()
                .map_err(io_err(format!("rank {rank}: clone socket to rank {peer}")))?;
            let mb = mailbox.clone();
            let max = opts.max_message;
            let reader = Touch {
                inner: reader,
                live: live.clone(),
                peer,
            };
            let lv = live.clone();
            thread::Builder::new()
                .name(format!("kolo-recv-{rank}-{peer}"))
                .spawn(move || read_loop(reader, peer, mb, max, lv))
                .map_err(io_err(format!("rank {rank}: spawn reader thread")))?;
            links.push(Some(Link {
                writer: Mutex::new(s),
                ctl,
            }));
        }
        let links = Arc::new(links);
        if let Some(timeout) = opts.heartbeat_timeout {
            start_heartbeats(rank, &links, &live, &mailbox, timeout)?;
        }
        Ok(TcpTransport {
            rank,
            size,
            mailbox,
            links,
            aborted: AtomicBool::new(false),
            live,
        })
    }

    fn write(
        &self,
        peer: usize,
        kind: Kind,
        header: &Header,
        payload: &[u8],
    ) -> Result<(), LinkFailure> {
        let link = self
            .links
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| LinkFailure::PeerLost {
                peer,
                reason: format!("no connection to rank {peer} in a world of {}", self.size),
            })?;
        let mut w = link.writer.lock().unwrap_or_else(|p| p.into_inner());
        frame::write_frame(&mut *w, kind, header, payload).map_err(|e| LinkFailure::PeerLost {
            peer,
            reason: format!("send failed: {e}"),
        })
    }
}

/// `reason` cut to what a receiver accepts in an abort frame (at a character boundary).
fn clip(reason: &str) -> &[u8] {
    let mut end = reason.len().min(frame::MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason.as_bytes()[..end]
}

fn control_header() -> Header {
    Header {
        ack: false,
        tag: Tag {
            group: 0,
            space: TagSpace::P2p,
            value: 0,
        },
        call: Call::new(OpKind::Send, Algorithm::Direct),
    }
}

/// How long a connecting peer gets to finish the secret exchange and its hello.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The accepting side's checks on one connection: the job secret, then the hello. Runs on a thread of
/// its own, so a connection that stalls cannot hold up the others.
fn greet(mut s: TcpStream, secret: &JobSecret) -> Result<(Hello, TcpStream), String> {
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

fn accept_higher(
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
fn connect_lower(
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

/// Starts the two heartbeat threads of a transport: one sends a heartbeat on every idle link each
/// second, the other fails the mailbox (naming the peer) when a peer has been silent for `timeout`.
/// Two threads, so that a heartbeat stuck behind a full socket cannot stop the check.
fn start_heartbeats(
    rank: usize,
    links: &Arc<Vec<Option<Link>>>,
    live: &Arc<Liveness>,
    mailbox: &Arc<Mailbox>,
    timeout: Duration,
) -> Result<(), Error> {
    let (l, lv) = (links.clone(), live.clone());
    thread::Builder::new()
        .name(format!("kolo-beat-{rank}"))
        .spawn(move || {
            while !lv.stop.load(Ordering::SeqCst) {
                for link in l.iter().flatten() {
                    // A link busy with a send needs no heartbeat.
                    if let Ok(mut w) = link.writer.try_lock() {
                        let _ =
                            frame::write_frame(&mut *w, Kind::Heartbeat, &control_header(), &[]);
                    }
                }
                let mut slept = Duration::ZERO;
                while slept < HEARTBEAT_EVERY && !lv.stop.load(Ordering::SeqCst) {
                    thread::sleep(Duration::from_millis(100));
                    slept += Duration::from_millis(100);
                }
            }
        })
        .map_err(io_err(format!("rank {rank}: spawn heartbeat thread")))?;
    let (l, lv, mb) = (links.clone(), live.clone(), mailbox.clone());
    thread::Builder::new()
        .name(format!("kolo-watch-{rank}"))
        .spawn(move || {
            // Everyone counts as heard from at the start.
            for p in 0..l.len() {
                lv.touch(p);
            }
            let limit = timeout.as_millis() as u64;
            while !lv.stop.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(200));
                let now = lv.now_ms();
                for (peer, link) in l.iter().enumerate() {
                    let Some(link) = link else { continue };
                    if lv.quiet[peer].load(Ordering::SeqCst) {
                        continue;
                    }
                    let seen = lv.last_seen[peer].load(Ordering::Relaxed);
                    if now.saturating_sub(seen) > limit {
                        lv.quiet[peer].store(true, Ordering::SeqCst);
                        mb.fail(LinkFailure::PeerLost {
                            peer,
                            reason: format!(
                                "nothing (not even a heartbeat) from it for {:.0} s: its process \
                                 is stopped or hung, or its host is unreachable",
                                timeout.as_secs_f64()
                            ),
                        });
                        let _ = link.ctl.shutdown(Shutdown::Both);
                    }
                }
            }
        })
        .map_err(io_err(format!("rank {rank}: spawn heartbeat thread")))?;
    Ok(())
}

fn read_loop(
    stream: Touch,
    peer: usize,
    mailbox: Arc<Mailbox>,
    max_message: u64,
    live: Arc<Liveness>,
) {
    let mut r = BufReader::with_capacity(256 * 1024, stream);
    let mut closed_cleanly = false;
    loop {
        match frame::read_frame(&mut r, max_message) {
            Ok(Frame {
                kind: Kind::Data,
                header,
                payload,
            }) => mailbox.deliver(peer, Message { header, payload }),
            Ok(Frame {
                kind: Kind::Heartbeat,
                ..
            }) => {}
            Ok(Frame {
                kind: Kind::Abort,
                payload,
                ..
            }) => mailbox.fail(LinkFailure::Aborted {
                by: peer,
                reason: String::from_utf8_lossy(&payload).into_owned(),
            }),
            Ok(Frame {
                kind: Kind::Goodbye,
                ..
            }) => {
                closed_cleanly = true;
                live.quiet[peer].store(true, Ordering::SeqCst);
                mailbox.close_peer(peer);
            }
            Err(ReadError::Eof) => {
                if !closed_cleanly {
                    mailbox.fail(LinkFailure::PeerLost {
                        peer,
                        reason:
                            "connection closed without goodbye (the process exited or was killed)"
                                .into(),
                    });
                }
                return;
            }
            Err(ReadError::Io(e)) => {
                if !closed_cleanly {
                    mailbox.fail(LinkFailure::PeerLost {
                        peer,
                        reason: e.to_string(),
                    });
                }
                return;
            }
            Err(ReadError::Invalid(reason)) => {
                mailbox.fail(LinkFailure::Protocol { peer, reason });
                let _ = r.get_ref().inner.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn kind(&self) -> &'static str {
        "tcp"
    }

    fn send(&self, peer: usize, header: &Header, payload: &[u8]) -> Result<(), LinkFailure> {
        if let Some(f) = self.mailbox.failure() {
            return Err(f);
        }
        if peer == self.rank {
            self.mailbox.deliver(
                peer,
                Message {
                    header: *header,
                    payload: payload.to_vec(),
                },
            );
            return Ok(());
        }
        self.write(peer, Kind::Data, header, payload).map_err(|f| {
            // The peer is gone; if it said why (an abort frame still being read), report that.
            let f = self
                .mailbox
                .wait_failure(std::time::Duration::from_millis(200))
                .unwrap_or(f);
            self.mailbox.fail(f.clone());
            f
        })
    }

    fn recv(
        &self,
        peer: usize,
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<Message, RecvError> {
        self.mailbox.recv(peer, tag, deadline)
    }

    fn try_recv(&self, peer: usize, tag: &Tag) -> Result<Option<Message>, LinkFailure> {
        self.mailbox.try_recv(peer, tag)
    }

    fn abort(&self, reason: &str) {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        for peer in 0..self.size {
            if peer != self.rank {
                let _ = self.write(peer, Kind::Abort, &control_header(), clip(reason));
            }
        }
        self.mailbox.fail(LinkFailure::LocalClosed {
            reason: reason.to_string(),
        });
    }

    fn expect(&self, header: &Header) {
        self.mailbox.expect(header);
    }

    fn failure(&self) -> Option<LinkFailure> {
        self.mailbox.failure()
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.live.stop.store(true, Ordering::SeqCst);
        let aborted = self.aborted.load(Ordering::SeqCst);
        // A rank that leaves with a failed endpoint passes the failure on, so that a peer still
        // waiting for it learns why rather than only that it left.
        let failed = self
            .mailbox
            .failure()
            .map(|f| f.into_error("shutdown", self.rank).to_string());
        for link in self.links.iter().flatten() {
            let mut w = link.writer.lock().unwrap_or_else(|p| p.into_inner());
            if !aborted {
                let _ = match &failed {
                    Some(reason) => {
                        frame::write_frame(&mut *w, Kind::Abort, &control_header(), clip(reason))
                    }
                    None => frame::write_frame(&mut *w, Kind::Goodbye, &control_header(), &[]),
                };
            }
            // Half-close: our reader keeps draining until the peer closes too, so no unread data
            // turns our close into a reset that could destroy what the peer has not read yet.
            let _ = w.shutdown(Shutdown::Write);
        }
    }
}
