//! Winograd F(4×4, 3×3) for the 3×3 stride-1 convolutions (Lavin & Gray, "Fast Algorithms for
//! Convolutional Neural Networks", 2016): forward pass and kernel gradient; the input gradient of
//! a stride-1 convolution is itself such a convolution (of the output gradient with the flipped
//! kernel, see [`super::conv`]).
//!
//! A 4×4 output tile from a 6×6 input tile `d` and a 3×3 kernel `g` is `Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A`:
//! 36 multiplications per channel pair instead of 144. Summed over input channels, the 36
//! element-wise products become 36 GEMMs `M[e] = U[e] @ V[e]` (`U[e]`: `[c_out, C]` transformed
//! kernels, `V[e]`: `[C, tiles]` transformed input tiles), done chunk by chunk of samples so that
//! `V` and `M` stay in cache. The kernel gradient is the adjoint: `dg = Gᵀ[Σ_tiles (A dy Aᵀ) ⊙
//! (Bᵀ d B)]G`, 36 GEMMs `dU[e] += dM[e] @ V[e]ᵀ`.
//!
//! The transforms work on [`LANES`] tiles at a time (one SIMD register of f32 per value).

use candle_core::{Layout, Result, WithDType};

use super::gemm::{matmul_into, MatRef};
use super::im2col::Geom;
use super::simd::vectorized_fn;

/// Output tile side.
const M: usize = 4;
/// Input tile side (`M + 3 − 1`).
const A: usize = 6;
/// Elements of a transformed tile: one GEMM each.
const E: usize = A * A;
/// Tiles transformed together.
const LANES: usize = 16;

type Lanes<T> = [T; LANES];

/// Whether `g` (with `c_out` output channels) runs on the Winograd path: 3×3, stride 1, enough
/// channels on both sides for the 36 GEMMs to be efficient, and enough tiles to pay for the
/// kernel transforms.
///
/// The cost model, per pair of channels: the direct (im2col) GEMM does `2·9·B·oh·ow` flops;
/// Winograd `2·36·tiles` plus the transformed kernels, 36 values written and read again
/// (`36·8` bytes, about 20 flops' time per byte at this class of CPU's GEMM speed and memory
/// bandwidth). With few tiles per kernel — ResNet's 512-channel stage on 4×4 images — the
/// kernel transforms cost as much as they save; Winograd is taken when it is at least 1.25×
/// cheaper.
pub(super) fn eligible(g: &Geom, c_out: usize) -> bool {
    const MIN_CHANNELS: usize = 8;
    const KERNEL_TRANSFORM_FLOPS: usize = E * 8 * 20;
    if !(g.k == 3 && g.stride == 1 && g.c >= MIN_CHANNELS && c_out >= MIN_CHANNELS && g.b > 0) {
        return false;
    }
    let tiles = g.b * Tiles::of(g).per_sample();
    let direct = 2 * 9 * g.b * g.oh * g.ow;
    let winograd = 2 * E * tiles + KERNEL_TRANSFORM_FLOPS;
    4 * direct >= 5 * winograd
}

fn k<T: WithDType>(v: f64) -> T {
    T::from_f64(v)
}

/// `Bᵀ d` for a column of 6 lane vectors.
#[inline(always)]
fn b_t<T: WithDType>(d: [Lanes<T>; A]) -> [Lanes<T>; A] {
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

/// `Aᵀ m` for a column of 6 lane vectors.
#[inline(always)]
fn a_t<T: WithDType>(m: [Lanes<T>; A]) -> [Lanes<T>; M] {
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
fn a<T: WithDType>(y: [Lanes<T>; M]) -> [Lanes<T>; A] {
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
fn g<T: WithDType>(g: [Lanes<T>; 3]) -> [Lanes<T>; A] {
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
fn g_t<T: WithDType>(u: [Lanes<T>; A]) -> [Lanes<T>; 3] {
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
fn two_sided<T: WithDType, const N: usize, const O: usize>(
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

/// The tiling of a chunk of samples: tile rows and columns per sample.
#[derive(Debug, Clone, Copy)]
struct Tiles {
    rows: usize,
    cols: usize,
}

impl Tiles {
    fn of(g: &Geom) -> Self {
        Tiles {
            rows: g.oh.div_ceil(M),
            cols: g.ow.div_ceil(M),
        }
    }

    fn per_sample(&self) -> usize {
        self.rows * self.cols
    }
}

/// Samples per chunk: `V` and `M` of a chunk within about 4 MiB.
fn chunk(g: &Geom, c_out: usize, t: Tiles) -> usize {
    const BUDGET_BYTES: usize = 4 << 20;
    let per_sample = E * (g.c + c_out) * t.per_sample() * std::mem::size_of::<f32>();
    (BUDGET_BYTES / per_sample.max(1)).clamp(1, g.b.max(1))
}

/// Samples `b0..b0 + bc` of `x` (`[B, C, H, W]`, any strides), zero-padded to
/// `[bc, C, 4·rows + 2, 4·cols + 2]` with `g.padding` rows and columns before the data: every
/// input tile lies inside.
fn pad_input<T: WithDType>(
    x: (&[T], &Layout),
    g: &Geom,
    t: Tiles,
    (b0, bc): (usize, usize),
) -> Result<Vec<T>> {
    let [s0, s1, s2, s3]: [usize; 4] = match x.1.stride().try_into() {
        Ok(s) => s,
        Err(_) => candle_core::bail!("kolo-conv2d: expected a rank-4 input"),
    };
    let src = &x.0[x.1.start_offset()..];
    let (ph, pw) = (M * t.rows + 2, M * t.cols + 2);
    let mut out = vec![T::zero(); bc * g.c * ph * pw];
    for (plane_idx, plane) in out.chunks_mut(ph * pw).enumerate() {
        let (bi, c) = (plane_idx / g.c, plane_idx % g.c);
        for iy in 0..g.h {
            let at = (b0 + bi) * s0 + c * s1 + iy * s2;
            let row = &mut plane[(iy + g.padding) * pw + g.padding..][..g.w];
            if s3 == 1 {
                row.copy_from_slice(&src[at..at + g.w]);
            } else {
                for (ix, v) in row.iter_mut().enumerate() {
                    *v = src[at + ix * s3];
                }
            }
        }
    }
    Ok(out)
}

/// For each tile of a chunk, in order (sample, tile row, tile column): the offset of its top-left
/// corner in one channel's plane of `ph × pw` (plus the sample's `plane_stride` offset).
fn tile_offsets(bc: usize, t: Tiles, step: usize, pw: usize, sample_stride: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(bc * t.per_sample());
    for bi in 0..bc {
        for ty in 0..t.rows {
            for tx in 0..t.cols {
                out.push(bi * sample_stride + step * ty * pw + step * tx);
            }
        }
    }
    out
}

/// `dst[..n] = src[..n]` for `n ≤ LANES`, a fixed-size (vector) copy when `n == LANES` (a
/// `copy_from_slice` of a run-time length is a `memcpy` call, too slow here).
#[inline(always)]
fn copy_lanes<T: Copy>(dst: &mut [T], src: &[T], n: usize) {
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
fn load<T: WithDType, const N: usize>(
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
fn store<T: WithDType>(dst: &mut [T], plane: usize, tile: &[[Lanes<T>; A]; A], n: usize) {
    for (e, v) in tile.iter().flatten().enumerate() {
        copy_lanes(&mut dst[e * plane..], v, n);
    }
}

vectorized_fn! {
/// `V[e][c][t]` (`[36, C, tiles]`) of the padded chunk `p` (`[bc, C, ph, pw]`, planes of `pp`
/// values) for the tiles at `offsets`.
fn input_transform<T: WithDType>(p: &[T], pp: usize, pw: usize, offsets: &[usize], v: &mut [T]) {
    let n_tiles = offsets.len();
    let c = v.len() / (E * n_tiles).max(1);
    let plane = c * n_tiles;
    for ci in 0..c {
        for (gi, group) in offsets.chunks(LANES).enumerate() {
            let mut at = [0; LANES];
            for (a, &o) in at.iter_mut().zip(group) {
                *a = o + ci * pp;
            }
            let d = load::<T, A>(p, &at[..group.len()], pw);
            let tile = two_sided(&d, b_t);
            store(
                &mut v[ci * n_tiles + gi * LANES..],
                plane,
                &tile,
                group.len(),
            );
        }
    }
}
}

vectorized_fn! {
/// `dM[e][k][t]` (`[36, c_out, tiles]`): `A dy Aᵀ` of the 4×4 output-gradient tiles of the padded
/// chunk `p` (`[bc, c_out, 4·rows, 4·cols]`, planes of `pp` values).
fn grad_transform<T: WithDType>(p: &[T], pp: usize, pw: usize, offsets: &[usize], dm: &mut [T]) {
    let n_tiles = offsets.len();
    let c_out = dm.len() / (E * n_tiles).max(1);
    let plane = c_out * n_tiles;
    for co in 0..c_out {
        for (gi, group) in offsets.chunks(LANES).enumerate() {
            let mut at = [0; LANES];
            for (a, &o) in at.iter_mut().zip(group) {
                *a = o + co * pp;
            }
            let dy = load::<T, M>(p, &at[..group.len()], pw);
            let tile = two_sided(&dy, a);
            store(
                &mut dm[co * n_tiles + gi * LANES..],
                plane,
                &tile,
                group.len(),
            );
        }
    }
}
}

/// Where a chunk's output goes: samples from `b0` of the `[B, c_out, oh, ow]` output.
struct OutChunk<'a, T> {
    y: &'a mut [T],
    b0: usize,
    c_out: usize,
    oh: usize,
    ow: usize,
}

vectorized_fn! {
/// `y = Aᵀ M A (+ bias)` for every tile and output channel of a chunk (`m`: `[36, c_out, tiles]`).
fn output_transform<T: WithDType>(m: &[T], t: Tiles, bias: Option<&[T]>, out: OutChunk<T>) {
    let c_out = out.c_out;
    let n_tiles = m.len() / (E * c_out).max(1);
    let plane = c_out * n_tiles;
    let (oh, ow) = (out.oh, out.ow);
    for co in 0..c_out {
        let b = bias.map_or(T::zero(), |b| b[co]);
        for t0 in (0..n_tiles).step_by(LANES) {
            let n = LANES.min(n_tiles - t0);
            let mut mm = [[[T::zero(); LANES]; A]; A];
            for (e, v) in mm.iter_mut().flatten().enumerate() {
                let at = e * plane + co * n_tiles + t0;
                copy_lanes(v, &m[at..], n);
            }
            let tile = two_sided(&mm, a_t);
            // Row i of tile l as rows[i][4l..4l + 4]: contiguous runs of the output row.
            let mut rows = [[T::zero(); M * LANES]; M];
            for (i, row) in rows.iter_mut().enumerate() {
                for l in 0..LANES {
                    for j in 0..M {
                        row[M * l + j] = tile[i][j][l] + b;
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
                    let src = &row[M * l..M * l + M];
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
/// `U[e][co][c]` (`[36, c_out, C]`) = `G g Gᵀ` of every 3×3 kernel of `w` (`[c_out, C, 3, 3]`).
fn kernel_transform<T: WithDType>(w: &[T], c_out: usize, c: usize) -> Vec<T> {
    let plane = c_out * c;
    let mut u = vec![T::zero(); E * plane];
    for kc0 in (0..plane).step_by(LANES) {
        let n = LANES.min(plane - kc0);
        let offsets: [usize; LANES] = std::array::from_fn(|l| (kc0 + l) * 9);
        let gg = load::<T, 3>(w, &offsets[..n], 3);
        store(&mut u[kc0..], plane, &two_sided(&gg, g), n);
    }
    u
}
}

vectorized_fn! {
/// The kernel gradient `[c_out, C, 3, 3]` from `dU` (`[36, c_out, C]`): `Gᵀ dU G` per kernel.
fn kernel_grad_transform<T: WithDType>(du: &[T], c_out: usize, c: usize) -> Vec<T> {
    let plane = c_out * c;
    let mut dw = vec![T::zero(); 9 * plane];
    for kc0 in (0..plane).step_by(LANES) {
        let n = LANES.min(plane - kc0);
        let mut t = [[[T::zero(); LANES]; A]; A];
        for (e, v) in t.iter_mut().flatten().enumerate() {
            copy_lanes(v, &du[e * plane + kc0..], n);
        }
        let dg = two_sided(&t, g_t);
        for l in 0..n {
            let out = &mut dw[(kc0 + l) * 9..(kc0 + l + 1) * 9];
            for i in 0..3 {
                for j in 0..3 {
                    out[i * 3 + j] = dg[i][j][l];
                }
            }
        }
    }
    dw
}
}

/// The zero-padded output gradient of samples `b0..b0 + bc` (`grad`: contiguous
/// `[B, c_out, oh, ow]`) as `[bc, c_out, 4·rows, 4·cols]`.
fn pad_grad<T: WithDType>(
    grad: &[T],
    g: &Geom,
    c_out: usize,
    t: Tiles,
    (b0, bc): (usize, usize),
) -> Vec<T> {
    let (ph, pw) = (M * t.rows, M * t.cols);
    let (oh, ow) = (g.oh, g.ow);
    let mut out = vec![T::zero(); bc * c_out * ph * pw];
    let src = &grad[b0 * c_out * oh * ow..(b0 + bc) * c_out * oh * ow];
    for (plane, s) in out.chunks_mut(ph * pw).zip(src.chunks(oh * ow)) {
        for (row, s) in plane.chunks_mut(pw).zip(s.chunks(ow)) {
            row[..ow].copy_from_slice(s);
        }
    }
    out
}

/// The forward pass `y = conv(x, w) (+ bias)`, `[B, c_out, oh, ow]`, of an [`eligible`]
/// convolution; `w` is the contiguous `[c_out, C, 3, 3]` kernel.
pub(super) fn forward<T: WithDType>(
    x: (&[T], &Layout),
    g: &Geom,
    w: &[T],
    bias: Option<&[T]>,
) -> Result<Vec<T>> {
    const OP: &str = "kolo-conv2d-winograd";
    let c_out = w.len() / (9 * g.c).max(1);
    if g.k != 3
        || g.stride != 1
        || c_out * 9 * g.c != w.len()
        || bias.is_some_and(|b| b.len() != c_out)
    {
        candle_core::bail!(
            "{OP}: kernel of {} values for {} input channels",
            w.len(),
            g.c
        );
    }
    let u = kernel_transform(w, c_out, g.c);
    let t = Tiles::of(g);
    let chunk = chunk(g, c_out, t);
    let mut y = vec![T::zero(); g.b * c_out * g.oh * g.ow];
    let (mut v, mut m) = (Vec::new(), Vec::new());
    for b0 in (0..g.b).step_by(chunk) {
        let bc = chunk.min(g.b - b0);
        let p = pad_input(x, g, t, (b0, bc))?;
        let (ph, pw) = (M * t.rows + 2, M * t.cols + 2);
        let offsets = tile_offsets(bc, t, M, pw, g.c * ph * pw);
        let tc = offsets.len();
        v.resize(E * g.c * tc, T::zero());
        m.resize(E * c_out * tc, T::zero());
        input_transform(&p, ph * pw, pw, &offsets, &mut v);
        for e in 0..E {
            matmul_into(
                OP,
                &mut m[e * c_out * tc..(e + 1) * c_out * tc],
                (tc, 1),
                MatRef::row_major(&u[e * c_out * g.c..(e + 1) * c_out * g.c], c_out, g.c),
                MatRef::row_major(&v[e * g.c * tc..(e + 1) * g.c * tc], g.c, tc),
                false,
            )?;
        }
        let out = OutChunk {
            y: &mut y,
            b0,
            c_out,
            oh: g.oh,
            ow: g.ow,
        };
        output_transform(&m, t, bias, out);
    }
    Ok(y)
}

/// The kernel gradient `[c_out, C, 3, 3]` of an [`eligible`] convolution from its input `x` and
/// its output gradient `grad` (contiguous `[B, c_out, oh, ow]`).
pub(super) fn kernel_grad<T: WithDType>(
    x: (&[T], &Layout),
    g: &Geom,
    grad: &[T],
    c_out: usize,
) -> Result<Vec<T>> {
    const OP: &str = "kolo-conv2d-winograd-backward";
    if g.k != 3 || g.stride != 1 || grad.len() != g.b * c_out * g.oh * g.ow {
        candle_core::bail!("{OP}: gradient of {} values does not match", grad.len());
    }
    let t = Tiles::of(g);
    let chunk = chunk(g, c_out, t);
    let mut du = vec![T::zero(); E * c_out * g.c];
    let (mut v, mut dm) = (Vec::new(), Vec::new());
    for b0 in (0..g.b).step_by(chunk) {
        let bc = chunk.min(g.b - b0);
        let p = pad_input(x, g, t, (b0, bc))?;
        let (ph, pw) = (M * t.rows + 2, M * t.cols + 2);
        let offsets = tile_offsets(bc, t, M, pw, g.c * ph * pw);
        let tc = offsets.len();
        v.resize(E * g.c * tc, T::zero());
        dm.resize(E * c_out * tc, T::zero());
        input_transform(&p, ph * pw, pw, &offsets, &mut v);
        let pg = pad_grad(grad, g, c_out, t, (b0, bc));
        let (gh, gw) = (M * t.rows, M * t.cols);
        let g_offsets = tile_offsets(bc, t, M, gw, c_out * gh * gw);
        grad_transform(&pg, gh * gw, gw, &g_offsets, &mut dm);
        for e in 0..E {
            matmul_into(
                OP,
                &mut du[e * c_out * g.c..(e + 1) * c_out * g.c],
                (g.c, 1),
                MatRef::row_major(&dm[e * c_out * tc..(e + 1) * c_out * tc], c_out, tc),
                MatRef::row_major(&v[e * g.c * tc..(e + 1) * g.c * tc], g.c, tc).t(),
                true,
            )?;
        }
    }
    Ok(kernel_grad_transform(&du, c_out, g.c))
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
    }

    /// `forward` and `kernel_grad` directly (whatever [`eligible`] would choose) against candle's
    /// conv2d in f64: output sizes that are and are not multiples of the tile, paddings 0–2,
    /// one and several chunks, a transposed (strided) input, f32 and f64.
    #[test]
    fn forward_and_kernel_gradient_match_candle() -> Result<()> {
        use candle_core::{DType, Device, Tensor, Var};
        // (batch, c_in, h, w, c_out, padding, strided input)
        let cases = [
            (3, 8, 7, 7, 8, 1, false),
            (2, 3, 28, 28, 5, 1, false),
            (2, 8, 5, 9, 12, 0, false),
            (1, 9, 4, 4, 10, 1, false),
            (2, 8, 6, 5, 8, 2, false),
            (2, 12, 9, 6, 8, 1, true),
            (1, 2, 1, 1, 3, 1, false),
            (9, 64, 28, 28, 16, 1, false),
        ];
        for dtype in [DType::F32, DType::F64] {
            let tol = if dtype == DType::F64 { 1e-10 } else { 1e-4 };
            for &(b, c, h, w, c_out, padding, strided) in &cases {
                let case = format!("{dtype:?} {:?}", (b, c, h, w, c_out, padding, strided));
                let x = if strided {
                    Tensor::randn(0f64, 1., (b, c, w, h), &Device::Cpu)?.transpose(2, 3)?
                } else {
                    Tensor::randn(0f64, 1., (b, c, h, w), &Device::Cpu)?
                };
                let wt = Tensor::randn(0f64, 1., (c_out, c, 3, 3), &Device::Cpu)?;
                let bias = Tensor::randn(0f64, 1., c_out, &Device::Cpu)?;
                let (oh, ow) = (h + 2 * padding - 2, w + 2 * padding - 2);
                let r = Tensor::randn(0f64, 1., (b, c_out, oh, ow), &Device::Cpu)?;
                let wv = Var::from_tensor(&wt)?;
                let y_ref = x
                    .conv2d(&wv, padding, 1, 1, 1)?
                    .broadcast_add(&bias.reshape((1, c_out, 1, 1))?)?;
                let Some(dw_ref) = (&y_ref * &r)?.sum_all()?.backward()?.get(&wv).cloned() else {
                    panic!("{case}: no reference gradient");
                };
                let geom = Geom {
                    b,
                    c,
                    h,
                    w,
                    k: 3,
                    stride: 1,
                    padding,
                    oh,
                    ow,
                };
                let x = x.to_dtype(dtype)?;
                let (storage, layout) = x.storage_and_layout();
                let candle_core::Storage::Cpu(cpu) = &*storage else {
                    panic!("not a CPU tensor");
                };
                let as_vec = |t: &Tensor| t.to_dtype(dtype)?.flatten_all()?.contiguous();
                let (w_t, b_t, r_t) = (as_vec(&wt)?, as_vec(&bias)?, as_vec(&r)?);
                let (y, dw) = match dtype {
                    DType::F32 => {
                        let xs = (cpu.as_slice::<f32>()?, layout);
                        let y = forward(xs, &geom, &w_t.to_vec1()?, Some(&b_t.to_vec1()?))?;
                        let dw = kernel_grad(xs, &geom, &r_t.to_vec1::<f32>()?, c_out)?;
                        (
                            Tensor::new(y, &Device::Cpu)?,
                            Tensor::new(dw, &Device::Cpu)?,
                        )
                    }
                    _ => {
                        let xs = (cpu.as_slice::<f64>()?, layout);
                        let y = forward(xs, &geom, &w_t.to_vec1()?, Some(&b_t.to_vec1()?))?;
                        let dw = kernel_grad(xs, &geom, &r_t.to_vec1::<f64>()?, c_out)?;
                        (
                            Tensor::new(y, &Device::Cpu)?,
                            Tensor::new(dw, &Device::Cpu)?,
                        )
                    }
                };
                for (name, ours, reference) in
                    [("output", y, y_ref), ("kernel gradient", dw, dw_ref)]
                {
                    let ours = ours.to_dtype(DType::F64)?.reshape(reference.shape())?;
                    let scale = reference
                        .abs()?
                        .max_keepdim(0)?
                        .max_all()?
                        .to_scalar::<f64>()?;
                    let err = (ours - &reference)?.abs()?.max_all()?.to_scalar::<f64>()?;
                    assert!(err <= tol * scale.max(1.), "{case}: {name} off by {err:e}");
                }
            }
        }
        Ok(())
    }
}
