//! [`Native`]: kolo's own algorithms (`kolo_collectives::algorithms`) over the communicator's
//! transport, run by the communicator's run machinery ([`Runner::run_step`]: tags, fingerprints,
//! the arena's turn and fingerprint step, deadlines).

use std::sync::{Arc, OnceLock};

use kolo_collectives::algorithms::{
    allreduce_hierarchical, alltoall_pairwise, barrier_dissemination, broadcast_binomial,
    broadcast_shm, linear, reduce_binomial, ring,
};
use kolo_collectives::ctx::{blocks_from_counts, even_blocks};
use kolo_collectives::select::Group;
use kolo_core::{Algorithm, Engine, Error, Reducer, Result};

use super::hierarchy::{Hierarchy, Plan};
#[cfg(doc)]
use super::Runner;
use super::{Backend, Collective, Job, Members};

/// kolo's own collectives over the transport.
pub(crate) struct Native {
    group: Group,
    /// The world's two levels, when it spans several hosts evenly.
    plan: Option<Plan>,
    /// Their communicators, made on first use.
    hierarchy: OnceLock<Hierarchy>,
}

impl Native {
    /// kolo's collectives for the group at `at`; `engine`: a collective engine runs the group's
    /// collectives, and this runs only those the cost model gives kolo (then over the engine's
    /// point-to-point transport, and never hierarchical: an engine has its own hierarchy).
    pub fn new(at: &Members, engine: bool) -> Native {
        let plan = if engine { None } else { Plan::new(at) };
        Native {
            group: Group {
                size: at.members.len(),
                engine,
                arena: at.arena,
                hosts: plan.as_ref().map(Plan::hosts),
            },
            plan,
            hierarchy: OnceLock::new(),
        }
    }

    fn hierarchy(&self, job: Job) -> Result<&Hierarchy> {
        match &self.plan {
            Some(plan) => Ok(self.hierarchy.get_or_init(|| plan.build(job.comm))),
            None => Err(Error::Unsupported {
                what: "hierarchical all_reduce on a group on one host".into(),
            }),
        }
    }
}

impl Backend for Native {
    fn name(&self) -> &'static str {
        "kolo"
    }

    fn engine(&self) -> Option<&Arc<dyn Engine>> {
        None
    }

    fn group(&self) -> &Group {
        &self.group
    }

    fn run(&self, job: Job, c: Collective<'_>) -> Result<()> {
        let n = job.comm.size();
        match c {
            Collective::Barrier => job.run(barrier_dissemination::barrier),
            Collective::Broadcast { buf, root, .. } if job.call.algo == Algorithm::Shm => {
                job.run(|ctx| match ctx.arena {
                    Some(arena) => broadcast_shm::broadcast(ctx, arena, buf, root),
                    None => Err(Error::Unsupported {
                        what: "broadcast through shared memory on a group without an arena".into(),
                    }),
                })
            }
            Collective::Broadcast { buf, dtype, root } => {
                job.run(|ctx| broadcast_binomial::broadcast(ctx, buf, dtype.size(), root))
            }
            Collective::AllReduce { buf, dtype, op }
                if job.call.algo == Algorithm::Hierarchical =>
            {
                let h = self.hierarchy(job).map_err(|e| job.comm.poison(e))?;
                job.run(|_| allreduce_hierarchical::all_reduce(h, buf, dtype, op))
            }
            Collective::AllReduce { buf, dtype, op } => {
                let red = Reducer::new(dtype, op);
                job.run(|ctx| kolo_collectives::all_reduce(ctx, buf, dtype.size(), &red))
            }
            Collective::Reduce {
                buf,
                dtype,
                op,
                root,
            } => {
                let red = Reducer::new(dtype, op);
                job.run(|ctx| {
                    if job.call.algo == Algorithm::Direct {
                        red.finish(buf, 1);
                        return Ok(());
                    }
                    reduce_binomial::reduce(ctx, buf, dtype.size(), &red, root)
                })
            }
            Collective::ReduceScatter {
                send,
                recv,
                dtype,
                op,
            } => {
                let (e, red) = (dtype.size(), Reducer::new(dtype, op));
                let blocks = even_blocks(recv.len() / e * n, n, e);
                job.run(|ctx| ring::reduce_scatter(ctx, send, recv, &blocks, e, &red))
            }
            Collective::AllGather {
                send,
                recv,
                dtype,
                counts,
            } => {
                let e = dtype.size();
                let blocks = blocks(send.len() / e, n, counts, e);
                job.run(|ctx| ring::all_gather(ctx, send, recv, &blocks, e))
            }
            Collective::AllGatherInPlace { buf, dtype, counts } => {
                let e = dtype.size();
                let blocks = blocks(buf.len() / e / n.max(1), n, counts, e);
                job.run(|ctx| ring::all_gather_in_place(ctx, buf, &blocks, e))
            }
            Collective::Rooted {
                send,
                recv,
                dtype,
                counts,
                root,
                scatter,
            } => {
                let e = dtype.size();
                let piece = if scatter { recv.len() } else { send.len() } / e;
                let blocks = blocks(piece, n, counts, e);
                job.run(|ctx| match scatter {
                    false => linear::gather(ctx, send, recv, &blocks, e, root),
                    true => linear::scatter(ctx, send, recv, &blocks, e, root),
                })
            }
            Collective::AllToAll {
                send,
                recv,
                dtype,
                counts,
            } => {
                let e = dtype.size();
                let (sb, rb) = match counts {
                    None => {
                        let b = even_blocks(send.len() / e, n, e);
                        (b.clone(), b)
                    }
                    Some((sc, rc)) => (blocks_from_counts(sc, e), blocks_from_counts(rc, e)),
                };
                job.run(|ctx| alltoall_pairwise::all_to_all(ctx, send, &sb, recv, &rb, e))
            }
        }
    }
}

/// The blocks of a whole buffer of `n` ranks' pieces: `piece` elements each, or `counts`.
pub(super) fn blocks(
    piece: usize,
    n: usize,
    counts: Option<&[usize]>,
    e: usize,
) -> Vec<std::ops::Range<usize>> {
    match counts {
        None => even_blocks(piece * n, n, e),
        Some(counts) => blocks_from_counts(counts, e),
    }
}
