//! Work buffers reused from one kernel call to the next, per thread.
//!
//! The Winograd passes fill several chunk-sized buffers (transformed tiles, GEMM products, a few
//! MiB each) that every convolution of every step needs again. Made fresh per call, each is
//! zero-filled first (a `memset` of memory that is overwritten right after) and, past the
//! allocator's thresholds, mapped and faulted in anew. A [`Scratch`] buffer is taken from the
//! calling thread's pool and goes back to it when dropped, with its length kept: a later call
//! gets it with stale contents and zero-fills only what it grows by. It is for buffers that are
//! entirely written before they are read.

use std::any::Any;
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::thread::LocalKey;

use candle_core::WithDType;

use super::aligned::Lines;

/// Buffers a thread keeps between calls; more are dropped (a convolution uses at most 5 at
/// once, the AMX one up to 8: its layouts, product and packed kernels).
const POOL_LEN: usize = 12;

/// Buffers that outlive a kernel call a thread keeps between steps: each Winograd convolution's
/// transformed kernel lives from its forward pass to its backward pass, so a step holds one per
/// convolution at once (ResNet-18: 13, 0.6-38 MB each) and the next step asks for the same sizes.
const KEPT_LEN: usize = 64;

type Pool = RefCell<Vec<Box<dyn Any>>>;

thread_local! {
    static POOL: Pool = const { RefCell::new(Vec::new()) };
    static KEPT: Pool = const { RefCell::new(Vec::new()) };
}

/// A vector of `len` values with unspecified contents (those of an earlier use, zeros where it
/// had to grow) for a buffer that outlives the call making it and is entirely written before it
/// is read: from the thread's pool of such buffers, the smallest that holds `len`. Hand it back
/// with [`keep_vec`] when done: made fresh, a buffer of megabytes is mapped, faulted in and
/// zeroed by the kernel page by page on every step.
pub(super) fn kept_vec<T: WithDType>(len: usize) -> Vec<T> {
    // Sized by capacity: a buffer cut short by an earlier use keeps its room.
    let mut v = taken(&KEPT, len, Vec::<T>::capacity).unwrap_or_default();
    v.resize(len, T::zero());
    v
}

/// Gives `v` (from [`kept_vec`] or not) to the thread's pool of buffers that outlive a call.
pub(super) fn keep_vec<T: WithDType>(v: Vec<T>) {
    if v.capacity() > 0 {
        give_back(&KEPT, KEPT_LEN, v);
    }
}

/// A work buffer of `T` from the thread's pool (see the module notes), returned to it on drop.
pub(super) struct Scratch<T: WithDType>(Vec<T>);

impl<T: WithDType> Scratch<T> {
    /// A buffer of `T` from the pool for up to `len` values: the smallest that holds them, or
    /// else the largest (which will grow), or a new one. Best fit keeps the pool from growing
    /// every buffer to the size of the largest use.
    pub(super) fn take(len: usize) -> Self {
        Scratch(taken(&POOL, len, Vec::<T>::len).unwrap_or_default())
    }

    /// The first `len` values, with unspecified contents: those of an earlier use of the
    /// buffer, zeros where it had to grow.
    pub(super) fn slice(&mut self, len: usize) -> &mut [T] {
        if self.0.len() < len {
            self.0.resize(len, T::zero());
        }
        &mut self.0[..len]
    }
}

impl<T: WithDType> Drop for Scratch<T> {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        if !v.is_empty() {
            give_back(&POOL, POOL_LEN, v);
        }
    }
}

/// A buffer of `B` from the thread's pool for `len` values (`size` says how many one holds):
/// the smallest that holds them, or else the largest (which will grow); `None` when the pool
/// has none. Best fit keeps the pool from growing every buffer to the size of the largest use.
fn taken<B: Any>(
    pool: &'static LocalKey<Pool>,
    len: usize,
    size: impl Fn(&B) -> usize,
) -> Option<B> {
    let found = pool.with(|pool| {
        let mut pool = pool.borrow_mut();
        let sizes = pool
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.downcast_ref::<B>().map(|v| (i, size(v))));
        let (mut fit, mut largest) = (None::<(usize, usize)>, None::<(usize, usize)>);
        for (i, n) in sizes {
            if n >= len && fit.is_none_or(|(_, f)| n < f) {
                fit = Some((i, n));
            }
            if largest.is_none_or(|(_, l)| n > l) {
                largest = Some((i, n));
            }
        }
        fit.or(largest).map(|(i, _)| pool.swap_remove(i))
    });
    found.and_then(|b| b.downcast::<B>().ok()).map(|b| *b)
}

/// Puts `b` back into the thread's `pool` (dropped where it holds `limit` buffers).
fn give_back<B: Any>(pool: &'static LocalKey<Pool>, limit: usize, b: B) {
    // `try_with`: a thread being torn down has no pool any more; the buffer is freed.
    let _ = pool.try_with(|pool| {
        if let Ok(mut pool) = pool.try_borrow_mut() {
            if pool.len() < limit {
                pool.push(Box::new(b));
            }
        }
    });
}

/// A work buffer on cache lines ([`Lines`]) from the thread's pool, returned to it on drop: the
/// AMX convolution's layouts, products and packed kernels. [`Lines::resize`] on it keeps what an
/// earlier use left where it does not grow.
pub(super) struct LineScratch<T: Copy + Default + 'static>(Lines<T>);

impl<T: Copy + Default + 'static> LineScratch<T> {
    /// A buffer from the pool that holds `len` values if one does (see [`Scratch::take`]); its
    /// length is that of its last use: [`Lines::resize`] or [`Lines::zeroed`] it.
    pub(super) fn take(len: usize) -> Self {
        LineScratch(taken(&POOL, len, Lines::<T>::room).unwrap_or_else(Lines::new))
    }
}

impl<T: Copy + Default + 'static> Deref for LineScratch<T> {
    type Target = Lines<T>;
    fn deref(&self) -> &Lines<T> {
        &self.0
    }
}

impl<T: Copy + Default + 'static> DerefMut for LineScratch<T> {
    fn deref_mut(&mut self) -> &mut Lines<T> {
        &mut self.0
    }
}

impl<T: Copy + Default + 'static> Drop for LineScratch<T> {
    fn drop(&mut self) {
        let v = std::mem::replace(&mut self.0, Lines::new());
        if v.room() > 0 {
            give_back(&POOL, POOL_LEN, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{keep_vec, kept_vec, LineScratch, Scratch};

    #[test]
    fn a_kept_buffer_is_reused_by_capacity_with_its_stale_values() {
        let mut v = kept_vec::<f32>(1000);
        assert!(v.iter().all(|&x| x == 0.0), "a new buffer is zeros");
        v.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
        let at = v.as_ptr();
        keep_vec(v);
        // Cut short, then asked for again at full length: the same memory, not a new buffer.
        let mut short = kept_vec::<f32>(10);
        assert_eq!((short.as_ptr(), &short[..3]), (at, &[0.0, 1.0, 2.0][..]));
        short.truncate(2);
        keep_vec(short);
        let again = kept_vec::<f32>(1000);
        assert_eq!(again.as_ptr(), at, "the buffer's room is what counts");
        // Another type never gets it.
        let other = kept_vec::<f64>(10);
        assert_ne!(other.as_ptr().cast::<f32>(), at);
    }

    #[test]
    fn a_buffer_comes_back_with_its_length_and_contents() {
        {
            let mut s = Scratch::<u32>::take(5);
            s.slice(5).copy_from_slice(&[1, 2, 3, 4, 5]);
        }
        let mut s = Scratch::<u32>::take(3);
        // Reused, not zero-filled: the stale values are still there; growing adds zeros.
        assert_eq!(s.slice(3), &[1, 2, 3]);
        assert_eq!(s.slice(7), &[1, 2, 3, 4, 5, 0, 0]);
        // Two at once are two different buffers; another type gets its own.
        let mut t = Scratch::<u32>::take(2);
        assert_eq!(t.slice(2), &[0, 0]);
        let mut f = Scratch::<f64>::take(1);
        assert_eq!(f.slice(1), &[0.0]);
    }

    #[test]
    fn the_smallest_buffer_that_fits_is_taken() {
        let (mut big, mut small) = (Scratch::<f32>::take(0), Scratch::<f32>::take(0));
        big.slice(100).fill(1.0);
        small.slice(10).fill(2.0);
        drop((big, small));
        let mut s = Scratch::<f32>::take(8);
        assert_eq!(s.slice(8), &[2.0; 8]);
        // Nothing fits: the largest, to grow.
        let mut l = Scratch::<f32>::take(200);
        assert_eq!(&l.slice(200)[..100], &[1.0; 100]);
    }

    #[test]
    fn a_line_buffer_comes_back_on_its_line_with_its_contents() {
        {
            let mut s = LineScratch::<u16>::take(100);
            s.zeroed(100);
            s.fill(7);
        }
        let mut s = LineScratch::<u16>::take(50);
        assert!(s.room() >= 100, "the kept buffer, not a new one");
        s.resize(50);
        assert_eq!((s.as_ptr() as usize % 64, &s[..]), (0, &[7u16; 50][..]));
        // Another at the same time is another buffer.
        let t = LineScratch::<u16>::take(50);
        assert_eq!(t.room(), 0);
    }
}
