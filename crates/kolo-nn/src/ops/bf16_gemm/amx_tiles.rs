//! The AMX product over operands already in a tile-readable layout, addressed through offset
//! tables instead of packed first: what the AMX convolution ([`crate::ops`]'s `amx_conv`) runs.
//! A tile of `A` is 16 rows of 32 bf16 values (64 bytes) anywhere in memory with a fixed row
//! stride, so a row of `A` may be one output pixel's 32 input channels read straight out of an
//! NHWC input (the tap's shift is an offset), and a tile of `B` 16 rows of 16 pairs in the
//! pair-interleaved order `tdpbf16ps` reads. `C` is f32, row-major, in 16 × 16 tiles; two of
//! them (a 16 × 32 block) stay in tile registers for the whole sum along `k`.
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

/// Tiles of one operand: tile `(i, kb)` (row block `i`, step `kb` of 32 along `k`) starts at
/// element `i · tile_step + k_offsets[kb]` of `data`, its 16 rows `row_stride` elements apart,
/// each row 32 bf16 values.
#[derive(Clone, Copy)]
pub(in crate::ops) struct TileOperand<'a> {
    pub(in crate::ops) data: &'a [u16],
    pub(in crate::ops) tile_step: usize,
    pub(in crate::ops) k_offsets: &'a [usize],
    pub(in crate::ops) row_stride: usize,
}

impl TileOperand<'_> {
    /// Whether tiles `0..blocks` along every `k` step lie inside `data`.
    fn fits(&self, blocks: usize) -> bool {
        let Some(&k_max) = self.k_offsets.iter().max() else {
            return true;
        };
        blocks == 0
            || (blocks - 1) * self.tile_step + k_max + 15 * self.row_stride + 32 <= self.data.len()
    }
}

/// `c = a · b` over `k_offsets.len()` steps of 32 (or `c += a · b` when `accumulate`), `a` in
/// `m_tiles` row blocks of 16 and `b` in `n_tiles` column blocks of 16 (`n_tiles` even), into
/// `c`'s first `16 · m_tiles` rows of `c_stride` f32 values (`16 · n_tiles` of them written).
/// Panics where an operand's tiles leave their slices, `n_tiles` is odd or the step counts
/// differ (the caller's shapes, not a user's); only called where AMX is
/// [`super::amx::available`].
pub(in crate::ops) fn tile_product(
    a: TileOperand<'_>,
    b: TileOperand<'_>,
    c: &mut [f32],
    (m_tiles, n_tiles, c_stride): (usize, usize, usize),
    accumulate: bool,
) {
    let ks = a.k_offsets.len();
    assert!(
        super::amx::available()
            && ks == b.k_offsets.len()
            && n_tiles.is_multiple_of(2)
            && a.fits(m_tiles)
            && b.fits(n_tiles)
            && n_tiles * 16 <= c_stride
            && (m_tiles == 0 || (m_tiles * 16 - 1) * c_stride + n_tiles * 16 <= c.len()),
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
