//! Shared-memory transport: the ranks are processes (or threads) of one host that map one segment.
//!
//! # Segment layout
//!
//! ```text
//! header    magic, world size, ring and buffer sizes, attach count           (128 B)
//! control   per rank: doorbell + sleepers | state, pid, abort reason | step + 2 slots (fingerprint, inline data)
//! rings     per ordered pair (src → dst, src ≠ dst): tail | head | `ring_bytes` of data
//! buffers   per rank: two arena buffers of `buffer_bytes` (see `kolo_core::Arena`)
//! ```
//!
//! # Point-to-point
//!
//! Each ordered pair has a single-producer single-consumer byte ring. A message is a 41-byte prefix
//! (payload length, [`Header`]) and the payload; a payload longer than the ring streams through it in
//! pieces, so large messages are pipelined. A receiver drains every incoming ring into its [`Mailbox`]
//! (which matches by source and tag); a sender whose ring is full drains its own incoming rings while
//! it waits, so two ranks sending large messages to each other cannot deadlock — `send` stays
//! buffered, as the [`Transport`] contract requires.
//!
//! # Waiting
//!
//! A waiting thread spins for a few hundred polls, then polls while yielding its core until `spin`
//! (default 1 ms) has passed, then sleeps on its rank's futex doorbell, which
//! peers ring after publishing (see [`sync`]). While asleep it wakes every `poll` (20 ms) to check
//! that its peers' processes are alive (a `pidfd` each), so a peer killed with `kill -9` is noticed
//! within that time; a peer that aborts sets its state and rings every doorbell.
//!
//! # Clean-up
//!
//! The segment's name is removed as soon as every rank has mapped it, so from then on a crash of any
//! kind leaves nothing in `/dev/shm`. A crash during those first milliseconds can leave the name; the
//! launcher (`kolo run`) removes every `/dev/shm/kolo-<job id>-*` when the job ends.

pub(crate) mod prefix;
pub mod segment;
pub mod sync;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use crate::{check_rank, io_err};
use kolo_core::{
    Arena, Error, Header, LinkFailure, Mailbox, Message, RecvError, Tag, Transport, HEADER_LEN,
};
use kolo_store::Store;

use prefix::{decode_prefix, encode_prefix, PREFIX};
pub use segment::Segment;
use sync::{Doorbell, ProcessWatch};

const SETUP_OP: &str = "shm connect";
const MAGIC: u64 = u64::from_le_bytes(*b"kolo-shm");
const LINE: usize = 128;
const HEADER_BYTES: usize = 128;
const CTRL_BYTES: usize = 4 * LINE;
const REASON_MAX: usize = 2 * LINE - 16;
/// A step's slot: the fingerprint (`HEADER_LEN` bytes), then inline data from `INLINE_AT`. The step
/// word and both slots share one 128-byte line.
const FP_SLOT: usize = 56;
const INLINE_AT: usize = 40;
const INLINE_BYTES: usize = FP_SLOT - INLINE_AT;
const _: () = assert!(HEADER_LEN <= INLINE_AT && 8 + 2 * FP_SLOT <= LINE);
const RING_CTRL: usize = 2 * LINE;

const STATE_ALIVE: u32 = 0;
const STATE_CLOSED: u32 = 1;
const STATE_ABORTED: u32 = 2;
const STATE_LOST: u32 = 3;

/// Start of the names of a job's segments: `kolo-<job id>-`, the job id (up to its first `/`) reduced
/// to characters safe in a file name. The launcher removes leftovers by this prefix.
pub fn name_prefix(job_id: &str) -> String {
    let job = job_id.split('/').next().unwrap_or("kolo");
    let safe: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("kolo-{safe}-")
}

/// Settings of the shared-memory transport.
#[derive(Clone, Debug)]
pub struct ShmOptions {
    /// Bytes of each pair's ring (rounded up to 64; at least 4 KiB).
    pub ring_bytes: usize,
    /// Bytes of each of a rank's two arena buffers (rounded up to 64; at least 4 KiB).
    pub buffer_bytes: usize,
    /// How long a waiting thread spins before it sleeps.
    pub spin: Duration,
    /// How often a sleeping thread checks that its peers are alive.
    pub poll: Duration,
    /// Largest payload accepted from a peer.
    pub max_message: u64,
    /// How long connecting waits for the other ranks.
    pub connect_timeout: Duration,
    /// A peer process whose heartbeat (bumped twice a second) stands still this long is lost: it
    /// is stopped or hung. `None`: no heartbeats.
    pub heartbeat_timeout: Option<Duration>,
}

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions {
            ring_bytes: 256 << 10,
            buffer_bytes: 1 << 20,
            spin: Duration::from_micros(1000),
            poll: Duration::from_millis(20),
            max_message: 1 << 40,
            connect_timeout: Duration::from_secs(300),
            heartbeat_timeout: Some(Duration::from_secs(6)),
        }
    }
}

impl ShmOptions {
    /// Defaults, overridden by `KOLO_SHM_RING_BYTES`, `KOLO_SHM_BUFFER_BYTES` and `KOLO_SHM_SPIN_US`.
    pub fn from_env() -> Result<ShmOptions, Error> {
        let mut o = ShmOptions::default();
        let num = |var: &'static str| -> Result<Option<u64>, Error> {
            match std::env::var(var) {
                Err(_) => Ok(None),
                Ok(v) => v
                    .trim()
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| Error::Config {
                        var: var.to_string(),
                        value: v.clone(),
                        reason: "expected a non-negative integer".into(),
                    }),
            }
        };
        if let Some(v) = num("KOLO_SHM_RING_BYTES")? {
            o.ring_bytes = v as usize;
        }
        if let Some(v) = num("KOLO_SHM_BUFFER_BYTES")? {
            o.buffer_bytes = v as usize;
        }
        if let Some(v) = num("KOLO_SHM_SPIN_US")? {
            o.spin = Duration::from_micros(v);
        }
        Ok(o)
    }
}

/// Sizes that fix the segment layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    n: usize,
    ring: usize,
    buffer: usize,
}

fn round64(x: usize) -> usize {
    x.max(4096).div_ceil(64) * 64
}

impl Layout {
    fn new(n: usize, opts: &ShmOptions) -> Layout {
        Layout {
            n,
            ring: round64(opts.ring_bytes),
            buffer: round64(opts.buffer_bytes),
        }
    }
    fn ctrl(&self, r: usize) -> usize {
        HEADER_BYTES + r * CTRL_BYTES
    }
    fn rings(&self) -> usize {
        self.ctrl(self.n)
    }
    fn ring(&self, src: usize, dst: usize) -> usize {
        let idx = src * (self.n - 1) + if dst < src { dst } else { dst - 1 };
        self.rings() + idx * (RING_CTRL + self.ring)
    }
    fn buffers(&self) -> usize {
        (self.rings() + self.n * (self.n - 1) * (RING_CTRL + self.ring)).div_ceil(4096) * 4096
    }
    fn buffer(&self, r: usize, parity: usize) -> usize {
        self.buffers() + (2 * r + parity) * self.buffer
    }
    fn total(&self) -> usize {
        self.buffer(self.n, 0)
    }
}

/// The receiving side of one incoming ring: a message being assembled.
#[derive(Debug, Default)]
struct Consumer {
    partial: Option<(Header, usize, Vec<u8>)>,
    /// The peer's clean close has been passed to the mailbox.
    closed: bool,
}

/// One rank's endpoint of a shared-memory world.
#[derive(Debug)]
pub struct ShmTransport {
    seg: Arc<Segment>,
    layout: Layout,
    rank: usize,
    opts: ShmOptions,
    mailbox: Mailbox,
    producers: Vec<Mutex<()>>,
    consumers: Vec<Mutex<Consumer>>,
    watches: Vec<Option<ProcessWatch>>,
    next_step: AtomicU64,
    next_round: AtomicU64,
    /// Each peer's last heartbeat value and when it was first seen.
    beats: Mutex<Vec<(u32, Instant)>>,
    beat_stop: Arc<AtomicBool>,
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
    Ok((0..size)
        .map(|rank| {
            let t = ShmTransport::new(seg.clone(), layout, rank, opts.clone());
            t.state_word(rank, 1).store(pid, Ordering::Release);
            t
        })
        .collect())
}

fn nonce() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    kolo_core::call::fnv1a(&[&t.to_le_bytes(), &std::process::id().to_le_bytes()])
}

fn init_header(seg: &Segment, layout: &Layout) {
    let w = |i: usize, v: u64| {
        // SAFETY: the header's first 32 bytes are four aligned u64 words of the mapping.
        unsafe { &*(seg.ptr().add(8 * i) as *const AtomicU64) }.store(v, Ordering::Release)
    };
    w(1, layout.n as u64);
    w(2, layout.ring as u64);
    w(3, layout.buffer as u64);
    w(0, MAGIC);
}

impl ShmTransport {
    fn new(seg: Arc<Segment>, layout: Layout, rank: usize, opts: ShmOptions) -> ShmTransport {
        let n = layout.n;
        ShmTransport {
            seg,
            layout,
            rank,
            opts,
            mailbox: Mailbox::new(n),
            producers: (0..n).map(|_| Mutex::new(())).collect(),
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
            let seg = Segment::open(&name, layout.total())
                .map_err(io_err(format!("rank {rank}: open /dev/shm/{name}")))?;
            // SAFETY: the header's first word.
            let magic = unsafe { &*(seg.ptr() as *const AtomicU64) }.load(Ordering::Acquire);
            if magic != MAGIC {
                return Err(Error::Io {
                    context: format!("rank {rank}: /dev/shm/{name}"),
                    source: io::Error::new(io::ErrorKind::InvalidData, "not a kolo segment"),
                });
            }
            seg
        };
        let mut t = ShmTransport::new(Arc::new(seg), layout, rank, opts.clone());
        t.state_word(rank, 1)
            .store(std::process::id(), Ordering::Release);
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

    fn step_word(&self, r: usize) -> &AtomicU64 {
        self.u64_at(self.layout.ctrl(r) + 3 * LINE)
    }

    fn fingerprint(&self, r: usize, step: u64) -> *mut u8 {
        self.at(self.layout.ctrl(r) + 3 * LINE + 8 + (step % 2) as usize * FP_SLOT)
    }

    fn ring_tail(&self, src: usize, dst: usize) -> &AtomicU64 {
        self.u64_at(self.layout.ring(src, dst))
    }

    fn ring_head(&self, src: usize, dst: usize) -> &AtomicU64 {
        self.u64_at(self.layout.ring(src, dst) + LINE)
    }

    fn ring_data(&self, src: usize, dst: usize) -> *mut u8 {
        self.at(self.layout.ring(src, dst) + RING_CTRL)
    }

    /// Copies `data` into the ring `src → dst` at stream position `pos` (wrapping).
    fn ring_write(&self, dst: usize, pos: u64, data: &[u8]) {
        let cap = self.layout.ring;
        let base = self.ring_data(self.rank, dst);
        let at = (pos % cap as u64) as usize;
        let first = data.len().min(cap - at);
        // SAFETY: the producer owns ring bytes [tail, head + cap) (checked by the caller); the two
        // pieces stay inside the ring's data area.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), base.add(at), first);
            std::ptr::copy_nonoverlapping(data.as_ptr().add(first), base, data.len() - first);
        }
    }

    /// Copies ring bytes of `src → self` at stream position `pos` into `out` (wrapping).
    fn ring_read(&self, src: usize, pos: u64, out: &mut [u8]) {
        let cap = self.layout.ring;
        let base = self.ring_data(src, self.rank);
        let at = (pos % cap as u64) as usize;
        let first = out.len().min(cap - at);
        // SAFETY: the consumer owns ring bytes [head, tail) (checked by the caller).
        unsafe {
            std::ptr::copy_nonoverlapping(base.add(at), out.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(base, out.as_mut_ptr().add(first), out.len() - first);
        }
    }

    /// Records `peer`'s state change (abort, loss, exit) in the mailbox; returns whether it failed.
    fn check_peer(&self, peer: usize) -> bool {
        match self.state_word(peer, 0).load(Ordering::Acquire) {
            STATE_ABORTED | STATE_LOST => {
                let reason = self.reason(peer);
                let failure = if self.state_word(peer, 0).load(Ordering::Acquire) == STATE_LOST {
                    LinkFailure::PeerLost { peer, reason }
                } else {
                    LinkFailure::Aborted { by: peer, reason }
                };
                self.mailbox.fail(failure);
                true
            }
            STATE_CLOSED => false,
            _ => match &self.watches[peer] {
                Some(w) if w.exited() => {
                    // Re-check: a clean close just before exit is not a loss.
                    if self.state_word(peer, 0).load(Ordering::Acquire) == STATE_ALIVE {
                        self.mailbox.fail(LinkFailure::PeerLost {
                            peer,
                            reason: format!(
                                "its process (pid {}) exited without closing the connection",
                                self.state_word(peer, 1).load(Ordering::Relaxed)
                            ),
                        });
                        return true;
                    }
                    false
                }
                Some(_) => self.check_heartbeat(peer),
                None => false,
            },
        }
    }

    /// Fails the mailbox when `peer`'s heartbeat (bumped twice a second by a thread of its process)
    /// has not moved for the heartbeat timeout: the process is stopped or hung.
    fn check_heartbeat(&self, peer: usize) -> bool {
        let Some(timeout) = self.opts.heartbeat_timeout else {
            return false;
        };
        let beat = self.state_word(peer, 3).load(Ordering::Relaxed);
        let mut seen = lock(&self.beats);
        let (last, since) = &mut seen[peer];
        if *last != beat {
            *last = beat;
            *since = Instant::now();
            return false;
        }
        if since.elapsed() < timeout {
            return false;
        }
        drop(seen);
        self.mailbox.fail(LinkFailure::PeerLost {
            peer,
            reason: format!(
                "no heartbeat from its process (pid {}) for {:.0} s: it is stopped or hung",
                self.state_word(peer, 1).load(Ordering::Relaxed),
                timeout.as_secs_f64()
            ),
        });
        true
    }

    /// Bumps this rank's heartbeat word twice a second until the transport is dropped.
    fn start_heartbeat(&self) -> Result<(), Error> {
        let seg = self.seg.clone();
        let off = self.layout.ctrl(self.rank) + LINE + 12;
        let stop = self.beat_stop.clone();
        std::thread::Builder::new()
            .name(format!("kolo-shm-beat-{}", self.rank))
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    // SAFETY: a 4-aligned word of the rank's own state line, inside the mapping that
                    // `seg` keeps alive; only accessed atomically.
                    let word = unsafe { &*(seg.ptr().add(off) as *const AtomicU32) };
                    word.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
            .map(|_| ())
            .map_err(io_err(format!(
                "rank {}: spawn heartbeat thread",
                self.rank
            )))
    }

    fn reason(&self, peer: usize) -> String {
        let len = (self.state_word(peer, 2).load(Ordering::Acquire) as usize).min(REASON_MAX);
        let mut b = vec![0u8; len];
        // SAFETY: the reason bytes were written before the state word (release) we read above.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.at(self.layout.ctrl(peer) + LINE + 16),
                b.as_mut_ptr(),
                len,
            )
        };
        String::from_utf8_lossy(&b).into_owned()
    }

    fn set_state(&self, state: u32, reason: &str) {
        let me = self.rank;
        if self
            .state_word(me, 0)
            .compare_exchange(STATE_ALIVE, state, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let mut b = reason.as_bytes();
        if b.len() > REASON_MAX {
            b = &b[..REASON_MAX];
        }
        // SAFETY: the owner writes its reason area once, then publishes its length (release).
        unsafe {
            std::ptr::copy_nonoverlapping(
                b.as_ptr(),
                self.at(self.layout.ctrl(me) + LINE + 16),
                b.len(),
            )
        };
        self.state_word(me, 2)
            .store(b.len() as u32, Ordering::Release);
        for peer in 0..self.layout.n {
            if peer != me {
                self.bell(peer).ring_always();
            }
        }
    }

    /// Checks every peer and this endpoint; the failure, if any.
    fn health(&self) -> Option<LinkFailure> {
        for peer in 0..self.layout.n {
            if peer != self.rank {
                self.check_peer(peer);
            }
        }
        self.mailbox.failure()
    }

    /// Moves complete (and partial) messages from every incoming ring into the mailbox; returns
    /// whether a message was delivered.
    fn progress(&self) -> bool {
        let mut delivered = false;
        for src in 0..self.layout.n {
            if src == self.rank {
                continue;
            }
            match self.consumers[src].try_lock() {
                Ok(mut c) => delivered |= self.drain(src, &mut c),
                Err(TryLockError::Poisoned(p)) => delivered |= self.drain(src, &mut p.into_inner()),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        if delivered {
            // Another thread of this rank may wait for what was delivered.
            self.bell(self.rank).ring();
        }
        delivered
    }

    fn drain(&self, src: usize, c: &mut Consumer) -> bool {
        let mut delivered = false;
        let head_word = self.ring_head(src, self.rank);
        let mut head = head_word.load(Ordering::Relaxed);
        loop {
            let tail = self.ring_tail(src, self.rank).load(Ordering::Acquire);
            let avail = (tail - head) as usize;
            if c.partial.is_none() {
                if avail < PREFIX {
                    if avail == 0 && !c.closed {
                        // A clean close is final only once everything sent before it is read.
                        if self.state_word(src, 0).load(Ordering::Acquire) == STATE_CLOSED
                            && self.ring_tail(src, self.rank).load(Ordering::Acquire) == head
                        {
                            c.closed = true;
                            self.mailbox.close_peer(src);
                            delivered = true;
                        }
                    }
                    break;
                }
                let mut p = [0u8; PREFIX];
                self.ring_read(src, head, &mut p);
                head += PREFIX as u64;
                let (header, len) = match decode_prefix(&p, self.opts.max_message) {
                    Ok(decoded) => decoded,
                    Err(reason) => {
                        self.fail_protocol(src, reason);
                        break;
                    }
                };
                // Never trust the length for the allocation: grow as bytes arrive.
                let buf = Vec::with_capacity(len.min(self.layout.ring));
                c.partial = Some((header, len, buf));
                continue;
            }
            let Some((_, len, buf)) = c.partial.as_mut() else {
                break;
            };
            let take = avail.min(*len - buf.len());
            if take > 0 {
                let old = buf.len();
                buf.resize(old + take, 0);
                self.ring_read(src, head, &mut buf[old..]);
                head += take as u64;
            }
            if buf.len() == *len {
                if let Some((header, _, payload)) = c.partial.take() {
                    self.mailbox.deliver(src, Message { header, payload });
                    delivered = true;
                }
                continue;
            }
            if take == 0 {
                break;
            }
        }
        if head != head_word.load(Ordering::Relaxed) {
            head_word.store(head, Ordering::Release);
            self.bell(src).ring();
        }
        delivered
    }

    fn fail_protocol(&self, peer: usize, reason: String) {
        self.mailbox.fail(LinkFailure::Protocol { peer, reason });
    }

    /// Spins, then sleeps on this rank's doorbell, until `ready` returns `Some`, the deadline passes
    /// (`Err(Timeout)`) or a link fails.
    fn wait_for<R>(
        &self,
        deadline: Option<Instant>,
        mut ready: impl FnMut() -> Option<R>,
    ) -> Result<R, RecvError> {
        // Most waits end within a few hundred spins: read the clock only after that. Past that, yield
        // the core every 16 spins: a thread or rank waiting for it (more ranks than free cores, or
        // both placed on one core) runs at once. Sleep only after `spin`: once a rank sleeps its peers
        // pay a wake-up per step, which on a virtual machine can outlast a short spin and keep every
        // rank sleeping on every step.
        let mut spin_until = None;
        let mut i = 0u32;
        loop {
            if let Some(r) = ready() {
                return Ok(r);
            }
            i = i.wrapping_add(1);
            if i % 16 == 0 && i >= 256 {
                let now = Instant::now();
                match spin_until {
                    None => spin_until = Some(now + self.opts.spin),
                    Some(t) if now >= t => break,
                    Some(_) => std::thread::yield_now(),
                }
            }
            std::hint::spin_loop();
        }
        let bell = self.bell(self.rank);
        loop {
            if let Some(f) = self.health() {
                return Err(RecvError::Link(f));
            }
            let mut timeout = self.opts.poll;
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    return Err(RecvError::Timeout);
                }
                timeout = timeout.min(d - now);
            }
            let mut out = None;
            bell.sleep_unless(timeout, &mut || {
                out = ready();
                out.is_some()
            });
            if let Some(r) = out.or_else(&mut ready) {
                return Ok(r);
            }
        }
    }

    fn send_to_peer(
        &self,
        peer: usize,
        header: &Header,
        payload: &[u8],
    ) -> Result<(), LinkFailure> {
        let _g = lock(&self.producers[peer]);
        let cap = self.layout.ring as u64;
        let tail_word = self.ring_tail(self.rank, peer);
        let head_word = self.ring_head(self.rank, peer);
        let mut tail = tail_word.load(Ordering::Relaxed);
        let prefix = encode_prefix(header, payload.len());
        let mut pieces: [&[u8]; 2] = [&prefix, payload];
        for (i, piece) in pieces.iter_mut().enumerate() {
            while !piece.is_empty() {
                let free = |head: u64| (cap - (tail - head)) as usize;
                let need = if i == 0 { PREFIX } else { 1 };
                let mut space = free(head_word.load(Ordering::Acquire));
                if space < need {
                    space = self
                        .wait_for(None, || {
                            if self.state_word(peer, 0).load(Ordering::Acquire) != STATE_ALIVE {
                                return Some(0);
                            }
                            let s = free(head_word.load(Ordering::Acquire));
                            if s >= need {
                                return Some(s);
                            }
                            // Keep our own incoming rings moving so the peer can finish its sends.
                            self.progress();
                            None
                        })
                        .map_err(|e| match e {
                            RecvError::Link(f) => f,
                            RecvError::Timeout => LinkFailure::PeerLost {
                                peer,
                                reason: "timed out waiting for ring space".into(),
                            },
                        })?;
                    if space == 0 {
                        self.check_peer(peer);
                        return Err(self
                            .mailbox
                            .failure()
                            .unwrap_or(LinkFailure::PeerClosed { peer }));
                    }
                }
                let n = space.min(piece.len());
                self.ring_write(peer, tail, &piece[..n]);
                tail += n as u64;
                tail_word.store(tail, Ordering::Release);
                self.bell(peer).ring();
                *piece = &piece[n..];
            }
        }
        Ok(())
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
            self.progress();
            match self.mailbox.try_recv(peer, tag) {
                Ok(Some(m)) => Some(Ok(m)),
                Ok(None) => None,
                Err(f) => Some(Err(f)),
            }
        })?
        .map_err(RecvError::Link)
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

    fn arena(&self) -> Option<&dyn Arena> {
        Some(self)
    }
}

impl Arena for ShmTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.layout.n
    }

    fn buffer_len(&self) -> usize {
        self.layout.buffer
    }

    fn next_round(&self) -> usize {
        (self.next_round.fetch_add(1, Ordering::Relaxed) % 2) as usize
    }

    fn inline_len(&self) -> usize {
        INLINE_BYTES
    }

    fn post(&self, header: &Header, inline: &[u8]) -> u64 {
        assert!(inline.len() <= INLINE_BYTES, "inline data too long");
        let step = self.next_step.fetch_add(1, Ordering::Relaxed);
        let fp = header.encode();
        let slot = self.fingerprint(self.rank, step);
        // SAFETY: the slot of this step's parity is ours to write (see kolo_core::arena); header and
        // inline data fit in it (asserted above).
        unsafe {
            std::ptr::copy_nonoverlapping(fp.as_ptr(), slot, HEADER_LEN);
            std::ptr::copy_nonoverlapping(inline.as_ptr(), slot.add(INLINE_AT), inline.len());
        };
        self.step_word(self.rank).store(step, Ordering::Release);
        for peer in 0..self.layout.n {
            if peer != self.rank {
                self.bell(peer).ring();
            }
        }
        step
    }

    fn wait(
        &self,
        peer: usize,
        step: u64,
        deadline: Option<Instant>,
        inline: &mut [u8],
    ) -> Result<Header, RecvError> {
        assert!(inline.len() <= INLINE_BYTES, "inline data too long");
        let word = self.step_word(peer);
        if word.load(Ordering::Acquire) < step {
            self.wait_for(deadline, || {
                if word.load(Ordering::Acquire) >= step {
                    Some(Ok(()))
                } else if self.state_word(peer, 0).load(Ordering::Acquire) == STATE_CLOSED {
                    Some(Err(LinkFailure::PeerClosed { peer }))
                } else {
                    None
                }
            })?
            .map_err(RecvError::Link)?;
        }
        let mut fp = [0u8; HEADER_LEN];
        let slot = self.fingerprint(peer, step);
        // SAFETY: the peer wrote this slot before posting `step` (acquired above) and will not
        // rewrite it before we post our next step.
        unsafe {
            std::ptr::copy_nonoverlapping(slot, fp.as_mut_ptr(), HEADER_LEN);
            std::ptr::copy_nonoverlapping(slot.add(INLINE_AT), inline.as_mut_ptr(), inline.len());
        };
        Header::decode(&fp).map_err(|e| {
            RecvError::Link(LinkFailure::Protocol {
                peer,
                reason: format!("bad fingerprint in shared memory: {}", e.0),
            })
        })
    }

    fn buffer(&self, rank: usize, parity: usize) -> *mut u8 {
        self.at(self.layout.buffer(rank, parity))
    }
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        self.beat_stop.store(true, Ordering::SeqCst);
        // Pass a failure on (as the TCP transport does with its abort frame); otherwise close cleanly.
        match self.mailbox.failure() {
            Some(LinkFailure::LocalClosed { reason }) => self.set_state(STATE_ABORTED, &reason),
            Some(f) => {
                let reason = f.into_error("shutdown", self.rank).to_string();
                self.set_state(STATE_ABORTED, &reason)
            }
            None if std::thread::panicking() => self.set_state(STATE_LOST, "its thread panicked"),
            None => self.set_state(STATE_CLOSED, ""),
        }
    }
}
