//! [`EngineBackend`]: the collectives of a communicator with a collective [`Engine`] (MPI today):
//! the ranks first agree on the call, then the engine runs the whole collective. A collective the
//! cost model gives kolo instead (an all-reduce with a forced algorithm) runs kolo's own algorithm
//! over the engine's point-to-point transport.

use std::sync::Arc;
use std::time::Instant;

use kolo_collectives::select::Group;
use kolo_core::{Algorithm, DType, DeviceBuffer, DeviceTicket, Engine, ReduceOp, Result};

use super::{no_device_collectives, Backend, Job, Members, Native, Runner};

/// Any [`Engine`] as a communicator's backend.
pub(crate) struct EngineBackend {
    engine: Arc<dyn Engine>,
    /// For the collectives whose algorithm is kolo's own.
    native: Native,
}

impl EngineBackend {
    pub fn new(engine: Arc<dyn Engine>, at: &Members) -> EngineBackend {
        EngineBackend {
            engine,
            native: Native::new(at, true),
        }
    }

    /// Whether the cost model gave `job` to kolo's own algorithms rather than the engine.
    fn native(&self, job: Job) -> Option<&Native> {
        (job.call.algo != Algorithm::Engine).then_some(&self.native)
    }

    /// Runs `job` on the engine: the ranks first agree on the call (unless `KOLO_CONFIRM_CALLS=0`),
    /// then `f` runs it. An error poisons the communicator.
    fn run(&self, job: Job, f: impl FnOnce(&dyn Engine) -> Result<()>) -> Result<()> {
        let comm = job.comm;
        comm.check()?;
        let engine = &*self.engine;
        let header = comm.collective_header(job.seq, job.call);
        let agreed = if comm.config().confirm_calls {
            let deadline = Instant::now() + comm.config().timeout;
            // A peer's abort arrives through the transport while this rank waits for the others.
            let interrupted = || match comm.transport().failure() {
                Some(f) => Err(f.into_error(job.call.op.name(), comm.rank())),
                None => Ok(()),
            };
            engine.agree(&header, deadline, &interrupted)
        } else {
            Ok(())
        };
        agreed.and_then(|()| f(engine)).map_err(|e| comm.poison(e))
    }

    /// The engine's device collectives, or the error saying it has none.
    fn device(&self, rank: usize) -> Result<&dyn kolo_core::DeviceCollectives> {
        self.engine
            .device()
            .ok_or_else(|| no_device_collectives(rank, self.engine.name()))
    }
}

impl Backend for EngineBackend {
    fn name(&self) -> &'static str {
        self.engine.name()
    }

    fn engine(&self) -> Option<&Arc<dyn Engine>> {
        Some(&self.engine)
    }

    fn group(&self) -> &Group {
        self.native.group()
    }

    fn barrier(&self, job: Job) -> Result<()> {
        match self.native(job) {
            Some(native) => native.barrier(job),
            None => self.run(job, |e| e.barrier()),
        }
    }

    fn broadcast(&self, job: Job, buf: &mut [u8], dtype: DType, root: usize) -> Result<()> {
        match self.native(job) {
            Some(native) => native.broadcast(job, buf, dtype, root),
            None => self.run(job, |e| e.broadcast(buf, dtype, root)),
        }
    }

    fn all_reduce(&self, job: Job, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        match self.native(job) {
            Some(native) => native.all_reduce(job, buf, dtype, op),
            None => self.run(job, |e| e.all_reduce(buf, dtype, op)),
        }
    }

    fn reduce(
        &self,
        job: Job,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        match self.native(job) {
            Some(native) => native.reduce(job, buf, dtype, op, root),
            None => self.run(job, |e| e.reduce(buf, dtype, op, root)),
        }
    }

    fn reduce_scatter(
        &self,
        job: Job,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        match self.native(job) {
            Some(native) => native.reduce_scatter(job, send, recv, dtype, op),
            None => self.run(job, |e| e.reduce_scatter(send, recv, dtype, op)),
        }
    }

    fn all_gather(
        &self,
        job: Job,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
    ) -> Result<()> {
        match self.native(job) {
            Some(native) => native.all_gather(job, send, recv, dtype, counts),
            None => self.run(job, |e| e.all_gather(send, recv, dtype, counts)),
        }
    }

    fn gather(
        &self,
        job: Job,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
    ) -> Result<()> {
        match self.native(job) {
            Some(native) => native.gather(job, send, recv, dtype, counts, root),
            None => self.run(job, |e| e.gather(send, recv, dtype, counts, root)),
        }
    }

    fn scatter(
        &self,
        job: Job,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
    ) -> Result<()> {
        match self.native(job) {
            Some(native) => native.scatter(job, send, recv, dtype, counts, root),
            None => self.run(job, |e| e.scatter(send, recv, dtype, counts, root)),
        }
    }

    fn all_to_all(
        &self,
        job: Job,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<(&[usize], &[usize])>,
    ) -> Result<()> {
        match self.native(job) {
            Some(native) => native.all_to_all(job, send, recv, dtype, counts),
            None => self.run(job, |e| e.all_to_all(send, recv, dtype, counts)),
        }
    }

    fn device_all_reduce(&self, job: Job, buf: DeviceBuffer, op: ReduceOp) -> Result<DeviceTicket> {
        // Device memory goes to the engine whatever algorithm the cost model named: kolo's own
        // algorithms work on host memory.
        let device = self
            .device(job.comm.rank())
            .map_err(|e| job.comm.poison(e))?;
        let mut ticket = None;
        self.run(job, |_| {
            ticket = Some(device.all_reduce_async(buf, op)?);
            Ok(())
        })?;
        ticket.ok_or_else(|| no_device_collectives(job.comm.rank(), self.engine.name()))
    }

    fn device_wait(&self, comm: &dyn Runner, ticket: DeviceTicket) -> Result<()> {
        let device = self.device(comm.rank())?;
        let deadline = Instant::now() + comm.config().timeout;
        let interrupted = || match comm.transport().failure() {
            Some(f) => Err(f.into_error("all_reduce", comm.rank())),
            None => Ok(()),
        };
        device
            .wait(ticket, deadline, &interrupted)
            .map_err(|e| comm.poison(e))
    }
}
