//! The whole data-parallel training loop: a candle model of your own (`common::mlp`), built
//! once, on Fashion-MNIST — sampler, Ddp, optimizer, loss check, checkpoint.
//!
//! ```text
//! cargo build --release -p kolo-ddp --example ddp_minimal
//! kolo run -n 2 -- target/release/examples/ddp_minimal [TRAIN_SAMPLES] [CHECKPOINT_DIR]
//! ```
//!
//! Every rank trains on its shard of the first TRAIN_SAMPLES images (default 12,000) for two
//! epochs; rank 0 saves a checkpoint after each and prints the loss. Exits non-zero unless the last
//! epoch's mean loss is below 0.6 (the suite runs it so). The README and the book show the part
//! between the ANCHOR lines.

mod common;

use candle_core::{DType, Device, Module};
use candle_nn::{loss::cross_entropy, VarBuilder, VarMap};
use common::{fashion, mlp, xy};
use kolo_data::{batches, DistributedSampler};
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::{check_loss, DistributedOptimizer};
use kolo_ddp::optim::{self, OptimizerConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let limit: usize = args.next().map_or(Ok(12_000), |a| a.parse())?;
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "checkpoints".into()));
    let train = fashion(limit)?;
    let dev = Device::Cpu;
    // ANCHOR: loop
    let comm = kolo::init()?;
    let varmap = VarMap::new();
    mlp(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?; // creates the parameters
    let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?; // rank 0's values on every rank
    let model = mlp(ddp.var_builder(DType::F32, &dev))?; // built once: gradients leave during backward
    let sgd = optim::build(ddp.params(), OptimizerConfig::sgd(0.1, 0.9))?;
    let mut opt = DistributedOptimizer::new(ddp, sgd, 1)?; // averages gradients, then steps
    let mut sampler = DistributedSampler::builder(train.len(), comm.size(), comm.rank()).build()?;
    let (mut xs, mut ys, mut step, mut mean) = (Vec::new(), Vec::new(), 0, f64::NAN);
    for epoch in 0..2 {
        sampler.set_epoch(epoch);
        let (mut total, mut n) = (0.0, 0);
        for batch in batches(&sampler.indices(), 64, true)? {
            let (x, y) = xy(&train, batch, &mut xs, &mut ys, &dev)?;
            let loss = cross_entropy(&model.forward(&x)?, &y)?;
            // The mean over ranks; a NaN or infinity on any rank stops every rank with an error.
            total += check_loss(&comm, step, f64::from(loss.to_scalar::<f32>()?))?;
            opt.backward_step(&loss)?;
            (step, n) = (step + 1, n + 1);
        }
        mean = total / n as f64;
        opt.save_checkpoint(&dir, epoch as usize + 1)?; // every rank: rank 0 writes
        if comm.rank() == 0 {
            println!("epoch {epoch}: mean loss {mean:.4}");
        }
    }
    // ANCHOR_END: loop
    if mean.is_nan() || mean >= 0.6 {
        return Err(format!(
            "rank {}: the last epoch's mean loss {mean:.4} is not below 0.6",
            comm.rank()
        )
        .into());
    }
    Ok(())
}
