//! Optimizers.
//!
//! [`Sgd`] and [`AdamW`] follow PyTorch's `torch.optim.SGD` / `torch.optim.AdamW` update rules
//! exactly, implement [`candle_nn::Optimizer`] (so they can be used wherever a candle optimizer
//! is expected) and expose their state for checkpoints through [`OptimizerState`].
//! [`DynOptimizer`] is an object-safe view of both, built by [`build`] from an
//! [`OptimizerConfig`].
//!
//! Like PyTorch, variables without a gradient in the [`GradStore`] are skipped (neither decayed
//! nor moved, their state untouched). No update builds an autograd graph: SGD writes contiguous
//! f32 / f64 variables and their momentum buffers in place (two passes per variable, as
//! `torch.optim.SGD`), everything else is computed on detached tensors and written with
//! [`Var::set`]. The tensors [`OptimizerState::state`] returns stay as they were when it was
//! called (SGD copies its buffers before the next in-place write).
//!
//! # State layout
//!
//! [`OptimizerState::state`] returns, for every variable `NAME` (stepped or not):
//! - `step.NAME`: number of updates applied to that variable, an `f64` scalar tensor (PyTorch
//!   keeps a per-parameter step too; AdamW's bias correction uses it);
//! - SGD with momentum ≠ 0: `momentum.NAME`, the momentum buffer (zeros until the first step);
//! - AdamW: `exp_avg.NAME` and `exp_avg_sq.NAME` (zeros until the first step).
//!
//! [`OptimizerState::load_state`] requires exactly that set of names.
//!
//! # Sharding
//!
//! [`ShardedOptimizer`] keeps the state of only its share of the variables on each rank (ZeRO
//! stage 1); its checkpoints have the layout above (see [`DynOptimizer::gather_state`]).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};

mod adamw;
mod in_place;
mod sgd;
pub mod sharded;

pub use adamw::{AdamW, AdamWConfig};
pub use sgd::{Sgd, SgdConfig};
pub use sharded::{partition, ShardedOptimizer, StateSnapshot};

/// Checkpointable optimizer state.
pub trait OptimizerState {
    /// Named state tensors (e.g. "momentum.conv1.weight"), for checkpoints.
    fn state(&self) -> Vec<(String, Tensor)>;
    /// Restores state saved by `state()`; an unknown or missing name or a shape mismatch is an
    /// error naming it.
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> candle_core::Result<()>;
    /// Scalar state (step count) for the training-state JSON.
    fn step_count(&self) -> u64;
    /// Sets the step count (see [`OptimizerState::step_count`]).
    fn set_step_count(&mut self, n: u64);
}

/// An object-safe optimizer: what [`build`] returns. ([`candle_nn::Optimizer`] itself is not
/// object safe.)
pub trait DynOptimizer: OptimizerState + Send {
    /// Applies one update from `grads`; variables without a gradient are skipped. Increments
    /// [`OptimizerState::step_count`].
    fn step(&mut self, grads: &GradStore) -> Result<()>;
    /// The current learning rate.
    fn learning_rate(&self) -> f64;
    /// Sets the learning rate used by the following steps.
    fn set_learning_rate(&mut self, lr: f64);
    /// Which algorithm this is.
    fn kind(&self) -> OptimizerKind;
    /// The full state to checkpoint, where it is to be written: every variable's state named as
    /// [`OptimizerState::state`] of an unsharded optimizer names it, and the step count. An
    /// unsharded optimizer returns it on every rank without communicating (this default); a
    /// [`ShardedOptimizer`] gathers its shards onto rank 0 and returns `None` on the other ranks,
    /// so it is a collective: call it on every rank, then save on rank 0.
    fn gather_state(&self) -> Result<Option<StateSnapshot>> {
        Ok(Some(StateSnapshot {
            tensors: self.state(),
            step_count: self.step_count(),
        }))
    }
}

/// The optimizers [`build`] knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// [`Sgd`] (`sgd`).
    Sgd,
    /// [`AdamW`] (`adamw`).
    AdamW,
}

impl OptimizerKind {
    /// The canonical name (`sgd`, `adamw`).
    pub fn as_str(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::AdamW => "adamw",
        }
    }

    /// PyTorch's default configuration for this kind, with learning rate `lr`.
    pub fn default_config(self, lr: f64) -> OptimizerConfig {
        match self {
            OptimizerKind::Sgd => OptimizerConfig::Sgd(SgdConfig {
                lr,
                ..SgdConfig::default()
            }),
            OptimizerKind::AdamW => OptimizerConfig::AdamW(AdamWConfig {
                lr,
                ..AdamWConfig::default()
            }),
        }
    }
}

impl fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown optimizer name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown optimizer `{0}` (expected one of: sgd, adamw)")]
pub struct UnknownOptimizer(pub String);

impl FromStr for OptimizerKind {
    type Err = UnknownOptimizer;

    /// Parses `sgd` or `adamw` (case-insensitive).
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sgd" => Ok(OptimizerKind::Sgd),
            "adamw" => Ok(OptimizerKind::AdamW),
            _ => Err(UnknownOptimizer(s.to_string())),
        }
    }
}

/// Configuration of any optimizer [`build`] knows.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum OptimizerConfig {
    /// [`Sgd`].
    Sgd(SgdConfig),
    /// [`AdamW`].
    AdamW(AdamWConfig),
}

impl OptimizerConfig {
    /// The optimizer kind.
    pub fn kind(&self) -> OptimizerKind {
        match self {
            OptimizerConfig::Sgd(_) => OptimizerKind::Sgd,
            OptimizerConfig::AdamW(_) => OptimizerKind::AdamW,
        }
    }

    /// The configured learning rate.
    pub fn learning_rate(&self) -> f64 {
        match self {
            OptimizerConfig::Sgd(c) => c.lr,
            OptimizerConfig::AdamW(c) => c.lr,
        }
    }
}

/// Builds a boxed optimizer over `vars` (name, variable) pairs, in the given order.
pub fn build(vars: Vec<(String, Var)>, config: OptimizerConfig) -> Result<Box<dyn DynOptimizer>> {
    Ok(match config {
        OptimizerConfig::Sgd(c) => Box::new(Sgd::new(vars, c)?),
        OptimizerConfig::AdamW(c) => Box::new(AdamW::new(vars, c)?),
    })
}

/// Names for variables handed over without names (through [`candle_nn::Optimizer::new`]):
/// their position, `"0"`, `"1"`, ….
pub(crate) fn positional_names(vars: Vec<Var>) -> Vec<(String, Var)> {
    vars.into_iter()
        .enumerate()
        .map(|(i, v)| (i.to_string(), v))
        .collect()
}

/// The variables an optimizer updates, with their names and per-variable step counts.
pub(crate) struct Params {
    pub(crate) names: Vec<String>,
    pub(crate) vars: Vec<Var>,
    /// Updates applied to each variable (PyTorch's per-parameter `state["step"]`).
    pub(crate) steps: Vec<u64>,
    /// `steps` as `f64` scalar tensors, kept in sync so that `state()` needs no fallible call.
    step_tensors: Vec<Tensor>,
}

impl Params {
    /// Checks names (non-empty, unique) and dtypes (floating point).
    pub(crate) fn new(optimizer: &str, vars: Vec<(String, Var)>) -> Result<Self> {
        let mut seen = HashSet::with_capacity(vars.len());
        for (name, var) in &vars {
            if name.is_empty() {
                candle_core::bail!("{optimizer}: empty variable name");
            }
            if !seen.insert(name.as_str()) {
                candle_core::bail!("{optimizer}: duplicate variable name `{name}`");
            }
            if !var.dtype().is_float() {
                candle_core::bail!(
                    "{optimizer}: variable `{name}` has non-float dtype {:?}",
                    var.dtype()
                );
            }
        }
        let steps = vec![0; vars.len()];
        let (names, vars): (Vec<String>, Vec<Var>) = vars.into_iter().unzip();
        let step_tensors = vars
            .iter()
            .map(|v| Tensor::new(0f64, v.device()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            names,
            vars,
            steps,
            step_tensors,
        })
    }

    /// The step count of variable `i` as an `f64` scalar tensor (for `step.NAME`).
    pub(crate) fn step_tensor(&self, i: usize) -> Tensor {
        self.step_tensors[i].clone()
    }

    /// Sets the step count of variable `i`.
    pub(crate) fn set_step(&mut self, i: usize, step: u64) -> Result<()> {
        self.step_tensors[i] = Tensor::new(step as f64, self.vars[i].device())?;
        self.steps[i] = step;
        Ok(())
    }
}

/// Validates a saved state map against the expected `(prefix, shape)` entries of every
/// variable plus `step.NAME`, and returns, per variable, the step count and the tensors for
/// each prefix (converted to the variable's dtype and device), in `prefixes` order.
pub(crate) fn take_state(
    optimizer: &str,
    params: &Params,
    prefixes: &[&str],
    state: &HashMap<String, Tensor>,
) -> Result<Vec<(u64, Vec<Tensor>)>> {
    let mut expected: HashSet<String> = HashSet::new();
    let mut out = Vec::with_capacity(params.vars.len());
    for (name, var) in params.names.iter().zip(&params.vars) {
        let step_key = format!("step.{name}");
        let step = match state.get(&step_key) {
            Some(t) => decode_step(optimizer, &step_key, t)?,
            None => candle_core::bail!("{optimizer}: state is missing `{step_key}`"),
        };
        expected.insert(step_key);
        let mut tensors = Vec::with_capacity(prefixes.len());
        for prefix in prefixes {
            let key = format!("{prefix}.{name}");
            let Some(t) = state.get(&key) else {
                candle_core::bail!("{optimizer}: state is missing `{key}`");
            };
            if t.dims() != var.dims() {
                candle_core::bail!(
                    "{optimizer}: state `{key}` has shape {:?}, variable `{name}` has {:?}",
                    t.shape(),
                    var.shape()
                );
            }
            let t = t
                .detach()
                .to_dtype(var.dtype())?
                .to_device(var.device())?
                .contiguous()?;
            tensors.push(t);
            expected.insert(key);
        }
        out.push((step, tensors));
    }
    let mut unknown: Vec<&String> = state.keys().filter(|k| !expected.contains(*k)).collect();
    unknown.sort();
    if let Some(key) = unknown.first() {
        candle_core::bail!(
            "{optimizer}: unknown state `{key}` ({} unknown name(s) in total)",
            unknown.len()
        );
    }
    Ok(out)
}

fn decode_step(optimizer: &str, key: &str, t: &Tensor) -> Result<u64> {
    if t.elem_count() != 1 {
        candle_core::bail!(
            "{optimizer}: state `{key}` must be a scalar, has shape {:?}",
            t.shape()
        );
    }
    let v = t
        .flatten_all()?
        .to_dtype(DType::F64)?
        .get(0)?
        .to_scalar::<f64>()?;
    if !(v >= 0.0 && v.fract() == 0.0 && v <= (1u64 << 53) as f64) {
        candle_core::bail!("{optimizer}: state `{key}` is not a valid step count: {v}");
    }
    Ok(v as u64)
}

/// `grads[var]`, detached, if present.
pub(crate) fn grad_of(grads: &GradStore, var: &Var) -> Option<Tensor> {
    grads.get(var.as_tensor()).map(Tensor::detach)
}
