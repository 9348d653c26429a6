//! The kernel gradient along the output's positions only, for small images: per tap `(kh, kw)`,
//! `dWᵀ[tap] = X[tap] · dY` with `k` running over the `B · H' · W'` output positions, `A` the
//! input values each output position's tap reads (`x[b][ch][s·i + kh − p][s·j + kw − p]`, zero
//! in the padding), gathered straight from the f32 input as bf16 planes, one per tap.
//!
//! The grid form ([`super::tap_grads`]) runs `k` along the grid's positions, the images' padding
//! included, where the output gradient is zero: `(h + p)(w + p) / (h · w)` of the products, 1.56×
//! on ResNet's 4 × 4 images (and on the 5 × 5 phase images of its last stride-2 layer), 1.31× on
//! 7 × 7. Here no product is wasted; what it costs instead is one gather per tap (a masked load of
//! the source row, a permute, a conversion and a masked store per output row), taken where
//! [`pays`] says the grid wastes enough.

use std::arch::x86_64::*;

use super::super::im2col::Geom;
use super::super::scratch::LineScratch;
use super::layout::lanes;
use super::{chunk, grad_pairs, tile_product, TileOperand, MIN_GRAD_POSITIONS};

/// The least share of wasted products of the grid form (its positions over the output's) for
/// which this form is taken.
const MIN_WASTE: f64 = 1.25;

/// Whether the kernel gradient of `g` can run here: every output row's taps read source columns
/// within the 32 values from column `−padding` (two registers); channels in 16s.
pub(super) fn fits(g: &Geom) -> bool {
    g.oh > 0
        && g.ow > 0
        && g.k > 0
        && g.c.is_multiple_of(16)
        && g.padding < 32
        && g.k - 1 + g.stride * (g.ow - 1) <= 31
}

/// Whether this form pays for `g`, whose grid form runs along `grid_positions` positions per
/// sample: it [`fits`] and the grid wastes at least [`MIN_WASTE`] of its products.
pub(super) fn pays(g: &Geom, grid_positions: usize) -> bool {
    fits(g) && grid_positions as f64 >= MIN_WASTE * (g.oh * g.ow) as f64
}

/// Whether this form pays for the strided `g` (phase images of `grid_positions` positions per
/// sample): where it [`fits`] and has more than one tap, always — the grid form lays every
/// channel out once per phase (`np²` planes each), where this one gathers only what each tap
/// reads (ResNet's 128-channel stride-2 layer, 14 × 14 outputs on 15 × 15 phase cells: 0.85×
/// the step time); a 1 × 1 kernel (one phase) as [`pays`] says.
pub(super) fn pays_strided(g: &Geom, grid_positions: usize) -> bool {
    if g.k > 1 {
        fits(g)
    } else {
        pays(g, grid_positions)
    }
}

/// The kernel gradient per tap, `[ch][tap][co]` (as [`super::tap_grads`] gives it), of the
/// contiguous NCHW `x` and output gradient `dy` (`[B, c_out, H', W']`). Only where [`fits`].
pub(super) fn tap_grads(x: &[f32], g: &Geom, dy: &[f32], c_out: usize) -> LineScratch<f32> {
    let (b, c, k, hw) = (g.b, g.c, g.k, g.oh * g.ow);
    let taps = k * k;
    assert!(
        fits(g)
            && c_out.is_multiple_of(32)
            && x.len() >= b * c * g.h * g.w
            && dy.len() >= b * c_out * hw,
        "kolo-conv2d-tiles: compact kernel gradient of a shape it does not fit"
    );
    let at_least = MIN_GRAD_POSITIONS.div_ceil(hw);
    let bc = chunk(b, hw * (c + c_out) * 2).max(at_least.min(b.max(1)));
    let mut acc = LineScratch::take(taps * c * c_out);
    if b == 0 {
        acc.zeroed(taps * c * c_out);
        return acc;
    }
    acc.resize(taps * c * c_out);
    let kq_first = (bc * hw).div_ceil(32) * 32;
    let (mut xt, mut dys, mut dyp) = (
        LineScratch::<u16>::take(c * kq_first),
        LineScratch::<u16>::take(c_out * kq_first),
        LineScratch::<u16>::take(c_out * kq_first),
    );
    let mut a_k = Vec::new();
    for (i, b0) in (0..b).step_by(bc).enumerate() {
        let n = bc.min(b - b0);
        let kq = (n * hw).div_ceil(32) * 32;
        // The positions past the chunk's outputs stay zero on both sides: written once for
        // every chunk of this size, never written by the gathers.
        if i == 0 || n != bc {
            xt.zeroed(c * kq);
            dys.zeroed(c_out * kq);
        }
        let dyq = (dy, c_out, g.oh, g.ow);
        let b_k = grad_pairs(dyq, (b0, n), (g.oh, g.ow), kq, &mut dys, &mut dyp);
        let bt = TileOperand {
            data: &dyp,
            tile_step: 32,
            k_offsets: &b_k,
            row_stride: 2 * c_out,
        };
        a_k.clear();
        a_k.extend((0..kq / 32).map(|kb| kb * 32));
        for t in 0..taps {
            gather_tap(x, g, (b0, n), (t / k, t % k), kq, &mut xt);
            let at = TileOperand {
                data: &xt,
                tile_step: 16 * kq,
                k_offsets: &a_k,
                row_stride: kq,
            };
            // Rows (ch, t) of the sums: `C`'s rows `taps · c_out` values apart.
            let dst = &mut acc[t * c_out..];
            tile_product(at, bt, dst, (c / 16, c_out / 16, taps * c_out), i > 0);
        }
    }
    acc
}

/// Tap `(kh, kw)`'s values of samples `b0..b0 + n` of `x`, as bf16 planes of `kq` positions:
/// `out[ch · kq + (b · H' + i) · W' + j] = x[b0 + b][ch][s·i + kh − p][s·j + kw − p]`, zero where
/// that lies in the padding. Writes every output position of the chunk, nothing past them.
fn gather_tap(
    x: &[f32],
    g: &Geom,
    (b0, n): (usize, usize),
    (kh, kw): (usize, usize),
    kq: usize,
    out: &mut [u16],
) {
    assert!(
        fits(g)
            && kh < g.k
            && kw < g.k
            && n * g.oh * g.ow <= kq
            && x.len() >= (b0 + n) * g.c * g.h * g.w
            && out.len() >= g.c * kq,
        "gather_tap: buffers too short"
    );
    // SAFETY: AVX-512F, BW, VL and BF16 (the module's condition, `layouts_available`); the
    // loads are masked to the source row's columns inside `x`, the stores to the output row's
    // positions inside `out` (asserted above, and `fits`: every index below 32).
    unsafe { gather_tap_avx512(x, g, (b0, n), (kh, kw), kq, out) }
}

#[target_feature(enable = "avx512f,avx512bf16,avx512vl,avx512bw")]
fn gather_tap_avx512(
    x: &[f32],
    g: &Geom,
    chunk: (usize, usize),
    tap: (usize, usize),
    kq: usize,
    out: &mut [u16],
) {
    // An output row is one register of 16 values or two (`fits`: `W' ≤ 32`).
    if g.ow <= 16 {
        gather_rows::<1>(x, g, chunk, tap, kq, out)
    } else {
        gather_rows::<2>(x, g, chunk, tap, kq, out)
    }
}

/// [`gather_tap`] with `BLOCKS` registers of 16 values per output row.
#[target_feature(enable = "avx512f,avx512bf16,avx512vl,avx512bw")]
fn gather_rows<const BLOCKS: usize>(
    x: &[f32],
    g: &Geom,
    (b0, n): (usize, usize),
    (kh, kw): (usize, usize),
    kq: usize,
    out: &mut [u16],
) {
    let (c, h, w, s, p, oh, ow) = (g.c, g.h, g.w, g.stride, g.padding, g.oh, g.ow);
    // Lane l of the two source registers holds column l − p of the row (zero off the image).
    let cols = (w + p).min(32);
    let valid: u32 = (if cols >= 32 {
        u32::MAX
    } else {
        (1u32 << cols) - 1
    }) & !((1u32 << p) - 1);
    let (m_lo, m_hi) = (valid as __mmask16, (valid >> 16) as __mmask16);
    // Output column j = 16·jb + l takes lane s·j + kw; the block's lanes past W' are not stored.
    let idx: [__m512i; BLOCKS] = std::array::from_fn(|jb| {
        let lanes: [i32; 16] = std::array::from_fn(|l| {
            let j = jb * 16 + l;
            if j < ow {
                (s * j + kw) as i32
            } else {
                0
            }
        });
        // SAFETY: 16 `i32`s, read unaligned.
        unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) }
    });
    let stored: [__mmask16; BLOCKS] = std::array::from_fn(|jb| lanes(ow.saturating_sub(jb * 16)));
    let (xp, op) = (x.as_ptr(), out.as_mut_ptr());
    let zero = _mm512_setzero_ps();
    for ch in 0..c {
        for b in 0..n {
            let plane = ((b0 + b) * c + ch) * h * w;
            let mut dst = ch * kq + b * oh * ow;
            for i in 0..oh {
                let (lo, hi) = match (s * i + kh).checked_sub(p).filter(|&r| r < h) {
                    Some(r) => {
                        // The row from column −p: lanes before column 0 and past column w − 1
                        // are masked off, so never read.
                        let row = xp.wrapping_add(plane + r * w).wrapping_sub(p);
                        // SAFETY: the lanes of `m_lo` and `m_hi` are columns 0..w of row r of
                        // the plane, inside `x`.
                        unsafe {
                            (
                                _mm512_maskz_loadu_ps(m_lo, row),
                                _mm512_maskz_loadu_ps(m_hi, row.wrapping_add(16)),
                            )
                        }
                    }
                    // A row in the padding: zeros.
                    None => (zero, zero),
                };
                for (jb, (&ix, &m)) in idx.iter().zip(&stored).enumerate() {
                    let v = _mm512_cvtneps_pbh(_mm512_permutex2var_ps(lo, ix, hi));
                    // SAFETY: positions of this output row inside `out` (see `gather_tap`);
                    // `__m256bh` and `__m256i` are the same 32 bytes.
                    unsafe {
                        _mm256_mask_storeu_epi16(
                            op.add(dst + jb * 16).cast(),
                            m,
                            std::mem::transmute::<__m256bh, __m256i>(v),
                        )
                    };
                }
                dst += ow;
            }
        }
    }
}
