//! Gradient buckets that stay on the GPU: when the parameters live on the GPU the communicator's
//! engine runs on (`KOLO_BACKEND=nccl`), each bucket is the concatenation of its gradients on the
//! device, handed to NCCL where it lies ([`kolo::Communicator::all_reduce_device`]): queued on the
//! engine's own stream after an event recorded on candle's stream, so the reduction overlaps the
//! rest of backward, with no copy through host memory. The averaged gradients are views of the
//! reduced bucket.
//!
//! Without the `cuda` feature nothing here can exist: the types are empty and never built.

#[cfg(feature = "cuda")]
pub(crate) use cuda::{DeviceBuckets, InFlight};
#[cfg(not(feature = "cuda"))]
pub(crate) use host_only::{DeviceBuckets, InFlight};

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::{DType, Device, Tensor};
    use kolo::{Communicator, ReduceOp};

    use crate::gpu::TensorWork;

    use crate::error::{Result, TrainError};

    /// This pass's gradients, waiting for their bucket to be complete.
    pub(crate) struct DeviceBuckets {
        device: Device,
        parts: Vec<Option<Tensor>>,
    }

    /// A bucket being reduced: the work and the bucket (alive until the reduction is done).
    pub(crate) struct InFlight {
        work: TensorWork,
        flat: Tensor,
    }

    fn unsupported(what: String) -> TrainError {
        TrainError::Unsupported { what }
    }

    impl DeviceBuckets {
        /// Buckets for `params` parameters on `device`, when `comm` can reduce them there (its
        /// engine has device collectives on that GPU); `None` otherwise.
        pub(crate) fn on(comm: &Communicator, device: &Device, params: usize) -> Option<Self> {
            let Device::Cuda(d) = device else {
                return None;
            };
            let ordinal = d.cuda_stream().context().ordinal();
            (comm.size() > 1 && comm.device_ordinal() == Some(ordinal)).then(|| DeviceBuckets {
                device: device.clone(),
                parts: vec![None; params],
            })
        }

        /// Forgets the gradients of an earlier pass.
        pub(crate) fn clear(&mut self) {
            self.parts.iter_mut().for_each(|p| *p = None);
        }

        /// Parameter `index`'s gradient (`None`: zeros of `numel` elements), flattened, in
        /// `dtype`.
        pub(crate) fn put(
            &mut self,
            index: usize,
            grad: Option<&Tensor>,
            (numel, dtype): (usize, DType),
        ) -> Result<()> {
            let t = match grad {
                Some(g) => g.flatten_all()?.to_dtype(dtype)?,
                None => Tensor::zeros(numel, dtype, &self.device)?,
            };
            self.parts[index] = Some(t);
            Ok(())
        }

        /// Concatenates the gradients of `params` (in bucket order) into a new bucket on the
        /// device and queues its reduction with `op`.
        pub(crate) fn launch(
            &mut self,
            comm: &Communicator,
            params: &[usize],
            op: ReduceOp,
        ) -> Result<InFlight> {
            let parts = params
                .iter()
                .map(|&p| {
                    self.parts[p]
                        .take()
                        .ok_or_else(|| unsupported(format!("bucket gradient {p} missing")))
                })
                .collect::<Result<Vec<_>>>()?;
            // A fresh buffer even for one gradient: NCCL writes it in place while candle may
            // still hold the gradient.
            let flat = match parts.as_slice() {
                [one] => one.copy()?,
                many => Tensor::cat(many, 0)?,
            };
            let work = crate::gpu::all_reduce_tensor(comm, &flat, op)?;
            Ok(InFlight { work, flat })
        }
    }

    impl InFlight {
        /// The reduced bucket, once the reduction has completed.
        pub(crate) fn wait(self) -> Result<Tensor> {
            self.work.wait()?;
            Ok(self.flat)
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod host_only {
    use candle_core::{DType, Device, Tensor};
    use kolo::{Communicator, ReduceOp};

    use crate::error::Result;

    /// Never built without the `cuda` feature.
    pub(crate) enum DeviceBuckets {}

    /// Never built without the `cuda` feature.
    pub(crate) enum InFlight {}

    impl DeviceBuckets {
        /// Without CUDA no parameter is on a GPU.
        pub(crate) fn on(_comm: &Communicator, _device: &Device, _params: usize) -> Option<Self> {
            None
        }

        pub(crate) fn clear(&mut self) {
            match *self {}
        }

        pub(crate) fn put(
            &mut self,
            _index: usize,
            _grad: Option<&Tensor>,
            _at: (usize, DType),
        ) -> Result<()> {
            match *self {}
        }

        pub(crate) fn launch(
            &mut self,
            _comm: &Communicator,
            _params: &[usize],
            _op: ReduceOp,
        ) -> Result<InFlight> {
            match *self {}
        }
    }

    impl InFlight {
        pub(crate) fn wait(self) -> Result<Tensor> {
            match self {}
        }
    }
}
