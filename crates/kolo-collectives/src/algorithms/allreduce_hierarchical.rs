//! Hierarchical all-reduce over a world spread evenly over several hosts, in three steps:
//! reduce-scatter among the ranks of each host (shared memory, say), all-reduce of each shard
//! across hosts (TCP, one rank per host and shard), all-gather inside each host.
//!
//! The buffer is padded to a multiple of the ranks per host; `Avg` divides at both levels, which for
//! integers truncates the same as dividing once.
//!
//! Each step is a collective of its own on one of the two [`Levels`] (its own tag and fingerprint,
//! built here as the level's communicator would build it), run by the caller, which knows how to
//! sequence collectives on the level's group.
//!
//! Cost: intra-host ring reduce-scatter + inter-host all-reduce of S/l + intra-host ring all-gather
//! (see [`crate::cost::hierarchical`]).

use kolo_core::{Call, DType, OpKind, ReduceOp, Reducer, Result};

use crate::algorithms::ring;
use crate::ctx::even_blocks;
use crate::select::{self, Group, Overrides};
use crate::Ctx;

/// One of the two levels of a hierarchical world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// The ranks of this rank's host.
    Local,
    /// The ranks of the same local index on every host.
    Cross,
}

/// The two levels' groups, as the caller runs collectives on them.
pub trait Levels {
    /// Ranks in the group of `level`.
    fn size(&self, level: Level) -> usize;
    /// Runs `step` as the next collective, with fingerprint `call`, of the group of `level`.
    fn run(&self, level: Level, call: Call, step: &mut dyn FnMut(&Ctx) -> Result<()>)
        -> Result<()>;
}

/// The fingerprint of one step: `op` on `count` elements over `n` ranks of a plain group.
fn step_call(op: OpKind, dtype: DType, reduce: Option<ReduceOp>, count: usize, n: usize) -> Call {
    Call {
        op,
        dtype: Some(dtype),
        reduce,
        count: count as u64,
        root: None,
        algo: select::choose(
            op,
            count,
            dtype.size(),
            &Group::plain(n),
            &Overrides::default(),
        ),
    }
}

/// All-reduces `buf` in place over the two `levels`.
pub fn all_reduce(levels: &dyn Levels, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    let e = dtype.size();
    let l = levels.size(Level::Local);
    let hosts = levels.size(Level::Cross);
    let per = (buf.len() / e).div_ceil(l);
    let mut padded = vec![0u8; per * l * e];
    padded[..buf.len()].copy_from_slice(buf);
    let mut shard = vec![0u8; per * e];
    let red = Reducer::new(dtype, op);
    let blocks = even_blocks(per * l, l, e);

    let call = step_call(OpKind::ReduceScatter, dtype, Some(op), per, l);
    levels.run(Level::Local, call, &mut |ctx| {
        ring::reduce_scatter(ctx, &padded, &mut shard, &blocks, e, &red)
    })?;
    let call = step_call(OpKind::AllReduce, dtype, Some(op), per, hosts);
    levels.run(Level::Cross, call, &mut |ctx| {
        crate::all_reduce(ctx, &mut shard, e, &red)
    })?;
    let call = step_call(OpKind::AllGather, dtype, None, per, l);
    levels.run(Level::Local, call, &mut |ctx| {
        ring::all_gather(ctx, &shard, &mut padded, &blocks, e)
    })?;
    buf.copy_from_slice(&padded[..buf.len()]);
    Ok(())
}
