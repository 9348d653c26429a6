//! The seam between a communicator's collectives and what runs them.
//!
//! A communicator checks a collective's arguments, builds its fingerprint (the algorithm chosen by
//! the one cost model, `kolo_collectives::select::choose`) and makes one call on its [`Backend`],
//! chosen once when the communicator is made ([`choose`]):
//!
//! - [`Native`]: kolo's own algorithms (`kolo_collectives::algorithms`) over the transport;
//! - [`EngineBackend`]: any [`Engine`] (a library that runs whole collectives, MPI today), which
//!   hands collectives whose algorithm is not [`kolo_core::Algorithm::Engine`] (a forced all-reduce)
//!   to kolo's own algorithms over the engine's point-to-point transport.
//!
//! A backend runs a [`Collective`] (one of [`Engine`]'s whole collectives as a value) for a [`Job`]
//! (which collective of the sequence, and its fingerprint). A new engine implements [`Engine`] in its own crate and is
//! passed to [`choose`]; nothing here changes.

mod engine;
mod hierarchy;
mod native;

use std::sync::Arc;

use kolo_collectives::select::Group;
use kolo_collectives::Ctx;
use kolo_core::{
    Call, DType, DeviceBuffer, DeviceTicket, Engine, Error, Header, ReduceOp, Result, Transport,
};

use crate::config::Config;
use crate::topology::Topology;

pub(crate) use engine::EngineBackend;
pub(crate) use native::Native;

/// One collective's buffers and arguments, bytes of one element type, checked by the communicator
/// (lengths agree with the counts and the group): what a communicator hands its backend.
pub(crate) enum Collective<'a> {
    /// Waits for every rank.
    Barrier,
    /// `buf` of `root` into `buf` of every rank.
    Broadcast {
        buf: &'a mut [u8],
        dtype: DType,
        root: usize,
    },
    /// Element-wise reduction of `buf` over all ranks, result everywhere.
    AllReduce {
        buf: &'a mut [u8],
        dtype: DType,
        op: ReduceOp,
    },
    /// Element-wise reduction into `buf` of `root`; other ranks' buffers unchanged.
    Reduce {
        buf: &'a mut [u8],
        dtype: DType,
        op: ReduceOp,
        root: usize,
    },
    /// `send` holds `size()` blocks of `recv.len()` bytes; rank r gets block r reduced.
    ReduceScatter {
        send: &'a [u8],
        recv: &'a mut [u8],
        dtype: DType,
        op: ReduceOp,
    },
    /// Every rank's `send` in rank order into `recv`; `counts` in elements for the variable form.
    AllGather {
        send: &'a [u8],
        recv: &'a mut [u8],
        dtype: DType,
        counts: Option<&'a [usize]>,
    },
    /// [`Collective::AllGather`] in place (MPI's `MPI_IN_PLACE`): `buf` holds every rank's block
    /// in rank order, this rank's filled in; `counts` in elements for the variable form.
    AllGatherInPlace {
        buf: &'a mut [u8],
        dtype: DType,
        counts: Option<&'a [usize]>,
    },
    /// Every rank's `send` in rank order into `recv` of `root` (`scatter`: block r of `send` on
    /// `root` into `recv` of rank r); `counts` in elements for the variable form.
    Rooted {
        send: &'a [u8],
        recv: &'a mut [u8],
        dtype: DType,
        counts: Option<&'a [usize]>,
        root: usize,
        scatter: bool,
    },
    /// Block d of `send` to rank d; the block from rank s into block s of `recv`. `counts` is
    /// `(send_counts, recv_counts)` in elements for the variable form.
    AllToAll {
        send: &'a [u8],
        recv: &'a mut [u8],
        dtype: DType,
        counts: Option<(&'a [usize], &'a [usize])>,
    },
}

/// The group that owns a transport's arena: the world communicator.
pub(crate) const ARENA_GROUP: u64 = 1;

/// The communicator as its backend sees it: the narrow set of things a backend asks of it.
/// Implemented by the communicator's state (`communicator::Inner`), so that the backends never
/// name the communicator's types and the dependency runs one way, communicator → backend.
pub(crate) trait Runner: Send + Sync {
    /// This rank in the group.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// The communicator's settings (timeout, the fingerprint step).
    fn config(&self) -> &Config;
    /// The transport it runs on (an engine's agreement watches its failures).
    fn transport(&self) -> &Arc<dyn Transport>;
    /// The first error, once the communicator has failed.
    fn check(&self) -> Result<()>;
    /// Records `e` as the communicator's failure (the first one sticks) and tells the peers.
    fn poison(&self, e: Error) -> Error;
    /// The header of collective number `seq` with fingerprint `call`.
    fn collective_header(&self, seq: u64, call: Call) -> Header;
    /// Runs `step` (one of kolo's algorithms) as collective number `seq`: its tag, fingerprint,
    /// deadline and turn; an error poisons the communicator.
    fn run_step(
        &self,
        seq: u64,
        call: Call,
        at: std::time::Instant,
        step: &mut dyn FnMut(&Ctx) -> Result<()>,
    ) -> Result<()>;
    /// The next sequence number for a blocking collective.
    fn issue_blocking(&self) -> Result<u64>;
    /// [`Runner::run_step`] from now, in the communicator's flight record (a collective of a
    /// sub-group that no communicator call started).
    fn run_recorded(
        &self,
        seq: u64,
        call: Call,
        step: &mut dyn FnMut(&Ctx) -> Result<()>,
    ) -> Result<()>;
    /// A sub-group of `members` (transport ranks) in which this process is `rank`, with group id
    /// `id`, over the same transport, topology and settings: a level of the hierarchical
    /// all-reduce.
    fn child(&self, members: Vec<usize>, rank: usize, id: u64) -> Arc<dyn Runner>;
    /// The group's id.
    fn group(&self) -> u64;
}

/// One collective as the communicator hands it to its backend: the communicator, the collective's
/// sequence number and its fingerprint (with the chosen algorithm).
#[derive(Clone, Copy)]
pub(crate) struct Job<'a> {
    pub comm: &'a dyn Runner,
    pub seq: u64,
    pub call: Call,
    /// When it started (its deadline counts from here).
    pub at: std::time::Instant,
}

impl Job<'_> {
    /// Runs `step`, one of kolo's algorithms, as this collective ([`Runner::run_step`]).
    pub fn run(self, step: impl FnOnce(&Ctx) -> Result<()>) -> Result<()> {
        let mut step = Some(step);
        self.comm
            .run_step(self.seq, self.call, self.at, &mut |ctx| match step.take() {
                Some(f) => f(ctx),
                None => Err(Error::Unsupported {
                    what: "a collective step run twice".into(),
                }),
            })
    }
}

/// Whole collectives on raw bytes of one element type, checked by the caller (lengths agree with the
/// counts and the group). Every method is collective: all ranks of the group call it in the same
/// order. An error poisons the communicator.
pub(crate) trait Backend: Send + Sync {
    /// `kolo`, or the engine's name (`mpi`): the communicator's [`crate::Communicator::backend`].
    fn name(&self) -> &'static str;
    /// The engine, if one runs the collectives (sub-groups split it too).
    fn engine(&self) -> Option<&Arc<dyn Engine>>;
    /// What the cost model needs to know about the group.
    fn group(&self) -> &Group;

    /// Runs collective `c` (its arguments checked by the communicator).
    fn run(&self, job: Job, c: Collective<'_>) -> Result<()>;

    /// Queues an in-place all-reduce of GPU memory on the engine's device collectives
    /// ([`kolo_core::DeviceCollectives`]); kolo's own algorithms work on host memory only.
    fn device_all_reduce(&self, job: Job, buf: DeviceBuffer, op: ReduceOp) -> Result<DeviceTicket> {
        let _ = (buf, op);
        Err(no_device_collectives(job.comm.rank(), self.name()))
    }

    /// Waits for a device collective queued by [`Backend::device_all_reduce`].
    fn device_wait(&self, comm: &dyn Runner, ticket: DeviceTicket) -> Result<()> {
        let _ = ticket;
        Err(no_device_collectives(comm.rank(), self.name()))
    }
}

/// The error for GPU memory handed to a backend without device collectives.
pub(crate) fn no_device_collectives(rank: usize, backend: &str) -> Error {
    Error::Unsupported {
        what: format!(
            "collectives on GPU memory on rank {rank}: the {backend} backend works on host memory \
             (start the job with KOLO_BACKEND=nccl, in a build with the `nccl` feature)"
        ),
    }
}

/// Where a group's members are: what a backend is chosen from.
pub(crate) struct Members<'a> {
    /// Group rank → transport rank.
    pub members: &'a [usize],
    /// This process's group rank.
    pub rank: usize,
    /// Group id.
    pub group: u64,
    pub topology: &'a Topology,
    /// Whether the group uses the transport's arena.
    pub arena: bool,
}

/// The backend of a communicator: `engine`'s, when it has one, else kolo's own.
pub(crate) fn choose(engine: Option<Arc<dyn Engine>>, at: &Members) -> Box<dyn Backend> {
    match engine {
        Some(engine) => Box::new(EngineBackend::new(engine, at)),
        None => Box::new(Native::new(at, false)),
    }
}
