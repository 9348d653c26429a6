//! The training loop behind `kolo train`: every rank loads the data, takes its shard through a
//! [`DistributedSampler`], trains a replica with [`Ddp`](kolo_ddp::ddp::Ddp) and a
//! [`DistributedOptimizer`](kolo_ddp::distributed::DistributedOptimizer), and evaluates
//! its shard of the test set; rank 0 shows progress, writes metrics (CSV, TensorBoard), the plot, the
//! checkpoints and a summary into the run directory.

mod config;
mod elastic;
mod epoch;
mod record;
mod setup;
mod summary;

pub use config::{check_config, LrDecayKind, TrainConfig};
pub use elastic::run_elastic;
pub use summary::{EpochStats, Summary};

use std::time::Instant;

use candle_core::Device;
use kolo::Communicator;
use kolo_data::DistributedSampler;
use kolo_ddp::optim::OptimizerKind;
use kolo_ddp::replicas::Placement;
use kolo_ddp::timeline::Timeline;
use kolo_ddp::vars_comm;

use crate::error::Result;
use epoch::{EpochCtx, Trained};
use record::Recorder;

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
    let out = train_on(comm, cfg, device);
    // An error of this rank alone (its files, its optimizer step) fails the peers at once with its
    // reason, not only "rank 0 has closed its communicator" (or, where the rank lives on, the wait
    // for it until the timeout).
    if let Err(e) = &out {
        if comm.failure().is_none() {
            comm.abort(&e.to_string());
        }
    }
    out
}

fn train_on(comm: &Communicator, cfg: &TrainConfig, device: &Device) -> Result<Summary> {
    config::check_config(cfg)?;
    let (rank, world) = (comm.rank(), comm.size());
    let place = Placement::new(rank, world, cfg.replicas)?;
    let started = Instant::now();
    let timeline = match &cfg.timeline {
        Some(path) => Timeline::create(comm, path)?,
        None => Timeline::disabled(),
    };

    let (train, test) = setup::load_data(cfg)?;
    cfg.precision.apply(device)?;
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
        // Replicas that drifted apart train different models: stop, naming them.
        dopt.ddp().check_replicas()?;
        let buffers_agreed = vars_comm::same_on_every_rank(comm, dopt.ddp().buffers())?;
        dopt.ddp().sync_buffers()?;
        let (test_loss, test_accuracy) =
            epoch::evaluate(comm, cfg, device, &varmap, &test, &eval_sampler)?;
        drop(eval_span);
        let s = EpochStats {
            epoch: epoch + 1,
            train_loss: loss,
            test_loss,
            test_accuracy,
            buffers_agreed,
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
            let state = record::train_state(cfg, epoch + 1, step, dopt.inner().step_count(), world);
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

    let held: usize = dopt
        .inner()
        .state()
        .iter()
        .map(|(_, t)| t.elem_count() * t.dtype().size_in_bytes())
        .sum();
    let mut gathered = vec![0i64; world];
    comm.all_gather(&[held as i64], &mut gathered)?;
    let optimizer_state_bytes = gathered.iter().map(|&b| b as u64).collect();
    let stragglers = match world {
        1 => None,
        // Over every collective the record holds (one in eight of them timed).
        _ => Some(comm.stragglers(kolo::flight::DEFAULT_RECORDS)?),
    };
    let summary = Summary {
        stragglers,
        optimizer_state_bytes,
        config: cfg.clone(),
        world_size: world,
        final_accuracy: stats.last().map_or(0.0, |s| s.test_accuracy),
        samples_per_second: trained_samples as f64 / train_seconds.max(1e-9),
        seconds_to_target,
        total_seconds: started.elapsed().as_secs_f64(),
        run_dir: Some(dir_path),
        epochs: stats,
        reconfigurations: Vec::new(),
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
        "kolo train: {} on {} ({} train / {} test samples), {} ({}) × batch {}, {} lr {}{}{}",
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
        },
        match cfg.lr_decay {
            LrDecayKind::Constant => String::new(),
            LrDecayKind::Cosine => format!(", cosine decay to {}", cfg.min_lr),
            LrDecayKind::Step =>
                format!(", × {} every {} epochs", cfg.lr_gamma, cfg.lr_step_epochs),
        }
    );
    precision_note(cfg);
}

/// Under `--precision bf16`, rank 0's line on what bf16 computes on this CPU.
fn precision_note(cfg: &TrainConfig) {
    if cfg.precision == kolo_ddp::precision::Precision::Bf16
        && matches!(cfg.device, kolo_ddp::device::DeviceKind::Cpu)
    {
        match kolo_nn::ops::bf16_compute_note() {
            Ok(note) => println!("{note}"),
            Err(e) => println!("bf16: {e}"),
        }
    }
}
