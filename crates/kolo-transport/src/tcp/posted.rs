//! Receiving straight into the destination: posted receives (and, in `crate::pool`, the buffers of
//! the messages that arrive before their receive is posted).
//!
//! A rank in [`Transport::recv_posted`](kolo_core::Transport::recv_posted) first takes the messages
//! already queued (or being read) for its source and tag; then it posts the rest of its buffer here.
//! The peer's reader thread, having read a data frame's prefix, [claims](Posts::claim) the next
//! segment of the posting when the frame has the posting's tag and exactly the segment's length, and
//! reads the payload from the socket straight into it: no buffer allocated, no copy. Any other frame
//! for that tag closes the posting (it and everything after it go through the mailbox, in order). A
//! frame read while no posting waits is marked *in flight* until it is in the mailbox, so a receive
//! posted meanwhile takes it first: messages of one source and tag are received in the order they
//! were sent, whichever way each arrives.
//!
//! The receiver does not return while the reader writes into its buffer (the segment being written
//! is `busy`); a reader stops writing when its frame is complete or its connection fails, and a
//! silent peer's connection is shut down by the heartbeat watchdog, so the wait ends.

use std::ops::Range;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kolo_core::{Header, Mailbox, Message, RecvError, Reducer, Tag};

/// The unfilled rest of a posted buffer.
#[derive(Debug)]
struct Posting {
    tag: Tag,
    /// Start of the posted region; valid for `len` bytes while the posting exists (see
    /// [`Posts::post`]).
    base: *mut u8,
    len: usize,
    segment: usize,
    /// Reduce payloads into the region instead of writing them there.
    reduce: Option<Reducer>,
    /// Bytes filled so far (whole segments, from the start).
    filled: usize,
    /// Headers of the filled segments, in order.
    headers: Vec<Header>,
    /// A reader is writing the segment at `filled`.
    busy: bool,
    /// A frame that did not fit arrived: nothing more is claimed.
    closed: bool,
}

// SAFETY: the pointer is only dereferenced by the reader thread that claimed a segment, under the
// protocol described on `Posts::post`; the posting itself is just bookkeeping.
unsafe impl Send for Posting {}

#[derive(Debug, Default)]
struct Slot {
    /// The tag of a data frame its reader is reading into a buffer of its own (until delivered).
    in_flight: Option<Tag>,
    posting: Option<Posting>,
}

/// The posted receives of one transport, one slot per source rank.
#[derive(Debug)]
pub(super) struct Posts {
    slots: Vec<(Mutex<Slot>, Condvar)>,
}

/// A segment of a posted buffer that a reader has claimed: it writes the payload into
/// [`Claim::buf`] (or reduces it there with [`Claim::reduce`]), then reports with [`Posts::filled`].
pub(super) struct Claim {
    ptr: *mut u8,
    len: usize,
    /// The posting's reducer: the payload is reduced into the segment rather than written over it.
    pub(super) reduce: Option<Reducer>,
}

impl Claim {
    /// The claimed segment.
    pub(super) fn buf(&mut self) -> &mut [u8] {
        // SAFETY: `ptr..ptr + len` lies inside a posted buffer (`Posts::claim` checked it against
        // the posting's bounds) whose owner is blocked in `Posts::wait` / `Posts::unpost` until this
        // claim is reported filled (`busy` is set until then), and no one else writes there: one
        // reader per source, one claim at a time.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// What the receiving side of a posting ends up with.
pub(super) struct Outcome {
    /// Headers of the segments written in place, in order, from the start of the posted region.
    pub(super) direct: Vec<Header>,
}

impl Posts {
    pub(super) fn new(size: usize) -> Posts {
        Posts {
            slots: (0..size)
                .map(|_| (Mutex::new(Slot::default()), Condvar::new()))
                .collect(),
        }
    }

    fn lock(&self, peer: usize) -> MutexGuard<'_, Slot> {
        self.slots[peer].0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn notify(&self, peer: usize) {
        self.slots[peer].1.notify_all();
    }

    // --- the reader's side ---

    /// A data frame from `peer` with `header` and `len` payload bytes is next: the segment to read it
    /// into, or `None` (then the frame is in flight until [`Posts::delivered`]).
    pub(super) fn claim(&self, peer: usize, header: &Header, len: usize) -> Option<Claim> {
        let mut s = self.lock(peer);
        if let Some(p) = s.posting.as_mut() {
            if p.tag == header.tag && !p.closed && p.filled < p.len {
                let want = p.segment.min(p.len - p.filled);
                if len == want {
                    p.busy = true;
                    // SAFETY: `filled + want <= len`, so the result stays inside the posted region.
                    let ptr = unsafe { p.base.add(p.filled) };
                    return Some(Claim {
                        ptr,
                        len,
                        reduce: p.reduce,
                    });
                }
                p.closed = true;
                drop(s);
                self.notify(peer);
                s = self.lock(peer);
            }
        }
        s.in_flight = Some(header.tag);
        None
    }

    /// The claimed segment is written (`ok`) or its connection failed partway (its bytes are then
    /// garbage and the posting closes; the reader fails the mailbox).
    pub(super) fn filled(&self, peer: usize, claim: Claim, header: Header, ok: bool) {
        let mut s = self.lock(peer);
        if let Some(p) = s.posting.as_mut() {
            p.busy = false;
            if ok {
                p.filled += claim.len;
                p.headers.push(header);
            } else {
                p.closed = true;
            }
        }
        drop(s);
        self.notify(peer);
    }

    /// The frame in flight from `peer` is read: `msg` (`None` if its connection failed) goes into the
    /// mailbox and the frame stops being in flight at once, under the slot's lock, so that a receiver
    /// deciding whether to post sees the message either in flight or queued, never neither (nor a
    /// stale in-flight mark for a message it has already taken).
    pub(super) fn delivered(&self, mailbox: &Mailbox, peer: usize, msg: Option<Message>) {
        let mut s = self.lock(peer);
        if let Some(m) = msg {
            mailbox.deliver(peer, m);
        }
        s.in_flight = None;
        drop(s);
        self.notify(peer);
    }

    // --- the receiver's side ---

    /// Posts the part of `buf` after the messages from `peer` with `tag` that are already queued or
    /// being read (those take the mailbox), for the next messages, in segments of `segment` bytes
    /// (reduced into `buf` with `reduce` rather than written). `ranges` are the segments of `buf`.
    /// Returns how many segments, from the first, belong to messages already here or in flight;
    /// nothing is posted when that is all of them.
    ///
    /// The count and the posting are taken under the slot's lock, which a reader also holds to move
    /// a frame from in flight to queued and to claim: every later frame with `tag` finds the
    /// posting. The receiver never waits for a frame here, so it can send at once: on a slow link
    /// a frame takes long, and waiting for the peer's frames before sending its own would make the
    /// two directions of the link take turns.
    ///
    /// After a posting the caller must call [`Posts::unpost`] before it uses `buf` again or lets it
    /// go (the receive path of the transport does so on every path, errors included), since a
    /// reader may write into it until then.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn post(
        &self,
        mailbox: &Mailbox,
        peer: usize,
        tag: &Tag,
        buf: &mut [u8],
        ranges: &[Range<usize>],
        segment: usize,
        reduce: Option<Reducer>,
    ) -> usize {
        let mut s = self.lock(peer);
        let here = mailbox.queued(peer, tag) + usize::from(s.in_flight == Some(*tag));
        let Some(first) = ranges.get(here) else {
            return ranges.len();
        };
        let rest = &mut buf[first.start..];
        s.posting = Some(Posting {
            tag: *tag,
            base: rest.as_mut_ptr(),
            len: rest.len(),
            segment: segment.max(1),
            reduce,
            filled: 0,
            headers: Vec::new(),
            busy: false,
            closed: false,
        });
        here
    }

    /// Waits until the posting from `peer` is filled or closed, the mailbox fails or `deadline`
    /// passes; whatever the outcome, ends the posting once no reader writes into it (a failed
    /// connection or the heartbeat watchdog stops a reader that is mid-segment).
    pub(super) fn unpost(
        &self,
        mailbox: &Mailbox,
        peer: usize,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Outcome, RecvError> {
        let mut s = self.lock(peer);
        let mut verdict = Ok(());
        loop {
            let Some(p) = s.posting.as_ref() else {
                return Ok(Outcome { direct: Vec::new() });
            };
            let settled = p.filled == p.len || p.closed;
            if !p.busy && (settled || !wait || verdict.is_err()) {
                break;
            }
            if verdict.is_ok() && wait && !settled {
                if let Some(f) = mailbox.failure() {
                    verdict = Err(RecvError::Link(f));
                } else if deadline.is_some_and(|d| Instant::now() >= d) {
                    verdict = Err(RecvError::Timeout);
                }
                if verdict.is_err() && !p.busy {
                    break;
                }
            }
            // A failure of another link notifies the mailbox, not this slot: look again now and then.
            let tick = Duration::from_millis(20);
            s = self.slots[peer]
                .1
                .wait_timeout(s, tick)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let p = s.posting.take();
        drop(s);
        verdict?;
        Ok(Outcome {
            direct: p.map(|p| p.headers).unwrap_or_default(),
        })
    }
}
