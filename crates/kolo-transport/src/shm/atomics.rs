//! The primitives under the shared-memory transport's lock-free protocols ([`super::doorbell`],
//! [`super::spsc`], [`super::steps`]): std's atomics, the kernel's futex and raw bytes of the
//! mapped segment.
//!
//! Those three files name their primitives only through this module (`super::atomics`), so
//! `tests/shm_model.rs` compiles the same files against a `loom` version of it (loom's atomics, a
//! futex modelled with loom's mutex and condition variable, `loom::cell::UnsafeCell` bytes) and
//! model-checks the shipping code. Nothing else goes through this module; it adds no cost.

use std::marker::PhantomData;

pub(super) use super::sync::{futex_wait, futex_wake};
pub(super) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// `len` bytes of the mapped segment that a protocol hands to one writer at a time.
#[derive(Clone, Copy, Debug)]
pub(super) struct SharedBytes<'a> {
    ptr: *mut u8,
    len: usize,
    _mapping: PhantomData<&'a [u8]>,
}

impl<'a> SharedBytes<'a> {
    /// The bytes `[ptr, ptr + len)`.
    ///
    /// # Safety
    ///
    /// They lie inside a mapping that outlives `'a`.
    #[inline]
    pub(super) unsafe fn new(ptr: *mut u8, len: usize) -> SharedBytes<'a> {
        SharedBytes {
            ptr,
            len,
            _mapping: PhantomData,
        }
    }

    /// Number of bytes.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Copies `src` to offset `at`.
    ///
    /// # Safety
    ///
    /// `at + src.len() <= len`, and the protocol gives these bytes to the caller: nobody else reads
    /// or writes them meanwhile.
    #[inline]
    pub(super) unsafe fn write(&self, at: usize, src: &[u8]) {
        debug_assert!(at + src.len() <= self.len);
        // SAFETY: in bounds and ours (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(at), src.len()) }
    }

    /// Writes `v` as 8 little-endian bytes at offset `at`, with one store.
    ///
    /// # Safety
    ///
    /// As [`Self::write`], with `at + 8 <= len`.
    #[inline]
    pub(super) unsafe fn write_u64(&self, at: usize, v: u64) {
        debug_assert!(at + 8 <= self.len);
        // SAFETY: in bounds and ours (the caller's contract); unaligned stores are fine.
        unsafe { self.ptr.add(at).cast::<u64>().write_unaligned(v.to_le()) }
    }

    /// Asks the CPU to fetch the cache line holding offset `at` (a hint: no access, no fault,
    /// nothing on other architectures than x86-64).
    #[inline]
    pub(super) fn prefetch(&self, at: usize) {
        debug_assert!(at < self.len);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch reads nothing and cannot fault; the address is inside the mapping.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(self.ptr.add(at).cast::<i8>());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = at;
    }

    /// Copies the bytes at offset `at` into `dst`.
    ///
    /// # Safety
    ///
    /// `at + dst.len() <= len`, and the protocol guarantees that nobody writes these bytes
    /// meanwhile (and that their writer's stores happen before this read).
    #[inline]
    pub(super) unsafe fn read(&self, at: usize, dst: &mut [u8]) {
        debug_assert!(at + dst.len() <= self.len);
        // SAFETY: in bounds and stable (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(at), dst.as_mut_ptr(), dst.len()) }
    }

    /// Reads the 8 little-endian bytes at offset `at`, with one load.
    ///
    /// # Safety
    ///
    /// As [`Self::read`], with `at + 8 <= len`.
    #[inline]
    pub(super) unsafe fn read_u64(&self, at: usize) -> u64 {
        debug_assert!(at + 8 <= self.len);
        // SAFETY: in bounds and stable (the caller's contract); unaligned loads are fine.
        u64::from_le(unsafe { self.ptr.add(at).cast::<u64>().read_unaligned() })
    }
}
