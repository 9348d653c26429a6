//! ZeRO stage 1: the optimizer state sharded over the ranks (each holds AdamW's moments for its
//! share of the parameters only), with a checkpoint that gathers the shards and a resume that
//! scatters them again — ending bit for bit where uninterrupted training ends.
//!
//! ```text
//! kolo run -n 2 -- target/release/examples/zero [TRAIN_SAMPLES] [CHECKPOINT_DIR]
//! ```
//!
//! Trains two epochs straight; then again from scratch for one epoch, saves, starts over with a
//! fresh model and optimizer, resumes from the checkpoint and trains the second epoch. Exits
//! non-zero unless both end with the same parameters, the ranks agree, the ranks' optimizer
//! states are disjoint shares that add up to the whole, and the loss fell below 0.7.

mod common;

use std::path::Path;

use candle_core::{DType, Device, Module};
use candle_nn::{loss::cross_entropy, VarBuilder, VarMap};
use common::{fashion, mlp, same_on_every_rank, xy};
use kolo_data::{batches, Dataset, DistributedSampler};
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::{check_loss, DistributedOptimizer};
use kolo_ddp::optim::{DynOptimizer, OptimizerConfig, ShardedOptimizer};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A fresh model (seeded: every run starts from the same values) and a sharded AdamW.
fn setup(
    comm: &kolo::Communicator,
    dev: &Device,
) -> Res<(
    VarMap,
    impl Module,
    DistributedOptimizer<Box<dyn DynOptimizer>>,
)> {
    let varmap = VarMap::new();
    mlp(VarBuilder::from_varmap(&varmap, DType::F32, dev))?;
    kolo_models::seeded_init(&varmap, 7)?;
    let ddp = Ddp::new(comm, &varmap, DdpOptions::default())?;
    let model = mlp(ddp.var_builder(DType::F32, dev))?;
    // ANCHOR: sharded
    let zero = ShardedOptimizer::new(comm, ddp.params(), OptimizerConfig::adamw(1e-3, 0.01))?;
    // ANCHOR_END: sharded
    Ok((
        varmap,
        model,
        DistributedOptimizer::new(ddp, Box::new(zero) as Box<dyn DynOptimizer>, 1)?,
    ))
}

/// Trains `epochs`; the last epoch's mean loss.
fn train(
    comm: &kolo::Communicator,
    data: &Dataset,
    model: &impl Module,
    opt: &mut DistributedOptimizer<Box<dyn DynOptimizer>>,
    epochs: std::ops::Range<u64>,
) -> Res<f64> {
    let mut sampler = DistributedSampler::builder(data.len(), comm.size(), comm.rank()).build()?;
    let (mut xs, mut ys, mut mean) = (Vec::new(), Vec::new(), f64::NAN);
    for epoch in epochs {
        sampler.set_epoch(epoch);
        let (mut total, mut n) = (0.0, 0);
        for batch in batches(&sampler.indices(), 64, true)? {
            let (x, y) = xy(data, batch, &mut xs, &mut ys, &Device::Cpu)?;
            let loss = cross_entropy(&model.forward(&x)?, &y)?;
            total += check_loss(comm, opt.steps(), f64::from(loss.to_scalar::<f32>()?))?;
            opt.backward_step(&loss)?;
            n += 1;
        }
        mean = total / n as f64;
    }
    Ok(mean)
}

fn values(varmap: &VarMap) -> Res<Vec<Vec<f32>>> {
    let mut vars = kolo_nn::vars::sorted_vars(varmap);
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (_, v) in vars {
        out.push(v.as_tensor().flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(out)
}

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let limit: usize = args.next().map_or(Ok(8_000), |a| a.parse())?;
    let dir = args.next().unwrap_or_else(|| "zero-checkpoints".into());
    let dir = Path::new(&dir);
    let data = fashion(limit)?;
    let dev = Device::Cpu;
    let comm = kolo::init()?;

    // Two epochs straight.
    let (straight, model, mut opt) = setup(&comm, &dev)?;
    let loss = train(&comm, &data, &model, &mut opt, 0..2)?;
    let moments = opt
        .inner()
        .state()
        .into_iter()
        .filter(|(n, _)| !n.starts_with("step."));
    let shard: usize = moments.map(|(_, t)| t.elem_count()).sum();
    let params: usize = opt.ddp().params().iter().map(|(_, v)| v.elem_count()).sum();

    // One epoch, a checkpoint, a fresh start resumed from it, the second epoch.
    let (_, model, mut opt) = setup(&comm, &dev)?;
    train(&comm, &data, &model, &mut opt, 0..1)?;
    // ANCHOR: checkpoint
    opt.save_checkpoint(dir, 1)?;
    let (resumed, model, mut opt) = setup(&comm, &dev)?;
    let state = opt.resume(dir)?.ok_or("no checkpoint to resume from")?;
    // ANCHOR_END: checkpoint
    train(&comm, &data, &model, &mut opt, state.epoch as u64..2)?;

    let equal = values(&straight)? == values(&resumed)?;
    let same = same_on_every_rank(&comm, opt.ddp().params())?;
    // ZeRO-1 partitions whole parameters: each rank's share of AdamW's two moments a parameter.
    let share = shard as f64 / (2 * params) as f64;
    let mut total = [share];
    comm.all_reduce(&mut total, kolo::ReduceOp::Sum)?;
    let split = (total[0] - 1.0).abs() < 1e-9 && (comm.size() == 1 || share < 1.0);
    println!(
        "loss {loss:.4}; resumed == uninterrupted: {equal}; ranks agree: {same}; \
         this rank's share of the optimizer state: {share:.3} (all ranks: {:.3})",
        total[0]
    );
    if !(equal && same && split && loss < 0.7) {
        let r = comm.rank();
        return Err(
            format!("rank {r}: equal {equal}, same {same}, split {split}, loss {loss:.4}").into(),
        );
    }
    Ok(())
}
