//! Collectives as differentiable tensor operations.
//!
//! [`all_reduce_sum`] sums a tensor over all ranks of a [`Communicator`] and takes part in
//! candle's autograd: its backward pass all-reduces (sums) the incoming gradient. If every rank
//! computes `y = Σ_r x_r` and a loss `L = Σ_r L_r(y)` is spread over the ranks, the gradient
//! each rank needs for its own `x_r` is `∂L/∂y = Σ_r ∂L_r/∂y`: exactly the all-reduce of the
//! gradients the ranks hold locally. This is what makes [`SyncBatchNorm`] train correctly
//! across ranks.
//!
//! Every rank must apply the operation (and run backward through it) in the same order, as for
//! any collective. That holds when all ranks build the same graph, whatever their local batch
//! size — even an empty one.
//!
//! A failed collective surfaces as a candle error carrying kolo's message, on the forward and
//! on the backward pass alike; it never panics.
//!
//! [`SyncBatchNorm`]: crate::batch_norm::BatchNorm

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Device, Tensor, WithDType};
use kolo::{Communicator, ReduceOp};

use crate::ops::storage::{slice, Arg, CpuOp, Grads, Kernel, Output};

/// `Σ_ranks x`, differentiable: the backward pass is the all-reduce (sum) of the gradient.
///
/// `x` must be f32 or f64 and have the same shape on every rank. Tensors on another device
/// than the CPU travel through the CPU for the collective.
pub fn all_reduce_sum(x: &Tensor, comm: &Communicator) -> candle_core::Result<Tensor> {
    check_dtype(x.dtype())?;
    let op = CpuOp(AllReduceSum {
        comm: comm.clone(),
        pass: "forward",
    });
    if x.device().is_cpu() {
        x.contiguous()?.apply_op1(op)
    } else {
        x.to_device(&Device::Cpu)?
            .contiguous()?
            .apply_op1(op)?
            .to_device(x.device())
    }
}

/// Sums `buf` over all ranks in place (the collective inside the differentiable ops); the
/// error names the rank and the `pass` ("forward" / "backward").
fn reduce_sum_in_place<T: kolo::Element>(
    comm: &Communicator,
    buf: &mut [T],
    pass: &str,
) -> candle_core::Result<()> {
    comm.all_reduce(buf, ReduceOp::Sum).map_err(|e| {
        candle_core::Error::Msg(format!(
            "kolo all_reduce_sum ({pass} pass) on rank {}: {e}",
            comm.rank()
        ))
    })
}

fn check_dtype(dtype: DType) -> candle_core::Result<()> {
    match dtype {
        DType::F32 | DType::F64 => Ok(()),
        other => {
            candle_core::bail!("kolo all_reduce_sum: tensors must be f32 or f64, not {other:?}")
        }
    }
}

/// The custom op behind [`all_reduce_sum`]: the sum over ranks of a contiguous CPU tensor, in
/// the forward pass of [`all_reduce_sum`] and, with its gradient, in the backward pass.
struct AllReduceSum {
    comm: Communicator,
    /// "forward" or "backward", for the error.
    pass: &'static str,
}

impl Kernel<1> for AllReduceSum {
    fn name(&self) -> &'static str {
        "kolo-all-reduce-sum"
    }

    fn forward<T: WithDType>(&self, [x]: [Arg<'_>; 1]) -> Output {
        let mut sum = T::to_cpu_storage(slice::<T>(x, "kolo all_reduce_sum")?);
        match &mut sum {
            CpuStorage::F32(v) => reduce_sum_in_place(&self.comm, v, self.pass)?,
            CpuStorage::F64(v) => reduce_sum_in_place(&self.comm, v, self.pass)?,
            other => check_dtype(other.dtype())?,
        }
        Ok((sum, x.1.shape().clone()))
    }

    fn backward(&self, _: [&Tensor; 1], _: &Tensor, grad: &Tensor) -> Grads<1> {
        let op = CpuOp(AllReduceSum {
            comm: self.comm.clone(),
            pass: "backward",
        });
        Ok([Some(grad.contiguous()?.apply_op1_no_bwd(&op)?)])
    }
}
