//! The whole data-parallel training loop: a candle model of your own (`common::mlp`), built
//! once, on Fashion-MNIST — sampler, Ddp, optimizer, loss check, checkpoint — and its evaluation
//! on the test set, without autograd, each rank on its shard.
//!
//! ```text
//! cargo build --release -p kolo-ddp --example ddp_minimal
//! kolo run -n 2 -- target/release/examples/ddp_minimal [TRAIN_SAMPLES] [CHECKPOINT_DIR]
//! ```
//!
//! Every rank trains on its shard of the first TRAIN_SAMPLES images (default 12,000) for two
//! epochs; rank 0 saves a checkpoint after each and prints the loss, then the accuracy on the
//! 10,000 test images. Exits non-zero unless the last epoch's mean loss is below 0.6 and the test
//! accuracy above 75 % (the suite runs it so). The README and the book show the part between the
//! `loop` ANCHOR lines, the book also the `eval` part.

mod common;

// ANCHOR: uses
use candle_core::{DType, Device, Module};
use candle_nn::{loss::cross_entropy, VarBuilder, VarMap};
use common::{fashion, mlp, xy};
use kolo::ReduceOp;
use kolo_data::{batches, DatasetKind, DistributedSampler, Split};
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::{check_loss, DistributedOptimizer};
use kolo_ddp::optim::{self, OptimizerConfig};
// ANCHOR_END: uses

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
    // ANCHOR: eval
    // Weights without autograd (torch.no_grad()): activations are freed as the pass goes.
    let eval_model = mlp(opt.ddp().eval_var_builder(DType::F32, &dev))?;
    let test = kolo_data::load(DatasetKind::FashionMnist, Split::Test, None)?;
    let shard = DistributedSampler::eval(test.len(), comm.size(), comm.rank())?; // no sample twice
    let mut counts = [0f64; 2]; // correct, seen
    for batch in batches(&shard.indices(), 1000, false)? {
        let (x, y) = xy(&test, batch, &mut xs, &mut ys, &dev)?;
        let hits = eval_model.forward(&x)?.argmax(1)?.eq(&y)?;
        counts[0] += f64::from(hits.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?);
        counts[1] += batch.len() as f64;
    }
    comm.all_reduce(&mut counts, ReduceOp::Sum)?; // over every rank's shard
    let accuracy = counts[0] / counts[1];
    if comm.rank() == 0 {
        println!("test accuracy {:.2} % of {}", 100.0 * accuracy, counts[1]);
    }
    // ANCHOR_END: eval
    if accuracy.is_nan() || accuracy <= 0.75 {
        return Err(format!(
            "rank {}: test accuracy {:.2} % is not above 75 %",
            comm.rank(),
            100.0 * accuracy
        )
        .into());
    }
    if mean.is_nan() || mean >= 0.6 {
        return Err(format!(
            "rank {}: the last epoch's mean loss {mean:.4} is not below 0.6",
            comm.rank()
        )
        .into());
    }
    Ok(())
}
