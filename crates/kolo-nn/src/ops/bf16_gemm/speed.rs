//! Whether this CPU's AVX512-BF16 unit multiplies faster than its f32 FMAs — measured, because
//! the instruction set does not say. `vdpbf16ps` does twice the work of an f32 FMA (two products
//! a lane); on AMD EPYC (Zen 4) it issues about as often as one, so its peak is twice f32's (233
//! against 116 GFLOP/s a core), while the Intel Xeons measured issue it far less often than their
//! two FMAs a cycle (83 against 176, and 89 against 179 on one without AMX): there bf16 products
//! on that unit are slower than f32 ones. [`avx512_bf16_speed`] times the two units' peak loops
//! once per process (a few milliseconds) and [`super::bf16_path`] takes the unit only where it
//! [`pays`](UnitSpeed::pays).

use std::sync::OnceLock;
use std::time::Instant;

use super::avx512;

/// The AVX512-BF16 unit must multiply this many times as fast as the f32 FMAs to be taken: the
/// peaks measured are 2× (AMD EPYC) or under 0.5× (Intel Xeon), and a real GEMM on the unit also
/// pays for rounding its operands as it packs them.
const MIN_SPEEDUP: f64 = 1.25;

/// Peak loop steps a timed run (24 instructions a step): 0.1–0.7 ms on the CPUs above.
const STEPS: u64 = 20_000;
/// Timed runs of each unit, alternating; the best of each counts.
const ROUNDS: usize = 5;

/// One core's peak rate of the AVX512-BF16 unit and of the f32 FMAs (AVX-512), in GFLOP/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UnitSpeed {
    /// `vdpbf16ps`: 64 operations an instruction.
    pub bf16_gflops: f64,
    /// `vfmadd` on 16 f32 lanes: 32 operations an instruction.
    pub f32_gflops: f64,
}

impl UnitSpeed {
    /// The bf16 unit's peak over the f32 one.
    pub fn speedup(&self) -> f64 {
        self.bf16_gflops / self.f32_gflops
    }

    /// Whether the bf16 unit is worth taking: at least 1.25 times the f32 rate (a real GEMM on it
    /// also rounds its operands as it packs them).
    pub fn pays(&self) -> bool {
        self.speedup() >= MIN_SPEEDUP
    }
}

/// This CPU's [`UnitSpeed`], measured on the calling thread the first time it is asked for
/// (`ROUNDS` alternating runs of each unit's peak loop after a warm-up, the best of each, about
/// 3 ms); `None` where the CPU has no AVX512-BF16.
pub fn avx512_bf16_speed() -> Option<UnitSpeed> {
    static SPEED: OnceLock<Option<UnitSpeed>> = OnceLock::new();
    *SPEED.get_or_init(|| avx512::available().then(measure))
}

/// The best rate of each unit over alternating runs (a run the host interrupted is slower, never
/// faster, so the best is the unit's).
fn measure() -> UnitSpeed {
    let rate = |spin: fn(u64) -> f64| {
        let t = Instant::now();
        let flops = spin(STEPS);
        flops / t.elapsed().as_secs_f64().max(1e-9) / 1e9
    };
    // Warm-up: the first AVX-512 instructions may run slowly while the core changes its clock.
    rate(avx512::spin);
    rate(avx512::spin_f32);
    let (mut bf16, mut f32) = (0f64, 0f64);
    for _ in 0..ROUNDS {
        bf16 = bf16.max(rate(avx512::spin));
        f32 = f32.max(rate(avx512::spin_f32));
    }
    UnitSpeed {
        bf16_gflops: bf16,
        f32_gflops: f32,
    }
}
