//! The byte-moving interface every transport implements, and the [`Mailbox`] they share for matching
//! incoming messages to receives.
//!
//! Collective algorithms are written once against [`Transport`] and so run unchanged on threads, shared
//! memory and TCP. The contract is small:
//!
//! - `send` is *buffered*: it returns once the payload has been handed to the transport and never waits
//!   for the peer to post a receive, so a schedule in which every rank sends before it receives cannot
//!   deadlock;
//! - messages from one peer with one tag arrive in the order they were sent;
//! - once a link fails (a peer died, a peer aborted, a protocol error), every receive returns that failure.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::call::{Call, Header, Tag};
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
    /// Waits for the next message from `peer` with `tag`, until `deadline` (`None`: forever).
    fn recv(&self, peer: usize, tag: &Tag, deadline: Option<Instant>)
        -> Result<Message, RecvError>;
    /// Returns the next message from `peer` with `tag` if one has arrived.
    fn try_recv(&self, peer: usize, tag: &Tag) -> Result<Option<Message>, LinkFailure>;
    /// Fails this endpoint and tells every peer that this rank aborted with `reason`; their pending
    /// and later receives fail with [`LinkFailure::Aborted`]. Idempotent.
    fn abort(&self, reason: &str);
    /// The failure that broke this endpoint, if any.
    fn failure(&self) -> Option<LinkFailure>;
    /// This rank enters the collective of `header` (see [`Mailbox::expect`]); transports with a
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

#[derive(Debug, Default)]
struct MailboxState {
    queues: HashMap<(usize, Tag), VecDeque<Message>>,
    failure: Option<LinkFailure>,
    closed: Vec<bool>,
    /// The fingerprints of the collectives this rank is in or has recently been in, by tag (see
    /// [`Mailbox::expect`]), and their tags, oldest first.
    expected: HashMap<Tag, Call>,
    expected_order: VecDeque<Tag>,
}

/// How many finished collectives a mailbox remembers, to catch mismatched messages that arrive late.
const REMEMBERED_CALLS: usize = 256;

impl MailboxState {
    /// Fails the mailbox if `msg` belongs to a collective this rank is in but was sent by a
    /// different call.
    fn screen(&mut self, src: usize, header: &Header) -> bool {
        match self.expected.get(&header.tag) {
            Some(call) if *call != header.call => {
                if self.failure.is_none() {
                    self.failure = Some(LinkFailure::Mismatch {
                        peer: src,
                        local: *call,
                        remote: header.call,
                        tag: header.tag,
                    });
                }
                true
            }
            _ => false,
        }
    }
}

/// Incoming messages of one rank, keyed by (source, tag), with waiting, deadlines and failure.
///
/// Transports deliver into it from wherever bytes arrive (a reader thread, another thread's `send`)
/// and implement `recv`/`try_recv` with it.
#[derive(Debug)]
pub struct Mailbox {
    state: Mutex<MailboxState>,
    cond: Condvar,
    /// Set once a failure is recorded: lets [`Mailbox::failure`] answer the common case unlocked.
    failed: AtomicBool,
}

impl Mailbox {
    /// An empty mailbox for a world of `size` ranks.
    pub fn new(size: usize) -> Self {
        Mailbox {
            state: Mutex::new(MailboxState {
                closed: vec![false; size],
                expected: HashMap::new(),
                expected_order: VecDeque::new(),
                ..MailboxState::default()
            }),
            cond: Condvar::new(),
            failed: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, MailboxState> {
        // A panic while holding this lock cannot leave the queues inconsistent (every critical section
        // is a single insert or remove), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a message from `src`.
    pub fn deliver(&self, src: usize, msg: Message) {
        let mut s = self.lock();
        if s.screen(src, &msg.header) {
            self.failed.store(true, Ordering::Release);
        }
        s.queues
            .entry((src, msg.header.tag))
            .or_default()
            .push_back(msg);
        drop(s);
        self.cond.notify_all();
    }

    /// Screens a message from `src` whose payload a transport wrote straight into a posted buffer
    /// (it never enters the queues): a different call under an expected tag fails the mailbox, as
    /// [`Mailbox::deliver`] would.
    pub fn screen(&self, src: usize, header: &Header) {
        let failed = self.lock().screen(src, header);
        if failed {
            self.failed.store(true, Ordering::Release);
            self.cond.notify_all();
        }
    }

    /// How many messages from `src` with `tag` are queued.
    pub fn queued(&self, src: usize, tag: &Tag) -> usize {
        self.lock().queues.get(&(src, *tag)).map_or(0, |q| q.len())
    }

    /// Notes that this rank is now in the collective of `header`: a message with its tag from a
    /// different call (already queued, arriving during the call or after it) fails the mailbox with
    /// [`LinkFailure::Mismatch`] at once, even when this rank is waiting on another peer — so ranks in
    /// different collectives fail even when the mismatched messages are not the ones being waited for.
    /// The fingerprints of the last 256 collectives are remembered, so a mismatched message that
    /// arrives after this rank has finished the call still fails the mailbox.
    pub fn expect(&self, header: &Header) {
        let mut s = self.lock();
        // A message of this collective already queued from a different call (no allocation: this
        // runs on every collective).
        let early = s
            .queues
            .iter()
            .filter(|((_, tag), _)| *tag == header.tag)
            .flat_map(|((src, _), q)| q.iter().map(move |m| (*src, m.header)))
            .find(|(_, h)| h.call != header.call);
        if s.expected.insert(header.tag, header.call).is_none() {
            s.expected_order.push_back(header.tag);
            while s.expected_order.len() > REMEMBERED_CALLS {
                if let Some(old) = s.expected_order.pop_front() {
                    s.expected.remove(&old);
                }
            }
        }
        let failed = early.is_some_and(|(src, h)| s.screen(src, &h));
        drop(s);
        if failed {
            self.failed.store(true, Ordering::Release);
            self.cond.notify_all();
        }
    }

    /// Marks `peer` as cleanly closed: its queued messages can still be received, then receives from it
    /// fail with [`LinkFailure::PeerClosed`].
    pub fn close_peer(&self, peer: usize) {
        let mut s = self.lock();
        if let Some(c) = s.closed.get_mut(peer) {
            *c = true;
        }
        drop(s);
        self.cond.notify_all();
    }

    /// Fails the mailbox; the first failure sticks and wakes every waiter.
    pub fn fail(&self, failure: LinkFailure) {
        let mut s = self.lock();
        if s.failure.is_none() {
            s.failure = Some(failure);
        }
        self.failed.store(true, Ordering::Release);
        drop(s);
        self.cond.notify_all();
    }

    /// The failure, if any.
    pub fn failure(&self) -> Option<LinkFailure> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.lock().failure.clone()
    }

    /// Waits up to `timeout` for a failure to be recorded and returns it. A transport whose send to a
    /// peer fails uses this to give the peer's reader a moment to deliver the reason (an abort frame
    /// that says why the peer went away) before falling back to a bare "connection lost".
    pub fn wait_failure(&self, timeout: std::time::Duration) -> Option<LinkFailure> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            if let Some(f) = &s.failure {
                return Some(f.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            s = self
                .cond
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// A message that arrived before a failure is still delivered (messages and failures keep the
    /// order the peer sent them in); after that, the failure.
    fn take(s: &mut MailboxState, src: usize, tag: &Tag) -> Result<Option<Message>, LinkFailure> {
        let key = (src, *tag);
        if let Some(q) = s.queues.get_mut(&key) {
            if let Some(m) = q.pop_front() {
                if q.is_empty() {
                    s.queues.remove(&key);
                }
                return Ok(Some(m));
            }
        }
        if let Some(f) = &s.failure {
            return Err(f.clone());
        }
        if s.closed.get(src).copied().unwrap_or(false) {
            return Err(LinkFailure::PeerClosed { peer: src });
        }
        Ok(None)
    }

    /// Returns the next message from `src` with `tag` if there is one.
    pub fn try_recv(&self, src: usize, tag: &Tag) -> Result<Option<Message>, LinkFailure> {
        Mailbox::take(&mut self.lock(), src, tag)
    }

    /// Waits for the next message from `src` with `tag` until `deadline`.
    pub fn recv(
        &self,
        src: usize,
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<Message, RecvError> {
        let mut s = self.lock();
        loop {
            if let Some(m) = Mailbox::take(&mut s, src, tag).map_err(RecvError::Link)? {
                return Ok(m);
            }
            s = match deadline {
                None => self.cond.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(RecvError::Timeout);
                    }
                    self.cond
                        .wait_timeout(s, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{Algorithm, Call, OpKind, TagSpace};
    use std::sync::Arc;
    use std::time::Duration;

    fn header(value: u64) -> Header {
        Header {
            ack: false,
            tag: Tag {
                group: 1,
                space: TagSpace::P2p,
                value,
            },
            call: Call::new(OpKind::Send, Algorithm::Direct),
        }
    }

    #[test]
    fn fifo_per_source_and_tag() {
        let mb = Mailbox::new(2);
        for (i, t) in [(1u8, 7), (2, 8), (3, 7)] {
            mb.deliver(
                1,
                Message {
                    header: header(t),
                    payload: vec![i],
                },
            );
        }
        let tag7 = header(7).tag;
        assert_eq!(mb.recv(1, &tag7, None).map(|m| m.payload), Ok(vec![1]));
        assert_eq!(mb.recv(1, &tag7, None).map(|m| m.payload), Ok(vec![3]));
        assert!(matches!(mb.try_recv(0, &tag7), Ok(None)));
        assert_eq!(
            mb.recv(1, &header(8).tag, None).map(|m| m.payload),
            Ok(vec![2])
        );
    }

    #[test]
    fn deadline_and_failure_wake_waiters() {
        let mb = Arc::new(Mailbox::new(2));
        let t = Instant::now();
        let r = mb.recv(1, &header(1).tag, Some(t + Duration::from_millis(50)));
        assert!(matches!(r, Err(RecvError::Timeout)));
        assert!(t.elapsed() >= Duration::from_millis(50));

        let mb2 = mb.clone();
        let h = std::thread::spawn(move || mb2.recv(1, &header(1).tag, None));
        std::thread::sleep(Duration::from_millis(20));
        mb.fail(LinkFailure::PeerLost {
            peer: 1,
            reason: "eof".into(),
        });
        let r = h.join().map_err(|_| "panicked");
        assert!(matches!(
            r,
            Ok(Err(RecvError::Link(LinkFailure::PeerLost { peer: 1, .. })))
        ));
    }

    #[test]
    fn closed_peer_drains_then_fails() {
        let mb = Mailbox::new(2);
        mb.deliver(
            1,
            Message {
                header: header(1),
                payload: vec![9],
            },
        );
        mb.close_peer(1);
        assert!(mb.recv(1, &header(1).tag, None).is_ok());
        assert!(matches!(
            mb.recv(1, &header(1).tag, None),
            Err(RecvError::Link(LinkFailure::PeerClosed { peer: 1 }))
        ));
    }
}
