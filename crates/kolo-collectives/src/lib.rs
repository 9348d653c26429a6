//! # kolo-collectives
//!
//! Collective algorithms written once against [`kolo_core::Transport`]: an algorithm is a plain
//! function of a [`Ctx`] (group, tag, fingerprint, deadline) and byte buffers; it never touches
//! transport code. [`select`] is the cost model that picks one ([`cost`] has its α-β formulas);
//! [`all_reduce`] dispatches on the algorithm recorded in the call's fingerprint.
//!
//! ```
//! use std::time::Instant;
//! use kolo_collectives::{all_reduce, Ctx};
//! use kolo_core::{Algorithm, Call, DType, Header, OpKind, ReduceOp, Reducer, Tag, TagSpace};
//! use kolo_core::Transport;
//!
//! // Every algorithm runs over a transport; here two ranks of one process sum [rank + 1; 3].
//! let world = kolo_transport::local_world(2);
//! let sums: Vec<Vec<u8>> = std::thread::scope(|s| {
//!     let ranks: Vec<_> = world
//!         .iter()
//!         .map(|t| {
//!             s.spawn(move || {
//!                 let tag = Tag { group: 1, space: TagSpace::Collective, value: 0 };
//!                 let call = Call::new(OpKind::AllReduce, Algorithm::Ring);
//!                 let header = Header { ack: false, tag, call };
//!                 let ctx = Ctx::new(t, &[0, 1], t.rank(), header, Instant::now(), None, None);
//!                 let mut buf: Vec<u8> =
//!                     [t.rank() as f32 + 1.0; 3].iter().flat_map(|x| x.to_le_bytes()).collect();
//!                 all_reduce(&ctx, &mut buf, 4, &Reducer::new(DType::F32, ReduceOp::Sum))
//!                     .map(|()| buf)
//!             })
//!         })
//!         .collect();
//!     ranks.into_iter().map(|r| r.join().unwrap().unwrap()).collect()
//! });
//! let three: Vec<u8> = [3.0f32; 3].iter().flat_map(|x| x.to_le_bytes()).collect();
//! assert!(sums.iter().all(|s| *s == three));
//! ```
#![warn(missing_docs)]

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
