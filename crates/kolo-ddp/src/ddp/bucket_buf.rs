//! A bucket's host buffer: filled from the parameters' gradients (one copy each), and, once
//! averaged, handed back as the parameters' gradients (views of it, no copy).

use std::ops::Range;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var, WithDType};

use crate::error::Result;

/// A bucket's buffer, in the parameters' element type.
pub(super) enum Buf {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// A zero-filled buffer of `n` values of `dtype` (f64, or f32 for every other type).
pub(super) fn zeros(dtype: DType, n: usize) -> Buf {
    match dtype {
        DType::F64 => Buf::F64(vec![0.0; n]),
        _ => Buf::F32(vec![0.0; n]),
    }
}

impl Buf {
    /// Writes the gradient `grad` into the slot `range`, zeros where there is none.
    pub(super) fn put(&mut self, range: Range<usize>, grad: Option<&Tensor>) -> Result<()> {
        match (self, grad) {
            (Buf::F32(v), Some(g)) => copy_grad(&mut v[range], g)?,
            (Buf::F64(v), Some(g)) => copy_grad(&mut v[range], g)?,
            (Buf::F32(v), None) => v[range].fill(0.0),
            (Buf::F64(v), None) => v[range].fill(0.0),
        }
        Ok(())
    }
}

/// Copies the gradient `g` into its slot `dst` of a bucket: straight from its storage where it is
/// a contiguous CPU tensor of the bucket's type (the common case: one copy), through a converted
/// host copy otherwise (another device or type, a strided view).
fn copy_grad<T: WithDType>(dst: &mut [T], g: &Tensor) -> Result<()> {
    if g.dtype() == T::DTYPE && g.elem_count() == dst.len() {
        let (storage, layout) = g.storage_and_layout();
        if let (candle_core::Storage::Cpu(cpu), Some((a, b))) =
            (&*storage, layout.contiguous_offsets())
        {
            dst.copy_from_slice(&cpu.as_slice::<T>()?[a..b]);
            return Ok(());
        }
    }
    let data = g.flatten_all()?.to_dtype(T::DTYPE)?.to_vec1::<T>()?;
    if data.len() != dst.len() {
        return Err(candle_core::Error::Msg(format!(
            "kolo ddp: a gradient of {} elements for a parameter of {}",
            data.len(),
            dst.len()
        ))
        .into());
    }
    dst.copy_from_slice(&data);
    Ok(())
}

/// Makes the averaged bucket `done` the gradients of its parameters `params` (`slot[p]`: each
/// one's range of it) in `grads`: the buffer becomes one CPU tensor and each gradient its view of
/// it, reshaped (no copy; the next pass fills a new buffer), then moved to the parameter's device
/// and cast to its type where they differ.
pub(super) fn hand_back(
    done: Buf,
    params: &[usize],
    slot: &[(usize, Range<usize>)],
    vars: &[Var],
    grads: &mut GradStore,
) -> Result<()> {
    let flat = match done {
        Buf::F32(v) => {
            let n = v.len();
            Tensor::from_vec(v, n, &Device::Cpu)?
        }
        Buf::F64(v) => {
            let n = v.len();
            Tensor::from_vec(v, n, &Device::Cpu)?
        }
    };
    for &p in params {
        let range = slot[p].1.clone();
        let var = &vars[p];
        let t = flat
            .narrow(0, range.start, range.len())?
            .reshape(var.shape())?
            .to_device(var.device())?;
        let t = if t.dtype() == var.dtype() {
            t
        } else {
            t.to_dtype(var.dtype())?
        };
        grads.insert(var.as_tensor(), t);
    }
    Ok(())
}
