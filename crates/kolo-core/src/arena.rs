//! [`Arena`]: memory that every rank of a group on one host maps, for collectives that read their
//! peers' data in place instead of sending it.
//!
//! Each rank owns two buffers (alternating by *round*) and a step counter. A rank *posts* a step after
//! writing what that step publishes (data in its buffer, the call's [`Header`] in its fingerprint slot);
//! a peer that *waits* for the step then reads it. The protocol that makes reuse safe without more
//! synchronization, followed by every arena algorithm:
//!
//! - a round's buffer is written only by its owner, and only before the round's first post;
//! - a rank posts the first step of round `r + 1` only after it has finished reading every peer's
//!   buffer of round `r`;
//! - so when a rank starts round `r + 2` in the buffer of round `r`, it has already waited (during round
//!   `r + 1`) for every peer's first post of round `r + 1`, and no peer still reads round `r`.
//!
//! The same argument covers the fingerprint slots, which alternate by step. A slot also carries up to
//! [`Arena::inline_len`] bytes of *inline* data, published with the step: a small message then moves
//! between ranks in the one cache line the peer reads anyway to see the step.

use std::fmt;
use std::time::Instant;

use crate::call::Header;
use crate::error::RecvError;

/// Shared memory of one group on one host. Ranks are group ranks.
pub trait Arena: Send + Sync + fmt::Debug {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Length of each buffer in bytes (a multiple of 64).
    fn buffer_len(&self) -> usize;
    /// Starts the next round and returns the parity (0 or 1) of its buffers.
    fn next_round(&self) -> usize;
    /// Bytes of inline data a step can carry (0 where the arena has no room for any).
    fn inline_len(&self) -> usize {
        0
    }
    /// Publishes the next step with `header` as this rank's fingerprint and `inline` (at most
    /// [`Arena::inline_len`] bytes; more is a caller bug) as its inline data; returns the step number.
    fn post(&self, header: &Header, inline: &[u8]) -> u64;
    /// Waits until `peer` has posted `step`, copies the first `inline.len()` bytes of its inline data
    /// into `inline` and returns the fingerprint it posted with it.
    fn wait(
        &self,
        peer: usize,
        step: u64,
        deadline: Option<Instant>,
        inline: &mut [u8],
    ) -> Result<Header, RecvError>;
    /// Start of `rank`'s buffer of `parity`: [`Arena::buffer_len`] bytes, aligned to 64.
    ///
    /// Reading or writing through it is sound only as the protocol above allows.
    fn buffer(&self, rank: usize, parity: usize) -> *mut u8;
}
