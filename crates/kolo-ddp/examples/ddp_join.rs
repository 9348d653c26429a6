//! Uneven inputs (PyTorch's `model.join()`, Horovod's `hvd.join()`): rank r holds a share of the
//! data that grows with r, so the ranks run out of batches at different steps. In join mode every
//! step averages over the ranks that still have data; a rank out of data joins and keeps stepping
//! with the others' averaged gradients until all are done, so no rank waits forever and all end
//! with the same parameters.
//!
//! ```text
//! kolo run -n 2 -- target/release/examples/ddp_join [TRAIN_SAMPLES]
//! ```
//!
//! Exits non-zero unless the ranks took different numbers of batches, ended with the same
//! parameters and step count, and the loss fell below 0.8.

mod common;

use candle_core::{DType, Device, Module};
use candle_nn::{loss::cross_entropy, VarBuilder, VarMap};
use common::{fashion, mlp, same_on_every_rank, xy};
use kolo_data::batches;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::{check_loss_active, DistributedOptimizer};
use kolo_ddp::optim::{self, OptimizerConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limit: usize = std::env::args().nth(1).map_or(Ok(12_000), |a| a.parse())?;
    let train = fashion(limit)?;
    let dev = Device::Cpu;
    let comm = kolo::init()?;
    let (n, r) = (comm.size(), comm.rank());
    // Uneven shards: rank r's share is proportional to r + 1 (1/3 and 2/3 with two ranks).
    let parts: usize = (1..=n).sum();
    let (from, to) = (
        train.len() * (r * (r + 1) / 2) / parts,
        train.len() * ((r + 1) * (r + 2) / 2) / parts,
    );
    let mine: Vec<usize> = (from..to).collect();
    let varmap = VarMap::new();
    mlp(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
    let model = mlp(ddp.var_builder(DType::F32, &dev))?;
    let sgd = optim::build(ddp.params(), OptimizerConfig::sgd(0.05, 0.9))?;
    let mut opt = DistributedOptimizer::new(ddp, sgd, 1)?;
    // ANCHOR: join
    opt.set_join(true); // on every rank, before the first step
    let (mut xs, mut ys, mut step, mut means) = (Vec::new(), Vec::new(), 0u64, Vec::new());
    for batch in batches(&mine, 32, false)? {
        let (x, y) = xy(&train, batch, &mut xs, &mut ys, &dev)?;
        let loss = cross_entropy(&model.forward(&x)?, &y)?;
        // The mean over the ranks still training (a NaN anywhere stops every rank).
        means.extend(check_loss_active(
            &comm,
            step,
            Some(f64::from(loss.to_scalar::<f32>()?)),
        )?);
        opt.backward_step(&loss)?;
        step += 1;
    }
    let mine_steps = step;
    // Out of data: shadow the others' steps (and their loss check) until every rank is out.
    let report = opt.join_with_pre_step(|| {
        means.extend(check_loss_active(&comm, step, None)?);
        step += 1;
        Ok(())
    })?;
    // ANCHOR_END: join
    let same = same_on_every_rank(&comm, opt.ddp().params())?;
    let recent = &means[means.len().saturating_sub(20)..];
    let mean = recent.iter().sum::<f64>() / recent.len() as f64; // of the last 20 steps
    println!(
        "{mine_steps} batches of its own, {} steps in all ({} shadowed); mean loss of the last 20 steps {mean:.4}; same parameters on every rank: {same}",
        opt.steps(),
        report.shadowed_steps
    );
    let mut steps = [opt.steps() as f64, -(opt.steps() as f64)];
    comm.all_reduce(&mut steps, kolo::ReduceOp::Max)?;
    let equal_steps = steps[0] == -steps[1];
    if !(same && equal_steps && mean < 0.8 && (n == 1 || report.shadowed_steps > 0 || r == n - 1)) {
        return Err(
            format!("rank {r}: same {same}, equal steps {equal_steps}, loss {mean:.4}").into(),
        );
    }
    Ok(())
}
