//! [`EngineBackend`]: the collectives of a communicator with a collective [`Engine`] (MPI today):
//! the ranks first agree on the call, then the engine runs the whole collective. A collective the
//! cost model gives kolo instead (an all-reduce with a forced algorithm) runs kolo's own algorithm
//! over the engine's point-to-point transport.

use std::sync::Arc;
use std::time::Instant;

use kolo_collectives::select::Group;
use kolo_core::{Algorithm, DeviceBuffer, DeviceTicket, Engine, ReduceOp, Result};

use super::native::blocks;
use super::{no_device_collectives, Backend, Collective, Job, Members, Native, Runner};

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
    fn run_on_engine(&self, job: Job, f: impl FnOnce(&dyn Engine) -> Result<()>) -> Result<()> {
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

    fn run(&self, job: Job, c: Collective<'_>) -> Result<()> {
        if let Some(native) = self.native(job) {
            return native.run(job, c);
        }
        self.run_on_engine(job, |e| match c {
            Collective::Barrier => e.barrier(),
            Collective::Broadcast { buf, dtype, root } => e.broadcast(buf, dtype, root),
            Collective::AllReduce { buf, dtype, op } => e.all_reduce(buf, dtype, op),
            Collective::Reduce {
                buf,
                dtype,
                op,
                root,
            } => e.reduce(buf, dtype, op, root),
            Collective::ReduceScatter {
                send,
                recv,
                dtype,
                op,
            } => e.reduce_scatter(send, recv, dtype, op),
            Collective::AllGather {
                send,
                recv,
                dtype,
                counts,
            } => e.all_gather(send, recv, dtype, counts),
            Collective::AllGatherInPlace { buf, dtype, counts } => {
                // Engines gather from a send buffer of their own: this rank's block, copied.
                let (n, size) = (job.comm.size(), dtype.size());
                let at =
                    blocks(buf.len() / size / n.max(1), n, counts, size)[job.comm.rank()].clone();
                let own = buf[at].to_vec();
                e.all_gather(&own, buf, dtype, counts)
            }
            Collective::Rooted {
                send,
                recv,
                dtype,
                counts,
                root,
                scatter: false,
            } => e.gather(send, recv, dtype, counts, root),
            Collective::Rooted {
                send,
                recv,
                dtype,
                counts,
                root,
                scatter: true,
            } => e.scatter(send, recv, dtype, counts, root),
            Collective::AllToAll {
                send,
                recv,
                dtype,
                counts,
            } => e.all_to_all(send, recv, dtype, counts),
        })
    }

    fn device_all_reduce(&self, job: Job, buf: DeviceBuffer, op: ReduceOp) -> Result<DeviceTicket> {
        // Device memory goes to the engine whatever algorithm the cost model named: kolo's own
        // algorithms work on host memory.
        let device = self
            .device(job.comm.rank())
            .map_err(|e| job.comm.poison(e))?;
        let mut ticket = None;
        self.run_on_engine(job, |_| {
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
