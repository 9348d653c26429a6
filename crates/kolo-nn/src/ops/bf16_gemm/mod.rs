//! The bf16 matrix product with f32 accumulation, `C (f32) = A (bf16) · B (bf16)`, on the fastest
//! unit the CPU has, chosen at run time so that one binary serves every x86-64:
//!
//! - **AMX** (`amx_bf16`, `amx_tile`; Linux, which must grant the process the tile state:
//!   `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`): `tdpbf16ps` on 16 × 32 tiles
//!   ([`amx`]);
//! - **AVX512-BF16** (`avx512_bf16`): `vdpbf16ps`, 16 f32 lanes of bf16 pairs ([`avx512`]);
//! - otherwise **f32**: both operands widened and multiplied by the f32 GEMM.
//!
//! By default AMX where the CPU has it, else AVX512-BF16 where that unit multiplies faster than the
//! f32 FMAs — measured once per process ([`speed`]: twice as fast on AMD EPYC, under half as fast
//! on the Intel Xeons tried), else f32.
//!
//! Stable Rust has the AVX512-BF16 intrinsics but not AMX's, which are written as `asm!` (the
//! assembler knows the instructions; the CPU and the kernel are asked first). `KOLO_BF16_GEMM` =
//! `amx`, `avx512bf16` or `f32` forces a path (one the CPU lacks is refused at the first call with
//! an error naming it).

mod amx;
mod amx_tiles;
mod avx512;
mod avx512_tiles;
mod gathered;
mod pack;
mod speed;
mod tiles;

pub(super) use gathered::pack_b_gathered;
#[cfg(test)]
pub(super) use tiles::with_tile_unit;
pub(super) use tiles::{layouts_available, tile_product, TileOperand};

pub(super) use pack::Source;
pub use speed::{avx512_bf16_speed, UnitSpeed};
use std::sync::OnceLock;

use candle_core::Result;
use half::bf16;

use super::gemm::{matmul_into, MatRef};

/// Which unit [`matmul_bf16`] runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Path {
    /// Intel AMX tiles (`tdpbf16ps`).
    Amx,
    /// AVX-512 BF16 (`vdpbf16ps`).
    Avx512Bf16,
    /// Widened to f32 and multiplied by the f32 GEMM.
    F32,
}

impl Bf16Path {
    /// Its name, as `KOLO_BF16_GEMM` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Bf16Path::Amx => "amx",
            Bf16Path::Avx512Bf16 => "avx512bf16",
            Bf16Path::F32 => "f32",
        }
    }

    /// Whether this CPU (and, for AMX, the kernel) can run it.
    pub fn available(self) -> bool {
        match self {
            Bf16Path::Amx => amx::available(),
            Bf16Path::Avx512Bf16 => avx512::available(),
            Bf16Path::F32 => true,
        }
    }
}

/// One line for the user on what bf16 training computes on this CPU (`kolo train --precision bf16`
/// prints it once, after setting it up): the unit the matrix products of the convolutions and
/// linear layers run on ([`super::set_matmul_precision`]), or that the layers compute in f32 —
/// as `--precision f32` does, or around bf16 conversions — and whether this CPU has a bf16 unit.
pub fn bf16_compute_note() -> Result<String> {
    let units: Vec<Bf16Path> = [Bf16Path::Amx, Bf16Path::Avx512Bf16]
        .into_iter()
        .filter(|p| p.available())
        .collect();
    let slower = super::matmul_precision::bf16_slower_than_f32()
        .then(avx512_bf16_speed)
        .flatten();
    Ok(bf16_note(
        super::matmul_precision::bf16_unit(),
        &units,
        slower,
        super::matmul_precision::bf16_without_a_unit(),
    ))
}

/// [`bf16_compute_note`] for the unit f32 products run on (if any), the bf16 units the CPU has,
/// the speeds of an AVX512-BF16 unit left out for being slower than f32, and whether a CPU without
/// a unit computes in f32 (`KOLO_BF16_GEMM` unset) rather than around bf16 conversions.
fn bf16_note(
    products: Option<Bf16Path>,
    units: &[Bf16Path],
    slower: Option<UnitSpeed>,
    no_unit_in_f32: bool,
) -> String {
    let label = |p: Bf16Path| match p {
        Bf16Path::Amx => "AMX",
        Bf16Path::Avx512Bf16 => "AVX512-BF16",
        Bf16Path::F32 => "f32",
    };
    match (products, units.first(), slower) {
        (Some(p), _, _) if p != Bf16Path::F32 => format!(
            "bf16: the matrix products of the convolutions and linear layers on this CPU's {} \
             unit (operands rounded to bf16, sums in f32): convolutions with channels in 32s as \
             implicit GEMMs (strided ones over their input's phases), the others through im2col \
             or Winograd F(2x2, 3x3) (F(4x4, 3x3) layers and products with a side under 32 keep \
             f32), activations and the other layers in f32",
            label(p)
        ),
        (None, Some(_), Some(s)) => {
            format!(
                "bf16: this CPU's AVX512-BF16 unit multiplies slower than its f32 FMAs ({:.0} \
                 against {:.0} GFLOP/s a core, measured) and it has no AMX, so the layers \
                 compute in f32, as fast as --precision f32 (KOLO_BF16_GEMM=avx512bf16 takes the \
                 unit anyway)",
                s.bf16_gflops, s.f32_gflops
            )
        }
        (_, None, _) if no_unit_in_f32 => "bf16: this CPU has no bf16 instructions (no \
                                            AVX512-BF16, no AMX), so the layers compute in f32, as \
                                            fast as --precision f32 (KOLO_BF16_GEMM=f32 computes \
                                            around bf16 conversions instead, slower)"
            .into(),
        (_, None, _) => "bf16: this CPU has no bf16 instructions (no AVX512-BF16, no AMX): the \
                         layers compute in f32 around bf16 conversions (KOLO_BF16_GEMM=f32) — \
                         correct, but slower than f32"
            .into(),
        (_, Some(_), _) => "bf16: the layers compute in f32 around bf16 conversions \
                         (KOLO_BF16_GEMM=f32 keeps this CPU's bf16 unit out)"
            .into(),
    }
}

/// The path `KOLO_BF16_GEMM` asks for, if it is set (an error naming the value if it is not a
/// path this CPU can run): bf16 convolutions use the bf16 GEMM only then (`ops::conv2d` on bf16 tensors; otherwise they are computed in f32). On the one
/// CPU measured, im2col + the AMX GEMM took ResNet-18's convolutions 2.7× longer per step than
/// f32 Winograd (the backward pass's packing of strided operands dominates): not yet a default.
pub fn bf16_path_asked() -> Result<Option<Bf16Path>> {
    match std::env::var_os("KOLO_BF16_GEMM").filter(|v| !v.is_empty()) {
        Some(_) => bf16_path().map(Some),
        None => Ok(None),
    }
}

/// The path [`matmul_bf16`] takes: `KOLO_BF16_GEMM` if set; else AMX where available; else
/// AVX512-BF16 where it [pays](UnitSpeed::pays) ([`avx512_bf16_speed`]); else f32.
pub fn bf16_path() -> Result<Bf16Path> {
    static PATH: OnceLock<std::result::Result<Bf16Path, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        let forced = std::env::var("KOLO_BF16_GEMM")
            .ok()
            .filter(|v| !v.is_empty());
        match forced.as_deref() {
            None => Ok(default_path(Bf16Path::Amx.available(), avx512_bf16_speed)),
            Some(v) => {
                let all = [Bf16Path::Amx, Bf16Path::Avx512Bf16, Bf16Path::F32];
                match all.into_iter().find(|p| p.name() == v) {
                    Some(p) if p.available() => Ok(p),
                    Some(p) => Err(format!(
                        "KOLO_BF16_GEMM={v}: this CPU (or its kernel) cannot run the {} path",
                        p.name()
                    )),
                    None => Err(format!(
                        "KOLO_BF16_GEMM={v}: not one of amx, avx512bf16, f32"
                    )),
                }
            }
        }
    })
    .clone()
    .map_err(candle_core::Error::msg)
}

/// The unit taken when none is asked for: AMX where the CPU has it (`amx`), else AVX512-BF16 where
/// it is faster than f32 (`avx512`, measured only then), else f32.
fn default_path(amx: bool, avx512: impl FnOnce() -> Option<UnitSpeed>) -> Bf16Path {
    if amx {
        Bf16Path::Amx
    } else if avx512().is_some_and(|s| s.pays()) {
        Bf16Path::Avx512Bf16
    } else {
        Bf16Path::F32
    }
}

/// `c = a · b` (or `c += a · b` when `accumulate`): `a` is `m × k` and `b` is `k × n`, both bf16
/// and row-major, `c` is `m × n` f32, row-major; products and sums in f32. On the path of
/// [`bf16_path`]. Errors on slices shorter than their shapes.
pub fn matmul_bf16(
    a: &[bf16],
    b: &[bf16],
    c: &mut [f32],
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
) -> Result<()> {
    matmul_bf16_on(bf16_path()?, a, b, c, (m, k, n), accumulate)
}

/// [`matmul_bf16`] on a given path (an error if this CPU cannot run it).
pub fn matmul_bf16_on(
    path: Bf16Path,
    a: &[bf16],
    b: &[bf16],
    c: &mut [f32],
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
) -> Result<()> {
    if a.len() < m * k || b.len() < k * n || c.len() < m * n {
        candle_core::bail!(
            "bf16 GEMM of [{m}, {k}] @ [{k}, {n}]: operands of {}, {} and {} values are too short",
            a.len(),
            b.len(),
            c.len()
        );
    }
    let (a, b) = (MatRef::row_major(a, m, k), MatRef::row_major(b, k, n));
    matmul_views(path, a, b, &mut c[..m * n], accumulate)
}

/// `c = a · b` (or `c += a · b`) for strided views `a` (`m × k`) and `b` (`k × n`) into the
/// row-major `m × n` f32 `c`, on `path`; the operands are bf16, or f32 rounded to bf16 as they are
/// packed ([`Source`]).
pub(super) fn matmul_views<S: Source>(
    path: Bf16Path,
    a: MatRef<'_, S>,
    b: MatRef<'_, S>,
    c: &mut [f32],
    accumulate: bool,
) -> Result<()> {
    let ((m, k), (k2, n)) = (a.dims(), b.dims());
    if k != k2 || !a.fits() || !b.fits() || c.len() != m * n {
        candle_core::bail!(
            "bf16 GEMM of [{m}, {k}] @ [{k2}, {n}] into {} values does not fit",
            c.len()
        );
    }
    if !path.available() {
        candle_core::bail!("bf16 GEMM: this CPU cannot run the {} path", path.name());
    }
    if m == 0 || n == 0 || k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return Ok(());
    }
    match path {
        Bf16Path::Amx => {
            if !accumulate {
                c.fill(0.0);
            }
            amx::matmul(a, b, c)
        }
        Bf16Path::Avx512Bf16 => avx512::matmul(a, b, c, accumulate),
        Bf16Path::F32 => {
            if !accumulate {
                c.fill(0.0);
            }
            let widen = |v: MatRef<'_, S>| {
                let ((r, cl), (d, rs, cs)) = (v.dims(), v.parts());
                (0..r)
                    .flat_map(|i| (0..cl).map(move |j| d[i * rs + j * cs].rounded()))
                    .collect::<Vec<f32>>()
            };
            let (a32, b32) = (widen(a), widen(b));
            matmul_into(
                "bf16 GEMM",
                c,
                (n, 1),
                MatRef::row_major(&a32, m, k),
                MatRef::row_major(&b32, k, n),
                true,
            )?;
        }
    }
    Ok(())
}

/// A unit whose peak [`peak_gflops`] measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// f32 fused multiply-adds on AVX-512 (16 lanes).
    F32Avx512,
    /// `vdpbf16ps` (AVX-512 BF16).
    Avx512Bf16,
    /// `tdpbf16ps` (AMX).
    Amx,
}

/// The peak GFLOP/s of one core's `unit`, from a loop of independent operations on registers
/// (no memory) that runs about `seconds`; `None` where the CPU lacks it.
pub fn peak_gflops(unit: Unit, seconds: f64) -> Option<f64> {
    let (spin, ok): (fn(u64) -> f64, bool) = match unit {
        Unit::F32Avx512 => (avx512::spin_f32, {
            #[cfg(target_arch = "x86_64")]
            {
                std::is_x86_feature_detected!("avx512f")
            }
            #[cfg(not(target_arch = "x86_64"))]
            false
        }),
        Unit::Avx512Bf16 => (avx512::spin, avx512::available()),
        Unit::Amx => (amx::spin, amx::available()),
    };
    if !ok {
        return None;
    }
    // Calibrate, then the best of three timed runs.
    let mut steps = 1_000u64;
    loop {
        let t = std::time::Instant::now();
        spin(steps);
        if t.elapsed().as_secs_f64() > 0.02 || steps > 1 << 40 {
            break;
        }
        steps *= 4;
    }
    let t = std::time::Instant::now();
    spin(steps);
    let per = t.elapsed().as_secs_f64() / steps as f64;
    let steps = ((seconds / 3.0) / per.max(1e-12)).max(1.0) as u64;
    (0..3)
        .map(|_| {
            let t = std::time::Instant::now();
            let flops = spin(steps);
            flops / t.elapsed().as_secs_f64() / 1e9
        })
        .reduce(f64::max)
}

#[cfg(test)]
mod tests;
