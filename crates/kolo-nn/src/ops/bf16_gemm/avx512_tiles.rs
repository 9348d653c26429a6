//! The tile product ([`super::tile_product`]) on AVX512-BF16: `vdpbf16ps` adds, in each of 16 f32
//! lanes, the products of one pair of `A` (broadcast) and a column's pair of `B`, so a row of a
//! `B` tile is one register as it lies. A block of 8 rows × 32 columns of `C` (half a row block
//! by a pair of column blocks) stays in 16 registers for the whole sum along `k`; each pair along
//! `k` loads two rows of `B` and broadcasts eight pairs of `A` from where they lie — the same
//! blocking as the packed GEMM's kernel ([`super::avx512`]), without the packing.

use super::tiles::TileOperand;

/// Rows of `C` a block holds (half a row block); its columns are a pair of column blocks, 32.
const ROWS: usize = 8;

/// [`super::tile_product`] on AVX512-BF16. Panics where the CPU lacks it or the operands do not
/// fit ([`TileOperand::fits_product`]).
pub(super) fn product(
    a: TileOperand<'_>,
    b: TileOperand<'_>,
    c: &mut [f32],
    dims: (usize, usize, usize),
    accumulate: bool,
) {
    assert!(
        super::avx512::available() && TileOperand::fits_product(&a, &b, c, dims),
        "AVX512-BF16 tile product: operands do not fit their tiles"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F and AVX-512 BF16, and the operands fit (asserted).
    unsafe {
        kernel(a, b, c, dims, accumulate)
    };
}

/// The product; only called where [`super::avx512::available`] and
/// [`TileOperand::fits_product`] hold.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel(
    a: TileOperand<'_>,
    b: TileOperand<'_>,
    c: &mut [f32],
    (m_tiles, n_tiles, c_stride): (usize, usize, usize),
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    let (ap, bp, cp) = (a.data.as_ptr(), b.data.as_ptr(), c.as_mut_ptr());
    let (a_rs, b_rs) = (a.row_stride, b.row_stride);
    // Column pairs outside, row blocks inside, as on AMX: a pair's rows of `B` are read from
    // L1/L2 by every row block, `A`'s row block streams along `k`.
    for nt in (0..n_tiles).step_by(2) {
        let (b0, b1) = (nt * b.tile_step, (nt + 1) * b.tile_step);
        for r0 in (0..m_tiles * 16).step_by(ROWS) {
            let a0 = (r0 / 16) * a.tile_step + (r0 % 16) * a_rs;
            // SAFETY (every access below): `fits_product` put tiles 0..m_tiles of `a` and
            // 0..n_tiles of `b` at every k step inside their slices, 16 rows of 32 values each
            // (these ROWS rows lie within row block r0 / 16, the pairs 2p, 2p + 1 < 32, the
            // rows p < 16 of `B`), and rows 0..16·m_tiles of `c`, 16·n_tiles values each, inside
            // `c`; loads and stores are unaligned.
            let crow = |r: usize| unsafe { cp.add((r0 + r) * c_stride + nt * 16) };
            let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
            if accumulate {
                for (r, acc) in acc.iter_mut().enumerate() {
                    unsafe {
                        acc[0] = _mm512_loadu_ps(crow(r));
                        acc[1] = _mm512_loadu_ps(crow(r).add(16));
                    }
                }
            }
            for (&ka, &kb) in a.k_offsets.iter().zip(b.k_offsets) {
                let (arow, brow0, brow1) =
                    unsafe { (ap.add(a0 + ka), bp.add(b0 + kb), bp.add(b1 + kb)) };
                for p in 0..16 {
                    // `__m512i` and `__m512bh` are the same 64 bytes.
                    let (x0, x1) = unsafe {
                        (
                            std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                                brow0.add(p * b_rs).cast(),
                            )),
                            std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                                brow1.add(p * b_rs).cast(),
                            )),
                        )
                    };
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let pair =
                            unsafe { arow.add(r * a_rs + 2 * p).cast::<i32>().read_unaligned() };
                        let y = unsafe {
                            std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair))
                        };
                        acc[0] = _mm512_dpbf16_ps(acc[0], x0, y);
                        acc[1] = _mm512_dpbf16_ps(acc[1], x1, y);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                unsafe {
                    _mm512_storeu_ps(crow(r), acc[0]);
                    _mm512_storeu_ps(crow(r).add(16), acc[1]);
                }
            }
        }
    }
}
