//! Setting a run up: the data, the model's parameters (seeded, rank 0's values on every rank), the
//! DDP optimizer, the run directory, and the resume from a checkpoint.

use std::path::PathBuf;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use kolo::Communicator;
use kolo_data::{Dataset, DistributedSampler, Split};
use kolo_metrics::RunDir;

use super::config::{LrDecayKind, TrainConfig};
use kolo_ddp::checkpoint;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::{DistributedOptimizer, LrDecay, LrSchedule};
use kolo_ddp::TrainError;
use kolo_nn::vars::sorted_vars;

use crate::error::Result;
use kolo_ddp::optim::{self, AdamWConfig, DynOptimizer, OptimizerConfig, OptimizerKind, SgdConfig};
use kolo_models as models;

fn optimizer_config(cfg: &TrainConfig) -> OptimizerConfig {
    match cfg.optimizer {
        OptimizerKind::Sgd => OptimizerConfig::Sgd(SgdConfig {
            lr: cfg.lr,
            momentum: cfg.momentum,
            weight_decay: cfg.weight_decay,
            ..SgdConfig::default()
        }),
        OptimizerKind::AdamW => OptimizerConfig::AdamW(AdamWConfig {
            lr: cfg.lr,
            weight_decay: cfg.weight_decay,
            ..AdamWConfig::default()
        }),
    }
}

/// The training and test sets, cut to the configured limits.
pub(super) fn load_data(cfg: &TrainConfig) -> Result<(Dataset, Dataset)> {
    let mut train = kolo_data::load(cfg.dataset, Split::Train, cfg.data_dir.as_deref())?;
    let mut test = kolo_data::load(cfg.dataset, Split::Test, cfg.data_dir.as_deref())?;
    if let Some(n) = cfg.train_limit.filter(|&n| n < train.len()) {
        train = train.subset(&(0..n).collect::<Vec<_>>())?;
    }
    if let Some(n) = cfg.test_limit.filter(|&n| n < test.len()) {
        test = test.subset(&(0..n).collect::<Vec<_>>())?;
    }
    Ok((train, test))
}

/// The model's parameters, seeded and made equal on every rank, and the optimizer that trains them.
pub(super) fn build_optimizer(
    comm: &Communicator,
    cfg: &TrainConfig,
    device: &Device,
    shape: [usize; 3],
    classes: usize,
) -> Result<(VarMap, DistributedOptimizer<Box<dyn DynOptimizer>>)> {
    let varmap = new_varmap(cfg, device, shape, classes)?;
    let dopt = wrap(comm, cfg, &varmap)?;
    Ok((varmap, dopt))
}

/// The model's parameters, initialized from the seed (the same on every rank).
pub(super) fn new_varmap(
    cfg: &TrainConfig,
    device: &Device,
    shape: [usize; 3],
    classes: usize,
) -> Result<VarMap> {
    // Build once to create the parameters.
    let varmap = VarMap::new();
    models::build(
        cfg.model,
        VarBuilder::from_varmap(&varmap, DType::F32, device),
        shape,
        classes,
    )?;
    models::seeded_init(&varmap, cfg.seed)?;
    Ok(varmap)
}

/// `varmap`'s parameters under DDP on `comm` (rank 0's values win) with the optimizer that
/// trains them.
pub(super) fn wrap(
    comm: &Communicator,
    cfg: &TrainConfig,
    varmap: &VarMap,
) -> Result<DistributedOptimizer<Box<dyn DynOptimizer>>> {
    let mut ddp = Ddp::new(
        comm,
        varmap,
        DdpOptions {
            bucket_bytes: cfg.bucket_bytes,
            overlap: cfg.overlap,
            // kolo train copies rank 0's buffers at the end of each epoch (before evaluating).
            broadcast_buffers: false,
            ..DdpOptions::default()
        },
    )?;
    match cfg.reduce.hook() {
        Some(hook) => {
            cfg.reduce.check_world(comm.size())?;
            ddp.set_comm_hook(Some(hook))?;
        }
        None => ddp.set_compression(cfg.compression)?,
    }
    let opt: Box<dyn DynOptimizer> = if cfg.shard_optimizer {
        Box::new(optim::ShardedOptimizer::new(
            comm,
            ddp.params().to_vec(),
            optimizer_config(cfg),
        )?)
    } else {
        optim::build(ddp.params().to_vec(), optimizer_config(cfg))?
    };
    Ok(DistributedOptimizer::new(
        ddp,
        opt,
        cfg.backward_passes_per_step,
    )?)
}

/// Rank 0 creates the run directory; every rank returns rank 0's directory (`Some` on rank 0 only)
/// and its path.
pub(super) fn run_dir(comm: &Communicator, cfg: &TrainConfig) -> Result<(Option<RunDir>, PathBuf)> {
    let dir = if comm.rank() == 0 {
        let name = format!("{}-{}", cfg.model, cfg.dataset);
        Some(RunDir::create(
            cfg.out.as_deref(),
            std::path::Path::new("runs"),
            &name,
        )?)
    } else {
        None
    };
    let path: PathBuf = comm.broadcast_object(dir.as_ref().map(|d| d.path().to_path_buf()), 0)?;
    Ok((dir, path))
}

/// Where a resumed run goes on: the epochs already done and the optimizer steps taken.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Resumed {
    pub epoch: usize,
    pub step: u64,
}

/// Resumes from the newest checkpoint under `dir`: rank 0 reads it and every rank gets its
/// parameters, optimizer state and counters. Nothing to resume from is a fresh start.
pub(super) fn resume(
    comm: &Communicator,
    cfg: &TrainConfig,
    device: &Device,
    dir: &std::path::Path,
    varmap: &VarMap,
    dopt: &mut DistributedOptimizer<Box<dyn DynOptimizer>>,
) -> Result<Resumed> {
    let lead = comm.rank() == 0;
    let ckpt_root = RunDir::from_path(dir).checkpoint_dir();
    let Some((state, ckpt)) = checkpoint::load_latest_on_rank0(comm, &ckpt_root, device)? else {
        if lead {
            println!(
                "no checkpoint in {}; starting from scratch",
                ckpt_root.display()
            );
        }
        return Ok(Resumed::default());
    };
    if state.model != cfg.model.to_string() {
        return Err(TrainError::Checkpoint {
            path: ckpt_root,
            reason: format!("was written for model {}, not {}", state.model, cfg.model),
        }
        .into());
    }
    let all_vars = sorted_vars(varmap);
    let model = checkpoint::broadcast_tensors(comm, 0, ckpt.as_ref().map(|c| &c.model), device)?;
    checkpoint::restore_vars(&ckpt_root, &all_vars, &model)?;
    let optstate =
        checkpoint::broadcast_tensors(comm, 0, ckpt.as_ref().map(|c| &c.optimizer), device)?;
    dopt.inner_mut().load_state(&optstate)?;
    dopt.inner_mut().set_step_count(state.optimizer_steps);
    dopt.set_steps(state.step);
    if lead {
        println!(
            "resumed from {} (epoch {} done, step {})",
            ckpt_root.display(),
            state.epoch,
            state.step
        );
    }
    Ok(Resumed {
        epoch: state.epoch,
        step: state.step,
    })
}

/// Optimizer steps per epoch: batches of the process's shard of the training set.
pub(super) fn steps_per_epoch(
    cfg: &TrainConfig,
    train_len: usize,
    procs: usize,
    proc_rank: usize,
) -> Result<usize> {
    Ok(kolo_data::num_batches(
        DistributedSampler::new(train_len, procs, proc_rank, true, cfg.seed, false)?.num_samples(),
        cfg.batch_size,
        true,
    ))
}

/// The run's learning-rate schedule: scaled by the number of workers (with warm-up) when asked,
/// then decayed as asked. `batches_per_epoch` counts backward passes; the schedule counts
/// optimizer steps, `backward_passes_per_step` passes each.
pub(super) fn schedule(
    cfg: &TrainConfig,
    workers: usize,
    batches_per_epoch: usize,
    dopt: DistributedOptimizer<Box<dyn DynOptimizer>>,
) -> DistributedOptimizer<Box<dyn DynOptimizer>> {
    let steps_per_epoch = batches_per_epoch as f64 / cfg.backward_passes_per_step.max(1) as f64;
    let steps = |epochs: f64| (epochs * steps_per_epoch).round() as u64;
    let scaled = cfg.scale_lr && workers > 1;
    let warmup_steps = if scaled { steps(cfg.warmup_epochs) } else { 0 };
    let decay = match cfg.lr_decay {
        LrDecayKind::Constant if !scaled => return dopt,
        LrDecayKind::Constant => LrDecay::Constant,
        LrDecayKind::Cosine => LrDecay::Cosine {
            steps: steps(cfg.epochs as f64).saturating_sub(warmup_steps),
            min_lr: cfg.min_lr,
        },
        LrDecayKind::Step => LrDecay::Step {
            every: steps(cfg.lr_step_epochs).max(1),
            gamma: cfg.lr_gamma,
        },
    };
    dopt.with_schedule(LrSchedule {
        base_lr: cfg.lr,
        scale: if scaled { workers as f64 } else { 1.0 },
        warmup_steps,
        decay,
    })
}
