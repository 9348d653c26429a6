//! # kolo-collectives
//!
//! Collective algorithms written once against [`kolo_core::Transport`]: an algorithm is a plain
//! function of a [`Ctx`] (group, tag, fingerprint, deadline) and byte buffers; it never touches
//! transport code. [`select`] is the cost model that picks one ([`cost`] has its α-β formulas);
//! [`all_reduce`] dispatches on the algorithm recorded in the call's fingerprint.

pub mod algorithms;
pub mod cost;
pub mod ctx;
pub mod select;

pub use ctx::Ctx;

use kolo_core::{Algorithm, Error, Reducer, Result};

use algorithms::{
    allreduce_halving_doubling, allreduce_recursive_doubling, allreduce_shm, allreduce_tree, ring,
};

/// Runs the all-reduce algorithm named in `ctx.header.call.algo` on `buf` in place.
pub fn all_reduce(ctx: &Ctx, buf: &mut [u8], elem: usize, red: &Reducer) -> Result<()> {
    match ctx.header.call.algo {
        Algorithm::Direct => Ok(()),
        Algorithm::Ring => ring::all_reduce(ctx, buf, elem, red),
        Algorithm::RecursiveDoubling => allreduce_recursive_doubling::all_reduce(ctx, buf, red),
        Algorithm::HalvingDoubling => allreduce_halving_doubling::all_reduce(ctx, buf, elem, red),
        Algorithm::BinomialTree => allreduce_tree::all_reduce(ctx, buf, elem, red),
        Algorithm::Shm => match ctx.arena {
            Some(arena) => allreduce_shm::all_reduce(ctx, arena, buf, elem, red),
            None => Err(Error::Unsupported {
                what: "all_reduce through shared memory on a group without an arena".into(),
            }),
        },
        other => Err(Error::Unsupported {
            what: format!("all_reduce with algorithm {other}"),
        }),
    }
}
