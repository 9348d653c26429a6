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
//! backward pass gives `x` only the direct term `w·σ⁻¹·g'` and returns the gradient of the
//! statistics, `∂L/∂Σx = ∂L/∂mean/n − 2·mean/n·∂L/∂var` and `∂L/∂Σx² = ∂L/∂var/n` with
//! `∂L/∂mean = −w·σ⁻¹·A` and `∂L/∂var = −½·w·σ⁻³·(Σg'·x − mean·A)`, which flows back through
//! whatever made them (an all-reduce sums it over the ranks) into [`batch_norm_stats`]' own
//! backward pass, `g₁ + 2·x·g₂`: together the same `dx` with `A`, `S` summed over all ranks.
//! These ops know nothing of communication.
//!
//! The ops apply on CPU to f32 / f64 tensors whose parameters share their dtype; callers compose
//! candle ops otherwise.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, WithDType,
};

use super::bn_loops;
use super::channel_stats::{channel_sums, channel_sums_no_grad};
use super::relu::ReluGrad;
use super::slices::{contiguous, same_len};

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

/// `[count, Σx…, Σx²…]` (`[1 + 2C]`, f64) of `x` (`[B, C, …]`, f32 or f64): the statistics
/// [`batch_norm_train_with_stats`] normalizes with, differentiable (the count is a constant).
/// Sum them over ranks with a differentiable all-reduce for synchronized batch normalization.
pub fn batch_norm_stats(x: &Tensor) -> Result<Tensor> {
    let (b, c, s) = bcs(x)?;
    let sums = channel_sums(&x.reshape((b, c, s))?)?;
    let count = Tensor::new(&[(b * s) as f64], x.device())?;
    Tensor::cat(&[&count, &sums], 0)
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
    apply(&x, residual, params, &stats, (c, s, relu, eps), Mode::Local).map(Some)
}

/// [`batch_norm_train`] with the statistics `stats` (`[count, Σx…, Σx²…]`, f64, as
/// [`batch_norm_stats`] computes them, e.g. summed over ranks) instead of this batch's: the
/// backward pass returns the gradient of `stats` (see the module notes), so that it reaches `x`
/// through whatever computed them. `None` where the kernel does not apply.
pub fn batch_norm_train_with_stats(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    residual: Option<&Tensor>,
    relu: bool,
    eps: f64,
    stats: &Tensor,
) -> Result<Option<(Tensor, BatchStats)>> {
    let Some((_, c, s)) = applies(x, weight, bias, residual)? else {
        return Ok(None);
    };
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
    apply(
        &x,
        residual,
        params,
        &values,
        (c, s, relu, eps),
        Mode::GivenStats,
    )
    .map(Some)
}

/// The op over `x` and `params` (`[weight…, bias…]` in f64, then the statistics in
/// [`Mode::GivenStats`]) with the statistics' values `stats`.
fn apply(
    x: &Tensor,
    residual: Option<&Tensor>,
    params: Tensor,
    stats: &[f64],
    (c, s, relu, eps): (usize, usize, bool, f64),
    mode: Mode,
) -> Result<(Tensor, BatchStats)> {
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
    }));
    let y = match residual {
        None => x.apply_op2(&params, op)?,
        Some(r) => x.apply_op3(&r.contiguous()?, &params, op)?,
    };
    Ok((
        y,
        BatchStats {
            count: n,
            mean,
            var,
        },
    ))
}

/// Where the statistics come from, which decides what backward returns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Computed inside from `x`: the full input gradient.
    Local,
    /// Given as the tail of the parameters: the direct input gradient and theirs.
    GivenStats,
}

/// What forward and backward share.
struct Inner {
    c: usize,
    /// Values per channel and sample.
    s: usize,
    relu: bool,
    /// The global count (1 for an empty global batch).
    divisor: f64,
    mean: Vec<f64>,
    inv_std: Vec<f64>,
    mode: Mode,
}

#[derive(Clone)]
struct BnTrain(Arc<Inner>);

impl Inner {
    /// Length of the parameters (`[weight…, bias…]`, then the statistics when given).
    fn params_len(&self) -> usize {
        match self.mode {
            Mode::Local => 2 * self.c,
            Mode::GivenStats => 4 * self.c + 1,
        }
    }

    /// `act(x·scale + shift [+ r])` with `scale`, `shift` from the statistics and `params`
    /// (`[weight…, bias…, …]`).
    fn forward<T: WithDType>(&self, x: &[T], r: Option<&[T]>, p: &[f64]) -> Result<Vec<T>> {
        let c = self.c;
        if p.len() != self.params_len() {
            candle_core::bail!("kolo-batch-norm: {} parameters for {c} channels", p.len());
        }
        let scale: Vec<T> = (0..c)
            .map(|ch| T::from_f64(p[ch] * self.inv_std[ch]))
            .collect();
        let shift: Vec<T> = (0..c)
            .map(|ch| T::from_f64(p[c + ch] - self.mean[ch] * self.inv_std[ch] * p[ch]))
            .collect();
        if r.is_some_and(|r| r.len() != x.len()) {
            candle_core::bail!("kolo-batch-norm: residual and input differ in length");
        }
        Ok(bn_loops::normalize(x, r, &scale, &shift, self.s, self.relu))
    }

    /// Per channel `[Σg'…, Σg'·x…]` in f64, `g'` the gradient masked by `y > 0` under ReLU.
    fn grad_sums<T: WithDType>(&self, g: &[T], x: &[T], y: &[T]) -> Vec<f64> {
        bn_loops::grad_sums(g, x, y, self.s, self.c, self.relu)
    }

    /// `dx = k1·g' − k2·(x − mean) − k3` per channel (`coef` holds k1, k2, k3 for each).
    fn grad_input<T: WithDType>(&self, g: &[T], x: &[T], y: &[T], coef: &[f64]) -> Vec<T> {
        bn_loops::grad_input(g, x, y, coef, &self.mean, self.s, self.relu)
    }
}

impl BnTrain {
    /// Gradients of `x`, the residual (when `residual` is tracked) and the parameters.
    fn backward(
        &self,
        x: &Tensor,
        residual: Option<&Tensor>,
        params: &Tensor,
        y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let me = &self.0;
        let c = me.c;
        let grad = grad.contiguous()?;
        let local: Vec<f64> = grad
            .apply_op3_no_bwd(x, y, &GradSums(self.0.clone()))?
            .to_vec1()?;
        let (a, b) = local.split_at(c);
        let given = me.mode == Mode::GivenStats;
        let w: Vec<f64> = params.narrow(0, 0, c)?.to_vec1()?;
        let d_params = if params.track_op() {
            // dweight = Σ g'·x̂ = (Σg'·x − mean·Σg')·σ⁻¹, dbias = Σ g'.
            let mut d = Vec::with_capacity(me.params_len());
            d.extend((0..c).map(|ch| (b[ch] - me.mean[ch] * a[ch]) * me.inv_std[ch]));
            d.extend_from_slice(a);
            if given {
                // The statistics' gradient (see the module notes); the count is a constant.
                let n = me.divisor;
                let (mut d_sum, mut d_sum_sq) = (Vec::with_capacity(c), Vec::with_capacity(c));
                for ch in 0..c {
                    let is = me.inv_std[ch];
                    let d_mean = -w[ch] * is * a[ch];
                    let d_var = -0.5 * w[ch] * is * is * is * (b[ch] - me.mean[ch] * a[ch]);
                    d_sum.push(d_mean / n - 2.0 * me.mean[ch] / n * d_var);
                    d_sum_sq.push(d_var / n);
                }
                d.push(0.0);
                d.extend(d_sum);
                d.extend(d_sum_sq);
            }
            Some(Tensor::from_vec(d, me.params_len(), params.device())?)
        } else {
            None
        };
        let d_residual = match residual {
            Some(r) if r.track_op() => Some(if me.relu {
                grad.apply_op2_no_bwd(y, &ReluGrad)?
            } else {
                grad.clone()
            }),
            _ => None,
        };
        let d_x = if x.track_op() {
            let n = me.divisor;
            let mut coef = Vec::with_capacity(3 * c);
            for ch in 0..c {
                let is = me.inv_std[ch];
                if given {
                    // The direct term; the rest comes through the statistics.
                    coef.extend([w[ch] * is, 0.0, 0.0]);
                } else {
                    // S = Σ g'·x̂.
                    let s = (b[ch] - me.mean[ch] * a[ch]) * is;
                    coef.extend([w[ch] * is, w[ch] * is * is * s / n, w[ch] * is * a[ch] / n]);
                }
            }
            Some(grad.apply_op3_no_bwd(x, y, &GradInput(self.0.clone(), coef))?)
        } else {
            None
        };
        Ok((d_x, d_residual, d_params))
    }

    fn forward_storage(
        &self,
        x: (&CpuStorage, &Layout),
        r: Option<(&CpuStorage, &Layout)>,
        p: (&CpuStorage, &Layout),
    ) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "kolo-batch-norm";
        let shape = x.1.shape().clone();
        let CpuStorage::F64(pv) = p.0 else {
            candle_core::bail!("{OP}: parameters of dtype {:?}, not f64", p.0.dtype());
        };
        let pv = contiguous(pv, p.1, OP)?;
        let out = match (x.0, r.map(|r| r.0)) {
            (CpuStorage::F32(xv), rv) => {
                let xs = contiguous(xv, x.1, OP)?;
                let rs = match (rv, r) {
                    (None, _) => None,
                    (Some(CpuStorage::F32(rv)), Some((_, l))) => {
                        Some(same_len(xs, contiguous(rv, l, OP)?, OP)?.1)
                    }
                    (Some(other), _) => {
                        candle_core::bail!("{OP}: residual of dtype {:?}", other.dtype())
                    }
                };
                CpuStorage::F32(self.0.forward(xs, rs, pv)?)
            }
            (CpuStorage::F64(xv), rv) => {
                let xs = contiguous(xv, x.1, OP)?;
                let rs = match (rv, r) {
                    (None, _) => None,
                    (Some(CpuStorage::F64(rv)), Some((_, l))) => {
                        Some(same_len(xs, contiguous(rv, l, OP)?, OP)?.1)
                    }
                    (Some(other), _) => {
                        candle_core::bail!("{OP}: residual of dtype {:?}", other.dtype())
                    }
                };
                CpuStorage::F64(self.0.forward(xs, rs, pv)?)
            }
            (xv, _) => candle_core::bail!("{OP}: unsupported dtype {:?}", xv.dtype()),
        };
        Ok((out, shape))
    }
}

impl CustomOp2 for BnTrain {
    fn name(&self) -> &'static str {
        "kolo-batch-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.forward_storage((s1, l1), None, (s2, l2))
    }

    fn bwd(
        &self,
        x: &Tensor,
        params: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, _, dp) = self.backward(x, None, params, res, grad)?;
        Ok((dx, dp))
    }
}

impl CustomOp3 for BnTrain {
    fn name(&self) -> &'static str {
        "kolo-batch-norm-residual"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.forward_storage((s1, l1), Some((s2, l2)), (s3, l3))
    }

    fn bwd(
        &self,
        x: &Tensor,
        residual: &Tensor,
        params: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        self.backward(x, Some(residual), params, res, grad)
    }
}

/// Three contiguous slices of the same length.
fn three<'a, T>(
    (a, la): (&'a [T], &Layout),
    (b, lb): (&'a [T], &Layout),
    (c, lc): (&'a [T], &Layout),
    op: &str,
) -> Result<(&'a [T], &'a [T], &'a [T])> {
    let (a, b) = same_len(contiguous(a, la, op)?, contiguous(b, lb, op)?, op)?;
    let (_, c) = same_len(a, contiguous(c, lc, op)?, op)?;
    Ok((a, b, c))
}

fn unsupported(op: &str, storages: [&CpuStorage; 3]) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{op}: unsupported dtypes {:?}",
        storages.map(|s| s.dtype())
    ))
}

/// `(g, x, y) -> [Σg'…, Σg'·x…]` (f64, per channel).
struct GradSums(Arc<Inner>);

impl CustomOp3 for GradSums {
    fn name(&self) -> &'static str {
        "kolo-batch-norm-grad-sums"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let sums = match (s1, s2, s3) {
            (CpuStorage::F32(g), CpuStorage::F32(x), CpuStorage::F32(y)) => {
                let (g, x, y) = three((g, l1), (x, l2), (y, l3), op)?;
                self.0.grad_sums(g, x, y)
            }
            (CpuStorage::F64(g), CpuStorage::F64(x), CpuStorage::F64(y)) => {
                let (g, x, y) = three((g, l1), (x, l2), (y, l3), op)?;
                self.0.grad_sums(g, x, y)
            }
            _ => return Err(unsupported(op, [s1, s2, s3])),
        };
        let len = sums.len();
        Ok((CpuStorage::F64(sums), Shape::from(len)))
    }
}

/// `(g, x, y) -> dx` with the per-channel coefficients `[k1, k2, k3]…`.
struct GradInput(Arc<Inner>, Vec<f64>);

impl CustomOp3 for GradInput {
    fn name(&self) -> &'static str {
        "kolo-batch-norm-grad-input"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(g), CpuStorage::F32(x), CpuStorage::F32(y)) => {
                let (g, x, y) = three((g, l1), (x, l2), (y, l3), op)?;
                CpuStorage::F32(self.0.grad_input(g, x, y, &self.1))
            }
            (CpuStorage::F64(g), CpuStorage::F64(x), CpuStorage::F64(y)) => {
                let (g, x, y) = three((g, l1), (x, l2), (y, l3), op)?;
                CpuStorage::F64(self.0.grad_input(g, x, y, &self.1))
            }
            _ => return Err(unsupported(op, [s1, s2, s3])),
        };
        Ok((out, l1.shape().clone()))
    }
}
