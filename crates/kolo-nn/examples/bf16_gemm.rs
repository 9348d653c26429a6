//! What kolo's matrix products reach on one core against the CPU's peaks: kolo's bf16 GEMM
//! (`ops::matmul_bf16`) on every path this CPU has and the f32 GEMM behind kolo's kernels, each
//! with its share of the matching peak (f32 FMA on AVX-512, AVX-512 BF16's `vdpbf16ps`, AMX's
//! `tdpbf16ps`, from `ops::peak_gflops`; kolo-train's `examples/peak_flops` gives the f32 peaks
//! on every thread too).
//!
//! ```text
//! cargo run --release -p kolo-nn --example bf16_gemm [-- SIZE | MxKxN] [--json]
//! ```
//!
//! SIZE (default 1024) multiplies SIZE × SIZE matrices; `MxKxN` an `M × K` by a `K × N` one
//! (`64x576x1024`: a 64-channel 3×3 layer over 1,024 output pixels, as im2col multiplies it).
//!
//! `--json` prints one object (the CPU, each peak and each GEMM rate, GFLOP/s) for scripts.

use std::time::Instant;

use candle_core::{Device, Tensor};
use half::bf16;
use kolo_nn::ops::{matmul_bf16_on, peak_gflops, Bf16Path, Unit};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let shape = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map_or("1024", |s| s);
    let dims: Vec<usize> = shape
        .split('x')
        .map(|d| d.parse().map_err(|e| format!("SIZE or MxKxN {shape}: {e}")))
        .collect::<Result<_, _>>()?;
    let (m, k, n) = match dims[..] {
        [s] => (s, s, s),
        [m, k, n] => (m, k, n),
        _ => return Err(format!("SIZE or MxKxN, not {shape}").into()),
    };
    // One core: the peaks are per core, and so is the GEMM here (candle's thread count is read
    // from RAYON_NUM_THREADS).
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // SAFETY: no other thread runs yet.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", "1") };
    }
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    let peaks = [
        ("f32_fma", peak_gflops(Unit::F32Avx512, 0.6)),
        ("avx512_bf16", peak_gflops(Unit::Avx512Bf16, 0.6)),
        ("amx_bf16", peak_gflops(Unit::Amx, 0.6)),
    ];
    let flops = 2.0 * (m * k * n) as f64;
    let a: Vec<bf16> = (0..m * k)
        .map(|i| bf16::from_f32((i % 13) as f32 / 16.0))
        .collect();
    let b: Vec<bf16> = (0..k * n)
        .map(|i| bf16::from_f32((i % 11) as f32 / 16.0))
        .collect();
    let mut c = vec![0f32; m * n];
    // The best of 3 timings of enough calls for 20 ms: a small product takes microseconds, less
    // than one timing's noise.
    let best = |f: &mut dyn FnMut()| -> f64 {
        let t = Instant::now();
        f();
        let reps = (0.02 / t.elapsed().as_secs_f64().max(1e-9)).clamp(1.0, 1e5) as usize;
        (0..3)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..reps {
                    f();
                }
                flops * reps as f64 / t.elapsed().as_secs_f64() / 1e9
            })
            .fold(0.0, f64::max)
    };
    let mut gemms = Vec::new();
    for (path, peak) in [
        (Bf16Path::Amx, peaks[2].1),
        (Bf16Path::Avx512Bf16, peaks[1].1),
        (Bf16Path::F32, peaks[0].1),
    ] {
        if path.available() {
            let rate = best(&mut || {
                matmul_bf16_on(path, &a, &b, &mut c, (m, k, n), false).expect("bf16 GEMM")
            });
            gemms.push((format!("bf16_gemm_{}", path.name()), rate, peak));
        }
    }
    let af = Tensor::rand(0f32, 1.0, (m, k), &Device::Cpu)?;
    let bf = Tensor::rand(0f32, 1.0, (k, n), &Device::Cpu)?;
    let rate = best(&mut || {
        af.matmul(&bf).expect("f32 GEMM");
    });
    gemms.push(("f32_gemm".into(), rate, peaks[0].1));
    if json {
        let mut fields = vec![format!("\"cpu\": {cpu:?}"), format!("\"shape\": {shape:?}")];
        for (name, p) in peaks {
            fields.push(format!(
                "\"peak_{name}\": {}",
                p.map_or("null".into(), |p| format!("{p:.1}"))
            ));
        }
        for (name, rate, _) in &gemms {
            fields.push(format!("\"{name}\": {rate:.1}"));
        }
        println!("{{{}}}", fields.join(", "));
        return Ok(());
    }
    println!("{cpu}, one core");
    println!("{:<28}{:>12}", "peak", "GFLOP/s");
    for (name, p) in peaks {
        match p {
            Some(p) => println!("{name:<28}{p:>12.1}"),
            None => println!("{name:<28}{:>12}", "not here"),
        }
    }
    println!(
        "\n{:<28}{:>12}{:>16}",
        format!("GEMM {m}x{k}x{n}"),
        "GFLOP/s",
        "share of peak"
    );
    for (name, rate, peak) in gemms {
        let share = peak.map_or("-".into(), |p| format!("{:.0} %", 100.0 * rate / p));
        println!("{name:<28}{rate:>12.1}{share:>16}");
    }
    Ok(())
}
