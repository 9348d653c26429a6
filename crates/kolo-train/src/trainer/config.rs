//! What a run is told ([`TrainConfig`]) and the settings it refuses.

use std::path::PathBuf;

use kolo_data::DatasetKind;
use kolo_ddp::optim::OptimizerKind;
use kolo_ddp::{Result, TrainError};
use kolo_models::ModelKind;
use serde::{Deserialize, Serialize};

/// Everything one training run needs; the same on every rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Model.
    pub model: ModelKind,
    /// Dataset.
    pub dataset: DatasetKind,
    /// Where the data is (default: the dataset's standard places).
    pub data_dir: Option<PathBuf>,
    /// Epochs to train.
    pub epochs: usize,
    /// Batch size per worker process (split among its replicas).
    pub batch_size: usize,
    /// Replicas per worker process: ranks that are threads of one process, each taking its share of
    /// every batch of the process (single-process data parallel). The communicator's ranks are
    /// `process × replicas + replica`.
    pub replicas: usize,
    /// Learning rate (of one worker, before scaling).
    pub lr: f64,
    /// Optimizer.
    pub optimizer: OptimizerKind,
    /// SGD momentum.
    pub momentum: f64,
    /// Weight decay.
    pub weight_decay: f64,
    /// Seed of the initialization and the sampler.
    pub seed: u64,
    /// Gradient bucket size in bytes.
    pub bucket_bytes: usize,
    /// Overlap gradient communication with backward.
    pub overlap: bool,
    /// Backward passes per optimizer step (gradient accumulation).
    pub backward_passes_per_step: usize,
    /// Scale the learning rate by the number of workers (linear scaling rule).
    pub scale_lr: bool,
    /// Epochs of learning-rate warm-up when scaling.
    pub warmup_epochs: f64,
    /// What the learning rate does after warm-up: constant, a cosine to [`Self::min_lr`] at the
    /// end of the run, or steps of [`Self::lr_gamma`] every [`Self::lr_step_epochs`]
    /// ([`kolo_ddp::distributed::LrDecay`]).
    #[serde(default)]
    pub lr_decay: LrDecayKind,
    /// Epochs between the decays of [`LrDecayKind::Step`] (PyTorch's `StepLR` `step_size`, in
    /// epochs as torchvision's recipes count it).
    #[serde(default = "thirty")]
    pub lr_step_epochs: f64,
    /// Factor of each decay of [`LrDecayKind::Step`].
    #[serde(default = "a_tenth")]
    pub lr_gamma: f64,
    /// The rate at the end of a [`LrDecayKind::Cosine`] run.
    #[serde(default)]
    pub min_lr: f64,
    /// Run directory (default: a new directory under `runs/`).
    pub out: Option<PathBuf>,
    /// Continue from the newest checkpoint in the run directory.
    pub resume: bool,
    /// Use only the first N training samples (quick runs and tests).
    pub train_limit: Option<usize>,
    /// Use only the first N test samples.
    pub test_limit: Option<usize>,
    /// Stop after this many epochs even if `epochs` is larger (to simulate an interrupted job).
    pub stop_after: Option<usize>,
    /// Show the progress bar on rank 0.
    pub progress: bool,
    /// Test accuracy in (0, 1] whose first epoch is reported as the time to reach it.
    pub target_accuracy: f64,
    /// Uneven inputs: every sample once per epoch without padding (ranks may take different numbers
    /// of batches), a rank out of batches joining the others' steps until all are out
    /// ([`kolo_ddp::ddp::join`]).
    pub uneven: bool,
    /// Synchronized BatchNorm: batch statistics over the global batch of all ranks
    /// ([`kolo_models::convert_sync_batchnorm`]); the model must have BatchNorm layers.
    pub sync_bn: bool,
    /// What forward and backward compute in ([`kolo_ddp::precision`]).
    pub precision: kolo_ddp::precision::Precision,
    /// Gradient compression of the bucket all-reduces ([`kolo_ddp::ddp::comm_hook`]).
    pub compression: kolo_ddp::ddp::Compression,
    /// How gradients are combined: the average, or Adasum ([`kolo_ddp::ddp::adasum_hook`]).
    pub reduce: kolo_ddp::ddp::GradientReduce,
    /// Optimizer-state sharding (ZeRO stage 1, [`kolo_ddp::optim::ShardedOptimizer`]): each rank keeps
    /// the state of 1/N of the parameters; checkpoints hold the full state.
    pub shard_optimizer: bool,
    /// Write a timeline of the run (Chrome trace, [`kolo_ddp::timeline`]) to this file.
    #[serde(default)]
    pub timeline: Option<PathBuf>,
    /// Where the tensors live: the CPU, or one GPU per rank ([`kolo_ddp::device`]).
    #[serde(default)]
    pub device: kolo_ddp::device::DeviceKind,
    /// Fault tolerance (`--fault-tolerant`): a lost worker's peers go on at the size left from
    /// the last completed step, a restarted worker rejoins at a step boundary
    /// ([`kolo::elastic`]); run with [`crate::trainer::run_elastic`].
    #[serde(default)]
    pub fault_tolerant: bool,
    /// With `fault_tolerant`: the fewest workers training goes on with.
    #[serde(default = "one")]
    pub min_workers: usize,
}

fn one() -> usize {
    1
}

fn thirty() -> f64 {
    30.0
}

fn a_tenth() -> f64 {
    0.1
}

/// The learning-rate decay of a run (`kolo train --lr-decay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrDecayKind {
    /// The rate stays where warm-up left it.
    #[default]
    Constant,
    /// Half a cosine down to `min_lr` over the run's steps after warm-up.
    Cosine,
    /// `lr_gamma` times every `lr_step_epochs` epochs.
    Step,
}

impl std::str::FromStr for LrDecayKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "constant" => Ok(LrDecayKind::Constant),
            "cosine" => Ok(LrDecayKind::Cosine),
            "step" => Ok(LrDecayKind::Step),
            other => Err(format!(
                "unknown learning-rate decay `{other}`: expected constant, cosine or step"
            )),
        }
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ModelKind::Lenet,
            dataset: DatasetKind::FashionMnist,
            data_dir: None,
            epochs: 10,
            batch_size: 64,
            lr: 0.05,
            optimizer: OptimizerKind::Sgd,
            momentum: 0.9,
            weight_decay: 0.0,
            seed: 0,
            bucket_bytes: 25 << 20,
            overlap: true,
            backward_passes_per_step: 1,
            scale_lr: false,
            warmup_epochs: 0.0,
            lr_decay: LrDecayKind::Constant,
            lr_step_epochs: 30.0,
            lr_gamma: 0.1,
            min_lr: 0.0,
            out: None,
            resume: false,
            train_limit: None,
            test_limit: None,
            stop_after: None,
            progress: true,
            replicas: 1,
            target_accuracy: 0.88,
            uneven: false,
            sync_bn: false,
            precision: kolo_ddp::precision::Precision::F32,
            compression: kolo_ddp::ddp::Compression::None,
            reduce: kolo_ddp::ddp::GradientReduce::Average,
            shard_optimizer: false,
            timeline: None,
            device: kolo_ddp::device::DeviceKind::Cpu,
            fault_tolerant: false,
            min_workers: 1,
        }
    }
}

/// Refuses settings that cannot train, before anything starts.
pub fn check_config(cfg: &TrainConfig) -> Result<()> {
    let bad = |arg: &'static str, reason: &str| {
        Err(TrainError::InvalidArgument {
            arg,
            reason: reason.to_string(),
        })
    };
    if cfg.batch_size == 0 {
        return bad("batch size", "must be at least 1");
    }
    if cfg.epochs == 0 {
        return bad("epochs", "must be at least 1");
    }
    if !(cfg.lr.is_finite() && cfg.lr > 0.0) {
        return bad("learning rate", "must be a positive number");
    }
    if cfg.backward_passes_per_step == 0 {
        return bad("backward passes per step", "must be at least 1");
    }
    match cfg.lr_decay {
        LrDecayKind::Constant => {}
        LrDecayKind::Cosine
            if !(cfg.min_lr.is_finite() && (0.0..=cfg.lr).contains(&cfg.min_lr)) =>
        {
            return Err(TrainError::InvalidArgument {
                arg: "min-lr",
                reason: format!(
                    "{} must be a number from 0 to the learning rate ({})",
                    cfg.min_lr, cfg.lr
                ),
            });
        }
        LrDecayKind::Cosine => {}
        LrDecayKind::Step => {
            if !(cfg.lr_step_epochs.is_finite() && cfg.lr_step_epochs > 0.0) {
                return bad("lr-step-epochs", "must be a positive number of epochs");
            }
            if !(cfg.lr_gamma.is_finite() && cfg.lr_gamma > 0.0) {
                return bad("lr-gamma", "must be a positive number");
            }
        }
    }
    if cfg.replicas == 0 {
        return bad("replicas", "must be at least 1");
    }
    if cfg.replicas > cfg.batch_size {
        return Err(TrainError::InvalidArgument {
            arg: "replicas",
            reason: format!(
                "{} replicas are more than the {} samples of a batch (each replica takes a share of every batch)",
                cfg.replicas, cfg.batch_size
            ),
        });
    }
    if cfg.uneven && cfg.backward_passes_per_step > 1 {
        return bad(
            "uneven",
            "cannot be combined with more than one backward pass per step (the per-batch loss \
             check of a rank out of data could not be shadowed)",
        );
    }
    if cfg.sync_bn && !cfg.model.has_batch_norm() {
        return Err(TrainError::InvalidArgument {
            arg: "sync-bn",
            reason: format!(
                "model {} has no batch norm layers to synchronize (resnet18 has)",
                cfg.model
            ),
        });
    }
    if cfg.sync_bn && cfg.uneven {
        return bad(
            "sync-bn",
            "cannot be combined with --uneven: synchronized BatchNorm gathers statistics from every \
             rank in each forward pass, which a rank out of data no longer runs",
        );
    }
    if cfg.reduce == kolo_ddp::ddp::GradientReduce::Adasum {
        if cfg.compression != kolo_ddp::ddp::Compression::None {
            return bad(
                "reduce",
                "Adasum and gradient compression cannot be combined (each replaces the average)",
            );
        }
        if cfg.uneven {
            return bad(
                "reduce",
                "Adasum cannot be combined with --uneven (a joined rank's zero gradient is not \
                 neutral under Adasum)",
            );
        }
    }
    if !(cfg.target_accuracy > 0.0 && cfg.target_accuracy <= 1.0) {
        return bad("target accuracy", "must be in (0, 1]");
    }
    if cfg.fault_tolerant {
        let refuse = |arg: &'static str, why: &str| {
            Err(TrainError::InvalidArgument {
                arg,
                reason: format!("cannot be combined with --fault-tolerant: {why}"),
            })
        };
        if cfg.shard_optimizer {
            return refuse(
                "shard-optimizer",
                "a lost worker takes its shard of the optimizer state with it (no other worker \
                 holds a copy); train without --shard-optimizer, or restart from checkpoints \
                 with --max-restarts",
            );
        }
        if cfg.replicas > 1 {
            return refuse("replicas", "a worker's replicas would be lost together");
        }
        if cfg.uneven {
            return refuse(
                "uneven",
                "the fault-tolerant sampler already gives every sample once",
            );
        }
        if cfg.backward_passes_per_step > 1 {
            return refuse(
                "backward-passes-per-step",
                "a step lost to a fault would take its accumulated passes with it",
            );
        }
        if cfg.reduce == kolo_ddp::ddp::GradientReduce::Adasum {
            return refuse(
                "reduce",
                "Adasum needs a power-of-two world, which a loss breaks",
            );
        }
        if cfg.resume || cfg.timeline.is_some() {
            return refuse(
                "resume/timeline",
                "not supported in a fault-tolerant run yet",
            );
        }
        if cfg.min_workers == 0 {
            return bad("min-workers", "must be at least 1");
        }
        if cfg.device != kolo_ddp::device::DeviceKind::Cpu {
            return refuse("device", "fault-tolerant training runs on the CPU for now");
        }
    }
    Ok(())
}
