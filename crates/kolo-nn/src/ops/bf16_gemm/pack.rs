//! Operand layouts of the bf16 kernels: blocks padded with zeros to whole tiles, and `B` in the
//! pair-interleaved ("VNNI") order both `vdpbf16ps` and `tdpbf16ps` read: row `p` of a packed
//! panel holds, for each column `j`, the pair `(b[2p][j], b[2p + 1][j])`. Either operand may be a
//! strided view (a transposed matrix, say); the common strides have loops of their own. Either
//! may hold bf16 values or f32 ones, rounded to bf16 as they are packed ([`Source`]).

use half::bf16;
use half::slice::HalfFloatSliceExt;

use super::super::aligned::Lines;
use super::super::gemm::MatRef;

/// A value the packing reads: bf16 as it is, f32 rounded to the nearest bf16 (ties to even; a
/// NaN stays a NaN), as the bf16 unit's own conversion (`vcvtneps2bf16`) rounds.
pub(in super::super) trait Source: Copy + Send + Sync + 'static {
    /// Its bf16 bits.
    fn bits(self) -> u16;

    /// The bf16 bits of a contiguous run: the run itself for bf16, converted into `tmp` for f32.
    fn run_bits<'a>(src: &'a [Self], tmp: &'a mut Vec<u16>) -> &'a [u16];

    /// Writes the bf16 bits of a contiguous run into `dst` (as long as `src`).
    fn write_bits(src: &[Self], dst: &mut [u16]);

    /// Its value after rounding to bf16, widened back to f32.
    fn rounded(self) -> f32 {
        bf16::from_bits(self.bits()).to_f32()
    }
}

impl Source for bf16 {
    fn bits(self) -> u16 {
        self.to_bits()
    }

    fn run_bits<'a>(src: &'a [Self], _tmp: &'a mut Vec<u16>) -> &'a [u16] {
        src.reinterpret_cast()
    }

    fn write_bits(src: &[Self], dst: &mut [u16]) {
        dst.copy_from_slice(src.reinterpret_cast());
    }
}

impl Source for f32 {
    fn bits(self) -> u16 {
        round_bits(self)
    }

    fn run_bits<'a>(src: &'a [Self], tmp: &'a mut Vec<u16>) -> &'a [u16] {
        tmp.clear();
        tmp.resize(src.len(), 0);
        round_run(src, tmp);
        tmp
    }

    fn write_bits(src: &[Self], dst: &mut [u16]) {
        round_run(src, dst);
    }
}

/// `dst[i] = round_bits(src[i])`, sixteen at a time on the bf16 unit's own conversion where the
/// CPU has AVX512-BF16 (a short run, such as an image row of 7 values, in one masked step).
pub(super) fn round_run(src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if super::avx512::available() && std::is_x86_feature_detected!("avx512bw") {
        // SAFETY: the CPU has AVX-512F, BW and BF16.
        unsafe { round_run_avx512(src, dst) };
        return;
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = round_bits(x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx512vl,avx512bw")]
fn round_run_avx512(src: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    for i in (0..n).step_by(16) {
        let m: __mmask16 = if n - i >= 16 {
            0xffff
        } else {
            (1u16 << (n - i)) - 1
        };
        // SAFETY: the lanes of `m` are values i.. below n ≤ both lengths; masked loads and
        // stores touch no other memory.
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, src.as_ptr().add(i));
            let h: __m256bh = _mm512_cvtneps_pbh(v);
            _mm256_mask_storeu_epi16(
                dst.as_mut_ptr().add(i).cast(),
                m,
                std::mem::transmute::<__m256bh, __m256i>(h),
            );
        }
    }
}

/// `x` rounded to the nearest bf16, ties to even; a NaN stays a (quiet) NaN.
#[inline(always)]
pub(super) fn round_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if x.is_nan() {
        (b >> 16) as u16 | 0x40
    } else {
        rounded
    }
}

/// Pair-interleave indices for `vpermw` over two rows of 16 bf16 values held in one register
/// (the first row in lanes 0..16, the second in 16..32): lane 2c takes the first row's column c
/// (index c), lane 2c + 1 the second's (16 + c).
pub(super) const PAIRS: [u16; 32] = {
    let mut idx = [0u16; 32];
    let mut c = 0;
    while c < 16 {
        idx[2 * c] = c as u16;
        idx[2 * c + 1] = 16 + c as u16;
        c += 1;
    }
    idx
};

/// The packed operands' buffers, kept per thread from one product to the next: a fresh buffer of
/// a convolution's size is mapped and faulted in anew on every call (which cost more than the
/// packing itself). A kept one is not zeroed: the packing writes every value a product reads
/// that counts — the padding along `k` is written as zeros ([`zero_tail`]); rows of `A` past `m`
/// and columns of `B` past `n` may hold old values, which only reach outputs that are dropped.
pub(super) mod pool {
    use std::cell::RefCell;

    use super::super::super::aligned::Lines;

    thread_local! {
        static KEPT: RefCell<[Lines<u16>; 2]> = const { RefCell::new([Lines::new(), Lines::new()]) };
    }

    /// Buffer `slot` (0: `A`, 1: `B`) of `len` values from a cache line on, which may be those
    /// of an earlier product (not zeroed: that would cost a pass).
    pub(in super::super) fn taken(slot: usize, len: usize) -> Lines<u16> {
        let mut v = KEPT.with(|k| std::mem::replace(&mut k.borrow_mut()[slot], Lines::new()));
        v.resize(len);
        v
    }

    /// Gives buffer `slot` back for the next product.
    pub(in super::super) fn keep(slot: usize, v: Lines<u16>) {
        KEPT.with(|k| k.borrow_mut()[slot] = v);
    }
}

/// Zeros the last `k` block of every block of `block` values in `out` (blocks of `kbs` in a row)
/// where `k` does not fill it: the padding along `k`, which the kernels multiply.
fn zero_tail(out: &mut [u16], (k, kc, kbs): (usize, usize, usize), block: usize) {
    if k % kc == 0 || kbs == 0 {
        return;
    }
    for group in out.chunks_exact_mut(kbs * block) {
        group[(kbs - 1) * block..].fill(0);
    }
}

/// `a` (`m × k`) as blocks of `rows` rows by `kc` columns (zero-padded), block `(i, kb)` at
/// `(i · kbs + kb) · rows · kc`, each row-major; the number of row blocks rounded up to a
/// multiple of `mult`. Returns the packed values, row blocks and `k` blocks.
pub(super) fn pack_a<S: Source>(
    a: MatRef<'_, S>,
    (rows, kc, mult): (usize, usize, usize),
) -> (Lines<u16>, usize, usize) {
    let ((m, k), (data, rs, cs)) = (a.dims(), a.parts());
    let mbs = m.div_ceil(rows).div_ceil(mult) * mult;
    let kbs = k.div_ceil(kc);
    let mut out = pool::taken(0, mbs * kbs * rows * kc);
    zero_tail(&mut out[..mbs * kbs * rows * kc], (k, kc, kbs), rows * kc);
    if rs == 1 && cs != 1 {
        // A transposed matrix: the rows of a block are neighbours in each of its columns, each
        // column converted whole first.
        let mut tmp = Vec::new();
        for kk in 0..k {
            let (kb, j) = (kk / kc, kk % kc);
            let col = S::run_bits(&data[kk * cs..][..m], &mut tmp);
            for (bi, part) in col.chunks(rows).enumerate() {
                let block = &mut out[(bi * kbs + kb) * rows * kc..][..rows * kc];
                for (r, &x) in part.iter().enumerate() {
                    block[r * kc + j] = x;
                }
            }
        }
        return (out, mbs, kbs);
    }
    for i in 0..m {
        let (bi, r) = (i / rows, i % rows);
        for kb in 0..kbs {
            let (k0, len) = (kb * kc, kc.min(k - kb * kc));
            let at = ((bi * kbs + kb) * rows + r) * kc;
            let dst = &mut out[at..at + len];
            if cs == 1 {
                S::write_bits(&data[i * rs + k0..][..len], dst);
            } else {
                for (j, o) in dst.iter_mut().enumerate() {
                    *o = data[i * rs + (k0 + j) * cs].bits();
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
pub(super) fn pack_b<S: Source>(
    b: MatRef<'_, S>,
    (cols, kc, mult): (usize, usize, usize),
) -> (Lines<u16>, usize, usize) {
    let ((k, n), (data, rs, cs)) = (b.dims(), b.parts());
    let nbs = n.div_ceil(cols).div_ceil(mult) * mult;
    let kbs = k.div_ceil(kc);
    let mut out = pool::taken(1, nbs * kbs * kc * cols);
    zero_tail(&mut out[..nbs * kbs * kc * cols], (k, kc, kbs), kc * cols);
    let at = |kk: usize, j: usize| {
        let (kb, p, q) = (kk / kc, kk % kc / 2, kk % 2);
        ((j / cols) * kbs + kb) * kc * cols + p * 2 * cols + 2 * (j % cols) + q
    };
    let (mut tmp0, mut tmp1) = (Vec::new(), Vec::new());
    if rs == 1 {
        // Columns are contiguous: each pair is two neighbouring values.
        for j in 0..n {
            let col = S::run_bits(&data[j * cs..][..k], &mut tmp0);
            let (bj, jj) = (j / cols, j % cols);
            for (kb, seg) in col.chunks(kc).enumerate() {
                let base = (bj * kbs + kb) * kc * cols + 2 * jj;
                for (p, pair) in seg.chunks(2).enumerate() {
                    let at = base + p * 2 * cols;
                    out[at] = pair[0];
                    if let Some(&v) = pair.get(1) {
                        out[at + 1] = v;
                    }
                }
            }
        }
    } else if cs == 1 {
        // Two rows at a time, interleaved 16 columns per instruction where AVX-512 BW is.
        let wide = cols % 16 == 0 && interleave::available();
        for kk in (0..k).step_by(2) {
            let r0 = S::run_bits(&data[kk * rs..][..n], &mut tmp0);
            let r1 = (kk + 1 < k).then(|| S::run_bits(&data[(kk + 1) * rs..][..n], &mut tmp1));
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
                out[at(kk, j)] = data[kk * rs + j * cs].bits();
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
        const IDX: [u16; 32] = super::PAIRS;
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
