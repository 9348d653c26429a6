//! The AVX512-BF16 kernel: `vdpbf16ps` adds, in each of 16 f32 lanes, the products of a bf16
//! pair of `A` (broadcast) and a pair of `B` (one column per lane). A block of 8 rows × 32 columns
//! of `C` lives in 16 registers; each pair of `k` loads two registers of `B` and broadcasts eight
//! pairs of `A`.

use half::bf16;

use super::super::gemm::MatRef;
use super::pack::{pack_a, pack_b, pool};

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

/// `c += a · b` (`c` row-major `m × n`, see [`super::matmul_bf16`]); only called where
/// [`available`].
pub(super) fn matmul(a: MatRef<'_, bf16>, b: MatRef<'_, bf16>, c: &mut [f32]) {
    let ((m, _), n) = (a.dims(), b.dims().1);
    let (ap, mbs, kbs) = pack_a(a, (MR, KC, 1));
    let (bp, nbs, _) = pack_b(b, (NR, KC, 1));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F and AVX-512 BF16 (the caller checked `available`).
    unsafe {
        kernel(&ap, &bp, c, (m, n), (mbs, nbs, kbs));
    }
    #[cfg(target_arch = "x86_64")]
    {
        pool::keep(0, ap);
        pool::keep(1, bp);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ap, bp, c, m, n, mbs, nbs, kbs);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn kernel(
    ap: &[u16],
    bp: &[u16],
    c: &mut [f32],
    (m, n): (usize, usize),
    (mbs, nbs, kbs): (usize, usize, usize),
) {
    use std::arch::x86_64::*;
    let (ablock, bblock) = (MR * KC, KC * NR);
    let mut out = [0f32; MR * NR];
    for bj in 0..nbs {
        for bi in 0..mbs {
            let mut acc = [[_mm512_setzero_ps(); 2]; MR];
            for kb in 0..kbs {
                let a = &ap[(bi * kbs + kb) * ablock..][..ablock];
                let b = &bp[(bj * kbs + kb) * bblock..][..bblock];
                for p in 0..KC / 2 {
                    let row = &b[p * 2 * NR..][..2 * NR];
                    // SAFETY: `row` holds 64 values: two loads of 32.
                    let (b0, b1) = unsafe {
                        (
                            _mm512_loadu_si512(row.as_ptr().cast()),
                            _mm512_loadu_si512(row.as_ptr().add(NR).cast()),
                        )
                    };
                    let (b0, b1): (__m512bh, __m512bh) =
                        // SAFETY: same size; a register of 32 bf16 values.
                        unsafe {
                            (
                                std::mem::transmute::<__m512i, __m512bh>(b0),
                                std::mem::transmute::<__m512i, __m512bh>(b1),
                            )
                        };
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let pair =
                            u32::from(a[r * KC + 2 * p]) | u32::from(a[r * KC + 2 * p + 1]) << 16;
                        // SAFETY: same size; 32 bf16 values (the pair, 16 times).
                        let x: __m512bh = unsafe {
                            std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair as i32))
                        };
                        acc[0] = _mm512_dpbf16_ps(acc[0], x, b0);
                        acc[1] = _mm512_dpbf16_ps(acc[1], x, b1);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                // SAFETY: each store writes 16 values inside `out`'s row of 32.
                unsafe {
                    _mm512_storeu_ps(out.as_mut_ptr().add(r * NR), acc[0]);
                    _mm512_storeu_ps(out.as_mut_ptr().add(r * NR + 16), acc[1]);
                }
            }
            let (i0, j0) = (bi * MR, bj * NR);
            let cols = (n - j0).min(NR);
            for (r, row) in out.chunks_exact(NR).take(m.saturating_sub(i0)).enumerate() {
                for (d, s) in c[(i0 + r) * n + j0..][..cols].iter_mut().zip(row) {
                    *d += s;
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
