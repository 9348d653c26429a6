//! The layouts the implicit-GEMM convolution reads and writes, made from and back into candle's NCHW f32
//! tensors in one pass each, sixteen by sixteen values through AVX-512 transposes:
//!
//! - [`to_nhwc`]: samples as zero-padded NHWC bf16 on the *grid* — position
//!   `q = (b · hp + i) · wp + j` of image `b`'s `hp × wp` cell, its `C` channels in a row —
//!   so that the tap `(kh, kw)` of output position `q` is input position `q + kh · wp + kw`.
//!   Neighbouring images share their padding: a cell is the image with `pad` zero rows above
//!   and `pad` zero columns to the left (`hp = h + pad`, `wp = w + pad`), the next cell's (or
//!   row's) zeros serving as this one's padding below (or to the right), so that a 4 × 4 image
//!   padded by 1 costs 25 positions, not 36;
//! - [`from_grid`]: the product's rows (one per grid position, `c_out` channels each) back into
//!   NCHW, the positions off the image dropped, bias and ReLU applied on the way;
//! - [`to_planes`]: NCHW bf16 planes on the grid (a row per channel), for the kernel gradient;
//! - [`pairs_to_rows`]: such planes' pairs of neighbouring positions as the pair-interleaved
//!   rows both bf16 units read as `B`.
//!
//! All of them only on a CPU with AVX-512F, BW, VL and BF16
//! (`bf16_gemm::layouts_available`: every CPU with AMX, and AMD EPYC's with AVX512-BF16).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

pub(super) use super::super::avx512_transpose::transpose16;

/// The grid of a chunk: `bc` samples of `c` channels, `h × w` each, padded by `pad` on every
/// side, in cells of `hp × wp` positions that share their padding (see the module notes).
#[derive(Clone, Copy, Debug)]
pub(super) struct Grid {
    pub(super) bc: usize,
    pub(super) c: usize,
    pub(super) h: usize,
    pub(super) w: usize,
    pub(super) pad: usize,
}

impl Grid {
    pub(super) fn hp(&self) -> usize {
        self.h + self.pad
    }

    pub(super) fn wp(&self) -> usize {
        self.w + self.pad
    }

    /// Grid positions of the chunk's cells (the last image's padding below lies past them).
    pub(super) fn positions(&self) -> usize {
        self.bc * self.hp() * self.wp()
    }
}

/// The low `n` of 16 lanes.
#[inline(always)]
pub(super) fn lanes(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        (1u16 << n) - 1
    }
}

/// Samples `b0..b0 + g.bc` of the contiguous NCHW `x` (`g.c` channels of `g.h × g.w`) into `out`
/// as NHWC bf16 on `g`'s grid: `out[q · c + ch]`. Only the images' positions are written: the
/// padding, and anything in `out` past the grid, must be zero already (a buffer zeroed once
/// serves every chunk of the same grid, which writes the same positions). `g.c` a multiple of
/// 16.
pub(super) fn to_nhwc(x: &[f32], g: Grid, b0: usize, out: &mut [u16]) {
    let (c, hw) = (g.c, g.h * g.w);
    assert!(
        c.is_multiple_of(16)
            && x.len() >= (b0 + g.bc) * c * hw
            && out.len() >= (g.positions() + g.pad * (g.wp() + 1)) * c,
        "to_nhwc: buffers too short"
    );
    // SAFETY: AVX-512F and BF16 (the module's condition); the reads are inside the samples'
    // planes (masked to the row's `w`), the writes inside the grid (asserted above).
    unsafe { to_nhwc_avx512(x, g, b0, out) }
}

#[target_feature(enable = "avx512f,avx512bf16,avx512vl")]
fn to_nhwc_avx512(x: &[f32], g: Grid, b0: usize, out: &mut [u16]) {
    let (c, hw, wp, hp) = (g.c, g.h * g.w, g.wp(), g.hp());
    let mut r = [_mm512_setzero_si512(); 16];
    // Sixteen input positions at a time along the flattened `h × w` plane (neighbours in each
    // channel's plane of `x`), across the image's rows, each stored at its own grid position.
    let mut q = [0usize; 16];
    for b in 0..g.bc {
        for p0 in (0..hw).step_by(16) {
            let n = (hw - p0).min(16);
            for (jj, qj) in q.iter_mut().enumerate().take(n) {
                let p = p0 + jj;
                *qj = (b * hp + p / g.w + g.pad) * wp + p % g.w + g.pad;
            }
            let m = lanes(n);
            for c0 in (0..c).step_by(16) {
                let plane = (b0 + b) * c * hw + c0 * hw;
                for (ch, v) in r.iter_mut().enumerate() {
                    // SAFETY: n values from position p0 of channel c0 + ch, inside `x`.
                    *v = unsafe {
                        _mm512_maskz_loadu_epi32(m, x.as_ptr().add(plane + ch * hw + p0).cast())
                    };
                }
                transpose16(&mut r);
                for (jj, v) in r.iter().take(n).enumerate() {
                    // SAFETY: position q[jj] lies in the grid; its 16 channels from c0.
                    unsafe {
                        let h = _mm512_cvtneps_pbh(_mm512_castsi512_ps(*v));
                        _mm256_storeu_si256(
                            out.as_mut_ptr().add(q[jj] * c + c0).cast(),
                            std::mem::transmute::<__m256bh, __m256i>(h),
                        );
                    }
                }
            }
        }
    }
}

/// What [`from_grid`] does to each value on the way out.
#[derive(Clone, Copy)]
pub(super) struct Epilogue<'a> {
    pub(super) bias: Option<&'a [f32]>,
    pub(super) relu: bool,
}

/// The rows of `prod` (grid position `q` of `g` at `prod[q · c_out..]`, `c_out` channels, for
/// the output `oh × ow` at the top left of each `hp × wp` image) into `y`, samples `b0..` of the
/// contiguous NCHW output: `y[b][co][i][j] = prod[q][co] (+ bias[co])`, ReLU'd if asked; every
/// value of those samples is written. `c_out` a multiple of 16.
pub(super) fn from_grid(
    prod: &[f32],
    g: Grid,
    (c_out, oh, ow): (usize, usize, usize),
    b0: usize,
    e: Epilogue<'_>,
    y: &mut [MaybeUninit<f32>],
) {
    let (wp, hp) = (g.wp(), g.hp());
    assert!(
        c_out.is_multiple_of(16)
            && oh <= hp
            && ow <= wp
            && prod.len() >= g.positions() * c_out
            && y.len() >= (b0 + g.bc) * c_out * oh * ow
            && e.bias.is_none_or(|b| b.len() >= c_out),
        "from_grid: buffers too short"
    );
    // SAFETY: as for `to_nhwc`; reads of whole 16-channel rows of grid positions (positions
    // past `ow` in a row are still on the grid: `ow ≤ wp`), masked writes inside the outputs.
    unsafe { from_grid_avx512(prod, g, (c_out, oh, ow), b0, e, y) }
}

#[target_feature(enable = "avx512f")]
fn from_grid_avx512(
    prod: &[f32],
    g: Grid,
    (c_out, oh, ow): (usize, usize, usize),
    b0: usize,
    e: Epilogue<'_>,
    y: &mut [MaybeUninit<f32>],
) {
    let (wp, hp, plane) = (g.wp(), g.hp(), oh * ow);
    let mut r = [_mm512_setzero_si512(); 16];
    let zero = _mm512_setzero_ps();
    // Sixteen output positions at a time along the flattened `oh × ow` plane (an output
    // channel's values for them are neighbours in `y`), across the image's rows: a 7 × 7 output
    // in 4 steps rather than 7, a 4 × 4 one in 1 rather than 4.
    let mut q = [0usize; 16];
    for b in 0..g.bc {
        for p0 in (0..plane).step_by(16) {
            let n = (plane - p0).min(16);
            for (jj, qj) in q.iter_mut().enumerate().take(n) {
                let p = p0 + jj;
                *qj = (b * hp + p / ow) * wp + p % ow;
            }
            for c0 in (0..c_out).step_by(16) {
                for (jj, v) in r.iter_mut().enumerate() {
                    // Positions past the plane's end are not read.
                    *v = if jj < n {
                        // SAFETY: position q[jj] is on the grid; 16 channels from c0.
                        unsafe { _mm512_loadu_si512(prod.as_ptr().add(q[jj] * c_out + c0).cast()) }
                    } else {
                        _mm512_setzero_si512()
                    };
                }
                transpose16(&mut r);
                for (ch, v) in r.iter().enumerate() {
                    let co = c0 + ch;
                    let mut v = _mm512_castsi512_ps(*v);
                    if let Some(bias) = e.bias {
                        v = _mm512_add_ps(v, _mm512_set1_ps(bias[co]));
                    }
                    if e.relu {
                        // max(v, 0) with NaN kept: v where v > 0 or v is NaN.
                        let keep = _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(v, zero);
                        v = _mm512_maskz_mov_ps(keep, v);
                    }
                    let at = ((b0 + b) * c_out + co) * plane + p0;
                    // SAFETY: n values of channel co's plane from position p0, inside `y`.
                    unsafe { _mm512_mask_storeu_ps(y.as_mut_ptr().add(at).cast(), lanes(n), v) };
                }
            }
        }
    }
}

/// Samples `b0..b0 + g.bc` of the contiguous NCHW `x` (`g.c` channels of `g.h × g.w`) as bf16
/// planes on `g`'s grid, one of `stride` values per channel: `out[ch · stride + q]`. Only the
/// images' positions are written: the padding, and each plane past the grid, must be zero
/// already (as for [`to_nhwc`]). With `g.pad = 0` and a larger grid (`hp`, `wp` given), the
/// output gradient on the input's grid: see [`to_planes_on`].
pub(super) fn to_planes(x: &[f32], g: Grid, b0: usize, stride: usize, out: &mut [u16]) {
    to_planes_on(x, g, (g.hp(), g.wp(), g.pad), b0, stride, out)
}

/// [`to_planes`] onto a grid of `hp × wp` positions per sample, the image placed at row and
/// column `at` of it.
pub(super) fn to_planes_on(
    x: &[f32],
    g: Grid,
    (hp, wp, at): (usize, usize, usize),
    b0: usize,
    stride: usize,
    out: &mut [u16],
) {
    let (c, hw) = (g.c, g.h * g.w);
    assert!(
        at + g.h <= hp
            && at + g.w <= wp
            && stride >= g.bc * hp * wp
            && x.len() >= (b0 + g.bc) * c * hw
            && out.len() >= c * stride,
        "to_planes: buffers too short"
    );
    // SAFETY: AVX-512F, BW and BF16 (the module's condition, `layouts_available`); the
    // reads are inside the samples' planes, the writes inside each channel's plane of `out`
    // (asserted above), both masked to the row's `w`.
    unsafe { to_planes_avx512(x, g, (hp, wp, at), b0, stride, out) }
}

#[target_feature(enable = "avx512f,avx512bf16,avx512vl,avx512bw")]
fn to_planes_avx512(
    x: &[f32],
    g: Grid,
    (hp, wp, at): (usize, usize, usize),
    b0: usize,
    stride: usize,
    out: &mut [u16],
) {
    let (c, hw) = (g.c, g.h * g.w);
    for ch in 0..c {
        for b in 0..g.bc {
            let src = ((b0 + b) * c + ch) * hw;
            for i in 0..g.h {
                let q = ch * stride + (b * hp + i + at) * wp + at;
                for j0 in (0..g.w).step_by(16) {
                    let m = lanes(g.w - j0);
                    // SAFETY: the lanes of `m` are values of row i inside `x` and positions of
                    // the row inside `out` (see `to_planes_on`).
                    unsafe {
                        let v = _mm512_maskz_loadu_ps(m, x.as_ptr().add(src + i * g.w + j0));
                        _mm256_mask_storeu_epi16(
                            out.as_mut_ptr().add(q + j0).cast(),
                            m,
                            std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v)),
                        );
                    }
                }
            }
        }
    }
}

/// `planes` (`rows` planes of `stride` bf16 values, `stride` a multiple of 32) as pairs of
/// neighbouring positions, row `p` of `out` holding `(planes[r][2p], planes[r][2p + 1])` for
/// every plane `r` in turn: `out[(p · rows + r) · 2 + {0, 1}]`. `rows` a multiple of 16.
pub(super) fn pairs_to_rows(planes: &[u16], rows: usize, stride: usize, out: &mut [u16]) {
    assert!(
        rows.is_multiple_of(16)
            && stride.is_multiple_of(32)
            && planes.len() >= rows * stride
            && out.len() >= rows * stride,
        "pairs_to_rows: buffers too short"
    );
    // SAFETY: AVX-512F; whole 16 × 16 blocks of pairs inside both buffers (asserted).
    unsafe { pairs_to_rows_avx512(planes, rows, stride, out) }
}

#[target_feature(enable = "avx512f")]
fn pairs_to_rows_avx512(planes: &[u16], rows: usize, stride: usize, out: &mut [u16]) {
    let pairs = stride / 2;
    let mut r = [_mm512_setzero_si512(); 16];
    for r0 in (0..rows).step_by(16) {
        for p0 in (0..pairs).step_by(16) {
            for (i, v) in r.iter_mut().enumerate() {
                // SAFETY: 16 pairs (32 values) of plane r0 + i from pair p0.
                *v = unsafe {
                    _mm512_loadu_si512(planes.as_ptr().add((r0 + i) * stride + 2 * p0).cast())
                };
            }
            transpose16(&mut r);
            for (p, v) in r.iter().enumerate() {
                // SAFETY: row p0 + p of `out`, planes r0.. (16 pairs).
                unsafe {
                    _mm512_storeu_si512(out.as_mut_ptr().add(((p0 + p) * rows + r0) * 2).cast(), *v)
                };
            }
        }
    }
}

/// `dst[row_at(s) + r] = src[r · cols + s]`: the row-major `rows × cols` `src` transposed, each
/// of its columns written as a row wherever `row_at` puts it.
pub(super) fn transpose_into(
    src: &[f32],
    (rows, cols): (usize, usize),
    dst: &mut [f32],
    row_at: impl Fn(usize) -> usize,
) {
    assert!(
        src.len() >= rows * cols && (0..cols).all(|s| row_at(s) + rows <= dst.len()),
        "transpose_into: buffers too short"
    );
    // SAFETY: AVX-512F; reads of row r's columns s0.. (masked to `cols`) inside `src`, writes of
    // rows r0.. (masked to `rows`) at `row_at(s)`, inside `dst` (asserted).
    unsafe { transpose_into_avx512(src, (rows, cols), dst, &row_at) }
}

#[target_feature(enable = "avx512f")]
fn transpose_into_avx512(
    src: &[f32],
    (rows, cols): (usize, usize),
    dst: &mut [f32],
    row_at: &impl Fn(usize) -> usize,
) {
    let mut r = [_mm512_setzero_si512(); 16];
    for r0 in (0..rows).step_by(16) {
        let nr = (rows - r0).min(16);
        for s0 in (0..cols).step_by(16) {
            let ns = (cols - s0).min(16);
            for (i, v) in r.iter_mut().enumerate() {
                *v = if i < nr {
                    // SAFETY: ns values of row r0 + i from column s0.
                    unsafe {
                        _mm512_maskz_loadu_epi32(
                            lanes(ns),
                            src.as_ptr().add((r0 + i) * cols + s0).cast(),
                        )
                    }
                } else {
                    _mm512_setzero_si512()
                };
            }
            transpose16(&mut r);
            for (s, v) in r.iter().take(ns).enumerate() {
                // SAFETY: nr values at row_at(s0 + s) + r0.
                unsafe {
                    _mm512_mask_storeu_epi32(
                        dst.as_mut_ptr().add(row_at(s0 + s) + r0).cast(),
                        lanes(nr),
                        *v,
                    )
                };
            }
        }
    }
}
