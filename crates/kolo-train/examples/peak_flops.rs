//! The f32 FMA peak of this CPU: what a training step's GFLOP/s per core (`scripts/bench_train.py`)
//! is measured against.
//!
//! ```text
//! cargo run --release -p kolo-train --example peak_flops -- [--iters N] [--repeats R]
//! ```
//!
//! Runs a loop of 12 independent fused multiply-adds (enough accumulators to hide the FMA latency
//! of current x86 cores) on 256-bit registers (AVX2 + FMA) and, where the CPU has AVX-512F, on
//! 512-bit registers; first on one thread (the peak of one core), then on one thread per logical
//! CPU (`available_parallelism`; the whole machine). Each FMA lane counts as 2 FLOPs; each figure
//! is the best of R runs of N iterations. Prints a table, then one JSON line:
//! `{"avx2_gflops_per_core", "avx2_gflops_all", "avx512_gflops_per_core", "avx512_gflops_all",
//! "peak_gflops_per_core", "threads", ...}` (`null` where the CPU lacks the instructions;
//! `peak_gflops_per_core` is the better of the two one-thread figures), and the bf16 peaks of one
//! core where the CPU has the units: `avx512_bf16_gflops_per_core` (`vdpbf16ps`) and
//! `amx_bf16_gflops_per_core` (`tdpbf16ps`), from `kolo_nn::ops::peak_gflops` (`null` where
//! absent). On other architectures it says so and exits successfully with nulls.
//!
//! The AVX-512 loop is written in inline assembly: the workspace's minimum Rust (1.85) predates
//! the stable AVX-512 intrinsics and `target_feature(enable = "avx512f")` (1.89).

use std::process::ExitCode;

/// Independent accumulators (registers) of the loops.
const ACCUMULATORS: usize = 12;

struct Args {
    iters: u64,
    repeats: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        iters: 50_000_000,
        repeats: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--iters" => a.iters = v.parse().map_err(|e| format!("--iters {v}: {e}"))?,
            "--repeats" => a.repeats = v.parse().map_err(|e| format!("--repeats {v}: {e}"))?,
            other => return Err(format!("unknown option {other} (--iters N, --repeats R)")),
        }
    }
    if a.iters == 0 || a.repeats == 0 {
        return Err("--iters and --repeats must be at least 1".to_owned());
    }
    Ok(a)
}

fn main() -> ExitCode {
    match parse() {
        Ok(a) => {
            measure(&a);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("peak_flops: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn measure(_: &Args) {
    println!(
        "peak_flops: measures the AVX2 and AVX-512 FMA peaks of x86-64 CPUs; this is {}, nothing to measure",
        std::env::consts::ARCH
    );
    println!(
        "{{\"arch\": \"{}\", \"avx2_gflops_per_core\": null, \"avx2_gflops_all\": null, \"avx512_gflops_per_core\": null, \"avx512_gflops_all\": null, \"peak_gflops_per_core\": null, \"threads\": null}}",
        std::env::consts::ARCH
    );
}

#[cfg(target_arch = "x86_64")]
fn measure(a: &Args) {
    use x86::Isa;

    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = cpu_name().unwrap_or_else(|| "unknown x86-64 CPU".to_owned());
    println!(
        "f32 FMA peak of {cpu}, {threads} logical CPUs: {ACCUMULATORS} independent FMAs x {} iterations, best of {}",
        a.iters, a.repeats
    );
    println!(
        "  {:8} {:>5} {:>17} {:>21} {:>23}",
        "ISA",
        "lanes",
        "1 thread GFLOP/s",
        format!("{threads} threads GFLOP/s"),
        "per core, all busy"
    );
    let mut json = Vec::new();
    let mut peak: Option<f64> = None;
    for isa in [Isa::Avx2, Isa::Avx512] {
        let key = isa.key();
        if !isa.available() {
            println!(
                "  {:8} {:>5} {:>17}",
                isa.name(),
                isa.lanes(),
                "not supported"
            );
            json.push(format!(
                "\"{key}_gflops_per_core\": null, \"{key}_gflops_all\": null"
            ));
            continue;
        }
        let one = best_gflops(isa, 1, a);
        let all = best_gflops(isa, threads, a);
        peak = Some(peak.map_or(one, |p| p.max(one)));
        println!(
            "  {:8} {:>5} {:>17.1} {:>21.1} {:>23.1}",
            isa.name(),
            isa.lanes(),
            one,
            all,
            all / threads as f64
        );
        json.push(format!(
            "\"{key}_gflops_per_core\": {one:.2}, \"{key}_gflops_all\": {all:.2}"
        ));
    }
    let peak = peak.map_or("null".to_owned(), |p| format!("{p:.2}"));
    // The bf16 units, one core.
    for (name, key, unit) in [
        ("AVX512-BF16", "avx512_bf16", kolo_nn::ops::Unit::Avx512Bf16),
        ("AMX-BF16", "amx_bf16", kolo_nn::ops::Unit::Amx),
    ] {
        let one = kolo_nn::ops::peak_gflops(unit, 0.5);
        match one {
            Some(g) => println!("  {name:12} bf16, 1 thread: {g:.1} GFLOP/s"),
            None => println!("  {name:12} not supported"),
        }
        json.push(format!(
            "\"{key}_gflops_per_core\": {}",
            one.map_or("null".to_owned(), |g| format!("{g:.2}"))
        ));
    }
    println!(
        "{{{}, \"peak_gflops_per_core\": {peak}, \"threads\": {threads}, \"cpu\": {:?}, \"iters\": {}, \"repeats\": {}}}",
        json.join(", "),
        cpu,
        a.iters,
        a.repeats
    );
}

/// The best GFLOP/s of `a.repeats` runs of `isa`'s loop on `threads` threads started together.
#[cfg(target_arch = "x86_64")]
fn best_gflops(isa: x86::Isa, threads: usize, a: &Args) -> f64 {
    use std::sync::Barrier;
    use std::time::Instant;

    let flops = isa.flops_per_iter() as f64 * a.iters as f64 * threads as f64;
    let mut best = 0.0f64;
    for _ in 0..a.repeats {
        let barrier = Barrier::new(threads);
        let slowest = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let t = Instant::now();
                        std::hint::black_box(isa.run(std::hint::black_box(a.iters)));
                        t.elapsed().as_secs_f64()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(f64::INFINITY))
                .fold(0.0f64, f64::max)
        });
        best = best.max(flops / slowest.max(1e-9) / 1e9);
    }
    best
}

/// The CPU's model name from /proc/cpuinfo (Linux).
#[cfg(target_arch = "x86_64")]
fn cpu_name() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_owned())
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_storeu_ps,
    };

    use super::ACCUMULATORS;

    /// Accumulators converge to `ADD / (1 - MUL)` = 1: no overflow, no subnormals.
    const MUL: f32 = 0.999_999;
    const ADD: f32 = 1e-6;

    #[derive(Debug, Clone, Copy)]
    pub enum Isa {
        Avx2,
        Avx512,
    }

    impl Isa {
        pub fn name(self) -> &'static str {
            match self {
                Isa::Avx2 => "AVX2",
                Isa::Avx512 => "AVX-512",
            }
        }

        pub fn key(self) -> &'static str {
            match self {
                Isa::Avx2 => "avx2",
                Isa::Avx512 => "avx512",
            }
        }

        /// f32 lanes of one register.
        pub fn lanes(self) -> usize {
            match self {
                Isa::Avx2 => 8,
                Isa::Avx512 => 16,
            }
        }

        /// FLOPs of one iteration: an FMA per accumulator and lane, 2 FLOPs each.
        pub fn flops_per_iter(self) -> u64 {
            (ACCUMULATORS * self.lanes() * 2) as u64
        }

        pub fn available(self) -> bool {
            match self {
                Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
                Isa::Avx512 => is_x86_feature_detected!("avx512f"),
            }
        }

        /// Runs `iters` iterations of the loop; returns a value that depends on all of them (0 if
        /// the CPU lacks the instructions).
        pub fn run(self, iters: u64) -> f32 {
            if !self.available() {
                return 0.0;
            }
            match self {
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                Isa::Avx2 => unsafe { fma_avx2(iters) },
                // SAFETY: the CPU has AVX-512F (checked above).
                Isa::Avx512 => unsafe { fma_avx512(iters) },
            }
        }
    }

    /// `iters` times `acc = acc * MUL + ADD` on 12 independent 8-lane registers.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma_avx2(iters: u64) -> f32 {
        let mut out = [0f32; 8];
        // SAFETY: the caller guarantees AVX2 and FMA; `out` holds the 8 f32 the store writes.
        unsafe {
            let mul = _mm256_set1_ps(std::hint::black_box(MUL));
            let add = _mm256_set1_ps(std::hint::black_box(ADD));
            let mut acc: [__m256; ACCUMULATORS] = [_mm256_set1_ps(0.0); ACCUMULATORS];
            for _ in 0..iters {
                for a in acc.iter_mut() {
                    *a = _mm256_fmadd_ps(*a, mul, add);
                }
            }
            let mut sum = acc[0];
            for a in &acc[1..] {
                sum = _mm256_add_ps(sum, *a);
            }
            _mm256_storeu_ps(out.as_mut_ptr(), sum);
        }
        out.iter().sum()
    }

    /// `iters` times `acc = acc * MUL + ADD` on 12 independent 16-lane registers (zmm0–zmm11).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    unsafe fn fma_avx512(iters: u64) -> f32 {
        let bits: u64;
        if iters == 0 {
            return 0.0;
        }
        // SAFETY: the caller guarantees AVX-512F. The assembly touches only zmm0–zmm15 (all
        // caller-saved, declared clobbered by `clobber_abi("C")`), rax, rcx and the flags;
        // it reads and writes no memory and clears the upper halves (vzeroupper) before returning.
        unsafe {
            std::arch::asm!(
                "vbroadcastss zmm14, xmm14",
                "vbroadcastss zmm15, xmm15",
                "vxorps xmm0, xmm0, xmm0",
                "vmovaps zmm1, zmm0",
                "vmovaps zmm2, zmm0",
                "vmovaps zmm3, zmm0",
                "vmovaps zmm4, zmm0",
                "vmovaps zmm5, zmm0",
                "vmovaps zmm6, zmm0",
                "vmovaps zmm7, zmm0",
                "vmovaps zmm8, zmm0",
                "vmovaps zmm9, zmm0",
                "vmovaps zmm10, zmm0",
                "vmovaps zmm11, zmm0",
                "2:",
                "vfmadd132ps zmm0, zmm15, zmm14",
                "vfmadd132ps zmm1, zmm15, zmm14",
                "vfmadd132ps zmm2, zmm15, zmm14",
                "vfmadd132ps zmm3, zmm15, zmm14",
                "vfmadd132ps zmm4, zmm15, zmm14",
                "vfmadd132ps zmm5, zmm15, zmm14",
                "vfmadd132ps zmm6, zmm15, zmm14",
                "vfmadd132ps zmm7, zmm15, zmm14",
                "vfmadd132ps zmm8, zmm15, zmm14",
                "vfmadd132ps zmm9, zmm15, zmm14",
                "vfmadd132ps zmm10, zmm15, zmm14",
                "vfmadd132ps zmm11, zmm15, zmm14",
                "dec rcx",
                "jnz 2b",
                // One lane of the sum of the accumulators, as the result.
                "vaddps zmm0, zmm0, zmm1",
                "vaddps zmm2, zmm2, zmm3",
                "vaddps zmm4, zmm4, zmm5",
                "vaddps zmm6, zmm6, zmm7",
                "vaddps zmm8, zmm8, zmm9",
                "vaddps zmm10, zmm10, zmm11",
                "vaddps zmm0, zmm0, zmm2",
                "vaddps zmm4, zmm4, zmm6",
                "vaddps zmm8, zmm8, zmm10",
                "vaddps zmm0, zmm0, zmm4",
                "vaddps zmm0, zmm0, zmm8",
                "vmovd eax, xmm0",
                "vzeroupper",
                inout("rcx") iters => _,
                lateout("rax") bits,
                in("xmm14") std::hint::black_box(MUL),
                in("xmm15") std::hint::black_box(ADD),
                clobber_abi("C"),
                options(nostack, nomem),
            );
        }
        f32::from_bits(bits as u32)
    }
}
