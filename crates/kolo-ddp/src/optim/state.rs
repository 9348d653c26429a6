//! What every optimizer shares: the checkpointable state ([`OptimizerState`], [`StateSnapshot`]),
//! the object-safe interface ([`DynOptimizer`]), and the bookkeeping of named variables, their
//! step counts and saved state.

use std::collections::{HashMap, HashSet};

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};

use super::config::OptimizerKind;

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
    /// Whether [`OptimizerState::state`] is only this rank's shard of the state (a
    /// [`ShardedOptimizer`](super::ShardedOptimizer)): a checkpoint then needs
    /// [`DynOptimizer::gather_state`], and [`crate::checkpoint::save`] refuses the shard.
    fn is_shard(&self) -> bool {
        false
    }
}

/// An object-safe optimizer: what [`build`](super::build) returns. ([`candle_nn::Optimizer`] itself is not
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
    /// [`ShardedOptimizer`](super::ShardedOptimizer) gathers its shards onto rank 0 and returns `None` on the other ranks,
    /// so it is a collective: call it on every rank, then save on rank 0.
    fn gather_state(&self) -> Result<Option<StateSnapshot>> {
        Ok(Some(StateSnapshot {
            tensors: self.state(),
            step_count: self.step_count(),
        }))
    }
}

/// The optimizer state to write to a checkpoint, as returned by
/// [`DynOptimizer::gather_state`]: the full state of every variable (named as an unsharded
/// optimizer names it) and the optimizer's step count. Pass it to
/// [`crate::checkpoint::save`] as the optimizer.
#[derive(Clone, Debug)]
pub struct StateSnapshot {
    /// Named state tensors, in the order of the variables.
    pub tensors: Vec<(String, Tensor)>,
    /// The optimizer's step count.
    pub step_count: u64,
}

impl OptimizerState for StateSnapshot {
    fn state(&self) -> Vec<(String, Tensor)> {
        self.tensors.clone()
    }

    /// Replaces the tensors by `state` (sorted by name); no validation.
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> candle_core::Result<()> {
        let mut tensors: Vec<(String, Tensor)> =
            state.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        self.tensors = tensors;
        Ok(())
    }

    fn step_count(&self) -> u64 {
        self.step_count
    }

    fn set_step_count(&mut self, n: u64) {
        self.step_count = n;
    }
}

/// What [`Sgd`](super::Sgd) and [`AdamW`](super::AdamW) share around their own `new` and
/// `step`, for a type `$ty` with fields `params` ([`Params`]), `config` (`$config`, whose `lr` is
/// the learning rate) and `step_count`: `Debug`, the accessors `config`, `names`,
/// `learning_rate` and `set_learning_rate`, and the traits through them: candle's
/// [`candle_nn::Optimizer`] (variables named by position) and [`DynOptimizer`] (of kind `$kind`).
macro_rules! optimizer_common {
    ($ty:ident, $config:ty, $kind:expr) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("config", &self.config)
                    .field("vars", &self.params.names.len())
                    .field("step_count", &self.step_count)
                    .finish()
            }
        }

        impl $ty {
            /// The configuration (with the current learning rate).
            pub fn config(&self) -> &$config {
                &self.config
            }

            /// The variable names, in update order.
            pub fn names(&self) -> &[String] {
                &self.params.names
            }

            /// The current learning rate.
            pub fn learning_rate(&self) -> f64 {
                self.config.lr
            }

            /// Sets the learning rate used by the following steps.
            pub fn set_learning_rate(&mut self, lr: f64) {
                self.config.lr = lr;
            }
        }

        impl candle_nn::Optimizer for $ty {
            type Config = $config;

            #[doc = concat!(
                                "Variables are named by position (`\"0\"`, `\"1\"`, …); prefer [`",
                                stringify!($ty),
                                "::new`] with names."
                            )]
            fn new(vars: Vec<candle_core::Var>, config: $config) -> candle_core::Result<Self> {
                $ty::new($crate::optim::state::positional_names(vars), config)
            }

            fn step(
                &mut self,
                grads: &candle_core::backprop::GradStore,
            ) -> candle_core::Result<()> {
                $ty::step(self, grads)
            }

            fn learning_rate(&self) -> f64 {
                $ty::learning_rate(self)
            }

            fn set_learning_rate(&mut self, lr: f64) {
                $ty::set_learning_rate(self, lr)
            }
        }

        impl $crate::optim::DynOptimizer for $ty {
            fn step(
                &mut self,
                grads: &candle_core::backprop::GradStore,
            ) -> candle_core::Result<()> {
                $ty::step(self, grads)
            }

            fn learning_rate(&self) -> f64 {
                $ty::learning_rate(self)
            }

            fn set_learning_rate(&mut self, lr: f64) {
                $ty::set_learning_rate(self, lr)
            }

            fn kind(&self) -> $crate::optim::OptimizerKind {
                $kind
            }
        }
    };
}
pub(super) use optimizer_common;

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

/// A variable's entries in a saved state map, checked by [`check_state`]: its step count, and
/// `(key, tensor)` for `step.NAME` and then each prefix's `PREFIX.NAME`.
pub(crate) type Entries<'a> = (u64, Vec<(String, &'a Tensor)>);

/// Checks a saved state map against what `vars` (name, variable) expect with `prefixes`: for
/// every variable `step.NAME` (a valid step count) and `PREFIX.NAME` of the variable's shape for
/// each prefix, and nothing else. Returns every variable's [`Entries`], in order; an error names
/// `optimizer` and the first missing or misshapen entry, or the first unknown name.
pub(crate) fn check_state<'a, 'v>(
    optimizer: &str,
    vars: impl Iterator<Item = (&'v str, &'v Var)>,
    prefixes: &[&str],
    state: &'a HashMap<String, Tensor>,
) -> Result<Vec<Entries<'a>>> {
    let mut out = Vec::new();
    for (name, var) in vars {
        let step_key = format!("step.{name}");
        let Some(step_tensor) = state.get(&step_key) else {
            candle_core::bail!("{optimizer}: state is missing `{step_key}`");
        };
        let step = decode_step(optimizer, &step_key, step_tensor)?;
        let mut entries = Vec::with_capacity(1 + prefixes.len());
        entries.push((step_key, step_tensor));
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
            entries.push((key, t));
        }
        out.push((step, entries));
    }
    let expected: HashSet<&str> = out
        .iter()
        .flat_map(|(_, entries)| entries.iter().map(|(key, _)| key.as_str()))
        .collect();
    let mut unknown: Vec<&String> = state
        .keys()
        .filter(|k| !expected.contains(k.as_str()))
        .collect();
    unknown.sort();
    if let Some(key) = unknown.first() {
        candle_core::bail!(
            "{optimizer}: unknown state `{key}` ({} unknown name(s) in total)",
            unknown.len()
        );
    }
    Ok(out)
}

/// [`check_state`] for `params`: per variable, the step count and the tensors for each prefix
/// (converted to the variable's dtype and device), in `prefixes` order.
pub(crate) fn take_state(
    optimizer: &str,
    params: &Params,
    prefixes: &[&str],
    state: &HashMap<String, Tensor>,
) -> Result<Vec<(u64, Vec<Tensor>)>> {
    let vars = params.names.iter().map(String::as_str).zip(&params.vars);
    let checked = check_state(optimizer, vars, prefixes, state)?;
    checked
        .into_iter()
        .zip(&params.vars)
        .map(|((step, entries), var)| {
            let tensors = entries
                .iter()
                .skip(1)
                .map(|(_, t)| {
                    t.detach()
                        .to_dtype(var.dtype())?
                        .to_device(var.device())?
                        .contiguous()
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((step, tensors))
        })
        .collect()
}

pub(crate) fn decode_step(optimizer: &str, key: &str, t: &Tensor) -> Result<u64> {
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
