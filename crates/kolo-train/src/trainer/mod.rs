//! The training loop behind `kolo train`: every rank loads the data, takes its shard through a
//! [`DistributedSampler`], trains a replica with [`Ddp`](crate::ddp::Ddp) and a
//! [`DistributedOptimizer`](crate::distributed::DistributedOptimizer), and evaluates
//! its shard of the test set; rank 0 shows progress, writes metrics (CSV, TensorBoard), the plot, the
//! checkpoints and a summary into the run directory.

mod epoch;
mod record;
mod setup;

pub use setup::seeded_init;

use std::ops::Range;
use std::path::PathBuf;
use std::time::Instant;

use candle_core::Device;
use kolo::Communicator;
use kolo_data::{DatasetKind, DistributedSampler};
use serde::{Deserialize, Serialize};

use crate::checkpoint::TrainState;
use crate::error::{Result, TrainError};
use crate::models::ModelKind;
use crate::optim::OptimizerKind;
use crate::timeline::Timeline;
use epoch::{EpochCtx, Trained};
use record::Recorder;

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
    /// ([`crate::ddp::join`]).
    pub uneven: bool,
    /// Synchronized BatchNorm: batch statistics over the global batch of all ranks
    /// ([`crate::models::convert_sync_batchnorm`]); the model must have BatchNorm layers.
    pub sync_bn: bool,
    /// What forward and backward compute in ([`crate::precision`]).
    pub precision: crate::precision::Precision,
    /// Gradient compression of the bucket all-reduces ([`crate::ddp::comm_hook`]).
    pub compression: crate::ddp::Compression,
    /// How gradients are combined: the average, or Adasum ([`crate::ddp::adasum_hook`]).
    pub reduce: crate::ddp::GradientReduce,
    /// Optimizer-state sharding (ZeRO stage 1, [`crate::optim::ShardedOptimizer`]): each rank keeps
    /// the state of 1/N of the parameters; checkpoints hold the full state.
    pub shard_optimizer: bool,
    /// Write a timeline of the run (Chrome trace, [`crate::timeline`]) to this file.
    #[serde(default)]
    pub timeline: Option<PathBuf>,
    /// Where the tensors live: the CPU, or one GPU per rank ([`crate::device`]).
    #[serde(default)]
    pub device: crate::device::DeviceKind,
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
            precision: crate::precision::Precision::F32,
            compression: crate::ddp::Compression::None,
            reduce: crate::ddp::GradientReduce::Average,
            shard_optimizer: false,
            timeline: None,
            device: crate::device::DeviceKind::Cpu,
        }
    }
}

/// Per-epoch results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochStats {
    /// Epoch number, from 1.
    pub epoch: usize,
    /// Mean training loss over the epoch (all ranks).
    pub train_loss: f64,
    /// Mean test loss.
    pub test_loss: f64,
    /// Test accuracy in [0, 1].
    pub test_accuracy: f64,
    /// Seconds of training in the epoch.
    pub epoch_seconds: f64,
    /// Training samples per second, all workers together.
    pub samples_per_second: f64,
}

/// Where this rank sits: its worker process among the job's and its replica within the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Worker processes.
    pub procs: usize,
    /// This rank's process.
    pub proc_rank: usize,
    /// Replicas per process.
    pub replicas: usize,
    /// This rank's replica in its process.
    pub replica: usize,
}

impl Placement {
    /// The placement of rank `rank` of `world` ranks with `replicas` per process.
    pub fn new(rank: usize, world: usize, replicas: usize) -> Result<Placement> {
        if replicas == 0 || world % replicas != 0 {
            return Err(TrainError::InvalidArgument {
                arg: "replicas",
                reason: format!(
                    "{replicas} replicas per process do not divide the {world} ranks of the job"
                ),
            });
        }
        Ok(Placement {
            procs: world / replicas,
            proc_rank: rank / replicas,
            replicas,
            replica: rank % replicas,
        })
    }

    /// This replica's share of a batch of `len` samples: contiguous, the first `len % replicas`
    /// replicas taking one more. An error when the batch has fewer samples than replicas.
    pub fn share(&self, len: usize) -> Result<Range<usize>> {
        let r = self.replicas;
        if len < r {
            return Err(TrainError::InvalidArgument {
                arg: "replicas",
                reason: format!("a batch of {len} samples cannot be split among {r} replicas"),
            });
        }
        let (base, extra) = (len / r, len % r);
        let start = self.replica * base + self.replica.min(extra);
        Ok(start..start + base + usize::from(self.replica < extra))
    }
}

/// What a run produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The configuration.
    pub config: TrainConfig,
    /// Ranks (worker processes × replicas).
    pub world_size: usize,
    /// Epochs trained in this run (after any resumed ones).
    pub epochs: Vec<EpochStats>,
    /// Final test accuracy.
    pub final_accuracy: f64,
    /// Training samples per second over the run, all workers together.
    pub samples_per_second: f64,
    /// Seconds from the start of the run to the end of the first epoch whose test accuracy reached
    /// [`TrainConfig::target_accuracy`].
    pub seconds_to_target: Option<f64>,
    /// Total seconds.
    pub total_seconds: f64,
    /// The run directory.
    pub run_dir: Option<PathBuf>,
}

fn check_config(cfg: &TrainConfig) -> Result<()> {
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
    if cfg.reduce == crate::ddp::GradientReduce::Adasum {
        if cfg.compression != crate::ddp::Compression::None {
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
    Ok(())
}

/// Trains on this rank of `comm` according to `cfg`, on `cfg.device` (the CPU, or GPU number
/// local rank of this host); every rank returns the summary.
pub fn run(comm: &Communicator, cfg: &TrainConfig) -> Result<Summary> {
    run_on(
        comm,
        cfg,
        &cfg.device.device((comm.rank(), comm.local_rank()))?,
    )
}

/// Trains on this rank of `comm` according to `cfg` with tensors on `device`; every rank returns
/// the summary.
pub fn run_on(comm: &Communicator, cfg: &TrainConfig, device: &Device) -> Result<Summary> {
    check_config(cfg)?;
    let (rank, world) = (comm.rank(), comm.size());
    let place = Placement::new(rank, world, cfg.replicas)?;
    let started = Instant::now();
    let timeline = match &cfg.timeline {
        Some(path) => Timeline::create(comm, path)?,
        None => Timeline::disabled(),
    };

    let (train, test) = setup::load_data(cfg)?;
    let (varmap, dopt) = setup::build_optimizer(comm, cfg, device, train.shape, train.num_classes)?;
    let (dir, dir_path) = setup::run_dir(comm, cfg)?;
    let mut dopt = dopt;
    dopt.ddp().set_timeline(timeline.clone());
    let resumed = if cfg.resume {
        setup::resume(comm, cfg, device, &dir_path, &varmap, &mut dopt)?
    } else {
        setup::Resumed::default()
    };
    let steps_per_epoch = setup::steps_per_epoch(cfg, train.len(), place.procs, place.proc_rank)?;
    let mut dopt = setup::schedule(cfg, place.procs, steps_per_epoch, dopt);

    let workers = if place.replicas > 1 {
        format!("{} workers × {} replicas", place.procs, place.replicas)
    } else {
        format!("{} workers", place.procs)
    };
    if rank == 0 {
        banner(comm, cfg, &train, &test, &workers);
    }
    let mut out = match dir {
        Some(dir) => Some(Recorder::open(dir, cfg, workers)?),
        None => None,
    };

    let mut sampler = if cfg.uneven {
        DistributedSampler::uneven(train.len(), place.procs, place.proc_rank, true, cfg.seed)?
    } else {
        DistributedSampler::new(
            train.len(),
            place.procs,
            place.proc_rank,
            true,
            cfg.seed,
            false,
        )?
    };
    if cfg.uneven {
        dopt.set_join(true);
    }
    let eval_sampler = DistributedSampler::eval(test.len(), world, rank)?;
    let ctx = EpochCtx {
        comm,
        cfg,
        device,
        place,
        train: &train,
        steps_per_epoch,
        timeline: &timeline,
    };
    let mut stats: Vec<EpochStats> = Vec::new();
    let mut seconds_to_target = None;
    let (mut trained_samples, mut train_seconds) = (0usize, 0.0);
    let mut step = resumed.step;
    let last_epoch = cfg.stop_after.map_or(cfg.epochs, |s| s.min(cfg.epochs));
    for epoch in resumed.epoch..last_epoch {
        let Trained {
            loss,
            steps,
            seconds,
        } = epoch::train_epoch(&ctx, &mut sampler, &mut dopt, epoch, &mut step)?;
        let samples = steps * cfg.batch_size * place.procs;
        trained_samples += samples;
        train_seconds += seconds;

        let eval_span = timeline.span("evaluate");
        dopt.ddp().sync_buffers()?;
        let (test_loss, test_accuracy) =
            epoch::evaluate(comm, cfg, device, &varmap, &test, &eval_sampler)?;
        drop(eval_span);
        let s = EpochStats {
            epoch: epoch + 1,
            train_loss: loss,
            test_loss,
            test_accuracy,
            epoch_seconds: seconds,
            samples_per_second: samples as f64 / seconds.max(1e-9),
        };
        if seconds_to_target.is_none() && s.test_accuracy >= cfg.target_accuracy {
            seconds_to_target = Some(started.elapsed().as_secs_f64());
        }
        // Every rank takes part in gathering a sharded optimizer's state; rank 0 saves it.
        let _checkpoint = timeline.span("checkpoint");
        let snapshot = dopt.inner().gather_state()?;
        if let (Some(o), Some(snapshot)) = (out.as_mut(), snapshot.as_ref()) {
            let state = TrainState {
                epoch: epoch + 1,
                step,
                seed: cfg.seed,
                optimizer_steps: dopt.inner().step_count(),
                model: cfg.model.to_string(),
                dataset: cfg.dataset.to_string(),
                world_size: world,
                batch_size: cfg.batch_size,
            };
            o.epoch(
                cfg,
                &s,
                &state,
                &varmap,
                dopt.inner().learning_rate(),
                snapshot,
            )?;
        }
        stats.push(s);
        drop(_checkpoint);
        // The epoch's events go to the file now: a long job's buffer stays small, and a job that
        // dies keeps the trace of its finished epochs.
        timeline.flush()?;
    }

    let summary = Summary {
        config: cfg.clone(),
        world_size: world,
        final_accuracy: stats.last().map_or(0.0, |s| s.test_accuracy),
        samples_per_second: trained_samples as f64 / train_seconds.max(1e-9),
        seconds_to_target,
        total_seconds: started.elapsed().as_secs_f64(),
        run_dir: Some(dir_path),
        epochs: stats,
    };
    if let Some(o) = out.as_ref() {
        o.summary(&summary)?;
    }
    timeline.finish()?;
    Ok(summary)
}

/// Rank 0's opening line: what trains on what, how.
fn banner(
    comm: &Communicator,
    cfg: &TrainConfig,
    train: &kolo_data::Dataset,
    test: &kolo_data::Dataset,
    workers: &str,
) {
    println!(
        "kolo train: {} on {} ({} train / {} test samples), {} ({}) × batch {}, {} lr {}{}",
        cfg.model,
        cfg.dataset,
        train.len(),
        test.len(),
        workers,
        match comm.backend() {
            "kolo" => format!("transport {}", comm.transport_kind()),
            engine => format!("backend {engine}"),
        },
        cfg.batch_size,
        cfg.optimizer,
        cfg.lr,
        if cfg.optimizer == OptimizerKind::Sgd && cfg.momentum > 0.0 {
            format!(" momentum {}", cfg.momentum)
        } else {
            String::new()
        }
    );
}
