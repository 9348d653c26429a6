//! Optimizer-state sharding (ZeRO stage 1), as PyTorch's `ZeroRedundancyOptimizer`.
//!
//! A [`ShardedOptimizer`] partitions the parameters over the ranks ([`partition`]: whole
//! parameters, greedily by element count, the same on every rank). Each rank keeps optimizer
//! state (SGD momentum, AdamW moments, step counts) for its shard only and updates only its
//! shard; after each step every rank broadcasts its updated shard (one flat broadcast per rank),
//! so that every rank holds the full model again.
//!
//! # Gradients
//!
//! Two ways in:
//!
//! - [`ShardedOptimizer::step`] (also [`DynOptimizer::step`]) takes the *averaged* gradients of
//!   every parameter, e.g. those of [`crate::ddp::Ddp::backward`] (bucketed, all-reduced while
//!   backward runs), exactly as PyTorch's `ZeroRedundancyOptimizer` is used with DDP; it reads
//!   only its shard's gradients. This keeps Ddp's overlap of communication with backward and works
//!   inside [`crate::distributed::DistributedOptimizer`] (gradient accumulation, learning-rate
//!   schedule, join mode) unchanged; it is what `kolo train` should use. The cost, compared with
//!   plain DDP: per step the parameters are sent once more (the shard broadcasts, the volume of an
//!   all-gather), so about 3·(N−1)/N·P values per rank instead of 2·(N−1)/N·P.
//! - [`ShardedOptimizer::reduce_scatter_step`] takes *local* gradients and reduce-scatters them,
//!   so each rank receives only its shard's sum: 2·(N−1)/N·P values per rank, as plain DDP, but
//!   without overlap with backward, gradient accumulation or join mode.
//!
//! Either way the full gradients are held on every rank during backward (sharding them is ZeRO
//! stage 2).
//!
//! # Checkpoints
//!
//! Checkpoints hold the *full* state, in the layout of an unsharded optimizer (see the
//! [module docs](super)): [`DynOptimizer::gather_state`] (a collective, call it on every rank)
//! gathers the shards onto rank 0, and [`OptimizerState::load_state`] takes that full state on
//! every rank and keeps its own shard. So a checkpoint written sharded resumes sharded or unsharded,
//! with the same or another number of ranks, and an unsharded checkpoint resumes sharded.
//! [`OptimizerState::state`] alone returns only this rank's shard (it cannot communicate); a
//! checkpoint saved from it does not load (the other shards' names are missing).

use std::collections::HashMap;
use std::fmt;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var, WithDType};
use kolo::{Communicator, Element};

use super::build::build;
use super::config::{OptimizerConfig, OptimizerKind};
use super::state::{check_state, decode_step, DynOptimizer, OptimizerState, StateSnapshot};
use crate::error::{Result, TrainError};
use crate::vars_comm;

const NAME: &str = "sharded optimizer";

/// Assigns each parameter (by its element count, in `numels`) to one of `world` ranks: parameters
/// sorted by size, largest first (ties by position), each to the rank with the fewest elements so
/// far (ties to the lowest rank). Deterministic, so every rank computes the same partition.
/// Returns the owning rank of each parameter; with `world == 0` every parameter goes to rank 0.
pub fn partition(numels: &[usize], world: usize) -> Vec<usize> {
    let world = world.max(1);
    let mut order: Vec<usize> = (0..numels.len()).collect();
    order.sort_by(|&a, &b| numels[b].cmp(&numels[a]).then(a.cmp(&b)));
    let mut load = vec![0usize; world];
    let mut owner = vec![0usize; numels.len()];
    for i in order {
        let mut best = 0;
        for (r, &l) in load.iter().enumerate() {
            if l < load[best] {
                best = r;
            }
        }
        owner[i] = best;
        load[best] += numels[i];
    }
    owner
}

/// The state names an unsharded optimizer of `config` saves per variable, besides `step.NAME`.
fn state_prefixes(config: &OptimizerConfig) -> &'static [&'static str] {
    match config {
        OptimizerConfig::Sgd(c) if c.momentum != 0.0 => &["momentum"],
        OptimizerConfig::Sgd(_) => &[],
        OptimizerConfig::AdamW(_) => &["exp_avg", "exp_avg_sq"],
    }
}

fn candle_err(e: TrainError) -> candle_core::Error {
    match e {
        TrainError::Candle(e) => e,
        other => candle_core::Error::wrap(other),
    }
}

/// An optimizer whose state is sharded over the ranks of a communicator (ZeRO stage 1; see the
/// [module docs](self)). Implements [`DynOptimizer`], so it goes wherever a
/// `Box<dyn DynOptimizer>` does, e.g. inside [`crate::distributed::DistributedOptimizer`].
///
/// Every rank must build it over the same variables (names, shapes, dtype, order) with the same
/// configuration, and call [`ShardedOptimizer::step`] (and [`DynOptimizer::gather_state`])
/// together: both are collectives.
pub struct ShardedOptimizer {
    comm: Communicator,
    config: OptimizerConfig,
    /// Every variable, in the given order.
    vars: Vec<(String, Var)>,
    /// Owning rank of each variable.
    owner: Vec<usize>,
    /// Per rank, the indices (into `vars`) of its shard, in order.
    shards: Vec<Vec<usize>>,
    /// Elements of each rank's shard.
    counts: Vec<usize>,
    dtype: DType,
    /// The optimizer over this rank's shard.
    local: Box<dyn DynOptimizer>,
    /// Clipping of [`ShardedOptimizer::reduce_scatter_step`]'s gradients, and the last norm.
    max_grad_norm: Option<f64>,
    grad_norm: Option<f64>,
}

impl fmt::Debug for ShardedOptimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedOptimizer")
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .field("config", &self.config)
            .field("vars", &self.vars.len())
            .field("shard_vars", &self.shards[self.comm.rank()].len())
            .field("counts", &self.counts)
            .finish()
    }
}

impl ShardedOptimizer {
    /// Partitions `vars` (name, variable) pairs over the ranks of `comm` and builds, on this rank,
    /// the optimizer of `config` over its shard. Checks that every rank passes the same variables
    /// (names, shapes, dtype); all variables must share one dtype, f32 or f64. A collective.
    pub fn new(
        comm: &Communicator,
        vars: impl Into<Vec<(String, Var)>>,
        config: OptimizerConfig,
    ) -> Result<Self> {
        let vars = vars.into();
        let noun = format!("{NAME}: variable");
        vars_comm::check_same_vars(comm, &vars, &noun)?;
        let dtype = vars_comm::common_float_dtype(&vars, &noun)?;
        let world = comm.size();
        let numels: Vec<usize> = vars.iter().map(|(_, v)| v.elem_count()).collect();
        let owner = partition(&numels, world);
        let mut shards = vec![Vec::new(); world];
        let mut counts = vec![0usize; world];
        for (i, &r) in owner.iter().enumerate() {
            shards[r].push(i);
            counts[r] += numels[i];
        }
        let mine: Vec<(String, Var)> = shards[comm.rank()]
            .iter()
            .map(|&i| vars[i].clone())
            .collect();
        let local = build(mine, config)?;
        Ok(ShardedOptimizer {
            comm: comm.clone(),
            config,
            vars,
            owner,
            shards,
            counts,
            dtype,
            local,
            max_grad_norm: None,
            grad_norm: None,
        })
    }

    /// Clips the gradients of [`ShardedOptimizer::reduce_scatter_step`] to the global L2 norm
    /// `max_norm` (PyTorch's `clip_grad_norm_`): each rank holds its shard's averaged gradients,
    /// so the squares are summed over ranks (one all-reduce of a number) and every rank scales its
    /// shard by the same factor; `None` turns clipping off. (Under
    /// [`DistributedOptimizer`](crate::distributed::DistributedOptimizer), whose Ddp gives every
    /// rank all the averaged gradients, use its `set_max_grad_norm` instead.)
    pub fn set_max_grad_norm(&mut self, max_norm: Option<f64>) -> Result<()> {
        crate::clip::check_max_norm(max_norm)?;
        self.max_grad_norm = max_norm;
        Ok(())
    }

    /// The global gradient norm of the last [`ShardedOptimizer::reduce_scatter_step`] before
    /// clipping (set while clipping is on).
    pub fn last_grad_norm(&self) -> Option<f64> {
        self.grad_norm
    }

    /// The configuration it was built with (the learning rate as given then).
    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// The owning rank of each variable, in the order given to [`ShardedOptimizer::new`].
    pub fn owners(&self) -> &[usize] {
        &self.owner
    }

    /// Names of the variables in this rank's shard.
    pub fn shard_names(&self) -> Vec<&str> {
        self.shards[self.comm.rank()]
            .iter()
            .map(|&i| self.vars[i].0.as_str())
            .collect()
    }

    /// Elements of each rank's shard, in rank order.
    pub fn shard_elements(&self) -> &[usize] {
        &self.counts
    }

    /// The optimizer over this rank's shard.
    pub fn local(&self) -> &dyn DynOptimizer {
        &*self.local
    }

    /// Bytes of optimizer state held by this rank (the tensors of [`OptimizerState::state`]:
    /// its shard's moments or momentum buffers and step counts).
    pub fn state_bytes(&self) -> usize {
        self.local
            .state()
            .iter()
            .map(|(_, t)| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }

    /// Updates this rank's shard from `grads` (averaged over ranks: see the [module docs](self);
    /// variables without a gradient are skipped), then broadcasts the updated shards so that every
    /// rank holds every variable's new value. A collective.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.local.step(grads)?;
        self.all_gather_vars()
    }

    /// ZeRO's own gradient path, without [`crate::ddp::Ddp`]: `grads` are this rank's *local*
    /// gradients (e.g. of `loss.backward()`); one reduce-scatter leaves each rank the gradients of
    /// its shard summed over ranks, which are divided by the number of ranks (a rank without a
    /// gradient for a variable counts as zeros; a variable no rank has a gradient for is skipped)
    /// and written into `grads`; then as [`ShardedOptimizer::step`]. Communication per step is
    /// that of one all-reduce (reduce-scatter plus the shard broadcasts), against one all-reduce
    /// plus the broadcasts with Ddp's averaged gradients, but nothing overlaps backward and there
    /// is no gradient accumulation or join mode. A collective.
    pub fn reduce_scatter_step(&mut self, grads: &mut GradStore) -> Result<()> {
        match self.dtype {
            DType::F64 => self.reduce_scatter_as::<f64>(grads)?,
            _ => self.reduce_scatter_as::<f32>(grads)?,
        }
        if let Some(m) = self.max_grad_norm {
            let mine = || {
                self.shards[self.comm.rank()]
                    .iter()
                    .map(|&i| &self.vars[i].1)
            };
            let squared = crate::clip::squared_norm(grads, mine())?;
            let total = crate::distributed::reduce_value(&self.comm, squared, kolo::ReduceOp::Sum)?;
            self.grad_norm = Some(crate::clip::scale_to(grads, mine(), total, m)?);
        }
        self.step(grads)
    }

    fn reduce_scatter_as<T: Element + WithDType>(&self, grads: &mut GradStore) -> Result<()> {
        let world = self.comm.size();
        let rank = self.comm.rank();
        // Block r: rank r's shard (padded to the largest), then one presence flag per variable.
        let values = self.counts.iter().copied().max().unwrap_or(0);
        let flags = self.shards.iter().map(Vec::len).max().unwrap_or(0);
        let block = values + flags;
        let mut send = vec![T::zeroed(); world * block];
        for (r, shard) in self.shards.iter().enumerate() {
            let mut at = r * block;
            for (j, &i) in shard.iter().enumerate() {
                let var = &self.vars[i].1;
                let n = var.elem_count();
                if let Some(g) = grads.get(var.as_tensor()) {
                    let g = g.flatten_all()?.to_dtype(self.dtype)?.to_vec1::<T>()?;
                    if g.len() != n {
                        return Err(candle_core::Error::Msg(format!(
                            "{NAME}: gradient of `{}` has {} values, the variable {n}",
                            self.vars[i].0,
                            g.len()
                        ))
                        .into());
                    }
                    send[at..at + n].copy_from_slice(&g);
                    send[r * block + values + j] = T::from_f64(1.0);
                }
                at += n;
            }
        }
        let mut recv = vec![T::zeroed(); block];
        if world > 1 {
            self.comm
                .reduce_scatter(&send, &mut recv, kolo::ReduceOp::Sum)?;
        } else {
            recv.copy_from_slice(&send);
        }
        drop(send);
        let mut at = 0;
        for (j, &i) in self.shards[rank].iter().enumerate() {
            let var = &self.vars[i].1;
            let n = var.elem_count();
            if recv[values + j].to_f64() > 0.0 {
                let g = Tensor::from_slice(&recv[at..at + n], var.shape(), var.device())?
                    .affine(1.0 / world as f64, 0.0)?;
                grads.insert(var.as_tensor(), g);
            } else {
                grads.remove(var.as_tensor());
            }
            at += n;
        }
        Ok(())
    }

    /// Copies every rank's shard of the variables to all ranks: one flat broadcast per rank of
    /// its shard, so that besides the variables themselves this needs memory for one shard at a
    /// time (an all-gather would need the whole model once more).
    fn all_gather_vars(&self) -> Result<()> {
        if self.comm.size() <= 1 {
            return Ok(());
        }
        for (r, shard) in self.shards.iter().enumerate() {
            let vars: Vec<&Var> = shard.iter().map(|&i| &self.vars[i].1).collect();
            match self.dtype {
                DType::F64 => vars_comm::broadcast_vars::<f64>(&self.comm, &vars, r)?,
                _ => vars_comm::broadcast_vars::<f32>(&self.comm, &vars, r)?,
            }
        }
        Ok(())
    }

    /// The names an unsharded optimizer's state has, in variable order.
    fn full_state_names(&self) -> Vec<String> {
        let prefixes = state_prefixes(&self.config);
        let mut out = Vec::with_capacity(self.vars.len() * (1 + prefixes.len()));
        for (name, _) in &self.vars {
            out.push(format!("step.{name}"));
            for p in prefixes {
                out.push(format!("{p}.{name}"));
            }
        }
        out
    }

    /// Gathers every rank's shard of the state onto rank 0: `Some` full state there (in the layout of
    /// an unsharded optimizer, variable order), `None` elsewhere. A collective.
    pub fn gather_full_state(&self) -> Result<Option<StateSnapshot>> {
        let step_count = self.local.step_count();
        if self.comm.size() <= 1 {
            return Ok(Some(StateSnapshot {
                tensors: self.local.state(),
                step_count,
            }));
        }
        match self.dtype {
            DType::F64 => self.gather_as::<f64>(step_count),
            _ => self.gather_as::<f32>(step_count),
        }
    }

    fn gather_as<T: Element + WithDType>(&self, step_count: u64) -> Result<Option<StateSnapshot>> {
        // Step counts travel in the metadata (exact u64), the other tensors as one flat buffer.
        let mut steps: Vec<(String, u64)> = Vec::new();
        let mut shapes: Vec<(String, Vec<usize>)> = Vec::new();
        let mut flat = Vec::new();
        for (name, t) in self.local.state() {
            if name.starts_with("step.") {
                steps.push((name.clone(), decode_step(NAME, &name, &t)?));
            } else {
                shapes.push((name, t.dims().to_vec()));
                flat.push(t.flatten_all()?.to_dtype(self.dtype)?);
            }
        }
        let send: Vec<T> = if flat.is_empty() {
            Vec::new()
        } else {
            Tensor::cat(&flat, 0)?.to_vec1::<T>()?
        };
        let meta = self.comm.all_gather_object(&(steps, shapes))?;
        let counts: Vec<usize> = meta
            .iter()
            .map(|(_, s)| s.iter().map(|(_, d)| d.iter().product::<usize>()).sum())
            .collect();
        let root = self.comm.rank() == 0;
        let mut recv = vec![T::zeroed(); if root { counts.iter().sum() } else { 0 }];
        self.comm.gather_v(&send, &mut recv, &counts, 0)?;
        if !root {
            return Ok(None);
        }
        let device = self
            .vars
            .first()
            .map_or(candle_core::Device::Cpu, |(_, v)| v.device().clone());
        let all = Tensor::from_vec(recv, counts.iter().sum::<usize>(), &device)?;
        let mut by_name: HashMap<String, Tensor> = HashMap::new();
        let mut at = 0;
        for (steps, shapes) in meta {
            for (name, step) in steps {
                by_name.insert(name, Tensor::new(step as f64, &device)?);
            }
            for (name, dims) in shapes {
                let n: usize = dims.iter().product();
                by_name.insert(name, all.narrow(0, at, n)?.reshape(dims)?);
                at += n;
            }
        }
        let mut tensors = Vec::with_capacity(by_name.len());
        for name in self.full_state_names() {
            let Some(t) = by_name.remove(&name) else {
                return Err(candle_core::Error::Msg(format!(
                    "{NAME}: no rank sent state `{name}`"
                ))
                .into());
            };
            tensors.push((name, t));
        }
        Ok(Some(StateSnapshot {
            tensors,
            step_count,
        }))
    }

    /// Checks a full state (every variable's names and shapes, so that every rank reaches the same
    /// verdict) and returns the entries of this rank's shard.
    fn shard_of(
        &self,
        state: &HashMap<String, Tensor>,
    ) -> candle_core::Result<HashMap<String, Tensor>> {
        let vars = self.vars.iter().map(|(name, var)| (name.as_str(), var));
        let checked = check_state(NAME, vars, state_prefixes(&self.config), state)?;
        let rank = self.comm.rank();
        Ok(checked
            .into_iter()
            .zip(&self.owner)
            .filter(|&(_, &owner)| owner == rank)
            .flat_map(|((_, entries), _)| entries)
            .map(|(key, t)| (key, t.clone()))
            .collect())
    }
}

impl OptimizerState for ShardedOptimizer {
    /// This rank's shard of the state only (see [`DynOptimizer::gather_state`] for checkpoints).
    fn state(&self) -> Vec<(String, Tensor)> {
        self.local.state()
    }

    fn is_shard(&self) -> bool {
        true
    }

    /// Takes the *full* state of every variable (as an unsharded optimizer or
    /// [`DynOptimizer::gather_state`] saves it, from any number of ranks), checks all of it and
    /// keeps this rank's shard. Not a collective.
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> candle_core::Result<()> {
        let mine = self.shard_of(state)?;
        self.local.load_state(&mine)
    }

    fn step_count(&self) -> u64 {
        self.local.step_count()
    }

    fn set_step_count(&mut self, n: u64) {
        self.local.set_step_count(n);
    }
}

impl DynOptimizer for ShardedOptimizer {
    /// [`ShardedOptimizer::step`] (a collective).
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        ShardedOptimizer::step(self, grads).map_err(candle_err)
    }

    fn learning_rate(&self) -> f64 {
        self.local.learning_rate()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.local.set_learning_rate(lr);
    }

    fn kind(&self) -> OptimizerKind {
        self.config.kind()
    }

    /// [`ShardedOptimizer::gather_full_state`] (a collective): `Some` on rank 0 only.
    fn gather_state(&self) -> candle_core::Result<Option<StateSnapshot>> {
        self.gather_full_state().map_err(candle_err)
    }
}
