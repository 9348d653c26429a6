//! The transforms of the two Winograd algorithms kolo uses, on columns of lane vectors:
//! F(4×4, 3×3) ([`F4`]: 6×6 input tiles, 36 products per output tile of 16, the common case) and
//! F(2×2, 3×3) ([`F2`]: 4×4 input tiles, 16 products per output tile of 4, for small images with
//! many channels, where F(4, 3)'s larger transformed kernels cost more than they save).
//!
//! Matrices as in Lavin & Gray (2016); `B`, `A` and `Gᵀ` are the adjoints the backward pass uses.

use candle_core::WithDType;

use super::lanes::{Lanes, Transforms, LANES};

fn k<T: WithDType>(v: f64) -> T {
    T::from_f64(v)
}

/// Winograd F(4×4, 3×3): 4 outputs per tile side from 6 inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct F4;

/// Winograd F(2×2, 3×3): 2 outputs per tile side from 4 inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct F2;

impl Transforms<4, 6> for F4 {
    /// `Bᵀ d` for a column of 6 lane vectors.
    #[inline(always)]
    fn b_t<T: WithDType>(d: [Lanes<T>; 6]) -> [Lanes<T>; 6] {
        let (two, four, five) = (k::<T>(2.), k::<T>(4.), k::<T>(5.));
        let mut o = [[T::zero(); LANES]; 6];
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

    /// `B v` for a column of 6 lane vectors (the adjoint of [`b_t`](Self::b_t)).
    #[inline(always)]
    fn b<T: WithDType>(v: [Lanes<T>; 6]) -> [Lanes<T>; 6] {
        let (two, four, five) = (k::<T>(2.), k::<T>(4.), k::<T>(5.));
        let mut o = [[T::zero(); LANES]; 6];
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
    fn a_t<T: WithDType>(m: [Lanes<T>; 6]) -> [Lanes<T>; 4] {
        let (two, four, eight) = (k::<T>(2.), k::<T>(4.), k::<T>(8.));
        let mut o = [[T::zero(); LANES]; 4];
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

    /// `A y` for a column of 4 lane vectors (the adjoint of [`a_t`](Self::a_t)).
    #[inline(always)]
    fn a<T: WithDType>(y: [Lanes<T>; 4]) -> [Lanes<T>; 6] {
        let (two, four, eight) = (k::<T>(2.), k::<T>(4.), k::<T>(8.));
        let mut o = [[T::zero(); LANES]; 6];
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
    fn g<T: WithDType>(g: [Lanes<T>; 3]) -> [Lanes<T>; 6] {
        let (quarter, sixth, twelfth, twenty_fourth) = (
            k::<T>(0.25),
            k::<T>(1. / 6.),
            k::<T>(1. / 12.),
            k::<T>(1. / 24.),
        );
        let mut o = [[T::zero(); LANES]; 6];
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

    /// `Gᵀ u` for a column of 6 lane vectors (the adjoint of [`g`](Self::g)).
    #[inline(always)]
    fn g_t<T: WithDType>(u: [Lanes<T>; 6]) -> [Lanes<T>; 3] {
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
}

impl Transforms<2, 4> for F2 {
    /// `Bᵀ = [[1, 0, −1, 0], [0, 1, 1, 0], [0, −1, 1, 0], [0, 1, 0, −1]]`.
    #[inline(always)]
    fn b_t<T: WithDType>(d: [Lanes<T>; 4]) -> [Lanes<T>; 4] {
        let mut o = [[T::zero(); LANES]; 4];
        for l in 0..LANES {
            let [d0, d1, d2, d3] = [d[0][l], d[1][l], d[2][l], d[3][l]];
            o[0][l] = d0 - d2;
            o[1][l] = d1 + d2;
            o[2][l] = d2 - d1;
            o[3][l] = d1 - d3;
        }
        o
    }

    #[inline(always)]
    fn b<T: WithDType>(v: [Lanes<T>; 4]) -> [Lanes<T>; 4] {
        let mut o = [[T::zero(); LANES]; 4];
        for l in 0..LANES {
            let [v0, v1, v2, v3] = [v[0][l], v[1][l], v[2][l], v[3][l]];
            o[0][l] = v0;
            o[1][l] = v1 - v2 + v3;
            o[2][l] = v1 + v2 - v0;
            o[3][l] = T::zero() - v3;
        }
        o
    }

    /// `Aᵀ = [[1, 1, 1, 0], [0, 1, −1, −1]]`.
    #[inline(always)]
    fn a_t<T: WithDType>(m: [Lanes<T>; 4]) -> [Lanes<T>; 2] {
        let mut o = [[T::zero(); LANES]; 2];
        for l in 0..LANES {
            let [m0, m1, m2, m3] = [m[0][l], m[1][l], m[2][l], m[3][l]];
            o[0][l] = m0 + m1 + m2;
            o[1][l] = m1 - m2 - m3;
        }
        o
    }

    #[inline(always)]
    fn a<T: WithDType>(y: [Lanes<T>; 2]) -> [Lanes<T>; 4] {
        let mut o = [[T::zero(); LANES]; 4];
        for l in 0..LANES {
            let [y0, y1] = [y[0][l], y[1][l]];
            o[0][l] = y0;
            o[1][l] = y0 + y1;
            o[2][l] = y0 - y1;
            o[3][l] = T::zero() - y1;
        }
        o
    }

    /// `G = [[1, 0, 0], [½, ½, ½], [½, −½, ½], [0, 0, 1]]`.
    #[inline(always)]
    fn g<T: WithDType>(g: [Lanes<T>; 3]) -> [Lanes<T>; 4] {
        let half = k::<T>(0.5);
        let mut o = [[T::zero(); LANES]; 4];
        for l in 0..LANES {
            let [g0, g1, g2] = [g[0][l], g[1][l], g[2][l]];
            let (outer, middle) = ((g0 + g2) * half, g1 * half);
            o[0][l] = g0;
            o[1][l] = outer + middle;
            o[2][l] = outer - middle;
            o[3][l] = g2;
        }
        o
    }

    #[inline(always)]
    fn g_t<T: WithDType>(u: [Lanes<T>; 4]) -> [Lanes<T>; 3] {
        let half = k::<T>(0.5);
        let mut o = [[T::zero(); LANES]; 3];
        for l in 0..LANES {
            let [u0, u1, u2, u3] = [u[0][l], u[1][l], u[2][l], u[3][l]];
            let (sum, diff) = ((u1 + u2) * half, (u1 - u2) * half);
            o[0][l] = u0 + sum;
            o[1][l] = diff;
            o[2][l] = sum + u3;
        }
        o
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

    /// One output row of `M` from `A` inputs: `Aᵀ[(G g) ⊙ (Bᵀ d)]` is the correlation of `d` with
    /// `g`; and the adjoint transforms are the transposes (`<R x, y> = <x, Rᵀ y>`).
    fn check<W: Transforms<M, A>, const M: usize, const A: usize>() {
        let d: [f64; A] = std::array::from_fn(|i| [0.3, -1.2, 2.5, 0.7, -0.4, 1.9][i]);
        let gv = [0.6, -0.8, 1.1];
        let (gg, bd) = (first(W::g(lanes(gv))), first(W::b_t(lanes(d))));
        let y = first(W::a_t(lanes(std::array::from_fn(|i| gg[i] * bd[i]))));
        for (i, yi) in y.iter().enumerate() {
            let want: f64 = (0..3).map(|j| gv[j] * d[i + j]).sum();
            assert!(
                (yi - want).abs() < 1e-12,
                "F({M}, 3) output {i}: {yi} vs {want}"
            );
        }
        let yv: [f64; M] = std::array::from_fn(|i| [0.5, -1.5, 2.0, 0.25][i]);
        let lhs = dot(first(W::a(lanes(yv))), d);
        assert!(
            (lhs - dot(yv, first(W::a_t(lanes(d))))).abs() < 1e-12,
            "F({M}, 3): A"
        );
        let lhs = dot(gg, d);
        assert!(
            (lhs - dot(gv, first(W::g_t(lanes(d))))).abs() < 1e-12,
            "F({M}, 3): Gᵀ"
        );
        let v: [f64; A] = std::array::from_fn(|i| [1.5, -0.5, 0.75, 2.0, -1.25, 0.5][i]);
        let lhs = dot(first(W::b_t(lanes(d))), v);
        assert!(
            (lhs - dot(d, first(W::b(lanes(v))))).abs() < 1e-12,
            "F({M}, 3): B"
        );
    }

    #[test]
    fn one_dimensional_transforms_compute_a_correlation() {
        check::<F4, 4, 6>();
        check::<F2, 2, 4>();
    }
}
