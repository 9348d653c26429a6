//! Stochastic gradient descent with momentum, as `torch.optim.SGD`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

use super::config::{OptimizerKind, SgdConfig};
use super::in_place::{self, MomentumPass, ParamPass};
use super::state::{grad_of, optimizer_common, take_state, OptimizerState, Params};

const NAME: &str = "sgd";

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
    /// Whether the momentum buffers may be shared outside the optimizer ([`OptimizerState::state`]
    /// handed them out, or [`OptimizerState::load_state`] took them in): the next step copies
    /// them before it writes into them in place, so that a saved state stays as it was.
    shared: AtomicBool,
}

impl Sgd {
    /// Creates the optimizer over `vars` (name, variable) pairs, in the given order. Names must
    /// be unique; variables must be floating point; the configuration must be valid (as
    /// PyTorch checks it).
    pub fn new(vars: impl Into<Vec<(String, Var)>>, config: SgdConfig) -> Result<Self> {
        config.validate()?;
        let params = Params::new(NAME, vars.into())?;
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
            shared: AtomicBool::new(false),
        })
    }

    /// Applies one update from `grads`, skipping variables without a gradient.
    ///
    /// Contiguous f32 / f64 variables are updated in place (two candle in-place passes over
    /// memory per variable, no temporaries); any other variable through candle's tensor
    /// arithmetic and [`Var::set`]. Both compute the same values.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        if self.shared.swap(false, Ordering::Relaxed) {
            for buf in &mut self.momentum {
                *buf = buf.copy()?;
            }
        }
        for i in 0..self.params.vars.len() {
            let var = self.params.vars[i].clone();
            let Some(g) = grad_of(grads, &var) else {
                continue;
            };
            let first = self.params.steps[i] == 0;
            let buf = self.momentum.get(i);
            if in_place::applies(var.as_tensor(), &g, buf) {
                self.step_in_place(&var, &g, buf, first)?;
            } else {
                self.step_out_of_place(i, &var, g, first)?;
            }
            self.params.set_step(i, self.params.steps[i] + 1)?;
        }
        self.step_count += 1;
        Ok(())
    }

    /// One variable's update in place: the momentum buffer, then the variable.
    fn step_in_place(
        &self,
        var: &Var,
        g: &Tensor,
        buf: Option<&Tensor>,
        first: bool,
    ) -> Result<()> {
        let c = self.config;
        let p = var.as_tensor();
        if let Some(buf) = buf {
            let pass = MomentumPass {
                momentum: c.momentum,
                dampening: c.dampening,
                weight_decay: c.weight_decay,
                first,
            };
            buf.inplace_op3(g, p, &pass)?;
        }
        let pass = ParamPass {
            lr: c.lr,
            weight_decay: c.weight_decay,
            momentum: buf.map(|_| (c.momentum, c.nesterov)),
        };
        p.inplace_op3(g, buf.unwrap_or(g), &pass)
    }

    /// One variable's update through candle's tensor arithmetic (any dtype, layout or device).
    fn step_out_of_place(&mut self, i: usize, var: &Var, mut g: Tensor, first: bool) -> Result<()> {
        let c = self.config;
        let p = var.as_detached_tensor();
        if c.weight_decay != 0.0 {
            g = (g + p.affine(c.weight_decay, 0.0)?)?;
        }
        if c.momentum != 0.0 {
            let buf = if first {
                // A copy: the in-place path may later write into the buffer.
                g.copy()?
            } else {
                (self.momentum[i].affine(c.momentum, 0.0)? + g.affine(1.0 - c.dampening, 0.0)?)?
            };
            g = if c.nesterov {
                (g + buf.affine(c.momentum, 0.0)?)?
            } else {
                buf.clone()
            };
            self.momentum[i] = buf;
        }
        var.set(&(p - g.affine(c.lr, 0.0)?)?)
    }
}

optimizer_common!(Sgd, SgdConfig, OptimizerKind::Sgd);

impl OptimizerState for Sgd {
    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(self.params.names.len() * 2);
        for (i, name) in self.params.names.iter().enumerate() {
            out.push((format!("step.{name}"), self.params.step_tensor(i)));
            if let Some(buf) = self.momentum.get(i) {
                out.push((format!("momentum.{name}"), buf.clone()));
            }
        }
        self.shared.store(true, Ordering::Relaxed);
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
        self.shared.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn step_count(&self) -> u64 {
        self.step_count
    }

    fn set_step_count(&mut self, n: u64) {
        self.step_count = n;
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor, Var};

    use super::*;

    fn var(seed: u64, dtype: DType) -> Result<Var> {
        let v: Vec<f64> = (0..37)
            .map(|i| ((i * 7 + seed * 13) % 17) as f64 / 8.0 - 1.0)
            .collect();
        Var::from_tensor(&Tensor::new(v, &Device::Cpu)?.to_dtype(dtype)?)
    }

    /// The in-place passes compute what the tensor-arithmetic form computes, for every
    /// combination of momentum, dampening, weight decay and Nesterov, over several steps.
    #[test]
    fn in_place_and_out_of_place_updates_agree() -> Result<()> {
        let configs = [
            (0.0, 0.0, 0.0, false),
            (0.0, 0.0, 0.01, false),
            (0.9, 0.0, 0.0, false),
            (0.9, 0.1, 0.01, false),
            (0.9, 0.0, 0.0, true),
            (0.8, 0.0, 0.05, true),
        ];
        for (momentum, dampening, weight_decay, nesterov) in configs {
            for dtype in [DType::F32, DType::F64] {
                let config = SgdConfig {
                    lr: 0.1,
                    momentum,
                    dampening,
                    weight_decay,
                    nesterov,
                };
                let (a, b) = (var(1, dtype)?, var(1, dtype)?);
                let fast = Sgd::new(vec![("p".into(), a.clone())], config)?;
                let mut slow = Sgd::new(vec![("p".into(), b.clone())], config)?;
                for step in 0..4 {
                    let g = var(step + 2, dtype)?.as_tensor().clone();
                    let first = step == 0;
                    let buf = fast.momentum.first().cloned();
                    assert!(in_place::applies(a.as_tensor(), &g, buf.as_ref()));
                    fast.step_in_place(&a, &g, buf.as_ref(), first)?;
                    slow.step_out_of_place(0, &b, g, first)?;
                    let diff = (a.as_tensor() - b.as_tensor())?.abs()?.max_all()?;
                    let diff = diff.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                    assert!(diff <= 1e-6, "{config:?} {dtype:?} step {step}: {diff}");
                }
            }
        }
        Ok(())
    }

    /// An operand sharing the destination's storage is refused (not read while written), and
    /// tensors the passes cannot take are left to the out-of-place form.
    #[test]
    fn aliased_or_unsuitable_operands_are_refused() -> Result<()> {
        let p = var(1, DType::F32)?;
        let pass = ParamPass {
            lr: 0.1,
            weight_decay: 0.0,
            momentum: None,
        };
        let t = p.as_tensor();
        assert!(t.inplace_op3(t, t, &pass).is_err());
        let half = var(1, DType::F16)?;
        assert!(!in_place::applies(half.as_tensor(), half.as_tensor(), None));
        let wide = Tensor::zeros((37, 2), DType::F32, &Device::Cpu)?;
        let strided = wide.narrow(1, 0, 1)?.squeeze(1)?;
        assert!(!in_place::applies(t, &strided, None));
        assert!(!in_place::applies(t, &t.narrow(0, 0, 36)?, None));
        Ok(())
    }
}
