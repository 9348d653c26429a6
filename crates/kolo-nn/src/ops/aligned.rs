//! Buffers whose working slice starts on a cache line. An AMX tile row is 64 bytes: read from a
//! line boundary it is one line, from anywhere else two — and a tile load of 16 such rows then
//! costs up to half as much again (measured on a Xeon with AMX), in kernels where tile loads, not
//! products, set the pace. A `Vec`'s own allocation promises only its element's alignment
//! (glibc returns large blocks 16 bytes past a page), so the packed operands of the bf16 GEMMs
//! and the AMX convolution's layouts live in these.

use std::ops::{Deref, DerefMut};

/// Bytes of a cache line.
const LINE: usize = 64;

/// A `Vec<T>` used from its first cache-line boundary on: `len` values of it, the rest slack.
pub(super) struct Lines<T> {
    v: Vec<T>,
    off: usize,
    len: usize,
}

impl<T> Lines<T> {
    pub(super) const fn new() -> Self {
        Lines {
            v: Vec::new(),
            off: 0,
            len: 0,
        }
    }
}

impl<T: Copy + Default> Lines<T> {
    /// `len` values, all of them the default (zero); the slice may move.
    pub(super) fn zeroed(&mut self, len: usize) {
        let n = len + LINE / size_of::<T>();
        if n > self.v.capacity() {
            // Fresh zero pages from the allocator rather than a pass of stores.
            self.v = vec![T::default(); n];
        } else {
            self.v.clear();
            self.v.resize(n, T::default());
        }
        self.off = self.v.as_ptr().align_offset(LINE);
        self.len = len;
    }

    /// Values the buffer holds from its line on without growing.
    pub(super) fn room(&self) -> usize {
        self.v.len() - self.off
    }

    /// `len` values whose contents the caller overwrites (what an earlier use left stays where
    /// the slice does not grow; it moves, zeroed, where it does).
    pub(super) fn resize(&mut self, len: usize) {
        if self.off + len > self.v.len() {
            self.zeroed(len);
        } else {
            self.len = len;
        }
    }
}

impl<T> Deref for Lines<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.v[self.off..self.off + self.len]
    }
}

impl<T> DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.v[self.off..self.off + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_start_on_a_line_and_keep_their_length() {
        let mut l = Lines::<u16>::new();
        for len in [1, 31, 32, 1000, 7] {
            l.zeroed(len);
            assert_eq!(l.as_ptr() as usize % LINE, 0);
            assert_eq!(l.len(), len);
            assert!(l.iter().all(|&v| v == 0));
        }
        l[3] = 9;
        l.resize(5);
        assert_eq!(&l[..], &[0, 0, 0, 9, 0]);
        l.resize(4000);
        assert_eq!((l.as_ptr() as usize % LINE, l.len()), (0, 4000));
        let mut f = Lines::<f32>::new();
        f.resize(3);
        assert_eq!((f.as_ptr() as usize % LINE, &f[..]), (0, &[0.0; 3][..]));
    }
}
