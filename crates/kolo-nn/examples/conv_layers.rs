//! Times kolo's convolution (`kolo_nn::ops::conv2d`, forward and backward) against candle's
//! (`Tensor::conv2d` plus the bias, what `candle_nn::Conv2d` runs) on the 3×3 layers of kolo's
//! ResNet-18 (28×28 input, batch 32) or, with `--model lenet`, on LeNet's two 5×5 layers
//! (batch 64): the kernel-level benchmark behind the training figures of
//! `scripts/bench_train.py`, steadier than whole training runs on a shared machine (each figure
//! is the best of R repetitions).
//!
//! ```text
//! RAYON_NUM_THREADS=1 cargo run --release -p kolo-nn --example conv_layers -- \
//!     [--model resnet18|lenet] [--batch 32] [--repeats 7] [--channels C] [--stride S] \
//!     [--dtype f32|bf16|f32-bf16gemm] [--candle on|off]
//! ```
//!
//! `--dtype bf16` times kolo's convolution on bf16 tensors (on a CPU with AMX: im2col and the
//! bf16 GEMM, `ops::matmul_bf16`; elsewhere computed in f32), against candle's in f32.
//! `--dtype f32-bf16gemm` times it on f32 tensors with `set_matmul_precision(Bf16)`: the GEMMs'
//! operands rounded to bf16 on the CPU's bf16 unit. `--candle off` leaves candle's timing out.
//!
//! Prints one line per layer (milliseconds for the forward pass and for forward + backward, and
//! the GFLOP/s of the direct convolution's `2·B·C·K·k²·H'·W'` flops per pass, three passes per
//! step, two for a layer whose input needs no gradient: LeNet's first) and a JSON line with the
//! totals; `--channels C` times only the layers with `C` output channels, `--stride S` only those
//! of stride `S` (ResNet-18's im2col layers: `--stride 2`).
//!
//! glibc's allocator is told to keep freed memory (as it does in a training process, whose
//! steps reuse the heap): otherwise one layer's buffers go back to the system after every pass
//! and page faults on fresh memory dominate the small layers (64 channels at 28×28: 39 vs 22 ms
//! per step).

use std::process::ExitCode;
use std::time::Instant;

use candle_core::{DType, Device, Result, Tensor, Var};

/// One convolution of a network: channels in and out, input side, kernel, stride, padding, how
/// many of it the network has, and whether its input needs a gradient.
#[derive(Clone, Copy)]
struct Layer {
    c_in: usize,
    c_out: usize,
    side: usize,
    k: usize,
    stride: usize,
    pad: usize,
    count: usize,
    dx: bool,
}

/// A 3×3, padding-1 layer of ResNet-18 (`c` output channels; half as many in where it strides).
const fn res(c: usize, side: usize, stride: usize, count: usize) -> Layer {
    let c_in = if stride == 2 { c / 2 } else { c };
    Layer {
        c_in,
        c_out: c,
        side,
        k: 3,
        stride,
        pad: 1,
        count,
        dx: true,
    }
}

/// ResNet-18's 3×3 convolutions on 28×28 inputs.
const RESNET18: [Layer; 7] = [
    res(64, 28, 1, 4),
    res(128, 28, 2, 1),
    res(128, 14, 1, 3),
    res(256, 14, 2, 1),
    res(256, 7, 1, 3),
    res(512, 7, 2, 1),
    res(512, 4, 1, 3),
];

/// LeNet's convolutions on 1×28×28 inputs (the first one's input is the data: no gradient).
const LENET: [Layer; 2] = [
    Layer {
        c_in: 1,
        c_out: 6,
        side: 28,
        k: 5,
        stride: 1,
        pad: 2,
        count: 1,
        dx: false,
    },
    Layer {
        c_in: 6,
        c_out: 16,
        side: 14,
        k: 5,
        stride: 1,
        pad: 0,
        count: 1,
        dx: true,
    },
];

struct Args {
    layers: &'static [Layer],
    batch: usize,
    repeats: usize,
    only: Option<usize>,
    stride: Option<usize>,
    dtype: DType,
    candle: bool,
}

fn parse() -> std::result::Result<Args, String> {
    let (mut batch, mut repeats, mut only, mut layers) = (None, 7, None, &RESNET18[..]);
    let mut stride = None;
    let (mut dtype, mut candle) = (DType::F32, true);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if flag == "--dtype" {
            dtype = match v.as_str() {
                "f32" => DType::F32,
                "bf16" => DType::BF16,
                "f32-bf16gemm" => {
                    let unit =
                        kolo_nn::ops::set_matmul_precision(kolo_nn::ops::MatmulPrecision::Bf16)
                            .map_err(|e| e.to_string())?;
                    eprintln!("f32 GEMMs on: {unit:?}");
                    DType::F32
                }
                other => {
                    return Err(format!(
                        "--dtype {other}: expected f32, bf16 or f32-bf16gemm"
                    ))
                }
            };
            continue;
        }
        if flag == "--candle" {
            candle = v != "off";
            continue;
        }
        if flag == "--model" {
            layers = match v.as_str() {
                "resnet18" => &RESNET18[..],
                "lenet" => &LENET[..],
                other => return Err(format!("--model {other}: expected resnet18 or lenet")),
            };
            continue;
        }
        let n: usize = v.parse().map_err(|e| format!("{flag} {v}: {e}"))?;
        match flag.as_str() {
            "--batch" => batch = Some(n),
            "--repeats" => repeats = n,
            "--channels" => only = Some(n),
            "--stride" => stride = Some(n),
            other => {
                return Err(format!(
                    "unknown option {other} (--model M, --batch N, --repeats R, --channels C, \
                     --stride S, --dtype D)"
                ))
            }
        }
    }
    let batch = batch.unwrap_or(if layers.len() == LENET.len() { 64 } else { 32 });
    if batch == 0 || repeats == 0 {
        return Err("--batch and --repeats must be at least 1".to_owned());
    }
    Ok(Args {
        layers,
        batch,
        repeats,
        only,
        stride,
        dtype,
        candle,
    })
}

/// Best-of-`repeats` seconds of the forward pass and of forward + backward, through kolo's
/// convolution or (`candle`) through candle's `Tensor::conv2d` plus the bias, as `candle_nn::Conv2d`
/// computes it.
fn time_layer(
    batch: usize,
    l: &Layer,
    repeats: usize,
    candle: bool,
    dtype: DType,
) -> Result<(f64, f64)> {
    let dev = Device::Cpu;
    let dtype = if candle { DType::F32 } else { dtype };
    let x = Tensor::randn(0f32, 1., (batch, l.c_in, l.side, l.side), &dev)?.to_dtype(dtype)?;
    let x = if l.dx {
        Var::from_tensor(&x)?.as_tensor().clone()
    } else {
        x
    };
    let w = Tensor::randn(0f32, 1., (l.c_out, l.c_in, l.k, l.k), &dev)?;
    let w = Var::from_tensor(&(w * 0.05)?.to_dtype(dtype)?)?;
    let b = Var::from_tensor(&Tensor::zeros(l.c_out, dtype, &dev)?)?;
    let (mut fwd, mut step) = (f64::MAX, f64::MAX);
    for _ in 0..repeats + 1 {
        let t = Instant::now();
        let y = if candle {
            let y = x.conv2d(w.as_tensor(), l.pad, l.stride, 1, 1)?;
            y.broadcast_add(&b.as_tensor().reshape((1, l.c_out, 1, 1))?)?
        } else {
            kolo_nn::ops::conv2d(&x, w.as_tensor(), Some(b.as_tensor()), l.stride, l.pad)?
        };
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

fn main() -> ExitCode {
    // As in a training process: freed buffers stay for the next pass.
    kolo_nn::memory::keep_freed_memory();
    let Args {
        layers,
        batch,
        repeats,
        only,
        stride: only_stride,
        dtype,
        candle,
    } = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("conv_layers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (mut total, mut flops, mut total_candle) = (0., 0., 0.);
    for l in layers {
        let (c, side, stride, count) = (l.c_out, l.side, l.stride, l.count);
        if only.is_some_and(|o| o != c) || only_stride.is_some_and(|s| s != stride) {
            continue;
        }
        let timed = time_layer(batch, l, repeats, false, dtype).and_then(|k| {
            let theirs = if candle {
                time_layer(batch, l, repeats, true, dtype)?
            } else {
                (f64::NAN, f64::NAN)
            };
            Ok((k, theirs))
        });
        let ((fwd, step), (candle_fwd, candle_step)) = match timed {
            Ok(t) => t,
            Err(e) => {
                eprintln!("conv_layers: {c} channels at {side}×{side}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let out = (side + 2 * l.pad - l.k) / stride + 1;
        let f = 2. * (batch * l.c_in * c * l.k * l.k * out * out) as f64;
        let passes = if l.dx { 3. } else { 2. };
        println!(
            "{c:>4} ch {side:>2}x{side:<2} stride {stride} (x{count}): forward {:7.2} ms, step {:7.2} ms, {:6.1} GFLOP/s; candle's conv2d: forward {:7.2} ms, step {:7.2} ms ({:.2}x kolo's step)",
            fwd * 1e3,
            step * 1e3,
            passes * f / step / 1e9,
            candle_fwd * 1e3,
            candle_step * 1e3,
            candle_step / step
        );
        total += step * count as f64;
        total_candle += candle_step * count as f64;
        flops += passes * f * count as f64;
    }
    println!(
        "{{\"batch\": {batch}, \"step_ms\": {:.2}, \"gflops\": {:.1}, \"candle_step_ms\": {:.2}, \"candle_over_kolo\": {:.2}}}",
        total * 1e3,
        flops / total / 1e9,
        total_candle * 1e3,
        total_candle / total
    );
    ExitCode::SUCCESS
}
