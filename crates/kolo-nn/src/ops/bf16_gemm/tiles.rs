//! The tile product: `C (f32) += A · B` over bf16 operands already in a tile-readable layout,
//! addressed through offset tables instead of packed first — what the implicit-GEMM convolutions
//! (`ops::tile_conv`) run. A tile of `A` is 16 rows of 32 bf16 values (64 bytes) anywhere in
//! memory with a fixed row stride, so a row of `A` may be one output pixel's 32 input channels
//! read straight out of an NHWC input (the tap's shift is an offset); a tile of `B` is 16 rows of
//! 16 pairs in the pair-interleaved order both bf16 units read (row `p`: the pairs `2p, 2p + 1`
//! along `k` of 16 columns). `C` is f32, row-major, in 16 × 16 tiles.
//!
//! One layout, two units: AMX's `tdpbf16ps` multiplies a whole tile pair ([`super::amx_tiles`]);
//! AVX512-BF16's `vdpbf16ps` a row of `B` by one broadcast pair of `A` ([`super::avx512_tiles`]).
//! Which one runs is [`tile_unit`].

use std::cell::Cell;

use super::Bf16Path;
use crate::ops::matmul_precision::bf16_unit;

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

    /// Whether `a` (`m_tiles` row blocks) times `b` (`n_tiles` column blocks, an even count)
    /// into `c` (rows `c_stride` values apart) stays inside the three slices, with as many steps
    /// along `k` on both sides.
    pub(super) fn fits_product(
        a: &TileOperand<'_>,
        b: &TileOperand<'_>,
        c: &[f32],
        (m_tiles, n_tiles, c_stride): (usize, usize, usize),
    ) -> bool {
        a.k_offsets.len() == b.k_offsets.len()
            && n_tiles.is_multiple_of(2)
            && a.fits(m_tiles)
            && b.fits(n_tiles)
            && n_tiles * 16 <= c_stride
            && (m_tiles == 0 || (m_tiles * 16 - 1) * c_stride + n_tiles * 16 <= c.len())
    }
}

/// Whether this CPU has the AVX-512 (F, BW, VL, BF16) that the layouts and packing around the
/// tiles run on: every CPU with AMX, and the AMD EPYCs with AVX512-BF16 — but a hypervisor may
/// hide some.
pub(in crate::ops) fn layouts_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

thread_local! {
    /// Set while [`with_tile_unit`] runs its closure on this thread.
    static FORCED: Cell<Option<Bf16Path>> = const { Cell::new(None) };
}

/// The unit [`tile_product`] runs on: the bf16 unit f32 products are set to
/// ([`crate::ops::set_matmul_precision`]) where that is AMX or AVX512-BF16, else the faster unit
/// this CPU has (AMX, then AVX512-BF16); `None` on a CPU with neither.
fn tile_unit() -> Option<Bf16Path> {
    if let Some(u) = FORCED.with(Cell::get) {
        return Some(u);
    }
    match bf16_unit() {
        Some(u @ (Bf16Path::Amx | Bf16Path::Avx512Bf16)) => Some(u),
        _ => [Bf16Path::Amx, Bf16Path::Avx512Bf16]
            .into_iter()
            .find(|u| u.available()),
    }
}

/// Runs `f` with this thread's tile products on `unit` (one the CPU has): the tests run each
/// unit on a CPU that has both.
#[cfg(test)]
pub(in crate::ops) fn with_tile_unit<R>(unit: Bf16Path, f: impl FnOnce() -> R) -> R {
    let before = FORCED.with(|c| c.replace(Some(unit)));
    let r = f();
    FORCED.with(|c| c.set(before));
    r
}

/// `c = a · b` over `k_offsets.len()` steps of 32 (or `c += a · b` when `accumulate`), `a` in
/// `m_tiles` row blocks of 16 and `b` in `n_tiles` column blocks of 16 (`n_tiles` even), into
/// `c`'s first `16 · m_tiles` rows of `c_stride` f32 values (`16 · n_tiles` of them written), on
/// [`tile_unit`]. Panics where an operand's tiles leave their slices, `n_tiles` is odd or the step
/// counts differ (the caller's shapes, not a user's), and on a CPU with neither unit.
pub(in crate::ops) fn tile_product(
    a: TileOperand<'_>,
    b: TileOperand<'_>,
    c: &mut [f32],
    dims: (usize, usize, usize),
    accumulate: bool,
) {
    match tile_unit() {
        Some(Bf16Path::Amx) => super::amx_tiles::product(a, b, c, dims, accumulate),
        Some(Bf16Path::Avx512Bf16) => super::avx512_tiles::product(a, b, c, dims, accumulate),
        _ => panic!("tile product: this CPU has neither AMX nor AVX512-BF16"),
    }
}
