//! `kolo train --fault-tolerant`: training that goes on when a worker is lost.
//!
//! Each step runs on the current generation of a [`kolo::elastic::ElasticWorld`]. When a collective
//! fails (a peer died), every survivor keeps what it has — parameters and optimizer state as of its
//! last completed step — and reconfigures: the survivors agree on the next generation, and the one
//! that got furthest (a step's all-reduce may have completed on some ranks and not others) hands
//! its parameters, optimizer state and place in the epoch to all. A restarted worker asks to join;
//! the members see it at the next step boundary, reconfigure with it, and it receives the same.
//! Nothing is reloaded from disk.
//!
//! The data order is one permutation per epoch; each step takes the next `size × batch` samples
//! of it and rank `r` its `r`-th share, so a change of size re-partitions the rest of the epoch:
//! no sample is skipped or repeated (the samples of a step lost to a fault are taken again). The
//! gradient average follows the live world size; `--scale-lr` follows it too.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use kolo::elastic::ElasticWorld;
use kolo::Communicator;
use kolo_data::{Dataset, DistributedSampler};
use kolo_ddp::distributed::{check_loss, DistributedOptimizer};
use kolo_ddp::elastic::{self, Kept};
use kolo_ddp::optim::DynOptimizer;
use kolo_ddp::TrainError;
use kolo_metrics::RunDir;
use serde::{Deserialize, Serialize};

use super::config::{self, TrainConfig};
use super::record::{self, Recorder};
use super::{epoch, setup, EpochStats, Summary};
use crate::error::{Result, RunError};

type Opt = DistributedOptimizer<Box<dyn DynOptimizer>>;

/// Where training is, handed from the furthest survivor to every member after a reconfiguration.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Position {
    /// Commits so far (steps and finished epochs): the furthest member has the most.
    progress: u64,
    epoch: usize,
    /// Samples of this epoch's order trained on.
    consumed: usize,
    /// Optimizer steps.
    step: u64,
    loss_sum: f64,
    loss_steps: usize,
    /// Seconds of training in this epoch (wall time of its steps, over generations).
    seconds: f64,
    samples: usize,
    epochs: Vec<EpochStats>,
    /// One line per reconfiguration.
    events: Vec<String>,
    /// The metrics CSV's rows so far (see [`record_epoch`]).
    rows: Vec<Vec<f64>>,
}

/// Trains fault-tolerantly according to `cfg` (`cfg.fault_tolerant`) on the world `join` gives
/// (called once the data is loaded, so that a restarted worker keeps no one waiting); every member
/// of the last generation returns the summary, and its rank 0 writes `summary.json` into `cfg.out`.
pub fn run_elastic(
    join: impl FnOnce() -> kolo::Result<ElasticWorld>,
    cfg: &TrainConfig,
) -> Result<Summary> {
    config::check_config(cfg)?;
    let (train, test) = setup::load_data(cfg)?;
    // The CPU: a rank's GPU would change with each generation.
    let device = cfg.device.device((0, 0))?;
    cfg.precision.apply(&device)?;
    let varmap = setup::new_varmap(cfg, &device, train.shape, train.num_classes)?;
    let world = &mut join()?;
    let started = Instant::now();
    let mut pos = Position::default();
    let mut kept: Kept<()> = Kept::default();
    if world.comm().rank() == 0 {
        println!(
            "kolo train: {} on {} ({} train / {} test samples), fault-tolerant, {} workers \
             (at least {}) × batch {}, {} lr {}",
            cfg.model,
            cfg.dataset,
            train.len(),
            test.len(),
            world.comm().size(),
            cfg.min_workers,
            cfg.batch_size,
            cfg.optimizer,
            cfg.lr
        );
        super::precision_note(cfg);
    }
    loop {
        let generation = (|| -> Result<bool> {
            let mut dopt = handover(world.comm(), cfg, &varmap, &mut pos, &kept, train.len())?;
            let done = train_generation(
                world, cfg, &device, &train, &test, &varmap, &mut dopt, &mut pos,
            );
            // Whatever happened, keep this member's optimizer state as of its last step.
            kept = Kept {
                optimizer_state: dopt.inner().state(),
                optimizer_steps: dopt.inner().step_count(),
                ..Kept::default()
            };
            done
        })();
        let why = match generation {
            Ok(true) => break,
            Ok(false) => "a worker asked to join".to_string(),
            Err(RunError::Train(TrainError::Comm(e))) => e.to_string(),
            Err(e) => return Err(e),
        };
        let change = world.reconfigure()?;
        let line = format!(
            "generation {}: {} workers ({}{}) after: {why}",
            change.generation,
            change.size,
            if change.lost.is_empty() {
                String::new()
            } else {
                format!("lost members {:?}", change.lost)
            },
            if change.joined.is_empty() {
                String::new()
            } else {
                format!(
                    "{}joined members {:?}",
                    if change.lost.is_empty() { "" } else { ", " },
                    change.joined
                )
            }
        );
        if change.rank == 0 {
            println!("kolo train: {line}");
        }
        pos.events.push(line);
    }
    let comm = world.comm();
    let summary = Summary {
        config: cfg.clone(),
        world_size: comm.size(),
        final_accuracy: pos.epochs.last().map_or(0.0, |s| s.test_accuracy),
        samples_per_second: pos
            .epochs
            .iter()
            .map(|e| e.samples_per_second * e.epoch_seconds)
            .sum::<f64>()
            / pos
                .epochs
                .iter()
                .map(|e| e.epoch_seconds)
                .sum::<f64>()
                .max(1e-9),
        seconds_to_target: None,
        total_seconds: started.elapsed().as_secs_f64(),
        run_dir: cfg.out.clone(),
        optimizer_state_bytes: Vec::new(),
        stragglers: None,
        epochs: pos.epochs.clone(),
        reconfigurations: pos.events.clone(),
    };
    if comm.rank() == 0 {
        if let Some(dir) = &cfg.out {
            let path = dir.join("summary.json");
            let io = |source| kolo_metrics::MetricsError::Io {
                path: path.clone(),
                source,
            };
            std::fs::create_dir_all(dir).map_err(io)?;
            let text = serde_json::to_string_pretty(&summary).unwrap_or_default();
            std::fs::write(&path, text).map_err(io)?;
        }
    }
    Ok(summary)
}

/// Makes every member of the new generation start from the furthest member's state
/// ([`kolo_ddp::elastic::handover`]) and wraps the parameters in DDP on the new communicator.
fn handover(
    comm: &Communicator,
    cfg: &TrainConfig,
    varmap: &VarMap,
    pos: &mut Position,
    kept: &Kept<()>,
    train_len: usize,
) -> Result<Opt> {
    let mine = Kept {
        progress: pos.progress,
        position: pos.clone(),
        optimizer_state: kept.optimizer_state.clone(),
        optimizer_steps: kept.optimizer_steps,
    };
    let got = elastic::handover(comm, varmap, &mine)?;
    *pos = got.position;
    // Every member now holds the same parameters: DDP's own broadcast from rank 0 changes nothing.
    let dopt = setup::wrap(comm, cfg, varmap)?;
    let steps_per_epoch = train_len.div_ceil(cfg.batch_size * comm.size()).max(1);
    let mut dopt = setup::schedule(cfg, comm.size(), steps_per_epoch, dopt);
    if !got.optimizer_state.is_empty() {
        dopt.inner_mut().load_state(&got.optimizer_state)?;
    }
    dopt.inner_mut().set_step_count(got.optimizer_steps);
    dopt.set_steps(pos.step);
    Ok(dopt)
}

/// Trains until every epoch is done (`true`), a worker asks to join (`false`), or a collective
/// fails (the error).
#[allow(clippy::too_many_arguments)]
fn train_generation(
    world: &mut ElasticWorld,
    cfg: &TrainConfig,
    device: &Device,
    train: &Dataset,
    test: &Dataset,
    varmap: &VarMap,
    dopt: &mut Opt,
    pos: &mut Position,
) -> Result<bool> {
    let comm = world.comm().clone();
    let (rank, size) = (comm.rank(), comm.size());
    let shape = train.shape;
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    // Built once for the generation: its world, and so its DDP, stay the same until it ends.
    let model = epoch::train_model(cfg, dopt, device, (shape, train.num_classes), &comm)?;
    while pos.epoch < cfg.epochs {
        let order =
            kolo_data::rng::permutation(train.len(), cfg.seed.wrapping_add(pos.epoch as u64));
        loop {
            let global = (cfg.batch_size * size).min(order.len() - pos.consumed);
            // The last few samples of an epoch, fewer than the workers, are left out.
            if global < size {
                break;
            }
            if world.grow_requested()? {
                return Ok(false);
            }
            let t = Instant::now();
            let (lo, hi) = (global * rank / size, global * (rank + 1) / size);
            let mine = &order[pos.consumed + lo..pos.consumed + hi];
            train.gather(mine, &mut xs, &mut ys)?;
            let x = Tensor::from_slice(&xs, (mine.len(), shape[0], shape[1], shape[2]), device)?;
            let x = epoch::compute_input(cfg, x, device)?;
            let y = Tensor::from_slice(&ys, mine.len(), device)?;
            let logits = model.forward(&x, true)?.to_dtype(DType::F32)?;
            let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
            let mean = check_loss(&comm, pos.step, f64::from(loss.to_scalar::<f32>()?))?;
            dopt.backward_step(&loss)?;
            // Committed: the step is this member's from here on.
            pos.progress += 1;
            pos.step += 1;
            pos.consumed += global;
            pos.samples += global;
            pos.loss_sum += mean;
            pos.loss_steps += 1;
            pos.seconds += t.elapsed().as_secs_f64();
        }
        // Replicas that drifted apart train different models: stop, naming them.
        dopt.ddp().check_replicas()?;
        dopt.ddp().sync_buffers()?;
        let eval_sampler = DistributedSampler::eval(test.len(), size, rank)?;
        let (test_loss, test_accuracy) =
            epoch::evaluate(&comm, cfg, device, varmap, test, &eval_sampler)?;
        let s = EpochStats {
            epoch: pos.epoch + 1,
            train_loss: pos.loss_sum / pos.loss_steps.max(1) as f64,
            test_loss,
            test_accuracy,
            buffers_agreed: None,
            epoch_seconds: pos.seconds,
            samples_per_second: pos.samples as f64 / pos.seconds.max(1e-9),
        };
        if rank == 0 {
            println!(
                "epoch {}/{}: train loss {:.4}, test loss {:.4}, accuracy {:.2} %, {:.0} samples/s, {} workers",
                s.epoch,
                cfg.epochs,
                s.train_loss,
                s.test_loss,
                100.0 * s.test_accuracy,
                s.samples_per_second,
                size
            );
        }
        let lr = dopt.inner().learning_rate();
        if rank == 0 {
            record_epoch(cfg, pos, &s, varmap, dopt, (size, lr))?;
        }
        pos.rows.push(record::row(&s, pos.step, lr));
        pos.epochs.push(s);
        pos.progress += 1;
        pos.epoch += 1;
        pos.consumed = 0;
        pos.loss_sum = 0.0;
        pos.loss_steps = 0;
        pos.seconds = 0.0;
        pos.samples = 0;
    }
    Ok(true)
}

/// Rank 0's outputs of an epoch, those of `kolo train`: the metrics CSV (rewritten from the rows
/// handed over, so that a rank 0 of a later generation — another process, perhaps on another
/// host — writes the whole history), TensorBoard's scalars, the plot and a checkpoint.
fn record_epoch(
    cfg: &TrainConfig,
    pos: &Position,
    s: &EpochStats,
    varmap: &VarMap,
    dopt: &Opt,
    (size, lr): (usize, f64),
) -> Result<()> {
    let Some(out) = &cfg.out else {
        return Ok(());
    };
    std::fs::create_dir_all(out).map_err(|source| TrainError::Io {
        path: out.clone(),
        source,
    })?;
    let fresh = TrainConfig {
        resume: false,
        ..cfg.clone()
    };
    let workers = format!("{size} workers, fault-tolerant");
    let mut rec = Recorder::open(RunDir::from_path(out), &fresh, workers)?;
    rec.replay(&pos.rows)?;
    let state = record::train_state(cfg, s.epoch, pos.step, dopt.inner().step_count(), size);
    // Local: fault-tolerant training refuses a sharded optimizer, whose gathering is collective.
    match dopt.inner().gather_state()? {
        Some(snapshot) => rec.epoch(cfg, s, &state, varmap, lr, &snapshot),
        None => Ok(()),
    }
}
