//! The batch-norm op itself: forward over `x` (and the residual) with the parameters, and its
//! backward pass.

use std::sync::Arc;

use candle_core::{Result, Tensor, WithDType};

use super::grads::{GradInput, GradSums};
use super::inner::{Inner, Mode};
use crate::ops::relu::relu_grad;
use crate::ops::storage::{same_len, slice, Arg, CpuOp, Grads, Kernel, Output};

/// The coefficients of `dx = k1·g' − k2·(x − mean) − k3` that add to the direct term `k1·g'` the
/// gradient through the statistics, `∂L/∂Σx + 2·x·∂L/∂Σx²` (`d_sums`: `[∂L/∂Σx…, ∂L/∂Σx²…]`).
fn deferred_coefficients(inner: &Inner, k1: &[f64], d_sums: &[f64]) -> Result<Vec<f64>> {
    let c = inner.c;
    if d_sums.len() != 2 * c {
        candle_core::bail!(
            "kolo-batch-norm: {} statistics gradients for {c} channels",
            d_sums.len()
        );
    }
    let (d_sum, d_sum_sq) = d_sums.split_at(c);
    Ok((0..c)
        .flat_map(|ch| {
            let k2 = -2.0 * d_sum_sq[ch];
            [k1[ch], k2, -d_sum[ch] + k2 * inner.mean[ch]]
        })
        .collect())
}

/// The op (`CustomOp2` over `x` and the parameters, `CustomOp3` with a residual between them).
#[derive(Clone)]
pub(super) struct BnTrain(pub(super) Arc<Inner>);

impl BnTrain {
    /// Gradients of `x`, the residual (when `residual` is tracked) and the parameters.
    fn gradients(
        &self,
        x: &Tensor,
        residual: Option<&Tensor>,
        params: &Tensor,
        y: &Tensor,
        grad: &Tensor,
    ) -> Grads<3> {
        let me = &self.0;
        let c = me.c;
        let grad = grad.contiguous()?;
        let local: Vec<f64> = grad
            .apply_op3_no_bwd(x, y, &CpuOp(GradSums(self.0.clone())))?
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
                relu_grad(&grad, y)?
            } else {
                grad.clone()
            }),
            _ => None,
        };
        let d_x = match &me.link {
            Some(link) if given && x.track_op() => {
                // The statistics' backward pass writes the whole input gradient once their
                // gradient (summed over ranks) has arrived: one pass instead of two.
                let k1: Vec<f64> = (0..c).map(|ch| w[ch] * me.inv_std[ch]).collect();
                let (inner, y) = (self.0.clone(), y.clone());
                link.set(Box::new(move |x, d_sums| {
                    let coef = deferred_coefficients(&inner, &k1, d_sums)?;
                    grad.apply_op3_no_bwd(x, &y, &CpuOp(GradInput(inner, coef)))
                }));
                None
            }
            _ if x.track_op() => {
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
                let op = CpuOp(GradInput(self.0.clone(), coef));
                Some(grad.apply_op3_no_bwd(x, y, &op)?)
            }
            _ => None,
        };
        Ok([d_x, d_residual, d_params])
    }

    /// `act(x·scale + shift [+ r])` from `x`, the residual `r` (of `x`'s type) and the
    /// parameters `p` (f64).
    fn normalize<T: WithDType>(&self, x: Arg<'_>, r: Option<Arg<'_>>, p: Arg<'_>) -> Output {
        const OP: &str = "kolo-batch-norm";
        let xs = slice::<T>(x, OP)?;
        let rs = match r {
            Some(r) => Some(same_len(xs, slice::<T>(r, OP)?, OP)?.1),
            None => None,
        };
        let y = self.0.forward(xs, rs, slice::<f64>(p, OP)?)?;
        Ok((T::to_cpu_storage_owned(y), x.1.shape().clone()))
    }
}

impl Kernel<2> for BnTrain {
    fn name(&self) -> &'static str {
        "kolo-batch-norm"
    }

    fn forward<T: WithDType>(&self, [x, p]: [Arg<'_>; 2]) -> Output {
        self.normalize::<T>(x, None, p)
    }

    fn backward(&self, [x, params]: [&Tensor; 2], res: &Tensor, grad: &Tensor) -> Grads<2> {
        let [dx, _, dp] = self.gradients(x, None, params, res, grad)?;
        Ok([dx, dp])
    }
}

impl Kernel<3> for BnTrain {
    fn name(&self) -> &'static str {
        "kolo-batch-norm-residual"
    }

    fn forward<T: WithDType>(&self, [x, r, p]: [Arg<'_>; 3]) -> Output {
        self.normalize::<T>(x, Some(r), p)
    }

    fn backward(&self, [x, r, params]: [&Tensor; 3], res: &Tensor, grad: &Tensor) -> Grads<3> {
        self.gradients(x, Some(r), params, res, grad)
    }
}
