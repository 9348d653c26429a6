//! The lane vectors the Winograd passes work on ([`LANES`] tiles at a time, one SIMD register of
//! f32 per value) and the tiling they come from ([`Tiles`]), the interface of an algorithm's
//! transforms ([`Transforms`]), and the loads, stores and two-sided application between them and
//! the chunk buffers. All `#[inline(always)]`: they are inlined into the vectorized passes of
//! [`super::passes`].

use std::mem::MaybeUninit;

use candle_core::WithDType;

use crate::ops::im2col::Geom;

/// Tiles transformed together.
pub(super) const LANES: usize = 16;

/// The tiling of a chunk of samples: tile rows and columns per sample.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tiles {
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl Tiles {
    /// The tiling of `g`'s output by `m × m` tiles.
    pub(super) fn of(g: &Geom, m: usize) -> Self {
        Tiles {
            rows: g.oh.div_ceil(m),
            cols: g.ow.div_ceil(m),
        }
    }

    pub(super) fn per_sample(&self) -> usize {
        self.rows * self.cols
    }
}

pub(super) type Lanes<T> = [T; LANES];

/// The 1-D transforms of Winograd's F(M, 3) on columns of lane vectors (`A = M + 2` inputs per
/// output tile side): `Bᵀ`, `Aᵀ`, `G` and their adjoints `B`, `A`, `Gᵀ`. A tile's output is
/// `Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A`.
pub(super) trait Transforms<const M: usize, const A: usize> {
    /// `Bᵀ d` (input tile).
    fn b_t<T: WithDType>(d: [Lanes<T>; A]) -> [Lanes<T>; A];
    /// `B v`, the adjoint of [`Transforms::b_t`].
    fn b<T: WithDType>(v: [Lanes<T>; A]) -> [Lanes<T>; A];
    /// `Aᵀ m` (output tile).
    fn a_t<T: WithDType>(m: [Lanes<T>; A]) -> [Lanes<T>; M];
    /// `A y`, the adjoint of [`Transforms::a_t`].
    fn a<T: WithDType>(y: [Lanes<T>; M]) -> [Lanes<T>; A];
    /// `G g` (kernel).
    fn g<T: WithDType>(g: [Lanes<T>; 3]) -> [Lanes<T>; A];
    /// `Gᵀ u`, the adjoint of [`Transforms::g`].
    fn g_t<T: WithDType>(u: [Lanes<T>; A]) -> [Lanes<T>; 3];
}

/// Applies a column transform to every column, then the row transform to every row, of a tile of
/// lane vectors: `Rᵀ t R` for the transform `R` given as `f` (`N` -> `O` values).
#[inline(always)]
pub(super) fn two_sided<T: WithDType, const N: usize, const O: usize>(
    t: &[[Lanes<T>; N]; N],
    f: impl Fn([Lanes<T>; N]) -> [Lanes<T>; O],
) -> [[Lanes<T>; O]; O] {
    // Not a zero-filled array first: that was a `memset` call per tile group.
    let mut cols = MaybeUninit::<[[Lanes<T>; N]; O]>::uninit();
    let at = cols.as_mut_ptr().cast::<Lanes<T>>();
    (0..N).for_each(|j| {
        let out = f(std::array::from_fn(|i| t[i][j]));
        for (i, v) in out.into_iter().enumerate() {
            // SAFETY: `i < O` and `j < N`: inside `cols`.
            unsafe { at.add(i * N + j).write(v) };
        }
    });
    // SAFETY: the loop wrote `cols[i][j]` for every `i < O` and `j < N`.
    let cols = unsafe { cols.assume_init() };
    std::array::from_fn(|i| f(cols[i]))
}

/// `dst[..n] = src[..n]` for `n ≤ LANES`, a fixed-size (vector) copy when `n == LANES` (a
/// `copy_from_slice` of a run-time length is a `memcpy` call, too slow here).
#[inline(always)]
pub(super) fn copy_lanes<T: Copy>(dst: &mut [T], src: &[T], n: usize) {
    if n == LANES {
        dst[..LANES].copy_from_slice(&src[..LANES]);
    } else {
        for (d, s) in dst[..n].iter_mut().zip(&src[..n]) {
            *d = *s;
        }
    }
}

/// Loads a `N × N` tile at `offsets` (up to [`LANES`] of them, rows `pw` apart) from `src` into
/// lane vectors; missing lanes are zero.
#[inline(always)]
pub(super) fn load<T: WithDType, const N: usize>(
    src: &[T],
    offsets: &[usize],
    pw: usize,
) -> [[Lanes<T>; N]; N] {
    if let Some(d) = super::f32x8::load(src, offsets, pw) {
        return d;
    }
    let mut d = [[[T::zero(); LANES]; N]; N];
    for (l, &at) in offsets.iter().enumerate() {
        for (i, row) in d.iter_mut().enumerate() {
            let line = &src[at + i * pw..at + i * pw + N];
            for j in 0..N {
                row[j][l] = line[j];
            }
        }
    }
    d
}

/// Stores the `A·A` lane vectors of a transformed tile: element `e` of lane `l` into
/// `dst[e·plane + l]`.
#[inline(always)]
pub(super) fn store<T: WithDType, const A: usize>(
    dst: &mut [T],
    plane: usize,
    tile: &[[Lanes<T>; A]; A],
    n: usize,
) {
    for (e, v) in tile.iter().flatten().enumerate() {
        copy_lanes(&mut dst[e * plane..], v, n);
    }
}
