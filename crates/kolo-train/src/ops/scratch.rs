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

use candle_core::WithDType;

/// Buffers a thread keeps between calls; more are dropped (a convolution uses at most 4 at
/// once).
const POOL_LEN: usize = 8;

thread_local! {
    static POOL: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// A work buffer of `T` from the thread's pool (see the module notes), returned to it on drop.
pub(super) struct Scratch<T: WithDType>(Vec<T>);

impl<T: WithDType> Scratch<T> {
    /// The pool's largest buffer of `T`, or an empty one.
    pub(super) fn take() -> Self {
        let found = POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            let best = pool
                .iter()
                .enumerate()
                .filter_map(|(i, b)| b.downcast_ref::<Vec<T>>().map(|v| (i, v.len())))
                .max_by_key(|&(_, len)| len)
                .map(|(i, _)| i);
            best.map(|i| pool.swap_remove(i))
        });
        match found.map(|b| b.downcast::<Vec<T>>()) {
            Some(Ok(v)) => Scratch(*v),
            _ => Scratch(Vec::new()),
        }
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
        if v.is_empty() {
            return;
        }
        // `try_with`: a thread being torn down has no pool any more; the buffer is freed.
        let _ = POOL.try_with(|pool| {
            if let Ok(mut pool) = pool.try_borrow_mut() {
                if pool.len() < POOL_LEN {
                    pool.push(Box::new(v));
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::Scratch;

    #[test]
    fn a_buffer_comes_back_with_its_length_and_contents() {
        {
            let mut s = Scratch::<u32>::take();
            s.slice(5).copy_from_slice(&[1, 2, 3, 4, 5]);
        }
        let mut s = Scratch::<u32>::take();
        // Reused, not zero-filled: the stale values are still there; growing adds zeros.
        assert_eq!(s.slice(3), &[1, 2, 3]);
        assert_eq!(s.slice(7), &[1, 2, 3, 4, 5, 0, 0]);
        // Two at once are two different buffers; another type gets its own.
        let mut t = Scratch::<u32>::take();
        assert_eq!(t.slice(2), &[0, 0]);
        let mut f = Scratch::<f64>::take();
        assert_eq!(f.slice(1), &[0.0]);
    }
}
