//! Collectives on GPU memory: what an [`Engine`](crate::Engine) whose library works on device
//! buffers (NCCL) offers besides its host-memory collectives, so that a GPU tensor goes to the
//! library where it lies instead of through host memory.
//!
//! kolo-core knows no CUDA types: a buffer is its raw device address and an event handle, as
//! NCCL's C API takes them. The operations are asynchronous, as on every GPU library: `*_async`
//! queues the collective on the engine's own communication stream (after the producer's `ready`
//! event, so it overlaps the work that follows on the producer's stream) and returns a
//! [`DeviceTicket`]; [`DeviceCollectives::wait`] waits for it with a deadline, so a collective whose
//! peer died is an error, never a hang.

use std::time::Instant;

use crate::{DType, ReduceOp, Result};

/// Device memory reduced in place: `count` elements of `dtype` at CUDA device address `ptr`, on
/// the engine's GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBuffer {
    /// The CUDA device address (`CUdeviceptr`) of the first element.
    pub ptr: u64,
    /// Elements.
    pub count: usize,
    /// Their type.
    pub dtype: DType,
    /// A CUDA event (`CUevent`) recorded on the producer's stream after the buffer's last write:
    /// the collective starts once it has completed. `0`: the buffer is ready now.
    pub ready: usize,
}

/// A queued device collective, to wait for with [`DeviceCollectives::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceTicket(pub u64);

/// Collectives on device memory (see the module documentation). Collective: every rank of the
/// engine's group queues the same operations in the same order.
pub trait DeviceCollectives: Send + Sync {
    /// The CUDA device ordinal the engine's buffers must be on.
    fn device_ordinal(&self) -> usize;

    /// Queues an in-place reduction of `buf` over all ranks (result everywhere) on the engine's
    /// communication stream, once `buf.ready` has completed, and returns without waiting.
    fn all_reduce_async(&self, buf: DeviceBuffer, op: ReduceOp) -> Result<DeviceTicket>;

    /// Waits until the collective of `ticket` has completed on the GPU (so `buf` holds the result),
    /// or fails: at `deadline` (the engine is aborted: later calls fail at once), on the library's
    /// asynchronous error, or with `interrupted`'s error (a peer's failure). Each ticket is waited
    /// for once; tickets may be waited for in any order.
    fn wait(
        &self,
        ticket: DeviceTicket,
        deadline: Instant,
        interrupted: &dyn Fn() -> Result<()>,
    ) -> Result<()>;
}
