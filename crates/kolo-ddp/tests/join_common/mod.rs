//! Shared by the join tests: a small MLP, per-rank data, and the one-process reference. The
//! crate root declares `mod common` (tests/common) too.

#![allow(dead_code)]

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::optim::{Sgd, SgdConfig};
use kolo_ddp::TrainError;
use kolo_nn::vars::sorted_vars;

use crate::common::{init, params, Params};

pub const LR: f64 = 0.1;

/// A small MLP: 4 → 8 → relu → 2.
pub struct Mlp {
    pub l1: candle_nn::Linear,
    pub l2: candle_nn::Linear,
}

impl Mlp {
    pub fn new(vb: VarBuilder) -> candle_core::Result<Mlp> {
        Ok(Mlp {
            l1: candle_nn::linear(4, 8, vb.pp("l1"))?,
            l2: candle_nn::linear(8, 2, vb.pp("l2"))?,
        })
    }

    pub fn loss(&self, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        let out = self.l2.forward(&self.l1.forward(x)?.relu()?)?;
        candle_nn::loss::mse(&out, y)
    }
}

/// Rank `rank`'s batch number `step` (3 samples), different for every rank and step.
pub fn batch(rank: usize, step: usize) -> candle_core::Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..12)
        .map(|i| (((i + 13 * step + 101 * rank) as f32) * 0.37).sin())
        .collect();
    let y: Vec<f32> = (0..6)
        .map(|i| (((i + 5 * step + 7 * rank) as f32) * 0.23).cos())
        .collect();
    Ok((
        Tensor::from_vec(x, (3, 4), &Device::Cpu)?,
        Tensor::from_vec(y, (3, 2), &Device::Cpu)?,
    ))
}

/// The magnitude of the [`Mlp`]'s starting values ([`init`]).
pub const INIT: f32 = 0.4;

/// The variables of an [`Mlp`], random.
pub fn new_varmap() -> candle_core::Result<VarMap> {
    let varmap = VarMap::new();
    Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    Ok(varmap)
}

/// An [`Mlp`]'s variables, with rank 0's deterministic starting values (the others start from
/// random values), and `comm`'s Ddp over them.
pub fn mlp_ddp(comm: &kolo::Communicator, opts: DdpOptions) -> Result<(VarMap, Ddp), TrainError> {
    let varmap = new_varmap()?;
    if comm.rank() == 0 {
        init(&varmap, INIT)?;
    }
    let ddp = Ddp::new(comm, &varmap, opts)?;
    Ok((varmap, ddp))
}

pub fn sgd(vars: &[(String, candle_core::Var)], momentum: f64) -> candle_core::Result<Sgd> {
    Sgd::new(
        vars.to_vec(),
        SgdConfig {
            lr: LR,
            momentum,
            ..SgdConfig::default()
        },
    )
}

/// One process: at each step, the gradient of every rank that still has a batch, averaged over
/// those ranks, then an optimizer step. `extra` more steps follow with every rank active.
pub fn reference(counts: &[usize], momentum: f64, extra: usize) -> candle_core::Result<Params> {
    let steps = counts.iter().copied().max().unwrap_or(0);
    reference_with(counts.len(), steps + extra, momentum, |net, r, step| {
        if step < counts[r] || step >= steps {
            let (x, y) = batch(r, step)?;
            Ok(Some(net.loss(&x, &y)?))
        } else {
            Ok(None)
        }
    })
}

/// One process taking `steps` steps of `ranks` ranks: `loss_of(net, rank, step)` is the loss of
/// `rank` at `step`, None where it has no data. Each step applies the mean gradient over the ranks
/// with a loss.
pub fn reference_with(
    ranks: usize,
    steps: usize,
    momentum: f64,
    loss_of: impl Fn(&Mlp, usize, usize) -> candle_core::Result<Option<Tensor>>,
) -> candle_core::Result<Params> {
    let varmap = VarMap::new();
    let net = Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    init(&varmap, INIT)?;
    let vars = sorted_vars(&varmap);
    let mut opt = sgd(&vars, momentum)?;
    for step in 0..steps {
        let mut active = 0usize;
        let mut sum: Vec<Option<Tensor>> = vec![None; vars.len()];
        let mut last: Option<GradStore> = None;
        for r in 0..ranks {
            let Some(loss) = loss_of(&net, r, step)? else {
                continue;
            };
            active += 1;
            let g = loss.backward()?;
            for (i, (_, v)) in vars.iter().enumerate() {
                let gi = g.get(v.as_tensor()).cloned();
                sum[i] = match (sum[i].take(), gi) {
                    (Some(a), Some(b)) => Some((a + b)?),
                    (a, b) => a.or(b),
                };
            }
            last = Some(g);
        }
        let mut grads = last.ok_or_else(|| candle_core::Error::Msg("no rank active".into()))?;
        for (i, (_, v)) in vars.iter().enumerate() {
            if let Some(s) = sum[i].take() {
                grads.insert(v.as_tensor(), (s / active as f64)?);
            }
        }
        opt.step(&grads)?;
    }
    params(&varmap)
}

/// Batches per rank of the uneven runs.
pub const UNEVEN: [usize; 3] = [3, 5, 7];
