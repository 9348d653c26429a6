//! Shared-memory transport: the ranks are processes (or threads) of one host that map one segment.
//!
//! # Segment layout
//!
//! ```text
//! header    magic, world size, ring and buffer sizes, attach count           (128 B)
//! control   per rank: doorbell + sleepers, mapping address | state, pid, abort reason | step + 2 slots (fingerprint, inline data)
//! rings     per ordered pair (src → dst, src ≠ dst): tail | head, copied, readable | `ring_bytes` of data
//! buffers   per rank: two arena buffers of `buffer_bytes` (see `kolo_core::Arena`)
//! ```
//!
//! # Point-to-point
//!
//! Each ordered pair has a single-producer single-consumer byte ring. A message is a 41-byte prefix
//! (payload length, [`Header`]) and the payload, starting on a 64-byte line of the stream; a
//! payload longer than the ring streams through it in pieces, so large messages are pipelined. A receiver drains every incoming ring into its [`Mailbox`]
//! (which matches by source and tag); a sender whose ring is full drains its own incoming rings while
//! it waits, so two ranks sending large messages to each other cannot deadlock — `send` stays
//! buffered, as the [`Transport`] contract requires.
//!
//! A send in place ([`Transport::send_in_place`], kolo.MPI's sends from 16 MiB) puts only the
//! payload's address into the ring; the receiver copies the payload straight out of the sender's
//! memory (see `single_copy`).
//!
//! # Waiting
//!
//! A waiting thread spins for a few hundred polls, then polls while yielding its core until `spin`
//! (1 ms at first, growing while sleeps turn out short: see `wait`) has passed, then sleeps on its
//! rank's futex doorbell, which peers ring after publishing (see [`sync`]). While asleep it wakes every `poll` (20 ms) to check
//! that its peers' processes are alive (a `pidfd` each), so a peer killed with `kill -9` is noticed
//! within that time; a peer that aborts sets its state and rings every doorbell.
//!
//! # Clean-up
//!
//! The segment's name is removed as soon as every rank has mapped it, so from then on a crash of any
//! kind leaves nothing in `/dev/shm`. A crash during those first milliseconds can leave the name; the
//! launcher (`kolo run`) removes every `/dev/shm/kolo-<job id>-*` when the job ends.

mod arena;
mod atomics;
#[cfg(test)]
mod connect_tests;
mod doorbell;
mod health;
mod layout;
mod options;
mod posted;
mod postings;
#[cfg(test)]
mod postings_tests;
pub(crate) mod prefix;
#[cfg(test)]
mod rewind_tests;
mod ring;
pub mod segment;
mod single_copy;
#[cfg(test)]
mod single_copy_tests;
mod spsc;
mod steps;
pub mod sync;
#[cfg(test)]
mod tests;
mod wait;
mod word_hash;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::pool::Pool;
use crate::{check_rank, io_err};
use kolo_core::{
    recv_each, Arena, Error, Header, LinkFailure, Mailbox, Message, Received, RecvError, Reducer,
    Tag, Transport,
};
use kolo_store::Store;

use health::{STATE_ABORTED, STATE_CLOSED, STATE_LOST};
use layout::{Layout, LINE, MAGIC};
pub use options::{ShmOptions, SINGLE_COPY_BYTES};
use postings::Postings;
use ring::{Consumer, Producer};
pub use segment::Segment;
use sync::{Doorbell, ProcessWatch};

const SETUP_OP: &str = "shm connect";

/// Start of the names of a job's segments: `kolo-<job id>-`, the job id (up to its first `/`) reduced
/// to characters safe in a file name. The launcher removes leftovers by this prefix.
pub fn name_prefix(job_id: &str) -> String {
    let job = job_id.split('/').next().unwrap_or("kolo");
    let safe = kolo_core::settings::file_name_safe(job);
    format!("kolo-{safe}-")
}

/// One rank's endpoint of a shared-memory world.
#[derive(Debug)]
pub struct ShmTransport {
    seg: Arc<Segment>,
    layout: Layout,
    rank: usize,
    opts: ShmOptions,
    mailbox: Mailbox,
    /// Payload buffers of messages drained into the mailbox, given back by `recycle`.
    pool: Pool,
    /// Receives posted ahead of their messages (see `postings`).
    postings: Postings,
    /// Per peer: the outgoing ring's producer side, under its lock.
    producers: Vec<Mutex<Producer>>,
    consumers: Vec<Mutex<Consumer>>,
    watches: Vec<Option<ProcessWatch>>,
    next_step: AtomicU64,
    next_round: AtomicU64,
    /// Each peer's last heartbeat value and when it was first seen.
    beats: Mutex<Vec<(u32, Instant)>>,
    beat_stop: Arc<AtomicBool>,
    /// How long a waiting thread spins before it sleeps, now (see `wait`).
    spin: wait::Spin,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Creates the endpoints of a world of `size` ranks that are threads of this process, over one
/// shared-memory segment (used by tests; processes use [`ShmTransport::connect`]).
pub fn shm_world(size: usize, opts: &ShmOptions) -> Result<Vec<ShmTransport>, Error> {
    let layout = Layout::new(size.max(1), opts);
    let name = format!(
        "kolo-local-{}-{:x}",
        std::process::id(),
        nonce() & 0xffff_ffff
    );
    let seg = Segment::create(&name, layout.total())
        .map_err(io_err(format!("create shared memory /dev/shm/{name}")))?;
    let _ = seg.unlink();
    let seg = Arc::new(seg);
    init_header(&seg, &layout);
    let pid = std::process::id();
    let world: Vec<ShmTransport> = (0..size)
        .map(|rank| {
            let t = ShmTransport::new(seg.clone(), layout, rank, opts.clone());
            t.state_word(rank, 1).store(pid, Ordering::Release);
            t.publish_base();
            t
        })
        .collect();
    for t in &world {
        t.try_reading_peers();
    }
    Ok(world)
}

fn nonce() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    kolo_core::call::fnv1a(&[&t.to_le_bytes(), &std::process::id().to_le_bytes()])
}

/// Word `i` of the segment's header: 0 magic, 1 ranks, 2 ring bytes, 3 buffer bytes.
fn header_word(seg: &Segment, i: usize) -> &AtomicU64 {
    debug_assert!(i < 4);
    // SAFETY: the header's first 32 bytes are four aligned u64 words of the mapping, which lives as
    // long as `seg`; they are only accessed atomically.
    unsafe { &*(seg.ptr().add(8 * i) as *const AtomicU64) }
}

fn init_header(seg: &Segment, layout: &Layout) {
    let w = |i: usize, v: u64| header_word(seg, i).store(v, Ordering::Release);
    w(1, layout.n as u64);
    w(2, layout.ring as u64);
    w(3, layout.buffer as u64);
    w(0, MAGIC);
}

/// Checks that the segment's creator laid it out as this rank's settings do (`KOLO_SHM_RING_BYTES`
/// and `KOLO_SHM_BUFFER_BYTES` set alike on every rank): a rank that disagreed would read and
/// write other ranks' rings and buffers.
fn check_layout(seg: &Segment, layout: &Layout, rank: usize, name: &str) -> Result<(), Error> {
    let word = |i: usize| header_word(seg, i).load(Ordering::Acquire);
    let (n, ring, buffer) = (word(1), word(2), word(3));
    let (var, theirs, mine) = if ring != layout.ring as u64 {
        ("KOLO_SHM_RING_BYTES", ring, layout.ring)
    } else if buffer != layout.buffer as u64 {
        ("KOLO_SHM_BUFFER_BYTES", buffer, layout.buffer)
    } else if n != layout.n as u64 {
        ("WORLD_SIZE", n, layout.n)
    } else {
        return Ok(());
    };
    Err(Error::Config {
        var: var.to_string(),
        value: mine.to_string(),
        reason: format!(
            "rank {rank}: rank 0 made the shared-memory segment /dev/shm/{name} with {theirs} \
             where this rank's settings give {mine}; set it alike on every rank"
        ),
    })
}

impl ShmTransport {
    fn new(seg: Arc<Segment>, layout: Layout, rank: usize, opts: ShmOptions) -> ShmTransport {
        let n = layout.n;
        ShmTransport {
            spin: wait::Spin::new(opts.spin),
            seg,
            layout,
            rank,
            opts,
            mailbox: Mailbox::new(n),
            pool: Pool::default(),
            postings: Postings::default(),
            producers: (0..n).map(|_| Mutex::default()).collect(),
            consumers: (0..n).map(|_| Mutex::new(Consumer::default())).collect(),
            watches: (0..n).map(|_| None).collect(),
            next_step: AtomicU64::new(1),
            next_round: AtomicU64::new(0),
            beats: Mutex::new(vec![(u32::MAX, Instant::now()); n]),
            beat_stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Connects rank `rank` of `size` (all on this host) through `store` under `prefix`; rank 0
    /// creates the segment, named `{name_prefix}{nonce}` in `/dev/shm`.
    pub fn connect(
        store: &dyn Store,
        prefix: &str,
        name_prefix: &str,
        rank: usize,
        size: usize,
        opts: &ShmOptions,
    ) -> Result<ShmTransport, Error> {
        check_rank(SETUP_OP, rank, size)?;
        let deadline = Instant::now() + opts.connect_timeout;
        let layout = Layout::new(size, opts);
        let key = format!("{prefix}/shm/name");
        let seg = if rank == 0 {
            let name = format!("{name_prefix}{:016x}", nonce());
            let seg = Segment::create(&name, layout.total()).map_err(io_err(format!(
                "rank 0: create {} bytes of shared memory at /dev/shm/{name} (a full or small \
                 /dev/shm? KOLO_TRANSPORT=tcp avoids it)",
                layout.total()
            )))?;
            init_header(&seg, &layout);
            store.set(&key, name.as_bytes())?;
            seg
        } else {
            let name = store.get(&key, opts.connect_timeout)?;
            let name = String::from_utf8_lossy(&name).into_owned();
            let seg = Segment::open(&name)
                .map_err(io_err(format!("rank {rank}: open /dev/shm/{name}")))?;
            let magic = header_word(&seg, 0).load(Ordering::Acquire);
            if magic != MAGIC {
                return Err(Error::Io {
                    context: format!("rank {rank}: /dev/shm/{name}"),
                    source: io::Error::new(io::ErrorKind::InvalidData, "not a kolo segment").into(),
                });
            }
            check_layout(&seg, &layout, rank, &name)?;
            if seg.len() != layout.total() {
                return Err(Error::Io {
                    context: format!("rank {rank}: /dev/shm/{name}"),
                    source: io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{} bytes where its layout needs {} (a different kolo version?)",
                            seg.len(),
                            layout.total()
                        ),
                    )
                    .into(),
                });
            }
            seg
        };
        let mut t = ShmTransport::new(Arc::new(seg), layout, rank, opts.clone());
        t.state_word(rank, 1)
            .store(std::process::id(), Ordering::Release);
        t.publish_base();
        let attached = t.attached().fetch_add(1, Ordering::AcqRel) + 1;
        if attached as usize == size {
            let _ = t.seg.unlink();
        }
        // Wait for everyone to attach (and publish its pid).
        while (t.attached().load(Ordering::Acquire) as usize) < size {
            if Instant::now() >= deadline {
                let _ = t.seg.unlink();
                let missing = (0..size)
                    .find(|&r| t.state_word(r, 1).load(Ordering::Acquire) == 0)
                    .unwrap_or(0);
                return Err(Error::Timeout {
                    op: SETUP_OP,
                    rank,
                    peer: missing,
                    waited: opts.connect_timeout,
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let me = std::process::id();
        for peer in 0..size {
            let pid = t.state_word(peer, 1).load(Ordering::Acquire);
            if peer != rank && pid != me {
                t.watches[peer] = Some(ProcessWatch::new(pid as i32));
            }
        }
        t.try_reading_peers();
        if opts.heartbeat_timeout.is_some() {
            t.start_heartbeat()?;
        }
        Ok(t)
    }

    /// Path of the segment (its name is removed once every rank has mapped it).
    pub fn segment_path(&self) -> &std::path::Path {
        self.seg.path()
    }

    fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off < self.seg.len());
        // SAFETY: every offset the layout produces lies inside the mapping.
        unsafe { self.seg.ptr().add(off) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: 4-aligned offset inside the mapping; the memory is only accessed atomically.
        unsafe { &*(self.at(off) as *const AtomicU32) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: 8-aligned offset inside the mapping; the memory is only accessed atomically.
        unsafe { &*(self.at(off) as *const AtomicU64) }
    }

    fn attached(&self) -> &AtomicU32 {
        self.u32_at(32)
    }

    fn bell(&self, r: usize) -> Doorbell<'_> {
        let c = self.layout.ctrl(r);
        Doorbell {
            word: self.u32_at(c),
            sleepers: self.u32_at(c + 4),
        }
    }

    /// Word `i` of rank `r`'s state line: 0 state, 1 pid, 2 reason length, 3 heartbeat.
    fn state_word(&self, r: usize, i: usize) -> &AtomicU32 {
        self.u32_at(self.layout.ctrl(r) + LINE + 4 * i)
    }
}

impl Transport for ShmTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.layout.n
    }

    fn kind(&self) -> &'static str {
        "shm"
    }

    fn send(&self, peer: usize, header: &Header, payload: &[u8]) -> Result<(), LinkFailure> {
        if let Some(f) = self.mailbox.failure() {
            return Err(f);
        }
        if peer >= self.layout.n {
            return Err(LinkFailure::PeerLost {
                peer,
                reason: format!("no rank {peer} in a world of {}", self.layout.n),
            });
        }
        if peer == self.rank {
            self.mailbox.deliver(
                peer,
                Message {
                    header: *header,
                    payload: payload.to_vec(),
                },
            );
            self.bell(self.rank).ring();
            return Ok(());
        }
        self.send_to_peer(peer, header, payload)
    }

    unsafe fn send_in_place(
        &self,
        peer: usize,
        header: &Header,
        payload: &[u8],
    ) -> Result<Option<u64>, LinkFailure> {
        if peer == self.rank || peer >= self.layout.n || !self.goes_in_place(peer, payload.len()) {
            return self.send(peer, header, payload).map(|()| None);
        }
        if let Some(f) = self.mailbox.failure() {
            return Err(f);
        }
        // SAFETY: the caller keeps `payload` as it is until the ticket is done (the contract).
        unsafe { self.push_in_place(peer, header, payload) }.map(Some)
    }

    fn in_place_min(&self) -> Option<usize> {
        (self.opts.single_copy_bytes > 0).then_some(self.opts.single_copy_bytes)
    }

    fn in_place_done(&self, peer: usize, ticket: u64) -> Result<bool, LinkFailure> {
        self.in_place_copied(peer, ticket)
    }

    fn wait_in_place(
        &self,
        peer: usize,
        ticket: u64,
        deadline: Option<Instant>,
    ) -> Result<(), RecvError> {
        self.wait_copied(peer, ticket, deadline)
    }

    fn recv(
        &self,
        peer: usize,
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<Message, RecvError> {
        if let Some(m) = self.mailbox.try_recv(peer, tag).map_err(RecvError::Link)? {
            return Ok(m);
        }
        self.wait_for(deadline, || {
            if peer != self.rank && peer < self.layout.n {
                // The line of the peer's next message, asked for while the ring is polled (see
                // `Spsc::prefetch`).
                let ring = self.ring(peer, self.rank);
                ring.prefetch(ring.consumer_position());
            }
            self.progress();
            match self.mailbox.try_recv(peer, tag) {
                Ok(Some(m)) => Some(Ok(m)),
                Ok(None) => None,
                Err(f) => Some(Err(f)),
            }
        })?
        .map_err(RecvError::Link)
    }

    #[allow(clippy::too_many_arguments)]
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
        meanwhile()?;
        if reduce.is_some() || peer == self.rank || peer >= self.layout.n {
            return recv_each(
                self,
                peer,
                tag,
                buf.len(),
                segment,
                deadline,
                &mut |r, m| each(&mut buf[r], Received::Message(m)),
            )
            .map_err(recv_error)?;
        }
        self.recv_posted_direct(peer, tag, buf, segment, deadline, each, recv_error)
    }

    fn try_recv(&self, peer: usize, tag: &Tag) -> Result<Option<Message>, LinkFailure> {
        self.progress();
        if let Some(m) = self.mailbox.try_recv(peer, tag)? {
            return Ok(Some(m));
        }
        match self.health() {
            Some(f) => Err(f),
            None => Ok(None),
        }
    }

    fn recv_any(
        &self,
        peers: &[usize],
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<(usize, Message), RecvError> {
        if let Some(m) = self
            .mailbox
            .try_recv_any(peers, tag)
            .map_err(RecvError::Link)?
        {
            return Ok(m);
        }
        self.wait_for(deadline, || {
            self.progress();
            self.mailbox.try_recv_any(peers, tag).transpose()
        })?
        .map_err(RecvError::Link)
    }

    fn try_recv_any(
        &self,
        peers: &[usize],
        tag: &Tag,
    ) -> Result<Option<(usize, Message)>, LinkFailure> {
        self.progress();
        if let Some(m) = self.mailbox.try_recv_any(peers, tag)? {
            return Ok(Some(m));
        }
        match self.health() {
            Some(f) => Err(f),
            None => Ok(None),
        }
    }

    fn abort(&self, reason: &str) {
        self.mailbox.fail(LinkFailure::LocalClosed {
            reason: reason.to_string(),
        });
        self.set_state(STATE_ABORTED, reason);
    }

    fn expect(&self, header: &Header) {
        self.mailbox.expect(header);
    }

    fn failure(&self) -> Option<LinkFailure> {
        // A peer that died is seen here, not only by the next wait's health check.
        self.health()
    }

    unsafe fn post_recv(
        &self,
        peer: usize,
        tag: &Tag,
        buf: *mut u8,
        len: usize,
    ) -> Result<Option<u64>, LinkFailure> {
        self.add_posting(peer, tag, buf as usize, len)
    }

    fn posted_recv(
        &self,
        posting: u64,
        block: bool,
        deadline: Option<Instant>,
    ) -> Result<Option<(Header, usize)>, RecvError> {
        self.wait_posting(posting, block, deadline)
    }

    fn unpost_recv(&self, posting: u64) {
        self.remove_posting(posting)
    }

    fn recycle(&self, payload: Vec<u8>) {
        self.pool.put(payload);
    }

    fn arena(&self) -> Option<&dyn Arena> {
        Some(self)
    }
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        self.beat_stop.store(true, Ordering::SeqCst);
        // Pass a failure on (as the TCP transport does with its abort frame); otherwise close cleanly.
        match self.mailbox.failure() {
            Some(LinkFailure::LocalClosed { reason }) => self.set_state(STATE_ABORTED, &reason),
            Some(f) => {
                let reason = f.forwarded("shutdown", self.rank);
                self.set_state(STATE_ABORTED, &reason)
            }
            None if std::thread::panicking() => self.set_state(STATE_LOST, "its thread panicked"),
            None => match self.finish_in_place() {
                Some(reason) => self.set_state(STATE_ABORTED, &reason),
                None => self.set_state(STATE_CLOSED, ""),
            },
        }
    }
}
