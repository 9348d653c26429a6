//! Single-process data parallel by hand, the building blocks of d2l's multi-GPU chapter with
//! threads as the devices: [`split_batch`] cuts a batch into one share per replica, [`replicate`]
//! gives a replica its own copy of the parameters, and [`all_reduce_mean`] averages tensors (the
//! gradients) across the replicas' communicator. Rust has no GIL, so replicas that are threads
//! compute in parallel. `kolo train --replicas R` does the same with [`crate::ddp::Ddp`].
//!
//! d2l's `train_batch`, one SGD step of R replicas:
//!
//! ```
//! # use candle_core::{DType, Device, Tensor};
//! # use candle_nn::{VarBuilder, VarMap};
//! # use kolo_train::models::{Mlp, Model};
//! # use kolo_train::replicas::{all_reduce_mean, replicate, split_batch};
//! # fn main() -> kolo_train::Result<()> {
//! # let dev = Device::Cpu;
//! let params = VarMap::new();
//! Mlp::new(VarBuilder::from_varmap(&params, DType::F32, &dev), [1, 4, 4], 3, &[8])?;
//! let x = Tensor::randn(0f32, 1.0, (6, 1, 4, 4), &dev)?;
//! let y = Tensor::new(&[0u32, 1, 2, 0, 1, 2], &dev)?;
//! let (replicas, lr) = (2, 0.1);
//!
//! let shards = split_batch(&x, &y, replicas)?; // X_shards, y_shards = split_batch(X, y, devices)
//! let stepped = kolo::run_local(replicas, kolo::Config::default(), |comm| -> kolo_train::Result<VarMap> {
//!     let own = replicate(&params)?; // each device its copy of the parameters
//!     let model = Mlp::new(VarBuilder::from_varmap(&own, DType::F32, &dev), [1, 4, 4], 3, &[8])?;
//!     let (x, y) = &shards[comm.rank()];
//!     let loss = candle_nn::loss::cross_entropy(&model.forward(x, true)?, y)?;
//!     let grads = loss.backward()?;
//!     let vars = kolo_train::ddp::sorted_vars(&own);
//!     let g = vars
//!         .iter()
//!         .map(|(_, v)| grads.get(v).cloned().map_or_else(|| v.zeros_like(), Ok))
//!         .collect::<candle_core::Result<Vec<_>>>()?;
//!     let g = all_reduce_mean(&comm, &g)?; // allreduce the gradients across devices
//!     for ((_, v), g) in vars.iter().zip(g) {
//!         v.set(&(v.as_tensor() - (g * lr)?)?)?; // sgd on each device
//!     }
//!     Ok(own)
//! });
//! # for r in stepped { r.map_err(|e| kolo_train::TrainError::Unsupported { what: e })??; }
//! # Ok(()) }
//! ```

use candle_core::{DType, Tensor, Var};
use candle_nn::VarMap;
use kolo::{Communicator, ReduceOp};

use crate::ddp::sorted_vars;
use crate::error::{Result, TrainError};
use crate::trainer::Placement;

/// Splits a batch (`x` and `y` along their first dimension) into `replicas` contiguous shares, the
/// first `len % replicas` one sample larger. An error when `replicas` is 0 or exceeds the batch.
pub fn split_batch(x: &Tensor, y: &Tensor, replicas: usize) -> Result<Vec<(Tensor, Tensor)>> {
    let len = x.dim(0)?;
    if y.dim(0)? != len {
        return Err(TrainError::InvalidArgument {
            arg: "batch",
            reason: format!("{len} inputs but {} labels", y.dim(0)?),
        });
    }
    if replicas == 0 {
        return Err(TrainError::InvalidArgument {
            arg: "replicas",
            reason: "must be at least 1".into(),
        });
    }
    (0..replicas)
        .map(|replica| {
            let share = Placement {
                procs: 1,
                proc_rank: 0,
                replicas,
                replica,
            }
            .share(len)?;
            Ok((
                x.narrow(0, share.start, share.len())?,
                y.narrow(0, share.start, share.len())?,
            ))
        })
        .collect()
}

/// A copy of every variable of `varmap` (same names, new storage): a replica's own parameters.
pub fn replicate(varmap: &VarMap) -> Result<VarMap> {
    let copy = VarMap::new();
    {
        let mut data = copy.data().lock().unwrap_or_else(|p| p.into_inner());
        for (name, var) in sorted_vars(varmap) {
            data.insert(name, Var::from_tensor(&var.as_tensor().copy()?)?);
        }
    }
    Ok(copy)
}

/// The element-wise mean of `tensors` over the ranks of `comm` (one all-reduce for all of them,
/// in f32), in the same shapes and types.
pub fn all_reduce_mean(comm: &Communicator, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut flat: Vec<f32> = Vec::new();
    for t in tensors {
        flat.extend(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?);
    }
    comm.all_reduce(&mut flat, ReduceOp::Avg)?;
    let mut at = 0;
    tensors
        .iter()
        .map(|t| {
            let n = t.elem_count();
            let part = Tensor::from_slice(&flat[at..at + n], t.shape(), t.device())?;
            at += n;
            Ok(part.to_dtype(t.dtype())?)
        })
        .collect()
}
