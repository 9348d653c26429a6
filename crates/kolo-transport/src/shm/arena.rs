//! The arena (`kolo_core::Arena`) over shared memory: each rank posts its steps (with a fingerprint
//! and inline data) in its control line; the two buffers per rank lie in the segment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kolo_core::{Arena, Header, LinkFailure, RecvError, HEADER_LEN};

use super::health::STATE_CLOSED;
use super::layout::{FP_SLOT, INLINE_AT, INLINE_BYTES, LINE};
use super::ShmTransport;

impl ShmTransport {
    pub(super) fn step_word(&self, r: usize) -> &AtomicU64 {
        self.u64_at(self.layout.ctrl(r) + 3 * LINE)
    }

    pub(super) fn fingerprint(&self, r: usize, step: u64) -> *mut u8 {
        self.at(self.layout.ctrl(r) + 3 * LINE + 8 + (step % 2) as usize * FP_SLOT)
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
