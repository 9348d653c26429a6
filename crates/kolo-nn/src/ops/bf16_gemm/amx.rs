//! The AMX kernel: `tdpbf16ps` multiplies a 16 × 32 bf16 tile of `A` by a 32 × 16 tile of `B`
//! (pair-interleaved) into a 16 × 16 f32 tile. Two tile registers accumulate a 16 × 32 block of
//! `C`, one holds `A`'s rows, two `B`'s columns; each step of 32 along `k` loads three tiles and
//! multiplies twice (why two accumulators and not four: [`super::amx_tiles`]). The instructions
//! are written as `asm!` (stable Rust has no AMX intrinsics), after the CPU (CPUID) and Linux
//! (`arch_prctl`) have said yes.

use std::arch::asm;
use std::sync::OnceLock;

use super::super::gemm::MatRef;
use super::pack::{pack_a, pack_b, pool, Source};

/// Rows of a tile, and bf16 values along `k` in one.
const TILE: usize = 16;
const KC: usize = 32;
/// Bytes of a tile's row.
const ROW_BYTES: usize = 64;

/// Whether the CPU has AMX-BF16 and the kernel lets this process use the tiles (asked once).
pub(super) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            let l = std::arch::x86_64::__cpuid_count(7, 0);
            let (amx_bf16, amx_tile) = (l.edx >> 22 & 1 == 1, l.edx >> 24 & 1 == 1);
            if !(amx_bf16 && amx_tile && super::tiles::layouts_available()) {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: arch_prctl with this request only changes the process's permissions.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            };
            r == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}

/// The tile configuration `ldtilecfg` reads (palette 1).
#[repr(C, align(64))]
pub(super) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// Eight tiles of 16 rows of 64 bytes.
    pub(super) fn full() -> TileConfig {
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            cfg.colsb[t] = ROW_BYTES as u16;
            cfg.rows[t] = TILE as u8;
        }
        cfg
    }
}

/// Runs `tdpbf16ps` `steps` × 4 times on tiles in registers (no memory traffic), into two
/// accumulators as the kernels do, on operands of ones (not zeros, which some units multiply
/// faster): the unit's peak. Only called where [`available`]. Returns the floating-point
/// operations done.
pub(super) fn spin(steps: u64) -> f64 {
    let cfg = TileConfig::full();
    // bf16 1.0; the sums grow by 32 a product and stay finite.
    let ones = [0x3f80u16; TILE * KC];
    // SAFETY: as in `matmul`: AMX allowed, a valid configuration, loads of 16 rows of 64 bytes
    // inside `ones`, tiles released.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tileloadd tmm4, [{z} + {s}]",
            "tileloadd tmm6, [{z} + {s}]",
            "tileloadd tmm7, [{z} + {s}]",
            "2:",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "dec {n}",
            "jnz 2b",
            "tilerelease",
            z = in(reg) ones.as_ptr(),
            s = in(reg) ROW_BYTES,
            n = inout(reg) steps.max(1) => _,
            options(nostack, readonly)
        );
    }
    // 16 × 16 outputs, 32 products each, two operations a product; four a step.
    (steps.max(1) * 4 * 16 * 16 * 32 * 2) as f64
}

/// Steps of 32 along `k` between the loads and stores of `C`'s tiles: a tile of `A` over this
/// many steps (8 KiB) stays in L1 while the panels of `B` stream past them.
const KB: usize = 8;

/// `c += a · b` (`c` row-major `m × n`, see [`super::matmul_bf16`]); only called where
/// [`available`].
pub(super) fn matmul<S: Source>(a: MatRef<'_, S>, b: MatRef<'_, S>, c: &mut [f32]) {
    let ((m, _), n) = (a.dims(), b.dims().1);
    let (ap, mbs, kbs) = pack_a(a, (TILE, KC, 2));
    let (bp, nbs, _) = pack_b(b, (TILE, KC, 2));
    let cfg = TileConfig::full();
    let (tile, ctile) = (TILE * KC, TILE * TILE);
    // A tile of `C` lies in `c` itself when whole (loaded and stored with `c`'s row stride);
    // one that crosses `c`'s edge goes through `edge`, kept between the `k` blocks.
    let whole = |bi: usize, bj: usize| (bi + 1) * TILE <= m && (bj + 1) * TILE <= n;
    let all_whole = m % (2 * TILE) == 0 && n % (2 * TILE) == 0;
    let mut edge = vec![0f32; if all_whole { 0 } else { mbs * nbs * ctile }];
    let c_stride = n * 4;
    // SAFETY: the CPU and kernel allow AMX (the caller checked `available`); the configuration
    // is valid for palette 1; every tile load or store moves 16 rows of 64 bytes inside `ap`,
    // `bp` (whole blocks; the packing pads both to even block counts), `edge` (whole tiles) or
    // `c` (a tile used there only when its 16 rows of 16 values lie inside `c`'s `m × n`); the
    // tiles are released before returning.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        let cp = c.as_mut_ptr();
        let ep = edge.as_mut_ptr();
        // Tile (bi, bj) of `C`: its address and row stride.
        let at = |bi: usize, bj: usize| -> (*mut f32, usize) {
            if whole(bi, bj) {
                (cp.add(bi * TILE * n + bj * TILE), c_stride)
            } else {
                (ep.add((bi * nbs + bj) * ctile), ROW_BYTES)
            }
        };
        for kb0 in (0..kbs).step_by(KB) {
            let kb1 = (kb0 + KB).min(kbs);
            for bi in 0..mbs {
                for bj in (0..nbs).step_by(2) {
                    let (c0, s0) = at(bi, bj);
                    let (c1, s1) = at(bi, bj + 1);
                    asm!(
                        "tileloadd tmm0, [{c0} + {s0}]",
                        "tileloadd tmm1, [{c1} + {s1}]",
                        c0 = in(reg) c0,
                        c1 = in(reg) c1,
                        s0 = in(reg) s0,
                        s1 = in(reg) s1,
                        options(nostack, readonly)
                    );
                    for kb in kb0..kb1 {
                        let a0 = ap.as_ptr().add((bi * kbs + kb) * tile);
                        let b0 = bp.as_ptr().add((bj * kbs + kb) * tile);
                        let b1 = bp.as_ptr().add(((bj + 1) * kbs + kb) * tile);
                        asm!(
                            "tileloadd tmm4, [{a0} + {s}]",
                            "tileloadd tmm6, [{b0} + {s}]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tileloadd tmm7, [{b1} + {s}]",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            a0 = in(reg) a0,
                            b0 = in(reg) b0,
                            b1 = in(reg) b1,
                            s = in(reg) ROW_BYTES,
                            options(nostack, readonly)
                        );
                    }
                    asm!(
                        "tilestored [{c0} + {s0}], tmm0",
                        "tilestored [{c1} + {s1}], tmm1",
                        c0 = in(reg) c0,
                        c1 = in(reg) c1,
                        s0 = in(reg) s0,
                        s1 = in(reg) s1,
                        options(nostack)
                    );
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
    pool::keep(0, ap);
    pool::keep(1, bp);
    // Add the edge tiles into `c`, inside its `m × n`.
    // (Where every tile is whole, `edge` is empty and never used.)
    for (t, tile) in edge.chunks_exact(ctile).enumerate() {
        let (bi, bj) = (t / nbs, t % nbs);
        let (ti, tj) = (bi * TILE, bj * TILE);
        if whole(bi, bj) || ti >= m || tj >= n {
            continue;
        }
        let cols = (n - tj).min(TILE);
        for (r, row) in tile.chunks_exact(TILE).take(m - ti).enumerate() {
            for (d, s) in c[(ti + r) * n + tj..][..cols].iter_mut().zip(row) {
                *d += s;
            }
        }
    }
}
