//! A plain candle training loop, no kolo communication: the baseline `kolo train -n 1` is measured
//! against (the cost of the Ddp layer with one worker) in `scripts/bench-train.sh`.
//!
//! It does what one `kolo train` worker does — the same model, data, sampler order, optimizer and
//! batch — minus `Ddp`, the loss check and the evaluation, and prints one JSON line:
//!
//! ```text
//! cargo run --release -p kolo-train --example plain_loop -- [--model lenet] [--batch-size 64] [--train-limit N] [--epochs 1]
//! ```

use std::process::ExitCode;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use kolo_data::{batches, DatasetKind, DistributedSampler, Split};
use kolo_ddp::optim::{self, OptimizerConfig, SgdConfig};
use kolo_models::{self as models, seeded_init, ModelKind};
use kolo_nn::vars::named_parameters;

struct Args {
    model: ModelKind,
    dataset: DatasetKind,
    batch: usize,
    epochs: usize,
    limit: Option<usize>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        model: ModelKind::Lenet,
        dataset: DatasetKind::FashionMnist,
        batch: 64,
        epochs: 1,
        limit: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--model" => a.model = v.parse().map_err(|e| format!("{e}"))?,
            "--dataset" => a.dataset = v.parse().map_err(|e| format!("{e}"))?,
            "--batch-size" => a.batch = v.parse().map_err(|e| format!("--batch-size: {e}"))?,
            "--epochs" => a.epochs = v.parse().map_err(|e| format!("--epochs: {e}"))?,
            "--train-limit" => {
                a.limit = Some(v.parse().map_err(|e| format!("--train-limit: {e}"))?)
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    match parse().and_then(|a| train(&a).map_err(|e| e.to_string())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plain_loop: {e}");
            ExitCode::FAILURE
        }
    }
}

fn train(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    // ANCHOR: keep_memory
    // As `kolo train` does: the next step reuses the pages this one frees (true where it
    // applied: glibc on Linux).
    kolo_nn::memory::keep_freed_memory();
    // ANCHOR_END: keep_memory
    let device = Device::Cpu;
    let mut data = kolo_data::load(a.dataset, Split::Train, None)?;
    if let Some(n) = a.limit.filter(|&n| n < data.len()) {
        data = data.subset(&(0..n).collect::<Vec<_>>())?;
    }
    let shape = data.shape;
    let varmap = VarMap::new();
    let model = models::build(
        a.model,
        VarBuilder::from_varmap(&varmap, DType::F32, &device),
        shape,
        data.num_classes,
    )?;
    seeded_init(&varmap, 0)?;
    let params = named_parameters(&varmap);
    let mut opt = optim::build(
        params,
        OptimizerConfig::Sgd(SgdConfig {
            lr: 0.05,
            momentum: 0.9,
            ..SgdConfig::default()
        }),
    )?;
    let mut sampler = DistributedSampler::new(data.len(), 1, 0, true, 0, false)?;
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    let mut samples = 0usize;
    let t0 = Instant::now();
    for epoch in 0..a.epochs {
        sampler.set_epoch(epoch as u64);
        let idx = sampler.indices();
        for b in batches(&idx, a.batch, true)? {
            data.gather(b, &mut xs, &mut ys)?;
            let x = Tensor::from_slice(&xs, (b.len(), shape[0], shape[1], shape[2]), &device)?;
            let y = Tensor::from_slice(&ys, b.len(), &device)?;
            let loss = candle_nn::loss::cross_entropy(&model.forward(&x, true)?, &y)?;
            let _ = loss.to_scalar::<f32>()?;
            let grads = loss.backward()?;
            opt.step(&grads)?;
            samples += b.len();
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{{\"impl\": \"candle-plain\", \"model\": \"{}\", \"batch\": {}, \"samples\": {samples}, \"seconds\": {secs:.3}, \"samples_per_s\": {:.1}}}",
        a.model,
        a.batch,
        samples as f64 / secs
    );
    Ok(())
}
