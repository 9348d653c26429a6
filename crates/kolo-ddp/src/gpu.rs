//! Collectives on candle's GPU tensors: [`all_reduce_tensor`] reduces a CUDA tensor in place over
//! a communicator whose engine works on GPU memory (NCCL, `KOLO_BACKEND=nccl`), as
//! `torch.distributed.all_reduce(tensor)` does on a GPU tensor — with no copy through host memory.
//! The reduction is queued on the engine's own stream after the work candle has queued so far, so
//! candle's stream goes on meanwhile; read the tensor after [`TensorWork::wait`].
//!
//! ```no_run
//! # fn f(comm: &kolo::Communicator) -> kolo_ddp::Result<()> {
//! use candle_core::{Device, Tensor};
//! let t = Tensor::ones(1024, candle_core::DType::F32, &Device::new_cuda(0)?)?;
//! kolo_ddp::gpu::all_reduce_tensor(comm, &t, kolo::ReduceOp::Sum)?.wait()?;
//! # Ok(()) }
//! ```

use candle_core::cuda::cudarc::driver::{CudaEvent, DevicePtr};
use candle_core::{DType, Storage, Tensor};
use kolo::{Communicator, DeviceBuffer, DeviceWork, ReduceOp};

use crate::error::{Result, TrainError};

/// A queued reduction of a GPU tensor: the tensor holds the result after [`TensorWork::wait`].
#[derive(Debug)]
#[must_use = "the tensor holds the result only after wait()"]
pub struct TensorWork {
    work: DeviceWork,
    /// What the engine's stream waits for before it reads the tensor.
    _ready: CudaEvent,
}

impl TensorWork {
    /// Waits until the reduction has completed (the communicator's timeout bounds the wait; an
    /// error poisons the communicator).
    pub fn wait(self) -> Result<()> {
        Ok(self.work.wait()?)
    }
}

fn unsupported(what: String) -> TrainError {
    TrainError::Unsupported { what }
}

/// Reduces contiguous CUDA tensor `t` in place over all ranks of `comm` with `op` (every rank
/// gets the result), on the GPU: queued at once, read after [`TensorWork::wait`]. The tensor must
/// be f32, f64, f16 or bf16 and on the GPU of `comm`'s engine
/// ([`Communicator::device_ordinal`]); no other tensor may share its storage while it is reduced.
/// Collective. The flight record names the caller's line.
#[track_caller]
pub fn all_reduce_tensor(comm: &Communicator, t: &Tensor, op: ReduceOp) -> Result<TensorWork> {
    let dtype = match t.dtype() {
        DType::F32 => kolo::DType::F32,
        DType::F64 => kolo::DType::F64,
        DType::F16 => kolo::DType::F16,
        DType::BF16 => kolo::DType::BF16,
        other => {
            return Err(unsupported(format!(
                "all-reducing {other:?} tensors on the GPU"
            )))
        }
    };
    let (ptr, stream) = {
        let (storage, layout) = t.storage_and_layout();
        let Storage::Cuda(cs) = &*storage else {
            return Err(unsupported(format!(
                "all_reduce_tensor on a tensor on {:?}: it takes CUDA tensors",
                t.device()
            )));
        };
        if !layout.is_contiguous() {
            return Err(unsupported("all_reduce_tensor on a strided tensor".into()));
        }
        let ordinal = cs.device.cuda_stream().context().ordinal();
        if comm.device_ordinal() != Some(ordinal) {
            return Err(unsupported(format!(
                "all_reduce_tensor on GPU {ordinal}: the communicator's collectives run on {} \
                 (GPU tensors need KOLO_BACKEND=nccl, and the rank's own GPU)",
                match comm.device_ordinal() {
                    Some(d) => format!("GPU {d}"),
                    None => "the host".to_owned(),
                }
            )));
        }
        let stream = cs.device.cuda_stream();
        let base = match t.dtype() {
            DType::F32 => cs.as_cuda_slice::<f32>()?.device_ptr(&stream).0,
            DType::F64 => cs.as_cuda_slice::<f64>()?.device_ptr(&stream).0,
            DType::F16 => cs.as_cuda_slice::<kolo::f16>()?.device_ptr(&stream).0,
            _ => cs.as_cuda_slice::<kolo::bf16>()?.device_ptr(&stream).0,
        };
        let offset = (layout.start_offset() * t.dtype().size_in_bytes()) as u64;
        (base + offset, stream)
    };
    // The engine's stream starts once what candle queued so far (the tensor's producers) is done.
    let ready = stream
        .record_event(None)
        .map_err(|e| unsupported(format!("a CUDA event for the reduction: {e:?}")))?;
    let work = comm.all_reduce_device(
        DeviceBuffer {
            ptr,
            count: t.elem_count(),
            dtype,
            ready: ready.cu_event() as usize,
        },
        op,
    )?;
    Ok(TensorWork {
        work,
        _ready: ready,
    })
}
