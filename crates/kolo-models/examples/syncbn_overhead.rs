//! The cost of SyncBatchNorm: ResNet-18 training steps (forward, backward with Ddp, SGD) with
//! plain (local) BatchNorm vs. BatchNorm synchronized over all ranks, on ranks that are threads
//! of this process. The two modes alternate (plain, sync, plain, sync, …) so that a noisy machine
//! hurts both alike; each measurement times `--steps` steps and the medians over `--reps`
//! measurements are reported, as text and as one JSON line:
//!
//! ```text
//! cargo run -p kolo-models --example syncbn_overhead -- [--ranks 2] [--batch 16] [--size 32] [--steps 3] [--reps 5]
//! ```
//!
//! `--batch` is the per-rank batch, `--size` the side of the 3×size×size inputs.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use candle_nn::{Optimizer, VarBuilder, VarMap, SGD};
use kolo::Config;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_models::{self as models, ModelKind};

const CLASSES: usize = 10;

#[derive(Clone, Copy, Debug)]
struct Args {
    ranks: usize,
    batch: usize,
    size: usize,
    steps: usize,
    reps: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        ranks: 2,
        batch: 16,
        size: 32,
        steps: 3,
        reps: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n: usize = v
            .parse()
            .map_err(|e| format!("{flag} {v}: not a count ({e})"))?;
        if n == 0 {
            return Err(format!("{flag} must be positive"));
        }
        match flag.as_str() {
            "--ranks" => a.ranks = n,
            "--batch" => a.batch = n,
            "--size" => a.size = n,
            "--steps" => a.steps = n,
            "--reps" => a.reps = n,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

/// One training step; `sync` selects SyncBatchNorm.
fn step(
    ddp: &Ddp,
    opt: &mut SGD,
    x: &Tensor,
    y: &Tensor,
    shape: [usize; 3],
    sync: bool,
) -> kolo_ddp::Result<()> {
    let vb = ddp.var_builder(DType::F32, &Device::Cpu);
    let mut model = models::build(ModelKind::Resnet18, vb, shape, CLASSES)?;
    if sync {
        models::convert_sync_batchnorm(model.as_mut(), ddp.comm());
    }
    let loss = candle_nn::loss::cross_entropy(&model.forward(x, true)?, y)?;
    let grads = ddp.backward(&loss)?;
    opt.step(&grads)?;
    Ok(())
}

/// Per-step seconds of each measurement: `(plain, sync)`.
type Times = (Vec<f64>, Vec<f64>);

fn rank(comm: &kolo::Communicator, a: Args) -> kolo_ddp::Result<Times> {
    let shape = [3, a.size, a.size];
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    models::build(ModelKind::Resnet18, vb, shape, CLASSES)?;
    let ddp = Ddp::new(comm, &varmap, DdpOptions::default())?;
    let mut opt = SGD::new(ddp.params().iter().map(|(_, v)| v.clone()).collect(), 0.01)?;
    let x = Tensor::randn(0f32, 1f32, (a.batch, 3, a.size, a.size), &Device::Cpu)?;
    let labels: Vec<u32> = (0..a.batch as u32).map(|i| i % CLASSES as u32).collect();
    let y = Tensor::new(labels, &Device::Cpu)?;
    // Warm-up: one step of each.
    for sync in [false, true] {
        step(&ddp, &mut opt, &x, &y, shape, sync)?;
    }
    let mut times: Times = (Vec::new(), Vec::new());
    for _ in 0..a.reps {
        for sync in [false, true] {
            comm.barrier()?;
            let t = Instant::now();
            for _ in 0..a.steps {
                step(&ddp, &mut opt, &x, &y, shape, sync)?;
            }
            let per_step = t.elapsed().as_secs_f64() / a.steps as f64;
            if sync {
                times.1.push(per_step);
            } else {
                times.0.push(per_step);
            }
        }
    }
    Ok(times)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("syncbn_overhead: {e}");
            return ExitCode::from(2);
        }
    };
    let config = Config::default().with_timeout(Duration::from_secs(600));
    let results = kolo::run_local(a.ranks, config, |comm| rank(&comm, a));
    let mut plain = Vec::new();
    let mut sync = Vec::new();
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Ok(Ok((p, s))) => {
                // A step ends when the slowest rank is done: take the slowest rank per measurement.
                if plain.is_empty() {
                    plain = p;
                    sync = s;
                } else {
                    plain
                        .iter_mut()
                        .zip(&p)
                        .for_each(|(a, b)| *a = f64::max(*a, *b));
                    sync.iter_mut()
                        .zip(&s)
                        .for_each(|(a, b)| *a = f64::max(*a, *b));
                }
            }
            Ok(Err(e)) => {
                eprintln!("syncbn_overhead: rank {r}: {e}");
                return ExitCode::FAILURE;
            }
            Err(p) => {
                eprintln!("syncbn_overhead: rank {r} panicked: {p}");
                return ExitCode::FAILURE;
            }
        }
    }
    let (mp, ms) = (median(&plain), median(&sync));
    let overhead = (ms / mp - 1.0) * 100.0;
    println!(
        "resnet18, {} ranks x batch {} of 3x{}x{}: plain BN {:.1} ms/step, SyncBatchNorm {:.1} ms/step (median of {}), overhead {overhead:+.1}%",
        a.ranks, a.batch, a.size, a.size, mp * 1e3, ms * 1e3, a.reps
    );
    println!(
        "{{\"ranks\":{},\"batch\":{},\"size\":{},\"steps\":{},\"reps\":{},\"plain_s\":{plain:?},\"sync_s\":{sync:?},\"plain_median_s\":{mp},\"sync_median_s\":{ms},\"overhead_pct\":{overhead}}}",
        a.ranks, a.batch, a.size, a.steps, a.reps
    );
    ExitCode::SUCCESS
}
