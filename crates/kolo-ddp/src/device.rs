//! Where a worker's tensors live: the CPU (kolo's kernels), or with the `cuda` feature one GPU per
//! rank, GPU number *local rank* of its host (PyTorch's `torch.cuda.set_device(local_rank)`;
//! `KOLO_CUDA_DEVICE` names another, see [`kolo::gpu_ordinal`]).
//!
//! The training stack is device-generic: kolo's CPU kernels step aside for candle's own ops on a
//! GPU and the optimizers fall back to candle's tensor arithmetic. DDP's gradient buckets stay on
//! the GPU and go to NCCL from there when the job runs on NCCL (`KOLO_BACKEND=nccl`); on kolo's
//! own transports they travel through host memory.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// The kind of device a run trains on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The CPU (the default).
    #[default]
    Cpu,
    /// An NVIDIA GPU through candle's CUDA backend (the `cuda` feature).
    Cuda,
}

impl DeviceKind {
    /// The device of rank `rank` with local rank `local_rank`: the CPU, or its GPU (GPU
    /// `local_rank` unless `KOLO_CUDA_DEVICE` says otherwise: [`kolo::gpu_ordinal`]).
    pub fn device(self, (rank, local_rank): (usize, usize)) -> Result<Device> {
        match self {
            DeviceKind::Cpu => Ok(Device::Cpu),
            DeviceKind::Cuda => cuda(rank, local_rank),
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda(rank: usize, local_rank: usize) -> Result<Device> {
    use candle_core::cuda::cudarc::driver::CudaContext;
    let unusable = |e: String| TrainError::InvalidArgument {
        arg: "device",
        reason: format!("rank {rank} has no GPU to train on: {e}"),
    };
    let visible = CudaContext::device_count().map_err(|e| unusable(format!("{e:?}")))?;
    let env = kolo::settings::ProcessEnv;
    let ordinal = kolo::gpu_ordinal(env, (rank, local_rank), visible.max(0) as usize)
        .map_err(|e| unusable(e.to_string()))?;
    Device::new_cuda(ordinal).map_err(|e| TrainError::InvalidArgument {
        arg: "device",
        reason: format!("GPU {ordinal} (rank {rank}'s) cannot be used: {e}"),
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda(_rank: usize, _local_rank: usize) -> Result<Device> {
    Err(TrainError::InvalidArgument {
        arg: "device",
        reason: "this build of kolo has no CUDA support: build it with `--features \
                 kolo-cli/cuda` (which needs CUDA's nvcc; the book's *GPUs* chapter, \
                 docs/src/gpus.md)"
            .into(),
    })
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        })
    }
}

impl FromStr for DeviceKind {
    type Err = TrainError;

    /// Parses `cpu` or `cuda` (`gpu`), case-insensitive; anything else is
    /// [`TrainError::InvalidArgument`] naming the valid ones.
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" | "gpu" => Ok(DeviceKind::Cuda),
            other => Err(TrainError::InvalidArgument {
                arg: "device",
                reason: format!("unknown device '{other}': expected cpu or cuda"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print() {
        assert_eq!("CPU".parse::<DeviceKind>().ok(), Some(DeviceKind::Cpu));
        assert_eq!("cuda".parse::<DeviceKind>().ok(), Some(DeviceKind::Cuda));
        assert_eq!("gpu".parse::<DeviceKind>().ok(), Some(DeviceKind::Cuda));
        let e = "tpu"
            .parse::<DeviceKind>()
            .expect_err("no TPUs")
            .to_string();
        assert!(e.contains("expected cpu or cuda"), "{e}");
        assert_eq!(DeviceKind::Cuda.to_string(), "cuda");
        assert!(matches!(DeviceKind::Cpu.device((3, 3)), Ok(Device::Cpu)));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_how_to_get_it() {
        let e = DeviceKind::Cuda
            .device((0, 0))
            .expect_err("no CUDA in this build");
        assert!(e.to_string().contains("--features kolo-cli/cuda"), "{e}");
    }
}
