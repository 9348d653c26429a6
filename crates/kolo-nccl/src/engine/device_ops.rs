//! The engine's collectives on GPU memory ([`DeviceCollectives`]): NCCL on the engine's own
//! stream, after the producer's `ready` event, so they overlap whatever the producer queues next
//! (the rest of a backward pass); each queued collective records a completion event, which
//! [`DeviceCollectives::wait`] polls with the communicator's deadline.

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::sys::{cuEventQuery, cuStreamWaitEvent, CUevent, CUevent_flags, CUresult};
use kolo_core::{DType, DeviceBuffer, DeviceCollectives, DeviceTicket, Error, ReduceOp, Result};

use super::NcclEngine;
use crate::device::{driver_error, query};
use crate::ffi::Stream;
use crate::types::{data_type, device_op};

const OP: &str = "all_reduce";

impl NcclEngine {
    /// In-place all-reduce of a buffer in GPU memory (`dtype` must match `T`'s size), waited for:
    /// [`DeviceCollectives::all_reduce_async`] and [`DeviceCollectives::wait`] in one call. `Avg` is
    /// NCCL's `ncclAvg`. Collective.
    pub fn all_reduce_device<T: cudarc::driver::DeviceRepr>(
        &self,
        buf: &mut cudarc::driver::CudaSlice<T>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        if dtype.size() != std::mem::size_of::<T>() {
            return Err(Error::InvalidArgument {
                op: OP,
                rank: self.rank,
                arg: "dtype",
                reason: format!(
                    "{dtype:?} has {} bytes per element, the buffer's type {}",
                    dtype.size(),
                    std::mem::size_of::<T>()
                ),
            });
        }
        let count = buf.len();
        let ticket = {
            // The slice's own stream orders its earlier writes before the engine's stream.
            let (ptr, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(buf, &self.gpu.stream);
            self.all_reduce_async(
                DeviceBuffer {
                    ptr,
                    count,
                    dtype,
                    ready: 0,
                },
                op,
            )?
        };
        self.wait(ticket, Instant::now() + self.timeout, &|| Ok(()))
    }
}

impl DeviceCollectives for NcclEngine {
    fn device_ordinal(&self) -> usize {
        self.device()
    }

    fn all_reduce_async(&self, buf: DeviceBuffer, op: ReduceOp) -> Result<DeviceTicket> {
        let mut st = self.lock(OP)?;
        self.gpu.bind(OP, self.rank)?;
        let stream = self.gpu.stream.cu_stream();
        if buf.ready != 0 {
            // SAFETY: the caller's event, alive for this call; the wait is queued on our stream.
            let rc = unsafe { cuStreamWaitEvent(stream, buf.ready as CUevent, 0) };
            if rc != CUresult::CUDA_SUCCESS {
                return Err(driver_error(
                    OP,
                    self.rank,
                    "wait for the buffer's event",
                    rc,
                ));
            }
        }
        let p = buf.ptr as usize as *mut c_void;
        let (dt, rop) = (data_type(buf.dtype), device_op(op));
        // SAFETY: the caller vouches that `count` elements of `dtype` lie at `ptr` on this
        // engine's GPU and stay allocated until the ticket is waited for.
        let rc = unsafe {
            (self.nccl.all_reduce)(p, p, buf.count, dt, rop, st.comm.0, stream as Stream)
        };
        self.check(OP, rc)?;
        let deadline = Instant::now() + self.timeout;
        match self.settle(OP, st.comm.0, deadline, &*self.watch) {
            Ok(true) => {}
            Ok(false) => {
                let e = Error::Backend {
                    op: OP,
                    rank: self.rank,
                    backend: "nccl",
                    reason: format!(
                        "NCCL did not queue the all-reduce within {:?} (the NCCL communicator \
                         is aborted)",
                        self.timeout
                    ),
                };
                return Err(self.abort(&mut st, e));
            }
            Err(e) => return Err(self.abort(&mut st, e)),
        }
        let event = self
            .gpu
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| driver_error(OP, self.rank, "completion event", e))?;
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.inflight.insert(ticket, event);
        Ok(DeviceTicket(ticket))
    }

    fn wait(
        &self,
        ticket: DeviceTicket,
        deadline: Instant,
        interrupted: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let mut st = self.lock(OP)?;
        let Some(event) = st.inflight.remove(&ticket.0) else {
            return Err(Error::InvalidArgument {
                op: OP,
                rank: self.rank,
                arg: "ticket",
                reason: format!(
                    "device collective {} is not queued on this engine (waited for already?)",
                    ticket.0
                ),
            });
        };
        let ev = event.cu_event();
        let rank = self.rank;
        self.wait_until(OP, &mut st, (deadline, interrupted), &|| {
            // SAFETY: `event` is alive until this wait returns.
            query(OP, rank, "event", || unsafe { cuEventQuery(ev) })
        })
    }
}
