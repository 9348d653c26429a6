//! How kolo's f32 matrix products may compute — what `torch.set_float32_matmul_precision` is to
//! PyTorch: [`MatmulPrecision::Highest`] (f32 throughout, the default) or
//! [`MatmulPrecision::Bf16`], where every f32 GEMM of kolo's kernels (the convolutions' Winograd
//! and im2col products, forward and backward) rounds its two operands to bf16 as it packs them and
//! multiplies them on the CPU's bf16 unit, summing in f32 — autocast's arithmetic at the GEMM,
//! while activations, gradients, weights and every other op stay f32 (no conversion passes between
//! layers). `--precision bf16` of `kolo train` sets it where the CPU has a bf16 unit.
//!
//! The setting is the process's (like PyTorch's): one atomic read per product.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use candle_core::Result;

use super::bf16_gemm::{avx512_bf16_speed, bf16_path, Bf16Path};

/// What kolo's f32 matrix products compute in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MatmulPrecision {
    /// f32 operands and sums (the default).
    #[default]
    Highest,
    /// Operands rounded to bf16 on the CPU's bf16 unit, sums in f32.
    Bf16,
}

/// 0: f32; otherwise `1 + ` the unit ([`unit_code`]).
static MODE: AtomicU8 = AtomicU8::new(0);

fn unit_code(p: Bf16Path) -> u8 {
    match p {
        Bf16Path::Amx => 1,
        Bf16Path::Avx512Bf16 => 2,
        Bf16Path::F32 => 0,
    }
}

/// The bf16 unit [`MatmulPrecision::Bf16`] multiplies on, on this CPU ([`bf16_path`]):
/// `KOLO_BF16_GEMM` where it names one; else AMX where the CPU (and Linux) allow it, else
/// AVX512-BF16 where that unit multiplies faster than the f32 FMAs; `None` otherwise (a CPU with
/// neither, one whose AVX512-BF16 is slower than its f32 FMAs ([`bf16_slower_than_f32`]), or
/// `KOLO_BF16_GEMM=f32`), where rounding the operands would gain nothing. An error if
/// `KOLO_BF16_GEMM` names a path this CPU cannot run.
pub fn bf16_matmul_unit() -> Result<Option<Bf16Path>> {
    Ok(match bf16_path()? {
        Bf16Path::F32 => None,
        unit => Some(unit),
    })
}

/// Whether this CPU has a bf16 unit that multiplies slower than its f32 FMAs, and nothing asks for
/// it: no AMX, an AVX512-BF16 unit that does not [pay](super::UnitSpeed::pays) (measured once,
/// [`avx512_bf16_speed`]), `KOLO_BF16_GEMM` unset. Mixed precision then computes in f32
/// (`kolo_ddp::precision`): bf16 there would only be slower. Decided once per process, as
/// [`bf16_path`] reads `KOLO_BF16_GEMM` once (a training loop asks on every step).
pub fn bf16_slower_than_f32() -> bool {
    static SLOWER: OnceLock<bool> = OnceLock::new();
    *SLOWER.get_or_init(|| {
        std::env::var_os("KOLO_BF16_GEMM").is_none_or(|v| v.is_empty())
            && !Bf16Path::Amx.available()
            && avx512_bf16_speed().is_some_and(|s| !s.pays())
    })
}

/// Whether this CPU has no bf16 unit at all (neither AMX nor AVX512-BF16: every x86-64 before
/// them, AMD EPYC to Zen 3 included, and every other architecture) and nothing asks for a path
/// (`KOLO_BF16_GEMM` unset). Mixed precision then computes in f32 (`kolo_ddp::precision`): bf16
/// tensors there would be converted to f32 around every layer and cost a third of the step
/// (ResNet-18 on a Zen 3: 28 against 43 samples/s) for no speed. `KOLO_BF16_GEMM=f32` keeps
/// those conversions.
pub fn bf16_without_a_unit() -> bool {
    bf16_computes_in_f32() && !Bf16Path::Avx512Bf16.available()
}

/// Whether `--precision bf16` computes in f32 on this CPU, exactly as `--precision f32` does:
/// where `KOLO_BF16_GEMM` is unset and [`bf16_path`] chose f32 — no bf16 unit
/// ([`bf16_without_a_unit`]) or only one slower than its f32 FMAs ([`bf16_slower_than_f32`]);
/// bf16 could only be slower there. Decided once per process (a training loop asks every step).
pub fn bf16_computes_in_f32() -> bool {
    static IN_F32: OnceLock<bool> = OnceLock::new();
    *IN_F32.get_or_init(|| {
        matches!(super::bf16_gemm::bf16_path_asked(), Ok(None))
            && matches!(bf16_path(), Ok(Bf16Path::F32))
    })
}

/// Sets how kolo's f32 matrix products compute, for the whole process, and returns the unit they
/// will run on: `None` for [`MatmulPrecision::Highest`], and for [`MatmulPrecision::Bf16`] on a
/// CPU without a bf16 unit (the products then stay f32; [`matmul_precision`] says `Highest`).
///
/// ```
/// use kolo_nn::ops::{matmul_precision, set_matmul_precision, MatmulPrecision};
/// let unit = set_matmul_precision(MatmulPrecision::Bf16)?;
/// assert_eq!(unit.is_some(), matmul_precision() == MatmulPrecision::Bf16);
/// set_matmul_precision(MatmulPrecision::Highest)?;
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn set_matmul_precision(p: MatmulPrecision) -> Result<Option<Bf16Path>> {
    let unit = match p {
        MatmulPrecision::Highest => None,
        MatmulPrecision::Bf16 => bf16_matmul_unit()?,
    };
    MODE.store(unit.map_or(0, unit_code), Ordering::Relaxed);
    Ok(unit)
}

/// How kolo's f32 matrix products compute now.
pub fn matmul_precision() -> MatmulPrecision {
    if MODE.load(Ordering::Relaxed) == 0 {
        MatmulPrecision::Highest
    } else {
        MatmulPrecision::Bf16
    }
}

thread_local! {
    /// Set while [`f32_products`] runs its closure on this thread.
    static F32_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's f32 products in f32 whatever the setting: for an algorithm whose
/// numbers bf16 operands would spoil — Winograd F(4×4, 3×3), whose transforms scale the rounding
/// errors up (bf16 operands: 6e-2 of the largest output against 4e-3 for F(2×2, 3×3) and 3e-3
/// for im2col, `tests/matmul_precision.rs`'s shapes).
pub(super) fn f32_products<R>(f: impl FnOnce() -> R) -> R {
    let before = F32_ONLY.with(|c| c.replace(true));
    let r = f();
    F32_ONLY.with(|c| c.set(before));
    r
}

/// The unit an f32 product runs on, where [`MatmulPrecision::Bf16`] is set (and this thread is
/// not inside [`f32_products`]).
pub(super) fn bf16_unit() -> Option<Bf16Path> {
    if F32_ONLY.with(Cell::get) {
        return None;
    }
    match MODE.load(Ordering::Relaxed) {
        1 => Some(Bf16Path::Amx),
        2 => Some(Bf16Path::Avx512Bf16),
        _ => None,
    }
}
