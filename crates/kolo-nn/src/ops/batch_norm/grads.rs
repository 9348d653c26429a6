//! The backward pass's element loops as ops over `(g, x, y)`: the per-channel sums and the input
//! gradient.

use std::sync::Arc;

use candle_core::{CpuStorage, Result, Shape, WithDType};

use super::inner::Inner;
use crate::ops::storage::{same_len, slice, Arg, Kernel, Output};

/// The three operands `(g, x, y)` as contiguous slices of the same length.
fn three<'a, T: WithDType>(
    [g, x, y]: [Arg<'a>; 3],
    op: &str,
) -> Result<(&'a [T], &'a [T], &'a [T])> {
    let (g, x) = same_len(slice(g, op)?, slice(x, op)?, op)?;
    let (_, y) = same_len(g, slice(y, op)?, op)?;
    Ok((g, x, y))
}

/// `(g, x, y) -> [Σg'…, Σg'·x…]` (f64, per channel).
pub(super) struct GradSums(pub(super) Arc<Inner>);

impl Kernel<3> for GradSums {
    fn name(&self) -> &'static str {
        "kolo-batch-norm-grad-sums"
    }

    fn forward<T: WithDType>(&self, args: [Arg<'_>; 3]) -> Output {
        let (g, x, y) = three::<T>(args, self.name())?;
        let sums = self.0.grad_sums(g, x, y);
        let len = sums.len();
        Ok((CpuStorage::F64(sums), Shape::from(len)))
    }
}

/// `(g, x, y) -> dx` with the per-channel coefficients `[k1, k2, k3]…`.
pub(super) struct GradInput(pub(super) Arc<Inner>, pub(super) Vec<f64>);

impl Kernel<3> for GradInput {
    fn name(&self) -> &'static str {
        "kolo-batch-norm-grad-input"
    }

    fn forward<T: WithDType>(&self, args: [Arg<'_>; 3]) -> Output {
        let (g, x, y) = three::<T>(args, self.name())?;
        let dx = self.0.grad_input(g, x, y, &self.1);
        Ok((T::to_cpu_storage_owned(dx), args[0].1.shape().clone()))
    }
}
