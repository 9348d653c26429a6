//! Training-mode batch normalization as one op, with its epilogue:
//! `y = act(x̂·weight + bias [+ residual])`, `x̂ = (x − mean)/√(var + eps)` per channel over the
//! batch, and `act` the identity or ReLU.
//!
//! Composed from candle ops (statistics, `x·scale + shift`, the residual add, ReLU), a ResNet
//! block's normalization reads or writes its activations about twenty times per step: every
//! intermediate costs a pass forward, one or two backward, and candle's gradient accumulation
//! adds a zero tensor and an addition per edge. Here the forward pass reads `x` twice
//! (statistics, then normalize with the epilogue) and the backward pass three arrays twice (the
//! per-channel sums `Σg'`, `Σg'·x` of the masked gradient `g'`, then the input gradient in one
//! pass), giving the gradients of `x`, `weight`, `bias` and the residual at once:
//!
//! `dx = w·σ⁻¹·(g' − A/n − x̂·S/n)`, `dweight = Σ g'·x̂`, `dbias = Σ g'`, `dresidual = g'`, with
//! `A = Σg'`, `S = Σg'·x̂`.
//!
//! Statistics computed elsewhere — the global ones of synchronized batch normalization, the
//! all-reduce of [`batch_norm_stats`] — go in through [`batch_norm_train_with_stats`]: its
//! backward pass returns the gradient of the statistics, `∂L/∂Σx = ∂L/∂mean/n −
//! 2·mean/n·∂L/∂var` and `∂L/∂Σx² = ∂L/∂var/n` with `∂L/∂mean = −w·σ⁻¹·A` and
//! `∂L/∂var = −½·w·σ⁻³·(Σg'·x − mean·A)`, which flows back through whatever made them (an
//! all-reduce sums it over the ranks) into the backward pass of [`batch_norm_stats`]. The input
//! gradient is `w·σ⁻¹·g'` plus that pass's `g₁ + 2·x·g₂`: together the same `dx` with `A`, `S`
//! summed over all ranks. Rather than two passes and candle's addition, the op leaves the direct
//! term to the statistics' backward pass ([`BatchNormStats`] links the two), which writes
//! `dx = k1·g' − k2·(x − mean) − k3` in one pass once the statistics' gradient has arrived: the
//! same three arrays read twice as with local statistics. These ops know nothing of
//! communication.
//!
//! The ops apply on CPU to f32 / f64 tensors whose parameters share their dtype; callers compose
//! candle ops otherwise.

mod grads;
mod inner;
mod op;

use std::sync::Arc;

use candle_core::{DType, Result, Tensor};

use super::channel_stats::{channel_sums_linked, channel_sums_no_grad, GradLink};
use super::storage::CpuOp;
use inner::{Inner, Mode};
use op::BnTrain;

/// The statistics of one training-mode forward pass.
#[derive(Debug, Clone)]
pub struct BatchStats {
    /// Values per channel (over all ranks when the statistics are global).
    pub count: f64,
    /// Mean per channel.
    pub mean: Vec<f64>,
    /// Biased variance per channel.
    pub var: Vec<f64>,
}

/// The statistics [`batch_norm_train_with_stats`] normalizes with: a tensor `[count, Σx…, Σx²…]`
/// (`[1 + 2C]`, f64) computed from [`batch_norm_stats`]' (possibly through other differentiable
/// ops, [`BatchNormStats::map`]), and the link through which the normalization hands its input
/// gradient to their backward pass.
#[derive(Clone)]
pub struct BatchNormStats {
    tensor: Tensor,
    link: GradLink,
}

impl std::fmt::Debug for BatchNormStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchNormStats")
            .field("tensor", &self.tensor)
            .finish()
    }
}

impl BatchNormStats {
    /// `[count, Σx…, Σx²…]`.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The statistics `f` computes from these (e.g. their sum over ranks, a differentiable
    /// all-reduce), still linked to the input they were computed from: `f` must be
    /// differentiable, and its result `[1 + 2C]` f64.
    pub fn map(self, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Self> {
        Ok(BatchNormStats {
            tensor: f(&self.tensor)?,
            link: self.link,
        })
    }
}

/// `[count, Σx…, Σx²…]` (`[1 + 2C]`, f64) of `x` (`[B, C, …]`, f32 or f64): the statistics
/// [`batch_norm_train_with_stats`] normalizes with, differentiable (the count is a constant).
/// Sum them over ranks with a differentiable all-reduce ([`BatchNormStats::map`]) for
/// synchronized batch normalization.
pub fn batch_norm_stats(x: &Tensor) -> Result<BatchNormStats> {
    let (b, c, s) = bcs(x)?;
    let link = GradLink::default();
    let sums = channel_sums_linked(x, (b, c, s), Some(link.clone()))?;
    let count = Tensor::new(&[(b * s) as f64], x.device())?;
    Ok(BatchNormStats {
        tensor: Tensor::cat(&[&count, &sums], 0)?,
        link,
    })
}

/// `[B, C, S]` of a `[B, C, …]` shape.
fn bcs(x: &Tensor) -> Result<(usize, usize, usize)> {
    let dims = x.dims();
    if dims.len() < 2 {
        candle_core::bail!("batch norm: expected input of shape [B, C, …], got {dims:?}");
    }
    Ok((dims[0], dims[1], dims[2..].iter().product()))
}

/// Whether the fused ops apply (CPU, f32 / f64, one dtype) and the shapes match.
fn applies(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    residual: Option<&Tensor>,
) -> Result<Option<(usize, usize, usize)>> {
    let dtype = x.dtype();
    let same = |t: &Tensor| t.dtype() == dtype && t.device().is_cpu();
    if !x.device().is_cpu()
        || !matches!(dtype, DType::F32 | DType::F64)
        || !same(weight)
        || !same(bias)
        || !residual.is_none_or(same)
    {
        return Ok(None);
    }
    let (b, c, s) = bcs(x)?;
    if weight.dims() != [c] || bias.dims() != [c] {
        candle_core::bail!(
            "batch norm: weight {:?} and bias {:?} do not match {c} channels",
            weight.dims(),
            bias.dims()
        );
    }
    if let Some(r) = residual {
        if r.dims() != x.dims() {
            candle_core::bail!(
                "batch norm: residual {:?} does not match the input {:?}",
                r.dims(),
                x.dims()
            );
        }
    }
    Ok(Some((b, c, s)))
}

/// Training-mode batch normalization of `x` (`[B, C, …]`) with `weight`, `bias` (`[C]`), the
/// statistics of this batch and the epilogue (residual add, ReLU): the output and the batch
/// statistics, or `None` where the kernel does not apply (not CPU, not f32 / f64, mixed dtypes)
/// and the caller composes candle ops. A single value per channel gives a zero variance; the
/// caller decides whether that is an error (PyTorch's layer makes it one).
pub fn batch_norm_train(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    residual: Option<&Tensor>,
    relu: bool,
    eps: f64,
) -> Result<Option<(Tensor, BatchStats)>> {
    let Some((b, c, s)) = applies(x, weight, bias, residual)? else {
        return Ok(None);
    };
    let x = x.contiguous()?;
    // [count, Σx…, Σx²…].
    let mut stats = vec![(b * s) as f64];
    stats.extend(channel_sums_no_grad(&x.reshape((b, c, s))?)?);
    let params = Tensor::cat(&[weight, bias], 0)?.to_dtype(DType::F64)?;
    let op = op(&stats, (c, s, relu, eps), Mode::Local, None);
    apply(&x, residual, params, op).map(Some)
}

/// [`batch_norm_train`] with the statistics `stats` ([`batch_norm_stats`] of `x`, e.g. summed
/// over ranks) instead of this batch's: the backward pass returns the gradient of the statistics
/// (see the module notes), so that it reaches `x` through whatever computed them. `None` where
/// the kernel does not apply.
pub fn batch_norm_train_with_stats(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    residual: Option<&Tensor>,
    relu: bool,
    eps: f64,
    stats: &BatchNormStats,
) -> Result<Option<(Tensor, BatchStats)>> {
    let Some((_, c, s)) = applies(x, weight, bias, residual)? else {
        return Ok(None);
    };
    let (link, stats) = (&stats.link, &stats.tensor);
    if stats.dtype() != DType::F64 || stats.dims() != [1 + 2 * c] || !stats.device().is_cpu() {
        candle_core::bail!(
            "batch norm: statistics must be [1 + 2·{c}] f64 on the CPU, got {:?} {:?}",
            stats.dims(),
            stats.dtype()
        );
    }
    let x = x.contiguous()?;
    let values: Vec<f64> = stats.to_vec1()?;
    let params = Tensor::cat(
        &[
            &weight.to_dtype(DType::F64)?,
            &bias.to_dtype(DType::F64)?,
            stats,
        ],
        0,
    )?;
    // The input gradient goes to the statistics' backward pass when it will run.
    let link = stats.track_op().then(|| link.clone());
    let op = op(&values, (c, s, relu, eps), Mode::GivenStats, link);
    apply(&x, residual, params, op).map(Some)
}

/// The op normalizing with the statistics' values `stats`, and those as [`BatchStats`].
fn op(
    stats: &[f64],
    (c, s, relu, eps): (usize, usize, bool, f64),
    mode: Mode,
    link: Option<GradLink>,
) -> (BnTrain, BatchStats) {
    let n = stats[0];
    // An empty batch gives an empty output; dividing by 1 keeps NaN out.
    let divisor = n.max(1.0);
    let mean: Vec<f64> = stats[1..=c].iter().map(|v| v / divisor).collect();
    // Biased variance; rounding can make E[x²] − E[x]² slightly negative.
    let var: Vec<f64> = stats[1 + c..]
        .iter()
        .zip(&mean)
        .map(|(sq, m)| (sq / divisor - m * m).max(0.0))
        .collect();
    let inv_std = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let op = BnTrain(Arc::new(Inner {
        c,
        s,
        relu,
        divisor,
        mean: mean.clone(),
        inv_std,
        mode,
        link,
    }));
    let stats = BatchStats {
        count: n,
        mean,
        var,
    };
    (op, stats)
}

/// `op` over `x` (and the residual) and `params` (`[weight…, bias…]` in f64, then the statistics
/// in [`Mode::GivenStats`]).
fn apply(
    x: &Tensor,
    residual: Option<&Tensor>,
    params: Tensor,
    (op, stats): (BnTrain, BatchStats),
) -> Result<(Tensor, BatchStats)> {
    let y = match residual {
        None => x.apply_op2(&params, CpuOp(op))?,
        Some(r) => x.apply_op3(&r.contiguous()?, &params, CpuOp(op))?,
    };
    Ok((y, stats))
}
