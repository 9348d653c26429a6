//! `kolo train`: data-parallel training of a model on a dataset, launching its own workers.
//!
//! Without `--worker`, this process is the launcher: it starts N copies of itself (`kolo train
//! --worker ...` with the same options) through the same machinery as `kolo run`, rank 0 writing
//! straight to the terminal (its progress bar) and the others prefixed. With `--worker` (set by the
//! launcher, or when started by torchrun/`mpirun`/`srun`), it joins the job through `kolo::init()` and
//! trains.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use kolo_core::settings::{Env, ProcessEnv};
use kolo_data::DatasetKind;
use kolo_ddp::ddp::{Compression, GradientReduce};
use kolo_ddp::device::DeviceKind;
use kolo_ddp::optim::OptimizerKind;
use kolo_ddp::precision::Precision;
use kolo_models::ModelKind;
use kolo_train::trainer::{self, LrDecayKind, TrainConfig};

use super::error::CliError;

mod replicas;

pub const LONG_ABOUT: &str = "\
Train a model data-parallel on N workers: each worker holds a replica, reads its \
shard of the data (DistributedSampler), and gradients are averaged by all-reduce \
in buckets that overlap backward (DDP).

With no options: LeNet on Fashion-MNIST, 2 workers, 10 epochs, batch 64 per \
worker, SGD lr 0.05 momentum 0.9. Data comes from the standard places \
(Fashion-MNIST: Debian's dataset-fashion-mnist; MNIST and digits: \
scripts/fetch-data.sh; CIFAR-10: --data-dir with the binary version).

Writes into the run directory (--out, default runs/MODEL-DATASET-TIME/): \
metrics.csv, tensorboard/ events, training.png (loss and accuracy per epoch), \
checkpoints/ (every epoch; continue with --resume --out DIR) and summary.json.";

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Number of workers
    #[arg(short = 'n', long = "nproc", visible_alias = "nproc-per-node", value_name = "N",
          default_value = "2", value_parser = parse_positive)]
    nproc: usize,
    #[command(flatten)]
    launch: super::launch_args::LaunchArgs,

    /// Model: lenet, simple-cnn, mlp, resnet18
    #[arg(long, default_value = "lenet")]
    model: ModelKind,
    /// Dataset: fashion-mnist, mnist, cifar10, digits, synthetic
    #[arg(long, default_value = "fashion-mnist")]
    dataset: DatasetKind,
    /// Directory holding the dataset's files
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Epochs
    #[arg(long, default_value = "10", value_parser = parse_positive)]
    epochs: usize,
    /// Batch size per worker
    #[arg(long, default_value = "64", value_parser = parse_positive)]
    batch_size: usize,
    /// Replicas per worker: threads of the worker process, each with its own copy of the model and
    /// its share of every batch, gradients averaged with the other ranks (N × R ranks in all)
    #[arg(long, default_value = "1", value_name = "R", value_parser = parse_positive)]
    replicas: usize,
    /// Gradient compression of the all-reduces: none, fp16, bf16
    #[arg(long, default_value = "none")]
    compression: Compression,
    /// How gradients are combined across workers: average, or adasum (power-of-two worlds)
    #[arg(long, default_value = "average")]
    reduce: GradientReduce,
    /// Shard the optimizer state over the workers (ZeRO stage 1)
    #[arg(long)]
    shard_optimizer: bool,
    /// Compute precision: f32, or bf16 (matrix products in bf16 with f32 sums and f32 master
    /// weights; in f32 on a CPU whose bf16 unit is slower than its f32 units, which it says)
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// Where to train: cpu, or cuda (one GPU per worker, GPU number local rank; needs a build
    /// with the `cuda` feature)
    #[arg(long, default_value = "cpu")]
    device: DeviceKind,
    /// Synchronized BatchNorm: statistics over the batches of all workers (resnet18)
    #[arg(long)]
    sync_bn: bool,
    /// Uneven inputs: no padding of the shards, a rank out of batches joins the others' steps
    #[arg(long)]
    uneven: bool,
    /// Test accuracy in percent whose first epoch is reported as the time to reach it
    #[arg(long, default_value = "88", value_name = "PERCENT")]
    target_accuracy: f64,
    /// Learning rate (of one worker; see --scale-lr)
    #[arg(long, default_value = "0.05")]
    lr: f64,
    /// Optimizer: sgd, adamw
    #[arg(long, default_value = "sgd")]
    optimizer: OptimizerKind,
    /// SGD momentum
    #[arg(long, default_value = "0.9")]
    momentum: f64,
    /// Weight decay
    #[arg(long, default_value = "0")]
    weight_decay: f64,
    /// Seed of the initialization and the data order
    #[arg(long, default_value = "0")]
    seed: u64,
    /// Gradient bucket size in MiB
    #[arg(long, default_value = "25")]
    bucket_mb: f64,
    /// Average gradients after backward instead of overlapping with it
    #[arg(long)]
    no_overlap: bool,
    /// Backward passes per optimizer step (gradient accumulation)
    #[arg(long, default_value = "1", value_parser = parse_positive)]
    backward_passes_per_step: usize,
    /// Multiply the learning rate by the number of workers (linear scaling rule)
    #[arg(long)]
    scale_lr: bool,
    /// Epochs of linear learning-rate warm-up with --scale-lr
    #[arg(long, default_value = "0")]
    warmup_epochs: f64,
    /// What the learning rate does after warm-up: constant; cosine, half a cosine down to --min-lr
    /// at the end of the run (PyTorch's CosineAnnealingLR); step, --lr-gamma times every
    /// --lr-step-epochs epochs (StepLR)
    #[arg(long, default_value = "constant", value_name = "constant|cosine|step")]
    lr_decay: LrDecayKind,
    /// Epochs between the decays of --lr-decay step
    #[arg(long, default_value = "30", value_name = "EPOCHS")]
    lr_step_epochs: f64,
    /// Factor of each decay of --lr-decay step
    #[arg(long, default_value = "0.1")]
    lr_gamma: f64,
    /// The learning rate at the end of a --lr-decay cosine run
    #[arg(long, default_value = "0")]
    min_lr: f64,
    /// Run directory (default: a new directory under runs/)
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Continue from the newest checkpoint in --out DIR
    #[arg(long, requires = "out")]
    resume: bool,
    /// Train on the first N samples only
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    train_limit: Option<usize>,
    /// Evaluate on the first N test samples only
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    test_limit: Option<usize>,
    /// Stop after epoch K (the job can be continued with --resume)
    #[arg(long, value_name = "K")]
    stop_after: Option<usize>,
    /// No progress bar
    #[arg(long)]
    no_progress: bool,
    /// Write a timeline of the job to FILE: a Chrome trace (one process per rank, main and
    /// communication tracks) for Perfetto or chrome://tracing
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// Fault tolerance: when a worker is lost its peers go on at the size left from the last
    /// completed step (no restart, no checkpoint), and the launcher restarts it (up to
    /// --max-restarts times in all) to rejoin at a step boundary
    #[arg(long)]
    fault_tolerant: bool,
    /// With --fault-tolerant: the fewest workers training goes on with
    #[arg(long, default_value = "1", value_name = "N", value_parser = parse_positive, requires = "fault_tolerant")]
    min_workers: usize,
    /// Run as a worker of a job (set by the launcher)
    #[arg(long, hide = true)]
    worker: bool,
}

fn parse_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

impl TrainArgs {
    fn config(&self) -> TrainConfig {
        self.config_in(&ProcessEnv)
    }

    /// The training configuration, with the settings the launcher hands its workers read from `env`.
    fn config_in(&self, env: &impl Env) -> TrainConfig {
        TrainConfig {
            model: self.model,
            dataset: self.dataset,
            data_dir: self.data_dir.clone(),
            epochs: self.epochs,
            batch_size: self.batch_size,
            lr: self.lr,
            optimizer: self.optimizer,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
            seed: self.seed,
            bucket_bytes: (self.bucket_mb * 1024.0 * 1024.0).max(1.0) as usize,
            overlap: !self.no_overlap,
            backward_passes_per_step: self.backward_passes_per_step,
            scale_lr: self.scale_lr,
            warmup_epochs: self.warmup_epochs,
            lr_decay: self.lr_decay,
            lr_step_epochs: self.lr_step_epochs,
            lr_gamma: self.lr_gamma,
            min_lr: self.min_lr,
            // The launcher names the run directory (so that a restarted group finds its checkpoints),
            // and a restarted group resumes from the newest one.
            out: self
                .out
                .clone()
                .or_else(|| env.lookup_os(RUN_DIR_ENV).map(PathBuf::from))
                .or_else(|| self.torchrun_run_dir(env)),
            // A fault-tolerant run's restarted worker gets the state from a live peer instead.
            resume: self.resume || (restart_count(env) > 0 && !self.fault_tolerant),
            train_limit: self.train_limit,
            test_limit: self.test_limit,
            stop_after: self.stop_after,
            progress: !self.no_progress,
            replicas: self.replicas,
            target_accuracy: self.target_accuracy / 100.0,
            uneven: self.uneven,
            sync_bn: self.sync_bn,
            precision: self.precision,
            compression: self.compression,
            reduce: self.reduce,
            shard_optimizer: self.shard_optimizer,
            timeline: self.timeline.clone(),
            device: self.device,
            fault_tolerant: self.fault_tolerant,
            min_workers: self.min_workers,
        }
    }
}

impl TrainArgs {
    /// Under torchrun without `--out`: `runs/MODEL-DATASET-RUN_ID`, the same for every attempt of
    /// the job so that a restarted group finds its checkpoints. torchrun's run id is unique with
    /// `--standalone` or a c10d rendezvous; with the default `none` (static rendezvous) rank 0
    /// makes a fresh directory, and restarts need `--out` to resume.
    fn torchrun_run_dir(&self, env: &impl Env) -> Option<PathBuf> {
        let id = env.lookup("TORCHELASTIC_RUN_ID")?;
        let id = id.trim();
        if id.is_empty() || id == "none" || id.contains('/') {
            return None;
        }
        Some(PathBuf::from("runs").join(format!("{}-{}-{id}", self.model, self.dataset)))
    }
}

fn worker(args: &TrainArgs) -> ExitCode {
    // Every step frees and allocates the same tensors again: keep their pages. `kolo train`'s
    // launcher says so in GLIBC_TUNABLES (with huge pages); under torchrun, mpirun or srun, or
    // where the user's GLIBC_TUNABLES say nothing of malloc, the worker asks malloc itself.
    if !std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
        kolo_nn::memory::keep_freed_memory();
    }
    if args.replicas > 1 {
        return replicas::worker(args.replicas, &args.config());
    }
    if args.fault_tolerant {
        return fault_tolerant_worker(&args.config());
    }
    let comm = match kolo::init() {
        Ok(c) => c,
        Err(e) => {
            report(&format!("kolo train: worker could not join the job: {e}"));
            return ExitCode::FAILURE;
        }
    };
    if train_rank(&comm, &args.config()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A worker of a fault-tolerant job: joins the job's current generation (a restarted worker too)
/// and trains until the last epoch, through the loss and return of workers.
fn fault_tolerant_worker(cfg: &TrainConfig) -> ExitCode {
    let options = kolo::elastic::ElasticOptions {
        min_size: cfg.min_workers,
        ..Default::default()
    };
    match trainer::run_elastic(|| kolo::elastic::ElasticWorld::from_env(options), cfg) {
        Ok(_) => ExitCode::SUCCESS,
        Err(kolo_train::RunError::Train(kolo_ddp::TrainError::Comm(kolo::Error::JobOver {
            ..
        }))) => {
            println!("kolo train: the job finished before this restarted worker could rejoin it");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let rank = std::env::var("RANK").unwrap_or_else(|_| "?".into());
            report(&format!("kolo train: worker {rank}: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// Prints a worker's error and, under torchrun, writes it to the error file for its summary
/// (unless the communicator's own failure, the root cause, was written first).
fn report(msg: &str) {
    eprintln!("{msg}");
    kolo::error_file::record_error(msg);
}

/// Trains on `comm`'s rank; whether it succeeded (a failure is reported).
fn train_rank(comm: &kolo::Communicator, cfg: &TrainConfig) -> bool {
    match trainer::run(comm, cfg) {
        Ok(_) => true,
        Err(e) => {
            report(&format!("kolo train: rank {}: {e}", comm.rank()));
            false
        }
    }
}

/// Environment variable by which the launching `kolo train` hands its workers the run directory.
const RUN_DIR_ENV: &str = "KOLO_TRAIN_RUN_DIR";

/// How many times the launcher restarted the worker group: `kolo run`'s `KOLO_RESTART_COUNT` or
/// torchrun's `TORCHELASTIC_RESTART_COUNT` (a restarted group resumes from its checkpoint).
fn restart_count(env: &impl Env) -> usize {
    ["KOLO_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"]
        .iter()
        .find_map(|v| env.lookup(v))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

pub fn execute(args: TrainArgs) -> ExitCode {
    if args.worker {
        return worker(&args);
    }
    super::finish("train", launch_job(&args))
}

/// Checks the options and starts the workers; returns the job's exit code.
fn launch_job(args: &TrainArgs) -> Result<ExitCode, CliError> {
    if args.sync_bn && !args.model.has_batch_norm() {
        return Err(CliError::Usage(format!(
            "--sync-bn: model {} has no batch norm layers to synchronize (resnet18 has)",
            args.model
        )));
    }
    // Without CUDA in this build every worker would fail the same way: say it once, up front.
    if args.device == DeviceKind::Cuda && !cfg!(feature = "cuda") {
        if let Err(e) = args.device.device((0, 0)) {
            return Err(CliError::Usage(format!("--device cuda: {e}")));
        }
    }
    // On one node the world size is known here (elsewhere every worker checks it).
    if args.launch.nnodes == (1, 1) && !args.launch.on_hosts() {
        args.reduce
            .check_world(args.nproc * args.replicas)
            .map_err(|e| CliError::Usage(e.to_string()))?;
    }
    if args.replicas > args.batch_size {
        return Err(CliError::Usage(format!(
            "--replicas {} is more than the {} samples of a batch (--batch-size): each replica \
             takes a share of every batch of its worker",
            args.replicas, args.batch_size
        )));
    }
    if args.launch.on_hosts() {
        return super::launch_args::execute_hosts("train", args.nproc, &args.launch);
    }
    let run_dir = match &args.out {
        Some(dir) => dir.clone(),
        None => {
            let name = format!("{}-{}", args.model, args.dataset);
            kolo_metrics::RunDir::create(None, std::path::Path::new("runs"), &name)
                .map_err(|e| CliError::Failed(format!("cannot create the run directory: {e}")))?
                .path()
                .to_path_buf()
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let defaults = [
        ("GLIBC_TUNABLES", super::TRAIN_MALLOC_TUNABLES.to_string()),
        // One compute thread per core share (like torch.set_num_threads); replicas share their
        // process's.
        (
            "RAYON_NUM_THREADS",
            (cores / (args.nproc * args.replicas)).max(1).to_string(),
        ),
        (RUN_DIR_ENV, run_dir.to_string_lossy().into_owned()),
    ];
    if args.fault_tolerant {
        // What every worker would refuse, said once.
        trainer::check_config(&args.config()).map_err(|e| CliError::Usage(e.to_string()))?;
        if args.min_workers > args.nproc {
            return Err(CliError::Usage(format!(
                "--min-workers {} is more than the {} workers (-n)",
                args.min_workers, args.nproc
            )));
        }
        let mut launch = args.launch.clone();
        launch.restart_workers = true;
        return super::launch_workers("train", args.nproc, &launch, &defaults);
    }
    super::launch_workers("train", args.nproc, &args.launch, &defaults)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_core::settings::MapEnv;

    #[test]
    fn restarts_are_counted_from_kolo_run_or_torchrun() {
        let env = |pairs: &[(&str, &str)]| pairs.iter().copied().collect::<MapEnv>();
        assert_eq!(restart_count(&env(&[])), 0);
        assert_eq!(restart_count(&env(&[("KOLO_RESTART_COUNT", "2")])), 2);
        assert_eq!(
            restart_count(&env(&[("TORCHELASTIC_RESTART_COUNT", " 3 ")])),
            3
        );
        assert_eq!(
            restart_count(&env(&[
                ("KOLO_RESTART_COUNT", "1"),
                ("TORCHELASTIC_RESTART_COUNT", "5")
            ])),
            1
        );
        assert_eq!(restart_count(&env(&[("KOLO_RESTART_COUNT", "x")])), 0);
    }
}
