//! Convolutions as implicit GEMMs on a bf16 unit's tiles — no patch matrix, no Winograd — taken
//! by [`super::conv`] for f32 tensors where [`super::matmul_precision()`] says bf16 on AMX or
//! AVX512-BF16 and the channels come in 32s (every layer of ResNet-18 but the first; the strided
//! ones through their input's phases, [`strided`]). Both units read the same tiles
//! ([`tile_product`] dispatches).
//!
//! On a CPU whose bf16 unit multiplies six times as fast as its f32 FMAs (AMX), Winograd's saving
//! (4× fewer products for F(4×4, 3×3), whose numbers bf16 operands spoil) is worth less than
//! putting every product on the unit; and im2col's patch matrix (nine copies of the input) costs
//! more than the products themselves. Where the unit is only twice as fast (AVX512-BF16 on AMD
//! EPYC), the direct products cost about what f32 Winograd's products and transforms do, and
//! the layouts here cost less than Winograd's transforms and im2col's copies: ResNet-18 trains
//! 1.2× as fast as in f32, against 1.05× with Winograd's f32 products and im2col's bf16 ones. Instead the input is laid out once per chunk of samples as
//! zero-padded NHWC bf16 on a *grid* (a row of `C` channels per padded pixel, see [`layout`]),
//! where output position `q` finds its tap `(kh, kw)` at input row `q + kh · wp + kw`: a tile of
//! `A` (16 output positions × 32 input channels of one tap) is 16 rows of that layout read in
//! place, 64 bytes each, and the product `y = A · W` runs along `k = (tap, channel)` with the
//! kernel as `B` (pair-interleaved, packed once per call) — [`tile_product`]. Positions of the
//! grid off the image (its padding, shared between neighbouring images) are computed and
//! dropped: `(h + p)(w + p) / (h · w)` of the work, 1.07× on 28 × 28 images, 1.56× on 4 × 4.
//!
//! The backward pass: the input gradient is the same forward product of the output gradient
//! with the flipped, transposed kernel; the kernel gradient, per tap, `dWᵀ[tap] = X[tap] · dY`
//! along the grid's positions — `A` the input as bf16 planes on the grid (a row per channel,
//! the tap an offset along it), `B` the output gradient's neighbouring positions paired.
//! Operands are rounded to bf16 (as autocast does), sums in f32. Each product is a [`Job`] of
//! [`grid_product`] (the kernel gradient: [`tap_grads`]), so that a strided convolution reuses
//! them with its own layout and offsets.

mod compact;
mod layout;
mod phases;
mod strided;

use candle_core::{Layout, Result};

use super::bf16_gemm::{layouts_available, pack_b_gathered, tile_product, Bf16Path, TileOperand};
use super::im2col::{gather, Geom};
use super::matmul_precision::bf16_unit;
use super::scratch::LineScratch;
use layout::{
    from_grid, pairs_to_rows, to_nhwc, to_planes, to_planes_on, transpose_into, Epilogue, Grid,
};
use phases::Phases;

/// Bytes of a chunk's product (`f32` per grid position and output channel) the forward pass
/// aims at: the chunk's input, kernel panel and product stay within a core's L2.
#[cfg(not(test))]
const CHUNK_BYTES: usize = 1 << 20;
/// Smaller in the tests, whose small images then come in several chunks, the last one short.
#[cfg(test)]
const CHUNK_BYTES: usize = 64 << 10;

/// Grid positions per chunk of a kernel gradient, at least: its sums (`k² · C · c_out` f32,
/// loaded and stored once per chunk) then cost little against the products along the chunk's
/// positions — at 512 channels on 4 × 4 images a chunk of 1 MiB held 20 samples, 500 positions.
#[cfg(not(test))]
const MIN_GRAD_POSITIONS: usize = 1024;
/// Smaller in the tests, whose batches then still come in several chunks.
#[cfg(test)]
const MIN_GRAD_POSITIONS: usize = 128;

/// Whether the convolution `g` (to `c_out` channels) of f32 tensors runs here: bf16 products on
/// AMX or AVX512-BF16 asked for ([`super::set_matmul_precision`]) and a shape [`shape_fits`].
pub(super) fn eligible(g: &Geom, c_out: usize) -> bool {
    matches!(bf16_unit(), Some(Bf16Path::Amx | Bf16Path::Avx512Bf16))
        && layouts_available()
        && shape_fits(g, c_out)
}

/// Whether this module computes `g` (to `c_out` channels): padding below the kernel's side,
/// channels in multiples of 32 on both sides; stride 1, or a larger one over the input's phases
/// ([`strided`]).
fn shape_fits(g: &Geom, c_out: usize) -> bool {
    let channels = g.c.is_multiple_of(32) && c_out.is_multiple_of(32) && g.b > 0;
    if g.stride > 1 {
        return channels && Phases::of(g).is_some();
    }
    channels
        && g.stride == 1
        && g.padding < g.k
        && (g.h + 2 * g.padding + 1).checked_sub(g.k) == Some(g.oh)
        && (g.w + 2 * g.padding + 1).checked_sub(g.k) == Some(g.ow)
}

/// The grid of `g`'s whole input (`bc` the batch).
fn grid_of(g: &Geom) -> Grid {
    Grid {
        bc: g.b,
        c: g.c,
        h: g.h,
        w: g.w,
        pad: g.padding,
    }
}

/// Samples per chunk of a product of `per_sample` bytes.
fn chunk(b: usize, per_sample: usize) -> usize {
    (CHUNK_BYTES / per_sample.max(1)).clamp(1, b.max(1))
}

/// `w` (`[c_out, C, k, k]`, contiguous) as `B` of the forward product: `k = (tap, channel)`,
/// pair-interleaved in panels of 16 output channels by 32 values of `k`, panel `(nt, kb)` at
/// `(nt · kbs + kb) · 512`.
fn pack_kernel(w: &[f32], c_out: usize, c: usize, k: usize) -> LineScratch<u16> {
    let taps = k * k;
    // Row (tap, ch), column co: w[co][ch][tap].
    pack_b_gathered(
        w,
        (taps * c, c_out),
        |kk| (kk % c) * taps + kk / c,
        c * taps,
    )
}

/// The kernel of the input gradient, `w` flipped in space and transposed (`[C, c_out, k, k]`),
/// packed as [`pack_kernel`] packs a kernel: `k = (tap, output channel)`, columns the input
/// channels.
fn pack_flipped_kernel(w: &[f32], c_out: usize, c: usize, k: usize) -> LineScratch<u16> {
    let taps = k * k;
    // Row (tap', co), column ch: w[co][ch][taps − 1 − tap'].
    pack_b_gathered(
        w,
        (taps * c_out, c),
        |kk| (kk % c_out) * c * taps + (taps - 1 - kk / c_out),
        taps,
    )
}

/// The forward product: `y = conv(x, w) (+ bias)`, ReLU'd if `relu`, as a contiguous
/// `[B, c_out, H', W']`. Only where [`eligible`].
pub(super) fn forward(
    x: (&[f32], &Layout),
    g: &Geom,
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
) -> Result<Vec<f32>> {
    let c_out = w.len() / (g.c * g.k * g.k).max(1);
    if c_out * g.c * g.k * g.k != w.len() || bias.is_some_and(|b| b.len() != c_out) {
        candle_core::bail!(
            "kolo-conv2d-tiles: kernel of {} values for {} channels",
            w.len(),
            g.c
        );
    }
    if g.stride > 1 {
        return strided::forward(x, g, (w, c_out), Epilogue { bias, relu });
    }
    let x = gather(x)?;
    let mut y = Vec::new();
    let packed = pack_kernel(w, c_out, g.c, g.k);
    run_forward(&x, g, (packed, c_out), Epilogue { bias, relu }, &mut y);
    Ok(y)
}

/// One product over a grid ([`grid_product`]): `A`'s k-steps at `a_k` (element offsets from an
/// output position's row of the grid), `B` a kernel packed as [`pack_kernel`] packs one for
/// `c_out` columns, the output `[B, c_out, oh, ow]` (the top left of each cell) appended to `y`.
struct Job<'a> {
    a_k: Vec<usize>,
    packed: LineScratch<u16>,
    c_out: usize,
    dims: (usize, usize),
    e: Epilogue<'a>,
    y: Vec<f32>,
}

/// The contiguous `x` (`[B, cells.c, cells.h, cells.w]`) laid out chunk by chunk on its grid
/// (`cells` with `bc` the whole batch; `reach` positions past a tile the k-steps read), and every
/// job's product of it.
fn grid_product(x: &[f32], cells: Grid, reach: usize, jobs: &mut [Job<'_>]) {
    grid_product_of(
        |grid, b0, out| to_nhwc(x, grid, b0, out),
        cells,
        reach,
        jobs,
    );
}

/// [`grid_product`] with the grid's chunks (samples `b0..b0 + grid.bc`) laid out by `lay`.
fn grid_product_of(
    lay: impl Fn(Grid, usize, &mut [u16]),
    cells: Grid,
    reach: usize,
    jobs: &mut [Job<'_>],
) {
    let (b, c) = (cells.bc, cells.c);
    let widest = jobs.iter().map(|j| j.c_out).max().unwrap_or(0);
    let bc = chunk(b, cells.hp() * cells.wp() * widest * 4);
    let starts: Vec<usize> = jobs.iter().map(|j| j.y.len()).collect();
    for j in jobs.iter_mut() {
        j.y.reserve(b * j.c_out * j.dims.0 * j.dims.1);
    }
    // Buffers of the first (largest) chunk's sizes, from the thread's pool.
    let m_first = (Grid { bc, ..cells }).positions().div_ceil(16) * 16;
    let (mut xin, mut prod, mut patch) = (
        LineScratch::take((m_first + reach) * c),
        LineScratch::take(m_first * widest),
        LineScratch::<u16>::take(0),
    );
    for b0 in (0..b).step_by(bc) {
        let grid = Grid {
            bc: bc.min(b - b0),
            ..cells
        };
        let m_tiles = grid.positions().div_ceil(16);
        // Rows past the grid (the last tiles' and the taps' reach) and the padding: zeros,
        // written once for every chunk of this size.
        if b0 == 0 || grid.bc != bc {
            xin.zeroed((m_tiles * 16 + reach) * c);
        }
        lay(grid, b0, &mut xin);
        for j in jobs.iter_mut() {
            let (ks, (oh, ow), c_out) = (j.a_k.len(), j.dims, j.c_out);
            let b_k: Vec<usize> = (0..ks).map(|kb| kb * 512).collect();
            let tb = TileOperand {
                data: &j.packed,
                tile_step: ks * 512,
                k_offsets: &b_k,
                row_stride: 32,
            };
            let len = b * c_out * oh * ow;
            let y = &mut j.y.spare_capacity_mut()[..len];
            if grid.hp() * grid.wp() * 2 >= oh * ow * 3 {
                // Small images, whose cells are half again their output (4 × 4 on 5 × 5): the
                // output positions' rows of `A` copied out, one after the other.
                let rows = grid.bc * oh * ow;
                let m_tiles = rows.div_ceil(16);
                patch.resize(m_tiles * 16 * ks * 32);
                gather_rows(&xin, grid, (oh, ow), &j.a_k, &mut patch);
                let p_k: Vec<usize> = (0..ks).map(|kb| kb * 32).collect();
                let ta = TileOperand {
                    data: &patch,
                    tile_step: 16 * ks * 32,
                    k_offsets: &p_k,
                    row_stride: ks * 32,
                };
                prod.resize(m_tiles * 16 * c_out);
                tile_product(ta, tb, &mut prod, (m_tiles, c_out / 16, c_out), false);
                let out = Grid {
                    h: oh,
                    w: ow,
                    pad: 0,
                    ..grid
                };
                from_grid(&prod, out, (c_out, oh, ow), b0, j.e, y);
                continue;
            }
            let ta = TileOperand {
                data: &xin,
                tile_step: 16 * c,
                k_offsets: &j.a_k,
                row_stride: c,
            };
            prod.resize(m_tiles * 16 * c_out);
            tile_product(ta, tb, &mut prod, (m_tiles, c_out / 16, c_out), false);
            from_grid(&prod, grid, (c_out, oh, ow), b0, j.e, y);
        }
    }
    for (j, start) in jobs.iter_mut().zip(starts) {
        let len = b * j.c_out * j.dims.0 * j.dims.1;
        // SAFETY: `from_grid` wrote every value of every chunk's samples: all `len` of them,
        // past the `start` values there were.
        unsafe { j.y.set_len(start + len) };
    }
}

/// The rows of `A` that the output positions (`oh × ow` at the top left of each of `grid`'s
/// cells) read from the laid-out `xin` (`grid.c` values per position), k-step by k-step at
/// `a_k`, one after the other in `patch`: row `(b · oh + i) · ow + j`, its k-steps of 32 values
/// in turn.
fn gather_rows(
    xin: &[u16],
    grid: Grid,
    (oh, ow): (usize, usize),
    a_k: &[usize],
    patch: &mut [u16],
) {
    let (c, hp, wp, ks) = (grid.c, grid.hp(), grid.wp(), a_k.len());
    let mut rows = patch.chunks_exact_mut(ks * 32);
    for b in 0..grid.bc {
        for i in 0..oh {
            for jj in 0..ow {
                let q = ((b * hp + i) * wp + jj) * c;
                let Some(row) = rows.next() else {
                    return;
                };
                for (dst, &off) in row.chunks_exact_mut(32).zip(a_k) {
                    dst.copy_from_slice(&xin[q + off..][..32]);
                }
            }
        }
    }
}

/// The product of the contiguous `x` with a kernel packed by [`pack_kernel`], appended to `y`
/// (`[B, c_out, H', W']`).
fn run_forward(
    x: &[f32],
    g: &Geom,
    (packed, c_out): (LineScratch<u16>, usize),
    e: Epilogue<'_>,
    y: &mut Vec<f32>,
) {
    let (c, k, wp) = (g.c, g.k, g.w + g.padding);
    // `A`: tap (kh, kw), channels 32·cb.. of position q at (q + kh·wp + kw)·c + 32·cb.
    let a_k = (0..k * k * c / 32)
        .map(|kb| {
            let (t, cb) = (kb * 32 / c, kb * 32 % c);
            ((t / k) * wp + t % k) * c + cb
        })
        .collect();
    let mut job = [Job {
        a_k,
        packed,
        c_out,
        dims: (g.oh, g.ow),
        e,
        y: std::mem::take(y),
    }];
    grid_product(x, grid_of(g), (k - 1) * (wp + 1), &mut job);
    let [job] = job;
    *y = job.y;
}

/// The input and kernel gradients the backward pass wants (`dx` `[B, C, H, W]`, then `dw`
/// `[c_out, C, k, k]`), appended to `out`. `grad` is the contiguous output gradient.
pub(super) fn backward(
    x: (&[f32], &Layout),
    w: &[f32],
    g: &Geom,
    grad: &[f32],
    (want_x, want_w): (bool, bool),
    out: &mut Vec<f32>,
) -> Result<()> {
    let (c, k) = (g.c, g.k);
    let c_out = w.len() / (c * k * k).max(1);
    if c_out * c * k * k != w.len() || grad.len() != g.b * c_out * g.oh * g.ow {
        candle_core::bail!(
            "kolo-conv2d-tiles-backward: gradient of {} values does not match",
            grad.len()
        );
    }
    if g.stride > 1 {
        return strided::backward(x, (w, c_out), g, grad, (want_x, want_w), out);
    }
    if want_x {
        // The forward product of the output gradient with the flipped, transposed kernel.
        let Some(gt) = g.input_grad(c_out) else {
            candle_core::bail!("kolo-conv2d-tiles-backward: not a stride-1 convolution");
        };
        let packed = pack_flipped_kernel(w, c_out, c, k);
        let e = Epilogue {
            bias: None,
            relu: false,
        };
        run_forward(grad, &gt, (packed, c), e, out);
    }
    if want_w {
        let x = gather(x)?;
        let wp = g.w + g.padding;
        let acc = if compact::pays(g, grid_of(g).hp() * wp) {
            compact::tap_grads(&x, g, grad, c_out)
        } else {
            let taps: Vec<(usize, usize)> = (0..k * k).map(|t| (0, (t / k) * wp + t % k)).collect();
            tap_grads(&x, grid_of(g), (grad, c_out, g.oh, g.ow), &taps, c)
        };
        dw_from_taps(&acc, (c, c_out, k * k), out);
    }
    Ok(())
}

/// `dw` (`[c_out, C, k, k]`) appended to `out` from the sums of [`tap_grads`] (`[ch][tap][co]`):
/// one transpose.
fn dw_from_taps(acc: &[f32], (c, c_out, taps): (usize, usize, usize), out: &mut Vec<f32>) {
    let at = out.len();
    out.resize(at + c_out * c * taps, 0.0);
    transpose_into(acc, (c * taps, c_out), &mut out[at..], |co| co * c * taps);
}

/// The kernel gradient per tap, `[ch][tap][co]`: for tap `t` at `(row, off)` of `taps`,
/// `Σ_q x[row + ch][q + off] · dy[q]` over the grid positions of `x` (`[B, cells.c, cells.h,
/// cells.w]` on its grid, `cells.bc` the whole batch) for its `c` channels from plane `row`,
/// `dy` (`[B, c_out, oh, ow]`) placed at the top left of each cell and zero elsewhere.
fn tap_grads(
    x: &[f32],
    cells: Grid,
    dy: (&[f32], usize, usize, usize),
    taps: &[(usize, usize)],
    c: usize,
) -> LineScratch<f32> {
    let planes = |grid, b0, stride, out: &mut [u16]| to_planes(x, grid, b0, stride, out);
    tap_grads_of(planes, cells, dy, taps, c)
}

/// [`tap_grads`] with the input's planes for samples `b0..b0 + grid.bc` (`stride` values each)
/// written by `planes`.
fn tap_grads_of(
    planes: impl Fn(Grid, usize, usize, &mut [u16]),
    cells: Grid,
    (grad, c_out, oh, ow): (&[f32], usize, usize, usize),
    taps: &[(usize, usize)],
    c: usize,
) -> LineScratch<f32> {
    let (b, hp, wp) = (cells.bc, cells.hp(), cells.wp());
    let at_least = MIN_GRAD_POSITIONS.div_ceil(hp * wp);
    let bc = chunk(b, hp * wp * (cells.c + c_out) * 2).max(at_least.min(b.max(1)));
    let reach = taps.iter().map(|t| t.1).max().unwrap_or(0);
    // Written whole by the first chunk's products (which do not accumulate).
    let mut acc = LineScratch::take(taps.len() * c * c_out);
    if b == 0 {
        acc.zeroed(taps.len() * c * c_out);
    } else {
        acc.resize(taps.len() * c * c_out);
    }
    let kq_first = (Grid { bc, ..cells }).positions().div_ceil(32) * 32;
    let (mut xs, mut dys, mut dyp) = (
        LineScratch::take(cells.c * (kq_first + reach).next_multiple_of(32)),
        Vec::new(),
        LineScratch::take(c_out * kq_first),
    );
    let mut a_k = Vec::new();
    for (i, b0) in (0..b).step_by(bc).enumerate() {
        let grid = Grid {
            bc: bc.min(b - b0),
            ..cells
        };
        let kq = grid.positions().div_ceil(32) * 32;
        // `A`'s planes reach `reach` positions past a k-step; each starts on a cache line.
        let stride = (kq + reach).next_multiple_of(32);
        // Zeros where nothing is written (padding, positions off the images, the tail),
        // written once for every chunk of this size.
        if b0 == 0 || grid.bc != bc {
            xs.zeroed(cells.c * stride);
            dys.clear();
            dys.resize(c_out * kq, 0);
        }
        planes(grid, b0, stride, &mut xs);
        let dy = (grad, c_out, oh, ow);
        let b_k = grad_pairs(dy, (b0, grid.bc), (hp, wp), kq, &mut dys, &mut dyp);
        let b = TileOperand {
            data: &dyp,
            tile_step: 32,
            k_offsets: &b_k,
            row_stride: 2 * c_out,
        };
        for (t, &(row, off)) in taps.iter().enumerate() {
            // This tap's steps: the pair rows' steps shifted by its offset along the planes.
            a_k.clear();
            a_k.extend((0..kq / 32).map(|kb| off + kb * 32));
            let a = TileOperand {
                data: &xs[row * stride..],
                tile_step: 16 * stride,
                k_offsets: &a_k,
                row_stride: stride,
            };
            // Rows (ch, t) of the sums: `C`'s rows `taps · c_out` values apart.
            let dst = &mut acc[t * c_out..];
            tile_product(a, b, dst, (c / 16, c_out / 16, taps.len() * c_out), i > 0);
        }
    }
    acc
}

/// Samples `b0..b0 + n` of the output gradient `grad` (`[B, c_out, oh, ow]`) as `B` of a
/// kernel gradient's products: bf16 planes of `kq` positions, each sample on `hp × wp` of them
/// (`dys`, zero wherever nothing is written), their neighbouring positions paired into `dyp`
/// ([`pairs_to_rows`]); returns the offsets of `B`'s steps of 32 along `k` in `dyp`.
fn grad_pairs(
    (grad, c_out, oh, ow): (&[f32], usize, usize, usize),
    (b0, n): (usize, usize),
    (hp, wp): (usize, usize),
    kq: usize,
    dys: &mut [u16],
    dyp: &mut LineScratch<u16>,
) -> Vec<usize> {
    let dgrid = Grid {
        bc: n,
        c: c_out,
        h: oh,
        w: ow,
        pad: 0,
    };
    to_planes_on(grad, dgrid, (hp, wp, 0), b0, kq, dys);
    dyp.resize(c_out * kq);
    pairs_to_rows(dys, c_out, kq, dyp);
    (0..kq / 32).map(|kb| kb * 32 * c_out).collect()
}

#[cfg(test)]
mod tests;
