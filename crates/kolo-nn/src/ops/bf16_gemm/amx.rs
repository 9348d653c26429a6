//! The AMX kernel: `tdpbf16ps` multiplies a 16 × 32 bf16 tile of `A` by a 32 × 16 tile of `B`
//! (pair-interleaved) into a 16 × 16 f32 tile. Eight tile registers: four accumulate a 32 × 32
//! block of `C`, two hold `A`'s rows, two `B`'s columns; each step of 32 along `k` loads four tiles
//! and multiplies four times. The instructions are written as `asm!` (stable Rust has no AMX
//! intrinsics), after the CPU (CPUID) and Linux (`arch_prctl`) have said yes.

use std::arch::asm;
use std::sync::OnceLock;

use half::bf16;

use super::pack::{pack_a, pack_b};

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
            if !(amx_bf16 && amx_tile) {
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

/// Runs `tdpbf16ps` `steps` × 4 times on tiles in registers (no memory traffic): the unit's
/// peak. Only called where [`available`]. Returns the floating-point operations done.
pub(super) fn spin(steps: u64) -> f64 {
    let cfg = TileConfig::full();
    let zeros = [0u16; TILE * KC];
    // SAFETY: as in `matmul`: AMX allowed, a valid configuration, loads of 16 rows of 64 bytes
    // inside `zeros`, tiles released.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tileloadd tmm4, [{z} + {s}]",
            "tileloadd tmm5, [{z} + {s}]",
            "tileloadd tmm6, [{z} + {s}]",
            "tileloadd tmm7, [{z} + {s}]",
            "2:",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "dec {n}",
            "jnz 2b",
            "tilerelease",
            z = in(reg) zeros.as_ptr(),
            s = in(reg) ROW_BYTES,
            n = inout(reg) steps.max(1) => _,
            options(nostack, readonly)
        );
    }
    // 16 × 16 outputs, 32 products each, two operations a product; four a step.
    (steps.max(1) * 4 * 16 * 16 * 32 * 2) as f64
}

/// `c += a · b` (see [`super::matmul_bf16`]); only called where [`available`].
pub(super) fn matmul(a: &[bf16], b: &[bf16], c: &mut [f32], (m, k, n): (usize, usize, usize)) {
    let (ap, mbs, kbs) = pack_a(a, (m, k), (TILE, KC, 2));
    let (bp, nbs, _) = pack_b(b, (k, n), (TILE, KC, 2));
    let cfg = TileConfig::full();
    let tile = TILE * KC;
    let mut out = [0f32; 4 * TILE * TILE];
    // SAFETY: the CPU and kernel allow AMX (the caller checked `available`); the configuration
    // is valid for palette 1; every tile load reads 16 rows of 64 bytes inside `ap` or `bp`
    // (whole blocks, padded by the packing to even block counts), every store writes 16 rows of
    // 64 bytes inside `out`; the tiles are released before returning.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        for bi in (0..mbs).step_by(2) {
            for bj in (0..nbs).step_by(2) {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
                for kb in 0..kbs {
                    let a0 = ap.as_ptr().add((bi * kbs + kb) * tile);
                    let a1 = ap.as_ptr().add(((bi + 1) * kbs + kb) * tile);
                    let b0 = bp.as_ptr().add((bj * kbs + kb) * tile);
                    let b1 = bp.as_ptr().add(((bj + 1) * kbs + kb) * tile);
                    asm!(
                        "tileloadd tmm4, [{a0} + {s}]",
                        "tileloadd tmm5, [{a1} + {s}]",
                        "tileloadd tmm6, [{b0} + {s}]",
                        "tileloadd tmm7, [{b1} + {s}]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        a0 = in(reg) a0,
                        a1 = in(reg) a1,
                        b0 = in(reg) b0,
                        b1 = in(reg) b1,
                        s = in(reg) ROW_BYTES,
                        options(nostack, readonly)
                    );
                }
                let o = out.as_mut_ptr();
                asm!(
                    "tilestored [{o0} + {s}], tmm0",
                    "tilestored [{o1} + {s}], tmm1",
                    "tilestored [{o2} + {s}], tmm2",
                    "tilestored [{o3} + {s}], tmm3",
                    o0 = in(reg) o,
                    o1 = in(reg) o.add(TILE * TILE),
                    o2 = in(reg) o.add(2 * TILE * TILE),
                    o3 = in(reg) o.add(3 * TILE * TILE),
                    s = in(reg) ROW_BYTES,
                    options(nostack)
                );
                add_tiles(&out, c, (m, n), (bi * TILE, bj * TILE));
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// Adds the four 16 × 16 tiles of `out` (the 32 × 32 block at `(i0, j0)`) into `c`, inside
/// its `m × n`.
fn add_tiles(out: &[f32], c: &mut [f32], (m, n): (usize, usize), (i0, j0): (usize, usize)) {
    for (t, tile) in out.chunks_exact(TILE * TILE).enumerate() {
        let (ti, tj) = (i0 + t / 2 * TILE, j0 + t % 2 * TILE);
        if ti >= m || tj >= n {
            continue;
        }
        let cols = (n - tj).min(TILE);
        for (r, row) in tile.chunks_exact(TILE).take(m - ti).enumerate() {
            let dst = &mut c[(ti + r) * n + tj..][..cols];
            for (d, s) in dst.iter_mut().zip(row) {
                *d += s;
            }
        }
    }
}
