//! Training-mode batch normalization as one op, with its epilogue:
//! `y = act(x̂·weight + bias [+ residual])`, `x̂ = (x − mean)/√(var + eps)` per channel over the
//! batch — over all ranks when synchronized — and `act` the identity or ReLU.
//!
//! Composed from candle ops (statistics, `x·scale + shift`, the residual add, ReLU), a ResNet
//! block's normalization reads or writes its activations about twenty times per step: every
//! intermediate costs a pass forward, one or two backward, and candle's gradient accumulation
//! adds a zero tensor and an addition per edge. Here the forward pass reads `x` twice
//! (statistics, then normalize with the epilogue) and the backward pass three arrays twice (the
//! per-channel sums `Σg'`, `Σg'·x` of the masked gradient `g'`, then the input gradient in one
//! pass), giving the gradients of `x`, `weight`, `bias` and the residual at once:
//!
//! `dx = w·σ⁻¹·(g' − A/n − x̂·S/n)`, `dweight = Σ_local g'·x̂`, `dbias = Σ_local g'`,
//! `dresidual = g'`, with `A = Σg'`, `S = Σg'·x̂` summed over all ranks when synchronized
//! (SyncBatchNorm's backward all-reduce; the forward one sums `[n, Σx, Σx²]`).
//!
//! The op applies on CPU to f32 / f64 tensors whose parameters share their dtype; the layer
//! composes candle ops otherwise.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, WithDType,
};
use kolo::Communicator;

use super::bn_loops;
use super::relu::ReluGrad;
use super::slices::{contiguous, same_len};
use crate::autograd::reduce_sum_in_place;
use crate::models::channel_sums_no_grad;

/// The statistics of one training-mode forward pass (global when synchronized).
#[derive(Debug, Clone)]
pub(crate) struct BatchStats {
    /// Values per channel (over all ranks when synchronized).
    pub count: f64,
    pub mean: Vec<f64>,
    /// Biased variance.
    pub var: Vec<f64>,
}

/// Training-mode batch normalization of `x` (`[B, C, …]`) with `weight`, `bias` (`[C]`) and
/// the epilogue (residual add, ReLU): the output and the batch statistics, or `None` where the
/// kernel does not apply (not CPU, not f32 / f64, mixed dtypes) and the caller composes candle
/// ops. With `comm`, the statistics and the backward sums are all-reduced: every rank must call
/// this in the same order, whatever its batch size (an empty one included).
pub(crate) fn batch_norm_train(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    residual: Option<&Tensor>,
    relu: bool,
    eps: f64,
    comm: Option<&Communicator>,
) -> Result<Option<(Tensor, BatchStats)>> {
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
    let dims = x.dims();
    if dims.len() < 2 {
        candle_core::bail!("batch norm: expected input of shape [B, C, …], got {dims:?}");
    }
    let (b, c) = (dims[0], dims[1]);
    let s: usize = dims[2..].iter().product();
    if weight.dims() != [c] || bias.dims() != [c] {
        candle_core::bail!(
            "batch norm: weight {:?} and bias {:?} do not match {c} channels",
            weight.dims(),
            bias.dims()
        );
    }
    if let Some(r) = residual {
        if r.dims() != dims {
            candle_core::bail!(
                "batch norm: residual {:?} does not match the input {dims:?}",
                r.dims()
            );
        }
    }
    let x = x.contiguous()?;

    // [count, Σx…, Σx²…], local then global.
    let mut stats = vec![(b * s) as f64];
    stats.extend(channel_sums_no_grad(&x.reshape((b, c, s))?)?);
    if let Some(comm) = comm {
        reduce_sum_in_place(comm, &mut stats, "forward")?;
    }
    let n = stats[0];
    if n == 1.0 {
        candle_core::bail!(
            "batch norm: expected more than 1 value per channel when training, got input {:?}{}",
            dims,
            if comm.is_some() {
                " (over all ranks)"
            } else {
                ""
            }
        );
    }
    // An empty global batch gives an empty output; dividing by 1 keeps NaN out.
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
        comm: comm.cloned(),
    }));
    let params = Tensor::cat(&[weight, bias], 0)?;
    let y = match residual {
        None => x.apply_op2(&params, op)?,
        Some(r) => x.apply_op3(&r.contiguous()?, &params, op)?,
    };
    Ok(Some((
        y,
        BatchStats {
            count: n,
            mean,
            var,
        },
    )))
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
    comm: Option<Communicator>,
}

#[derive(Clone)]
struct BnTrain(Arc<Inner>);

impl Inner {
    /// `act(x·scale + shift [+ r])` with `scale`, `shift` from the statistics and `params`
    /// (`[weight…, bias…]`).
    fn forward<T: WithDType>(&self, x: &[T], r: Option<&[T]>, p: &[T]) -> Result<Vec<T>> {
        let c = self.c;
        if p.len() != 2 * c {
            candle_core::bail!("kolo-batch-norm: {} parameters for {c} channels", p.len());
        }
        let scale: Vec<T> = (0..c)
            .map(|ch| T::from_f64(p[ch].to_f64() * self.inv_std[ch]))
            .collect();
        let shift: Vec<T> = (0..c)
            .map(|ch| {
                T::from_f64(p[c + ch].to_f64() - self.mean[ch] * self.inv_std[ch] * p[ch].to_f64())
            })
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
        let (a_local, b_local) = local.split_at(c);
        let d_params = if params.track_op() {
            // dweight = Σ g'·x̂ = (Σg'·x − mean·Σg')·σ⁻¹, dbias = Σ g' (this rank's share).
            let mut d = Vec::with_capacity(2 * c);
            d.extend((0..c).map(|ch| (b_local[ch] - me.mean[ch] * a_local[ch]) * me.inv_std[ch]));
            d.extend_from_slice(a_local);
            Some(Tensor::from_vec(d, 2 * c, params.device())?.to_dtype(params.dtype())?)
        } else {
            None
        };
        // Every rank takes part in the all-reduce, whatever it tracks.
        let mut global = local.clone();
        if let Some(comm) = &me.comm {
            reduce_sum_in_place(comm, &mut global, "backward")?;
        }
        let d_residual = match residual {
            Some(r) if r.track_op() => Some(if me.relu {
                grad.apply_op2_no_bwd(y, &ReluGrad)?
            } else {
                grad.clone()
            }),
            _ => None,
        };
        let d_x = if x.track_op() {
            let w: Vec<f64> = params.narrow(0, 0, c)?.to_dtype(DType::F64)?.to_vec1()?;
            let n = me.divisor;
            let mut coef = Vec::with_capacity(3 * c);
            for ch in 0..c {
                let (a, b) = (global[ch], global[c + ch]);
                let is = me.inv_std[ch];
                // S = Σ g'·x̂ over all ranks.
                let s = (b - me.mean[ch] * a) * is;
                coef.extend([w[ch] * is, w[ch] * is * is * s / n, w[ch] * is * a / n]);
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
        let out = match (x.0, r.map(|r| r.0), p.0) {
            (CpuStorage::F32(xv), rv, CpuStorage::F32(pv)) => {
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
                CpuStorage::F32(self.0.forward(xs, rs, contiguous(pv, p.1, OP)?)?)
            }
            (CpuStorage::F64(xv), rv, CpuStorage::F64(pv)) => {
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
                CpuStorage::F64(self.0.forward(xs, rs, contiguous(pv, p.1, OP)?)?)
            }
            (xv, _, pv) => candle_core::bail!(
                "{OP}: unsupported dtypes {:?}, {:?}",
                xv.dtype(),
                pv.dtype()
            ),
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
