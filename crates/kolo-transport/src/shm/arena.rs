//! The arena (`kolo_core::Arena`) over shared memory: each rank posts its steps (with a fingerprint
//! and inline data) in its control line (the protocol is [`super::steps`]); the two buffers per
//! rank lie in the segment.

use std::sync::atomic::Ordering;
use std::time::Instant;

use kolo_core::{Arena, Header, LinkFailure, RecvError, HEADER_LEN};

use super::atomics::SharedBytes;
use super::health::STATE_CLOSED;
use super::layout::LINE;
use super::steps::{Steps, FP_SLOT, INLINE_BYTES};
use super::ShmTransport;

impl ShmTransport {
    /// Rank `r`'s step word and slots: the last line of its control area.
    fn steps(&self, r: usize) -> Steps<'_> {
        let line = self.layout.ctrl(r) + 3 * LINE;
        // SAFETY: the line's slots (after its step word) lie inside the mapping, which lives as
        // long as `self`.
        let slots = unsafe { SharedBytes::new(self.at(line + 8), 2 * FP_SLOT) };
        Steps::new(self.u64_at(line), slots)
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
        // SAFETY: only this rank posts its steps, one at a time (`next_step`); the arena's rounds
        // (see kolo_core::arena) keep a slot unread before it is rewritten; the header fits before
        // the inline data (see `layout`) and the inline data fits (asserted above).
        unsafe { self.steps(self.rank).post(step, &fp, inline) };
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
        let steps = self.steps(peer);
        if !steps.posted(step) {
            self.wait_for(deadline, || {
                if steps.posted(step) {
                    Some(Ok(()))
                } else if self.state_word(peer, 0).load(Ordering::Acquire) == STATE_CLOSED {
                    // A peer posts its last step and then closes: look again after seeing the
                    // close (its Release store makes the step visible), or the race reads as a loss.
                    if steps.posted(step) {
                        Some(Ok(()))
                    } else {
                        Some(Err(LinkFailure::PeerClosed { peer }))
                    }
                } else {
                    None
                }
            })?
            .map_err(RecvError::Link)?;
        }
        let mut fp = [0u8; HEADER_LEN];
        // SAFETY: the peer posted `step` (acquired above) and will not rewrite its slot before we
        // post our next step; the header and the inline data (asserted above) fit.
        unsafe { steps.read(step, &mut fp, inline) };
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
