//! Operand layouts of the bf16 kernels: blocks padded with zeros to whole tiles, and `B` in the
//! pair-interleaved ("VNNI") order both `vdpbf16ps` and `tdpbf16ps` read: row `p` of a packed
//! panel holds, for each column `j`, the pair `(b[2p][j], b[2p + 1][j])`. Either operand may be a
//! strided view (a transposed matrix, say); the common strides have loops of their own.

use half::bf16;
use half::slice::HalfFloatSliceExt;

use super::super::gemm::MatRef;

/// The packed operands' buffers, kept per thread from one product to the next: a fresh buffer of
/// a convolution's size is mapped and faulted in anew on every call (which cost more than the
/// packing itself); a kept one is only zeroed.
pub(super) mod pool {
    use std::cell::RefCell;

    thread_local! {
        static KEPT: RefCell<[Vec<u16>; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
    }

    /// Buffer `slot` (0: `A`, 1: `B`) of `len` zeros.
    pub(in super::super) fn zeroed(slot: usize, len: usize) -> Vec<u16> {
        let mut v = KEPT.with(|k| std::mem::take(&mut k.borrow_mut()[slot]));
        v.clear();
        v.resize(len, 0);
        v
    }

    /// Gives buffer `slot` back for the next product.
    pub(in super::super) fn keep(slot: usize, v: Vec<u16>) {
        KEPT.with(|k| k.borrow_mut()[slot] = v);
    }
}

/// `a` (`m × k`) as blocks of `rows` rows by `kc` columns (zero-padded), block `(i, kb)` at
/// `(i · kbs + kb) · rows · kc`, each row-major; the number of row blocks rounded up to a
/// multiple of `mult`. Returns the packed values, row blocks and `k` blocks.
pub(super) fn pack_a(
    a: MatRef<'_, bf16>,
    (rows, kc, mult): (usize, usize, usize),
) -> (Vec<u16>, usize, usize) {
    let ((m, k), (data, rs, cs)) = (a.dims(), a.parts());
    let mbs = m.div_ceil(rows).div_ceil(mult) * mult;
    let kbs = k.div_ceil(kc);
    let mut out = pool::zeroed(0, mbs * kbs * rows * kc);
    for i in 0..m {
        let (bi, r) = (i / rows, i % rows);
        for kb in 0..kbs {
            let (k0, len) = (kb * kc, kc.min(k - kb * kc));
            let at = ((bi * kbs + kb) * rows + r) * kc;
            let dst = &mut out[at..at + len];
            if cs == 1 {
                dst.copy_from_slice(data[i * rs + k0..][..len].reinterpret_cast());
            } else {
                for (j, o) in dst.iter_mut().enumerate() {
                    *o = data[i * rs + (k0 + j) * cs].to_bits();
                }
            }
        }
    }
    (out, mbs, kbs)
}

/// `b` (`k × n`) as panels of `cols` columns by `kc` rows (zero-padded), pair-interleaved:
/// panel `(j, kb)` at `(j · kbs + kb) · kc · cols`, holding `kc / 2` rows of `2 · cols` values;
/// the number of panels rounded up to a multiple of `mult`. Returns the packed values, panels and
/// `k` blocks.
pub(super) fn pack_b(
    b: MatRef<'_, bf16>,
    (cols, kc, mult): (usize, usize, usize),
) -> (Vec<u16>, usize, usize) {
    let ((k, n), (data, rs, cs)) = (b.dims(), b.parts());
    let nbs = n.div_ceil(cols).div_ceil(mult) * mult;
    let kbs = k.div_ceil(kc);
    let mut out = pool::zeroed(1, nbs * kbs * kc * cols);
    let at = |kk: usize, j: usize| {
        let (kb, p, q) = (kk / kc, kk % kc / 2, kk % 2);
        ((j / cols) * kbs + kb) * kc * cols + p * 2 * cols + 2 * (j % cols) + q
    };
    if rs == 1 {
        // Columns are contiguous: each pair is two neighbouring values.
        for j in 0..n {
            let col = &data[j * cs..][..k];
            for (kk, x) in col.iter().enumerate() {
                out[at(kk, j)] = x.to_bits();
            }
        }
    } else if cs == 1 {
        // Two rows at a time, interleaved 16 columns per instruction where AVX-512 BW is.
        let wide = cols % 16 == 0 && interleave::available();
        for kk in (0..k).step_by(2) {
            let r0 = data[kk * rs..][..n].reinterpret_cast();
            let r1 = (kk + 1 < k).then(|| data[(kk + 1) * rs..][..n].reinterpret_cast());
            let (kb, p) = (kk / kc, kk % kc / 2);
            let row_at = |bj: usize| (bj * kbs + kb) * kc * cols + p * 2 * cols;
            let done = if wide {
                interleave::rows(r0, r1, &mut out, cols, row_at)
            } else {
                0
            };
            for j in done..n {
                let at = row_at(j / cols) + 2 * (j % cols);
                out[at] = r0[j];
                if let Some(r1) = r1 {
                    out[at + 1] = r1[j];
                }
            }
        }
    } else {
        for kk in 0..k {
            for j in 0..n {
                out[at(kk, j)] = data[kk * rs + j * cs].to_bits();
            }
        }
    }
    (out, nbs, kbs)
}

/// Two rows interleaved into pairs, sixteen columns per AVX-512 BW permutation.
mod interleave {
    pub(super) fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// For every whole 16 columns `j0..j0 + 16` of `r0` (and `r1`, zeros without it): writes
    /// `r0[j], r1[j]` pairs at `out[row_at(j0 / cols) + 2 · (j0 % cols)..]`. Returns the columns
    /// done (a multiple of 16; the rest is the caller's). Only where [`available`], with `cols`
    /// a multiple of 16.
    pub(super) fn rows(
        r0: &[u16],
        r1: Option<&[u16]>,
        out: &mut [u16],
        cols: usize,
        row_at: impl Fn(usize) -> usize,
    ) -> usize {
        let n = r0.len() / 16 * 16;
        let n = r1.map_or(n, |r| n.min(r.len() / 16 * 16));
        for j0 in (0..n).step_by(16) {
            let at = row_at(j0 / cols) + 2 * (j0 % cols);
            assert!(at + 32 <= out.len(), "interleave: out of the packed panel");
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512F and BW (the caller checked `available`); every read is
        // inside `r0` / `r1` (n is within both) and every write inside `out` (checked above).
        unsafe {
            kernel(r0, r1, out, n, cols, &row_at);
        }
        n
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn kernel(
        r0: &[u16],
        r1: Option<&[u16]>,
        out: &mut [u16],
        n: usize,
        cols: usize,
        row_at: &impl Fn(usize) -> usize,
    ) {
        use std::arch::x86_64::*;
        // Lane 2c takes r0's value c (index c), lane 2c + 1 r1's (index 16 + c).
        const IDX: [u16; 32] = {
            let mut idx = [0u16; 32];
            let mut c = 0;
            while c < 16 {
                idx[2 * c] = c as u16;
                idx[2 * c + 1] = 16 + c as u16;
                c += 1;
            }
            idx
        };
        // SAFETY: see `rows`: reads of 16 values at j0 < n within both rows, writes of 32
        // inside `out`; unaligned loads and stores.
        unsafe {
            let idx = _mm512_loadu_si512(IDX.as_ptr().cast());
            for j0 in (0..n).step_by(16) {
                let lo = _mm256_loadu_si256(r0.as_ptr().add(j0).cast());
                let hi = match r1 {
                    Some(r1) => _mm256_loadu_si256(r1.as_ptr().add(j0).cast()),
                    None => _mm256_setzero_si256(),
                };
                let v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                let at = row_at(j0 / cols) + 2 * (j0 % cols);
                _mm512_storeu_si512(
                    out.as_mut_ptr().add(at).cast(),
                    _mm512_permutexvar_epi16(idx, v),
                );
            }
        }
    }
}
