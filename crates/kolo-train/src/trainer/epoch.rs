//! One epoch of training and one evaluation of the test set.

use std::time::Instant;

use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarMap;
use kolo::{Communicator, ReduceOp};
use kolo_data::{batches, Dataset, DistributedSampler};
use kolo_metrics::Progress;

use kolo_ddp::replicas::Placement;

use super::config::TrainConfig;
use crate::error::Result;
use kolo_ddp::distributed::{check_loss, check_loss_active, DistributedOptimizer};
use kolo_ddp::optim::DynOptimizer;
use kolo_models as models;

/// What an epoch of training measured.
#[derive(Clone, Copy, Debug)]
pub(super) struct Trained {
    /// Mean training loss over the epoch's steps (all ranks).
    pub loss: f64,
    /// Optimizer steps taken.
    pub steps: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Everything an epoch works with.
pub(super) struct EpochCtx<'a> {
    pub comm: &'a Communicator,
    pub cfg: &'a TrainConfig,
    pub device: &'a Device,
    pub place: Placement,
    pub train: &'a Dataset,
    pub steps_per_epoch: usize,
    pub timeline: &'a kolo_ddp::timeline::Timeline,
}

/// Trains one epoch: this process's shard of the training set in batches of `cfg.batch_size`, this
/// replica taking its share of every batch; `step` counts optimizer steps across epochs.
pub(super) fn train_epoch(
    ctx: &EpochCtx,
    sampler: &mut DistributedSampler,
    dopt: &mut DistributedOptimizer<Box<dyn DynOptimizer>>,
    epoch: usize,
    step: &mut u64,
) -> Result<Trained> {
    let (cfg, device, place, tl) = (ctx.cfg, ctx.device, ctx.place, ctx.timeline);
    let shape = ctx.train.shape;
    let classes = ctx.train.num_classes;
    sampler.set_epoch(epoch as u64);
    let indices = sampler.indices();
    let mut progress = (ctx.comm.rank() == 0 && cfg.progress).then(|| {
        Progress::new(
            ctx.steps_per_epoch as u64,
            epoch as u64 + 1,
            cfg.epochs as u64,
        )
    });
    let t0 = Instant::now();
    let (mut loss_sum, mut steps) = (0.0, 0usize);
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    // Uneven inputs keep the last, shorter batch (every sample once per epoch) unless it has fewer
    // samples than there are replicas to share it.
    let batches =
        batches(&indices, cfg.batch_size, !cfg.uneven)?.filter(|b| b.len() >= place.replicas);
    let model = train_model(cfg, dopt, device, (shape, classes), ctx.comm)?;
    for (i, b) in batches.enumerate() {
        // A replica's loss is weighted by its share of the batch, so that the average over the
        // replicas is the mean over the whole batch even when the shares differ by one.
        let weight = place.loss_weight(b.len())?;
        let b = &b[place.share(b.len())?];
        let data = tl.span("data");
        ctx.train.gather(b, &mut xs, &mut ys)?;
        let x = Tensor::from_slice(&xs, (b.len(), shape[0], shape[1], shape[2]), device)?;
        let y = Tensor::from_slice(&ys, b.len(), device)?;
        drop(data);
        let forward = tl.span("forward");
        let x = compute_input(cfg, x, device)?;
        let logits = model.forward(&x, true)?.to_dtype(DType::F32)?;
        let mut loss = candle_nn::loss::cross_entropy(&logits, &y)?;
        let local = f64::from(loss.to_scalar::<f32>()?);
        drop(forward);
        let check = tl.span("loss check");
        let mean = if cfg.uneven {
            check_loss_active(ctx.comm, *step, Some(local))?.unwrap_or(local)
        } else {
            check_loss(ctx.comm, *step, local)?
        };
        if place.replicas > 1 {
            loss = loss.affine(weight, 0.0)?;
        }
        drop(check);
        dopt.backward_step(&loss)?;
        *step += 1;
        loss_sum += mean;
        steps += 1;
        if let Some(p) = progress.as_mut() {
            let secs = t0.elapsed().as_secs_f64().max(1e-9);
            p.update(
                i as u64 + 1,
                mean,
                ((i + 1) * cfg.batch_size * place.procs) as f64 / secs,
            );
        }
    }
    if cfg.uneven {
        // Out of batches: shadow the others' steps (their loss check included) until all are out,
        // stepping with the same averaged gradients.
        let mut shadow = *step;
        let report = dopt.join_with_pre_step(|| {
            check_loss_active(ctx.comm, shadow, None)?;
            shadow += 1;
            Ok(())
        })?;
        *step += report.shadowed_steps;
    }
    let seconds = t0.elapsed().as_secs_f64();
    if let Some(p) = progress.as_mut() {
        p.finish();
    }
    Ok(Trained {
        loss: loss_sum / steps.max(1) as f64,
        steps,
        seconds,
    })
}

/// The model to train, built once (for an epoch, or for an elastic generation) from DDP's builder
/// in the run's compute precision (`--precision bf16` where the model computes on bf16 tensors: a
/// bf16 view of the f32 master weights, see [`kolo_ddp::precision`]). The weights it holds are
/// DDP's copies (hooked, or cast), which the optimizer's step refreshes in place; built anew every
/// step, each step would copy every weight once more to build it and once to refresh the model it
/// then drops (2 workers on ResNet-18: 10 ms a step each).
pub(super) fn train_model(
    cfg: &TrainConfig,
    dopt: &DistributedOptimizer<Box<dyn DynOptimizer>>,
    device: &Device,
    (shape, classes): ([usize; 3], usize),
    comm: &Communicator,
) -> Result<Box<dyn models::Model>> {
    let vb = match cfg.precision.tensor_dtype(device) {
        Some(compute) => dopt.ddp().var_builder_in(compute, device),
        None => dopt.ddp().var_builder(DType::F32, device),
    };
    Ok(if cfg.sync_bn {
        models::build_sync_bn(cfg.model, vb, shape, classes, comm)?
    } else {
        models::build(cfg.model, vb, shape, classes)?
    })
}

/// The input `x` in the run's compute precision (see [`train_model`]).
pub(super) fn compute_input(cfg: &TrainConfig, x: Tensor, device: &Device) -> Result<Tensor> {
    Ok(match cfg.precision.tensor_dtype(device) {
        Some(compute) => x.to_dtype(compute)?,
        None => x,
    })
}

/// Test loss and accuracy: every rank evaluates its shard with the running statistics, then the
/// sums are added over the ranks.
pub(super) fn evaluate(
    comm: &Communicator,
    cfg: &TrainConfig,
    device: &Device,
    varmap: &VarMap,
    test: &Dataset,
    eval_sampler: &DistributedSampler,
) -> Result<(f64, f64)> {
    let shape = test.shape;
    // Weights without autograd: each layer's activations are freed as the pass goes (from the
    // map itself, the graph would hold a whole 512-sample batch's, 4.5 GB on ResNet-18).
    let model = models::build(
        cfg.model,
        kolo_nn::vars::frozen_var_builder(varmap, DType::F32, device),
        shape,
        test.num_classes,
    )?;
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    let mut sums = [0.0f64; 3]; // correct, count, loss sum
    for b in batches(&eval_sampler.indices(), 512, false)? {
        test.gather(b, &mut xs, &mut ys)?;
        let x = Tensor::from_slice(&xs, (b.len(), shape[0], shape[1], shape[2]), device)?;
        let y = Tensor::from_slice(&ys, b.len(), device)?;
        let logits = model.forward(&x, false)?;
        let l = candle_nn::loss::cross_entropy(&logits, &y)?.to_scalar::<f32>()?;
        let pred = logits.argmax(D::Minus1)?;
        let correct = pred
            .eq(&y)?
            .to_dtype(DType::F32)?
            .sum_all()?
            .to_scalar::<f32>()?;
        sums[0] += f64::from(correct);
        sums[1] += b.len() as f64;
        sums[2] += f64::from(l) * b.len() as f64;
    }
    comm.all_reduce(&mut sums, ReduceOp::Sum)?;
    Ok((sums[2] / sums[1].max(1.0), sums[0] / sums[1].max(1.0)))
}
