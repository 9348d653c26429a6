//! Communication hooks: the gradient buckets all-reduced in bf16 (half the bytes), through a hook
//! of your own that also counts what it sends (PyTorch's `register_comm_hook`).
//!
//! ```text
//! kolo run -n 2 -- target/release/examples/ddp_hooks [TRAIN_SAMPLES]
//! ```
//!
//! Exits non-zero unless the loss falls below 0.7, every step sent 2 bytes per parameter, and the
//! ranks end with the same parameters.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::{DType, Device, Module};
use candle_nn::{loss::cross_entropy, VarBuilder, VarMap};
use common::{fashion, mlp, same_on_every_rank, xy};
use kolo_data::{batches, DistributedSampler};
use kolo_ddp::ddp::{Compression, Ddp, DdpOptions, GradBucket};
use kolo_ddp::distributed::{check_loss, DistributedOptimizer};
use kolo_ddp::optim::{self, OptimizerConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limit: usize = std::env::args().nth(1).map_or(Ok(8_000), |a| a.parse())?;
    let train = fashion(limit)?;
    let dev = Device::Cpu;
    let comm = kolo::init()?;
    let varmap = VarMap::new();
    mlp(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    let mut ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
    // ANCHOR: hook
    // A hook of our own: count the bytes, then hand the bucket to the built-in bf16 compression.
    let sent = Arc::new(AtomicUsize::new(0));
    let (counter, bf16) = (
        sent.clone(),
        Compression::Bf16.hook().ok_or("no bf16 hook")?,
    );
    ddp.register_comm_hook(move |bucket: GradBucket, comm: &kolo::Communicator| {
        counter.fetch_add(2 * bucket.len(), Ordering::Relaxed); // bf16: 2 bytes an element
        bf16.reduce(bucket, comm)
    })?;
    // ANCHOR_END: hook
    let params: usize = ddp.params().iter().map(|(_, v)| v.elem_count()).sum();
    let model = mlp(ddp.var_builder(DType::F32, &dev))?;
    let sgd = optim::build(ddp.params(), OptimizerConfig::sgd(0.1, 0.9))?;
    let mut opt = DistributedOptimizer::new(ddp, sgd, 1)?;
    let mut sampler = DistributedSampler::builder(train.len(), comm.size(), comm.rank()).build()?;
    let (mut xs, mut ys, mut step, mut mean) = (Vec::new(), Vec::new(), 0, f64::NAN);
    for epoch in 0..2 {
        sampler.set_epoch(epoch);
        let (mut total, mut n) = (0.0, 0);
        for batch in batches(&sampler.indices(), 64, true)? {
            let (x, y) = xy(&train, batch, &mut xs, &mut ys, &dev)?;
            let loss = cross_entropy(&model.forward(&x)?, &y)?;
            total += check_loss(&comm, step, f64::from(loss.to_scalar::<f32>()?))?;
            opt.backward_step(&loss)?;
            (step, n) = (step + 1, n + 1);
        }
        mean = total / n as f64;
    }
    let per_step = sent.load(Ordering::Relaxed) as f64 / step as f64;
    let same = same_on_every_rank(&comm, opt.ddp().params())?;
    if comm.rank() == 0 {
        println!("{step} steps: mean loss {mean:.4}, {per_step} bytes sent a step for {params} parameters, same parameters on every rank: {same}");
    }
    if !(mean < 0.7 && per_step == 2.0 * params as f64 && same) {
        return Err(format!(
            "rank {}: loss {mean:.4}, {per_step} bytes a step, same {same}",
            comm.rank()
        )
        .into());
    }
    Ok(())
}
