//! Receiving straight from a ring into a posted buffer ([`Transport::recv_posted`]).
//!
//! A message travels through its pair's ring either way; what a posted receive saves is everything
//! after the ring: the mailbox's payload buffer (an allocation, and for a large message fresh pages
//! to fault in), the copy into it and the copy out of it. When the next message of the incoming
//! ring is the one the posting waits for — its tag, exactly the segment's length — and the mailbox
//! holds nothing earlier for that source and tag, the receiving thread takes the ring's consumer
//! lock and copies the payload from the ring into its buffer as the sender streams it in, releasing
//! ring space as it goes (so a message longer than the ring is pipelined, as before). Anything
//! else — a message of another tag or length, one already half read into the mailbox, one queued
//! before the receive was posted — goes through the mailbox as it always has, in order.
//!
//! [`Transport::recv_posted`]: kolo_core::Transport::recv_posted

use std::sync::atomic::Ordering;
use std::time::Instant;

use kolo_core::{segment_ranges, Header, LinkFailure, Received, RecvError, Tag, TagSpace};

use super::health::STATE_ALIVE;
use super::prefix::Prefix;
use super::ring::{read_prefix, Consumer, Partial};
use super::{lock, ShmTransport};

/// A posted receive's callbacks, as [`Transport::recv_posted`](kolo_core::Transport::recv_posted)
/// takes them.
pub(super) type Each<'a> = &'a mut dyn FnMut(&mut [u8], Received) -> kolo_core::Result<()>;

impl ShmTransport {
    /// [`Transport::recv_posted`](kolo_core::Transport::recv_posted) without a reducer, from a peer.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn recv_posted_direct(
        &self,
        peer: usize,
        tag: &Tag,
        buf: &mut [u8],
        segment: usize,
        deadline: Option<Instant>,
        each: Each<'_>,
        recv_error: &dyn Fn(RecvError) -> kolo_core::Error,
    ) -> kolo_core::Result<()> {
        for r in segment_ranges(buf.len(), segment) {
            let dst = &mut buf[r];
            let got = self
                .take_posted(peer, tag, dst, deadline)
                .map_err(recv_error)?;
            each(dst, got)?;
        }
        Ok(())
    }

    /// The next message from `peer` with `tag`: the one queued in the mailbox, or, when the ring's
    /// next message is it and has `dst`'s length, its payload read straight into `dst`.
    fn take_posted(
        &self,
        peer: usize,
        tag: &Tag,
        dst: &mut [u8],
        deadline: Option<Instant>,
    ) -> Result<Received, RecvError> {
        loop {
            if let Some(m) = self.mailbox.try_recv(peer, tag).map_err(RecvError::Link)? {
                return Ok(Received::Message(m));
            }
            {
                let mut c = lock(&self.consumers[peer]);
                // Nothing has arrived from a live peer: nothing to drain. (Draining then would send
                // a message that arrives meanwhile through the mailbox, not straight here.)
                let mut idle = false;
                if c.partial.is_none() {
                    match self.peek(peer) {
                        Some(Ok(p)) => {
                            // (A posting waiting for the same messages takes them first.)
                            if p.header.tag == *tag
                                && p.len == dst.len()
                                && !self.postings.waiting_for(peer, tag)
                            {
                                if !p.in_place {
                                    return self.read_direct(peer, &mut c, p, dst, deadline);
                                }
                                if let Some(got) = self.read_in_place(peer, p, dst) {
                                    return got;
                                }
                            }
                        }
                        None => {
                            idle = self.state_word(peer, 0).load(Ordering::Acquire) == STATE_ALIVE;
                        }
                        Some(Err(_)) => {}
                    }
                }
                // The message that comes first goes to the mailbox (a clean close or a bad prefix is
                // noted), and the posting looks again at the one after it.
                if !idle && self.drain(peer, &mut c, true) {
                    self.bell(self.rank).ring();
                }
            }
            if let Some(m) = self.mailbox.try_recv(peer, tag).map_err(RecvError::Link)? {
                return Ok(Received::Message(m));
            }
            // Wait until the ring has a new message, the mailbox one for us, or the peer is gone;
            // keep the other incoming rings moving meanwhile.
            self.wait_for(deadline, || {
                // New bytes: a message's prefix (a sender publishes a prefix whole) or more of the
                // message being read into the mailbox.
                let ring = self.ring(peer, self.rank);
                let head = ring.consumer_position();
                ring.prefetch(head);
                let avail = ring.available(head);
                if avail > 0 {
                    ring.prefetch_span(head, avail);
                    return Some(());
                }
                if self.state_word(peer, 0).load(Ordering::Acquire) != STATE_ALIVE {
                    // Aborted or lost: noted in the mailbox, which the next look reports; closed:
                    // the drain notes it once the ring is read to the end.
                    self.check_peer(peer);
                    return Some(());
                }
                self.progress_except(Some(peer));
                (self.mailbox.queued(peer, tag) > 0 || self.mailbox.failure().is_some())
                    .then_some(())
            })?;
        }
    }

    /// The prefix of the next message in `peer`'s ring, if it has arrived whole. The caller holds the
    /// ring's consumer lock.
    fn peek(&self, peer: usize) -> Option<Result<Prefix, String>> {
        let ring = self.ring(peer, self.rank);
        let head = ring.consumer_position();
        let avail = ring.available(head);
        // SAFETY: the caller holds the ring's consumer lock.
        unsafe { read_prefix(&ring, head, avail, self.opts.max_message) }
    }

    /// Copies the payload of the ring's next message, one sent in place (whose prefix
    /// [`Self::peek`] decoded), straight from the sender's memory into `dst`; `None` if its address
    /// has not arrived (the sender publishes both at once: never). The caller holds the ring's
    /// consumer lock.
    fn read_in_place(
        &self,
        peer: usize,
        Prefix { header, bytes, .. }: Prefix,
        dst: &mut [u8],
    ) -> Option<Result<Received, RecvError>> {
        let head = self.ring(peer, self.rank).consumer_position();
        let (addr, _) = self.take_in_place(peer, head, bytes)?;
        Some(match self.copy_in_place(peer, addr, dst) {
            Ok(()) => Ok(self.direct(peer, header)),
            Err(f) => Err(RecvError::Link(f)),
        })
    }

    /// A message read straight into the posted buffer, screened (see [`Self::screen_direct`]).
    fn direct(&self, peer: usize, header: Header) -> Received {
        self.screen_direct(peer, &header);
        Received::Direct(header)
    }

    /// Screens a message from `peer` written straight into a receive's buffer (it never enters
    /// the mailbox) as the mailbox screens those it delivers: only collectives' tags, since
    /// point-to-point ones are never expected.
    pub(super) fn screen_direct(&self, peer: usize, header: &Header) {
        if header.tag.space != TagSpace::P2p {
            self.mailbox.screen(peer, header);
        }
    }

    /// Reads the payload of the ring's next message (whose prefix [`Self::peek`] decoded) into `dst`
    /// as it arrives. Should the wait end early (deadline, failure), what was read becomes the
    /// message's partial payload, which later drains finish into the mailbox: the ring stays in step.
    #[inline(always)]
    fn read_direct(
        &self,
        peer: usize,
        c: &mut Consumer,
        Prefix {
            header,
            rewind,
            bytes,
            ..
        }: Prefix,
        dst: &mut [u8],
        deadline: Option<Instant>,
    ) -> Result<Received, RecvError> {
        let ring = self.ring(peer, self.rank);
        // The prefix is given back with the payload's first bytes (or at an early end).
        let mut head = ring.consumer_position() + bytes as u64;
        let mut done = 0;
        loop {
            let take = ring.available(head).min(dst.len() - done).min(self.chunk());
            if take > 0 {
                // SAFETY: this thread holds the ring's consumer lock; `available` covers the bytes.
                unsafe { ring.read(head, &mut dst[done..done + take]) };
                head += take as u64;
                done += take;
            }
            if done == dst.len() {
                head = super::ring::after(head, rewind, ring.capacity());
            }
            if take > 0 || done == dst.len() {
                ring.release(head);
                self.bell(peer).ring();
            }
            if done == dst.len() {
                return Ok(self.direct(peer, header));
            }
            // A stream that keeps coming never makes the wait below long enough to see the
            // deadline: look at it here too.
            let late = deadline.is_some_and(|d| Instant::now() >= d);
            let waited = if late {
                Err(RecvError::Timeout)
            } else {
                self.wait_for(deadline, || {
                    self.progress_except(Some(peer));
                    if ring.available(head) > 0 {
                        return Some(Ok(()));
                    }
                    if self.state_word(peer, 0).load(Ordering::Acquire) != STATE_ALIVE {
                        // A peer closes only after its sends are in the ring: this one died mid-message.
                        self.check_peer(peer);
                        let f = self.mailbox.failure().unwrap_or(LinkFailure::PeerLost {
                            peer,
                            reason: "it went away in the middle of a message".into(),
                        });
                        return Some(Err(RecvError::Link(f)));
                    }
                    None
                })
            };
            if let Err(e) = waited.and_then(|r| r) {
                ring.release(head);
                c.partial = Some(Partial {
                    header,
                    len: dst.len(),
                    got: done,
                    posting: None,
                    buf: dst[..done].to_vec(),
                    rewind,
                });
                return Err(e);
            }
        }
    }
}
