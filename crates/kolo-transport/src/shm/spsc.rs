//! The protocol of one single-producer single-consumer byte ring: `tail` (the producer's stream
//! position) is released after the bytes it covers are written; `head` (the consumer's) is released
//! after the bytes it passes are read. The producer owns ring bytes `[tail, head + capacity)`, the
//! consumer `[head, tail)`; positions only grow, and a byte's place is its position modulo the
//! capacity.
//!
//! Written against [`super::atomics`] only, so `tests/shm_model.rs` model-checks this file with
//! `loom` (including wrap-around and a full ring).

use super::atomics::{AtomicU64, Ordering, SharedBytes};

/// The most lines [`Spsc::prefetch_span`] asks for after the first.
const SPAN_LINES: usize = 16;

/// One ring: its two position words and its data bytes.
#[derive(Debug)]
pub(super) struct Spsc<'a> {
    tail: &'a AtomicU64,
    head: &'a AtomicU64,
    data: SharedBytes<'a>,
}

impl<'a> Spsc<'a> {
    /// The ring with position words `tail` and `head` and data `data` (the capacity is its length).
    #[inline]
    pub(super) fn new(tail: &'a AtomicU64, head: &'a AtomicU64, data: SharedBytes<'a>) -> Spsc<'a> {
        Spsc { tail, head, data }
    }

    /// Capacity in bytes.
    #[inline]
    pub(super) fn capacity(&self) -> usize {
        self.data.len()
    }

    /// The producer's position (only the producer moves it).
    #[inline]
    pub(super) fn producer_position(&self) -> u64 {
        self.tail.load(Ordering::Relaxed)
    }

    /// Bytes the producer at position `tail` may write now.
    #[inline]
    pub(super) fn free(&self, tail: u64) -> usize {
        self.free_before(tail, self.released())
    }

    /// The consumer's released position, as the producer reads it (the bytes before it are the
    /// producer's again).
    #[inline]
    pub(super) fn released(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Bytes the producer at position `tail` may write once the consumer has released `head` (a
    /// position [`Spsc::released`] returned: one read earlier only understates the free space, to
    /// nothing where the producer has since written past it with a newer one).
    #[inline]
    pub(super) fn free_before(&self, tail: u64, head: u64) -> usize {
        // The consumer may have released past `tail` (a message's padding, see `ring.rs`).
        (self.capacity() as u64 + head).saturating_sub(tail) as usize
    }

    /// Writes `bytes` at position `tail` (wrapping) and publishes them; returns the new position.
    ///
    /// # Safety
    ///
    /// Only the ring's one producer calls this, at its position `tail`, with
    /// `bytes.len() <= self.free(tail)`.
    #[inline]
    pub(super) unsafe fn push(&self, tail: u64, bytes: &[u8]) -> u64 {
        let cap = self.capacity();
        let at = (tail % cap as u64) as usize;
        let first = bytes.len().min(cap - at);
        // SAFETY: the producer owns ring bytes [tail, head + cap) and `bytes` fits in them (the
        // caller's contract); the two pieces stay inside the data area.
        unsafe {
            self.data.write(at, &bytes[..first]);
            self.data.write(0, &bytes[first..]);
        }
        let tail = tail + bytes.len() as u64;
        self.tail.store(tail, Ordering::Release);
        tail
    }

    /// Writes `a` then `b` at position `tail` (wrapping) and publishes both at once, up to position
    /// `end` (at or past their end: the bytes between are skipped, not written); returns `end`.
    ///
    /// # Safety
    ///
    /// As [`Spsc::push`], with `end - tail <= self.free(tail)`.
    #[inline]
    pub(super) unsafe fn push2(&self, tail: u64, a: &[u8], b: &[u8], end: u64) -> u64 {
        let cap = self.capacity();
        let mut at = tail;
        for bytes in [a, b] {
            let i = (at % cap as u64) as usize;
            let first = bytes.len().min(cap - i);
            // SAFETY: as in `push`: the producer owns ring bytes [tail, head + cap) and both fit.
            unsafe {
                self.data.write(i, &bytes[..first]);
                self.data.write(0, &bytes[first..]);
            }
            at += bytes.len() as u64;
        }
        debug_assert!(end >= at);
        self.tail.store(end, Ordering::Release);
        end
    }

    /// As [`Spsc::push2`] with `a` given as little-endian words, written with one store each
    /// where they do not wrap (a message's prefix: no round trip through a buffer on the stack).
    ///
    /// # Safety
    ///
    /// As [`Spsc::push2`].
    #[inline]
    pub(super) unsafe fn push_words2<const N: usize>(
        &self,
        tail: u64,
        a: &[u64; N],
        b: &[u8],
        end: u64,
    ) -> u64 {
        let cap = self.capacity();
        let i = (tail % cap as u64) as usize;
        if i + 8 * N > cap {
            let mut bytes = [0u8; 64];
            for (chunk, w) in bytes.chunks_exact_mut(8).zip(a) {
                chunk.copy_from_slice(&w.to_le_bytes());
            }
            // SAFETY: the caller's contract.
            return unsafe { self.push2(tail, &bytes[..8 * N], b, end) };
        }
        for (k, &w) in a.iter().enumerate() {
            // SAFETY: as in `push`: the producer owns these bytes, and they lie before the end.
            unsafe { self.data.write_u64(i + 8 * k, w) };
        }
        let at = tail + 8 * N as u64;
        let j = (at % cap as u64) as usize;
        let first = b.len().min(cap - j);
        // SAFETY: as in `push`.
        unsafe {
            self.data.write(j, &b[..first]);
            self.data.write(0, &b[first..]);
        }
        debug_assert!(end >= at + b.len() as u64);
        self.tail.store(end, Ordering::Release);
        end
    }

    /// The `N` little-endian words at position `head`, read with one load each; `None` where
    /// they wrap around the ring's end.
    ///
    /// # Safety
    ///
    /// As [`Spsc::read`], for `8 * N` bytes.
    #[inline]
    pub(super) unsafe fn read_words<const N: usize>(&self, head: u64) -> Option<[u64; N]> {
        let cap = self.capacity();
        let at = (head % cap as u64) as usize;
        if at + 8 * N > cap {
            return None;
        }
        let mut w = [0u64; N];
        for (k, v) in w.iter_mut().enumerate() {
            // SAFETY: the consumer owns these bytes (the caller's contract), inside the area.
            *v = unsafe { self.data.read_u64(at + 8 * k) };
        }
        Some(w)
    }

    /// The consumer's position (only the consumer moves it).
    #[inline]
    pub(super) fn consumer_position(&self) -> u64 {
        self.head.load(Ordering::Relaxed)
    }

    /// Bytes published beyond the consumer's position `head`.
    #[inline]
    pub(super) fn available(&self, head: u64) -> usize {
        // `head` may be past the producer's position: a message's padding released before the
        // producer published it.
        self.tail.load(Ordering::Acquire).saturating_sub(head) as usize
    }

    /// Copies the ring bytes at position `head` (wrapping) into `out`.
    ///
    /// # Safety
    ///
    /// Only the ring's one consumer calls this, with `head` at or past its released position and
    /// `head + out.len()` at most where [`Spsc::available`] saw the producer's position.
    #[inline]
    pub(super) unsafe fn read(&self, head: u64, out: &mut [u8]) {
        let cap = self.capacity();
        let at = (head % cap as u64) as usize;
        let first = out.len().min(cap - at);
        let (a, b) = out.split_at_mut(first);
        // SAFETY: the consumer owns ring bytes [head, tail) (the caller's contract); the two pieces
        // stay inside the data area.
        unsafe {
            self.data.read(at, a);
            self.data.read(0, b);
        }
    }

    /// Asks for the cache line of position `head` ahead of reading it: a consumer that polls the
    /// producer's position and then reads the bytes waits for two lines from the producer's core,
    /// one after the other; polled together, the two come at once.
    #[inline]
    pub(super) fn prefetch(&self, head: u64) {
        self.data.prefetch((head % self.capacity() as u64) as usize);
    }

    /// Asks for the cache lines of the `len` bytes from position `head` after the first, up to
    /// [`SPAN_LINES`] of them: a consumer that has just seen them published fetches them while it
    /// decodes the prefix, not one after the other as it copies.
    #[inline]
    pub(super) fn prefetch_span(&self, head: u64, len: usize) {
        let cap = self.capacity();
        let at = (head % cap as u64) as usize;
        let end = (at + len.min(SPAN_LINES * 64)).min(cap);
        let mut line = (at & !63) + 64;
        while line < end {
            self.data.prefetch(line);
            line += 64;
        }
    }

    /// Gives the bytes before position `head` back to the producer.
    #[inline]
    pub(super) fn release(&self, head: u64) {
        self.head.store(head, Ordering::Release);
    }
}
