//! Shared by kolo-ddp's tests: snapshots of a model's parameters and their comparison,
//! deterministic starting values, the small conv net of the DDP invariant with its data, and runs
//! of thread-ranks.

#![allow(dead_code)]

use std::fmt::Debug;

use candle_core::{Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use kolo::{Communicator, Config};
use kolo_nn::vars::sorted_vars;

/// Every variable's values, by name (sorted).
pub type Params = Vec<(String, Vec<f32>)>;

/// The values of `varmap`'s variables.
pub fn params(varmap: &VarMap) -> candle_core::Result<Params> {
    sorted_vars(varmap)
        .into_iter()
        .map(|(k, v)| Ok((k, v.flatten_all()?.to_vec1::<f32>()?)))
        .collect()
}

/// Sets every variable to deterministic values of magnitude up to `scale` (on its device).
pub fn init(varmap: &VarMap, scale: f32) -> candle_core::Result<()> {
    for (k, (_, v)) in sorted_vars(varmap).into_iter().enumerate() {
        let vals: Vec<f32> = (0..v.elem_count())
            .map(|i| (((i * 31 + k * 17) as f32) * 0.11).cos() * scale)
            .collect();
        v.set(&Tensor::from_vec(vals, v.shape(), v.device())?)?;
    }
    Ok(())
}

/// The largest relative L2 difference `|a − b| / |b|` over the variables of two snapshots of the
/// same model.
pub fn max_relative_difference(a: &Params, b: &Params) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((na, va), (nb, vb))| {
            assert_eq!(na, nb);
            let diff: f64 = va
                .iter()
                .zip(vb)
                .map(|(x, y)| f64::from(x - y).powi(2))
                .sum::<f64>()
                .sqrt();
            let norm: f64 = vb.iter().map(|y| f64::from(*y).powi(2)).sum::<f64>().sqrt();
            diff / norm.max(1e-12)
        })
        .fold(0.0, f64::max)
}

/// `f` on `n` thread-ranks: every rank's result, in rank order; a rank that failed (or whose
/// thread did) is a panic naming it.
pub fn on_ranks<T, E, F>(n: usize, config: Config, f: F) -> Vec<T>
where
    T: Send + Debug,
    E: Send + Debug,
    F: Fn(Communicator) -> Result<T, E> + Sync,
{
    kolo::run_local(n, config, f)
        .into_iter()
        .enumerate()
        .map(|(r, x)| match x {
            Ok(Ok(v)) => v,
            other => panic!("rank {r}: {other:?}"),
        })
        .collect()
}

/// The text of `r`'s error; empty if it is `Ok`.
pub fn error_text<T, E: std::fmt::Display>(r: Result<T, E>) -> String {
    r.err().map(|e| e.to_string()).unwrap_or_default()
}

/// Samples per rank in the conv net's runs.
pub const B: usize = 4;

/// A small conv net: conv → relu → avg-pool → linear → relu → linear, and optionally a third
/// linear layer (`fc3`) that the forward pass uses only when asked.
pub struct ConvNet {
    conv: candle_nn::Conv2d,
    fc1: candle_nn::Linear,
    fc2: candle_nn::Linear,
    extra: Option<candle_nn::Linear>,
}

impl ConvNet {
    pub fn new(vb: VarBuilder, with_extra: bool) -> candle_core::Result<ConvNet> {
        let cfg = candle_nn::Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        Ok(ConvNet {
            conv: candle_nn::conv2d(1, 4, 3, cfg, vb.pp("conv"))?,
            fc1: candle_nn::linear(4 * 4 * 4, 16, vb.pp("fc1"))?,
            fc2: candle_nn::linear(16, 3, vb.pp("fc2"))?,
            extra: if with_extra {
                Some(candle_nn::linear(3, 3, vb.pp("fc3"))?)
            } else {
                None
            },
        })
    }

    pub fn forward(&self, x: &Tensor, use_extra: bool) -> candle_core::Result<Tensor> {
        let h = self
            .conv
            .forward(x)?
            .relu()?
            .avg_pool2d(2)?
            .flatten_from(1)?;
        let y = self.fc2.forward(&self.fc1.forward(&h)?.relu()?)?;
        match (&self.extra, use_extra) {
            (Some(e), true) => e.forward(&y),
            _ => Ok(y),
        }
    }

    /// Cross-entropy of the logits (through `fc3` if the net has it) against `y`.
    pub fn loss(&self, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::loss::cross_entropy(&self.forward(x, true)?, y)
    }
}

/// Deterministic inputs (`[n·B, 1, 8, 8]`) and labels (3 classes) for the [`ConvNet`]'s global
/// batch of `n` ranks at `step`, on `dev`.
pub fn conv_batch(step: usize, n: usize, dev: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let total = n * B;
    let x: Vec<f32> = (0..total * 64)
        .map(|i| (((i + 7 * step) as f32) * 0.37).sin())
        .collect();
    let y: Vec<u32> = (0..total).map(|i| ((i * 5 + step) % 3) as u32).collect();
    Ok((
        Tensor::from_vec(x, (total, 1, 8, 8), dev)?,
        Tensor::from_vec(y, total, dev)?,
    ))
}

/// Rank `rank`'s `B` samples of a global batch.
pub fn rank_share((x, y): &(Tensor, Tensor), rank: usize) -> candle_core::Result<(Tensor, Tensor)> {
    Ok((x.narrow(0, rank * B, B)?, y.narrow(0, rank * B, B)?))
}
