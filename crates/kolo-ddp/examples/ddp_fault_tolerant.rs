//! A data-parallel loop of your own that survives a lost worker: `kolo::elastic::ElasticWorld` for
//! the communicator, `kolo_ddp::elastic::handover` for the state, on Fashion-MNIST.
//!
//! ```text
//! cargo build --release -p kolo-ddp --example ddp_fault_tolerant
//! kolo run -n 3 --restart-workers --max-restarts 2 -- target/release/examples/ddp_fault_tolerant
//! ```
//!
//! Kill a worker (`kill -9`) while it trains: the others abandon the step, agree on the next
//! generation, take the state of the one that got furthest, and go on at the size left; the worker
//! `kolo run` restarts joins at a step boundary. Each step takes the next `size × 64` samples of the
//! epoch's order, so no sample is skipped or repeated. Exits non-zero unless the last epoch's mean
//! loss is below 0.6.

mod common;

use candle_core::{DType, Device, Module};
use candle_nn::{loss::cross_entropy, VarBuilder, VarMap};
use common::{fashion, mlp, xy};
use kolo::elastic::{ElasticOptions, ElasticWorld};
use kolo_data::Dataset;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::{check_loss, DistributedOptimizer};
use kolo_ddp::elastic::{handover, Kept};
use kolo_ddp::optim::{self, DynOptimizer, OptimizerConfig};
use kolo_ddp::TrainError;
use serde::{Deserialize, Serialize};

const EPOCHS: u64 = 2;
const BATCH: usize = 64;

/// Where the loop is: handed from the furthest member to all after a reconfiguration.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Position {
    epoch: u64,
    /// Samples of this epoch's order trained on.
    done: usize,
    loss_sum: f64,
    steps: usize,
    last_mean: Option<f64>,
}

type Opt = DistributedOptimizer<Box<dyn DynOptimizer>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limit: usize = std::env::args().nth(1).map_or(Ok(12_000), |a| a.parse())?;
    let train = fashion(limit)?;
    let dev = Device::Cpu;
    // ANCHOR: world
    let mut world = match ElasticWorld::from_env(ElasticOptions::default()) {
        Ok(w) => w,
        // Restarted as the others finished: nothing left to do.
        Err(kolo::Error::JobOver { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let varmap = VarMap::new();
    mlp(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?; // creates the parameters
    let mut kept: Kept<Position> = Kept::default();
    loop {
        let mut opt: Option<Opt> = None;
        let outcome = generation(&mut world, &varmap, &train, &dev, &mut kept, &mut opt);
        if let Some(opt) = &opt {
            // This member's optimizer state as of its last step, for the next handover.
            kept.optimizer_state = opt.inner().state();
            kept.optimizer_steps = opt.inner().step_count();
        }
        match outcome {
            Ok(true) => break,
            Ok(false) => {} // a worker asked to join
            Err(TrainError::Comm(e)) => eprintln!("member {}: {e}", world.member()),
            Err(e) => return Err(e.into()),
        }
        let change = world.reconfigure()?;
        if change.rank == 0 {
            println!(
                "generation {}: {} workers (lost {:?}, joined {:?})",
                change.generation, change.size, change.lost, change.joined
            );
        }
    }
    // ANCHOR_END: world
    let mean = kept.position.last_mean.unwrap_or(f64::NAN);
    if world.comm().rank() == 0 {
        println!("done: last epoch's mean loss {mean:.4}");
    }
    if mean.is_nan() || mean >= 0.6 {
        return Err(format!("the last epoch's mean loss {mean:.4} is not below 0.6").into());
    }
    Ok(())
}

/// Trains on the current generation until the last epoch (`true`), a worker asks to join
/// (`false`) or a collective fails.
fn generation(
    world: &mut ElasticWorld,
    varmap: &VarMap,
    train: &Dataset,
    dev: &Device,
    kept: &mut Kept<Position>,
    opt_slot: &mut Option<Opt>,
) -> Result<bool, TrainError> {
    let comm = &world.comm().clone();
    let got = handover(comm, varmap, kept)?;
    (kept.progress, kept.position) = (got.progress, got.position);
    let ddp = Ddp::new(comm, varmap, DdpOptions::default())?;
    let model = mlp(ddp.var_builder(DType::F32, dev))?;
    let mut sgd = optim::build(ddp.params(), OptimizerConfig::sgd(0.1, 0.9))?;
    if !got.optimizer_state.is_empty() {
        sgd.load_state(&got.optimizer_state)?;
    }
    sgd.set_step_count(got.optimizer_steps);
    let opt = opt_slot.insert(DistributedOptimizer::new(ddp, sgd, 1)?);
    let (rank, size) = (comm.rank(), comm.size());
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    let mut asked_to_join = false;
    while kept.position.epoch < EPOCHS && !asked_to_join {
        let order = kolo_data::rng::permutation(train.len(), kept.position.epoch);
        loop {
            let p = &mut kept.position;
            let global = (BATCH * size).min(order.len() - p.done);
            if global < size {
                break; // the epoch's last few samples, fewer than the workers
            }
            // ANCHOR: step
            // Agreed by all: a restarted worker waits to join.
            if world.grow_requested()? {
                asked_to_join = true;
                break;
            }
            let mine = &order[p.done + global * rank / size..p.done + global * (rank + 1) / size];
            let (x, y) = xy(train, mine, &mut xs, &mut ys, dev).map_err(|e| {
                TrainError::InvalidArgument {
                    arg: "batch",
                    reason: e.to_string(),
                }
            })?;
            let loss = cross_entropy(&model.forward(&x)?, &y)?;
            let mean = check_loss(comm, kept.progress, f64::from(loss.to_scalar::<f32>()?))?;
            opt.backward_step(&loss)?;
            // Committed: from here the step is this member's.
            kept.progress += 1;
            (p.done, p.loss_sum, p.steps) = (p.done + global, p.loss_sum + mean, p.steps + 1);
            // ANCHOR_END: step
        }
        if asked_to_join {
            break;
        }
        let p = &mut kept.position;
        let mean = p.loss_sum / p.steps.max(1) as f64;
        if rank == 0 {
            println!("epoch {}: mean loss {mean:.4} on {size} workers", p.epoch);
        }
        *p = Position {
            epoch: p.epoch + 1,
            last_mean: Some(mean),
            ..Position::default()
        };
        kept.progress += 1;
    }
    Ok(!asked_to_join)
}
