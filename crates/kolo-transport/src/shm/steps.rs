//! The arena's step posts (see `kolo_core::arena`): each rank has a step word and two slots, used
//! by step parity. A post writes the slot of its step's parity (the call's fingerprint, then inline
//! data at [`INLINE_AT`]) and then releases the step number; a peer that acquires a step at least
//! that large reads the slot. The owner rewrites a slot only two steps later, after the peer has
//! posted in between, so the peer's read is done by then.
//!
//! Written against [`super::atomics`] only, so `tests/shm_model.rs` model-checks this file with
//! `loom`.

use super::atomics::{AtomicU64, Ordering, SharedBytes};

/// Bytes of one slot: the fingerprint, then inline data from [`INLINE_AT`].
pub(super) const FP_SLOT: usize = 56;
/// Offset of the inline data in a slot.
pub(super) const INLINE_AT: usize = 40;
/// Most inline data a post carries.
pub(super) const INLINE_BYTES: usize = FP_SLOT - INLINE_AT;

/// One rank's step word and its two slots (`2 * FP_SLOT` bytes).
#[derive(Debug)]
pub(super) struct Steps<'a> {
    word: &'a AtomicU64,
    slots: SharedBytes<'a>,
}

impl<'a> Steps<'a> {
    /// The step word `word` and the slots `slots`.
    #[inline]
    pub(super) fn new(word: &'a AtomicU64, slots: SharedBytes<'a>) -> Steps<'a> {
        debug_assert_eq!(slots.len(), 2 * FP_SLOT);
        Steps { word, slots }
    }

    /// Writes `fingerprint` and `inline` into the slot of `step` and posts the step.
    ///
    /// # Safety
    ///
    /// Only the owner posts, with steps growing one at a time, `fingerprint.len() <= INLINE_AT` and
    /// `inline.len() <= INLINE_BYTES`; every reader of step `step - 2` has posted step `step - 1`
    /// (as the arena's rounds guarantee).
    #[inline]
    pub(super) unsafe fn post(&self, step: u64, fingerprint: &[u8], inline: &[u8]) {
        let slot = (step % 2) as usize * FP_SLOT;
        // SAFETY: the slot of this step's parity is the owner's to write (the caller's contract);
        // both pieces fit in it.
        unsafe {
            self.slots.write(slot, fingerprint);
            self.slots.write(slot + INLINE_AT, inline);
        }
        self.word.store(step, Ordering::Release);
    }

    /// Whether step `step` (or a later one) is posted.
    #[inline]
    pub(super) fn posted(&self, step: u64) -> bool {
        self.word.load(Ordering::Acquire) >= step
    }

    /// Copies the fingerprint and inline data of posted step `step`.
    ///
    /// # Safety
    ///
    /// [`Steps::posted`] returned true for `step`, this reader posts its own step `step + 1`
    /// only after this call, `fingerprint.len() <= INLINE_AT` and `inline.len() <= INLINE_BYTES`.
    #[inline]
    pub(super) unsafe fn read(&self, step: u64, fingerprint: &mut [u8], inline: &mut [u8]) {
        let slot = (step % 2) as usize * FP_SLOT;
        // SAFETY: the owner wrote this slot before posting `step` (acquired by `posted`) and will
        // not rewrite it before we post our next step.
        unsafe {
            self.slots.read(slot, fingerprint);
            self.slots.read(slot + INLINE_AT, inline);
        }
    }
}
