//! The GPU side of the engine: the CUDA context and stream its NCCL calls run on, the device
//! buffers host data is staged through, and waiting for the stream with a deadline (a collective
//! whose peer died never completes: NCCL must be aborted, not waited on forever).

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use kolo_core::{Error, Result};

/// The CUDA context of one GPU and the stream kolo's collectives run on.
#[derive(Debug)]
pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
}

/// A CUDA driver error as kolo's.
pub(crate) fn driver_error(
    op: &'static str,
    rank: usize,
    what: &str,
    e: impl std::fmt::Debug,
) -> Error {
    Error::Backend {
        op,
        rank,
        backend: "nccl",
        reason: format!("CUDA {what}: {e:?}"),
    }
}

impl Gpu {
    /// The primary context of the GPU of the rank with local rank `local_rank` (the rule of
    /// [`kolo_core::gpu::device_ordinal`]) and a new stream on it.
    pub(crate) fn open(local_rank: usize, rank: usize) -> Result<Gpu> {
        let count = CudaContext::device_count()
            .map_err(|e| driver_error("init", rank, "device count", e))?;
        let ordinal = kolo_core::gpu::device_ordinal(
            kolo_core::settings::ProcessEnv,
            (rank, local_rank),
            count.max(0) as usize,
        )?;
        let ctx =
            CudaContext::new(ordinal).map_err(|e| driver_error("init", rank, "context", e))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_error("init", rank, "stream", e))?;
        Ok(Gpu { ctx, stream })
    }

    /// Makes the context current on the calling thread (NCCL and the driver act on it).
    pub(crate) fn bind(&self, op: &'static str, rank: usize) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error(op, rank, "context", e))
    }

    /// Waits until `done` (a stream's or an event's query) says the GPU work has run. Polls, so
    /// that it can give up at `deadline` (`Ok(false)`), return `interrupted`'s error (a peer's
    /// abort) or NCCL's asynchronous error (`async_error`, checked while waiting).
    pub(crate) fn wait(
        &self,
        op: &'static str,
        rank: usize,
        deadline: Instant,
        interrupted: &dyn Fn() -> Result<()>,
        async_error: &dyn Fn() -> Result<()>,
        done: &dyn Fn() -> Result<bool>,
    ) -> Result<bool> {
        self.bind(op, rank)?;
        let started = Instant::now();
        let mut spins = 0u32;
        loop {
            if done()? {
                return Ok(true);
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                async_error()?;
                interrupted()?;
                if Instant::now() >= deadline {
                    return Ok(false);
                }
            }
            if started.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
}

/// Whether the GPU work behind a CUDA query (`cuStreamQuery`, `cuEventQuery`) has run.
pub(crate) fn query(
    op: &'static str,
    rank: usize,
    what: &str,
    q: impl FnOnce() -> cudarc::driver::sys::CUresult,
) -> Result<bool> {
    use cudarc::driver::sys::CUresult;
    match q() {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        e => Err(driver_error(op, rank, what, e)),
    }
}

/// A device buffer reused from call to call, grown when a call needs more.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    buf: Option<CudaSlice<u8>>,
}

impl Staging {
    /// At least `len` bytes of device memory (contents undefined).
    pub(crate) fn ensure(
        &mut self,
        gpu: &Gpu,
        len: usize,
        rank: usize,
    ) -> Result<&mut CudaSlice<u8>> {
        let small = self.buf.as_ref().is_none_or(|b| b.len() < len);
        if small {
            // Free the old one first: the peak is the new size, not both.
            self.buf = None;
            // SAFETY: bytes need no initialization; every use writes before it reads.
            let b = unsafe { gpu.stream.alloc::<u8>(len.max(1)) }
                .map_err(|e| driver_error("alloc", rank, &format!("alloc of {len} bytes"), e))?;
            self.buf = Some(b);
        }
        match self.buf.as_mut() {
            Some(b) => Ok(b),
            None => Err(driver_error("alloc", rank, "staging buffer", "missing")),
        }
    }
}

/// Host bytes into the start of `dev` (queued on the stream).
pub(crate) fn upload(gpu: &Gpu, src: &[u8], dev: &mut CudaSlice<u8>, rank: usize) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    let mut view = dev.slice_mut(..src.len());
    gpu.stream
        .memcpy_htod(src, &mut view)
        .map_err(|e| driver_error("copy", rank, "host-to-device copy", e))
}

/// The start of `dev` into host bytes; returns once they are there.
pub(crate) fn download(gpu: &Gpu, dev: &CudaSlice<u8>, dst: &mut [u8], rank: usize) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    let view = dev.slice(..dst.len());
    gpu.stream
        .memcpy_dtoh(&view, dst)
        .map_err(|e| driver_error("copy", rank, "device-to-host copy", e))?;
    gpu.stream
        .synchronize()
        .map_err(|e| driver_error("copy", rank, "synchronize", e))
}

/// The raw device address of `dev`'s start, for NCCL, at `offset` bytes.
pub(crate) fn ptr(gpu: &Gpu, dev: &CudaSlice<u8>, offset: usize) -> *const c_void {
    let (p, _sync) = dev.device_ptr(&gpu.stream);
    (p as usize + offset) as *const c_void
}

/// [`ptr`] for writing.
pub(crate) fn ptr_mut(gpu: &Gpu, dev: &mut CudaSlice<u8>, offset: usize) -> *mut c_void {
    let (p, _sync) = dev.device_ptr_mut(&gpu.stream);
    (p as usize + offset) as *mut c_void
}
