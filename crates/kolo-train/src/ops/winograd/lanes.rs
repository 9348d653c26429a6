//! The Winograd F(4×4, 3×3) transforms on lane vectors ([`LANES`] tiles at a time), with the
//! loads and stores between them and the chunk buffers. All `#[inline(always)]`: they are inlined
//! into the vectorized passes of [`super::passes`].

use candle_core::WithDType;

use super::{A, LANES, M};

pub(super) type Lanes<T> = [T; LANES];

fn k<T: WithDType>(v: f64) -> T {
    T::from_f64(v)
}

/// `Bᵀ d` for a column of 6 lane vectors.
#[inline(always)]
pub(super) fn b_t<T: WithDType>(d: [Lanes<T>; A]) -> [Lanes<T>; A] {
    let (two, four, five) = (k::<T>(2.), k::<T>(4.), k::<T>(5.));
    let mut o = [[T::zero(); LANES]; A];
    for l in 0..LANES {
        let [d0, d1, d2, d3, d4, d5] = [d[0][l], d[1][l], d[2][l], d[3][l], d[4][l], d[5][l]];
        o[0][l] = four * d0 - five * d2 + d4;
        o[1][l] = d3 + d4 - four * (d1 + d2);
        o[2][l] = four * (d1 - d2) + d4 - d3;
        o[3][l] = two * (d3 - d1) + d4 - d2;
        o[4][l] = two * (d1 - d3) + d4 - d2;
        o[5][l] = four * d1 - five * d3 + d5;
    }
    o
}

/// `B v` for a column of 6 lane vectors (the adjoint of [`b_t`]).
#[inline(always)]
pub(super) fn b<T: WithDType>(v: [Lanes<T>; A]) -> [Lanes<T>; A] {
    let (two, four, five) = (k::<T>(2.), k::<T>(4.), k::<T>(5.));
    let mut o = [[T::zero(); LANES]; A];
    for l in 0..LANES {
        let [v0, v1, v2, v3, v4, v5] = [v[0][l], v[1][l], v[2][l], v[3][l], v[4][l], v[5][l]];
        let (p12, d12, p34, d34) = (v1 + v2, v2 - v1, v3 + v4, v4 - v3);
        o[0][l] = four * v0;
        o[1][l] = four * (d12 + v5) + two * d34;
        o[2][l] = T::zero() - five * v0 - four * p12 - p34;
        o[3][l] = two * (v3 - v4) - d12 - five * v5;
        o[4][l] = v0 + p12 + p34;
        o[5][l] = v5;
    }
    o
}

/// `Aᵀ m` for a column of 6 lane vectors.
#[inline(always)]
pub(super) fn a_t<T: WithDType>(m: [Lanes<T>; A]) -> [Lanes<T>; M] {
    let (two, four, eight) = (k::<T>(2.), k::<T>(4.), k::<T>(8.));
    let mut o = [[T::zero(); LANES]; M];
    for l in 0..LANES {
        let [m0, m1, m2, m3, m4, m5] = [m[0][l], m[1][l], m[2][l], m[3][l], m[4][l], m[5][l]];
        let (p12, d12, p34, d34) = (m1 + m2, m1 - m2, m3 + m4, m3 - m4);
        o[0][l] = m0 + p12 + p34;
        o[1][l] = d12 + two * d34;
        o[2][l] = p12 + four * p34;
        o[3][l] = d12 + eight * d34 + m5;
    }
    o
}

/// `A y` for a column of 4 lane vectors (the adjoint of [`a_t`]).
#[inline(always)]
pub(super) fn a<T: WithDType>(y: [Lanes<T>; M]) -> [Lanes<T>; A] {
    let (two, four, eight) = (k::<T>(2.), k::<T>(4.), k::<T>(8.));
    let mut o = [[T::zero(); LANES]; A];
    for l in 0..LANES {
        let [y0, y1, y2, y3] = [y[0][l], y[1][l], y[2][l], y[3][l]];
        let (even, odd) = (y0 + y2, y1 + y3);
        let (even4, odd4) = (y0 + four * y2, two * y1 + eight * y3);
        o[0][l] = y0;
        o[1][l] = even + odd;
        o[2][l] = even - odd;
        o[3][l] = even4 + odd4;
        o[4][l] = even4 - odd4;
        o[5][l] = y3;
    }
    o
}

/// `G g` for a column of 3 lane vectors.
#[inline(always)]
pub(super) fn g<T: WithDType>(g: [Lanes<T>; 3]) -> [Lanes<T>; A] {
    let (quarter, sixth, twelfth, twenty_fourth) = (
        k::<T>(0.25),
        k::<T>(1. / 6.),
        k::<T>(1. / 12.),
        k::<T>(1. / 24.),
    );
    let mut o = [[T::zero(); LANES]; A];
    for l in 0..LANES {
        let [g0, g1, g2] = [g[0][l], g[1][l], g[2][l]];
        let (p, q) = ((g0 + g2) * sixth, g0 * twenty_fourth + g2 * sixth);
        o[0][l] = g0 * quarter;
        o[1][l] = T::zero() - p - g1 * sixth;
        o[2][l] = g1 * sixth - p;
        o[3][l] = q + g1 * twelfth;
        o[4][l] = q - g1 * twelfth;
        o[5][l] = g2;
    }
    o
}

/// `Gᵀ u` for a column of 6 lane vectors (the adjoint of [`g`]).
#[inline(always)]
pub(super) fn g_t<T: WithDType>(u: [Lanes<T>; A]) -> [Lanes<T>; 3] {
    let (quarter, sixth, twelfth, twenty_fourth) = (
        k::<T>(0.25),
        k::<T>(1. / 6.),
        k::<T>(1. / 12.),
        k::<T>(1. / 24.),
    );
    let mut o = [[T::zero(); LANES]; 3];
    for l in 0..LANES {
        let [u0, u1, u2, u3, u4, u5] = [u[0][l], u[1][l], u[2][l], u[3][l], u[4][l], u[5][l]];
        let (p12, p34) = (u1 + u2, u3 + u4);
        o[0][l] = u0 * quarter - p12 * sixth + p34 * twenty_fourth;
        o[1][l] = (u2 - u1) * sixth + (u3 - u4) * twelfth;
        o[2][l] = (p34 - p12) * sixth + u5;
    }
    o
}

/// Applies a column transform to every column, then the row transform to every row, of a tile of
/// lane vectors: `Rᵀ t R` for the transform `R` given as `f` (`N` -> `O` values).
#[inline(always)]
pub(super) fn two_sided<T: WithDType, const N: usize, const O: usize>(
    t: &[[Lanes<T>; N]; N],
    f: impl Fn([Lanes<T>; N]) -> [Lanes<T>; O],
) -> [[Lanes<T>; O]; O] {
    let mut cols = [[[T::zero(); LANES]; N]; O];
    for j in 0..N {
        let out = f(std::array::from_fn(|i| t[i][j]));
        for (i, v) in out.into_iter().enumerate() {
            cols[i][j] = v;
        }
    }
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

/// Stores the 36 lane vectors of a transformed tile: element `e` of lane `l` into
/// `dst[e·plane + l]`.
#[inline(always)]
pub(super) fn store<T: WithDType>(
    dst: &mut [T],
    plane: usize,
    tile: &[[Lanes<T>; A]; A],
    n: usize,
) {
    for (e, v) in tile.iter().flatten().enumerate() {
        copy_lanes(&mut dst[e * plane..], v, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes<const N: usize>(v: [f64; N]) -> [Lanes<f64>; N] {
        std::array::from_fn(|i| {
            let mut l = [0.; LANES];
            l[0] = v[i];
            l
        })
    }

    fn first<const N: usize>(v: [Lanes<f64>; N]) -> [f64; N] {
        std::array::from_fn(|i| v[i][0])
    }

    fn dot<const N: usize>(a: [f64; N], b: [f64; N]) -> f64 {
        a.iter().zip(&b).map(|(x, y)| x * y).sum()
    }

    /// One output row of 4 from 6 inputs: `Aᵀ[(G g) ⊙ (Bᵀ d)]` is the correlation of `d` with `g`;
    /// and the adjoint transforms are the transposes (`<R x, y> = <x, Rᵀ y>`).
    #[test]
    fn one_dimensional_transforms_compute_a_correlation() {
        let d = [0.3, -1.2, 2.5, 0.7, -0.4, 1.9];
        let gv = [0.6, -0.8, 1.1];
        let (gg, bd) = (first(g(lanes(gv))), first(b_t(lanes(d))));
        let y = first(a_t(lanes(std::array::from_fn(|i| gg[i] * bd[i]))));
        for (i, yi) in y.iter().enumerate() {
            let want: f64 = (0..3).map(|j| gv[j] * d[i + j]).sum();
            assert!((yi - want).abs() < 1e-12, "{i}: {yi} vs {want}");
        }
        let yv = [0.5, -1.5, 2.0, 0.25];
        let lhs = dot(first(a(lanes(yv))), d);
        assert!((lhs - dot(yv, first(a_t(lanes(d))))).abs() < 1e-12);
        let lhs = dot(gg, d);
        assert!((lhs - dot(gv, first(g_t(lanes(d))))).abs() < 1e-12);
        let v = [1.5, -0.5, 0.75, 2.0, -1.25, 0.5];
        let lhs = dot(first(b_t(lanes(d))), v);
        assert!((lhs - dot(d, first(b(lanes(v))))).abs() < 1e-12);
    }
}
