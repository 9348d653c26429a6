//! The passes of the Winograd convolution over a chunk's buffers, each compiled for the CPU's
//! vector extension ([`crate::ops::simd`]): input, output-gradient and kernel transforms and
//! their inverses, for either algorithm (`W`: F(M×M, 3×3) on `A×A` input tiles, `A = M + 2`).

use candle_core::WithDType;

use super::lanes::{copy_lanes, load, store, two_sided, Lanes, Tiles, Transforms, LANES};
use crate::ops::scratch::kept_vec;
use crate::ops::simd::vectorized_fn;

/// Every `N × N` tile of every channel of the padded chunk `p` (planes of `pp` values, rows `pw`
/// apart; tiles at `offsets` within a plane) through the two-sided transform `f`, stored as
/// `out[e][channel][tile]` (`[A·A, channels, tiles]`).
#[inline(always)]
fn transform_tiles<T: WithDType, const N: usize, const A: usize>(
    (p, pp, pw): (&[T], usize, usize),
    offsets: &[usize],
    out: &mut [T],
    f: impl Fn([Lanes<T>; N]) -> [Lanes<T>; A],
) {
    let n_tiles = offsets.len();
    let channels = out.len() / (A * A * n_tiles).max(1);
    let plane = channels * n_tiles;
    for ch in 0..channels {
        for (gi, group) in offsets.chunks(LANES).enumerate() {
            let mut at = [0; LANES];
            for (a, &o) in at.iter_mut().zip(group) {
                *a = o + ch * pp;
            }
            let tile = two_sided(&load::<T, N>(p, &at[..group.len()], pw), &f);
            let dst = &mut out[ch * n_tiles + gi * LANES..];
            store(dst, plane, &tile, group.len());
        }
    }
}

vectorized_fn! {
/// `V[e][c][t]` (`[A·A, C, tiles]`): `Bᵀ d B` of the `A×A` input tiles of the padded chunk `p`
/// (`[bc, C, ph, pw]`, planes of `pp` values) at `offsets`.
pub(super) fn input_transform<T: WithDType, W: Transforms<M, A>, const M: usize, const A: usize>(
    p: &[T],
    pp: usize,
    pw: usize,
    offsets: &[usize],
    v: &mut [T],
) {
    transform_tiles::<T, A, A>((p, pp, pw), offsets, v, W::b_t);
}
}

vectorized_fn! {
/// `dM[e][k][t]` (`[A·A, c_out, tiles]`): `A dy Aᵀ` of the `M×M` output-gradient tiles of the
/// padded chunk `p` (`[bc, c_out, M·rows, M·cols]`, planes of `pp` values) at `offsets`.
pub(super) fn grad_transform<T: WithDType, W: Transforms<M, A>, const M: usize, const A: usize>(
    p: &[T],
    pp: usize,
    pw: usize,
    offsets: &[usize],
    dm: &mut [T],
) {
    transform_tiles::<T, M, A>((p, pp, pw), offsets, dm, W::a);
}
}

/// Where a chunk's output goes: samples from `b0` of the `[B, c_out, oh, ow]` output.
pub(super) struct OutChunk<'a, T> {
    pub(super) y: &'a mut [T],
    pub(super) b0: usize,
    pub(super) c_out: usize,
    pub(super) oh: usize,
    pub(super) ow: usize,
}

vectorized_fn! {
/// `y = Aᵀ M A (+ bias)` for every tile and output channel of a chunk (`m`: `[A·A, c_out,
/// tiles]`).
pub(super) fn output_transform<T: WithDType, W: Transforms<M, A>, const M: usize, const A: usize>(
    m: &[T],
    t: Tiles,
    bias: Option<&[T]>,
    out: OutChunk<T>,
) {
    let c_out = out.c_out;
    let n_tiles = m.len() / (A * A * c_out).max(1);
    let plane = c_out * n_tiles;
    let (oh, ow) = (out.oh, out.ow);
    // Made once, not per group of tiles: lanes past a partial group's `n` keep stale values,
    // transformed but never stored.
    let mut mm = [[[T::zero(); LANES]; A]; A];
    // Row i of tile l as rows[i][l][..M]: a contiguous run of the output row (8 values: the
    // f32 path's transposes write whole vectors).
    let mut rows = [[[T::zero(); 8]; LANES]; M];
    for co in 0..c_out {
        let b = bias.map_or(T::zero(), |b| b[co]);
        for t0 in (0..n_tiles).step_by(LANES) {
            let n = LANES.min(n_tiles - t0);
            for (e, v) in mm.iter_mut().flatten().enumerate() {
                let at = e * plane + co * n_tiles + t0;
                copy_lanes(v, &m[at..], n);
            }
            let tile = two_sided(&mm, W::a_t);
            if !super::f32x8::rows_of(&tile, b, &mut rows) {
                for (i, row) in rows.iter_mut().enumerate() {
                    for (l, run) in row.iter_mut().enumerate() {
                        for (j, v) in run.iter_mut().take(M).enumerate() {
                            *v = tile[i][j][l] + b;
                        }
                    }
                }
            }
            for l in 0..n {
                let tile_idx = t0 + l;
                let (bi, r) = (tile_idx / t.per_sample(), tile_idx % t.per_sample());
                let (oy0, ox0) = (M * (r / t.cols), M * (r % t.cols));
                let base = ((out.b0 + bi) * c_out + co) * oh * ow;
                let cols = M.min(ow - ox0);
                for (i, row) in rows.iter().enumerate().take(M.min(oh - oy0)) {
                    let at = base + (oy0 + i) * ow + ox0;
                    let src = &row[l][..M];
                    if cols == M {
                        out.y[at..at + M].copy_from_slice(src);
                    } else {
                        for (d, s) in out.y[at..at + cols].iter_mut().zip(src) {
                            *d = *s;
                        }
                    }
                }
            }
        }
    }
}
}

vectorized_fn! {
/// `U[e][co][c]` (`[A·A, c_out, C]`) = `G g Gᵀ` of every 3×3 kernel of `w` (`[c_out, C, 3, 3]`),
/// in a buffer from the thread's pool of kept ones (every value is written; hand it back with
/// `scratch::keep_vec`).
pub(super) fn kernel_transform<T: WithDType, W: Transforms<M, A>, const M: usize, const A: usize>(
    w: &[T],
    c_out: usize,
    c: usize,
) -> Vec<T> {
    let plane = c_out * c;
    let mut u = kept_vec::<T>(A * A * plane);
    for kc0 in (0..plane).step_by(LANES) {
        let n = LANES.min(plane - kc0);
        let gg = super::f32x8::load_kernels(w, kc0).unwrap_or_else(|| {
            let offsets: [usize; LANES] = std::array::from_fn(|l| (kc0 + l) * 9);
            load::<T, 3>(w, &offsets[..n], 3)
        });
        store(&mut u[kc0..], plane, &two_sided(&gg, W::g), n);
    }
    u
}
}

vectorized_fn! {
/// The kernel gradient `[c_out, C, 3, 3]` from `dU` (`[A·A, c_out, C]`): `Gᵀ dU G` per kernel,
/// appended to `dw` in order (no zeroed buffer first, no copy after).
pub(super) fn kernel_grad_transform<T: WithDType, W: Transforms<M, A>, const M: usize, const A: usize>(
    du: &[T],
    c_out: usize,
    c: usize,
    dw: &mut Vec<T>,
) {
    let plane = c_out * c;
    dw.reserve(9 * plane);
    // Kernel after kernel, as they are appended (lanes past `n` are stale and not appended).
    let mut kernels = [T::zero(); LANES * 9];
    let mut t = [[[T::zero(); LANES]; A]; A];
    for kc0 in (0..plane).step_by(LANES) {
        let n = LANES.min(plane - kc0);
        for (e, v) in t.iter_mut().flatten().enumerate() {
            copy_lanes(v, &du[e * plane + kc0..], n);
        }
        let dg = two_sided(&t, W::g_t);
        if !super::f32x8::kernels_of(&dg, &mut kernels) {
            for (l, out) in kernels.chunks_exact_mut(9).enumerate() {
                for i in 0..3 {
                    for j in 0..3 {
                        out[i * 3 + j] = dg[i][j][l];
                    }
                }
            }
        }
        dw.extend_from_slice(&kernels[..n * 9]);
    }
}
}

vectorized_fn! {
/// The adjoint of [`input_transform`]: `B dV Bᵀ` of every tile of `dv` (`[A·A, C, tiles]`) added
/// into the padded chunk gradient `pdx` (`[bc, C, ph, pw]`, planes of `pp` values) at `offsets`
/// (overlapping tiles add up).
pub(super) fn input_grad_transform<T: WithDType, W: Transforms<M, A>, const M: usize, const A: usize>(
    dv: &[T],
    pp: usize,
    pw: usize,
    offsets: &[usize],
    pdx: &mut [T],
) {
    let n_tiles = offsets.len();
    let c = dv.len() / (A * A * n_tiles).max(1);
    let plane = c * n_tiles;
    // Lanes past a partial group's length keep stale values, never added anywhere.
    let mut tile = [[[T::zero(); LANES]; A]; A];
    for ci in 0..c {
        for (gi, group) in offsets.chunks(LANES).enumerate() {
            let t0 = ci * n_tiles + gi * LANES;
            for (e, v) in tile.iter_mut().flatten().enumerate() {
                copy_lanes(v, &dv[e * plane + t0..], group.len());
            }
            let d = two_sided(&tile, W::b);
            if super::f32x8::add_into(&d, group, pw, &mut pdx[ci * pp..]) {
                continue;
            }
            for (l, &o) in group.iter().enumerate() {
                let at = o + ci * pp;
                for (i, row) in d.iter().enumerate() {
                    let line = &mut pdx[at + i * pw..at + i * pw + A];
                    for (dst, v) in line.iter_mut().zip(row) {
                        *dst += v[l];
                    }
                }
            }
        }
    }
}
}
