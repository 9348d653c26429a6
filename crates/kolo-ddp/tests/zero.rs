//! Optimizer-state sharding (ZeRO stage 1): N ranks with a `ShardedOptimizer` inside
//! `DistributedOptimizer` end, after 5 steps, with the parameters of one process training
//! unsharded on the same global batch — SGD with momentum and weight decay, and AdamW, for
//! N = 1, 2, 3. Each rank holds state for its shard only. Checkpoints hold the full state: a
//! sharded checkpoint resumes sharded (same or another world size) or unsharded, and an unsharded
//! checkpoint resumes sharded, all ending where uninterrupted training does. Also join mode
//! (uneven inputs) and the reduce-scatter gradient path.

mod common;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::{error_text, init, max_relative_difference, on_ranks, params, Params};
use kolo::Config;
use kolo_ddp::checkpoint::{self, TrainState};
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::DistributedOptimizer;
use kolo_ddp::optim::partition;
use kolo_ddp::optim::{
    self, AdamWConfig, DynOptimizer, OptimizerConfig, OptimizerState, SgdConfig, ShardedOptimizer,
};
use kolo_ddp::TrainError;
use kolo_nn::vars::sorted_vars;

const STEPS: usize = 5;
/// Global batch, the same for every world size (divisible by 1, 2 and 3).
const GLOBAL: usize = 12;

/// An MLP with parameters of different sizes: 8 → 16 → 12 → 3.
struct Net {
    fc1: candle_nn::Linear,
    fc2: candle_nn::Linear,
    fc3: candle_nn::Linear,
}

impl Net {
    fn new(vb: VarBuilder) -> candle_core::Result<Net> {
        Ok(Net {
            fc1: candle_nn::linear(8, 16, vb.pp("fc1"))?,
            fc2: candle_nn::linear(16, 12, vb.pp("fc2"))?,
            fc3: candle_nn::linear(12, 3, vb.pp("fc3"))?,
        })
    }

    fn loss(&self, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.fc1.forward(x)?.relu()?;
        let h = self.fc2.forward(&h)?.relu()?;
        candle_nn::loss::cross_entropy(&self.fc3.forward(&h)?, y)
    }
}

/// This rank's share of the deterministic global batch of `step`.
fn batch(step: usize, rank: usize, n: usize) -> candle_core::Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..GLOBAL * 8)
        .map(|i| (((i + 7 * step) as f32) * 0.37).sin())
        .collect();
    let y: Vec<u32> = (0..GLOBAL).map(|i| ((i * 5 + step) % 3) as u32).collect();
    let x = Tensor::from_vec(x, (GLOBAL, 8), &Device::Cpu)?;
    let y = Tensor::from_vec(y, GLOBAL, &Device::Cpu)?;
    let b = GLOBAL / n;
    Ok((x.narrow(0, rank * b, b)?, y.narrow(0, rank * b, b)?))
}

fn sgd() -> OptimizerConfig {
    OptimizerConfig::Sgd(SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.01,
        ..SgdConfig::default()
    })
}

fn adamw() -> OptimizerConfig {
    OptimizerConfig::AdamW(AdamWConfig {
        lr: 0.01,
        weight_decay: 0.01,
        ..AdamWConfig::default()
    })
}

/// One training run of one rank.
#[derive(Clone)]
struct Run {
    sharded: bool,
    config: OptimizerConfig,
    steps: Range<usize>,
    /// Resume from the checkpoint under this directory first.
    resume: Option<PathBuf>,
    /// Save a checkpoint under this directory at the end.
    save: Option<PathBuf>,
}

/// What a rank ends with: its parameters and its optimizer state.
#[derive(Debug)]
struct Outcome {
    params: Params,
    state: Vec<(String, Tensor)>,
    shard: Vec<String>,
}

/// The variables of a [`Net`], random.
fn new_varmap() -> candle_core::Result<VarMap> {
    let varmap = VarMap::new();
    Net::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    Ok(varmap)
}

/// A [`Net`]'s variables, with rank 0's deterministic starting values (the others start from
/// random values), and the Ddp over them.
fn new_ddp(comm: &kolo::Communicator) -> Result<(VarMap, Ddp), TrainError> {
    let varmap = new_varmap()?;
    if comm.rank() == 0 {
        init(&varmap, 0.3)?;
    }
    let ddp = Ddp::new(comm, &varmap, DdpOptions::default())?;
    Ok((varmap, ddp))
}

fn train_rank(comm: &kolo::Communicator, run: &Run) -> Result<Outcome, TrainError> {
    let n = comm.size();
    let (varmap, ddp) = new_ddp(comm)?;
    let vars = ddp.params().to_vec();
    let (opt, shard): (Box<dyn DynOptimizer>, Vec<String>) = if run.sharded {
        let s = ShardedOptimizer::new(comm, vars, run.config)?;
        let shard = s.shard_names().iter().map(|s| s.to_string()).collect();
        (Box::new(s), shard)
    } else {
        let shard = vars.iter().map(|(n, _)| n.clone()).collect();
        (optim::build(vars, run.config)?, shard)
    };
    let mut dopt = DistributedOptimizer::new(ddp, opt, 1)?;
    if let Some(dir) = &run.resume {
        resume(dir, &mut dopt)?;
    }
    for step in run.steps.clone() {
        let net = Net::new(dopt.ddp().var_builder(DType::F32, &Device::Cpu))?;
        let (x, y) = batch(step, comm.rank(), n)?;
        dopt.backward_step(&net.loss(&x, &y)?)?;
    }
    if let Some(dir) = &run.save {
        // Every rank gathers; rank 0 writes (an unsharded optimizer's state is `Some` on every
        // rank: ranks writing the same directory at once race for its files).
        let snapshot = dopt.inner().gather_state()?;
        if let Some(s) = snapshot.filter(|_| comm.rank() == 0) {
            let state = TrainState {
                epoch: 1,
                step: dopt.steps(),
                seed: 0,
                optimizer_steps: s.step_count,
                model: "mlp".into(),
                dataset: "synthetic".into(),
                world_size: n,
                batch_size: GLOBAL / n,
            };
            checkpoint::save(dir, &sorted_vars(&varmap), &s, &state)?;
            // A sharded optimizer itself is one rank's shard: refused, naming what to save instead.
            if dopt.inner().is_shard() {
                let shard = checkpoint::save(dir, &sorted_vars(&varmap), &**dopt.inner(), &state);
                assert!(
                    error_text(shard).contains("gather_state"),
                    "a shard must not be saved as a checkpoint"
                );
            }
        }
    }
    Ok(Outcome {
        params: params(&varmap)?,
        state: dopt.inner().state(),
        shard,
    })
}

/// `DistributedOptimizer::resume`: rank 0 reads, every rank gets model and full optimizer state.
fn resume(
    dir: &Path,
    dopt: &mut DistributedOptimizer<Box<dyn DynOptimizer>>,
) -> Result<(), TrainError> {
    match dopt.resume(dir)? {
        Some(_) => Ok(()),
        None => Err(TrainError::InvalidArgument {
            arg: "dir",
            reason: format!("no checkpoint under {}", dir.display()),
        }),
    }
}

/// `f` on `n` thread-ranks (60 s timeout).
fn ranks<T: Send + std::fmt::Debug>(
    n: usize,
    f: impl Fn(&kolo::Communicator) -> Result<T, TrainError> + Sync,
) -> Vec<T> {
    on_ranks(
        n,
        Config::default().with_timeout(Duration::from_secs(60)),
        |comm| f(&comm),
    )
}

fn run_ranks(n: usize, run: &Run) -> Vec<Outcome> {
    ranks(n, |comm| train_rank(comm, run))
}

fn fresh(sharded: bool, config: OptimizerConfig, steps: Range<usize>) -> Run {
    Run {
        sharded,
        config,
        steps,
        resume: None,
        save: None,
    }
}

/// One process, unsharded, all steps.
fn reference(config: OptimizerConfig) -> Params {
    run_ranks(1, &fresh(false, config, 0..STEPS))
        .remove(0)
        .params
}

fn assert_close(got: &[Outcome], want: &Params, what: &str) {
    for (rank, o) in got.iter().enumerate() {
        let d = max_relative_difference(&o.params, want);
        assert!(d <= 1e-5, "{what} rank {rank}: relative difference {d:e}");
    }
}

#[test]
fn sharded_training_equals_unsharded_training() {
    for (label, config) in [("sgd", sgd()), ("adamw", adamw())] {
        let want = reference(config);
        // The parameters must have moved, or equality would prove nothing.
        let start = run_ranks(1, &fresh(false, config, 0..0)).remove(0).params;
        assert!(max_relative_difference(&start, &want) > 1e-3, "{label}");
        for n in [1, 2, 3] {
            let got = run_ranks(n, &fresh(true, config, 0..STEPS));
            assert_close(&got, &want, &format!("{label} n={n}"));
        }
    }
}

#[test]
fn each_rank_holds_state_for_its_shard_only() {
    let n = 3;
    let full = run_ranks(1, &fresh(false, adamw(), 0..1)).remove(0);
    let numel: HashMap<String, usize> = full
        .params
        .iter()
        .map(|(k, v)| (k.clone(), v.len()))
        .collect();
    let total: usize = numel.values().sum();
    let got = run_ranks(n, &fresh(true, adamw(), 0..1));
    let mut seen = HashSet::new();
    let mut moments = 0;
    for (rank, o) in got.iter().enumerate() {
        assert!(!o.shard.is_empty(), "rank {rank} owns nothing");
        assert!(o.shard.len() < numel.len(), "rank {rank} owns everything");
        // step + exp_avg + exp_avg_sq per variable of the shard, nothing else.
        assert_eq!(o.state.len(), 3 * o.shard.len(), "rank {rank}");
        let mine: usize = o.shard.iter().map(|s| numel[s]).sum();
        let elements: usize = o.state.iter().map(|(_, t)| t.elem_count()).sum();
        assert_eq!(elements, 2 * mine + o.shard.len(), "rank {rank}");
        assert!(mine < total, "rank {rank}");
        for (name, _) in &o.state {
            let var = name.split_once('.').map(|(_, v)| v).unwrap_or_default();
            assert!(o.shard.iter().any(|s| s == var), "rank {rank} holds {name}");
        }
        for s in &o.shard {
            assert!(seen.insert(s.clone()), "{s} is in two shards");
        }
        moments += mine;
    }
    assert_eq!(moments, total);
    assert_eq!(seen.len(), numel.len());
}

/// Trains `first` steps with `save_n` ranks (sharded or not), checkpoints, resumes with
/// `resume_n` ranks (sharded or not) for the remaining steps.
fn interrupted(
    config: OptimizerConfig,
    (save_n, save_sharded): (usize, bool),
    (resume_n, resume_sharded): (usize, bool),
) -> Vec<Outcome> {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("checkpoints");
    let first = 3;
    let mut save = fresh(save_sharded, config, 0..first);
    save.save = Some(root.clone());
    run_ranks(save_n, &save);
    let mut resume = fresh(resume_sharded, config, first..STEPS);
    resume.resume = Some(root);
    run_ranks(resume_n, &resume)
}

#[test]
fn checkpoints_resume_across_sharding_and_world_sizes() {
    for (label, config) in [("sgd", sgd()), ("adamw", adamw())] {
        let want = reference(config);
        for (save, resume) in [
            ((2, true), (2, true)),
            ((2, true), (3, true)),
            ((3, true), (1, false)),
            ((1, false), (3, true)),
            ((3, true), (2, false)),
        ] {
            let got = interrupted(config, save, resume);
            assert_close(
                &got,
                &want,
                &format!("{label} saved {save:?}, resumed {resume:?}"),
            );
        }
    }
}

#[test]
fn a_checkpoint_of_one_shard_does_not_load() {
    let res = kolo::run_local(2, Config::default(), |comm| -> Result<(), TrainError> {
        let vars = sorted_vars(&new_varmap()?);
        let mut s = ShardedOptimizer::new(&comm, vars.clone(), adamw())?;
        let shard: HashMap<String, Tensor> = s.state().into_iter().collect();
        let err = s
            .load_state(&shard)
            .expect_err("a shard is not the full state");
        assert!(err.to_string().contains("missing"), "{err}");
        // The full state of an unsharded optimizer loads; an extra name does not.
        let mut full: HashMap<String, Tensor> =
            optim::build(vars, adamw())?.state().into_iter().collect();
        s.load_state(&full)?;
        full.insert("exp_avg.nothing".into(), Tensor::new(0f32, &Device::Cpu)?);
        let err = s.load_state(&full).expect_err("unknown name");
        assert!(err.to_string().contains("unknown state"), "{err}");
        Ok(())
    });
    for r in res {
        r.expect("rank thread").expect("rank result");
    }
}

/// Join mode (uneven inputs): rank r has 2 + r batches, then joins.
fn join_rank(
    comm: &kolo::Communicator,
    sharded: bool,
    config: OptimizerConfig,
) -> Result<Params, TrainError> {
    let n = comm.size();
    let (varmap, ddp) = new_ddp(comm)?;
    let vars = ddp.params().to_vec();
    let opt: Box<dyn DynOptimizer> = if sharded {
        Box::new(ShardedOptimizer::new(comm, vars, config)?)
    } else {
        optim::build(vars, config)?
    };
    let mut dopt = DistributedOptimizer::new(ddp, opt, 1)?;
    dopt.set_join(true);
    for step in 0..2 + comm.rank() {
        let net = Net::new(dopt.ddp().var_builder(DType::F32, &Device::Cpu))?;
        let (x, y) = batch(step, comm.rank(), n)?;
        dopt.backward_step(&net.loss(&x, &y)?)?;
    }
    dopt.join()?;
    assert_eq!(dopt.steps(), 2 + n as u64 - 1);
    Ok(params(&varmap)?)
}

#[test]
fn join_mode_with_uneven_inputs_matches_unsharded_join() {
    for (label, config) in [("sgd", sgd()), ("adamw", adamw())] {
        let run = |sharded: bool| ranks(3, |comm| join_rank(comm, sharded, config));
        let want = run(false);
        let start = run_ranks(1, &fresh(false, config, 0..0)).remove(0).params;
        assert!(max_relative_difference(&start, &want[0]) > 1e-3, "{label}");
        for (rank, got) in run(true).iter().enumerate() {
            let d = max_relative_difference(got, &want[0]);
            assert!(d <= 1e-5, "{label} rank {rank}: relative difference {d:e}");
        }
    }
}

/// Without Ddp: local gradients, reduce-scattered by the sharded optimizer.
fn reduce_scatter_rank(
    comm: &kolo::Communicator,
    config: OptimizerConfig,
) -> Result<Params, TrainError> {
    let varmap = VarMap::new();
    let net = Net::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    init(&varmap, 0.3)?;
    let mut opt = ShardedOptimizer::new(comm, sorted_vars(&varmap), config)?;
    for step in 0..STEPS {
        let (x, y) = batch(step, comm.rank(), comm.size())?;
        let mut grads = net.loss(&x, &y)?.backward()?;
        opt.reduce_scatter_step(&mut grads)?;
    }
    Ok(params(&varmap)?)
}

#[test]
fn reduce_scattered_gradients_equal_unsharded_training() {
    for (label, config) in [("sgd", sgd()), ("adamw", adamw())] {
        let want = reference(config);
        for n in [1, 2, 3] {
            let res = ranks(n, |comm| reduce_scatter_rank(comm, config));
            for (rank, got) in res.into_iter().enumerate() {
                let d = max_relative_difference(&got, &want);
                assert!(
                    d <= 1e-5,
                    "{label} n={n} rank {rank}: relative difference {d:e}"
                );
            }
        }
    }
}

#[test]
fn partition_balances_by_elements_and_is_deterministic() {
    let numels = [100, 10, 60, 50, 5, 40];
    let owner = partition(&numels, 2);
    assert_eq!(owner, partition(&numels, 2));
    let mut load = [0usize; 2];
    for (i, &r) in owner.iter().enumerate() {
        load[r] += numels[i];
    }
    // 100→0, 60→1, 50→1, 40→0, 10→1, 5→1: 140 / 125.
    assert_eq!(load, [140, 125]);
    assert_eq!(partition(&numels, 1), vec![0; 6]);
    assert_eq!(partition(&numels, 0), vec![0; 6]);
    // More ranks than parameters: some ranks own nothing.
    let owner = partition(&[3, 2], 4);
    assert_eq!(owner, vec![0, 1]);
}

/// A checkpoint rank 0 cannot read stops every rank with the reason: the other ranks' errors
/// name rank 0 and say why, not only that rank 0 left.
#[test]
fn an_unreadable_checkpoint_is_an_error_on_every_rank_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_path_buf();
    run_ranks(
        2,
        &Run {
            save: Some(path.clone()),
            ..fresh(false, sgd(), 0..2)
        },
    );
    let latest = std::fs::read_to_string(path.join("latest")).expect("latest");
    let model = path.join(latest.trim()).join("model.safetensors");
    std::fs::write(&model, b"not a safetensors file").expect("overwrite");
    let errors = ranks(2, |comm| -> Result<_, TrainError> {
        let (_varmap, ddp) = new_ddp(comm)?;
        let opt = optim::build(ddp.params().to_vec(), sgd())?;
        let mut dopt = DistributedOptimizer::new(ddp, opt, 1)?;
        Ok(dopt.resume(&path).err().map(|e| e.to_string()))
    });
    for (rank, e) in errors.into_iter().enumerate() {
        let e = e.unwrap_or_else(|| panic!("rank {rank} resumed from a corrupt checkpoint"));
        assert!(e.contains("model.safetensors"), "rank {rank}: {e}");
        assert_eq!(
            e.contains("rank 0 could not read"),
            rank > 0,
            "rank {rank}: {e}"
        );
    }
}
