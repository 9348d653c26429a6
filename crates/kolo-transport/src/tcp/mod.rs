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
//! thread per connection drains incoming frames. Because readers always drain, sends never wait for
//! the peer to post a receive. A payload whose receive is already posted
//! ([`Transport::recv_posted`], which the ring all-gather uses) is read from the socket straight into
//! its destination, or, when the receive reduces (the ring reduce-scatter), reduced into it from the
//! reader's socket buffer as it arrives; any other goes into a pooled buffer queued in the rank's [`Mailbox`] (the receiver
//! gives it back with [`Transport::recycle`] once it has copied or reduced it), so steady traffic
//! neither allocates nor copies more than once. An unexpected end of stream (the peer died)
//! fails the mailbox, so every pending and later receive reports the lost rank at once; a `GOODBYE` frame
//! marks a clean close; an `ABORT` frame carries another rank's error.

mod connect;
pub mod frame;
mod live;
mod posted;
mod reader;
#[cfg(test)]
mod tests;

use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::{check_rank, io_err};
use kolo_core::{
    call::fnv1a, segment_ranges, Algorithm, Call, Error, Header, LinkFailure, Mailbox, Message,
    OpKind, Received, RecvError, Reducer, Tag, TagSpace, Transport,
};
use kolo_store::{JobSecret, Store};

use crate::pool::Pool;
use connect::{accept_higher, connect_lower};
use frame::Kind;
use live::{send_control, start_heartbeats, Liveness, Touch};
use posted::Posts;
use reader::Reader;

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

/// This rank's end of the connection to one peer.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) writer: Mutex<TcpStream>,
    /// A handle to shut the connection down without the writer's lock.
    pub(super) ctl: TcpStream,
}

/// One rank's endpoint of a TCP world. Build it with [`TcpTransport::connect`].
#[derive(Debug)]
pub struct TcpTransport {
    rank: usize,
    size: usize,
    mailbox: Arc<Mailbox>,
    links: Arc<Vec<Option<Link>>>,
    aborted: AtomicBool,
    live: Arc<Liveness>,
    posts: Arc<Posts>,
    pool: Arc<Pool>,
}

pub(super) const SETUP_OP: &str = "tcp connect";

/// The longest an abort or a close waits to hand a peer its last frame (see [`send_control`]).
const CONTROL_WAIT: Duration = Duration::from_secs(2);

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
                source: std::io::Error::other("panic").into(),
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
        let posts = Arc::new(Posts::new(size));
        let pool = Arc::new(Pool::default());
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
            let stream = Touch {
                inner: reader,
                live: live.clone(),
                peer,
            };
            let reader = Reader {
                peer,
                mailbox: mailbox.clone(),
                posts: posts.clone(),
                pool: pool.clone(),
                max_message: opts.max_message,
                live: live.clone(),
            };
            thread::Builder::new()
                .name(format!("kolo-recv-{rank}-{peer}"))
                .spawn(move || reader.run(stream))
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
            posts,
            pool,
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

pub(super) fn control_header() -> Header {
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

    fn recv_any(
        &self,
        peers: &[usize],
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<(usize, Message), RecvError> {
        self.mailbox.recv_any(peers, tag, deadline)
    }

    fn try_recv_any(
        &self,
        peers: &[usize],
        tag: &Tag,
    ) -> Result<Option<(usize, Message)>, LinkFailure> {
        self.mailbox.try_recv_any(peers, tag)
    }

    fn abort(&self, reason: &str) {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        for link in self.links.iter().flatten() {
            if !send_control(link, Kind::Abort, clip(reason), CONTROL_WAIT) {
                // A peer that cannot take the frame learns of the abort from the closed link.
                let _ = link.ctl.shutdown(Shutdown::Both);
            }
        }
        self.mailbox.fail(LinkFailure::LocalClosed {
            reason: reason.to_string(),
        });
    }

    fn recv_posted(
        &self,
        peer: usize,
        tag: &Tag,
        buf: &mut [u8],
        segment: usize,
        reduce: Option<Reducer>,
        deadline: Option<Instant>,
        meanwhile: &mut dyn FnMut() -> kolo_core::Result<()>,
        each: &mut dyn FnMut(&mut [u8], Received) -> kolo_core::Result<()>,
        recv_error: &dyn Fn(RecvError) -> Error,
    ) -> kolo_core::Result<()> {
        if peer >= self.size {
            return Err(recv_error(RecvError::Link(LinkFailure::PeerLost {
                peer,
                reason: format!("no rank {peer} in a world of {}", self.size),
            })));
        }
        let ranges: Vec<_> = segment_ranges(buf.len(), segment).collect();
        let recv = |each: &mut dyn FnMut(&mut [u8], Received) -> kolo_core::Result<()>,
                    buf: &mut [u8]| {
            let m = self.mailbox.recv(peer, tag, deadline).map_err(recv_error)?;
            each(buf, Received::Message(m))
        };
        // Messages already here (or being read) take the mailbox; the rest of `buf` is posted. Only
        // a reader thread can fill a posting, so messages to this rank itself take the mailbox.
        let (early, posted) = if peer == self.rank {
            (ranges.len(), false)
        } else {
            let early = self
                .posts
                .post(&self.mailbox, peer, tag, buf, &ranges, segment, reduce);
            (early, early < ranges.len())
        };
        let mut direct = Vec::new();
        if posted {
            // Until `unpost` returns, a reader may write into `buf`: end the posting on every path,
            // unwinding included.
            let guard = Unpost {
                posts: &self.posts,
                mailbox: &self.mailbox,
                peer,
                armed: true,
            };
            let ran = meanwhile();
            let outcome = self
                .posts
                .unpost(&self.mailbox, peer, deadline, ran.is_ok());
            guard.disarm();
            ran?;
            direct = outcome.map_err(recv_error)?.direct;
        } else {
            meanwhile()?;
        }
        // In order: the early messages, the segments written in place, then any that came through
        // the mailbox after the posting closed.
        let mut next = 0;
        for r in &ranges[..early] {
            recv(each, &mut buf[r.clone()])?;
            next += 1;
        }
        for header in direct {
            each(&mut buf[ranges[next].clone()], Received::Direct(header))?;
            next += 1;
        }
        for r in &ranges[next..] {
            recv(each, &mut buf[r.clone()])?;
        }
        Ok(())
    }

    fn recycle(&self, payload: Vec<u8>) {
        self.pool.put(payload);
    }

    fn expect(&self, header: &Header) {
        self.mailbox.expect(header);
    }

    fn failure(&self) -> Option<LinkFailure> {
        self.mailbox.failure()
    }
}

/// Ends a posting when a [`TcpTransport::recv_posted`] is left early (unwinding).
struct Unpost<'a> {
    posts: &'a Posts,
    mailbox: &'a Mailbox,
    peer: usize,
    armed: bool,
}

impl Unpost<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Unpost<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.posts.unpost(self.mailbox, self.peer, None, false);
        }
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
            .map(|f| f.forwarded("shutdown", self.rank));
        for link in self.links.iter().flatten() {
            let said = aborted
                || match &failed {
                    Some(reason) => send_control(link, Kind::Abort, clip(reason), CONTROL_WAIT),
                    None => send_control(link, Kind::Goodbye, &[], CONTROL_WAIT),
                };
            // Half-close: our reader keeps draining until the peer closes too, so no unread data
            // turns our close into a reset that could destroy what the peer has not read yet. A
            // peer that could not take the last frame (it stopped reading) is cut off outright.
            let how = if said {
                Shutdown::Write
            } else {
                Shutdown::Both
            };
            let _ = link.ctl.shutdown(how);
        }
    }
}
