//! The tile product ([`super::tile_product`]) on AMX: `tdpbf16ps` on 16 × 16 tiles of `C`, two
//! of them (a 16 × 32 block) in tile registers for the whole sum along `k`.
//!
//! Why two accumulators and not the four of a 2 × 2 block (one load per product instead of one
//! and a half): while something outside a cloud guest computes on its core (the core's other
//! hardware thread, as far as the guest can tell), a product into one of four accumulators took
//! twice as long as into one of two (17.6 against 9.5 ns per `tdpbf16ps`, no loads), and the
//! 2 × 2 block with its loads 32 ns per product against 21.5 for the 1 × 2 block; on a quiet
//! core both reach the unit's 7.3 ns (`examples/amx_blocks` measures it; the performance
//! chapter has the figures).

use std::arch::asm;

use super::amx::TileConfig;
use super::tiles::TileOperand;

/// `c = a · b` over `k_offsets.len()` steps of 32 (or `c += a · b` when `accumulate`), `a` in
/// `m_tiles` row blocks of 16 and `b` in `n_tiles` column blocks of 16 (`n_tiles` even), into
/// `c`'s first `16 · m_tiles` rows of `c_stride` f32 values (`16 · n_tiles` of them written).
/// Panics where AMX is not [`super::amx::available`] or the operands do not fit
/// ([`TileOperand::fits_product`]).
pub(super) fn product(
    a: TileOperand<'_>,
    b: TileOperand<'_>,
    c: &mut [f32],
    (m_tiles, n_tiles, c_stride): (usize, usize, usize),
    accumulate: bool,
) {
    assert!(
        super::amx::available()
            && TileOperand::fits_product(&a, &b, c, (m_tiles, n_tiles, c_stride)),
        "AMX tile product: operands do not fit their tiles"
    );
    let cfg = TileConfig::full();
    let (ap, bp, cp) = (a.data.as_ptr(), b.data.as_ptr(), c.as_mut_ptr());
    let (a_rs, b_rs, c_rs) = (a.row_stride * 2, b.row_stride * 2, c_stride * 4);
    // SAFETY: AMX is available (asserted); the configuration is palette 1's eight 16 × 64-byte
    // tiles; every tile load reads 16 rows of 64 bytes that `fits` put inside `a` / `b`, every
    // load or store of `C` 16 rows of 16 f32 inside `c` (asserted above); tiles released.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        // Column pairs outside, row blocks inside: a pair's panels of `B` (2 KiB a step) are
        // read from L1/L2 by every row block, `A`'s row block streams along `k`. (Row blocks
        // outside, or in groups of four, measured no faster; nor a prefetch of the next row
        // block's `A`.)
        for nt in (0..n_tiles).step_by(2) {
            let b0 = bp.add(nt * b.tile_step);
            let b1 = b0.add(b.tile_step);
            for mt in 0..m_tiles {
                let c0 = cp.add(mt * 16 * c_stride + nt * 16);
                let c1 = c0.add(16);
                if accumulate {
                    asm!(
                        "tileloadd tmm0, [{c0} + {s}]",
                        "tileloadd tmm1, [{c1} + {s}]",
                        c0 = in(reg) c0, c1 = in(reg) c1, s = in(reg) c_rs,
                        options(nostack, readonly)
                    );
                } else {
                    asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
                }
                let a0 = ap.add(mt * a.tile_step);
                for (&ka, &kb) in a.k_offsets.iter().zip(b.k_offsets) {
                    asm!(
                        "tileloadd tmm4, [{a0} + {sa}]",
                        "tileloadd tmm6, [{b0} + {sb}]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tileloadd tmm7, [{b1} + {sb}]",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        a0 = in(reg) a0.add(ka),
                        b0 = in(reg) b0.add(kb), b1 = in(reg) b1.add(kb),
                        sa = in(reg) a_rs, sb = in(reg) b_rs,
                        options(nostack, readonly)
                    );
                }
                asm!(
                    "tilestored [{c0} + {s}], tmm0",
                    "tilestored [{c1} + {s}], tmm1",
                    c0 = in(reg) c0, c1 = in(reg) c1, s = in(reg) c_rs,
                    options(nostack)
                );
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}
