//! The training loop behind `kolo train`: every rank loads the data, takes its shard through a
//! [`DistributedSampler`], trains a replica with [`Ddp`] and a [`DistributedOptimizer`], and evaluates
//! its shard of the test set; rank 0 shows progress, writes metrics (CSV, TensorBoard), the plot, the
//! checkpoints and a summary into the run directory.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use kolo::{Communicator, ReduceOp};
use kolo_data::{batches, DatasetKind, DistributedSampler, Split};
use kolo_metrics::{
    MetricsCsv, Progress, RunDir, TensorBoardWriter, TrainingSeries, TRAINING_COLUMNS,
};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, TrainState};
use crate::ddp::{sorted_vars, Ddp, DdpOptions};
use crate::distributed::{check_loss, DistributedOptimizer, LrSchedule};
use crate::error::{Result, TrainError};
use crate::models::{self, ModelKind};
use crate::optim::{self, AdamWConfig, OptimizerConfig, OptimizerKind, SgdConfig};

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
    /// Batch size per worker.
    pub batch_size: usize,
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

/// What a run produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The configuration.
    pub config: TrainConfig,
    /// Workers.
    pub world_size: usize,
    /// Epochs trained in this run (after any resumed ones).
    pub epochs: Vec<EpochStats>,
    /// Final test accuracy.
    pub final_accuracy: f64,
    /// Training samples per second over the run, all workers together.
    pub samples_per_second: f64,
    /// Seconds from the start of training to the first epoch with ≥ 88 % test accuracy.
    pub seconds_to_88: Option<f64>,
    /// Total seconds.
    pub total_seconds: f64,
    /// The run directory.
    pub run_dir: Option<PathBuf>,
}

/// Deterministic PyTorch-style initialization from `seed`: weights (2-d and more) and their biases
/// uniform in ±1/√fan_in, as `nn.Linear`/`nn.Conv2d` do; BatchNorm scales, shifts and buffers are left
/// as built. Candle's CPU random generator cannot be seeded, so runs are reproducible only with this.
pub fn seeded_init(varmap: &VarMap, seed: u64) -> Result<()> {
    let vars = sorted_vars(varmap);
    let fan_in = |name: &str| -> Option<usize> {
        let w = vars.iter().find(|(n, _)| n == name)?;
        let d = w.1.dims();
        (d.len() >= 2).then(|| d[1..].iter().product())
    };
    let mut rng = kolo_data::rng::SplitMix64::new(seed);
    for (name, var) in &vars {
        let fan = if name.ends_with(".weight") {
            fan_in(name)
        } else if let Some(prefix) = name.strip_suffix(".bias") {
            fan_in(&format!("{prefix}.weight"))
        } else {
            None
        };
        let Some(fan) = fan else { continue };
        let bound = 1.0 / (fan as f64).sqrt();
        let vals: Vec<f32> = (0..var.elem_count())
            .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
            .collect();
        var.set(&Tensor::from_vec(vals, var.shape(), var.device())?.to_dtype(var.dtype())?)?;
    }
    Ok(())
}

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
    Ok(())
}

/// Rank 0's outputs.
struct Outputs {
    dir: RunDir,
    csv: MetricsCsv,
    tb: Option<TensorBoardWriter>,
}

/// Trains on this rank of `comm` according to `cfg`; every rank returns the summary.
pub fn run(comm: &Communicator, cfg: &TrainConfig) -> Result<Summary> {
    check_config(cfg)?;
    let device = Device::Cpu;
    let (rank, world) = (comm.rank(), comm.size());
    let lead = rank == 0;
    let started = Instant::now();

    let mut train = kolo_data::load(cfg.dataset, Split::Train, cfg.data_dir.as_deref())?;
    let mut test = kolo_data::load(cfg.dataset, Split::Test, cfg.data_dir.as_deref())?;
    if let Some(n) = cfg.train_limit.filter(|&n| n < train.len()) {
        train = train.subset(&(0..n).collect::<Vec<_>>())?;
    }
    if let Some(n) = cfg.test_limit.filter(|&n| n < test.len()) {
        test = test.subset(&(0..n).collect::<Vec<_>>())?;
    }
    let shape = train.shape;
    let classes = train.num_classes;

    // Build once to create the parameters, initialize from the seed (rank 0's values win).
    let varmap = VarMap::new();
    models::build(
        cfg.model,
        VarBuilder::from_varmap(&varmap, DType::F32, &device),
        shape,
        classes,
    )?;
    seeded_init(&varmap, cfg.seed)?;
    let ddp = Ddp::new(
        comm,
        &varmap,
        DdpOptions {
            bucket_bytes: cfg.bucket_bytes,
            overlap: cfg.overlap,
        },
    )?;
    let opt = optim::build(ddp.params().to_vec(), optimizer_config(cfg))?;

    // The run directory is rank 0's; the others learn its path.
    let dir = if lead {
        let name = format!("{}-{}", cfg.model, cfg.dataset);
        Some(RunDir::create(
            cfg.out.as_deref(),
            std::path::Path::new("runs"),
            &name,
        )?)
    } else {
        None
    };
    let dir_path: PathBuf =
        comm.broadcast_object(dir.as_ref().map(|d| d.path().to_path_buf()), 0)?;

    // Resume: rank 0 reads the newest checkpoint and everyone gets its contents.
    let mut first_epoch = 0;
    let mut step: u64 = 0;
    let mut dopt = DistributedOptimizer::new(ddp, opt, cfg.backward_passes_per_step)?;
    if cfg.resume {
        let ckpt_root = RunDir::from_path(&dir_path).checkpoint_dir();
        let ckpt = if lead {
            checkpoint::load_latest(&ckpt_root, &device)?
        } else {
            None
        };
        let state: Option<TrainState> =
            comm.broadcast_object(lead.then(|| ckpt.as_ref().map(|c| c.state.clone())), 0)?;
        if let Some(state) = state {
            if state.model != cfg.model.to_string() {
                return Err(TrainError::Checkpoint {
                    path: ckpt_root,
                    reason: format!("was written for model {}, not {}", state.model, cfg.model),
                });
            }
            let all_vars = sorted_vars(&varmap);
            let model =
                checkpoint::broadcast_tensors(comm, 0, ckpt.as_ref().map(|c| &c.model), &device)?;
            checkpoint::restore_vars(&ckpt_root, &all_vars, &model)?;
            let optstate = checkpoint::broadcast_tensors(
                comm,
                0,
                ckpt.as_ref().map(|c| &c.optimizer),
                &device,
            )?;
            dopt.inner_mut().load_state(&optstate)?;
            dopt.inner_mut().set_step_count(state.optimizer_steps);
            dopt.set_steps(state.step);
            first_epoch = state.epoch;
            step = state.step;
            if lead {
                println!(
                    "resumed from {} (epoch {} done, step {})",
                    ckpt_root.display(),
                    state.epoch,
                    state.step
                );
            }
        } else if lead {
            println!(
                "no checkpoint in {}; starting from scratch",
                ckpt_root.display()
            );
        }
    }

    let steps_per_epoch = kolo_data::num_batches(
        DistributedSampler::new(train.len(), world, rank, true, cfg.seed, false)?.num_samples(),
        cfg.batch_size,
        true,
    );
    if cfg.scale_lr && world > 1 {
        let warmup = (cfg.warmup_epochs * steps_per_epoch as f64).round() as u64;
        dopt = dopt.with_schedule(LrSchedule {
            base_lr: cfg.lr,
            scale: world as f64,
            warmup_steps: warmup,
        });
    }

    let mut out = match dir {
        Some(dir) => {
            let csv = if cfg.resume {
                MetricsCsv::open_append(&dir.metrics_csv(), &TRAINING_COLUMNS)?
            } else {
                MetricsCsv::create(&dir.metrics_csv(), &TRAINING_COLUMNS)?
            };
            let tb = match TensorBoardWriter::create(&dir.tensorboard_dir()) {
                Ok(tb) => Some(tb),
                Err(e) => {
                    eprintln!("kolo train: TensorBoard events disabled: {e}");
                    None
                }
            };
            Some(Outputs { dir, csv, tb })
        }
        None => None,
    };
    if lead {
        println!(
            "kolo train: {} on {} ({} train / {} test samples), {} workers ({}) × batch {}, {} lr {}{}",
            cfg.model,
            cfg.dataset,
            train.len(),
            test.len(),
            world,
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

    let mut sampler = DistributedSampler::new(train.len(), world, rank, true, cfg.seed, false)?;
    let eval_sampler = DistributedSampler::eval(test.len(), world, rank)?;
    let mut stats: Vec<EpochStats> = Vec::new();
    let mut seconds_to_88 = None;
    let mut trained_samples = 0usize;
    let mut train_seconds = 0.0;
    let last_epoch = cfg.stop_after.map_or(cfg.epochs, |s| s.min(cfg.epochs));
    let (mut xs, mut ys) = (Vec::new(), Vec::new());

    for epoch in first_epoch..last_epoch {
        sampler.set_epoch(epoch as u64);
        let indices = sampler.indices();
        let mut progress = (lead && cfg.progress)
            .then(|| Progress::new(steps_per_epoch as u64, epoch as u64 + 1, cfg.epochs as u64));
        let t0 = Instant::now();
        let mut loss_sum = 0.0;
        let mut loss_n = 0usize;
        for (i, b) in batches(&indices, cfg.batch_size, true)?.enumerate() {
            train.gather(b, &mut xs, &mut ys)?;
            let x = Tensor::from_slice(&xs, (b.len(), shape[0], shape[1], shape[2]), &device)?;
            let y = Tensor::from_slice(&ys, b.len(), &device)?;
            let model = models::build(
                cfg.model,
                dopt.ddp().var_builder(DType::F32, &device),
                shape,
                classes,
            )?;
            let logits = model.forward(&x, true)?;
            let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
            let mean = check_loss(comm, step, f64::from(loss.to_scalar::<f32>()?))?;
            dopt.backward_step(&loss)?;
            step += 1;
            loss_sum += mean;
            loss_n += 1;
            if let Some(p) = progress.as_mut() {
                let secs = t0.elapsed().as_secs_f64().max(1e-9);
                p.update(
                    i as u64 + 1,
                    mean,
                    ((i + 1) * cfg.batch_size * world) as f64 / secs,
                );
            }
        }
        let epoch_seconds = t0.elapsed().as_secs_f64();
        if let Some(p) = progress.as_mut() {
            p.finish();
        }
        let samples = loss_n * cfg.batch_size * world;
        trained_samples += samples;
        train_seconds += epoch_seconds;

        // Evaluate: every rank its shard, then sum over ranks.
        dopt.ddp().sync_buffers()?;
        let model = models::build(
            cfg.model,
            VarBuilder::from_varmap(&varmap, DType::F32, &device),
            shape,
            classes,
        )?;
        let mut sums = [0.0f64; 3]; // correct, count, loss sum
        for b in batches(&eval_sampler.indices(), 512, false)? {
            test.gather(b, &mut xs, &mut ys)?;
            let x = Tensor::from_slice(&xs, (b.len(), shape[0], shape[1], shape[2]), &device)?;
            let y = Tensor::from_slice(&ys, b.len(), &device)?;
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
        let s = EpochStats {
            epoch: epoch + 1,
            train_loss: loss_sum / loss_n.max(1) as f64,
            test_loss: sums[2] / sums[1].max(1.0),
            test_accuracy: sums[0] / sums[1].max(1.0),
            epoch_seconds,
            samples_per_second: samples as f64 / epoch_seconds.max(1e-9),
        };
        if seconds_to_88.is_none() && s.test_accuracy >= 0.88 {
            seconds_to_88 = Some(started.elapsed().as_secs_f64());
        }
        if let Some(o) = out.as_mut() {
            println!(
                "epoch {:>3}/{}  train loss {:.4}  test loss {:.4}  test acc {:6.2}%  {:6.1} s  {:>8.0} samples/s",
                s.epoch,
                cfg.epochs,
                s.train_loss,
                s.test_loss,
                100.0 * s.test_accuracy,
                s.epoch_seconds,
                s.samples_per_second
            );
            let lr = dopt.inner().learning_rate();
            o.csv.append(&[
                s.epoch as f64,
                step as f64,
                s.train_loss,
                s.test_loss,
                s.test_accuracy,
                s.epoch_seconds,
                s.samples_per_second,
                lr,
            ])?;
            if let Some(tb) = o.tb.as_mut() {
                let scalars = [
                    ("loss/train", s.train_loss as f32),
                    ("loss/test", s.test_loss as f32),
                    ("accuracy/test", s.test_accuracy as f32),
                    ("throughput/samples_per_second", s.samples_per_second as f32),
                ];
                if let Err(e) = tb
                    .add_scalars(s.epoch as i64, &scalars)
                    .and_then(|_| tb.flush())
                {
                    eprintln!("kolo train: TensorBoard events: {e}");
                }
            }
            let series = TrainingSeries::from_csv(&o.dir.metrics_csv())?;
            let title = format!("{} on {} — {} workers", cfg.model, cfg.dataset, world);
            if let Some(w) = kolo_metrics::plot_training(&series, &o.dir.plot_png(), &title)? {
                if epoch == first_epoch {
                    eprintln!("kolo train: plot without text: {w}");
                }
            }
            let all_vars = sorted_vars(&varmap);
            checkpoint::save(
                &o.dir.checkpoint_dir(),
                &all_vars,
                &**dopt.inner(),
                &TrainState {
                    epoch: epoch + 1,
                    step,
                    seed: cfg.seed,
                    optimizer_steps: dopt.inner().step_count(),
                    model: cfg.model.to_string(),
                    dataset: cfg.dataset.to_string(),
                    world_size: world,
                    batch_size: cfg.batch_size,
                },
            )?;
        }
        stats.push(s);
    }

    let summary = Summary {
        config: cfg.clone(),
        world_size: world,
        final_accuracy: stats.last().map_or(0.0, |s| s.test_accuracy),
        samples_per_second: trained_samples as f64 / train_seconds.max(1e-9),
        seconds_to_88,
        total_seconds: started.elapsed().as_secs_f64(),
        run_dir: Some(dir_path),
        epochs: stats,
    };
    if let Some(o) = out.as_ref() {
        let path = o.dir.summary_json();
        let json = serde_json::to_vec_pretty(&summary).map_err(|e| TrainError::Checkpoint {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        std::fs::write(&path, json).map_err(|source| TrainError::Io { path, source })?;
        println!(
            "done: {} epochs, final test accuracy {:.2}%, {:.0} samples/s, {:.1} s{}; outputs in {}",
            summary.epochs.len(),
            100.0 * summary.final_accuracy,
            summary.samples_per_second,
            summary.total_seconds,
            summary
                .seconds_to_88
                .map(|s| format!(", 88% after {s:.1} s"))
                .unwrap_or_default(),
            o.dir.path().display()
        );
    }
    Ok(summary)
}
