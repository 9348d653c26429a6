//! The backward pass's element loops as ops over `(g, x, y)`: the per-channel sums and the input
//! gradient.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape};

use super::inner::Inner;
use crate::ops::slices::{contiguous, same_len};

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
pub(super) struct GradSums(pub(super) Arc<Inner>);

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
pub(super) struct GradInput(pub(super) Arc<Inner>, pub(super) Vec<f64>);

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
