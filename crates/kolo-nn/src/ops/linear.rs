//! A fully connected layer's product, `x @ weightᵀ + bias`, as one op with its own backward pass
//! on this crate's GEMM ([`super::gemm`]): the three products of a step — the output, the input
//! gradient `grad @ weight` and the weight gradient `gradᵀ @ x` — read their operands where they
//! lie (transposes are views, no copies), the bias is added as the output is written and its
//! gradient summed in one pass. Under [`MatmulPrecision::Bf16`] each product with every side of
//! at least 32 runs on the CPU's bf16 unit (operands rounded to bf16 as they are packed, sums in
//! f32), as the convolutions' do.
//!
//! Non-CPU tensors and dtypes other than f32 / f64 fall back to candle's `matmul`.
//!
//! [`MatmulPrecision::Bf16`]: super::matmul_precision::MatmulPrecision::Bf16

use candle_core::{DType, Result, Shape, Tensor, WithDType};

use super::gemm::{matmul_into, MatRef};
use super::low_precision::low_precision;
use super::storage::{slice, Arg, CpuOp, Grads, Kernel, Output};

/// The product's sizes: `rows` rows of `x` (every dimension but the last), `inp` features in,
/// `out` features out.
#[derive(Debug, Clone, Copy)]
struct Dims {
    rows: usize,
    inp: usize,
    out: usize,
}

/// `(x, weight[, bias]) -> x @ weightᵀ (+ bias)`, `x` flattened to `[rows, inp]`.
struct LinearOp(Dims);

/// `(x, weight, grad) -> [dx…, dweight…, dbias…]` (the wanted ones, in that order), without a
/// backward pass of its own.
struct LinearBackward(Dims, Wanted);

/// Which gradients the backward pass computes.
#[derive(Debug, Clone, Copy)]
struct Wanted {
    x: bool,
    weight: bool,
    bias: bool,
}

impl LinearOp {
    fn forward_slices<T: WithDType>(&self, x: &[T], w: &[T], b: Option<&[T]>) -> Result<Vec<T>> {
        let Dims { rows, inp, out } = self.0;
        // The bias in every row, for the GEMM to add onto.
        let mut y = match b {
            Some(b) => b.repeat(rows),
            None => vec![T::zero(); rows * out],
        };
        matmul_into(
            "kolo-linear",
            &mut y,
            (out, 1),
            MatRef::row_major(x, rows, inp),
            MatRef::row_major(w, out, inp).t(),
            b.is_some(),
        )?;
        Ok(y)
    }

    fn forward_args<T: WithDType>(&self, x: Arg<'_>, w: Arg<'_>, b: Option<Arg<'_>>) -> Output {
        let op = "kolo-linear";
        let b = match b {
            Some(b) => Some(slice::<T>(b, op)?),
            None => None,
        };
        let y = self.forward_slices(slice::<T>(x, op)?, slice::<T>(w, op)?, b)?;
        let Dims { rows, out, .. } = self.0;
        Ok((T::to_cpu_storage_owned(y), Shape::from((rows, out))))
    }

    /// The wanted gradients of `x`, `weight` and `bias` for the result's gradient `grad`.
    fn gradients(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        grad: &Tensor,
    ) -> Grads<3> {
        let want = Wanted {
            x: x.track_op(),
            weight: weight.track_op(),
            bias: bias.is_some_and(Tensor::track_op),
        };
        let all = x.detach().apply_op3_no_bwd(
            &weight.detach(),
            &grad.detach().contiguous()?,
            &CpuOp(LinearBackward(self.0, want)),
        )?;
        let mut at = 0;
        let mut take = |wanted: bool, shape: &Shape| -> Result<Option<Tensor>> {
            if !wanted {
                return Ok(None);
            }
            let len = shape.elem_count();
            let t = all.narrow(0, at, len)?.reshape(shape)?;
            at += len;
            Ok(Some(t))
        };
        let dx = take(want.x, x.shape())?;
        let dw = take(want.weight, weight.shape())?;
        let db = take(want.bias, &Shape::from(self.0.out))?;
        Ok([dx, dw, db])
    }
}

impl LinearBackward {
    fn slices<T: WithDType>(&self, x: &[T], w: &[T], g: &[T]) -> Result<Vec<T>> {
        const OP: &str = "kolo-linear-backward";
        let (Dims { rows, inp, out }, want) = (self.0, self.1);
        let len = |on: bool, n: usize| if on { n } else { 0 };
        let (nx, nw) = (len(want.x, rows * inp), len(want.weight, out * inp));
        let mut all = vec![T::zero(); nx + nw + len(want.bias, out)];
        let (dx, rest) = all.split_at_mut(nx);
        let (dw, db) = rest.split_at_mut(nw);
        let g_view = MatRef::row_major(g, rows, out);
        if want.x {
            // dx = grad @ weight: [rows, out] @ [out, inp].
            let w_view = MatRef::row_major(w, out, inp);
            matmul_into(OP, dx, (inp, 1), g_view, w_view, false)?;
        }
        if want.weight {
            // dweight = gradᵀ @ x: [out, rows] @ [rows, inp].
            let x_view = MatRef::row_major(x, rows, inp);
            matmul_into(OP, dw, (inp, 1), g_view.t(), x_view, false)?;
        }
        if want.bias {
            for row in g.chunks_exact(out.max(1)) {
                for (s, &v) in db.iter_mut().zip(row) {
                    *s += v;
                }
            }
        }
        Ok(all)
    }
}

impl Kernel<3> for LinearBackward {
    fn name(&self) -> &'static str {
        "kolo-linear-backward"
    }

    fn forward<T: WithDType>(&self, [x, w, g]: [Arg<'_>; 3]) -> Output {
        let op = self.name();
        let all = self.slices(slice::<T>(x, op)?, slice::<T>(w, op)?, slice::<T>(g, op)?)?;
        let len = all.len();
        Ok((T::to_cpu_storage_owned(all), Shape::from(len)))
    }
}

impl Kernel<2> for LinearOp {
    fn name(&self) -> &'static str {
        "kolo-linear"
    }

    fn forward<T: WithDType>(&self, [x, w]: [Arg<'_>; 2]) -> Output {
        self.forward_args::<T>(x, w, None)
    }

    fn backward(&self, [x, weight]: [&Tensor; 2], _res: &Tensor, grad: &Tensor) -> Grads<2> {
        let [dx, dw, _] = self.gradients(x, weight, None, grad)?;
        Ok([dx, dw])
    }
}

impl Kernel<3> for LinearOp {
    fn name(&self) -> &'static str {
        "kolo-linear-bias"
    }

    fn forward<T: WithDType>(&self, [x, w, b]: [Arg<'_>; 3]) -> Output {
        self.forward_args::<T>(x, w, Some(b))
    }

    fn backward(&self, [x, weight, bias]: [&Tensor; 3], _res: &Tensor, grad: &Tensor) -> Grads<3> {
        self.gradients(x, weight, Some(bias), grad)
    }
}

/// `x @ weightᵀ + bias`, differentiable — PyTorch's `nn.functional.linear`: `x` is `[…, inp]`
/// (at least one dimension), `weight` `[out, inp]`, `bias` (optional) `[out]`; the result is
/// `[…, out]`. On CPU for f32 / f64 one op on this crate's GEMM, whose products run on the bf16
/// unit under [`MatmulPrecision::Bf16`](super::MatmulPrecision::Bf16); candle's `matmul`
/// otherwise (16-bit CPU tensors: see [`super::low_precision()`]).
///
/// Errors, naming the shapes, if they do not match.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if let Some(y) = low_precision(x, &[Some(weight), bias], |t| linear(&t[0], &t[1], t.get(2))) {
        return y;
    }
    let (out, inp) = weight.dims2()?;
    let lead = match x.dims().split_last() {
        Some((&last, lead)) if last == inp => lead.to_vec(),
        _ => candle_core::bail!(
            "linear: input {:?} does not match weight {:?} (its last dimension must be {inp})",
            x.shape(),
            weight.shape()
        ),
    };
    if let Some(bias) = bias {
        if bias.dims() != [out] {
            candle_core::bail!(
                "linear: bias {:?} does not match weight {:?} (expected [{out}])",
                bias.shape(),
                weight.shape()
            );
        }
    }
    let dtype = x.dtype();
    let fast = matches!(dtype, DType::F32 | DType::F64)
        && [Some(x), Some(weight), bias]
            .into_iter()
            .flatten()
            .all(|t| t.device().is_cpu() && t.dtype() == dtype);
    let rows = lead.iter().product();
    let mut shape = lead;
    shape.push(out);
    let x2 = x.reshape((rows, inp))?;
    if !fast {
        let y = x2.matmul(&weight.t()?)?;
        let y = match bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        return y.reshape(shape);
    }
    let x2 = x2.contiguous()?;
    let (weight, bias) = (
        weight.contiguous()?,
        bias.map(Tensor::contiguous).transpose()?,
    );
    let op = CpuOp(LinearOp(Dims { rows, inp, out }));
    let tracked = x2.track_op() || weight.track_op() || bias.as_ref().is_some_and(Tensor::track_op);
    let y = match (tracked, &bias) {
        (false, Some(b)) => x2.apply_op3_no_bwd(&weight, b, &op)?,
        (false, None) => x2.apply_op2_no_bwd(&weight, &op)?,
        (true, Some(b)) => x2.apply_op3(&weight, b, op)?,
        (true, None) => x2.apply_op2(&weight, op)?,
    };
    y.reshape(shape)
}

#[cfg(test)]
mod tests;
