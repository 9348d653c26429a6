//! # kolo-nccl
//!
//! kolo on NVIDIA's NCCL, the collective library of every GPU cluster: [`NcclEngine`] is a
//! [`kolo_core::Engine`] whose collectives are NCCL's (`ncclAllReduce`, `ncclBroadcast`,
//! `ncclReduce`, `ncclReduceScatter`, `ncclAllGather`; gather, scatter, all-to-all and the
//! variable-size forms as grouped `ncclSend`/`ncclRecv`), one process per GPU. Programs do not use
//! this crate directly: build `kolo` with the `nccl` feature and start the job with
//! `KOLO_BACKEND=nccl` (under `kolo run`, torchrun, `mpirun` or `srun`); `kolo::init()` then
//! connects kolo's own transports as always (point-to-point messages, heartbeats, the store),
//! rank 0 publishes NCCL's unique id through the rendezvous store (as PyTorch's
//! `ProcessGroupNCCL` does) and every rank joins the NCCL communicator on GPU `LOCAL_RANK`.
//!
//! - **Buffers.** The [`kolo_core::Engine`] methods take host memory: it is staged through
//!   device buffers kept from call to call (upload, NCCL, download). GPU tensors skip the copies:
//!   [`NcclEngine::all_reduce_device`] reduces a `CudaSlice` in place.
//! - **Same results as kolo's algorithms.** `Avg` reduces as a sum and divides on the host with
//!   kolo's own code, so integer averages truncate as everywhere in kolo.
//! - **Never a silent hang.** Before each collective the ranks agree on its fingerprint (a
//!   16-byte NCCL all-reduce; a rank in another call is an [`kolo_core::Error::Mismatch`] naming
//!   it), every wait on the GPU polls with the communicator's timeout and checks NCCL's
//!   asynchronous error, and a collective that does not complete aborts the NCCL communicator
//!   (`ncclCommAbort`) and returns an error; a peer that died is named by kolo's transport
//!   heartbeats while the agreement waits.
//! - **No CUDA needed to build.** NCCL is loaded at run time ([`version`] says which; set
//!   `KOLO_NCCL_LIBRARY` to choose the file), the CUDA driver through cudarc's dynamic loading: a
//!   build with the `nccl` feature runs on machines without GPUs, and asking one of them for NCCL
//!   is an error naming the missing library.
//!
//! ```
//! // Where kolo's NCCL engine could run: a count of GPUs, or why there are none.
//! match kolo_nccl::device_count() {
//!     Ok(n) => println!("{n} CUDA device(s)"),
//!     Err(e) => println!("no NCCL here: {e}"),
//! }
//! ```
#![warn(missing_docs)]

mod device;
mod engine;
mod ffi;
#[cfg(test)]
mod tests;
mod types;

pub use engine::{NcclEngine, NcclId, Watch};
pub use ffi::{version, UNIQUE_ID_BYTES};

/// The number of CUDA devices this process sees, or an error naming why none can be used (no
/// driver library, no device).
pub fn device_count() -> kolo_core::Result<usize> {
    driver_present()?;
    let n = cudarc::driver::CudaContext::device_count()
        .map_err(|e| device::driver_error("init", 0, "device count", e))?;
    Ok(n.max(0) as usize)
}

/// Whether the CUDA driver library can be loaded (cudarc would panic on the first call if not).
pub(crate) fn driver_present() -> kolo_core::Result<()> {
    for name in ["libcuda.so.1", "libcuda.so"] {
        // SAFETY: loading the driver library runs no code with preconditions.
        if unsafe { libloading::Library::new(name) }.is_ok() {
            return Ok(());
        }
    }
    Err(ffi::unavailable(
        "the CUDA driver library (libcuda.so.1) could not be loaded: NCCL needs an NVIDIA GPU \
         and its driver on this host"
            .into(),
    ))
}
