//! [`Ctx`]: what an algorithm knows about the collective it runs — its group, its tag and fingerprint,
//! its deadline — and the checked send/receive it uses.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use kolo_core::{
    Arena, Error, Header, Message, OpKind, Received, RecvError, Reducer, Result, Tag, TagSpace,
    Transport,
};

/// One collective call on one rank, as seen by an algorithm.
///
/// Ranks here are group ranks (`0..size`); `members` maps them to transport ranks. Every message is
/// sent with this call's [`Header`]; every receive checks that the sender's fingerprint equals ours and
/// that the payload has the expected length, so ranks that disagree get [`Error::Mismatch`] or
/// [`Error::MessageLength`] instead of a hang or garbage.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// The transport.
    pub transport: &'a dyn Transport,
    /// Group rank → transport rank.
    pub members: &'a [usize],
    /// This rank in the group.
    pub rank: usize,
    /// Tag and fingerprint of this call.
    pub header: Header,
    /// When the call started.
    pub started: Instant,
    /// When waiting for a peer becomes an error (`None`: never).
    pub deadline: Option<Instant>,
    /// Memory shared by the whole group, when it has one (then every collective starts with
    /// [`crate::algorithms::allreduce_shm::confirm`]).
    pub arena: Option<&'a dyn Arena>,
    /// Messages received so far in this call.
    pub received: AtomicUsize,
    /// Peers this rank sent to before receiving anything, in a collective where some rank only sends:
    /// they confirm acceptance, and [`Ctx::finish`] waits for that.
    pub awaiting: Mutex<Vec<usize>>,
    /// Whether pure senders ask for confirmation (on unless turned off to measure its cost).
    pub confirm: bool,
}

/// The fewest bytes of a block that the pairwise and linear algorithms send in place (2 ranks,
/// shared memory, `kolo bench alltoall`: 64 KiB – 8 MiB blocks 1.1–1.7× faster, 32 KiB even, with
/// 256 KiB rings). Each segment goes in place only from the transport's own threshold too
/// (`KOLO_SHM_SINGLE_COPY_BYTES`, 16 MiB by default: over 1 MiB rings the blocks stream faster),
/// so by default none does.
pub const IN_PLACE_BLOCK_BYTES: usize = 64 << 10;

/// The fewest bytes of a block that the ring all-gather sends in place: each step's block is
/// copied while the peer copies its own (2 ranks, `kolo bench allgather`, 256 KiB rings: 256 KiB
/// blocks 1.3× slower in place, 512 KiB 1.3× faster, 8 MiB 2× faster). As for
/// [`IN_PLACE_BLOCK_BYTES`], the transport's threshold applies to each segment as well.
pub const IN_PLACE_RING_BYTES: usize = 512 << 10;

/// Segments sent in place and not yet known to be copied: (group rank, the transport's ticket).
#[derive(Debug, Default)]
pub struct InPlace(Vec<(usize, u64)>);

/// Largest message a pipelined algorithm sends at once; longer chunks go as several segments so the
/// receiver reduces one while the next is on the wire.
pub const SEGMENT_BYTES: usize = 1 << 20;

impl<'a> Ctx<'a> {
    /// Group size.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Name of the operation.
    pub fn op(&self) -> &'static str {
        self.header.call.op.name()
    }

    /// A context for one call (the fields that change during it start empty).
    pub fn new(
        transport: &'a dyn Transport,
        members: &'a [usize],
        rank: usize,
        header: Header,
        started: Instant,
        deadline: Option<Instant>,
        arena: Option<&'a dyn Arena>,
    ) -> Ctx<'a> {
        Ctx {
            transport,
            members,
            rank,
            header,
            started,
            deadline,
            arena,
            received: AtomicUsize::new(0),
            awaiting: Mutex::new(Vec::new()),
            confirm: true,
        }
    }

    /// This context with pure senders' confirmations turned off (`KOLO_CONFIRM_CALLS=0`, for
    /// measuring what they cost).
    pub fn without_confirmation(mut self) -> Self {
        self.confirm = false;
        self
    }

    /// Whether a send now comes from a rank whose only part in this call is to send. In broadcast,
    /// scatter, gather and reduce every rank that receives does so before it sends, so a rank that
    /// sends before receiving anything is a pure sender (a root of broadcast or scatter, a leaf of
    /// gather or reduce). Such a rank would return before a receiver could object to a mismatched
    /// call; it asks for confirmation instead. Not needed with an arena, whose fingerprint step
    /// covers every rank.
    fn pure_sender(&self) -> bool {
        self.confirm
            && self.arena.is_none()
            && matches!(
                self.header.call.op,
                OpKind::Broadcast
                    | OpKind::Scatter
                    | OpKind::ScatterV
                    | OpKind::Gather
                    | OpKind::GatherV
                    | OpKind::Reduce
            )
            && self.received.load(Ordering::Relaxed) == 0
    }

    /// Sends `data` to group rank `to`.
    pub fn send(&self, to: usize, data: &[u8]) -> Result<()> {
        let header = self.header_to(to);
        self.transport
            .send(self.members[to], &header, data)
            .map_err(|f| f.into_error(self.op(), self.rank))
    }

    /// The header of a message to `to`: this call's, asking for confirmation where this is a pure
    /// sender's first message to `to`.
    fn header_to(&self, to: usize) -> Header {
        let mut header = self.header;
        if self.pure_sender() {
            let mut w = self.awaiting.lock().unwrap_or_else(|p| p.into_inner());
            if !w.contains(&to) {
                // The first message to each peer asks for its confirmation.
                w.push(to);
                header.ack = true;
            }
        }
        header
    }

    fn ack_tag(&self) -> Tag {
        Tag {
            space: TagSpace::Ack,
            ..self.header.tag
        }
    }

    /// Waits for the confirmations this rank asked for (see [`Ctx::send`]): a receiver that found
    /// the call mismatched fails instead, and its abort reaches this rank here.
    pub fn finish(&self) -> Result<()> {
        let peers = std::mem::take(&mut *self.awaiting.lock().unwrap_or_else(|p| p.into_inner()));
        let tag = self.ack_tag();
        for peer in peers {
            let m = self
                .transport
                .recv(self.members[peer], &tag, self.deadline)
                .map_err(|e| self.recv_error(peer, e))?;
            if m.header.call != self.header.call {
                return Err(Error::Mismatch {
                    rank: self.rank,
                    peer,
                    local: self.header.call,
                    remote: m.header.call,
                    tag: self.header.tag,
                });
            }
        }
        Ok(())
    }

    /// The error for a failed wait on group rank `peer`.
    pub fn recv_error(&self, peer: usize, e: RecvError) -> Error {
        match e {
            RecvError::Timeout => Error::Timeout {
                op: self.op(),
                rank: self.rank,
                peer,
                waited: self.started.elapsed(),
            },
            RecvError::Link(f) => f.into_error(self.op(), self.rank),
        }
    }

    fn recv_msg(&self, from: usize, expected: usize) -> Result<Message> {
        let msg = self
            .transport
            .recv(self.members[from], &self.header.tag, self.deadline)
            .map_err(|e| self.recv_error(from, e))?;
        self.accept(from, &msg.header, expected, msg.payload.len())?;
        Ok(msg)
    }

    /// Checks a message from group rank `from` (its sender's fingerprint, its length) and confirms it
    /// when the sender asked for that.
    fn accept(&self, from: usize, header: &Header, expected: usize, actual: usize) -> Result<()> {
        if header.call != self.header.call {
            return Err(Error::Mismatch {
                rank: self.rank,
                peer: from,
                local: self.header.call,
                remote: header.call,
                tag: self.header.tag,
            });
        }
        if actual != expected {
            return Err(Error::MessageLength {
                op: self.op(),
                rank: self.rank,
                peer: from,
                expected,
                actual,
            });
        }
        self.received.fetch_add(1, Ordering::Relaxed);
        if header.ack {
            let ack = Header {
                tag: self.ack_tag(),
                call: self.header.call,
                ack: false,
            };
            self.transport
                .send(self.members[from], &ack, &[])
                .map_err(|f| f.into_error(self.op(), self.rank))?;
        }
        Ok(())
    }

    /// Receives exactly `expected` bytes from group rank `from`.
    pub fn recv(&self, from: usize, expected: usize) -> Result<Vec<u8>> {
        Ok(self.recv_msg(from, expected)?.payload)
    }

    /// Receives `buf.len()` bytes from `from` into `buf`.
    pub fn recv_into(&self, from: usize, buf: &mut [u8]) -> Result<()> {
        let m = self.recv_msg(from, buf.len())?;
        buf.copy_from_slice(&m.payload);
        self.transport.recycle(m.payload);
        Ok(())
    }

    /// Receives `buf.len()` bytes from `from` and reduces them into `buf`.
    pub fn recv_reduce(&self, from: usize, buf: &mut [u8], red: &Reducer) -> Result<()> {
        let m = self.recv_msg(from, buf.len())?;
        red.apply(buf, &m.payload);
        self.transport.recycle(m.payload);
        Ok(())
    }

    /// Sends `data` in segments of at most [`SEGMENT_BYTES`] (rounded to whole elements of `elem` bytes).
    pub fn send_segmented(&self, to: usize, data: &[u8], elem: usize) -> Result<()> {
        if data.is_empty() {
            return self.send(to, data);
        }
        for r in segments(data.len(), elem) {
            self.send(to, &data[r])?;
        }
        Ok(())
    }

    /// Sends `data` as [`Ctx::send_segmented`] does, each segment in place where the transport can
    /// ([`Transport::send_in_place`]: shared memory between processes, segments of at least its
    /// threshold): the receiver copies it once, straight out of this process's memory, instead of
    /// this rank copying it into the shared ring and the receiver copying it out — where `data`
    /// has at least `min` bytes (the algorithm's measured break-even; each copy out of another
    /// process costs a system call and the sender's wait for it). The segments sent in place are
    /// added to `sent`, for [`Ctx::wait_sent`]; the others were sent buffered.
    ///
    /// # Safety
    ///
    /// The memory of `data` must stay alive and unchanged until [`Ctx::wait_sent`] has returned
    /// `Ok(())` for `sent`. (If the call fails first, `to` may still copy it later: into its own
    /// buffer of that failed call.)
    pub unsafe fn send_segmented_in_place(
        &self,
        to: usize,
        data: &[u8],
        elem: usize,
        min: usize,
        sent: &mut InPlace,
    ) -> Result<()> {
        if self
            .transport
            .in_place_min()
            .is_none_or(|m| data.len() < m.max(min))
        {
            return self.send_segmented(to, data, elem);
        }
        for r in segments(data.len(), elem) {
            let header = self.header_to(to);
            // SAFETY: the caller keeps `data` as it is until `wait_sent` (this function's contract).
            let ticket = unsafe {
                self.transport
                    .send_in_place(self.members[to], &header, &data[r])
            };
            if let Some(t) = ticket.map_err(|f| f.into_error(self.op(), self.rank))? {
                sent.0.push((to, t));
            }
        }
        Ok(())
    }

    /// Waits until the receivers have copied every segment in `sent` (see
    /// [`Ctx::send_segmented_in_place`]), until this call's deadline; `sent` is empty after.
    pub fn wait_sent(&self, sent: &mut InPlace) -> Result<()> {
        for (to, ticket) in sent.0.drain(..) {
            self.transport
                .wait_in_place(self.members[to], ticket, self.deadline)
                .map_err(|e| self.recv_error(to, e))?;
        }
        Ok(())
    }

    /// Receives what [`Ctx::send_segmented`] sent, copying or reducing each segment into `buf`.
    pub fn recv_segmented(
        &self,
        from: usize,
        buf: &mut [u8],
        elem: usize,
        red: Option<&Reducer>,
    ) -> Result<()> {
        if buf.is_empty() {
            return self.recv_into(from, buf);
        }
        for r in segments(buf.len(), elem) {
            match red {
                Some(red) => self.recv_reduce(from, &mut buf[r], red)?,
                None => self.recv_into(from, &mut buf[r])?,
            }
        }
        Ok(())
    }
}

impl Ctx<'_> {
    /// Receives into `buf` what `from` sends with [`Ctx::send_segmented`] — copying each segment, or
    /// reducing it into `buf` with `red` — running `meanwhile` (the sends of the same step) after
    /// posting `buf`: a transport that can writes (or reduces) the segments that arrive after the
    /// posting straight into `buf` ([`Transport::recv_posted`]); segments that came earlier are
    /// copied (or reduced) here. Every segment is checked like [`Ctx::recv_into`]'s message.
    pub fn recv_segmented_posted(
        &self,
        from: usize,
        buf: &mut [u8],
        elem: usize,
        red: Option<&Reducer>,
        meanwhile: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let seg = (SEGMENT_BYTES / elem).max(1) * elem;
        self.transport.recv_posted(
            self.members[from],
            &self.header.tag,
            buf,
            seg,
            red.copied(),
            self.deadline,
            meanwhile,
            &mut |dst, got| match got {
                Received::Direct(h) => self.accept(from, &h, dst.len(), dst.len()),
                Received::Message(m) => {
                    self.accept(from, &m.header, dst.len(), m.payload.len())?;
                    match red {
                        Some(red) => red.apply(dst, &m.payload),
                        None => dst.copy_from_slice(&m.payload),
                    }
                    self.transport.recycle(m.payload);
                    Ok(())
                }
            },
            &|e| self.recv_error(from, e),
        )
    }
}

/// `buf[send]` to read and `buf[recv]` to write at once (the ranges must not overlap).
pub fn split_pair(buf: &mut [u8], send: Range<usize>, recv: Range<usize>) -> (&[u8], &mut [u8]) {
    if send.end <= recv.start {
        let (a, b) = buf.split_at_mut(recv.start);
        (&a[send], &mut b[..recv.end - recv.start])
    } else {
        debug_assert!(
            recv.end <= send.start,
            "overlapping ranges {send:?} and {recv:?}"
        );
        let (a, b) = buf.split_at_mut(send.start);
        (&b[..send.end - send.start], &mut a[recv])
    }
}

/// Splits `len` bytes into segments of at most [`SEGMENT_BYTES`], cut at multiples of `elem`.
pub fn segments(len: usize, elem: usize) -> impl Iterator<Item = Range<usize>> {
    let seg = (SEGMENT_BYTES / elem).max(1) * elem;
    (0..len).step_by(seg).map(move |s| s..(s + seg).min(len))
}

/// Splits `count` elements into `parts` contiguous blocks whose sizes differ by at most one, as byte
/// ranges for elements of `elem` bytes.
pub fn even_blocks(count: usize, parts: usize, elem: usize) -> Vec<Range<usize>> {
    let base = count / parts;
    let extra = count % parts;
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let n = base + usize::from(i < extra);
            let r = start * elem..(start + n) * elem;
            start += n;
            r
        })
        .collect()
}

/// Byte ranges of consecutive blocks with the given element counts.
pub fn blocks_from_counts(counts: &[usize], elem: usize) -> Vec<Range<usize>> {
    let mut start = 0;
    counts
        .iter()
        .map(|c| {
            let r = start..start + c * elem;
            start = r.end;
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_everything() {
        let b = even_blocks(10, 3, 4);
        assert_eq!(b, vec![0..16, 16..28, 28..40]);
        assert_eq!(even_blocks(2, 4, 1), vec![0..1, 1..2, 2..2, 2..2]);
        assert_eq!(blocks_from_counts(&[1, 0, 2], 2), vec![0..2, 2..2, 2..6]);
    }

    #[test]
    fn segments_are_whole_elements() {
        let s: Vec<_> = segments(3 * SEGMENT_BYTES + 6, 6).collect();
        assert!(s.iter().all(|r| r.len() % 6 == 0));
        assert_eq!(s.last().map(|r| r.end), Some(3 * SEGMENT_BYTES + 6));
    }
}
