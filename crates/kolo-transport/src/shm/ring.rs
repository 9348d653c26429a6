//! The single-producer single-consumer byte ring of each ordered pair of ranks: sending into it,
//! and draining the incoming rings into the mailbox.
//!
//! Every message starts at a multiple of [`MESSAGE_ALIGN`] bytes of the stream: the producer
//! pads after each one (the padding of a small message is skipped in the same publication, a
//! streamed message's is written as zeros after it) and the consumer releases up to the next
//! multiple when it has read one. A small message and its prefix then share one cache line, which
//! the receiver fetches from the sender's core once.
//!
//! Back and forth, small messages reuse the same few lines of the ring: a sender of a message of up
//! to [`REWIND_MAX`] bytes that finds the ring empty (it looks once every [`REWIND_EVERY`] bytes
//! of its stream) marks it to [`REWIND`](super::prefix::REWIND), and the stream goes on at the
//! start of the ring's next lap — the lines both cores just had, not fresh ones a megabyte along
//! (a 1 KiB ping-pong runs in three quarters of the time).

use std::sync::atomic::Ordering;
use std::sync::TryLockError;

use kolo_core::{Header, LinkFailure, Message, RecvError};

use super::atomics::SharedBytes;
use super::health::{STATE_ALIVE, STATE_CLOSED};
use super::layout::{LINE, RING_CTRL};
use super::postings::Claim;
use super::prefix::{
    decode_prefix, decode_words, encode_prefix, Encoded, Prefix, COMPACT, IN_PLACE_BYTES,
    PREFIX_COMPACT, PREFIX_MAX,
};
use super::single_copy::Batch;
use super::spsc::Spsc;
use super::{lock, ShmTransport};

/// Where messages start in a ring's stream: at multiples of this (a cache line).
pub(super) const MESSAGE_ALIGN: u64 = 64;

/// The position where the message after one that ends at `end` starts.
#[inline]
pub(super) fn next_message(end: u64) -> u64 {
    end.next_multiple_of(MESSAGE_ALIGN)
}

/// How often (bytes of its stream) a sender looks whether the ring is empty, to go on at the
/// ring's start; and how far into a lap its stream must be before it does (so that the consumer's
/// next read gives it this much room at once).
pub(super) const REWIND_EVERY: u64 = 4096;

/// The longest message that rewinds the ring. Back and forth on the same lines, 512 B-1 KiB
/// messages took 0.77-0.82x the time they take on fresh ones; from 1.5 KiB it was a wash at best
/// (2 KiB 1.08x), and from 8 KiB a loss (8-64 KiB: 1.2-1.9x): the sender's writes then wait on the
/// lines the receiver still holds.
pub(super) const REWIND_MAX: usize = 1024;

/// Where the message after one that ends at `end` starts: with `rewind`, at the start of the
/// ring's next lap (`cap` is the ring's capacity, a multiple of [`MESSAGE_ALIGN`]).
#[inline]
pub(super) fn after(end: u64, rewind: bool, cap: usize) -> u64 {
    let next = next_message(end);
    if rewind {
        next.next_multiple_of(cap as u64)
    } else {
        next
    }
}

/// The prefix of the message at `head` of `ring`, once it has arrived whole (of the `avail`
/// bytes there, the first); `None` until then.
///
/// # Safety
///
/// The caller holds the ring's consumer lock, and `avail` bytes from `head` have been published.
#[inline(always)]
pub(super) unsafe fn read_prefix(
    ring: &Spsc<'_>,
    head: u64,
    avail: usize,
    max_message: u64,
) -> Option<Result<Prefix, String>> {
    if avail < PREFIX_COMPACT {
        return None;
    }
    // The compact form read straight from the ring into registers: through a copy on the stack,
    // the decoder's loads wait on the copy's stores, on every message's critical path. (A prefix
    // starts on a line and never wraps; should one, its words are read through the stack.)
    // SAFETY (all reads): the caller holds the consumer lock; `avail` covers the bytes.
    let w = unsafe { ring.read_words::<3>(head) }.unwrap_or_else(|| {
        let mut b = [0u8; PREFIX_COMPACT];
        unsafe { ring.read(head, &mut b) };
        std::array::from_fn(|k| u64::from_le_bytes(std::array::from_fn(|i| b[8 * k + i])))
    });
    if w[0] & COMPACT != 0 {
        return Some(decode_words(w, max_message));
    }
    if avail < PREFIX_MAX {
        return None;
    }
    let mut p = [0u8; PREFIX_MAX];
    unsafe { ring.read(head, &mut p) };
    decode_prefix(&p, max_message)
}

/// A streamed message's padding (at most `MESSAGE_ALIGN - 1` bytes of it).
static PADDING: [u8; MESSAGE_ALIGN as usize] = [0; MESSAGE_ALIGN as usize];

/// The receiving side of one incoming ring: a message being read.
#[derive(Debug, Default)]
pub(super) struct Consumer {
    pub(super) partial: Option<Partial>,
    /// The peer's clean close has been passed to the mailbox.
    closed: bool,
}

/// A message being read from a ring: `got` of its `len` payload bytes so far, into the buffer of
/// the posting it was matched to (see `postings`) when it fits there, else into `buf`.
#[derive(Debug)]
pub(super) struct Partial {
    pub(super) header: Header,
    pub(super) len: usize,
    pub(super) got: usize,
    pub(super) posting: Option<Claim>,
    pub(super) buf: Vec<u8>,
    /// The next message starts at the ring's next lap.
    pub(super) rewind: bool,
}

impl Partial {
    /// The posting its payload is written into.
    fn posting_fits(&self) -> Option<Claim> {
        self.posting.filter(|c| self.len <= c.cap)
    }
}

/// The producer's side of an outgoing ring, under its lock: its own position (only it moves the
/// ring's `tail`, so it need not read the shared word back) and the consumer's as last read.
#[derive(Debug, Default)]
pub(super) struct Producer {
    pub(super) tail: u64,
    pub(super) known_head: u64,
    /// The stream position from which the producer looks again whether the ring is empty.
    pub(super) look_at: u64,
    /// Messages sent in place to this peer so far (see `single_copy`).
    pub(super) in_place: u64,
}

impl Producer {
    /// Where the stream goes on after a small message of `len` bytes at `tail` whose padded end is
    /// `next`, when it rewinds the ring (see the module's documentation): the start of the ring's
    /// next lap. Only messages of up to [`REWIND_MAX`] bytes, looked at once every
    /// [`REWIND_EVERY`] bytes, far enough into a lap, within it, and into an empty ring.
    fn rewind(&mut self, ring: &Spsc<'_>, len: usize, tail: u64, next: u64) -> Option<u64> {
        let cap = ring.capacity() as u64;
        if len > REWIND_MAX
            || tail < self.look_at
            || cap < 4 * REWIND_EVERY
            || tail % cap < REWIND_EVERY
            || (next - 1) / cap != tail / cap
        {
            return None;
        }
        self.look_at = tail + REWIND_EVERY;
        self.known_head = ring.released();
        if self.known_head != tail {
            return None;
        }
        let lap = after(next, true, ring.capacity());
        self.look_at = lap + REWIND_EVERY;
        Some(lap)
    }
}

impl ShmTransport {
    /// The ring `src → dst`.
    pub(super) fn ring(&self, src: usize, dst: usize) -> Spsc<'_> {
        let at = self.layout.ring(src, dst);
        // SAFETY: the ring's data area lies inside the mapping, which lives as long as `self`.
        let data = unsafe { SharedBytes::new(self.at(at + RING_CTRL), self.layout.ring) };
        Spsc::new(self.u64_at(at), self.u64_at(at + LINE), data)
    }

    /// Moves complete (and partial) messages from every incoming ring into the mailbox; returns
    /// whether a message was delivered.
    pub(super) fn progress(&self) -> bool {
        self.progress_except(None)
    }

    /// [`Self::progress`], leaving the ring from `skip` alone (a posted receive reads it).
    pub(super) fn progress_except(&self, skip: Option<usize>) -> bool {
        let mut delivered = false;
        for src in 0..self.layout.n {
            if src == self.rank || Some(src) == skip {
                continue;
            }
            match self.consumers[src].try_lock() {
                Ok(mut c) => delivered |= self.drain(src, &mut c, false),
                Err(TryLockError::Poisoned(p)) => {
                    delivered |= self.drain(src, &mut p.into_inner(), false)
                }
                Err(TryLockError::WouldBlock) => {}
            }
        }
        if delivered {
            // Another thread of this rank may wait for what was delivered.
            self.bell(self.rank).ring();
        }
        delivered
    }

    /// The most bytes copied into or out of a ring between two releases: a quarter of it (at least
    /// a page), so that sender and receiver copy at the same time.
    pub(super) fn chunk(&self) -> usize {
        (self.layout.ring / 4).max(4096)
    }

    /// Moves what has arrived from `src` into the mailbox — with `one`, no further than the end of
    /// the first message delivered; returns whether a message was delivered.
    pub(super) fn drain(&self, src: usize, c: &mut Consumer, one: bool) -> bool {
        let mut delivered = false;
        // Messages in place for postings, copied together (see `single_copy::Batch`).
        let mut batch = Batch::default();
        let ring = self.ring(src, self.rank);
        let mut head = ring.consumer_position();
        loop {
            let avail = ring.available(head);
            if c.partial.is_none() {
                // SAFETY: this thread holds the ring's consumer lock.
                let decoded = unsafe { read_prefix(&ring, head, avail, self.opts.max_message) };
                let Some(decoded) = decoded else {
                    if avail == 0 && !c.closed {
                        // A clean close is final only once everything sent before it is read.
                        if self.state_word(src, 0).load(Ordering::Acquire) == STATE_CLOSED
                            && ring.available(head) == 0
                        {
                            c.closed = true;
                            self.mailbox.close_peer(src);
                            delivered = true;
                        }
                    }
                    break;
                };
                let Prefix {
                    header,
                    len,
                    in_place,
                    rewind,
                    bytes,
                } = match decoded {
                    Ok(decoded) => decoded,
                    Err(reason) => {
                        self.fail_protocol(src, reason);
                        break;
                    }
                };
                if in_place {
                    // Published whole with its prefix; copied from the sender into the posting
                    // waiting for it, else into a buffer for the mailbox.
                    let Some((addr, next)) = self.take_in_place(src, head, bytes) else {
                        break;
                    };
                    head = next;
                    match self.in_place_to_posting(src, &mut batch, header, (addr, len)) {
                        Some(true) => delivered = true,
                        Some(false) => break, // the mailbox holds the failure
                        None if !self.flush_in_place(src, &mut batch) => break,
                        None => match self.copy_in_place_vec(src, addr, len) {
                            Ok(payload) => {
                                self.mailbox.deliver(src, Message { header, payload });
                                delivered = true;
                            }
                            Err(_) => break,
                        },
                    }
                    if one {
                        break;
                    }
                    continue;
                }
                head += bytes as u64;
                c.partial = Some(self.start_partial(src, header, len, rewind));
                continue;
            }
            let Some(p) = c.partial.as_mut() else {
                break;
            };
            let take = avail.min(p.len - p.got).min(self.chunk());
            if take > 0 {
                match p.posting_fits() {
                    // SAFETY: this thread holds the ring's consumer lock, under which the claim
                    // holds; `take` fits the posting and `avail` covers the bytes.
                    Some(claim) => unsafe { ring.read(head, claim.bytes(p.got, take)) },
                    None => {
                        let old = p.buf.len();
                        p.buf.resize(old + take, 0);
                        // SAFETY: as above.
                        unsafe { ring.read(head, &mut p.buf[old..]) };
                    }
                }
                p.got += take;
                head += take as u64;
            }
            let whole = p.got == p.len;
            if whole {
                head = after(head, p.rewind, ring.capacity());
            }
            if take > 0 || whole {
                // Give the space back at once: the sender refills it while the next chunk is read.
                ring.release(head);
                self.bell(src).ring();
            }
            if whole {
                if let Some(p) = c.partial.take() {
                    self.complete(src, p);
                    delivered = true;
                }
                if one {
                    break;
                }
                continue;
            }
            if take == 0 {
                break;
            }
        }
        if !batch.is_empty() {
            self.flush_in_place(src, &mut batch);
            delivered = true;
        }
        if head != ring.consumer_position() {
            ring.release(head);
            self.bell(src).ring();
        }
        delivered
    }

    /// Waits until the ring to `peer` has `need` bytes free for the producer at `tail`, keeping
    /// this rank's incoming rings moving meanwhile (so the peer can finish its own sends); the
    /// free bytes. The caller holds the ring's producer lock.
    pub(super) fn wait_for_space(
        &self,
        peer: usize,
        tail: u64,
        need: usize,
    ) -> Result<usize, LinkFailure> {
        let ring = self.ring(self.rank, peer);
        let space = self
            .wait_for(None, || {
                if self.state_word(peer, 0).load(Ordering::Acquire) != STATE_ALIVE {
                    return Some(0);
                }
                let s = ring.free(tail);
                if s >= need {
                    return Some(s);
                }
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
        Ok(space)
    }

    /// Takes the message in place from `src` whose prefix (of `prefix` bytes) is at `head`, once
    /// its address (after the prefix; the sender publishes both at once) has arrived: gives its
    /// ring space back and returns the address and where the next message starts. The caller holds
    /// the ring's consumer lock.
    pub(super) fn take_in_place(&self, src: usize, head: u64, prefix: usize) -> Option<(u64, u64)> {
        let ring = self.ring(src, self.rank);
        if ring.available(head) < prefix + IN_PLACE_BYTES {
            return None;
        }
        let mut a = [0u8; IN_PLACE_BYTES];
        // SAFETY: the caller holds the consumer lock; `available` covers the bytes.
        unsafe { ring.read(head + prefix as u64, &mut a) };
        let next = next_message(head + (prefix + IN_PLACE_BYTES) as u64);
        ring.release(next);
        self.bell(src).ring();
        Some((u64::from_le_bytes(a), next))
    }

    pub(super) fn send_to_peer(
        &self,
        peer: usize,
        header: &Header,
        payload: &[u8],
    ) -> Result<(), LinkFailure> {
        let mut producer = lock(&self.producers[peer]);
        let ring = self.ring(self.rank, peer);
        let mut tail = producer.tail;
        debug_assert_eq!(
            tail,
            ring.producer_position(),
            "only this producer moves the tail"
        );
        // A small message that fits goes in with one publication (and one doorbell). The space is
        // first judged by the consumer's position as last read: reading it anew costs a cache
        // line from the receiver's core, and most small sends do not need it.
        let prefix = encode_prefix(header, payload.len());
        let end = tail + (prefix.len() + payload.len()) as u64;
        let next = next_message(end);
        let small = (next - tail) as usize;
        if small <= self.chunk()
            && (ring.free_before(tail, producer.known_head) >= small || {
                producer.known_head = ring.released();
                ring.free_before(tail, producer.known_head) >= small
            })
        {
            let (prefix, next) = match producer.rewind(&ring, payload.len(), tail, next) {
                Some(lap) => (prefix.rewinding(), lap),
                None => (prefix, next),
            };
            // SAFETY: this thread holds the ring's producer lock; the free space covers both and
            // the padding (up to the next lap: the ring is empty).
            producer.tail = unsafe {
                match &prefix {
                    Encoded::Compact(words) => ring.push_words2(tail, words, payload, next),
                    Encoded::Full(bytes) => ring.push2(tail, bytes, payload, next),
                }
            };
            self.bell(peer).ring();
            return Ok(());
        }
        let bytes = prefix.bytes();
        let mut pieces: [&[u8]; 3] = [
            &bytes[..prefix.len()],
            payload,
            &PADDING[..(next - end) as usize],
        ];
        for (i, piece) in pieces.iter_mut().enumerate() {
            while !piece.is_empty() {
                let need = if i == 0 { prefix.len() } else { 1 };
                let mut space = ring.free(tail);
                if space < need {
                    space = self.wait_for_space(peer, tail, need)?;
                }
                // Publish in chunks of a quarter ring, so the receiver copies one out while the
                // next is copied in.
                let n = space.min(piece.len()).min(self.chunk());
                // SAFETY: this thread holds the ring's producer lock; `space` covers the bytes.
                tail = unsafe { ring.push(tail, &piece[..n]) };
                producer.tail = tail;
                self.bell(peer).ring();
                *piece = &piece[n..];
            }
        }
        Ok(())
    }
}
