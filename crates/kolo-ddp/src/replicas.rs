//! Single-process data parallel by hand, the building blocks of d2l's multi-GPU chapter with
//! threads as the devices: [`split_batch`] cuts a batch into one share per replica, [`replicate`]
//! gives a replica its own copy of the parameters, and [`all_reduce_mean`] averages tensors (the
//! gradients) across the replicas' communicator. Rust has no GIL, so replicas that are threads
//! compute in parallel. `kolo train --replicas R` does the same with [`crate::ddp::Ddp`], each rank
//! taking its [`Placement`]'s share of every batch.
//!
//! d2l's `train_batch`, one SGD step of R replicas:
//!
//! ```
//! # use candle_core::{DType, Device, Tensor};
//! # use candle_nn::{VarBuilder, VarMap};
//! # use kolo_models::{Mlp, Model};
//! # use kolo_ddp::replicas::{all_reduce_mean, replicate, split_batch};
//! # fn main() -> kolo_ddp::Result<()> {
//! # let dev = Device::Cpu;
//! let params = VarMap::new();
//! Mlp::new(VarBuilder::from_varmap(&params, DType::F32, &dev), [1, 4, 4], 3, &[8])?;
//! let x = Tensor::randn(0f32, 1.0, (6, 1, 4, 4), &dev)?;
//! let y = Tensor::new(&[0u32, 1, 2, 0, 1, 2], &dev)?;
//! let (replicas, lr) = (2, 0.1);
//!
//! let shards = split_batch(&x, &y, replicas)?; // X_shards, y_shards = split_batch(X, y, devices)
//! let stepped = kolo::run_local(replicas, kolo::Config::default(), |comm| -> kolo_ddp::Result<VarMap> {
//!     let own = replicate(&params)?; // each device its copy of the parameters
//!     let model = Mlp::new(VarBuilder::from_varmap(&own, DType::F32, &dev), [1, 4, 4], 3, &[8])?;
//!     let (x, y) = &shards[comm.rank()];
//!     let loss = candle_nn::loss::cross_entropy(&model.forward(x, true)?, y)?;
//!     let grads = loss.backward()?;
//!     let vars = kolo_nn::vars::sorted_vars(&own);
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
//! # for r in stepped { r.map_err(|e| kolo_ddp::TrainError::Unsupported { what: e })??; }
//! # Ok(()) }
//! ```

use std::ops::Range;

use candle_core::{Device, Tensor, Var};
use candle_nn::VarMap;
use kolo::{Communicator, ReduceOp};
use kolo_nn::vars::sorted_vars;

use crate::error::{Result, TrainError};
use crate::vars_comm::Flat;

/// Where a rank sits: its worker process among the job's and its replica within the process
/// (`kolo train --replicas R`: ranks `process × replicas + replica`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Worker processes.
    pub procs: usize,
    /// This rank's process.
    pub proc_rank: usize,
    /// Replicas per process.
    pub replicas: usize,
    /// This rank's replica in its process.
    pub replica: usize,
}

impl Placement {
    /// The placement of rank `rank` of `world` ranks with `replicas` per process.
    pub fn new(rank: usize, world: usize, replicas: usize) -> Result<Placement> {
        if replicas == 0 || !world.is_multiple_of(replicas) {
            return Err(TrainError::InvalidArgument {
                arg: "replicas",
                reason: format!(
                    "{replicas} replicas per process do not divide the {world} ranks of the job"
                ),
            });
        }
        Ok(Placement {
            procs: world / replicas,
            proc_rank: rank / replicas,
            replicas,
            replica: rank % replicas,
        })
    }

    /// This replica's share of a batch of `len` samples: contiguous, the first `len % replicas`
    /// replicas taking one more. An error when the batch has fewer samples than replicas.
    pub fn share(&self, len: usize) -> Result<Range<usize>> {
        let r = self.replicas;
        if len < r {
            return Err(TrainError::InvalidArgument {
                arg: "replicas",
                reason: format!("a batch of {len} samples cannot be split among {r} replicas"),
            });
        }
        let (base, extra) = (len / r, len % r);
        let start = self.replica * base + self.replica.min(extra);
        Ok(start..start + base + usize::from(self.replica < extra))
    }
}

impl Placement {
    /// The weight of this replica's mean loss on its share of a batch of `len` samples:
    /// `share × replicas / len`, so that the average over the replicas of the weighted losses (and
    /// of their gradients) is the mean over the whole batch even when the shares differ by one.
    pub fn loss_weight(&self, len: usize) -> Result<f64> {
        let share = self.share(len)?;
        Ok((share.len() * self.replicas) as f64 / len as f64)
    }
}

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
    let mut flat = Flat::<f32>::of(tensors)?;
    comm.all_reduce(flat.values_mut(), ReduceOp::Avg)?;
    tensors
        .iter()
        .zip(flat.tensors(&Device::Cpu)?)
        .map(|(t, mean)| Ok(mean.to_device(t.device())?.to_dtype(t.dtype())?))
        .collect()
}
