//! Stride-1 convolutions on AMX tiles as implicit GEMMs — no patch matrix, no Winograd — taken by
//! [`super::conv`] for f32 tensors where [`super::matmul_precision()`] says bf16 on AMX and the
//! channels come in 32s (ResNet's 3×3 layers after the first).
//!
//! On a CPU whose bf16 unit multiplies six times as fast as its f32 FMAs, Winograd's saving (4×
//! fewer products for F(4×4, 3×3), whose numbers bf16 operands spoil) is worth less than putting
//! every product on the unit; and im2col's patch matrix (nine copies of the input) costs more
//! than the products themselves. Instead the input is laid out once per chunk of samples as
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
//! Operands are rounded to bf16 (as autocast does), sums in f32.

mod layout;

use candle_core::{Layout, Result};

use super::aligned::Lines;
use super::bf16_gemm::{pack_b_panels, tile_product, Bf16Path, TileOperand};
use super::im2col::{gather, Geom};
use super::matmul_precision::bf16_unit;
use layout::{
    from_grid, pairs_to_rows, to_nhwc, to_planes, to_planes_on, transpose_into, Epilogue, Grid,
};

/// Bytes of a chunk's product (`f32` per grid position and output channel) the forward pass
/// aims at: the chunk's input, kernel panel and product stay within a core's L2.
#[cfg(not(test))]
const CHUNK_BYTES: usize = 1 << 20;
/// Smaller in the tests, whose small images then come in several chunks, the last one short.
#[cfg(test)]
const CHUNK_BYTES: usize = 64 << 10;

/// Whether the convolution `g` (to `c_out` channels) of f32 tensors runs here: bf16 products on
/// AMX asked for ([`super::set_matmul_precision`]), stride 1, padding below the kernel's side,
/// channels in multiples of 32 on both sides.
pub(super) fn eligible(g: &Geom, c_out: usize) -> bool {
    bf16_unit() == Some(Bf16Path::Amx)
        && g.stride == 1
        && g.padding < g.k
        && g.c.is_multiple_of(32)
        && c_out.is_multiple_of(32)
        && g.b > 0
        && (g.h + 2 * g.padding + 1).checked_sub(g.k) == Some(g.oh)
        && (g.w + 2 * g.padding + 1).checked_sub(g.k) == Some(g.ow)
}

/// The grid of samples `b0..b0 + bc` (fewer at the end of the batch) of `g`'s input.
fn chunk_grid(g: &Geom, b0: usize, bc: usize) -> Grid {
    Grid {
        bc: bc.min(g.b - b0),
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
fn pack_kernel(w: &[f32], c_out: usize, c: usize, k: usize) -> Lines<u16> {
    let taps = k * k;
    // [c_out][(ch, tap)] -> [(tap, ch)][c_out].
    let mut wt = vec![0f32; w.len()];
    transpose_into(w, (c_out, c * taps), &mut wt, |s| {
        ((s % taps) * c + s / taps) * c_out
    });
    pack_b_panels(&wt, (taps * c, c_out))
}

/// The kernel of the input gradient, `w` flipped in space and transposed (`[C, c_out, k, k]`),
/// packed as [`pack_kernel`] packs a kernel: `k = (tap, output channel)`, columns the input
/// channels.
fn pack_flipped_kernel(w: &[f32], c_out: usize, c: usize, k: usize) -> Lines<u16> {
    let taps = k * k;
    // [(co, ch)][tap] -> [taps − 1 − tap][(co, ch)]: row (tap', co) holds the channels.
    let mut wt = vec![0f32; w.len()];
    transpose_into(w, (c_out * c, taps), &mut wt, |t| {
        (taps - 1 - t) * c_out * c
    });
    pack_b_panels(&wt, (taps * c_out, c))
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
            "kolo-conv2d-amx: kernel of {} values for {} channels",
            w.len(),
            g.c
        );
    }
    let x = gather(x)?;
    let mut y = Vec::new();
    let packed = pack_kernel(w, c_out, g.c, g.k);
    run_forward(&x, g, (&packed, c_out), Epilogue { bias, relu }, &mut y);
    Ok(y)
}

/// The product of the contiguous `x` with a kernel packed by [`pack_kernel`], appended to `y`
/// (`[B, c_out, H', W']`).
fn run_forward(
    x: &[f32],
    g: &Geom,
    (packed, c_out): (&[u16], usize),
    e: Epilogue<'_>,
    y: &mut Vec<f32>,
) {
    let (c, k, p) = (g.c, g.k, g.padding);
    let (hp, wp) = (g.h + p, g.w + p);
    let bc = chunk(g.b, hp * wp * c_out * 4);
    let kbs = k * k * c / 32;
    // `A`: tap (kh, kw), channels 32·cb.. of position q at (q + kh·wp + kw)·c + 32·cb.
    let a_k: Vec<usize> = (0..kbs)
        .map(|kb| {
            let (t, cb) = (kb * 32 / c, kb * 32 % c);
            ((t / k) * wp + t % k) * c + cb
        })
        .collect();
    let b_k: Vec<usize> = (0..kbs).map(|kb| kb * 512).collect();
    let len = g.b * c_out * g.oh * g.ow;
    y.reserve(len);
    let start = y.len();
    let out = &mut y.spare_capacity_mut()[..len];
    let (mut xin, mut prod) = (Lines::new(), Lines::new());
    for b0 in (0..g.b).step_by(bc) {
        let grid = chunk_grid(g, b0, bc);
        let m_tiles = grid.positions().div_ceil(32) * 2;
        // Rows past the grid (the last tiles' and the taps' reach) and the padding: zeros,
        // written once for every chunk of this size.
        if b0 == 0 || grid.bc != bc {
            xin.zeroed((m_tiles * 16 + (k - 1) * (wp + 1)) * c);
        }
        prod.resize(m_tiles * 16 * c_out);
        to_nhwc(x, grid, b0, &mut xin);
        let a = TileOperand {
            data: &xin,
            tile_step: 16 * c,
            k_offsets: &a_k,
            row_stride: c,
        };
        let b = TileOperand {
            data: packed,
            tile_step: kbs * 512,
            k_offsets: &b_k,
            row_stride: 32,
        };
        tile_product(a, b, &mut prod, (m_tiles, c_out / 16, c_out), false);
        from_grid(&prod, grid, (c_out, g.oh, g.ow), b0, e, out);
    }
    // SAFETY: `from_grid` wrote every value of every chunk's samples: all `len` of them.
    unsafe { y.set_len(start + len) };
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
            "kolo-conv2d-amx-backward: gradient of {} values does not match",
            grad.len()
        );
    }
    if want_x {
        // The forward product of the output gradient with the flipped, transposed kernel.
        let Some(gt) = g.input_grad(c_out) else {
            candle_core::bail!("kolo-conv2d-amx-backward: not a stride-1 convolution");
        };
        let packed = pack_flipped_kernel(w, c_out, c, k);
        let e = Epilogue {
            bias: None,
            relu: false,
        };
        run_forward(grad, &gt, (&packed, c), e, out);
    }
    if want_w {
        let x = gather(x)?;
        kernel_grad(&x, g, grad, c_out, out);
    }
    Ok(())
}

/// `dw` (`[c_out, C, k, k]`) appended to `out`: per tap, `dwᵀ[tap] (C × c_out) = Σ_q
/// x[q + tap offset] · dy[q]` over the chunks' grid positions, `dy` zero off the image.
fn kernel_grad(x: &[f32], g: &Geom, grad: &[f32], c_out: usize, out: &mut Vec<f32>) {
    let (c, k, p) = (g.c, g.k, g.padding);
    let (hp, wp, taps) = (g.h + p, g.w + p, k * k);
    let bc = chunk(g.b, hp * wp * (c + c_out) * 2);
    let mut acc = Lines::new();
    acc.zeroed(taps * c * c_out);
    let (mut xs, mut dys, mut dyp) = (Lines::new(), Vec::new(), Lines::new());
    let mut a_k = Vec::new();
    for (i, b0) in (0..g.b).step_by(bc).enumerate() {
        let grid = chunk_grid(g, b0, bc);
        let kq = grid.positions().div_ceil(32) * 32;
        // `A`'s planes reach `(k − 1)·(wp + 1)` positions past a k-step; each starts on a
        // cache line.
        let stride = (kq + (k - 1) * (wp + 1)).next_multiple_of(32);
        // Zeros where nothing is written (padding, positions off the images, the tail),
        // written once for every chunk of this size.
        if b0 == 0 || grid.bc != bc {
            xs.zeroed(c * stride);
            dys.clear();
            dys.resize(c_out * kq, 0);
        }
        to_planes(x, grid, b0, stride, &mut xs);
        let dgrid = Grid {
            bc: grid.bc,
            c: c_out,
            h: g.oh,
            w: g.ow,
            pad: 0,
        };
        to_planes_on(grad, dgrid, (hp, wp, 0), b0, kq, &mut dys);
        dyp.resize(c_out * kq);
        pairs_to_rows(&dys, c_out, kq, &mut dyp);
        let b_k: Vec<usize> = (0..kq / 32).map(|kb| kb * 32 * c_out).collect();
        let b = TileOperand {
            data: &dyp,
            tile_step: 32,
            k_offsets: &b_k,
            row_stride: 2 * c_out,
        };
        for t in 0..taps {
            let off = (t / k) * wp + t % k;
            // This tap's steps: the pair rows' steps shifted by its offset along the planes.
            a_k.clear();
            a_k.extend((0..kq / 32).map(|kb| off + kb * 32));
            let a = TileOperand {
                data: &xs,
                tile_step: 16 * stride,
                k_offsets: &a_k,
                row_stride: stride,
            };
            let dst = &mut acc[t * c * c_out..][..c * c_out];
            tile_product(a, b, dst, (c / 16, c_out / 16, c_out), i > 0);
        }
    }
    // acc[tap][ch][co] -> [tap][co][ch] -> dw[co][ch][tap].
    let mut by_tap = vec![0f32; taps * c * c_out];
    for (t, a) in acc.chunks_exact(c * c_out).enumerate() {
        transpose_into(a, (c, c_out), &mut by_tap[t * c * c_out..], |co| co * c);
    }
    let at = out.len();
    out.resize(at + c_out * c * taps, 0.0);
    transpose_into(&by_tap, (taps, c_out * c), &mut out[at..], |s| s * taps);
}

#[cfg(test)]
mod tests;
