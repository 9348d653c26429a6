//! The byte-moving interface every transport implements (the [`Mailbox`](crate::Mailbox) they share for matching
//! incoming messages to receives is in [`crate::mailbox`]).
//!
//! Collective algorithms are written once against [`Transport`] and so run unchanged on threads, shared
//! memory and TCP. The contract is small:
//!
//! - `send` is *buffered*: it returns once the payload has been handed to the transport and never waits
//!   for the peer to post a receive, so a schedule in which every rank sends before it receives cannot
//!   deadlock;
//! - messages from one peer with one tag arrive in the order they were sent;
//! - once a link fails (a peer died, a peer aborted, a protocol error), every receive returns that failure.

use std::fmt;
use std::time::{Duration, Instant};

use crate::call::{Header, Tag};
use crate::error::{LinkFailure, RecvError};

/// A received message.
#[derive(Debug)]
pub struct Message {
    /// Tag and sender's fingerprint.
    pub header: Header,
    /// Payload bytes.
    pub payload: Vec<u8>,
}

/// How one message of a [`Transport::recv_posted`] arrived.
#[derive(Debug)]
pub enum Received {
    /// Its payload was written straight into its place in the posted buffer (it had exactly the
    /// expected length) — or, for a posting with a reducer, reduced into it; the header it came with.
    Direct(Header),
    /// The whole message, for the caller to check and copy (it arrived before the receive was posted,
    /// or it was not what the posting expected).
    Message(Message),
}

/// Moves tagged byte messages between the ranks of one world.
///
/// Ranks here are transport ranks (positions in the world the transport was built for); communicators
/// for sub-groups map their own ranks onto these.
pub trait Transport: Send + Sync + fmt::Debug {
    /// This endpoint's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Short name (`local`, `tcp`, ...), used in benchmarks and errors.
    fn kind(&self) -> &'static str;
    /// Sends `payload` to `peer` (which may be this rank). Buffered: returns without waiting for a
    /// matching receive.
    fn send(&self, peer: usize, header: &Header, payload: &[u8]) -> Result<(), LinkFailure>;
    /// Sends `payload` to `peer` in place where this transport can: the peer copies it once,
    /// straight out of this process's memory, when it receives it (shared memory between
    /// processes that may read each other's memory, messages of at least its threshold); the
    /// message's ticket then, for [`Transport::in_place_done`] and [`Transport::wait_in_place`].
    /// Elsewhere this is [`Transport::send`] (buffered) and returns `None`. Messages sent either
    /// way keep their order.
    ///
    /// # Safety
    ///
    /// With `Ok(Some(ticket))`, the memory of `payload` must stay alive and unchanged until the
    /// ticket is reported done; after either of those two failed, for as long as the process runs
    /// (the peer may still be copying it).
    unsafe fn send_in_place(
        &self,
        peer: usize,
        header: &Header,
        payload: &[u8],
    ) -> Result<Option<u64>, LinkFailure> {
        self.send(peer, header, payload).map(|()| None)
    }
    /// The fewest bytes [`Transport::send_in_place`] may send in place (`None`: it never does).
    fn in_place_min(&self) -> Option<usize> {
        None
    }
    /// Whether `peer` has copied the message sent in place with `ticket`.
    fn in_place_done(&self, _peer: usize, _ticket: u64) -> Result<bool, LinkFailure> {
        Ok(true)
    }
    /// Waits until `peer` has copied the message sent in place with `ticket`, until `deadline`.
    fn wait_in_place(
        &self,
        _peer: usize,
        _ticket: u64,
        _deadline: Option<Instant>,
    ) -> Result<(), RecvError> {
        Ok(())
    }
    /// Posts a receive of the next message from `peer` with `tag` into `len` bytes at `buf`, where
    /// this transport can fill it as the message arrives (MPI's posted `Irecv`): whichever call of
    /// this endpoint next moves incoming messages writes the payload straight into `buf` — the
    /// shared-memory transport, between processes; its posting then, for
    /// [`Transport::posted_recv`] and [`Transport::unpost_recv`]. Elsewhere `None`: nothing was
    /// posted (receive with [`Transport::recv_posted`] or [`Transport::recv`] instead). Postings
    /// from one peer with one tag take that peer's messages in the order they were posted, before
    /// any later receive; a message that arrived before the posting, still queued, is its first.
    ///
    /// # Safety
    ///
    /// With `Ok(Some(posting))`, `buf` must stay valid for writes of `len` bytes, and be neither
    /// read nor written by anyone else, until [`Transport::posted_recv`] reports the posting
    /// complete or failed, or [`Transport::unpost_recv`] returns.
    unsafe fn post_recv(
        &self,
        _peer: usize,
        _tag: &Tag,
        _buf: *mut u8,
        _len: usize,
    ) -> Result<Option<u64>, LinkFailure> {
        Ok(None)
    }
    /// The outcome of a posting of [`Transport::post_recv`] once its message has been received:
    /// the message's header and length (a message longer than the posting was consumed with
    /// nothing written: the caller reports the truncation). With `block`, waits until `deadline`
    /// ([`RecvError::Timeout`]); without, `None` at once while the message has not arrived. A
    /// posting reported complete or failed is gone.
    fn posted_recv(
        &self,
        _posting: u64,
        _block: bool,
        _deadline: Option<Instant>,
    ) -> Result<Option<(Header, usize)>, RecvError> {
        Err(RecvError::Link(LinkFailure::PeerLost {
            peer: self.rank(),
            reason: "this transport posts no receives".into(),
        }))
    }
    /// Withdraws a posting of [`Transport::post_recv`] that is no longer wanted: nothing is written
    /// into its buffer after this returns. A message it had begun to take goes on to the next
    /// receive instead, whole; one it had taken is dropped with it.
    fn unpost_recv(&self, _posting: u64) {}
    /// Waits for the next message from `peer` with `tag`, until `deadline` (`None`: forever).
    fn recv(&self, peer: usize, tag: &Tag, deadline: Option<Instant>)
        -> Result<Message, RecvError>;
    /// Returns the next message from `peer` with `tag` if one has arrived.
    fn try_recv(&self, peer: usize, tag: &Tag) -> Result<Option<Message>, LinkFailure>;
    /// Waits for the next message with `tag` from any of `peers` (a receive from any source), until
    /// `deadline`: the sender and the message. Messages from one peer keep their order; between
    /// peers, transports with a [`Mailbox`](crate::Mailbox) hand over the one that arrived first. A peer that
    /// closed cleanly is passed over while another of `peers` may still send; once all have,
    /// [`LinkFailure::PeerClosed`]. The default polls [`Transport::try_recv_any`] ([`poll_until`]).
    fn recv_any(
        &self,
        peers: &[usize],
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<(usize, Message), RecvError> {
        poll_until(deadline, || self.try_recv_any(peers, tag))
    }
    /// Returns the next message with `tag` from any of `peers` if one has arrived, with its sender
    /// (see [`Transport::recv_any`]). The default asks each peer in turn with [`Transport::try_recv`].
    fn try_recv_any(
        &self,
        peers: &[usize],
        tag: &Tag,
    ) -> Result<Option<(usize, Message)>, LinkFailure> {
        let mut closed = None;
        let mut open = false;
        for &p in peers {
            match self.try_recv(p, tag) {
                Ok(Some(m)) => return Ok(Some((p, m))),
                Ok(None) => open = true,
                Err(LinkFailure::PeerClosed { peer }) => {
                    closed.get_or_insert(peer);
                }
                Err(f) => return Err(f),
            }
        }
        match closed {
            Some(peer) if !open => Err(LinkFailure::PeerClosed { peer }),
            _ => Ok(None),
        }
    }
    /// Fails this endpoint and tells every peer that this rank aborted with `reason`; their pending
    /// and later receives fail with [`LinkFailure::Aborted`]. Idempotent.
    fn abort(&self, reason: &str);
    /// The failure that broke this endpoint, if any.
    fn failure(&self) -> Option<LinkFailure>;
    /// This rank enters the collective of `header` (see [`Mailbox::expect`](crate::Mailbox::expect)); transports with a
    /// mailbox pass it on. The default does nothing.
    fn expect(&self, _header: &Header) {}
    /// Receives `buf.len()` bytes from `peer` with `tag`, sent as consecutive messages of `segment`
    /// bytes (the last one shorter; one empty message for an empty `buf`). Posts `buf` first, so that
    /// a transport can write payloads arriving later straight into it, then runs `meanwhile` (the sends
    /// that make the peer answer, say), then hands every message to `each` in order with the part of
    /// `buf` it belongs to, once no transport thread writes into `buf` any more. With `reduce`, a
    /// transport may instead reduce payloads arriving later into `buf` as they come off the wire
    /// (`buf[i] = op(buf[i], payload[i])`, whole elements), so that no payload is buffered whole; a
    /// message handed over as [`Received::Message`] is still the caller's to reduce. `recv_error`
    /// turns a failed wait into the caller's error (`buf` then holds partial results). The default
    /// posts nothing: it receives each message after `meanwhile` and hands it over as
    /// [`Received::Message`].
    #[allow(clippy::too_many_arguments)]
    fn recv_posted(
        &self,
        peer: usize,
        tag: &Tag,
        buf: &mut [u8],
        segment: usize,
        _reduce: Option<crate::Reducer>,
        deadline: Option<Instant>,
        meanwhile: &mut dyn FnMut() -> crate::Result<()>,
        each: &mut dyn FnMut(&mut [u8], Received) -> crate::Result<()>,
        recv_error: &dyn Fn(RecvError) -> crate::Error,
    ) -> crate::Result<()> {
        meanwhile()?;
        recv_each(
            self,
            peer,
            tag,
            buf.len(),
            segment,
            deadline,
            &mut |r, m| each(&mut buf[r], Received::Message(m)),
        )
        .map_err(recv_error)?
    }
    /// Gives back the payload of a received message once the caller is done with it; transports that
    /// read into pooled buffers reuse it (so steady traffic allocates nothing). The default drops it.
    fn recycle(&self, _payload: Vec<u8>) {}
    /// Memory shared by every rank of this transport's world, when they all run on one host and the
    /// transport maps one (the shared-memory transport does).
    fn arena(&self) -> Option<&dyn crate::Arena> {
        None
    }
}

/// Calls `poll` until it returns something, the deadline passes ([`RecvError::Timeout`]) or it fails:
/// at once a few times, then yielding the core, then sleeping (doubling from 20 µs to 1 ms) between
/// calls. For waits on several sources that no one condition variable covers.
pub fn poll_until<R>(
    deadline: Option<Instant>,
    mut poll: impl FnMut() -> Result<Option<R>, LinkFailure>,
) -> Result<R, RecvError> {
    let mut pause = Duration::from_micros(20);
    let mut tries = 0u32;
    loop {
        if let Some(r) = poll().map_err(RecvError::Link)? {
            return Ok(r);
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(RecvError::Timeout);
        }
        if tries < 64 {
            tries += 1;
            std::thread::yield_now();
            continue;
        }
        let left = deadline.map_or(pause, |d| d - now);
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// What [`Transport::recv_posted`] does where nothing is posted: receives the messages of a
/// `len`-byte posting of `segment`-byte messages one by one, handing each to `each` with its range.
/// The outer error is the failed wait; the inner one `each`'s.
pub fn recv_each<T: Transport + ?Sized>(
    t: &T,
    peer: usize,
    tag: &Tag,
    len: usize,
    segment: usize,
    deadline: Option<Instant>,
    each: &mut dyn FnMut(std::ops::Range<usize>, Message) -> crate::Result<()>,
) -> Result<crate::Result<()>, RecvError> {
    for r in segment_ranges(len, segment) {
        let m = t.recv(peer, tag, deadline)?;
        if let Err(e) = each(r, m) {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

/// The byte ranges of the messages a [`Transport::recv_posted`] of `len` bytes in `segment`-byte
/// messages receives: consecutive, each `segment` long but the last; one empty range when `len` is 0.
pub fn segment_ranges(len: usize, segment: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let seg = segment.max(1);
    let count = len.div_ceil(seg).max(1);
    (0..count).map(move |i| (i * seg).min(len)..((i + 1) * seg).min(len))
}
