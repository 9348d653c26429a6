//! The AVX512-BF16 kernel: `vdpbf16ps` adds, in each of 16 f32 lanes, the products of a bf16
//! pair of `A` (broadcast) and a pair of `B` (one column per lane). A block of 8 rows × 32 columns
//! of `C` lives in 16 registers; each pair of `k` loads two registers of `B` and broadcasts eight
//! pairs of `A`.

use super::super::gemm::MatRef;
use super::pack::{pack_a, pack_b, pool, Source};

/// Rows and columns of a block of `C`, and values along `k` per packed block.
const MR: usize = 8;
const NR: usize = 32;
const KC: usize = 256;
/// Independent accumulators of the peak loops: enough to cover the units' latency.
const ACCS: usize = 24;

/// Whether the CPU has AVX-512 BF16.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `c += a · b`, or `c = a · b` unless `accumulate` (`c` row-major `m × n`, see
/// [`super::matmul_bf16`]); only called where [`available`].
pub(super) fn matmul<S: Source>(
    a: MatRef<'_, S>,
    b: MatRef<'_, S>,
    c: &mut [f32],
    accumulate: bool,
) {
    let ((m, k), n) = (a.dims(), b.dims().1);
    // A short `k` is packed in blocks of its own length (rounded up to pairs), not `KC`.
    let kc = KC.min(k.next_multiple_of(2));
    let (ap, mbs, kbs) = pack_a(a, (MR, kc, 1));
    let (bp, nbs, _) = pack_b(b, (NR, kc, 1));
    #[cfg(target_arch = "x86_64")]
    {
        // Row blocks split over candle's threads: each task owns its rows of `c` and its blocks
        // of the packed `A`, and reads all of the packed `B`.
        let threads = super::super::threads::count().min(mbs).max(1);
        let per = mbs.div_ceil(threads);
        let task = |(t, c): (usize, &mut [f32])| {
            let (b0, b1) = (t * per, ((t + 1) * per).min(mbs));
            let rows = (m - b0 * MR).min((b1 - b0) * MR);
            let a = &ap[b0 * kbs * MR * kc..b1 * kbs * MR * kc];
            // SAFETY: the CPU has AVX-512F and AVX-512 BF16 (the caller checked `available`).
            unsafe {
                kernel(
                    a,
                    &bp,
                    (c, accumulate),
                    (rows, k, n),
                    (b1 - b0, nbs, kbs, kc),
                )
            };
        };
        let parts = c[..m * n].chunks_mut(per * MR * n).enumerate();
        if threads > 1 {
            use rayon::prelude::*;
            parts.collect::<Vec<_>>().into_par_iter().for_each(task);
        } else {
            parts.for_each(task);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        pool::keep(0, ap);
        pool::keep(1, bp);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ap, bp, c, accumulate, m, k, n, mbs, nbs, kbs, kc);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn kernel(
    ap: &[u16],
    bp: &[u16],
    (c, accumulate): (&mut [f32], bool),
    (m, k, n): (usize, usize, usize),
    (mbs, nbs, kbs, kc): (usize, usize, usize, usize),
) {
    use std::arch::x86_64::*;
    let (ablock, bblock) = (MR * kc, kc * NR);
    let mut out = [0f32; MR * NR];
    for bj in 0..nbs {
        for bi in 0..mbs {
            let mut acc = [[_mm512_setzero_ps(); 2]; MR];
            for kb in 0..kbs {
                let a = &ap[(bi * kbs + kb) * ablock..][..ablock];
                let b = &bp[(bj * kbs + kb) * bblock..][..bblock];
                // The last block's pairs past `k` are zeros: not multiplied.
                let pairs = (k - kb * kc).min(kc).div_ceil(2);
                assert!(2 * pairs <= kc, "bf16 GEMM: a block of {kc} along k");
                let (a, b) = (a.as_ptr(), b.as_ptr());
                for p in 0..pairs {
                    // SAFETY: `b` holds `kc / 2` rows of 2·NR values and
                    // `p < kc / 2`: two loads of 32 inside it; `a` holds MR rows of `kc`
                    // values, and the pair `2p, 2p + 1 < kc` lies inside each; unaligned loads.
                    // `__m512i` and `__m512bh` are the same 64 bytes.
                    unsafe {
                        let row = b.add(p * 2 * NR);
                        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(row.cast()));
                        let b1: __m512bh =
                            std::mem::transmute(_mm512_loadu_si512(row.add(NR).cast()));
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let pair = a.add(r * kc + 2 * p).cast::<i32>().read_unaligned();
                            let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                            acc[0] = _mm512_dpbf16_ps(acc[0], x, b0);
                            acc[1] = _mm512_dpbf16_ps(acc[1], x, b1);
                        }
                    }
                }
            }
            let (i0, j0) = (bi * MR, bj * NR);
            if i0 + MR <= m && j0 + NR <= n {
                // A whole block: straight from the registers into `c`.
                let at = i0 * n + j0;
                let rows = &mut c[at..at + (MR - 1) * n + NR];
                for (r, acc) in acc.iter().enumerate() {
                    // SAFETY: row r's 32 values at r·n lie inside `rows` (checked by its
                    // slicing); unaligned loads and stores.
                    unsafe {
                        let d = rows.as_mut_ptr().add(r * n);
                        let (mut lo, mut hi) = (acc[0], acc[1]);
                        if accumulate {
                            lo = _mm512_add_ps(lo, _mm512_loadu_ps(d));
                            hi = _mm512_add_ps(hi, _mm512_loadu_ps(d.add(16)));
                        }
                        _mm512_storeu_ps(d, lo);
                        _mm512_storeu_ps(d.add(16), hi);
                    }
                }
                continue;
            }
            for (r, acc) in acc.iter().enumerate() {
                // SAFETY: each store writes 16 values inside `out`'s row of 32.
                unsafe {
                    _mm512_storeu_ps(out.as_mut_ptr().add(r * NR), acc[0]);
                    _mm512_storeu_ps(out.as_mut_ptr().add(r * NR + 16), acc[1]);
                }
            }
            let cols = (n - j0).min(NR);
            for (r, row) in out.chunks_exact(NR).take(m.saturating_sub(i0)).enumerate() {
                let dst = &mut c[(i0 + r) * n + j0..][..cols];
                if accumulate {
                    for (d, s) in dst.iter_mut().zip(row) {
                        *d += s;
                    }
                } else {
                    dst.copy_from_slice(&row[..cols]);
                }
            }
        }
    }
}

/// Runs `vdpbf16ps` `steps` × 24 times on independent registers: the unit's peak. Only called
/// where [`available`]. Returns the floating-point operations done.
pub(super) fn spin(steps: u64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F and AVX-512 BF16 (the caller checked `available`).
    unsafe {
        spin_kernel(steps);
    }
    // 16 lanes, two products each, two operations a product; 24 a step.
    (steps * ACCS as u64 * 16 * 2 * 2) as f64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn spin_kernel(steps: u64) {
    use std::arch::x86_64::*;
    // SAFETY: same size; 32 bf16 values.
    let x: __m512bh = unsafe {
        std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(std::hint::black_box(
            0x3f80_3f80,
        )))
    };
    let mut acc = [_mm512_setzero_ps(); ACCS];
    for _ in 0..steps {
        for a in acc.iter_mut() {
            *a = _mm512_dpbf16_ps(*a, x, x);
        }
    }
    std::hint::black_box(acc);
}

/// Runs f32 FMAs (`vfmadd` on 16 lanes) `steps` × 24 times on independent registers: the f32
/// peak. Only where AVX-512F is. Returns the floating-point operations done.
pub(super) fn spin_f32(steps: u64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: only called where the CPU has AVX-512F.
    unsafe {
        spin_f32_kernel(steps);
    }
    (steps * ACCS as u64 * 16 * 2) as f64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn spin_f32_kernel(steps: u64) {
    use std::arch::x86_64::*;
    let x = _mm512_set1_ps(std::hint::black_box(1.0));
    let mut acc = [_mm512_setzero_ps(); ACCS];
    for _ in 0..steps {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, x, x);
        }
    }
    std::hint::black_box(acc);
}
