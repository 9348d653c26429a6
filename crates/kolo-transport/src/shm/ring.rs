//! The single-producer single-consumer byte ring of each ordered pair of ranks: sending into it,
//! and draining the incoming rings into the mailbox.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::TryLockError;

use kolo_core::{Header, LinkFailure, Message, RecvError};

use super::health::{STATE_ALIVE, STATE_CLOSED};
use super::layout::{LINE, RING_CTRL};
use super::prefix::{decode_prefix, encode_prefix, PREFIX};
use super::{lock, ShmTransport};

/// The receiving side of one incoming ring: a message being assembled.
#[derive(Debug, Default)]
pub(super) struct Consumer {
    partial: Option<(Header, usize, Vec<u8>)>,
    /// The peer's clean close has been passed to the mailbox.
    closed: bool,
}

impl ShmTransport {
    pub(super) fn ring_tail(&self, src: usize, dst: usize) -> &AtomicU64 {
        self.u64_at(self.layout.ring(src, dst))
    }

    pub(super) fn ring_head(&self, src: usize, dst: usize) -> &AtomicU64 {
        self.u64_at(self.layout.ring(src, dst) + LINE)
    }

    pub(super) fn ring_data(&self, src: usize, dst: usize) -> *mut u8 {
        self.at(self.layout.ring(src, dst) + RING_CTRL)
    }

    /// Copies `data` into the ring `src → dst` at stream position `pos` (wrapping).
    pub(super) fn ring_write(&self, dst: usize, pos: u64, data: &[u8]) {
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
    pub(super) fn ring_read(&self, src: usize, pos: u64, out: &mut [u8]) {
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

    /// Moves complete (and partial) messages from every incoming ring into the mailbox; returns
    /// whether a message was delivered.
    pub(super) fn progress(&self) -> bool {
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

    pub(super) fn drain(&self, src: usize, c: &mut Consumer) -> bool {
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

    pub(super) fn send_to_peer(
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
