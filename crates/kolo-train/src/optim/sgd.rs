//! Stochastic gradient descent with momentum, as `torch.optim.SGD`.

use std::collections::HashMap;
use std::fmt;

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

use super::{
    grad_of, positional_names, take_state, DynOptimizer, OptimizerKind, OptimizerState, Params,
};

const NAME: &str = "sgd";

/// Hyper-parameters of [`Sgd`] (PyTorch's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SgdConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Momentum factor (default 0: plain SGD).
    pub momentum: f64,
    /// Dampening for momentum (default 0).
    pub dampening: f64,
    /// L2 penalty added to the gradient (default 0).
    pub weight_decay: f64,
    /// Nesterov momentum (default false; needs momentum > 0 and dampening = 0).
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

impl SgdConfig {
    fn validate(&self) -> Result<()> {
        let finite_non_negative = |v: f64| v.is_finite() && v >= 0.0;
        if !finite_non_negative(self.lr) {
            candle_core::bail!("{NAME}: invalid learning rate {}", self.lr);
        }
        if !finite_non_negative(self.momentum) {
            candle_core::bail!("{NAME}: invalid momentum {}", self.momentum);
        }
        if !self.dampening.is_finite() {
            candle_core::bail!("{NAME}: invalid dampening {}", self.dampening);
        }
        if !finite_non_negative(self.weight_decay) {
            candle_core::bail!("{NAME}: invalid weight decay {}", self.weight_decay);
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            candle_core::bail!("{NAME}: nesterov momentum requires a momentum and zero dampening");
        }
        Ok(())
    }
}

/// SGD with PyTorch's `torch.optim.SGD` update rule. For each variable with gradient `g`:
///
/// ```text
/// g = g + weight_decay · p                      (if weight_decay ≠ 0)
/// if momentum ≠ 0:
///     b = g                                     (first update of this variable)
///     b = momentum · b + (1 − dampening) · g    (later updates)
///     g = g + momentum · b  if nesterov, else  g = b
/// p = p − lr · g
/// ```
///
/// State: `step.NAME` and, with momentum, `momentum.NAME` (see the [module docs](super)).
pub struct Sgd {
    params: Params,
    /// Momentum buffers (meaningful once the variable's step count is > 0); empty without
    /// momentum.
    momentum: Vec<Tensor>,
    config: SgdConfig,
    step_count: u64,
}

impl fmt::Debug for Sgd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sgd")
            .field("config", &self.config)
            .field("vars", &self.params.names.len())
            .field("step_count", &self.step_count)
            .finish()
    }
}

impl Sgd {
    /// Creates the optimizer over `vars` (name, variable) pairs, in the given order. Names must
    /// be unique; variables must be floating point; the configuration must be valid (as
    /// PyTorch checks it).
    pub fn new(vars: Vec<(String, Var)>, config: SgdConfig) -> Result<Self> {
        config.validate()?;
        let params = Params::new(NAME, vars)?;
        let momentum = if config.momentum != 0.0 {
            params
                .vars
                .iter()
                .map(|v| v.zeros_like())
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        Ok(Self {
            params,
            momentum,
            config,
            step_count: 0,
        })
    }

    /// The configuration (with the current learning rate).
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }

    /// The variable names, in update order.
    pub fn names(&self) -> &[String] {
        &self.params.names
    }

    /// Applies one update from `grads`, skipping variables without a gradient.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        let c = self.config;
        for i in 0..self.params.vars.len() {
            let var = self.params.vars[i].clone();
            let Some(mut g) = grad_of(grads, &var) else {
                continue;
            };
            let p = var.as_detached_tensor();
            if c.weight_decay != 0.0 {
                g = (g + p.affine(c.weight_decay, 0.0)?)?;
            }
            if c.momentum != 0.0 {
                let buf = if self.params.steps[i] == 0 {
                    g.clone()
                } else {
                    (self.momentum[i].affine(c.momentum, 0.0)?
                        + g.affine(1.0 - c.dampening, 0.0)?)?
                };
                g = if c.nesterov {
                    (g + buf.affine(c.momentum, 0.0)?)?
                } else {
                    buf.clone()
                };
                self.momentum[i] = buf;
            }
            var.set(&(p - g.affine(c.lr, 0.0)?)?)?;
            self.params.set_step(i, self.params.steps[i] + 1)?;
        }
        self.step_count += 1;
        Ok(())
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

impl candle_nn::Optimizer for Sgd {
    type Config = SgdConfig;

    /// Variables are named by position (`"0"`, `"1"`, …); prefer [`Sgd::new`] with names.
    fn new(vars: Vec<Var>, config: SgdConfig) -> Result<Self> {
        Sgd::new(positional_names(vars), config)
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        Sgd::step(self, grads)
    }

    fn learning_rate(&self) -> f64 {
        Sgd::learning_rate(self)
    }

    fn set_learning_rate(&mut self, lr: f64) {
        Sgd::set_learning_rate(self, lr)
    }
}

impl OptimizerState for Sgd {
    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(self.params.names.len() * 2);
        for (i, name) in self.params.names.iter().enumerate() {
            out.push((format!("step.{name}"), self.params.step_tensor(i)));
            if let Some(buf) = self.momentum.get(i) {
                out.push((format!("momentum.{name}"), buf.clone()));
            }
        }
        out
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        let prefixes: &[&str] = if self.config.momentum != 0.0 {
            &["momentum"]
        } else {
            &[]
        };
        let loaded = take_state(NAME, &self.params, prefixes, state)?;
        for (i, (step, mut tensors)) in loaded.into_iter().enumerate() {
            self.params.set_step(i, step)?;
            if let Some(buf) = tensors.pop() {
                self.momentum[i] = buf;
            }
        }
        Ok(())
    }

    fn step_count(&self) -> u64 {
        self.step_count
    }

    fn set_step_count(&mut self, n: u64) {
        self.step_count = n;
    }
}

impl DynOptimizer for Sgd {
    fn step(&mut self, grads: &GradStore) -> Result<()> {
        Sgd::step(self, grads)
    }

    fn learning_rate(&self) -> f64 {
        Sgd::learning_rate(self)
    }

    fn set_learning_rate(&mut self, lr: f64) {
        Sgd::set_learning_rate(self, lr)
    }

    fn kind(&self) -> OptimizerKind {
        OptimizerKind::Sgd
    }
}
