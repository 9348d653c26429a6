//! `B` of [`super::tile_product`] packed straight from a strided f32 source: element `(k, j)` of
//! the `k × n` matrix at `w[row(k) + j · col_stride]`, rounded to bf16 as it is read. A
//! convolution's kernel (`[c_out, C, kh, kw]`) is such a matrix in each of its products' orders —
//! `k = (tap, channel)` by output channel for the forward pass, `k = (tap, output channel)` by
//! channel, the taps flipped, for the input gradient — so no transposed f32 copy of it is written
//! and read again: the AVX-512 path gathers the 16 columns of a panel row (one `vpgatherdd` per
//! row of `B`), rounds two rows at once (`vcvtne2ps2bf16`) and interleaves them into pairs.

use super::super::scratch::LineScratch;
use super::pack::{round_bits, PAIRS};

/// Columns of a panel and values of `k` per panel.
const COLS: usize = 16;
const KC: usize = 32;

/// The `k × n` matrix `B[kk][j] = w[row(kk) + j · col_stride]` rounded to bf16 and packed as
/// the general packing (`pack::pack_b`) packs a row-major one: pair-interleaved panels of 16 columns by 32
/// rows, panel `(nt, kb)` at `(nt · k / 32 + kb) · 512`. `k` must be a multiple of 32 and `n` of
/// 16, and every element inside `w` (the callers' shapes; checked, panics otherwise).
pub(in super::super) fn pack_b_gathered(
    w: &[f32],
    (k, n): (usize, usize),
    row: impl Fn(usize) -> usize,
    col_stride: usize,
) -> LineScratch<u16> {
    assert!(
        k.is_multiple_of(KC) && n.is_multiple_of(COLS),
        "pack_b_gathered: {k} × {n} is not in whole panels"
    );
    let last = (n.max(1) - 1) * col_stride;
    assert!(
        (0..k).all(|kk| row(kk) + last < w.len()),
        "pack_b_gathered: an element lies past the {} values of the source",
        w.len()
    );
    // From the thread's pool: every value is written below.
    let mut out = LineScratch::take(k * n);
    out.resize(k * n);
    #[cfg(target_arch = "x86_64")]
    if super::avx512::available()
        && std::is_x86_feature_detected!("avx512bw")
        && i32::try_from(last).is_ok()
    {
        match k_step(k, &row).filter(|&d| d < col_stride) {
            // SAFETY: AVX-512F, BW and BF16 (checked); every gathered index `row(kk) + j ·
            // col_stride` (j < n) is inside `w` (asserted above), `row(kk)` being `row` of its
            // block's first row plus `d` per row (checked by `k_step`), and the offsets from a
            // gather's base (< 16 · col_stride) fit an i32 (checked); every store of 32 values
            // is inside `out` (k · n values, in whole panels).
            Some(d) => unsafe { along_k(w, (k, n), &row, (d, col_stride), &mut out) },
            // SAFETY: as above, the offsets `j · col_stride` (j < 16) from each row's first
            // column of a panel.
            None => unsafe { along_columns(w, (k, n), &row, col_stride, &mut out) },
        }
        return out;
    }
    scalar(w, (k, n), &row, col_stride, &mut out);
    out
}

/// [`pack_b_gathered`] one value at a time, where the CPU lacks AVX-512 BF16.
fn scalar(
    w: &[f32],
    (k, n): (usize, usize),
    row: &impl Fn(usize) -> usize,
    col_stride: usize,
    out: &mut [u16],
) {
    for kk in 0..k {
        let (kb, p, q) = (kk / KC, kk % KC / 2, kk % 2);
        for j in 0..n {
            let at = ((j / COLS) * (k / KC) + kb) * KC * COLS + p * 2 * COLS + 2 * (j % COLS) + q;
            out[at] = round_bits(w[row(kk) + j * col_stride]);
        }
    }
}

/// The distance `d` between neighbouring rows of `B` in the source where every block of 32 rows
/// has one (`row(kb · 32 + i) = row(kb · 32) + i · d`): a kernel's forward order, whose rows
/// are neighbouring channels of one tap, `k²` values apart.
fn k_step(k: usize, row: &impl Fn(usize) -> usize) -> Option<usize> {
    if k < KC {
        return None;
    }
    let d = row(1).checked_sub(row(0))?;
    (0..k / KC)
        .all(|kb| (0..KC).all(|i| row(kb * KC + i) == row(kb * KC) + i * d))
        .then_some(d)
}

/// A panel's 16 columns gathered as 32 rows apiece — two gathers of 16 neighbouring rows `d`
/// apart, rounded together into the column's 16 pairs — then transposed into the panel's rows:
/// for sources whose rows are closer together than their columns (a gather then reads a few
/// cache lines, not sixteen pages).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn along_k(
    w: &[f32],
    (k, n): (usize, usize),
    row: &impl Fn(usize) -> usize,
    (d, col_stride): (usize, usize),
    out: &mut [u16],
) {
    use super::super::avx512_transpose::transpose16;
    use std::arch::x86_64::*;
    let kbs = k / KC;
    // SAFETY: see `pack_b_gathered`; gathers of 16 f32 at `d` apart from a column's first
    // row of a block, unaligned stores of whole panel rows.
    unsafe {
        let rows = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(d as i32),
        );
        let mut v = [_mm512_setzero_si512(); 16];
        for nt in 0..n / COLS {
            for kb in 0..kbs {
                let first = w.as_ptr().add(row(kb * KC) + nt * COLS * col_stride);
                for (j, vj) in v.iter_mut().enumerate() {
                    let col = first.add(j * col_stride);
                    let r0 = _mm512_i32gather_ps::<4>(rows, col.cast());
                    let r1 = _mm512_i32gather_ps::<4>(rows, col.add(16 * d).cast());
                    // Lane p: the pair of rows 2p, 2p + 1 of column j.
                    *vj = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(r1, r0));
                }
                transpose16(&mut v);
                let panel = out.as_mut_ptr().add((nt * kbs + kb) * KC * COLS);
                for (p, vp) in v.iter().enumerate() {
                    _mm512_storeu_si512(panel.add(p * 2 * COLS).cast(), *vp);
                }
            }
        }
    }
}

/// Each row of a panel gathered along its 16 columns (`col_stride` apart), two rows rounded
/// together and interleaved into pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn along_columns(
    w: &[f32],
    (k, n): (usize, usize),
    row: &impl Fn(usize) -> usize,
    col_stride: usize,
    out: &mut [u16],
) {
    use std::arch::x86_64::*;
    let kbs = k / KC;
    let stride = col_stride as i32;
    // SAFETY: see `pack_b_gathered`; unaligned loads and stores, gathers of 16 f32 at `base`
    // plus `j · col_stride` for j < 16.
    unsafe {
        let pairs = _mm512_loadu_si512(PAIRS.as_ptr().cast());
        let cols = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(stride),
        );
        for nt in 0..n / COLS {
            let first = nt * COLS * col_stride;
            for kb in 0..kbs {
                let panel = out.as_mut_ptr().add((nt * kbs + kb) * KC * COLS);
                for p in 0..KC / 2 {
                    let kk = kb * KC + 2 * p;
                    let r0 = _mm512_i32gather_ps::<4>(cols, w.as_ptr().add(row(kk) + first).cast());
                    let r1 =
                        _mm512_i32gather_ps::<4>(cols, w.as_ptr().add(row(kk + 1) + first).cast());
                    // Lanes 0..16 the first row's bf16, 16..32 the second's.
                    let both: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(r1, r0));
                    _mm512_storeu_si512(
                        panel.add(p * 2 * COLS).cast(),
                        _mm512_permutexvar_epi16(pairs, both),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::aligned::Lines;
    use super::super::super::gemm::MatRef;
    use super::super::pack::pack_b;
    use super::*;

    /// The row-major `k × n` `b` packed by the general packing into the same panels.
    fn pack_b_panels(b: &[f32], (k, n): (usize, usize)) -> Lines<u16> {
        let (mut packed, _, _) = pack_b(MatRef::row_major(b, k, n), (COLS, KC, 1));
        packed.resize(k * n);
        packed
    }

    /// Against the row-major copy packed by `pack_b_panels`, on a kernel's two orders (strides
    /// of a 3 × 3 kernel, 64 channels to 32) and values whose rounding matters (ties, NaN).
    #[test]
    fn gathers_what_the_row_major_packing_packs() {
        let (c_out, c, taps) = (32usize, 64usize, 9usize);
        let w: Vec<f32> = (0..c_out * c * taps)
            .map(|i| match i % 97 {
                0 => f32::NAN,
                1 => f32::from_bits(0x3f80_8000), // a tie: rounds to even
                _ => (i as f32 * 0.377).sin() * (1 + i % 13) as f32,
            })
            .collect();
        let at = |co: usize, ch: usize, t: usize| (co * c + ch) * taps + t;
        // Forward: row (tap, ch), column co.
        check(
            &w,
            (taps * c, c_out),
            |kk| at(0, kk % c, kk / c),
            c * taps,
            |kk, j| at(j, kk % c, kk / c),
        );
        // Input gradient: row (tap', co), column ch, the taps flipped.
        check(
            &w,
            (taps * c_out, c),
            |kk| at(kk % c_out, 0, taps - 1 - kk / c_out),
            taps,
            |kk, j| at(kk % c_out, j, taps - 1 - kk / c_out),
        );
    }

    /// Both paths against `pack_b_panels` of the matrix whose element `(kk, j)` is
    /// `w[elem(kk, j)]`.
    fn check(
        w: &[f32],
        (k, n): (usize, usize),
        row: impl Fn(usize) -> usize,
        col_stride: usize,
        elem: impl Fn(usize, usize) -> usize,
    ) {
        let dense: Vec<f32> = (0..k * n).map(|i| w[elem(i / n, i % n)]).collect();
        let want = pack_b_panels(&dense, (k, n));
        let mut one_by_one = vec![0u16; k * n];
        scalar(w, (k, n), &row, col_stride, &mut one_by_one);
        let got = pack_b_gathered(w, (k, n), row, col_stride);
        for (path, got) in [("packed", &got[..]), ("one by one", &one_by_one[..])] {
            assert_eq!(got.len(), want.len());
            let bad = (0..want.len()).filter(|&i| got[i] != want[i]).count();
            assert_eq!(bad, 0, "{path}: {bad} of {} values differ", want.len());
        }
    }

    #[test]
    #[should_panic(expected = "past the")]
    fn refuses_a_source_too_short() {
        let w = vec![0f32; 32 * 16 - 1];
        pack_b_gathered(&w, (32, 16), |kk| kk * 16, 1);
    }
}
