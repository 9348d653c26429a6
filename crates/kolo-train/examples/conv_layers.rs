//! Times kolo's convolution (`kolo_train::models::conv2d`, forward and backward) on the 3×3 layers
//! of kolo's ResNet-18 (28×28 input, batch 32): the kernel-level benchmark behind the training
//! figures of `scripts/bench_train.py`, steadier than whole training runs on a shared machine
//! (each figure is the best of R repetitions).
//!
//! ```text
//! RAYON_NUM_THREADS=1 cargo run --release -p kolo-train --example conv_layers -- \
//!     [--batch 32] [--repeats 7] [--channels C]
//! ```
//!
//! Prints one line per layer (milliseconds for the forward pass and for forward + backward, and
//! the GFLOP/s of the direct convolution's `2·B·C·K·9·H·W` flops per pass, three passes per step)
//! and a JSON line with the totals; `--channels C` times only the layers with `C` output
//! channels.
//!
//! glibc's allocator is told to keep freed memory (as it does in a training process, whose
//! steps reuse the heap): otherwise one layer's buffers go back to the system after every pass
//! and page faults on fresh memory dominate the small layers (64 channels at 28×28: 39 vs 22 ms
//! per step).

use std::process::ExitCode;
use std::time::Instant;

use candle_core::{Device, Result, Tensor, Var};

/// `(channels, image side, stride)` of ResNet-18's 3×3 convolutions on 28×28 inputs, and how
/// many of each the network has.
const LAYERS: [(usize, usize, usize, usize); 7] = [
    (64, 28, 1, 4),
    (128, 28, 2, 1),
    (128, 14, 1, 3),
    (256, 14, 2, 1),
    (256, 7, 1, 3),
    (512, 7, 2, 1),
    (512, 4, 1, 3),
];

fn parse() -> std::result::Result<(usize, usize, Option<usize>), String> {
    let (mut batch, mut repeats, mut only) = (32, 7, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n: usize = v.parse().map_err(|e| format!("{flag} {v}: {e}"))?;
        match flag.as_str() {
            "--batch" => batch = n,
            "--repeats" => repeats = n,
            "--channels" => only = Some(n),
            other => {
                return Err(format!(
                    "unknown option {other} (--batch N, --repeats R, --channels C)"
                ))
            }
        }
    }
    if batch == 0 || repeats == 0 {
        return Err("--batch and --repeats must be at least 1".to_owned());
    }
    Ok((batch, repeats, only))
}

/// Best-of-`repeats` seconds of the forward pass and of forward + backward.
fn time_layer(
    batch: usize,
    (c, side, stride): (usize, usize, usize),
    repeats: usize,
) -> Result<(f64, f64)> {
    let c_in = if stride == 2 { c / 2 } else { c };
    let dev = Device::Cpu;
    let x = Var::from_tensor(&Tensor::randn(0f32, 1., (batch, c_in, side, side), &dev)?)?;
    let w = Var::from_tensor(&(Tensor::randn(0f32, 1., (c, c_in, 3, 3), &dev)? * 0.05)?)?;
    let (mut fwd, mut step) = (f64::MAX, f64::MAX);
    for _ in 0..repeats + 1 {
        let t = Instant::now();
        let y = kolo_train::models::conv2d(x.as_tensor(), w.as_tensor(), None, stride, 1)?;
        let f = t.elapsed().as_secs_f64();
        let grads = y.sqr()?.sum_all()?.backward()?;
        let s = t.elapsed().as_secs_f64();
        if grads.get(&w).is_none() {
            candle_core::bail!("no kernel gradient");
        }
        fwd = fwd.min(f);
        step = step.min(s);
    }
    Ok((fwd, step))
}

/// Freed memory stays in the heap: no `mmap` for buffers under 32 MiB, no trimming.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; called before any other thread runs.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    let (batch, repeats, only) = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("conv_layers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (mut total, mut flops) = (0., 0.);
    for &(c, side, stride, count) in &LAYERS {
        if only.is_some_and(|o| o != c) {
            continue;
        }
        let (fwd, step) = match time_layer(batch, (c, side, stride), repeats) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("conv_layers: {c} channels at {side}×{side}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let c_in = if stride == 2 { c / 2 } else { c };
        let out = side.div_ceil(stride);
        let f = 2. * (batch * c_in * c * 9 * out * out) as f64;
        println!(
            "{c:>4} ch {side:>2}x{side:<2} stride {stride} (x{count}): forward {:7.2} ms, step {:7.2} ms, {:6.1} GFLOP/s",
            fwd * 1e3,
            step * 1e3,
            3. * f / step / 1e9
        );
        total += step * count as f64;
        flops += 3. * f * count as f64;
    }
    println!(
        "{{\"batch\": {batch}, \"step_ms\": {:.2}, \"gflops\": {:.1}}}",
        total * 1e3,
        flops / total / 1e9
    );
    ExitCode::SUCCESS
}
