//! Adasum all-reduce (Maleki et al., "Scaling Distributed Training with Adaptive Summation",
//! MLSys 2021; Horovod's `hvd.Adasum`), by recursive doubling.
//!
//! Two gradients a and b combine as
//!
//! ```text
//! adasum(a, b) = (1 − a·b / (2|a|²)) a + (1 − a·b / (2|b|²)) b
//! ```
//!
//! with a zero vector absorbed: if |a|² = 0 the result is b, if |b|² = 0 it is a. Identical vectors
//! give that vector back, orthogonal ones their sum. The combination is applied per layer: the buffer
//! is cut into consecutive segments (`layers`, lengths in elements) and each segment has its own dot
//! product and norms. Dot products and norms are accumulated in f64 whatever the element type, and the
//! combined element is computed in f64 and rounded once.
//!
//! Over p = 2^k ranks the vectors combine over a binary tree: level 1 combines ranks (0,1), (2,3), …;
//! level 2 the results of {0,1} and {2,3}; and so on. Recursive doubling runs it: in round j each rank
//! exchanges its current vector with the rank whose index differs in bit j and both compute
//! adasum(lower, upper), the lower group's vector as `a`. Both sides of a pair compute the same
//! function of the same two vectors, so every rank ends with a bit-identical result. Cost:
//! log₂ p α + log₂ p · m β, plus the arithmetic.
//!
//! The world size must be a power of two (as in Horovod); the caller checks that before any
//! communication ([`is_supported`]).

use std::ops::Range;

use kolo_core::dtype::{as_bytes, vec_from_bytes};
use kolo_core::{Element, Result};

use crate::Ctx;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A floating-point element type Adasum combines: `f32` or `f64`.
///
/// Sealed: Adasum is defined for these types only.
pub trait AdasumFloat: Element + Copy + sealed::Sealed {
    /// The value widened to f64.
    fn to_f64(self) -> f64;
    /// An f64 rounded to this type.
    fn from_f64(v: f64) -> Self;
}

impl AdasumFloat for f32 {
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl AdasumFloat for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

/// Whether Adasum can run on a group of `n` ranks (`n` a power of two, one included).
pub fn is_supported(n: usize) -> bool {
    n.is_power_of_two()
}

/// The coefficients `(ca, cb)` of `adasum(a, b) = ca·a + cb·b` for one segment, from its dot
/// product and squared norms (the zero-vector conventions included).
pub fn coefficients(dot: f64, a_sq: f64, b_sq: f64) -> (f64, f64) {
    if a_sq == 0.0 {
        return (0.0, 1.0);
    }
    if b_sq == 0.0 {
        return (1.0, 0.0);
    }
    (1.0 - dot / (2.0 * a_sq), 1.0 - dot / (2.0 * b_sq))
}

/// Writes `adasum(a, b)` into `out`, segment by segment (`layers` are segment lengths summing to
/// `a.len()`; `a`, `b` and `out` have the same length).
pub fn combine<T: AdasumFloat>(a: &[T], b: &[T], layers: &[usize], out: &mut [T]) {
    let sums = partial_sums(a, b, 0, layers);
    apply(a, b, 0, layers, &sums, out);
}

/// The element range of each layer that falls inside `offset..offset + len`, relative to `offset`.
fn clipped(offset: usize, len: usize, layers: &[usize]) -> impl Iterator<Item = Range<usize>> + '_ {
    let end = offset + len;
    layers.iter().scan(0usize, move |start, &l| {
        let (s, e) = (*start, *start + l);
        *start = e;
        let (cs, ce) = (s.clamp(offset, end), e.clamp(offset, end));
        Some(cs - offset..ce - offset)
    })
}

/// Per layer, `[a·b, |a|², |b|²]` (in f64) over the part of the layer inside the slice: `a` and `b`
/// hold elements `offset..offset + a.len()` of the two whole vectors. Three entries per layer.
pub fn partial_sums<T: AdasumFloat>(a: &[T], b: &[T], offset: usize, layers: &[usize]) -> Vec<f64> {
    let mut sums = Vec::with_capacity(3 * layers.len());
    for r in clipped(offset, a.len(), layers) {
        let (mut dot, mut a_sq, mut b_sq) = (0.0f64, 0.0f64, 0.0f64);
        for (x, y) in a[r.clone()].iter().zip(&b[r]) {
            let (x, y) = (x.to_f64(), y.to_f64());
            dot += x * y;
            a_sq += x * x;
            b_sq += y * y;
        }
        sums.extend([dot, a_sq, b_sq]);
    }
    sums
}

/// Writes `ca·a + cb·b` into `out` for the slice at `offset` (as in [`partial_sums`]), each layer's
/// coefficients from its whole-layer `sums`.
pub fn apply<T: AdasumFloat>(
    a: &[T],
    b: &[T],
    offset: usize,
    layers: &[usize],
    sums: &[f64],
    out: &mut [T],
) {
    for (r, s) in clipped(offset, a.len(), layers).zip(sums.chunks_exact(3)) {
        let (ca, cb) = coefficients(s[0], s[1], s[2]);
        for ((o, x), y) in out[r.clone()].iter_mut().zip(&a[r.clone()]).zip(&b[r]) {
            *o = T::from_f64(ca * x.to_f64() + cb * y.to_f64());
        }
    }
}

/// Adasum-reduces `buf` in place over the group; `layers` are the segment lengths (summing to
/// `buf.len()`, as checked by the caller) and the group size is a power of two ([`is_supported`]).
pub fn all_reduce<T: AdasumFloat>(ctx: &Ctx, buf: &mut [T], layers: &[usize]) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank;
    let bytes = std::mem::size_of_val(buf);
    let mut mask = 1;
    while mask < n {
        let partner = r ^ mask;
        ctx.send(partner, as_bytes(buf))?;
        let theirs: Vec<T> = vec_from_bytes(&ctx.recv(partner, bytes)?);
        let mine = buf.to_vec();
        // The lower group's vector is `a` on both sides, so both compute the same bits.
        if r & mask == 0 {
            combine(&mine, &theirs, layers, buf);
        } else {
            combine(&theirs, &mine, layers, buf);
        }
        mask <<= 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adasum(a: &[f64], b: &[f64], layers: &[usize]) -> Vec<f64> {
        let mut out = vec![0.0; a.len()];
        combine(a, b, layers, &mut out);
        out
    }

    #[test]
    fn identical_vectors_give_themselves() {
        let a = [1.0, -2.0, 3.5, 0.25];
        assert_eq!(adasum(&a, &a, &[4]), a.to_vec());
        assert_eq!(adasum(&a, &a, &[1, 3]), a.to_vec());
    }

    #[test]
    fn orthogonal_vectors_add() {
        let (a, b) = ([1.0, 0.0, 2.0], [0.0, 3.0, 0.0]);
        assert_eq!(adasum(&a, &b, &[3]), vec![1.0, 3.0, 2.0]);
    }

    #[test]
    fn zero_vector_is_absorbed() {
        let (a, z) = ([1.0, -2.0], [0.0, 0.0]);
        assert_eq!(adasum(&a, &z, &[2]), a.to_vec());
        assert_eq!(adasum(&z, &a, &[2]), a.to_vec());
        assert_eq!(adasum(&z, &z, &[2]), z.to_vec());
    }

    #[test]
    fn segments_have_their_own_coefficients() {
        // Segment 1 identical (result a), segment 2 orthogonal (result a + b).
        let a = [2.0, 1.0, 1.0, 0.0];
        let b = [2.0, 1.0, 0.0, 1.0];
        assert_eq!(adasum(&a, &b, &[2, 2]), vec![2.0, 1.0, 1.0, 1.0]);
        // As one segment: a·b = 5, |a|² = 6, |b|² = 6 → both coefficients 1 − 5/12.
        let c = 1.0 - 5.0 / 12.0;
        let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| c * x + c * y).collect();
        assert_eq!(adasum(&a, &b, &[4]), want);
    }

    #[test]
    fn opposite_vectors_cancel_to_the_general_formula() {
        // a = −b: a·b = −|a|², coefficients 1.5 each → 1.5 a − 1.5 a = 0.
        let a = [1.0, 2.0];
        let b = [-1.0, -2.0];
        assert_eq!(adasum(&a, &b, &[2]), vec![0.0, 0.0]);
    }

    #[test]
    fn slices_sum_to_the_whole() {
        let a: Vec<f64> = (0..10).map(|i| i as f64 - 3.0).collect();
        let b: Vec<f64> = (0..10).map(|i| (i * i) as f64 * 0.5).collect();
        let layers = [3, 0, 6, 1];
        let whole = partial_sums(&a, &b, 0, &layers);
        let left = partial_sums(&a[..4], &b[..4], 0, &layers);
        let right = partial_sums(&a[4..], &b[4..], 4, &layers);
        assert_eq!(whole.len(), 12);
        for i in 0..12 {
            assert_eq!(left[i] + right[i], whole[i], "entry {i}");
        }
        let mut out = vec![0.0; 10];
        combine(&a, &b, &layers, &mut out);
        let mut halves = vec![0.0; 10];
        apply(&a[..4], &b[..4], 0, &layers, &whole, &mut halves[..4]);
        apply(&a[4..], &b[4..], 4, &layers, &whole, &mut halves[4..]);
        assert_eq!(halves, out);
    }

    #[test]
    fn powers_of_two_only() {
        assert!([1, 2, 4, 8, 1024].iter().all(|&n| is_supported(n)));
        assert!([0, 3, 5, 6, 12].iter().all(|&n| !is_supported(n)));
    }
}
