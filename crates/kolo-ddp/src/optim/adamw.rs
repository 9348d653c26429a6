//! Adam with decoupled weight decay, as `torch.optim.AdamW`.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

use super::config::{AdamWConfig, OptimizerKind};
use super::state::{grad_of, optimizer_common, take_state, OptimizerState, Params};

const NAME: &str = "adamw";

/// AdamW with PyTorch's `torch.optim.AdamW` update rule (no AMSGrad). For each variable with
/// gradient `g`, with `t` the number of updates of that variable including this one:
///
/// ```text
/// p = p · (1 − lr · weight_decay)
/// m = β1 · m + (1 − β1) · g
/// v = β2 · v + (1 − β2) · g²
/// p = p − lr / (1 − β1^t) · m / (√v / √(1 − β2^t) + eps)
/// ```
///
/// State: `step.NAME`, `exp_avg.NAME` (m) and `exp_avg_sq.NAME` (v); see the
/// [module docs](super).
pub struct AdamW {
    params: Params,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    config: AdamWConfig,
    step_count: u64,
}

impl AdamW {
    /// Creates the optimizer over `vars` (name, variable) pairs, in the given order. Names must
    /// be unique; variables must be floating point; the configuration must be valid (as
    /// PyTorch checks it).
    pub fn new(vars: impl Into<Vec<(String, Var)>>, config: AdamWConfig) -> Result<Self> {
        config.validate()?;
        let params = Params::new(NAME, vars.into())?;
        let zeros = || {
            params
                .vars
                .iter()
                .map(|v| v.zeros_like())
                .collect::<Result<Vec<_>>>()
        };
        let exp_avg = zeros()?;
        let exp_avg_sq = zeros()?;
        Ok(Self {
            params,
            exp_avg,
            exp_avg_sq,
            config,
            step_count: 0,
        })
    }

    /// Applies one update from `grads`, skipping variables without a gradient.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        let c = self.config;
        for i in 0..self.params.vars.len() {
            let var = self.params.vars[i].clone();
            let Some(g) = grad_of(grads, &var) else {
                continue;
            };
            let t = self.params.steps[i] + 1;
            let mut p = var.as_detached_tensor();
            if c.weight_decay != 0.0 {
                p = p.affine(1.0 - c.lr * c.weight_decay, 0.0)?;
            }
            let m = (self.exp_avg[i].affine(c.beta1, 0.0)? + g.affine(1.0 - c.beta1, 0.0)?)?;
            let v = (self.exp_avg_sq[i].affine(c.beta2, 0.0)?
                + g.sqr()?.affine(1.0 - c.beta2, 0.0)?)?;
            // Exponents beyond i32 only matter for β^t, which is 0 by then.
            let t_exp = i32::try_from(t).unwrap_or(i32::MAX);
            let bias_correction1 = 1.0 - c.beta1.powi(t_exp);
            let bias_correction2_sqrt = (1.0 - c.beta2.powi(t_exp)).sqrt();
            let step_size = c.lr / bias_correction1;
            let denom = v.sqrt()?.affine(1.0 / bias_correction2_sqrt, c.eps)?;
            let update = (m.div(&denom)?).affine(step_size, 0.0)?;
            var.set(&(p - update)?)?;
            self.exp_avg[i] = m;
            self.exp_avg_sq[i] = v;
            self.params.set_step(i, t)?;
        }
        self.step_count += 1;
        Ok(())
    }
}

optimizer_common!(AdamW, AdamWConfig, OptimizerKind::AdamW);

impl OptimizerState for AdamW {
    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(self.params.names.len() * 3);
        for (i, name) in self.params.names.iter().enumerate() {
            out.push((format!("step.{name}"), self.params.step_tensor(i)));
            out.push((format!("exp_avg.{name}"), self.exp_avg[i].clone()));
            out.push((format!("exp_avg_sq.{name}"), self.exp_avg_sq[i].clone()));
        }
        out
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        let loaded = take_state(NAME, &self.params, &["exp_avg", "exp_avg_sq"], state)?;
        for (i, (step, tensors)) in loaded.into_iter().enumerate() {
            let [m, v]: [Tensor; 2] = match tensors.try_into() {
                Ok(pair) => pair,
                Err(_) => candle_core::bail!("{NAME}: internal error restoring state"),
            };
            self.params.set_step(i, step)?;
            self.exp_avg[i] = m;
            self.exp_avg_sq[i] = v;
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
