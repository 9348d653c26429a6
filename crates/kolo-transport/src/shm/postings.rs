//! Receives posted ahead of their messages ([`Transport::post_recv`], kolo.MPI's `Irecv`): the
//! table of postings, and how a message reaches one.
//!
//! A posting waits in the table under its peer and tag. Whichever call of this rank next drains
//! the peer's ring (a wait of any kind: the posting's own, a send waiting for ring space, another
//! receive) matches the peer's next message with that tag to the oldest posting of the two and
//! writes its payload straight into the posting's buffer — from the ring as it streams in, or,
//! for a message sent in place, straight out of the sender's memory — instead of into a mailbox
//! buffer to be copied again when the receive is waited on. A message that arrived before its
//! posting, still queued in the mailbox, is the posting's at once. Every write into a posting's
//! buffer happens under its peer's consumer lock, which the withdrawal of a posting also takes:
//! after [`Transport::unpost_recv`] nothing touches the buffer.
//!
//! [`Transport::post_recv`]: kolo_core::Transport::post_recv
//! [`Transport::unpost_recv`]: kolo_core::Transport::unpost_recv

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use kolo_core::{Header, LinkFailure, Message, RecvError, Tag};

use super::health::STATE_ALIVE;
use super::ring::Partial;
use super::single_copy::{Batch, READ_CHUNK};
use super::word_hash::WordHash;
use super::{lock, ShmTransport};

/// What a posting's wait reports: the message's header and length, or the failure that ended it.
pub(super) type Outcome = Result<(Header, usize), LinkFailure>;

/// The postings of one endpoint.
#[derive(Debug, Default)]
pub(super) struct Postings {
    /// Postings waiting for their message: zero lets a drain skip the table.
    waiting: AtomicUsize,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    /// The waiting postings per (peer, tag), oldest first.
    queues: HashMap<(usize, Tag), VecDeque<u64>, WordHash>,
    entries: HashMap<u64, Entry, WordHash>,
}

#[derive(Debug)]
enum Entry {
    Waiting {
        peer: usize,
        claim: Claim,
    },
    /// A drain is reading its message (the peer's consumer holds the claim).
    Filling {
        peer: usize,
    },
    Done(Outcome),
}

/// A posting matched to a message: where the payload goes, `cap` bytes at `addr`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Claim {
    pub(super) id: u64,
    pub(super) addr: usize,
    pub(super) cap: usize,
}

impl Claim {
    /// The posting's first `len` bytes, for its message's payload.
    ///
    /// # Safety
    /// The posting must hold (the caller holds its peer's consumer lock and the claim) and `len`
    /// must be at most `cap`.
    pub(super) unsafe fn bytes<'a>(&self, at: usize, len: usize) -> &'a mut [u8] {
        debug_assert!(at + len <= self.cap);
        // SAFETY: per this function's contract and `post_recv`'s.
        unsafe { std::slice::from_raw_parts_mut((self.addr + at) as *mut u8, len) }
    }

    /// Writes a whole message's `payload` into the posting if it fits (one too long is left
    /// out: the caller reports its length).
    ///
    /// # Safety
    /// As [`Claim::bytes`]: the posting must hold.
    pub(super) unsafe fn fill(&self, payload: &[u8]) {
        if payload.len() <= self.cap {
            // SAFETY: per this function's contract; it fits.
            unsafe { self.bytes(0, payload.len()) }.copy_from_slice(payload);
        }
    }
}

impl Postings {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        lock(&self.table)
    }

    fn add(&self, peer: usize, entry: impl FnOnce(u64) -> Entry, tag: Option<&Tag>) -> u64 {
        let mut t = self.table();
        let id = t.next;
        t.next += 1;
        t.entries.insert(id, entry(id));
        if let Some(tag) = tag {
            t.queues.entry((peer, *tag)).or_default().push_back(id);
            self.waiting.fetch_add(1, Ordering::Release);
        }
        id
    }

    /// The oldest posting waiting for the next message from `peer` with `tag`, now claimed by the
    /// caller, who holds the peer's consumer lock and must [`Postings::finish`] it.
    pub(super) fn claim(&self, peer: usize, tag: &Tag) -> Option<Claim> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut t = self.table();
        let q = t.queues.get_mut(&(peer, *tag))?;
        let id = q.pop_front()?;
        if q.is_empty() {
            t.queues.remove(&(peer, *tag));
        }
        self.waiting.fetch_sub(1, Ordering::Release);
        let entry = t.entries.insert(id, Entry::Filling { peer });
        match entry {
            Some(Entry::Waiting { claim, .. }) => Some(claim),
            _ => None,
        }
    }

    /// Whether a posting waits for a message from `peer` with `tag`.
    pub(super) fn waiting_for(&self, peer: usize, tag: &Tag) -> bool {
        self.waiting.load(Ordering::Acquire) > 0 && self.table().queues.contains_key(&(peer, *tag))
    }

    /// Completes a claimed posting (one withdrawn meanwhile is gone: nothing to note).
    pub(super) fn finish(&self, id: u64, outcome: Outcome) {
        let mut t = self.table();
        if let Some(e) = t.entries.get_mut(&id) {
            *e = Entry::Done(outcome);
        }
    }

    /// The outcome of a completed posting (removing it), `Ok(None)` while it waits; an unknown
    /// posting is an error.
    fn take_done(&self, id: u64) -> Result<Option<Outcome>, LinkFailure> {
        let mut t = self.table();
        match t.entries.get(&id) {
            Some(Entry::Done(_)) => match t.entries.remove(&id) {
                Some(Entry::Done(o)) => Ok(Some(o)),
                _ => Ok(None),
            },
            Some(_) => Ok(None),
            None => Err(LinkFailure::PeerLost {
                peer: usize::MAX,
                reason: format!("no receive posted as {id} (completed or withdrawn already)"),
            }),
        }
    }

    /// The posting's peer and tag while it waits or fills.
    fn peer_of(&self, id: u64) -> Option<usize> {
        match self.table().entries.get(&id) {
            Some(Entry::Waiting { peer, .. } | Entry::Filling { peer }) => Some(*peer),
            _ => None,
        }
    }
}

impl ShmTransport {
    /// [`Transport::post_recv`](kolo_core::Transport::post_recv).
    pub(super) fn add_posting(
        &self,
        peer: usize,
        tag: &Tag,
        addr: usize,
        cap: usize,
    ) -> Result<Option<u64>, LinkFailure> {
        if peer == self.rank || peer >= self.layout.n {
            return Ok(None);
        }
        // Under the consumer lock no drain delivers from `peer`: what the mailbox holds for the
        // tag now is all that came before the posting.
        let _c = lock(&self.consumers[peer]);
        let claim = Claim { id: 0, addr, cap };
        if let Ok(Some(m)) = self.mailbox.try_recv(peer, tag) {
            let len = m.payload.len();
            // SAFETY: the caller's contract (`post_recv`).
            unsafe { claim.fill(&m.payload) };
            self.pool.put(m.payload);
            return Ok(Some(self.postings.add(
                peer,
                |_| Entry::Done(Ok((m.header, len))),
                None,
            )));
        }
        let id = self.postings.add(
            peer,
            |id| Entry::Waiting {
                peer,
                claim: Claim { id, ..claim },
            },
            Some(tag),
        );
        Ok(Some(id))
    }

    /// [`Transport::posted_recv`](kolo_core::Transport::posted_recv).
    pub(super) fn wait_posting(
        &self,
        id: u64,
        block: bool,
        deadline: Option<Instant>,
    ) -> Result<Option<(Header, usize)>, RecvError> {
        let done = |o: Outcome| o.map(Some).map_err(RecvError::Link);
        if let Some(o) = self.postings.take_done(id).map_err(RecvError::Link)? {
            return done(o);
        }
        let Some(peer) = self.postings.peer_of(id) else {
            // Completed since.
            return match self.postings.take_done(id).map_err(RecvError::Link)? {
                Some(o) => done(o),
                None => Ok(None),
            };
        };
        let poll = || -> Option<Result<Outcome, LinkFailure>> {
            self.progress();
            if self.state_word(peer, 0).load(Ordering::Acquire) != STATE_ALIVE {
                self.check_peer(peer);
            }
            // The link's end as seen before the last look at the posting: a message delivered
            // before the end is found by that look.
            let ended = self.mailbox.failure().or_else(|| {
                // Closed cleanly and its ring read to the end: the message will never come.
                self.mailbox
                    .is_closed(peer)
                    .then_some(LinkFailure::PeerClosed { peer })
            });
            match self.postings.take_done(id) {
                Ok(Some(o)) => Some(Ok(o)),
                Err(f) => Some(Err(f)),
                Ok(None) => ended.map(Err),
            }
        };
        let got = if block {
            self.wait_for(deadline, poll)?
        } else {
            match poll() {
                Some(got) => got,
                None => return Ok(None),
            }
        };
        if got.is_err() {
            // A failed posting is gone, as a completed one is.
            self.remove_posting(id);
        }
        done(got.map_err(RecvError::Link)?)
    }

    /// [`Transport::unpost_recv`](kolo_core::Transport::unpost_recv).
    pub(super) fn remove_posting(&self, id: u64) {
        let Some(peer) = self.postings.peer_of(id) else {
            self.postings.table().entries.remove(&id);
            return;
        };
        let mut c = lock(&self.consumers[peer]);
        let mut t = self.postings.table();
        match t.entries.remove(&id) {
            Some(Entry::Waiting { .. }) => {
                for q in t.queues.values_mut() {
                    q.retain(|&p| p != id);
                }
                t.queues.retain(|_, q| !q.is_empty());
                self.postings.waiting.fetch_sub(1, Ordering::Release);
            }
            Some(Entry::Filling { .. }) => {
                // The message being read goes on into a buffer of its own, for the mailbox.
                if let Some(p) = c.partial.as_mut() {
                    self.unclaim(p, id);
                }
            }
            _ => {}
        }
    }

    /// Moves the bytes a withdrawn posting `id` holds of `p`'s message into a buffer of its own.
    fn unclaim(&self, p: &mut Partial, id: u64) {
        let Some(claim) = p.posting.filter(|c| c.id == id) else {
            return;
        };
        p.posting = None;
        if p.len <= claim.cap {
            let mut buf = self.pool.take(p.len);
            buf.clear();
            // SAFETY: the posting held until now (the caller holds the consumer lock).
            buf.extend_from_slice(unsafe { claim.bytes(0, p.got) });
            p.buf = buf;
        }
    }

    /// A whole message from `src`: into the oldest posting waiting for it, else the mailbox.
    pub(super) fn deliver(&self, src: usize, msg: Message) {
        match self.postings.claim(src, &msg.header.tag) {
            Some(claim) => {
                let len = msg.payload.len();
                // SAFETY: claimed under the consumer lock, which the caller holds.
                unsafe { claim.fill(&msg.payload) };
                self.pool.put(msg.payload);
                self.postings.finish(claim.id, Ok((msg.header, len)));
            }
            None => self.mailbox.deliver(src, msg),
        }
    }

    /// Completes the message `p` from `src` once all of it is read.
    pub(super) fn complete(&self, src: usize, p: Partial) {
        let Partial {
            header,
            len,
            posting,
            buf,
            ..
        } = p;
        let Some(claim) = posting else {
            return self.deliver(
                src,
                Message {
                    header,
                    payload: buf,
                },
            );
        };
        self.screen_direct(src, &header);
        self.pool.put(buf);
        self.postings.finish(claim.id, Ok((header, len)));
    }

    /// Copies the message in place from `src` at `addr` into the posting waiting for it, if one
    /// does: `None` if none does (the caller reads it for the mailbox, after `batch`), else
    /// whether the copy succeeded (a failure is the mailbox's, and the posting's). A message that
    /// fits its posting joins `batch` (copied when it is full, or by the caller's
    /// [`flush_in_place`](Self::flush_in_place)); others are copied at once, after it.
    pub(super) fn in_place_to_posting(
        &self,
        src: usize,
        batch: &mut Batch,
        header: Header,
        (addr, len): (u64, usize),
    ) -> Option<bool> {
        let claim = self.postings.claim(src, &header.tag)?;
        if len <= claim.cap && len <= READ_CHUNK {
            return Some(self.batch_in_place(src, batch, (claim, header), (addr, len)));
        }
        if !self.flush_in_place(src, batch) {
            let failure = self.mailbox.failure();
            self.postings.finish(
                claim.id,
                Err(failure.unwrap_or(LinkFailure::PeerClosed { peer: src })),
            );
            return Some(false);
        }
        let copied = if len <= claim.cap {
            // SAFETY: claimed under the consumer lock, which the caller holds; it fits.
            self.copy_in_place(src, addr, unsafe { claim.bytes(0, len) })
        } else {
            // Too long for the posting: read (the sender waits for it) and dropped.
            self.copy_in_place_vec(src, addr, len)
                .map(|b| self.pool.put(b))
        };
        let ok = copied.is_ok();
        if ok {
            self.screen_direct(src, &header);
        }
        self.postings
            .finish(claim.id, copied.map(|()| (header, len)));
        Some(ok)
    }

    /// A new message from `src` whose payload streams in from the ring: into the posting waiting
    /// for it when there is one (and it fits), else into a pooled buffer.
    pub(super) fn start_partial(
        &self,
        src: usize,
        header: Header,
        len: usize,
        rewind: bool,
    ) -> Partial {
        let posting = self.postings.claim(src, &header.tag);
        let buf = if posting.is_some_and(|c| len <= c.cap) {
            Vec::new()
        } else {
            // Never trust the length for the allocation: grow as bytes arrive.
            let mut buf = self.pool.take(len);
            buf.clear();
            buf.reserve(len.min(self.layout.ring));
            buf
        };
        Partial {
            header,
            len,
            got: 0,
            posting,
            buf,
            rewind,
        }
    }
}
